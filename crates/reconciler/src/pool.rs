//! The shared pool every reconcile/activate operation runs in (seed,
//! "Concurrency"): at most `max_concurrent_reconciles` at once, submission
//! blocks while the pool is full, and each running operation holds a
//! numbered slot (`0..max`) that becomes its `lock_id`.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

/// A bounded, numbered worker pool.
#[derive(Clone)]
pub struct Pool {
    permits: Arc<Semaphore>,
    /// Slot numbers not in use; a held permit guarantees one is here.
    free: Arc<Mutex<Vec<usize>>>,
    tracker: TaskTracker,
    size: usize,
}

impl Pool {
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        Self {
            permits: Arc::new(Semaphore::new(size)),
            free: Arc::new(Mutex::new((0..size).rev().collect())),
            tracker: TaskTracker::new(),
            size,
        }
    }

    /// Runs `job(slot)` on the pool, waiting first for a free slot.
    pub async fn submit<F, Fut>(&self, job: F)
    where
        F: FnOnce(usize) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return; // closed: shutting down
        };
        let slot = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        metrics::gauge!(super::METRIC_SLOTS_IN_USE).increment(1.0);
        let free = self.free.clone();
        self.tracker.spawn(async move {
            job(slot).await;
            free.lock().unwrap_or_else(|p| p.into_inner()).push(slot);
            metrics::gauge!(super::METRIC_SLOTS_IN_USE).decrement(1.0);
            drop(permit);
        });
    }

    /// Slots currently running an operation.
    pub fn in_use(&self) -> usize {
        self.size - self.permits.available_permits()
    }

    /// Stops accepting work and waits for every running operation.
    pub async fn close_and_wait(&self) {
        self.permits.close();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn bound_holds_and_slots_are_distinct() {
        let pool = Pool::new(3);
        let running = Arc::new(AtomicUsize::new(0));
        let max_seen = Arc::new(AtomicUsize::new(0));
        let slots = Arc::new(Mutex::new(std::collections::HashSet::new()));
        for _ in 0..50 {
            let (running, max_seen, slots) = (running.clone(), max_seen.clone(), slots.clone());
            pool.submit(move |slot| async move {
                assert!(slot < 3);
                assert!(slots.lock().unwrap().insert(slot), "slot {slot} used twice at once");
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                max_seen.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                slots.lock().unwrap().remove(&slot);
            })
            .await;
            assert!(pool.in_use() <= 3);
        }
        pool.close_and_wait().await;
        assert_eq!(max_seen.load(Ordering::SeqCst), 3);
        assert_eq!(running.load(Ordering::SeqCst), 0);
    }
}
