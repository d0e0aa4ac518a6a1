//! Async steps' requests that outlive their step (platform §2,
//! `reconciler.max_detached_requests`).
//!
//! An async step waits `async_ack_timeout` for its answer and moves on; the
//! request keeps running in the background until the step's own `timeout`,
//! so a backend that cancels work on a client disconnect still gets the whole
//! call. A backend that never answers would then hold one socket per run for
//! up to a day, so the process keeps at most `max_detached_requests` of them:
//! detaching one more abandons the oldest (its task is aborted, which drops
//! the request and closes its connection) with a log line.
//!
//! Every async request is registered from the moment it is spawned until its
//! task ends (normally, by panic or by abort: a guard inside the task removes
//! it), and marked detached when its step stops waiting. Only detached ones
//! count and are ever abandoned, and a request that answered just before the
//! ack deadline is already gone when its step would detach it.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::{AbortHandle, JoinHandle};

/// Who a request belongs to, for the line logged when it is abandoned.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    pub(crate) step: usize,
    pub(crate) endpoint: String,
    pub(crate) lock_id: usize,
    pub(crate) sync_id: String,
    pub(crate) run_id: String,
}

struct Entry {
    abort: AbortHandle,
    owner: Owner,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Every registered request, detached or not.
    open: BTreeMap<u64, Entry>,
    /// Detached ids, oldest first; may hold ids whose task has since ended
    /// (they are skipped, and pruned when counted).
    detached: VecDeque<u64>,
}

/// The process's async requests; shared by every pipeline of a [`crate::Pipelines`].
pub(crate) struct DetachedRequests {
    max: usize,
    state: Mutex<State>,
}

/// A registered request's handle, held by its step while it waits for the ack.
pub(crate) struct Registered<T> {
    id: u64,
    pub(crate) task: JoinHandle<T>,
}

/// Removes the request from the registry when its task ends, however.
struct Deregister {
    registry: Arc<DetachedRequests>,
    id: u64,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        self.registry.state().open.remove(&self.id);
    }
}

impl std::fmt::Debug for DetachedRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetachedRequests").field("max", &self.max).field("open", &self.open()).finish()
    }
}

impl DetachedRequests {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { max: max.max(1), state: Mutex::new(State::default()) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spawns `request` as a registered task.
    pub(crate) fn spawn<T: Send + 'static>(
        self: &Arc<Self>,
        owner: Owner,
        request: impl Future<Output = T> + Send + 'static,
    ) -> Registered<T> {
        // Registered under the lock, so the task's own removal (which takes
        // the lock) cannot run before the entry exists.
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        let guard = Deregister { registry: self.clone(), id };
        let task = tokio::spawn(async move {
            let _guard = guard;
            request.await
        });
        state.open.insert(id, Entry { abort: task.abort_handle(), owner });
        Registered { id, task }
    }

    /// The step stopped waiting for `registered`: it runs on in the
    /// background, and the oldest detached request past the limit is
    /// abandoned.
    pub(crate) fn detach<T>(&self, registered: Registered<T>) {
        let abandoned = {
            let mut state = self.state();
            if !state.open.contains_key(&registered.id) {
                return; // it ended meanwhile
            }
            state.detached.push_back(registered.id);
            let mut abandoned = Vec::new();
            while Self::count(&mut state) > self.max {
                let Some(oldest) = state.detached.pop_front() else { break };
                if let Some(entry) = state.open.remove(&oldest) {
                    abandoned.push(entry);
                }
            }
            abandoned
        };
        // Outside the lock: an aborted task's guard takes it.
        for entry in abandoned {
            entry.abort.abort();
            let o = &entry.owner;
            tracing::warn!(
                lock_id = o.lock_id,
                sync_id = %o.sync_id,
                run_id = %o.run_id,
                step = o.step,
                endpoint = %o.endpoint,
                max_detached_requests = self.max,
                "abandoning the oldest async request still unanswered: too many are open"
            );
        }
        // Dropping the JoinHandle detaches the task; it is not aborted.
        drop(registered.task);
    }

    /// Detached requests still open, pruning ended ones from the order.
    fn count(state: &mut State) -> usize {
        let State { open, detached, .. } = state;
        detached.retain(|id| open.contains_key(id));
        detached.len()
    }

    /// How many detached requests are open now.
    pub(crate) fn open(&self) -> usize {
        Self::count(&mut self.state())
    }
}
