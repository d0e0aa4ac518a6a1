//! Runs: the record of one reconcile attempt of a subscription (platform §4.4).
//!
//! Written by the reconciler in the same store transaction as the attempt's
//! result; read by the catalog API (`.../subscriptions/:api/runs`), the CLI
//! and the console.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What made a job run: the cause of the newest write that triggered it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RunTrigger {
    /// A write to the subscription.
    #[default]
    Initial,
    /// Its registration's SyncID moved (also a run after `superseded`).
    Ongoing,
    /// The subscription's `/sync` reset.
    Resync,
    /// reconcileExisting after a reconciler start.
    Startup,
    /// The immediate retry after a failure.
    Retry,
}

/// How a run ended.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RunResult {
    #[default]
    Success,
    Error,
    /// Stopped between steps by a shutdown.
    Cancelled,
    /// Stopped because the expected SyncID moved past the one it worked toward.
    Superseded,
}

/// One reconcile attempt of one subscription.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Run {
    /// Unique and time-ordered (a UUIDv7); also `run_id` in logs and `.Run.ID`.
    pub id: String,
    pub namespace: String,
    pub api: String,
    /// The SyncID the run worked toward.
    pub sync_id: String,
    /// The resolved mode; empty when none resolved.
    pub mode: String,
    pub trigger: RunTrigger,
    pub result: RunResult,
    #[serde(default)]
    pub error: String,
    /// RFC 3339 UTC with milliseconds.
    pub started_at: String,
    pub finished_at: String,
    /// The pool slot that ran it.
    pub lock_id: usize,
    /// `<hostname>:<pid>` of the reconciler.
    pub reconciler: String,
    /// Empty for a placeholder run.
    #[serde(default)]
    pub steps: Vec<RunStep>,
}

/// One step of a run, as it was sent and answered (redacted as §2/§8 say).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RunStep {
    /// 0-based.
    pub index: usize,
    /// Upper-case.
    pub method: String,
    /// Rendered, without user info; `<redacted>` when it holds a secret.
    pub endpoint: String,
    #[serde(rename = "async")]
    pub is_async: bool,
    /// Calls made (a `wait` step counts each poll).
    pub attempts: u32,
    /// 0 when no response came.
    pub status: u16,
    #[serde(default)]
    pub error: String,
    /// Spans every attempt.
    pub duration_ms: u64,
    #[serde(default)]
    pub outputs: BTreeMap<String, String>,
}
