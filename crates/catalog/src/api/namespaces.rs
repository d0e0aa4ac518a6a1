//! `/namespaces`: tenants (§4.1). Cluster-scoped, shared by every
//! deployment on one store; `active` is computed (the reconciler sets it).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use kayra_core::Namespace;
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, JsonObject, Path, Query, RequestBody, merged, reject_computed};
use super::list::{List, ListQuery, page};
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
}

impl RequestBody for NamespaceCreate {
    const COMPUTED: &'static [&'static str] = COMPUTED;
}

/// PUT body (and the result of a PATCH): only `description` can change;
/// `name` may be repeated but must match the path.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamespaceUpdate {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: String,
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

#[utoipa::path(get, path = "/namespaces", tag = "namespaces", params(ListQuery),
    responses((status = 200, body = List<Namespace>), (status = 400, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<Namespace>>, ApiError> {
    page(&state, Collection::Namespaces, &query, |ns: Namespace| ns).await.map(Json)
}

#[utoipa::path(post, path = "/namespaces", tag = "namespaces", request_body = NamespaceCreate,
    responses((status = 201, body = Namespace), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create(
    Audited(state): Audited,
    JsonBody(body): JsonBody<NamespaceCreate>,
) -> Result<(StatusCode, Json<Namespace>), ApiError> {
    label("namespace", &body.name)?;
    let namespace = Namespace { name: body.name, description: body.description, active: false };
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
    request_body(content = Object, description = "JSON merge patch (RFC 7386) of `description`"),
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
                let body = merged(json!({"name": current.name, "description": current.description}), patch)?;
                apply(name, current, &body)
            }
        },
    )
    .await?;
    Ok(Json(updated))
}

/// The next value of a namespace under a PUT body: only `description` changes.
fn apply(name: &str, mut current: Namespace, body: &NamespaceUpdate) -> Result<Namespace, ApiError> {
    check_body_name("namespace", name, body.name.as_deref())?;
    current.description.clone_from(&body.description);
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
