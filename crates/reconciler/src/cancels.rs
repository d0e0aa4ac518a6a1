//! Stopping a run in flight (platform §12): a user's cancel, from any
//! `serve`, and the run's deadline (`reconciler.limits.<mode>.run_timeout`).
//!
//! Every running pipeline has an entry in [`Cancels`], by run id, with the
//! token its [`kayra_pipeline::RunControl::stop`] watches. The stop's
//! cause decides how the run is recorded: a cancel as `cancelled` (`error`
//! naming the user and the reason; state and `current_sync_id` unchanged,
//! no retry, no given-up record: the job waits for its next trigger), a
//! deadline as `error` (`run timeout of 30m exceeded`), followed by the
//! ordinary failure path.
//!
//! Cancel requests reach the process holding the run through the store
//! ([`kayra_catalog::repo::cancels`]): [`watch`] follows the request prefix
//! with a reflector and stops the running entry a request names. The
//! run's result transaction carries the answer back to the waiting serve.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kayra_catalog::repo::cancels::CancelRequest;
use kayra_catalog::repo::{Collection, Repository};
use kayra_store::Revision;
use kayra_store::reflector::Reflector;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

/// How often the requests are looked through again whatever the watch
/// announced (a lagged announcement, a request that came before its run's
/// entry), and stale ones swept.
const RESCAN: Duration = Duration::from_secs(1);

/// Why a run was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// A user's cancel: the run is recorded `cancelled`.
    Cancel(Box<CancelRequest>),
    /// The run's deadline passed: the run is recorded as failed.
    Deadline(Duration),
}

impl Stop {
    /// The run's `error`.
    pub fn message(&self) -> String {
        match self {
            Self::Cancel(request) => request.message(),
            Self::Deadline(limit) => format!("run timeout of {} exceeded", humantime::format_duration(*limit)),
        }
    }
}

/// The running pipelines of one reconciler, by run id.
#[derive(Default)]
pub struct Cancels {
    running: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    namespace: String,
    api: String,
    stop: CancellationToken,
    cause: Arc<Mutex<Option<Stop>>>,
}

/// A running pipeline's entry, removed when this is dropped, however the
/// pipeline ended.
pub struct RunStop<'c> {
    cancels: &'c Cancels,
    run_id: String,
    /// What the pipeline's `RunControl::stop` watches.
    pub token: CancellationToken,
    cause: Arc<Mutex<Option<Stop>>>,
}

impl Cancels {
    /// Enters run `run_id` of `namespace`'s subscription to `api`.
    pub fn enter(&self, run_id: &str, namespace: &str, api: &str) -> RunStop<'_> {
        let (token, cause) = (CancellationToken::new(), Arc::new(Mutex::new(None)));
        let entry = Entry { namespace: namespace.into(), api: api.into(), stop: token.clone(), cause: cause.clone() };
        self.map().insert(run_id.to_string(), entry);
        RunStop { cancels: self, run_id: run_id.to_string(), token, cause }
    }

    /// Stops the run `request` names if it runs here and has not been
    /// stopped yet; whether it did.
    pub fn request(&self, request: &CancelRequest) -> bool {
        let map = self.map();
        let Some(entry) = map.get(&request.run_id) else { return false };
        if entry.namespace != request.namespace || entry.api != request.api {
            return false;
        }
        stop(&entry.cause, &entry.stop, Stop::Cancel(Box::new(request.clone())))
    }

    /// How many pipelines run here.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no pipeline runs here.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The first cause wins: a run is stopped once.
fn stop(cause: &Mutex<Option<Stop>>, token: &CancellationToken, why: Stop) -> bool {
    let mut cause = cause.lock().unwrap_or_else(PoisonError::into_inner);
    if cause.is_some() {
        return false;
    }
    *cause = Some(why);
    token.cancel();
    true
}

