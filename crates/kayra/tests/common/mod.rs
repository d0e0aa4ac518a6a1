//! What the process tests of `kayra reconciler` share: a reconciler child
//! process with its stderr collected, and a world of one etcd, a recording
//! HTTP backend and a repository to seed and inspect records.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kayra_catalog::repo::{Change, Repository, keys};
use kayra_core::{ApiRegistration, Namespace, Subscription};
use kayra_store::Store;
use kayra_testkit::backend::TestBackend;
use kayra_testkit::{Etcd, free_port};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub fn http_setup() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub const API: &str = "compute.example.com";

/// A `kayra reconciler` child process with its stderr collected.
pub struct Reconciler {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Reconciler {
    pub fn start(config: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kayra"))
            .args(["reconciler", "--config"])
            .arg(config)
            .env("KAYRA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kayra reconciler");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, lines }
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits (bounded) for the process to exit and returns its status.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "reconciler did not exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct World {
    pub etcd: Etcd,
    pub dir: tempfile::TempDir,
    pub repo: Repository,
    pub backend: TestBackend,
}

impl World {
    pub async fn new() -> Self {
        let etcd = Etcd::start().await;
        let store = Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await.unwrap());
        let repo = Repository::new(store, "dev", "local");
        Self { etcd, dir: tempfile::tempdir().unwrap(), repo, backend: TestBackend::start().await }
    }

    /// Writes a reconciler config whose mode `api` POSTs to `/<behaviour>/<namespace>`.
    pub fn config(&self, name: &str, behaviour: &str) -> PathBuf {
        self.config_with(name, behaviour, "json", free_port())
    }

    pub fn config_with(&self, name: &str, behaviour: &str, log_format: &str, port: u16) -> PathBuf {
        let yaml = format!(
            r#"platform: dev
region: local
database:
  etcd:
    endpoints: ["{endpoint}"]
    prefix: /kayra
    lock_ttl: 2s
    lock_retry_interval: 50ms
logging:
  format: {log_format}
reconciler:
  listen: 127.0.0.1:{port}
  max_concurrent_reconciles: 8
  mode:
    api:
      - method: post
        endpoint: "{base}/{behaviour}/{{{{ .Subscription.Namespace }}}}"
        headers:
          Authorization: {{type: Bearer, value: "s3cr3t-token-value"}}
        timeout: 60s
"#,
            endpoint = self.etcd.endpoint(),
            base = self.backend.base,
        );
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    pub async fn seed(&self, namespaces: &[&str], sync_id: &str) {
        let reg =
            ApiRegistration { name: API.into(), mode: "api".into(), sync_id: sync_id.into(), ..Default::default() };
        self.repo.create(&keys::registration("dev", "local", API), &reg, "registration").await.unwrap();
        for ns in namespaces {
            let n = Namespace { name: ns.to_string(), ..Default::default() };
            self.repo.create(&keys::namespace(ns), &n, "namespace").await.unwrap();
            let sub = Subscription::new(*ns, API);
            self.repo.create(&keys::subscription("dev", "local", ns, API), &sub, "subscription").await.unwrap();
        }
    }

    pub async fn bump(&self, sync_id: &str) {
        let key = keys::registration("dev", "local", API);
        self.repo
            .modify::<ApiRegistration, _>(&key, "registration", |r| {
                r.sync_id = sync_id.into();
                Change::Write
            })
            .await
            .unwrap();
    }

    pub async fn all_synced(&self, namespaces: &[&str], sync_id: &str) -> bool {
        for ns in namespaces {
            match self.repo.get_subscription(ns, API).await.unwrap() {
                Some(s) if s.value.is_synced(sync_id) => {}
                _ => return false,
            }
        }
        true
    }
}
