//! `store.Store`: the one storage interface of kayra, and its two backends.
//!
//! A [`Store`] is a cheap, cloneable handle over a private [`Backend`]
//! (garage's `Db(Arc<dyn IDb>)` shape): call sites never carry backend
//! generics. Keys are `/`-separated strings relative to the store's root
//! (etcd adds `database.etcd.prefix`). Every record carries the revision of
//! its last write, and every operation reports the store revision it saw, so
//! a caller can list and then follow [`Store::changes`] from exactly the
//! next revision without losing a change — which is what [`Store::watcher`]
//! does, resuming and re-listing by itself.
//!
//! # Layout
//! - this file: the handle, records, events, errors, [`JobLocker`].
//! - `watcher.rs`: [`Store::watcher`], list → watch → re-list over any
//!   backend's one change feed ([`Backend::changes`]).
//! - `local.rs`: SQLite (WAL) file backend for `kayra dev`; its change feed
//!   polls a change log. No job locker: a dev deployment has one reconciler.
//! - `etcd.rs`: etcd v3 backend; native watch as its change feed;
//!   [`JobLocker`] on a leased session with one mutex per job.
//! - `group.rs`: group commit, for [`Store::txn_grouped`] and the etcd
//!   job locker's acquisitions.
//! - `testsuite.rs`: the conformance suite every backend passes.

pub mod etcd;
pub mod group;
pub mod local;
pub mod reflector;
pub mod testsuite;
pub mod txn;
mod watcher;

pub use txn::{Compare, Op, Txn, TxnResponse};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::Either;
use futures::stream::BoxStream;
use thiserror::Error;

/// A store revision: etcd's cluster revision, or the local change-log index.
pub type Revision = i64;

/// Why a store operation failed.
#[derive(Debug, Clone, Error)]
pub enum Error {
    /// The key does not exist.
    #[error("key {0:?} not found")]
    NotFound(String),
    /// A create found the key present, or a compare-and-swap found another revision.
    #[error("conflict on key {0:?}")]
    Conflict(String),
    /// The requested watch revision is no longer retained.
    #[error("revision {0} has been compacted")]
    Compacted(Revision),
    /// The backend cannot be reached or failed; retrying may help.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend answered and refused the request itself (too large, out
    /// of space, invalid): the same request sent again fails again.
    #[error("store refused the request: {0}")]
    Refused(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// Relative to the store root.
    pub key: String,
    pub value: Vec<u8>,
    /// Revision of the write that created the key.
    pub create_revision: Revision,
    /// Revision of the last write to the key: the CAS token.
    pub mod_revision: Revision,
}

/// One page of a prefix listing.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// Sorted by key.
    pub items: Vec<KeyValue>,
    /// More keys after the last item remain.
    pub more: bool,
    /// The store revision this page was read at.
    pub revision: Revision,
}

/// A change seen by a change feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A key was created or updated.
    Put(KeyValue),
    /// A key was deleted at `revision`.
    Delete { key: String, revision: Revision },
}

impl Event {
    pub fn key(&self) -> &str {
        match self {
            Event::Put(kv) => &kv.key,
            Event::Delete { key, .. } => key,
        }
    }
    pub fn revision(&self) -> Revision {
        match self {
            Event::Put(kv) => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }
}

/// What a consumer of [`Store::watcher`] sees (kube-runtime's `watcher`
/// events): a list as `Init`, `InitApply`…, `InitDone`, then changes. A
/// re-list (a compacted revision, a trimmed change log, a lost position)
/// is `Init`…`InitDone` again: the consumer replaces its whole view at
/// `InitDone`, so it learns of every delete it missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatcherEvent {
    /// A (re-)list starts; buffer `InitApply`s until `InitDone`.
    Init,
    /// One key present at the list's revision.
    InitApply(KeyValue),
    /// The list is complete at this revision; replace the view.
    InitDone { revision: Revision },
    /// A key was created or updated.
    Apply(KeyValue),
    /// A key was deleted at `revision`.
    Delete { key: String, revision: Revision },
    /// Nothing under the prefix changed up to `revision` (etcd progress
    /// notification; the local poll): the view is current as of it.
    Progress { revision: Revision },
}

