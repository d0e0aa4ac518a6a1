//! `kayra-bench`: how much kayra costs on top of its store.
//!
//! Every figure is measured against the raw store *in the same run*, on
//! the same machine, and reported as a ratio, so results from noisy or
//! different machines stay comparable. Run with
//! `cargo run --release -p kayra-bench -- --ops 2000`; the numbers of record
//! live in `docs/BENCHMARKS.md`.
//!
//! Measured per backend (local SQLite file, a private etcd):
//! - raw store creates, 1 and 32 in flight;
//! - `Repository` typed creates (JSON encoding + key layout), same concurrency;
//! - the catalog API over HTTP (authentication, RBAC, validation, JSON,
//!   axum): `POST /namespaces` and `GET /namespaces/{name}`, 32 in flight,
//!   against raw creates and gets at the same concurrency;
//! - reconciler fan-out: after a SyncID bump, reconciles completed per
//!   second (placeholder mode: the cost is kayra's, not a backend's),
//!   against raw compare-and-swap updates of the same records.

mod serve;
mod streams;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use kayra_catalog::repo::{Change, Repository, keys};
use kayra_config::ReconcilerConfig;
use kayra_core::{ApiRegistration, Subscription};
use kayra_reconciler::Reconciler;
use kayra_store::Store;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    /// Operations per measurement.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Subscriptions in the fan-out measurement.
    #[arg(long, default_value_t = 500)]
    subscribers: usize,
    /// Only the `kayra serve` figures (`serve.rs`).
    #[arg(long)]
    serve_only: bool,
    /// Also measure a real `kayra serve`'s RSS over a large store, running this binary.
    #[arg(long)]
    memory: Option<std::path::PathBuf>,
    /// Only the watch-stream figures (`streams.rs`), on this `kayra` binary.
    #[arg(long)]
    streams: Option<std::path::PathBuf>,
    /// Watch streams held open by `--streams`.
    #[arg(long, default_value_t = 1000)]
    stream_count: usize,
    /// Writes whose delivery `--streams` times.
    #[arg(long, default_value_t = 20)]
    stream_writes: usize,
}

const API: &str = "compute.example.com";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(binary) = &args.streams {
        return streams_only(binary, &args).await;
    }
    println!("| backend | measurement | ops/s | ratio to raw |");
    println!("|---|---|---:|---:|");
    let dir = tempfile::tempdir()?;
    let local = kayra_testkit::local_config(dir.path());
    let etcd = kayra_testkit::Etcd::start().await;
    if !args.serve_only {
        let store = Store::new(kayra_store::local::LocalStore::open(&local.path, local.poll_interval.0)?);
        run("local", store, &args).await?;
        let store = Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/bench")).await?);
        run("etcd", store, &args).await?;
    }
    println!();
    println!("| backend | measurement | ops/s | p50 ms | p99 ms | ratio |");
    println!("|---|---|---:|---:|---:|---|");
    let serve_dir = tempfile::tempdir()?;
    let database = kayra_config::DatabaseConfig::local(kayra_testkit::local_config(serve_dir.path()));
    serve::run("local", database, None, args.ops).await?;
    let database = kayra_config::DatabaseConfig::etcd(etcd.config("/serve"));
    serve::run("etcd", database, Some(etcd.endpoint()), args.ops).await?;
    if let Some(binary) = &args.memory {
        serve::memory(&kayra_config::DatabaseConfig::etcd(etcd.config("/memory")), binary).await?;
    }
    Ok(())
}

async fn streams_only(binary: &std::path::Path, args: &Args) -> anyhow::Result<()> {
    println!("| backend | measurement | figure | ratio / p99 |");
    println!("|---|---|---:|---:|");
    let etcd = kayra_testkit::Etcd::start().await;
    let database = format!("  etcd:\n    endpoints: [{}]\n    prefix: /streams\n", etcd.endpoint());
    streams::run("etcd", binary, &database, args.stream_count, args.stream_writes, args.ops).await?;
    let dir = tempfile::tempdir()?;
    // The local store's watch polls: its interval bounds the delivery time.
    let database = format!("  local:\n    path: {}\n    poll_interval: 20ms\n", dir.path().join("kayra.db").display());
    streams::run("local", binary, &database, args.stream_count, args.stream_writes, args.ops).await
}

async fn run(backend: &str, store: Store, args: &Args) -> anyhow::Result<()> {
    let row = |what: &str, rate: f64, raw: f64| println!("| {backend} | {what} | {rate:.0} | {:.2} |", rate / raw);
    for inflight in [1, 32] {
        let raw = rate(args.ops, inflight, |i| {
            let store = store.clone();
            async move { store.create(&format!("/bench/raw{inflight}/{i:08}"), vec![b'x'; 256]).await.map(|_| ()) }
        })
        .await?;
        row(&format!("raw store create, {inflight} in flight"), raw, raw);
        let repo = Repository::new(store.clone(), "dev", "local");
        let typed = rate(args.ops, inflight, |i| {
            let repo = repo.clone();
            async move {
                let sub = Subscription::new(format!("ns{inflight}-{i}"), API);
                let key = keys::subscription("bench", &inflight.to_string(), &sub.namespace, API);
                repo.create(&key, &sub, "subscription").await.map(|_| ())
            }
        })
        .await?;
        row(&format!("Repository create, {inflight} in flight"), typed, raw);
    }
    api(backend, store.clone(), args).await?;
    fan_out(backend, store, args).await
}

