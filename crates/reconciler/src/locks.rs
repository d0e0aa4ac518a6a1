//! Per-job locking (seed, "Per-job locking").
//!
//! Two layers. In-process, the work queue itself is the lock: a key being
//! processed is never handed out again until it is done, and a trigger
//! that arrives meanwhile runs it once more afterwards (it "blocks until
//! its turn comes", waiting in the queue). Across processes, the store's
//! [`JobLocker`] (etcd) is taken without blocking, before the job has a
//! pool slot: a job that finds its lock held by another process goes back
//! to the queue and retries every `lock_retry_interval`.
//!
//! A held lock is a [`JobGuard`]: dropped without [`JobGuard::release`]
//! (a panic, an early return) it still unlocks, in the background, so a
//! job can never leave its lock parked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kayra_store::{JobLock, JobLocker, KeyValue, LockedRead, Revision};

use crate::queue::JobKey;

/// The job locks of one reconciler process.
#[derive(Clone)]
pub struct JobLocks {
    distributed: Option<Arc<dyn JobLocker>>,
    platform: String,
    region: String,
}

/// What one try found.
pub enum Acquired {
    Held(JobGuard),
    /// Another process holds it (or the store could not be asked): retry later.
    Busy,
}

/// A held job lock.
pub struct JobGuard {
    held: Option<(Arc<dyn JobLocker>, JobLock)>,
    /// What [`JobLocks::try_lock_and_get`] read with the lock, until taken.
    reads: Option<(Vec<Option<KeyValue>>, Revision)>,
}

impl JobLocks {
    pub fn new(distributed: Option<Arc<dyn JobLocker>>, platform: &str, region: &str) -> Self {
        Self { distributed, platform: platform.into(), region: region.into() }
    }

    /// Whether other processes may share the work (a cross-process job
    /// locker: etcd).
    pub fn shared(&self) -> bool {
        self.distributed.is_some()
    }

    /// One non-blocking try. The caller already holds `key` in-process (it
    /// is processing it in the work queue).
    pub async fn try_lock(&self, key: &JobKey) -> Acquired {
        let Some(locker) = &self.distributed else { return Acquired::Held(JobGuard { held: None, reads: None }) };
        let job = key.lock_key(&self.platform, &self.region);
        let started = Instant::now();
        match locker.try_lock(&job).await {
            Ok(Some(lock)) => {
                metrics::histogram!(super::METRIC_LOCK_WAIT).record(started.elapsed().as_secs_f64());
                Acquired::Held(JobGuard { held: Some((locker.clone(), lock)), reads: None })
            }
            Ok(None) => Acquired::Busy,
            Err(e) => {
                tracing::warn!(job, error = %e, "job lock failed; retrying");
                Acquired::Busy
            }
        }
    }

    /// [`JobLocks::try_lock`], reading `keys` in the same round trip where
    /// the store can (etcd). The reads come back with the guard
    /// ([`JobGuard::take_reads`]); without a distributed lock there are
    /// none and the caller reads itself.
    pub async fn try_lock_and_get(&self, key: &JobKey, keys: &[String]) -> Acquired {
        let Some(locker) = &self.distributed else {
            return Acquired::Held(JobGuard { held: None, reads: None });
        };
        let job = key.lock_key(&self.platform, &self.region);
        let started = Instant::now();
        match locker.try_lock_and_get(&job, keys).await {
            Ok(Some(LockedRead { lock, gets, revision })) => {
                metrics::histogram!(super::METRIC_LOCK_WAIT).record(started.elapsed().as_secs_f64());
                Acquired::Held(JobGuard { held: Some((locker.clone(), lock)), reads: Some((gets, revision)) })
            }
            Ok(None) => Acquired::Busy,
            Err(e) => {
                tracing::warn!(job, error = %e, "job lock failed; retrying");
                Acquired::Busy
            }
        }
    }

    /// How long a job whose lock is held elsewhere waits before its next try.
    pub fn retry_interval(&self) -> Duration {
        self.distributed.as_ref().map_or(Duration::from_millis(250), |l| l.retry_interval())
    }

    /// How long a job that holds its lock may wait for a pool slot before
    /// it unlocks and goes back to the queue: a retry interval where other
    /// processes share the work (so a busy pool keeps no job from them),
    /// without end where this process is the only one.
    pub fn slot_patience(&self) -> Option<Duration> {
        self.shared().then(|| self.retry_interval())
    }
}

impl JobGuard {
    /// The distributed lock's create revision (the fencing token on etcd);
    /// `None` without a distributed lock.
    pub fn fencing_token(&self) -> Option<Revision> {
        self.held.as_ref().map(|(_, lock)| lock.create_revision)
    }

