//! `/notifications` (platform §14): the deliveries of notification events
//! to their sinks, and the retry of a dead one.
//!
//! The reconciler writes and settles the records; this module lists them
//! (without the stored-only scheduling fields: [`DeliveryView`]) and makes
//! a dead one pending again. A retry of a delivery that is not dead is a
//! 409: a pending one is tried anyway, a delivered one was answered. A
//! retry is a change, audited like any other ([`Audited`]): its record,
//! named by the delivery's id, rides on the write.

use axum::Json;
use axum::extract::State;
use kayra_core::notifications::{DeliveryState, DeliveryView};
use serde::Deserialize;
use utoipa::IntoParams;

use super::audit::Audited;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, Path, Query};
use super::list::{List, ListQuery, page_in_memory};
use super::{ApiState, Empty};
use crate::repo::audit::AuditContext;

/// `?state=pending|delivered|dead&sink=NAME&limit=N&continue=TOKEN`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NotificationsQuery {
    /// Only deliveries in this state: `pending`, `delivered` or `dead`.
    pub state: Option<String>,
    /// Only deliveries to this sink.
    pub sink: Option<String>,
    /// At most this many items; absent or 0 means all.
    pub limit: Option<usize>,
    /// The `continue` of the previous page.
    #[serde(rename = "continue")]
    #[param(rename = "continue")]
    pub continue_token: Option<String>,
}

#[utoipa::path(get, path = "/notifications", tag = "notifications", params(NotificationsQuery),
    responses((status = 200, body = List<DeliveryView>, description = "by id"),
        (status = 400, body = ErrorBody, description = "an unknown state, or a bad continue token")))]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Query(query): Query<NotificationsQuery>,
) -> Result<Json<List<DeliveryView>>, ApiError> {
    let wanted = match query.state.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(name) => Some(DeliveryState::parse(name).ok_or_else(|| {
            ApiError::bad_request(format!("unknown state {}; use pending, delivered or dead", super::shown(name)))
        })?),
    };
    let sink = query.sink.as_deref().filter(|s| !s.is_empty());
    let page = state.repo.deliveries_page(wanted, sink, None, 0).await?;
    let items = page.items.iter().map(kayra_core::notifications::Delivery::view).collect();
    let paging = ListQuery { limit: query.limit, continue_token: query.continue_token };
    Ok(Json(page_in_memory(items, &paging, |d: &DeliveryView| d.id.as_str())?))
}

#[utoipa::path(put, path = "/notifications/{id}/retry", tag = "notifications",
    params(("id" = String, Path, description = "the delivery's id")), request_body = Empty,
    responses((status = 200, body = DeliveryView, description = "pending again, its attempts reset"),
        (status = 404, body = ErrorBody, description = "no such delivery"),
        (status = 409, body = ErrorBody, description = "the delivery is not dead")))]
pub(crate) async fn retry(
    Audited(state): Audited,
    Path(id): Path<String>,
    JsonBody(Empty {}): JsonBody<Empty>,
) -> Result<Json<DeliveryView>, ApiError> {
    // The route's path names the delivery by `id`, not `name`: the record
    // names it by its id.
    let repo = match state.repo.audit_context() {
        Some(context) => state.repo.audited(AuditContext { name: id.clone(), ..context.clone() }),
        None => state.repo.clone(),
    };
    Ok(Json(repo.retry_delivery(&id).await?.view()))
}
