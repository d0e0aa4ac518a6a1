//! The HTTP test harness of `kayra serve`, written once: a real server on
//! `127.0.0.1:0` over either store backend (a SQLite file in a temp dir, or
//! a private etcd), a reqwest client, and helpers for the calls and
//! assertions every test makes.
//!
//! [`both_backends!`] turns each test case into two tests, `<case>::local`
//! and `<case>::etcd`, so the test list shows every case on both stores.

#![allow(dead_code)]

pub mod counted;

use std::sync::{Arc, Once};

use kayra_catalog::repo::{Repository, ResultWrite, Versioned};
use kayra_config::{Config, DatabaseConfig};
use kayra_core::{Subscription, SubscriptionState};
use kayra_store::Store;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use kayra_catalog::api::BASE_PATH;

/// Which store backend a server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Local,
    Etcd,
}

/// Runs each `async fn case(server: Server) { ... }` against both backends,
/// as `case::local` and `case::etcd`.
#[macro_export]
macro_rules! both_backends {
    ($($(#[$meta:meta])* async fn $name:ident($server:ident: Server) $body:block)*) => {$(
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn case($server: $crate::common::Server) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn local() {
                case($crate::common::Server::start($crate::common::Backend::Local).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                case($crate::common::Server::start($crate::common::Backend::Etcd).await).await;
            }
        }
    )*};
}

/// What keeps a store alive: its temp dir or its etcd process.
enum Keep {
    Dir(tempfile::TempDir),
    Etcd(Box<tokio::sync::Mutex<kayra_testkit::Etcd>>),
}

/// A running `kayra serve`, stopped when dropped.
pub struct Server {
    pub backend: Backend,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub client: reqwest::Client,
    /// The bootstrap token: authenticates as `admin` (role `sysadmin`).
    pub admin: String,
    /// The server's configuration (platform, region, store, limits).
    pub config: Config,
    /// This deployment's repository on the same store, for what the API
    /// cannot do: acting as the reconciler, reading revisions.
    pub repo: Repository,
    /// The server's watch hub, to count its store watches.
    pub hub: kayra_catalog::api::Hub,
    stop: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    keep: Arc<Keep>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The watch streams' tunables in tests: short, so keep-alives and
/// revocations show within a test's patience.
pub fn watch_options() -> kayra_catalog::api::WatchOptions {
    kayra_catalog::api::WatchOptions {
        keep_alive: std::time::Duration::from_millis(500),
        recheck: std::time::Duration::from_millis(200),
        ..Default::default()
    }
}

/// `reqwest` is built without a default crypto provider: install ring once.
fn crypto() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl Server {
    /// A server for platform `dev`, region `local` on a fresh store.
    pub async fn start(backend: Backend) -> Server {
        let (config, keep) = test_config(backend).await;
        Self::start_with(backend, config, Arc::new(keep)).await
    }

    /// A server whose store counts its round trips (watch feeds aside).
    pub async fn start_counted(backend: Backend) -> (Server, counted::RoundTrips) {
        let (config, keep) = test_config(backend).await;
        let (store, trips) = match (&config.database.local, &config.database.etcd) {
            (Some(local), _) => {
                let inner = kayra_store::local::LocalStore::open(&local.path, local.poll_interval.0).expect("open");
                let (counted, trips) = counted::Counted::new(inner);
                (Store::new(counted), trips)
            }
            (_, Some(etcd)) => {
                let inner = kayra_store::etcd::EtcdStore::connect(etcd).await.expect("connect to etcd");
                let (counted, trips) = counted::Counted::new(inner);
                (Store::new(counted), trips)
            }
            _ => unreachable!("one backend is configured"),
        };
        let store = store.with_request_timeout(config.database.request_timeout.0);
        (Self::start_on(backend, config, Arc::new(keep), store).await, trips)
    }

    /// Another deployment on the same store, with its own platform/region.
    pub async fn sibling(&self, platform: &str, region: &str) -> Server {
        let mut config = self.config.clone();
        config.platform = platform.into();
        config.region = region.into();
        Self::start_with(self.backend, config, self.keep.clone()).await
    }

    /// The same deployment again, on the same store, with `change` applied.
    pub async fn restart_with(&self, change: impl FnOnce(&mut Config)) -> Server {
        let mut config = self.config.clone();
        change(&mut config);
        Self::start_with(self.backend, config, self.keep.clone()).await
    }

    async fn start_with(backend: Backend, config: Config, keep: Arc<Keep>) -> Server {
        let store = Store::open(&config.database).await.expect("open store");
        Self::start_on(backend, config, keep, store).await
    }

    /// A server on a private etcd whose change feeds the test can cut, as a
    /// lost connection would (`kayra_store::testsuite::Switched`), and a
    /// client of that etcd (to compact it, say).
    pub async fn start_switched() -> (Server, kayra_store::testsuite::FeedSwitch, etcd_client::Client) {
        Self::start_switched_with(|_| {}).await
    }

    /// [`Server::start_switched`], with `prepare` applied to the switch
    /// before the server starts (a list made slow from its first).
    pub async fn start_switched_with(
        prepare: impl FnOnce(&kayra_store::testsuite::FeedSwitch),
    ) -> (Server, kayra_store::testsuite::FeedSwitch, etcd_client::Client) {
        let etcd = kayra_testkit::Etcd::start().await;
        let etcd_config = etcd.config("/kayra");
        let client = etcd.client().await;
        let connected = kayra_store::etcd::EtcdStore::connect(&etcd_config).await.expect("connect to etcd");
        let (switched, switch) = kayra_store::testsuite::Switched::new(connected);
        prepare(&switch);
        let mut config = Config { database: DatabaseConfig::etcd(etcd_config), ..Config::default() };
        config.auth.bootstrap_token = "test-bootstrap-token-0123456789abcdef".into();
        let keep = Arc::new(Keep::Etcd(Box::new(tokio::sync::Mutex::new(etcd))));
        (Self::start_on(Backend::Etcd, config, keep, Store::new(switched)).await, switch, client)
    }

    async fn start_on(backend: Backend, config: Config, keep: Arc<Keep>, store: Store) -> Server {
        crypto();
        let repo = Repository::new(store.clone(), &config.platform, &config.region);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let stop = CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        let hub = kayra_catalog::api::Hub::new(store.clone(), watch_options());
        let task = tokio::spawn(kayra_server::run_with(config.clone(), store, listener, shutdown, hub.clone()));
        let scheme = if config.server.tls.is_some() { "https" } else { "http" };
        let server = Server {
            backend,
            base: format!("{scheme}://{addr}"),
            client: reqwest::Client::new(),
            admin: config.auth.bootstrap_token.clone(),
            config,
            repo,
            hub,
            stop,
            task: Some(task),
            keep,
        };
        if scheme == "http" {
            server.wait_ready().await;
        }
        server
    }

    /// Waits until the server answers `/healthz` (bootstrap runs first).
    pub async fn wait_ready(&self) {
        let url = format!("{}/healthz", self.base);
        kayra_testkit::eventually("the server to answer /healthz", || async {
            self.client.get(&url).send().await.is_ok_and(|r| r.status().is_success())
        })
        .await;
    }

    /// Stops the server and returns what `kayra_server::run` returned.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        match self.task.take() {
            Some(task) => task.await.expect("server task panicked"),
            None => Ok(()),
        }
    }

    /// Kills the etcd behind an etcd-backed server (data kept).
    pub async fn stop_etcd(&self) {
        match &*self.keep {
            Keep::Etcd(etcd) => etcd.lock().await.stop(),
            Keep::Dir(_) => panic!("stop_etcd on a local store"),
        }
    }

    /// The etcd behind an etcd-backed server: its pid and client endpoint.
    pub async fn etcd_process(&self) -> (u32, String) {
        match &*self.keep {
            Keep::Etcd(etcd) => {
                let etcd = etcd.lock().await;
                (etcd.pid().expect("etcd is running"), etcd.endpoint())
            }
            Keep::Dir(_) => panic!("etcd_process on a local store"),
        }
    }

    /// Starts the etcd stopped by [`Server::stop_etcd`] again.
    pub async fn restart_etcd(&self) {
        match &*self.keep {
            Keep::Etcd(etcd) => etcd.lock().await.restart().await,
            Keep::Dir(_) => panic!("restart_etcd on a local store"),
        }
    }

    /// Starts a shutdown without waiting for it.
    pub fn begin_shutdown(&self) {
        self.stop.cancel();
    }

    /// Waits for the server task to end.
    pub async fn join(mut self) -> anyhow::Result<()> {
        match self.task.take() {
            Some(task) => task.await.expect("server task panicked"),
            None => Ok(()),
        }
    }

    /// A path made a URL. Catalog paths are relative to the catalog API
    /// (`/namespaces`); `/apis/...` and the operational endpoints are
    /// server paths; a full URL is kept.
    pub fn url(&self, path: &str) -> String {
        const SERVER_PATHS: [&str; 4] = ["/healthz", "/readyz", "/metrics", "/openapi.json"];
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else if path.starts_with("/apis/") || SERVER_PATHS.contains(&path) {
            format!("{}{path}", self.base)
        } else {
            format!("{}{BASE_PATH}{path}", self.base)
        }
    }

    /// Any request: `token` as bearer (none when `None`), `body` as JSON.
    pub async fn call(&self, method: Method, path: &str, token: Option<&str>, body: Option<Value>) -> Reply {
        let mut request = self.client.request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        Reply::from(request.send().await.expect("request failed")).await
    }

    /// A request with a raw body, sent as `application/json`.
    pub async fn raw(&self, method: Method, path: &str, token: Option<&str>, body: impl Into<reqwest::Body>) -> Reply {
        let mut request = self.client.request(method, self.url(path)).header("content-type", "application/json");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        Reply::from(request.body(body).send().await.expect("request failed")).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, Some(&self.admin), None).await
    }
    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.call(Method::POST, path, Some(&self.admin), Some(body)).await
    }
    pub async fn put(&self, path: &str, body: Value) -> Reply {
        self.call(Method::PUT, path, Some(&self.admin), Some(body)).await
    }
    pub async fn patch(&self, path: &str, body: Value) -> Reply {
        self.call(Method::PATCH, path, Some(&self.admin), Some(body)).await
    }
    pub async fn delete(&self, path: &str) -> Reply {
        self.call(Method::DELETE, path, Some(&self.admin), None).await
    }

    /// Creates a namespace (as admin), panicking unless it is created.
    pub async fn namespace(&self, name: &str) -> Value {
        self.post("/namespaces", json!({"name": name})).await.expect(201)
    }

    /// Creates a registration (as admin) with the given extra fields.
    pub async fn registration(&self, name: &str, fields: Value) -> Value {
        let mut body = json!({"name": name});
        merge(&mut body, fields);
        self.post("/apiregistrations", body).await.expect(201)
    }

    /// Subscribes `namespace` to `api` (as admin).
    pub async fn subscribe(&self, namespace: &str, api: &str) -> Value {
        self.post(&format!("/namespaces/{namespace}/subscriptions"), json!({"api": api})).await.expect(201)
    }

    /// A user holding exactly `rules` through a cluster role binding, and a
    /// token of theirs.
    pub async fn user_with_rules(&self, user: &str, rules: Value) -> String {
        self.post("/roles", json!({"name": format!("{user}-role"), "rules": rules})).await.expect(201);
        self.user_with_token(user).await.1
    }

    /// A user, its cluster role binding to role `<user>-role` (which may not
    /// exist), and a token: `(binding name, token)`.
    pub async fn user_with_token(&self, user: &str) -> (String, String) {
        self.post("/users", json!({"name": user})).await.expect(201);
        let binding = format!("{user}-binding");
        self.post("/clusterrolebindings", json!({"name": binding, "role": format!("{user}-role"), "user": user}))
            .await
            .expect(201);
        let token = self.post(&format!("/users/{user}/tokens"), json!({})).await.expect(201);
        (binding, token["token"].as_str().expect("token").to_string())
    }
}