    /// The distributed lock a result write is fenced by (its store key
    /// exists exactly while the lock is held); `None` without one.
    pub fn fence(&self) -> Option<&kayra_store::JobLock> {
        self.held.as_ref().map(|(_, lock)| lock)
    }

    /// The records read with the lock and the read's revision, once.
    pub fn take_reads(&mut self) -> Option<(Vec<Option<KeyValue>>, Revision)> {
        self.reads.take()
    }

    /// Releases the lock and waits for the store to confirm.
    pub async fn release(mut self) {
        if let Some((locker, lock)) = self.held.take() {
            unlock(locker, lock).await;
        }
    }

    /// The caller's own transaction deleted the lock's store key (the
    /// result write that is also the unlock): free the rest, no store call.
    pub async fn released_by_txn(mut self) {
        if let Some((locker, lock)) = self.held.take() {
            let job = lock.job.clone();
            if let Err(e) = locker.unlocked_by_txn(lock).await {
                tracing::warn!(job, error = %e, "job unlock failed; the lock frees itself when its lease expires");
            }
        }
    }
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        let Some((locker, lock)) = self.held.take() else { return };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(unlock(locker, lock));
        }
        // Without a runtime the session lease frees it after lock_ttl.
    }
}

async fn unlock(locker: Arc<dyn JobLocker>, lock: JobLock) {
    let job = lock.job.clone();
    if let Err(e) = locker.unlock(lock).await {
        // The session lease frees it after lock_ttl anyway.
        tracing::warn!(job, error = %e, "job unlock failed; the lock frees itself when its lease expires");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A JobLocker that records unlocks.
    #[derive(Default)]
    struct Recording {
        held: Mutex<Vec<String>>,
        unlocked: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl JobLocker for Recording {
        async fn lock(&self, job: &str) -> kayra_store::Result<JobLock> {
            Ok(self.try_lock(job).await?.expect("free"))
        }
        async fn try_lock(&self, job: &str) -> kayra_store::Result<Option<JobLock>> {
            let mut held = self.held.lock().unwrap();
            if held.iter().any(|j| j == job) {
                return Ok(None);
            }
            held.push(job.to_string());
            Ok(Some(JobLock { job: job.into(), key: job.into(), create_revision: 7, store_key: job.into() }))
        }
        async fn try_lock_and_get(&self, job: &str, keys: &[String]) -> kayra_store::Result<Option<LockedRead>> {
            let lock = self.try_lock(job).await?;
            Ok(lock.map(|lock| LockedRead { lock, gets: vec![None; keys.len()], revision: 1 }))
        }
        async fn unlock(&self, lock: JobLock) -> kayra_store::Result<()> {
            self.held.lock().unwrap().retain(|j| *j != lock.job);
            self.unlocked.lock().unwrap().push(lock.job);
            Ok(())
        }
    }

    #[tokio::test]
    async fn lock_keys_belong_to_the_deployment_and_a_held_lock_is_busy() {
        let locker = Arc::new(Recording::default());
        let eu = JobLocks::new(Some(locker.clone()), "prod", "eu");
        let us = JobLocks::new(Some(locker.clone()), "prod", "us");
        let key = JobKey::subscription("core", "x.io");
        let Acquired::Held(guard) = eu.try_lock(&key).await else { panic!("free lock") };
        assert_eq!(guard.fencing_token(), Some(7));
        assert!(matches!(eu.try_lock(&key).await, Acquired::Busy));
        assert!(matches!(us.try_lock(&key).await, Acquired::Held(_)), "another deployment never waits");
        guard.release().await;
        assert!(locker.unlocked.lock().unwrap().contains(&"prod/eu/subscriptions/core/x.io".to_string()));
    }

    #[tokio::test]
    async fn a_panicking_holder_still_unlocks() {
        let locker = Arc::new(Recording::default());
        let locks = JobLocks::new(Some(locker.clone()), "dev", "local");
        let job = tokio::spawn({
            let locks = locks.clone();
            async move {
                let _guard = locks.try_lock(&JobKey::Namespace("core".into())).await;
                panic!("job failed");
            }
        });
        assert!(job.await.unwrap_err().is_panic());
        wait_until(|| locker.unlocked.lock().unwrap().len() == 1).await;
        assert!(matches!(locks.try_lock(&JobKey::Namespace("core".into())).await, Acquired::Held(_)));
    }

    async fn wait_until(cond: impl Fn() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not met within 5 s");
    }
}
