//! `/namespaces/{namespace}/subscriptions`: the seed's "Managing one",
//! "Forcing a re-sync" and "Active/State/CurrentSyncID are computed".
//!
//! - Create takes only `api`, the registration's long name: a short name is
//!   a 400 naming the long one; a registration outside this deployment's
//!   scope is a 404. `active`, `state` and `current_sync_id` are never taken
//!   from a body (400 naming the field); a new subscription is always
//!   `active: false`, `state: "init"`, `current_sync_id: ""`.
//! - Every response carries `expected_sync_id`, read fresh from the
//!   registration each time (empty when it is gone), and `synced`.
//! - `PUT .../subscriptions/{api}` is a no-op confirmation; `PUT
//!   .../subscriptions/{api}/sync` resets `current_sync_id` and always
//!   writes, because the write is what triggers the reconciler.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use kayra_core::{Subscription, SubscriptionView};
use serde::Deserialize;
use utoipa::ToSchema;

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, Path, Query, RequestBody};
use super::list::{List, ListQuery, continue_token};
use super::{ApiState, Empty, label, long_name, registration_not_found, shown};
use crate::repo::tenancy::CreateRefused;
use crate::repo::{Collection, RecordRef, Versioned};

/// The computed fields, and the response-only ones.
const COMPUTED: &[&str] = &["active", "state", "current_sync_id", "expected_sync_id", "synced"];

/// POST body: only `api` is needed.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionCreate {
    /// The registration's long name, e.g. `compute.example.com`.
    pub api: String,
    /// May be repeated; must match the path.
    #[serde(default)]
    pub namespace: Option<String>,
}

impl RequestBody for SubscriptionCreate {
    const COMPUTED: &'static [&'static str] = COMPUTED;
}

/// PUT/PATCH body of the no-op confirmation: `{}` or `{"api": <the path's api>}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionConfirm {
    #[serde(default)]
    pub api: Option<String>,
}

impl RequestBody for SubscriptionConfirm {
    const COMPUTED: &'static [&'static str] = COMPUTED;
}

fn what(namespace: &str, api: &str) -> String {
    format!("subscription of namespace {namespace:?} to {api:?}")
}

/// Checks the path: a valid, existing namespace and a long API name.
async fn check_path(state: &ApiState, namespace: &str, api: Option<&str>) -> Result<(), ApiError> {
    label("namespace", namespace)?;
    if state.repo.get_namespace(namespace).await?.is_none() {
        return Err(namespace_not_found(namespace));
    }
    match api {
        Some(api) => long_name(state, api).await,
        None => Ok(()),
    }
}

fn namespace_not_found(namespace: &str) -> ApiError {
    ApiError::not_found(format!("namespace {namespace:?} not found"))
}

/// Checks the path's names without a store read when they are valid: a
/// bad API name is a 400, but a missing namespace is named first (the
/// order of [`check_path`]), so only that failure path reads the store.
async fn check_names(state: &ApiState, namespace: &str, api: &str) -> Result<(), ApiError> {
    label("namespace", namespace)?;
    if let Err(invalid) = long_name(state, api).await {
        if state.repo.get_namespace(namespace).await?.is_none() {
            return Err(namespace_not_found(namespace));
        }
        return Err(invalid);
    }
    Ok(())
}

/// The subscription of the path and its registration's SyncID, in one
/// round trip (as [`check_path`] then a read would answer, 404s included).
pub(crate) async fn existing(
    state: &ApiState,
    namespace: &str,
    api: &str,
) -> Result<(Versioned<Subscription>, String), ApiError> {
    check_names(state, namespace, api).await?;
    let read = state.repo.read_subscription(namespace, api).await?;
    if !read.namespace_exists {
        return Err(namespace_not_found(namespace));
    }
    match read.subscription {
        Some(subscription) => Ok((subscription, read.sync_id)),
        None => Err(ApiError::not_found(format!("{} not found", what(namespace, api)))),
    }
}

#[utoipa::path(get, path = "/namespaces/{namespace}/subscriptions", tag = "subscriptions",
    params(("namespace" = String, Path), ListQuery),
    responses((status = 200, body = List<SubscriptionView>), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Path(namespace): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<SubscriptionView>>, ApiError> {
    check_path(&state, &namespace, None).await?;
    let collection = Collection::NamespaceSubscriptions(&namespace);
    let after = query.after(&state.repo.layout().prefix(collection))?;
    let page = state.repo.list::<Subscription>(collection, after.as_deref(), query.limit()).await?;
    // One read of the registrations serves the whole page.
    let (registrations, _) = state.repo.list_registrations().await?;
    let sync_ids: HashMap<String, String> =
        registrations.into_iter().map(|r| (r.value.name, r.value.sync_id)).collect();
    let items = page
        .items
        .iter()
        .map(|s| s.value.view(sync_ids.get(&s.value.api).map(String::as_str).unwrap_or_default()))
        .collect();
    Ok(Json(List { items, continue_token: continue_token(page.next.as_deref()) }))
}

#[utoipa::path(post, path = "/namespaces/{namespace}/subscriptions", tag = "subscriptions",
    params(("namespace" = String, Path)), request_body = SubscriptionCreate,
    responses((status = 201, body = SubscriptionView),
        (status = 400, body = ErrorBody, description = "a computed field, a short name (the message names the long one), or a bad body"),
        (status = 404, body = ErrorBody, description = "no such namespace, or no such registration in this deployment"),
        (status = 409, body = ErrorBody, description = "the subscription exists")))]
