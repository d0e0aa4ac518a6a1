//! The HTTP step pipeline: reconcile's real implementation once
//! `reconciler.mode.<mode>` is configured (seed, "HTTP step pipeline").
//!
//! A mode is a list of plain HTTP calls run in order. Each step's endpoint,
//! header values and every string inside its `data` are Go templates over
//! the subscription and the previous step's outputs; the answer's JSON body
//! feeds `outputs` (for the next step) and `wait` (polling until a status
//! field resolves). A failed non-async step aborts the run, so the
//! reconciler never advances a subscription whose backend did not confirm.
//!
//! Everything that can be checked without a backend is checked once, by
//! [`Pipelines::compile`] at startup: templates are parsed, methods,
//! header names, URLs and dot paths validated. A broken config stops the
//! process with a message naming mode, step and field, instead of failing
//! every reconcile later.
//!
//! # Logging
//!
//! Each step writes exactly one event when it finishes, win or lose, with
//! `step` (0-based index), `method`, `endpoint` (rendered), `async`,
//! `attempts`, `status` and/or `error`, and `outputs` (compact JSON), and
//! returns the same facts as a [`RunStep`] for the run record (platform
//! §4.4). The reconciler runs [`Pipeline::run`] inside its reconcile span,
//! but every event here also carries `lock_id`, `sync_id` and `run_id`
//! itself, so the contract's rule ("a line with `step` has `lock_id` and
//! `sync_id`") holds whatever a formatter does with span fields.
//!
//! Header values and request bodies are never logged, recorded or put in an
//! error: they are where tokens live. The endpoint is shown without user
//! info, and as `<redacted>` when it contains a secret's value; an output
//! that the next step's headers read, or that contains a secret's value, is
//! shown as `<redacted>` (platform §2, §8). See `secrets`.
//!
//! # Stopping early
//!
//! A run checks its [`RunControl`] before each step: shutdown stops it with
//! [`PipelineError::Cancelled`], a newer SyncID with
//! [`PipelineError::Superseded`], a stop of the run itself (a cancel, the
//! run's deadline: platform §12) with [`PipelineError::Stopped`]. A newer
//! SyncID also ends a `wait` step's pause between two polls at once. A stop
//! ends whatever the run is doing at once: the call in flight is dropped,
//! a `wait` polls no more, an async step stops waiting for its
//! acknowledgement; the step still gets its record and log line. Otherwise
//! the call in flight is never interrupted
//! (platform §7: in-flight reconciles finish), so a step's outcome and log
//! line are always complete; for the same reason shutdown does not cut a
//! `wait` short, and a step still polling holds shutdown until it resolves
//! or its `timeout` elapses. An async step's detached request is tied to
//! neither; it ends with its own timeout, when `max_detached_requests`
//! abandons it, or when the runtime shuts down.
//!
//! # Layout
//! - this file: the public handle ([`Pipelines`], [`Pipeline::run`]), run
//!   records and logging.
//! - `step`: one compiled step; awaited, polled and async execution.
//! - `render`: [`Pipeline::render`], what a run would send, for `kayra render`.
//! - `template`: Go templates via `gotmpl`; rendering `data` recursively; `secret`.
//! - `secrets`: reading `reconciler.secrets` per run; redaction.
//! - `detached`: async requests that outlive their step, bounded.
//! - `limits`: [`Limits`], `reconciler.limits` per mode (local and fleet-wide).
//! - `dotpath`: `.a.b[0]` paths into a JSON body.
//! - `http`: the shared client, one request attempt, redaction.
//! - `error`: [`ValidationError`], [`PipelineError`].

mod detached;
mod dotpath;
mod error;
mod gate;
mod http;
mod limits;
mod render;
mod secrets;
mod step;
mod template;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kayra_config::ReconcilerConfig;
use kayra_core::RunStep;
use kayra_core::runs::shown;
use tokio_util::sync::CancellationToken;

pub use error::{PipelineError, ValidationError};
pub use gate::Gate;
pub use http::{MAX_RETRY_AFTER, http_client};
pub use limits::{HoldCause, LimitKey, LimitKeys, LimitPermit, Limits};
pub use render::{RenderedStep, format_rendered};
pub use secrets::{REDACTED, read_source as read_secret};
pub use template::RolloutContext;

