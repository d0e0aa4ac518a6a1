//! Notifications (platform §14) end to end: reconcilers in this process,
//! a real store (both backends; several reconcilers on etcd), and real
//! HTTP receivers on loopback standing in for sinks and backends.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use common::{Kind, Running, Seed, eventually, store};
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_config::{NotificationsConfig, ReconcilerConfig, SecretSource};
use kayra_core::notifications::{Delivery, DeliveryState};
use kayra_reconciler::Reconciler;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

const API: &str = "compute.example.com";
const SIGNING: &str = "s1gn-the-b0dy-0451";
const HOOK: &str = "h00k-t0ken-3141";

// ------------------------------------------------------------ receivers

/// One request a sink received.
#[derive(Debug, Clone)]
struct Got {
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
    at: Instant,
}

impl Got {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    fn event_type(&self) -> &str {
        self.header("kayra-event-type")
    }
}

/// How a sink answers its `n`th request (1-based) of one event id.
#[derive(Clone)]
enum Answer {
    Status(u16),
    /// A status with `Retry-After: seconds`.
    RetryAfter(u16, u64),
    /// The status and, as the body, the request's own headers.
    Echo(u16),
    /// Never answers.
    Hang,
}

type Policy = Arc<dyn Fn(usize) -> Answer + Send + Sync>;

/// A sink at `<base>/sink` and a backend for steps at `<base>/backend/<ns>`
/// (500 while `failing` holds the namespace, else 200).
#[derive(Clone)]
struct Receiver {
    base: String,
    got: Arc<Mutex<Vec<Got>>>,
    policy: Arc<Mutex<Policy>>,
    failing: Arc<Mutex<BTreeSet<String>>>,
}

impl Receiver {
    async fn start(policy: impl Fn(usize) -> Answer + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let receiver = Self {
            base: format!("http://{}", listener.local_addr().unwrap()),
            got: Arc::default(),
            policy: Arc::new(Mutex::new(Arc::new(policy))),
            failing: Arc::default(),
        };
        let app = axum::Router::new().fallback(answer).with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        receiver
    }

    fn sink_url(&self) -> String {
        format!("{}/sink", self.base)
    }

    fn set_policy(&self, policy: impl Fn(usize) -> Answer + Send + Sync + 'static) {
        *self.policy.lock().unwrap() = Arc::new(policy);
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    fn of_type(&self, kind: &str) -> Vec<Got> {
        self.got().into_iter().filter(|g| g.event_type() == kind).collect()
    }

    fn fail(&self, namespaces: &[String]) {
        *self.failing.lock().unwrap() = namespaces.iter().cloned().collect();
    }
}

async fn answer(State(r): State<Receiver>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(ns) = uri.path().strip_prefix("/backend/") {
        let failing = r.failing.lock().unwrap().contains(ns);
        return if failing { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK }.into_response();
    }
    let headers: BTreeMap<String, String> =
        headers.iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or_default().to_string())).collect();
    let got = Got { headers, body: body.to_vec(), at: Instant::now() };
    let nth = {
        let mut all = r.got.lock().unwrap();
        all.push(got.clone());
        all.iter().filter(|g| g.header("kayra-event-id") == got.header("kayra-event-id")).count()
    };
    let policy = r.policy.lock().unwrap().clone();
    let status = |code: u16| StatusCode::from_u16(code).unwrap();
    match policy(nth) {
        Answer::Status(code) => status(code).into_response(),
        Answer::RetryAfter(code, seconds) => (status(code), [("retry-after", seconds.to_string())]).into_response(),
        Answer::Echo(code) => (status(code), format!("{:?}", got.headers)).into_response(),
        Answer::Hang => std::future::pending().await,
    }
}

// ------------------------------------------------------------ setup

/// The secrets live in files of `dir` (no process-wide env in tests).
fn secrets(dir: &std::path::Path) -> BTreeMap<String, SecretSource> {
    let mut out = BTreeMap::new();
    for (name, value) in [("sign", SIGNING), ("hook", HOOK)] {
        let path = dir.join(name);
        std::fs::write(&path, format!("{value}\n")).unwrap();
        out.insert(name.to_string(), SecretSource::File(path));
    }
    out
}

