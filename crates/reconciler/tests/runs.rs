//! Run records (platform §4.4) against a real store (both backends) and a
//! real HTTP backend: each trigger from its cause, the two runs of a failed
//! decision, exact step fields, placeholder runs, retention, removal with
//! the subscription, and `run_id` / `.Run.ID` equal to the recorded id.

mod common;

use std::time::Duration;

use common::backend::TestBackend;
use common::echo::EchoBackend;
use common::{Kind, Seed, eventually, one_step_mode, start_reconciler, store};
use futures::StreamExt;
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_config::ReconcilerConfig;
use kayra_core::{Run, RunResult, RunStep, RunTrigger, SubscriptionState};
use kayra_store::{Change, Event};

const API: &str = "compute.example.com";

fn config() -> ReconcilerConfig {
    ReconcilerConfig { wait_poll_interval: kayra_config::Duration::from_millis(20), ..Default::default() }
}

/// The subscription's runs, oldest first.
async fn runs(repo: &Repository, ns: &str, api: &str) -> Vec<Run> {
    let mut runs = repo.runs_page(ns, api, None, 0).await.unwrap().items;
    runs.reverse();
    runs
}

async fn synced(seed: &Seed<'_>, ns: &str, api: &str, sync_id: &str) -> bool {
    let sub = seed.get(ns, api).await;
    sub.is_synced(sync_id) && sub.state == SubscriptionState::Success
}

/// Waits for `n` runs and returns them, oldest first.
async fn wait_runs(repo: &Repository, ns: &str, api: &str, n: usize) -> Vec<Run> {
    eventually(&format!("{n} runs of {ns}"), || async { runs(repo, ns, api).await.len() >= n }).await;
    runs(repo, ns, api).await
}

/// Starts a reconciler and waits until it has listed (a subscription of
/// its own, written before, is synced): writes from here on are watch
/// events, not reconcileExisting.
async fn start_listed(repo: &Repository, cfg: ReconcilerConfig) -> common::Running {
    let seed = Seed(repo);
    seed.registration(WARM, "placeholder", "w1").await;
    seed.subscription("warm", WARM).await;
    let running = start_reconciler(repo, cfg);
    eventually("the reconciler listed", || synced(&seed, "warm", WARM, "w1")).await;
    running
}

const WARM: &str = "warm.example.com";

fn is_timestamp(s: &str) -> bool {
    s.len() == "2026-02-01T00:00:03.200Z".len() && s.ends_with('Z') && humantime::parse_rfc3339(s).is_ok()
}

async fn each_trigger_comes_from_its_cause(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let mut cfg = config();
    one_step_mode(&mut cfg, "api", &format!("{}/ok/{{{{ .Subscription.Namespace }}}}", backend.base));
    seed.registration(API, "api", "s1").await;
    let running = start_listed(&repo, cfg.clone()).await;
    // A new subscription: initial.
    seed.subscription("core", API).await;
    wait_runs(&repo, "core", API, 1).await;
    // A SyncID bump: ongoing.
    eventually("synced s1", || synced(&seed, "core", API, "s1")).await;
    seed.bump(API, "s2").await;
    wait_runs(&repo, "core", API, 2).await;
    // The /sync reset: resync.
    eventually("synced s2", || synced(&seed, "core", API, "s2")).await;
    seed.force_resync("core", API).await;
    wait_runs(&repo, "core", API, 3).await;
    eventually("synced s2 again", || synced(&seed, "core", API, "s2")).await;
    running.stop().await;
    // Written while no reconciler ran, then a restart: startup.
    seed.bump(API, "s3").await;
    let running = start_reconciler(&repo, cfg);
    let all = wait_runs(&repo, "core", API, 4).await;
    running.stop().await;

    let triggers: Vec<RunTrigger> = all.iter().map(|r| r.trigger).collect();
    assert_eq!(triggers, [RunTrigger::Initial, RunTrigger::Ongoing, RunTrigger::Resync, RunTrigger::Startup]);
    let sync_ids: Vec<&str> = all.iter().map(|r| r.sync_id.as_str()).collect();
    assert_eq!(sync_ids, ["s1", "s2", "s2", "s3"]);
    let me = format!(":{}", std::process::id());
    for run in &all {
        assert_eq!((run.namespace.as_str(), run.api.as_str(), run.mode.as_str()), ("core", API, "api"), "{run:?}");
        assert_eq!((run.result, run.error.as_str()), (RunResult::Success, ""), "{run:?}");
        assert!(run.lock_id < cfg_slots(), "{run:?}");
        assert!(run.reconciler.ends_with(&me) && run.reconciler.len() > me.len(), "{run:?}");
        assert!(is_timestamp(&run.started_at) && is_timestamp(&run.finished_at), "{run:?}");
        assert!(run.started_at <= run.finished_at, "{run:?}");
        assert_eq!(run.steps.len(), 1, "{run:?}");
        assert_eq!(uuid::Uuid::parse_str(&run.id).unwrap().get_version_num(), 7);
    }
}

