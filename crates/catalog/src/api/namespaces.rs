//! `/namespaces`: tenants (§4.1). Cluster-scoped, shared by every
//! deployment on one store; `active` is computed (the reconciler sets it).
//!
//! `labels` are validated by [`kayra_core::labels`]; the list takes
//! `?labelSelector=` ([`SelectorQuery`]), whose paging counts only the
//! namespaces that match: `limit` is the most items a page returns, and
//! `continue` continues after the last item returned, so no matching
//! namespace is lost or repeated between pages.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use kayra_core::Namespace;
use kayra_core::labels::{Selector, validate_labels};
use serde::Deserialize;
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, JsonObject, Path, Query, RequestBody, merged, reject_computed};
use super::list::{List, ListQuery, continue_token, page};
use super::{ApiState, check_body_name, label, update_with};
use crate::repo::{Collection, RecordRef};

const COMPUTED: &[&str] = &["active"];

/// POST body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamespaceCreate {
    /// A DNS label.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// At most 64 entries; see the API reference for the key and value rules.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl RequestBody for NamespaceCreate {
    const COMPUTED: &'static [&'static str] = COMPUTED;
}

/// PUT body (and the result of a PATCH): only `description` and `labels`
/// can change; `name` may be repeated but must match the path.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamespaceUpdate {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: String,
    /// Replaces the labels (an omitted `labels` becomes `{}`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `?labelSelector=tier=canary,env,!legacy` of a namespace list (and of
/// its watch).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SelectorQuery {
    /// Comma-separated terms, all of which must hold: `k=v` (equal; `k=` is
    /// the empty value), `k` (present), `!k` (absent).
    #[serde(rename = "labelSelector")]
    #[param(rename = "labelSelector")]
    pub label_selector: Option<String>,
}

impl SelectorQuery {
    /// The selector asked for; `None` when absent or empty (everything).
    pub fn selector(&self) -> Result<Option<Selector>, ApiError> {
        let Some(text) = self.label_selector.as_deref() else {
            return Ok(None);
        };
        let selector = Selector::parse(text).map_err(ApiError::bad_request)?;
        Ok((!selector.is_empty()).then_some(selector))
    }
}

/// Refuses labels that break §4.1's rules (400 naming the key).
fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ApiError> {
    validate_labels(labels).map_err(|e| ApiError::bad_request(e.to_string()))
}

impl RequestBody for NamespaceUpdate {
    const COMPUTED: &'static [&'static str] = COMPUTED;
}

fn what(name: &str) -> String {
    format!("namespace {name:?}")
}

fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("{} not found", what(name)))
}

