//! Space per subscription (issue 34): a store filled by the generator
//! ([`crate::generate`]) with `n` synced subscriptions and their run
//! history, and what it takes —
//!
//! - etcd: the backend's size (`etcdctl endpoint status`, `dbSize`) after
//!   compaction and defragmentation, less that of the empty store, per
//!   subscription, against the goal: a million fit in etcd's default
//!   2 GiB quota with ≥ 25 % left for history (≤ 1,610 B each);
//! - the local store: the SQLite file's size per subscription.
//!
//! etcd runs with an 8 GiB quota here, so a fill the default would refuse
//! is still measured.

use anyhow::Context;
use kayra_catalog::repo::Repository;
use kayra_store::Store;

use crate::generate::{self, Shape};

/// etcd's default backend quota.
const DEFAULT_QUOTA: u64 = 2 << 30;
/// The goal: a million subscriptions in 75 % of the default quota.
const GOAL_PER_SUBSCRIPTION: u64 = DEFAULT_QUOTA * 3 / 4 / 1_000_000;
/// Transactions in flight while filling.
const IN_FLIGHT: usize = 8;

pub async fn run(n: usize, runs: usize, steps: usize) -> anyhow::Result<()> {
    println!("| backend | measurement | figure | goal |");
    println!("|---|---|---:|---|");
    let shape = Shape::spread(n, runs, steps);
    let what = format!(
        "{n} synced subscriptions ({} namespaces × {} APIs), a history of {} runs each of {steps} steps",
        shape.namespaces,
        shape.apis,
        runs.min(generate::DEFAULT_RUN_HISTORY)
    );

    let etcd = kayra_testkit::Etcd::start_with(&["--quota-backend-bytes=8589934592"]).await;
    let endpoint = etcd.endpoint();
    let empty = db_size(&endpoint)?;
    let repo = Repository::new(
        Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await?),
        "prod",
        "eu1",
    );
    let filled = generate::fill(&repo, &shape, IN_FLIGHT).await?;
    filled_row("etcd", &what, &filled);
    let size = db_size(&endpoint)?;
    let per = (size - empty) / n as u64;
    println!(
        "| etcd | dbSize after compaction and defrag: {} MiB; per subscription | {per} B | ≤ {GOAL_PER_SUBSCRIPTION} B ({}); at 1,000,000: {:.2} GiB of 2 GiB |",
        size >> 20,
        if per <= GOAL_PER_SUBSCRIPTION { "met" } else { "missed" },
        (per * 1_000_000) as f64 / f64::from(1u32 << 30)
    );

    // The floor: the same history keys, empty, in an etcd of their own.
    let floor = kayra_testkit::Etcd::start_with(&["--quota-backend-bytes=8589934592"]).await;
    let empty = db_size(&floor.endpoint())?;
    let repo = Repository::new(
        Store::new(kayra_store::etcd::EtcdStore::connect(&floor.config("/kayra")).await?),
        "prod",
        "eu1",
    );
    let keys = generate::fill_run_keys(&repo, &shape, IN_FLIGHT).await?;
    let floor_size = db_size(&floor.endpoint())?;
    if keys > 0 {
        let key = (floor_size - empty) / keys as u64;
        println!(
            "| etcd | floor: the {keys} history records' keys alone (empty values, written raw); per key, per subscription | {key} B, {} B | one record a subscription: ≥ {} B before any byte of a run |",
            (floor_size - empty) / n as u64,
            (floor_size - empty) / n as u64
        );
    }
    drop(floor);

    let dir = tempfile::tempdir()?;
    let local = kayra_testkit::local_config(dir.path());
    let repo = Repository::new(
        Store::new(kayra_store::local::LocalStore::open(&local.path, local.poll_interval.0)?),
        "prod",
        "eu1",
    );
    let before = file_size(&local.path)?;
    let filled = generate::fill(&repo, &shape, IN_FLIGHT).await?;
    filled_row("local", &what, &filled);
    drop(repo);
    let size = file_size(&local.path)?;
    println!(
        "| local | SQLite file (with its WAL): {} MiB; per subscription | {} B | (no quota) |",
        size >> 20,
        (size - before) / n as u64
    );
    Ok(())
}

fn filled_row(backend: &str, what: &str, filled: &generate::Filled) {
    println!(
        "| {backend} | generated {what}: {} records, {} runs in {} transactions | {:.1} s | minutes, not hours |",
        filled.records,
        filled.runs,
        filled.transactions,
        filled.took.as_secs_f64()
    );
}

/// etcd's backend size once its whole history is compacted away and the
/// file defragmented, as `etcdctl endpoint status` reports it.
pub(crate) fn db_size(endpoint: &str) -> anyhow::Result<u64> {
    let status = etcdctl(endpoint, &["endpoint", "status", "-w", "json"])?;
    let revision = status[0]["Status"]["header"]["revision"].as_u64().context("revision")?;
    etcdctl(endpoint, &["compaction", "--physical", &revision.to_string()]).ok();
    etcdctl(endpoint, &["defrag"])?;
    let status = etcdctl(endpoint, &["endpoint", "status", "-w", "json"])?;
    status[0]["Status"]["dbSize"].as_u64().context("dbSize")
}

fn etcdctl(endpoint: &str, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        // A defragmentation of a million subscriptions' store takes longer
        // than etcdctl's default 5 s.
        .arg("--command-timeout=10m")
        .args(args)
        .output()
        .context("run etcdctl (apt-get install -y etcd-client)")?;
    anyhow::ensure!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null))
}

/// The SQLite file and its WAL, in bytes.
fn file_size(path: &std::path::Path) -> anyhow::Result<u64> {
    let wal = std::path::PathBuf::from(format!("{}-wal", path.display()));
    let len = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    Ok(len(path) + len(&wal))
}