fn notifications(url: &str, events: &[&str], max_attempts: u32, timeout: &str) -> NotificationsConfig {
    let yaml = format!(
        "sinks:\n  ops:\n    url: {url}\n    signing_secret: sign\n    \
         headers: {{Authorization: {{type: Bearer, secret: hook}}, X-Plain: hello}}\n    \
         events: [{}]\n    timeout: {timeout}\nmax_attempts: {max_attempts}\n",
        events.join(", ")
    );
    serde_norway::from_str(&yaml).unwrap()
}

struct Setup {
    config: ReconcilerConfig,
    notifications: NotificationsConfig,
    _dir: tempfile::TempDir,
}

fn setup(receiver: &Receiver, events: &[&str], max_attempts: u32, timeout: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ReconcilerConfig { secrets: secrets(dir.path()), ..ReconcilerConfig::default() };
    let endpoint = format!("{}/backend/{{{{ .Subscription.Namespace }}}}", receiver.base);
    common::one_step_mode(&mut config, "m", &endpoint);
    Setup { config, notifications: notifications(&receiver.sink_url(), events, max_attempts, timeout), _dir: dir }
}

fn start(repo: &Repository, setup: &Setup) -> Running {
    let cancel = CancellationToken::new();
    let mut reconciler = Reconciler::new(repo.clone(), setup.config.clone(), cancel.clone())
        .unwrap()
        .with_notifications(&setup.notifications)
        .unwrap();
    reconciler.set_notify_retry_base(Duration::from_millis(20));
    Running::spawn(reconciler, cancel)
}

async fn deliveries(repo: &Repository) -> Vec<Delivery> {
    repo.deliveries_page(None, None, None, 0).await.unwrap().items
}

async fn all_settled(repo: &Repository) -> bool {
    let all = deliveries(repo).await;
    !all.is_empty() && all.iter().all(|d| d.state != DeliveryState::Pending)
}

/// HMAC-SHA256 written out from its definition (RFC 2104), so the test
/// does not check the notifier with the notifier's own code.
fn hmac_sha256(key: &[u8], message: &[u8]) -> String {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    let outer = Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

fn assert_signed(got: &Got) {
    let timestamp = got.header("kayra-timestamp");
    assert!(timestamp.parse::<u64>().is_ok(), "Kayra-Timestamp is Unix seconds: {timestamp:?}");
    let mut message = format!("{timestamp}.").into_bytes();
    message.extend_from_slice(&got.body);
    let want = format!("sha256={}", hmac_sha256(SIGNING.as_bytes(), &message));
    assert_eq!(got.header("kayra-signature"), want);
}

// ------------------------------------------------------------ tests

async fn retried_until_delivered_with_one_id_and_a_valid_signature(kind: Kind) {
    let ts = store(kind).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|n| if n <= 3 { Answer::Status(500) } else { Answer::Status(200) }).await;
    let setup = setup(&receiver, &["subscription.activated"], 10, "5s");
    let _reconciler = start(&repo, &setup);
    let seed = Seed(&repo);
    seed.namespace("core").await;
    seed.registration(API, "m", "s1").await;
    seed.subscription("core", API).await;

    eventually("four attempts reach the sink", || async { receiver.got().len() >= 4 }).await;
    eventually("the delivery is recorded delivered", || all_settled(&repo)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 4, "three failures and one success: {got:?}");
    let ids: BTreeSet<&str> = got.iter().map(|g| g.header("kayra-event-id")).collect();
    assert_eq!(ids.len(), 1, "one event id on every attempt: {ids:?}");
    for g in &got {
        assert_signed(g);
        assert_eq!(g.header("content-type"), "application/json");
        assert_eq!(g.header("kayra-event-type"), "subscription.activated");
        assert_eq!(g.header("authorization"), format!("Bearer {HOOK}"));
        assert_eq!(g.header("x-plain"), "hello");
    }
    let body = got[3].json();
    let keys: BTreeSet<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
    let want = ["api", "data", "id", "message", "namespace", "run_id", "sync_id", "time", "type"];
    assert_eq!(keys, want.into_iter().collect());
    assert_eq!((body["api"].as_str(), body["namespace"].as_str()), (Some(API), Some("core")));
    assert_eq!((body["sync_id"].as_str(), body["id"].as_str()), (Some("s1"), ids.first().copied()));
    assert!(!body["run_id"].as_str().unwrap().is_empty());

    let [delivery] = deliveries(&repo).await.try_into().unwrap();
    assert_eq!((delivery.state, delivery.attempts, delivery.sink.as_str()), (DeliveryState::Delivered, 4, "ops"));
    assert!(delivery.last_error.contains("500"), "{}", delivery.last_error);
    assert!(!delivery.delivered_at.is_empty() && delivery.claim.is_none());
}

