//! The generator (issue 34): fills a store with a converged deployment —
//! `namespaces` × `apis` registrations and `subscriptions` spread over
//! them, every one active and synced to its registration's SyncID, each
//! with the run history a reconciler leaves after `runs` syncs (at most
//! the default `run_history` of 20 records) — fast, with writes batched
//! and several transactions in flight.
//!
//! It writes exactly what kayra writes, through the Repository: the
//! namespaces, registrations and subscriptions by [`Repository::import`]'s
//! bulk create (guard and index keys included, each key compared absent),
//! and each subscription's run history record as the result writes'
//! riders encode it ([`Repository::rider_puts`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use kayra_catalog::repo::backup::{MAX_TXN_KEYS, Record};
use kayra_catalog::repo::{Repository, Rider};
use kayra_core::run_ring::RunRing;
use kayra_core::{ApiRegistration, Namespace, Run, RunResult, RunStep, RunTrigger, Subscription, SubscriptionState};
use kayra_store::{Revision, Txn};

/// The reconciler's default `run_history`.
pub const DEFAULT_RUN_HISTORY: usize = 20;
/// Subscriptions per bulk create (each its own sequence of transactions).
const SUBSCRIPTIONS_PER_IMPORT: usize = 2_000;

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub namespaces: usize,
    pub apis: usize,
    /// At most `namespaces × apis`: subscription `i` is namespace
    /// `i % namespaces`'s to API `i / namespaces`.
    pub subscriptions: usize,
    /// Syncs each subscription has had; its history keeps the last
    /// `min(runs, DEFAULT_RUN_HISTORY)`.
    pub runs: usize,
    /// Steps of each run: 0 is the `placeholder` mode's run.
    pub steps: usize,
}

impl Shape {
    /// `subscriptions` over 10,000 namespaces (fewer when there are fewer
    /// subscriptions) and as many APIs as that takes.
    pub fn spread(subscriptions: usize, runs: usize, steps: usize) -> Shape {
        let namespaces = subscriptions.clamp(1, 10_000);
        Shape { namespaces, apis: subscriptions.div_ceil(namespaces), subscriptions, runs, steps }
    }

    /// The SyncID every registration is at, and every subscription synced to.
    pub fn sync_id(&self) -> String {
        sync_id(self.runs.max(1) - 1)
    }

    fn mode(&self) -> &'static str {
        if self.steps == 0 { "placeholder" } else { "api" }
    }
}

/// The SyncID of bump `seq`, as `PUT …/sync` sets them (RFC 3339 with
/// nanoseconds): an hour apart.
pub fn sync_id(seq: usize) -> String {
    let at = std::time::UNIX_EPOCH
        + Duration::from_secs(1_764_000_000 + seq as u64 * 3_600)
        + Duration::from_nanos(123_456_789);
    humantime::format_rfc3339_nanos(at).to_string()
}

pub fn namespace(i: usize) -> String {
    format!("t{i:05}")
}

pub fn api(a: usize) -> String {
    format!("api{a:03}.example.com")
}

/// What [`fill`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct Filled {
    /// Catalog records (namespaces, registrations, subscriptions).
    pub records: usize,
    /// Runs kept, in one history record a subscription.
    pub runs: usize,
    pub transactions: usize,
    pub took: Duration,
    /// The store's revision once every write is in.
    pub revision: Revision,
}

