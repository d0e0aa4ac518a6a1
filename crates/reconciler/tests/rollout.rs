//! Staged rollouts (platform §12), driven by a real reconciler against
//! both store backends: waves in order, a manual wave waiting for
//! `promote`, bake and gates, failures pausing the rollout and `resume`
//! going on without re-running what failed, first syncs and force
//! re-syncs never held, and a newer SyncID superseding a rollout.

mod common;

use std::time::Duration;

use common::backend::TestBackend;
use common::{Kind, Seed, eventually, start_reconciler, store};
use kayra_catalog::repo::Repository;
use kayra_catalog::repo::rollouts::Acted;
use kayra_config::ReconcilerConfig;
use kayra_core::ApiRegistration;
use kayra_core::rollout::{Action, Approval, RolloutPolicy, RolloutRecord, RolloutState, WavePolicy, WaveState};

const API: &str = "compute.example.com";

/// Mode `api`: one POST to `<base>/ns/<namespace>/<sync id>`, which the
/// test backend fails (500) for namespaces starting with `bad`.
fn config(base: &str) -> ReconcilerConfig {
    let endpoint = format!("{base}/ns/{{{{ .Subscription.Namespace }}}}/{{{{ .Subscription.ExpectedSyncID }}}}");
    let yaml = format!("- method: post\n  endpoint: '{endpoint}'\n  timeout: 30s\n");
    let mut cfg = ReconcilerConfig::default();
    cfg.mode.insert("api".into(), serde_norway::from_str(&yaml).unwrap());
    cfg
}

fn wave(name: &str) -> WavePolicy {
    WavePolicy { name: name.into(), ..WavePolicy::default() }
}

/// Writes `policy` on the registration and moves its SyncID, in one write.
async fn bump_with(repo: &Repository, sync_id: &str, policy: Option<RolloutPolicy>) {
    change_registration(repo, sync_id, None, policy).await;
}

/// Moves the registration to `sync_id` with `policy`, and to `mode` when given.
async fn change_registration(repo: &Repository, sync_id: &str, mode: Option<&str>, policy: Option<RolloutPolicy>) {
    repo.modify::<ApiRegistration, _>(kayra_catalog::repo::RecordRef::Registration(API), "registration", |r| {
        r.sync_id = sync_id.into();
        if let Some(mode) = mode {
            r.mode = mode.into();
        }
        r.rollout = policy.clone();
        kayra_catalog::repo::Change::Write
    })
    .await
    .unwrap();
}

/// [`config`] plus mode `first`, in which every call succeeds (so `bad`
/// namespaces can sync before the registration moves to mode `api`).
fn config_with_first(base: &str) -> ReconcilerConfig {
    let mut cfg = config(base);
    let plain = format!("- method: post\n  endpoint: '{base}/ok/{{{{ .Subscription.Namespace }}}}/s1'\n");
    cfg.mode.insert("first".into(), serde_norway::from_str(&plain).unwrap());
    cfg
}

async fn rollout(repo: &Repository) -> Option<RolloutRecord> {
    repo.rollout(API).await.unwrap().map(|r| r.value)
}

/// Waits until the rollout toward `sync_id` is in `state`.
async fn reaches(repo: &Repository, sync_id: &str, state: RolloutState) -> RolloutRecord {
    eventually(&format!("rollout to {sync_id} {}", state.as_str()), || async {
        rollout(repo).await.is_some_and(|r| r.rollout.sync_id == sync_id && r.rollout.state == state)
    })
    .await;
    rollout(repo).await.unwrap()
}

/// Registration at `s1`, `namespaces` subscribed and synced to it.
async fn synced_at_s1(repo: &Repository, namespaces: &[&str]) {
    synced_at_s1_in(repo, "api", namespaces).await;
}

/// [`synced_at_s1`] with the registration in `mode`.
async fn synced_at_s1_in(repo: &Repository, mode: &str, namespaces: &[&str]) {
    synced_at(repo, mode, "s1", namespaces).await;
}

