//! The work queue end to end, on both backends (platform contract §7,
//! "Work queue"): coalescing, fairness, nothing waiting in a slot, and a
//! panicking job that wedges nothing.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::{Kind, Seed, eventually, one_step_mode, store};
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_config::ReconcilerConfig;
use kayra_core::{Run, RunResult, RunTrigger, Subscription};
use kayra_reconciler::Reconciler;
use kayra_reconciler::queue::JobKey;
use tokio_util::sync::CancellationToken;

const API: &str = "compute.example.com";
const OTHER: &str = "storage.example.com";

struct World {
    store: common::TestStore,
    repo: Repository,
    backend: Arc<TestBackend>,
}

impl World {
    async fn new(kind: Kind) -> Self {
        let store = store(kind).await;
        let repo = Repository::new(store.store.clone(), "dev", "local");
        Self { store, repo, backend: Arc::new(TestBackend::start().await) }
    }

    fn seed(&self) -> Seed<'_> {
        Seed(&self.repo)
    }

    /// Mode `api`: one POST to the backend's `path` (a template).
    fn config(&self, pool: usize, path: &str) -> ReconcilerConfig {
        let mut cfg = ReconcilerConfig {
            wait_poll_interval: kayra_config::Duration::from_millis(20),
            max_concurrent_reconciles: pool,
            ..Default::default()
        };
        one_step_mode(&mut cfg, "api", &format!("{}/{path}", self.backend.base));
        cfg
    }

    /// Rewrites the subscription unchanged: a write, hence a trigger.
    async fn touch(&self, namespace: &str, api: &str) {
        let key = RecordRef::Subscription { namespace, api };
        let current = self.repo.get::<Subscription>(key).await.unwrap().unwrap();
        self.repo.update(key, &current.value, current.revision, "subscription").await.unwrap();
    }
}

struct Running {
    cancel: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(reconciler: Reconciler, cancel: CancellationToken) -> Self {
        let handle = tokio::spawn(async move { reconciler.run().await.expect("reconciler run") });
        Self { cancel, handle }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.handle.await.unwrap();
    }
}

fn start(repo: &Repository, config: ReconcilerConfig) -> Running {
    let cancel = CancellationToken::new();
    Running::start(Reconciler::new(repo.clone(), config, cancel.clone()).unwrap(), cancel)
}

async fn synced(seed: &Seed<'_>, ns: &str, api: &str, sync_id: &str) -> bool {
    seed.get(ns, api).await.is_synced(sync_id)
}

async fn within<F, Fut>(what: &str, limit: Duration, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    eventually(what, cond).await;
    assert!(started.elapsed() <= limit, "{what}: took {:?}, more than {limit:?}", started.elapsed());
}