/// Fills `repo`'s store (which holds none of it yet) with `shape`,
/// `in_flight` transactions at a time.
pub async fn fill(repo: &Repository, shape: &Shape, in_flight: usize) -> anyhow::Result<Filled> {
    anyhow::ensure!(
        shape.subscriptions <= shape.namespaces * shape.apis,
        "{} subscriptions do not fit {} namespaces × {} APIs",
        shape.subscriptions,
        shape.namespaces,
        shape.apis
    );
    let started = Instant::now();
    let sync_id = shape.sync_id();
    let mut catalog: Vec<Record> = (0..shape.apis)
        .map(|a| {
            Record::Registration(ApiRegistration {
                name: api(a),
                mode: shape.mode().into(),
                sync_id: sync_id.clone(),
                platform: repo.platform().into(),
                region: repo.region().into(),
                ..Default::default()
            })
        })
        .collect();
    catalog.extend((0..shape.namespaces).map(|i| Record::Namespace(active(&namespace(i)))));
    let mut transactions = repo.import_unchecked(&catalog).await.context("namespaces and registrations")?.transactions;

    let chunks = (0..shape.subscriptions).step_by(SUBSCRIPTIONS_PER_IMPORT).map(|from| {
        let to = (from + SUBSCRIPTIONS_PER_IMPORT).min(shape.subscriptions);
        let records: Vec<Record> = (from..to).map(|i| Record::Subscription(synced(shape, i))).collect();
        async move { repo.import_unchecked(&records).await.map(|done| done.transactions) }
    });
    let mut imports = futures::stream::iter(chunks).buffer_unordered(in_flight);
    while let Some(done) = imports.next().await {
        transactions += done.context("subscriptions")?;
    }

    let kept = shape.runs.min(DEFAULT_RUN_HISTORY);
    transactions += write_runs(repo, shape, in_flight, Values::Encoded).await.context("run history")?;
    Ok(Filled {
        records: catalog.len() + shape.subscriptions,
        runs: shape.subscriptions * kept,
        transactions,
        took: started.elapsed(),
        revision: repo.store().revision().await?,
    })
}

/// The floor of the run history's space: the keys [`fill`] writes it
/// under, each with an empty value, written raw (no kayra code but the
/// key names), `in_flight` transactions at a time: what a record of its
/// own costs the store whatever it holds. The keys written.
pub async fn fill_run_keys(repo: &Repository, shape: &Shape, in_flight: usize) -> anyhow::Result<usize> {
    if shape.runs == 0 {
        return Ok(0);
    }
    write_runs(repo, shape, in_flight, Values::Empty).await.context("run history keys")?;
    Ok(shape.subscriptions)
}

/// What [`write_runs`] stores under each history key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Values {
    /// The history as a result write's rider encodes it.
    Encoded,
    /// Nothing (the keys' own cost).
    Empty,
}

/// Writes every subscription's run history record, as many a transaction
/// as one may hold, `in_flight` at a time: the transactions it took.
async fn write_runs(repo: &Repository, shape: &Shape, in_flight: usize, values: Values) -> anyhow::Result<usize> {
    if shape.runs == 0 {
        return Ok(0);
    }
    let batches = (0..shape.subscriptions).step_by(MAX_TXN_KEYS).map(|from| {
        let to = (from + MAX_TXN_KEYS).min(shape.subscriptions);
        let histories: Vec<(String, String, RunRing)> = (from..to)
            .map(|i| (namespace(i % shape.namespaces), api(i / shape.namespaces), history(shape, i)))
            .collect();
        async move {
            let riders: Vec<Rider<'_>> = histories
                .iter()
                .map(|(namespace, api, ring)| Rider::Runs { namespace, api, ring, first: false })
                .collect();
            let ops = repo.rider_puts(&riders).into_iter().map(|op| match (op, values) {
                (kayra_store::Op::Put { key, .. }, Values::Empty) => kayra_store::Op::Put { key, value: Vec::new() },
                (op, _) => op,
            });
            repo.store().txn(ops.fold(Txn::new(), Txn::then)).await.map(|_| ())
        }
    });
    let mut writes = futures::stream::iter(batches).buffer_unordered(in_flight);
    let mut transactions = 0;
    while let Some(done) = writes.next().await {
        done?;
        transactions += 1;
    }
    Ok(transactions)
}

fn active(name: &str) -> Namespace {
    Namespace { name: name.into(), active: true, ..Namespace::default() }
}

/// Subscription `i`, as the reconciler leaves it after `shape.runs` syncs.
fn synced(shape: &Shape, i: usize) -> Subscription {
    Subscription {
        active: true,
        state: SubscriptionState::Success,
        current_sync_id: shape.sync_id(),
        ..Subscription::new(namespace(i % shape.namespaces), api(i / shape.namespaces))
    }
}

/// The run history subscription `i` keeps.
fn history(shape: &Shape, i: usize) -> RunRing {
    let kept = shape.runs.min(DEFAULT_RUN_HISTORY);
    let newest_first: Vec<Run> = (shape.runs - kept..shape.runs).rev().map(|seq| run(shape, i, seq)).collect();
    RunRing::of(&newest_first, DEFAULT_RUN_HISTORY)
}