/// Registration at `sync_id` in `mode`, `namespaces` subscribed and synced to it.
async fn synced_at(repo: &Repository, mode: &str, sync_id: &str, namespaces: &[&str]) {
    let seed = Seed(repo);
    seed.registration(API, mode, sync_id).await;
    for ns in namespaces {
        seed.namespace(ns).await;
        seed.subscription(ns, API).await;
    }
    for ns in namespaces {
        eventually(&format!("{ns} at {sync_id}"), || async { seed.get(ns, API).await.is_synced(sync_id) }).await;
    }
}

/// The revision `api`'s registration is at.
async fn registration_revision(repo: &Repository, api: &str) -> kayra_store::Revision {
    repo.get::<ApiRegistration>(kayra_catalog::repo::RecordRef::Registration(api)).await.unwrap().unwrap().revision
}

/// Waits until the reconciler has given up on `ns`'s subscription with
/// the registration at `registration` (its run and immediate retry failed).
async fn given_up_at(repo: &Repository, ns: &str, registration: kayra_store::Revision) {
    eventually(&format!("{ns} given up at registration revision {registration}"), || async {
        let key = kayra_catalog::repo::RecordRef::Attempt { namespace: ns, api: API };
        let attempt = repo.get::<kayra_reconciler::decide::Attempt>(key).await.unwrap();
        attempt.is_some_and(|a| a.value.registration_revision == registration)
    })
    .await;
}

fn calls(backend: &TestBackend, ns: &str, sync_id: &str) -> usize {
    backend.calls().iter().filter(|c| c.ends_with(&format!("/{ns}/{sync_id}"))).count()
}

async fn waves_run_in_order_and_a_manual_wave_waits_for_promote(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let running = start_reconciler(&repo, config(&backend.base));
    let names = ["a0", "a1", "a2", "a3", "a4"];
    synced_at_s1(&repo, &names).await;
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { size: "2".into(), ..wave("canary") },
            WavePolicy { approval: Approval::Manual, ..wave("rest") },
        ],
        ..RolloutPolicy::default()
    };
    bump_with(&repo, "s2", Some(policy)).await;
    let r = reaches(&repo, "s2", RolloutState::Waiting).await;
    assert_eq!((r.rollout.wave, r.rollout.waves[0].state), (1, WaveState::Completed));
    assert_eq!((r.rollout.waves[0].synced, r.rollout.waves[0].total), (2, 2));
    assert_eq!((r.rollout.waves[1].pending, r.rollout.waves[1].total), (3, 3));
    let seed = Seed(&repo);
    for ns in ["a0", "a1"] {
        assert!(seed.get(ns, API).await.is_synced("s2"), "{ns} is in the first wave");
    }
    // The second wave waits: give a wrongly released job time to show.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for ns in ["a2", "a3", "a4"] {
        assert_eq!(calls(&backend, ns, "s2"), 0, "{ns} was called before its wave: {:?}", backend.calls());
        assert!(seed.get(ns, API).await.is_synced("s1"));
    }
    let Acted::Done(promoted) = repo.act_on_rollout(API, Action::Promote, "alice", &Default::default()).await.unwrap()
    else {
        panic!("promote refused")
    };
    assert_eq!(promoted.value.rollout.state, RolloutState::Progressing);
    let r = reaches(&repo, "s2", RolloutState::Completed).await;
    assert!(r.rollout.waves.iter().all(|w| w.state == WaveState::Completed && w.pending == 0), "{r:?}");
    for ns in names {
        assert!(seed.get(ns, API).await.is_synced("s2"));
        assert_eq!(calls(&backend, ns, "s2"), 1, "{ns}: each subscriber runs once per SyncID");
    }
    running.stop().await;
}