impl RunStop<'_> {
    /// Stops the run for `why`, unless it was stopped already.
    pub fn stop(&self, why: Stop) -> bool {
        stop(&self.cause, &self.token, why)
    }

    /// Why the run was stopped, if it was.
    pub fn cause(&self) -> Option<Stop> {
        self.cause.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Drop for RunStop<'_> {
    fn drop(&mut self) {
        self.cancels.map().remove(&self.run_id);
    }
}

/// Follows the cancel requests of this deployment until `shutdown`,
/// stopping the runs of this process they name, and sweeping requests
/// nobody waits for any more.
pub async fn watch(repo: Repository, cancels: Arc<Cancels>, shutdown: CancellationToken) {
    let requests: Reflector<(CancelRequest, Revision)> = Reflector::announcing(
        |kv| {
            serde_json::from_slice::<CancelRequest>(&kv.value).map(|r| (r, kv.mod_revision)).map_err(|e| e.to_string())
        },
        1024,
        |a, b| a.1 == b.1,
    );
    let (mut changes, ()) = requests.subscribe(|_| ());
    let feed = requests.clone().run(repo.store().watcher(&repo.layout().prefix(Collection::CancelRequests)));
    let mut feed = std::pin::pin!(feed);
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = &mut feed => return,
            change = changes.recv() => match change {
                Ok(change) => {
                    if let Some((request, _)) = change.value.filter(|(r, _)| r.run.is_none()) {
                        stop_requested(&cancels, &request);
                    }
                }
                Err(RecvError::Lagged(_)) => scan(&requests, &cancels),
                Err(RecvError::Closed) => return,
            },
            _ = rescan.tick() => {
                scan(&requests, &cancels);
                let stale: Vec<_> = requests.read(|map| map.values().filter(|(r, _)| r.stale()).cloned().collect());
                for (request, revision) in stale {
                    if let Err(e) = repo.sweep_cancel_request(&request, revision).await {
                        tracing::warn!(run_id = %request.run_id, error = %e, "could not remove a stale cancel request");
                    }
                }
            }
        }
    }
}

/// Looks every unanswered request through against the running pipelines.
fn scan(requests: &Reflector<(CancelRequest, Revision)>, cancels: &Cancels) {
    if cancels.is_empty() {
        return;
    }
    let open: Vec<CancelRequest> =
        requests.read(|map| map.values().filter(|(r, _)| r.run.is_none()).map(|(r, _)| r.clone()).collect());
    for request in open {
        stop_requested(cancels, &request);
    }
}

/// Stops the run `request` names if it runs here.
fn stop_requested(cancels: &Cancels, request: &CancelRequest) {
    if cancels.request(request) {
        tracing::info!(namespace = %request.namespace, api = %request.api, run_id = %request.run_id,
            user = %request.user, "run cancel requested; stopping it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_stops_only_its_own_run_and_only_once() {
        let cancels = Cancels::default();
        let run = cancels.enter("r1", "core", "x.io");
        let other = CancelRequest::new("core", "y.io", "r1", "alice", "");
        assert!(!cancels.request(&other), "same id, another subscription");
        assert!(!cancels.request(&CancelRequest::new("core", "x.io", "r2", "alice", "")));
        assert!(!run.token.is_cancelled());
        let request = CancelRequest::new("core", "x.io", "r1", "alice", "bad canary");
        assert!(cancels.request(&request));
        assert!(run.token.is_cancelled());
        assert!(!run.stop(Stop::Deadline(Duration::from_secs(1))), "the first cause wins");
        assert_eq!(run.cause().map(|c| c.message()).as_deref(), Some("cancelled by alice: bad canary"));
        drop(run);
        assert!(cancels.is_empty(), "the entry goes with its run");
    }

    #[test]
    fn a_deadline_names_its_limit() {
        assert_eq!(Stop::Deadline(Duration::from_secs(1800)).message(), "run timeout of 30m exceeded");
        assert_eq!(Stop::Deadline(Duration::from_millis(1500)).message(), "run timeout of 1s 500ms exceeded");
    }
}
