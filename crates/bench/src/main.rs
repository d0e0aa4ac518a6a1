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
//! - the reconciler (`reconcile.rs`): fan-out, run recording, a 20 ms
//!   step, scale-out, round trips per reconcile, a staged rollout's fan-out
//!   (`--rollout-only` for that figure alone); the placeholder fan-out
//!   alone at any size against raw puts and its floor (`--fan-out-only`,
//!   `--pool`);
//! - a real `kayra reconciler`'s restart over 100,000 synced
//!   subscriptions (`restart.rs`, `--restart`; any number with
//!   `--restart-subscribers`): time to ready, RSS, idle;
//! - bytes per subscription in etcd and the local store (`space.rs`,
//!   `--space N`), over a store filled by the generator (`generate.rs`).

mod client;
mod console;
mod generate;
mod reconcile;
mod restart;
mod serve;
mod space;
mod streams;

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_core::Subscription;
use kayra_store::Store;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    /// Operations per measurement.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Subscriptions in the placeholder fan-out measurements.
    #[arg(long, default_value_t = 2000)]
    subscribers: usize,
    /// Subscriptions behind the 20 ms step.
    #[arg(long, default_value_t = 3000)]
    step_subscribers: usize,
    /// Subscriptions in the scale-out measurement (100 ms step).
    #[arg(long, default_value_t = 900)]
    scale_subscribers: usize,
    /// Only the reconciler's figures (`reconcile.rs`).
    #[arg(long)]
    reconciler_only: bool,
    /// Run the scale-out measurement's reconcilers as real processes of
    /// this `kayra` binary (default: in this process).
    #[arg(long)]
    reconciler_processes: Option<std::path::PathBuf>,
    /// Only the placeholder fan-out at `--subscribers`, every history
    /// full, against raw puts (`reconcile.rs`; issue 34 at 100,000).
    #[arg(long)]
    fan_out_only: bool,
    /// The reconciler's `max_concurrent_reconciles` in `--fan-out-only`.
    #[arg(long, default_value_t = 30)]
    pool: usize,
    /// Only the staged rollout's figures (`reconcile.rs`, issue 31), at
    /// `--subscribers`.
    #[arg(long)]
    rollout_only: bool,
    /// With `--reconciler-only`, `--fan-out-only`, `--rollout-only` or `--serve-only`: only this backend's figures (`local` or `etcd`).
    #[arg(long, value_parser = ["local", "etcd"])]
    backend: Option<String>,
    /// Only the `kayra serve` figures (`serve.rs`).
    #[arg(long)]
    serve_only: bool,
    /// Only the console's `/status` figures (`console.rs`).
    #[arg(long)]
    console_only: bool,
    /// Synced subscriptions (with one run each) the generator fills the
    /// `kayra serve` figures' stores with before the server starts: the
    /// GET and POST ratios over a large store (issue 34: 1,000,000).
    #[arg(long, default_value_t = 0)]
    serve_prefill: usize,
    /// Subscribers of the one API the console's `/status` figures read.
    #[arg(long, default_value_t = 10_000)]
    console_subscribers: usize,
    /// Also measure a real `kayra serve`'s RSS over a large store, running this binary.
    #[arg(long)]
    memory: Option<std::path::PathBuf>,
    /// Only the watch-stream figures (`streams.rs`), on this `kayra` binary.
    #[arg(long)]
    streams: Option<std::path::PathBuf>,
    /// Watch streams held open by `--streams`.
    #[arg(long, default_value_t = 1000)]
    stream_count: usize,
    /// Only the restart figures (`restart.rs`), on this `kayra` binary.
    #[arg(long)]
    restart: Option<std::path::PathBuf>,
    /// Synced subscriptions the restart starts over.
    #[arg(long, default_value_t = 100_000)]
    restart_subscribers: usize,
    /// Run records each of them keeps in the restart's store.
    #[arg(long, default_value_t = 1)]
    restart_runs: usize,
    /// Only the space figures (`space.rs`): bytes per subscription of a
    /// store the generator fills with this many.
    #[arg(long)]
    space: Option<usize>,
    /// Syncs each subscription of `--space` has had (its run records: at
    /// most the default `run_history` of 20).
    #[arg(long, default_value_t = 20)]
    space_runs: usize,
    /// Steps of each run of `--space` (0: the placeholder mode's).
    #[arg(long, default_value_t = 0)]
    space_steps: usize,
    /// Writes whose delivery `--streams` times.
    #[arg(long, default_value_t = 20)]
    stream_writes: usize,
}

