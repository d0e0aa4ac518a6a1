//! Notification deliveries (platform §14): the outbox's records, read,
//! listed and retried; and the fan-out markers that make
//! `fanout.completed` once per (api, SyncID).
//!
//! Deliveries are created as riders ([`super::Rider::Delivery`]) of the
//! write that caused their event; the reconciler's notifier claims and
//! settles them with compare-and-swap ([`Repository::update`]), so two
//! processes never send one at the same time.

use kayra_core::notifications::{Delivery, DeliveryState, FanoutMarker};
use kayra_store::{Compare, Op, Revision, Txn};

use super::audit::shown;
use super::{Collection, Error, RecordRef, Repository, Result, Versioned, encode};

/// One page of deliveries, in id order.
#[derive(Debug)]
pub struct DeliveryPage {
    pub items: Vec<Delivery>,
    /// The id to continue after, when more remain.
    pub next: Option<String>,
}

impl Repository {
    /// The deliveries in `state` (any, with `None`) to `sink` (any, with
    /// `None`), after the id `after`, at most `limit` (0: all).
    pub async fn deliveries_page(
        &self,
        state: Option<DeliveryState>,
        sink: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<DeliveryPage> {
        let (all, _) = self.list_all::<Delivery>(Collection::Deliveries).await?;
        let mut items: Vec<Delivery> = all
            .into_iter()
            .map(|v| v.value)
            .filter(|d| state.is_none_or(|s| d.state == s) && sink.is_none_or(|s| d.sink == s))
            .filter(|d| after.is_none_or(|after| d.id.as_str() > after))
            .collect();
        items.sort_by(|a, b| a.id.cmp(&b.id));
        let more = limit > 0 && items.len() > limit;
        if limit > 0 {
            items.truncate(limit);
        }
        let next = more.then(|| items.last().map(|d| d.id.clone())).flatten();
        Ok(DeliveryPage { items, next })
    }

    /// Makes the dead delivery `id` pending again, its attempts reset and
    /// due now. `NotFound` for an unknown id, `Conflict` when it is not dead
    /// (a pending one is tried anyway; a delivered one was answered). The
    /// retry is a change: with an audit context on this handle, its record
    /// (the delivery as the list shows it, before and after) rides on the
    /// write, made afresh on every compare-and-swap retry.
    pub async fn retry_delivery(&self, id: &str) -> Result<Delivery> {
        let record = RecordRef::Delivery(id);
        let what = format!("notification {id:?}");
        loop {
            let current = self.get::<Delivery>(record).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
            if current.value.state != DeliveryState::Dead {
                return Err(Error::Conflict(format!(
                    "notification {id:?} is {}, not dead: only a dead one can be retried",
                    current.value.state.as_str()
                )));
            }
            let next = Delivery {
                state: DeliveryState::Pending,
                attempts: 0,
                next_attempt_at_ms: 0,
                claim: None,
                ..current.value.clone()
            };
            let handle = self.auditing(shown(&current.value.view()), shown(&next.view()));
            match handle.update(record, &next, current.revision, &what).await {
                Ok(_) => return Ok(next),
                // Settled or retried meanwhile: decide again on what is there now.
                Err(Error::Conflict(_)) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Records that `api`'s fan-out to `marker.sync_id` completed, with the
    /// deliveries of its `fanout.completed` event, in one transaction that
    /// commits only while the API's marker is still at `seen` (`None`: no
    /// marker yet). `false` when another writer got there first: then
    /// nothing was written.
    pub async fn complete_fanout(
        &self,
        api: &str,
        seen: Option<Revision>,
        marker: &FanoutMarker,
        deliveries: &[Delivery],
    ) -> Result<bool> {
        let key = self.base.layout.key(RecordRef::FanoutMarker(api));
        let guard = match seen {
            Some(revision) => Compare::ModRevision(key.clone(), revision),
            None => Compare::Absent(key.clone()),
        };
        let mut txn = Txn::new().when(guard).then(Op::Put { key, value: encode(marker) });
        for delivery in deliveries {
            let key = self.base.layout.key(RecordRef::Delivery(&delivery.id));
            txn = txn.then(Op::Put { key, value: encode(delivery) });
        }
        Ok(self.txn(txn).await?.succeeded)
    }

    /// The fan-out marker of `api`.
    pub async fn fanout_marker(&self, api: &str) -> Result<Option<Versioned<FanoutMarker>>> {
        self.get(RecordRef::FanoutMarker(api)).await
    }
}

#[cfg(test)]
mod tests {
    use kayra_core::notifications::{Event, FANOUT_COMPLETED};

    use super::*;
    use crate::repo::tests::local_repo;

    fn delivery(event: &str, sink: &str, state: DeliveryState) -> Delivery {
        let event = Event { id: event.into(), kind: FANOUT_COMPLETED.into(), ..Event::default() };
        Delivery { state, attempts: 3, ..Delivery::new(&event, sink) }
    }

    #[tokio::test]
    async fn the_marker_lets_one_writer_complete_a_fan_out() {
        let (_dir, repo) = local_repo().await;
        let marker = FanoutMarker { sync_id: "s2".into() };
        let first = [delivery("e1", "ops", DeliveryState::Pending)];
        assert!(repo.complete_fanout("x.io", None, &marker, &first).await.unwrap());
        // A second writer that saw no marker either: nothing written.
        let second = [delivery("e2", "ops", DeliveryState::Pending)];
        assert!(!repo.complete_fanout("x.io", None, &marker, &second).await.unwrap());
        let page = repo.deliveries_page(None, None, None, 0).await.unwrap();
        assert_eq!(page.items.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["e1.ops"]);
        let seen = repo.fanout_marker("x.io").await.unwrap().unwrap();
        assert_eq!(seen.value, marker);
        let next = FanoutMarker { sync_id: "s3".into() };
        assert!(repo.complete_fanout("x.io", Some(seen.revision), &next, &second).await.unwrap());
        assert!(!repo.complete_fanout("x.io", Some(seen.revision), &next, &second).await.unwrap());
    }

    #[tokio::test]
    async fn deliveries_list_by_state_and_sink_and_only_dead_ones_retry() {
        let (_dir, repo) = local_repo().await;
        for d in [
            delivery("a", "ops", DeliveryState::Dead),
            delivery("b", "ops", DeliveryState::Delivered),
            delivery("c", "dev", DeliveryState::Dead),
            delivery("d", "ops", DeliveryState::Pending),
        ] {
            repo.create(RecordRef::Delivery(&d.id), &d, "delivery").await.unwrap();
        }
        let ids = |page: DeliveryPage| page.items.into_iter().map(|d| d.id).collect::<Vec<_>>();
        let dead = repo.deliveries_page(Some(DeliveryState::Dead), None, None, 0).await.unwrap();
        assert_eq!(ids(dead), ["a.ops", "c.dev"]);
        let ops = repo.deliveries_page(None, Some("ops"), None, 2).await.unwrap();
        assert_eq!(ops.next.as_deref(), Some("b.ops"));
        assert_eq!(ids(ops), ["a.ops", "b.ops"]);
        let rest = repo.deliveries_page(None, Some("ops"), Some("b.ops"), 2).await.unwrap();
        assert_eq!((rest.next.clone(), ids(rest)), (None, vec!["d.ops".to_string()]));

        let retried = repo.retry_delivery("a.ops").await.unwrap();
        assert_eq!((retried.state, retried.attempts), (DeliveryState::Pending, 0));
        assert!(matches!(repo.retry_delivery("a.ops").await, Err(Error::Conflict(_))), "pending now");
        assert!(matches!(repo.retry_delivery("b.ops").await, Err(Error::Conflict(_))), "delivered");
        assert!(matches!(repo.retry_delivery("nope.ops").await, Err(Error::NotFound(_))));
    }

    #[tokio::test]
    async fn a_retry_writes_its_audit_record_with_it_and_a_refused_one_none() {
        use crate::repo::audit::{AuditContext, AuditFilter};
        let (_dir, repo) = local_repo().await;
        let dead = delivery("a", "ops", DeliveryState::Dead);
        repo.create(RecordRef::Delivery(&dead.id), &dead, "delivery").await.unwrap();
        let audited = repo.audited(AuditContext { user: "alice".into(), name: dead.id.clone(), ..Default::default() });
        audited.retry_delivery(&dead.id).await.unwrap();
        assert!(matches!(audited.retry_delivery(&dead.id).await, Err(Error::Conflict(_))), "pending now");
        assert!(matches!(audited.retry_delivery("nope.ops").await, Err(Error::NotFound(_))));
        let page = repo.list_audit(&AuditFilter::default(), None, 0).await.unwrap();
        assert_eq!(page.items.len(), 1, "{:#?}", page.items);
        let record = &page.items[0];
        assert_eq!((record.user.as_str(), record.name.as_str()), ("alice", "a.ops"));
        assert_eq!(
            (&record.before["state"], &record.before["attempts"]),
            (&serde_json::json!("dead"), &serde_json::json!(3))
        );
        assert_eq!(
            (&record.after["state"], &record.after["attempts"]),
            (&serde_json::json!("pending"), &serde_json::json!(0))
        );
        assert!(record.after.get("claim").is_none(), "the list's shape, without the scheduling fields");
    }
}
