//! The jobs: namespace activation and `ensureReconciled` (seed, "Initial
//! action" / "Ongoing action"; platform contract §7) — the thin I/O around
//! the pure decision in [`crate::decide`].
//!
//! A subscription job: (1) asks the watch-fed [`View`] whether there is
//! anything to do, with no store read; (2) takes its job lock without
//! blocking (held elsewhere: the job goes back to the queue); both before
//! it has a pool slot ([`Worker::prepare`]). In its slot it (3) reads the
//! subscription, registration and given-up record fresh (on etcd they came
//! with the lock) and decides again; (4) reconciles and writes the result with
//! compare-and-swap against the revision it decided on: when the
//! subscription changed meanwhile (a force re-sync, a delete) the write is
//! dropped and the fresh record decides again, so a force re-sync racing a
//! reconcile always causes one more.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use kayra_catalog::repo::cancels::CancelRequest;
use kayra_catalog::repo::{FanoutWrite, JobRead, RecordRef, Repository, ResultCommit, ResultWrite, Rider, Versioned};
use kayra_config::ReconcilerConfig;
use kayra_core::runs::shown;
use kayra_core::{ApiRegistration, Run, RunResult, RunStep, RunTrigger, Subscription};
use kayra_pipeline::{HoldCause, Limits};
use kayra_pipeline::{PipelineError, Pipelines, RunControl, SubscriptionContext};

use crate::cancels::{Cancels, Stop};
use crate::decide::{self, Attempt, Decision, Observed, Outcome, Then, Write};
use crate::locks::{Acquired, JobGuard, JobLocks};
use crate::queue::{Cause, JobKey};
use crate::runs::{self, Begun, History};
use crate::view::View;
use kayra_core::run_ring::RunRing;

/// A test-only fault injection: called with the job's key right before it
/// reconciles (under its lock).
pub type FaultHook = Arc<dyn Fn(&JobKey) + Send + Sync>;

/// Everything a job needs; shared by every job of one reconciler.
pub struct Worker {
    pub repo: Repository,
    pub config: ReconcilerConfig,
    pub pipelines: Pipelines,
    pub client: reqwest::Client,
    pub locks: JobLocks,
    pub cancel: CancellationToken,
    pub view: Arc<RwLock<View>>,
    pub fault: Option<FaultHook>,
    /// `reconciler.limits`: taken without waiting before each pipeline start.
    pub limits: Limits,
    /// Running pipelines, for §7 supersede (see [`RunningMap`]).
    pub running: RunningMap,
    /// Immediate retries held back by a limit (a backend's `Retry-After`):
    /// (namespace, api) → the state whose first failure they retry. The
    /// job goes back to the queue, and whichever entry of that key runs
    /// next (the requeued one or the echo of the `state: error` write) runs
    /// it as the retry — `trigger: retry`, the decision's second and last
    /// attempt — unless the subscription or registration was written since.
    /// An entry left by a subscription deleted meanwhile is dropped when a
    /// job of its key next decides.
    pub owed_retries: Mutex<HashMap<(String, String), Attempt>>,
    /// `notifications`: the deliveries a result's events make ride on its write.
    pub sinks: Arc<crate::notify::Sinks>,
    /// Running pipelines by run id, for §12 cancels and run deadlines.
    pub cancels: Arc<Cancels>,
    /// Woken by every watch event that can move a rollout (a subscriber's
    /// result, a given-up record, a registration or rollout write), so the
    /// rollout driver acts on it at once rather than at its next tick.
    pub rollout_wake: Arc<tokio::sync::Notify>,
    /// With a sink told of `fanout.completed`: the completed fan-outs'
    /// markers, so the result that finishes a fan-out carries its event.
    pub fanout_markers: Option<crate::fanout::Markers>,
    /// The store revision of this process's startup list (0 until it is
    /// in): reconcileExisting retries what was given up before it, not
    /// what another process gave up (or a user cancelled) since.
    pub startup_listed_at: std::sync::atomic::AtomicI64,
}

/// How a job ended, for the dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    Done,
    /// Its lock is held by another process: retry from the queue.
    LockBusy,
    /// Its mode's limit is used up: retry from the queue after this long.
    Limited(std::time::Duration),
    /// The store failed it (unreachable, timed out): retry from the queue
    /// after [`STORE_BACKOFF`], so a transient outage loses no work.
    StoreFailed,
    /// Its job lock was lost while it ran (an expired lease) and its result
    /// was not recorded: decide it again from the queue after
    /// [`STORE_BACKOFF`]. Whoever holds the lock now may be running it; if
    /// nobody is, the subscription would otherwise wait for its next write.
    Fenced,
}

