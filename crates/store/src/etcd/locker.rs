//! `store.JobLocker` on etcd: one leased session, one mutex per job.
//!
//! # Why a TryLock loop
//! The seed asks for etcd's concurrency package semantics (a Session plus a
//! Mutex per job) with a waiter that *retries a non-blocking TryLock every
//! `lock_retry_interval`*. Go's `Mutex.TryLock` is reproduced here key for
//! key, so `etcdctl lock` and Go programs interoperate with kayra's locks:
//!
//! - the mutex of job `j` is the key prefix `<root>/locks/<j>/`; each
//!   contender owns the key `<root>/locks/<j>/<lease id in hex>`;
//! - one transaction puts my key (attached to my lease) if absent and reads
//!   the prefix's key with the lowest `create_revision`: that is the owner;
//! - I hold the lock iff the owner is my key; otherwise I delete my key and
//!   try again later. Unlock deletes my key.
//!
//! Two additions cost no extra round trip and change nothing a Go holder
//! sees: `try_lock_and_get` appends the caller's gets to both branches of
//! the TryLock transaction (a reconcile's fresh read), and a caller may
//! delete its own key inside its result transaction (the unlock), then
//! tell the locker with `unlocked_by_txn`.
//!
//! A job key may contain `/` (`subscriptions/<ns>/<api>`). It is escaped
//! (`%` → `%25`, `/` → `%2F`) so that one job's prefix can never contain
//! another job's keys (`a/` would otherwise own `a/b/<lease>`).
//!
//! The server-side `Lock` RPC was not used: it blocks inside etcd, and a
//! caller that gives up on it cannot tell whether it was granted meanwhile.
//!
//! # The session
//! One lease per locker (that is, per store, per process), with TTL
//! `lock_ttl`, renewed every `lock_ttl / 3` by a background task. The
//! keep-alive stream lives on one cluster member; when it fails, or that
//! member fails a health check, it is reopened on the member calls are
//! pinned to now, and tried again every 250 ms until one TTL has passed
//! since the last renewal (`renewal`), so the lease outlives a member's
//! loss. A leader election does not expire leases (the new leader extends
//! them), so a session survives one shorter than `lock_ttl` and its locks
//! stay held. Every
//! mutex key is attached to it, so the locks of a process killed with
//! SIGKILL vanish when the lease expires. If renewals fail for a whole TTL,
//! or etcd reports the lease gone, the session is marked lost and the next
//! [`JobLocker::lock`] grants a fresh lease. Locks held under a lost lease
//! are gone with it; the holder is not told (the `JobLocker` API has no
//! channel for that), which is why callers re-read records under the lock
//! and write with compare-and-swap. The lease is revoked when the locker is
//! dropped, so a clean shutdown frees its locks at once.
//!
//! # In-process exclusion
//! The contender key is per lease, not per call, so two tasks of one
//! process locking the same job would share one key and both "hold" it.
//! Calls for the same job are therefore serialised in-process first.
//!
//! # Cancellation
//! `lock` may be dropped at any await (callers `select!` it against
//! shutdown). Whatever the outcome of an in-flight transaction, a dropped
//! `lock` deletes its contender key in the background before letting the
//! next local caller in, so an abandoned attempt never ends up owning, or
//! queueing on, the mutex forever. `unlock` runs to completion in its own
//! task for the same reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::renewal::{self, EtcdKeepAlive};
use super::{Keyspace, revision_of};
use crate::group::Group;
use crate::{Error, JobLock, JobLocker, LockedRead, Result};

/// The etcd [`JobLocker`]. Cheap to share; get it from
/// [`crate::Store::job_locker`].
pub struct EtcdJobLocker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdJobLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdJobLocker").field("root", &self.inner.keys.root).finish_non_exhaustive()
    }
}

struct Inner {
    keys: Keyspace,
    session: Session,
    retry_interval: Duration,
    local: LocalLocks,
    /// Group commit of `try_lock_and_get`'s transactions, started by the first.
    acquisitions: std::sync::OnceLock<Group<Acquire, Result<Acquired>>>,
}

