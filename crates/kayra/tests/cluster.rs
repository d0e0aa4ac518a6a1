//! Black-box: the real `kayra serve` and `kayra reconciler` processes on a
//! real 3-member etcd cluster (`kayra_testkit::EtcdCluster`), losing or
//! freezing one member. Nothing restarts, every subscriber converges, each
//! step runs once per SyncID, acknowledged creates survive, and 503s last
//! only while no leader exists.
//!
//! The issue's fan-out has 200 subscribers; these tests use 60 (and 20 on
//! TLS) so each stays well under a minute on a shared 2-core machine. The
//! tests of this file run one at a time (each starts 3 etcd members and up
//! to 3 kayra processes).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{API, Catalog, Proc, names, sample};
use kayra_store::Store;
use kayra_store::etcd::EtcdStore;
use kayra_testkit::backend::TestBackend;
use kayra_testkit::{EtcdCluster, eventually, free_port};
use serde_json::json;

const TOKEN: &str = "cluster-test-admin-token";
/// The environment of every process here: the bootstrap token.
const TOKEN_ENV: &[(&str, &str)] = &[("KAYRA_BOOTSTRAP_TOKEN", TOKEN)];
/// `database.request_timeout` of every process here.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(1);
const LOCK_TTL: Duration = Duration::from_secs(5);

/// One test at a time: each starts a whole cluster and several processes.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct World {
    cluster: EtcdCluster,
    dir: tempfile::TempDir,
    catalog: Catalog,
    backend: TestBackend,
    http: reqwest::Client,
}

impl World {
    async fn new(tls: bool) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cluster = if tls { EtcdCluster::start_tls().await } else { EtcdCluster::start().await };
        let config = cluster.config("/kayra", LOCK_TTL);
        let store = Store::new(EtcdStore::connect_within(&config, REQUEST_TIMEOUT).await.expect("connect"));
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
        Self {
            cluster,
            dir: tempfile::tempdir().unwrap(),
            catalog: Catalog::new(store),
            backend: TestBackend::start().await,
            http,
        }
    }

    /// A config for every process: all members, `behaviour` picks the
    /// test backend's answer, and the given listen ports.
    fn config(&self, name: &str, behaviour: &str, serve_port: u16, admin_port: u16) -> PathBuf {
        let endpoints = self.cluster.endpoints().iter().map(|e| format!("\"{e}\"")).collect::<Vec<_>>().join(", ");
        let tls = match self.cluster.certificates() {
            Some(c) => format!(
                "\n    tls: {{ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\"}}",
                c.ca.display(),
                c.client_cert.display(),
                c.client_key.display()
            ),
            None => String::new(),
        };
        let yaml = format!(
            r#"platform: dev
region: local
server:
  listen: 127.0.0.1:{serve_port}
database:
  request_timeout: {timeout}ms
  etcd:
    endpoints: [{endpoints}]
    prefix: /kayra
    lock_ttl: {ttl}s
    lock_retry_interval: 50ms{tls}
logging:
  format: json
reconciler:
  listen: 127.0.0.1:{admin_port}
  max_concurrent_reconciles: 8
  mode:
    api:
      - method: post
        endpoint: "{base}/{behaviour}/{{{{ .Subscription.Namespace }}}}"
        timeout: 60s
"#,
            timeout = REQUEST_TIMEOUT.as_millis(),
            ttl = LOCK_TTL.as_secs(),
            base = self.backend.base,
        );
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn reconciler(&self, name: &str, behaviour: &str) -> (Proc, u16) {
        let admin = free_port();
        (Proc::start("reconciler", &self.config(name, behaviour, free_port(), admin), TOKEN_ENV), admin)
    }

    async fn serve(&self) -> (Proc, String) {
        let port = free_port();
        let proc = Proc::start("serve", &self.config("serve", "ok", port, free_port()), TOKEN_ENV);
        let base = format!("http://127.0.0.1:{port}");
        eventually("serve answers", || async {
            matches!(self.get(&format!("{base}/apis/catalog.example.com/v1/namespaces")).await, Ok(200))
        })
        .await;
        (proc, base)
    }

    async fn get(&self, url: &str) -> reqwest::Result<u16> {
        Ok(self.http.get(url).bearer_auth(TOKEN).send().await?.status().as_u16())
    }

    async fn seed(&self, namespaces: &[String], sync_id: &str) {
        self.catalog.seed("api", namespaces, sync_id).await;
    }

    async fn subscribe(&self, ns: &str) {
        self.catalog.subscribe(ns).await;
    }

    async fn bump(&self, sync_id: &str) {
        self.catalog.bump(sync_id).await;
    }

    async fn all_synced(&self, namespaces: &[String], sync_id: &str) -> bool {
        self.catalog.all_synced(namespaces, sync_id).await
    }
}

