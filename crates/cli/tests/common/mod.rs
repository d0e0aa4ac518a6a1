//! Shared by the integration tests: running the built `kayra-cli` binary
//! ([`Cli`]), and a real `kayra serve` (+ reconciler) to run it against
//! ([`server::Kayra`]).
//!
//! Every run starts from a clean environment for the CLI's own variables,
//! so a developer's `KAYRA_TOKEN` or `KAYRA_SERVER` never leaks into a test.

#![allow(dead_code)] // each test binary uses a different part

pub mod server;

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::ChildStdout;

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Panics with the whole run when the exit status is not `code`.
    #[track_caller]
    pub fn expect_code(self, code: i32) -> Run {
        assert_eq!(self.code, code, "unexpected exit status: {self:#?}");
        self
    }

    /// Panics unless the run succeeded.
    #[track_caller]
    pub fn ok(self) -> Run {
        self.expect_code(0)
    }

    /// stdout parsed as JSON.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:#?}"))
    }
}

/// A `kayra-cli` pointed at one server, with or without a token.
#[derive(Clone, Debug)]
pub struct Cli {
    pub server: String,
    pub token: Option<String>,
    /// Extra environment variables for every run.
    pub env: Vec<(String, String)>,
}

impl Cli {
    pub fn new(server: impl Into<String>, token: Option<&str>) -> Cli {
        Cli { server: server.into(), token: token.map(str::to_string), env: Vec::new() }
    }

    /// Runs `kayra-cli ARGS` with `KAYRA_SERVER`/`KAYRA_TOKEN` set from `self`.
    pub async fn run(&self, args: &[&str]) -> Run {
        self.run_with_stdin(args, None).await
    }

    /// Like [`Cli::run`], feeding `stdin` to the process.
    pub async fn run_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Run {
        let mut command = self.command(args);
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() }).stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn kayra-cli");
        if let Some(bytes) = stdin {
            let mut pipe = child.stdin.take().expect("stdin is piped");
            pipe.write_all(bytes).await.expect("write stdin");
            drop(pipe);
        }
        let output = child.wait_with_output().await.expect("wait for kayra-cli");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Starts `kayra-cli ARGS` (`get --watch`, say) and leaves it running,
    /// its stdout to be read as it comes.
    pub fn spawn(&self, args: &[&str]) -> Running {
        let mut child = self.command(args).stdin(Stdio::null()).spawn().expect("spawn kayra-cli");
        let stdout = child.stdout.take().expect("stdout is piped");
        Running { child, lines: BufReader::new(stdout).lines() }
    }

    /// `kayra-cli ARGS` in a clean environment but for `self`'s, stdout piped.
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_kayra-cli"));
        command
            .args(args)
            .env_remove("KAYRA_TOKEN")
            .env_remove("KAYRA_SERVER")
            .env("KAYRA_SERVER", &self.server)
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if let Some(token) = &self.token {
            command.env("KAYRA_TOKEN", token);
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command
    }
}

/// A `kayra-cli` still running, read line by line.
pub struct Running {
    pub child: tokio::process::Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    /// The next line it prints; panics when none comes within `within` or it exits.
    pub async fn next_line(&mut self, within: Duration) -> String {
        let line = tokio::time::timeout(within, self.lines.next_line()).await;
        line.unwrap_or_else(|_| panic!("no line within {within:?}")).expect("read stdout").expect("still running")
    }

    /// Sends it SIGINT, as Ctrl-C would, and waits for its exit.
    pub async fn interrupt(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("still running").to_string();
        let killed = std::process::Command::new("kill").args(["-INT", &pid]).status().expect("run kill");
        assert!(killed.success());
        self.child.wait().await.expect("wait for kayra-cli")
    }
}
