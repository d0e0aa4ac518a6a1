//! The key layout. Names are validated DNS labels / subdomains before they
//! get here, so they never contain `/` and keys cannot collide.
//!
//! Namespaces, users, roles and bindings are shared by every deployment on
//! one store; registrations and subscriptions live under their deployment's
//! `<platform>/<region>`, so a deployment only ever sees its own.
//!
//! A key is its pieces concatenated: one allocation of the exact length
//! (every read and write builds its keys; `format!` formats each piece
//! through `fmt` and grows its buffer as it goes).

pub const NAMESPACES: &str = "/namespaces/";
pub const USERS: &str = "/users/";
pub const TOKENS: &str = "/tokens/";
pub const ROLES: &str = "/roles/";
pub const CLUSTER_ROLE_BINDINGS: &str = "/clusterrolebindings/";
pub const ROLE_BINDINGS: &str = "/rolebindings/";

pub fn namespace(name: &str) -> String {
    [NAMESPACES, name].concat()
}
pub fn user(name: &str) -> String {
    [USERS, name].concat()
}
/// Tokens are keyed by the hex SHA-256 of the token, so authentication is one read.
pub fn token(hash: &str) -> String {
    [TOKENS, hash].concat()
}
pub fn role(name: &str) -> String {
    [ROLES, name].concat()
}
pub fn cluster_role_binding(name: &str) -> String {
    [CLUSTER_ROLE_BINDINGS, name].concat()
}
pub fn role_bindings(namespace: &str) -> String {
    [ROLE_BINDINGS, namespace, "/"].concat()
}
pub fn role_binding(namespace: &str, name: &str) -> String {
    [ROLE_BINDINGS, namespace, "/", name].concat()
}
/// Every registration of one deployment.
pub fn registrations(platform: &str, region: &str) -> String {
    ["/apiregistrations/", platform, "/", region, "/"].concat()
}
pub fn registration(platform: &str, region: &str, name: &str) -> String {
    ["/apiregistrations/", platform, "/", region, "/", name].concat()
}
/// Every subscription of one deployment.
pub fn subscriptions(platform: &str, region: &str) -> String {
    ["/subscriptions/", platform, "/", region, "/"].concat()
}
/// One namespace's subscriptions in one deployment.
pub fn namespace_subscriptions(platform: &str, region: &str, namespace: &str) -> String {
    ["/subscriptions/", platform, "/", region, "/", namespace, "/"].concat()
}
pub fn subscription(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    ["/subscriptions/", platform, "/", region, "/", namespace, "/", api].concat()
}

/// The reconciler's record of the last failed attempt on a subscription:
/// which (subscription revision, registration revision) it was made
/// against, so no reconciler process attempts that exact state again.
pub fn attempt(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    ["/reconcileattempts/", platform, "/", region, "/", namespace, "/", api].concat()
}

// Guard and index keys: written in the same transaction as the records
// they stand for, so uniqueness and "delete only when unreferenced" are
// single compares (see `docs/architecture.md`, key layout).

/// Claims a short name in one deployment; the value is the long name.
pub fn short_name(platform: &str, region: &str, short: &str) -> String {
    ["/shortnames/", platform, "/", region, "/", short].concat()
}
/// The subscriptions of one deployment to registration `api`, by namespace.
pub fn subscribers(platform: &str, region: &str, api: &str) -> String {
    ["/subscribers/", platform, "/", region, "/", api, "/"].concat()
}
pub fn subscriber(platform: &str, region: &str, api: &str, namespace: &str) -> String {
    ["/subscribers/", platform, "/", region, "/", api, "/", namespace].concat()
}
/// The subscriptions in namespace `namespace`, of every deployment.
pub fn namespace_subscribers(namespace: &str) -> String {
    ["/namespacesubscribers/", namespace, "/"].concat()
}
pub fn namespace_subscriber(namespace: &str, platform: &str, region: &str, api: &str) -> String {
    ["/namespacesubscribers/", namespace, "/", platform, "/", region, "/", api].concat()
}
/// `[platform, region, api]` of a [`namespace_subscriber`] key under
/// `namespace`'s [`namespace_subscribers`].
pub fn namespace_subscriber_parts<'k>(namespace: &str, key: &'k str) -> Option<[&'k str; 3]> {
    let mut parts =
        key.strip_prefix("/namespacesubscribers/")?.strip_prefix(namespace)?.strip_prefix('/')?.splitn(3, '/');
    Some([parts.next()?, parts.next()?, parts.next()?])
}
/// A user's tokens, by hash.
pub fn user_tokens(user: &str) -> String {
    ["/usertokens/", user, "/"].concat()
}
pub fn user_token(user: &str, hash: &str) -> String {
    ["/usertokens/", user, "/", hash].concat()
}
/// The hash of the token the last bootstrap installed (platform §5.4: one bootstrap token).
pub const BOOTSTRAP_TOKEN: &str = "/bootstraptoken";
/// Every run history record of one deployment.
pub fn all_runs(platform: &str, region: &str) -> String {
    ["/runs/", platform, "/", region, "/"].concat()
}
/// The run history of one subscription: one record holding its newest
/// runs (`kayra_core::run_ring`).
pub fn runs(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    ["/runs/", platform, "/", region, "/", namespace, "/", api].concat()
}
/// The run records earlier builds wrote for one subscription, one a ring
/// slot under its history's key: still read until the subscription's next
/// run, whose history write deletes them (never the history itself: the
/// history's key sorts before this prefix, outside it).
pub fn run_slots(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    ["/runs/", platform, "/", region, "/", namespace, "/", api, "/"].concat()
}
/// The run counter an earlier build kept for one subscription: unused,
/// deleted by the subscription's first history write and with it.
pub fn run_cursor(platform: &str, region: &str, namespace: &str, api: &str) -> String {
    ["/runcursors/", platform, "/", region, "/", namespace, "/", api].concat()
}

/// Every limit record of one deployment (`reconciler.limits`: slots,
/// starts, backoff deadlines, per mode).
pub fn limits(platform: &str, region: &str) -> String {
    ["/limits/", platform, "/", region, "/"].concat()
}

/// Every audit record of one deployment (platform §13). The last segment
/// is the record's UUIDv7 subtracted from the largest one, in hex, so the
/// store's ascending key order is newest first.
pub fn audit(platform: &str, region: &str) -> String {
    ["/audit/", platform, "/", region, "/"].concat()
}
/// Every notification delivery of one deployment (§14), by id.
pub fn deliveries(platform: &str, region: &str) -> String {
    ["/notifications/", platform, "/", region, "/deliveries/"].concat()
}
/// Every API's fan-out marker (the last completed fan-out's SyncID) in one deployment.
pub fn fanout_markers(platform: &str, region: &str) -> String {
    ["/notifications/", platform, "/", region, "/fanouts/"].concat()
}

/// Every API's rollout record (platform §12).
pub fn rollouts(platform: &str, region: &str) -> String {
    ["/rollouts/", platform, "/", region, "/"].concat()
}

/// Every cancel request of one deployment (platform §12): one per run,
/// `<namespace>/<api>/<run id>`, watched by every reconciler.
pub fn cancel_requests(platform: &str, region: &str) -> String {
    ["/cancelrequests/", platform, "/", region, "/"].concat()
}