async fn a_sink_that_never_answers_ends_dead_and_a_retry_sends_it_again(kind: Kind) {
    let ts = store(kind).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|_| Answer::Status(503)).await;
    let setup = setup(&receiver, &["subscription.activated"], 3, "5s");
    let _reconciler = start(&repo, &setup);
    let seed = Seed(&repo);
    seed.namespace("core").await;
    seed.registration(API, "m", "s1").await;
    seed.subscription("core", API).await;

    eventually("the delivery dies", || async {
        deliveries(&repo).await.first().is_some_and(|d| d.state == DeliveryState::Dead)
    })
    .await;
    let dead = deliveries(&repo).await.remove(0);
    assert_eq!(dead.attempts, 3, "max_attempts");
    assert_eq!(receiver.got().len(), 3);
    assert!(dead.last_error.contains("503"), "{}", dead.last_error);

    receiver.set_policy(|_| Answer::Status(204));
    let retried = repo.retry_delivery(&dead.id).await.unwrap();
    assert_eq!((retried.state, retried.attempts), (DeliveryState::Pending, 0));
    eventually("the retried delivery is delivered", || async {
        deliveries(&repo).await.first().is_some_and(|d| d.state == DeliveryState::Delivered)
    })
    .await;
    let got = receiver.got();
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|g| g.header("kayra-event-id") == dead.event.id), "the same event, the same id");
    assert_eq!(deliveries(&repo).await[0].attempts, 1);
}

async fn retry_after_is_honoured(kind: Kind) {
    let ts = store(kind).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|n| if n == 1 { Answer::RetryAfter(503, 2) } else { Answer::Status(200) }).await;
    let setup = setup(&receiver, &["subscription.activated"], 10, "5s");
    let _reconciler = start(&repo, &setup);
    let seed = Seed(&repo);
    seed.namespace("core").await;
    seed.registration(API, "m", "s1").await;
    seed.subscription("core", API).await;

    eventually("the delivery is recorded delivered", || all_settled(&repo)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 2);
    let gap = got[1].at - got[0].at;
    assert!(gap >= Duration::from_millis(1900), "Retry-After: 2 waited only {gap:?} (the backoff alone is 20ms)");
}