fn cfg_slots() -> usize {
    ReconcilerConfig::default().max_concurrent_reconciles
}

async fn a_failed_decision_leaves_an_error_run_and_a_retry_run(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let mut cfg = config();
    one_step_mode(&mut cfg, "api", &format!("{}/fail/x", backend.base));
    seed.registration(API, "api", "s1").await;
    let running = start_listed(&repo, cfg).await;
    // Every change to the subscription from its creation on.
    let sub_key = RecordRef::Subscription { namespace: "core", api: API };
    let from = store.store.revision().await.unwrap() + 1;
    let mut changes = store.store.changes(&repo.store_key_of(sub_key), from).await.unwrap();
    seed.subscription("core", API).await;
    backend.wait_for("/fail/x", 2).await;
    let all = wait_runs(&repo, "core", API, 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.stop().await;
    let all_now = runs(&repo, "core", API).await;
    assert_eq!(all_now, all, "exactly two runs for one decision");
    let triggers: Vec<RunTrigger> = all.iter().map(|r| r.trigger).collect();
    assert_eq!(triggers, [RunTrigger::Initial, RunTrigger::Retry]);
    for run in &all {
        assert_eq!(run.result, RunResult::Error, "{run:?}");
        assert!(run.error.contains("500"), "the pipeline's error text: {run:?}");
        let step = &run.steps[0];
        assert_eq!((step.method.as_str(), step.status, step.attempts), ("POST", 500, 1), "{step:?}");
    }
    // `state: error` written once; the second run is no subscription event.
    // Every change up to now, read until the feed reports it has caught up.
    let now = store.store.revision().await.unwrap();
    let mut puts = 0;
    loop {
        let change = tokio::time::timeout(Duration::from_secs(20), changes.next()).await;
        match change.expect("the change feed catches up in time").expect("the feed goes on").unwrap() {
            Change::Event(Event::Put(kv)) => {
                let sub: kayra_core::Subscription = serde_json::from_slice(&kv.value).unwrap();
                puts += 1;
                if puts > 1 {
                    assert_eq!(sub.state, SubscriptionState::Error);
                }
            }
            Change::Event(Event::Delete { .. }) => {}
            Change::Progress(revision) if revision >= now => break,
            Change::Progress(_) => {}
        }
    }
    assert_eq!(puts, 2, "the subscription is created, then written once (state error)");
}

/// Whether the reconciler gave up on the subscription's current state
/// (its failure and immediate retry both failed).
async fn given_up(repo: &Repository, ns: &str, api: &str) -> bool {
    repo.get::<serde_json::Value>(RecordRef::Attempt { namespace: ns, api }).await.unwrap().is_some()
}

/// A subscription whose activation failed (`active: false`, `state:
/// error`, `current_sync_id` still empty): the `/sync` reset changes no
/// field the API shows, yet its run is a `resync`, not `initial`.
async fn a_resync_of_a_subscription_that_never_synced_is_a_resync(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let mut cfg = config();
    one_step_mode(&mut cfg, "api", &format!("{}/fail/x", backend.base));
    seed.registration(API, "api", "s1").await;
    let running = start_listed(&repo, cfg).await;
    seed.subscription("core", API).await;
    wait_runs(&repo, "core", API, 2).await;
    eventually("given up", || given_up(&repo, "core", API)).await;
    let sub = seed.get("core", API).await;
    assert!(!sub.active && sub.state == SubscriptionState::Error && sub.current_sync_id.is_empty(), "{sub:?}");
    seed.force_resync("core", API).await;
    let all = wait_runs(&repo, "core", API, 4).await;
    running.stop().await;
    let triggers: Vec<RunTrigger> = all.iter().map(|r| r.trigger).collect();
    assert_eq!(triggers, [RunTrigger::Initial, RunTrigger::Retry, RunTrigger::Resync, RunTrigger::Retry]);
}

/// A re-sync request that lands while the first sync is in flight: that
/// run's result is not recorded (the subscription changed under it), and
/// the run made again for the request is a `resync`.
async fn a_resync_during_a_first_sync_runs_again_as_a_resync(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let mut cfg = config();
    one_step_mode(&mut cfg, "api", &format!("{}/hold/x", backend.base));
    seed.registration(API, "api", "s1").await;
    let running = start_listed(&repo, cfg).await;
    seed.subscription("core", API).await;
    backend.wait_for("/hold/x", 1).await;
    seed.force_resync("core", API).await;
    backend.release(2);
    eventually("synced s1", || synced(&seed, "core", API, "s1")).await;
    let all = runs(&repo, "core", API).await;
    running.stop().await;
    assert_eq!(backend.count("/hold/x"), 2, "the pipeline ran again for the request");
    let got: Vec<(RunTrigger, RunResult)> = all.iter().map(|r| (r.trigger, r.result)).collect();
    assert_eq!(got, [(RunTrigger::Resync, RunResult::Success)], "{all:?}");
    assert!(!seed.get("core", API).await.resync_requested, "the result write is no re-sync request");
}

/// A backend that answers `429` with `Retry-After: 1`: the immediate retry
/// waits for the mode's hold in the queue, and the run it makes is still
/// the `retry`, the decision's second and last attempt.
async fn a_retry_held_by_retry_after_is_recorded_as_the_retry(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), EchoBackend::start().await);
    let mut cfg = config();
    one_step_mode(&mut cfg, "api", &format!("{}/throttle/x", backend.base));
    seed.registration(API, "api", "s1").await;
    let running = start_listed(&repo, cfg).await;
    seed.subscription("core", API).await;
    let all = wait_runs(&repo, "core", API, 2).await;
    let got: Vec<(RunTrigger, RunResult)> = all.iter().map(|r| (r.trigger, r.result)).collect();
    assert_eq!(got, [(RunTrigger::Initial, RunResult::Error), (RunTrigger::Retry, RunResult::Error)], "{all:?}");
    for run in &all {
        assert_eq!(run.steps[0].status, 429, "{run:?}");
    }
    // Two failures of one decision: it gives up, with no third run.
    eventually("given up", || given_up(&repo, "core", API)).await;
    let all_now = runs(&repo, "core", API).await;
    running.stop().await;
    assert_eq!(all_now, all, "exactly two runs for one decision");
    assert_eq!(backend.requests().len(), 2);
    let sub = seed.get("core", API).await;
    assert!(!sub.active && sub.state == SubscriptionState::Error, "{sub:?}");
}