async fn failures_beyond_max_failures_pause_and_resume_reruns_nothing_failed(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    // The `bad` ones succeed at s1 (mode `first`); at s2 (mode `api`) they fail.
    let running = start_reconciler(&repo, config_with_first(&backend.base));
    synced_at_s1_in(&repo, "first", &["bad1", "bad2", "c0", "c1", "c2"]).await;
    // In namespace-name order: `early` takes bad1, bad2 and c0; `rest` c1 and c2.
    let policy = RolloutPolicy {
        waves: vec![WavePolicy { size: "3".into(), max_failures: "1".into(), ..wave("early") }, wave("rest")],
        ..RolloutPolicy::default()
    };
    change_registration(&repo, "s2", Some("api"), Some(policy)).await;
    let r = reaches(&repo, "s2", RolloutState::Paused).await;
    assert_eq!(r.records[1].namespaces, ["c1", "c2"]);
    assert_eq!((r.rollout.wave, r.rollout.waves[0].state), (0, WaveState::Failed));
    assert_eq!(r.rollout.waves[1].state, WaveState::Pending);
    assert!(r.rollout.reason.starts_with("wave early failed: 2 of 3 subscribers failed"), "{}", r.rollout.reason);
    for ns in ["bad1", "bad2"] {
        assert_eq!(calls(&backend, ns, "s2"), 2, "the run and its immediate retry");
    }
    // Paused: the next wave waits. Give a wrongly released job time to show.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seed = Seed(&repo);
    for ns in ["c1", "c2"] {
        assert_eq!(calls(&backend, ns, "s2"), 0, "{ns} ran while paused: {:?}", backend.calls());
        assert!(seed.get(ns, API).await.is_synced("s1"), "{ns} keeps its SyncID while paused");
    }
    let Acted::Done(_) = repo.act_on_rollout(API, Action::Resume, "alice", &Default::default()).await.unwrap() else {
        panic!("resume refused")
    };
    let r = reaches(&repo, "s2", RolloutState::Completed).await;
    assert_eq!((r.rollout.waves[0].synced, r.rollout.waves[0].failed), (1, 2));
    assert_eq!((r.rollout.waves[1].synced, r.rollout.waves[1].failed, r.rollout.waves[1].total), (2, 0, 2));
    for ns in ["c0", "c1", "c2"] {
        assert!(seed.get(ns, API).await.is_synced("s2"), "{ns}");
        assert_eq!(calls(&backend, ns, "s2"), 1, "{ns} runs once after resume: {:?}", backend.calls());
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for ns in ["bad1", "bad2"] {
        assert_eq!(calls(&backend, ns, "s2"), 2, "resume re-runs nothing that failed: {:?}", backend.calls());
    }
    running.stop().await;
}

/// With `on_failure: abort` a wave beyond `max_failures` ends the
/// rollout: `aborted`, the reason naming the wave, the later waves never
/// run and keep their SyncID, and nothing resumes it.
async fn failures_beyond_max_failures_abort_when_on_failure_is_abort(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let running = start_reconciler(&repo, config_with_first(&backend.base));
    synced_at_s1_in(&repo, "first", &["bad1", "c0", "c1", "c2"]).await;
    let policy = RolloutPolicy {
        waves: vec![WavePolicy { size: "2".into(), ..wave("early") }, wave("rest")],
        on_failure: kayra_core::rollout::OnFailure::Abort,
        ..RolloutPolicy::default()
    };
    change_registration(&repo, "s2", Some("api"), Some(policy)).await;
    let r = reaches(&repo, "s2", RolloutState::Aborted).await;
    assert_eq!(r.records[0].namespaces, ["bad1", "c0"]);
    assert_eq!(r.records[1].namespaces, ["c1", "c2"]);
    assert_eq!(
        r.rollout.reason, "wave early failed: 1 of 2 subscribers failed, more than max_failures 0",
        "the reason names the wave"
    );
    assert_eq!((r.rollout.wave, r.rollout.waves[0].state), (0, WaveState::Failed));
    assert_eq!((r.rollout.waves[1].state, r.rollout.waves[1].started_at.as_str()), (WaveState::Pending, ""));
    assert_eq!(calls(&backend, "bad1", "s2"), 2, "the run and its immediate retry");
    let Acted::NotAllowed(refused) =
        repo.act_on_rollout(API, Action::Resume, "alice", &Default::default()).await.unwrap()
    else {
        panic!("an aborted rollout resumed")
    };
    assert_eq!(refused.to_string(), "cannot resume a rollout that is aborted");
    // Give a wrongly released job time to show.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seed = Seed(&repo);
    for ns in ["c1", "c2"] {
        assert_eq!(calls(&backend, ns, "s2"), 0, "{ns} ran after the abort: {:?}", backend.calls());
        assert!(seed.get(ns, API).await.is_synced("s1"), "{ns} keeps its SyncID");
    }
    assert_eq!(calls(&backend, "bad1", "s2"), 2, "no run after the abort");
    assert_eq!(rollout(&repo).await.unwrap().rollout.state, RolloutState::Aborted);
    running.stop().await;
}

/// Done means a run for *this* SyncID (§12): a subscriber left given up
/// in `error` toward s1 is, once the SyncID moves to s2, pending until
/// its own run toward s2 and that run's immediate retry have failed; the
/// state left over from s1 counts it neither failed nor done.
async fn a_subscriber_given_up_at_an_older_sync_id_is_pending_until_its_runs_toward_the_new_one_fail(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    // Mode `held`: each run waits at the backend until the test releases
    // it, then fails for `bad` namespaces.
    let mut cfg = config_with_first(&backend.base);
    let held = format!(
        "- method: post\n  endpoint: '{base}/hold/{{{{ .Subscription.Namespace }}}}/{{{{ .Subscription.ExpectedSyncID }}}}'\n  timeout: 30s\n\
         - method: post\n  endpoint: '{base}/ns/{{{{ .Subscription.Namespace }}}}/{{{{ .Subscription.ExpectedSyncID }}}}'\n  timeout: 30s\n",
        base = backend.base
    );
    cfg.mode.insert("held".into(), serde_norway::from_str(&held).unwrap());
    let running = start_reconciler(&repo, cfg);
    synced_at(&repo, "first", "s0", &["bad1", "c0"]).await;
    // Toward s1 (no policy) bad1 fails twice and is given up, in `error`.
    change_registration(&repo, "s1", Some("api"), None).await;
    given_up_at(&repo, "bad1", registration_revision(&repo, API).await).await;
    let seed = Seed(&repo);
    let bad1 = seed.get("bad1", API).await;
    assert_eq!((bad1.state, bad1.current_sync_id.as_str()), (kayra_core::SubscriptionState::Error, "s0"));
    assert_eq!(backend.count("/ns/bad1/s1"), 2);
    eventually("c0 at s1", || async { seed.get("c0", API).await.is_synced("s1") }).await;
    // Toward s2 under a rollout: `canary` is bad1 alone, `rest` c0.
    let policy = RolloutPolicy {
        waves: vec![WavePolicy { size: "1".into(), ..wave("canary") }, wave("rest")],
        ..RolloutPolicy::default()
    };
    change_registration(&repo, "s2", Some("held"), Some(policy)).await;
    let pending = |what: &'static str| {
        let repo = &repo;
        async move {
            // Three driver ticks: time for a wrong count to be written.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let r = rollout(repo).await.unwrap();
            assert_eq!(r.records[0].namespaces, ["bad1"]);
            assert_eq!((r.rollout.state, r.rollout.wave), (RolloutState::Progressing, 0), "{what}: {r:?}");
            let w = &r.rollout.waves[0];
            assert_eq!((w.state, w.synced, w.failed, w.pending), (WaveState::Progressing, 0, 0, 1), "{what}: {w:?}");
        }
    };
    backend.wait_for("/hold/bad1/s2", 1).await;
    pending("during its first run toward s2").await;
    backend.release(1);
    backend.wait_for("/hold/bad1/s2", 2).await;
    assert_eq!(backend.count("/ns/bad1/s2"), 1, "the first run failed");
    pending("during its immediate retry").await;
    backend.release(1);
    let r = reaches(&repo, "s2", RolloutState::Paused).await;
    assert!(r.rollout.reason.starts_with("wave canary failed: 1 of 1 subscribers failed"), "{}", r.rollout.reason);
    let w = &r.rollout.waves[0];
    assert_eq!((w.state, w.synced, w.failed, w.pending), (WaveState::Failed, 0, 1, 0));
    assert_eq!(backend.count("/ns/bad1/s2"), 2, "the run and its immediate retry, no more");
    assert_eq!(backend.count("/hold/c0/"), 0, "the next wave waits: {:?}", backend.calls());
    running.stop().await;
}

