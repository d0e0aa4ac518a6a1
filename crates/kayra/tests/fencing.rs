//! Black-box test of fencing (platform §7) through real processes on one
//! real etcd: a `kayra reconciler` A whose lease expires while it is
//! SIGSTOPped inside a step records nothing once resumed; reconciler B,
//! which took the job meanwhile, has its result and its run kept, and its
//! call carries a higher `.Run.FencingToken` than any call A made.
//!
//! Two orders: A resumes after B has finished (the subscription's revision
//! has moved, so A's write would be stale anyway), and A resumes while B
//! is still inside its own step (the subscription is as A read it: only
//! the compare on A's lock key keeps A's result out).
//!
//! The two processes get different step endpoints (`/hold/a/..` for A,
//! `/ok/b/..` or `/hold/b/..` for B), so the backend tells their calls
//! apart and holds each until the test lets it answer; every step sends its
//! `.Run.FencingToken` in an `X-Fence` header. The run history is read
//! through a real `kayra serve`.

mod common;

use std::collections::BTreeSet;
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
/// What A logs when its result write finds the subscription changed.
const STALE_LINE: &str = "subscription changed during reconcile";

// ------------------------------------------------------------- backend

/// One call as the backend saw it arrive.
#[derive(Debug, Clone)]
struct Call {
    path: String,
    fence: Option<i64>,
}

/// A recording backend on 127.0.0.1:0: `/hold/<who>/..` answers 200 once
/// [`Backend::open`]`(who)` is called, anything else 200 at once. Each
/// call's `X-Fence` header is kept.
struct Backend {
    base: String,
    calls: Arc<Mutex<Vec<Call>>>,
    gate: watch::Sender<BTreeSet<String>>,
}