async fn steps_are_recorded_exactly_and_carry_the_run_id(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), EchoBackend::start().await);
    let base = &backend.base;
    let yaml = format!(
        "- method: post\n  endpoint: \"{base}/deploy/{{{{ .Subscription.Namespace }}}}\"\n  headers:\n    Idempotency-Key: \"{{{{ .Run.ID }}}}\"\n  outputs:\n    JobID: .id\n\
         - method: get\n  endpoint: \"{base}/check/{{{{ .Run.ID }}}}\"\n  headers:\n    X-Job: \"{{{{ .Previous.Outputs.JobID }}}}\"\n"
    );
    let mut cfg = config();
    cfg.mode.insert("api".into(), serde_norway::from_str(&yaml).unwrap());
    seed.registration(API, "api", "s1").await;
    // Its own namespace per backend: both share this binary's log.
    let ns = format!("logged-{kind:?}").to_lowercase();
    seed.subscription(&ns, API).await;
    let running = start_reconciler(&repo, cfg);
    let run = wait_runs(&repo, &ns, API, 1).await.remove(0);
    eventually("synced", || synced(&seed, &ns, API, "s1")).await;
    running.stop().await;

    assert_eq!(run.result, RunResult::Success, "{run:?}");
    let step = |index: usize, method: &str, endpoint: String, outputs: &[(&str, &str)], got: &RunStep| RunStep {
        index,
        method: method.into(),
        endpoint,
        is_async: false,
        attempts: 1,
        status: 200,
        error: String::new(),
        duration_ms: got.duration_ms,
        outputs: outputs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    assert_eq!(run.steps.len(), 2, "{run:?}");
    assert_eq!(run.steps[0], step(0, "POST", format!("{base}/deploy/{ns}"), &[("JobID", "<redacted>")], &run.steps[0]));
    assert_eq!(run.steps[1], step(1, "GET", format!("{base}/check/{}", run.id), &[], &run.steps[1]));
    // `.Run.ID` as the backend received it, in a header and in a path.
    let requests = backend.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].headers.get("idempotency-key"), Some(&run.id), "{requests:?}");
    assert_eq!(requests[1].path, format!("/check/{}", run.id));
    // An output a later step's header reads is sent, never recorded.
    assert_eq!(requests[1].headers.get("x-job").map(String::as_str), Some("77"), "{requests:?}");

    // `run_id` on every line of the run, equal to the recorded id.
    let lines = log_lines();
    let of_run: Vec<&String> = lines.iter().filter(|l| l.contains(&format!("namespace=\"{ns}\""))).collect();
    assert!(of_run.len() >= 3, "the run logged: {of_run:?}");
    for line in &of_run {
        assert!(line.contains(&format!("run_id={}", run.id)), "without the run's id: {line}");
    }
    assert!(of_run.iter().any(|l| l.contains("step=")), "step lines are on the run: {of_run:?}");
}