/// Held subscribers take no pool slot and no queue entry that blocks
/// other work: with one pool slot and many subscribers held (a manual
/// wave waiting, then the rollout paused), another API's fan-out and a
/// first sync of the held API still run.
async fn held_subscribers_take_no_pool_slot_from_other_work(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let mut cfg = config(&backend.base);
    cfg.max_concurrent_reconciles = 1;
    let running = start_reconciler(&repo, cfg);
    let names: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    synced_at_s1(&repo, &refs).await;
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { size: "1".into(), ..wave("canary") },
            WavePolicy { approval: Approval::Manual, ..wave("rest") },
        ],
        ..RolloutPolicy::default()
    };
    bump_with(&repo, "s2", Some(policy)).await;
    let r = reaches(&repo, "s2", RolloutState::Waiting).await;
    assert_eq!(r.rollout.waves[1].pending, 29, "{r:?}");
    let seed = Seed(&repo);
    // Another API's first sync, then its SyncID moving.
    const OTHER: &str = "storage.example.com";
    seed.registration(OTHER, "api", "o1").await;
    seed.namespace("zz").await;
    seed.subscription("zz", OTHER).await;
    eventually("the other API's first sync", || async { seed.get("zz", OTHER).await.is_synced("o1") }).await;
    seed.bump(OTHER, "o2").await;
    eventually("the other API's fan-out", || async { seed.get("zz", OTHER).await.is_synced("o2") }).await;
    // A first sync of the held API itself.
    seed.namespace("late").await;
    seed.subscription("late", API).await;
    eventually("a first sync of the held API", || async { seed.get("late", API).await.is_synced("s2") }).await;
    // Paused, the held subscribers still block nothing.
    let Acted::Done(_) = repo.act_on_rollout(API, Action::Pause, "alice", &Default::default()).await.unwrap() else {
        panic!("pause refused")
    };
    seed.bump(OTHER, "o3").await;
    eventually("the other API's fan-out while paused", || async { seed.get("zz", OTHER).await.is_synced("o3") }).await;
    for ns in &names[1..] {
        assert_eq!(calls(&backend, ns, "s2"), 0, "{ns} is held: {:?}", backend.calls());
        assert!(seed.get(ns, API).await.is_synced("s1"), "{ns}");
    }
    assert_eq!(calls(&backend, "zz", "o3"), 1);
    running.stop().await;
}

