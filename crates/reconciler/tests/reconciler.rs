//! The reconciler against a real store (both backends) and a real HTTP
//! backend: activation, the ongoing action, mode resolution, the pool
//! bound, per-job locking, failure handling, force re-sync races and
//! idleness (seed, "Reconciler"; platform contract §7).

mod common;

use std::time::Duration;

use common::backend::TestBackend;
use common::{Kind, Seed, eventually, one_step_mode, start_reconciler, store};
use kayra_catalog::repo::Repository;
use kayra_config::ReconcilerConfig;
use kayra_core::SubscriptionState;

const API: &str = "compute.example.com";

/// A store of one backend, its repository and a recording HTTP backend.
struct World {
    store: common::TestStore,
    repo: Repository,
    backend: TestBackend,
}

impl World {
    async fn new(kind: Kind) -> Self {
        let store = store(kind).await;
        let repo = Repository::new(store.store.clone(), "dev", "local");
        Self { store, repo, backend: TestBackend::start().await }
    }

    fn seed(&self) -> Seed<'_> {
        Seed(&self.repo)
    }

    /// `core` subscribed to `API` (mode `api`: one POST to the backend's
    /// `path`, at SyncID `s1`), and a reconciler running.
    async fn one_subscription(&self, path: &str) -> common::Running {
        let mut cfg = config();
        self.mode(&mut cfg, "api", path);
        self.seed().registration(API, "api", "s1").await;
        self.seed().subscription("core", API).await;
        start_reconciler(&self.repo, cfg)
    }

    /// Adds mode `name`: one POST to the backend's `path` (a template).
    fn mode(&self, config: &mut ReconcilerConfig, name: &str, path: &str) {
        one_step_mode(config, name, &format!("{}/{path}", self.backend.base));
    }
}

fn config() -> ReconcilerConfig {
    ReconcilerConfig { wait_poll_interval: kayra_config::Duration::from_millis(20), ..Default::default() }
}

async fn synced(seed: &Seed<'_>, ns: &str, api: &str, sync_id: &str) -> bool {
    let sub = seed.get(ns, api).await;
    sub.is_synced(sync_id) && sub.state == SubscriptionState::Success
}

async fn activates_namespaces_and_new_subscriptions(kind: Kind) {
    let w = World::new(kind).await;
    let (repo, seed) = (&w.repo, w.seed());
    // Written before the reconciler starts: reconcileExisting picks them up.
    seed.namespace("core").await;
    seed.registration(API, "placeholder", "s1").await;
    seed.subscription("core", API).await;
    let running = start_reconciler(repo, config());
    eventually("core synced", || synced(&seed, "core", API, "s1")).await;
    eventually("core active", || async { repo.get_namespace("core").await.unwrap().unwrap().value.active }).await;
    // Written after: the watch picks them up.
    seed.namespace("sre").await;
    seed.subscription("sre", API).await;
    eventually("sre synced", || synced(&seed, "sre", API, "s1")).await;
    eventually("sre active", || async { repo.get_namespace("sre").await.unwrap().unwrap().value.active }).await;
    running.stop().await;
}

async fn ongoing_action_reaches_active_subscribers_only(kind: Kind) {
    let w = World::new(kind).await;
    let (repo, seed, backend) = (&w.repo, w.seed(), &w.backend);
    let mut cfg = config();
    w.mode(&mut cfg, "api", "ok/{{ .Subscription.Namespace }}");
    w.mode(&mut cfg, "broken", "fail/{{ .Subscription.Namespace }}");
    seed.registration(API, "api", "s1").await;
    seed.registration("broken.example.com", "broken", "s1").await;
    for ns in ["a", "b", "c"] {
        seed.namespace(ns).await;
        seed.subscription(ns, API).await;
    }
    seed.namespace("never").await;
    seed.subscription("never", "broken.example.com").await;
    let running = start_reconciler(repo, cfg);
    for ns in ["a", "b", "c"] {
        eventually("initial sync", || synced(&seed, ns, API, "s1")).await;
    }
    backend.wait_for("/fail/never", 2).await;
    assert_eq!(backend.count("/ok/"), 3, "one reconcile per new subscription");

    seed.bump(API, "s2").await;
    for ns in ["a", "b", "c"] {
        eventually("reconciled to s2", || synced(&seed, ns, API, "s2")).await;
    }
    assert_eq!(backend.count("/ok/"), 6, "exactly one more reconcile per subscriber");

    // An inactive subscription is left to the initial action: a registration
    // write alone never retries it.
    seed.bump("broken.example.com", "s2").await;
    seed.bump(API, "s3").await;
    for ns in ["a", "b", "c"] {
        eventually("reconciled to s3", || synced(&seed, ns, API, "s3")).await;
    }
    assert_eq!(backend.count("/fail/never"), 2);
    let never = seed.get("never", "broken.example.com").await;
    assert!(!never.active);
    assert_eq!(never.state, SubscriptionState::Error);
    running.stop().await;
}