impl EtcdJobLocker {
    /// No I/O: the session lease is granted by the first `lock`.
    pub(super) fn new(keys: Keyspace, ttl: Duration, retry_interval: Duration) -> Self {
        let session = Session::new(keys.cluster.clone(), ttl);
        // A zero interval would turn a blocked lock into a busy loop on etcd.
        let retry_interval = retry_interval.max(Duration::from_millis(1));
        let local = LocalLocks::default();
        Self { inner: Arc::new(Inner { keys, session, retry_interval, local, acquisitions: Default::default() }) }
    }

    /// The lease every lock of this locker is attached to, granting one if
    /// there is none (or it was lost).
    pub async fn lease_id(&self) -> Result<i64> {
        self.inner.session.lease().await
    }
}

#[async_trait]
impl JobLocker for EtcdJobLocker {
    async fn lock(&self, job: &str) -> Result<JobLock> {
        let prefix = format!("{}/locks/{}/", self.inner.keys.root, escape(job));
        let local = self.inner.local.lock(job).await;
        let mut claim = Claim { inner: self.inner.clone(), job: job.to_string(), local: Some(local), key: None };
        loop {
            let lease = self.inner.session.lease().await?;
            let key = format!("{prefix}{lease:x}");
            // Set before the transaction: from here on a drop must clean up.
            claim.key = Some(key.clone());
            if let Some(revision) = self.inner.try_acquire(&prefix, &key, lease).await? {
                return Ok(claim.into_lock(revision));
            }
            self.inner.delete(&key).await?;
            claim.key = None;
            tokio::time::sleep(self.inner.retry_interval).await;
        }
    }

    async fn try_lock(&self, job: &str) -> Result<Option<JobLock>> {
        Ok(self.try_lock_and_get(job, &[]).await?.map(|read| read.lock))
    }

    async fn try_lock_and_get(&self, job: &str, keys: &[String]) -> Result<Option<LockedRead>> {
        let prefix = format!("{}/locks/{}/", self.inner.keys.root, escape(job));
        let Some(local) = self.inner.local.try_lock(job) else { return Ok(None) };
        let mut claim = Claim { inner: self.inner.clone(), job: job.to_string(), local: Some(local), key: None };
        let lease = self.inner.session.lease().await?;
        let key = format!("{prefix}{lease:x}");
        claim.key = Some(key.clone());
        let acquire = Acquire { prefix, key: key.clone(), lease, reads: keys.to_vec() };
        let (mine, gets) = self.inner.acquire_grouped(acquire).await?;
        if let Some((create_revision, revision)) = mine {
            return Ok(Some(LockedRead { lock: claim.into_lock(create_revision), gets, revision }));
        }
        self.inner.delete(&key).await?;
        claim.key = None;
        Ok(None)
    }

    async fn unlocked_by_txn(&self, lock: JobLock) -> Result<()> {
        self.inner.local.release(&lock.job);
        Ok(())
    }

    fn retry_interval(&self) -> Duration {
        self.inner.retry_interval
    }

    async fn unlock(&self, lock: JobLock) -> Result<()> {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let deleted = inner.delete(&lock.key).await;
            inner.local.release(&lock.job);
            deleted
        })
        .await
        .map_err(|e| Error::Unavailable(format!("unlock task failed: {e}")))?
    }
}

impl Inner {
    /// Go's `Mutex.TryLock`: one transaction that enqueues `key` (if not
    /// already there) and reads the current owner. `Some(create revision of
    /// key)` iff `key` owns it.
    async fn try_acquire(&self, prefix: &str, key: &str, lease: i64) -> Result<Option<i64>> {
        Ok(self.acquire_and_get(prefix, key, lease, &[]).await?.0.map(|(mine, _)| mine))
    }

    /// [`Inner::try_acquire`] with the caller's gets of `keys` (store keys)
    /// appended to both branches: `(Some((create revision of key, the
    /// transaction's revision)) iff key owns the mutex, the reads)`.
    async fn acquire_and_get(&self, prefix: &str, key: &str, lease: i64, keys: &[String]) -> Result<Acquired> {
        let acquire = Acquire { prefix: prefix.into(), key: key.into(), lease, reads: keys.to_vec() };
        acquire_one(&self.keys, &acquire).await
    }

