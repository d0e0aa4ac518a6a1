//! Helpers shared by the black-box tests that start real `kayra` processes.
//!
//! - [`Proc`]: a `kayra <command> --config FILE` child process, its stderr
//!   collected line by line, killed on drop.
//! - [`Catalog`]: seeds and reads registrations, namespaces and
//!   subscriptions directly in the store, as an operator's writes would.
//! - [`sample`]: one sample of a Prometheus text page.
//!
//! Each test binary uses only part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kayra_catalog::repo::{Change, Error as RepoError, RecordRef, Repository};
use kayra_core::{ApiRegistration, Namespace, Subscription};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The API every process test registers.
pub const API: &str = "compute.example.com";

/// A kayra child process with its stderr collected.
pub struct Proc {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    /// `kayra <command> --config <config>` with `KAYRA_LOG=info` and `env`.
    pub fn start(command: &str, config: &Path, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kayra"))
            .args([command, "--config"])
            .arg(config)
            .env("KAYRA_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kayra");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, lines }
    }

    /// `kayra reconciler --config <config>`.
    pub fn reconciler(config: &Path) -> Self {
        Self::start("reconciler", config, &[])
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits (bounded) for the process to exit and returns its status.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "kayra did not exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Panics (with its log) if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("kayra exited ({status}):\n{}", self.lines().join("\n"));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The catalog of platform `dev`, region `local`, written straight to the
/// store (no server involved).
pub struct Catalog {
    pub repo: Repository,
}

impl Catalog {
    pub fn new(store: kayra_store::Store) -> Self {
        Self { repo: Repository::new(store, "dev", "local") }
    }

    /// Registers [`API`] in `mode` at `sync_id`, and subscribes `namespaces`.
    pub async fn seed(&self, mode: &str, namespaces: &[String], sync_id: &str) {
        let reg =
            ApiRegistration { name: API.into(), mode: mode.into(), sync_id: sync_id.into(), ..Default::default() };
        self.repo.create(RecordRef::Registration(API), &reg, "registration").await.unwrap();
        for ns in namespaces {
            self.subscribe(ns).await;
        }
    }

    /// Creates namespace `ns` and its subscription to [`API`], riding out
    /// an election or a dead member as a client would (see [`Catalog::create`]).
    pub async fn subscribe(&self, ns: &str) {
        let n = Namespace { name: ns.to_string(), ..Default::default() };
        self.create(RecordRef::Namespace(ns), &n, "namespace").await;
        let sub = Subscription::new(ns, API);
        self.create(RecordRef::Subscription { namespace: ns, api: API }, &sub, "subscription").await;
    }

    /// Creates a record, trying again while the store answers that no
    /// member could take the write within `database.request_timeout` (an
    /// etcd election can outlast it on a loaded machine). A record found
    /// existing after such a failure was written by the failed attempt:
    /// an attempt cut off by a dying member may still have been applied.
    async fn create<T: serde::Serialize>(&self, record: RecordRef<'_>, value: &T, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut failed = false;
        loop {
            match self.repo.create(record, value, what).await {
                Ok(_) => return,
                Err(RepoError::Conflict(_)) if failed => return,
                Err(RepoError::Store(kayra_store::Error::Unavailable(e))) if Instant::now() < deadline => {
                    eprintln!("creating {what} {record:?}: {e}; trying again");
                    failed = true;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("creating {what} {record:?}: {e}"),
            }
        }
    }

    pub async fn bump(&self, sync_id: &str) {
        let key = RecordRef::Registration(API);
        self.repo
            .modify::<ApiRegistration, _>(key, "registration", |r| {
                r.sync_id = sync_id.into();
                Change::Write
            })
            .await
            .unwrap();
    }

    pub async fn all_synced<S: AsRef<str>>(&self, namespaces: &[S], sync_id: &str) -> bool {
        for ns in namespaces {
            match self.repo.get_subscription(ns.as_ref(), API).await {
                Ok(Some(s)) if s.value.is_synced(sync_id) => {}
                _ => return false,
            }
        }
        true
    }
}

/// `prefix000`, `prefix001`, … (`n` names).
pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:03}")).collect()
}

/// The value of the sample `name{labels}` in Prometheus text, if present.
pub fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}
