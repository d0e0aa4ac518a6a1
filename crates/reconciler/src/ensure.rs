//! The jobs: namespace activation and `ensureReconciled` (seed, "Initial
//! action" / "Ongoing action"; platform contract §7).
//!
//! ```text
//! ensureReconciled(reg, sub):
//!   already active and CurrentSyncID == reg.SyncID?  -> nothing to do
//!   this exact (sub, reg) state already failed twice  -> nothing to do
//!   reconcile(reg) succeeds -> CurrentSyncID = reg.SyncID (+ active, state success)
//!   reconcile(reg) fails    -> state error (once), retry once right away,
//!                              then wait for the next write to either record
//! ```
//!
//! Every result is written with compare-and-swap against the revision the
//! decision was made on: when the subscription changed meanwhile (a force
//! re-sync, a delete) the write is dropped and the fresh record decides
//! again, so a force re-sync racing a reconcile always causes one more.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use kayra_config::ReconcilerConfig;
use kayra_core::{ApiRegistration, Subscription};
use kayra_store::Revision;

use super::locks::JobLocks;
use kayra_catalog::pipeline::{PipelineError, Pipelines, SubscriptionContext};
use kayra_catalog::repo::tenancy::Recorded;
use kayra_catalog::repo::{Repository, Versioned, keys};

/// Everything a job needs; shared by every job of one reconciler.
pub struct Worker {
    pub repo: Repository,
    pub config: ReconcilerConfig,
    pub pipelines: Pipelines,
    pub client: reqwest::Client,
    pub locks: JobLocks,
    pub cancel: CancellationToken,
}

/// Why a reconcile did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Neither the registration nor `reconciler.default_mode` names a mode.
    #[error("api registration {0:?} has no mode and reconciler.default_mode is empty")]
    NoMode(String),
    /// The step pipeline failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

/// The last failed attempt on a subscription (stored under `keys::attempt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Attempt {
    subscription_revision: Revision,
    registration_revision: Revision,
}

/// What dispatched a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// reconcileExisting at startup: every record, unconditionally, so a
    /// subscription that gave up before the restart is tried again (seed).
    Startup,
    /// A watch event (a write to the subscription or its registration).
    Event,
}

/// What `ensureReconciled` does after one attempt.
enum Next {
    Done,
    /// Read the records fresh and decide again, with this many failures so far.
    Again {
        failures: u32,
    },
}

/// How many times one decision is attempted before waiting for the next write.
const ATTEMPTS_PER_DECISION: u32 = 2;

impl Worker {
    /// Activates a namespace still `active: false` (seed, "Initial action").
    pub async fn activate_namespace(self: Arc<Self>, name: String, lock_id: usize) {
        let job = format!("namespaces/{name}");
        let span = tracing::info_span!("activate", namespace = %name, lock_id, sync_id = "");
        async move {
            match self.repo.get_namespace(&name).await {
                Ok(Some(ns)) if !ns.value.active => {}
                Ok(_) => return,
                Err(e) => return tracing::warn!(error = %e, "read namespace failed"),
            }
            let Some(guard) = self.locks.lock(&job, &self.cancel).await else { return };
            match self.repo.activate_namespace(&name).await {
                Ok(Recorded::Written(_)) => tracing::info!("namespace activated"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "namespace activation failed"),
            }
            guard.release().await;
        }
        .instrument(span)
        .await
    }

