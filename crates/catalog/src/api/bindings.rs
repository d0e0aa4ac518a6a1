//! `/clusterrolebindings` and `/namespaces/{namespace}/rolebindings`
//! (§5.3): which user holds which role, everywhere or in one namespace.
//!
//! A binding may name a role or user that does not exist (yet): it grants
//! nothing until both do, as in Kubernetes, so objects can be created in
//! any order. Role bindings live with their namespace: creating one needs
//! the namespace, and deleting the namespace deletes them.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use kayra_core::{ClusterRoleBinding, RoleBinding};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, JsonObject, Path, Query, RequestBody, merged};
use super::list::{List, ListQuery, page};
use super::{ApiState, check_body_name, delete_with, label, shown, update_with};
use crate::repo::audit::shown as record_view;
use crate::repo::{Collection, RecordRef};

/// POST body of either kind; `name` is optional in PUT and PATCH bodies,
/// where it must match the path.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BindingBody {
    /// A DNS label.
    #[serde(default)]
    pub name: Option<String>,
    /// The role's name.
    pub role: String,
    /// The user's name.
    pub user: String,
    /// Role bindings only: may be repeated, must match the path.
    #[serde(default)]
    pub namespace: Option<String>,
}

impl RequestBody for BindingBody {}

/// Checks the parts every binding body shares.
fn validate(body: &BindingBody, namespace: Option<&str>) -> Result<(), ApiError> {
    label("role", &body.role)?;
    label("user", &body.user)?;
    match (namespace, body.namespace.as_deref()) {
        (None, Some(_)) => Err(ApiError::bad_request("a cluster role binding has no field \"namespace\"")),
        (Some(path), Some(given)) if path != given => Err(ApiError::bad_request(format!(
            "body namespace {} does not match the path's {}",
            shown(given),
            shown(path)
        ))),
        _ => Ok(()),
    }
}

fn body_name(body: &BindingBody) -> Result<&str, ApiError> {
    let name =
        body.name.as_deref().ok_or_else(|| ApiError::bad_request("invalid request body: missing field `name`"))?;
    label("binding", name)?;
    Ok(name)
}

fn cluster_what(name: &str) -> String {
    format!("cluster role binding {name:?}")
}

fn what(namespace: &str, name: &str) -> String {
    format!("role binding {name:?} in namespace {namespace:?}")
}

#[utoipa::path(get, path = "/clusterrolebindings", tag = "clusterrolebindings", params(ListQuery),
    responses((status = 200, body = List<ClusterRoleBinding>), (status = 400, body = ErrorBody)))]
pub(crate) async fn cluster_list(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<ClusterRoleBinding>>, ApiError> {
    page(&state, Collection::ClusterRoleBindings, &query, |b: ClusterRoleBinding| b).await.map(Json)
}

#[utoipa::path(post, path = "/clusterrolebindings", tag = "clusterrolebindings", request_body = BindingBody,
    responses((status = 201, body = ClusterRoleBinding), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn cluster_create(
    Audited(state): Audited,
    JsonBody(body): JsonBody<BindingBody>,
) -> Result<(StatusCode, Json<ClusterRoleBinding>), ApiError> {
    let name = body_name(&body)?.to_string();
    validate(&body, None)?;
    let binding = ClusterRoleBinding { name, role: body.role, user: body.user };
    let repo = state.repo.auditing(serde_json::Value::Null, record_view(&binding));
    repo.create(RecordRef::ClusterRoleBinding(&binding.name), &binding, &cluster_what(&binding.name)).await?;
    Ok((StatusCode::CREATED, Json(binding)))
}

#[utoipa::path(get, path = "/clusterrolebindings/{name}", tag = "clusterrolebindings", params(("name" = String, Path)),
    responses((status = 200, body = ClusterRoleBinding), (status = 404, body = ErrorBody)))]
