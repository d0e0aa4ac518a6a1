//! Why a pipeline could not be built ([`ValidationError`]) or did not
//! succeed ([`PipelineError`]).
//!
//! Messages name the step (its 0-based index in `reconciler.mode.<mode>`,
//! the same index the config key and the step's log line use) and what
//! failed, never a header value, a request body, a rendered endpoint or a
//! secret's value: any of them may hold a token. Transport errors are kept
//! without their URL for the same reason.

use std::time::Duration;

use thiserror::Error;

/// A `reconciler.mode` entry that cannot run; stops the process at startup.
///
/// `key` is the full config key, e.g.
/// `reconciler.mode.api[1].headers.Authorization`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{key}: {message}")]
pub struct ValidationError {
    pub key: String,
    pub message: String,
}

/// Why a pipeline run failed.
#[derive(Debug, Error)]
pub enum PipelineError {
    /// A template failed to execute, before any request was made.
    #[error("step {step}: render {field}: {message}")]
    Render { step: usize, field: String, message: String },
    /// The rendered request is unusable, and was not sent: the endpoint is
    /// not an absolute http(s) URL, or has user info, a fragment or a `.`
    /// or `..` path segment (the message starts `endpoint: `), or a header
    /// value contains characters HTTP does not allow.
    #[error("step {step}: invalid request: {message}")]
    InvalidRequest { step: usize, message: String },
    /// No answer: connect, TLS, reset, or a broken body.
    #[error("step {step}: request failed")]
    Transport {
        step: usize,
        #[source]
        source: reqwest::Error,
    },
    /// The backend answered with a status outside 2xx.
    #[error("step {step}: answered HTTP {status}")]
    Status { step: usize, status: u16 },
    /// No complete answer within the step's `timeout`.
    #[error("step {step}: no answer within {}", humantime::format_duration(*timeout))]
    Timeout { step: usize, timeout: Duration },
    /// An async step's answer did not arrive within the acknowledgement
    /// window; the request itself goes on in the background.
    #[error("step {step}: no answer within the async acknowledgement window of {}", humantime::format_duration(*ack))]
    NoAck { step: usize, ack: Duration },
    /// The task sending an async step's request ended abnormally.
    #[error("step {step}: request task ended abnormally")]
    TaskFailed { step: usize },
    /// A `wait` condition's value landed in its `failures`.
    #[error("step {step}: wait condition {key} is {value:?}, one of its failures")]
    WaitFailed { step: usize, key: String, value: String },
    /// The step's `timeout` elapsed before every `wait` condition reached one
    /// of its `successes`; `last` describes what the final answer showed.
    #[error("step {step}: wait unresolved within {} after {attempts} attempts (last: {last})", humantime::format_duration(*timeout))]
    WaitTimeout { step: usize, timeout: Duration, attempts: u32, last: String },
    /// An output's value is longer than `reconciler.max_output_bytes`
    /// (§17); the next step is not run.
    #[error("step {step}: output {name} is {len} bytes, over reconciler.max_output_bytes ({max})")]
    OutputTooLarge { step: usize, name: String, len: usize, max: usize },
    /// A secret the pipeline uses could not be read for this run; no step
    /// was called. The message names the secret and its source, never a value.
    #[error("secret {name:?}: {message}")]
    Secret { name: String, message: String },
    /// Shutdown began between two steps; the remaining ones were not run.
    #[error("pipeline cancelled by shutdown between steps")]
    Cancelled,
    /// The subscription's expected SyncID moved past the one this run works
    /// toward; it stopped at a step boundary or between two `wait` polls.
    #[error("pipeline superseded by a newer SyncID")]
    Superseded,
    /// The run was stopped ([`crate::RunControl::stop`]: a cancel, its
    /// deadline), at a step boundary or in the middle of a step; the
    /// caller knows why and says so in the run's record.
    #[error("run stopped")]
    Stopped,
}

impl PipelineError {
    /// The 0-based index of the failed step; `None` for [`Self::Cancelled`],
    /// [`Self::Secret`], [`Self::Stopped`] and a [`Self::Superseded`]
    /// between steps.
    pub fn step(&self) -> Option<usize> {
        match self {
            Self::Render { step, .. }
            | Self::InvalidRequest { step, .. }
            | Self::Transport { step, .. }
            | Self::Status { step, .. }
            | Self::Timeout { step, .. }
            | Self::NoAck { step, .. }
            | Self::TaskFailed { step }
            | Self::WaitFailed { step, .. }
            | Self::WaitTimeout { step, .. }
            | Self::OutputTooLarge { step, .. } => Some(*step),
            Self::Secret { .. } | Self::Cancelled | Self::Superseded | Self::Stopped => None,
        }
    }
}