use detached::DetachedRequests;
use secrets::{Redactor, SecretSources};
use step::{CompiledStep, Outcome, StepEnv};
use template::Scope;

/// What the templates see as `.Subscription` and `.Run`, plus the slot
/// running it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriptionContext {
    /// The registration's long name (`.Subscription.Api`).
    pub api: String,
    /// Empty when the registration has none.
    pub short_name: String,
    pub namespace: String,
    pub platform: String,
    pub region: String,
    pub current_sync_id: String,
    /// The registration's SyncID being reconciled toward; logged as `sync_id`.
    pub expected_sync_id: String,
    /// The concurrency slot running this reconcile; logged on every step
    /// line, not visible to templates.
    pub lock_id: usize,
    /// The run's id (`.Run.ID`, logged as `run_id`): an idempotency key for
    /// backends. Not a secret.
    pub run_id: String,
    /// Grows each time any process takes this job's lock
    /// (`.Run.FencingToken`, platform §7). Not a secret.
    pub fencing_token: i64,
}

/// The timing knobs of `reconciler` that apply to every mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSettings {
    /// How long an async step waits for an answer (seed: `AsyncStepAckTimeout`).
    pub async_ack_timeout: Duration,
    /// Pause between two calls of a `wait` step (seed: `WaitPollInterval`).
    pub wait_poll_interval: Duration,
    /// The longest output value a step may take (`reconciler.max_output_bytes`).
    pub max_output_bytes: usize,
}

impl Default for PipelineSettings {
    fn default() -> Self {
        Self {
            async_ack_timeout: kayra_config::ASYNC_STEP_ACK_TIMEOUT,
            wait_poll_interval: kayra_config::WAIT_POLL_INTERVAL,
            max_output_bytes: kayra_config::DEFAULT_MAX_OUTPUT_BYTES,
        }
    }
}

impl From<&ReconcilerConfig> for PipelineSettings {
    fn from(cfg: &ReconcilerConfig) -> Self {
        Self {
            async_ack_timeout: cfg.async_ack_timeout.0,
            wait_poll_interval: cfg.wait_poll_interval.0,
            max_output_bytes: cfg.max_output_bytes,
        }
    }
}

/// What may stop a run before its last step (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct RunControl {
    /// The process is shutting down: checked between steps.
    pub shutdown: CancellationToken,
    /// The subscription's expected SyncID moved past this run's: checked
    /// between steps and during every pause between `wait` polls.
    pub superseded: CancellationToken,
    /// The run itself is stopped (a cancel, its deadline: platform §12):
    /// checked between steps, and it ends at once the call in flight
    /// (dropped), a `wait`'s pause and an async step's acknowledgement wait.
    pub stop: CancellationToken,
}

impl RunControl {
    /// A control that only shutdown can stop.
    pub fn new(shutdown: CancellationToken) -> Self {
        Self { shutdown, superseded: CancellationToken::new(), stop: CancellationToken::new() }
    }
}

/// How a run went.
#[derive(Debug)]
pub struct PipelineReport {
    /// `Ok` when every non-async step succeeded.
    pub result: Result<(), PipelineError>,
    /// One entry per step called, in order, redacted as platform §2/§8 say.
    pub steps: Vec<RunStep>,
    /// Set when a step was answered 429 with a `Retry-After` (the longest,
    /// if several): no new run of this mode should start before it passes.
    pub retry_after: Option<Duration>,
}

/// Every configured mode, compiled once at startup.
#[derive(Debug)]
pub struct Pipelines {
    modes: BTreeMap<String, Pipeline>,
    settings: PipelineSettings,
    detached: Arc<DetachedRequests>,
}

