//! The catalog API: every route under `/apis/catalog.example.com/v1`
//! (platform contract §4 and §5, seed "Managing one", "Forcing a re-sync").
//!
//! Every route is declared once, in [`declarations`], with the HTTP
//! method, the handler and the access it demands. From that one list come
//! the live router ([`router`], each handler behind its RBAC requirement),
//! the route table ([`routes`]) and the checks that keep the OpenAPI
//! document ([`openapi`]) in step with the router.
//!
//! Handlers validate input, call the [`Repository`](crate::repo::Repository)
//! and map its errors; every read-modify-write goes through the
//! repository's compare-and-swap loop. Authentication is not done here: the
//! server's middleware puts a [`Caller`] into the request.
//!
//! # Layout
//! - [`authz`]: [`Caller`], [`Access`], `RequireClusterRBAC`.
//! - [`audit`]: the request's audit context ([`audit::Audited`]: the state
//!   of every change route) and `/audit`, the records newest first.
//! - [`endpoint`]: routes as declared ([`Endpoint`](endpoint::Endpoint)),
//!   their access enforced as a route layer, `?watch=true` dispatched; the route table.
//! - [`error`]: [`ApiError`], the `{code, reason, message}` shape.
//! - [`extract`]: body/path/query extractors refusing in that shape (400/413).
//! - [`guard`]: a route behind an async guard (the requirements, `/apis/`'s
//!   admission), as `from_fn` without its per-request clones.
//! - [`list`]: `{items, continue}` and pagination.
//! - one module per resource: [`namespaces`], [`registrations`],
//!   [`subscriptions`] (with their [`runs`]), [`users`] (with tokens and `/whoami`), [`roles`],
//!   [`bindings`] (cluster and namespace role bindings), [`notifications`]
//!   (the deliveries of §14's events, and their retry).
//! - [`watch`], [`hub`]: `?watch=true` streams, fanned out from one store
//!   watch per prefix; [`status`]: the `/status` report and its stream;
//!   [`stream`]: what every stream shares (framing, outbox, re-checks).
//! - [`openapi`]: the OpenAPI 3 document, derived from the handlers' types.

pub mod audit;
pub mod authz;
pub mod bindings;
pub mod endpoint;
pub mod error;
pub mod extract;
pub mod guard;
pub mod hub;
pub mod list;
pub mod namespaces;
pub mod notifications;
pub mod openapi;
pub mod registrations;
pub mod roles;
pub mod rollouts;
pub mod runs;
pub mod status;
pub mod stream;
pub mod subscriptions;
pub mod users;
pub mod watch;

use std::future::Future;

use axum::Router;
use axum::routing::{MethodRouter, any};
use kayra_core::names;
use kayra_rbac::Verb::{Create, Delete, Get, List, Patch, Update};
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

pub use authz::{Access, Caller, require_cluster_rbac};
pub use endpoint::RouteSpec;
pub use error::{ApiError, ErrorBody};
pub use hub::Hub;
pub use stream::WatchOptions;

use authz::cluster;
use endpoint::Endpoint;
use extract::RequestBody;
use watch::Watched as W;

use crate::repo::Repository;

/// Where the catalog API is mounted.
pub const BASE_PATH: &str = "/apis/catalog.example.com/v1";

/// What every catalog handler shares. axum clones the state into every
/// route and middleware a request passes, so a clone is one reference
/// count: the fields are read through `Deref` (`state.repo`), and the
/// builders below change a copy of them.
#[derive(Debug, Clone)]
pub struct ApiState {
    shared: std::sync::Arc<Shared>,
}

/// The fields of [`ApiState`].
#[derive(Debug, Clone)]
pub struct Shared {
    /// This deployment's repository (its platform/region scope included).
    pub repo: Repository,
    /// `server.max_body_bytes`: larger bodies are refused with 413.
    pub max_body_bytes: usize,
    /// The watch streams' one store watch per prefix (§4.5).
    pub hub: Hub,
    /// `audit.require_reason` (§13).
    pub audit: audit::AuditSettings,
    /// The sinks (§14) a change made here tells of its events (a rollout
    /// aborted or promoted by an operator).
    pub notifications: std::sync::Arc<kayra_config::NotificationsConfig>,
}