pub(crate) async fn create(
    Audited(state): Audited,
    Path(namespace): Path<String>,
    JsonBody(body): JsonBody<SubscriptionCreate>,
) -> Result<(StatusCode, Json<SubscriptionView>), ApiError> {
    if let Some(given) = body.namespace.as_deref().filter(|given| *given != namespace) {
        return Err(ApiError::bad_request(format!(
            "body namespace {} does not match the path's {}",
            shown(given),
            shown(&namespace)
        )));
    }
    check_names(&state, &namespace, &body.api).await?;
    // One round trip: the transaction's compares answer the 404s and the 409.
    match state.repo.create_subscription(&namespace, &body.api).await? {
        Ok((created, sync_id)) => Ok((StatusCode::CREATED, Json(created.value.view(&sync_id)))),
        Err(CreateRefused::NoNamespace) => Err(namespace_not_found(&namespace)),
        Err(CreateRefused::NoRegistration) => Err(registration_not_found(&state, &body.api)),
        Err(CreateRefused::Exists) => {
            Err(ApiError::conflict(format!("{} already exists", what(&namespace, &body.api))))
        }
    }
}

#[utoipa::path(get, path = "/namespaces/{namespace}/subscriptions/{api}", tag = "subscriptions",
    params(("namespace" = String, Path), ("api" = String, Path, description = "the registration's long name")),
    responses((status = 200, body = SubscriptionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Path((namespace, api)): Path<(String, String)>,
) -> Result<Json<SubscriptionView>, ApiError> {
    label("namespace", &namespace)?;
    long_name(&state, &api).await?;
    let read = state.repo.read_subscription(&namespace, &api).await?;
    match (&read.subscription, read.namespace_exists) {
        (Some(subscription), _) => Ok(Json(subscription.value.view(&read.sync_id))),
        // Which 404: a missing namespace is named as such.
        (None, false) => Err(namespace_not_found(&namespace)),
        (None, true) => Err(ApiError::not_found(format!("{} not found", what(&namespace, &api)))),
    }
}

/// The no-op confirmation behind PUT and PATCH: `api` is fixed by the path
/// and everything else is computed, so nothing is written.
async fn confirm(
    state: &ApiState,
    namespace: &str,
    api: &str,
    body: SubscriptionConfirm,
) -> Result<Json<SubscriptionView>, ApiError> {
    loop {
        let (subscription, sync_id) = existing(state, namespace, api).await?;
        if let Some(given) = body.api.as_deref().filter(|given| *given != api) {
            return Err(ApiError::bad_request(format!(
                "field \"api\" is fixed by the path: {} does not match {api:?}; the body may only be {{}} or {{\"api\": {api:?}}}",
                shown(given)
            )));
        }
        // Nothing changes; the confirmation is recorded all the same.
        let view = subscription.value.view(&sync_id);
        let record = RecordRef::Subscription { namespace, api };
        if state.repo.audit_unchanged(record, subscription.revision, crate::repo::audit::shown(&view)).await? {
            return Ok(Json(view));
        }
    }
}

#[utoipa::path(put, path = "/namespaces/{namespace}/subscriptions/{api}", tag = "subscriptions",
    params(("namespace" = String, Path), ("api" = String, Path)), request_body = SubscriptionConfirm,
    responses((status = 200, body = SubscriptionView, description = "unchanged: a no-op confirmation"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn update(
    Audited(state): Audited,
    Path((namespace, api)): Path<(String, String)>,
    JsonBody(body): JsonBody<SubscriptionConfirm>,
) -> Result<Json<SubscriptionView>, ApiError> {
    confirm(&state, &namespace, &api, body).await
}

#[utoipa::path(patch, path = "/namespaces/{namespace}/subscriptions/{api}", tag = "subscriptions",
    params(("namespace" = String, Path), ("api" = String, Path)), request_body = SubscriptionConfirm,
    responses((status = 200, body = SubscriptionView, description = "unchanged: there is nothing a patch may change"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn patch(
    Audited(state): Audited,
    Path((namespace, api)): Path<(String, String)>,
    JsonBody(body): JsonBody<SubscriptionConfirm>,
) -> Result<Json<SubscriptionView>, ApiError> {
    confirm(&state, &namespace, &api, body).await
}

#[utoipa::path(put, path = "/namespaces/{namespace}/subscriptions/{api}/sync", tag = "subscriptions",
    params(("namespace" = String, Path), ("api" = String, Path)), request_body = Empty,
    responses((status = 200, body = SubscriptionView, description = "`current_sync_id` reset to \"\"; `active` and `state` unchanged"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn sync(
    Audited(state): Audited,
    Path((namespace, api)): Path<(String, String)>,
    JsonBody(Empty {}): JsonBody<Empty>,
) -> Result<Json<SubscriptionView>, ApiError> {
    loop {
        let (current, sync_id) = existing(&state, &namespace, &api).await?;
        // A concurrent write moved it: read again (a delete answers 404 then).
        let before = current.value.view(&sync_id);
        let after = SubscriptionView { current_sync_id: String::new(), synced: false, ..before.clone() };
        let repo = state.repo.auditing(crate::repo::audit::shown(&before), crate::repo::audit::shown(&after));
        if let Some((reset, sync_id)) = repo.reset_subscription_sync(&namespace, &api, &current).await? {
            return Ok(Json(reset.value.view(&sync_id)));
        }
    }
}

#[utoipa::path(delete, path = "/namespaces/{namespace}/subscriptions/{api}", tag = "subscriptions",
    params(("namespace" = String, Path), ("api" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete(
    Audited(state): Audited,
    Path((namespace, api)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_names(&state, &namespace, &api).await?;
    // One round trip: its failure branch tells which 404.
    state.repo.delete_subscription(&namespace, &api).await?;
    Ok(StatusCode::NO_CONTENT)
}
