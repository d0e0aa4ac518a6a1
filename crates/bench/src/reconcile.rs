//! The reconciler's figures (issue 12, issue 14), each against the raw
//! store or the pool's ideal time measured in the same run:
//! - placeholder fan-out after a SyncID bump, pool 30, with `run_history`
//!   20 and 0 (four bumps each, alternating, while the history of runs
//!   fills; then filled, four more with it full), against raw single-key puts
//!   at 32 in flight (the mean of a run before and one after the bumps,
//!   which grow the store) and raw read + CAS updates at 30, with the
//!   store round trips per reconcile, and the raw store's own cost of a
//!   run-sized second record in each grouped write (the floor of run
//!   recording's cost);
//! - the same fan-out with a notification sink told of
//!   `subscription.failed` and `fanout.completed`, against one without
//!   (notifications' cost, §14), bumps alternating;
//! - the same fan-out staged by a rollout policy of three waves without
//!   bake (§12, issue 31), until every subscriber is synced and the
//!   rollout record says `completed`, against one without a policy, bumps
//!   alternating, with its floor: the same three waves bumped by hand
//!   (three deployments of the waves' sizes, each bumped once the one
//!   before converged);
//! - one 20 ms HTTP step (a real local HTTP backend), pool 30, against the
//!   ideal N × 20 ms / 30, with the floor of that figure measured without
//!   kayra (the same calls from 30 callers, with and without one raw put
//!   after each), and on etcd also with a real `kayra reconciler` process;
//! - scale-out on one etcd: 1, 2, 3 reconcilers (each its own `Reconciler`
//!   and store client), a 100 ms step, pool 30, against N × 100 ms /
//!   (30 × R), checking each subscriber's step ran exactly once per bump.
//!
//! Every measurement has its own deployment (platform `bench`, its own
//! region), so none sees another's records. Progress is polled through a
//! second store client (`probe`), so the reconciler's round-trip count is
//! its own.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kayra_catalog::repo::{Change, Collection, RecordRef, Repository, Rider};
use kayra_config::{NotificationsConfig, ReconcilerConfig};
use kayra_core::rollout::{Approval, RolloutPolicy, RolloutRecord, RolloutState, WavePolicy};
use kayra_core::run_ring::RunRing;
use kayra_core::{ApiRegistration, Subscription};
use kayra_reconciler::Reconciler;
use kayra_store::{Compare, Op, Store, Txn};
use kayra_testkit::backend::TestBackend;
use tokio_util::sync::CancellationToken;

const API: &str = "compute.example.com";
const PLATFORM: &str = "bench";
/// SyncID bumps of each placeholder fan-out deployment, in each phase
/// (the run ring filling, then full).
const FAN_OUT_BUMPS: usize = 4;
/// `run_history` of the fan-out deployments: the default, and none.
const HISTORIES: [usize; 2] = [20, 0];

/// Bumps `rounds` of the two fan-out deployments (`HISTORIES`),
/// alternating which goes first, each with a reconciler of its own:
/// appends their rates and adds up their store round trips. Each bump
/// starts on a compacted history where the store has one (`compact`), as
/// bumps minutes apart on a production etcd do.
async fn alternate_bumps(
    store: &Store,
    compact: Option<&Compact>,
    deployments: &[Deployment],
    rounds: std::ops::Range<usize>,
    rates: &mut [Vec<f64>; 2],
    trips: &mut [f64; 2],
) -> anyhow::Result<()> {
    for round in rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let config =
                ReconcilerConfig { max_concurrent_reconciles: 30, run_history: HISTORIES[i], ..Default::default() };
            let running = vec![start(store, &deployments[i].region, config)?];
            deployments[i].wait_synced(&format!("s{}", round + 1)).await?;
            settle(store).await;
            compacted(compact).await?;
            let before = store.round_trips();
            let took = deployments[i].bump_and_wait(&format!("s{}", round + 2)).await?;
            trips[i] += (store.round_trips() - before) as f64;
            stop(running).await?;
            rates[i].push(deployments[i].n as f64 / took.as_secs_f64());
        }
    }
    Ok(())
}

/// `n` raw single-key puts of 256 bytes under `/bench/rawput/<round>/`,
/// 32 in flight: the fan-outs' baseline.
async fn raw_puts(store: &Store, n: usize, round: &'static str) -> anyhow::Result<f64> {
    rate(n, 32, move |i| {
        let store = store.clone();
        async move {
            let key = format!("/bench/rawput/{round}/{i:08}");
            store.txn(Txn::new().then(Op::Put { key, value: vec![b'x'; 256] })).await.map(|_| ())
        }
    })
    .await
}

/// SyncID bumps [`fan_out_only`] measures.
const LARGE_FAN_OUT_BUMPS: usize = 3;

