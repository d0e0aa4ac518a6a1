//! Fencing (platform contract §7), with real `kayra reconciler` processes
//! on one etcd: a reconciler SIGSTOPped past its lease (`lock_ttl: 2s`)
//! while its step is held at the backend loses the job to a second one,
//! which finishes it; resumed, the first records nothing, and its backend
//! call carries a lower `.Run.FencingToken` than the second's.

mod common;

use std::time::Duration;

use common::{API, Reconciler, World};
use kayra_catalog::repo::keys;
use kayra_core::{Run, RunResult};
use kayra_testkit::eventually;
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_reconciler_past_its_lease_records_nothing() {
    let world = World::new().await;
    world.seed(&["core"], "s1").await;
    // The step's path carries the fencing token: /hold/<token>/core.
    let behaviour = "hold/{{ .Run.FencingToken }}";
    let first = Reconciler::start(&world.config("first", behaviour));
    world.backend.wait_for("/hold/", 1).await;
    first.signal(Signal::SIGSTOP);

    // The first's lease expires (no renewals while stopped): the second
    // takes the job lock and calls the backend too.
    let second = Reconciler::start(&world.config("second", behaviour));
    world.backend.wait_for("/hold/", 2).await;
    world.backend.release(2);
    eventually("synced by the second", || world.all_synced(&["core"], "s1")).await;
    let runs_key = keys::runs("dev", "local", "core", API);
    let recorded = || async { world.repo.list_all::<Run>(&runs_key).await.unwrap().0 };
    eventually("the second's run is recorded", || async { recorded().await.len() == 1 }).await;
    let sub_key = keys::subscription("dev", "local", "core", API);
    let before = world.repo.get::<kayra_core::Subscription>(&sub_key).await.unwrap().unwrap().revision;

    first.signal(Signal::SIGCONT);
    eventually("the first finds its lock lost", || async {
        first.lines().iter().any(|l| l.contains("job lock lost during the reconcile"))
    })
    .await;
    // Give a stray write every chance to land before checking.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = world.repo.get::<kayra_core::Subscription>(&sub_key).await.unwrap().unwrap().revision;
    assert_eq!(after, before, "the resumed first wrote the subscription");
    let runs: Vec<Run> = recorded().await.into_iter().map(|r| r.value).collect();
    assert_eq!(runs.len(), 1, "only the second's run: {runs:?}");
    assert_eq!(runs[0].result, RunResult::Success);
    assert!(runs[0].reconciler.ends_with(&format!(":{}", second.child.id())), "{runs:?}");

    let tokens: Vec<i64> = world
        .backend
        .calls()
        .iter()
        .filter_map(|path| path.strip_prefix("/hold/")?.split('/').next()?.parse().ok())
        .collect();
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    assert!(tokens[0] > 0 && tokens[0] < tokens[1], "the first's token is lower: {tokens:?}");
    drop(second);
    drop(first);
}
