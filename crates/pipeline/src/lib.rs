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
//! `attempts`, `status` and/or `error`, and `outputs` (compact JSON). The
//! reconciler runs [`Pipeline::run`] inside its reconcile span, but every
//! event here also carries `lock_id` and `sync_id` itself, so the contract's
//! rule ("a line with `step` has `lock_id` and `sync_id`") holds whatever a
//! formatter does with span fields.
//!
//! Header values and request bodies are never logged or put in an error:
//! they are where tokens live. The rendered endpoint is logged (with any
//! userinfo password redacted); by convention it carries no secret, so
//! tokens belong in headers, not in query strings.
//!
//! # Cancellation
//!
//! A run checks its [`CancellationToken`] before each step and stops with
//! [`PipelineError::Cancelled`] once shutdown began. The step in flight is
//! never interrupted (platform contract §7: in-flight reconciles finish), so
//! its outcome and log line are always complete. The price: a `wait` step
//! still polling holds shutdown until it resolves or its `timeout` elapses.
//! An async step's detached request is not tied to the token either; it
//! ends with its own timeout or when the runtime shuts down.
//!
//! # Layout
//! - this file: the public handle ([`Pipelines`], [`Pipeline::run`]) and logging.
//! - `step`: one compiled step; awaited, polled and async execution.
//! - `template`: Go templates via `gotmpl`; rendering `data` recursively.
//! - `dotpath`: `.a.b[0]` paths into a JSON body.
//! - `http`: the shared client, one request attempt, redaction.
//! - `error`: [`ValidationError`], [`PipelineError`].

mod dotpath;
mod error;
mod http;
mod step;
mod template;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use kayra_config::ReconcilerConfig;
use tokio_util::sync::CancellationToken;

pub use error::{PipelineError, ValidationError};
pub use http::http_client;

use step::{CompiledStep, Outcome};
use template::Scope;

/// What the templates see as `.Subscription`, plus the slot running it.
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
}

/// The timing knobs of `reconciler` that apply to every mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSettings {
    /// How long an async step waits for an answer (seed: `AsyncStepAckTimeout`).
    pub async_ack_timeout: Duration,
    /// Pause between two calls of a `wait` step (seed: `WaitPollInterval`).
    pub wait_poll_interval: Duration,
}

impl Default for PipelineSettings {
    fn default() -> Self {
        Self {
            async_ack_timeout: kayra_config::ASYNC_STEP_ACK_TIMEOUT,
            wait_poll_interval: kayra_config::WAIT_POLL_INTERVAL,
        }
    }
}

impl From<&ReconcilerConfig> for PipelineSettings {
    fn from(cfg: &ReconcilerConfig) -> Self {
        Self { async_ack_timeout: cfg.async_ack_timeout.0, wait_poll_interval: cfg.wait_poll_interval.0 }
    }
}

/// Every configured mode, compiled once at startup.
#[derive(Debug)]
pub struct Pipelines {
    modes: BTreeMap<String, Pipeline>,
    settings: PipelineSettings,
}

impl Pipelines {
    /// Compiles every mode of `reconciler.mode`: parses every template and
    /// checks methods, header names, literal endpoints and dot paths. The
    /// error names mode, step index and field, e.g.
    /// `reconciler.mode.api[1].headers.Authorization: template: 1:7: unclosed action`.
    pub fn compile(cfg: &ReconcilerConfig) -> Result<Self, ValidationError> {
        let mut modes = BTreeMap::new();
        for (mode, steps) in &cfg.mode {
            let mut compiled = Vec::with_capacity(steps.len());
            for (index, step) in steps.iter().enumerate() {
                let key = |field: &str| format!("reconciler.mode.{mode}[{index}].{field}");
                let step_compiled = CompiledStep::compile(index, step)
                    .map_err(|(field, message)| ValidationError { key: key(&field), message })?;
                if step.is_async && !step.wait.is_empty() {
                    tracing::warn!(key = %key("wait"), "wait is ignored on an async step");
                }
                compiled.push(step_compiled);
            }
            // An empty list is "no steps configured": the mode keeps the
            // placeholder behaviour (seed, "Reconcile"), so it gets no pipeline.
            if !compiled.is_empty() {
                modes.insert(mode.clone(), Pipeline { mode: mode.clone(), steps: compiled });
            }
        }
        Ok(Self { modes, settings: PipelineSettings::from(cfg) })
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
}

/// One mode's steps.
pub struct Pipeline {
    mode: String,
    steps: Vec<CompiledStep>,
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
    /// `Ok` when every non-async step succeeded (async steps' failures are
    /// logged and ignored). The first failing non-async step ends the run
    /// with its error; the steps after it are not called.
    pub async fn run(
        &self,
        client: &reqwest::Client,
        ctx: &SubscriptionContext,
        settings: &PipelineSettings,
        cancel: &CancellationToken,
    ) -> Result<(), PipelineError> {
        let mut previous_outputs = BTreeMap::new();
        for step in &self.steps {
            if cancel.is_cancelled() {
                tracing::info!(
                    lock_id = ctx.lock_id,
                    sync_id = %ctx.expected_sync_id,
                    step = step.index(),
                    "shutdown: pipeline stops before this step"
                );
                return Err(PipelineError::Cancelled);
            }
            let scope = Scope::new(ctx, &previous_outputs);
            let outcome = step.run(client, scope, settings).await;
            log_step(ctx, step, &outcome);
            match outcome.result {
                Ok(()) => previous_outputs = outcome.outputs,
                Err(_) if step.is_async() => {
                    // The detail is on the step's own line; this one only
                    // records the decision (seed, "Logging").
                    tracing::info!(
                        lock_id = ctx.lock_id,
                        sync_id = %ctx.expected_sync_id,
                        step = step.index(),
                        "ignoring the failure of an async step"
                    );
                    previous_outputs = BTreeMap::new();
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pipeline").field("mode", &self.mode).field("steps", &self.steps).finish()
    }
}

/// The step's one log line (see the module docs for its fields).
fn log_step(ctx: &SubscriptionContext, step: &CompiledStep, outcome: &Outcome) {
    // A map of strings always serialises.
    let outputs = serde_json::to_string(&outcome.outputs).unwrap_or_default();
    let status = outcome.status.map(|s| s.as_u16());
    match &outcome.result {
        Ok(()) => tracing::info!(
            lock_id = ctx.lock_id,
            sync_id = %ctx.expected_sync_id,
            step = step.index(),
            method = %step.method(),
            endpoint = %outcome.endpoint,
            "async" = step.is_async(),
            attempts = outcome.attempts,
            status,
            outputs = %outputs,
            "step succeeded"
        ),
        Err(error) => tracing::warn!(
            lock_id = ctx.lock_id,
            sync_id = %ctx.expected_sync_id,
            step = step.index(),
            method = %step.method(),
            endpoint = %outcome.endpoint,
            "async" = step.is_async(),
            attempts = outcome.attempts,
            status,
            error = %http::error_chain(error),
            outputs = %outputs,
            "step failed"
        ),
    }
}