/// The placeholder fan-out alone at `n` subscribers of one API, with the
/// default `run_history` and every history full (a long-lived deployment:
/// each run displaces the oldest), against raw single-key puts before and
/// after (`--fan-out-only`; issue 34 at 100,000), and against its floor
/// ([`reconcile_floor`]). `pool` is the reconciler's
/// `max_concurrent_reconciles`. Prints the initial sync of every
/// subscriber too, for what it is worth.
pub async fn fan_out_only(
    backend: &str,
    connect: Connect,
    compact: Option<Compact>,
    (n, pool): (usize, usize),
) -> anyhow::Result<()> {
    let store = connect().await?;
    let probe = connect().await?;
    let row = |what: &str, value: String, ratio: String| println!("| {backend} | {what} | {value} | {ratio} |");
    let raw_before = raw_puts(&store, n, "before").await?;
    let deployment = Deployment::seed(&probe, "large", "placeholder", n).await?;
    let config = ReconcilerConfig { max_concurrent_reconciles: pool, ..Default::default() };
    let running = vec![start(&store, &deployment.region, config.clone())?];
    let started = Instant::now();
    deployment.wait_synced("s1").await?;
    let initial = n as f64 / started.elapsed().as_secs_f64();
    stop(running).await?;
    let keep = config.run_history;
    deployment.fill_runs(keep).await?;
    let running = vec![start(&store, &deployment.region, config)?];
    settle(&store).await;
    // Each bump followed by the floor, so that the store's drift weighs on both alike.
    let (mut rates, mut floors) = (Vec::new(), Vec::new());
    let (mut trips, mut floor_trips) = (0.0, 0.0);
    for bump in 0..LARGE_FAN_OUT_BUMPS {
        compacted(compact.as_ref()).await?;
        settle(&store).await;
        let before = store.round_trips();
        let took = deployment.bump_and_wait(&format!("s{}", bump + 2)).await?;
        trips += (store.round_trips() - before) as f64;
        rates.push(n as f64 / took.as_secs_f64());
        compacted(compact.as_ref()).await?;
        let before = store.round_trips();
        floors.push(reconcile_floor(&store, &deployment).await?);
        floor_trips += (store.round_trips() - before) as f64;
    }
    stop(running).await?;
    compacted(compact.as_ref()).await?;
    let raw_after = raw_puts(&store, n, "after").await?;
    let raw_put = (raw_before + raw_after) / 2.0;
    row(
        &format!("raw single-key put, 32 in flight, {n} keys (before and after the fan-outs)"),
        format!("{raw_put:.0}/s ({raw_before:.0}, {raw_after:.0})"),
        "1.00".into(),
    );
    row(
        &format!("initial sync, placeholder, {n} subscribers, pool {pool}"),
        format!("{initial:.0}/s"),
        format!("{:.2} of puts", initial / raw_put),
    );
    let each = |rates: &[f64]| rates.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
    let (fan, floor) = (overall(&rates), overall(&floors));
    row(
        &format!(
            "fan-out, placeholder, {n} subscribers, pool {pool}, run_history {keep} full ({LARGE_FAN_OUT_BUMPS} bumps: {}/s)",
            each(&rates)
        ),
        format!("{fan:.0}/s"),
        format!("{:.2} of puts", fan / raw_put),
    );
    row(
        &format!(
            "floor: the store's own work of those reconciles, no kayra code ({LARGE_FAN_OUT_BUMPS} rounds: {}/s)",
            each(&floors)
        ),
        format!("{floor:.0}/s"),
        format!("{:.2} of puts; the fan-out {:.2} of it", floor / raw_put, fan / floor),
    );
    let reconciles = (n * LARGE_FAN_OUT_BUMPS) as f64;
    row(
        "store round trips per reconcile: the fan-out's, the floor's",
        format!("{:.2}, {:.2}", trips / reconciles, floor_trips / reconciles),
        "-".into(),
    );
    Ok(())
}

/// The store's own work of one fan-out's reconciles, through the store
/// client with no decision, pipeline or encoding of kayra's: for each
/// subscriber, the job lock's transaction (its key put if absent, with
/// the job's four reads) and then the result's (the subscription's and
/// its run history's values written back as read, compared on the
/// subscription's revision, the lock's key deleted), both by group commit
/// as the reconciler's are, 30 in flight. Subscribers/s.
async fn reconcile_floor(store: &Store, deployment: &Deployment) -> anyhow::Result<f64> {
    rate(deployment.n, 30, |i| {
        let (store, keys) = (store.clone(), deployment.repo.job_read_keys(&format!("t{i}"), API));
        async move {
            let lock = format!("/bench/floor/locks/{i:08}");
            let locked =
                Txn::new().when(Compare::Absent(lock.clone())).then(Op::Put { key: lock.clone(), value: Vec::new() });
            let read = store.txn_grouped(keys.into_iter().fold(locked, |t, key| t.then(Op::Get { key }))).await?;
            let mut gets = read.gets.into_iter();
            let subscription = gets.next().flatten().ok_or_else(|| kayra_store::Error::NotFound(lock.clone()))?;
            let mut result = Txn::new()
                .when(Compare::ModRevision(subscription.key.clone(), subscription.mod_revision))
                .then(Op::Put { key: subscription.key, value: subscription.value });
            if let Some(runs) = gets.nth(2).flatten() {
                result = result.then(Op::Put { key: runs.key, value: runs.value });
            }
            store.txn_grouped(result.then(Op::Delete { key: lock })).await.map(|_| ())
        }
    })
    .await
}

/// Fan-out rates (subscribers/s) of a deployment whose reconciler tells
/// no sink and of one whose reconciler tells a sink answering 200 at once,
/// bumps alternating which goes first.
async fn notification_cost(
    store: &Store,
    probe: &Store,
    compact: Option<&Compact>,
    http: &TestBackend,
    n: usize,
) -> anyhow::Result<[f64; 2]> {
    let yaml = format!(
        "sinks:\n  ops:\n    url: \"{}/ok/sink\"\n    events: [subscription.failed, fanout.completed]\n",
        http.base
    );
    let sink: NotificationsConfig = serde_norway::from_str(&yaml)?;
    let deployments = [
        Deployment::seed(probe, "untold", "placeholder", n).await?,
        Deployment::seed(probe, "told", "placeholder", n).await?,
    ];
    let mut rates: [Vec<f64>; 2] = Default::default();
    for round in 0..FAN_OUT_BUMPS {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let config = ReconcilerConfig { max_concurrent_reconciles: 30, ..Default::default() };
            let running = vec![start_told(store, &deployments[i].region, config, (i == 1).then_some(&sink))?];
            deployments[i].wait_synced(&format!("s{}", round + 1)).await?;
            settle(store).await;
            compacted(compact).await?;
            let took = deployments[i].bump_and_wait(&format!("s{}", round + 2)).await?;
            stop(running).await?;
            rates[i].push(deployments[i].n as f64 / took.as_secs_f64());
        }
    }
    Ok([overall(&rates[0]), overall(&rates[1])])
}

/// A new client of the same store (another process's connection).
pub type Connect = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = anyhow::Result<Store>> + Send>> + Send + Sync>;

/// Compacts the store's history up to now (etcd: what its
/// `--auto-compaction-*` does in production), waiting until it is done.
pub type Compact = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync>;

/// Sizes of the measurements.
pub struct Sizes {
    pub fan_out: usize,
    pub step: usize,
    pub scale: usize,
    /// Measure scale-out (etcd only).
    pub scale_out: Option<ScaleOut>,
}

/// How the scale-out measurement runs its reconcilers.
pub enum ScaleOut {
    /// Each its own `Reconciler` and store client in this process.
    InProcess,
    /// Each a real `kayra reconciler` process (this binary) on this etcd.
    Processes { binary: std::path::PathBuf, endpoint: String, prefix: String },
}

