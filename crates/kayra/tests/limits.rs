//! Black-box tests of `reconciler.limits` and of a backend's `Retry-After`
//! (platform §7), through real `kayra reconciler` processes: several on one
//! real etcd, or one on a local store file. The backend here counts the
//! calls in flight at it and stamps every call's arrival, so the limits are
//! checked where they matter, at the backend.
//!
//! `per_minute` is not tested through a process: its window is 60 s and
//! no setting shortens it; `crates/pipeline/tests/limits.rs` tests it on
//! both stores with a short window.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use common::{Catalog, Proc, names, sample};
use kayra_config::DatabaseConfig;
use kayra_store::Store;
use kayra_testkit::{Etcd, eventually, free_port};
use nix::sys::signal::Signal;
use tokio::sync::watch;

/// `database.etcd.lock_ttl` of every etcd process here.
const LOCK_TTL: Duration = Duration::from_secs(2);
/// The backend's `Retry-After` on its first `/throttle/` call.
const RETRY_AFTER: Duration = Duration::from_secs(3);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);
const GAUGE: &str = "kayra_limit_in_flight{mode=\"api\"}";
const HELD_GAUGE: &str = "kayra_limit_held_seconds{mode=\"api\"}";
/// The `Retry-After` of the backend's `/huge/` 429s: about 31 years.
const HUGE_RETRY_AFTER: u64 = 999_999_999;
/// How many `/huge/` calls are answered 429.
const HUGE_429S: usize = 3;
/// `reconciler.limits.api.max_retry_after` where `/huge/` is called.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(4);

// ------------------------------------------------------------- backend

/// One call as the backend saw it arrive.
#[derive(Debug, Clone)]
struct Call {
    path: String,
    at: Instant,
    status: u16,
}

#[derive(Default)]
struct BackendState {
    calls: Mutex<Vec<Call>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    throttled: AtomicBool,
    huge: AtomicUsize,
}

/// A recording backend on 127.0.0.1:0. The first path segment picks the
/// answer: `/second/..` 200 after 1 s; `/hold/..` 200 once
/// [`Backend::open`] is called; `/throttle/..` 429 with `Retry-After: 3`
/// the first time, 200 after that; `/huge/..` once [`Backend::open`] is
/// called, 429 with `Retry-After: 999999999` for the first [`HUGE_429S`]
/// calls, 200 after that.
struct Backend {
    base: String,
    state: Arc<BackendState>,
    gate: watch::Sender<bool>,
}