async fn first_syncs_and_force_resyncs_are_never_held(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let running = start_reconciler(&repo, config(&backend.base));
    synced_at_s1(&repo, &["a0", "a1"]).await;
    let policy = RolloutPolicy {
        waves: vec![WavePolicy { approval: Approval::Manual, ..wave("all") }],
        ..RolloutPolicy::default()
    };
    bump_with(&repo, "s2", Some(policy)).await;
    reaches(&repo, "s2", RolloutState::Waiting).await;
    let seed = Seed(&repo);
    // A new subscription is a first sync: outside every wave.
    seed.namespace("late").await;
    seed.subscription("late", API).await;
    eventually("late activated at s2", || async { seed.get("late", API).await.is_synced("s2") }).await;
    // A force re-sync of a held subscriber runs at once.
    seed.force_resync("a1", API).await;
    eventually("a1 re-synced", || async { seed.get("a1", API).await.is_synced("s2") }).await;
    assert_eq!(calls(&backend, "a0", "s2"), 0, "a0 is still held");
    assert!(seed.get("a0", API).await.is_synced("s1"));
    running.stop().await;
}

async fn a_gate_decides_its_wave_and_a_newer_sync_id_supersedes(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let running = start_reconciler(&repo, config(&backend.base));
    synced_at_s1(&repo, &["a0", "a1", "a2"]).await;
    let gate = |path: &str| serde_json::json!({"method": "get", "endpoint": format!("{}/{path}/gate/{{{{ .Rollout.Wave }}}}/{{{{ .Rollout.Synced }}}}", backend.base)});
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { size: "1".into(), bake: "1s".into(), gate: Some(gate("ok")), ..wave("canary") },
            WavePolicy { size: "1".into(), gate: Some(gate("fail")), ..wave("early") },
            WavePolicy { approval: Approval::Manual, ..wave("rest") },
        ],
        ..RolloutPolicy::default()
    };
    bump_with(&repo, "s2", Some(policy.clone())).await;
    let r = reaches(&repo, "s2", RolloutState::Paused).await;
    assert_eq!(backend.count("/ok/gate/canary/1"), 1, "the passing gate ran once: {:?}", backend.calls());
    assert_eq!(backend.count("/fail/gate/early/1"), 1, "the failing gate ran once: {:?}", backend.calls());
    let canary = &r.rollout.waves[0];
    let baked = humantime::parse_rfc3339_weak(&r.rollout.waves[1].started_at)
        .unwrap()
        .duration_since(humantime::parse_rfc3339_weak(&canary.finished_at).unwrap())
        .unwrap();
    assert!(baked >= Duration::from_secs(1), "the next wave started {baked:?} after the canary finished");
    assert_eq!(canary.gate.as_ref().map(|g| g.result.as_str()), Some("success"));
    assert_eq!(r.rollout.waves[1].gate.as_ref().map(|g| (g.result.as_str(), g.status)), Some(("error", 500)));
    assert!(r.rollout.reason.starts_with("wave early failed: its gate failed"), "{}", r.rollout.reason);
    // A newer SyncID: a new rollout at the first wave, with its own assignment.
    bump_with(&repo, "s3", Some(policy)).await;
    eventually("a rollout to s3", || async {
        rollout(&repo).await.is_some_and(|r| r.rollout.sync_id == "s3" && r.rollout.wave >= 1)
    })
    .await;
    let r = rollout(&repo).await.unwrap();
    assert_eq!(r.records[0].namespaces.len(), 1);
    assert_eq!(r.rollout.waves.iter().map(|w| w.total).sum::<usize>(), 3, "every subscriber is behind s3");
    running.stop().await;
}

