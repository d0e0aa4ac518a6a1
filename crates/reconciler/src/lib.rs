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
//! - [`queue`]: the work queue (coalescing, fair order).
//! - [`pool`]: the numbered slots.
//! - [`locks`]: cross-process job locks.
//! - [`runs`]: the run records (§4.4).
//! - [`view`]: the watch-fed view of this deployment.

pub mod decide;
pub mod ensure;
pub mod locks;
pub mod pool;
pub mod queue;
pub mod runs;
pub mod view;

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kayra_catalog::repo::{Collection, Layout, Repository};
use kayra_config::ReconcilerConfig;
use kayra_core::{ApiRegistration, Namespace, RunTrigger, Subscription};
use kayra_pipeline::{Pipelines, ValidationError};
use kayra_store::{Event, Revision, WatcherEvent};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use decide::{Attempt, Decision};
use ensure::{FaultHook, JobEnd, Prepared, SyncNote, Worker};
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
}

/// Where one resource's list → watch → re-list machine is.
enum Phase {
    /// Between `Init` and `InitDone`: the list so far.
    Listing(Listing),
    Watching,
}

/// A list in progress, decoded record by record as it arrives, so a large
/// list is never held both raw and decoded (the restart over 100,000
/// subscriptions peaks at its view, not at twice its list).
enum Listing {
    Namespaces(Vec<(String, bool, Revision)>),
    Registrations(Vec<(ApiRegistration, Revision)>),
    Subscriptions(Vec<(Subscription, Revision)>),
    Attempts(Vec<((String, String), Attempt)>),
}

impl Listing {
    fn new(kind: Kind) -> Self {
        match kind {
            Kind::Namespace => Self::Namespaces(Vec::new()),
            Kind::Registration => Self::Registrations(Vec::new()),
            Kind::Subscription => Self::Subscriptions(Vec::new()),
            Kind::Attempt => Self::Attempts(Vec::new()),
        }
    }

    /// Adds one listed record; an unreadable one is logged and left out,
    /// as its watch event would be.
    fn push(&mut self, kv: kayra_store::KeyValue, layout: &Layout) {
        let rev = kv.mod_revision;
        let decoded = match self {
            Self::Namespaces(items) => {
                serde_json::from_slice::<Namespace>(&kv.value).map(|n| items.push((n.name, n.active, rev)))
            }
            Self::Registrations(items) => {
                serde_json::from_slice::<ApiRegistration>(&kv.value).map(|r| items.push((r, rev)))
            }
            Self::Subscriptions(items) => {
                serde_json::from_slice::<Subscription>(&kv.value).map(|s| items.push((s, rev)))
            }
            Self::Attempts(items) => match attempt_parts(layout, &kv.key) {
                Some((ns, api)) => serde_json::from_slice::<Attempt>(&kv.value)
                    .map(|attempt| items.push(((ns.to_string(), api.to_string()), attempt))),
                None => Ok(()),
            },
        };
        if let Err(e) = decoded {
            tracing::warn!(key = %kv.key, error = %e, "unreadable record left out of the list");
        }
    }
}

