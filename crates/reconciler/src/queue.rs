//! The work queue (platform contract §7, "Work queue"), with client-go's
//! workqueue semantics (`util/workqueue/queue.go`: a dirty set, a
//! processing set, and an order):
//!
//! - one entry per job key: a trigger for a key that is already queued is
//!   merged into it (its cause is updated, its place kept);
//! - a trigger for a key that is running marks it dirty: it is queued again
//!   when the running job is [`WorkQueue::done`], so it runs exactly once
//!   more however many triggers arrived meanwhile, and never twice at once
//!   (this is the in-process layer of the seed's per-job lock);
//! - nothing waiting holds a pool slot: a job takes one only once it holds
//!   its job lock (see `dispatch` in the crate root).
//!
//! Order: activations (namespaces, first syncs) first, in arrival order;
//! then ongoing work round-robin across APIs, so one API's fan-out of
//! 10,000 never delays another API's subscription by more than one job.
//! Within one API keys are taken in an order of this process's own
//! (a hash of the key and a per-process seed), so several reconcilers on
//! one etcd mostly take different keys and each adds its pool of useful
//! work instead of all of them chasing the same lock.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kayra_core::RunTrigger;
use tokio::sync::Notify;

/// One unit of work: one namespace's activation or one subscription's
/// `ensureReconciled`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobKey {
    Namespace(String),
    Subscription { namespace: String, api: String },
}

impl JobKey {
    pub fn subscription(namespace: impl Into<String>, api: impl Into<String>) -> Self {
        Self::Subscription { namespace: namespace.into(), api: api.into() }
    }

    /// The job lock's key: per deployment, so two deployments sharing an
    /// etcd never wait for each other (platform contract §3).
    pub fn lock_key(&self, platform: &str, region: &str) -> String {
        match self {
            Self::Namespace(name) => format!("{platform}/{region}/namespaces/{name}"),
            Self::Subscription { namespace, api } => format!("{platform}/{region}/subscriptions/{namespace}/{api}"),
        }
    }
}

/// Why a job runs: the newest trigger (recorded as the run's `trigger`),
/// and whether any merged trigger was the startup pass (which retries
/// given-up subscriptions; a later event must not take that away).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cause {
    pub trigger: RunTrigger,
    pub startup: bool,
    /// Queued by the echo of this reconciler's own result write: not a
    /// cause of its own, so it never replaces a merged entry's trigger.
    pub own_write: bool,
}

impl Cause {
    pub fn new(trigger: RunTrigger) -> Self {
        Self { trigger, startup: trigger == RunTrigger::Startup, own_write: false }
    }

    /// The echo of the reconciler's own write found the subscription
    /// behind: whatever moved meanwhile (`trigger`, the registration's
    /// SyncID) is the cause, unless a real one is merged with it.
    pub fn own_write(trigger: RunTrigger) -> Self {
        Self { own_write: true, ..Self::new(trigger) }
    }

    fn merge(self, newer: Cause) -> Cause {
        let trigger = if newer.own_write { self.trigger } else { newer.trigger };
        Cause { trigger, startup: self.startup || newer.startup, own_write: self.own_write && newer.own_write }
    }
}

/// Which turn a job takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Namespaces and first syncs: taken before anything else.
    Activation,
    /// Everything else, round-robin across APIs.
    Ongoing,
}

#[derive(Debug)]
struct Pending {
    cause: Cause,
    class: Class,
    /// In the order structures (false: dirty while its key is processing).
    queued: bool,
}

#[derive(Default)]
struct State {
    pending: HashMap<JobKey, Pending>,
    processing: HashSet<JobKey>,
    activations: VecDeque<JobKey>,
    /// api → its queued ongoing keys in this process's order.
    ongoing: HashMap<String, BTreeSet<(u64, JobKey)>>,
    /// APIs with queued ongoing keys, in round-robin order.
    ring: VecDeque<String>,
    closed: bool,
}

/// The queue. Shared by the watch loop (adds), the dispatcher (next) and
/// the jobs (done).
pub struct WorkQueue {
    state: Mutex<State>,
    notify: Notify,
    /// This process's order within an API; `None`: key order.
    seed: Option<u64>,
}

impl WorkQueue {
    /// `seed` decides this process's order within an API.
    pub fn new(seed: u64) -> Self {
        Self { state: Mutex::default(), notify: Notify::new(), seed: Some(seed) }
    }

    /// Keys within an API taken in key order: where one process does all
    /// the work (no job locker to share it with), neighbouring keys run
    /// together, and their results, written together by group commit,
    /// share the store's pages.
    pub fn in_key_order() -> Self {
        Self { state: Mutex::default(), notify: Notify::new(), seed: None }
    }