async fn a_fan_out_tells_each_failure_once_and_completes_once(kind: Kind) {
    let ts = store(kind).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|_| Answer::Status(200)).await;
    let events = ["subscription.failed", "subscription.recovered", "fanout.completed"];
    let setup = setup(&receiver, &events, 10, "5s");
    let _reconciler = start(&repo, &setup);
    let seed = Seed(&repo);
    seed.registration(API, "m", "s1").await;
    let namespaces: Vec<String> = (0..200).map(|i| format!("ns-{i:03}")).collect();
    for ns in &namespaces {
        seed.namespace(ns).await;
        seed.subscription(ns, API).await;
    }
    let completed = |sync_id: &'static str| {
        let receiver = receiver.clone();
        move || {
            let found = receiver.of_type("fanout.completed").into_iter().filter(|g| g.json()["sync_id"] == sync_id);
            found.map(|g| g.header("kayra-event-id").to_string()).collect::<BTreeSet<_>>()
        }
    };
    eventually("the first fan-out completes", || async { !completed("s1")().is_empty() }).await;

    let failing: Vec<String> = ["ns-007", "ns-050", "ns-051", "ns-123", "ns-199"].map(String::from).to_vec();
    receiver.fail(&failing);
    seed.bump(API, "s2").await;
    eventually("the second fan-out completes", || async { !completed("s2")().is_empty() }).await;
    eventually("every delivery settles", || all_settled(&repo)).await;
    assert_eq!(completed("s1")().len(), 1, "one fanout.completed for s1");
    assert_eq!(completed("s2")().len(), 1, "one fanout.completed for s2");
    let fanout = receiver.of_type("fanout.completed").into_iter().find(|g| g.json()["sync_id"] == "s2").unwrap();
    let data = &fanout.json()["data"];
    assert_eq!(
        (data["total"].as_u64(), data["synced"].as_u64(), data["failed"].as_u64()),
        (Some(200), Some(195), Some(5))
    );
    assert_eq!(data["failed_namespaces"], serde_json::json!(failing));
    assert!(data["seconds"].is_number());
    let failed: BTreeSet<String> = receiver
        .of_type("subscription.failed")
        .iter()
        .map(|g| g.json()["namespace"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(failed, failing.iter().cloned().collect::<BTreeSet<_>>());
    assert_eq!(receiver.of_type("subscription.failed").len(), 5, "once per decision, not once per run");

    // A later success of one of them: one recovery.
    receiver.fail(&[]);
    seed.force_resync("ns-050", API).await;
    eventually("the recovery is told", || async { !receiver.of_type("subscription.recovered").is_empty() }).await;
    eventually("every delivery settles", || all_settled(&repo)).await;
    let recovered = receiver.of_type("subscription.recovered");
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0].json()["namespace"], "ns-050");
    assert_eq!(completed("s2")().len(), 1, "no second fanout.completed for s2");
}

/// The result that finishes a fan-out carries its event (§14: in the
/// causing transaction): with one job at a time, the fan-out marker and
/// the event's delivery are written with the last subscriber's result,
/// not after it by the debounced check.
async fn the_last_result_carries_the_fan_out(kind: Kind) {
    let ts = store(kind).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|_| Answer::Status(200)).await;
    let mut setup = setup(&receiver, &["fanout.completed"], 10, "5s");
    setup.config.max_concurrent_reconciles = 1;
    let seed = Seed(&repo);
    seed.registration(API, "m", "s1").await;
    let namespaces = ["ns-a", "ns-b", "ns-c"];
    for ns in namespaces {
        seed.namespace(ns).await;
        seed.subscription(ns, API).await;
    }
    // Started once all three exist: a fan-out of s1 to fewer (the first
    // ones synced before the last was created) would complete early.
    let _reconciler = start(&repo, &setup);
    for sync_id in ["s1", "s2"] {
        if sync_id == "s2" {
            seed.bump(API, sync_id).await;
        }
        let told = || receiver.of_type("fanout.completed").into_iter().filter(|g| g.json()["sync_id"] == sync_id);
        eventually("the fan-out completes", || async { told().next().is_some() }).await;
        let store = repo.store();
        let marker = store.get(&repo.store_key_of(RecordRef::FanoutMarker(API))).await.unwrap().0.unwrap();
        let mut last = 0;
        for ns in namespaces {
            let key = repo.store_key_of(RecordRef::Subscription { namespace: ns, api: API });
            last = last.max(store.get(&key).await.unwrap().0.unwrap().mod_revision);
        }
        // etcd gives a transaction one revision; the local store one per
        // put, the subscription's last, its riders (run, cursor, the
        // marker, the delivery) just before it.
        match kind {
            Kind::Etcd => assert_eq!(marker.mod_revision, last, "{sync_id}: the marker is in the last result's txn"),
            Kind::Local => assert!(
                marker.mod_revision < last && last - marker.mod_revision <= 4,
                "{sync_id}: the marker at {} is a rider of the last result at {last}",
                marker.mod_revision
            ),
        }
        assert_eq!(told().count(), 1, "{sync_id}: told once");
    }
    let data = receiver.of_type("fanout.completed").last().unwrap().json()["data"].clone();
    assert_eq!((data["total"].as_u64(), data["synced"].as_u64()), (Some(3), Some(3)));
    assert!(logs().contains("fan-out completed with this result"));
}

