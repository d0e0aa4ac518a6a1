//! `Repository`: typed reads and compare-and-swap writes over the store.
//!
//! The Repository is the only code that knows the store's key layout: callers
//! name records by what they are ([`RecordRef`], [`Collection`]), never by
//! key, and a key read from the store (a watch event) is parsed back by
//! [`Layout::parse`]. Parts that consume store keys without a Repository
//! (the auth caches, the watch hub, the limits) are handed its [`Layout`].
//!
//! Records are JSON values under that layout. Every
//! read returns the record with its revision ([`Versioned`]); every
//! read-modify-write goes through [`Repository::modify`], a CAS loop that
//! re-reads and re-applies on conflict, so concurrent writers never lose an
//! update. Writes that would not change anything are skipped, which is what
//! makes the reconciler's writes idempotent (it never loops on its own
//! writes).
//!
//! # Riders
//! A [`Rider`] is a record written in the same store transaction as the
//! change that causes it, so the two commit or fail together: the run record
//! of a reconcile rides on its result ([`Repository::write_result`]); the
//! audit record of a request rides on the change it records ([`audit`]); the
//! outbox event of a notification is the next one (add a variant to
//! [`Rider`] and its key to the layout). Any
//! write of the Repository carries riders given to
//! [`Repository::with_riders`]: every write path ends in one of the generic
//! ops below or in [`Repository::txn`], and both add them to the branch that
//! commits. A write that commits in several transactions writes its riders
//! with each (none of today's riders minds: a rider's key is its own).
//!
//! # Layout
//! - this file: `Repository`, `Versioned`, `Error`, riders, the generic typed
//!   ops and the reconciler's result write.
//! - `keys`: the key layout, private to the Repository; [`Layout`],
//!   [`RecordRef`] and [`Collection`] are its typed face.
//! - [`tenancy`]: namespaces, API registrations, subscriptions.
//! - [`auth`]: users, tokens, roles, bindings.
//! - [`backup`]: `kayra export`'s consistent read of every record and
//!   `kayra import`'s conditional bulk create.
//! - [`audit`]: audit records: the request's context, the rider, listing
//!   and retention.
//! - [`notifications`]: notification deliveries and fan-out markers (§14).
//! - [`cancels`]: requests to cancel a run in flight and their answers (§12).

pub mod audit;
pub mod auth;
pub mod backup;
pub mod cancels;
mod keys;
pub mod layout;
pub mod notifications;
pub mod rollouts;
pub mod runs;
pub mod tenancy;

pub use layout::{Collection, Layout, RecordRef};

use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

use kayra_core::Subscription;
use kayra_core::run_ring::RunRing;
use kayra_store::{Compare, JobLock, Op, Revision, Store, Txn};

use crate::cache::AuthCache;

/// Why a repository operation failed.
#[derive(Debug, Error)]
pub enum Error {
    /// The record does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The record exists already, or changed under a conditional write.
    #[error("{0}")]
    Conflict(String),
    /// A stored value does not decode: the store holds something kayra did not write.
    #[error("stored record {key:?} is unreadable: {message}")]
    Corrupt { key: String, message: String },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] kayra_store::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A record and the revision of its last write (its CAS token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub revision: Revision,
}

/// One page of a typed listing.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<Versioned<T>>,
    /// The key to continue after, when more remain.
    pub next: Option<String>,
}

/// What [`Repository::modify`]'s closure decided.
pub enum Change<E> {
    /// Write the modified value.
    Write,
    /// Leave the record as it is (nothing to change).
    Keep,
    /// Abort with this error.
    Abort(E),
}

/// The typed repository of one deployment (platform + region).
///
/// A handle is cloned into every request's state and every reconcile: a
/// clone is two reference counts (the deployment's part and the riders),
/// never an allocation.
#[derive(Debug, Clone)]
pub struct Repository {
    /// What every handle of this deployment shares.
    base: std::sync::Arc<Base>,
    /// Ops of the riders every write of this handle carries
    /// ([`Repository::with_riders`]); empty for a plain handle.
    riders: std::sync::Arc<[Op]>,
    /// The request whose changes this handle records ([`Repository::audited`]).
    audit: Option<std::sync::Arc<audit::AuditContext>>,
}

/// The deployment's part of a [`Repository`].
#[derive(Debug, Clone)]
struct Base {
    store: Store,
    platform: std::sync::Arc<str>,
    region: std::sync::Arc<str>,
    /// The key layout of this deployment (shares `platform` and `region`).
    layout: Layout,
    /// `kayra serve`'s auth caches: authentication and RBAC read them, and
    /// every write here is reported to them (read-your-writes).
    cache: Option<AuthCache>,
}

