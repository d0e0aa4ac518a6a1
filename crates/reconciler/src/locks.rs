//! Per-job locking (seed, "Per-job locking").
//!
//! Every unit of work is guarded by a lock keyed by its namespace, or
//! namespace/api pair: in-process always, and additionally by the store's
//! [`JobLocker`] when it has one (etcd), so several reconciler processes
//! agree on who runs a job. A racing call never skips: it blocks until the
//! holder releases, then re-reads the record fresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kayra_store::{JobLock, JobLocker};
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

/// Job locks of one reconciler process.
#[derive(Clone)]
pub struct JobLocks {
    local: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    distributed: Option<Arc<dyn JobLocker>>,
}

/// A held job lock; call [`JobGuard::release`] when done.
pub struct JobGuard {
    job: String,
    local: Option<OwnedMutexGuard<()>>,
    distributed: Option<(Arc<dyn JobLocker>, JobLock)>,
    registry: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl JobLocks {
    pub fn new(distributed: Option<Arc<dyn JobLocker>>) -> Self {
        Self { local: Arc::default(), distributed }
    }

    /// Blocks until this process holds `job` (in-process, then across
    /// processes). `None` when `cancel` fires first.
    pub async fn lock(&self, job: &str, cancel: &CancellationToken) -> Option<JobGuard> {
        let started = Instant::now();
        let mutex = {
            let mut map = self.local.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(job.to_string()).or_default().clone()
        };
        let local = tokio::select! {
            guard = mutex.lock_owned() => guard,
            _ = cancel.cancelled() => return None,
        };
        let mut guard =
            JobGuard { job: job.to_string(), local: Some(local), distributed: None, registry: self.local.clone() };
        if let Some(locker) = &self.distributed {
            loop {
                tokio::select! {
                    held = locker.lock(job) => match held {
                        Ok(lock) => {
                            guard.distributed = Some((locker.clone(), lock));
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(job, error = %e, "job lock failed; retrying");
                            tokio::select! {
                                _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
                                _ = cancel.cancelled() => { guard.release().await; return None; }
                            }
                        }
                    },
                    _ = cancel.cancelled() => { guard.release().await; return None; }
                }
            }
        }
        metrics::histogram!(super::METRIC_LOCK_WAIT).record(started.elapsed().as_secs_f64());
        Some(guard)
    }
}

impl JobGuard {
    /// Releases the distributed lock (if any), then the in-process one.
    pub async fn release(mut self) {
        if let Some((locker, lock)) = self.distributed.take()
            && let Err(e) = locker.unlock(lock).await
        {
            // The session lease frees it after lock_ttl anyway.
            tracing::warn!(job = %self.job, error = %e, "job unlock failed; the lock frees itself when its lease expires");
        }
        drop(self.local.take());
        // Forget the per-key mutex once nobody else holds or waits on it.
        let mut map = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&self.job).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&self.job);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn second_locker_blocks_until_release() {
        let locks = JobLocks::new(None);
        let cancel = CancellationToken::new();
        let first = locks.lock("core/a.b", &cancel).await.unwrap();
        let (locks2, cancel2) = (locks.clone(), cancel.clone());
        let waiter = tokio::spawn(async move {
            let guard = locks2.lock("core/a.b", &cancel2).await?;
            let job = guard.job.clone();
            guard.release().await;
            Some(job)
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "second lock must block while the first is held");
        // A different job is not blocked.
        locks.lock("core/c.d", &cancel).await.unwrap().release().await;
        first.release().await;
        assert_eq!(waiter.await.unwrap().as_deref(), Some("core/a.b"));
        assert!(locks.local.lock().unwrap().is_empty(), "per-key mutexes are forgotten when unused");
    }

    #[tokio::test]
    async fn cancel_unblocks_a_waiter() {
        let locks = JobLocks::new(None);
        let cancel = CancellationToken::new();
        let _held = locks.lock("ns/core", &cancel).await.unwrap();
        let other = CancellationToken::new();
        other.cancel();
        assert!(locks.lock("ns/core", &other).await.is_none());
    }
}
