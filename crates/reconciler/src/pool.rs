//! The shared pool every reconcile/activate operation runs in (seed,
//! "Concurrency"): at most `max_concurrent_reconciles` at once, and each
//! running operation holds a numbered slot (`0..max`) that becomes its
//! `lock_id`.
//!
//! Only running work holds a slot: a job takes its [`Slot`] once it holds
//! its job lock (see `dispatch` in the crate root), so jobs waiting for
//! their turn, for a lock held elsewhere or for a limit hold none. A [`Slot`] is
//! an RAII guard: its number and its permit come back on every path out of
//! the job, a panic included, so numbers are never lost nor handed out twice.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A bounded pool of numbered slots.
#[derive(Clone)]
pub struct Pool {
    permits: Arc<Semaphore>,
    /// Slot numbers not in use; a held permit guarantees one is here.
    free: Arc<Mutex<Vec<usize>>>,
    size: usize,
}

/// One held slot; its number is the `lock_id`. Returned on drop.
pub struct Slot {
    id: usize,
    free: Arc<Mutex<Vec<usize>>>,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        Self { permits: Arc::new(Semaphore::new(size)), free: Arc::new(Mutex::new((0..size).rev().collect())), size }
    }

    /// Waits for a free slot; `None` once the pool is closed.
    pub async fn acquire(&self) -> Option<Slot> {
        let permit = self.permits.clone().acquire_owned().await.ok()?;
        let id = self.free.lock().unwrap_or_else(PoisonError::into_inner).pop();
        // Permits and numbers are one-to-one: a permit always finds a number.
        let id = id.expect("a held permit always has a free slot number");
        metrics::gauge!(super::METRIC_SLOTS_IN_USE).increment(1.0);
        Some(Slot { id, free: self.free.clone(), _permit: permit })
    }

    /// How many slots there are (`max_concurrent_reconciles`).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Slots currently held.
    pub fn in_use(&self) -> usize {
        self.size - self.permits.available_permits()
    }

    /// Hands out no more slots; held ones still come back.
    pub fn close(&self) {
        self.permits.close();
    }
}

impl Slot {
    pub fn id(&self) -> usize {
        self.id
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The number goes back before the permit (a field, dropped after this).
        self.free.lock().unwrap_or_else(PoisonError::into_inner).push(self.id);
        metrics::gauge!(super::METRIC_SLOTS_IN_USE).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[tokio::test]
    async fn bound_holds_and_slots_are_distinct() {
        let pool = Pool::new(3);
        let a = pool.acquire().await.unwrap();
        let b = pool.acquire().await.unwrap();
        let c = pool.acquire().await.unwrap();
        let ids: HashSet<_> = [a.id(), b.id(), c.id()].into();
        assert_eq!(ids, HashSet::from([0, 1, 2]));
        assert_eq!(pool.in_use(), 3);
        let fourth = tokio::time::timeout(std::time::Duration::from_millis(50), pool.acquire()).await;
        assert!(fourth.is_err(), "a full pool hands out no fourth slot");
        let freed = b.id();
        drop(b);
        assert_eq!(pool.acquire().await.unwrap().id(), freed);
    }

    #[tokio::test]
    async fn a_panicking_holder_returns_its_slot() {
        let pool = Pool::new(1);
        let slot = pool.acquire().await.unwrap();
        let job = tokio::spawn(async move {
            let _slot = slot;
            panic!("job failed");
        });
        assert!(job.await.unwrap_err().is_panic());
        assert_eq!(pool.in_use(), 0);
        assert_eq!(pool.acquire().await.unwrap().id(), 0, "the number came back, not a duplicate");
    }

    #[tokio::test]
    async fn closing_stops_handing_out_slots() {
        let pool = Pool::new(1);
        pool.close();
        assert!(pool.acquire().await.is_none());
    }
}
