//! The key layout. Names are validated DNS labels / subdomains before they
//! get here, so they never contain `/` and keys cannot collide.
//!
//! Namespaces, users, roles and bindings are shared by every deployment on
//! one store; registrations and subscriptions live under their deployment's
//! `<platform>/<region>`, so a deployment only ever sees its own.

pub const NAMESPACES: &str = "/namespaces/";
pub const USERS: &str = "/users/";
pub const TOKENS: &str = "/tokens/";
pub const ROLES: &str = "/roles/";
pub const CLUSTER_ROLE_BINDINGS: &str = "/clusterrolebindings/";
pub const ROLE_BINDINGS: &str = "/rolebindings/";
/// Every deployment's subscriptions (namespaces are shared by deployments).
pub const SUBSCRIPTIONS: &str = "/subscriptions/";

pub fn namespace(name: &str) -> String {
    format!("{NAMESPACES}{name}")
}
pub fn user(name: &str) -> String {
    format!("{USERS}{name}")
}
/// Tokens are keyed by the hex SHA-256 of the token, so authentication is one read.
pub fn token(hash: &str) -> String {
    format!("{TOKENS}{hash}")
}
pub fn role(name: &str) -> String {
    format!("{ROLES}{name}")
}
pub fn cluster_role_binding(name: &str) -> String {
    format!("{CLUSTER_ROLE_BINDINGS}{name}")
}
pub fn role_bindings(namespace: &str) -> String {
    format!("{ROLE_BINDINGS}{namespace}/")
}
pub fn role_binding(namespace: &str, name: &str) -> String {
    format!("{ROLE_BINDINGS}{namespace}/{name}")
}
/// Every registration of one deployment.
pub fn registrations(platform: &str, region: &str) -> String {
    format!("/apiregistrations/{platform}/{region}/")
}
pub fn registration(platform: &str, region: &str, name: &str) -> String {
    format!("/apiregistrations/{platform}/{region}/{name}")
}
/// Every subscription of one deployment.
pub fn subscriptions(platform: &str, region: &str) -> String {
    format!("/subscriptions/{platform}/{region}/")
}
/// One namespace's subscriptions in one deployment.
pub fn namespace_subscriptions(platform: &str, region: &str, namespace: &str) -> String {
    format!("/subscriptions/{platform}/{region}/{namespace}/")
}
pub fn subscription(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    format!("/subscriptions/{platform}/{region}/{namespace}/{api}")
}
/// Parses any deployment's subscription key into `[platform, region, namespace, api]`.
pub fn subscription_parts(key: &str) -> Option<[&str; 4]> {
    let mut parts = key.strip_prefix(SUBSCRIPTIONS)?.splitn(4, '/');
    Some([parts.next()?, parts.next()?, parts.next()?, parts.next()?])
}

/// The reconciler's record of the last failed attempt on a subscription:
/// which (subscription revision, registration revision) it was made
/// against, so no reconciler process attempts that exact state again.
pub fn attempt(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    format!("/reconcileattempts/{platform}/{region}/{namespace}/{api}")
}

// Guard and index keys: written in the same transaction as the records
// they stand for, so uniqueness and "delete only when unreferenced" are
// single compares (see `docs/architecture.md`, key layout).

/// Claims a short name in one deployment; the value is the long name.
pub fn short_name(platform: &str, region: &str, short: &str) -> String {
    format!("/shortnames/{platform}/{region}/{short}")
}
/// The subscriptions of one deployment to registration `api`, by namespace.
pub fn subscribers(platform: &str, region: &str, api: &str) -> String {
    format!("/subscribers/{platform}/{region}/{api}/")
}
pub fn subscriber(platform: &str, region: &str, api: &str, namespace: &str) -> String {
    format!("/subscribers/{platform}/{region}/{api}/{namespace}")
}
/// The subscriptions in namespace `namespace`, of every deployment.
pub fn namespace_subscribers(namespace: &str) -> String {
    format!("/namespacesubscribers/{namespace}/")
}
pub fn namespace_subscriber(namespace: &str, platform: &str, region: &str, api: &str) -> String {
    format!("/namespacesubscribers/{namespace}/{platform}/{region}/{api}")
}
/// A user's tokens, by hash.
pub fn user_tokens(user: &str) -> String {
    format!("/usertokens/{user}/")
}
pub fn user_token(user: &str, hash: &str) -> String {
    format!("/usertokens/{user}/{hash}")
}
/// The hash of the token the last bootstrap installed (platform §5.4: one bootstrap token).
pub const BOOTSTRAP_TOKEN: &str = "/bootstraptoken";
/// Every run history record of one deployment.
pub fn all_runs(platform: &str, region: &str) -> String {
    format!("/runs/{platform}/{region}/")
}
/// The run history of one subscription: one record holding its newest
/// runs (`kayra_core::run_ring`).
pub fn runs(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    format!("/runs/{platform}/{region}/{namespace}/{api}")
}
/// The run records earlier builds wrote for one subscription, one a ring
/// slot under its history's key: still read until the subscription's next
/// run, whose history write deletes them (never the history itself: the
/// history's key sorts before this prefix, outside it).
pub fn run_slots(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    format!("/runs/{platform}/{region}/{namespace}/{api}/")
}
/// The run counter an earlier build kept for one subscription: unused,
/// deleted by the subscription's first history write and with it.
pub fn run_cursor(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    format!("/runcursors/{platform}/{region}/{namespace}/{api}")
}

/// Every limit record of one deployment (`reconciler.limits`: slots,
/// starts, backoff deadlines, per mode).
pub fn limits(platform: &str, region: &str) -> String {
    format!("/limits/{platform}/{region}/")
}

/// Every audit record of one deployment (platform §13). The last segment
/// is the record's UUIDv7 subtracted from the largest one, in hex, so the
/// store's ascending key order is newest first.
pub fn audit(platform: &str, region: &str) -> String {
    format!("/audit/{platform}/{region}/")
}
/// Every notification delivery of one deployment (§14), by id.
pub fn deliveries(platform: &str, region: &str) -> String {
    format!("/notifications/{platform}/{region}/deliveries/")
}
/// Every API's fan-out marker (the last completed fan-out's SyncID) in one deployment.
pub fn fanout_markers(platform: &str, region: &str) -> String {
    format!("/notifications/{platform}/{region}/fanouts/")
}

/// Every API's rollout record (platform §12).
pub fn rollouts(platform: &str, region: &str) -> String {
    format!("/rollouts/{platform}/{region}/")
}

/// Every cancel request of one deployment (platform §12): one per run,
/// `<namespace>/<api>/<run id>`, watched by every reconciler.
pub fn cancel_requests(platform: &str, region: &str) -> String {
    format!("/cancelrequests/{platform}/{region}/")
}