async fn a_selector_puts_labelled_namespaces_in_their_wave(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let running = start_reconciler(&repo, config(&backend.base));
    let seed = Seed(&repo);
    seed.registration(API, "api", "s1").await;
    for (ns, tier) in [("a0", "prod"), ("a1", "canary"), ("a2", "prod"), ("a3", "canary")] {
        let labels = [("tier".to_string(), tier.to_string())].into();
        let namespace = kayra_core::Namespace { name: ns.into(), labels, ..Default::default() };
        repo.create(kayra_catalog::repo::RecordRef::Namespace(ns), &namespace, "namespace").await.unwrap();
        seed.subscription(ns, API).await;
    }
    for ns in ["a0", "a1", "a2", "a3"] {
        eventually("at s1", || async { seed.get(ns, API).await.is_synced("s1") }).await;
    }
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { selector: [("tier".to_string(), "canary".to_string())].into(), ..wave("canary") },
            WavePolicy { approval: Approval::Manual, ..wave("rest") },
        ],
        ..RolloutPolicy::default()
    };
    bump_with(&repo, "s2", Some(policy)).await;
    let r = reaches(&repo, "s2", RolloutState::Waiting).await;
    assert_eq!(r.records[0].namespaces, ["a1", "a3"], "the canaries, by their label");
    assert_eq!(r.records[1].namespaces, ["a0", "a2"]);
    for (ns, calls_at_s2) in [("a0", 0), ("a1", 1), ("a2", 0), ("a3", 1)] {
        assert_eq!(calls(&backend, ns, "s2"), calls_at_s2, "{ns}");
    }
    running.stop().await;
}

async fn a_wave_not_done_within_progress_deadline_fails(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let mut cfg = config(&backend.base);
    // Runs at s2 take 4 s: longer than the deadline.
    let slow = format!("- method: post\n  endpoint: '{}/sleep/4000/{{{{ .Subscription.Namespace }}}}'\n", backend.base);
    cfg.mode.insert("slow".into(), serde_norway::from_str(&slow).unwrap());
    let running = start_reconciler(&repo, cfg);
    synced_at_s1(&repo, &["a0", "a1"]).await;
    let policy = RolloutPolicy {
        waves: vec![wave("all")],
        progress_deadline: "1s".into(),
        on_failure: kayra_core::rollout::OnFailure::Abort,
    };
    change_registration(&repo, "s2", Some("slow"), Some(policy)).await;
    let r = reaches(&repo, "s2", RolloutState::Aborted).await;
    assert_eq!(r.rollout.reason, "wave all failed: not done within progress_deadline 1s");
    assert_eq!(r.rollout.waves[0].state, WaveState::Failed);
    let started = humantime::parse_rfc3339_weak(&r.rollout.waves[0].started_at).unwrap();
    let failed = humantime::parse_rfc3339_weak(&r.rollout.updated_at).unwrap();
    assert!(failed.duration_since(started).unwrap() >= Duration::from_secs(1), "not before its deadline");
    running.stop().await;
}

