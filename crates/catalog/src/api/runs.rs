//! `/namespaces/{namespace}/subscriptions/{api}/runs`: the record of every
//! reconcile attempt of one subscription (§4.4), newest first.
//!
//! The reconciler writes the records (in the same store transaction as the
//! attempt's result); this module only reads them. A record's key ends in a
//! segment of the reconciler's choosing, so the routes list the
//! subscription's prefix and order by the record's `id`, a UUIDv7, whose
//! text sorts by time. A subscription keeps at most `reconciler.run_history`
//! runs, so listing the prefix whole and paging in memory stays small.
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

/// Every run of the subscription, newest first. 404 (as a GET of the
/// subscription) when it does not exist.
async fn all_runs(state: &ApiState, namespace: &str, api: &str) -> Result<(String, Vec<Run>), ApiError> {
    existing(state, namespace, api).await?;
    let collection = Collection::SubscriptionRuns { namespace, api };
    let (prefix, (records, _)) =
        (state.repo.layout().prefix(collection), state.repo.list_all::<Run>(collection).await?);
    let mut runs: Vec<Run> = records.into_iter().map(|r| r.value).collect();
    runs.sort_by(|a, b| b.id.cmp(&a.id));
    Ok((prefix, runs))
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
    let (prefix, runs) = all_runs(&state, &namespace, &api).await?;
    let after = query.after(&prefix)?.map(|key| key[prefix.len()..].to_string());
    let mut items: Vec<Run> = runs.into_iter().filter(|r| after.as_deref().is_none_or(|a| r.id.as_str() < a)).collect();
    let mut next = None;
    if query.limit() > 0 && items.len() > query.limit() {
        items.truncate(query.limit());
        next = items.last().map(|last| format!("{prefix}{}", last.id));
    }
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
    let (_, runs) = all_runs(&state, &namespace, &api).await?;
    runs.into_iter().find(|r| r.id == id).map(Json).ok_or_else(|| {
        ApiError::not_found(format!(
            "run {} of the subscription of namespace {namespace:?} to {api:?} not found",
            super::shown(&id)
        ))
    })
}