async fn placeholder_runs_have_no_steps_and_retention_holds(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let seed = Seed(&repo);
    let cfg = ReconcilerConfig { run_history: 2, ..config() };
    seed.registration(API, "placeholder", "s0").await;
    seed.subscription("core", API).await;
    let running = start_reconciler(&repo, cfg);
    eventually("synced s0", || synced(&seed, "core", API, "s0")).await;
    for i in 1..=5 {
        seed.bump(API, &format!("s{i}")).await;
        let sync_id = format!("s{i}");
        eventually("synced", || synced(&seed, "core", API, &sync_id)).await;
    }
    // Each run's record is in the result's transaction: synced means recorded.
    let kept = runs(&repo, "core", API).await;
    running.stop().await;
    let sync_ids: Vec<&str> = kept.iter().map(|r| r.sync_id.as_str()).collect();
    assert_eq!(sync_ids, ["s4", "s5"], "the two newest runs: {kept:?}");
    for run in &kept {
        assert_eq!((run.mode.as_str(), run.result), ("placeholder", RunResult::Success));
        // A bump is `ongoing`, even when the reconciler's own previous
        // result write lands in the same coalesced entry.
        assert_eq!(run.trigger, RunTrigger::Ongoing, "{run:?}");
        assert!(run.steps.is_empty(), "a placeholder run has no steps: {run:?}");
    }

    // Runs go with their subscription.
    repo.delete_subscription("core", API).await.unwrap();
    assert!(runs(&repo, "core", API).await.is_empty());
    let history = repo.store_key_of(RecordRef::Runs { namespace: "core", api: API });
    assert!(repo.store().get(&history).await.unwrap().0.is_none(), "the history record went too");
}

/// A run that rewrites the subscription and one that does not (the
/// immediate retry's second failure) both enter the history record, so
/// retention keeps the newest runs whichever kind each was.
async fn the_history_keeps_runs_that_leave_the_subscription_untouched(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let mut cfg = ReconcilerConfig { run_history: 3, ..config() };
    one_step_mode(&mut cfg, "api", &format!("{}/fail/x", backend.base));
    seed.registration(API, "placeholder", "s1").await;
    seed.subscription("core", API).await;
    let running = start_reconciler(&repo, cfg);
    eventually("synced s1", || synced(&seed, "core", API, "s1")).await;
    // A failing pipeline: `state: error` rewrites the subscription, its
    // retry's second failure does not.
    let reg_key = RecordRef::Registration(API);
    let to = |mode: &'static str, sync_id: &'static str| {
        repo.modify::<kayra_core::ApiRegistration, _>(reg_key, "registration", move |r| {
            (r.mode, r.sync_id) = (mode.into(), sync_id.into());
            kayra_catalog::repo::Change::Write
        })
    };
    to("api", "s2").await.unwrap();
    backend.wait_for("/fail/x", 2).await;
    wait_runs(&repo, "core", API, 3).await;
    to("placeholder", "s3").await.unwrap();
    eventually("synced s3", || synced(&seed, "core", API, "s3")).await;
    let kept = runs(&repo, "core", API).await;
    running.stop().await;
    let got: Vec<(&str, RunTrigger, RunResult)> =
        kept.iter().map(|r| (r.sync_id.as_str(), r.trigger, r.result)).collect();
    assert_eq!(
        got,
        [
            ("s2", RunTrigger::Ongoing, RunResult::Error),
            ("s2", RunTrigger::Retry, RunResult::Error),
            ("s3", RunTrigger::Ongoing, RunResult::Success),
        ],
        "the three newest of four runs: {kept:?}"
    );
}