/// Pool 2, one reconcile held at the backend, 4 force re-syncs of it: the
/// re-syncs wait in the queue (coalesced), not in slots, so a brand-new
/// namespace activates at once; the held one runs at most twice more and
/// never twice at once.
async fn resyncs_of_a_slow_job_never_delay_a_new_namespace(kind: Kind) {
    let w = World::new(kind).await;
    let (seed, backend) = (w.seed(), &w.backend);
    seed.registration(API, "api", "s1").await;
    seed.subscription("core", API).await;
    let running = start(&w.repo, w.config(2, "hold/x"));
    backend.wait_for("/hold/x", 1).await;
    for _ in 0..4 {
        seed.force_resync("core", API).await;
    }
    seed.namespace("fresh").await;
    within("fresh namespace active", Duration::from_secs(1), || async {
        w.repo.get_namespace("fresh").await.unwrap().unwrap().value.active
    })
    .await;
    backend.release(10);
    eventually("core synced", || synced(&seed, "core", API, "s1")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = backend.count("/hold/x");
    assert!((2..=3).contains(&calls), "the held job ran {calls} times: at most twice more");
    assert_eq!(backend.max_in_flight(), 1, "never twice at once");
    running.stop().await;
}

/// A burst of 10 writes to one subscription during its run: one more run.
async fn a_burst_of_writes_during_a_run_makes_one_more_run(kind: Kind) {
    let w = World::new(kind).await;
    let (seed, backend) = (w.seed(), &w.backend);
    seed.registration(API, "api", "s1").await;
    seed.subscription("core", API).await;
    let running = start(&w.repo, w.config(4, "hold/x"));
    backend.wait_for("/hold/x", 1).await;
    backend.release(1);
    eventually("synced", || synced(&seed, "core", API, "s1")).await;
    seed.force_resync("core", API).await;
    backend.wait_for("/hold/x", 2).await;
    for _ in 0..10 {
        w.touch("core", API).await;
    }
    backend.release(10);
    eventually("synced again", || synced(&seed, "core", API, "s1")).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The held run's result was stale (the writes landed): it decides again
    // once, and the ten coalesced triggers find nothing more to do.
    assert_eq!(backend.count("/hold/x"), 3, "one more run, not ten");
    assert_eq!(backend.max_in_flight(), 1);
    running.stop().await;
}

/// During a fan-out behind a slow step, a new subscription to another API
/// activates at once: activations go first, APIs take turns.
async fn a_new_subscription_jumps_a_large_fan_out(kind: Kind) {
    let w = World::new(kind).await;
    let (seed, backend) = (w.seed(), &w.backend);
    // The SyncID picks the path: "ok" answers at once, "hold" waits for release.
    let cfg = w.config(5, "{{ .Subscription.ExpectedSyncID }}/{{ .Subscription.Namespace }}");
    seed.registration(API, "api", "ok").await;
    seed.registration(OTHER, "placeholder", "p1").await;
    let n = 300;
    for i in 0..n {
        seed.subscription(&format!("t{i}"), API).await;
    }
    let running = start(&w.repo, cfg);
    backend.wait_for("/ok/", n).await;
    eventually("all synced", || async {
        let (subs, _) = w.repo.list_subscriptions().await.unwrap();
        subs.iter().all(|s| s.value.is_synced("ok"))
    })
    .await;
    seed.bump(API, "hold").await;
    backend.wait_for("/hold/", 5).await;
    // The fan-out drains at 5 calls per 200 ms (a 200 ms step, pool 5):
    // about 12 s for all 300.
    let stop = Arc::new(AtomicBool::new(false));
    let releaser = tokio::spawn({
        let (stop, backend) = (stop.clone(), w.backend.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                backend.release(5);
            }
        }
    });
    seed.subscription("late", OTHER).await;
    within("late subscription activated", Duration::from_secs(2), || synced(&seed, "late", OTHER, "p1")).await;
    assert!(backend.count("/hold/") < n, "the new subscription did not wait for the whole fan-out");
    eventually("fan-out done", || async { backend.count("/hold/") >= n }).await;
    stop.store(true, Ordering::SeqCst);
    releaser.await.unwrap();
    backend.release(n);
    assert!(backend.max_in_flight() <= 5);
    running.stop().await;
}

/// A job that panics (a test-only hook) wedges neither its key nor its
/// slot: pool 1, the panicking key runs again, and other work goes on.
async fn a_panicking_job_wedges_nothing(kind: Kind) {
    let w = World::new(kind).await;
    let seed = w.seed();
    seed.registration(API, "placeholder", "s1").await;
    seed.subscription("boom", API).await;
    let cancel = CancellationToken::new();
    let mut cfg = w.config(1, "ok/x");
    cfg.max_concurrent_reconciles = 1;
    let mut reconciler = Reconciler::new(w.repo.clone(), cfg, cancel.clone()).unwrap();
    let panicked = Arc::new(AtomicBool::new(false));
    reconciler.set_fault_hook(Arc::new({
        let panicked = panicked.clone();
        move |key: &JobKey| {
            if *key == JobKey::subscription("boom", API) && !panicked.swap(true, Ordering::SeqCst) {
                panic!("injected fault");
            }
        }
    }));
    let running = Running::start(reconciler, cancel);
    eventually("the fault fired", || async { panicked.load(Ordering::SeqCst) }).await;
    // The only slot came back: other work runs.
    seed.subscription("calm", API).await;
    eventually("calm synced", || synced(&seed, "calm", API, "s1")).await;
    // The panicking key was queued again and its next run succeeds.
    eventually("boom synced", || synced(&seed, "boom", API, "s1")).await;
    running.stop().await;
}

