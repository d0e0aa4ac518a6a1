//! Store outages (both backends).
//!
//! - Re-list with deletes in the gap: the store's watcher re-lists after an
//!   etcd compaction or a trimmed local change log, and the reconciler
//!   replaces its view whole, so a subscription deleted while it was not
//!   watching leaves no stale view entry and no attempt record.
//! - A result the store fails to record (an etcd election outlasting the
//!   request timeout) is recorded again, not reconciled again: the steps
//!   that already ran are not called a second time.

mod common;

use std::time::Duration;

use common::backend::TestBackend;
use common::{Kind, Seed, eventually, one_step_mode, start_reconciler};
use kayra_catalog::repo::{Collection, RecordRef, Repository};
use kayra_config::ReconcilerConfig;
use kayra_core::SubscriptionState;
use kayra_reconciler::Reconciler;
use kayra_store::testsuite::{FeedSwitch, Switched};
use kayra_store::{Op, Store};
use tokio_util::sync::CancellationToken;

const API: &str = "compute.example.com";

/// A store whose change feeds can be cut, and a way to lose its history.
struct Gap {
    store: Store,
    switch: FeedSwitch,
    _dir: Option<tempfile::TempDir>,
    etcd: Option<kayra_testkit::Etcd>,
}

impl Gap {
    async fn new(kind: Kind) -> Self {
        match kind {
            Kind::Local => {
                let dir = tempfile::tempdir().unwrap();
                let local = kayra_store::local::LocalStore::open_with_retention(
                    &dir.path().join("kayra.db"),
                    Duration::from_millis(20),
                    10,
                )
                .unwrap();
                let (backend, switch) = Switched::new(local);
                Self { store: Store::new(backend), switch, _dir: Some(dir), etcd: None }
            }
            Kind::Etcd => {
                let etcd = kayra_testkit::Etcd::start().await;
                let inner = kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await.unwrap();
                let (backend, switch) = Switched::new(inner);
                Self { store: Store::new(backend), switch, _dir: None, etcd: Some(etcd) }
            }
        }
    }

    /// Makes the history since the cut unavailable to a resuming watch.
    async fn lose_history(&self) {
        for i in 0..20 {
            self.store.create(&format!("/filler/{i}"), b"f".to_vec()).await.unwrap();
        }
        if let Some(etcd) = &self.etcd {
            let at = self.store.revision().await.unwrap();
            etcd.client().await.compact(at, None).await.unwrap();
        }
    }
}

async fn deletes_in_a_relist_gap_are_learnt(kind: Kind) {
    let gap = Gap::new(kind).await;
    let repo = Repository::new(gap.store.clone(), "dev", "local");
    let seed = Seed(&repo);
    let backend = TestBackend::start().await;
    let mut cfg = ReconcilerConfig::default();
    one_step_mode(&mut cfg, "api", &format!("{}/fail/x", backend.base));
    seed.registration(API, "api", "s1").await;
    seed.subscription("gone", API).await;
    let cancel = CancellationToken::new();
    let reconciler = Reconciler::new(repo.clone(), cfg, cancel.clone()).unwrap();
    let view = reconciler.view_handle();
    let handle = tokio::spawn(async move { reconciler.run().await.unwrap() });
    // Two failures, then the given-up record.
    backend.wait_for("/fail/x", 2).await;
    let attempt = RecordRef::Attempt { namespace: "gone", api: API };
    eventually("given up", || async { repo.get::<serde_json::Value>(attempt).await.unwrap().is_some() }).await;
    eventually("state error", || async { seed.get("gone", API).await.state == SubscriptionState::Error }).await;
    eventually("the view has it", || async { view.read().unwrap().has_given_up("gone", API) }).await;

    // Unwatched: the subscription goes (its record only, as an older
    // server's delete would leave the attempt), and history is lost.
    gap.switch.cut();
    repo.store()
        .delete(&repo.store_key_of(RecordRef::Subscription { namespace: "gone", api: API }), None)
        .await
        .unwrap();
    gap.lose_history().await;
    gap.switch.restore();

    eventually("the view forgot the subscription", || async {
        view.read().unwrap().subscription("gone", API).is_none()
    })
    .await;
    eventually("the leftover attempt record is removed", || async {
        repo.get::<serde_json::Value>(attempt).await.unwrap().is_none()
    })
    .await;
    assert!(!view.read().unwrap().has_given_up("gone", API));
    cancel.cancel();
    handle.await.unwrap();
}

async fn a_result_the_store_fails_to_record_is_recorded_not_reconciled_again(kind: Kind) {
    let gap = Gap::new(kind).await;
    let repo = Repository::new(gap.store.clone(), "dev", "local");
    let seed = Seed(&repo);
    let backend = TestBackend::start().await;
    let mut cfg = ReconcilerConfig::default();
    one_step_mode(&mut cfg, "api", &format!("{}/ok/x", backend.base));
    seed.registration(API, "api", "s1").await;
    // The result's transaction is the one that records a run.
    let runs = repo.layout().prefix(Collection::Runs);
    gap.switch.fail_txns(3, move |txn| {
        txn.success.iter().any(|op| matches!(op, Op::Put { key, .. } if key.starts_with(&runs)))
    });
    seed.subscription("core", API).await;
    let running = start_reconciler(&repo, cfg);

    eventually("synced", || async { seed.get("core", API).await.is_synced("s1") }).await;
    assert_eq!(gap.switch.txns_left_to_fail(), 0, "the result write failed three times first");
    // Past the queue's store backoff, when a reconcile thrown away would run again.
    tokio::time::sleep(kayra_reconciler::ensure::STORE_BACKOFF * 2).await;
    assert_eq!(backend.count("/ok/x"), 1, "the step ran once");
    let runs = repo.runs_page("core", API, None, 0).await.unwrap().items;
    assert_eq!(runs.len(), 1, "one run recorded");
    running.stop().await;
}

both_backends!(deletes_in_a_relist_gap_are_learnt, a_result_the_store_fails_to_record_is_recorded_not_reconciled_again,);