pub(crate) async fn cluster_get(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<ClusterRoleBinding>, ApiError> {
    label("binding", &name)?;
    let binding = state.repo.get::<ClusterRoleBinding>(RecordRef::ClusterRoleBinding(&name)).await?;
    binding.map(|b| Json(b.value)).ok_or_else(|| ApiError::not_found(format!("{} not found", cluster_what(&name))))
}

#[utoipa::path(put, path = "/clusterrolebindings/{name}", tag = "clusterrolebindings", params(("name" = String, Path)),
    request_body = BindingBody,
    responses((status = 200, body = ClusterRoleBinding), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn cluster_update(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<BindingBody>,
) -> Result<Json<ClusterRoleBinding>, ApiError> {
    label("binding", &name)?;
    check_body_name("cluster role binding", &name, body.name.as_deref())?;
    validate(&body, None)?;
    let not_found = || ApiError::not_found(format!("{} not found", cluster_what(&name)));
    let updated =
        update_with(&state, RecordRef::ClusterRoleBinding(&name), not_found, |mut current: ClusterRoleBinding| {
            current.role.clone_from(&body.role);
            current.user.clone_from(&body.user);
            async move { Ok(current) }
        })
        .await?;
    Ok(Json(updated))
}

#[utoipa::path(patch, path = "/clusterrolebindings/{name}", tag = "clusterrolebindings", params(("name" = String, Path)),
    request_body(content = Object, description = "JSON merge patch (RFC 7386) of `role` and `user`"),
    responses((status = 200, body = ClusterRoleBinding), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn cluster_patch(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonObject(patch): JsonObject,
) -> Result<Json<ClusterRoleBinding>, ApiError> {
    label("binding", &name)?;
    let patch = serde_json::Value::Object(patch);
    let not_found = || ApiError::not_found(format!("{} not found", cluster_what(&name)));
    let updated =
        update_with(&state, RecordRef::ClusterRoleBinding(&name), not_found, |mut current: ClusterRoleBinding| {
            let (name, patch) = (&name, &patch);
            async move {
                let body: BindingBody =
                    merged(json!({"name": current.name, "role": current.role, "user": current.user}), patch)?;
                check_body_name("cluster role binding", name, body.name.as_deref())?;
                validate(&body, None)?;
                current.role = body.role;
                current.user = body.user;
                Ok(current)
            }
        })
        .await?;
    Ok(Json(updated))
}

#[utoipa::path(delete, path = "/clusterrolebindings/{name}", tag = "clusterrolebindings", params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub(crate) async fn cluster_delete(Audited(state): Audited, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    label("binding", &name)?;
    let not_found = || ApiError::not_found(format!("{} not found", cluster_what(&name)));
    delete_with::<ClusterRoleBinding>(&state, RecordRef::ClusterRoleBinding(&name), not_found).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Checks the namespace of a role binding path: valid and existing.
async fn namespace_exists(state: &ApiState, namespace: &str) -> Result<(), ApiError> {
    label("namespace", namespace)?;
    match state.repo.get_namespace(namespace).await? {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found(format!("namespace {namespace:?} not found"))),
    }
}

#[utoipa::path(get, path = "/namespaces/{namespace}/rolebindings", tag = "rolebindings",
    params(("namespace" = String, Path), ListQuery),
    responses((status = 200, body = List<RoleBinding>), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Path(namespace): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<RoleBinding>>, ApiError> {
    namespace_exists(&state, &namespace).await?;
    page(&state, Collection::NamespaceRoleBindings(&namespace), &query, |b: RoleBinding| b).await.map(Json)
}

#[utoipa::path(post, path = "/namespaces/{namespace}/rolebindings", tag = "rolebindings",
    params(("namespace" = String, Path)), request_body = BindingBody,
    responses((status = 201, body = RoleBinding), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub(crate) async fn create(
    Audited(state): Audited,
    Path(namespace): Path<String>,
    JsonBody(body): JsonBody<BindingBody>,
) -> Result<(StatusCode, Json<RoleBinding>), ApiError> {
    let name = body_name(&body)?.to_string();
    validate(&body, Some(&namespace))?;
    label("namespace", &namespace)?;
    // One round trip: the transaction's compare answers a missing namespace (404).
    let binding = RoleBinding { name, namespace, role: body.role, user: body.user };
    state.repo.auditing(serde_json::Value::Null, record_view(&binding)).create_role_binding(&binding).await?;
    Ok((StatusCode::CREATED, Json(binding)))
}

#[utoipa::path(get, path = "/namespaces/{namespace}/rolebindings/{name}", tag = "rolebindings",
    params(("namespace" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = RoleBinding), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<Json<RoleBinding>, ApiError> {
    namespace_exists(&state, &namespace).await?;
    label("binding", &name)?;
    let binding = state.repo.get::<RoleBinding>(RecordRef::RoleBinding { namespace: &namespace, name: &name }).await?;
    binding.map(|b| Json(b.value)).ok_or_else(|| ApiError::not_found(format!("{} not found", what(&namespace, &name))))
}

#[utoipa::path(put, path = "/namespaces/{namespace}/rolebindings/{name}", tag = "rolebindings",
    params(("namespace" = String, Path), ("name" = String, Path)), request_body = BindingBody,
    responses((status = 200, body = RoleBinding), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn update(
    Audited(state): Audited,
    Path((namespace, name)): Path<(String, String)>,
    JsonBody(body): JsonBody<BindingBody>,
) -> Result<Json<RoleBinding>, ApiError> {
    namespace_exists(&state, &namespace).await?;
    label("binding", &name)?;
    check_body_name("role binding", &name, body.name.as_deref())?;
    validate(&body, Some(&namespace))?;
    let not_found = || ApiError::not_found(format!("{} not found", what(&namespace, &name)));
    let updated = update_with(
        &state,
        RecordRef::RoleBinding { namespace: &namespace, name: &name },
        not_found,
        |mut current: RoleBinding| {
            current.role.clone_from(&body.role);
            current.user.clone_from(&body.user);
            async move { Ok(current) }
        },
    )
    .await?;
    Ok(Json(updated))
}

#[utoipa::path(patch, path = "/namespaces/{namespace}/rolebindings/{name}", tag = "rolebindings",
    params(("namespace" = String, Path), ("name" = String, Path)),
    request_body(content = Object, description = "JSON merge patch (RFC 7386) of `role` and `user`"),
    responses((status = 200, body = RoleBinding), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn patch(
    Audited(state): Audited,
    Path((namespace, name)): Path<(String, String)>,
    JsonObject(patch): JsonObject,
) -> Result<Json<RoleBinding>, ApiError> {
    namespace_exists(&state, &namespace).await?;
    label("binding", &name)?;
    let patch = serde_json::Value::Object(patch);
    let not_found = || ApiError::not_found(format!("{} not found", what(&namespace, &name)));
    let updated = update_with(
        &state,
        RecordRef::RoleBinding { namespace: &namespace, name: &name },
        not_found,
        |mut current: RoleBinding| {
            let (namespace, name, patch) = (&namespace, &name, &patch);
            async move {
                let writable =
                    json!({"name": current.name, "namespace": namespace, "role": current.role, "user": current.user});
                let body: BindingBody = merged(writable, patch)?;
                check_body_name("role binding", name, body.name.as_deref())?;
                validate(&body, Some(namespace))?;
                current.role = body.role;
                current.user = body.user;
                Ok(current)
            }
        },
    )
    .await?;
    Ok(Json(updated))
}

#[utoipa::path(delete, path = "/namespaces/{namespace}/rolebindings/{name}", tag = "rolebindings",
    params(("namespace" = String, Path), ("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete(
    Audited(state): Audited,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    namespace_exists(&state, &namespace).await?;
    label("binding", &name)?;
    let not_found = || ApiError::not_found(format!("{} not found", what(&namespace, &name)));
    delete_with::<RoleBinding>(&state, RecordRef::RoleBinding { namespace: &namespace, name: &name }, not_found)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