async fn mode_resolution(kind: Kind) {
    let w = World::new(kind).await;
    let (repo, seed, backend) = (&w.repo, w.seed(), &w.backend);
    seed.namespace("core").await;
    seed.registration("nomode.example.com", "", "s1").await;
    seed.registration("explicit.example.com", "api", "s1").await;
    seed.subscription("core", "nomode.example.com").await;
    seed.subscription("core", "explicit.example.com").await;

    // No mode and no default_mode: reconcile fails, never synced.
    let mut cfg = config();
    w.mode(&mut cfg, "api", "ok/api");
    w.mode(&mut cfg, "trigger", "ok/trigger");
    let running = start_reconciler(repo, cfg.clone());
    eventually("explicit synced", || synced(&seed, "core", "explicit.example.com", "s1")).await;
    eventually("no-mode error", || async {
        seed.get("core", "nomode.example.com").await.state == SubscriptionState::Error
    })
    .await;
    let sub = seed.get("core", "nomode.example.com").await;
    assert!(!sub.active && sub.current_sync_id.is_empty(), "{sub:?}");
    running.stop().await;

    // default_mode: the registration without a mode uses it; an explicit
    // mode still wins.
    cfg.default_mode = "trigger".into();
    seed.force_resync("core", "nomode.example.com").await;
    let running = start_reconciler(repo, cfg);
    eventually("default mode synced", || synced(&seed, "core", "nomode.example.com", "s1")).await;
    assert_eq!(backend.count("/ok/trigger"), 1);
    assert_eq!(backend.count("/ok/api"), 1, "the explicit mode ran once, never the default");
    running.stop().await;
}

async fn pool_bound_holds_under_fan_out(kind: Kind) {
    let w = World::new(kind).await;
    let (repo, seed, backend) = (&w.repo, w.seed(), &w.backend);
    let mut cfg = config();
    cfg.max_concurrent_reconciles = 4;
    w.mode(&mut cfg, "api", "slow/{{ .Subscription.Namespace }}");
    seed.registration(API, "api", "s1").await;
    let n = 120;
    for i in 0..n {
        seed.subscription(&format!("t{i}"), API).await;
    }
    let running = start_reconciler(repo, cfg);
    backend.wait_for("/slow/", n).await;
    seed.bump(API, "s2").await;
    backend.wait_for("/slow/", 2 * n).await;
    eventually("all synced", || async {
        let (subs, _) = repo.list_subscriptions().await.unwrap();
        subs.iter().all(|s| s.value.is_synced("s2"))
    })
    .await;
    assert!(backend.max_in_flight() <= 4, "max in flight {} exceeds the bound", backend.max_in_flight());
    assert!(backend.max_in_flight() >= 2, "the pool should run jobs concurrently");
    assert_eq!(backend.count("/slow/"), 2 * n);
    running.stop().await;
}

async fn failing_sync_is_attempted_twice_then_left_alone(kind: Kind) {
    let w = World::new(kind).await;
    let (repo, seed, backend) = (&w.repo, w.seed(), &w.backend);
    let mut cfg = config();
    w.mode(&mut cfg, "api", "fail/x");
    seed.namespace("core").await;
    seed.registration(API, "api", "s1").await;
    seed.subscription("core", API).await;
    let running = start_reconciler(repo, cfg.clone());
    backend.wait_for("/fail/x", 2).await;
    eventually("state error", || async { seed.get("core", API).await.state == SubscriptionState::Error }).await;
    // Several seconds, many poll intervals: no third attempt.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(backend.count("/fail/x"), 2);
    let sub = seed.get("core", API).await;
    assert!(!sub.active && sub.current_sync_id.is_empty());

    // Writing the subscription again retries (twice more, at most).
    seed.force_resync("core", API).await;
    backend.wait_for("/fail/x", 4).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(backend.count("/fail/x"), 4);
    running.stop().await;

    // A restart's reconcileExisting tries every record again, unconditionally.
    let running = start_reconciler(repo, cfg);
    backend.wait_for("/fail/x", 6).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(backend.count("/fail/x"), 6);
    running.stop().await;
}