impl Repository {
    pub fn new(store: Store, platform: impl Into<String>, region: impl Into<String>) -> Self {
        let (platform, region): (String, String) = (platform.into(), region.into());
        let (platform, region): (std::sync::Arc<str>, std::sync::Arc<str>) = (platform.into(), region.into());
        let layout = Layout::new(platform.clone(), region.clone());
        let base = Base { store, platform, region, layout, cache: None };
        Self { base: std::sync::Arc::new(base), riders: std::sync::Arc::new([]), audit: None }
    }

    /// This repository's key layout, for the parts that consume store keys
    /// without a Repository (watch prefixes, key parses).
    pub fn layout(&self) -> &Layout {
        &self.base.layout
    }

    /// The store key of `record`, for tests that plant a record the API
    /// would refuse (a corrupt or hostile value) straight into the store.
    #[doc(hidden)]
    pub fn store_key_of(&self, record: RecordRef<'_>) -> String {
        self.base.layout.key(record)
    }

    /// A handle whose every write also writes `riders`, in the same store
    /// transaction (see the module docs).
    pub fn with_riders(&self, riders: &[Rider<'_>]) -> Self {
        let mut handle = self.clone();
        handle.riders = riders.iter().flat_map(|rider| self.rider_ops(rider)).collect();
        handle
    }

    /// The ops that write `riders` alone, as a write carrying them would:
    /// for bulk loads outside any write (the benchmarks' generator).
    #[doc(hidden)]
    pub fn rider_puts(&self, riders: &[Rider<'_>]) -> Vec<Op> {
        riders.iter().flat_map(|rider| self.rider_ops(rider)).collect()
    }

    /// The ops that write `rider`.
    fn rider_ops(&self, rider: &Rider<'_>) -> Vec<Op> {
        let (key, value) = match rider {
            Rider::Runs { namespace, api, ring, first } => {
                let history =
                    Op::Put { key: self.base.layout.key(RecordRef::Runs { namespace, api }), value: ring.encode() };
                if !first {
                    return vec![history];
                }
                // The first history of a subscription replaces the run
                // records an earlier build kept for it, one a slot, and
                // that build's run counter.
                let slots =
                    Op::DeletePrefix { prefix: self.base.layout.prefix(Collection::RunSlots { namespace, api }) };
                let cursor = Op::Delete { key: self.base.layout.key(RecordRef::RunCursor { namespace, api }) };
                return vec![slots, cursor, history];
            }
            Rider::Audit(record) => return self.audit_ops(record),
            Rider::Delivery(delivery) => (self.base.layout.key(RecordRef::Delivery(&delivery.id)), encode(delivery)),
            Rider::CancelAnswer(answer) => (self.base.layout.key(answer.record()), encode(answer)),
        };
        vec![Op::Put { key, value }]
    }

    /// This repository, deciding authentication and RBAC from `cache`.
    pub fn with_cache(mut self, cache: AuthCache) -> Self {
        std::sync::Arc::make_mut(&mut self.base).cache = Some(cache);
        self
    }

    pub fn cache(&self) -> Option<&AuthCache> {
        self.base.cache.as_ref()
    }

    /// Reports an acknowledged update or delete to the caches, so this
    /// process's next decision waits until they have seen it. Every update
    /// and delete path calls it. Creates need not: a create can only grant,
    /// and what the caches do not know yet is confirmed against the store.
    pub(crate) fn wrote(&self, key: &str, revision: Revision) -> Revision {
        if let Some(cache) = &self.base.cache {
            cache.note_write(key, revision);
        }
        revision
    }

    /// Runs `txn`, sharing a round trip with others on their way to the
    /// store ([`Store::txn_grouped`]: each answers as if alone, and many
    /// tenants' writes at once share commits), and reports what it wrote
    /// to the caches, like [`Repository::wrote`]: every put (but a create,
    /// a put guarded by `Absent` on its key), delete and deleted prefix of
    /// the branch that ran.
    ///
    /// A plain `fn`: what the caller awaits holds only the store's call
    /// and the keys to report, not the transaction a second time (every
    /// request's future holds one).
    pub(crate) fn txn(
        &self,
        mut txn: kayra_store::Txn,
    ) -> impl Future<Output = Result<kayra_store::TxnResponse>> + Send + '_ {
        txn.success.extend(self.riders.iter().cloned());
        // The keys to report, by branch, taken before the transaction goes
        // (not the whole transaction with its values): none for a read.
        let written = match self.base.cache {
            Some(_) => [&txn.success, &txn.failure].map(|ops| written_keys(&txn.compares, ops)),
            None => Default::default(),
        };
        let response = self.base.store.txn_grouped(txn);
        async move {
            let response = response.await?;
            let [success, failure] = written;
            for key in if response.succeeded { success } else { failure } {
                self.wrote(&key, response.revision);
            }
            Ok(response)
        }
    }

    pub fn store(&self) -> &Store {
        &self.base.store
    }
    pub fn platform(&self) -> &str {
        &self.base.platform
    }
    pub fn region(&self) -> &str {
        &self.base.region
    }

    /// Reads one record.
    pub async fn get<T: DeserializeOwned>(&self, record: RecordRef<'_>) -> Result<Option<Versioned<T>>> {
        self.get_key(&self.base.layout.key(record)).await
    }

    /// Reads one record, with the store's revision at the read (what a
    /// consistent read of a cache waits for).
    pub async fn get_with_revision<T: DeserializeOwned>(
        &self,
        record: RecordRef<'_>,
    ) -> Result<(Option<Versioned<T>>, Revision)> {
        let (kv, revision) = self.base.store.get(&self.base.layout.key(record)).await?;
        Ok((kv.map(|kv| decode(&kv)).transpose()?, revision))
    }

    /// Reads one page of `collection`, after the key `after` (a page's `next`).
    pub async fn list<T: DeserializeOwned>(
        &self,
        collection: Collection<'_>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<T>> {
        let page = self.base.store.list(&self.base.layout.prefix(collection), after, limit).await?;
        let next = if page.more { page.items.last().map(|kv| kv.key.clone()) } else { None };
        let items = page.items.iter().map(decode).collect::<Result<Vec<_>>>()?;
        Ok(Page { items, next })
    }

    /// Reads every record of `collection`.
    pub async fn list_all<T: DeserializeOwned>(
        &self,
        collection: Collection<'_>,
    ) -> Result<(Vec<Versioned<T>>, Revision)> {
        self.list_all_key(&self.base.layout.prefix(collection)).await
    }

    /// Creates a record; `Conflict(what)` when it exists.
    pub async fn create<T: Serialize>(&self, record: RecordRef<'_>, value: &T, what: &str) -> Result<Revision> {
        self.create_key(&self.base.layout.key(record), value, what).await
    }

    /// Replaces a record iff it is still at `revision`.
    pub async fn update<T: Serialize>(
        &self,
        record: RecordRef<'_>,
        value: &T,
        revision: Revision,
        what: &str,
    ) -> Result<Revision> {
        self.update_key(&self.base.layout.key(record), value, revision, what).await
    }

    /// Deletes a record (iff at `revision`, when given).
    pub async fn delete(&self, record: RecordRef<'_>, revision: Option<Revision>, what: &str) -> Result<Revision> {
        self.delete_key(&self.base.layout.key(record), revision, what).await
    }

    /// Read-modify-write with compare-and-swap, retried on conflict.
    ///
    /// `f` sees the current value and decides; `Change::Keep` writes nothing
    /// (and returns the record as read). Returns `NotFound(what)` when the
    /// record does not exist.
    pub async fn modify<T, F>(&self, record: RecordRef<'_>, what: &str, f: F) -> Result<Versioned<T>>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&mut T) -> Change<Error>,
    {
        self.modify_key(&self.base.layout.key(record), what, f).await
    }

    // The same ops by store key, for the Repository's own guard and index
    // keys; every write among them carries this handle's riders.

    async fn get_key<T: DeserializeOwned>(&self, key: &str) -> Result<Option<Versioned<T>>> {
        let (kv, _) = self.base.store.get(key).await?;
        kv.map(|kv| decode(&kv)).transpose()
    }

    async fn list_all_key<T: DeserializeOwned>(&self, prefix: &str) -> Result<(Vec<Versioned<T>>, Revision)> {
        let (kvs, revision) = self.base.store.list_all(prefix).await?;
        Ok((kvs.iter().map(decode).collect::<Result<Vec<_>>>()?, revision))
    }

    async fn create_key<T: Serialize>(&self, key: &str, value: &T, what: &str) -> Result<Revision> {
        match self.store_put(key, encode(value), Compare::Absent(key.into())).await {
            Err(kayra_store::Error::Conflict(_)) => Err(Error::Conflict(format!("{what} already exists"))),
            other => Ok(other?),
        }
    }

    async fn update_key<T: Serialize>(&self, key: &str, value: &T, revision: Revision, what: &str) -> Result<Revision> {
        match self.store_put(key, encode(value), Compare::ModRevision(key.into(), revision)).await {
            Err(kayra_store::Error::Conflict(_)) => Err(Error::Conflict(format!("{what} was changed concurrently"))),
            Err(kayra_store::Error::NotFound(_)) => Err(Error::NotFound(what.to_string())),
            other => Ok(self.wrote(key, other?)),
        }
    }

    async fn delete_key(&self, key: &str, revision: Option<Revision>, what: &str) -> Result<Revision> {
        let result = if self.riders.is_empty() {
            self.base.store.delete(key, revision).await
        } else {
            let guard = revision.map_or_else(|| Compare::Exists(key.into()), |r| Compare::ModRevision(key.into(), r));
            self.store_txn_one(key, guard, Op::Delete { key: key.into() }).await
        };
        match result {
            Err(kayra_store::Error::Conflict(_)) => Err(Error::Conflict(format!("{what} was changed concurrently"))),
            Err(kayra_store::Error::NotFound(_)) => Err(Error::NotFound(what.to_string())),
            other => Ok(self.wrote(key, other?)),
        }
    }

    async fn modify_key<T, F>(&self, key: &str, what: &str, mut f: F) -> Result<Versioned<T>>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&mut T) -> Change<Error>,
    {
        loop {
            let Some(mut current) = self.get_key::<T>(key).await? else {
                return Err(Error::NotFound(what.to_string()));
            };
            match f(&mut current.value) {
                Change::Keep => return Ok(current),
                Change::Abort(e) => return Err(e),
                Change::Write => {}
            }
            let guard = Compare::ModRevision(key.into(), current.revision);
            match self.store_put(key, encode(&current.value), guard).await {
                Ok(revision) => return Ok(Versioned { value: current.value, revision: self.wrote(key, revision) }),
                Err(kayra_store::Error::Conflict(_)) => continue,
                Err(kayra_store::Error::NotFound(_)) => return Err(Error::NotFound(what.to_string())),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A create (`guard` `Absent`) or update (`guard` `ModRevision`) of one
    /// key: the store's own single-key write, or with riders one transaction.
    async fn store_put(&self, key: &str, value: Vec<u8>, guard: Compare) -> kayra_store::Result<Revision> {
        match (self.riders.is_empty(), guard) {
            (true, Compare::Absent(_)) => self.base.store.create(key, value).await,
            (true, Compare::ModRevision(_, revision)) => self.base.store.update(key, value, revision).await,
            (_, guard) => self.store_txn_one(key, guard, Op::Put { key: key.into(), value }).await,
        }
    }

    /// One guarded write of `key` with this handle's riders, answering as
    /// the store's single-key writes do: `NotFound` when the key is missing
    /// and had to exist, `Conflict` when the guard failed otherwise.
    async fn store_txn_one(&self, key: &str, guard: Compare, op: Op) -> kayra_store::Result<Revision> {
        let must_exist = !matches!(guard, Compare::Absent(_));
        let mut txn = Txn::new().when(guard).then(op).otherwise(Op::Get { key: key.into() });
        // The riders first, the record last: the local store gives each
        // put its own revision, and the answer's is then the record's.
        txn.success.splice(0..0, self.riders.iter().cloned());
        let resp = self.base.store.txn_grouped(txn).await?;
        match (resp.succeeded, resp.gets.first()) {
            (true, _) => Ok(resp.revision),
            (false, Some(None)) if must_exist => Err(kayra_store::Error::NotFound(key.into())),
            (false, _) => Err(kayra_store::Error::Conflict(key.into())),
        }
    }

    /// The store keys of what one reconcile job reads fresh under its lock:
    /// the subscription, its registration, its given-up attempt record and
    /// its run history (which the result's write rewrites with its run). The lock's own transaction can carry these reads
    /// (`kayra_store::JobLocker::try_lock_and_get`); decode its gets with
    /// [`Repository::decode_job_read`].
    pub fn job_read_keys(&self, namespace: &str, api: &str) -> Vec<String> {
        [
            RecordRef::Subscription { namespace, api },
            RecordRef::Registration(api),
            RecordRef::Attempt { namespace, api },
            RecordRef::Runs { namespace, api },
        ]
        .into_iter()
        .map(|record| self.base.layout.key(record))
        .collect()
    }

    /// Decodes the gets of [`Repository::job_read_keys`], read at `revision`;
    /// `A` is the reconciler's attempt record.
    pub fn decode_job_read<A: DeserializeOwned>(
        &self,
        gets: &[Option<kayra_store::KeyValue>],
        revision: Revision,
    ) -> Result<JobRead<A>> {
        fn one<T: DeserializeOwned>(gets: &[Option<kayra_store::KeyValue>], i: usize) -> Result<Option<Versioned<T>>> {
            gets.get(i).and_then(Option::as_ref).map(decode).transpose()
        }
        let attempt: Option<Versioned<A>> = one(gets, 2)?;
        Ok(JobRead {
            subscription: one(gets, 0)?,
            registration: one(gets, 1)?,
            attempt_revision: attempt.as_ref().map_or(0, |a| a.revision),
            attempt: attempt.map(|v| v.value),
            runs: gets.get(3).and_then(Option::as_ref).map(|kv| {
                // Runs are history, not state: a history that does not
                // read is replaced by the next run's, never a job's end.
                RunRing::decode(&kv.value).unwrap_or_else(|e| {
                    tracing::warn!(key = %kv.key, error = %e, "run history unreadable; the next run starts it anew");
                    RunRing::default()
                })
            }),
            revision,
        })
    }

    /// The job read of [`Repository::job_read_keys`] in one round trip (a
    /// transaction of four gets), where the lock's own transaction did not
    /// carry it. Not group-committed: a read never queues behind other
    /// jobs' writes (locally it is a point read beside them).
    pub async fn read_job<A: DeserializeOwned>(&self, namespace: &str, api: &str) -> Result<JobRead<A>> {
        let keys = self.job_read_keys(namespace, api);
        let txn = keys.into_iter().fold(Txn::new(), |txn, key| txn.then(Op::Get { key }));
        let resp = self.base.store.txn(txn).await?;
        self.decode_job_read(&resp.gets, resp.revision)
    }

    /// The reconciler's result write (platform contract §7): the decided
    /// subscription, with `riders` (the run record, the run cursor), in ONE
    /// store transaction that commits only if the subscription is still at
    /// the revision the decision was made on and, with a job lock (etcd),
    /// the lock is still held (fencing: its key exists); with `unlock` the
    /// transaction also deletes the lock key. Shares its round trip with
    /// other results on their way to the store ([`Store::txn_grouped`]).
    pub async fn write_result(&self, write: &ResultWrite<'_>, riders: &[Rider<'_>]) -> Result<ResultCommit> {
        let (namespace, api) = (&write.seen.value.namespace, &write.seen.value.api);
        let key = self.base.layout.key(RecordRef::Subscription { namespace, api });
        let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), write.seen.revision));
        // The riders and the unlock first, the subscription last: the local store gives
        // every put its own revision, and the revision the commit answers
        // must be the subscription's own (the reconciler's view keeps it,
        // and the watch's echo of the record must not look older).
        txn = riders.iter().flat_map(|rider| self.rider_ops(rider)).fold(txn, Txn::then);
        txn.success.extend(self.riders.iter().cloned());
        if let Some(lock) = write.lock {
            let fence = lock.store_key.clone();
            txn = txn.when(Compare::Exists(fence.clone())).otherwise(Op::Get { key: fence.clone() });
            if write.unlock {
                txn = txn.then(Op::Delete { key: fence });
            }
        }
        if let Some(fanout) = &write.fanout {
            let marker = self.base.layout.key(RecordRef::FanoutMarker(fanout.api));
            let guard = match fanout.seen {
                Some(revision) => Compare::ModRevision(marker.clone(), revision),
                None => Compare::Absent(marker.clone()),
            };
            txn = txn
                .when(guard)
                .otherwise(Op::Get { key: marker.clone() })
                .then(Op::Put { key: marker, value: encode(fanout.marker) });
        }
        if let Some(next) = write.next {
            // A result is no re-sync request (§4.4 `trigger`): its echo must
            // never read as one, whatever `next` carried over.
            let cleared;
            let next = if next.resync_requested {
                cleared = Subscription { resync_requested: false, ..next.clone() };
                &cleared
            } else {
                next
            };
            let value =
                serde_json::to_vec(next).map_err(|e| Error::Corrupt { key: key.clone(), message: e.to_string() })?;
            if write.clear_runs {
                txn = txn
                    .then(Op::DeletePrefix { prefix: self.base.layout.prefix(Collection::RunSlots { namespace, api }) })
                    .then(Op::Delete { key: self.base.layout.key(RecordRef::Runs { namespace, api }) });
            }
            txn = txn.then(Op::Put { key, value });
        }
        let resp = self.base.store.txn_grouped(txn).await?;
        if resp.succeeded {
            return Ok(ResultCommit::Committed(resp.revision));
        }
        let mut gets = resp.gets.iter();
        if write.lock.is_some() && matches!(gets.next(), Some(None)) {
            return Ok(ResultCommit::Fenced);
        }
        if let (Some(fanout), Some(found)) = (&write.fanout, gets.next())
            && found.as_ref().map(|kv| kv.mod_revision) != fanout.seen
        {
            return Ok(ResultCommit::MarkerMoved);
        }
        Ok(ResultCommit::Stale)
    }
}

