//! `store.Store`: the one storage interface of kayra, and its two backends.
//!
//! A [`Store`] is a cheap, cloneable handle over a private [`Backend`]
//! (garage's `Db(Arc<dyn IDb>)` shape): call sites never carry backend
//! generics. Keys are `/`-separated strings relative to the store's root
//! (etcd adds `database.etcd.prefix`). Every record carries the revision of
//! its last write, and every operation reports the store revision it saw, so
//! a caller can list and then [`Store::watch`] from exactly the next
//! revision without losing a change.
//!
//! # Layout
//! - this file: the handle, records, events, errors, [`JobLocker`].
//! - `local.rs`: SQLite (WAL) file backend for `kayra dev`; Watch polls a
//!   change log. No job locker: a dev deployment has one reconciler.
//! - `etcd.rs`: etcd v3 backend; native watch; [`JobLocker`] on a leased
//!   session with one mutex per job.
//! - `testsuite.rs`: the conformance suite every backend passes.

pub mod etcd;
pub mod local;
pub mod testsuite;
pub mod txn;

pub use txn::{Compare, Op, Txn, TxnResponse};

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use thiserror::Error;

/// A store revision: etcd's cluster revision, or the local change-log index.
pub type Revision = i64;

/// Why a store operation failed.
#[derive(Debug, Error)]
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

/// A change seen by a watch.
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

/// A stream of events in revision order. It only ends when the store handle
/// is gone; transient failures are retried inside. When the position was
/// compacted away, the backend re-lists and emits a `Put` for every key
/// present (at its current revision) before resuming, so a consumer that
/// treats puts idempotently loses nothing but intermediate deletes' timing.
pub type WatchStream = BoxStream<'static, Event>;

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
    /// Puts and deletes under `prefix` from `from` (inclusive) on.
    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream>;
    /// The store's current revision; doubles as a reachability check.
    async fn revision(&self) -> Result<Revision>;
    /// Cross-process job locks, where the backend has them.
    fn job_locker(&self) -> Option<Arc<dyn JobLocker>> {
        None
    }
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
}

/// The storage handle every component uses.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

impl Store {
    pub fn new(backend: impl Backend) -> Self {
        Self(Arc::new(backend))
    }

    /// Opens the backend `config` selects.
    pub async fn open(config: &kayra_config::DatabaseConfig) -> Result<Self> {
        match (&config.local, &config.etcd) {
            (Some(local), None) => Ok(Self::new(local::LocalStore::open(&local.path, local.poll_interval.0)?)),
            (None, Some(etcd)) => Ok(Self::new(etcd::EtcdStore::connect(etcd).await?)),
            _ => Err(Error::Unavailable("exactly one of database.local / database.etcd must be set".into())),
        }
    }

    pub async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision)> {
        self.0.get(key).await
    }
    pub async fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Result<ListPage> {
        self.0.list(prefix, start_after, limit).await
    }
    /// Every key under `prefix`, read page by page. Returns the revision of the first page.
    pub async fn list_all(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        let mut first_revision = None;
        loop {
            let page = self.0.list(prefix, after.as_deref(), 1000).await?;
            first_revision.get_or_insert(page.revision);
            after = page.items.last().map(|kv| kv.key.clone());
            out.extend(page.items);
            if !page.more || after.is_none() {
                return Ok((out, first_revision.unwrap_or_default()));
            }
        }
    }
    pub async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision> {
        self.0.create(key, value).await
    }
    pub async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<Revision> {
        self.0.update(key, value, expected).await
    }
    pub async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Revision> {
        self.0.delete(key, expected).await
    }
    pub async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream> {
        self.0.watch(prefix, from).await
    }
    pub async fn revision(&self) -> Result<Revision> {
        self.0.revision().await
    }
    pub fn job_locker(&self) -> Option<Arc<dyn JobLocker>> {
        self.0.job_locker()
    }
}
