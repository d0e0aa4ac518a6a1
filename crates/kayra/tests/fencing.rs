//! Black-box test of fencing (platform §7) through real processes on one
//! real etcd: a `kayra reconciler` A whose lease expires while it is
//! SIGSTOPped inside a step records nothing once resumed; reconciler B,
//! which took the job meanwhile, has its result and its run kept, and its
//! call carries a higher `.Run.FencingToken` than any call A made.
//!
//! The two processes get different step endpoints (`/hold/a/..` for A,
//! `/ok/b/..` for B), so the backend can tell whose call it holds; every
//! step sends its `.Run.FencingToken` in an `X-Fence` header.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri};
use common::{API, Catalog, Proc};
use kayra_config::DatabaseConfig;
use kayra_store::Store;
use kayra_testkit::{Etcd, eventually, free_port};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::sync::watch;

/// `database.etcd.lock_ttl` of both reconcilers.
const LOCK_TTL: Duration = Duration::from_secs(2);
const TOKEN: &str = "fencing-test-admin-token";
const TOKEN_ENV: &[(&str, &str)] = &[("KAYRA_BOOTSTRAP_TOKEN", TOKEN)];
const NS: &str = "fenced";
/// What A logs when its result write finds its lock key gone.
const FENCED_LINE: &str = "job lock lost during the reconcile";

// ------------------------------------------------------------- backend

/// One call as the backend saw it arrive.
#[derive(Debug, Clone)]
struct Call {
    path: String,
    fence: Option<i64>,
}

/// A recording backend on 127.0.0.1:0: `/hold/..` answers 200 once
/// [`Backend::open`] is called, anything else 200 at once. Each call's
/// `X-Fence` header is kept.
struct Backend {
    base: String,
    calls: Arc<Mutex<Vec<Call>>>,
    gate: watch::Sender<bool>,
}