/// A job the store failed (the local file's write lock held elsewhere past
/// the write timeout, so its result write is refused and never commits)
/// tries again and finishes once the store answers: a transient outage
/// loses no work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_the_store_failed_finishes_once_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let config = kayra_testkit::local_config(dir.path());
    let open = || kayra_store::local::LocalStore::open(&config.path, config.poll_interval.0).unwrap();
    let seed_repo = Repository::new(kayra_store::Store::new(open()), "dev", "local");
    let seed = Seed(&seed_repo);
    seed.registration(API, "placeholder", "s1").await;
    seed.subscription("flaky", API).await;
    let store = kayra_store::Store::new(open().with_write_timeout(Duration::from_millis(500)));
    let cancel = CancellationToken::new();
    let mut cfg =
        ReconcilerConfig { wait_poll_interval: kayra_config::Duration::from_millis(20), ..Default::default() };
    cfg.max_concurrent_reconciles = 2;
    let mut reconciler = Reconciler::new(Repository::new(store, "dev", "local"), cfg, cancel.clone()).unwrap();
    let (blocked, path) = (Arc::new(AtomicBool::new(false)), config.path.clone());
    reconciler.set_fault_hook(Arc::new({
        let blocked = blocked.clone();
        move |key: &JobKey| {
            if *key == JobKey::subscription("flaky", API) && !blocked.swap(true, Ordering::SeqCst) {
                // Another process holds the file's write lock for 2 s: the
                // result write that follows gives up after 500 ms.
                let conn = rusqlite::Connection::open(&path).unwrap();
                conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(2000));
                    conn.execute_batch("ROLLBACK").unwrap();
                });
            }
        }
    }));
    let running = Running::start(reconciler, cancel);
    eventually("the outage happened", || async { blocked.load(Ordering::SeqCst) }).await;
    eventually("flaky synced after the outage", || synced(&seed, "flaky", API, "s1")).await;
    running.stop().await;
}