const API: &str = "compute.example.com";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Warnings of the layers measured (a store error, a retried job) go to
    // stderr, so a figure that looks wrong can be explained.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .init();
    if let Some(binary) = &args.streams {
        return streams_only(binary, &args).await;
    }
    if let Some(binary) = &args.restart {
        return restart_only(binary, &args).await;
    }
    if let Some(n) = args.space {
        return space::run(n, args.space_runs, args.space_steps).await;
    }
    let dir = tempfile::tempdir()?;
    let local = kayra_testkit::local_config(dir.path());
    let etcd = kayra_testkit::Etcd::start().await;
    if args.rollout_only {
        return rollout_only(&args, &local, &etcd).await;
    }
    println!("| backend | measurement | ops/s | ratio to raw |");
    println!("|---|---|---:|---:|");
    if args.fan_out_only {
        return fan_out_only(&args, &local, &etcd).await;
    }
    if args.reconciler_only {
        return reconciler(&args, &local, &etcd).await;
    }
    if !args.serve_only && !args.console_only {
        let store = Store::new(kayra_store::local::LocalStore::open(&local.path, local.poll_interval.0)?);
        run("local", store, &args).await?;
        let store = Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/bench")).await?);
        run("etcd", store, &args).await?;
        reconciler(&args, &local, &etcd).await?;
    }
    if !args.console_only {
        serve_figures(&args, &etcd).await?;
    }
    println!();
    println!("| backend | measurement | p50 ms | p99 ms | ratio |");
    println!("|---|---|---:|---:|---|");
    let console_dir = tempfile::tempdir()?;
    let n = args.console_subscribers;
    console::run("local", kayra_config::DatabaseConfig::local(kayra_testkit::local_config(console_dir.path())), n)
        .await?;
    console::run("etcd", kayra_config::DatabaseConfig::etcd(etcd.config("/console")), n).await?;
    if let Some(binary) = &args.memory {
        serve::memory(&kayra_config::DatabaseConfig::etcd(etcd.config("/memory")), binary).await?;
    }
    Ok(())
}

async fn serve_figures(args: &Args, etcd: &kayra_testkit::Etcd) -> anyhow::Result<()> {
    println!();
    println!("| backend | measurement | ops/s | p50 ms | p99 ms | ratio |");
    println!("|---|---|---:|---:|---:|---|");
    let serve_dir = tempfile::tempdir()?;
    if args.backend.as_deref() != Some("etcd") {
        let database = kayra_config::DatabaseConfig::local(kayra_testkit::local_config(serve_dir.path()));
        serve::run("local", database, None, args.ops, args.serve_prefill).await?;
    }
    if args.backend.as_deref() == Some("local") {
        return Ok(());
    }
    // A prefilled store needs more than etcd's default quota, history included.
    let large = match args.serve_prefill {
        0 => None,
        _ => Some(kayra_testkit::Etcd::start_with(&["--quota-backend-bytes=8589934592"]).await),
    };
    let etcd = large.as_ref().unwrap_or(etcd);
    let database = kayra_config::DatabaseConfig::etcd(etcd.config("/serve"));
    serve::run("etcd", database, Some(etcd.endpoint()), args.ops, args.serve_prefill).await
}

async fn restart_only(binary: &std::path::Path, args: &Args) -> anyhow::Result<()> {
    println!("| backend | measurement | figure | target |");
    println!("|---|---|---:|---|");
    let etcd = kayra_testkit::Etcd::start().await;
    let store = Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/restart")).await?);
    let database = format!("  etcd:\n    endpoints: [{}]\n    prefix: /restart\n", etcd.endpoint());
    restart::run("etcd", &store, &database, binary, (args.restart_subscribers, args.restart_runs)).await?;
    let dir = tempfile::tempdir()?;
    let local = kayra_testkit::local_config(dir.path());
    let store = Store::new(kayra_store::local::LocalStore::open(&local.path, local.poll_interval.0)?);
    let database = format!("  local:\n    path: {}\n    poll_interval: 20ms\n", local.path.display());
    restart::run("local", &store, &database, binary, (args.restart_subscribers, args.restart_runs)).await
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
        let repo = Repository::new(store.clone(), "bench", inflight.to_string());
        let typed = rate(args.ops, inflight, |i| {
            let repo = repo.clone();
            async move {
                let sub = Subscription::new(format!("ns{inflight}-{i}"), API);
                let key = RecordRef::Subscription { namespace: &sub.namespace, api: API };
                repo.create(key, &sub, "subscription").await.map(|_| ())
            }
        })
        .await?;
        row(&format!("Repository create, {inflight} in flight"), typed, raw);
    }
    api(backend, store.clone(), args).await
}