/// A gate's templates see `.Rollout` and the secrets; its secret's value
/// is sent, and shown nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_sends_its_secret_and_rollout_fields() {
    let store = store(Kind::Local).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let echo = common::echo::EchoBackend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("gate-token");
    std::fs::write(&secret, "g4te-s3cret").unwrap();
    let mut cfg = config(&backend.base);
    let source = format!("{{file: {}}}", secret.display());
    cfg.secrets.insert("gate".into(), serde_norway::from_str(&source).unwrap());
    let running = start_reconciler(&repo, cfg);
    synced_at_s1(&repo, &["a0"]).await;
    let gate = serde_json::json!({
        "method": "get",
        "endpoint": format!("{}/ok/{{{{ .Rollout.Api }}}}/{{{{ .Rollout.SyncID }}}}/{{{{ .Rollout.Wave }}}}/{{{{ .Rollout.Synced }}}}/{{{{ .Rollout.Failed }}}}", echo.base),
        "headers": {"Authorization": {"type": "Bearer", "secret": "gate"}}
    });
    let policy =
        RolloutPolicy { waves: vec![WavePolicy { gate: Some(gate), ..wave("only") }], ..RolloutPolicy::default() };
    bump_with(&repo, "s2", Some(policy)).await;
    let r = reaches(&repo, "s2", RolloutState::Completed).await;
    assert_eq!(r.rollout.waves[0].gate.as_ref().map(|g| (g.result.as_str(), g.status)), Some(("success", 200)));
    let requests = echo.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].path, format!("/ok/{API}/s2/only/1/0"));
    assert_eq!(requests[0].headers.get("authorization").map(String::as_str), Some("Bearer g4te-s3cret"));
    let stored = serde_json::to_string(&r).unwrap();
    assert!(!stored.contains("g4te-s3cret"));
    running.stop().await;
}

/// The driver's transitions are events (§14) written with the record:
/// one `rollout.wave_completed` per wave passed, one `rollout.halted` when a
/// wave fails, one `rollout.completed` when the last wave passes (here
/// after a `resume`), each delivered once however many ticks see the state.
async fn the_drivers_transitions_are_told_to_sinks_once_each(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let sinks: kayra_config::NotificationsConfig = serde_json::from_value(serde_json::json!({
        "sinks": {"ops": {"url": format!("{}/ok/sink", backend.base),
                          "events": ["rollout.wave_completed", "rollout.halted", "rollout.completed"]}}
    }))
    .unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let reconciler = kayra_reconciler::Reconciler::new(repo.clone(), config_with_first(&backend.base), cancel.clone())
        .unwrap()
        .with_notifications(&sinks)
        .unwrap();
    let running = common::Running::spawn(reconciler, cancel);
    // Everyone syncs at s1 in mode `first`; at s2 (mode `api`) `bad1` fails.
    synced_at_s1_in(&repo, "first", &["a0", "a1", "bad1"]).await;
    let policy = RolloutPolicy {
        waves: vec![WavePolicy { size: "1".into(), ..wave("canary") }, wave("rest")],
        ..RolloutPolicy::default()
    };
    change_registration(&repo, "s2", Some("api"), Some(policy)).await;
    reaches(&repo, "s2", RolloutState::Paused).await;
    eventually("both events delivered", || async { backend.count("/ok/sink") >= 2 }).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let kinds = |deliveries: &[kayra_core::notifications::Delivery]| {
        let mut kinds: Vec<String> = deliveries.iter().map(|d| d.event.kind.clone()).collect();
        kinds.sort();
        kinds
    };
    let deliveries = repo.deliveries_page(None, None, None, 0).await.unwrap().items;
    assert_eq!(kinds(&deliveries), ["rollout.halted", "rollout.wave_completed"], "{deliveries:?}");
    // Resumed, `rest` passes with its failure accepted and the rollout completes.
    let Acted::Done(_) = repo.act_on_rollout(API, Action::Resume, "alice", &sinks).await.unwrap() else {
        panic!("resume refused")
    };
    reaches(&repo, "s2", RolloutState::Completed).await;
    eventually("four events delivered", || async { backend.count("/ok/sink") >= 4 }).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let deliveries = repo.deliveries_page(None, None, None, 0).await.unwrap().items;
    assert_eq!(
        kinds(&deliveries),
        ["rollout.completed", "rollout.halted", "rollout.wave_completed", "rollout.wave_completed"],
        "{deliveries:?}"
    );
    for d in &deliveries {
        assert_eq!(d.state, kayra_core::notifications::DeliveryState::Delivered, "{d:?}");
    }
    let completed = deliveries.iter().find(|d| d.event.kind == "rollout.completed").unwrap();
    assert_eq!((completed.event.api.as_str(), completed.event.sync_id.as_str()), (API, "s2"));
    assert_eq!(completed.event.data, serde_json::json!({"waves": 2}));
    assert_eq!(backend.count("/ok/sink"), 4, "each event told once");
    running.stop().await;
}

