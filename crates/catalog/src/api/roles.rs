//! `/roles` (§5.3): named sets of rules, cluster-scoped. A role grants
//! nothing until a binding names it; deleting a bound role is allowed and
//! simply makes its bindings grant nothing.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use kayra_core::{Role, Rule};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, JsonObject, Path, Query, RequestBody, merged};
use super::list::{List, ListQuery, page};
use super::{ApiState, check_body_name, label, update_with};
use crate::repo::{Collection, RecordRef};

/// A rule as a body gives it. Unlike the stored [`Rule`], unknown fields
/// are refused, so a misspelt `resource` is a 400, not a silent no-grant.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleBody {
    /// API long names, or `"*"`; omitted means every API.
    #[serde(default)]
    pub apis: Option<Vec<String>>,
    /// e.g. `subscriptions`, `subscriptions/sync`, or `"*"`.
    pub resources: Vec<String>,
    /// e.g. `get`, `list`, `create`, `update`, `patch`, `delete`, or `"*"`.
    pub verbs: Vec<String>,
}

/// POST body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleCreate {
    /// A DNS label.
    pub name: String,
    #[serde(default)]
    pub rules: Vec<RuleBody>,
}

impl RequestBody for RoleCreate {}

/// PUT body (and the result of a PATCH): replaces the rules.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleUpdate {
    /// May be repeated; must match the path.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub rules: Vec<RuleBody>,
}

impl RequestBody for RoleUpdate {}

/// Checks rules and turns them into their stored form.
fn rules(bodies: Vec<RuleBody>) -> Result<Vec<Rule>, ApiError> {
    bodies
        .into_iter()
        .enumerate()
        .map(|(index, body)| {
            let apis = body.apis.unwrap_or_else(|| vec!["*".to_string()]);
            for (field, list) in [("apis", &apis), ("resources", &body.resources), ("verbs", &body.verbs)] {
                if list.iter().any(|entry| entry.trim().is_empty()) {
                    return Err(ApiError::bad_request(format!(
                        "rules[{index}].{field} must not contain empty entries"
                    )));
                }
            }
            Ok(Rule { apis, resources: body.resources, verbs: body.verbs })
        })
        .collect()
}

fn what(name: &str) -> String {
    format!("role {name:?}")
}

fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("{} not found", what(name)))
}

#[utoipa::path(get, path = "/roles", tag = "roles", params(ListQuery),
    responses((status = 200, body = List<Role>), (status = 400, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<Role>>, ApiError> {
    page(&state, Collection::Roles, &query, |r: Role| r).await.map(Json)
}

#[utoipa::path(post, path = "/roles", tag = "roles", request_body = RoleCreate,
    responses((status = 201, body = Role), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create(
    Audited(state): Audited,
    JsonBody(body): JsonBody<RoleCreate>,
) -> Result<(StatusCode, Json<Role>), ApiError> {
    label("role", &body.name)?;
    let role = Role { rules: rules(body.rules)?, name: body.name };
    let repo = state.repo.auditing(serde_json::Value::Null, crate::repo::audit::shown(&role));
    repo.create(RecordRef::Role(&role.name), &role, &what(&role.name)).await?;
    Ok((StatusCode::CREATED, Json(role)))
}

#[utoipa::path(get, path = "/roles/{name}", tag = "roles", params(("name" = String, Path)),
    responses((status = 200, body = Role), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(State(state): State<ApiState>, Path(name): Path<String>) -> Result<Json<Role>, ApiError> {
    label("role", &name)?;
    let role = state.repo.get::<Role>(RecordRef::Role(&name)).await?;
    role.map(|r| Json(r.value)).ok_or_else(|| not_found(&name))
}

#[utoipa::path(put, path = "/roles/{name}", tag = "roles", params(("name" = String, Path)), request_body = RoleUpdate,
    responses((status = 200, body = Role), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn update(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<RoleUpdate>,
) -> Result<Json<Role>, ApiError> {
    label("role", &name)?;
    check_body_name("role", &name, body.name.as_deref())?;
    let new_rules = rules(body.rules)?;
    let updated = update_with(
        &state,
        RecordRef::Role(&name),
        || not_found(&name),
        |mut current: Role| {
            current.rules.clone_from(&new_rules);
            async move { Ok(current) }
        },
    )
    .await?;
    Ok(Json(updated))
}

#[utoipa::path(patch, path = "/roles/{name}", tag = "roles", params(("name" = String, Path)),
    request_body(content = Object, description = "JSON merge patch (RFC 7386) of `rules` (an array is replaced whole)"),
    responses((status = 200, body = Role), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn patch(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonObject(patch): JsonObject,
) -> Result<Json<Role>, ApiError> {
    label("role", &name)?;
    let patch = serde_json::Value::Object(patch);
    let updated = update_with(
        &state,
        RecordRef::Role(&name),
        || not_found(&name),
        |mut current: Role| {
            let (name, patch) = (&name, &patch);
            async move {
                let body: RoleUpdate = merged(json!({"name": current.name, "rules": current.rules}), patch)?;
                check_body_name("role", name, body.name.as_deref())?;
                current.rules = rules(body.rules)?;
                Ok(current)
            }
        },
    )
    .await?;
    Ok(Json(updated))
}

#[utoipa::path(delete, path = "/roles/{name}", tag = "roles", params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete(Audited(state): Audited, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    label("role", &name)?;
    super::delete_with::<Role>(&state, RecordRef::Role(&name), || not_found(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}
