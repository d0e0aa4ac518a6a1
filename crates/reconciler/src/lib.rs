//! `Reconciler`: the controller behind `kayra reconciler` (seed,
//! "Reconciler"; `catalog.Reconciler` in the seed, `Reconciler.Run` is
//! [`Reconciler::run`]).
//!
//! It runs as its own process, built on `store.Store.Watch`. `run` is an
//! explicit state machine (kube-runtime's watcher): **listing** — list
//! namespaces, registrations, subscriptions and given-up attempts into a
//! fresh [`view::View`] that replaces the old one whole, then queue every
//! inactive namespace and every subscription with anything to do
//! (reconcileExisting) — then **watching** from the list's revision + 1,
//! so nothing written in between is missed; if a watch stream ever ends,
//! back to listing.
//!
//! Watch events update the view and queue jobs on the [`queue::WorkQueue`]:
//! - namespace put, `active: false` → activation (initial action);
//! - subscription put with anything to do → `ensureReconciled` (initial action);
//! - registration put → the ongoing action's fan-out to every *active*
//!   subscriber whose CurrentSyncID differs, found in the view.
//!
//! A dispatcher takes the queue's next key and runs its job in its own
//! task: the job asks the view, takes its job lock ([`locks::JobLocks`];
//! on etcd with its fresh reads), and only then a pool slot
//! ([`pool::Pool`]; its number is the `lock_id`), so a slot is spent on
//! the pipeline and the result's write, not on lock round trips. At most
//! half a pool of jobs wait, locked, for a slot. A job that panics is
//! logged once and its key is queued again; its slot and lock come back
//! by RAII.
//!
//! # Layout
//! - [`decide`]: `ensureReconciled`'s decision, pure.
//! - [`ensure`]: the jobs, the I/O around the decision.
//! - `events`: watch events by resource: decode → view → queue policy.
//! - [`queue`]: the work queue (coalescing, fair order).
//! - [`pool`]: the numbered slots.
//! - [`locks`]: cross-process job locks.
//! - [`runs`]: the run records (§4.4).
//! - [`view`]: the watch-fed view of this deployment.
//! - [`notify`]: notifications (§14): the sinks, the deliveries an event
//!   makes, the notifier that sends them.
//! - [`fanout`]: `fanout.completed`, from the view, once per (api, SyncID).
//! - [`cancels`]: stopping a run in flight: cancel requests, run deadlines (§12).

