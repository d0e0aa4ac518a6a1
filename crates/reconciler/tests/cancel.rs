//! Cancelling a run in flight and run deadlines (platform §12) against a
//! real store (both backends) and a real HTTP backend: a cancel stops a
//! run within a second wherever it is (a `wait` polling, a call in
//! flight), records it `cancelled` with the user and the reason, leaves
//! the subscription as it was, retries nothing, and the next trigger runs
//! the job again; a finished run cannot be cancelled, an unknown one is
//! not found; a run over `run_timeout` fails and gets its one immediate
//! retry; on etcd the reconciler holding the run stops it, whichever
//! process wrote the request.

mod common;

use std::time::{Duration, Instant};

use common::backend::TestBackend;
use common::{Kind, Running, Seed, eventually, start_reconciler, store};
use kayra_catalog::repo::cancels::{CancelOutcome, CancelRequest};
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_config::ReconcilerConfig;
use kayra_core::{Run, RunResult, RunTrigger, Subscription, SubscriptionState};
use kayra_reconciler::Reconciler;
use kayra_store::WatcherEvent;

const API: &str = "compute.example.com";
const WARM: &str = "warm.example.com";
const POLL: Duration = Duration::from_millis(100);
const PATIENCE: Duration = Duration::from_secs(5);

/// Mode `api`: one step to `endpoint` (`{{ .Run.ID }}` in it), polling
/// `.status` until `done` for 30 s: the test backend never answers JSON,
/// so the step is "not done" until it is stopped.
fn config(endpoint: &str, run_timeout: Option<&str>) -> ReconcilerConfig {
    let mut cfg = ReconcilerConfig { wait_poll_interval: kayra_config::Duration(POLL), ..Default::default() };
    let yaml = format!(
        "- method: get\n  endpoint: \"{endpoint}/{{{{ .Subscription.Namespace }}}}/{{{{ .Run.ID }}}}\"\n  timeout: 30s\n  \
         wait: [{{key: .status, successes: [done]}}]\n"
    );
    cfg.mode.insert("api".into(), serde_norway::from_str(&yaml).unwrap());
    if let Some(limit) = run_timeout {
        let limits = format!("run_timeout: \"{limit}\"\n");
        cfg.limits.insert("api".into(), serde_norway::from_str(&limits).unwrap());
    }
    cfg
}

/// The subscription's runs, oldest first.
async fn runs(repo: &Repository) -> Vec<Run> {
    let mut runs = repo.runs_page("core", API, None, 0).await.unwrap().items;
    runs.reverse();
    runs
}

/// The (namespace, run id) pairs the backend was called with under
/// `prefix`, in call order, each once.
fn run_ids(backend: &TestBackend, prefix: &str) -> Vec<(String, String)> {
    let mut ids = Vec::new();
    for call in backend.calls() {
        let Some(rest) = call.strip_prefix(prefix) else { continue };
        let mut parts = rest.trim_start_matches('/').split('/');
        let (Some(ns), Some(id)) = (parts.next(), parts.next()) else { continue };
        let pair = (ns.to_string(), id.to_string());
        if !ids.contains(&pair) {
            ids.push(pair);
        }
    }
    ids
}

/// Seeds a namespace `core` and registration `API` in mode `api` at `s1`.
async fn seed_api(repo: &Repository) -> Seed<'_> {
    let seed = Seed(repo);
    seed.namespace("core").await;
    seed.registration(API, "api", "s1").await;
    seed
}

/// Cancels `id` as alice would, returning the outcome and how long it took.
async fn cancel(repo: &Repository, id: &str) -> (CancelOutcome, Duration) {
    let request = CancelRequest::new("core", API, id, "alice", "bad canary");
    let started = Instant::now();
    let outcome = repo.cancel_run(&request, PATIENCE).await.unwrap();
    (outcome, started.elapsed())
}

/// The run is stopped, recorded and answered within a second.
fn assert_cancelled_in_time(outcome: &CancelOutcome, took: Duration, id: &str) -> Run {
    let CancelOutcome::Cancelled(run) = outcome else { panic!("run {id} not cancelled: {outcome:?}") };
    assert!(took < Duration::from_secs(1), "the cancel of run {id} took {took:?}, over the contract's 1 s");
    assert_eq!((run.id.as_str(), run.result), (id, RunResult::Cancelled), "{run:?}");
    assert_eq!(run.error, "cancelled by alice: bad canary");
    run.clone()
}