    /// [`Inner::acquire_and_get`] through the group commit: acquisitions
    /// asked for while others are on their way share one transaction.
    async fn acquire_grouped(&self, acquire: Acquire) -> Result<Acquired> {
        let group = self.acquisitions.get_or_init(|| {
            let keys = self.keys.clone();
            Group::new(
                super::GROUP_IN_FLIGHT,
                32,
                Arc::new(move |batch: Vec<Acquire>| {
                    let keys = keys.clone();
                    Box::pin(async move { acquire_many(&keys, batch).await })
                }),
            )
        });
        group.submit(acquire).await.unwrap_or_else(|| Err(Error::Unavailable("the store is shutting down".into())))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.keys.cluster.delete(key, None).await?;
        Ok(())
    }
}

/// One TryLock (with the caller's reads) of [`Inner::acquire_and_get`].
struct Acquire {
    /// The job's mutex prefix.
    prefix: String,
    /// My contender key under it.
    key: String,
    lease: i64,
    /// Store keys read in the same transaction.
    reads: Vec<String>,
}

/// `(Some((create revision of my key, the transaction's revision)) iff my
/// key owns the mutex, the reads)`.
type Acquired = (Option<(i64, i64)>, Vec<Option<crate::KeyValue>>);

impl Acquire {
    fn owner(&self) -> TxnOp {
        let owner = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        TxnOp::get(self.prefix.as_str(), Some(owner))
    }

    fn reads<'a>(&'a self, keys: &'a Keyspace) -> impl Iterator<Item = TxnOp> + 'a {
        self.reads.iter().map(|k| TxnOp::get(keys.full(k), None))
    }

    /// Put my key, read the owner, then the reads.
    fn success(&self, keys: &Keyspace) -> Vec<TxnOp> {
        let put = TxnOp::put(self.key.as_str(), "", Some(PutOptions::new().with_lease(self.lease)));
        [put, self.owner()].into_iter().chain(self.reads(keys)).collect()
    }

    /// Operations of the success branch (and of the failure branch).
    fn ops(&self) -> usize {
        2 + self.reads.len()
    }

    /// The answer, from this acquisition's responses (`ops`, its first
    /// first) given my key's create revision and the transaction's.
    fn answer(&self, keys: &Keyspace, ops: &[TxnOpResponse], mine: i64, revision: i64) -> Acquired {
        let first = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(get)) => get.kvs().first(),
            _ => None,
        };
        let gets = (0..self.reads.len()).map(|i| first(2 + i).and_then(|kv| keys.record(kv))).collect();
        let owner = first(1).map(etcd_client::KeyValue::create_revision);
        (owner.is_none_or(|owner| owner == mine).then_some((mine, revision)), gets)
    }
}

/// Go's TryLock as one transaction of its own.
async fn acquire_one(keys: &Keyspace, acquire: &Acquire) -> Result<Acquired> {
    let failure: Vec<TxnOp> =
        [TxnOp::get(acquire.key.as_str(), None), acquire.owner()].into_iter().chain(acquire.reads(keys)).collect();
    let txn = Txn::new()
        .when([Compare::create_revision(acquire.key.as_str(), CompareOp::Equal, 0)])
        .and_then(acquire.success(keys))
        .or_else(failure);
    // A retry after an unknown outcome finds the key already there:
    // the `else` branch reads it, so the answer is the same.
    let resp = keys.txn(txn).await?.value;
    let revision = revision_of(resp.header())?;
    let ops = resp.op_responses();
    let mine = if resp.succeeded() {
        revision
    } else {
        // The key was already there (a retry after an unknown outcome):
        // it keeps its place in the queue, as in Go.
        match ops.first() {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().map(etcd_client::KeyValue::create_revision),
            _ => None,
        }
        .ok_or_else(|| Error::Unavailable(format!("lock key {} vanished inside a transaction", acquire.key)))?
    };
    Ok(acquire.answer(keys, &ops, mine, revision))
}