pub mod cancels;
pub mod decide;
pub mod ensure;
mod events;
pub mod fanout;
pub mod locks;
pub mod notify;
pub mod pool;
pub mod queue;
pub mod rollout;
pub mod runs;
pub mod view;

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kayra_catalog::repo::Repository;
use kayra_config::ReconcilerConfig;
use kayra_core::RunTrigger;
use kayra_pipeline::{Pipelines, ValidationError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ensure::{FaultHook, JobEnd, Prepared, SyncNote, Worker};
use events::Resource;
use locks::JobLocks;
use pool::Pool;
use queue::{Cause, Class, JobKey, WorkQueue};
use view::View;

pub const METRIC_RECONCILES: &str = "kayra_reconciles_total";
pub const METRIC_DURATION: &str = "kayra_reconcile_duration_seconds";
pub const METRIC_IN_FLIGHT: &str = "kayra_reconciles_in_flight";
pub const METRIC_SLOTS_IN_USE: &str = "kayra_reconciler_pool_slots_in_use";
pub const METRIC_LOCK_WAIT: &str = "kayra_reconciler_lock_wait_seconds";
pub const METRIC_WATCH_EVENTS: &str = "kayra_reconciler_watch_events_total";
pub const METRIC_QUEUE_DEPTH: &str = "kayra_work_queue_depth";
pub const METRIC_PANICS: &str = "kayra_reconciler_job_panics_total";
pub const METRIC_BEHIND: &str = "kayra_subscriptions_behind";
pub const METRIC_SYNC_LAG: &str = "kayra_sync_lag_seconds";

/// How often view-derived gauges (`kayra_subscriptions_behind`) are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a key whose job panicked waits before it is queued again (a
/// job that panics every time must not spin).
const PANIC_BACKOFF: Duration = Duration::from_secs(1);

/// The controller. Build with [`Reconciler::new`], drive with [`Reconciler::run`].
pub struct Reconciler {
    worker: Arc<Worker>,
    pool: Pool,
    queue: Arc<WorkQueue>,
    tracker: TaskTracker,
    ready: Arc<AtomicBool>,
    /// The resources listed at least once since the start.
    listed: HashSet<Resource>,
    /// The notifier's first pause after a failed attempt ([`notify::RETRY_BASE`]).
    notify_retry_base: Duration,
}

impl Reconciler {
    /// Compiles every mode's pipeline (the startup validation) and prepares
    /// the pool, the queue and the locks. `cancel` is the shutdown signal.
    pub fn new(repo: Repository, config: ReconcilerConfig, cancel: CancellationToken) -> Result<Self, ValidationError> {
        describe_metrics();
        let pipelines = Pipelines::compile(&config)?;
        let locks = JobLocks::new(repo.store().job_locker(), repo.platform(), repo.region());
        let pool = Pool::new(config.max_concurrent_reconciles);
        let limits = kayra_pipeline::Limits::new(&config, repo.store().clone(), repo.layout().clone());
        // This process's own order within an API (see `queue`), where other
        // processes share the work; key order where this one does it all.
        let queue = match locks.shared() {
            true => WorkQueue::new(rand_seed()),
            false => WorkQueue::in_key_order(),
        };
        let worker = Worker {
            repo,
            config,
            pipelines,
            client: kayra_pipeline::http_client(),
            locks,
            cancel,
            view: Arc::default(),
            fault: None,
            limits,
            running: Default::default(),
            owed_retries: Default::default(),
            sinks: Arc::default(),
            rollout_wake: Arc::default(),
            cancels: Arc::default(),
            fanout_markers: None,
            startup_listed_at: std::sync::atomic::AtomicI64::new(0),
        };
        Ok(Self {
            worker: Arc::new(worker),
            pool,
            queue: Arc::new(queue),
            tracker: TaskTracker::new(),
            ready: Arc::default(),
            listed: HashSet::new(),
            notify_retry_base: notify::RETRY_BASE,
        })
    }

    /// Delivers events to `notifications`' sinks (§14): checks them as the
    /// reconciler's startup does (an unknown secret stops it, naming the
    /// key). Call before `run`.
    pub fn with_notifications(
        mut self,
        notifications: &kayra_config::NotificationsConfig,
    ) -> Result<Self, kayra_config::Error> {
        let sinks = notify::Sinks::compile(notifications, &self.worker.config)?;
        notify::Notifier::describe_metrics(&sinks);
        if let Some(worker) = Arc::get_mut(&mut self.worker) {
            // A result that finishes a fan-out carries its event: the view
            // keeps which subscribers are still open, and the markers say
            // which SyncIDs completed already.
            if sinks.wants_kind(kayra_core::notifications::FANOUT_COMPLETED) {
                worker.fanout_markers = Some(fanout::markers());
                worker.view.write().unwrap_or_else(PoisonError::into_inner).track_fanouts();
            }
            worker.sinks = Arc::new(sinks);
        }
        Ok(self)
    }

    /// Test-only: the notifier's first pause after a failed attempt
    /// (1 s in production), so retries can be tested quickly.
    #[doc(hidden)]
    pub fn set_notify_retry_base(&mut self, base: Duration) {
        self.notify_retry_base = base;
    }

    /// Test-only fault injection: `hook` runs in every job right before it
    /// acts under its lock (e.g. to make one panic). Call before `run`.
    #[doc(hidden)]
    pub fn set_fault_hook(&mut self, hook: FaultHook) {
        if let Some(worker) = Arc::get_mut(&mut self.worker) {
            worker.fault = Some(hook);
        }
    }

    /// The watch-fed view, for tests that check what the reconciler knows.
    #[doc(hidden)]
    pub fn view_handle(&self) -> Arc<std::sync::RwLock<View>> {
        self.worker.view.clone()
    }

    /// Becomes true once the startup list has been queued (for `/readyz`).
    pub fn ready_flag(&self) -> Arc<AtomicBool> {
        self.ready.clone()
    }

    /// Runs until the cancel token fires, then waits for every in-flight
    /// operation before returning (seed: "Reconciler.Run waits").
    pub async fn run(mut self) -> Result<(), kayra_catalog::repo::Error> {
        let cancel = self.worker.cancel.clone();
        let dispatcher = tokio::spawn(dispatch(
            self.worker.clone(),
            self.pool.clone(),
            self.queue.clone(),
            self.tracker.clone(),
            cancel.clone(),
        ));
        // On etcd, `kayra_limit_in_flight` shows the fleet's slots; everywhere,
        // `kayra_limit_held_seconds` counts a 429's hold down.
        let fleet = tokio::spawn(self.worker.limits.clone().report_fleet(cancel.clone()));
        let (notifier, fanout) = self.start_notifications(&cancel);
        let gates = TaskTracker::new();
        let driver = rollout::Driver { worker: self.worker.clone(), ready: self.ready.clone(), tasks: gates.clone() };
        let driver = tokio::spawn(driver.run(cancel.clone()));
        let cancels =
            tokio::spawn(cancels::watch(self.worker.repo.clone(), self.worker.cancels.clone(), cancel.clone()));
        self.watch(&cancel).await;
        self.queue.close();
        let _ = dispatcher.await;
        let _ = fleet.await;
        let _ = cancels.await;
        for task in [notifier, fanout].into_iter().flatten() {
            let _ = task.await;
        }
        let _ = driver.await;
        gates.close();
        gates.wait().await;
        self.pool.close();
        self.tracker.close();
        self.tracker.wait().await;
        tracing::info!("reconciler stopped; every in-flight operation finished");
        Ok(())
    }

    /// The list → watch → re-list state machine, one per watched prefix
    /// over `store.Store.Watch` ([`kayra_store::Store::watcher`]), decoded
    /// by the store's reflector ([`events::updates`]): a list replaces that
    /// resource's part of the view whole, so every delete missed in a gap
    /// is learnt; changes update it and queue work ([`events`]). Once all
    /// four resources have listed, reconcileExisting runs (again after
    /// every later re-list).
    async fn watch(&mut self, cancel: &CancellationToken) {
        let mut updates = events::updates(&self.worker.repo);
        let mut gauges = tokio::time::interval(GAUGE_INTERVAL);
        loop {
            let next = tokio::select! {
                next = updates.next() => next,
                _ = gauges.tick() => {
                    self.report_behind();
                    continue;
                }
                _ = cancel.cancelled() => return,
            };
            let Some(update) = next else {
                tracing::warn!("store gone; reconciler stops watching");
                return;
            };
            let (resource, list) = (update.resource(), update.is_list());
            let first = list && self.listed.insert(resource);
            if let Some(revision) = update.listed_at().filter(|_| !self.ready.load(Ordering::SeqCst)) {
                // The startup lists' revision: what reconcileExisting's
                // unconditional retry covers.
                self.worker.startup_listed_at.fetch_max(revision, Ordering::SeqCst);
            }
            self.apply(update);
            if list && self.listed.len() == Resource::ALL.len() {
                if first {
                    tracing::info!(resource = ?resource, "listed; reconciling existing records");
                } else {
                    tracing::info!(resource = ?resource, "re-listed; the view is replaced");
                }
                self.queue_existing();
                self.report_behind();
                self.ready.store(true, Ordering::SeqCst);
            }
        }
    }

    /// With sinks configured: the notifier, and the fan-out checks when a
    /// sink wants `fanout.completed`.
    #[allow(clippy::type_complexity)]
    fn start_notifications(
        &self,
        cancel: &CancellationToken,
    ) -> (Option<tokio::task::JoinHandle<()>>, Option<tokio::task::JoinHandle<()>>) {
        let sinks = self.worker.sinks.clone();
        if sinks.is_empty() {
            return (None, None);
        }
        let repo = self.worker.repo.clone();
        let notifier = notify::Notifier::new(repo.clone(), sinks.clone(), self.notify_retry_base);
        let notifier = tokio::spawn(notifier.run(cancel.clone()));
        let fanout = self.worker.fanout_markers.clone().map(|markers| {
            let (view, ready) = (self.worker.view.clone(), self.ready.clone());
            tokio::spawn(fanout::run(repo, sinks, view, (markers, ready), cancel.clone()))
        });
        (Some(notifier), fanout)
    }

    /// `kayra_subscriptions_behind{api}` from the view (no store read).
    fn report_behind(&self) {
        let counts = self.worker.view.read().unwrap_or_else(PoisonError::into_inner).behind_counts();
        for (api, behind) in counts {
            metrics::gauge!(METRIC_BEHIND, "api" => api).set(behind as f64);
        }
    }

    fn view(&self) -> std::sync::RwLockWriteGuard<'_, View> {
        self.worker.view.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// reconcileExisting: every inactive namespace and every subscription
    /// with anything to do, given-up ones included (seed: "unconditionally,
    /// on every kayra reconciler startup").
    /// A later re-list (the watch was lost) is no restart: it queues what
    /// has anything to do, but leaves given-up subscriptions alone.
    fn queue_existing(&self) {
        let startup = !self.ready.load(Ordering::SeqCst);
        let cause = Cause::new(if startup { RunTrigger::Startup } else { RunTrigger::Initial });
        let view = self.worker.view.read().unwrap_or_else(PoisonError::into_inner);
        for name in view.inactive_namespaces() {
            self.queue.add(JobKey::Namespace(name), cause, Class::Activation);
        }
        for (ns, api, activate) in view.to_reconcile(startup) {
            let class = if activate { Class::Activation } else { Class::Ongoing };
            self.queue.add(JobKey::subscription(ns, api), cause, class);
        }
    }
}

/// Takes a slot, then the next key, and runs its job in its own task: so
/// only running jobs hold slots, however many wait.
async fn dispatch(
    worker: Arc<Worker>,
    pool: Pool,
    queue: Arc<WorkQueue>,
    tracker: TaskTracker,
    cancel: CancellationToken,
) {
    // Jobs out of the queue: the pool's running ones plus at most half a
    // pool locked and waiting for a slot. Fewer than a pool wait, so a
    // queued activation still gets a slot among the next ones to free.
    let out = Arc::new(tokio::sync::Semaphore::new(pool.size() + pool.size() / 2));
    loop {
        let permit = tokio::select! {
            permit = out.clone().acquire_owned() => permit.ok(),
            _ = cancel.cancelled() => None,
        };
        let Some(permit) = permit else { break };
        let next = tokio::select! {
            next = queue.next() => next,
            _ = cancel.cancelled() => None,
        };
        let Some((key, cause, class)) = next else { break };
        let (worker, queue, pool) = (worker.clone(), queue.clone(), pool.clone());
        tracker.spawn(async move {
            let note = SyncNote::default();
            let (end, lock_id) = job(&worker, &pool, &key, cause, &note).await;
            drop(permit);
            queue.done(&key);
            match end {
                Ok(JobEnd::Done) => {}
                Ok(JobEnd::LockBusy) => queue.add_after(key, cause, class, worker.locks.retry_interval()),
                Ok(JobEnd::Limited(wait)) => queue.add_after(key, cause, class, wait),
                Ok(JobEnd::StoreFailed | JobEnd::Fenced) => {
                    queue.add_after(key, cause, class, ensure::STORE_BACKOFF);
                }
                Err(panic) => {
                    let why = panic_message(panic.as_ref());
                    let (namespace, api) = match &key {
                        JobKey::Namespace(ns) => (ns.clone(), String::new()),
                        JobKey::Subscription { namespace, api } => (namespace.clone(), api.clone()),
                    };
                    metrics::counter!(METRIC_PANICS).increment(1);
                    match lock_id {
                        Some(lock_id) => tracing::error!(namespace, api, lock_id, sync_id = %note.get(), panic = %why,
                            "reconcile job panicked; its key is queued again"),
                        None => tracing::error!(job = ?key, panic = %why,
                            "reconcile job panicked before it had a slot; its key is queued again"),
                    }
                    queue.add_after(key, cause, class, PANIC_BACKOFF);
                }
            }
        });
    }
}

/// One job: prepared (view, lock, on etcd the fresh reads) without a slot,
/// then run in the next free one, whose number it returns. A locked job
/// waits for a slot at most [`JobLocks::slot_patience`], then unlocks and
/// goes back to the queue.
async fn job(
    worker: &Worker,
    pool: &Pool,
    key: &JobKey,
    cause: Cause,
    note: &SyncNote,
) -> (std::thread::Result<JobEnd>, Option<usize>) {
    let guard = match AssertUnwindSafe(worker.prepare(key, cause)).catch_unwind().await {
        Ok(Prepared::Nothing) => return (Ok(JobEnd::Done), None),
        Ok(Prepared::Busy) => return (Ok(JobEnd::LockBusy), None),
        Ok(Prepared::Ready(guard)) => guard,
        Err(panic) => return (Err(panic), None),
    };
    let slot = tokio::select! {
        slot = pool.acquire() => slot,
        _ = worker.cancel.cancelled() => None,
        _ = sleep_or_forever(worker.locks.slot_patience()) => {
            guard.release().await;
            return (Ok(JobEnd::LockBusy), None);
        }
    };
    let Some(slot) = slot else {
        guard.release().await;
        return (Ok(JobEnd::Done), None);
    };
    let lock_id = slot.id();
    let end = AssertUnwindSafe(worker.run(key, cause, guard, lock_id, note)).catch_unwind().await;
    drop(slot);
    (end, Some(lock_id))
}

async fn sleep_or_forever(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id())
}