/// One HTTP request made by [`Clients`].
#[derive(Debug)]
struct Request {
    started: Instant,
    took: Duration,
    status: u16,
    what: String,
}

/// Creates a namespace and its subscription over HTTP, again and again,
/// until stopped; remembers every answer.
struct Clients {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Request>>,
}

impl Clients {
    fn start(http: reqwest::Client, base: &str, prefix: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let api = format!("{base}/apis/catalog.example.com/v1");
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut requests = Vec::new();
            let mut n = 0;
            while !flag.load(Ordering::Relaxed) {
                n += 1;
                let ns = format!("{prefix}{n:04}");
                let namespace = (format!("{api}/namespaces"), json!({"name": ns}), format!("namespace {ns}"));
                let sub = (format!("{api}/namespaces/{ns}/subscriptions"), json!({"api": API}), format!("sub {ns}"));
                for (url, body, what) in [namespace, sub] {
                    let started = Instant::now();
                    let status = match http.post(&url).bearer_auth(TOKEN).json(&body).send().await {
                        Ok(r) => r.status().as_u16(),
                        Err(_) => 0,
                    };
                    let created = status == 201;
                    requests.push(Request { started, took: started.elapsed(), status, what });
                    if !created {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            requests
        });
        Self { stop, task }
    }

    async fn stop(self) -> Vec<Request> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("clients")
    }
}

/// Every request answered 201 or 503, within the request timeout (plus
/// slack); 503s only until `errors_end_by`. Returns the namespaces whose
/// subscription was acknowledged.
fn check_requests(requests: &[Request], errors_end_by: Instant) -> Vec<String> {
    assert!(requests.len() > 10, "only {} requests were made", requests.len());
    let mut subscribed = Vec::new();
    for r in requests {
        assert!(r.took <= REQUEST_TIMEOUT + SLACK, "a request took {:?}: {r:?}", r.took);
        match r.status {
            201 => {
                if let Some(ns) = r.what.strip_prefix("sub ") {
                    subscribed.push(ns.to_string());
                }
            }
            503 => {
                let ended = r.started + r.took;
                assert!(ended <= errors_end_by, "503 {:?} after the deadline: {r:?}", ended - errors_end_by);
            }
            other => panic!("unexpected status {other}: {r:?}"),
        }
    }
    subscribed
}