impl std::ops::Deref for ApiState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl ApiState {
    /// State over `repo`, with default watch options.
    pub fn new(repo: Repository, max_body_bytes: usize) -> Self {
        Self::with_watch_options(repo, max_body_bytes, WatchOptions::default())
    }

    /// State whose watch streams use `options` (tests shorten them).
    pub fn with_watch_options(repo: Repository, max_body_bytes: usize, options: WatchOptions) -> Self {
        let hub = Hub::new(repo.store().clone(), options);
        let shared = Shared {
            repo,
            max_body_bytes,
            hub,
            audit: audit::AuditSettings::default(),
            notifications: std::sync::Arc::default(),
        };
        Self { shared: std::sync::Arc::new(shared) }
    }

    /// The same state, telling `notifications`' sinks of the events its
    /// changes make.
    pub fn with_notifications(mut self, notifications: &kayra_config::NotificationsConfig) -> Self {
        self.change().notifications = std::sync::Arc::new(notifications.clone());
        self
    }

    /// The same state, refusing changes to these RBAC resources without a
    /// reason (`audit.require_reason`).
    pub fn with_required_reasons(mut self, resources: &[String]) -> Self {
        self.change().audit.require_reason = resources.into();
        self
    }

    /// The same state with its watch streams served by `hub`.
    pub fn with_hub(mut self, hub: Hub) -> Self {
        self.change().hub = hub;
        self
    }

    /// The same state on another handle of its repository (a request's
    /// audited one).
    pub(crate) fn with_repo(mut self, repo: Repository) -> Self {
        self.change().repo = repo;
        self
    }

    /// This state's own copy of its fields, to change.
    fn change(&mut self) -> &mut Shared {
        std::sync::Arc::make_mut(&mut self.shared)
    }
}

/// The body of the `/sync` shorthands and of token creation: `{}` (or
/// nothing at all), and no field is accepted.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

impl RequestBody for Empty {
    const EMPTY_IS_OBJECT: bool = true;
}

