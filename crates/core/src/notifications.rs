//! Notifications (platform §14): the events kayra tells operators about,
//! and the delivery records of its outbox, one per (event, sink).
//!
//! An [`Event`] is what a sink receives, as the JSON body of a `POST`. A
//! [`Delivery`] is what the store keeps of one event on its way to one
//! sink: written in the same transaction as the change that caused the
//! event, then claimed, sent and settled by a reconciler. Its list shape
//! ([`DeliveryView`]) is what `GET /notifications` shows; the scheduling
//! fields (`next_attempt_at`, the claim) are stored only.

use serde::{Deserialize, Serialize};

/// The kinds of event (§14), as spelled in `notifications.sinks.*.events`
/// and in an event's `type`.
pub const EVENT_TYPES: [&str; 8] = [
    SUBSCRIPTION_ACTIVATED,
    SUBSCRIPTION_FAILED,
    SUBSCRIPTION_RECOVERED,
    FANOUT_COMPLETED,
    ROLLOUT_WAVE_COMPLETED,
    ROLLOUT_HALTED,
    ROLLOUT_COMPLETED,
    ROLLOUT_ABORTED,
];

/// A rollout's wave passed (§12).
pub const ROLLOUT_WAVE_COMPLETED: &str = "rollout.wave_completed";
/// A rollout paused because a wave failed.
pub const ROLLOUT_HALTED: &str = "rollout.halted";
/// A rollout's last wave passed.
pub const ROLLOUT_COMPLETED: &str = "rollout.completed";
/// A rollout ended by a failure (`on_failure: abort`) or an operator's abort.
pub const ROLLOUT_ABORTED: &str = "rollout.aborted";

/// A subscription's first success.
pub const SUBSCRIPTION_ACTIVATED: &str = "subscription.activated";
/// A run and its immediate retry both failed: once per decision.
pub const SUBSCRIPTION_FAILED: &str = "subscription.failed";
/// A success while the subscription was in `state: error`.
pub const SUBSCRIPTION_RECOVERED: &str = "subscription.recovered";
/// Every subscriber of a SyncID change is synced or failed: once per (api, SyncID).
pub const FANOUT_COMPLETED: &str = "fanout.completed";

/// How many failed namespaces a `fanout.completed` event names.
pub const FANOUT_FAILED_SHOWN: usize = 100;

/// One event, exactly as a sink receives it (the body of the `POST`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The same on every attempt and for every sink (`Kayra-Event-Id`).
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// When it happened, RFC 3339 UTC.
    pub time: String,
    pub api: String,
    /// Empty for an event of a whole API (`fanout.completed`).
    pub namespace: String,
    pub sync_id: String,
    /// The run that caused it; empty for `fanout.completed`.
    pub run_id: String,
    pub message: String,
    pub data: serde_json::Value,
}

impl Event {
    /// The id of the event of `kind` caused by run `run_id`: a run causes
    /// at most one of each kind, so a result write that is retried can only
    /// write the same records again, never a second event.
    pub fn id_of_run(run_id: &str, kind: &str) -> String {
        format!("{run_id}.{kind}")
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// Not delivered yet; tried again at `next_attempt_at`.
    #[default]
    Pending,
    /// A 2xx answered it.
    Delivered,
    /// `max_attempts` failed; `PUT /notifications/:id/retry` makes it pending again.
    Dead,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Dead => "dead",
        }
    }

    /// The state named `name` (a `?state=` filter).
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Pending, Self::Delivered, Self::Dead].into_iter().find(|s| s.as_str() == name)
    }
}

/// A process's hold on a delivery while it sends it: others skip it until
/// `until_ms`, after which anyone may take it (a killed holder's delivery
/// is sent again: at least once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// `<hostname>:<pid>` of the holder.
    pub owner: String,
    /// Unix milliseconds.
    pub until_ms: u64,
}

/// One event on its way to one sink (stored).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// `<event id>.<sink>`.
    pub id: String,
    pub event: Event,
    pub sink: String,
    pub state: DeliveryState,
    pub attempts: u32,
    #[serde(default)]
    pub last_error: String,
    #[serde(default)]
    pub last_attempt_at: String,
    #[serde(default)]
    pub delivered_at: String,
    /// Unix milliseconds before which it is not tried again (stored only).
    #[serde(default)]
    pub next_attempt_at_ms: u64,
    /// Who is sending it now (stored only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
}

impl Delivery {
    /// The id of `event`'s delivery to `sink`.
    pub fn id_of(event_id: &str, sink: &str) -> String {
        format!("{event_id}.{sink}")
    }

    /// A new, pending delivery of `event` to `sink`, due now.
    pub fn new(event: &Event, sink: &str) -> Self {
        Self { id: Self::id_of(&event.id, sink), event: event.clone(), sink: sink.to_string(), ..Self::default() }
    }

    /// The list shape (§14): without the scheduling fields.
    pub fn view(&self) -> DeliveryView {
        DeliveryView {
            id: self.id.clone(),
            event: self.event.clone(),
            sink: self.sink.clone(),
            state: self.state,
            attempts: self.attempts,
            last_error: self.last_error.clone(),
            last_attempt_at: self.last_attempt_at.clone(),
            delivered_at: self.delivered_at.clone(),
        }
    }
}

/// A delivery as `GET /notifications` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    pub id: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub event: Event,
    pub sink: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub state: DeliveryState,
    pub attempts: u32,
    pub last_error: String,
    pub last_attempt_at: String,
    pub delivered_at: String,
}

/// The last completed fan-out of an API (stored, one per API): the CAS
/// guard that makes `fanout.completed` once per (api, SyncID) fleet-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FanoutMarker {
    pub sync_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_shape_leaves_the_scheduling_fields_out() {
        let event = Event { id: "r1.subscription.failed".into(), kind: SUBSCRIPTION_FAILED.into(), ..Event::default() };
        let mut delivery = Delivery::new(&event, "ops");
        delivery.claim = Some(Claim { owner: "h:1".into(), until_ms: 5 });
        delivery.next_attempt_at_ms = 9;
        assert_eq!(delivery.id, "r1.subscription.failed.ops");
        let shown = serde_json::to_value(delivery.view()).unwrap();
        let keys: Vec<_> = shown.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            ["attempts", "delivered_at", "event", "id", "last_attempt_at", "last_error", "sink", "state"],
            "§14's fields and no others"
        );
        assert_eq!(shown["state"], "pending");
        assert_eq!(shown["event"]["type"], SUBSCRIPTION_FAILED);
        let stored: Delivery = serde_json::from_value(serde_json::to_value(&delivery).unwrap()).unwrap();
        assert_eq!(stored, delivery);
    }

    #[test]
    fn states_parse_by_name_only() {
        for state in [DeliveryState::Pending, DeliveryState::Delivered, DeliveryState::Dead] {
            assert_eq!(DeliveryState::parse(state.as_str()), Some(state));
        }
        assert_eq!(DeliveryState::parse("Dead"), None);
        assert_eq!(DeliveryState::parse(""), None);
    }
}