/// Every reconciler metric, described and present from startup (counters at 0).
fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(METRIC_RECONCILES, "Reconcile attempts by result (success, error, cancelled, superseded).");
    describe_histogram!(METRIC_DURATION, metrics::Unit::Seconds, "Duration of one reconcile attempt.");
    describe_gauge!(METRIC_IN_FLIGHT, "Reconciles running now.");
    describe_gauge!(METRIC_SLOTS_IN_USE, "Pool slots held by running jobs.");
    describe_histogram!(METRIC_LOCK_WAIT, metrics::Unit::Seconds, "Time to take a free job lock.");
    describe_counter!(METRIC_WATCH_EVENTS, "Watch events seen, by resource.");
    describe_gauge!(METRIC_QUEUE_DEPTH, "Jobs waiting in the work queue.");
    describe_histogram!(
        METRIC_SYNC_LAG,
        metrics::Unit::Seconds,
        "A subscriber's sync time minus its registration's sync_id_updated_at."
    );
    describe_counter!(METRIC_PANICS, "Reconcile jobs that panicked (their keys are queued again).");
    describe_gauge!(
        METRIC_BEHIND,
        "Active subscribers whose current_sync_id differs from their registration's SyncID."
    );
    for result in ["success", "error", "cancelled", "superseded"] {
        metrics::counter!(METRIC_RECONCILES, "result" => result).increment(0);
    }
    rollout::describe_metrics();
    for resource in ["namespace", "apiregistration", "subscription", "reconcileattempt", "rollout"] {
        metrics::counter!(METRIC_WATCH_EVENTS, "resource" => resource).increment(0);
    }
    metrics::counter!(METRIC_PANICS).increment(0);
    // Registered now, so the histogram is listed before the first sync.
    let _ = metrics::histogram!(METRIC_SYNC_LAG);
    metrics::gauge!(METRIC_IN_FLIGHT).set(0.0);
    metrics::gauge!(METRIC_SLOTS_IN_USE).set(0.0);
    metrics::gauge!(METRIC_QUEUE_DEPTH).set(0.0);
}