/// Every route of the catalog API, relative to [`BASE_PATH`]. The only
/// place routes are declared: an [`Endpoint`] cannot exist without its
/// [`Access`].
fn declarations() -> Vec<(&'static str, Vec<Endpoint>)> {
    use self::{bindings as b, namespaces as ns, registrations as reg, roles as r, subscriptions as sub, users as u};
    vec![
        (
            "/namespaces",
            vec![
                Endpoint::get(cluster("namespaces", List), ns::list).watch(W::Namespaces),
                Endpoint::post(cluster("namespaces", Create), ns::create),
            ],
        ),
        (
            "/namespaces/{namespace}",
            vec![
                Endpoint::get(cluster("namespaces", Get), ns::get).watch(W::Namespaces),
                Endpoint::put(cluster("namespaces", Update), ns::update),
                Endpoint::patch(cluster("namespaces", Patch), ns::patch),
                Endpoint::delete(cluster("namespaces", Delete), ns::delete),
            ],
        ),
        (
            "/apiregistrations",
            vec![
                Endpoint::get(cluster("apiregistrations", List), reg::list).watch(W::Registrations),
                Endpoint::post(cluster("apiregistrations", Create), reg::create),
            ],
        ),
        (
            "/apiregistrations/{name}",
            vec![
                Endpoint::get(cluster("apiregistrations", Get), reg::get).watch(W::Registrations),
                Endpoint::put(cluster("apiregistrations", Update), reg::update),
                Endpoint::patch(cluster("apiregistrations", Patch), reg::patch),
                Endpoint::delete(cluster("apiregistrations", Delete), reg::delete),
            ],
        ),
        ("/apiregistrations/{name}/sync", vec![Endpoint::put(cluster("apiregistrations/sync", Patch), reg::sync)]),
        (
            "/apiregistrations/{name}/status",
            vec![Endpoint::get(cluster("apiregistrations/status", Get), status::status).watch(W::Status)],
        ),
        (
            "/apiregistrations/{name}/rollout",
            vec![
                Endpoint::get(cluster("apiregistrations/rollout", Get), rollouts::get).watch(W::Rollout),
                Endpoint::put(cluster("apiregistrations/rollout", Update), rollouts::act),
            ],
        ),
        (
            "/namespaces/{namespace}/subscriptions",
            vec![
                Endpoint::get(cluster("subscriptions", List), sub::list).watch(W::Subscriptions),
                Endpoint::post(cluster("subscriptions", Create), sub::create),
            ],
        ),
        (
            "/namespaces/{namespace}/subscriptions/{api}",
            vec![
                Endpoint::get(cluster("subscriptions", Get), sub::get).watch(W::Subscriptions),
                Endpoint::put(cluster("subscriptions", Update), sub::update),
                Endpoint::patch(cluster("subscriptions", Patch), sub::patch),
                Endpoint::delete(cluster("subscriptions", Delete), sub::delete),
            ],
        ),
        (
            "/namespaces/{namespace}/subscriptions/{api}/sync",
            vec![Endpoint::put(cluster("subscriptions/sync", Patch), sub::sync)],
        ),
        (
            "/namespaces/{namespace}/subscriptions/{api}/runs",
            vec![Endpoint::get(cluster("subscriptions/runs", List), runs::list).watch(W::Runs)],
        ),
        (
            "/namespaces/{namespace}/subscriptions/{api}/runs/{id}",
            vec![Endpoint::get(cluster("subscriptions/runs", Get), runs::get).watch(W::Runs)],
        ),
        (
            "/namespaces/{namespace}/subscriptions/{api}/runs/{id}/cancel",
            vec![Endpoint::put(cluster("subscriptions/cancel", Patch), runs::cancel)],
        ),
        (
            "/users",
            vec![
                Endpoint::get(cluster("users", List), u::list).watch(W::Users),
                Endpoint::post(cluster("users", Create), u::create),
            ],
        ),
        (
            "/users/{name}",
            vec![
                Endpoint::get(cluster("users", Get), u::get).watch(W::Users),
                Endpoint::put(cluster("users", Update), u::update),
                Endpoint::patch(cluster("users", Patch), u::patch),
                Endpoint::delete(cluster("users", Delete), u::delete),
            ],
        ),
        (
            "/users/{name}/tokens",
            vec![
                Endpoint::get(cluster("users/tokens", List), u::list_tokens).watch(W::Tokens),
                Endpoint::post(cluster("users/tokens", Create), u::create_token),
            ],
        ),
        (
            "/users/{name}/tokens/{id}",
            vec![
                Endpoint::get(cluster("users/tokens", Get), u::get_token).watch(W::Tokens),
                Endpoint::delete(cluster("users/tokens", Delete), u::delete_token),
            ],
        ),
        ("/whoami", vec![Endpoint::get(Access::Authenticated, u::whoami)]),
        (
            "/roles",
            vec![
                Endpoint::get(cluster("roles", List), r::list).watch(W::Roles),
                Endpoint::post(cluster("roles", Create), r::create),
            ],
        ),
        (
            "/roles/{name}",
            vec![
                Endpoint::get(cluster("roles", Get), r::get).watch(W::Roles),
                Endpoint::put(cluster("roles", Update), r::update),
                Endpoint::patch(cluster("roles", Patch), r::patch),
                Endpoint::delete(cluster("roles", Delete), r::delete),
            ],
        ),
        (
            "/clusterrolebindings",
            vec![
                Endpoint::get(cluster("clusterrolebindings", List), b::cluster_list).watch(W::ClusterRoleBindings),
                Endpoint::post(cluster("clusterrolebindings", Create), b::cluster_create),
            ],
        ),
        (
            "/clusterrolebindings/{name}",
            vec![
                Endpoint::get(cluster("clusterrolebindings", Get), b::cluster_get).watch(W::ClusterRoleBindings),
                Endpoint::put(cluster("clusterrolebindings", Update), b::cluster_update),
                Endpoint::patch(cluster("clusterrolebindings", Patch), b::cluster_patch),
                Endpoint::delete(cluster("clusterrolebindings", Delete), b::cluster_delete),
            ],
        ),
        (
            "/namespaces/{namespace}/rolebindings",
            vec![
                Endpoint::get(cluster("rolebindings", List), b::list).watch(W::RoleBindings),
                Endpoint::post(cluster("rolebindings", Create), b::create),
            ],
        ),
        (
            "/namespaces/{namespace}/rolebindings/{name}",
            vec![
                Endpoint::get(cluster("rolebindings", Get), b::get).watch(W::RoleBindings),
                Endpoint::put(cluster("rolebindings", Update), b::update),
                Endpoint::patch(cluster("rolebindings", Patch), b::patch),
                Endpoint::delete(cluster("rolebindings", Delete), b::delete),
            ],
        ),
        ("/audit", vec![Endpoint::get(cluster("audit", List), audit::list).watch(W::Audit)]),
        ("/audit/{id}", vec![Endpoint::get(cluster("audit", Get), audit::get)]),
        ("/notifications", vec![Endpoint::get(cluster("notifications", List), notifications::list)]),
        ("/notifications/{id}/retry", vec![Endpoint::put(cluster("notifications/retry", Patch), notifications::retry)]),
    ]
}

