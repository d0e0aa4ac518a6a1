//! `fanout.completed` (platform §14): once per (api, SyncID), fleet-wide,
//! when every subscriber of the API is done with the registration's
//! current SyncID — synced to it, or given up on in `state: error`.
//!
//! The event is stored in the transaction of the result that finishes the
//! fan-out, as every §14 event is: a job writing a result that leaves its
//! subscription done asks its watch-fed [`View`] whether every *other*
//! subscriber is done already (one lookup: the view keeps each API's open
//! subscribers, [`View::only_open`]). If so, the result's transaction also
//! writes the API's fan-out marker (the SyncID of its last completed
//! fan-out) and the event's deliveries, guarded by the marker's revision
//! ([`last_result`]).
//!
//! No result write can know for certain that it is the last without a key
//! every result would contend on, which would serialize the fan-out: two
//! reconcilers finishing the last two subscribers at once each see the
//! other still open, and neither writes the event. For that case, and for
//! a crash between the last result and its echo, every reconciler also
//! looks at its view ([`run`]): an API whose subscriptions, registration or
//! given-up records changed is marked dirty there, and, debounced
//! ([`DEBOUNCE`]), each dirty API whose marker differs from the
//! registration's SyncID is checked; when all are done, the marker and the
//! deliveries are written in one transaction guarded by the marker's
//! revision. Of the writers that see it at once, exactly one writes it, and
//! none is lost (every re-list marks every API dirty again). A registration
//! without subscribers makes no event.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use kayra_catalog::repo::{Collection, Layout, RecordRef, Repository};
use kayra_core::notifications::{Delivery, Event, FANOUT_COMPLETED, FANOUT_FAILED_SHOWN, FanoutMarker};
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

/// The markers of completed fan-outs, by key, with their revisions.
pub type Markers = Reflector<(FanoutMarker, Revision)>;

/// An empty [`Markers`], filled once [`run`] follows the store.
pub fn markers() -> Markers {
    Reflector::new(|kv| {
        serde_json::from_slice::<FanoutMarker>(&kv.value).map(|m| (m, kv.mod_revision)).map_err(|e| e.to_string())
    })
}

/// Whether every subscriber of `api` is done with its registration's
/// SyncID: `None` while one is not (or there are none, or no registration).
pub fn completed(view: &View, api: &str) -> Option<Completed> {
    completed_with(view, api, None)
}

/// [`completed`], counting `last` — a namespace whose result is being
/// written, and whether it leaves it synced (else failed) — as that
/// result leaves it rather than as the view shows it.
fn completed_with(view: &View, api: &str, last: Option<(&str, bool)>) -> Option<Completed> {
    let (reg, _) = view.registration(api)?;
    if view.only_open(api, last.map_or("", |(ns, _)| ns)) == Some(false) {
        return None;
    }
    let mut synced = 0;
    let mut failed = Vec::new();
    let mut found_last = false;
    for (namespace, sub) in view.subscribers_of(api) {
        let done = match last {
            Some((ns, outcome)) if ns == namespace => {
                found_last = true;
                Some(outcome)
            }
            _ => match view.decide(namespace, api, false) {
                Decision::Nothing(Idle::Synced) => Some(true),
                Decision::Nothing(Idle::GivenUp) if sub.state == SubscriptionState::Error => Some(false),
                _ => None,
            },
        };
        match done? {
            true => synced += 1,
            false => failed.push(namespace.to_string()),
        }
    }
    if last.is_some() && !found_last {
        return None;
    }
    failed.sort();
    let total = synced + failed.len();
    (total > 0).then(|| Completed { sync_id: reg.sync_id.clone(), total, synced, failed })
}

/// What a result that finishes its API's fan-out writes with it.
#[derive(Debug)]
pub struct Completion {
    pub marker: FanoutMarker,
    /// The marker's revision it was seen at (`None`: no marker yet).
    pub seen: Option<Revision>,
    pub deliveries: Vec<Delivery>,
    pub event: Event,
}

/// The completion a result finishes, if it is the last of the fan-out
/// of `reg` (the registration its job read) that the view knows of:
/// `namespace` is left synced to `reg`'s SyncID (`synced`) or given up on
/// in `state: error`, every other subscriber is done, no marker says this
/// SyncID completed already, and a sink wants the event.
pub fn last_result(
    view: &View,
    (layout, markers): (&Layout, &Markers),
    sinks: &Sinks,
    reg: &ApiRegistration,
    namespace: &str,
    synced: bool,
) -> Option<Completion> {
    if !sinks.wants(FANOUT_COMPLETED, &reg.name) || !markers.synced() {
        return None;
    }
    let (current, _) = view.registration(&reg.name)?;
    if current.sync_id != reg.sync_id {
        return None;
    }
    let marker = markers.get(&layout.key(RecordRef::FanoutMarker(&reg.name)));
    if marker.as_ref().is_some_and(|(m, _)| m.sync_id == reg.sync_id) {
        return None;
    }
    let done = completed_with(view, &reg.name, Some((namespace, synced)))?;
    let event = event(reg, &done);
    let deliveries = sinks.deliveries(&event);
    Some(Completion { marker: FanoutMarker { sync_id: done.sync_id }, seen: marker.map(|(_, r)| r), deliveries, event })
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
    (markers, ready): (Markers, Arc<AtomicBool>),
    cancel: CancellationToken,
) {
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