/// How long a job that failed on the store waits in the queue before it
/// runs again.
pub const STORE_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a job whose steps ran keeps trying to record the result while
/// the store is unavailable ([`Worker::record_patiently`]), and its first
/// pause between tries (doubling up to [`STORE_BACKOFF`]).
const RECORD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
const RECORD_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// The SyncID a job works toward, readable by the dispatcher if the job panics.
#[derive(Default)]
pub struct SyncNote(Mutex<String>);

impl SyncNote {
    fn set(&self, sync_id: &str) {
        sync_id.clone_into(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
    pub fn get(&self) -> String {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
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

/// What a job found before it took a pool slot ([`Worker::prepare`]).
pub enum Prepared {
    /// Nothing to do: the watch-fed view says so (no store call made).
    Nothing,
    /// Its lock is held by another process: retry from the queue.
    Busy,
    /// Its lock is held (on etcd with the fresh reads that came with it):
    /// it runs in the next free slot.
    Ready(JobGuard),
}

impl Worker {
    /// The part of a job before its slot: the unlocked "anything to do?"
    /// from the view, then the job lock without blocking (on etcd one
    /// transaction that also reads the records the job decides on). A job
    /// whose lock is held elsewhere waits in the queue, not in a slot, and
    /// a slot that frees finds its next job already locked and read.
    pub async fn prepare(&self, key: &JobKey, cause: Cause) -> Prepared {
        let acquired = match key {
            JobKey::Namespace(name) => {
                if !self.view().namespace_inactive(name) {
                    return Prepared::Nothing;
                }
                self.locks.try_lock(key).await
            }
            JobKey::Subscription { namespace, api } => {
                // Unlocked: answered from the view, so an idle reconciler
                // reads, locks and writes nothing.
                if let Decision::Nothing(_) = self.view().decide(namespace, api, cause.startup) {
                    return Prepared::Nothing;
                }
                self.locks.try_lock_and_get(key, &self.repo.job_read_keys(namespace, api)).await
            }
        };
        match acquired {
            Acquired::Held(guard) => Prepared::Ready(guard),
            Acquired::Busy => Prepared::Busy,
        }
    }

    /// Runs one prepared job in slot `lock_id`; its lock is released (or,
    /// on etcd, deleted by the result's own transaction) before it returns.
    pub async fn run(&self, key: &JobKey, cause: Cause, guard: JobGuard, lock_id: usize, note: &SyncNote) -> JobEnd {
        match key {
            JobKey::Namespace(name) => self.activate_namespace(key, name, guard, lock_id).await,
            JobKey::Subscription { namespace, api } => {
                self.ensure_reconciled(key, (namespace, api), cause, guard, lock_id, note).await
            }
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (String, CancellationToken)>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn owed_retries(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Attempt>> {
        self.owed_retries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// §7 supersede: stops every running pipeline of `api` that works toward
    /// another SyncID than `sync_id`. Returns their namespaces (their jobs
    /// must run again toward the new one, first syncs included).
    pub fn supersede(&self, api: &str, sync_id: &str) -> Vec<String> {
        let running = self.running();
        let stale = running.iter().filter(|((_, a), (toward, _))| a == api && toward != sync_id);
        stale
            .map(|((ns, _), (_, superseded))| {
                superseded.cancel();
                ns.clone()
            })
            .collect()
    }

    fn view(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn view_mut(&self) -> std::sync::RwLockWriteGuard<'_, View> {
        self.view.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Activates a namespace still `active: false` (seed, "Initial action").
    async fn activate_namespace(&self, key: &JobKey, name: &str, guard: JobGuard, lock_id: usize) -> JobEnd {
        if let Some(fault) = &self.fault {
            fault(key);
        }
        let span = tracing::info_span!("activate", namespace = %name, lock_id, sync_id = "");
        let end = async {
            match self.repo.activate_namespace(name).await {
                Ok(kayra_catalog::repo::tenancy::Recorded::Written(revision)) => {
                    self.view_mut().put_namespace(name, true, revision);
                    tracing::info!("namespace activated");
                    JobEnd::Done
                }
                Ok(_) => JobEnd::Done,
                Err(e) => {
                    tracing::warn!(error = %e, "namespace activation failed; queued again");
                    JobEnd::StoreFailed
                }
            }
        }
        .instrument(span)
        .await;
        guard.release().await;
        end
    }

    /// `ensureReconciled` for one subscription.
    async fn ensure_reconciled(
        &self,
        key: &JobKey,
        (namespace, api): (&str, &str),
        cause: Cause,
        mut guard: JobGuard,
        lock_id: usize,
        note: &SyncNote,
    ) -> JobEnd {
        // On etcd the fresh read rode in the lock's transaction.
        let prefetched = guard.take_reads();
        let unlocked = AtomicBool::new(false);
        let run = RunIds { lock_id, fencing_token: guard.fencing_token(), fence: guard.fence(), unlocked: &unlocked };
        let end = match self.ensure_locked(key, (namespace, api), cause, run, note, prefetched).await {
            Ok(end) => end,
            Err(e) => {
                tracing::warn!(namespace, api, lock_id, sync_id = %note.get(), error = %e,
                    "reconcile aborted: store error; queued again");
                JobEnd::StoreFailed
            }
        };
        if unlocked.load(Ordering::Relaxed) {
            guard.released_by_txn().await;
        } else {
            guard.release().await;
        }
        end
    }

    async fn ensure_locked(
        &self,
        key: &JobKey,
        (namespace, api): (&str, &str),
        cause: Cause,
        run: RunIds<'_>,
        note: &SyncNote,
        mut prefetched: Option<(Vec<Option<kayra_store::KeyValue>>, kayra_store::Revision)>,
    ) -> kayra_catalog::repo::Result<JobEnd> {
        let lock_id = run.lock_id;
        let mut failures = 0;
        let mut next_trigger = Some(cause.trigger);
        loop {
            if self.cancel.is_cancelled() {
                return Ok(JobEnd::Done);
            }
            let (sub, reg, given_up, read_at, stored_runs, given_up_at) = match prefetched.take() {
                Some((gets, revision)) => fresh(self.repo.decode_job_read(&gets, revision)?),
                None => fresh(self.repo.read_job(namespace, api).await?),
            };
            // A startup trigger retries given-up states unconditionally
            // (seed), but only those its list saw: a state given up or
            // cancelled since (by another process, while this trigger
            // waited for the lock) stands until the next write.
            let startup = cause.startup && given_up_at <= self.startup_listed_at.load(Ordering::SeqCst);
            let owed = self.owed_retries().remove(&(namespace.to_string(), api.to_string()));
            let run = RunIds { fencing_token: run.fencing_token.or(Some(read_at)), ..run };
            // A rollout holds back the ongoing action only: never this
            // decision's immediate retry, nor one a limit held back (§12).
            let held = failures == 0
                && owed.is_none()
                && match (&sub, &reg) {
                    (Some(s), Some(r)) => {
                        decide::holds(&r.value, &s.value, self.view().rollout(api).map(|(rollout, _)| rollout))
                    }
                    _ => false,
                };
            let observed = Observed {
                subscription: sub.as_ref().map(|s| (&s.value, s.revision)),
                registration: reg.as_ref().map(|r| (&r.value, r.revision)),
                given_up: given_up.as_ref(),
                held,
            };
            let (Decision::Reconcile { sync_id, .. }, Some(sub), Some(reg)) =
                (decide::decide(&observed, startup), &sub, &reg)
            else {
                return Ok(JobEnd::Done);
            };
            note.set(&sync_id);
            // The retry a limit held back, still of the same state: run now
            // as the decision's second attempt, whatever queued the key.
            if failures == 0 && owed.is_some_and(|a| decide::gave_up_on(&a, &sub.value, sub.revision, reg.revision)) {
                failures = 1;
                next_trigger = Some(RunTrigger::Retry);
            }
            // §7 limits: never waited on here; a used-up limit sends the job
            // back to the queue (the immediate retry is a start too).
            let acquired = match self.config.resolve_mode(&reg.value.mode) {
                Some(mode) => self.limits.try_acquire(mode, namespace).await.map(|got| got.map(Some)),
                None => Ok(Ok(None)),
            };
            if failures > 0 && !matches!(acquired, Ok(Ok(_))) {
                let state = Attempt {
                    subscription_revision: sub.revision,
                    registration_revision: reg.revision,
                    cancelled: false,
                };
                self.owed_retries().insert((namespace.to_string(), api.to_string()), state);
            }
            let _permit = match acquired.map_err(kayra_catalog::repo::Error::from)? {
                Ok(permit) => permit,
                Err(wait) => return Ok(JobEnd::Limited(wait)),
            };
            if let Some(fault) = &self.fault {
                fault(key);
            }
            // After a write to the subscription raced this job, the fresh
            // record says what that write was.
            let trigger = next_trigger.unwrap_or_else(|| written_trigger(&sub.value));
            let begun = Begun::new(trigger);
            let history = History::read(&self.repo, (namespace, api), stored_runs, self.config.run_history).await?;
            // One span per attempt, instrumenting (never entered across an
            // await), so every line inside carries all five fields.
            let span =
                tracing::info_span!("reconcile", namespace, api, lock_id, sync_id = %sync_id, run_id = %begun.id);
            match self.attempt(sub, reg, failures, run, &begun, &history).instrument(span).await? {
                Step::Done => return Ok(JobEnd::Done),
                Step::Fenced => return Ok(JobEnd::Fenced),
                Step::Again { failures: f, trigger } => {
                    failures = f;
                    next_trigger = trigger;
                }
            }
        }
    }

    /// One reconcile of `sub` toward `reg`, and its recorded result.
    async fn attempt(
        &self,
        sub: &Versioned<Subscription>,
        reg: &Versioned<ApiRegistration>,
        failures: u32,
        run: RunIds<'_>,
        begun: &Begun,
        history: &History,
    ) -> kayra_catalog::repo::Result<Step> {
        let sync_id = &reg.value.sync_id;
        let started = Instant::now();
        let in_flight = InFlight::enter();
        let (result, mode, steps, stopped) = self.reconcile(&reg.value, &sub.value, run, &begun.id).await;
        drop(in_flight);
        metrics::histogram!(super::METRIC_DURATION).record(started.elapsed().as_secs_f64());
        let outcome = match (&result, &stopped) {
            (Ok(()), _) => Outcome::Succeeded,
            // §12: a cancel leaves the subscription as it was and waits for
            // the next trigger; a deadline is an ordinary failure.
            (Err(ReconcileError::Pipeline(PipelineError::Stopped)), Some(Stop::Cancel(_))) => Outcome::Cancelled,
            (Err(ReconcileError::Pipeline(PipelineError::Stopped)), _) => Outcome::Failed,
            (Err(ReconcileError::Pipeline(PipelineError::Cancelled)), _) => Outcome::Cancelled,
            (Err(ReconcileError::Pipeline(PipelineError::Superseded)), _) => Outcome::Superseded,
            (Err(_), _) => Outcome::Failed,
        };
        // What the run's `error` says: the stop's cause, when it stopped the run.
        let error = match (&result, &stopped) {
            (Ok(()), _) => String::new(),
            (Err(ReconcileError::Pipeline(PipelineError::Stopped)), Some(why)) => why.message(),
            (Err(e), _) => e.to_string(),
        };
        let label = match outcome {
            Outcome::Succeeded => "success",
            Outcome::Failed => "error",
            Outcome::Cancelled => "cancelled",
            Outcome::Superseded => "superseded",
        };
        metrics::counter!(super::METRIC_RECONCILES, "result" => label).increment(1);
        match &result {
            Err(ReconcileError::Pipeline(PipelineError::Stopped)) if outcome == Outcome::Cancelled => {
                tracing::info!(result = "cancelled", error = %shown(&error), "run cancelled");
            }
            Err(ReconcileError::Pipeline(PipelineError::Cancelled)) => {
                tracing::info!("reconcile stopped between steps: shutting down");
            }
            Err(ReconcileError::Pipeline(PipelineError::Superseded)) => {
                tracing::info!(
                    result = "superseded",
                    "reconcile superseded by a newer SyncID; running again toward it"
                );
            }
            Err(_) => {
                tracing::warn!(result = "error", attempt = failures + 1, error = %shown(&error), "reconcile failed")
            }
            Ok(()) => {}
        }
        let (mut write, mut then) = decide::after(&sub.value, sync_id, outcome, failures);
        let record = Run {
            id: begun.id.clone(),
            namespace: sub.value.namespace.clone(),
            api: sub.value.api.clone(),
            sync_id: sync_id.clone(),
            mode,
            trigger: begun.trigger,
            result: match outcome {
                Outcome::Succeeded => RunResult::Success,
                Outcome::Failed => RunResult::Error,
                Outcome::Cancelled => RunResult::Cancelled,
                Outcome::Superseded => RunResult::Superseded,
            },
            error: shown(&error).into_owned(),
            started_at: begun.started_at.clone(),
            finished_at: runs::now(),
            lock_id: run.lock_id,
            reconciler: runs::identity().to_string(),
            steps,
        }
        .bounded();
        // A user's cancel (§12): the state is recorded as cancelled under
        // the lock, so no other process's queued trigger runs it again.
        let user_cancelled = outcome == Outcome::Cancelled && matches!(stopped, Some(Stop::Cancel(_)));
        // Nothing follows a final result under this lock: the result's
        // transaction is also the unlock.
        let unlock = matches!(then, Then::Done) && !user_cancelled;
        // The answer to the cancel request that stopped the run (or came
        // too late to), carried back by the result's own transaction.
        let answer = match &stopped {
            Some(Stop::Cancel(request)) => Some(request.answered(&record)),
            _ => None,
        };
        let result = (&record, history, answer.as_ref());
        let recorded = match self.record_patiently(sub, (&write, then, &reg.value), result, run, unlock).await {
            // §17: a result the store refuses (too large, out of space) is
            // recorded once as a failed run without its outputs, and the
            // ordinary failure path follows; it never loops.
            Err(kayra_catalog::repo::Error::Store(kayra_store::Error::Refused(why))) => {
                tracing::warn!(error = %shown(&why), "the store refused the result; recording the run as failed");
                (write, then) = decide::after(&sub.value, sync_id, Outcome::Failed, failures);
                let failed = runs::refused(&record, &why);
                let result = (&failed, history, None);
                match self
                    .record_patiently(sub, (&write, then, &reg.value), result, run, matches!(then, Then::Done))
                    .await
                {
                    Err(kayra_catalog::repo::Error::Store(kayra_store::Error::Refused(why))) => {
                        // Not even that fits: the store is full. Running
                        // the pipeline again would only repeat this, so the
                        // job waits, as given up, for the next write.
                        tracing::error!(
                            error = %shown(&why),
                            "the store refused the failed run too; giving up until the subscription or its \
                             registration is written again"
                        );
                        let attempt = Attempt {
                            subscription_revision: sub.revision,
                            registration_revision: reg.revision,
                            cancelled: false,
                        };
                        self.view_mut().put_given_up(&sub.value.namespace, &sub.value.api, attempt);
                        return Ok(Step::Done);
                    }
                    other => other?,
                }
            }
            other => other?,
        };
        let after = match recorded {
            Recorded::Fenced => {
                tracing::warn!(
                    "job lock lost during the reconcile (lease expired?); its result is not recorded, \
                     and the job is queued again"
                );
                return Ok(Step::Fenced);
            }
            Recorded::Stale => {
                tracing::info!("subscription changed during reconcile; deciding again");
                return Ok(Step::Again { failures: 0, trigger: None });
            }
            Recorded::Written(next, revision) => {
                // This job's own write goes into the view, so a job run
                // again right after it does not wait for the watch's echo.
                self.view_mut().put_subscription(next, revision);
                revision
            }
            Recorded::Unchanged => sub.revision,
        };
        if let Write::Success { .. } = write {
            if let Some(lag) = runs::sync_lag(&reg.value) {
                metrics::histogram!(super::METRIC_SYNC_LAG).record(lag);
            }
            let what = if sub.value.active { "subscription reconciled" } else { "subscription activated" };
            tracing::info!(result = "success", "{what}");
        }
        if user_cancelled {
            let attempt =
                Attempt { subscription_revision: after, registration_revision: reg.revision, cancelled: true };
            self.record_given_up(&sub.value.namespace, &sub.value.api, &attempt).await?;
            tracing::info!("cancelled: waiting for the next write to the subscription or its registration");
            return Ok(Step::Done);
        }
        match then {
            Then::Done => Ok(Step::Done),
            Then::RetryNow => {
                tracing::info!("retrying once right away");
                Ok(Step::Again { failures: failures + 1, trigger: Some(RunTrigger::Retry) })
            }
            Then::GiveUp => {
                let attempt =
                    Attempt { subscription_revision: after, registration_revision: reg.revision, cancelled: false };
                self.record_given_up(&sub.value.namespace, &sub.value.api, &attempt).await?;
                tracing::warn!("giving up until the subscription or its registration is written again");
                Ok(Step::Done)
            }
        }
    }

    /// [`Worker::record`], tried again while the store is unavailable (an
    /// etcd election, a member's loss), so that an outage does not throw
    /// away a reconcile whose steps already ran: the job still holds its
    /// lock, and the write's guards (the subscription's revision, the
    /// fence) make every retry safe. Gives up after [`RECORD_PATIENCE`] or
    /// at shutdown, leaving the job to the queue, which decides it again
    /// from a fresh read. A failed attempt's outcome may be unknown (it may
    /// have committed, unlock included), so a later attempt that finds the
    /// lock gone may be looking at its own earlier commit: as any fenced
    /// job, it goes back to the queue and finds that out from a fresh read.
    async fn record_patiently(
        &self,
        seen: &Versioned<Subscription>,
        write: (&Write, Then, &ApiRegistration),
        result: (&Run, &History, Option<&CancelRequest>),
        run: RunIds<'_>,
        unlock: bool,
    ) -> kayra_catalog::repo::Result<Recorded> {
        let started = Instant::now();
        let mut pause = RECORD_RETRY_PAUSE;
        let unavailable = |message: String| kayra_catalog::repo::Error::Store(kayra_store::Error::Unavailable(message));
        loop {
            match self.record(seen, write, result, run, unlock).await {
                Err(kayra_catalog::repo::Error::Store(kayra_store::Error::Unavailable(message))) => {
                    if started.elapsed() + pause > RECORD_PATIENCE {
                        return Err(unavailable(message));
                    }
                    tracing::warn!(error = %message, "could not record the result; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = self.cancel.cancelled() => return Err(unavailable(message)),
                    }
                    pause = (pause * 2).min(STORE_BACKOFF);
                }
                other => return other,
            }
        }
    }

    /// Writes the result and its run record (`run`, added to the run
    /// history as the job read it) in one transaction that commits only if
    /// the subscription is still at the revision the decision was made on
    /// and, on etcd, the job lock is still ours (fencing, platform contract
    /// §7). When only the run is new (a second failure, a superseded run)
    /// the subscription is not rewritten, so its watchers see no event. With `unlock`, the
    /// transaction also deletes the lock key (etcd), and `run.unlocked`
    /// says whether it did. The results of jobs finishing together share
    /// one transaction (group commit, [`kayra_store::Store::txn_grouped`]).
    /// The deliveries of the notifications the result causes (§14) ride on
    /// the same transaction: stored with it, or not at all.
    async fn record(
        &self,
        seen: &Versioned<Subscription>,
        (write, then, reg): (&Write, Then, &ApiRegistration),
        (record, read, answer): (&Run, &History, Option<&CancelRequest>),
        run: RunIds<'_>,
        unlock: bool,
    ) -> kayra_catalog::repo::Result<Recorded> {
        let fence = run.fence;
        let history = self.config.run_history;
        let next = written(&seen.value, write).filter(|next| *next != seen.value);
        let ring = runs::recorded(history, read, record);
        let mut riders: Vec<Rider<'_>> = ring.iter().map(|ring| runs::rider(record, ring, read)).collect();
        let deliveries = self.deliveries(&seen.value, write, then, record);
        riders.extend(deliveries.iter().map(Rider::Delivery));
        riders.extend(answer.map(Rider::CancelAnswer));
        if next.is_none() && riders.is_empty() {
            return Ok(Recorded::Unchanged);
        }
        // The fan-out this result finishes, if the view says it is the
        // last: its marker and its event's deliveries ride on the result.
        let fanout = self.finishes_fanout(&seen.value, write, then, reg);
        let plain = riders.len();
        if let Some(done) = &fanout {
            riders.extend(done.deliveries.iter().map(Rider::Delivery));
        }
        // run_history 0: older runs go at the next write.
        let mut write = ResultWrite {
            seen,
            next: next.as_ref(),
            clear_runs: history == 0,
            lock: fence,
            unlock,
            fanout: fanout.as_ref().map(|done| FanoutWrite {
                api: &seen.value.api,
                seen: done.seen,
                marker: &done.marker,
            }),
        };
        let mut commit = self.repo.write_result(&write, &riders).await?;
        if commit == ResultCommit::MarkerMoved {
            // Another writer recorded the fan-out first: the result alone.
            write.fanout = None;
            riders.truncate(plain);
            commit = self.repo.write_result(&write, &riders).await?;
        } else if let (ResultCommit::Committed(_), Some(done)) = (&commit, &fanout) {
            tracing::info!(sync_id = %done.marker.sync_id, event_id = %done.event.id,
                "fan-out completed with this result");
        }
        if matches!(commit, ResultCommit::Committed(_)) && unlock && fence.is_some() {
            run.unlocked.store(true, Ordering::Relaxed);
        }
        Ok(match commit {
            ResultCommit::Committed(revision) => {
                next.map_or(Recorded::Unchanged, |next| Recorded::Written(next, revision))
            }
            ResultCommit::Fenced => Recorded::Fenced,
            ResultCommit::Stale | ResultCommit::MarkerMoved => Recorded::Stale,
        })
    }

    /// The fan-out completion (§14 `fanout.completed`) a result finishes,
    /// when it leaves its subscription done with `reg`'s SyncID (synced to
    /// it, or given up on) and the view shows every other subscriber done
    /// ([`crate::fanout::last_result`]).
    fn finishes_fanout(
        &self,
        sub: &Subscription,
        write: &Write,
        then: Then,
        reg: &ApiRegistration,
    ) -> Option<crate::fanout::Completion> {
        let markers = self.fanout_markers.as_ref()?;
        let synced = match (write, then) {
            (Write::Success { sync_id }, Then::Done) if *sync_id == reg.sync_id => true,
            (_, Then::GiveUp) => false,
            _ => return None,
        };
        let view = self.view.read().unwrap_or_else(PoisonError::into_inner);
        let layout = self.repo.layout();
        crate::fanout::last_result(&view, (layout, markers), &self.sinks, reg, &sub.namespace, synced)
    }

    /// The deliveries of the events (§14) a result causes, for every sink
    /// that wants them: `subscription.activated` on the first success,
    /// `subscription.recovered` on a success while `state: error`,
    /// `subscription.failed` on the write that gives a decision up (once
    /// per decision, never per run). Their ids come from the run's, so a
    /// result written again writes the same records.
    fn deliveries(
        &self,
        sub: &Subscription,
        write: &Write,
        then: Then,
        run: &Run,
    ) -> Vec<kayra_core::notifications::Delivery> {
        use kayra_core::notifications::{SUBSCRIPTION_ACTIVATED, SUBSCRIPTION_FAILED, SUBSCRIPTION_RECOVERED};
        if self.sinks.is_empty() {
            return Vec::new();
        }
        let mut events = Vec::new();
        if let Write::Success { sync_id } = write {
            if !sub.active {
                events.push((SUBSCRIPTION_ACTIVATED, format!("subscription activated at {sync_id}"), json!({})));
            }
            if sub.state == kayra_core::SubscriptionState::Error {
                events.push((SUBSCRIPTION_RECOVERED, format!("subscription recovered at {sync_id}"), json!({})));
            }
        }
        if then == Then::GiveUp {
            let message = format!(
                "reconcile toward {} failed and its retry too; waiting for the next write: {}",
                run.sync_id, run.error
            );
            events.push((SUBSCRIPTION_FAILED, message, json!({ "error": run.error })));
        }
        let mut deliveries = Vec::new();
        for (kind, message, mut data) in events {
            if !self.sinks.wants(kind, &run.api) {
                continue;
            }
            data["trigger"] = json!(run.trigger);
            data["mode"] = json!(run.mode);
            let event = kayra_core::notifications::Event {
                id: kayra_core::notifications::Event::id_of_run(&run.id, kind),
                kind: kind.to_string(),
                time: run.finished_at.clone(),
                api: run.api.clone(),
                namespace: run.namespace.clone(),
                sync_id: run.sync_id.clone(),
                run_id: run.id.clone(),
                message: shown(&message).into_owned(),
                data,
            };
            deliveries.extend(self.sinks.deliveries(&event));
        }
        deliveries
    }

    /// reconcile(reg): run the mode's pipeline, or the placeholder; with
    /// why the run was stopped, if it was (§12: a cancel, its deadline).
    async fn reconcile(
        &self,
        reg: &ApiRegistration,
        sub: &Subscription,
        run: RunIds<'_>,
        run_id: &str,
    ) -> (Result<(), ReconcileError>, String, Vec<RunStep>, Option<Stop>) {
        let Some(mode) = self.config.resolve_mode(&reg.mode) else {
            return (Err(ReconcileError::NoMode(reg.name.clone())), String::new(), Vec::new(), None);
        };
        let Some(pipeline) = self.pipelines.get(mode) else {
            tracing::info!(mode, "mode has no steps configured: placeholder reconcile succeeds");
            return (Ok(()), mode.to_string(), Vec::new(), None);
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
            lock_id: run.lock_id,
            run_id: run_id.to_string(),
            fencing_token: run.fencing_token.unwrap_or_default(),
        };
        let stop = self.cancels.enter(run_id, &sub.namespace, &sub.api);
        let control = RunControl { stop: stop.token.clone(), ..RunControl::new(self.cancel.clone()) };
        let job = (sub.namespace.clone(), sub.api.clone());
        let running =
            self.config.supersede.then(|| Running::enter(&self.running, job, &reg.sync_id, &control.superseded));
        let settings = self.pipelines.settings();
        let pipeline_run = pipeline.run(&self.client, &ctx, &settings, &control);
        let report = match self.config.limits.get(mode).and_then(kayra_config::ModeLimits::run_timeout) {
            None => pipeline_run.await,
            Some(limit) => {
                let mut pipeline_run = std::pin::pin!(pipeline_run);
                tokio::select! {
                    report = &mut pipeline_run => report,
                    () = tokio::time::sleep(limit) => {
                        stop.stop(Stop::Deadline(limit));
                        pipeline_run.await
                    }
                }
            }
        };
        drop(running);
        let stopped = stop.cause();
        drop(stop);
        if let Some(retry_after) = report.retry_after
            && let Err(e) =
                self.limits.backoff(mode, retry_after, HoldCause { api: &reg.name, namespace: &sub.namespace }).await
        {
            tracing::warn!(mode, error = %e, "could not record the backend's Retry-After");
        }
        (report.result.map_err(ReconcileError::from), mode.to_string(), report.steps, stopped)
    }

    async fn record_given_up(&self, namespace: &str, api: &str, attempt: &Attempt) -> kayra_catalog::repo::Result<()> {
        let record = RecordRef::Attempt { namespace, api };
        loop {
            let result = match self.repo.get::<Attempt>(record).await? {
                Some(old) if old.value == *attempt => break,
                Some(old) => self.repo.update(record, attempt, old.revision, "reconcile attempt").await,
                None => self.repo.create(record, attempt, "reconcile attempt").await,
            };
            match result {
                Ok(_) => break,
                Err(kayra_catalog::repo::Error::Conflict(_) | kayra_catalog::repo::Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        self.view_mut().put_given_up(namespace, api, *attempt);
        Ok(())
    }
}

/// The subscription as `write` leaves it (seed: `Repository.ActivateSubscription`
/// / `SetSubscriptionSyncID`; §7 `state: error`, everything else unchanged).
fn written(sub: &Subscription, write: &Write) -> Option<Subscription> {
    let mut next = sub.clone();
    // A result is no re-sync request: its echo must not read as one.
    next.resync_requested = false;
    match write {
        Write::Success { sync_id } => {
            next.active = true;
            next.state = kayra_core::SubscriptionState::Success;
            next.current_sync_id.clone_from(sync_id);
        }
        Write::Error => next.state = kayra_core::SubscriptionState::Error,
        Write::Nothing => return None,
    }
    Some(next)
}

/// Forgets the given-up record of a deleted subscription.
pub async fn forget_given_up(repo: &Repository, namespace: &str, api: &str) {
    match repo.delete(RecordRef::Attempt { namespace, api }, None, "reconcile attempt").await {
        Ok(_) | Err(kayra_catalog::repo::Error::NotFound(_)) => {}
        Err(e) => {
            tracing::warn!(namespace, api, error = %e, "could not remove a deleted subscription's attempt record")
        }
    }
}

/// The fresh read as the job decides on it.
fn fresh(read: JobRead<Attempt>) -> Fresh {
    (read.subscription, read.registration, read.attempt, read.revision, read.runs, read.attempt_revision)
}

/// The fresh read: subscription, registration, given-up record, the read's
/// store revision and the subscription's run history.
type Fresh = (
    Option<Versioned<Subscription>>,
    Option<Versioned<ApiRegistration>>,
    Option<Attempt>,
    kayra_store::Revision,
    Option<RunRing>,
    kayra_store::Revision,
);

/// The trigger of a run caused by a write to the subscription itself: the
/// `/sync` reset (which marks the record it writes) or any other write.
fn written_trigger(sub: &Subscription) -> RunTrigger {
    if sub.resync_requested { RunTrigger::Resync } else { RunTrigger::Initial }
}

/// What identifies one run to the backend, in logs and to the store.
#[derive(Debug, Clone, Copy)]
struct RunIds<'a> {
    lock_id: usize,
    /// The lock key's create revision (etcd). Without a distributed lock
    /// the fresh read's store revision stands in: it is read right after
    /// the in-process lock was taken, and grows just the same.
    fencing_token: Option<kayra_store::Revision>,
    /// The job lock (etcd): results commit only while its key exists.
    fence: Option<&'a kayra_store::JobLock>,
    /// Set when a result transaction also deleted the lock key.
    unlocked: &'a AtomicBool,
}

/// What a fenced result write did.
enum Recorded {
    /// The subscription was rewritten, to this, at this revision.
    Written(Subscription, kayra_store::Revision),
    Unchanged,
    /// The subscription changed since it was read: decide again.
    Stale,
    /// The job lock is no longer ours (the lease expired, another process
    /// took the job): nothing was written.
    Fenced,
}

/// What [`Worker::attempt`] leaves to do.
enum Step {
    Done,
    /// The job lock was lost: nothing was recorded.
    Fenced,
    /// Read the records fresh and decide again, with this many failures so
    /// far, as a run with this trigger (`None`: from the fresh record).
    Again {
        failures: u32,
        trigger: Option<RunTrigger>,
    },
}

/// `kayra_reconciles_in_flight` counts a reconcile while this lives: a
/// pipeline that panics or is dropped leaves the gauge right.
struct InFlight(());

impl InFlight {
    fn enter() -> Self {
        metrics::gauge!(super::METRIC_IN_FLIGHT).increment(1.0);
        Self(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(super::METRIC_IN_FLIGHT).decrement(1.0);
    }
}

/// Running pipelines: (namespace, api) → (the SyncID worked toward, its
/// `RunControl.superseded`).
pub type RunningMap = Mutex<HashMap<(String, String), (String, CancellationToken)>>;

/// A running pipeline's entry in [`Worker::running`] (what §7 supersede
/// cancels), removed when this is dropped, however the pipeline ended.
struct Running<'m> {
    map: &'m RunningMap,
    job: (String, String),
}

impl<'m> Running<'m> {
    fn enter(map: &'m RunningMap, job: (String, String), sync_id: &str, superseded: &CancellationToken) -> Self {
        let entry = (sync_id.to_string(), superseded.clone());
        map.lock().unwrap_or_else(PoisonError::into_inner).insert(job.clone(), entry);
        Self { map, job }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_that_panics_leaves_no_running_entry() {
        let map = RunningMap::default();
        let token = CancellationToken::new();
        let job = ("core".to_string(), "compute.example.com".to_string());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _running = Running::enter(&map, job.clone(), "s1", &token);
            assert_eq!(map.lock().unwrap().get(&job).map(|(s, _)| s.as_str()), Some("s1"));
            panic!("the pipeline panicked");
        }));
        assert!(panicked.is_err());
        assert!(map.lock().unwrap().is_empty(), "the entry went with the panic");
    }
}
