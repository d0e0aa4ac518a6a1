//! Group commit: requests submitted while earlier ones are in flight are
//! sent to the store together, in one round trip.
//!
//! The classic of write-ahead logs (PostgreSQL's `commit_delay`, etcd's own
//! raft batching): no timer waits for a batch to fill. A request that finds
//! a free in-flight place goes alone; requests that arrive while every
//! place is taken queue up, and the next free place takes them all at once.
//! Under light load nothing is delayed; under heavy load the round trips
//! (and on SQLite the commits, on etcd the raft proposals) are shared.
//!
//! [`Group`] is generic over what one request is: [`crate::Store`] groups
//! transactions with it, the etcd job locker its lock acquisitions.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

/// Sends a batch in one round trip: one answer per request, in order.
pub type Flush<Req, Resp> = Arc<dyn Fn(Vec<Req>) -> Pin<Box<dyn Future<Output = Vec<Resp>> + Send>> + Send + Sync>;

/// A group-commit queue in front of `flush`. Cloning shares the queue.
pub struct Group<Req, Resp> {
    tx: mpsc::UnboundedSender<(Req, oneshot::Sender<Resp>)>,
}

impl<Req, Resp> Clone for Group<Req, Resp> {
    fn clone(&self) -> Self {
        Self { tx: self.tx.clone() }
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> Group<Req, Resp> {
    /// A queue with at most `in_flight` batches of at most `max_batch`
    /// requests on their way at once. Its task ends when every handle is
    /// gone and the queue has drained. Must be called within a runtime.
    pub fn new(in_flight: usize, max_batch: usize, flush: Flush<Req, Resp>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(drain(rx, in_flight.max(1), max_batch.max(1), flush));
        Self { tx }
    }

    /// Submits `req` as it is called and returns its answer to come;
    /// `None` when the queue's task is gone (the runtime is shutting
    /// down). A plain `fn`, not an `async fn`: what the caller awaits holds
    /// only the answer's receiver, never the request (callers hold these
    /// futures in every store call's state, boxed per request).
    pub fn submit(&self, req: Req) -> impl Future<Output = Option<Resp>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send((req, tx)).is_ok();
        async move {
            if !sent {
                return None;
            }
            rx.await.ok()
        }
    }
}

async fn drain<Req: Send + 'static, Resp: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<(Req, oneshot::Sender<Resp>)>,
    in_flight: usize,
    max_batch: usize,
    flush: Flush<Req, Resp>,
) {
    let places = Arc::new(Semaphore::new(in_flight));
    while let Some(first) = rx.recv().await {
        // While every place is taken, more requests queue up behind `first`.
        let Ok(place) = places.clone().acquire_owned().await else { return };
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let flush = flush.clone();
        tokio::spawn(async move {
            let (reqs, answers): (Vec<Req>, Vec<oneshot::Sender<Resp>>) = batch.into_iter().unzip();
            let resps = flush(reqs).await;
            // A caller that stopped waiting (its timeout) just drops its answer.
            for (answer, resp) in answers.into_iter().zip(resps) {
                let _ = answer.send(resp);
            }
            drop(place);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A flush that records batch sizes and holds each batch until released.
    fn recording(gate: Arc<Semaphore>) -> (Flush<u32, u32>, Arc<Mutex<Vec<usize>>>) {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let flush: Flush<u32, u32> = Arc::new(move |reqs: Vec<u32>| {
            let (gate, seen) = (gate.clone(), seen.clone());
            Box::pin(async move {
                seen.lock().unwrap().push(reqs.len());
                gate.acquire().await.unwrap().forget();
                reqs.into_iter().map(|r| r * 10).collect()
            })
        });
        (flush, sizes)
    }

    #[tokio::test]
    async fn a_lone_request_goes_at_once() {
        let gate = Arc::new(Semaphore::new(100));
        let (flush, sizes) = recording(gate);
        let group = Group::new(1, 8, flush);
        assert_eq!(group.submit(4).await, Some(40));
        assert_eq!(*sizes.lock().unwrap(), vec![1]);
    }

    #[tokio::test]
    async fn requests_behind_a_full_pipeline_share_one_batch_and_keep_their_answers() {
        let gate = Arc::new(Semaphore::new(0));
        let (flush, sizes) = recording(gate.clone());
        let group = Group::new(1, 8, flush);
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.submit(1).await }
        });
        kayra_wait(|| sizes.lock().unwrap().len() == 1).await;
        // The only place is taken: these ten queue, and go as 8 + 2.
        let rest: Vec<_> = (2..12)
            .map(|i| {
                let group = group.clone();
                tokio::spawn(async move { group.submit(i).await })
            })
            .collect();
        tokio::task::yield_now().await;
        gate.add_permits(100);
        assert_eq!(first.await.unwrap(), Some(10));
        for (i, handle) in (2..12).zip(rest) {
            assert_eq!(handle.await.unwrap(), Some(i * 10));
        }
        let sizes = sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 11);
        assert!(sizes.iter().all(|s| *s <= 8), "{sizes:?}");
        assert!(sizes.len() < 11, "queued requests were batched: {sizes:?}");
    }

    async fn kayra_wait(done: impl Fn() -> bool) {
        for _ in 0..1000 {
            if done() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("condition not reached within 5 s");
    }
}
