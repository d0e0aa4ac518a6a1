//! The reconciler's own HTTP listener (`reconciler.listen`): `/healthz`,
//! `/readyz` (store reachable and the startup list dispatched) and
//! `/metrics` in Prometheus text format.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct AdminState {
    store: kayra_store::Store,
    ready: Arc<AtomicBool>,
    metrics: PrometheusHandle,
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    store: kayra_store::Store,
    ready: Arc<AtomicBool>,
    cancel: CancellationToken,
) {
    let metrics = kayra_server::metrics::handle();
    tokio::spawn(kayra_server::metrics::upkeep(metrics.clone(), cancel.clone()));
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render))
        .with_state(AdminState { store, ready, metrics });
    // Slow and silent clients are closed as on `kayra serve`, with its
    // default timeouts (the reconciler has no `server` section of its own).
    let timeouts = kayra_server::listener::Timeouts::default();
    kayra_server::listener::serve(listener, app, timeouts, false, cancel).await;
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if !state.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "starting");
    }
    match state.store.revision().await {
        Ok(_) => (StatusCode::OK, "ok"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "store unreachable"),
    }
}

async fn render(State(state): State<AdminState>) -> String {
    state.metrics.render()
}