/// A record written in the same store transaction as the write it rides on
/// (see the module docs). The Repository knows each one's key.
#[derive(Debug, Clone, Copy)]
pub enum Rider<'a> {
    /// A subscription's run history (platform §4.4) as a run leaves it:
    /// `ring` replaces the record. `first` when the job read none (an
    /// earlier build's run records of the subscription, one a ring slot,
    /// are deleted with it).
    Runs { namespace: &'a str, api: &'a str, ring: &'a RunRing, first: bool },
    /// The audit record of a catalog change (platform §13), keyed newest
    /// first ([`audit::order_key`]).
    Audit(&'a kayra_core::AuditRecord),
    /// A notification's delivery to one sink (§14's outbox): written with
    /// the change that caused its event. Its key is its id, which is
    /// deterministic, so a write retried writes the same record again.
    Delivery(&'a kayra_core::notifications::Delivery),
    /// A cancel request answered by the reconciler that held its run
    /// (§12): the request with the run as recorded, written with the run's
    /// result so the request's waiter reads both at once.
    CancelAnswer(&'a cancels::CancelRequest),
}

/// What one reconcile job reads fresh under its lock ([`Repository::read_job`]).
#[derive(Debug, Clone)]
pub struct JobRead<A> {
    pub subscription: Option<Versioned<Subscription>>,
    pub registration: Option<Versioned<kayra_core::ApiRegistration>>,
    /// The reconciler's given-up attempt record.
    pub attempt: Option<A>,
    /// The store revision the attempt record was written at (0: none).
    pub attempt_revision: Revision,
    /// The subscription's run history (`None`: no record yet).
    pub runs: Option<RunRing>,
    /// The store revision of the read.
    pub revision: Revision,
}

/// A decided reconcile result ([`Repository::write_result`]).
#[derive(Debug, Clone, Copy)]
pub struct ResultWrite<'a> {
    /// The subscription as the decision read it: the write commits only
    /// while it is still at this revision.
    pub seen: &'a Versioned<Subscription>,
    /// The subscription as the result leaves it; `None` leaves it
    /// untouched (its watchers see no event).
    pub next: Option<&'a Subscription>,
    /// With `next`, also delete the subscription's run history (a
    /// `run_history` of 0: older runs go at the next write).
    pub clear_runs: bool,
    /// The job lock the result is fenced by (etcd): the write commits only
    /// while its key exists.
    pub lock: Option<&'a JobLock>,
    /// With `lock`, delete the lock key in the same transaction.
    pub unlock: bool,
    /// The fan-out this result finishes (§14 `fanout.completed`): its
    /// marker is written too, and the write commits only while the
    /// marker is as seen (else [`ResultCommit::MarkerMoved`]).
    pub fanout: Option<FanoutWrite<'a>>,
}

/// The fan-out marker a result writes when it finishes its API's fan-out.
#[derive(Debug, Clone, Copy)]
pub struct FanoutWrite<'a> {
    pub api: &'a str,
    /// The marker's revision as seen (`None`: no marker yet).
    pub seen: Option<Revision>,
    pub marker: &'a kayra_core::notifications::FanoutMarker,
}

/// What [`Repository::write_result`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultCommit {
    /// Committed, at this store revision.
    Committed(Revision),
    /// The subscription changed since it was read: nothing was written.
    Stale,
    /// The job lock is no longer held: nothing was written.
    Fenced,
    /// The fan-out marker moved since it was seen (another writer recorded
    /// the fan-out): nothing was written; write again without it.
    MarkerMoved,
}

