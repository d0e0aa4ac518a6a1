//! `/apiregistrations`: the APIs this deployment serves (§4.2), with the
//! `/sync` shorthand that starts the ongoing action; the `/status` report
//! of every subscriber is [`super::status`].
//!
//! Registrations are scoped to this deployment's platform/region: the
//! repository reads and writes only under its own key prefix, so another
//! deployment's registration of the same name is simply not found here.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use kayra_core::ApiRegistration;
use kayra_core::rollout::RolloutPolicy;
use kayra_core::validation as rules;
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, JsonObject, Path, Query, RequestBody, merged, reject_computed};
use super::list::{List, ListQuery, page};
pub use super::status::{RegistrationStatus, Subscriber};
use super::{ApiState, Empty, check_body_name, label, long_name, registration_not_found};
use crate::repo::Collection;
use crate::repo::audit::shown;
use crate::repo::tenancy::{new_sync_id, sync_id_updated_now};

const COMPUTED: &[&str] = &["platform", "region", "sync_id_updated_at"];

/// POST body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistrationCreate {
    /// The long name: a DNS subdomain with at least one dot.
    pub name: String,
    /// A DNS label, unique among this deployment's registrations.
    #[serde(default)]
    pub short_name: String,
    /// A key into `reconciler.mode`; empty falls back to `default_mode`.
    #[serde(default)]
    pub mode: String,
    /// Any string; absent or empty means "now" (RFC 3339, UTC).
    #[serde(default)]
    pub sync_id: Option<String>,
    /// Base URL of the API's backend (http or https), for the gateway.
    #[serde(default)]
    pub endpoint: String,
    #[serde(default)]
    pub description: String,
    /// How a SyncID change reaches the subscribers (§12); absent or null: all at once.
    #[serde(default)]
    pub rollout: Option<RolloutPolicy>,
}

impl RequestBody for RegistrationCreate {
    const COMPUTED: &'static [&'static str] = COMPUTED;
}

/// PUT body (and the result of a PATCH): replaces every writable field; an
/// omitted one becomes empty, except `sync_id`, which is kept unless given.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistrationUpdate {
    /// May be repeated; must match the path.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub short_name: String,
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub sync_id: Option<String>,
    #[serde(default)]
    pub endpoint: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub rollout: Option<RolloutPolicy>,
}

impl RequestBody for RegistrationUpdate {
    const COMPUTED: &'static [&'static str] = COMPUTED;
}

/// A refused value as the caller is told (§4.2: naming the field).
fn invalid(invalid: rules::Invalid) -> ApiError {
    ApiError::bad_request(invalid.to_string())
}

/// A `sync_id` the caller gave; empty means "let the server set it".
fn given_sync_id(sync_id: Option<&str>) -> Result<(), ApiError> {
    sync_id.filter(|s| !s.is_empty()).map_or(Ok(()), |s| rules::validate_sync_id(s).map_err(invalid))
}

/// Checks a rollout policy (§12): its shape, and each gate as a step.
fn validate_rollout(policy: Option<&RolloutPolicy>) -> Result<(), ApiError> {
    let Some(policy) = policy else { return Ok(()) };
    policy.validate().map_err(|e| ApiError::bad_request(e.to_string()))?;
    for (i, wave) in policy.waves.iter().enumerate() {
        if let Some(gate) = &wave.gate {
            kayra_pipeline::Gate::compile(gate).map_err(|(field, message)| {
                let field = if field.is_empty() { String::new() } else { format!(".{field}") };
                ApiError::bad_request(format!("rollout.waves[{i}].gate{field}: {message}"))
            })?;
        }
    }
    Ok(())
}

/// Checks the writable fields of a registration named `name`.
async fn validate(state: &ApiState, name: &str, short_name: &str, endpoint: &str) -> Result<(), ApiError> {
    rules::validate_endpoint(endpoint).map_err(invalid)?;
    rules::validate_not_reserved(name, short_name).map_err(invalid)?;
    if short_name.is_empty() {
        return Ok(());
    }
    label("short name", short_name)?;
    let (all, _) = state.repo.list_registrations().await?;
    if let Some(other) =
        all.iter().map(|r| &r.value).find(|r| r.name != name && (r.short_name == short_name || r.name == short_name))
    {
        return Err(ApiError::conflict(format!(
            "short name {short_name:?} is already used by api registration {:?}",
            other.name
        )));
    }
    Ok(())
}