pub async fn run(backend: &str, connect: Connect, compact: Option<Compact>, sizes: &Sizes) -> anyhow::Result<()> {
    let store = connect().await?;
    let probe = connect().await?;
    let http = TestBackend::start().await;
    let row = |what: &str, value: String, ratio: String| println!("| {backend} | {what} | {value} | {ratio} |");

    let raw_puts = |round: &'static str| raw_puts(&store, sizes.fan_out, round);
    let raw_before = raw_puts("before").await?;
    let raw_cas = raw_cas(&store, sizes.fan_out).await?;

    // Run recording's cost: bumps of a deployment recording runs and of one
    // recording none, alternating (20, 0, 0, 20, 20, 0, …) so that drift of
    // the machine or the store's size weighs on both alike. First while the
    // history of 20 runs per subscription fills (a record growing from one
    // run), then with it full (each run displaces the oldest: a
    // subscription's every sync after its twentieth).
    let mut deployments = Vec::new();
    for history in HISTORIES {
        deployments.push(Deployment::seed(&probe, &format!("fan{history}"), "placeholder", sizes.fan_out).await?);
    }
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut trips = [0.0; 2];
    alternate_bumps(&store, compact.as_ref(), &deployments, 0..FAN_OUT_BUMPS, &mut rates, &mut trips).await?;
    // Fill every history: each run from now on displaces the oldest.
    deployments[0].fill_runs(HISTORIES[0]).await?;
    let mut full: [Vec<f64>; 2] = Default::default();
    alternate_bumps(&store, compact.as_ref(), &deployments, FAN_OUT_BUMPS..2 * FAN_OUT_BUMPS, &mut full, &mut trips)
        .await?;
    let trips = trips.map(|t| t / sizes.fan_out as f64 / (2 * FAN_OUT_BUMPS) as f64);
    // The store grew by eight fan-outs' writes: its raw puts again, and the
    // fan-outs' baseline is the mean of before and after.
    let raw_after = raw_puts("after").await?;
    let raw_put = (raw_before + raw_after) / 2.0;
    row(
        "raw single-key put, 32 in flight (before and after the fan-outs)",
        format!("{raw_put:.0}/s ({raw_before:.0}, {raw_after:.0})"),
        "1.00".into(),
    );
    row("raw read + CAS update, 30 in flight", format!("{raw_cas:.0}/s"), format!("{:.2} of puts", raw_cas / raw_put));
    for (i, history) in HISTORIES.into_iter().enumerate() {
        let fan = overall(&rates[i]);
        let (low, high) = rates[i].iter().fold((f64::MAX, 0.0_f64), |(l, h), r| (l.min(*r), h.max(*r)));
        let what = format!(
            "fan-out, placeholder, {} subscribers, pool 30, run_history {history} ({FAN_OUT_BUMPS} bumps: {low:.0}–{high:.0}/s)",
            sizes.fan_out
        );
        row(&what, format!("{fan:.0}/s"), format!("{:.2} of puts, {:.2} of CAS", fan / raw_put, fan / raw_cas));
        row(&format!("store round trips per reconcile, run_history {history}"), format!("{:.2}", trips[i]), "-".into());
    }
    for (what, rates) in [("while the history fills", &rates), ("with the history full", &full)] {
        let each: Vec<String> = rates[0]
            .iter()
            .zip(&rates[1])
            .map(|(with, without)| format!("{:+.0}", (without / with - 1.0) * 100.0))
            .collect();
        row(
            &format!("run recording cost (run_history 20 vs 0), {what}"),
            format!("{:+.1} %", (overall(&rates[1]) / overall(&rates[0]) - 1.0) * 100.0),
            format!("bump by bump: {} %", each.join(", ")),
        );
    }

    // Uncompacted, the fan-outs' history of millions of revisions slows
    // etcd's writes by half. A production etcd compacts
    // (`--auto-compaction-retention`): so does this one before each
    // measurement (each bump above, each below).
    if let Some(compact) = &compact {
        compact().await?;
        let raw = raw_puts("compacted").await?;
        row("raw single-key put, 32 in flight, after compacting the history", format!("{raw:.0}/s"), "-".into());
    }

    // Notifications' cost (§14): the same fan-out with a sink told of
    // `subscription.failed` and `fanout.completed` (none fails: one event a
    // bump) against one without, bumps alternating as above.
    let told = notification_cost(&store, &probe, compact.as_ref(), &http, sizes.fan_out).await?;
    row(
        &format!(
            "fan-out, placeholder, {} subscribers, without / with a sink (subscription.failed, fanout.completed)",
            sizes.fan_out
        ),
        format!("{:.0}/s / {:.0}/s", told[0], told[1]),
        format!("{:+.1} %", (told[1] / told[0] - 1.0) * 100.0),
    );

    // Staged rollouts' cost (§12): the same fan-out through three waves.
    compacted(compact.as_ref()).await?;
    let cost = rollout_cost(&store, &probe, compact.as_ref(), sizes.fan_out).await?;
    print_rollout(backend, sizes.fan_out, &cost);

    let (alone, with_run) = second_record_cost(&store, sizes.fan_out).await?;
    row(
        &format!(
            "floor: the raw store's cost of a run-sized second record in each of {} grouped subscription-sized writes, 30 in flight",
            sizes.fan_out
        ),
        format!("{:+.1} %", (alone / with_run - 1.0) * 100.0),
        format!("{alone:.0}/s alone, {with_run:.0}/s with it"),
    );

    // The floor of the 20 ms step's slot, without kayra: 30 tasks, each
    // taking jobs one after another, a job one POST to the same backend
    // through the reconciler's HTTP client and then (as any reconcile whose
    // result is written inside its pool slot) one raw single-key put, by
    // group commit as the reconciler's results are.
    for write in [false, true] {
        let took = step_floor(&store, &http, sizes.step, write).await?;
        let ideal = sizes.step as f64 * 0.020 / 30.0;
        let then = if write { "each then one raw put" } else { "no store" };
        let what =
            format!("floor: {} calls of the 20 ms backend from 30 tasks, {then} (ideal {ideal:.2} s)", sizes.step);
        row(&what, format!("{took:.2} s"), format!("{:.2}x ideal", took / ideal));
    }

    // One 20 ms step per reconcile: a reconciler in this process, and (with
    // `--reconciler-processes`, etcd) a real `kayra reconciler` process,
    // as deployed: its runtime shares nothing with this process's backend.
    let mut kinds = vec![None];
    if let Some(ScaleOut::Processes { .. }) = &sizes.scale_out {
        kinds.push(sizes.scale_out.as_ref());
    }
    for how in kinds {
        compacted(compact.as_ref()).await?;
        let region = if how.is_some() { "step20p" } else { "step20" };
        let deployment = Deployment::seed(&probe, region, "step", sizes.step).await?;
        let (running, process) = match how {
            Some(ScaleOut::Processes { binary, endpoint, prefix }) => {
                (Vec::new(), Some(Process::start(binary, endpoint, prefix, region, &http, 0, 20)?))
            }
            _ => {
                let mut config = ReconcilerConfig { max_concurrent_reconciles: 30, ..Default::default() };
                one_step(&mut config, &http, 20, region);
                (vec![start(&store, region, config)?], None)
            }
        };
        deployment.wait_synced("s1").await?;
        let bumped = Instant::now();
        let took = deployment.bump_and_wait("s2").await?;
        stop(running).await?;
        drop(process);
        let ideal = sizes.step as f64 * 0.020 / 30.0;
        let kind = if how.is_some() { "a reconciler process" } else { "in-process" };
        let what = format!("one 20 ms step, {} subscribers, pool 30, {kind} (ideal {ideal:.2} s)", sizes.step);
        row(&what, format!("{:.2} s", took.as_secs_f64()), format!("{:.2}x ideal", took.as_secs_f64() / ideal));
        let arrivals = http.arrivals(&format!("/sleep/20/{region}/s2/"));
        if let (Some(first), Some(last)) = (arrivals.first(), arrivals.last()) {
            let steady = arrivals.len().saturating_sub(1) as f64 / last.duration_since(*first).as_secs_f64();
            row(
                "  its phases: bump to first step call, steady per-slot job time, last call to converged",
                format!(
                    "{:.0} ms, {:.2} ms, {:.0} ms",
                    first.duration_since(bumped).as_secs_f64() * 1e3,
                    30.0 / steady * 1e3,
                    (bumped + took).duration_since(*last).as_secs_f64() * 1e3
                ),
                "-".into(),
            );
        }
    }

    if let Some(how) = &sizes.scale_out {
        let kind = match how {
            ScaleOut::InProcess => "in-process",
            ScaleOut::Processes { .. } => "processes",
        };
        for replicas in 1..=3 {
            compacted(compact.as_ref()).await?;
            let region = format!("scale{replicas}");
            let mut config = ReconcilerConfig { max_concurrent_reconciles: 30, ..Default::default() };
            one_step(&mut config, &http, 100, &region);
            let deployment = Deployment::seed(&probe, &region, "step", sizes.scale).await?;
            let mut running = Vec::new();
            let mut processes = Vec::new();
            for i in 0..replicas {
                match how {
                    ScaleOut::InProcess => running.push(start(&connect().await?, &region, config.clone())?),
                    ScaleOut::Processes { binary, endpoint, prefix } => {
                        processes.push(Process::start(binary, endpoint, prefix, &region, &http, i, 100)?);
                    }
                }
            }
            deployment.wait_synced("s1").await?;
            let took = deployment.bump_and_wait("s2").await?;
            stop(running).await?;
            drop(processes);
            let calls = calls_per_subscriber(&http, &region, "s2");
            let once = calls.len() == sizes.scale && calls.values().all(|n| *n == 1);
            let ideal = sizes.scale as f64 * 0.100 / (30.0 * replicas as f64);
            let what = format!(
                "scale-out, {replicas} reconciler(s) ({kind}), 100 ms step, {} subscribers, pool 30 (ideal {ideal:.2} s)",
                sizes.scale
            );
            let ratio = format!("{:.2}x ideal, each step once: {once}", took.as_secs_f64() / ideal);
            row(&what, format!("{:.2} s", took.as_secs_f64()), ratio);
        }
    }
    Ok(())
}