/// The reconciler's table, both backends.
async fn reconciler(args: &Args, local: &kayra_config::LocalConfig, etcd: &kayra_testkit::Etcd) -> anyhow::Result<()> {
    println!();
    println!("| backend | measurement | value | ratio |");
    println!("|---|---|---:|---|");
    let mut sizes = reconcile::Sizes {
        fan_out: args.subscribers,
        step: args.step_subscribers,
        scale: args.scale_subscribers,
        scale_out: None,
    };
    if args.backend.as_deref() != Some("etcd") {
        reconcile::run("local", local_connect(local), None, &sizes).await?;
    }
    if args.backend.as_deref() == Some("local") {
        return Ok(());
    }
    let connect = etcd_connect(etcd, "/reconcile");
    sizes.scale_out = Some(match &args.reconciler_processes {
        Some(binary) => reconcile::ScaleOut::Processes {
            binary: binary.clone(),
            endpoint: etcd.endpoint(),
            prefix: "/reconcile".into(),
        },
        None => reconcile::ScaleOut::InProcess,
    });
    reconcile::run("etcd", connect, Some(etcd_compact(etcd).await), &sizes).await
}

/// The placeholder fan-out alone (`--fan-out-only`), both backends or `--backend`'s.
async fn fan_out_only(
    args: &Args,
    local: &kayra_config::LocalConfig,
    etcd: &kayra_testkit::Etcd,
) -> anyhow::Result<()> {
    if args.backend.as_deref() != Some("etcd") {
        reconcile::fan_out_only("local", local_connect(local), None, (args.subscribers, args.pool)).await?;
    }
    if args.backend.as_deref() != Some("local") {
        let compact = etcd_compact(etcd).await;
        let sizes = (args.subscribers, args.pool);
        reconcile::fan_out_only("etcd", etcd_connect(etcd, "/fanout"), Some(compact), sizes).await?;
    }
    Ok(())
}

/// The staged rollout's figures alone (`--rollout-only`), both backends.
async fn rollout_only(
    args: &Args,
    local: &kayra_config::LocalConfig,
    etcd: &kayra_testkit::Etcd,
) -> anyhow::Result<()> {
    println!("| backend | measurement | value | ratio |");
    println!("|---|---|---:|---|");
    let n = args.subscribers;
    if args.backend.as_deref() != Some("etcd") {
        let connect = local_connect(local);
        let (store, probe) = (connect().await?, connect().await?);
        let cost = reconcile::rollout_cost(&store, &probe, None, n).await?;
        reconcile::print_rollout("local", n, &cost);
    }
    if args.backend.as_deref() != Some("local") {
        let connect = etcd_connect(etcd, "/rollout");
        let (store, probe) = (connect().await?, connect().await?);
        let compact = etcd_compact(etcd).await;
        let cost = reconcile::rollout_cost(&store, &probe, Some(&compact), n).await?;
        reconcile::print_rollout("etcd", n, &cost);
    }
    Ok(())
}

/// New clients of the local store at `local`.
fn local_connect(local: &kayra_config::LocalConfig) -> reconcile::Connect {
    let (path, poll) = (local.path.clone(), local.poll_interval.0);
    Arc::new(move || {
        let path = path.clone();
        Box::pin(async move { Ok(Store::new(kayra_store::local::LocalStore::open(&path, poll)?)) })
    })
}

/// New clients of `etcd` under `prefix`.
fn etcd_connect(etcd: &kayra_testkit::Etcd, prefix: &str) -> reconcile::Connect {
    let config = etcd.config(prefix);
    Arc::new(move || {
        let config = config.clone();
        Box::pin(async move { Ok(Store::new(kayra_store::etcd::EtcdStore::connect(&config).await?)) })
    })
}

/// Compacts `etcd`'s whole history up to now.
async fn etcd_compact(etcd: &kayra_testkit::Etcd) -> reconcile::Compact {
    let client = etcd.client().await;
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            let revision = client.get("/", None).await?.header().map_or(0, |h| h.revision());
            client.compact(revision, Some(etcd_client::CompactionOptions::new().with_physical())).await?;
            Ok(())
        })
    })
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