impl Pipelines {
    /// Compiles every mode of `reconciler.mode`: parses every template and
    /// checks methods, header names, literal endpoints, dot paths and secret
    /// names. The error names mode, step index and field, e.g.
    /// `reconciler.mode.api[1].headers.Authorization: template: 1:7: unclosed action`.
    pub fn compile(cfg: &ReconcilerConfig) -> Result<Self, ValidationError> {
        let sources = Arc::new(SecretSources::new(&cfg.secrets));
        let detached = DetachedRequests::new(cfg.max_detached_requests);
        let mut modes = BTreeMap::new();
        for (mode, steps) in &cfg.mode {
            let mut compiled = Vec::with_capacity(steps.len());
            for (index, step) in steps.iter().enumerate() {
                let key = |field: &str| format!("reconciler.mode.{mode}[{index}].{field}");
                let step_compiled = CompiledStep::compile(index, step)
                    .map_err(|(field, message)| ValidationError { key: key(&field), message })?;
                for text in step_compiled.texts() {
                    if let Some(name) = text.secrets().iter().find(|name| !sources.contains(name)) {
                        return Err(ValidationError {
                            key: key(text.field()),
                            message: format!("unknown secret {name:?}; define it under reconciler.secrets"),
                        });
                    }
                }
                if step.is_async && !step.wait.is_empty() {
                    tracing::warn!(key = %key("wait"), "wait is ignored on an async step");
                }
                compiled.push(step_compiled);
            }
            // Outputs reach the next step only; those its headers read are
            // shown redacted.
            for i in 1..compiled.len() {
                compiled[i - 1].outputs_in_headers = compiled[i].header_outputs();
            }
            // An empty list is "no steps configured": the mode keeps the
            // placeholder behaviour (seed, "Reconcile"), so it gets no pipeline.
            if !compiled.is_empty() {
                let secrets = compiled.iter().flat_map(CompiledStep::secrets).collect();
                let pipeline = Pipeline {
                    mode: mode.clone(),
                    steps: compiled,
                    secrets,
                    sources: sources.clone(),
                    detached: detached.clone(),
                };
                modes.insert(mode.clone(), pipeline);
            }
        }
        Ok(Self { modes, settings: PipelineSettings::from(cfg), detached })
    }

    /// The pipeline of `mode`; `None` when the mode has no steps configured,
    /// in which case reconcile falls back to the log-only placeholder.
    pub fn get(&self, mode: &str) -> Option<&Pipeline> {
        self.modes.get(mode)
    }

    /// The configured `async_ack_timeout` and `wait_poll_interval`.
    pub fn settings(&self) -> PipelineSettings {
        self.settings
    }

    /// The names of the modes that have a pipeline, sorted.
    pub fn modes(&self) -> impl Iterator<Item = &str> {
        self.modes.keys().map(String::as_str)
    }

    /// Async requests of this process still open after their step's ack
    /// (at most `reconciler.max_detached_requests`).
    pub fn detached_requests(&self) -> usize {
        self.detached.open()
    }
}

/// One mode's steps.
pub struct Pipeline {
    mode: String,
    steps: Vec<CompiledStep>,
    /// Every secret name the steps read.
    secrets: BTreeSet<String>,
    sources: Arc<SecretSources>,
    detached: Arc<DetachedRequests>,
}

impl Pipeline {
    pub fn mode(&self) -> &str {
        &self.mode
    }