/// Several TryLocks in one transaction: every contender key is put iff
/// none exists yet (a retry after an unknown outcome is the only way one
/// can), each job's owner read as in [`acquire_one`]. The keys are of
/// different jobs (one process contends for a job once at a time), so the
/// one transaction is the same as each alone; if any key already exists,
/// each is sent alone instead. Each lock key gets the transaction's
/// revision as its create revision: still a fencing token that grows with
/// every acquisition of that job.
async fn acquire_many(keys: &Keyspace, batch: Vec<Acquire>) -> Vec<Result<Acquired>> {
    let mut chunks: Vec<Vec<Acquire>> = Vec::new();
    for acquire in batch {
        match chunks.last_mut() {
            Some(chunk) if chunk.iter().map(Acquire::ops).sum::<usize>() + acquire.ops() <= super::MAX_TXN_OPS => {
                chunk.push(acquire);
            }
            _ => chunks.push(vec![acquire]),
        }
    }
    let mut answers = Vec::new();
    for chunk in chunks {
        if let [only] = &chunk[..] {
            answers.push(acquire_one(keys, only).await);
            continue;
        }
        let compares: Vec<Compare> =
            chunk.iter().map(|a| Compare::create_revision(a.key.as_str(), CompareOp::Equal, 0)).collect();
        let success: Vec<TxnOp> = chunk.iter().flat_map(|a| a.success(keys)).collect();
        match keys.txn(Txn::new().when(compares).and_then(success)).await {
            Ok(attempted) if attempted.value.succeeded() => {
                let resp = attempted.value;
                let revision = revision_of(resp.header());
                let ops = resp.op_responses();
                let mut from = 0;
                for acquire in &chunk {
                    let mine = &ops[from.min(ops.len())..(from + acquire.ops()).min(ops.len())];
                    from += acquire.ops();
                    answers.push(revision.clone().map(|r| acquire.answer(keys, mine, r, r)));
                }
            }
            Ok(_) => {
                answers.extend(futures::future::join_all(chunk.iter().map(|a| acquire_one(keys, a))).await);
            }
            Err(e) => answers.extend(chunk.iter().map(|_| Err(e.clone()))),
        }
    }
    answers
}

/// `%` → `%25`, `/` → `%2F`: a job key as one path segment.
fn escape(job: &str) -> String {
    job.replace('%', "%25").replace('/', "%2F")
}

/// One `lock` call in progress: the in-process slot it holds and the etcd
/// key it may have written. Dropped unfinished, it removes both.
struct Claim {
    inner: Arc<Inner>,
    job: String,
    local: Option<OwnedMutexGuard<()>>,
    key: Option<String>,
}

impl Claim {
    fn into_lock(mut self, create_revision: i64) -> JobLock {
        if let Some(guard) = self.local.take() {
            self.inner.local.hold(&self.job, guard);
        }
        let key = self.key.take().unwrap_or_default();
        let store_key = key.strip_prefix(&self.inner.keys.root).unwrap_or(&key).to_string();
        JobLock { job: self.job.clone(), key, create_revision, store_key }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let Some(guard) = self.local.take() else { return };
        let Some(key) = self.key.take() else {
            drop(guard);
            self.inner.local.forget_if_unused(&self.job);
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (inner, job) = (self.inner.clone(), std::mem::take(&mut self.job));
        runtime.spawn(async move {
            if let Err(e) = inner.delete(&key).await {
                tracing::warn!(%key, error = %e, "abandoned lock attempt left its key; it goes with the session lease");
            }
            drop(guard);
            inner.local.forget_if_unused(&job);
        });
    }
}

/// In-process exclusion per job: a mutex per job key, created on demand and
/// forgotten when nobody holds or waits on it. The guard of a held lock is
/// parked here between `lock` and `unlock`.
#[derive(Default)]
struct LocalLocks {
    jobs: Mutex<HashMap<String, LocalJob>>,
}

#[derive(Default)]
struct LocalJob {
    mutex: Arc<tokio::sync::Mutex<()>>,
    held: Option<OwnedMutexGuard<()>>,
}

impl LocalLocks {
    async fn lock(&self, job: &str) -> OwnedMutexGuard<()> {
        let mutex = self.jobs().entry(job.to_string()).or_default().mutex.clone();
        mutex.lock_owned().await
    }

