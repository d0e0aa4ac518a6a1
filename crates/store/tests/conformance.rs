//! Runs the store conformance suite (`kayra_store::testsuite`) against
//! every backend: each case is one test per backend, so `cargo test` lists
//! `local::<case>` and `etcd::<case>` side by side. Every etcd test starts
//! its own etcd (see `kayra_testkit::Etcd`).

use kayra_store::Store;

/// A store plus whatever keeps it alive (temp dir, etcd process).
struct TestStore {
    store: Store,
    _dir: Option<tempfile::TempDir>,
    _etcd: Option<kayra_testkit::Etcd>,
}

async fn local() -> TestStore {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = kayra_testkit::local_config(dir.path());
    let local = kayra_store::local::LocalStore::open(&config.path, config.poll_interval.0).expect("open local store");
    TestStore { store: Store::new(local), _dir: Some(dir), _etcd: None }
}

async fn etcd() -> TestStore {
    let etcd = kayra_testkit::Etcd::start().await;
    let store = kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await.expect("connect to etcd");
    TestStore { store: Store::new(store), _dir: None, _etcd: Some(etcd) }
}

/// One `#[tokio::test]` per case in `mod local` and in `mod etcd`.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = super::local().await;
                    kayra_store::testsuite::$case(&store.store).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = super::etcd().await;
                    kayra_store::testsuite::$case(&store.store).await;
                }
            )*
        }
    };
}

conformance!(
    get_missing,
    create_then_conflict,
    update_compare_and_swap,
    delete_conditional,
    list_sorted_and_paginated,
    changes_order_puts_and_deletes,
    changes_replay_history_from_a_past_revision,
    list_then_changes_lose_nothing,
    revision_moves_only_on_writes,
    txn_compares_choose_the_branch,
    txn_ops_apply_in_order_atomically,
    txn_prefix_empty_guards,
    grouped_txns_answer_as_if_alone,
    watcher_lists_then_watches_in_order,
    watcher_reports_progress,
    watcher_lists_many_pages_at_one_revision,
    lists_of_uneven_keys_read_whole,
    snapshot_many_reads_one_revision,
    run_all,
);
