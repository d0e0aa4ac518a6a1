//! Rollout records (platform §12): one per API, the rollout of its latest
//! SyncID change. Reconcilers advance it and serves apply operators'
//! actions to it, every write a compare-and-swap on the record's revision,
//! so any process may move it and none undoes another's move.

use std::time::SystemTime;

use kayra_core::notifications::Delivery;
use kayra_core::rollout::{Action, NotAllowed, RolloutRecord};
use kayra_store::{Compare, Op, Revision, Txn};

use super::audit::shown;
use super::{Error, RecordRef, Repository, Result, Versioned, encode};

/// How an operator's action went.
#[derive(Debug)]
pub enum Acted {
    Done(Box<Versioned<RolloutRecord>>),
    NotAllowed(NotAllowed),
}

impl Repository {
    /// The rollout record of `api`, if one has started.
    pub async fn rollout(&self, api: &str) -> Result<Option<Versioned<RolloutRecord>>> {
        self.get(RecordRef::Rollout(api)).await
    }

    /// Writes `record` as `api`'s rollout, with the deliveries of the events
    /// its transition made, only while the record is still at `seen`
    /// (`None`: no record yet). `None` when another writer got there first:
    /// nothing was written.
    pub async fn write_rollout(
        &self,
        api: &str,
        seen: Option<Revision>,
        record: &RolloutRecord,
        deliveries: &[Delivery],
    ) -> Result<Option<Revision>> {
        let key = self.layout.key(RecordRef::Rollout(api));
        let guard = match seen {
            Some(revision) => Compare::ModRevision(key.clone(), revision),
            None => Compare::Absent(key.clone()),
        };
        let mut txn = Txn::new().when(guard);
        for delivery in deliveries {
            let key = self.layout.key(RecordRef::Delivery(&delivery.id));
            txn = txn.then(Op::Put { key, value: encode(delivery) });
        }
        let txn = txn.then(Op::Put { key, value: encode(record) });
        let response = self.txn(txn).await?;
        Ok(response.succeeded.then_some(response.revision))
    }

    /// Applies an operator's `action` to `api`'s rollout (`by`: who and
    /// why, for its `reason`), audited as a change of the rollout.
    pub async fn act_on_rollout(&self, api: &str, action: Action, by: &str) -> Result<Acted> {
        let what = format!("rollout of {api:?}");
        loop {
            let current = self.rollout(api).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
            let mut next = current.value.clone();
            if let Err(refused) = next.act(action, by, SystemTime::now()) {
                return Ok(Acted::NotAllowed(refused));
            }
            let handle = self.auditing(shown(&current.value.rollout), shown(&next.rollout));
            if let Some(revision) = handle.write_rollout(api, Some(current.revision), &next, &[]).await? {
                return Ok(Acted::Done(Box::new(Versioned { value: next, revision })));
            }
        }
    }
}