/// Counts a call in flight until its handler ends, answered or dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Backend {
    async fn start() -> Self {
        let state = Arc::new(BackendState::default());
        let (gate, _) = watch::channel(false);
        let app = Router::new().fallback({
            let (state, gate) = (state.clone(), gate.clone());
            move |uri: Uri| {
                let (state, opened) = (state.clone(), gate.subscribe());
                async move { answer(&state, opened, uri).await }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { base, state, gate }
    }

    fn calls(&self) -> Vec<Call> {
        self.state.calls.lock().unwrap().clone()
    }

    fn count(&self, prefix: &str) -> usize {
        self.calls().iter().filter(|c| c.path.starts_with(prefix)).count()
    }

    fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// Lets every held call, and every later one, answer.
    fn open(&self) {
        self.gate.send_replace(true);
    }

    async fn wait_for(&self, n: usize) {
        eventually(&format!("{n} calls at the backend"), || async { self.calls().len() >= n }).await;
    }
}

async fn answer(state: &BackendState, mut opened: watch::Receiver<bool>, uri: Uri) -> (StatusCode, HeaderMap) {
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _in_flight = InFlight(&state.in_flight);
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let path = uri.path().to_string();
    let at = Instant::now();
    let mut headers = HeaderMap::new();
    let status = match path.split('/').nth(1).unwrap_or("") {
        "throttle" if !state.throttled.swap(true, Ordering::SeqCst) => {
            headers.insert(header::RETRY_AFTER, RETRY_AFTER.as_secs().into());
            StatusCode::TOO_MANY_REQUESTS
        }
        "throttle" => StatusCode::OK,
        "huge" if state.huge.fetch_add(1, Ordering::SeqCst) < HUGE_429S => {
            headers.insert(header::RETRY_AFTER, HUGE_RETRY_AFTER.into());
            StatusCode::TOO_MANY_REQUESTS
        }
        "huge" => StatusCode::OK,
        "second" => StatusCode::OK,
        "hold" => StatusCode::OK,
        _ => StatusCode::NOT_FOUND,
    };
    state.calls.lock().unwrap().push(Call { path: path.clone(), at, status: status.as_u16() });
    match path.split('/').nth(1).unwrap_or("") {
        "second" => tokio::time::sleep(Duration::from_secs(1)).await,
        "hold" | "huge" => {
            let _ = opened.wait_for(|open| *open).await;
        }
        _ => {}
    }
    (status, headers)
}

// --------------------------------------------------------------- world

/// Where the processes keep their state.
enum Db {
    Etcd(Box<Etcd>),
    Local,
}

struct World {
    db: Db,
    dir: tempfile::TempDir,
    catalog: Catalog,
    backend: Backend,
    http: reqwest::Client,
}

impl World {
    async fn etcd() -> Self {
        let etcd = Etcd::start().await;
        let store = Store::open(&DatabaseConfig::etcd(etcd.config("/kayra"))).await.unwrap();
        Self::with(Db::Etcd(Box::new(etcd)), tempfile::tempdir().unwrap(), store).await
    }

    async fn local() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&DatabaseConfig::local(kayra_testkit::local_config(dir.path()))).await.unwrap();
        Self::with(Db::Local, dir, store).await
    }

    async fn with(db: Db, dir: tempfile::TempDir, store: Store) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        Self { db, dir, catalog: Catalog::new(store), backend: Backend::start().await, http }
    }

    fn database_yaml(&self) -> String {
        match &self.db {
            Db::Etcd(etcd) => format!(
                "  etcd:\n    endpoints: [\"{}\"]\n    prefix: /kayra\n    lock_ttl: {}s\n    lock_retry_interval: 50ms\n",
                etcd.endpoint(),
                LOCK_TTL.as_secs()
            ),
            Db::Local => {
                let local = kayra_testkit::local_config(self.dir.path());
                format!("  local:\n    path: {:?}\n    poll_interval: 20ms\n", local.path.display().to_string())
            }
        }
    }

    /// Starts a reconciler whose mode `api` POSTs to
    /// `/<behaviour>/<namespace>`, limited by `limits` (a flow map, or
    /// empty for none); returns it with its admin port.
    fn reconciler(&self, name: &str, behaviour: &str, limits: &str) -> (Proc, u16) {
        let port = free_port();
        let limits = if limits.is_empty() { String::new() } else { format!("  limits:\n    api: {limits}\n") };
        let yaml = format!(
            r#"platform: dev
region: local
database:
{database}logging:
  format: json
reconciler:
  listen: 127.0.0.1:{port}
  max_concurrent_reconciles: 8
{limits}  mode:
    api:
      - method: post
        endpoint: "{base}/{behaviour}/{{{{ .Subscription.Namespace }}}}"
        timeout: 60s
"#,
            database = self.database_yaml(),
            base = self.backend.base,
        );
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        (Proc::reconciler(&path), port)
    }

    async fn metrics(&self, port: u16) -> Option<String> {
        let response = self.http.get(format!("http://127.0.0.1:{port}/metrics")).send().await.ok()?;
        response.text().await.ok()
    }

    /// The process's `kayra_limit_held_seconds{mode="api"}`, if it shows one.
    async fn held_seconds(&self, port: u16) -> Option<f64> {
        sample(&self.metrics(port).await?, HELD_GAUGE)
    }

    /// Waits until the process's `kayra_limit_in_flight{mode="api"}` is `value`.
    async fn gauge_reaches(&self, port: u16, value: f64, what: &str) {
        eventually(what, || async { self.metrics(port).await.is_some_and(|m| sample(&m, GAUGE) == Some(value)) }).await;
    }
}

