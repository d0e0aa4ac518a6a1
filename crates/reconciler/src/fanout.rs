//! `fanout.completed` (platform §14): once per (api, SyncID), fleet-wide,
//! when every subscriber of the API is done with the registration's
//! current SyncID — synced to it, or given up on in `state: error`.
//!
//! No result write can know it is the last of a fan-out without a key
//! every result would contend on (which would serialize the fan-out).
//! Instead every reconciler looks at its watch-fed [`View`]: an API whose
//! subscriptions, registration or given-up records changed is marked dirty
//! there, and, debounced ([`DEBOUNCE`]), each dirty API whose fan-out
//! marker (the SyncID of its last completed fan-out, watched here) differs
//! from the registration's SyncID is checked. The check stops at the first
//! subscriber not done, so a fan-out under way costs little; only the last
//! one walks every subscriber. When all are done, the marker and the
//! event's deliveries are written in one transaction guarded by the marker's
//! revision: of the reconcilers that see it at once, exactly one writes it,
//! and none is lost (every re-list marks every API dirty again). A
//! registration without subscribers makes no event.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use kayra_catalog::repo::{Collection, RecordRef, Repository};
use kayra_core::notifications::{Event, FANOUT_COMPLETED, FANOUT_FAILED_SHOWN, FanoutMarker};
use kayra_core::{ApiRegistration, SubscriptionState};
use kayra_store::Revision;
use kayra_store::reflector::Reflector;
use tokio_util::sync::CancellationToken;

use crate::decide::{Decision, Idle};
use crate::notify::Sinks;
use crate::view::View;

/// How long changes gather before dirty APIs are checked.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

/// A completed fan-out, as the view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    pub sync_id: String,
    pub total: usize,
    pub synced: usize,
    /// Every failed namespace, sorted.
    pub failed: Vec<String>,
}

/// Whether every subscriber of `api` is done with its registration's
/// SyncID: `None` while one is not (or there are none, or no registration).
pub fn completed(view: &View, api: &str) -> Option<Completed> {
    let (reg, _) = view.registration(api)?;
    let mut synced = 0;
    let mut failed = Vec::new();
    for (namespace, (sub, _)) in view.subscribers_of(api) {
        match view.decide(namespace, api, false) {
            Decision::Nothing(Idle::Synced) => synced += 1,
            Decision::Nothing(Idle::GivenUp) if sub.state == SubscriptionState::Error => {
                failed.push(namespace.clone());
            }
            _ => return None,
        }
    }
    failed.sort();
    let total = synced + failed.len();
    (total > 0).then(|| Completed { sync_id: reg.sync_id.clone(), total, synced, failed })
}

/// The `fanout.completed` event of `done` for `reg`.
pub fn event(reg: &ApiRegistration, done: &Completed) -> Event {
    let seconds = crate::runs::sync_lag(reg).unwrap_or(0.0);
    let failed = done.failed.len();
    Event {
        id: uuid::Uuid::now_v7().to_string(),
        kind: FANOUT_COMPLETED.into(),
        time: crate::runs::now(),
        api: reg.name.clone(),
        namespace: String::new(),
        sync_id: done.sync_id.clone(),
        run_id: String::new(),
        message: format!(
            "fan-out of {} to {} completed: {} synced, {failed} failed of {}",
            reg.name, done.sync_id, done.synced, done.total
        ),
        data: serde_json::json!({
            "total": done.total,
            "synced": done.synced,
            "failed": failed,
            "seconds": seconds,
            "failed_namespaces": done.failed.iter().take(FANOUT_FAILED_SHOWN).collect::<Vec<_>>(),
        }),
    }
}

