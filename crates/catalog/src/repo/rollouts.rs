//! Rollout records (platform §12): one per API, the rollout of its latest
//! SyncID change. Reconcilers advance it and serves apply operators'
//! actions to it, every write a compare-and-swap on the record's revision,
//! so any process may move it and none undoes another's move.

use std::time::SystemTime;

use kayra_config::NotificationsConfig;
use kayra_core::notifications::{
    Delivery, Event, ROLLOUT_ABORTED, ROLLOUT_COMPLETED, ROLLOUT_HALTED, ROLLOUT_WAVE_COMPLETED,
};
use kayra_core::rollout::{Action, NotAllowed, RolloutRecord, Transition};
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
        let key = self.base.layout.key(RecordRef::Rollout(api));
        let guard = match seen {
            Some(revision) => Compare::ModRevision(key.clone(), revision),
            None => Compare::Absent(key.clone()),
        };
        let mut txn = Txn::new().when(guard);
        for delivery in deliveries {
            let key = self.base.layout.key(RecordRef::Delivery(&delivery.id));
            txn = txn.then(Op::Put { key, value: encode(delivery) });
        }
        let txn = txn.then(Op::Put { key, value: encode(record) });
        let response = self.txn(txn).await?;
        Ok(response.succeeded.then_some(response.revision))
    }

    /// Applies an operator's `action` to `api`'s rollout (`by`: who and
    /// why, for its `reason`), audited as a change of the rollout, with
    /// the deliveries to `sinks` of the `rollout.*` events it makes (an
    /// abort, a promote that completes a wave) in the same transaction.
    pub async fn act_on_rollout(
        &self,
        api: &str,
        action: Action,
        by: &str,
        sinks: &NotificationsConfig,
    ) -> Result<Acted> {
        let what = format!("rollout of {api:?}");
        loop {
            let current = self.rollout(api).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
            let mut next = current.value.clone();
            let transitions = match next.act(action, by, SystemTime::now()) {
                Ok(transitions) => transitions,
                Err(refused) => return Ok(Acted::NotAllowed(refused)),
            };
            let deliveries: Vec<Delivery> =
                transitions.iter().flat_map(|t| deliveries(sinks, &rollout_event(&next, t))).collect();
            let handle = self.auditing(shown(&current.value.rollout), shown(&next.rollout));
            if let Some(revision) = handle.write_rollout(api, Some(current.revision), &next, &deliveries).await? {
                return Ok(Acted::Done(Box::new(Versioned { value: next, revision })));
            }
        }
    }
}

/// The `rollout.*` event of `transition`.
pub fn rollout_event(record: &RolloutRecord, transition: &Transition) -> Event {
    let r = &record.rollout;
    let (kind, message, data) = match transition {
        Transition::WaveCompleted { wave } => {
            let w = r.waves.iter().find(|w| &w.name == wave);
            let counts = w.map(|w| serde_json::json!({"total": w.total, "synced": w.synced, "failed": w.failed}));
            (ROLLOUT_WAVE_COMPLETED, format!("rollout of {} to {}: wave {wave} completed", r.api, r.sync_id), {
                let mut data = serde_json::json!({"wave": wave});
                if let (Some(obj), Some(serde_json::Value::Object(c))) = (data.as_object_mut(), counts) {
                    obj.extend(c);
                }
                data
            })
        }
        Transition::Halted { wave, reason } => (
            ROLLOUT_HALTED,
            format!("rollout of {} to {} paused: {reason}", r.api, r.sync_id),
            serde_json::json!({"wave": wave, "reason": reason}),
        ),
        Transition::Completed => (
            ROLLOUT_COMPLETED,
            format!("rollout of {} to {} completed", r.api, r.sync_id),
            serde_json::json!({"waves": r.waves.len()}),
        ),
        Transition::Aborted { reason } => (
            ROLLOUT_ABORTED,
            format!("rollout of {} to {} aborted: {reason}", r.api, r.sync_id),
            serde_json::json!({"reason": reason}),
        ),
    };
    Event {
        id: uuid::Uuid::now_v7().to_string(),
        kind: kind.into(),
        time: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        api: r.api.clone(),
        namespace: String::new(),
        sync_id: r.sync_id.clone(),
        run_id: String::new(),
        message,
        data,
    }
}

/// The deliveries of `event` to every sink of `sinks` that wants it.
pub fn deliveries(sinks: &NotificationsConfig, event: &Event) -> Vec<Delivery> {
    let wanting = sinks.sinks.iter().filter(|(_, sink)| sink.wants(&event.kind, &event.api));
    wanting.map(|(name, _)| Delivery::new(event, name)).collect()
}

#[cfg(test)]
mod tests {
    use kayra_core::rollout::{RolloutPolicy, RolloutState, WavePolicy, assign};

    use super::*;
    use crate::repo::tests::local_repo;

    #[tokio::test]
    async fn an_operators_abort_writes_its_event_with_the_record_and_a_refused_action_nothing() {
        let (_dir, repo) = local_repo().await;
        let policy = RolloutPolicy {
            waves: vec![WavePolicy { name: "all".into(), ..WavePolicy::default() }],
            ..RolloutPolicy::default()
        };
        let subscribers = vec![("a".to_string(), Default::default())];
        let (record, _) =
            RolloutRecord::start("x.example.com", "s2", &policy, assign(&policy, &subscribers), SystemTime::now());
        repo.write_rollout("x.example.com", None, &record, &[]).await.unwrap().unwrap();
        let sinks: NotificationsConfig = serde_json::from_value(serde_json::json!({
            "sinks": {"ops": {"url": "https://hooks.example.com/k", "events": ["rollout.aborted"]},
                      "other": {"url": "https://hooks.example.com/o", "events": ["rollout.completed"]}}
        }))
        .unwrap();
        let Acted::Done(done) =
            repo.act_on_rollout("x.example.com", Action::Abort, "alice: bad", &sinks).await.unwrap()
        else {
            panic!("abort refused")
        };
        assert_eq!(done.value.rollout.state, RolloutState::Aborted);
        assert_eq!(done.value.rollout.reason, "aborted by alice: bad");
        let page = repo.deliveries_page(None, None, None, 0).await.unwrap();
        assert_eq!(page.items.len(), 1, "{:?}", page.items);
        assert_eq!((page.items[0].sink.as_str(), page.items[0].event.kind.as_str()), ("ops", ROLLOUT_ABORTED));
        assert_eq!(page.items[0].event.sync_id, "s2");
        let Acted::NotAllowed(refused) =
            repo.act_on_rollout("x.example.com", Action::Abort, "alice", &sinks).await.unwrap()
        else {
            panic!("a second abort was allowed")
        };
        assert_eq!(refused.to_string(), "cannot abort a rollout that is aborted");
        assert_eq!(repo.deliveries_page(None, None, None, 0).await.unwrap().items.len(), 1);
    }
}