impl Backend {
    async fn start() -> Self {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (gate, _) = watch::channel(BTreeSet::new());
        let app = Router::new().fallback({
            let (calls, gate) = (calls.clone(), gate.clone());
            move |uri: Uri, headers: HeaderMap| {
                let (calls, mut opened) = (calls.clone(), gate.subscribe());
                async move {
                    let path = uri.path().to_string();
                    let fence = headers.get("x-fence").and_then(|v| v.to_str().ok()?.parse().ok());
                    calls.lock().unwrap().push(Call { path: path.clone(), fence });
                    if let Some(who) = path.strip_prefix("/hold/").and_then(|rest| rest.split('/').next()) {
                        let _ = opened.wait_for(|open| open.contains(who)).await;
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

    /// Lets every held call to `/hold/<who>/`, and every later one, answer.
    fn open(&self, who: &str) {
        self.gate.send_modify(|open| {
            open.insert(who.to_string());
        });
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
        let list = self.get(&url).await.expect("the runs list answers 200");
        list["items"].as_array().cloned().expect("runs have items")
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

/// The start both tests share: A takes the job and is held inside its
/// step, then is SIGSTOPped; B, started after that, gets the job's lock
/// only once A's lease has expired, and calls `/<b_path>/..` with a higher
/// fencing token than A's.
struct Paused {
    world: World,
    serve: Proc,
    base: String,
    a: Proc,
    a_token: i64,
    stopped_at: Instant,
    b: Proc,
    b_token: i64,
}

async fn paused(b_path: &str) -> Paused {
    let world = World::new().await;
    world.catalog.seed("api", &[NS.to_string()], "s1").await;
    let (serve, base) = world.serve().await;
    let a = world.reconciler("a", "hold/a");
    let a_call = world.backend.wait_for("/hold/a/").await;
    let a_token = a_call.fence.expect("A's call carries X-Fence");
    a.signal(Signal::SIGSTOP);
    let stopped_at = Instant::now();
    let b = world.reconciler("b", b_path);
    let b_call = world.backend.wait_for(&format!("/{b_path}/")).await;
    let b_token = b_call.fence.expect("B's call carries X-Fence");
    // A's last renewal may have come up to a third of the TTL before the
    // stop; half the TTL is a bound no fresh lease could meet.
    assert!(stopped_at.elapsed() >= LOCK_TTL / 2, "B got the lock while A's lease was fresh");
    assert!(b_token > a_token, "B's fencing token {b_token} is above A's {a_token}");
    Paused { world, serve, base, a, a_token, stopped_at, b, b_token }
}

impl Paused {
    /// Resumes A (stopped for at least its lease TTL) with its step's
    /// answer waiting, waits until A has either logged that it was fenced
    /// off or ended its attempt otherwise, and asserts it wrote nothing and
    /// was fenced off.
    async fn resume_a(&self) {
        tokio::time::sleep_until((self.stopped_at + LOCK_TTL).into()).await;
        let (before, revision) = self.world.subscription().await;
        self.world.backend.open("a");
        self.a.signal(Signal::SIGCONT);
        eventually("A is fenced off (or writes, or finds its write stale)", || async {
            self.a.lines().iter().any(|l| l.contains(FENCED_LINE) || l.contains(STALE_LINE))
                || self.world.subscription().await.1 != revision
        })
        .await;
        let (after, after_revision) = self.world.subscription().await;
        assert_eq!((&after, after_revision), (&before, revision), "A wrote to the subscription after losing its lock");
        let lines = self.a.lines();
        let fenced = lines.iter().find(|l| l.contains(FENCED_LINE)).expect("A logs that it was fenced off");
        assert!(fenced.contains(NS) && fenced.contains("\"lock_id\""), "the fenced line names its job: {fenced}");
        assert!(
            !lines.iter().any(|l| l.contains("subscription activated") || l.contains("subscription reconciled")),
            "A claims a recorded result:\n{}",
            lines.join("\n")
        );
    }

    /// `(reconciler, result)` of each recorded run, newest first.
    async fn runs(&self) -> Vec<(String, String)> {
        let field = |r: &Value, name: &str| r[name].as_str().unwrap_or("").to_string();
        self.world.runs(&self.base).await.iter().map(|r| (field(r, "reconciler"), field(r, "result"))).collect()
    }

    /// The history is B's one successful run; A made its one call, with
    /// the lower token, and B its one call; every process still runs.
    async fn assert_only_b_recorded(mut self) {
        // Give a redundant run a moment to show up before counting.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let runs = self.runs().await;
        assert_eq!(runs.len(), 1, "one run, B's: {runs:?}");
        assert!(runs[0].0.ends_with(&identity_of(&self.b)), "the run is B's: {runs:?}");
        assert_eq!(runs[0].1, "success", "{runs:?}");
        let a_calls = self.world.backend.calls("/hold/a/");
        assert_eq!(a_calls.len(), 1, "A called again: {a_calls:?}");
        assert_eq!(a_calls[0].fence, Some(self.a_token));
        assert!(self.a_token < self.b_token);
        let b_calls = self.world.backend.calls("/").len() - a_calls.len();
        assert_eq!(b_calls, 1, "B ran the job once: {:?}", self.world.backend.calls("/"));
        self.a.assert_running();
        self.b.assert_running();
        self.serve.assert_running();
    }
}

/// The order of the issue: B finishes the job while A is paused; A,
/// resumed, completes its step and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_resumed_after_the_new_holder_finished_records_nothing() {
    let paused = paused("ok/b").await;
    let world = &paused.world;
    eventually("B's result is recorded", || world.catalog.all_synced(&[NS], "s1")).await;
    eventually("B's run is in the history", || async { !paused.runs().await.is_empty() }).await;
    paused.resume_a().await;
    let (sub, _) = world.subscription().await;
    assert!(sub.active && sub.current_sync_id == "s1", "B's result stays: {sub:?}");
    paused.assert_only_b_recorded().await;
}

/// A resumes and completes its step while B still holds the job inside its
/// own step: the subscription has not changed since A read it, so only the
/// lock-key compare keeps A's result out. B's result lands afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_resumed_while_the_new_holder_runs_records_nothing() {
    let paused = paused("hold/b").await;
    paused.resume_a().await;
    assert_eq!(paused.runs().await, Vec::<(String, String)>::new(), "A recorded a run");
    paused.world.backend.open("b");
    let world = &paused.world;
    eventually("B's result is recorded", || world.catalog.all_synced(&[NS], "s1")).await;
    eventually("B's run is in the history", || async { !paused.runs().await.is_empty() }).await;
    paused.assert_only_b_recorded().await;
}