/// Runs the fan-out checks of one reconciler until `cancel`. `ready`
/// turns true once the view has listed every resource.
pub async fn run(
    repo: Repository,
    sinks: Arc<Sinks>,
    view: Arc<RwLock<View>>,
    ready: Arc<AtomicBool>,
    cancel: CancellationToken,
) {
    let markers: Reflector<(FanoutMarker, Revision)> = Reflector::new(|kv| {
        serde_json::from_slice::<FanoutMarker>(&kv.value).map(|m| (m, kv.mod_revision)).map_err(|e| e.to_string())
    });
    let watch = markers.clone().run(repo.store().watcher(&repo.layout().prefix(Collection::FanoutMarkers)));
    let mut watch = std::pin::pin!(watch);
    let mut tick = tokio::time::interval(DEBOUNCE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // APIs to check again: dirty ones taken from the view, and those whose
    // check could not finish (a lost race, a store error).
    let mut pending = BTreeSet::new();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = &mut watch => return,
            _ = tick.tick() => {}
        }
        if !ready.load(Ordering::SeqCst) || !markers.synced() {
            continue;
        }
        let dirty = view.write().unwrap_or_else(PoisonError::into_inner).take_dirty();
        pending.extend(dirty.into_iter().filter(|api| sinks.wants(FANOUT_COMPLETED, api)));
        for api in std::mem::take(&mut pending) {
            let marker = markers.get(&repo.layout().key(RecordRef::FanoutMarker(&api)));
            let found = {
                let view = view.read().unwrap_or_else(PoisonError::into_inner);
                let Some((reg, _)) = view.registration(&api) else { continue };
                if marker.as_ref().is_some_and(|(m, _)| m.sync_id == reg.sync_id) {
                    continue;
                }
                completed(&view, &api).map(|done| (event(reg, &done), done))
            };
            let Some((event, done)) = found else { continue };
            let deliveries = sinks.deliveries(&event);
            let next = FanoutMarker { sync_id: done.sync_id.clone() };
            match repo.complete_fanout(&api, marker.map(|(_, r)| r), &next, &deliveries).await {
                Ok(true) => tracing::info!(api, sync_id = %done.sync_id, total = done.total,
                    failed = done.failed.len(), event_id = %event.id, "fan-out completed"),
                // Another reconciler wrote it, or this one's marker is not
                // current yet: look again once the marker's watch caught up.
                Ok(false) => {
                    pending.insert(api);
                }
                Err(e) => {
                    tracing::warn!(api, error = %e, "could not record a completed fan-out; trying again");
                    pending.insert(api);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kayra_core::Subscription;

    use super::*;
    use crate::decide::Attempt;

    fn reg(sync_id: &str) -> ApiRegistration {
        ApiRegistration { name: "x.io".into(), sync_id: sync_id.into(), ..Default::default() }
    }

    fn sub(ns: &str, current: &str, state: SubscriptionState) -> Subscription {
        Subscription { active: true, current_sync_id: current.into(), state, ..Subscription::new(ns, "x.io") }
    }

    #[test]
    fn a_fan_out_completes_when_every_subscriber_is_synced_or_given_up() {
        let mut view = View::default();
        view.put_registration(reg("s2"), 10);
        assert_eq!(completed(&view, "x.io"), None, "no subscribers: no event");
        view.put_subscription(sub("a", "s2", SubscriptionState::Success), 11);
        view.put_subscription(sub("b", "s1", SubscriptionState::Error), 12);
        assert_eq!(completed(&view, "x.io"), None, "b failed but was not given up on yet");
        view.put_given_up(
            "b",
            "x.io",
            Attempt { subscription_revision: 12, registration_revision: 9, cancelled: false },
        );
        assert_eq!(completed(&view, "x.io"), None, "given up on an older registration");
        view.put_given_up(
            "b",
            "x.io",
            Attempt { subscription_revision: 12, registration_revision: 10, cancelled: false },
        );
        let done = completed(&view, "x.io").unwrap();
        assert_eq!((done.total, done.synced, done.failed.clone()), (2, 1, vec!["b".to_string()]));
        let event = event(&reg("s2"), &done);
        assert_eq!(event.data["failed_namespaces"], serde_json::json!(["b"]));
        assert_eq!((event.kind.as_str(), event.sync_id.as_str()), (FANOUT_COMPLETED, "s2"));
        view.put_subscription(sub("c", "s1", SubscriptionState::Success), 13);
        assert_eq!(completed(&view, "x.io"), None, "c is still behind");
    }

    #[test]
    fn changes_mark_their_api_dirty_and_a_relist_marks_every_one() {
        let mut view = View::default();
        view.put_registration(reg("s1"), 1);
        view.put_registration(ApiRegistration { name: "y.io".into(), ..Default::default() }, 2);
        let _ = view.take_dirty();
        view.put_subscription(sub("a", "s1", SubscriptionState::Success), 3);
        assert_eq!(view.take_dirty(), BTreeSet::from(["x.io".to_string()]));
        assert!(view.take_dirty().is_empty());
        view.replace_subscriptions(Vec::new());
        assert_eq!(view.take_dirty(), BTreeSet::from(["x.io".to_string(), "y.io".to_string()]));
    }
}