// --------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_two_holds_across_three_reconcilers() {
    let world = World::etcd().await;
    let namespaces = names("t", 20);
    world.catalog.seed("api", &namespaces, "s1").await;
    let procs: Vec<(Proc, u16)> =
        (0..3).map(|i| world.reconciler(&format!("r{i}"), "second", "{max_in_flight: 2}")).collect();
    eventually("all 20 synced", || world.catalog.all_synced(&namespaces, "s1")).await;
    assert_eq!(world.backend.max_in_flight(), 2, "at most 2 calls in flight at the backend, and the 2 are used");
    // Give any redundant run a chance to show up before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for ns in &namespaces {
        assert_eq!(world.backend.count(&format!("/second/{ns}")), 1, "{ns}: one call across three processes");
    }
    for (proc, port) in &procs {
        world.gauge_reaches(*port, 0.0, "every slot given back").await;
        assert!(!proc.lines().iter().any(|l| l.contains("panicked")), "a reconciler panicked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_slot_holder_frees_its_slot_within_the_lock_ttl_and_the_gauge_is_fleet_wide() {
    let world = World::etcd().await;
    world.catalog.seed("api", &["first".to_string()], "s1").await;
    let (mut holder, holder_port) = world.reconciler("holder", "hold", "{max_in_flight: 1}");
    world.backend.wait_for(1).await;
    world.gauge_reaches(holder_port, 1.0, "the holder shows its slot").await;
    let (mut other, other_port) = world.reconciler("other", "hold", "{max_in_flight: 1}");
    // The other process runs nothing, yet shows the fleet's one slot in use.
    world.gauge_reaches(other_port, 1.0, "the other process shows the holder's slot").await;
    let metrics = world.metrics(other_port).await.unwrap();
    assert!(
        metrics.contains("# HELP kayra_limit_in_flight ") && metrics.contains("fleet"),
        "HELP says the gauge is fleet-wide on etcd:\n{metrics}"
    );
    world.catalog.subscribe("second").await;
    // The only slot is taken: "second" does not reach the backend.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(world.backend.calls().len(), 1, "a second pipeline started while the only slot was held");

    holder.signal(Signal::SIGKILL);
    holder.wait(Duration::from_secs(10));
    let killed_at = Instant::now();
    world.backend.wait_for(2).await;
    let freed = killed_at.elapsed();
    // The lease expires at most LOCK_TTL after the holder's last keep-alive.
    assert!(freed < LOCK_TTL + SLACK, "the slot was freed {freed:?} after the kill");
    world.gauge_reaches(other_port, 1.0, "the other process holds the slot now").await;

    world.backend.open();
    eventually("both synced", || world.catalog.all_synced(&["first", "second"], "s1")).await;
    world.gauge_reaches(other_port, 0.0, "the slot is given back").await;
    other.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gauge_on_the_local_store_counts_this_process() {
    let world = World::local().await;
    let namespaces = names("l", 3);
    world.catalog.seed("api", &namespaces, "s1").await;
    let (mut proc, port) = world.reconciler("local", "hold", "{max_in_flight: 2}");
    world.backend.wait_for(2).await;
    world.gauge_reaches(port, 2.0, "two permits held").await;
    let metrics = world.metrics(port).await.unwrap();
    assert!(metrics.contains("# TYPE kayra_limit_in_flight gauge"), "{metrics}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(world.backend.calls().len(), 2, "a third pipeline started past max_in_flight: 2");
    world.backend.open();
    eventually("all synced", || world.catalog.all_synced(&namespaces, "s1")).await;
    world.gauge_reaches(port, 0.0, "every permit given back").await;
    assert!(world.backend.max_in_flight() <= 2);
    proc.assert_running();
}

/// The first call is answered 429 with `Retry-After: 3`: neither its retry
/// nor the runs of subscriptions created right after reach the backend
/// before 3 s have passed; then everything syncs.
async fn retry_after_holds_back_the_mode(world: World) {
    world.catalog.seed("api", &["first".to_string()], "s1").await;
    let (mut proc, _) = world.reconciler("throttled", "throttle", "");
    world.backend.wait_for(1).await;
    let throttled = world.backend.calls()[0].clone();
    assert_eq!(throttled.status, 429);
    let later = names("later", 2);
    for ns in &later {
        world.catalog.subscribe(ns).await;
    }
    let mut everyone = later.clone();
    everyone.push("first".into());
    eventually("all synced", || world.catalog.all_synced(&everyone, "s1")).await;
    let calls = world.backend.calls();
    assert!(calls.len() >= 4, "{calls:?}");
    for call in &calls[1..] {
        let after = call.at.duration_since(throttled.at);
        assert!(after >= RETRY_AFTER, "{} reached the backend {after:?} after the 429", call.path);
    }
    proc.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_holds_back_the_mode_on_etcd() {
    retry_after_holds_back_the_mode(World::etcd().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_holds_back_the_mode_on_the_local_store() {
    retry_after_holds_back_the_mode(World::local().await).await;
}

/// Three runs' calls are answered 429 with `Retry-After: 999999999` at
/// once: the mode is held for `max_retry_after` (4 s), not 999999999 s nor
/// an hour; while held every process shows the time left in
/// `kayra_limit_held_seconds`, and 0 after; one warning line (across the
/// fleet) names the mode, the API, a namespace that got the 429 and the
/// end of the hold.
async fn a_huge_retry_after_is_capped_shown_and_logged_once(world: World, processes: usize) {
    let namespaces = names("huge", HUGE_429S);
    world.catalog.seed("api", &namespaces, "s1").await;
    let procs: Vec<(Proc, u16)> = (0..processes)
        .map(|i| {
            world.reconciler(&format!("r{i}"), "huge", &format!("{{max_retry_after: {}s}}", MAX_RETRY_AFTER.as_secs()))
        })
        .collect();
    world.backend.wait_for(HUGE_429S).await;
    for (_, port) in &procs {
        eventually("the held gauge is there from the start, at 0", || async {
            world.held_seconds(*port).await == Some(0.0)
        })
        .await;
    }
    let opened_at = Instant::now();
    world.backend.open();
    for (_, port) in &procs {
        eventually("every process shows the hold", || async {
            world.held_seconds(*port).await.is_some_and(|left| left > 0.0 && left <= MAX_RETRY_AFTER.as_secs_f64())
        })
        .await;
    }
    eventually("all synced", || world.catalog.all_synced(&namespaces, "s1")).await;
    let calls = world.backend.calls();
    assert_eq!(calls.iter().filter(|c| c.status == 429).count(), HUGE_429S, "{calls:?}");
    let next = calls.iter().filter(|c| c.status == 200).map(|c| c.at).min().expect("a run after the hold");
    let after = next.duration_since(opened_at);
    assert!(after >= MAX_RETRY_AFTER, "a run started {after:?} after the 429s, inside the hold");
    assert!(after < MAX_RETRY_AFTER + 3 * SLACK, "the hold lasted past max_retry_after: {after:?}");
    for (_, port) in &procs {
        eventually("the gauge is back at 0", || async { world.held_seconds(*port).await == Some(0.0) }).await;
    }
    let metrics = world.metrics(procs[0].1).await.unwrap();
    assert!(metrics.contains("# TYPE kayra_limit_held_seconds gauge"), "{metrics}");
    assert!(metrics.contains("# HELP kayra_limit_held_seconds "), "{metrics}");

    let warnings: Vec<serde_json::Value> = procs
        .iter()
        .flat_map(|(proc, _)| proc.lines())
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(&line).ok())
        .filter(|line| line["level"] == "warn" && line["message"].as_str().is_some_and(|m| m.contains("429")))
        .collect();
    let all_429: Vec<String> =
        procs.iter().flat_map(|(proc, _)| proc.lines()).filter(|line| line.contains("429")).collect();
    assert_eq!(warnings.len(), 1, "one warning line for the hold: {warnings:#?}\nevery line about a 429: {all_429:#?}");
    let warning = &warnings[0];
    assert_eq!(warning["mode"], "api", "{warning}");
    assert_eq!(warning["api"], common::API, "{warning}");
    assert!(namespaces.iter().any(|ns| warning["namespace"] == ns.as_str()), "{warning}");
    let until = warning["until"].as_str().expect("until");
    let until = humantime::parse_rfc3339(until).expect("until is an RFC 3339 time");
    let now = std::time::SystemTime::now();
    assert!(until <= now, "the hold ended by now, yet the line says {until:?}");
    assert!(now.duration_since(until).unwrap() < Duration::from_secs(120), "{until:?} is not this hold's end");
    for (mut proc, _) in procs {
        proc.assert_running();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_is_capped_shown_and_logged_once_on_etcd() {
    a_huge_retry_after_is_capped_shown_and_logged_once(World::etcd().await, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_is_capped_shown_and_logged_once_on_the_local_store() {
    a_huge_retry_after_is_capped_shown_and_logged_once(World::local().await, 1).await;
}
