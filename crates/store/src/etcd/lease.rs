//! [`Leases`] on etcd: keys that vanish with a lease, for fleet-wide
//! counters that a killed process must not leave behind (the reconciler's
//! per-mode limits).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::{EtcdJobLocker, Keyspace, revision_of, unavailable};
use crate::{Leases, Result, Revision};

pub(super) struct EtcdLeases {
    pub(super) keys: Keyspace,
    pub(super) locker: Arc<EtcdJobLocker>,
}

#[async_trait]
impl Leases for EtcdLeases {
    async fn session(&self) -> Result<i64> {
        self.locker.lease_id().await
    }

    async fn grant(&self, ttl: Duration) -> Result<i64> {
        // etcd leases have whole-second TTLs; round up, never below 1 s.
        let secs = i64::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX).max(1);
        Ok(self.keys.client.lease_client().grant(secs, None).await.map_err(unavailable)?.id())
    }

    async fn create_leased(&self, key: &str, value: Vec<u8>, lease: i64) -> Result<Option<Revision>> {
        let full = self.keys.full(key);
        let txn = Txn::new()
            .when([Compare::create_revision(full.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(full, value, Some(PutOptions::new().with_lease(lease)))]);
        let resp = self.keys.txn(txn).await?;
        if resp.succeeded() { Ok(Some(revision_of(resp.header())?)) } else { Ok(None) }
    }
}