/// One item of a backend's raw change feed (see [`Backend::changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A put or delete, in revision order.
    Event(Event),
    /// Every change under the prefix up to this revision has been delivered.
    Progress(Revision),
}

/// A backend's raw change feed. It yields `Err(Compacted)` when the history
/// from its position is gone and `Err(Unavailable)` (or ends) when the
/// connection is lost; either way it is finished after that.
/// [`Store::watcher`] turns it into a stream that never ends.
pub type ChangeStream = BoxStream<'static, Result<Change>>;

/// A snapshot read a page at a time (see [`Backend::snapshot_pages`]):
/// each page's records, in key order, and the snapshot's revision.
pub type SnapshotPages = BoxStream<'static, Result<(Vec<KeyValue>, Revision)>>;

/// What a backend implements. Private in spirit: use [`Store`].
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision)>;
    /// Keys starting with `prefix`, sorted, strictly after `start_after`, at most `limit` (0 = no limit).
    async fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Result<ListPage>;
    /// Creates `key`; `Conflict` when it exists. Returns the new revision.
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision>;
    /// Replaces `key` iff its mod_revision is `expected`; `NotFound` / `Conflict`.
    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<Revision>;
    /// Deletes `key` (iff at `expected` when given); `NotFound` / `Conflict`.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Revision>;
    /// The store's current revision; doubles as a reachability check.
    async fn revision(&self) -> Result<Revision>;
    /// Runs `txn` atomically: compares, then one branch's operations.
    async fn txn(&self, txn: Txn) -> Result<TxnResponse>;
    /// Independent transactions in as few round trips as the backend can
    /// (one SQLite transaction; one etcd Txn when every compare holds):
    /// each answer is what [`Backend::txn`] alone would have answered had
    /// they run one after another. `started`: when the oldest was
    /// submitted (a local write never commits past its request timeout).
    async fn txn_group(&self, txns: Vec<Txn>, started: std::time::Instant) -> Vec<Result<TxnResponse>> {
        let _ = started;
        let mut answers = Vec::with_capacity(txns.len());
        for txn in txns {
            answers.push(self.txn(txn).await);
        }
        answers
    }
    /// How [`Store::txn_grouped`] groups: batches in flight at once, and
    /// transactions per batch.
    fn group_limits(&self) -> (usize, usize) {
        (4, 1)
    }
    /// Whether [`Store::txn_grouped`] groups transactions that only read
    /// too (etcd: one Txn for many reads saves round trips), or sends each
    /// alone ([`Backend::txn`]).
    fn groups_reads(&self) -> bool {
        true
    }
    /// Every key under `prefix` at one revision, read page by page.
    async fn snapshot(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)>;
    /// [`Backend::snapshot`] handed out a page at a time, each page with
    /// the snapshot's one revision (at least one page, maybe empty), so
    /// that a list of any size is never held whole: the next page is read
    /// only when the consumer asks for it. A failed read ends the stream
    /// with its error. This default reads the whole snapshot as one page;
    /// the etcd and local backends page for real.
    fn snapshot_pages(self: Arc<Self>, prefix: String) -> SnapshotPages {
        Box::pin(futures::stream::once(async move { self.snapshot(&prefix).await }))
    }
    /// Every key under each of `prefixes`, all at ONE revision (one list
    /// per prefix, in order). This default reads each prefix with
    /// [`Backend::snapshot`] and accepts the result only when every read
    /// answered the same revision (no write came between them), retrying
    /// otherwise; the etcd and local backends override it with a true
    /// single-revision read.
    async fn snapshot_many(&self, prefixes: &[String]) -> Result<(Vec<Vec<KeyValue>>, Revision)> {
        for _ in 0..SNAPSHOT_ATTEMPTS {
            let mut lists = Vec::with_capacity(prefixes.len());
            let mut revisions = std::collections::BTreeSet::new();
            for prefix in prefixes {
                let (items, revision) = self.snapshot(prefix).await?;
                lists.push(items);
                revisions.insert(revision);
            }
            match revisions.into_iter().collect::<Vec<_>>()[..] {
                [] => return Ok((lists, self.revision().await?)),
                [revision] => return Ok((lists, revision)),
                _ => continue,
            }
        }
        Err(Error::Unavailable("the store kept changing during a consistent read of several prefixes".into()))
    }
    /// The raw change feed under `prefix` from `from` (inclusive), with
    /// progress at least every [`PROGRESS_INTERVAL`] while healthy.
    async fn changes(&self, prefix: &str, from: Revision) -> Result<ChangeStream>;
    /// Cross-process job locks, where the backend has them.
    fn job_locker(&self) -> Option<Arc<dyn JobLocker>> {
        None
    }
    /// Keys bound to leases, where the backend has them (etcd).
    fn leases(&self) -> Option<Arc<dyn Leases>> {
        None
    }
    /// Round trips to the store so far, where the backend counts them
    /// itself (etcd: every call, the job locker's and leases' included).
    fn round_trips(&self) -> Option<u64> {
        None
    }
}

