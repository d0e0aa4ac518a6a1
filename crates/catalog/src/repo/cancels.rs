//! Cancelling a run in flight (platform §12), across processes.
//!
//! Whichever `serve` takes `PUT …/runs/{id}/cancel` writes a
//! [`CancelRequest`] under the run's key (`/cancelrequests/<platform>/
//! <region>/<namespace>/<api>/<run id>`). Every reconciler watches that
//! prefix; the one whose job is running that run stops it and records the
//! run, and the same result transaction rewrites the request with the run
//! in it ([`super::Rider::CancelAnswer`]), so the waiting serve reads the
//! answer in one get, whatever `reconciler.run_history` keeps. The serve
//! then deletes the request. A request nobody answers (no run of that id
//! is in flight) is deleted by the serve when its patience runs out; one
//! left behind by a serve that died meanwhile is swept by the reconcilers
//! after [`STALE_AFTER`].
//!
//! The reconcilers publish nothing per run for this: a run's writes are
//! unchanged, and only a cancel costs store writes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kayra_core::Run;
use serde::{Deserialize, Serialize};

use super::{Error, RecordRef, Repository, Result};

/// How long a request may stay before any reconciler deletes it: far
/// beyond any waiter's patience.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// How often a waiting serve reads the request for its answer.
const POLL: Duration = Duration::from_millis(20);

/// A request to cancel one run, and, once its holder stopped it, the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    pub namespace: String,
    pub api: String,
    pub run_id: String,
    /// Who asked.
    pub user: String,
    /// Why (may be empty).
    #[serde(default)]
    pub reason: String,
    /// When the request was written, in ms since the epoch.
    pub requested_at_ms: u64,
    /// The holder's answer: the run as recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Run>,
}

impl CancelRequest {
    /// A new request of `user` with `reason`, made now.
    pub fn new(namespace: &str, api: &str, run_id: &str, user: &str, reason: &str) -> Self {
        Self {
            namespace: namespace.into(),
            api: api.into(),
            run_id: run_id.into(),
            user: user.into(),
            reason: reason.into(),
            requested_at_ms: now_ms(),
            run: None,
        }
    }

    /// The request's record.
    pub fn record(&self) -> RecordRef<'_> {
        RecordRef::CancelRequest { namespace: &self.namespace, api: &self.api, id: &self.run_id }
    }

    /// The run's `error` when this request stopped it:
    /// `cancelled by <user>: <reason>` (without `: ` when no reason was given).
    pub fn message(&self) -> String {
        match self.reason.trim() {
            "" => format!("cancelled by {}", self.user),
            reason => format!("cancelled by {}: {reason}", self.user),
        }
    }

    /// Whether the request has waited so long that nobody waits for it.
    pub fn stale(&self) -> bool {
        now_ms().saturating_sub(self.requested_at_ms) > STALE_AFTER.as_millis() as u64
    }

    /// The answered request: `run` as recorded.
    pub fn answered(&self, run: &Run) -> Self {
        Self { run: Some(run.clone()), ..self.clone() }
    }
}

/// How a cancel ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The run's holder stopped it: the run as recorded (`cancelled`).
    Cancelled(Run),
    /// The run had finished (or finished before the stop reached it).
    Finished(Run),
    /// No run of that id is recorded or in flight.
    NotFound,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Repository {
    /// Cancels the run `request` names: a finished run is
    /// [`CancelOutcome::Finished`] at once; otherwise the request is
    /// written and its answer awaited for at most `patience` (the holder
    /// stops the run and answers within a second). With an audit context
    /// on this handle, the audit record rides on the removal of an
    /// answered request, so only a cancel that stopped a run is audited.
    pub async fn cancel_run(&self, request: &CancelRequest, patience: Duration) -> Result<CancelOutcome> {
        let (namespace, api, id) = (&request.namespace, &request.api, &request.run_id);
        let plain = self.with_riders(&[]);
        if let Some(run) = plain.run(namespace, api, id).await? {
            return Ok(CancelOutcome::Finished(run));
        }
        let record = request.record();
        match plain.create(record, request, "cancel request").await {
            // A concurrent cancel of the same run: wait for its answer too.
            Ok(_) | Err(Error::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
        let deadline = tokio::time::Instant::now() + patience;
        let answer = loop {
            match plain.get::<CancelRequest>(record).await? {
                Some(found) if found.value.run.is_some() => break Some(found),
                // Answered and removed by a concurrent cancel's waiter.
                None => break None,
                Some(_) if tokio::time::Instant::now() >= deadline => break None,
                Some(_) => tokio::time::sleep(POLL).await,
            }
        };
        let Some(answer) = answer else {
            match plain.delete(record, None, "cancel request").await {
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
            // It may have finished meanwhile, or its answer was read by
            // a concurrent waiter.
            return Ok(match plain.run(namespace, api, id).await? {
                Some(run) if run.result == kayra_core::RunResult::Cancelled => CancelOutcome::Cancelled(run),
                Some(run) => CancelOutcome::Finished(run),
                None => CancelOutcome::NotFound,
            });
        };
        let run = answer.value.run.clone().unwrap_or_default();
        let cancelled = run.result == kayra_core::RunResult::Cancelled;
        let remover = if cancelled { self.auditing(serde_json::Value::Null, serde_json::json!(run)) } else { plain };
        match remover.delete(record, Some(answer.revision), "cancel request").await {
            Ok(_) | Err(Error::NotFound(_) | Error::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
        Ok(if cancelled { CancelOutcome::Cancelled(run) } else { CancelOutcome::Finished(run) })
    }

    /// Removes a request nobody waits for any more (see [`STALE_AFTER`]),
    /// if it is still at `revision`.
    pub async fn sweep_cancel_request(&self, request: &CancelRequest, revision: kayra_store::Revision) -> Result<()> {
        match self.delete(request.record(), Some(revision), "cancel request").await {
            Ok(_) | Err(Error::NotFound(_) | Error::Conflict(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_user_and_the_reason() {
        let request = CancelRequest::new("core", "x.io", "r1", "alice", "bad canary");
        assert_eq!(request.message(), "cancelled by alice: bad canary");
        let request = CancelRequest::new("core", "x.io", "r1", "alice", " ");
        assert_eq!(request.message(), "cancelled by alice");
        assert!(!request.stale());
        let old = CancelRequest { requested_at_ms: now_ms() - 61_000, ..request };
        assert!(old.stale());
    }
}
