//! The reconciler's figures (issue 12, issue 14), each against the raw
//! store or the pool's ideal time measured in the same run:
//! - placeholder fan-out after a SyncID bump, pool 30, with `run_history`
//!   20 and 0 (four bumps each, alternating, while the ring of runs fills;
//!   then its other slots filled, four more with it full), against raw single-key puts
//!   at 32 in flight (the mean of a run before and one after the bumps,
//!   which grow the store) and raw read + CAS updates at 30, with the
//!   store round trips per reconcile, and the raw store's own cost of a
//!   run-sized second record in each grouped write (the floor of run
//!   recording's cost);
//! - the same fan-out with a notification sink told of
//!   `subscription.failed` and `fanout.completed`, against one without
//!   (notifications' cost, §14), bumps alternating;
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
use kayra_catalog::repo::{Change, Collection, RecordRef, Repository};
use kayra_config::{NotificationsConfig, ReconcilerConfig};
use kayra_core::{ApiRegistration, Subscription};
use kayra_reconciler::Reconciler;
use kayra_store::{Op, Store, Txn};
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

    let raw_puts = |round: &'static str| {
        let store = store.clone();
        rate(sizes.fan_out, 32, move |i| {
            let store = store.clone();
            async move {
                let key = format!("/bench/rawput/{round}/{i:08}");
                store.txn(Txn::new().then(Op::Put { key, value: vec![b'x'; 256] })).await.map(|_| ())
            }
        })
    };
    let raw_before = raw_puts("before").await?;
    let raw_cas = raw_cas(&store, sizes.fan_out).await?;

    // Run recording's cost: bumps of a deployment recording runs and of one
    // recording none, alternating (20, 0, 0, 20, 20, 0, …) so that drift of
    // the machine or the store's size weighs on both alike. First while the
    // ring of 20 runs per subscription fills (each run a new record), then
    // with it full (each run overwrites the oldest: a subscription's every
    // sync after its twentieth).
    let mut deployments = Vec::new();
    for history in HISTORIES {
        deployments.push(Deployment::seed(&probe, &format!("fan{history}"), "placeholder", sizes.fan_out).await?);
    }
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut trips = [0.0; 2];
    alternate_bumps(&store, compact.as_ref(), &deployments, 0..FAN_OUT_BUMPS, &mut rates, &mut trips).await?;
    // The initial sync and each bump recorded a run: fill the rest.
    deployments[0].fill_runs(FAN_OUT_BUMPS + 1, HISTORIES[0]).await?;
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
    for (what, rates) in [("while the ring fills", &rates), ("with the ring full", &full)] {
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
        let repo = Repository::new(probe.clone(), PLATFORM, region);
        let reg = ApiRegistration {
            name: API.into(),
            mode: mode.into(),
            sync_id: "s1".into(),
            platform: PLATFORM.into(),
            region: region.into(),
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

    /// Writes placeholder runs into ring slots `from..to` of every
    /// subscriber: with slots `0..from` recorded already, every slot then
    /// holds a run and each new run overwrites one.
    async fn fill_runs(&self, from: usize, to: usize) -> anyhow::Result<()> {
        let filled: Vec<anyhow::Result<()>> = futures::stream::iter(0..self.n)
            .map(|i| async move {
                let namespace = format!("t{i}");
                let txn = (from..to).fold(Txn::new(), |txn, slot| {
                    let value = placeholder_run(format!("filled-{i}-{slot}"), &namespace, &format!("filled{slot}"));
                    let record = RecordRef::Run { namespace: &namespace, api: API, slot: slot as u64 };
                    txn.then(Op::Put { key: self.repo.store_key_of(record), value })
                });
                self.repo.store().txn(txn).await?;
                Ok(())
            })
            .buffer_unordered(32)
            .collect()
            .await;
        filled.into_iter().collect()
    }

    async fn bump_and_wait(&self, sync_id: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let written = self
            .repo
            .modify::<ApiRegistration, _>(RecordRef::Registration(API), "registration", |r| {
                r.sync_id = sync_id.into();
                Change::Write
            })
            .await?;
        self.follow_until_synced(sync_id, written.revision).await?;
        Ok(started.elapsed())
    }

    /// Waits until every subscriber is synced to `sync_id` by following the
    /// store's watcher (a list at `from` or later, then its changes; a
    /// re-list after a compaction replaces the set). The probe costs one
    /// decode per change, so it takes no CPU from the reconciler being
    /// measured (re-listing 10,000 records every few milliseconds would
    /// take most of a core of this two-core machine).
    async fn follow_until_synced(&self, sync_id: &str, from: kayra_store::Revision) -> anyhow::Result<()> {
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
        self.follow_until_synced(sync_id, from).await
    }
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

/// A placeholder run's record (no steps) as the reconciler stores it.
fn placeholder_run(id: String, namespace: &str, sync_id: &str) -> Vec<u8> {
    let run = kayra_core::Run {
        id,
        namespace: namespace.into(),
        api: API.into(),
        sync_id: sync_id.into(),
        mode: "placeholder".into(),
        started_at: "2026-01-01T00:00:00.000Z".into(),
        finished_at: "2026-01-01T00:00:00.001Z".into(),
        reconciler: "bench:1".into(),
        ..Default::default()
    };
    // Serializing a plain struct cannot fail.
    serde_json::to_vec(&run).unwrap_or_default()
}

/// The raw store's rates of `n` writes of a subscription-sized record (its
/// value as the reconciler writes it), 30 in flight by group commit as the
/// reconciler's results are, each transaction alone and each with a
/// placeholder run's record (a ring slot of its own) added: what a second
/// record in the same transaction costs the store itself. Eight rounds,
/// alternating which goes first, as the fan-outs above.
async fn second_record_cost(store: &Store, n: usize) -> anyhow::Result<(f64, f64)> {
    let subscription = |i: usize| {
        let mut sub = Subscription::new(format!("t{i}"), API);
        (sub.active, sub.state) = (true, kayra_core::SubscriptionState::Success);
        sub.current_sync_id = "s1".into();
        sub.runs = 1;
        serde_json::to_vec(&sub).unwrap_or_default()
    };
    let run = |i: usize, round: usize| {
        placeholder_run(format!("0193a6c1-0000-7000-8000-{i:012}"), &format!("t{i}"), &format!("s{round}"))
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