/// Run `seq` of subscription `i`: its sync to SyncID [`sync_id`]`(seq)`,
/// a second long, with `shape.steps` answered steps.
fn run(shape: &Shape, i: usize, seq: usize) -> Run {
    let (namespace, api) = (namespace(i % shape.namespaces), api(i / shape.namespaces));
    // A UUIDv7 of the run's start, as the reconciler makes them.
    let at = 1_764_000_000_000 + (seq as u64) * 3_600_000 + (i as u64 % 3_600_000);
    let id = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, at / 1000, (at % 1000) as u32 * 1_000_000));
    let stamp = |ms: u64| {
        let time = std::time::UNIX_EPOCH + Duration::from_millis(ms);
        humantime::format_rfc3339_millis(time).to_string()
    };
    let steps = (0..shape.steps)
        .map(|index| RunStep {
            index,
            method: if index == 0 { "POST" } else { "PUT" }.into(),
            endpoint: format!("https://backend.example.com/api/v1/tenants/{namespace}/items/{index}"),
            is_async: false,
            attempts: 1,
            status: 200,
            error: String::new(),
            duration_ms: 42,
            outputs: BTreeMap::from([("ID".to_string(), format!("{namespace}-{index}"))]),
        })
        .collect();
    Run {
        id: id.to_string(),
        namespace,
        api,
        sync_id: sync_id(seq),
        mode: shape.mode().into(),
        trigger: if seq == 0 { RunTrigger::Initial } else { RunTrigger::Ongoing },
        result: RunResult::Success,
        error: String::new(),
        started_at: stamp(at),
        finished_at: stamp(at + 1000),
        lock_id: i % 30,
        reconciler: "reconciler-7:4242".into(),
        steps,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use kayra_catalog::repo::Collection;
    use kayra_config::ReconcilerConfig;
    use tokio_util::sync::CancellationToken;

    use super::*;

    #[test]
    fn a_spread_fits_its_subscriptions() {
        for n in [1, 999, 10_000, 10_001, 1_000_000] {
            let shape = Shape::spread(n, 20, 0);
            assert!(shape.namespaces * shape.apis >= n && shape.namespaces <= 10_000, "{n}: {shape:?}");
        }
    }

    /// The generated store reads as kayra's own: every subscription synced
    /// to its registration with its run history, and a reconciler started
    /// over it is idle — no write, no reconcile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reconciler_over_a_generated_store_is_idle() {
        let dir = tempfile::tempdir().unwrap();
        let config = kayra_config::DatabaseConfig::local(kayra_testkit::local_config(dir.path()));
        let repo = Repository::new(kayra_store::Store::open(&config).await.unwrap(), "dev", "local");
        let shape = Shape { namespaces: 300, apis: 4, subscriptions: 1_000, runs: 23, steps: 1 };
        let filled = fill(&repo, &shape, 4).await.unwrap();
        assert_eq!((filled.records, filled.runs), (4 + 300 + 1_000, 20_000));

        let runs = repo.runs_page("t00007", &api(2), None, 0).await.unwrap().items;
        assert_eq!(runs.len(), 20, "the newest 20 of 23");
        assert_eq!(
            runs.iter().map(|r| r.sync_id.clone()).collect::<Vec<_>>()[..2],
            [sync_id(22), sync_id(21)],
            "newest first"
        );
        let (subs, _) = repo.list_all::<Subscription>(Collection::Subscriptions).await.unwrap();
        assert_eq!(subs.len(), 1_000);
        assert!(subs.iter().all(|s| s.value.active && s.value.current_sync_id == shape.sync_id()));
        let (namespace_subs, _) =
            repo.list_all::<Subscription>(Collection::NamespaceSubscriptions("t00007")).await.unwrap();
        assert_eq!(namespace_subs.len(), 4);
        // Every record and, beside each subscription, its two index keys
        // (by API and by namespace), as a create through the API writes
        // them, and its one run history record.
        let (everything, _) = repo.store().list_all("/").await.unwrap();
        assert_eq!(everything.len(), 4 + 300 + 1_000 * 4, "the index keys are written too");

        let cancel = CancellationToken::new();
        let config = ReconcilerConfig::default();
        let reconciler = Reconciler::new(repo.clone(), config, cancel.clone()).unwrap();
        let ready = reconciler.ready_flag();
        let running = tokio::spawn(reconciler.run());
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "ready within 60 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Idle is an absence: watched over a fixed window once ready.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(repo.store().revision().await.unwrap(), filled.revision, "no store write");
        cancel.cancel();
        running.await.unwrap().unwrap();
    }

    use kayra_reconciler::Reconciler;
}