/// Merges the members of `extra` into `target`.
pub fn merge(target: &mut Value, extra: Value) {
    if let (Some(target), Value::Object(extra)) = (target.as_object_mut(), extra) {
        target.extend(extra);
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
    /// The body as JSON (`Null` when it is empty or not JSON).
    pub json: Value,
}

impl Reply {
    async fn from(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply { status, headers, text, json }
    }

    /// The body, after checking the status.
    #[track_caller]
    pub fn expect(self, status: u16) -> Value {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.text);
        self.json
    }

    /// Checks an error answer: status, the contract's shape and reason, and
    /// that the message mentions each of `mentions`. Returns the message.
    #[track_caller]
    pub fn error(self, status: u16, mentions: &[&str]) -> String {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.text);
        let reason = match status {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            413 => "PayloadTooLarge",
            503 => "Unavailable",
            _ => "Internal",
        };
        let body = self.json.as_object().unwrap_or_else(|| panic!("error body is not a JSON object: {:?}", self.text));
        assert_eq!(body.len(), 3, "error body has other fields than code/reason/message: {}", self.text);
        assert_eq!(self.json["code"], status, "{}", self.text);
        assert_eq!(self.json["reason"], reason, "{}", self.text);
        let message = self.json["message"].as_str().expect("message is a string").to_string();
        for mention in mentions {
            assert!(message.contains(mention), "message {message:?} does not mention {mention:?}");
        }
        message
    }
}