async fn a_registration_without_subscribers_tells_nothing(kind: Kind) {
    let ts = store(kind).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|_| Answer::Status(200)).await;
    let setup = setup(&receiver, &["fanout.completed", "subscription.activated"], 10, "5s");
    let _reconciler = start(&repo, &setup);
    let seed = Seed(&repo);
    seed.registration("empty.example.com", "m", "s1").await;
    seed.bump("empty.example.com", "s2").await;
    // Something that does complete, afterwards: once it is told, the
    // empty registration had every chance to be told too.
    seed.namespace("core").await;
    seed.registration(API, "m", "s1").await;
    seed.subscription("core", API).await;
    eventually("the other fan-out completes", || async { !receiver.of_type("fanout.completed").is_empty() }).await;
    tokio::time::sleep(kayra_reconciler::fanout::DEBOUNCE * 3).await;
    let told: Vec<_> = receiver.of_type("fanout.completed").iter().map(|g| g.json()["api"].clone()).collect();
    assert_eq!(told, [serde_json::json!(API)]);
}

async fn a_sinks_secrets_never_reach_logs_records_or_errors(kind: Kind) {
    let ts = store(kind).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    // The sink answers with the request's own headers: its error carries the token.
    let receiver = Receiver::start(|_| Answer::Echo(500)).await;
    let setup = setup(&receiver, &["subscription.activated"], 2, "5s");
    let _reconciler = start(&repo, &setup);
    let seed = Seed(&repo);
    seed.namespace("core").await;
    seed.registration(API, "m", "s1").await;
    seed.subscription("core", API).await;
    eventually("the delivery dies", || all_settled(&repo)).await;
    assert_eq!(receiver.got()[0].header("authorization"), format!("Bearer {HOOK}"), "the sink got the secret");
    let records = serde_json::to_string(&deliveries(&repo).await).unwrap();
    assert!(records.contains("HTTP 500"), "{records}");
    for secret in [HOOK, SIGNING] {
        assert!(!records.contains(secret), "a record holds a secret: {records}");
        assert!(!logs().contains(secret), "a log line holds a secret");
    }
    assert!(logs().contains("notification not delivered"), "the failure was logged");
}

/// A delivery of event `event` to `sink` in `state`, stored as a notifier
/// leaves one: delivered `age` ago when delivered, dead after 3 attempts.
async fn plant(repo: &Repository, event: &str, sink: &str, state: DeliveryState, age: Duration) -> Delivery {
    let event = kayra_core::notifications::Event {
        id: event.into(),
        kind: "subscription.activated".into(),
        api: API.into(),
        ..Default::default()
    };
    let at = humantime::format_rfc3339_millis(std::time::SystemTime::now() - age).to_string();
    let mut delivery = Delivery { state, attempts: 3, last_attempt_at: at.clone(), ..Delivery::new(&event, sink) };
    if state == DeliveryState::Delivered {
        delivery.delivered_at = at;
    }
    repo.create(RecordRef::Delivery(&delivery.id), &delivery, "delivery").await.unwrap();
    delivery
}

