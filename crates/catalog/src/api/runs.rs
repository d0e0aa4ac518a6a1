//! `/namespaces/{namespace}/subscriptions/{api}/runs`: the record of every
//! reconcile attempt of one subscription (§4.4), newest first.
//!
//! The reconciler writes the records (in the same store transaction as the
//! attempt's result); this module only reads them. A record's key ends in a
//! segment of the reconciler's choosing (a ring slot), so the Repository
//! orders a subscription's runs by the record's `id`, a UUIDv7, whose text
//! sorts by time, reading each record's id alone and decoding only the
//! page asked for (§17; [`crate::repo::runs`]).
//!
//! The continue token is the base64url of the prefix and the last id
//! returned, so a token only works for the subscription it came from.

use axum::Json;
use axum::extract::State;
use kayra_core::Run;

use super::ApiState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Path, Query};
use super::list::{List, ListQuery, continue_token};
use super::subscriptions::existing;
use crate::repo::Collection;

/// The prefix of the subscription's runs, which continue tokens carry.
/// 404 (as a GET of the subscription) when it does not exist.
async fn runs_of(state: &ApiState, namespace: &str, api: &str) -> Result<String, ApiError> {
    existing(state, namespace, api).await?;
    Ok(state.repo.layout().prefix(Collection::SubscriptionRuns { namespace, api }))
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