/// Three reconcilers on one etcd advance one rollout; the one whose
/// task ends mid-bake (as a killed process would) stops nothing: the bake
/// keeps its deadline and every subscriber runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_reconcilers_drive_a_rollout_and_losing_one_mid_bake_repeats_and_stalls_nothing() {
    let store = store(Kind::Etcd).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let names: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut fleet = Vec::new();
    for _ in 0..3 {
        let other = Repository::new(store.connect_again().await, "dev", "local");
        fleet.push(start_reconciler(&other, config(&backend.base)));
    }
    synced_at_s1(&repo, &refs).await;
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { size: "4".into(), bake: "2s".into(), ..wave("one") },
            WavePolicy { size: "4".into(), bake: "1s".into(), ..wave("two") },
            wave("three"),
        ],
        ..RolloutPolicy::default()
    };
    bump_with(&repo, "s2", Some(policy)).await;
    reaches(&repo, "s2", RolloutState::Baking).await;
    fleet.remove(0).abort();
    let r = reaches(&repo, "s2", RolloutState::Completed).await;
    for pair in r.rollout.waves.windows(2) {
        let finished = humantime::parse_rfc3339_weak(&pair[0].finished_at).unwrap();
        let started = humantime::parse_rfc3339_weak(&pair[1].started_at).unwrap();
        let baked = started.duration_since(finished).unwrap();
        assert!(
            baked >= Duration::from_secs(1),
            "wave {} started {baked:?} after {} finished",
            pair[1].name,
            pair[0].name
        );
    }
    assert!(r.rollout.waves.iter().all(|w| w.total == 4 && w.synced == 4), "{:?}", r.rollout.waves);
    for ns in &names {
        assert_eq!(calls(&backend, ns, "s2"), 1, "{ns}: {:?}", backend.calls());
    }
    for running in fleet {
        running.stop().await;
    }
}

both_backends!(
    a_wave_not_done_within_progress_deadline_fails,
    the_drivers_transitions_are_told_to_sinks_once_each,
    a_selector_puts_labelled_namespaces_in_their_wave,
    waves_run_in_order_and_a_manual_wave_waits_for_promote,
    failures_beyond_max_failures_pause_and_resume_reruns_nothing_failed,
    failures_beyond_max_failures_abort_when_on_failure_is_abort,
    a_subscriber_given_up_at_an_older_sync_id_is_pending_until_its_runs_toward_the_new_one_fail,
    held_subscribers_take_no_pool_slot_from_other_work,
    first_syncs_and_force_resyncs_are_never_held,
    a_gate_decides_its_wave_and_a_newer_sync_id_supersedes
);
