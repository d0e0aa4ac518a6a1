//! `Reconciler`: the controller behind `kayra reconciler` (seed,
//! "Reconciler").
//!
//! It runs as its own process, built on `store.Store.Watch`. `run` is an
//! explicit state machine (kube-runtime's watcher): **listing** — list
//! namespaces and activate the inactive ones, list every subscription of
//! this deployment and run `ensureReconciled` on each (reconcileExisting) —
//! then **watching** from the list's revision + 1, so nothing written in
//! between is missed; if a watch stream ever ends, back to listing.
//!
//! Reactions to watch events:
//! - namespace put, `active: false` → activation (initial action);
//! - subscription put → `ensureReconciled` (initial action), unless the
//!   record is already converged;
//! - registration put → the ongoing action's fan-out to every *active*
//!   subscriber whose CurrentSyncID differs, found through the in-memory
//!   [`index::Index`] instead of a store scan.
//!
//! Every operation runs on the shared [`pool::Pool`] (its slot number is
//! the `lock_id`) under a per-job lock ([`locks::JobLocks`]).
//!
//! # Layout
//! - [`ensure`]: the jobs (`ensureReconciled`, namespace activation).
//! - [`pool`]: the bounded, numbered worker pool.
//! - [`locks`]: in-process + distributed per-job locks.
//! - [`index`]: subscribers by API, registrations' SyncIDs.

pub mod ensure;
pub mod index;
pub mod locks;
pub mod pool;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use kayra_config::ReconcilerConfig;
use kayra_core::{ApiRegistration, Namespace, Subscription};
use kayra_store::{Event, Revision};
use tokio_util::sync::CancellationToken;

use ensure::{Trigger, Worker};
use index::Index;
use kayra_catalog::pipeline::{Pipelines, ValidationError};
use kayra_catalog::repo::{Repository, keys};
use locks::JobLocks;
use pool::Pool;

pub const METRIC_RECONCILES: &str = "kayra_reconciles_total";
pub const METRIC_DURATION: &str = "kayra_reconcile_duration_seconds";
pub const METRIC_IN_FLIGHT: &str = "kayra_reconciles_in_flight";
pub const METRIC_SLOTS_IN_USE: &str = "kayra_reconciler_pool_slots_in_use";
pub const METRIC_LOCK_WAIT: &str = "kayra_reconciler_lock_wait_seconds";
pub const METRIC_WATCH_EVENTS: &str = "kayra_reconciler_watch_events_total";

/// The controller. Build with [`Reconciler::new`], drive with [`Reconciler::run`].
pub struct Reconciler {
    worker: Arc<Worker>,
    pool: Pool,
    index: Index,
    ready: Arc<AtomicBool>,
}

/// Which resource a watch event is about.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Namespace,
    Registration,
    Subscription,
}

impl Reconciler {
    /// Compiles every mode's pipeline (the startup validation) and prepares
    /// the pool and locks. `cancel` is the shutdown signal.
    pub fn new(repo: Repository, config: ReconcilerConfig, cancel: CancellationToken) -> Result<Self, ValidationError> {
        let pipelines = Pipelines::compile(&config)?;
        let locks = JobLocks::new(repo.store().job_locker());
        let pool = Pool::new(config.max_concurrent_reconciles);
        let worker = Worker { repo, config, pipelines, client: kayra_catalog::pipeline::http_client(), locks, cancel };
        Ok(Self { worker: Arc::new(worker), pool, index: Index::default(), ready: Arc::default() })
    }

    /// Becomes true once the startup list has been dispatched (for `/readyz`).
    pub fn ready_flag(&self) -> Arc<AtomicBool> {
        self.ready.clone()
    }