/// A run blocked in a `wait` is cancelled within a second; the
/// subscription stays as it was, nothing is retried, nothing is given up,
/// and the next trigger (a `/sync` reset) runs the job again.
async fn a_waiting_run_is_cancelled_and_only_the_next_trigger_runs_it_again(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let seed = seed_api(&repo).await;
    let running = start_reconciler(&repo, config(&format!("{}/ok", backend.base), None));
    seed.subscription("core", API).await;
    // Polling: a few "not done" answers arrived.
    backend.wait_for("/ok/", 2).await;
    let before: Subscription = seed.get("core", API).await;
    let (_, id) = run_ids(&backend, "/ok").remove(0);

    let (outcome, took) = cancel(&repo, &id).await;
    let run = assert_cancelled_in_time(&outcome, took, &id);
    assert_eq!(run.steps.len(), 1, "the stopped step is recorded: {run:?}");
    let after = seed.get("core", API).await;
    assert_eq!((after.state, after.current_sync_id.as_str(), after.active), (before.state, "", false));
    assert_eq!(after.state, SubscriptionState::Init);
    assert_eq!(runs(&repo).await, std::slice::from_ref(&run), "the run is recorded as answered");
    let request = RecordRef::CancelRequest { namespace: "core", api: API, id: &id };
    assert!(repo.get::<CancelRequest>(request).await.unwrap().is_none(), "the answered request is removed");

    // No retry: the backend hears nothing more for three poll intervals.
    let calls = backend.count("/ok/");
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(backend.count("/ok/"), calls, "no call after the cancel: {:?}", backend.calls());
    // The state is marked cancelled (not given up: any next write runs it).
    let marker = repo.get::<serde_json::Value>(RecordRef::Attempt { namespace: "core", api: API }).await.unwrap();
    assert_eq!(marker.map(|m| m.value["cancelled"].clone()), Some(serde_json::json!(true)));

    // The next trigger runs it again, as a new run.
    seed.force_resync("core", API).await;
    eventually("a new run after the /sync reset", || async { run_ids(&backend, "/ok").len() == 2 }).await;
    let (_, next) = run_ids(&backend, "/ok").remove(1);
    let (outcome, took) = cancel(&repo, &next).await;
    assert_eq!(assert_cancelled_in_time(&outcome, took, &next).trigger, RunTrigger::Resync);

    running.stop().await;
}

/// An active subscription's cancelled run toward a new SyncID runs again
/// when the SyncID moves again, and not before.
async fn a_sync_id_move_runs_a_cancelled_subscription_again(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let seed = seed_api(&repo).await;
    let synced = Subscription {
        active: true,
        current_sync_id: "s1".into(),
        state: SubscriptionState::Success,
        ..Subscription::new("core", API)
    };
    repo.create(RecordRef::Subscription { namespace: "core", api: API }, &synced, "subscription").await.unwrap();
    // Listed before the SyncID moves: the move is one trigger, not also
    // a startup's (which would run a cancelled state again, as a restart).
    seed.registration(WARM, "placeholder", "w1").await;
    seed.subscription("core", WARM).await;
    let running = start_reconciler(&repo, config(&format!("{}/ok", backend.base), None));
    eventually("the reconciler listed", || async { seed.get("core", WARM).await.is_synced("w1") }).await;
    seed.bump(API, "s2").await;
    backend.wait_for("/ok/", 1).await;
    let (_, id) = run_ids(&backend, "/ok").remove(0);
    let (outcome, took) = cancel(&repo, &id).await;
    assert_eq!(assert_cancelled_in_time(&outcome, took, &id).sync_id, "s2");
    let after = seed.get("core", API).await;
    assert_eq!((after.state, after.current_sync_id.as_str()), (SubscriptionState::Success, "s1"));
    let calls = backend.count("/ok/");
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(backend.count("/ok/"), calls, "no call after the cancel");
    seed.bump(API, "s3").await;
    eventually("a new run after the SyncID move", || async { run_ids(&backend, "/ok").len() == 2 }).await;
    let (_, next) = run_ids(&backend, "/ok").remove(1);
    let (outcome, took) = cancel(&repo, &next).await;
    let run = assert_cancelled_in_time(&outcome, took, &next);
    assert_eq!((run.sync_id.as_str(), run.trigger), ("s3", RunTrigger::Ongoing));
    running.stop().await;
}

/// A call in flight is dropped by the cancel: the run does not wait for it.
async fn a_call_in_flight_is_dropped_by_the_cancel(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let seed = seed_api(&repo).await;
    let running = start_reconciler(&repo, config(&format!("{}/hold", backend.base), None));
    seed.subscription("core", API).await;
    backend.wait_for("/hold/", 1).await;
    let (_, id) = run_ids(&backend, "/hold").remove(0);
    let (outcome, took) = cancel(&repo, &id).await;
    let run = assert_cancelled_in_time(&outcome, took, &id);
    assert_eq!((run.steps[0].status, run.steps[0].attempts), (0, 1), "no answer came: {run:?}");
    backend.release(1);
    running.stop().await;
}