/// Kills the leader in the middle of a fan-out of `subscribers` with two
/// reconcilers and serve taking creates.
async fn leader_killed_during_a_fan_out(tls: bool, subscribers: usize) {
    let mut world = World::new(tls).await;
    let namespaces = names("f", subscribers);
    world.seed(&namespaces, "s1").await;
    let (mut serve, base) = world.serve().await;
    let mut reconcilers = [world.reconciler("r0", "slow").0, world.reconciler("r1", "slow").0];
    eventually("all synced to s1", || world.all_synced(&namespaces, "s1")).await;

    // The bump is acknowledged before the first create: every subscription
    // the clients create is first synced to s2, its only SyncID.
    world.bump("s2").await;
    let clients = Clients::start(world.http.clone(), &base, "e");
    world.backend.wait_for("/slow/f", subscribers + subscribers / 4).await;
    let leader = world.cluster.leader().await;
    world.cluster.kill(leader);
    let new_leader = world.cluster.leader().await;
    let elected = Instant::now();
    assert_ne!(new_leader, leader);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = clients.stop().await;
    let subscribed = check_requests(&requests, elected + REQUEST_TIMEOUT);
    assert!(requests.iter().any(|r| r.started > elected && r.status == 201), "nothing was created after the election");

    eventually("the fan-out completes", || world.all_synced(&namespaces, "s2")).await;
    eventually("subscriptions created meanwhile converge", || world.all_synced(&subscribed, "s2")).await;
    // Acknowledged namespace creates all survived.
    for r in requests.iter().filter(|r| r.status == 201) {
        if let Some(ns) = r.what.strip_prefix("namespace ") {
            let url = format!("{base}/apis/catalog.example.com/v1/namespaces/{ns}");
            assert_eq!(world.get(&url).await.unwrap(), 200, "acknowledged namespace {ns} is gone");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for ns in &namespaces {
        assert_eq!(world.backend.count(&format!("/slow/{ns}")), 2, "{ns}: one run per SyncID");
    }
    for ns in &subscribed {
        assert_eq!(world.backend.count(&format!("/slow/{ns}")), 1, "{ns}: one run for its only SyncID");
    }
    serve.assert_running();
    for r in &mut reconcilers {
        r.assert_running();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_during_a_fan_out_with_two_reconcilers() {
    let _serial = SERIAL.lock().await;
    leader_killed_during_a_fan_out(false, 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_of_a_tls_cluster_with_client_certificates() {
    let _serial = SERIAL.lock().await;
    leader_killed_during_a_fan_out(true, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_delays_no_request_beyond_the_request_timeout() {
    let _serial = SERIAL.lock().await;
    let mut world = World::new(false).await;
    world.seed(&names("f", 5), "s1").await;
    let (mut serve, base) = world.serve().await;
    let (mut reconciler, _) = world.reconciler("r0", "ok");
    let metrics_url = format!("{base}/metrics");
    let metrics = world.http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
    let m0 = world.cluster.endpoint(0);
    for name in ["kayra_store_endpoint", "kayra_store_failovers_total", "kayra_store_errors_total"] {
        assert!(metrics.contains(&format!("# HELP {name}")), "{name} undescribed:\n{metrics}");
    }
    assert_eq!(sample(&metrics, &format!("kayra_store_endpoint{{endpoint=\"{m0}\"}}")), Some(1.0), "{metrics}");

    let clients = Clients::start(world.http.clone(), &base, "z");
    tokio::time::sleep(Duration::from_millis(500)).await;
    world.cluster.freeze(0);
    let frozen = Instant::now();
    // If m0 led, the others elect a new leader: the only window for 503s.
    assert_ne!(world.cluster.leader().await, 0);
    let elected = Instant::now();
    tokio::time::sleep(Duration::from_secs(12).saturating_sub(frozen.elapsed())).await;
    world.cluster.thaw(0);
    let requests = clients.stop().await;
    let subscribed = check_requests(&requests, elected + REQUEST_TIMEOUT);
    assert!(subscribed.len() > 5, "only {} subscriptions were created during the freeze", subscribed.len());
    eventually("subscriptions created during the freeze converge", || world.all_synced(&subscribed, "s1")).await;

    let healthy = format!("kayra_store_endpoint_healthy{{endpoint=\"{m0}\"}}");
    eventually("the thawed member is healthy again for serve", || async {
        let metrics = world.http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
        sample(&metrics, &healthy) == Some(1.0) && sample(&metrics, "kayra_store_failovers_total").unwrap_or(0.0) >= 1.0
    })
    .await;
    serve.assert_running();
    reconciler.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_member_a_reconcilers_watch_is_on_misses_no_subscription() {
    let _serial = SERIAL.lock().await;
    let mut world = World::new(false).await;
    let seeded = names("f", 3);
    world.seed(&seeded, "s1").await;
    let (mut reconciler, admin) = world.reconciler("r0", "ok");
    eventually("synced to s1", || world.all_synced(&seeded, "s1")).await;
    // The reconciler's calls, and so its watch, are on m0.
    let metrics = world.http.get(format!("http://127.0.0.1:{admin}/metrics")).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let m0 = world.cluster.endpoint(0);
    assert_eq!(sample(&metrics, &format!("kayra_store_endpoint{{endpoint=\"{m0}\"}}")), Some(1.0), "{metrics}");
    assert!(metrics.contains("# HELP kayra_store_failovers_total"), "{metrics}");

    world.cluster.kill(0);
    let created = vec!["late".to_string()];
    world.subscribe("late").await;
    eventually("the subscription created at the kill is activated", || world.all_synced(&created, "s1")).await;
    assert_eq!(world.backend.count("/ok/late"), 1);
    reconciler.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_locks_held_through_a_leader_change_are_kept() {
    let _serial = SERIAL.lock().await;
    let mut world = World::new(false).await;
    let core = vec!["core".to_string()];
    world.seed(&core, "s1").await;
    let (mut first, _) = world.reconciler("first", "hold");
    world.backend.wait_for("/hold/core", 1).await;
    let (mut second, _) = world.reconciler("second", "hold");
    // Both reconcilers (and the holder's lease keep-alive) are on m0: make
    // it the leader and kill it, an election and a failover at once.
    world.cluster.move_leader(0).await;
    world.cluster.kill(0);
    world.cluster.leader().await;
    // Longer than the lock TTL: a lost session would hand the job over.
    tokio::time::sleep(LOCK_TTL + LOCK_TTL / 2).await;
    assert_eq!(world.backend.count("/hold/core"), 1, "a second reconciler ran the job held through the election");
    world.backend.release(1);
    eventually("synced by the holder", || world.all_synced(&core, "s1")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(world.backend.count("/hold/core"), 1, "the job ran once for its SyncID");
    first.assert_running();
    second.assert_running();
}