/// Keys that vanish when their lease does (etcd): fleet-wide counters that a
/// killed process cannot leave behind.
#[async_trait]
pub trait Leases: Send + Sync + 'static {
    /// This process's session lease (the job locker's, TTL `lock_ttl`),
    /// kept alive while the store handle lives.
    async fn session(&self) -> Result<i64>;
    /// A new lease expiring after `ttl`, rounded up to whole seconds.
    async fn grant(&self, ttl: std::time::Duration) -> Result<i64>;
    /// Creates `key` attached to `lease` unless it exists (`Ok(None)`).
    async fn create_leased(&self, key: &str, value: Vec<u8>, lease: i64) -> Result<Option<Revision>>;
}

/// Cross-process mutual exclusion per job key (seed, "Per-job locking").
#[async_trait]
pub trait JobLocker: Send + Sync + 'static {
    /// Blocks until this process holds `job`, retrying a non-blocking
    /// try-lock every `lock_retry_interval`.
    async fn lock(&self, job: &str) -> Result<JobLock>;
    /// One non-blocking attempt: `None` when another holder has `job` (a
    /// caller that waits retries it every [`JobLocker::retry_interval`]).
    async fn try_lock(&self, job: &str) -> Result<Option<JobLock>>;
    /// `lock_retry_interval`: how often a blocked caller retries.
    fn retry_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(250)
    }
    /// Releases a lock taken by [`JobLocker::lock`].
    async fn unlock(&self, lock: JobLock) -> Result<()>;
    /// [`JobLocker::try_lock`] and a read of `keys` (store keys) in the
    /// same round trip (on etcd: one transaction that is Go's TryLock plus
    /// the caller's gets), so a job that takes its lock also learns the
    /// records it decides on. The reads are as of the lock's transaction.
    async fn try_lock_and_get(&self, job: &str, keys: &[String]) -> Result<Option<LockedRead>>;
    /// Forgets `lock` after the caller's own transaction deleted its
    /// [`JobLock::store_key`] (the result write that is also the unlock):
    /// frees what this process holds for it, with no store call.
    async fn unlocked_by_txn(&self, lock: JobLock) -> Result<()> {
        self.unlock(lock).await
    }
}

/// A lock taken by [`JobLocker::try_lock_and_get`], and what was read with it.
#[derive(Debug)]
pub struct LockedRead {
    pub lock: JobLock,
    /// One entry per requested key, in order.
    pub gets: Vec<Option<KeyValue>>,
    /// The store revision of the lock's transaction.
    pub revision: Revision,
}

/// A held job lock. Release it with [`JobLocker::unlock`]; if the process
/// dies instead, the session lease frees it after `lock_ttl`.
#[derive(Debug)]
pub struct JobLock {
    /// The job key as asked for.
    pub job: String,
    /// The backend's own key for the held mutex.
    pub key: String,
    /// That key's create revision: grows each time any process takes the
    /// job's lock (the fencing token, platform contract §7).
    pub create_revision: Revision,
    /// The same key as a store key (relative to the store root), for a
    /// transaction that must only commit while the lock is still held
    /// (`Compare::Exists`: the key goes with the session's lease).
    pub store_key: String,
}

/// Attempts of the default [`Backend::snapshot_many`] before it gives up.
const SNAPSHOT_ATTEMPTS: usize = 10;

/// How often a healthy watcher reports [`WatcherEvent::Progress`] at the
/// latest (etcd progress requests; the local store reports every poll).
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(400);