/// A finished run is `Finished` (the API's 409) at once; an id that no run
/// has is `NotFound` (404) once the patience is out.
async fn a_finished_run_is_refused_and_an_unknown_one_is_not_found(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let seed = seed_api(&repo).await;
    let running = start_reconciler(&repo, ReconcilerConfig::default());
    seed.subscription("core", API).await;
    eventually("the placeholder run", || async { runs(&repo).await.len() == 1 }).await;
    let done = runs(&repo).await.remove(0);
    let (outcome, took) = cancel(&repo, &done.id).await;
    assert_eq!(outcome, CancelOutcome::Finished(done.clone()));
    assert!(took < Duration::from_secs(1), "a finished run is refused at once: {took:?}");

    let unknown = uuid::Uuid::now_v7().to_string();
    let request = CancelRequest::new("core", API, &unknown, "alice", "");
    let outcome = repo.cancel_run(&request, Duration::from_millis(300)).await.unwrap();
    assert_eq!(outcome, CancelOutcome::NotFound);
    let record = RecordRef::CancelRequest { namespace: "core", api: API, id: &unknown };
    assert!(repo.get::<CancelRequest>(record).await.unwrap().is_none(), "the unanswered request is removed");
    assert_eq!(runs(&repo).await, [done], "nothing else ran");
    running.stop().await;
}

/// A run still going after `run_timeout` is stopped and fails with the
/// limit in its error; the ordinary failure path follows: state `error`,
/// one immediate retry that fails the same way, then nothing.
async fn a_run_over_its_deadline_fails_and_is_retried_once(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let seed = seed_api(&repo).await;
    let running = start_reconciler(&repo, config(&format!("{}/ok", backend.base), Some("500ms")));
    seed.subscription("core", API).await;
    eventually("two runs", || async { runs(&repo).await.len() == 2 }).await;
    eventually("the give-up record", || async {
        repo.get::<serde_json::Value>(RecordRef::Attempt { namespace: "core", api: API }).await.unwrap().is_some()
    })
    .await;
    let all = runs(&repo).await;
    let got: Vec<_> = all.iter().map(|r| (r.result, r.error.as_str())).collect();
    let error = "run timeout of 500ms exceeded";
    assert_eq!(got, [(RunResult::Error, error), (RunResult::Error, error)], "{all:?}");
    assert_eq!(all[1].trigger, RunTrigger::Retry, "the second run is the immediate retry");
    let sub = seed.get("core", API).await;
    assert_eq!((sub.state, sub.current_sync_id.as_str()), (SubscriptionState::Error, ""));
    let calls = backend.count("/ok/");
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(backend.count("/ok/"), calls, "given up: no third run");
    running.stop().await;
}

/// On etcd, with two reconcilers on their own connections, a cancel written
/// through a third reaches whichever holds the run.
async fn the_holder_stops_the_run_whichever_process_asked(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let seed = seed_api(&repo).await;
    let cfg = config(&format!("{}/ok", backend.base), None);
    let a = Repository::new(store.connect_again().await, "dev", "local");
    let b = Repository::new(store.connect_again().await, "dev", "local");
    let (first, second) = (start_reconciler(&a, cfg.clone()), start_reconciler(&b, cfg));
    let namespaces = ["n1", "n2", "n3", "n4"];
    for ns in namespaces {
        seed.namespace(ns).await;
        seed.subscription(ns, API).await;
    }
    eventually("every subscription's run polling", || async { run_ids(&backend, "/ok").len() >= 4 }).await;
    let asking = Repository::new(store.connect_again().await, "dev", "local");
    for (ns, id) in run_ids(&backend, "/ok") {
        let request = CancelRequest::new(&ns, API, &id, "alice", "bad canary");
        let started = Instant::now();
        let outcome = asking.cancel_run(&request, PATIENCE).await.unwrap();
        let took = started.elapsed();
        let CancelOutcome::Cancelled(run) = outcome else { panic!("run {id} of {ns} not cancelled: {outcome:?}") };
        assert!(took < Duration::from_secs(1), "the cancel of run {id} took {took:?}, over the contract's 1 s");
        assert_eq!((run.result, run.error.as_str()), (RunResult::Cancelled, "cancelled by alice: bad canary"));
    }
    // Neither reconciler runs a cancelled job again (the other one's
    // queued trigger included) until its next trigger.
    let calls = backend.count("/ok/");
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(backend.count("/ok/"), calls, "a cancelled job ran again: {:?}", backend.calls());
    let stopping = Instant::now();
    first.stop().await;
    second.stop().await;
    assert!(stopping.elapsed() < Duration::from_secs(10), "nothing was left running: {:?}", stopping.elapsed());
}