/// A real `kayra reconciler` process of deployment (`bench`, `region`),
/// mode `step` as [`one_step`] with `ms`; killed on drop.
struct Process {
    child: std::process::Child,
    _config: tempfile::NamedTempFile,
}

impl Process {
    fn start(
        binary: &std::path::Path,
        endpoint: &str,
        prefix: &str,
        region: &str,
        http: &TestBackend,
        index: usize,
        ms: u64,
    ) -> anyhow::Result<Self> {
        let endpoint_template = format!(
            "{}/sleep/{ms}/{region}/{{{{ .Subscription.ExpectedSyncID }}}}/{{{{ .Subscription.Namespace }}}}",
            http.base
        );
        let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let yaml = format!(
            "platform: {PLATFORM}\nregion: {region}\ndatabase:\n  etcd:\n    endpoints: [\"{endpoint}\"]\n    prefix: {prefix}\n\
             reconciler:\n  listen: {listen}\n  max_concurrent_reconciles: 30\n  mode:\n    step:\n\
             \x20     - method: post\n        endpoint: \"{endpoint_template}\"\n        timeout: 30s\n"
        );
        let mut config =
            tempfile::Builder::new().prefix(&format!("reconciler-{region}-{index}-")).suffix(".yaml").tempfile()?;
        std::io::Write::write_all(&mut config, yaml.as_bytes())?;
        let child = std::process::Command::new(binary)
            .args(["reconciler", "--config"])
            .arg(config.path())
            .env("KAYRA_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        Ok(Self { child, _config: config })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Mode `step`: one POST to the backend sleeping `ms`, the path naming
/// the deployment, SyncID and subscriber.
fn one_step(config: &mut ReconcilerConfig, http: &TestBackend, ms: u64, region: &str) {
    let endpoint = format!(
        "{}/sleep/{ms}/{region}/{{{{ .Subscription.ExpectedSyncID }}}}/{{{{ .Subscription.Namespace }}}}",
        http.base
    );
    let yaml = format!("- method: post\n  endpoint: \"{endpoint}\"\n  timeout: 30s\n");
    config.mode.insert("step".into(), serde_norway::from_str(&yaml).expect("a valid step"));
}

fn calls_per_subscriber(http: &TestBackend, region: &str, sync_id: &str) -> HashMap<String, usize> {
    let mut calls = HashMap::new();
    for path in http.calls() {
        let parts: Vec<&str> = path.split('/').collect();
        if let [_, "sleep", _, r, s, ns] = parts.as_slice()
            && *r == region
            && *s == sync_id
        {
            *calls.entry((*ns).to_string()).or_default() += 1;
        }
    }
    calls
}

fn start(store: &Store, region: &str, config: ReconcilerConfig) -> anyhow::Result<(CancellationToken, Running)> {
    start_told(store, region, config, None)
}

/// [`start`], telling `sinks` when given.
fn start_told(
    store: &Store,
    region: &str,
    config: ReconcilerConfig,
    sinks: Option<&NotificationsConfig>,
) -> anyhow::Result<(CancellationToken, Running)> {
    let repo = Repository::new(store.clone(), PLATFORM, region);
    let cancel = CancellationToken::new();
    let mut reconciler = Reconciler::new(repo, config, cancel.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(sinks) = sinks {
        reconciler = reconciler.with_notifications(sinks).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok((cancel, tokio::spawn(reconciler.run())))
}

type Running = tokio::task::JoinHandle<Result<(), kayra_catalog::repo::Error>>;

async fn stop(running: Vec<(CancellationToken, Running)>) -> anyhow::Result<()> {
    for (cancel, _) in &running {
        cancel.cancel();
    }
    for (_, handle) in running {
        handle.await??;
    }
    Ok(())
}

/// Waits until `store`'s round-trip count stops moving (the reconciler has
/// seen its own writes' echoes and is idle).
async fn settle(store: &Store) {
    let mut last = store.round_trips();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = store.round_trips();
        if now == last {
            return;
        }
        last = now;
    }
}

/// One deployment's registration and subscribers, written through `probe`.
struct Deployment {
    repo: Repository,
    region: String,
    n: usize,
}

impl Deployment {
    async fn seed(probe: &Store, region: &str, mode: &str, n: usize) -> anyhow::Result<Self> {
        Self::seed_with(probe, region, mode, n, None).await
    }

    /// [`Deployment::seed`], its registration with `rollout` as its policy.
    async fn seed_with(
        probe: &Store,
        region: &str,
        mode: &str,
        n: usize,
        rollout: Option<RolloutPolicy>,
    ) -> anyhow::Result<Self> {
        let repo = Repository::new(probe.clone(), PLATFORM, region);
        let reg = ApiRegistration {
            name: API.into(),
            mode: mode.into(),
            sync_id: "s1".into(),
            platform: PLATFORM.into(),
            region: region.into(),
            rollout,
            ..Default::default()
        };
        repo.create(RecordRef::Registration(API), &reg, "registration").await?;
        let created: Vec<kayra_catalog::repo::Result<_>> = futures::stream::iter(0..n)
            .map(|i| {
                let repo = repo.clone();
                async move {
                    let sub = Subscription::new(format!("t{i}"), API);
                    repo.create(RecordRef::Subscription { namespace: &sub.namespace, api: API }, &sub, "subscription")
                        .await
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        for c in created {
            c?;
        }
        Ok(Self { repo, region: region.into(), n })
    }

    /// Gives every subscriber a full history: `kept` placeholder runs, so
    /// that each new run displaces the oldest.
    async fn fill_runs(&self, kept: usize) -> anyhow::Result<()> {
        let filled: Vec<anyhow::Result<()>> = futures::stream::iter(0..self.n)
            .map(|i| async move {
                let namespace = format!("t{i}");
                let runs: Vec<kayra_core::Run> = (0..kept)
                    .map(|slot| placeholder_run(format!("filled-{i}-{slot}"), &namespace, &format!("filled{slot}")))
                    .collect();
                let ring = RunRing::of(&runs, kept);
                let rider = Rider::Runs { namespace: &namespace, api: API, ring: &ring, first: false };
                let txn = self.repo.rider_puts(&[rider]).into_iter().fold(Txn::new(), Txn::then);
                self.repo.store().txn(txn).await?;
                Ok(())
            })
            .buffer_unordered(32)
            .collect()
            .await;
        filled.into_iter().collect()
    }

    /// Moves the registration's SyncID to `sync_id`.
    async fn bump(&self, sync_id: &str) -> anyhow::Result<kayra_catalog::repo::Versioned<ApiRegistration>> {
        let written = self
            .repo
            .modify::<ApiRegistration, _>(RecordRef::Registration(API), "registration", |r| {
                r.sync_id = sync_id.into();
                Change::Write
            })
            .await?;
        Ok(written)
    }

    async fn bump_and_wait(&self, sync_id: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let written = self.bump(sync_id).await?;
        self.follow_until_synced(sync_id, written.revision, None).await?;
        Ok(started.elapsed())
    }

    /// [`Deployment::bump_and_wait`] of a deployment with a rollout
    /// policy: until every subscriber is synced to `sync_id` and the
    /// rollout record of `sync_id` says `completed`. Also returns when each
    /// subscriber (by store key) last became synced and each version of the
    /// rollout record the probe saw, all from the bump.
    async fn bump_staged_and_wait(&self, sync_id: &str) -> anyhow::Result<StagedBump> {
        let key = self.repo.store_key_of(RecordRef::Rollout(API));
        let (listed, listed_rx) = tokio::sync::oneshot::channel();
        let records = tokio::spawn(follow_rollout(self.repo.store().clone(), key, sync_id.to_string(), listed));
        // The record's watch is listed before the bump: it sees every move.
        listed_rx.await.map_err(|_| anyhow::anyhow!("{}: the rollout's watch ended before it listed", self.region))?;
        let started = Instant::now();
        let written = self.bump(sync_id).await?;
        let mut synced_at = HashMap::new();
        self.follow_until_synced(sync_id, written.revision, Some(&mut synced_at)).await?;
        let records = records.await??;
        let took = started.elapsed();
        let since = |at: Instant| at.saturating_duration_since(started);
        Ok(StagedBump {
            took,
            synced_at: synced_at.into_iter().map(|(k, at)| (k, since(at))).collect(),
            records: records.into_iter().map(|(at, r)| (since(at), r)).collect(),
        })
    }

    /// Waits until every subscriber is synced to `sync_id` by following the
    /// store's watcher (a list at `from` or later, then its changes; a
    /// re-list after a compaction replaces the set). The probe costs one
    /// decode per change, so it takes no CPU from the reconciler being
    /// measured (re-listing 10,000 records every few milliseconds would
    /// take most of a core of this two-core machine).
    /// With `synced_at`, also records when each subscriber (by store key)
    /// last became synced.
    async fn follow_until_synced(
        &self,
        sync_id: &str,
        from: kayra_store::Revision,
        mut synced_at: Option<&mut HashMap<String, Instant>>,
    ) -> anyhow::Result<()> {
        use kayra_store::WatcherEvent;
        let prefix = self.repo.layout().prefix(Collection::Subscriptions);
        let synced_value =
            |value: &[u8]| serde_json::from_slice::<Subscription>(value).is_ok_and(|s| s.is_synced(sync_id));
        let mut events = self.repo.store().watcher(&prefix);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        // The set being listed (between `Init` and `InitDone`), and the one followed.
        let mut listing: Option<std::collections::HashSet<String>> = None;
        let mut synced: Option<std::collections::HashSet<String>> = None;
        while listing.is_some() || synced.as_ref().is_none_or(|synced| synced.len() < self.n) {
            let event = tokio::time::timeout_at(deadline, events.next())
                .await
                .map_err(|_| anyhow::anyhow!("{}: fan-out to {sync_id} did not converge", self.region))?
                .ok_or_else(|| anyhow::anyhow!("{}: the probe's watch ended", self.region))?;
            match event {
                WatcherEvent::Init => listing = Some(Default::default()),
                WatcherEvent::InitApply(kv) => {
                    if let Some(listing) = listing.as_mut().filter(|_| synced_value(&kv.value)) {
                        listing.insert(kv.key);
                    }
                }
                WatcherEvent::InitDone { revision } => {
                    anyhow::ensure!(revision >= from, "{}: the list is older than the bump", self.region);
                    synced = listing.take();
                }
                WatcherEvent::Apply(kv) => {
                    if let Some(synced) = synced.as_mut() {
                        if synced_value(&kv.value) {
                            if let Some(at) = synced_at.as_deref_mut()
                                && !synced.contains(&kv.key)
                            {
                                at.insert(kv.key.clone(), Instant::now());
                            }
                            synced.insert(kv.key);
                        } else {
                            synced.remove(&kv.key);
                        }
                    }
                }
                WatcherEvent::Delete { key, .. } => {
                    if let Some(synced) = synced.as_mut() {
                        synced.remove(&key);
                    }
                }
                WatcherEvent::Progress { .. } => {}
            }
        }
        Ok(())
    }

    async fn wait_synced(&self, sync_id: &str) -> anyhow::Result<()> {
        let from = self.repo.store().revision().await?;
        self.follow_until_synced(sync_id, from, None).await
    }
}

/// One bump of a staged deployment ([`Deployment::bump_staged_and_wait`]),
/// every time since the bump.
struct StagedBump {
    /// Until every subscriber was synced and the rollout completed.
    took: Duration,
    /// When each subscriber (by store key) last became synced.
    synced_at: HashMap<String, Duration>,
    /// Each version of the rollout record the probe saw, and when.
    records: Vec<(Duration, RolloutRecord)>,
}

/// Where a staged bump's time went, from what the probe saw.
#[derive(Default, Clone, Copy)]
struct StagedPhases {
    /// From the bump until the record showed the first wave started.
    first_wave: Duration,
    /// The waves' own fan-outs: from a wave's start (as the probe saw the
    /// record) until its last subscriber synced, summed.
    waves: Duration,
    /// From a wave's last subscriber synced until the record showed the
    /// next wave started (or the rollout completed), summed.
    driver: Duration,
}

impl StagedBump {
    /// The phases, `key_of` naming a namespace's subscription's store key.
    fn phases(&self, key_of: impl Fn(&str) -> String) -> anyhow::Result<StagedPhases> {
        let (_, last) = self.records.last().ok_or_else(|| anyhow::anyhow!("no rollout record seen"))?;
        let waves = last.records.len();
        // When the probe first saw each wave started, and the rollout completed.
        let seen =
            |started: &dyn Fn(&RolloutRecord) -> bool| self.records.iter().find(|(_, r)| started(r)).map(|(at, _)| *at);
        let mut phases = StagedPhases::default();
        let mut wave_start = Vec::new();
        for wave in 0..waves {
            let at = seen(&|r: &RolloutRecord| r.started(wave) || r.rollout.wave > wave)
                .ok_or_else(|| anyhow::anyhow!("wave {wave} never seen started"))?;
            wave_start.push(at);
        }
        let completed = seen(&|r: &RolloutRecord| r.rollout.state == RolloutState::Completed)
            .ok_or_else(|| anyhow::anyhow!("the rollout never seen completed"))?;
        phases.first_wave = wave_start[0];
        for (wave, record) in last.records.iter().enumerate() {
            let last_synced = record
                .namespaces
                .iter()
                .filter_map(|ns| self.synced_at.get(&key_of(ns)).copied())
                .max()
                .unwrap_or(wave_start[wave]);
            let next = wave_start.get(wave + 1).copied().unwrap_or(completed);
            phases.waves += last_synced.saturating_sub(wave_start[wave]);
            phases.driver += next.saturating_sub(last_synced);
        }
        Ok(phases)
    }
}

/// Follows the rollout record at `key` until it is `sync_id`'s and
/// `completed`, sending `listed` once its watch has listed: each version
/// seen, and when. A rollout that pauses, aborts or is superseded fails.
async fn follow_rollout(
    store: Store,
    key: String,
    sync_id: String,
    listed: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<Vec<(Instant, RolloutRecord)>> {
    use kayra_store::WatcherEvent;
    let mut events = store.watcher(&key);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let mut listed = Some(listed);
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .map_err(|_| anyhow::anyhow!("the rollout to {sync_id} did not complete"))?
            .ok_or_else(|| anyhow::anyhow!("the probe's watch of the rollout ended"))?;
        let kv = match event {
            WatcherEvent::InitDone { .. } => {
                if let Some(listed) = listed.take() {
                    let _ = listed.send(());
                }
                continue;
            }
            WatcherEvent::InitApply(kv) | WatcherEvent::Apply(kv) if kv.key == key => kv,
            _ => continue,
        };
        let record: RolloutRecord = serde_json::from_slice(&kv.value)?;
        if record.rollout.sync_id != sync_id {
            continue;
        }
        let state = record.rollout.state;
        seen.push((Instant::now(), record));
        match state {
            RolloutState::Completed => return Ok(seen),
            RolloutState::Paused | RolloutState::Aborted | RolloutState::Superseded => {
                anyhow::bail!("the rollout to {sync_id} ended {} instead of completing", state.as_str())
            }
            _ => {}
        }
    }
}

/// The staged deployment's policy: three waves (10 %, 30 %, the rest),
/// no bake, no gate, approval `auto`.
fn three_waves() -> RolloutPolicy {
    let wave = |name: &str, size: &str| WavePolicy {
        name: name.into(),
        size: size.into(),
        approval: Approval::Auto,
        ..Default::default()
    };
    RolloutPolicy { waves: vec![wave("canary", "10%"), wave("early", "30%"), wave("rest", "")], ..Default::default() }
}

/// The staged rollout's figures ([`rollout_cost`]).
pub struct RolloutCost {
    /// Mean seconds of a bump: without a policy, staged, by hand.
    pub plain: f64,
    pub staged: f64,
    pub by_hand: f64,
    /// Each staged bump's seconds.
    pub staged_each: Vec<f64>,
    /// The wave sizes.
    pub sizes: Vec<usize>,
    /// Mean seconds of the staged bumps' phases: until the first wave
    /// started, the waves' own fan-outs, the driver's moves after them.
    pub first_wave: f64,
    pub waves: f64,
    pub driver: f64,
}

/// Fan-out times of `n` placeholder subscribers after a bump: a
/// deployment without a rollout policy, one with [`three_waves`] (until
/// its rollout record completes), and, as the floor of the staged one,
/// the same waves by hand: three deployments of the waves' sizes, each
/// bumped once the one before converged (the operator's way without a
/// policy; no driver). Rounds alternate which goes first.
pub async fn rollout_cost(
    store: &Store,
    probe: &Store,
    compact: Option<&Compact>,
    n: usize,
) -> anyhow::Result<RolloutCost> {
    anyhow::ensure!(n > 0, "a rollout needs subscribers: --subscribers must be at least 1");
    let policy = three_waves();
    policy.validate().map_err(|e| anyhow::anyhow!("the staged deployment's policy: {e}"))?;
    let everyone: Vec<(String, std::collections::BTreeMap<String, String>)> =
        (0..n).map(|i| (format!("t{i}"), Default::default())).collect();
    let sizes: Vec<usize> = kayra_core::rollout::assign(&policy, &everyone).iter().map(Vec::len).collect();
    let plain = Deployment::seed(probe, "unstaged", "placeholder", n).await?;
    let staged = Deployment::seed_with(probe, "staged", "placeholder", n, Some(policy)).await?;
    let mut by_hand = Vec::new();
    for (wave, size) in sizes.iter().enumerate() {
        by_hand.push(Deployment::seed(probe, &format!("byhand{wave}"), "placeholder", *size).await?);
    }
    let config = || ReconcilerConfig { max_concurrent_reconciles: 30, ..Default::default() };
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut phases = Vec::new();
    for round in 0..FAN_OUT_BUMPS {
        let (from, to) = (format!("s{}", round + 1), format!("s{}", round + 2));
        let order = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for which in order {
            let deployments: Vec<&Deployment> = match which {
                0 => vec![&plain],
                1 => vec![&staged],
                _ => by_hand.iter().collect(),
            };
            let mut running = Vec::new();
            for d in &deployments {
                running.push(start(store, &d.region, config())?);
            }
            for d in &deployments {
                d.wait_synced(&from).await?;
            }
            settle(store).await;
            compacted(compact).await?;
            // The reconciler's driver ticks from its start, and `settle`
            // returns on a multiple of its own 200 ms after it: a bump
            // right then would find the tick just past every time. Bumps
            // at evenly spread phases of the tick, as bumps at random
            // times are.
            let tick = kayra_reconciler::rollout::TICK;
            tokio::time::sleep(tick * (2 * round as u32 + 1) / (2 * FAN_OUT_BUMPS as u32)).await;
            let took = match which {
                0 => plain.bump_and_wait(&to).await?,
                1 => {
                    let bump = staged.bump_staged_and_wait(&to).await?;
                    let key_of =
                        |ns: &str| staged.repo.store_key_of(RecordRef::Subscription { namespace: ns, api: API });
                    phases.push(bump.phases(key_of)?);
                    bump.took
                }
                _ => {
                    let started = Instant::now();
                    for d in &by_hand {
                        d.bump_and_wait(&to).await?;
                    }
                    started.elapsed()
                }
            };
            stop(running).await?;
            times[which].push(took.as_secs_f64());
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let phase = |f: fn(&StagedPhases) -> Duration| mean(&phases.iter().map(|p| f(p).as_secs_f64()).collect::<Vec<_>>());
    Ok(RolloutCost {
        plain: mean(&times[0]),
        staged: mean(&times[1]),
        by_hand: mean(&times[2]),
        staged_each: times[1].clone(),
        sizes,
        first_wave: phase(|p| p.first_wave),
        waves: phase(|p| p.waves),
        driver: phase(|p| p.driver),
    })
}

/// Prints the rows of [`rollout_cost`].
pub fn print_rollout(backend: &str, n: usize, cost: &RolloutCost) {
    let row = |what: &str, value: String, ratio: String| println!("| {backend} | {what} | {value} | {ratio} |");
    let sizes: Vec<String> = cost.sizes.iter().map(usize::to_string).collect();
    let each: Vec<String> = cost.staged_each.iter().map(|t| format!("{t:.2}")).collect();
    row(
        &format!("fan-out, placeholder, {n} subscribers, pool 30, no rollout policy ({FAN_OUT_BUMPS} bumps, mean)"),
        format!("{:.2} s ({:.0}/s)", cost.plain, n as f64 / cost.plain),
        "1.00".into(),
    );
    row(
        &format!(
            "the same, rollout of three waves ({}), no bake, until `completed` (bumps: {} s)",
            sizes.join(" / "),
            each.join(", ")
        ),
        format!("{:.2} s ({:.0}/s)", cost.staged, n as f64 / cost.staged),
        format!("{:.2}x time, {:.2}x rate (target ≤ 1.15x time)", cost.staged / cost.plain, cost.plain / cost.staged),
    );
    row(
        &format!(
            "floor: the same three waves by hand (deployments of {}, each bumped once the one before converged)",
            sizes.join(" / ")
        ),
        format!("{:.2} s", cost.by_hand),
        format!("{:.2}x time; the rollout {:.2}x of it", cost.by_hand / cost.plain, cost.staged / cost.by_hand),
    );
    row(
        &format!(
            "  the rollout's phases: bump to first wave started, the waves' fan-outs, the driver's {} moves after them (TICK {} ms)",
            cost.sizes.len(),
            kayra_reconciler::rollout::TICK.as_millis()
        ),
        format!("{:.0} ms, {:.0} ms, {:.0} ms", cost.first_wave * 1e3, cost.waves * 1e3, cost.driver * 1e3),
        "-".into(),
    );
}

/// Raw baseline: one read + CAS update of each of `n` records, 30 in flight
/// (the reconciler's default pool).
async fn raw_cas(store: &Store, n: usize) -> anyhow::Result<f64> {
    for i in 0..n {
        store.create(&format!("/bench/rawcas/{i:08}"), vec![b'x'; 256]).await?;
    }
    rate(n, 30, |i| {
        let store = store.clone();
        async move {
            let key = format!("/bench/rawcas/{i:08}");
            let (current, _) = store.get(&key).await?;
            let current = current.ok_or_else(|| kayra_store::Error::NotFound(key.clone()))?;
            store.update(&key, current.value, current.mod_revision).await.map(|_| ())
        }
    })
    .await
}

/// A placeholder run (no steps).
fn placeholder_run(id: String, namespace: &str, sync_id: &str) -> kayra_core::Run {
    kayra_core::Run {
        id,
        namespace: namespace.into(),
        api: API.into(),
        sync_id: sync_id.into(),
        mode: "placeholder".into(),
        started_at: "2026-01-01T00:00:00.000Z".into(),
        finished_at: "2026-01-01T00:00:00.001Z".into(),
        reconciler: "bench:1".into(),
        ..Default::default()
    }
}

/// The raw store's rates of `n` writes of a subscription-sized record (its
/// value as the reconciler writes it), 30 in flight by group commit as the
/// reconciler's results are, each transaction alone and each with a
/// first run's history record (a record of its own) added: what a second
/// record in the same transaction costs the store itself. Eight rounds,
/// alternating which goes first, as the fan-outs above.
async fn second_record_cost(store: &Store, n: usize) -> anyhow::Result<(f64, f64)> {
    let subscription = |i: usize| {
        let mut sub = Subscription::new(format!("t{i}"), API);
        (sub.active, sub.state) = (true, kayra_core::SubscriptionState::Success);
        sub.current_sync_id = "s1".into();
        serde_json::to_vec(&sub).unwrap_or_default()
    };
    // A first run's history record.
    let run = |i: usize, round: usize| {
        let run = placeholder_run(format!("0193a6c1-0000-7000-8000-{i:012}"), &format!("t{i}"), &format!("s{round}"));
        RunRing::of(&[run], 20).encode()
    };
    let mut rates = [Vec::new(), Vec::new()];
    for round in 0..2 * FAN_OUT_BUMPS {
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        for with_run in order {
            let rate = rate(n, 30, |i| {
                let store = store.clone();
                let key = format!("/bench/second/{with_run}/subscriptions/{i:08}");
                let mut txn = Txn::new().then(Op::Put { key, value: subscription(i) });
                if with_run {
                    let key = format!("/bench/second/{with_run}/runs/{i:08}/{round}");
                    txn = txn.then(Op::Put { key, value: run(i, round) });
                }
                async move { store.txn_grouped(txn).await.map(|_| ()) }
            })
            .await?;
            rates[usize::from(with_run)].push(rate);
        }
    }
    Ok((overall(&rates[0]), overall(&rates[1])))
}

/// Seconds for 30 tasks to make `n` calls of the backend's 20 ms sleep, one
/// after another within each task (a pool slot's loop), each call followed
/// by one raw single-key put when `write`, by group commit as the
/// reconciler's results are.
async fn step_floor(store: &Store, http: &TestBackend, n: usize, write: bool) -> anyhow::Result<f64> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..30)
        .map(|_| {
            let (client, store, next) = (kayra_pipeline::http_client(), store.clone(), next.clone());
            let base = http.base.clone();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        return anyhow::Ok(());
                    }
                    client.post(format!("{base}/sleep/20/floor/{write}/{i}")).send().await?.bytes().await?;
                    if write {
                        let key = format!("/bench/floor/{i:08}");
                        store.txn_grouped(Txn::new().then(Op::Put { key, value: vec![b'x'; 256] })).await?;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The rate over several runs of the same work: the harmonic mean of theirs.
fn overall(rates: &[f64]) -> f64 {
    rates.len() as f64 / rates.iter().map(|r| 1.0 / r).sum::<f64>()
}

/// Compacts the store's history where it has one ([`Compact`]).
async fn compacted(compact: Option<&Compact>) -> anyhow::Result<()> {
    match compact {
        Some(compact) => compact().await,
        None => Ok(()),
    }
}

/// Ops per second of `ops` calls of `op`, `inflight` at a time.
async fn rate<F, Fut>(ops: usize, inflight: usize, op: F) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<(), kayra_store::Error>>,
{
    let started = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..ops).map(op).buffer_unordered(inflight).collect().await;
    for r in results {
        r?;
    }
    Ok(ops as f64 / started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kayra_core::rollout::Counts;

    #[test]
    fn a_staged_bumps_time_splits_into_the_first_wave_the_waves_and_the_driver() {
        let ms = Duration::from_millis;
        let now = std::time::SystemTime::now();
        let assignment = vec![vec!["a".to_string()], vec!["b".to_string()], vec!["c".to_string(), "d".to_string()]];
        let (started, _) = RolloutRecord::start(API, "s2", &three_waves(), assignment, now);
        let done = |synced: [usize; 3], pending: [usize; 3]| {
            let mut next = started.clone();
            let counts: Vec<Counts> =
                (0..3).map(|i| Counts { synced: synced[i], failed: 0, pending: pending[i] }).collect();
            next.step(&counts, now);
            next
        };
        let second = done([1, 0, 0], [0, 1, 2]);
        let third = done([1, 1, 0], [0, 0, 2]);
        let completed = done([1, 1, 2], [0, 0, 0]);
        assert_eq!((second.rollout.wave, third.rollout.wave), (1, 2));
        assert_eq!(completed.rollout.state, RolloutState::Completed);
        let bump = StagedBump {
            took: ms(1000),
            synced_at: [("a", 250), ("b", 500), ("c", 800), ("d", 900)]
                .into_iter()
                .map(|(ns, at)| (format!("/{ns}"), ms(at)))
                .collect(),
            records: vec![(ms(100), started), (ms(300), second), (ms(600), third), (ms(1000), completed)],
        };
        let phases = bump.phases(|ns| format!("/{ns}")).expect("phases");
        assert_eq!(phases.first_wave, ms(100));
        assert_eq!(phases.waves, ms(150 + 200 + 300));
        assert_eq!(phases.driver, ms(50 + 100 + 100));
    }

    #[test]
    fn a_staged_bump_without_a_completed_record_is_an_error() {
        let bump = StagedBump { took: Duration::ZERO, synced_at: HashMap::new(), records: Vec::new() };
        assert!(bump.phases(|ns| ns.to_string()).is_err());
    }
}
