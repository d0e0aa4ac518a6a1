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
//! pinned to now, so the lease outlives a member's loss. A leader election
//! does not expire leases (the new leader extends them), so a session
//! survives one shorter than `lock_ttl` and its locks stay held. Every
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
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::{Keyspace, revision_of};
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
}

impl EtcdJobLocker {
    /// No I/O: the session lease is granted by the first `lock`.
    pub(super) fn new(keys: Keyspace, ttl: Duration, retry_interval: Duration) -> Self {
        let session = Session::new(keys.cluster.clone(), ttl);
        // A zero interval would turn a blocked lock into a busy loop on etcd.
        let retry_interval = retry_interval.max(Duration::from_millis(1));
        Self { inner: Arc::new(Inner { keys, session, retry_interval, local: LocalLocks::default() }) }
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
        let (mine, gets) = self.inner.acquire_and_get(&prefix, &key, lease, keys).await?;
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
    async fn acquire_and_get(
        &self,
        prefix: &str,
        key: &str,
        lease: i64,
        keys: &[String],
    ) -> Result<(Option<(i64, i64)>, Vec<Option<crate::KeyValue>>)> {
        let owner = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        let reads = keys.iter().map(|k| TxnOp::get(self.keys.full(k), None));
        let success =
            [TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease))), TxnOp::get(prefix, Some(owner.clone()))];
        let failure = [TxnOp::get(key, None), TxnOp::get(prefix, Some(owner))];
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(success.into_iter().chain(reads.clone()).collect::<Vec<_>>())
            .or_else(failure.into_iter().chain(reads).collect::<Vec<_>>());
        // A retry after an unknown outcome finds the key already there:
        // the `else` branch reads it, so the answer is the same.
        let resp = self.keys.txn(txn).await?.value;
        let revision = revision_of(resp.header())?;
        let ops = resp.op_responses();
        let first = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(get)) => get.kvs().first(),
            _ => None,
        };
        let first_kv = |i: usize| first(i).map(etcd_client::KeyValue::create_revision);
        let mine = if resp.succeeded() {
            revision
        } else {
            // The key was already there (a retry after an unknown outcome):
            // it keeps its place in the queue, as in Go.
            first_kv(0).ok_or_else(|| Error::Unavailable(format!("lock key {key} vanished inside a transaction")))?
        };
        let gets = (0..keys.len()).map(|i| first(2 + i).and_then(|kv| self.keys.record(kv))).collect();
        Ok((first_kv(1).is_none_or(|owner| owner == mine).then_some((mine, revision)), gets))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.keys.cluster.delete(key, None).await?;
        Ok(())
    }
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
        let (keeper, responses, member) = match self.cluster.lease_keep_alive(id).await {
            Ok(opened) => opened,
            Err(e) => {
                let _ = self.cluster.lease_revoke(id).await;
                return Err(e);
            }
        };
        let lost = CancellationToken::new();
        let cluster = self.cluster.clone();
        let renewal = Renewal { cluster, id, ttl: Duration::from_secs(ttl_secs.unsigned_abs()), lost: lost.clone() };
        tokio::spawn(renewal.run(Stream { keeper, responses, member }, self.shutdown.clone()));
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

/// The keep-alive task of one lease.
struct Renewal {
    cluster: Cluster,
    id: i64,
    ttl: Duration,
    lost: CancellationToken,
}

/// A keep-alive stream and the cluster member it is open on.
struct Stream {
    keeper: LeaseKeeper,
    responses: LeaseKeepAliveStream,
    member: usize,
}

impl Renewal {
    async fn run(self, mut stream: Stream, shutdown: CancellationToken) {
        let period = self.ttl / 3;
        let mut renewed = Instant::now();
        loop {
            // Asked afresh each period: a member that went bad between two
            // periods is found by the renewal failing instead.
            let mut health = self.cluster.health(stream.member);
            let member_failed = tokio::select! {
                () = shutdown.cancelled() => {
                    // Free this process's locks now rather than after the TTL.
                    let _ = tokio::time::timeout(Duration::from_secs(1), self.cluster.lease_revoke(self.id)).await;
                    return;
                }
                () = tokio::time::sleep(period) => false,
                () = health.went_bad() => true,
            };
            let failure = if member_failed {
                "the member of the keep-alive stream failed its health check".to_string()
            } else {
                match renew(&mut stream, period).await {
                    Ok(true) => {
                        renewed = Instant::now();
                        continue;
                    }
                    Ok(false) => return self.give_up("etcd reports the lease expired"),
                    Err(e) => e,
                }
            };
            self.cluster.stream_failed(stream.member);
            if renewed.elapsed() >= self.ttl {
                return self.give_up(&format!("no renewal for a whole TTL ({failure})"));
            }
            tracing::warn!(lease = format!("{:x}", self.id), error = %failure, "lease keep-alive failed; reconnecting");
            match self.cluster.lease_keep_alive(self.id).await {
                // Opening the stream renews the lease once.
                Ok((keeper, responses, member)) => {
                    stream = Stream { keeper, responses, member };
                    renewed = Instant::now();
                }
                Err(e) if e.to_string().contains("lease not found") => return self.give_up(&e.to_string()),
                Err(_) => {}
            }
        }
    }

    fn give_up(self, why: &str) {
        tracing::warn!(lease = format!("{:x}", self.id), why, "job lock session lost; its locks are released");
        self.lost.cancel();
    }
}

/// One renewal: `Ok(false)` when etcd no longer knows the lease.
async fn renew(stream: &mut Stream, wait: Duration) -> Result<bool, String> {
    stream.keeper.keep_alive().await.map_err(|e| e.to_string())?;
    match tokio::time::timeout(wait, stream.responses.message()).await {
        Err(_) => Err("no keep-alive response".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(None)) => Err("keep-alive stream closed".into()),
        Ok(Ok(Some(resp))) => Ok(resp.ttl() > 0),
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
