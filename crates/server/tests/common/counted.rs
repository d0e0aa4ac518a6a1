//! A store backend that counts the round trips made through it, to hold
//! handlers to their store round-trip budgets. Watch feeds (`changes`,
//! `snapshot`) are the caches' and the hub's background work and
//! are not counted; every request-path call is.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use kayra_store::{Backend, ChangeStream, JobLocker, KeyValue, Leases, ListPage, Result, Revision, Txn, TxnResponse};

/// The round trips counted so far, shared with the backend.
#[derive(Clone, Default)]
pub struct RoundTrips(Arc<AtomicUsize>);

impl RoundTrips {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
    fn add(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// `inner`, counting its request-path calls into a [`RoundTrips`].
pub struct Counted<B> {
    inner: B,
    trips: RoundTrips,
}

impl<B: Backend> Counted<B> {
    pub fn new(inner: B) -> (Self, RoundTrips) {
        let trips = RoundTrips::default();
        (Self { inner, trips: trips.clone() }, trips)
    }
}

#[async_trait]
impl<B: Backend> Backend for Counted<B> {
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision)> {
        self.trips.add();
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Result<ListPage> {
        self.trips.add();
        self.inner.list(prefix, start_after, limit).await
    }
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision> {
        self.trips.add();
        self.inner.create(key, value).await
    }
    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<Revision> {
        self.trips.add();
        self.inner.update(key, value, expected).await
    }
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Revision> {
        self.trips.add();
        self.inner.delete(key, expected).await
    }
    async fn revision(&self) -> Result<Revision> {
        self.trips.add();
        self.inner.revision().await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.trips.add();
        self.inner.txn(txn).await
    }
    /// A group is one round trip of the backend's own kind.
    async fn txn_group(&self, txns: Vec<Txn>, started: std::time::Instant) -> Vec<Result<TxnResponse>> {
        self.trips.add();
        self.inner.txn_group(txns, started).await
    }
    fn group_limits(&self) -> (usize, usize) {
        self.inner.group_limits()
    }
    async fn snapshot(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
        self.inner.snapshot(prefix).await
    }
    async fn changes(&self, prefix: &str, from: Revision) -> Result<ChangeStream> {
        self.inner.changes(prefix, from).await
    }
    fn job_locker(&self) -> Option<Arc<dyn JobLocker>> {
        self.inner.job_locker()
    }
    fn leases(&self) -> Option<Arc<dyn Leases>> {
        self.inner.leases()
    }
}