    /// `None` when another local caller holds or is taking `job`.
    fn try_lock(&self, job: &str) -> Option<OwnedMutexGuard<()>> {
        let mutex = self.jobs().entry(job.to_string()).or_default().mutex.clone();
        mutex.try_lock_owned().ok()
    }

    fn hold(&self, job: &str, guard: OwnedMutexGuard<()>) {
        self.jobs().entry(job.to_string()).or_default().held = Some(guard);
    }

    fn release(&self, job: &str) {
        let guard = self.jobs().get_mut(job).and_then(|entry| entry.held.take());
        drop(guard);
        self.forget_if_unused(job);
    }

    fn forget_if_unused(&self, job: &str) {
        let mut jobs = self.jobs();
        if jobs.get(job).is_some_and(|entry| entry.held.is_none() && Arc::strong_count(&entry.mutex) == 1) {
            jobs.remove(job);
        }
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<String, LocalJob>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The session: one lease, kept alive in the background, replaced when lost.
struct Session {
    cluster: Cluster,
    ttl: Duration,
    current: tokio::sync::Mutex<Option<Lease>>,
    /// Cancelled on drop: the keep-alive task revokes the lease and exits.
    shutdown: CancellationToken,
}

struct Lease {
    id: i64,
    /// Cancelled by the keep-alive task when the lease is gone.
    lost: CancellationToken,
}

impl Session {
    fn new(cluster: Cluster, ttl: Duration) -> Self {
        Self { cluster, ttl, current: tokio::sync::Mutex::new(None), shutdown: CancellationToken::new() }
    }

    async fn lease(&self) -> Result<i64> {
        let mut current = self.current.lock().await;
        if let Some(lease) = current.as_ref().filter(|lease| !lease.lost.is_cancelled()) {
            return Ok(lease.id);
        }
        // etcd leases have whole-second TTLs.
        let ttl_secs = i64::try_from(self.ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX).max(1);
        // A grant retried after an unknown outcome may leave an unused
        // lease behind: it expires after its TTL.
        let id = self.cluster.lease_grant(ttl_secs).await?.id();
        let opened = match self.cluster.lease_keep_alive(id).await {
            Ok(opened) => opened,
            Err(e) => {
                let _ = self.cluster.lease_revoke(id).await;
                return Err(e);
            }
        };
        let lost = CancellationToken::new();
        let link = EtcdKeepAlive::new(self.cluster.clone(), id, opened);
        let ttl = Duration::from_secs(ttl_secs.unsigned_abs());
        tokio::spawn(renewal::run(link, ttl, lost.clone(), self.shutdown.clone()));
        tracing::debug!(lease = format!("{id:x}"), ttl_secs, "job lock session started");
        *current = Some(Lease { id, lost });
        Ok(id)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_keys_escape_to_one_segment() {
        assert_eq!(escape("subscriptions/core/a.example.com"), "subscriptions%2Fcore%2Fa.example.com");
        assert_eq!(escape("100%/x"), "100%25%2Fx");
        assert_ne!(escape("a%2Fb"), escape("a/b"));
    }

    #[tokio::test]
    async fn local_locks_serialise_one_job_and_forget_idle_entries() {
        let locks = Arc::new(LocalLocks::default());
        let first = locks.lock("a").await;
        locks.hold("a", first);
        let waiter = tokio::spawn({
            let locks = locks.clone();
            async move { locks.lock("a").await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a held job blocks a second local caller");
        let other = locks.lock("b").await;
        drop(other);
        locks.forget_if_unused("b");
        locks.release("a");
        let second = waiter.await.expect("waiter");
        drop(second);
        locks.forget_if_unused("a");
        assert!(locks.jobs().is_empty());
    }
}
