//! `/users`, `/users/{name}/tokens` and `/whoami` (§5.2).
//!
//! A token is shown once, in the 201 of its creation; afterwards only its
//! `id` and `created_at` are ever returned. Deleting a token or its user
//! revokes it at once: authentication reads the store on every request.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use kayra_core::User;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::audit::Audited;
use super::authz::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, JsonObject, Path, Query, RequestBody, merged};
use super::list::{List, ListQuery, page, page_in_memory};
use super::{ApiState, Empty, check_body_name, label, shown, update_with};
use crate::repo::{Collection, RecordRef};

/// POST body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserCreate {
    /// A DNS label.
    pub name: String,
    #[serde(default)]
    pub description: String,
}

impl RequestBody for UserCreate {}

/// PUT body (and the result of a PATCH).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserUpdate {
    /// May be repeated; must match the path.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: String,
}

impl RequestBody for UserUpdate {}

/// The answer to `POST /users/{name}/tokens`: the only time `token` is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    pub id: String,
    /// The bearer token. kayra keeps only its hash.
    pub token: String,
    pub created_at: String,
}

/// A token as listed: never the secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    pub id: String,
    pub created_at: String,
}

/// `GET /whoami`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Whoami {
    pub user: String,
    /// The roles bound to the user by cluster role bindings, sorted.
    pub cluster_roles: Vec<String>,
}

fn what(name: &str) -> String {
    format!("user {name:?}")
}

fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("{} not found", what(name)))
}

#[utoipa::path(get, path = "/users", tag = "users", params(ListQuery),
    responses((status = 200, body = List<User>), (status = 400, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<User>>, ApiError> {
    page(&state, Collection::Users, &query, |u: User| u).await.map(Json)
}

#[utoipa::path(post, path = "/users", tag = "users", request_body = UserCreate,
    responses((status = 201, body = User), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create(
    Audited(state): Audited,
    JsonBody(body): JsonBody<UserCreate>,
) -> Result<(StatusCode, Json<User>), ApiError> {
    label("user", &body.name)?;
    let user = User { name: body.name, description: body.description };
    let repo = state.repo.auditing(serde_json::Value::Null, crate::repo::audit::shown(&user));
    repo.create(RecordRef::User(&user.name), &user, &what(&user.name)).await?;
    Ok((StatusCode::CREATED, Json(user)))
}

#[utoipa::path(get, path = "/users/{name}", tag = "users", params(("name" = String, Path)),
    responses((status = 200, body = User), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(State(state): State<ApiState>, Path(name): Path<String>) -> Result<Json<User>, ApiError> {
    label("user", &name)?;
    state.repo.get_user(&name).await?.map(|u| Json(u.value)).ok_or_else(|| not_found(&name))
}

#[utoipa::path(put, path = "/users/{name}", tag = "users", params(("name" = String, Path)), request_body = UserUpdate,
    responses((status = 200, body = User), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn update(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<UserUpdate>,
) -> Result<Json<User>, ApiError> {
    label("user", &name)?;
    let updated = update_with(
        &state,
        RecordRef::User(&name),
        || not_found(&name),
        |current| {
            let (name, body) = (&name, &body);
            async move { apply(name, current, body) }
        },
    )
    .await?;
    Ok(Json(updated))
}

#[utoipa::path(patch, path = "/users/{name}", tag = "users", params(("name" = String, Path)),
    request_body(content = Object, description = "JSON merge patch (RFC 7386) of `description`"),
    responses((status = 200, body = User), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn patch(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonObject(patch): JsonObject,
) -> Result<Json<User>, ApiError> {
    label("user", &name)?;
    let patch = serde_json::Value::Object(patch);
    let updated = update_with(
        &state,
        RecordRef::User(&name),
        || not_found(&name),
        |current: User| {
            let (name, patch) = (&name, &patch);
            async move {
                let body = merged(json!({"name": current.name, "description": current.description}), patch)?;
                apply(name, current, &body)
            }
        },
    )
    .await?;
    Ok(Json(updated))
}

/// The next value of a user under a PUT body: only `description` changes.
fn apply(name: &str, mut current: User, body: &UserUpdate) -> Result<User, ApiError> {
    check_body_name("user", name, body.name.as_deref())?;
    current.description.clone_from(&body.description);
    Ok(current)
}

#[utoipa::path(delete, path = "/users/{name}", tag = "users", params(("name" = String, Path)),
    responses((status = 204, description = "deleted, and every token of the user revoked"), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete(Audited(state): Audited, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    label("user", &name)?;
    state.repo.delete_user(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/users/{name}/tokens", tag = "users", params(("name" = String, Path), ListQuery),
    responses((status = 200, body = List<TokenInfo>), (status = 404, body = ErrorBody)))]
pub(crate) async fn list_tokens(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<TokenInfo>>, ApiError> {
    label("user", &name)?;
    state.repo.get_user(&name).await?.ok_or_else(|| not_found(&name))?;
    let tokens = state.repo.list_user_tokens(&name).await?;
    let infos = tokens.into_iter().map(|t| TokenInfo { id: t.id, created_at: t.created_at }).collect();
    page_in_memory(infos, &query, |t: &TokenInfo| t.id.as_str()).map(Json)
}

#[utoipa::path(post, path = "/users/{name}/tokens", tag = "users", params(("name" = String, Path)), request_body = Empty,
    responses((status = 201, body = TokenCreated), (status = 404, body = ErrorBody)))]
pub(crate) async fn create_token(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonBody(Empty {}): JsonBody<Empty>,
) -> Result<(StatusCode, Json<TokenCreated>), ApiError> {
    label("user", &name)?;
    let issued = state.repo.issue_token(&name).await?;
    tracing::info!(user = %name, token_id = %issued.id, "token issued");
    Ok((StatusCode::CREATED, Json(TokenCreated { id: issued.id, token: issued.token, created_at: issued.created_at })))
}

#[utoipa::path(get, path = "/users/{name}/tokens/{id}", tag = "users", params(("name" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = TokenInfo), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_token(
    State(state): State<ApiState>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Json<TokenInfo>, ApiError> {
    label("user", &name)?;
    let token = state.repo.get_user_token(&name, &id).await?;
    token
        .map(|t| Json(TokenInfo { id: t.id, created_at: t.created_at }))
        .ok_or_else(|| ApiError::not_found(format!("token {} of user {name:?} not found", shown(&id))))
}

#[utoipa::path(delete, path = "/users/{name}/tokens/{id}", tag = "users", params(("name" = String, Path), ("id" = String, Path)),
    responses((status = 204, description = "revoked: the next request with the token is refused"), (status = 404, body = ErrorBody)))]
pub(crate) async fn delete_token(
    Audited(state): Audited,
    Path((name, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    label("user", &name)?;
    if !crate::repo::auth::is_token_id(&id) {
        return Err(ApiError::not_found(format!("token {} of user {name:?} not found", shown(&id))));
    }
    state.repo.revoke_token(&name, &id).await?;
    tracing::info!(user = %name, token_id = %id, "token revoked");
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/whoami", tag = "users", responses((status = 200, body = Whoami)))]
pub(crate) async fn whoami(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Whoami>, ApiError> {
    let cluster_roles = state.repo.cluster_role_names(&caller.user).await?;
    Ok(Json(Whoami { user: caller.user, cluster_roles }))
}
