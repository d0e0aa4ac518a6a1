//! A real kayra for the console tests: `kayra serve` and (optionally)
//! `kayra reconciler` as child processes on one local store, a recording
//! backend whose first path segment picks the answer (`ok`, `fail`,
//! `hold`), and a reqwest client acting as the operator.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use kayra_catalog::repo::Repository;
use kayra_store::Store;
use kayra_testkit::backend::TestBackend;
use kayra_testkit::{eventually, free_port};
use reqwest::Method;
use serde_json::{Value, json};

pub const ADMIN: &str = "console-test-admin-token-0123456789abcdef";
pub const CATALOG: &str = "/apis/catalog.example.com/v1";

/// A child process killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Which store the processes share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file (what `kayra dev` runs on).
    Local,
    /// A private etcd.
    Etcd,
}

pub struct World {
    /// `http://127.0.0.1:<port>` of `kayra serve`.
    pub base: String,
    pub backend: TestBackend,
    pub http: reqwest::Client,
    config: PathBuf,
    /// The reconciler's admin listener (`/readyz`).
    reconciler_admin: String,
    serve: Option<Process>,
    reconciler: Option<Process>,
    etcd: Option<kayra_testkit::Etcd>,
    dir: tempfile::TempDir,
}

impl World {
    /// `kayra serve` (with the admin token) and, when `reconciler`, a
    /// `kayra reconciler` whose modes `ok`, `fail` and `hold` call the
    /// recording backend in two steps.
    pub async fn start(reconciler: bool) -> World {
        Self::start_on(Backend::Local, reconciler).await
    }

    /// [`World::start`] on `backend`.
    pub async fn start_on(backend_kind: Backend, reconciler: bool) -> World {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let etcd = match backend_kind {
            Backend::Local => None,
            Backend::Etcd => Some(kayra_testkit::Etcd::start().await),
        };
        let database = match &etcd {
            None => format!("  local:\n    path: {}\n    poll_interval: 20ms", dir.path().join("kayra.db").display()),
            Some(etcd) => format!(
                "  etcd:\n    endpoints: [\"{}\"]\n    prefix: /kayra\n    lock_ttl: 2s\n    lock_retry_interval: 50ms",
                etcd.endpoint()
            ),
        };
        let backend = TestBackend::start().await;
        let port = free_port();
        let rport = free_port();
        // `ok` and `fail`: two steps; `hold`: one step, so one release lets
        // one subscription finish. The pool is larger than any test's held
        // calls, so held subscriptions never starve the others.
        let step = |method: &str, behaviour: &str, tail: &str| {
            format!(
                "\n      - method: {method}\n        endpoint: \"{base}/{behaviour}/{{{{ .Subscription.Namespace }}}}/{tail}\"",
                base = backend.base
            )
        };
        let two = |behaviour: &str| {
            format!("\n    {behaviour}:{}{}", step("post", behaviour, "deploy"), step("get", behaviour, "check"))
        };
        let modes = format!("{}{}\n    hold:{}", two("ok"), two("fail"), step("post", "hold", "deploy"));
        let yaml = format!(
            r#"platform: dev
region: local
server:
  listen: 127.0.0.1:{port}
database:
{database}
auth:
  bootstrap_token: {ADMIN}
reconciler:
  listen: 127.0.0.1:{rport}
  max_concurrent_reconciles: 16
  mode:{modes}
"#,
        );
        let config = dir.path().join("kayra.yaml");
        std::fs::write(&config, yaml).unwrap();
        let mut world = World {
            base: format!("http://127.0.0.1:{port}"),
            backend,
            http: reqwest::Client::new(),
            config,
            reconciler_admin: format!("http://127.0.0.1:{rport}"),
            serve: None,
            reconciler: None,
            etcd,
            dir,
        };
        world.serve = Some(world.spawn("serve"));
        world.wait_ready().await;
        if reconciler {
            world.reconciler = Some(world.spawn("reconciler"));
            // Ready once its startup list is dispatched: what the test
            // writes from now on is an `initial` run, not a `startup` one.
            let ready = format!("{}/readyz", world.reconciler_admin);
            eventually("kayra reconciler to be ready", || async {
                world.http.get(&ready).send().await.is_ok_and(|r| r.status().is_success())
            })
            .await;
        }
        world
    }

    async fn wait_ready(&self) {
        let health = format!("{}/healthz", self.base);
        eventually("kayra serve to answer /healthz", || async {
            self.http.get(&health).send().await.is_ok_and(|r| r.status().is_success())
        })
        .await;
    }

    /// Kills `kayra serve` and starts it again on the same port: every
    /// open stream drops.
    pub async fn restart_serve(&mut self) {
        drop(self.serve.take());
        self.serve = Some(self.spawn("serve"));
        self.wait_ready().await;
    }

    fn spawn(&self, command: &str) -> Process {
        let child = Command::new(env!("CARGO_BIN_EXE_kayra"))
            .args([command, "--config"])
            .arg(&self.config)
            .env_remove("KAYRA_BOOTSTRAP_TOKEN")
            .env("KAYRA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start kayra {command}: {e}"));
        Process(child)
    }

    /// The same store, opened by the test (for seeding thousands of records
    /// faster than the API would take them).
    pub async fn repo(&self) -> Repository {
        let config = match &self.etcd {
            None => kayra_config::DatabaseConfig::local(kayra_testkit::local_config(self.dir.path())),
            Some(etcd) => kayra_config::DatabaseConfig::etcd(etcd.config("/kayra")),
        };
        Repository::new(Store::open(&config).await.expect("open the store"), "dev", "local")
    }

    /// The console's URL for `route` (`#/apis`…).
    pub fn ui(&self, route: &str) -> String {
        format!("{}/ui/{route}", self.base)
    }

    /// A catalog call as the admin; panics unless it answers `expect`.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>, expect: u16) -> Value {
        let mut request = self.http.request(method.clone(), format!("{}{CATALOG}{path}", self.base)).bearer_auth(ADMIN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("catalog call");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        assert_eq!(status, expect, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    pub async fn namespace(&self, name: &str, description: &str) {
        self.call(Method::POST, "/namespaces", Some(json!({"name": name, "description": description})), 201).await;
    }

    pub async fn registration(&self, name: &str, fields: Value) {
        let mut body = json!({"name": name});
        body.as_object_mut().unwrap().extend(fields.as_object().cloned().unwrap_or_default());
        self.call(Method::POST, "/apiregistrations", Some(body), 201).await;
    }

    pub async fn subscribe(&self, namespace: &str, api: &str) {
        let path = format!("/namespaces/{namespace}/subscriptions");
        self.call(Method::POST, &path, Some(json!({"api": api})), 201).await;
    }

    /// The server's message refusing `token` (401).
    pub async fn refusal(&self, token: &str) -> String {
        let response = self.http.get(format!("{}{CATALOG}/whoami", self.base)).bearer_auth(token).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401);
        let body: Value = response.json().await.unwrap();
        body["message"].as_str().unwrap().to_string()
    }

    /// `/status` of `api`.
    pub async fn status(&self, api: &str) -> Value {
        self.call(Method::GET, &format!("/apiregistrations/{api}/status"), None, 200).await
    }

    /// Waits until `/status` of `api` says `synced` of `total`.
    pub async fn wait_synced(&self, api: &str, synced: u64) {
        eventually(&format!("{synced} subscribers of {api} synced"), || async {
            self.status(api).await["synced"] == synced
        })
        .await;
    }
}