#[utoipa::path(get, path = "/namespaces", tag = "namespaces", params(ListQuery, SelectorQuery),
    responses((status = 200, body = List<Namespace>), (status = 400, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
    Query(selecting): Query<SelectorQuery>,
) -> Result<Json<List<Namespace>>, ApiError> {
    match selecting.selector()? {
        None => page(&state, Collection::Namespaces, &query, |ns: Namespace| ns).await.map(Json),
        Some(selector) => selected_page(&state, &query, &selector).await.map(Json),
    }
}

/// How many records a selected page reads from the store at a time (at
/// least `limit`).
const SCAN_CHUNK: usize = 500;

/// One page of the namespaces `selector` matches: up to `limit` of them
/// (all when 0), read in chunks after the continue token's key. The token
/// of a full page is the key of its last item, and is given only when
/// another matching namespace exists after it.
async fn selected_page(state: &ApiState, query: &ListQuery, selector: &Selector) -> Result<List<Namespace>, ApiError> {
    let layout = state.repo.layout();
    let mut after = query.after(&layout.prefix(Collection::Namespaces))?;
    let limit = query.limit();
    let chunk = if limit == 0 { 0 } else { limit.max(SCAN_CHUNK) };
    let mut items: Vec<Namespace> = Vec::new();
    loop {
        let scanned = state.repo.list::<Namespace>(Collection::Namespaces, after.as_deref(), chunk).await?;
        for namespace in scanned.items.into_iter().map(|v| v.value) {
            if !selector.matches(&namespace.labels) {
                continue;
            }
            if limit > 0 && items.len() == limit {
                // One more match: the page is full and more remain.
                let last = items.last().map(|ns| layout.key(RecordRef::Namespace(&ns.name)));
                return Ok(List { items, continue_token: continue_token(last.as_deref()) });
            }
            items.push(namespace);
        }
        match scanned.next {
            Some(next) => after = Some(next),
            None => return Ok(List { items, continue_token: String::new() }),
        }
    }
}

#[utoipa::path(post, path = "/namespaces", tag = "namespaces", request_body = NamespaceCreate,
    responses((status = 201, body = Namespace), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create(
    Audited(state): Audited,
    JsonBody(body): JsonBody<NamespaceCreate>,
) -> Result<(StatusCode, Json<Namespace>), ApiError> {
    label("namespace", &body.name)?;
    check_labels(&body.labels)?;
    let namespace = Namespace { name: body.name, description: body.description, labels: body.labels, active: false };
    let repo = state.repo.auditing(serde_json::Value::Null, crate::repo::audit::shown(&namespace));
    repo.create(RecordRef::Namespace(&namespace.name), &namespace, &what(&namespace.name)).await?;
    Ok((StatusCode::CREATED, Json(namespace)))
}

#[utoipa::path(get, path = "/namespaces/{namespace}", tag = "namespaces", params(("namespace" = String, Path)),
    responses((status = 200, body = Namespace), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(State(state): State<ApiState>, Path(name): Path<String>) -> Result<Json<Namespace>, ApiError> {
    label("namespace", &name)?;
    let namespace = state.repo.get_namespace(&name).await?;
    namespace.map(|ns| Json(ns.value)).ok_or_else(|| not_found(&name))
}

#[utoipa::path(put, path = "/namespaces/{namespace}", tag = "namespaces", params(("namespace" = String, Path)),
    request_body = NamespaceUpdate,
    responses((status = 200, body = Namespace), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn update(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<NamespaceUpdate>,
) -> Result<Json<Namespace>, ApiError> {
    label("namespace", &name)?;
    let updated = update_with(
        &state,
        RecordRef::Namespace(&name),
        || not_found(&name),
        |current| {
            let body = &body;
            let name = &name;
            async move { apply(name, current, body) }
        },
    )
    .await?;
    Ok(Json(updated))
}

#[utoipa::path(patch, path = "/namespaces/{namespace}", tag = "namespaces", params(("namespace" = String, Path)),
    request_body(content = Object, description = "JSON merge patch (RFC 7386) of `description` and `labels`"),
    responses((status = 200, body = Namespace), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn patch(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonObject(patch): JsonObject,
) -> Result<Json<Namespace>, ApiError> {
    label("namespace", &name)?;
    reject_computed(&patch, COMPUTED)?;
    let patch = serde_json::Value::Object(patch);
    let updated = update_with(
        &state,
        RecordRef::Namespace(&name),
        || not_found(&name),
        |current: Namespace| {
            let (patch, name) = (&patch, &name);
            async move {
                let body = merged(
                    json!({"name": current.name, "description": current.description, "labels": current.labels}),
                    patch,
                )?;
                apply(name, current, &body)
            }
        },
    )
    .await?;
    Ok(Json(updated))
}

/// The next value of a namespace under a PUT body: only `description` and
/// `labels` change.
fn apply(name: &str, mut current: Namespace, body: &NamespaceUpdate) -> Result<Namespace, ApiError> {
    check_body_name("namespace", name, body.name.as_deref())?;
    check_labels(&body.labels)?;
    current.description.clone_from(&body.description);
    current.labels.clone_from(&body.labels);
    Ok(current)
}

#[utoipa::path(delete, path = "/namespaces/{namespace}", tag = "namespaces", params(("namespace" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the namespace still has subscriptions, named in the message")))]
pub(crate) async fn delete(Audited(state): Audited, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    label("namespace", &name)?;
    state.repo.delete_namespace(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