    /// Runs until the cancel token fires, then waits for every in-flight
    /// operation before returning (seed: "Reconciler.Run waits").
    pub async fn run(mut self) -> Result<(), kayra_catalog::repo::Error> {
        let cancel = self.worker.cancel.clone();
        let result = loop {
            if cancel.is_cancelled() {
                break Ok(());
            }
            match self.list_and_watch(&cancel).await {
                Ok(()) => {}
                Err(e) if cancel.is_cancelled() => break Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "reconciler list/watch failed; re-listing");
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = cancel.cancelled() => {}
                    }
                }
            }
        };
        self.pool.close_and_wait().await;
        tracing::info!("reconciler stopped; every in-flight operation finished");
        result
    }

    /// One listing → watching cycle. Returns when a stream ends or on cancel.
    async fn list_and_watch(&mut self, cancel: &CancellationToken) -> Result<(), kayra_catalog::repo::Error> {
        let repo = self.worker.repo.clone();
        self.index = Index::default();

        let (namespaces, ns_rev) = repo.list_namespaces().await?;
        let (registrations, reg_rev) = repo.list_registrations().await?;
        for reg in &registrations {
            self.index.put_registration(&reg.value);
        }
        let (subscriptions, sub_rev) = repo.list_subscriptions().await?;
        for sub in &subscriptions {
            self.index.put_subscription(&sub.value);
        }
        tracing::info!(
            namespaces = namespaces.len(),
            registrations = registrations.len(),
            subscriptions = subscriptions.len(),
            "listed; reconciling existing records"
        );
        for ns in namespaces.into_iter().filter(|ns| !ns.value.active) {
            self.dispatch_namespace(ns.value.name).await;
        }
        for sub in subscriptions {
            if !self.index.is_converged(&sub.value) {
                self.dispatch_subscription(sub.value.namespace, sub.value.api, Trigger::Startup).await;
            }
        }
        self.ready.store(true, Ordering::SeqCst);

        let store = repo.store();
        let streams = vec![
            watch(store, keys::NAMESPACES, ns_rev, Kind::Namespace).await?,
            watch(store, &keys::registrations(repo.platform(), repo.region()), reg_rev, Kind::Registration).await?,
            watch(store, &keys::subscriptions(repo.platform(), repo.region()), sub_rev, Kind::Subscription).await?,
        ];
        let mut events = futures::stream::select_all(streams);
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                _ = cancel.cancelled() => return Ok(()),
            };
            let Some((kind, event)) = next else {
                tracing::warn!("watch stream ended; re-listing");
                return Ok(());
            };
            self.handle(kind, event).await;
        }
    }

    async fn handle(&mut self, kind: Kind, event: Event) {
        let label = match (&kind, &event) {
            (Kind::Namespace, _) => "namespace",
            (Kind::Registration, _) => "apiregistration",
            (Kind::Subscription, _) => "subscription",
        };
        metrics::counter!(METRIC_WATCH_EVENTS, "resource" => label).increment(1);
        match (kind, event) {
            (Kind::Namespace, Event::Put(kv)) => match serde_json::from_slice::<Namespace>(&kv.value) {
                Ok(ns) if !ns.active => self.dispatch_namespace(ns.name).await,
                Ok(_) => {}
                Err(e) => tracing::warn!(key = %kv.key, error = %e, "unreadable namespace record ignored"),
            },
            (Kind::Registration, Event::Put(kv)) => match serde_json::from_slice::<ApiRegistration>(&kv.value) {
                Ok(reg) => {
                    self.index.put_registration(&reg);
                    // The ongoing action: every active subscriber behind the new SyncID.
                    for namespace in self.index.behind(&reg.name, &reg.sync_id) {
                        self.dispatch_subscription(namespace, reg.name.clone(), Trigger::Event).await;
                    }
                }
                Err(e) => tracing::warn!(key = %kv.key, error = %e, "unreadable api registration record ignored"),
            },
            (Kind::Registration, Event::Delete { key, .. }) => {
                if let Some(name) = self.worker.repo.registration_key_name(&key) {
                    self.index.delete_registration(name);
                }
            }
            (Kind::Subscription, Event::Put(kv)) => match serde_json::from_slice::<Subscription>(&kv.value) {
                Ok(sub) => {
                    self.index.put_subscription(&sub);
                    if !self.index.is_converged(&sub) {
                        self.dispatch_subscription(sub.namespace, sub.api, Trigger::Event).await;
                    }
                }
                Err(e) => tracing::warn!(key = %kv.key, error = %e, "unreadable subscription record ignored"),
            },
            (Kind::Subscription, Event::Delete { key, .. }) => {
                if let Some((namespace, api)) = self.worker.repo.subscription_key_parts(&key) {
                    let (namespace, api) = (namespace.to_string(), api.to_string());
                    self.index.delete_subscription(&namespace, &api);
                    let worker = self.worker.clone();
                    self.pool.submit(move |_| async move { worker.forget_attempt(&namespace, &api).await }).await;
                }
            }
            (Kind::Namespace, Event::Delete { .. }) => {}
        }
    }

    async fn dispatch_namespace(&self, name: String) {
        let worker = self.worker.clone();
        self.pool.submit(move |slot| worker.activate_namespace(name, slot)).await;
    }

    async fn dispatch_subscription(&self, namespace: String, api: String, trigger: Trigger) {
        let worker = self.worker.clone();
        self.pool.submit(move |slot| worker.ensure_reconciled(namespace, api, trigger, slot)).await;
    }
}

async fn watch(
    store: &kayra_store::Store,
    prefix: &str,
    listed_at: Revision,
    kind: Kind,
) -> Result<futures::stream::BoxStream<'static, (Kind, Event)>, kayra_catalog::repo::Error> {
    let stream = store.watch(prefix, listed_at + 1).await?;
    Ok(stream.map(move |e| (kind, e)).boxed())
}