/// The keys `ops` (one branch of a transaction) write that the caches
/// must hear of ([`Repository::wrote`]): every put but a create (a put
/// guarded by `Absent` on its key), every delete and deleted prefix.
fn written_keys(compares: &[kayra_store::Compare], ops: &[Op]) -> Vec<String> {
    let created = |key: &str| compares.iter().any(|c| matches!(c, kayra_store::Compare::Absent(k) if k == key));
    ops.iter()
        .filter_map(|op| match op {
            Op::Put { key, .. } if !created(key) => Some(key.clone()),
            Op::Delete { key } => Some(key.clone()),
            Op::DeletePrefix { prefix } => Some(prefix.clone()),
            _ => None,
        })
        .collect()
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing our own plain structs into JSON cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

pub(crate) fn decode<T: DeserializeOwned>(kv: &kayra_store::KeyValue) -> Result<Versioned<T>> {
    serde_json::from_slice(&kv.value)
        .map(|value| Versioned { value, revision: kv.mod_revision })
        .map_err(|e| Error::Corrupt { key: kv.key.clone(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use kayra_core::{Namespace, Run};

    use super::*;

    /// A repository of deployment dev/local on a fresh local store (the
    /// repo modules' tests share it).
    pub(super) async fn local_repo() -> (tempfile::TempDir, Repository) {
        let dir = tempfile::tempdir().unwrap();
        let config = kayra_config::DatabaseConfig::local(kayra_testkit::local_config(dir.path()));
        let store = Store::open(&config).await.unwrap();
        (dir, Repository::new(store, "dev", "local"))
    }

    fn run(id: &str) -> Run {
        Run { id: id.into(), namespace: "core".into(), api: "compute.example.com".into(), ..Run::default() }
    }

    /// A history of the runs `ids`, given newest first.
    fn history(ids: &[&str]) -> RunRing {
        RunRing::of(&ids.iter().map(|id| run(id)).collect::<Vec<_>>(), 20)
    }

    fn rider(ring: &RunRing, first: bool) -> Rider<'_> {
        Rider::Runs { namespace: "core", api: "compute.example.com", ring, first }
    }

    /// The subscription's run ids, in order.
    async fn runs(repo: &Repository) -> Vec<String> {
        let page = repo.runs_page("core", "compute.example.com", None, 0).await.unwrap();
        let mut ids: Vec<String> = page.items.into_iter().map(|r| r.id).collect();
        ids.sort();
        ids
    }

    #[tokio::test]
    async fn a_rider_commits_with_its_write_and_only_with_it() {
        let (_dir, repo) = local_repo().await;
        let first = history(&["r1"]);
        let riding = repo.with_riders(&[rider(&first, true)]);
        let ns = Namespace { name: "core".into(), ..Namespace::default() };
        riding.create(RecordRef::Namespace("core"), &ns, "namespace").await.unwrap();
        assert_eq!(runs(&repo).await, ["r1"], "written with the create");

        // A write that fails writes none of its riders.
        let second = history(&["r2", "r1"]);
        let riding = repo.with_riders(&[rider(&second, false)]);
        let e = riding.create(RecordRef::Namespace("core"), &ns, "namespace").await.unwrap_err();
        assert!(matches!(e, Error::Conflict(_)), "{e}");
        let e = riding.update(RecordRef::Namespace("core"), &ns, 999, "namespace").await.unwrap_err();
        assert!(matches!(e, Error::Conflict(_)), "{e}");
        let e = riding.update(RecordRef::Namespace("gone"), &ns, 1, "namespace").await.unwrap_err();
        assert!(matches!(e, Error::NotFound(_)), "{e}");
        assert_eq!(runs(&repo).await, ["r1"]);

        // Every kind of write carries them: a read-modify-write, a delete,
        // and the Repository's own multi-record transactions.
        riding.modify::<Namespace, _>(RecordRef::Namespace("core"), "namespace", |_| Change::Write).await.unwrap();
        assert_eq!(runs(&repo).await, ["r1", "r2"]);
        let third = history(&["r3", "r2"]);
        repo.with_riders(&[rider(&third, false)]).delete_namespace("core").await.unwrap();
        assert_eq!(runs(&repo).await, ["r2", "r3"], "r1 went past the history");
        let fourth = history(&["r4", "r3"]);
        let riding = repo.with_riders(&[rider(&fourth, false)]);
        assert!(matches!(
            riding.delete(RecordRef::Namespace("core"), None, "namespace").await,
            Err(Error::NotFound(_))
        ));
        assert_eq!(runs(&repo).await, ["r2", "r3"]);
    }

    #[tokio::test]
    async fn the_result_write_is_one_fenced_transaction_with_its_riders() {
        let (_dir, repo) = local_repo().await;
        let (namespace, api) = ("core", "compute.example.com");
        let sub = Subscription::new(namespace, api);
        let revision = repo.create(RecordRef::Subscription { namespace, api }, &sub, "subscription").await.unwrap();
        let seen = Versioned { value: sub.clone(), revision };
        let next = Subscription { active: true, ..sub.clone() };
        let first = history(&["r1"]);
        let riders = [rider(&first, true)];
        // A run record and run counter an earlier build left: the first
        // history replaces them.
        let slot = repo.layout().key(RecordRef::RunSlot { namespace, api, slot: 3 });
        repo.store().create(&slot, kayra_core::run_codec::encode(&run("r0"))).await.unwrap();
        let cursor = repo.layout().key(RecordRef::RunCursor { namespace, api });
        repo.store().create(&cursor, br#"{"next":4}"#.to_vec()).await.unwrap();
        assert_eq!(runs(&repo).await, ["r0"], "read while there is no history");

        // A lock that is no longer held: nothing is written.
        let lock_at = |store_key: &str| JobLock {
            job: "j".into(),
            key: "k".into(),
            create_revision: 1,
            store_key: store_key.into(),
        };
        let lock = lock_at("/locks/gone");
        let write = ResultWrite {
            seen: &seen,
            next: Some(&next),
            clear_runs: false,
            lock: Some(&lock),
            unlock: true,
            fanout: None,
        };
        assert_eq!(repo.write_result(&write, &riders).await.unwrap(), ResultCommit::Fenced);
        assert_eq!(repo.get::<Subscription>(RecordRef::Subscription { namespace, api }).await.unwrap().unwrap(), seen);
        assert_eq!(runs(&repo).await, ["r0"]);

        // Held: the subscription, the run and the lock's delete commit together.
        let held = repo.store().create("/locks/held", Vec::new()).await.unwrap();
        assert!(held > 0);
        let lock = lock_at("/locks/held");
        let write = ResultWrite { lock: Some(&lock), ..write };
        let ResultCommit::Committed(at) = repo.write_result(&write, &riders).await.unwrap() else {
            panic!("the result commits while the lock is held")
        };
        let stored = repo.get::<Subscription>(RecordRef::Subscription { namespace, api }).await.unwrap().unwrap();
        assert_eq!(stored.value, next);
        assert_eq!(stored.revision, at, "the commit's revision is the subscription's own, riders or not");
        assert_eq!(runs(&repo).await, ["r1"]);
        assert_eq!(repo.store().get(&slot).await.unwrap().0, None, "the earlier build's record went");
        assert_eq!(repo.store().get(&cursor).await.unwrap().0, None, "and its run counter");
        assert!(repo.store().get("/locks/held").await.unwrap().0.is_none(), "unlocked in the same transaction");

        // Decided on an old revision: stale, and its riders are not written.
        let second = history(&["r2", "r1"]);
        let write = ResultWrite { seen: &seen, next: None, clear_runs: false, lock: None, unlock: false, fanout: None };
        let riders = [rider(&second, false)];
        assert_eq!(repo.write_result(&write, &riders).await.unwrap(), ResultCommit::Stale);
        assert_eq!(runs(&repo).await, ["r1"]);

        // Only the run is new: the subscription is left as it is.
        let current = stored;
        let write = ResultWrite { seen: &current, ..write };
        assert!(matches!(repo.write_result(&write, &riders).await.unwrap(), ResultCommit::Committed(_)));
        let stored = repo.get::<Subscription>(RecordRef::Subscription { namespace, api }).await.unwrap().unwrap();
        assert_eq!(stored, current, "the subscription was not rewritten");
        assert_eq!(runs(&repo).await, ["r1", "r2"]);

        // A run history of 0: the rewrite clears the runs.
        let last = Subscription { state: kayra_core::SubscriptionState::Error, ..next.clone() };
        let write = ResultWrite {
            seen: &current,
            next: Some(&last),
            clear_runs: true,
            lock: None,
            unlock: false,
            fanout: None,
        };
        assert!(matches!(repo.write_result(&write, &[]).await.unwrap(), ResultCommit::Committed(_)));
        assert!(runs(&repo).await.is_empty());
    }

    #[tokio::test]
    async fn a_result_finishing_a_fan_out_commits_only_while_the_marker_is_as_seen() {
        let (_dir, repo) = local_repo().await;
        let (namespace, api) = ("core", "compute.example.com");
        let sub = Subscription::new(namespace, api);
        let revision = repo.create(RecordRef::Subscription { namespace, api }, &sub, "subscription").await.unwrap();
        let seen = Versioned { value: sub.clone(), revision };
        let next = Subscription { active: true, ..sub };
        let marker = kayra_core::notifications::FanoutMarker { sync_id: "s1".into() };
        let fanout = FanoutWrite { api, seen: None, marker: &marker };
        let write = ResultWrite {
            seen: &seen,
            next: Some(&next),
            clear_runs: false,
            lock: None,
            unlock: false,
            fanout: Some(fanout),
        };

        // Another writer recorded a fan-out first: nothing is written.
        let other = kayra_core::notifications::FanoutMarker { sync_id: "s0".into() };
        assert!(repo.complete_fanout(api, None, &other, &[]).await.unwrap());
        let moved = repo.fanout_marker(api).await.unwrap().unwrap();
        assert_eq!(repo.write_result(&write, &[]).await.unwrap(), ResultCommit::MarkerMoved);
        assert_eq!(repo.get::<Subscription>(RecordRef::Subscription { namespace, api }).await.unwrap().unwrap(), seen);

        // As seen: the marker and the subscription commit together.
        let write = ResultWrite { fanout: Some(FanoutWrite { seen: Some(moved.revision), ..fanout }), ..write };
        let ResultCommit::Committed(at) = repo.write_result(&write, &[]).await.unwrap() else {
            panic!("the result commits while the marker is as seen")
        };
        let stored = repo.fanout_marker(api).await.unwrap().unwrap();
        assert_eq!(stored.value, marker);
        assert!(stored.revision <= at && stored.revision > moved.revision);

        // A stale subscription with the marker as seen is stale, not moved.
        let write = ResultWrite { fanout: Some(FanoutWrite { seen: Some(stored.revision), ..fanout }), ..write };
        assert_eq!(repo.write_result(&write, &[]).await.unwrap(), ResultCommit::Stale);
    }
}
