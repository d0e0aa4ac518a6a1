//! `/apiregistrations/:name/rollout` (platform §12): the rollout of the
//! API's latest SyncID change, and operators' actions on it.
//!
//! The reconcilers advance a rollout; this route only reads it and applies
//! `pause`, `resume`, `abort` and `promote` by compare-and-swap on the same
//! record, audited like every change.

use axum::Json;
use axum::extract::State;
use kayra_core::rollout::{Action, Rollout};
use serde::Deserialize;
use utoipa::ToSchema;

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, Path, RequestBody};
use super::{ApiState, long_name, registration_not_found};
use crate::repo::rollouts::Acted;

/// `PUT …/rollout`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutAction {
    /// `pause`, `resume`, `abort` or `promote`.
    #[schema(value_type = String)]
    pub action: Action,
    /// Why; shown in the rollout's `reason` with the user.
    #[serde(default)]
    pub reason: String,
}

impl RequestBody for RolloutAction {}

fn no_rollout(name: &str) -> ApiError {
    ApiError::not_found(format!("no rollout of api registration {name:?} has started"))
}

#[utoipa::path(get, path = "/apiregistrations/{name}/rollout", tag = "apiregistrations", params(("name" = String, Path)),
    responses((status = 200, body = Rollout), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such registration, or no rollout has started")))]
pub(crate) async fn get(State(state): State<ApiState>, Path(name): Path<String>) -> Result<Json<Rollout>, ApiError> {
    long_name(&state, &name).await?;
    if state.repo.get_registration(&name).await?.is_none() {
        return Err(registration_not_found(&state, &name));
    }
    let record = state.repo.rollout(&name).await?.ok_or_else(|| no_rollout(&name))?;
    Ok(Json(record.value.rollout))
}

#[utoipa::path(put, path = "/apiregistrations/{name}/rollout", tag = "apiregistrations", params(("name" = String, Path)),
    request_body = RolloutAction,
    responses((status = 200, body = Rollout), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the rollout's state does not allow the action")))]
pub(crate) async fn act(
    Audited(state): Audited,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<RolloutAction>,
) -> Result<Json<Rollout>, ApiError> {
    long_name(&state, &name).await?;
    if state.repo.get_registration(&name).await?.is_none() {
        return Err(registration_not_found(&state, &name));
    }
    let user = state.repo.audit_context().map(|c| c.user.clone()).unwrap_or_default();
    let reason = kayra_core::runs::cut(body.reason.trim(), 512).into_owned();
    let by = if reason.is_empty() { user } else { format!("{user}: {reason}") };
    match state.repo.act_on_rollout(&name, body.action, &by, &state.notifications).await {
        Ok(Acted::Done(record)) => Ok(Json(record.value.rollout)),
        Ok(Acted::NotAllowed(refused)) => Err(ApiError::conflict(refused.to_string())),
        Err(crate::repo::Error::NotFound(_)) => Err(no_rollout(&name)),
        Err(e) => Err(e.into()),
    }
}