/// Two reconcilers with pool 5 each on one etcd, 100 subscribers behind a
/// held step: each process takes the keys in its own order, so the
/// backend sees more than one pool's calls at once, and every subscriber
/// is still called exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_add_their_pools_on_one_etcd() {
    let w = World::new(Kind::Etcd).await;
    let (seed, backend) = (w.seed(), &w.backend);
    let cfg = w.config(5, "{{ .Subscription.ExpectedSyncID }}/{{ .Subscription.Namespace }}");
    seed.registration(API, "api", "ok").await;
    let n = 100;
    for i in 0..n {
        seed.subscription(&format!("t{i}"), API).await;
    }
    let first = start(&w.repo, cfg.clone());
    let other = Repository::new(w.store.connect_again().await, "dev", "local");
    let second = start(&other, cfg);
    eventually("all synced", || async {
        let (subs, _) = w.repo.list_subscriptions().await.unwrap();
        subs.iter().all(|s| s.value.is_synced("ok"))
    })
    .await;
    seed.bump(API, "hold").await;
    eventually("more than one pool in flight", || async { backend.count("/hold/") > 5 }).await;
    backend.release(10 * n);
    eventually("all synced to hold", || async {
        let (subs, _) = w.repo.list_subscriptions().await.unwrap();
        subs.iter().all(|s| s.value.is_synced("hold"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    for i in 0..n {
        let calls = |path: String| backend.calls().iter().filter(|c| **c == path).count();
        assert_eq!(calls(format!("/ok/t{i}")), 1, "t{i} activated exactly once");
        assert_eq!(calls(format!("/hold/t{i}")), 1, "t{i} reconciled exactly once");
    }
    assert!(backend.max_in_flight() > 5, "peak {} is one pool's worth", backend.max_in_flight());
    first.stop().await;
    second.stop().await;
}

/// The lock round trip is no part of a slot (etcd): with both slots of a
/// pool of 2 busy, the next job already holds its lock, waiting for the
/// first slot to free; without one within a lock retry interval it gives
/// the lock back, so a busy pool never keeps a job from another reconciler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_is_locked_before_a_slot_frees() {
    let w = World::new(Kind::Etcd).await;
    let (seed, backend) = (w.seed(), &w.backend);
    let cfg = w.config(2, "hold/{{ .Subscription.Namespace }}");
    seed.registration(API, "api", "s1").await;
    seed.subscription("a", API).await;
    seed.subscription("b", API).await;
    let first = start(&w.repo, cfg.clone());
    backend.wait_for("/hold/", 2).await;
    seed.subscription("c", API).await;
    let other = w.store.connect_again().await;
    let locked = || async { other.list_all("/locks/").await.unwrap().0.len() };
    eventually("c locked while both slots are busy", || async { locked().await == 3 }).await;
    assert_eq!(backend.count("/hold/c"), 0, "c has no slot yet");
    // A second reconciler gets c: the first lets go of it while it waits.
    let again = Repository::new(w.store.connect_again().await, "dev", "local");
    let second = start(&again, cfg);
    backend.wait_for("/hold/c", 1).await;
    backend.release(3);
    for ns in ["a", "b", "c"] {
        eventually("synced", || synced(&seed, ns, API, "s1")).await;
    }
    for ns in ["a", "b", "c"] {
        assert_eq!(backend.count(&format!("/hold/{ns}")), 1, "{ns} ran exactly once");
    }
    first.stop().await;
    second.stop().await;
}

both_backends!(
    resyncs_of_a_slow_job_never_delay_a_new_namespace,
    a_burst_of_writes_during_a_run_makes_one_more_run,
    a_new_subscription_jumps_a_large_fan_out,
    a_panicking_job_wedges_nothing,
    a_newer_sync_id_supersedes_a_running_wait,
    without_supersede_the_old_run_keeps_polling,
    fencing_tokens_grow_with_each_lock,
    a_mode_limit_bounds_its_pipelines,
);

/// Fencing (etcd): a reconciler whose job lock vanished while its step ran
/// (as when its lease expires during a pause) records nothing, and queues
/// the job again: with nobody else holding the lock, it takes the lock
/// anew and runs the job itself, its calls carrying a higher
/// `.Run.FencingToken`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_that_lost_its_lock_records_nothing_and_runs_the_job_again() {
    let w = World::new(Kind::Etcd).await;
    let (seed, backend) = (w.seed(), &w.backend);
    seed.registration(API, "api", "s1").await;
    seed.subscription("core", API).await;
    let running = start(&w.repo, w.config(2, "hold/{{ .Run.FencingToken }}"));
    backend.wait_for("/hold/", 1).await;
    // The lock key goes, as it does with an expired lease.
    let other = w.store.connect_again().await;
    let (locks, _) = other.list_all("/locks/").await.unwrap();
    assert_eq!(locks.len(), 1, "one job lock held: {locks:?}");
    other.delete(&locks[0].key, None).await.unwrap();
    backend.release(1);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let sub = seed.get("core", API).await;
    assert!(!sub.active && sub.current_sync_id.is_empty(), "a fenced-out result is not recorded: {sub:?}");
    // No write to the subscription: the job was queued again.
    backend.wait_for("/hold/", 2).await;
    backend.release(1);
    eventually("synced", || synced(&seed, "core", API, "s1")).await;
    let tokens: Vec<i64> = backend.calls().iter().map(|c| c.trim_start_matches("/hold/").parse().unwrap()).collect();
    assert!(tokens[1] > tokens[0], "fencing tokens grow: {tokens:?}");
    running.stop().await;
}

/// A mode `api` whose one step polls `ok/<SyncID>` with a `wait` that never
/// resolves (the backend's body is not JSON), and a registration at `s1`.
async fn never_resolving(w: &World, supersede: bool) -> Running {
    let mut cfg = w.config(4, "unused");
    cfg.supersede = supersede;
    let yaml = format!(
        "- method: get\n  endpoint: \"{}/ok/{{{{ .Subscription.ExpectedSyncID }}}}\"\n  timeout: 3s\n  wait:\n    - key: .status\n      successes: [done]\n      failures: [failed]\n",
        w.backend.base
    );
    cfg.mode.insert("api".into(), serde_norway::from_str(&yaml).unwrap());
    w.seed().registration(API, "api", "s1").await;
    w.seed().subscription("core", API).await;
    let running = start(&w.repo, cfg);
    w.backend.wait_for("/ok/s1", 3).await;
    // s2 moves the SyncID, and its mode succeeds at once.
    let key = RecordRef::Registration(API);
    w.repo
        .modify::<kayra_core::ApiRegistration, _>(key, "registration", |r| {
            r.sync_id = "s2".into();
            r.mode = "placeholder".into();
            kayra_catalog::repo::Change::Write
        })
        .await
        .unwrap();
    running
}

/// §7 supersede: a run polling toward s1 stops when the SyncID moves to
/// s2, and the job runs toward s2 at once (a first sync, too).
async fn a_newer_sync_id_supersedes_a_running_wait(kind: Kind) {
    let w = World::new(kind).await;
    let running = never_resolving(&w, true).await;
    let seed = w.seed();
    eventually("synced to s2", || synced(&seed, "core", API, "s2")).await;
    let polls = w.backend.count("/ok/s1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(w.backend.count("/ok/s1"), polls, "polling toward s1 stopped");
    running.stop().await;
    // Both runs are recorded: the superseded one with its polls, then the
    // run toward s2 (a run after superseded is `ongoing`).
    let mut runs: Vec<Run> = w.repo.runs_page("core", API, None, 0).await.unwrap().items;
    runs.reverse();
    let summary: Vec<_> = runs.iter().map(|r| (r.sync_id.as_str(), r.result)).collect();
    assert_eq!(summary, [("s1", RunResult::Superseded), ("s2", RunResult::Success)], "{runs:?}");
    assert_eq!(runs[1].trigger, RunTrigger::Ongoing);
    assert!(runs[0].steps.len() == 1 && runs[0].steps[0].attempts >= 3, "a wait step counts its polls: {runs:?}");
    assert!(runs[1].steps.is_empty(), "placeholder: {runs:?}");
}

/// With `supersede: false` the seed's behaviour stays: the old run keeps
/// polling until its timeout.
async fn without_supersede_the_old_run_keeps_polling(kind: Kind) {
    let w = World::new(kind).await;
    let running = never_resolving(&w, false).await;
    let polls = w.backend.count("/ok/s1");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(w.backend.count("/ok/s1") > polls, "still polling toward s1");
    assert!(!synced(&w.seed(), "core", API, "s2").await);
    running.stop().await;
}

/// `.Run.FencingToken` grows each time the job's lock is taken, on either
/// backend (the lock key's create revision on etcd; the store revision at
/// the locked read locally).
async fn fencing_tokens_grow_with_each_lock(kind: Kind) {
    let w = World::new(kind).await;
    let (seed, backend) = (w.seed(), &w.backend);
    seed.registration(API, "api", "s1").await;
    seed.subscription("core", API).await;
    let running = start(&w.repo, w.config(2, "ok/{{ .Run.FencingToken }}"));
    backend.wait_for("/ok/", 1).await;
    eventually("synced", || synced(&seed, "core", API, "s1")).await;
    seed.force_resync("core", API).await;
    backend.wait_for("/ok/", 2).await;
    let tokens: Vec<i64> = backend.calls().iter().map(|c| c.trim_start_matches("/ok/").parse().unwrap()).collect();
    assert!(tokens[0] > 0 && tokens[1] > tokens[0], "fencing tokens grow: {tokens:?}");
    running.stop().await;
}

/// §7 limits: `max_in_flight: 2` on mode `api` with a pool of 5: never
/// more than 2 pipelines at the backend; the others wait in the queue
/// (not in slots: another API's subscription activates meanwhile).
async fn a_mode_limit_bounds_its_pipelines(kind: Kind) {
    let w = World::new(kind).await;
    let (seed, backend) = (w.seed(), &w.backend);
    let mut cfg = w.config(5, "hold/{{ .Subscription.Namespace }}");
    cfg.limits.insert("api".into(), kayra_config::ModeLimits { max_in_flight: Some(2), ..Default::default() });
    seed.registration(API, "api", "s1").await;
    seed.registration(OTHER, "placeholder", "p1").await;
    let n = 6;
    for i in 0..n {
        seed.subscription(&format!("t{i}"), API).await;
    }
    let running = start(&w.repo, cfg);
    backend.wait_for("/hold/", 2).await;
    seed.subscription("late", OTHER).await;
    eventually("another mode's subscription runs meanwhile", || synced(&seed, "late", OTHER, "p1")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(backend.count("/hold/"), 2, "the limit holds the others back");
    for done in 1..=n {
        backend.release(1);
        backend.wait_for("/hold/", (done + 2).min(n)).await;
    }
    eventually("all synced", || async {
        let (subs, _) = w.repo.list_subscriptions().await.unwrap();
        subs.iter().filter(|s| s.value.api == API).all(|s| s.value.is_synced("s1"))
    })
    .await;
    assert_eq!(backend.max_in_flight(), 2, "never more than the limit at once");
    assert_eq!(backend.count("/hold/"), n);
    running.stop().await;
}