    /// Queues `key`, or merges into its entry.
    pub fn add(&self, key: JobKey, cause: Cause, class: Class) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        if let Some(pending) = state.pending.get_mut(&key) {
            pending.cause = pending.cause.merge(cause);
            let upgrade = class < pending.class;
            if upgrade {
                pending.class = class;
            }
            if upgrade && pending.queued {
                let hash = self.hash(&key);
                state.unqueue_ongoing(&key, hash);
                state.activations.push_back(key);
            }
            return;
        }
        let queued = !state.processing.contains(&key);
        state.pending.insert(key.clone(), Pending { cause, class, queued });
        if queued {
            let hash = self.hash(&key);
            state.push(key, class, hash);
        }
        let depth = state.pending.len();
        drop(state);
        if queued {
            self.notify.notify_one();
        }
        report_depth(depth);
    }

    /// Adds `key` after `delay` (a job that found its lock held elsewhere
    /// retries every `lock_retry_interval`, waiting here, not in a slot).
    pub fn add_after(self: &Arc<Self>, key: JobKey, cause: Cause, class: Class, delay: Duration) {
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key, cause, class);
        });
    }

    /// The next key to run, marked processing; `None` once closed. One
    /// consumer (the dispatcher) calls this.
    pub async fn next(&self) -> Option<(JobKey, Cause, Class)> {
        loop {
            let notified = self.notify.notified();
            {
                let mut state = self.lock();
                if let Some(next) = state.pop() {
                    report_depth(state.pending.len());
                    return Some(next);
                }
                if state.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Marks `key` finished; if it was triggered meanwhile it is queued again.
    pub fn done(&self, key: &JobKey) {
        let mut state = self.lock();
        state.processing.remove(key);
        let Some(pending) = state.pending.get_mut(key) else { return };
        pending.queued = true;
        let class = pending.class;
        let hash = self.hash(key);
        state.push(key.clone(), class, hash);
        drop(state);
        self.notify.notify_one();
    }

    /// Entries waiting (queued, or dirty behind a running job).
    pub fn len(&self) -> usize {
        self.lock().pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes no more keys; [`WorkQueue::next`] answers `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    fn hash(&self, key: &JobKey) -> u64 {
        let Some(seed) = self.seed else { return 0 };
        let mut h = DefaultHasher::new();
        seed.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn report_depth(depth: usize) {
    metrics::gauge!(super::METRIC_QUEUE_DEPTH).set(depth as f64);
}

impl State {
    fn push(&mut self, key: JobKey, class: Class, hash: u64) {
        match (&key, class) {
            (JobKey::Subscription { api, .. }, Class::Ongoing) => {
                let api = api.clone();
                let keys = self.ongoing.entry(api.clone()).or_default();
                if keys.is_empty() {
                    self.ring.push_back(api);
                }
                keys.insert((hash, key));
            }
            _ => self.activations.push_back(key),
        }
    }

    fn unqueue_ongoing(&mut self, key: &JobKey, hash: u64) {
        let JobKey::Subscription { api, .. } = key else { return };
        let Some(keys) = self.ongoing.get_mut(api) else { return };
        keys.remove(&(hash, key.clone()));
        if keys.is_empty() {
            self.ongoing.remove(api);
            self.ring.retain(|a| a != api);
        }
    }

    fn pop(&mut self) -> Option<(JobKey, Cause, Class)> {
        let key = match self.activations.pop_front() {
            Some(key) => key,
            None => {
                let api = self.ring.pop_front()?;
                let keys = self.ongoing.get_mut(&api)?;
                let (_, key) = keys.pop_first()?;
                if keys.is_empty() {
                    self.ongoing.remove(&api);
                } else {
                    self.ring.push_back(api);
                }
                key
            }
        };
        let pending = self.pending.remove(&key)?;
        self.processing.insert(key.clone());
        Some((key, pending.cause, pending.class))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(ns: &str, api: &str) -> JobKey {
        JobKey::subscription(ns, api)
    }

    fn ongoing() -> Cause {
        Cause::new(RunTrigger::Ongoing)
    }

    async fn drain(q: &WorkQueue) -> Vec<JobKey> {
        let mut out = Vec::new();
        while !q.lock().activations.is_empty() || !q.lock().ring.is_empty() {
            let (key, _, _) = q.next().await.unwrap();
            q.done(&key);
            out.push(key);
        }
        out
    }

    #[tokio::test]
    async fn a_trigger_for_a_queued_key_is_merged() {
        let q = WorkQueue::new(1);
        q.add(sub("a", "x"), Cause::new(RunTrigger::Startup), Class::Ongoing);
        q.add(sub("a", "x"), Cause::new(RunTrigger::Resync), Class::Ongoing);
        assert_eq!(q.len(), 1);
        let (key, cause, _) = q.next().await.unwrap();
        assert_eq!(key, sub("a", "x"));
        // The newest trigger is the run's; the startup pass's retry right stays.
        assert_eq!(cause, Cause { trigger: RunTrigger::Resync, startup: true, own_write: false });
        q.done(&key);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn the_echo_of_an_own_write_never_replaces_a_cause() {
        let q = WorkQueue::new(1);
        q.add(sub("a", "x"), ongoing(), Class::Ongoing);
        q.add(sub("a", "x"), Cause::own_write(RunTrigger::Initial), Class::Ongoing);
        let (key, cause, _) = q.next().await.unwrap();
        assert_eq!(cause.trigger, RunTrigger::Ongoing, "the bump stays the cause");
        assert!(!cause.own_write);
        // Dirty while running: the same holds for the one more run.
        q.add(key.clone(), Cause::new(RunTrigger::Resync), Class::Ongoing);
        q.add(key.clone(), Cause::own_write(RunTrigger::Ongoing), Class::Ongoing);
        q.done(&key);
        let (_, cause, _) = q.next().await.unwrap();
        assert_eq!(cause.trigger, RunTrigger::Resync);
        // Alone, an echo's entry carries the trigger it was given.
        q.done(&key);
        q.add(key.clone(), Cause::own_write(RunTrigger::Ongoing), Class::Ongoing);
        let (_, cause, _) = q.next().await.unwrap();
        assert_eq!(cause.trigger, RunTrigger::Ongoing);
    }

    #[tokio::test]
    async fn triggers_during_a_run_make_exactly_one_more_run() {
        let q = WorkQueue::new(1);
        q.add(sub("a", "x"), ongoing(), Class::Ongoing);
        let (key, _, _) = q.next().await.unwrap();
        for _ in 0..10 {
            q.add(sub("a", "x"), Cause::new(RunTrigger::Initial), Class::Ongoing);
        }
        // Never handed out twice at once.
        let while_running = tokio::time::timeout(Duration::from_millis(30), q.next()).await;
        assert!(while_running.is_err(), "a running key is not handed out again");
        q.done(&key);
        let (again, cause, _) = q.next().await.unwrap();
        assert_eq!((again.clone(), cause.trigger), (key, RunTrigger::Initial));
        q.done(&again);
        assert!(q.is_empty());
        assert!(tokio::time::timeout(Duration::from_millis(30), q.next()).await.is_err(), "exactly one more");
    }

    #[tokio::test]
    async fn activations_go_before_ongoing_fan_out() {
        let q = WorkQueue::new(1);
        for ns in ["a", "b", "c"] {
            q.add(sub(ns, "x"), ongoing(), Class::Ongoing);
        }
        q.add(JobKey::Namespace("new".into()), Cause::new(RunTrigger::Initial), Class::Activation);
        q.add(sub("new", "y"), Cause::new(RunTrigger::Initial), Class::Activation);
        let order = drain(&q).await;
        assert_eq!(order[..2], [JobKey::Namespace("new".into()), sub("new", "y")]);
        assert_eq!(order.len(), 5);
    }

    #[tokio::test]
    async fn a_queued_key_moves_up_when_it_becomes_an_activation() {
        let q = WorkQueue::new(1);
        q.add(sub("a", "x"), ongoing(), Class::Ongoing);
        q.add(sub("b", "x"), ongoing(), Class::Ongoing);
        q.add(sub("c", "x"), ongoing(), Class::Ongoing);
        q.add(sub("c", "x"), Cause::new(RunTrigger::Initial), Class::Activation);
        assert_eq!(drain(&q).await[0], sub("c", "x"));
    }

    #[tokio::test]
    async fn ongoing_work_is_round_robin_across_apis() {
        let q = WorkQueue::new(1);
        for i in 0..100 {
            q.add(sub(&format!("n{i}"), "big"), ongoing(), Class::Ongoing);
        }
        q.add(sub("n0", "small"), ongoing(), Class::Ongoing);
        let order = drain(&q).await;
        let small = order.iter().position(|k| *k == sub("n0", "small")).unwrap();
        assert!(small <= 1, "another API's job waits at most one job, was at {small}");
    }

    #[tokio::test]
    async fn a_queue_in_key_order_takes_an_apis_keys_sorted() {
        let q = WorkQueue::in_key_order();
        let mut names: Vec<String> = (0..50).map(|i| format!("n{:02}", (i * 37) % 50)).collect();
        for name in &names {
            q.add(sub(name, "x"), ongoing(), Class::Ongoing);
        }
        names.sort();
        let expected: Vec<JobKey> = names.iter().map(|n| sub(n, "x")).collect();
        assert_eq!(drain(&q).await, expected);
    }

    #[tokio::test]
    async fn each_process_takes_an_apis_keys_in_its_own_order() {
        let order = |seed| async move {
            let q = WorkQueue::new(seed);
            for i in 0..50 {
                q.add(sub(&format!("n{i}"), "x"), ongoing(), Class::Ongoing);
            }
            drain(&q).await
        };
        let (one, two) = (order(1).await, order(2).await);
        assert_eq!(one.len(), 50);
        assert_ne!(one[..5], two[..5], "two processes start on different keys");
        assert_eq!(order(1).await, one, "one process's order is stable");
    }

    #[tokio::test]
    async fn closing_ends_next_and_ignores_adds() {
        let q = Arc::new(WorkQueue::new(1));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.close();
        assert!(waiter.await.unwrap().is_none());
        q.add(sub("a", "x"), ongoing(), Class::Ongoing);
        assert!(q.is_empty());
    }
}