/// The storage handle every component uses. Every call is bounded by its
/// request timeout (`database.request_timeout`): past it the call fails
/// with [`Error::Unavailable`], whatever the backend is doing.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    request_timeout: Duration,
    /// Calls through this handle and its clones (see [`Store::round_trips`]).
    calls: Arc<std::sync::atomic::AtomicU64>,
    /// The group-commit queue of [`Store::txn_grouped`], started by its first call.
    groups: Arc<std::sync::OnceLock<TxnGroup>>,
}

type TxnGroup = group::Group<(Txn, std::time::Instant), Result<TxnResponse>>;

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

impl Store {
    /// A handle with the default request timeout
    /// ([`kayra_config::DEFAULT_REQUEST_TIMEOUT`]).
    pub fn new(backend: impl Backend) -> Self {
        Self {
            backend: Arc::new(backend),
            request_timeout: kayra_config::DEFAULT_REQUEST_TIMEOUT,
            calls: Arc::default(),
            groups: Arc::default(),
        }
    }

    /// The same store with every call bounded by `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The deadline every call of this handle carries.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Opens the backend `config` selects, bounded by `database.request_timeout`.
    pub async fn open(config: &kayra_config::DatabaseConfig) -> Result<Self> {
        let timeout = config.request_timeout.0;
        let store = match (&config.local, &config.etcd) {
            (Some(local), None) => {
                Self::new(local::LocalStore::open(&local.path, local.poll_interval.0)?.with_write_timeout(timeout))
            }
            (None, Some(etcd)) => {
                // Connecting is lazy; the first call is what can hang.
                // The backend bounds its failover attempts by the same timeout.
                Self::new(etcd::EtcdStore::connect_within(etcd, timeout).await?)
            }
            _ => return Err(Error::Unavailable("exactly one of database.local / database.etcd must be set".into())),
        };
        Ok(store.with_request_timeout(timeout))
    }