/// Which resource a watch event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Namespace,
    Registration,
    Subscription,
    Attempt,
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
        };
        Ok(Self {
            worker: Arc::new(worker),
            pool,
            queue: Arc::new(queue),
            tracker: TaskTracker::new(),
            ready: Arc::default(),
        })
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
        // On etcd, `kayra_limit_in_flight` shows the fleet's slots.
        let fleet = tokio::spawn(self.worker.limits.clone().report_fleet(cancel.clone()));
        self.watch(&cancel).await;
        self.queue.close();
        let _ = dispatcher.await;
        let _ = fleet.await;
        self.pool.close();
        self.tracker.close();
        self.tracker.wait().await;
        tracing::info!("reconciler stopped; every in-flight operation finished");
        Ok(())
    }

    /// The list → watch → re-list state machine, one per watched prefix
    /// over `store.Store.Watch` ([`kayra_store::Store::watcher`]): while
    /// **listing** (`Init`…`InitApply`…) records are buffered; at
    /// `InitDone` that resource's part of the view is replaced whole, so
    /// every delete missed in a gap is learnt, and the machine is
    /// **watching** (`Apply`/`Delete`) until the store re-lists again. Once
    /// all four resources have listed, reconcileExisting runs.
    async fn watch(&mut self, cancel: &CancellationToken) {
        let repo = self.worker.repo.clone();
        let layout = repo.layout().clone();
        let store = repo.store();
        let prefixes = [
            (Kind::Namespace, layout.prefix(Collection::Namespaces)),
            (Kind::Registration, layout.prefix(Collection::Registrations)),
            (Kind::Subscription, layout.prefix(Collection::Subscriptions)),
            (Kind::Attempt, layout.prefix(Collection::Attempts)),
        ];
        let streams = prefixes.iter().map(|(kind, prefix)| {
            let kind = *kind;
            store.watcher(prefix).map(move |e| (kind, e)).boxed()
        });
        let mut events = futures::stream::select_all(streams);
        let mut phases: HashMap<Kind, Phase> =
            prefixes.iter().map(|(k, _)| (*k, Phase::Listing(Listing::new(*k)))).collect();
        let mut listed: HashSet<Kind> = HashSet::new();
        let mut gauges = tokio::time::interval(GAUGE_INTERVAL);
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                _ = gauges.tick() => {
                    self.report_behind();
                    continue;
                }
                _ = cancel.cancelled() => return,
            };
            let Some((kind, event)) = next else {
                tracing::warn!("store gone; reconciler stops watching");
                return;
            };
            let phase = phases.entry(kind).or_insert(Phase::Watching);
            match event {
                WatcherEvent::Init => *phase = Phase::Listing(Listing::new(kind)),
                WatcherEvent::InitApply(kv) => match phase {
                    Phase::Listing(listing) => listing.push(kv, &layout),
                    Phase::Watching => self.handle(kind, Event::Put(kv), &layout),
                },
                WatcherEvent::InitDone { .. } => {
                    let listing = match std::mem::replace(phase, Phase::Watching) {
                        Phase::Listing(listing) => listing,
                        Phase::Watching => Listing::new(kind),
                    };
                    let first = listed.insert(kind);
                    self.replace(listing);
                    if listed.len() == prefixes.len() {
                        if first {
                            tracing::info!(kind = ?kind, "listed; reconciling existing records");
                        } else {
                            tracing::info!(kind = ?kind, "re-listed; the view is replaced");
                        }
                        self.queue_existing();
                        self.report_behind();
                        self.ready.store(true, Ordering::SeqCst);
                    }
                }
                WatcherEvent::Apply(kv) => self.handle(kind, Event::Put(kv), &layout),
                WatcherEvent::Delete { key, revision } => self.handle(kind, Event::Delete { key, revision }, &layout),
                WatcherEvent::Progress { .. } => {}
            }
        }
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

    /// Replaces one kind's records in the view with a complete list.
    /// Subscriptions gone from it were deleted in a gap: their given-up
    /// records go too.
    fn replace(&mut self, listing: Listing) {
        let mut view = self.view();
        let gaps_matter = matches!(listing, Listing::Subscriptions(_) | Listing::Attempts(_));
        match listing {
            Listing::Namespaces(items) => view.replace_namespaces(items),
            Listing::Registrations(items) => view.replace_registrations(items),
            Listing::Subscriptions(items) => view.replace_subscriptions(items),
            Listing::Attempts(items) => view.replace_given_up(items),
        }
        // Attempt records of subscriptions deleted while nobody watched.
        let orphans = view.orphaned_given_up();
        drop(view);
        if !gaps_matter {
            return;
        }
        for (ns, api) in orphans {
            self.view().delete_given_up(&ns, &api);
            let repo = self.worker.repo.clone();
            self.tracker.spawn(async move { ensure::forget_given_up(&repo, &ns, &api).await });
        }
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
        for (ns, api) in view.subscription_keys() {
            if let Decision::Reconcile { activate, .. } = view.decide(&ns, &api, startup) {
                let class = if activate { Class::Activation } else { Class::Ongoing };
                self.queue.add(JobKey::subscription(ns, api), cause, class);
            }
        }
    }

    fn handle(&mut self, kind: Kind, event: Event, layout: &Layout) {
        let label = match kind {
            Kind::Namespace => "namespace",
            Kind::Registration => "apiregistration",
            Kind::Subscription => "subscription",
            Kind::Attempt => "reconcileattempt",
        };
        metrics::counter!(METRIC_WATCH_EVENTS, "resource" => label).increment(1);
        match (kind, event) {
            (Kind::Namespace, Event::Put(kv)) => match serde_json::from_slice::<Namespace>(&kv.value) {
                Ok(ns) => {
                    self.view().put_namespace(&ns.name, ns.active, kv.mod_revision);
                    if !ns.active {
                        self.queue.add(JobKey::Namespace(ns.name), Cause::new(RunTrigger::Initial), Class::Activation);
                    }
                }
                Err(e) => tracing::warn!(key = %kv.key, error = %e, "unreadable namespace record ignored"),
            },
            (Kind::Namespace, Event::Delete { key, .. }) => {
                if let Some(name) = self.worker.repo.namespace_key_name(&key) {
                    self.view().delete_namespace(name);
                }
            }
            (Kind::Registration, Event::Put(kv)) => match serde_json::from_slice::<ApiRegistration>(&kv.value) {
                Ok(reg) => {
                    let (name, sync_id) = (reg.name.clone(), reg.sync_id.clone());
                    let (behind, waiting) = {
                        let mut view = self.view();
                        let new = view.registration(&name).is_none();
                        view.put_registration(reg, kv.mod_revision);
                        let waiting = if new { view.never_attempted(&name) } else { Vec::new() };
                        (view.behind(&name, &sync_id), waiting)
                    };
                    // First syncs whose subscription event arrived before
                    // their registration's (separate watches): decided then
                    // without a registration, they are queued now.
                    for namespace in waiting {
                        let key = JobKey::subscription(namespace, name.clone());
                        self.queue.add(key, Cause::new(RunTrigger::Initial), Class::Activation);
                    }
                    // Supersede: running pipelines toward an older SyncID stop,
                    // and their jobs (first syncs included) run again toward this one.
                    // A superseded first sync is still an activation.
                    for namespace in self.worker.supersede(&name, &sync_id) {
                        let first = self.view().subscription(&namespace, &name).is_none_or(|(sub, _)| !sub.active);
                        let class = if first { Class::Activation } else { Class::Ongoing };
                        let key = JobKey::subscription(namespace, name.clone());
                        self.queue.add(key, Cause::new(RunTrigger::Ongoing), class);
                    }
                    // The ongoing action: every active subscriber behind the new SyncID.
                    for namespace in behind {
                        let key = JobKey::subscription(namespace, name.clone());
                        self.queue.add(key, Cause::new(RunTrigger::Ongoing), Class::Ongoing);
                    }
                }
                Err(e) => tracing::warn!(key = %kv.key, error = %e, "unreadable api registration record ignored"),
            },
            (Kind::Registration, Event::Delete { key, .. }) => {
                if let Some(name) = self.worker.repo.registration_key_name(&key) {
                    self.view().delete_registration(name);
                }
            }
            (Kind::Subscription, Event::Put(kv)) => match serde_json::from_slice::<Subscription>(&kv.value) {
                Ok(sub) => self.subscription_put(sub, kv.mod_revision),
                Err(e) => tracing::warn!(key = %kv.key, error = %e, "unreadable subscription record ignored"),
            },
            (Kind::Subscription, Event::Delete { key, .. }) => {
                if let Some((namespace, api)) = self.worker.repo.subscription_key_parts(&key) {
                    let (namespace, api) = (namespace.to_string(), api.to_string());
                    let had_record = {
                        let mut view = self.view();
                        view.delete_subscription(&namespace, &api);
                        view.delete_given_up(&namespace, &api)
                    };
                    if had_record {
                        let repo = self.worker.repo.clone();
                        self.tracker.spawn(async move { ensure::forget_given_up(&repo, &namespace, &api).await });
                    }
                }
            }
            (Kind::Attempt, Event::Put(kv)) => {
                if let (Some((ns, api)), Ok(attempt)) =
                    (attempt_parts(layout, &kv.key), serde_json::from_slice::<Attempt>(&kv.value))
                {
                    self.view().put_given_up(ns, api, attempt);
                }
            }
            (Kind::Attempt, Event::Delete { key, .. }) => {
                if let Some((ns, api)) = attempt_parts(layout, &key) {
                    self.view().delete_given_up(ns, api);
                }
            }
        }
    }

    /// A write to a subscription: the initial action (or a force re-sync,
    /// which the `/sync` reset says in the record it writes). The echo of
    /// this reconciler's own result write (the job put it in
    /// the view at its revision already) is no cause: when it finds the
    /// subscription behind, what moved is the registration (`ongoing`),
    /// and a trigger already queued for the key stays the run's.
    fn subscription_put(&mut self, sub: Subscription, revision: Revision) {
        let (namespace, api) = (sub.namespace.clone(), sub.api.clone());
        let resync = sub.resync_requested;
        let (decision, own_write) = {
            let mut view = self.view();
            let own_write = view.subscription(&namespace, &api).is_some_and(|(_, seen)| *seen >= revision);
            view.put_subscription(sub, revision);
            (view.decide(&namespace, &api, false), own_write)
        };
        if let Decision::Reconcile { activate, .. } = decision {
            let class = if activate { Class::Activation } else { Class::Ongoing };
            let cause = match (own_write, activate, resync) {
                (true, false, _) => Cause::own_write(RunTrigger::Ongoing),
                (true, true, _) => Cause::own_write(RunTrigger::Initial),
                (false, _, true) => Cause::new(RunTrigger::Resync),
                (false, _, false) => Cause::new(RunTrigger::Initial),
            };
            self.queue.add(JobKey::subscription(namespace, api), cause, class);
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
    for resource in ["namespace", "apiregistration", "subscription", "reconcileattempt"] {
        metrics::counter!(METRIC_WATCH_EVENTS, "resource" => resource).increment(0);
    }
    metrics::counter!(METRIC_PANICS).increment(0);
    // Registered now, so the histogram is listed before the first sync.
    let _ = metrics::histogram!(METRIC_SYNC_LAG);
    metrics::gauge!(METRIC_IN_FLIGHT).set(0.0);
    metrics::gauge!(METRIC_SLOTS_IN_USE).set(0.0);
    metrics::gauge!(METRIC_QUEUE_DEPTH).set(0.0);
}

/// `(namespace, api)` of the key of one of `layout`'s deployment's attempt records.
fn attempt_parts<'k>(layout: &Layout, key: &'k str) -> Option<(&'k str, &'k str)> {
    match layout.parse(key)? {
        kayra_catalog::repo::RecordRef::Attempt { namespace, api } => Some((namespace, api)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kayra_catalog::repo::RecordRef;

    fn kv(key: &str, value: &[u8], revision: Revision) -> kayra_store::KeyValue {
        kayra_store::KeyValue {
            key: key.into(),
            value: value.to_vec(),
            create_revision: revision,
            mod_revision: revision,
        }
    }

    #[test]
    fn a_list_is_decoded_as_it_arrives_and_unreadable_records_are_left_out() {
        let mut listing = Listing::new(Kind::Subscription);
        let sub = Subscription::new("team-a", "compute.example.com");
        let layout = Layout::new("p", "r");
        let key = |namespace| layout.key(RecordRef::Subscription { namespace, api: "compute.example.com" });
        listing.push(kv(&key("team-a"), &serde_json::to_vec(&sub).unwrap(), 7), &layout);
        listing.push(kv(&key("team-b"), b"{not json", 8), &layout);
        let Listing::Subscriptions(items) = listing else { panic!("a subscription listing") };
        assert_eq!(items, vec![(sub, 7)]);

        let mut listing = Listing::new(Kind::Attempt);
        let attempt = Attempt { subscription_revision: 3, registration_revision: 2 };
        let value = serde_json::to_vec(&attempt).unwrap();
        let attempt_key = layout.key(RecordRef::Attempt { namespace: "team-a", api: "compute.example.com" });
        listing.push(kv(&attempt_key, &value, 9), &layout);
        listing.push(kv("/elsewhere/team-a/compute.example.com", &value, 10), &layout);
        let Listing::Attempts(items) = listing else { panic!("an attempt listing") };
        assert_eq!(items, vec![(("team-a".to_string(), "compute.example.com".to_string()), attempt)]);
    }
}