/// A server config on a fresh store of `backend`, and what keeps that store
/// alive.
async fn test_config(backend: Backend) -> (Config, Keep) {
    let (database, keep) = match backend {
        Backend::Local => {
            let dir = tempfile::tempdir().expect("temp dir");
            (DatabaseConfig::local(kayra_testkit::local_config(dir.path())), Keep::Dir(dir))
        }
        Backend::Etcd => {
            let etcd = kayra_testkit::Etcd::start().await;
            let database = DatabaseConfig::etcd(etcd.config("/kayra"));
            (database, Keep::Etcd(Box::new(tokio::sync::Mutex::new(etcd))))
        }
    };
    let mut config = Config { database, ..Config::default() };
    config.auth.bootstrap_token = "test-bootstrap-token-0123456789abcdef".into();
    (config, keep)
}

/// Records a reconcile result on `seen` as the reconciler's result write
/// does (without a run record): synced to `sync_id`, or with `None` failed.
/// Nothing is written when the subscription already says so; a stale `seen`
/// writes nothing either.
pub async fn record_result(repo: &Repository, seen: &Versioned<Subscription>, sync_id: Option<&str>) {
    let mut next = seen.value.clone();
    match sync_id {
        Some(sync_id) => {
            next.active = true;
            next.state = SubscriptionState::Success;
            next.current_sync_id = sync_id.into();
        }
        None => next.state = SubscriptionState::Error,
    }
    if next != seen.value {
        let write = ResultWrite { seen, next: Some(&next), clear_runs: false, lock: None, unlock: false, fanout: None };
        repo.write_result(&write, &[]).await.expect("record the result");
    }
}