/// The catalog API on a real server on loopback, against the raw store.
async fn api(backend: &str, store: Store, args: &Args) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let token = "bench-admin-token-0123456789abcdef0123456789";
    let mut config = kayra_config::Config::default();
    config.auth.bootstrap_token = token.into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/apis/catalog.example.com/v1/namespaces", listener.local_addr()?);
    let cancel = CancellationToken::new();
    let server = tokio::spawn(kayra_server::run(config, store.clone(), listener, cancel.clone().cancelled_owned()));
    let http = reqwest::Client::new();
    kayra_testkit::eventually("api up", || async {
        http.get(&base).bearer_auth(token).send().await.is_ok_and(|r| r.status().is_success())
    })
    .await;

    let raw_create = rate(args.ops, 32, |i| {
        let store = store.clone();
        async move { store.create(&format!("/bench/api-raw/{i:08}"), vec![b'x'; 64]).await.map(|_| ()) }
    })
    .await?;
    let api_create = rate(args.ops, 32, |i| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r =
                http.post(&base).bearer_auth(token).json(&serde_json::json!({"name": format!("b{i}")})).send().await?;
            r.error_for_status().map(|_| ())
        }
    })
    .await?;
    println!("| {backend} | raw store create, 32 in flight | {raw_create:.0} | 1.00 |");
    println!("| {backend} | API POST /namespaces, 32 in flight | {api_create:.0} | {:.2} |", api_create / raw_create);
    let raw_get = rate(args.ops, 32, |i| {
        let store = store.clone();
        async move { store.get(&format!("/bench/api-raw/{i:08}")).await.map(|_| ()) }
    })
    .await?;
    let api_get = rate(args.ops, 32, |i| {
        let (http, base) = (http.clone(), base.clone());
        async move { http.get(format!("{base}/b{i}")).bearer_auth(token).send().await?.error_for_status().map(|_| ()) }
    })
    .await?;
    println!("| {backend} | raw store get, 32 in flight | {raw_get:.0} | 1.00 |");
    println!("| {backend} | API GET /namespaces/{{name}}, 32 in flight | {api_get:.0} | {:.2} |", api_get / raw_get);
    cancel.cancel();
    server.await??;
    Ok(())
}

/// Ops per second of `ops` calls of `op`, `inflight` at a time.
async fn rate<F, Fut, E>(ops: usize, inflight: usize, op: F) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let started = Instant::now();
    let results: Vec<Result<(), E>> = futures::stream::iter(0..ops).map(op).buffer_unordered(inflight).collect().await;
    for r in results {
        r.context("benchmark operation")?;
    }
    Ok(ops as f64 / started.elapsed().as_secs_f64())
}

async fn fan_out(backend: &str, store: Store, args: &Args) -> anyhow::Result<()> {
    let repo = Repository::new(store.clone(), "dev", "local");
    let reg =
        ApiRegistration { name: API.into(), mode: "placeholder".into(), sync_id: "s1".into(), ..Default::default() };
    repo.create(&keys::registration("dev", "local", API), &reg, "registration").await?;
    for i in 0..args.subscribers {
        let sub = Subscription::new(format!("t{i}"), API);
        repo.create(&keys::subscription("dev", "local", &sub.namespace, API), &sub, "subscription").await?;
    }
    // Raw baseline: one CAS update of every subscription record, 30 in flight
    // (the reconciler's default pool size).
    let (subs, _) = repo.list_subscriptions().await?;
    let subs = Arc::new(subs);
    let raw = rate(subs.len(), 30, |i| {
        let (store, subs) = (store.clone(), subs.clone());
        async move {
            let kv = &subs[i];
            let key = keys::subscription("dev", "local", &kv.value.namespace, API);
            let (current, _) = store.get(&key).await?;
            let current = current.ok_or_else(|| kayra_store::Error::NotFound(key.clone()))?;
            store.update(&key, current.value, current.mod_revision).await.map(|_| ())
        }
    })
    .await?;
    println!("| {backend} | raw CAS update (read + update), 30 in flight | {raw:.0} | 1.00 |");

    let config = ReconcilerConfig { max_concurrent_reconciles: 30, ..Default::default() };
    let cancel = CancellationToken::new();
    let reconciler = Reconciler::new(repo.clone(), config, cancel.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let handle = tokio::spawn(reconciler.run());
    wait_synced(&repo, "s1", args.subscribers).await?;
    let started = Instant::now();
    repo.modify::<ApiRegistration, _>(&keys::registration("dev", "local", API), "registration", |r| {
        r.sync_id = "s2".into();
        Change::Write
    })
    .await?;
    wait_synced(&repo, "s2", args.subscribers).await?;
    let fan = args.subscribers as f64 / started.elapsed().as_secs_f64();
    println!("| {backend} | reconciler fan-out after a SyncID bump, pool 30 | {fan:.0} | {:.2} |", fan / raw);
    cancel.cancel();
    handle.await??;
    Ok(())
}

async fn wait_synced(repo: &Repository, sync_id: &str, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (subs, _) = repo.list_subscriptions().await?;
        if subs.iter().filter(|s| s.value.is_synced(sync_id)).count() >= n {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "fan-out did not converge");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