    /// The number of steps (never zero).
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Always false: modes without steps get no pipeline.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Runs every step in order for one subscription.
    ///
    /// The secrets the steps use are read first; one that cannot be read
    /// fails the run before any call. `Ok` when every non-async step
    /// succeeded (async steps' failures are logged and ignored). The first
    /// failing non-async step ends the run with its error; the steps after
    /// it are not called.
    pub async fn run(
        &self,
        client: &reqwest::Client,
        ctx: &SubscriptionContext,
        settings: &PipelineSettings,
        control: &RunControl,
    ) -> PipelineReport {
        let mut report = PipelineReport { result: Ok(()), steps: Vec::new(), retry_after: None };
        let secrets = match self.sources.read(&self.secrets).await {
            Ok(secrets) => secrets,
            Err(error) => {
                tracing::warn!(
                    lock_id = ctx.lock_id,
                    sync_id = %ctx.expected_sync_id,
                    run_id = %ctx.run_id,
                    error = %error,
                    "pipeline not started: a secret could not be read"
                );
                report.result = Err(error);
                return report;
            }
        };
        let redactor = Redactor::new(&secrets);
        let secrets = secrets.into_shared();
        let env = StepEnv { client, ctx, settings, control, redactor: &redactor, detached: &self.detached };
        let mut previous_outputs = BTreeMap::new();
        for step in &self.steps {
            let stop = if control.shutdown.is_cancelled() {
                Some((PipelineError::Cancelled, "shutdown: pipeline stops before this step"))
            } else if control.stop.is_cancelled() {
                Some((PipelineError::Stopped, "run stopped: pipeline stops before this step"))
            } else if control.superseded.is_cancelled() {
                Some((PipelineError::Superseded, "superseded by a newer SyncID: pipeline stops before this step"))
            } else {
                None
            };
            if let Some((error, why)) = stop {
                log_decision(ctx, step.index(), why);
                report.result = Err(error);
                return report;
            }
            let scope = Scope::new(ctx, &previous_outputs, secrets.clone());
            let outcome = step.run(scope, &env).await;
            let record = record(step, &outcome, &redactor);
            log_step(ctx, &record, outcome.result.is_ok());
            report.steps.push(record);
            report.retry_after = report.retry_after.max(outcome.retry_after);
            match outcome.result {
                Ok(()) => previous_outputs = outcome.outputs,
                Err(_) if step.is_async() => {
                    // The detail is on the step's own line; this one only
                    // records the decision (seed, "Logging").
                    log_decision(ctx, step.index(), "ignoring the failure of an async step");
                    previous_outputs = BTreeMap::new();
                }
                Err(error) => {
                    report.result = Err(error);
                    return report;
                }
            }
        }
        report
    }
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pipeline")
            .field("mode", &self.mode)
            .field("steps", &self.steps)
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

/// The step's run record: what its log line says too.
fn record(step: &CompiledStep, outcome: &Outcome, redactor: &Redactor) -> RunStep {
    RunStep {
        index: step.index(),
        method: step.method().to_string(),
        endpoint: shown(&outcome.endpoint).into_owned(),
        is_async: step.is_async(),
        attempts: outcome.attempts,
        status: outcome.status.map_or(0, |s| s.as_u16()),
        error: match &outcome.result {
            Ok(()) => String::new(),
            // Redacted whole first: a cut must not leave part of a secret.
            Err(error) => shown(&redactor.scrub(&http::error_chain(error))).into_owned(),
        },
        duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
        outputs: step
            .shown_outputs(&outcome.outputs, redactor)
            .into_iter()
            .map(|(name, value)| (name, shown(&value).into_owned()))
            .collect(),
    }
}

/// A line about what the run does at step `step`, beside the step's own line.
fn log_decision(ctx: &SubscriptionContext, step: usize, message: &str) {
    tracing::info!(lock_id = ctx.lock_id, sync_id = %ctx.expected_sync_id, run_id = %ctx.run_id, step, "{message}");
}

/// The step's one log line (see the module docs for its fields). The two
/// outcomes differ only in level, message and `error` (absent on success).
fn log_step(ctx: &SubscriptionContext, record: &RunStep, succeeded: bool) {
    // A map of strings always serialises.
    let outputs = serde_json::to_string(&record.outputs).unwrap_or_default();
    let status = (record.status != 0).then_some(record.status);
    let error = (!succeeded).then_some(record.error.as_str());
    macro_rules! step_line {
        ($level:expr, $message:literal) => {
            tracing::event!(
                $level,
                lock_id = ctx.lock_id,
                sync_id = %ctx.expected_sync_id,
                run_id = %ctx.run_id,
                step = record.index,
                method = %record.method,
                endpoint = %record.endpoint,
                "async" = record.is_async,
                attempts = record.attempts,
                status,
                duration_ms = record.duration_ms,
                error,
                outputs = %outputs,
                $message
            )
        };
    }
    if succeeded {
        step_line!(tracing::Level::INFO, "step succeeded");
    } else {
        step_line!(tracing::Level::WARN, "step failed");
    }
}