impl Backend {
    async fn start() -> Self {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (gate, _) = watch::channel(false);
        let app = Router::new().fallback({
            let (calls, gate) = (calls.clone(), gate.clone());
            move |uri: Uri, headers: HeaderMap| {
                let (calls, mut opened) = (calls.clone(), gate.subscribe());
                async move {
                    let path = uri.path().to_string();
                    let fence = headers.get("x-fence").and_then(|v| v.to_str().ok()?.parse().ok());
                    calls.lock().unwrap().push(Call { path: path.clone(), fence });
                    if path.starts_with("/hold/") {
                        let _ = opened.wait_for(|open| *open).await;
                    }
                    StatusCode::OK
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { base, calls, gate }
    }

    fn calls(&self, prefix: &str) -> Vec<Call> {
        self.calls.lock().unwrap().iter().filter(|c| c.path.starts_with(prefix)).cloned().collect()
    }

    /// Lets every held call, and every later one, answer.
    fn open(&self) {
        self.gate.send_replace(true);
    }

    async fn wait_for(&self, prefix: &str) -> Call {
        eventually(&format!("a call to {prefix}"), || async { !self.calls(prefix).is_empty() }).await;
        self.calls(prefix).remove(0)
    }
}

// --------------------------------------------------------------- world

struct World {
    etcd: Etcd,
    dir: tempfile::TempDir,
    catalog: Catalog,
    backend: Backend,
    http: reqwest::Client,
}

impl World {
    async fn new() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let etcd = Etcd::start().await;
        let store = Store::open(&DatabaseConfig::etcd(etcd.config("/kayra"))).await.unwrap();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        Self {
            etcd,
            dir: tempfile::tempdir().unwrap(),
            catalog: Catalog::new(store),
            backend: Backend::start().await,
            http,
        }
    }

    /// A config whose mode `api` POSTs to `/<path>/<namespace>` with the
    /// run's fencing token in `X-Fence`; `serve_port` for `kayra serve`.
    fn config(&self, name: &str, path: &str, serve_port: u16) -> PathBuf {
        let yaml = format!(
            r#"platform: dev
region: local
server:
  listen: 127.0.0.1:{serve_port}
database:
  etcd:
    endpoints: ["{endpoint}"]
    prefix: /kayra
    lock_ttl: {ttl}s
    lock_retry_interval: 50ms
logging:
  format: json
reconciler:
  listen: 127.0.0.1:{admin}
  max_concurrent_reconciles: 4
  mode:
    api:
      - method: post
        endpoint: "{base}/{path}/{{{{ .Subscription.Namespace }}}}"
        headers: {{X-Fence: "{{{{ .Run.FencingToken }}}}"}}
        timeout: 60s
"#,
            endpoint = self.etcd.endpoint(),
            ttl = LOCK_TTL.as_secs(),
            admin = free_port(),
            base = self.backend.base,
        );
        let file = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        file
    }

    fn reconciler(&self, name: &str, path: &str) -> Proc {
        Proc::start("reconciler", &self.config(name, path, free_port()), TOKEN_ENV)
    }

    /// `kayra serve`, once it answers; returns it with its base URL.
    async fn serve(&self) -> (Proc, String) {
        let port = free_port();
        let proc = Proc::start("serve", &self.config("serve", "unused", port), TOKEN_ENV);
        let base = format!("http://127.0.0.1:{port}/apis/catalog.example.com/v1");
        eventually("serve answers", || async { self.get(&format!("{base}/namespaces")).await.is_some() }).await;
        (proc, base)
    }

    /// A 200 response's JSON body.
    async fn get(&self, url: &str) -> Option<Value> {
        let response = self.http.get(url).bearer_auth(TOKEN).send().await.ok()?;
        if response.status() != StatusCode::OK {
            return None;
        }
        response.json().await.ok()
    }

    /// `GET .../subscriptions/API/runs` of [`NS`], newest first.
    async fn runs(&self, base: &str) -> Vec<Value> {
        let url = format!("{base}/namespaces/{NS}/subscriptions/{API}/runs");
        match self.get(&url).await {
            Some(list) => list["items"].as_array().cloned().unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// The subscription's record and its revision in the store.
    async fn subscription(&self) -> (kayra_core::Subscription, kayra_store::Revision) {
        let found = self.catalog.repo.get_subscription(NS, API).await.unwrap().expect("subscription exists");
        (found.value, found.revision)
    }
}

/// The `reconciler` field a process's runs carry: `<host>:<pid>`.
fn identity_of(proc: &Proc) -> String {
    format!(":{}", proc.child.id())
}

// ----------------------------------------------------------------- test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_paused_past_its_lease_records_nothing_and_its_calls_carry_the_lower_token() {
    let world = World::new().await;
    world.catalog.seed("api", &[NS.to_string()], "s1").await;
    let (mut serve, base) = world.serve().await;

    // A takes the job and is held inside its step.
    let mut a = world.reconciler("a", "hold/a");
    let a_call = world.backend.wait_for("/hold/a/").await;
    let a_token = a_call.fence.expect("A's call carries X-Fence");
    a.signal(Signal::SIGSTOP);
    let stopped_at = Instant::now();

    // B can take the job only once A's lease has expired.
    let mut b = world.reconciler("b", "ok/b");
    let b_call = world.backend.wait_for("/ok/b/").await;
    let b_token = b_call.fence.expect("B's call carries X-Fence");
    assert!(stopped_at.elapsed() >= LOCK_TTL, "B got the lock before A's lease could expire");
    assert!(b_token > a_token, "B's fencing token {b_token} is above A's {a_token}");
    eventually("B's result is recorded", || world.catalog.all_synced(&[NS], "s1")).await;
    eventually("B's run is in the history", || async { !world.runs(&base).await.is_empty() }).await;
    let (by_b, b_revision) = world.subscription().await;
    assert!(by_b.active && by_b.current_sync_id == "s1", "B's result: {by_b:?}");

    // A's step completes the moment it runs again; its result must not land.
    world.backend.open();
    a.signal(Signal::SIGCONT);
    eventually("A says its result was fenced off", || async {
        a.lines().iter().any(|l| l.contains(FENCED_LINE) && l.contains(NS))
    })
    .await;
    let (after, after_revision) = world.subscription().await;
    assert_eq!((&after, after_revision), (&by_b, b_revision), "A wrote to the subscription after being fenced off");
    assert!(
        !a.lines().iter().any(|l| l.contains("subscription activated") || l.contains("subscription reconciled")),
        "A claims a recorded result:\n{}",
        a.lines().join("\n")
    );

    // The history holds B's successful run and nothing from A.
    let runs = world.runs(&base).await;
    let summary: Vec<(String, String)> = runs
        .iter()
        .map(|r| (r["reconciler"].as_str().unwrap_or("").to_string(), r["result"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(runs.len(), 1, "one run, B's: {summary:?}");
    assert!(summary[0].0.ends_with(&identity_of(&b)), "the run is B's: {summary:?}");
    assert_eq!(summary[0].1, "success", "{summary:?}");
    assert!(!summary.iter().any(|(who, _)| who.ends_with(&identity_of(&a))), "A recorded a run: {summary:?}");

    // A has nothing left to do: any call it made carried the older token.
    // Give a redundant run a moment to show up before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a_calls = world.backend.calls("/hold/a/");
    assert_eq!(a_calls.len(), 1, "A called again: {a_calls:?}");
    assert!(a_calls.iter().all(|c| c.fence.is_some_and(|t| t < b_token)), "{a_calls:?} vs B's {b_token}");
    assert_eq!(world.backend.calls("/ok/b/").len(), 1, "B ran the job once");
    assert_eq!(world.runs(&base).await.len(), 1, "no later run was recorded");
    a.assert_running();
    b.assert_running();
    serve.assert_running();
}