async fn force_resync_racing_a_reconcile_causes_exactly_one_more(kind: Kind) {
    let w = World::new(kind).await;
    let (seed, backend) = (w.seed(), &w.backend);
    let running = w.one_subscription("hold/x").await;
    backend.wait_for("/hold/x", 1).await;
    // The reconcile is in flight; the force re-sync lands now.
    seed.force_resync("core", API).await;
    backend.release(1);
    backend.wait_for("/hold/x", 2).await;
    backend.release(1);
    eventually("synced", || synced(&seed, "core", API, "s1")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(backend.count("/hold/x"), 2, "exactly one more reconcile");
    assert_eq!(backend.max_in_flight(), 1, "the two triggers never ran concurrently");
    running.stop().await;
}

async fn racing_triggers_never_run_concurrently(kind: Kind) {
    let w = World::new(kind).await;
    let (repo, seed, backend) = (&w.repo, w.seed(), &w.backend);
    let running = w.one_subscription("hold/x").await;
    backend.wait_for("/hold/x", 1).await;
    backend.release(1);
    eventually("synced s1", || synced(&seed, "core", API, "s1")).await;
    // Two triggers for one subscription at nearly the same moment: the
    // registration bump's fan-out and a write to the subscription itself.
    seed.bump(API, "s2").await;
    backend.wait_for("/hold/x", 2).await;
    let key = kayra_catalog::repo::RecordRef::Subscription { namespace: "core", api: API };
    let current = repo.get::<kayra_core::Subscription>(key).await.unwrap().unwrap();
    repo.update(key, &current.value, current.revision, "subscription").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(backend.count("/hold/x"), 2, "the second trigger waits for the first");
    backend.release(1);
    // The touch landed mid-reconcile, so the result's CAS write is stale and
    // the fresh record decides again: exactly one more call, never
    // concurrent; the second trigger then re-reads and finds nothing to do.
    backend.wait_for("/hold/x", 3).await;
    backend.release(1);
    eventually("synced s2", || synced(&seed, "core", API, "s2")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(backend.count("/hold/x"), 3);
    assert_eq!(backend.max_in_flight(), 1);
    running.stop().await;
}

async fn idle_reconciler_writes_nothing_and_calls_nothing(kind: Kind) {
    let w = World::new(kind).await;
    let (repo, seed, backend) = (&w.repo, w.seed(), &w.backend);
    let mut cfg = config();
    w.mode(&mut cfg, "api", "ok/{{ .Subscription.Namespace }}");
    seed.registration(API, "api", "s1").await;
    for ns in ["a", "b"] {
        seed.namespace(ns).await;
        seed.subscription(ns, API).await;
    }
    let running = start_reconciler(repo, cfg.clone());
    for ns in ["a", "b"] {
        eventually("synced", || synced(&seed, ns, API, "s1")).await;
        eventually("active", || async { repo.get_namespace(ns).await.unwrap().unwrap().value.active }).await;
    }
    // Let the events of the reconciler's own writes arrive and settle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let revision = w.store.store.revision().await.unwrap();
    let calls = backend.calls().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(w.store.store.revision().await.unwrap(), revision, "an idle reconciler moved the store revision");
    assert_eq!(backend.calls().len(), calls, "an idle reconciler made HTTP calls");
    running.stop().await;

    // A restart over a converged store is idle too.
    let running = start_reconciler(repo, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(w.store.store.revision().await.unwrap(), revision);
    assert_eq!(backend.calls().len(), calls);
    running.stop().await;
}

async fn stop_waits_for_in_flight_reconciles(kind: Kind) {
    let w = World::new(kind).await;
    let (seed, backend) = (w.seed(), &w.backend);
    let running = w.one_subscription("hold/x").await;
    backend.wait_for("/hold/x", 1).await;
    let stopping = tokio::spawn(running.stop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!stopping.is_finished(), "stop must wait for the in-flight reconcile");
    backend.release(1);
    stopping.await.unwrap();
    assert!(synced(&seed, "core", API, "s1").await, "the in-flight reconcile finished and was recorded");
}

async fn reconciles_only_its_own_deployment(kind: Kind) {
    let w = World::new(kind).await;
    let (repo, seed) = (&w.repo, w.seed());
    // Another deployment's records on the same store.
    let other = Repository::new(w.store.store.clone(), "prod", "eu");
    let other_seed = Seed(&other);
    other_seed.registration(API, "placeholder", "p1").await;
    other_seed.subscription("core", API).await;
    seed.registration(API, "placeholder", "s1").await;
    seed.subscription("core", API).await;
    let running = start_reconciler(repo, config());
    eventually("own subscription synced", || synced(&seed, "core", API, "s1")).await;
    other_seed.bump(API, "p2").await;
    seed.bump(API, "s2").await;
    eventually("own subscription synced to s2", || synced(&seed, "core", API, "s2")).await;
    let theirs = other_seed.get("core", API).await;
    assert!(
        !theirs.active && theirs.current_sync_id.is_empty(),
        "touched another deployment's subscription: {theirs:?}"
    );
    assert_eq!(theirs.state, SubscriptionState::Init);
    running.stop().await;
}

both_backends!(
    reconciles_only_its_own_deployment,
    activates_namespaces_and_new_subscriptions,
    ongoing_action_reaches_active_subscribers_only,
    mode_resolution,
    pool_bound_holds_under_fan_out,
    failing_sync_is_attempted_twice_then_left_alone,
    force_resync_racing_a_reconcile_causes_exactly_one_more,
    racing_triggers_never_run_concurrently,
    idle_reconciler_writes_nothing_and_calls_nothing,
    stop_waits_for_in_flight_reconciles,
);