    /// Store round trips made so far: the backend's own count where it
    /// keeps one (etcd), else the calls through this handle and its clones
    /// (local: one SQLite statement or transaction each; the change-log
    /// polls of watches are not counted). A cheap atomic, for benchmarks.
    pub fn round_trips(&self) -> u64 {
        self.backend.round_trips().unwrap_or_else(|| self.calls.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Runs `call` within the request timeout, counted as one round trip.
    fn bounded<T>(&self, what: &'static str, call: impl Future<Output = Result<T>>) -> impl Future<Output = Result<T>> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.within_timeout(what, call)
    }

    /// `call`, failing `Unavailable` past the request timeout, which
    /// starts at its first poll. Plain `fn`s returning combinators, here
    /// and in [`Store::bounded`] and [`Store::txn_grouped`]: an `async fn`
    /// would hold `call` twice (its argument and the timeout around it),
    /// and every request's future holds one of these. `lazy` keeps the
    /// timer (which needs the runtime) and a group's submission to the
    /// first poll, as an `async fn` would, in states that overlap.
    fn within_timeout<T>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> impl Future<Output = Result<T>> {
        let timeout = self.request_timeout;
        futures::future::lazy(move |_| tokio::time::timeout(timeout, call)).flatten().map(move |answer| {
            answer.unwrap_or_else(|_| {
                Err(Error::Unavailable(format!("{what} did not answer within the request timeout of {timeout:?}")))
            })
        })
    }

    pub fn get<'a>(&'a self, key: &'a str) -> impl Future<Output = Result<(Option<KeyValue>, Revision)>> + Send + 'a {
        self.bounded("get", self.backend.get(key))
    }
    pub fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> impl Future<Output = Result<ListPage>> + Send + 'a {
        self.bounded("list", self.backend.list(prefix, start_after, limit))
    }
    /// Every key under `prefix`, read page by page. Returns the revision of the first page.
    pub async fn list_all(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        let mut first_revision = None;
        loop {
            let page = self.list(prefix, after.as_deref(), 1000).await?;
            first_revision.get_or_insert(page.revision);
            after = page.items.last().map(|kv| kv.key.clone());
            out.extend(page.items);
            if !page.more || after.is_none() {
                return Ok((out, first_revision.unwrap_or_default()));
            }
        }
    }
    pub fn create<'a>(&'a self, key: &'a str, value: Vec<u8>) -> impl Future<Output = Result<Revision>> + Send + 'a {
        self.bounded("create", self.backend.create(key, value))
    }
    pub fn update<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        expected: Revision,
    ) -> impl Future<Output = Result<Revision>> + Send + 'a {
        self.bounded("update", self.backend.update(key, value, expected))
    }
    pub fn delete<'a>(
        &'a self,
        key: &'a str,
        expected: Option<Revision>,
    ) -> impl Future<Output = Result<Revision>> + Send + 'a {
        self.bounded("delete", self.backend.delete(key, expected))
    }
    /// Runs `txn` atomically in one round trip (one etcd Txn; one SQLite
    /// transaction locally).
    pub fn txn(&self, txn: Txn) -> impl Future<Output = Result<TxnResponse>> + Send {
        self.bounded("txn", self.backend.txn(txn))
    }
    /// [`Store::txn`] with group commit: transactions submitted while
    /// others are on their way to the store go together, in one round
    /// trip (one SQLite transaction; one etcd Txn), with the answer each
    /// would have had alone. For many small independent writers (the
    /// reconciler's jobs): under load they share commits instead of
    /// queueing for them one by one; alone, nothing waits. A transaction
    /// that only reads goes alone where the backend gains nothing from
    /// grouping reads ([`Backend::groups_reads`]).
    pub fn txn_grouped(&self, txn: Txn) -> impl Future<Output = Result<TxnResponse>> + Send {
        if !self.backend.groups_reads() && txn.reads_only() {
            return Either::Left(self.txn(txn));
        }
        let submitted = futures::future::lazy(move |_| {
            let group = self.groups.get_or_init(|| {
                let (backend, calls) = (self.backend.clone(), self.calls.clone());
                let (in_flight, max_batch) = backend.group_limits();
                group::Group::new(
                    in_flight,
                    max_batch,
                    Arc::new(move |batch: Vec<(Txn, std::time::Instant)>| {
                        let (backend, calls) = (backend.clone(), calls.clone());
                        Box::pin(async move {
                            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let started = batch.iter().map(|(_, at)| *at).min().unwrap_or_else(std::time::Instant::now);
                            backend.txn_group(batch.into_iter().map(|(txn, _)| txn).collect(), started).await
                        })
                    }),
                )
            });
            group.submit((txn, std::time::Instant::now()))
        })
        .flatten();
        Either::Right(
            self.within_timeout(
                "txn",
                submitted.map(|answer| {
                    answer.unwrap_or_else(|| Err(Error::Unavailable("the store is shutting down".into())))
                }),
            ),
        )
    }
    /// The backend's raw change feed under `prefix` from `from`
    /// (inclusive; see [`Backend::changes`]), opened within the request
    /// timeout. It is finished at its first error (`Compacted` when the
    /// history from `from` is gone); [`Store::watcher`] is the stream that
    /// lists, resumes and re-lists by itself.
    pub fn changes<'a>(
        &'a self,
        prefix: &'a str,
        from: Revision,
    ) -> impl Future<Output = Result<ChangeStream>> + Send + 'a {
        self.bounded("changes", self.backend.changes(prefix, from))
    }
    /// Every key under each of `prefixes` at one store revision (one list
    /// per prefix, in order): a consistent read of several collections
    /// (`kayra export`). Read page by page, so it is not bounded by the
    /// request timeout as a whole; each backend call still fails with
    /// `Unavailable` when the store is unreachable.
    pub async fn snapshot_many(&self, prefixes: &[String]) -> Result<(Vec<Vec<KeyValue>>, Revision)> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.backend.snapshot_many(prefixes).await
    }
    /// A never-ending list → watch → re-list stream of `prefix` (see
    /// [`WatcherEvent`]). It ends only when every handle on the store is gone.
    pub fn watcher(&self, prefix: &str) -> BoxStream<'static, WatcherEvent> {
        watcher::watcher(Arc::downgrade(&self.backend), prefix.to_string(), self.request_timeout)
    }
    pub fn revision(&self) -> impl Future<Output = Result<Revision>> + Send {
        self.bounded("revision", self.backend.revision())
    }
    pub fn job_locker(&self) -> Option<Arc<dyn JobLocker>> {
        self.backend.job_locker()
    }
    pub fn leases(&self) -> Option<Arc<dyn Leases>> {
        self.backend.leases()
    }
}