both_backends!(
    a_waiting_run_is_cancelled_and_only_the_next_trigger_runs_it_again,
    a_call_in_flight_is_dropped_by_the_cancel,
    a_sync_id_move_runs_a_cancelled_subscription_again,
    a_finished_run_is_refused_and_an_unknown_one_is_not_found,
    a_run_over_its_deadline_fails_and_is_retried_once,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_the_holder_stops_the_run_whichever_process_asked() {
    the_holder_stops_the_run_whichever_process_asked(Kind::Etcd).await;
}

/// A reconciler that starts while another runs a job lists the job as not
/// synced, and its startup trigger waits behind the other's lock. A cancel
/// of that run lands meanwhile. When the trigger takes the lock, the
/// cancelled record is newer than its startup list: the seed's
/// unconditional retry does not cover it, and nothing runs until the next
/// write. The lock keys show each step, so nothing here is left to timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_startup_trigger_waiting_for_the_lock_leaves_a_run_cancelled_meanwhile_stopped() {
    use futures::StreamExt;
    let store = store(Kind::Etcd).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let seed = seed_api(&repo).await;
    let cfg = config(&format!("{}/ok", backend.base), None);
    let first = start_reconciler(&Repository::new(store.connect_again().await, "dev", "local"), cfg.clone());
    seed.namespace("n1").await;
    seed.subscription("n1", API).await;
    eventually("the first reconciler's run polling", || async { !run_ids(&backend, "/ok").is_empty() }).await;

    // Every move of the subscription's job lock from here on: first the
    // key of the running job's (the namespace's activation is done).
    let mut locks = store.store.watcher("/locks/").filter(|event| {
        let key = match event {
            WatcherEvent::InitApply(kv) | WatcherEvent::Apply(kv) => kv.key.as_str(),
            WatcherEvent::Delete { key, .. } => key.as_str(),
            _ => "subscriptions",
        };
        std::future::ready(key.contains("subscriptions"))
    });
    let mut held = Vec::new();
    loop {
        match locks.next().await.expect("the lock watch") {
            WatcherEvent::InitApply(kv) => held.push(kv.key),
            WatcherEvent::InitDone { .. } => break,
            _ => {}
        }
    }
    let [running_lock] = held.as_slice() else { panic!("one lock held by the running job: {held:?}") };

    // The second reconciler lists while the run is in flight.
    let cancel = tokio_util::sync::CancellationToken::new();
    let second = Reconciler::new(Repository::new(store.connect_again().await, "dev", "local"), cfg, cancel.clone())
        .expect("valid reconciler config");
    let ready = second.ready_flag();
    let second = Running::spawn(second, cancel);
    eventually("the second reconciler listed", || async { ready.load(std::sync::atomic::Ordering::SeqCst) }).await;

    let (ns, id) = run_ids(&backend, "/ok")[0].clone();
    let request = CancelRequest::new(&ns, API, &id, "alice", "bad canary");
    let outcome = repo.cancel_run(&request, PATIENCE).await.unwrap();
    assert!(matches!(outcome, CancelOutcome::Cancelled(_)), "{outcome:?}");

    // The running job's lock goes with its cancelled result; the waiting
    // trigger then takes the lock (the first key put after that: the
    // first reconciler has nothing to do), decides, and lets go without a
    // call.
    let calls = backend.count("/ok/");
    let (mut released, mut taken, mut let_go) = (false, None, false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !let_go {
        let Ok(event) = tokio::time::timeout_at(deadline, locks.next()).await else {
            panic!(
                "the startup trigger did not take the lock and let it go (running job's released: {released}, \
                 taken: {taken:?}); runs that called the backend: {:?}",
                run_ids(&backend, "/ok")
            );
        };
        match event.expect("the lock watch") {
            WatcherEvent::Delete { key, .. } if key == *running_lock => released = true,
            // Before, its tries saw the lock held and took their keys back.
            WatcherEvent::Apply(kv) if released => taken = Some(kv.key),
            WatcherEvent::Delete { key, .. } if Some(&key) == taken.as_ref() => let_go = true,
            WatcherEvent::Init | WatcherEvent::InitApply(_) | WatcherEvent::InitDone { .. } => {
                panic!("the lock watch re-listed: this test needs every move")
            }
            _ => {}
        }
    }
    assert_eq!(backend.count("/ok/"), calls, "the cancelled job ran again: {:?}", backend.calls());
    let runs = repo.runs_page("n1", API, None, 0).await.unwrap().items;
    assert_eq!(runs.iter().map(|r| r.result).collect::<Vec<_>>(), [RunResult::Cancelled], "one run, cancelled");
    first.stop().await;
    second.stop().await;
}
