//! Black-box tests of `kayra reconciler` as real OS processes sharing one
//! etcd: several processes run each job once, a killed lock holder is taken
//! over after the lease TTL, SIGTERM finishes the in-flight reconcile and
//! exits 0, JSON log lines carry `lock_id` and `sync_id`, a bad step
//! stops the process with a message naming mode, step and field, and a
//! notification whose sender is killed (-9) mid-delivery is delivered by
//! another process with the same `Kayra-Event-Id` (§14), and a rollout
//! outlives a reconciler killed mid-bake (§12).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Catalog, Proc};
use kayra_store::Store;
use kayra_testkit::backend::TestBackend;
use kayra_testkit::{Etcd, eventually, free_port};
use nix::sys::signal::Signal;

fn http_setup() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

struct World {
    etcd: Etcd,
    dir: tempfile::TempDir,
    catalog: Catalog,
    backend: TestBackend,
}

impl World {
    async fn new() -> Self {
        let etcd = Etcd::start().await;
        let store = Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await.unwrap());
        Self {
            etcd,
            dir: tempfile::tempdir().unwrap(),
            catalog: Catalog::new(store),
            backend: TestBackend::start().await,
        }
    }

    /// Writes a reconciler config whose mode `api` POSTs to `/<behaviour>/<namespace>`.
    fn config(&self, name: &str, behaviour: &str) -> PathBuf {
        self.config_with(name, behaviour, "json", free_port())
    }

    fn config_with(&self, name: &str, behaviour: &str, log_format: &str, port: u16) -> PathBuf {
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

    async fn seed(&self, namespaces: &[&str], sync_id: &str) {
        let namespaces: Vec<String> = namespaces.iter().map(|ns| ns.to_string()).collect();
        self.catalog.seed("api", &namespaces, sync_id).await;
    }

    async fn bump(&self, sync_id: &str) {
        self.catalog.bump(sync_id).await;
    }

    async fn all_synced(&self, namespaces: &[&str], sync_id: &str) -> bool {
        self.catalog.all_synced(namespaces, sync_id).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_run_each_job_once_per_sync_id() {
    let world = World::new().await;
    let namespaces: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    let namespaces: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    world.seed(&namespaces, "s1").await;
    let procs: Vec<Proc> = (0..3).map(|i| Proc::reconciler(&world.config(&format!("r{i}"), "slow"))).collect();
    eventually("all synced to s1", || world.all_synced(&namespaces, "s1")).await;
    world.bump("s2").await;
    eventually("all synced to s2", || world.all_synced(&namespaces, "s2")).await;
    // Give any redundant run a chance to show up before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for ns in &namespaces {
        assert_eq!(world.backend.count(&format!("/slow/{ns}")), 2, "{ns}: one run per SyncID across three processes");
    }
    assert_json_lines_carry_ids(procs.iter().flat_map(Proc::lines));
}

/// §12: three processes drive one rollout; the one killed (-9) mid-bake
/// neither stalls it nor repeats a wave, and the bakes keep their
/// deadlines (timestamps in the record, not timers in a process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_outlives_a_killed_reconciler_process() {
    use kayra_core::rollout::{RolloutPolicy, RolloutState, WavePolicy};
    let world = World::new().await;
    let namespaces: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    let namespaces: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    world.seed(&namespaces, "s1").await;
    let mut procs: Vec<Proc> = (0..3).map(|i| Proc::reconciler(&world.config(&format!("r{i}"), "slow"))).collect();
    eventually("all synced to s1", || world.all_synced(&namespaces, "s1")).await;
    let wave = |name: &str, size: &str, bake: &str| WavePolicy {
        name: name.into(),
        size: size.into(),
        bake: bake.into(),
        ..WavePolicy::default()
    };
    let policy = RolloutPolicy {
        waves: vec![wave("one", "4", "2s"), wave("two", "4", "2s"), wave("three", "", "")],
        ..RolloutPolicy::default()
    };
    let repo = &world.catalog.repo;
    repo.modify::<kayra_core::ApiRegistration, _>(
        kayra_catalog::repo::RecordRef::Registration(common::API),
        "registration",
        |r| {
            r.sync_id = "s2".into();
            r.rollout = Some(policy.clone());
            kayra_catalog::repo::Change::Write
        },
    )
    .await
    .unwrap();
    let state = || async { repo.rollout(common::API).await.unwrap().map(|r| r.value) };
    eventually("the first wave bakes", || async {
        state().await.is_some_and(|r| r.rollout.sync_id == "s2" && r.rollout.state == RolloutState::Baking)
    })
    .await;
    let mut killed = procs.remove(0);
    killed.signal(Signal::SIGKILL);
    killed.wait(Duration::from_secs(10));
    eventually("the rollout completes", || async {
        state().await.is_some_and(|r| r.rollout.state == RolloutState::Completed)
    })
    .await;
    let r = state().await.unwrap();
    for pair in r.rollout.waves.windows(2) {
        let finished = humantime::parse_rfc3339_weak(&pair[0].finished_at).unwrap();
        let started = humantime::parse_rfc3339_weak(&pair[1].started_at).unwrap();
        let baked = started.duration_since(finished).unwrap();
        assert!(baked >= Duration::from_secs(2), "{} started {baked:?} after {}", pair[1].name, pair[0].name);
    }
    assert!(world.all_synced(&namespaces, "s2").await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for ns in &namespaces {
        assert_eq!(world.backend.count(&format!("/slow/{ns}")), 2, "{ns}: one run per SyncID");
    }
    for proc in &mut procs {
        proc.assert_running();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_lock_holder_is_taken_over_after_the_lease_ttl() {
    let world = World::new().await;
    world.seed(&["core"], "s1").await;
    let mut first = Proc::reconciler(&world.config("first", "hold"));
    world.backend.wait_for("/hold/core", 1).await;
    // The second process blocks on the job lock the first one holds.
    let second = Proc::reconciler(&world.config("second", "hold"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(world.backend.count("/hold/core"), 1, "the second process must wait for the lock");
    first.signal(Signal::SIGKILL);
    first.wait(Duration::from_secs(10));
    let killed_at = Instant::now();
    world.backend.wait_for("/hold/core", 2).await;
    let waited = killed_at.elapsed();
    assert!(waited < Duration::from_secs(15), "takeover took {waited:?}");
    world.backend.release(2);
    eventually("synced by the second process", || world.all_synced(&["core"], "s1")).await;
    drop(second);
}

/// §14: the reconciler delivering an event is killed (-9) while the sink
/// holds its request; another process sends the same delivery again once
/// the dead one's claim runs out, and it ends `delivered`: never lost, one
/// delivery record (one `Kayra-Event-Id`) however many attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_whose_sender_is_killed_is_made_by_another_process() {
    let world = World::new().await;
    let sink = HoldingSink::start().await;
    let with_sink = |name: &str| {
        let path = world.config(name, "ok");
        let sink = format!(
            "notifications:\n  sinks:\n    ops:\n      url: \"{}\"\n      events: [subscription.activated]\n      timeout: 2s\n",
            sink.url
        );
        let yaml = std::fs::read_to_string(&path).unwrap() + &sink;
        std::fs::write(&path, yaml).unwrap();
        path
    };
    world.seed(&["core"], "s1").await;
    let mut first = Proc::reconciler(&with_sink("first"));
    // The first success tells the sink, which holds the request.
    eventually("the sink holds the first attempt", || async { !sink.event_ids().is_empty() }).await;
    let second = Proc::reconciler(&with_sink("second"));
    first.signal(Signal::SIGKILL);
    first.wait(Duration::from_secs(10));
    // The dead process's claim (timeout 2 s + margin) runs out; the second sends it.
    eventually("another process sends it again", || async { sink.event_ids().len() >= 2 }).await;
    let repo = &world.catalog.repo;
    eventually("the delivery is delivered", || async {
        let page = repo.deliveries_page(None, None, None, 0).await.unwrap();
        page.items.iter().any(|d| d.state == kayra_core::notifications::DeliveryState::Delivered)
    })
    .await;
    let page = repo.deliveries_page(None, None, None, 0).await.unwrap();
    assert_eq!(page.items.len(), 1, "one event, one sink, one delivery record: {:?}", page.items);
    assert_eq!(page.items[0].event.kind, "subscription.activated");
    assert!(page.items[0].attempts >= 1, "{:?}", page.items[0]);
    // Every attempt, the killed process's and the other's, carries the event's one id.
    let ids = sink.event_ids();
    assert!(ids.iter().all(|id| *id == page.items[0].event.id), "one Kayra-Event-Id on every attempt: {ids:?}");
    assert!(!page.items[0].event.id.is_empty());
    drop(second);
}

/// A sink on loopback that records each request's `Kayra-Event-Id` and
/// never answers the first request (its sender is killed meanwhile); later
/// ones answer 200.
struct HoldingSink {
    url: String,
    ids: Arc<Mutex<Vec<String>>>,
}

impl HoldingSink {
    async fn start() -> Self {
        let ids: Arc<Mutex<Vec<String>>> = Arc::default();
        let recorded = ids.clone();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let recorded = recorded.clone();
            async move {
                let id = headers.get("kayra-event-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
                let first = {
                    let mut ids = recorded.lock().unwrap();
                    ids.push(id.to_string());
                    ids.len() == 1
                };
                if first {
                    std::future::pending::<()>().await;
                }
                axum::http::StatusCode::OK
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/sink", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, ids }
    }

    /// The `Kayra-Event-Id` of every request so far, in arrival order.
    fn event_ids(&self) -> Vec<String> {
        self.ids.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_in_flight_reconcile_and_exits_zero() {
    http_setup();
    let world = World::new().await;
    world.seed(&["core"], "s1").await;
    let port = free_port();
    let mut proc = Proc::reconciler(&world.config_with("only", "hold", "text", port));
    world.backend.wait_for("/hold/core", 1).await;
    // The admin listener answers while the reconcile is in flight.
    let admin = format!("http://127.0.0.1:{port}");
    assert_eq!(reqwest::get(format!("{admin}/healthz")).await.unwrap().status(), 200);
    assert_eq!(reqwest::get(format!("{admin}/readyz")).await.unwrap().status(), 200);
    let metrics = reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap();
    // Platform §8: described, and present before anything happened (no
    // reconcile has finished yet: its counters are at 0).
    for name in [
        "kayra_reconciles_total",
        "kayra_reconciles_in_flight",
        "kayra_reconciler_pool_slots_in_use",
        "kayra_reconciler_watch_events_total",
        "kayra_work_queue_depth",
        "kayra_reconciler_job_panics_total",
        "kayra_subscriptions_behind",
        "kayra_sync_lag_seconds",
    ] {
        assert!(metrics.contains(&format!("# HELP {name} ")), "{name} has no HELP:\n{metrics}");
        assert!(metrics.contains(&format!("# TYPE {name} ")), "{name} has no TYPE:\n{metrics}");
    }
    for zero in ["kayra_reconciles_total{result=\"success\"} 0", "kayra_reconciler_job_panics_total 0"] {
        assert!(metrics.contains(zero), "{zero} missing from /metrics:\n{metrics}");
    }
    proc.signal(Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(proc.child.try_wait().unwrap().is_none(), "must wait for the in-flight reconcile");
    world.backend.release(1);
    let status = proc.wait(Duration::from_secs(30));
    assert!(status.success(), "exit status {status:?}");
    assert!(world.all_synced(&["core"], "s1").await, "the in-flight reconcile was recorded before exit");
    let lines = proc.lines();
    assert!(!lines.iter().any(|l| l.contains("s3cr3t-token-value")), "a token reached the logs");
    // Text format: every reconcile-path line shows both ids as key=value.
    let on_path: Vec<&String> = lines
        .iter()
        .filter(|l| {
            (l.contains("namespace=") && l.contains("api="))
                || l.contains("step=")
                || RECONCILE_PATH.iter().any(|m| l.contains(&format!("{m}:")) || l.contains(&format!("{m}::")))
        })
        .collect();
    assert!(!on_path.is_empty(), "no reconcile-path line logged:\n{}", lines.join("\n"));
    for line in on_path {
        assert!(line.contains("lock_id=") && line.contains("sync_id="), "ids missing: {line}");
    }
}

#[test]
fn bad_step_stops_the_process_naming_mode_step_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "reconciler:\n  mode:\n    api:\n      - method: get\n        endpoint: http://x/\n      - method: post\n        endpoint: \"http://x/{{ .Subscription.Namespace \"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kayra"))
        .args(["reconciler", "--config"])
        .arg(&path)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("api") && stderr.contains("[1]") && stderr.contains("endpoint"), "{stderr}");
}

#[test]
fn unknown_config_key_stops_serve_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "server:\n  listen: 127.0.0.1:0\n  max_body_bytez: 10\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kayra"))
        .args(["serve", "--config"])
        .arg(&path)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_body_bytez"));
}

#[test]
fn a_listen_address_that_is_no_address_stops_both_processes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "server:\n  listen: 999.1.1.1:80\n").unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kayra")).args(args).current_dir(dir.path()).output().unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let from_config = run(&["serve", "--config", path.to_str().unwrap()]);
    assert!(from_config.contains("server.listen") && from_config.contains("999.1.1.1"), "{from_config}");
    let from_flag = run(&["reconciler", "--listen", "999.1.1.1:80"]);
    assert!(from_flag.contains("--listen") && from_flag.contains("999.1.1.1"), "{from_flag}");
}

/// Modules whose every line is on the reconcile path.
const RECONCILE_PATH: [&str; 2] = ["kayra_reconciler::ensure", "kayra_pipeline"];

/// Platform contract §8: any reconciler line with both `namespace` and
/// `api`, or with `step`, also has `lock_id` and `sync_id` (and so does any
/// line logged by the reconcile path's own modules).
fn assert_json_lines_carry_ids(lines: impl IntoIterator<Item = String>) {
    let mut checked = 0;
    for line in lines {
        let value: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        for key in ["timestamp", "level", "message"] {
            assert!(value.get(key).is_some(), "{key} missing: {line}");
        }
        let target = value.get("target").and_then(|t| t.as_str()).unwrap_or_default();
        let on_path = (value.get("namespace").is_some() && value.get("api").is_some())
            || value.get("step").is_some()
            || RECONCILE_PATH.iter().any(|m| target.starts_with(m));
        if on_path {
            checked += 1;
            assert!(value.get("lock_id").is_some() && value.get("sync_id").is_some(), "ids missing: {line}");
        }
    }
    assert!(checked > 0, "no reconcile-path line was logged");
}