#[utoipa::path(get, path = "/apiregistrations", tag = "apiregistrations", params(ListQuery),
    responses((status = 200, body = List<ApiRegistration>), (status = 400, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<ApiRegistration>>, ApiError> {
    page(&state, Collection::Registrations, &query, |r: ApiRegistration| r).await.map(Json)
}

#[utoipa::path(post, path = "/apiregistrations", tag = "apiregistrations", request_body = RegistrationCreate,
    responses((status = 201, body = ApiRegistration), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn create(
    Audited(state): Audited,
    JsonBody(body): JsonBody<RegistrationCreate>,
) -> Result<(StatusCode, Json<ApiRegistration>), ApiError> {
    long_name(&state, &body.name).await?;
    validate(&state, &body.name, &body.short_name, &body.endpoint).await?;
    given_sync_id(body.sync_id.as_deref())?;
    validate_rollout(body.rollout.as_ref())?;
    let registration = ApiRegistration {
        sync_id: body.sync_id.filter(|s| !s.is_empty()).unwrap_or_else(|| new_sync_id("")),
        sync_id_updated_at: sync_id_updated_now(),
        name: body.name,
        short_name: body.short_name,
        mode: body.mode,
        endpoint: body.endpoint,
        description: body.description,
        platform: state.repo.platform().to_string(),
        region: state.repo.region().to_string(),
        rollout: body.rollout,
    };
    let repo = state.repo.auditing(serde_json::Value::Null, crate::repo::audit::shown(&registration));
    repo.create_registration(&registration).await?;
    Ok((StatusCode::CREATED, Json(registration)))
}

#[utoipa::path(get, path = "/apiregistrations/{name}", tag = "apiregistrations", params(("name" = String, Path)),
    responses((status = 200, body = ApiRegistration), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<ApiRegistration>, ApiError> {
    long_name(&state, &name).await?;
    let registration = state.repo.get_registration(&name).await?;
    registration.map(|r| Json(r.value)).ok_or_else(|| registration_not_found(&state, &name))
}

#[utoipa::path(put, path = "/apiregistrations/{name}", tag = "apiregistrations", params(("name" = String, Path)),
    request_body = RegistrationUpdate,
    responses((status = 200, body = ApiRegistration), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub(crate) async fn update(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<RegistrationUpdate>,
) -> Result<Json<ApiRegistration>, ApiError> {
    long_name(&state, &name).await?;
    let updated = update_registration_with(&state, &name, |current| {
        let (state, name, body) = (&state, &name, &body);
        async move { apply(state, name, current, body).await }
    })
    .await?;
    Ok(Json(updated))
}

#[utoipa::path(patch, path = "/apiregistrations/{name}", tag = "apiregistrations", params(("name" = String, Path)),
    request_body(content = Object, description = "JSON merge patch (RFC 7386) of the writable fields"),
    responses((status = 200, body = ApiRegistration), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub(crate) async fn patch(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonObject(patch): JsonObject,
) -> Result<Json<ApiRegistration>, ApiError> {
    long_name(&state, &name).await?;
    reject_computed(&patch, COMPUTED)?;
    let patch = serde_json::Value::Object(patch);
    let updated = update_registration_with(&state, &name, |current: ApiRegistration| {
        let (state, name, patch) = (&state, &name, &patch);
        async move {
            let writable = json!({
                "name": current.name,
                "short_name": current.short_name,
                "mode": current.mode,
                "sync_id": current.sync_id,
                "endpoint": current.endpoint,
                "description": current.description,
                "rollout": current.rollout,
            });
            let body = merged(writable, patch)?;
            apply(state, name, current, &body).await
        }
    })
    .await?;
    Ok(Json(updated))
}

/// `update_with` for registrations: the write moves the short-name claim
/// in the same transaction (`Repository::update_registration`).
async fn update_registration_with<F, Fut>(
    state: &ApiState,
    name: &str,
    mut change: F,
) -> Result<ApiRegistration, ApiError>
where
    F: FnMut(ApiRegistration) -> Fut,
    Fut: Future<Output = Result<ApiRegistration, ApiError>>,
{
    loop {
        let current = state.repo.get_registration(name).await?.ok_or_else(|| registration_not_found(state, name))?;
        let next = change(current.value.clone()).await?;
        if next == current.value {
            let record = crate::repo::RecordRef::Registration(name);
            if state.repo.audit_unchanged(record, current.revision, shown(&next)).await? {
                return Ok(next);
            }
            continue;
        }
        let repo = state.repo.auditing(shown(&current.value), shown(&next));
        if repo.update_registration(&current, &next).await?.is_some() {
            return Ok(next);
        }
    }
}

/// The next value of a registration under a PUT body, validated.
async fn apply(
    state: &ApiState,
    name: &str,
    mut current: ApiRegistration,
    body: &RegistrationUpdate,
) -> Result<ApiRegistration, ApiError> {
    check_body_name("api registration", name, body.name.as_deref())?;
    validate(state, name, &body.short_name, &body.endpoint).await?;
    given_sync_id(body.sync_id.as_deref())?;
    validate_rollout(body.rollout.as_ref())?;
    current.rollout.clone_from(&body.rollout);
    current.short_name.clone_from(&body.short_name);
    current.mode.clone_from(&body.mode);
    current.endpoint.clone_from(&body.endpoint);
    current.description.clone_from(&body.description);
    if let Some(sync_id) = body.sync_id.as_ref().filter(|s| !s.is_empty() && **s != current.sync_id) {
        current.sync_id.clone_from(sync_id);
        current.sync_id_updated_at = sync_id_updated_now();
    }
    Ok(current)
}

#[utoipa::path(delete, path = "/apiregistrations/{name}", tag = "apiregistrations", params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "still referenced by subscriptions, named in the message")))]
pub(crate) async fn delete(Audited(state): Audited, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    long_name(&state, &name).await?;
    match state.repo.delete_registration(&name).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(crate::repo::Error::NotFound(_)) => Err(registration_not_found(&state, &name)),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(put, path = "/apiregistrations/{name}/sync", tag = "apiregistrations", params(("name" = String, Path)),
    request_body = Empty,
    responses((status = 200, body = ApiRegistration, description = "`sync_id` is now the current time, RFC 3339 with sub-second precision"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn sync(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonBody(Empty {}): JsonBody<Empty>,
) -> Result<Json<ApiRegistration>, ApiError> {
    long_name(&state, &name).await?;
    match state.repo.bump_registration_sync_id(&name).await {
        Ok(r) => Ok(Json(r.value)),
        Err(crate::repo::Error::NotFound(_)) => Err(registration_not_found(&state, &name)),
        Err(e) => Err(e.into()),
    }
}
