//! The unauthenticated operational endpoints: `/healthz` (the process
//! answers), `/readyz` (its caches and subscriber index are current and
//! its store answers), `/metrics`,
//! `/openapi.json`.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use kayra_catalog::api::ApiError;
use serde_json::{Value, json};

use crate::AppState;

/// How long `/readyz` waits for the store before calling it unreachable.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn readyz(State(state): State<AppState>) -> Response {
    // Decisions come from the auth caches: not current, not ready.
    if let Some(Err(e)) = state.api.repo.cache().map(|cache| cache.check_current()) {
        tracing::warn!(error = %e, "not ready: the auth caches are not current");
        return ApiError::unavailable(format!("not ready: {e}")).into_response();
    }
    // `/status` answers from the subscriber index, 503 until its first
    // list is in: until then, neither is the process ready (at a million
    // subscriptions that list takes etcd tens of seconds).
    if !state.api.hub.subscribers(state.api.repo.layout()).synced() {
        tracing::info!("not ready: the subscriber index is still listing");
        return ApiError::unavailable("not ready: the subscriber index is still listing").into_response();
    }
    match tokio::time::timeout(READY_TIMEOUT, state.api.repo.store().revision()).await {
        Ok(Ok(_)) => Json(json!({"status": "ready"})).into_response(),
        Ok(Err(e)) => {
            // A store error may quote an endpoint URL, user info and all.
            let error = kayra_core::validation::scrub_userinfo(&e.to_string()).into_owned();
            tracing::warn!(error, "not ready: store unreachable");
            ApiError::unavailable("not ready: the store is unreachable").into_response()
        }
        Err(_) => {
            tracing::warn!(timeout = ?READY_TIMEOUT, "not ready: store did not answer in time");
            ApiError::unavailable("not ready: the store did not answer in time").into_response()
        }
    }
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

pub async fn openapi(State(state): State<AppState>) -> Response {
    ([(CONTENT_TYPE, "application/json")], state.openapi.clone()).into_response()
}