    /// `ensureReconciled` for one subscription.
    pub async fn ensure_reconciled(self: Arc<Self>, namespace: String, api: String, trigger: Trigger, lock_id: usize) {
        // Unlocked fast path: reads only, so an idle reconciler takes no
        // locks and makes no writes.
        match self.needs_work(&namespace, &api, trigger).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(namespace, api, lock_id, sync_id = "", error = %e, "read subscription failed");
                return;
            }
        }
        let job = format!("subscriptions/{namespace}/{api}");
        let Some(guard) = self.locks.lock(&job, &self.cancel).await else { return };
        if let Err(e) = self.ensure_locked(&namespace, &api, trigger, lock_id).await {
            tracing::warn!(namespace, api, lock_id, sync_id = "", error = %e, "reconcile aborted: store error");
        }
        guard.release().await;
    }

    async fn needs_work(&self, namespace: &str, api: &str, trigger: Trigger) -> kayra_catalog::repo::Result<bool> {
        let Some(sub) = self.repo.get_subscription(namespace, api).await? else { return Ok(false) };
        let Some(reg) = self.repo.get_registration(api).await? else { return Ok(false) };
        if sub.value.is_synced(&reg.value.sync_id) {
            return Ok(false);
        }
        Ok(trigger == Trigger::Startup || self.last_attempt(namespace, api).await? != Some(attempt_of(&sub, &reg)))
    }

    async fn ensure_locked(
        &self,
        namespace: &str,
        api: &str,
        trigger: Trigger,
        lock_id: usize,
    ) -> kayra_catalog::repo::Result<()> {
        let mut failures = 0;
        loop {
            if self.cancel.is_cancelled() {
                return Ok(());
            }
            let Some(sub) = self.repo.get_subscription(namespace, api).await? else { return Ok(()) };
            let Some(reg) = self.repo.get_registration(api).await? else {
                // The registration is gone (or out of scope): nothing to reconcile toward.
                return Ok(());
            };
            if sub.value.is_synced(&reg.value.sync_id) {
                return Ok(());
            }
            if failures == 0
                && trigger == Trigger::Event
                && self.last_attempt(namespace, api).await? == Some(attempt_of(&sub, &reg))
            {
                return Ok(()); // this exact state already failed: wait for the next write
            }
            // One span per attempt, instrumenting (never entered across an
            // await), so every line inside carries all four fields.
            let span = tracing::info_span!("reconcile", namespace, api, lock_id, sync_id = %reg.value.sync_id);
            match self.attempt(&sub, &reg, failures, lock_id).instrument(span).await? {
                Next::Done => return Ok(()),
                Next::Again { failures: f } => failures = f,
            }
        }
    }

    /// One reconcile of `sub` toward `reg`, and its recorded result.
    async fn attempt(
        &self,
        sub: &Versioned<Subscription>,
        reg: &Versioned<ApiRegistration>,
        mut failures: u32,
        lock_id: usize,
    ) -> kayra_catalog::repo::Result<Next> {
        let sync_id = &reg.value.sync_id;
        let started = Instant::now();
        metrics::gauge!(super::METRIC_IN_FLIGHT).increment(1.0);
        let result = self.reconcile(&reg.value, &sub.value, lock_id).await;
        metrics::gauge!(super::METRIC_IN_FLIGHT).decrement(1.0);
        metrics::histogram!(super::METRIC_DURATION).record(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                metrics::counter!(super::METRIC_RECONCILES, "result" => "success").increment(1);
                let first = !sub.value.active;
                let recorded = if first {
                    self.repo.activate_subscription(sub, sync_id).await?
                } else {
                    self.repo.set_subscription_sync_id(sub, sync_id).await?
                };
                if recorded == Recorded::Stale {
                    tracing::info!("subscription changed during reconcile; deciding again");
                    return Ok(Next::Again { failures: 0 });
                }
                let what = if first { "subscription activated" } else { "subscription reconciled" };
                tracing::info!(result = "success", "{what}");
                Ok(Next::Done)
            }
            Err(ReconcileError::Pipeline(PipelineError::Cancelled)) => {
                metrics::counter!(super::METRIC_RECONCILES, "result" => "cancelled").increment(1);
                tracing::info!("reconcile stopped between steps: shutting down");
                Ok(Next::Done)
            }
            Err(e) => {
                metrics::counter!(super::METRIC_RECONCILES, "result" => "error").increment(1);
                failures += 1;
                tracing::warn!(result = "error", attempt = failures, error = %e, "reconcile failed");
                let after = match self.repo.mark_subscription_error(sub).await? {
                    Recorded::Stale => {
                        tracing::info!("subscription changed during reconcile; deciding again");
                        return Ok(Next::Again { failures: 0 });
                    }
                    Recorded::Written(revision) => revision,
                    Recorded::Unchanged => sub.revision,
                };
                if failures >= ATTEMPTS_PER_DECISION {
                    let attempt = Attempt { subscription_revision: after, registration_revision: reg.revision };
                    self.record_attempt(&sub.value.namespace, &sub.value.api, &attempt).await?;
                    tracing::warn!("giving up until the subscription or its registration is written again");
                    return Ok(Next::Done);
                }
                tracing::info!("retrying once right away");
                Ok(Next::Again { failures })
            }
        }
    }

    /// reconcile(reg): run the mode's pipeline, or the placeholder.
    async fn reconcile(&self, reg: &ApiRegistration, sub: &Subscription, lock_id: usize) -> Result<(), ReconcileError> {
        let Some(mode) = self.config.resolve_mode(&reg.mode) else {
            return Err(ReconcileError::NoMode(reg.name.clone()));
        };
        let Some(pipeline) = self.pipelines.get(mode) else {
            tracing::info!(mode, "mode has no steps configured: placeholder reconcile succeeds");
            return Ok(());
        };
        tracing::info!(mode, "running step pipeline");
        let ctx = SubscriptionContext {
            api: reg.name.clone(),
            short_name: reg.short_name.clone(),
            namespace: sub.namespace.clone(),
            platform: self.repo.platform().to_string(),
            region: self.repo.region().to_string(),
            current_sync_id: sub.current_sync_id.clone(),
            expected_sync_id: reg.sync_id.clone(),
            lock_id,
        };
        pipeline.run(&self.client, &ctx, &self.pipelines.settings(), &self.cancel).await?;
        Ok(())
    }

    async fn last_attempt(&self, namespace: &str, api: &str) -> kayra_catalog::repo::Result<Option<Attempt>> {
        let key = keys::attempt(self.repo.platform(), self.repo.region(), namespace, api);
        Ok(self.repo.get::<Attempt>(&key).await?.map(|v| v.value))
    }

    async fn record_attempt(&self, namespace: &str, api: &str, attempt: &Attempt) -> kayra_catalog::repo::Result<()> {
        let key = keys::attempt(self.repo.platform(), self.repo.region(), namespace, api);
        loop {
            let result = match self.repo.get::<Attempt>(&key).await? {
                Some(old) if old.value == *attempt => return Ok(()),
                Some(old) => self.repo.update(&key, attempt, old.revision, "reconcile attempt").await,
                None => self.repo.create(&key, attempt, "reconcile attempt").await,
            };
            match result {
                Ok(_) => return Ok(()),
                Err(kayra_catalog::repo::Error::Conflict(_) | kayra_catalog::repo::Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Forgets the failed-attempt record of a deleted subscription.
    pub async fn forget_attempt(&self, namespace: &str, api: &str) {
        let key = keys::attempt(self.repo.platform(), self.repo.region(), namespace, api);
        if let Ok(Some(_)) = self.repo.get::<Attempt>(&key).await {
            let _ = self.repo.delete(&key, None, "reconcile attempt").await;
        }
    }
}

fn attempt_of(sub: &Versioned<Subscription>, reg: &Versioned<ApiRegistration>) -> Attempt {
    Attempt { subscription_revision: sub.revision, registration_revision: reg.revision }
}