/// The catalog API's router, at its full paths under [`BASE_PATH`], to be
/// merged behind the server's authentication middleware. Not nested: a
/// nested route rewrites every request's URI on its way in, twice for
/// `/apis` and the API's base, which a GET paid for in allocations. Every
/// other path under [`BASE_PATH`] is the catalog's 404.
pub fn router(state: ApiState) -> Router {
    let not_found = || async { ApiError::not_found("no such route in the catalog API") };
    let mut router = Router::new();
    for (path, endpoints) in declarations() {
        let methods = endpoints.into_iter().fold(MethodRouter::new(), |methods, e| methods.merge(e.guarded(&state)));
        router = router.route(&format!("{BASE_PATH}{path}"), methods);
    }
    router
        .route(BASE_PATH, any(not_found))
        .route(&format!("{BASE_PATH}/"), any(not_found))
        .route(&format!("{BASE_PATH}/{{*rest}}"), any(not_found))
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed("method not allowed on this route") })
        .with_state(state)
}

/// Every (method, path, access) of the catalog API, as declared.
pub fn routes() -> Vec<RouteSpec> {
    declarations().iter().flat_map(|(path, endpoints)| endpoints.iter().map(|e| e.spec(path))).collect()
}

/// Refuses a name that is not a DNS label (400 naming the rule).
pub(crate) fn label(kind: &'static str, name: &str) -> Result<(), ApiError> {
    names::validate_label(kind, name).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Refuses anything but an API's long name: a short name is a 400 naming
/// the long name to use (seed, "Managing one").
pub(crate) async fn long_name(state: &ApiState, name: &str) -> Result<(), ApiError> {
    let Err(invalid) = names::validate_subdomain("api", name) else {
        return Ok(());
    };
    if names::validate_label("api", name).is_ok()
        && let Some(registration) = state.repo.find_registration_by_short_name(name).await?
    {
        return Err(ApiError::bad_request(format!(
            "{name:?} is the short name of api registration {:?}; use the long name {:?}",
            registration.name, registration.name
        )));
    }
    Err(ApiError::bad_request(format!("{invalid}; an api is named by its long name, e.g. compute.example.com")))
}

/// The 404 of a registration outside this deployment's scope (§4's example).
pub(crate) fn registration_not_found(state: &ApiState, name: &str) -> ApiError {
    ApiError::not_found(format!(
        "api registration {name:?} not found in platform {}, region {}",
        state.repo.platform(),
        state.repo.region()
    ))
}

/// Read-modify-write of the record at `key` with compare-and-swap: `change`
/// turns the current value into the next one (and may await, to validate
/// against other records); on a concurrent write the record is re-read and
/// `change` runs again on the fresh value, so no update is lost. PUT and
/// PATCH both go through here: a merge patch is applied to the value read
/// in the same iteration, never to a stale copy. When `change` changes
/// nothing, only the request's audit record is written (while the record
/// is still as read). The record's `before`/`after` are the value as read
/// and as written, so the stored value must be what a GET shows.
pub(crate) async fn update_with<T, F, Fut>(
    state: &ApiState,
    record: crate::repo::RecordRef<'_>,
    not_found: impl Fn() -> ApiError,
    mut change: F,
) -> Result<T, ApiError>
where
    T: Serialize + DeserializeOwned + Clone + PartialEq,
    F: FnMut(T) -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    loop {
        let current = state.repo.get::<T>(record).await?.ok_or_else(&not_found)?;
        let next = change(current.value.clone()).await?;
        if next == current.value {
            if state.repo.audit_unchanged(record, current.revision, shown_value(&next)).await? {
                return Ok(next);
            }
            continue;
        }
        let repo = state.repo.auditing(shown_value(&current.value), shown_value(&next));
        match repo.update(record, &next, current.revision, "record").await {
            Ok(_) => return Ok(next),
            Err(crate::repo::Error::Conflict(_)) => continue,
            Err(crate::repo::Error::NotFound(_)) => return Err(not_found()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Deletes the record at `record` as read, with its audit record showing
/// it; re-read when it changed meanwhile.
pub(crate) async fn delete_with<T>(
    state: &ApiState,
    record: crate::repo::RecordRef<'_>,
    not_found: impl Fn() -> ApiError,
) -> Result<(), ApiError>
where
    T: Serialize + DeserializeOwned,
{
    loop {
        let current = state.repo.get::<T>(record).await?.ok_or_else(&not_found)?;
        let repo = state.repo.auditing(shown_value(&current.value), serde_json::Value::Null);
        match repo.delete(record, Some(current.revision), "record").await {
            Ok(_) => return Ok(()),
            Err(crate::repo::Error::Conflict(_)) => continue,
            Err(crate::repo::Error::NotFound(_)) => return Err(not_found()),
            Err(e) => return Err(e.into()),
        }
    }
}

use crate::repo::audit::shown as shown_value;

/// A caller-supplied value quoted in a message, cut to 80 characters so a
/// hostile body cannot blow up the error it provokes.
pub(crate) fn shown(value: &str) -> String {
    if value.chars().count() <= 80 {
        format!("{value:?}")
    } else {
        format!("{:?}…", value.chars().take(80).collect::<String>())
    }
}

/// A name repeated in a PUT/PATCH body must be the path's.
pub(crate) fn check_body_name(kind: &str, path: &str, body: Option<&str>) -> Result<(), ApiError> {
    match body {
        Some(given) if given != path => Err(ApiError::bad_request(format!(
            "{kind} name {} in the body does not match {} in the path",
            shown(given),
            shown(path)
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_route_is_declared_once_and_gated() {
        let routes = routes();
        let mut seen = HashSet::new();
        for route in &routes {
            assert!(seen.insert((route.method.clone(), route.path)), "{} {} declared twice", route.method, route.path);
            match route.access {
                Access::Authenticated => assert_eq!(route.path, "/whoami"),
                Access::Cluster { resource, .. } => assert!(!resource.is_empty()),
            }
        }
    }

    #[test]
    fn every_resource_of_a_route_may_be_named_by_require_reason() {
        for route in routes() {
            if let Access::Cluster { resource, .. } = route.access {
                assert!(kayra_core::audit::CATALOG_RESOURCES.contains(&resource), "{resource}");
            }
        }
    }

    #[test]
    fn verbs_follow_the_http_mapping_and_sync_is_patch() {
        for route in routes() {
            let Access::Cluster { resource, verb } = route.access else { continue };
            // The action subresources: a PUT that changes part of a record.
            if let Some(action) = ["/sync", "/retry", "/cancel"].into_iter().find(|a| route.path.ends_with(a)) {
                assert_eq!((route.method.as_str(), verb), ("PUT", Patch), "{}", route.path);
                assert!(resource.ends_with(action), "{}", route.path);
                continue;
            }
            // A collection path ends in a literal, an item path in a
            // parameter; a registration's status and rollout are one object.
            let single = ["}", "/status", "/rollout"].iter().any(|end| route.path.ends_with(end));
            let collection = !single;
            assert_eq!(
                Some(verb),
                kayra_rbac::Verb::from_http(route.method.as_str(), collection),
                "{} {}",
                route.method,
                route.path
            );
        }
    }
}
