//! The records kayra stores, in the JSON shape the catalog API speaks.
//!
//! Every field is always serialized (never omitted): the contract says a
//! caller never has to tell "absent" from "empty" apart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A tenant. Cluster-scoped, shared by every deployment on one store.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Namespace {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// At most 64 entries ([`crate::labels::validate_labels`]); always
    /// serialized, `{}` when empty.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Computed: false until the reconciler activates it.
    #[serde(default)]
    pub active: bool,
}

/// An API registered by an operator, scoped to one platform/region.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ApiRegistration {
    /// The long name, e.g. `compute.example.com`.
    pub name: String,
    #[serde(default)]
    pub short_name: String,
    /// Free-form key into `reconciler.mode`; empty falls back to `default_mode`.
    #[serde(default)]
    pub mode: String,
    /// Moving it to any new value starts the ongoing action (seed).
    #[serde(default)]
    pub sync_id: String,
    /// Computed: RFC 3339 UTC time, with milliseconds, of the last write
    /// that changed `sync_id` (set on create too). Empty on records written
    /// before the field existed.
    #[serde(default)]
    pub sync_id_updated_at: String,
    /// Base URL of the API's backend, used by the gateway.
    #[serde(default)]
    pub endpoint: String,
    #[serde(default)]
    pub description: String,
    /// Computed: stamped from the deployment.
    #[serde(default)]
    pub platform: String,
    /// Computed: stamped from the deployment.
    #[serde(default)]
    pub region: String,
    /// *(3rd)* How a SyncID change reaches the subscribers (§12); `None`:
    /// all at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::RolloutPolicy>,
}

/// How the last sync of a subscription went (seed, "State").
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SubscriptionState {
    /// Subscribed, initial sync not done yet.
    #[default]
    Init,
    /// The last sync succeeded.
    Success,
    /// The last sync failed.
    Error,
}

impl SubscriptionState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::Success => "success",
            Self::Error => "error",
        }
    }
}

/// A namespace's subscription to an API registration, as stored.
///
/// `active`, `state` and `current_sync_id` are computed: only the reconciler
/// moves them.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Subscription {
    pub namespace: String,
    /// The registration's long name.
    pub api: String,
    /// Set once, by the initial sync; never cleared.
    #[serde(default)]
    pub active: bool,
    #[serde(default)]
    pub state: SubscriptionState,
    /// The subscription's own last-reconciled-to SyncID.
    #[serde(default)]
    pub current_sync_id: String,
    /// The run counter earlier builds kept here (one run record a ring
    /// slot). Read, so their stored records and exports still load, and
    /// never written again: a subscription's runs are one record now
    /// (`run_ring`), which needs no counter.
    #[serde(default, skip_serializing)]
    pub runs: u64,
    /// Whether the write that left the record so is a `/sync` re-sync
    /// request: set by the reset, cleared by every other write (the
    /// reconciler's results included), so the cause of a run travels with
    /// the write instead of being guessed from `current_sync_id` (which a
    /// reset of a never-synced subscription leaves as it was). Stored only,
    /// as `runs`: [`SubscriptionView`] has no such field and no request
    /// body sets it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub resync_requested: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Subscription {
    /// A brand-new subscription: inactive, `init`, never synced.
    pub fn new(namespace: impl Into<String>, api: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), api: api.into(), ..Self::default() }
    }

    /// Whether this subscription is reconciled to `expected_sync_id`.
    pub fn is_synced(&self, expected_sync_id: &str) -> bool {
        self.active && self.current_sync_id == expected_sync_id
    }

    /// The wire form, with `expected_sync_id` read from the registration.
    pub fn view(&self, expected_sync_id: &str) -> SubscriptionView {
        SubscriptionView {
            api: self.api.clone(),
            namespace: self.namespace.clone(),
            active: self.active,
            state: self.state,
            current_sync_id: self.current_sync_id.clone(),
            expected_sync_id: expected_sync_id.to_string(),
            synced: self.is_synced(expected_sync_id),
        }
    }
}

/// A subscription as every API response shows it (seed, "Subscriptions").
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionView {
    pub api: String,
    pub namespace: String,
    pub active: bool,
    pub state: SubscriptionState,
    pub current_sync_id: String,
    /// The registration's current SyncID, read fresh on every response.
    pub expected_sync_id: String,
    /// `active && current_sync_id == expected_sync_id`.
    pub synced: bool,
}

/// A person or robot that holds tokens.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct User {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

/// A bearer token as stored: only its hash, never the token itself.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: String,
    pub user: String,
    /// Hex SHA-256 of the token.
    pub hash: String,
    pub created_at: String,
}

/// One RBAC rule. `"*"` in a list matches anything; otherwise exact match.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Omitted means every API.
    #[serde(default = "every")]
    pub apis: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
}

fn every() -> Vec<String> {
    vec!["*".to_string()]
}

/// A named set of rules. Cluster-scoped.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Role {
    pub name: String,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// Grants a role to a user everywhere.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClusterRoleBinding {
    pub name: String,
    pub role: String,
    pub user: String,
}

/// Grants a role to a user for gateway requests into one namespace.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RoleBinding {
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub role: String,
    pub user: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_view_never_omits_fields() {
        let sub = Subscription::new("core", "compute.example.com");
        let json = serde_json::to_value(sub.view("")).unwrap();
        for key in ["api", "namespace", "active", "state", "current_sync_id", "expected_sync_id", "synced"] {
            assert!(json.get(key).is_some(), "{key} missing");
        }
        assert_eq!(json["state"], "init");
        assert_eq!(json["synced"], false);
    }

    #[test]
    fn a_resync_request_is_stored_only_and_old_records_decode_without_it() {
        let mut sub = Subscription::new("core", "compute.example.com");
        let old = serde_json::to_value(&sub).unwrap();
        assert!(old.get("resync_requested").is_none(), "not written while false: {old}");
        let decoded: Subscription =
            serde_json::from_str(r#"{"namespace":"core","api":"compute.example.com","active":true}"#).unwrap();
        assert!(!decoded.resync_requested);
        sub.resync_requested = true;
        let stored = serde_json::to_value(&sub).unwrap();
        assert_eq!(stored["resync_requested"], true);
        assert_eq!(serde_json::from_value::<Subscription>(stored).unwrap(), sub);
        let wire = serde_json::to_value(sub.view("")).unwrap();
        assert!(wire.get("resync_requested").is_none(), "the API never shows it: {wire}");
    }

    #[test]
    fn namespace_labels_are_always_serialized_and_default_to_empty() {
        let old: Namespace = serde_json::from_str(r#"{"name":"core","description":"","active":true}"#).unwrap();
        assert!(old.labels.is_empty());
        let json = serde_json::to_value(&old).unwrap();
        assert_eq!(json, serde_json::json!({"name": "core", "description": "", "labels": {}, "active": true}));
    }

    #[test]
    fn synced_needs_active() {
        let mut sub = Subscription::new("core", "a.b");
        sub.current_sync_id = "1".into();
        assert!(!sub.is_synced("1"));
        sub.active = true;
        assert!(sub.is_synced("1"));
        assert!(!sub.is_synced("2"));
    }

    #[test]
    fn rule_apis_default_to_every_api() {
        let rule: Rule = serde_json::from_str(r#"{"resources":["*"],"verbs":["get"]}"#).unwrap();
        assert_eq!(rule.apis, vec!["*"]);
    }
}