async fn delivered_ones_are_deleted_after_keep_delivered_and_nothing_else(kind: Kind) {
    let ts = store(kind).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|_| Answer::Status(200)).await;
    let mut setup = setup(&receiver, &["subscription.activated"], 10, "5s");
    // Shorter than the default 24h: the 2h-old delivered one is past it.
    setup.notifications.keep_delivered = kayra_config::Duration(Duration::from_secs(3600));
    let hour = Duration::from_secs(3600);
    let old = plant(&repo, "old", "ops", DeliveryState::Delivered, 2 * hour).await;
    let recent = plant(&repo, "recent", "ops", DeliveryState::Delivered, hour / 2).await;
    let dead = plant(&repo, "dead", "ops", DeliveryState::Dead, 2 * hour).await;
    let unknown = plant(&repo, "unknown", "gone", DeliveryState::Pending, 2 * hour).await;
    let first = start(&repo, &setup);
    let seed = Seed(&repo);
    seed.namespace("core").await;
    seed.registration(API, "m", "s1").await;
    seed.subscription("core", API).await;
    let planted = [&old.id, &recent.id, &dead.id, &unknown.id];
    eventually("the activation is delivered", || async {
        let all = deliveries(&repo).await;
        all.iter().any(|d| !planted.contains(&&d.id) && d.state == DeliveryState::Delivered)
    })
    .await;
    assert_eq!(receiver.got().len(), 1, "planted deliveries are not sent");
    let ids = |all: Vec<Delivery>| all.into_iter().map(|d| d.id).collect::<BTreeSet<_>>();
    // The notifier cleans up every few seconds: wait for it to remove the old one.
    eventually("the delivered one past keep_delivered is deleted", || async {
        !ids(deliveries(&repo).await).contains(&old.id)
    })
    .await;
    let left = deliveries(&repo).await;
    let fresh: Vec<&Delivery> = left.iter().filter(|d| !planted.contains(&&d.id)).collect();
    assert_eq!(fresh.len(), 1, "the notifier's own delivery stays: {left:?}");
    assert_eq!(fresh[0].state, DeliveryState::Delivered);
    let stayed = |id: &str| left.iter().find(|d| d.id == id).cloned();
    assert_eq!(stayed(&recent.id).map(|d| d.state), Some(DeliveryState::Delivered), "younger than keep_delivered");
    assert_eq!(stayed(&dead.id).map(|d| d.state), Some(DeliveryState::Dead), "dead ones stay until retried");
    assert_eq!(stayed(&unknown.id), Some(unknown.clone()), "a pending one to an unknown sink is untouched");
    first.stop().await;

    // With a keep_delivered of a second, the notifier's own delivered one
    // (its `delivered_at` as the notifier wrote it) goes too.
    setup.notifications.keep_delivered = kayra_config::Duration(Duration::from_secs(1));
    let _second = start(&repo, &setup);
    eventually("every delivered one is deleted", || async {
        deliveries(&repo).await.iter().all(|d| d.state != DeliveryState::Delivered)
    })
    .await;
    assert_eq!(ids(deliveries(&repo).await), BTreeSet::from([dead.id.clone(), unknown.id.clone()]));
}

