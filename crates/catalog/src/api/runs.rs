//! `/namespaces/{namespace}/subscriptions/{api}/runs`: the record of every
//! reconcile attempt of one subscription (§4.4), newest first.
//!
//! The reconciler writes them (in the same store transaction as the
//! attempt's result, one record holding the subscription's run history);
//! this module only reads them. The Repository reads that one record and
//! decodes only the page asked for (§17; [`crate::repo::runs`]).
//!
//! The continue token is the base64url of the subscription's runs' key
//! prefix and the last id returned, so a token only works for the
//! subscription it came from.
//!
//! `PUT …/runs/{id}/cancel` (§12) stops a run in flight wherever it runs:
//! it writes a cancel request, which the reconciler holding the run
//! answers with the run as recorded ([`crate::repo::cancels`]).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use kayra_core::Run;
use kayra_core::audit::validate_reason;
use serde::Deserialize;
use utoipa::ToSchema;

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, Path, Query, RequestBody};
use super::list::{List, ListQuery, continue_token};
use super::subscriptions::existing;
use super::{ApiState, shown};
use crate::repo::Collection;
use crate::repo::cancels::{CancelOutcome, CancelRequest};

/// How long a cancel waits for the run's holder to answer: it stops the
/// run and records it within a second; a run id nobody holds is a 404
/// once this has passed.
pub const CANCEL_PATIENCE: Duration = Duration::from_secs(5);

/// `PUT …/runs/{id}/cancel`'s body: `{"reason": "…"}`, `{}` or nothing.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why; recorded in the run's `error` (`cancelled by alice: bad canary`).
    /// Absent or empty: the request's `X-Kayra-Reason`, if any.
    #[serde(default)]
    pub reason: String,
}

impl RequestBody for CancelBody {
    const EMPTY_IS_OBJECT: bool = true;
}

/// The key prefix of the subscription's runs, which continue tokens carry.
/// 404 (as a GET of the subscription) when it does not exist.
async fn runs_of(state: &ApiState, namespace: &str, api: &str) -> Result<String, ApiError> {
    existing(state, namespace, api).await?;
    Ok(state.repo.layout().prefix(Collection::RunSlots { namespace, api }))
}

#[utoipa::path(get, path = "/namespaces/{namespace}/subscriptions/{api}/runs", tag = "subscriptions",
    params(("namespace" = String, Path), ("api" = String, Path, description = "the registration's long name"), ListQuery),
    responses((status = 200, body = List<Run>, description = "newest first"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "no such namespace or subscription")))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Path((namespace, api)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> Result<Json<List<Run>>, ApiError> {
    let prefix = runs_of(&state, &namespace, &api).await?;
    let after = query.after(&prefix)?.map(|key| key[prefix.len()..].to_string());
    let page = state.repo.runs_page(&namespace, &api, after.as_deref(), query.limit()).await?;
    let (items, next) = (page.items, page.next.map(|id| format!("{prefix}{id}")));
    Ok(Json(List { items, continue_token: continue_token(next.as_deref()) }))
}

#[utoipa::path(get, path = "/namespaces/{namespace}/subscriptions/{api}/runs/{id}", tag = "subscriptions",
    params(("namespace" = String, Path), ("api" = String, Path), ("id" = String, Path, description = "the run's id")),
    responses((status = 200, body = Run), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such namespace, subscription or run")))]
pub(crate) async fn get(
    State(state): State<ApiState>,
    Path((namespace, api, id)): Path<(String, String, String)>,
) -> Result<Json<Run>, ApiError> {
    runs_of(&state, &namespace, &api).await?;
    state.repo.run(&namespace, &api, &id).await?.map(Json).ok_or_else(|| {
        ApiError::not_found(format!(
            "run {} of the subscription of namespace {namespace:?} to {api:?} not found",
            super::shown(&id)
        ))
    })
}

#[utoipa::path(put, path = "/namespaces/{namespace}/subscriptions/{api}/runs/{id}/cancel", tag = "subscriptions",
    params(("namespace" = String, Path), ("api" = String, Path), ("id" = String, Path, description = "the run's id")),
    request_body = CancelBody,
    responses((status = 200, body = Run, description = "the run, stopped and recorded `cancelled`"),
        (status = 400, body = ErrorBody, description = "a run id that is no UUID, a bad body or reason"),
        (status = 404, body = ErrorBody, description = "no such namespace or subscription, or no such run recorded or in flight"),
        (status = 409, body = ErrorBody, description = "the run has finished")))]
pub(crate) async fn cancel(
    Audited(state): Audited,
    Path((namespace, api, id)): Path<(String, String, String)>,
    JsonBody(body): JsonBody<CancelBody>,
) -> Result<Json<Run>, ApiError> {
    if uuid::Uuid::parse_str(&id).is_err() {
        return Err(ApiError::bad_request(format!("run id {} is not a run's id (a UUID)", shown(&id))));
    }
    validate_reason(&body.reason).map_err(|e| ApiError::bad_request(format!("reason: {e}")))?;
    runs_of(&state, &namespace, &api).await?;
    let context = state.repo.audit_context();
    let user = context.map(|c| c.user.clone()).unwrap_or_default();
    let reason = match body.reason.trim() {
        "" => context.map(|c| c.reason.clone()).unwrap_or_default(),
        reason => reason.to_string(),
    };
    let request = CancelRequest::new(&namespace, &api, &id, &user, &reason);
    let what = format!("run {id} of the subscription of namespace {namespace:?} to {api:?}");
    match state.repo.cancel_run(&request, CANCEL_PATIENCE).await? {
        CancelOutcome::Cancelled(run) => {
            tracing::info!(namespace, api, run_id = %id, user, "run cancelled");
            Ok(Json(run))
        }
        CancelOutcome::Finished(run) => Err(ApiError::conflict(format!(
            "{what} has finished (result {}); only a run in flight can be cancelled",
            serde_json::to_value(run.result).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
        ))),
        CancelOutcome::NotFound => Err(ApiError::not_found(format!("{what} not found: none is recorded or in flight"))),
    }
}