/// Runs an earlier build recorded one a record (in ring slots, as JSON or
/// compact) are read until the subscription's next run, whose result
/// writes them into its history with the new run and deletes their
/// records: an upgrade loses no run.
async fn an_earlier_builds_run_records_join_the_history(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let seed = Seed(&repo);
    seed.registration(API, "placeholder", "s1").await;
    seed.subscription("core", API).await;
    let earlier = |n: u64| Run {
        id: format!("00000000-0000-7000-8000-{n:012}"),
        namespace: "core".into(),
        api: API.into(),
        sync_id: format!("s0-{n}"),
        mode: "placeholder".into(),
        ..Run::default()
    };
    let slot = |slot: u64| repo.store_key_of(RecordRef::RunSlot { namespace: "core", api: API, slot });
    repo.store().create(&slot(0), serde_json::to_vec(&earlier(1)).unwrap()).await.unwrap();
    repo.store().create(&slot(1), kayra_core::run_codec::encode(&earlier(2))).await.unwrap();
    let ids = |runs: &[Run]| runs.iter().map(|r| r.sync_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&runs(&repo, "core", API).await), ["s0-1", "s0-2"], "read before any new run");

    let running = start_reconciler(&repo, ReconcilerConfig { run_history: 3, ..config() });
    eventually("synced s1", || synced(&seed, "core", API, "s1")).await;
    assert_eq!(ids(&runs(&repo, "core", API).await), ["s0-1", "s0-2", "s1"], "the earlier runs stay");
    let slots = repo.store().list_all(&format!("{}/", slot(0).rsplit_once('/').unwrap().0)).await.unwrap().0;
    assert!(slots.is_empty(), "their records went with the first history's write: {slots:?}");
    seed.bump(API, "s2").await;
    eventually("synced s2", || synced(&seed, "core", API, "s2")).await;
    running.stop().await;
    assert_eq!(ids(&runs(&repo, "core", API).await), ["s0-2", "s1", "s2"], "and age out as any run");
}

async fn run_history_zero_records_none_and_clears_older_ones(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let seed = Seed(&repo);
    seed.registration(API, "placeholder", "s1").await;
    seed.subscription("core", API).await;
    let running = start_reconciler(&repo, config());
    wait_runs(&repo, "core", API, 1).await;
    running.stop().await;

    let running = start_reconciler(&repo, ReconcilerConfig { run_history: 0, ..config() });
    seed.bump(API, "s2").await;
    eventually("synced s2", || synced(&seed, "core", API, "s2")).await;
    running.stop().await;
    assert!(runs(&repo, "core", API).await.is_empty(), "older runs go at the next write");
}

/// A shutdown between steps: the run is recorded as `cancelled` with the
/// steps it made, and the subscription is left as it was.
async fn a_run_stopped_by_shutdown_is_recorded_as_cancelled(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let base = &backend.base;
    let yaml = format!("- method: post\n  endpoint: \"{base}/hold/a\"\n- method: post\n  endpoint: \"{base}/ok/b\"\n");
    let mut cfg = config();
    cfg.mode.insert("api".into(), serde_norway::from_str(&yaml).unwrap());
    seed.registration(API, "api", "s1").await;
    seed.subscription("core", API).await;
    let running = start_reconciler(&repo, cfg);
    backend.wait_for("/hold/a", 1).await;
    running.cancel.cancel();
    backend.release(1);
    running.stop().await;
    let all = runs(&repo, "core", API).await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(
        (all[0].result, all[0].trigger, all[0].steps.len()),
        (RunResult::Cancelled, RunTrigger::Startup, 1),
        "{all:?}"
    );
    assert_eq!(backend.count("/ok/b"), 0, "stopped between steps");
    let sub = seed.get("core", API).await;
    assert!(!sub.active && sub.state == SubscriptionState::Init, "{sub:?}");
}

/// Every log line of this test binary, as text (`key=value` span fields).
fn log_lines() -> Vec<String> {
    common::logs::captured().lines().map(str::to_string).collect()
}

/// Installs the capturing subscriber once per test binary.
fn capture_logs() {
    common::logs::capture(common::logs::Format::Text);
}

macro_rules! runs_tests {
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

runs_tests!(
    each_trigger_comes_from_its_cause,
    a_failed_decision_leaves_an_error_run_and_a_retry_run,
    a_resync_of_a_subscription_that_never_synced_is_a_resync,
    a_resync_during_a_first_sync_runs_again_as_a_resync,
    a_retry_held_by_retry_after_is_recorded_as_the_retry,
    steps_are_recorded_exactly_and_carry_the_run_id,
    placeholder_runs_have_no_steps_and_retention_holds,
    the_history_keeps_runs_that_leave_the_subscription_untouched,
    an_earlier_builds_run_records_join_the_history,
    run_history_zero_records_none_and_clears_older_ones,
    a_run_stopped_by_shutdown_is_recorded_as_cancelled,
);
