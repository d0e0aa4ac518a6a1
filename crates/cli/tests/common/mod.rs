//! Shared by the integration tests: running the built `kayra-cli` binary
//! ([`Cli`]), and a real `kayra serve` (+ reconciler) to run it against
//! ([`server::Kayra`]).
//!
//! Every run starts from a clean environment for the CLI's own variables,
//! so a developer's `KAYRA_TOKEN` or `KAYRA_SERVER` never leaks into a test.

#![allow(dead_code)] // each test binary uses a different part

pub mod server;

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

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
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_kayra-cli"));
        command
            .args(args)
            .env_remove("KAYRA_TOKEN")
            .env_remove("KAYRA_SERVER")
            .env("KAYRA_SERVER", &self.server)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(token) = &self.token {
            command.env("KAYRA_TOKEN", token);
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
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
}