async fn each_event_reaches_the_sink_once_from_three_reconcilers(_: Kind) {
    let ts = store(Kind::Etcd).await;
    let receiver = Receiver::start(|_| Answer::Status(200)).await;
    let setup = setup(&receiver, &["subscription.activated", "fanout.completed"], 10, "5s");
    let mut fleet = Vec::new();
    for _ in 0..3 {
        let repo = Repository::new(ts.connect_again().await, "dev", "local");
        fleet.push(start(&repo, &setup));
    }
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let seed = Seed(&repo);
    seed.registration(API, "m", "s1").await;
    for i in 0..20 {
        let ns = format!("ns-{i:02}");
        seed.namespace(&ns).await;
        seed.subscription(&ns, API).await;
    }
    eventually("21 events arrive", || async { receiver.got().len() >= 21 }).await;
    eventually("every delivery settles", || all_settled(&repo)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = receiver.got();
    let ids: BTreeSet<&str> = got.iter().map(|g| g.header("kayra-event-id")).collect();
    assert_eq!((got.len(), ids.len()), (21, 21), "20 activations and one fan-out, each once");
    assert_eq!(receiver.of_type("fanout.completed").len(), 1);
    for running in fleet {
        running.stop().await;
    }
}

async fn a_delivery_cut_off_mid_send_is_sent_again_by_another(_: Kind) {
    let ts = store(Kind::Etcd).await;
    let receiver = Receiver::start(|n| if n == 1 { Answer::Hang } else { Answer::Status(200) }).await;
    let setup = setup(&receiver, &["subscription.activated"], 10, "2s");
    let first = start(&Repository::new(ts.connect_again().await, "dev", "local"), &setup);
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let seed = Seed(&repo);
    seed.namespace("core").await;
    seed.registration(API, "m", "s1").await;
    seed.subscription("core", API).await;
    eventually("the sink holds the first attempt", || async { receiver.got().len() == 1 }).await;
    // Stopped while the sink holds its request: its claim stays behind.
    first.stop().await;
    let _second = start(&Repository::new(ts.connect_again().await, "dev", "local"), &setup);
    eventually("another reconciler delivers it", || all_settled(&repo)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].header("kayra-event-id"), got[1].header("kayra-event-id"), "the same id");
    let [delivery] = deliveries(&repo).await.try_into().unwrap();
    assert_eq!(delivery.state, DeliveryState::Delivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_sink_secrets_stop_the_reconciler_naming_the_key() {
    let ts = store(Kind::Local).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|_| Answer::Status(200)).await;
    let mut setup = setup(&receiver, &["subscription.activated"], 10, "5s");
    setup.config.secrets.remove("sign");
    let cancel = CancellationToken::new();
    let refused = Reconciler::new(repo, setup.config, cancel).unwrap().with_notifications(&setup.notifications);
    let error = refused.err().expect("an unknown signing secret is refused").to_string();
    assert!(error.contains("notifications.sinks.ops.signing_secret") && error.contains("\"sign\""), "{error}");
}

/// The process-wide metrics recorder, installed once for this binary.
fn metrics() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).unwrap();
        handle
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_counted_by_sink_and_result() {
    let handle = metrics();
    let ts = store(Kind::Local).await;
    let repo = Repository::new(ts.store.clone(), "dev", "local");
    let receiver = Receiver::start(|n| if n == 1 { Answer::Status(500) } else { Answer::Status(200) }).await;
    let mut setup = setup(&receiver, &["subscription.activated"], 10, "5s");
    let metered = setup.notifications.sinks.remove("ops").unwrap();
    setup.notifications.sinks.insert("metered".into(), metered);
    let _reconciler = start(&repo, &setup);
    let sample = |series: &str| {
        let rendered = handle.render();
        rendered.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
    };
    let total = |result: &str| sample(&format!("kayra_notifications_total{{sink=\"metered\",result=\"{result}\"}}"));
    assert_eq!(total("dead"), Some(0.0), "described at startup: {}", handle.render());
    assert_eq!(sample("kayra_notifications_pending{sink=\"metered\"}"), Some(0.0));
    let seed = Seed(&repo);
    seed.namespace("core").await;
    seed.registration(API, "m", "s1").await;
    seed.subscription("core", API).await;
    eventually("one failed attempt and one delivery are counted", || async {
        total("failed") == Some(1.0) && total("delivered") == Some(1.0)
    })
    .await;
    eventually("nothing is pending", || async { sample("kayra_notifications_pending{sink=\"metered\"}") == Some(0.0) })
        .await;
    assert_eq!(total("dead"), Some(0.0));
}

// ------------------------------------------------------------ logs

fn capture_logs() {
    common::logs::capture(common::logs::Format::Text);
}

fn logs() -> String {
    common::logs::captured()
}

macro_rules! notify_tests {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::capture_logs();
                    super::$name(super::common::Kind::Local).await
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::capture_logs();
                    super::$name(super::common::Kind::Etcd).await
                }
            )*
        }
    };
}

notify_tests!(
    retried_until_delivered_with_one_id_and_a_valid_signature,
    a_sink_that_never_answers_ends_dead_and_a_retry_sends_it_again,
    retry_after_is_honoured,
    a_fan_out_tells_each_failure_once_and_completes_once,
    the_last_result_carries_the_fan_out,
    a_registration_without_subscribers_tells_nothing,
    a_sinks_secrets_never_reach_logs_records_or_errors,
    delivered_ones_are_deleted_after_keep_delivered_and_nothing_else,
);

mod fleet {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_event_reaches_the_sink_once_from_three_reconcilers() {
        super::capture_logs();
        super::each_event_reaches_the_sink_once_from_three_reconcilers(super::common::Kind::Etcd).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delivery_cut_off_mid_send_is_sent_again_by_another() {
        super::capture_logs();
        super::a_delivery_cut_off_mid_send_is_sent_again_by_another(super::common::Kind::Etcd).await
    }
}
