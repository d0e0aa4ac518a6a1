//! `kayra serve`: the HTTP API server — the catalog API behind
//! authentication, the gateway to registered APIs, health, metrics and the OpenAPI
//! document — and its lifecycle (bootstrap, serve, graceful shutdown).
//!
//! The entry point is [`run`], mini-redis style: it takes an already bound
//! listener and a shutdown future, so tests bind `127.0.0.1:0` and stop the
//! server whenever they like, and the `kayra` binary passes SIGTERM/SIGINT.
//! [`router`] builds the whole application for in-process tests.
//!
//! Request path, outside in: tracing span → metrics (by route template) →
//! routing → for `/apis/...`: authentication (401) → the route's RBAC
//! requirement (403) → extractors (400/413) → handler.
//!
//! # Layout
//! - this file: [`AppState`], [`router`], [`run`], shutdown.
//! - `admission`: the one middleware of `/apis/`: source, authentication,
//!   body-stall guard.
//! - `auth`: bearer-token authentication.
//! - [`console`]: the web console at `/ui/` (§11), embedded assets.
//! - [`gateway`]: `/apis/<other api>/...`, the six steps and forwarding (§6).
//! - `health`: `/healthz`, `/readyz`, `/metrics`, `/openapi.json`.
//! - `metrics`: the Prometheus recorder and the request metrics middleware.
//! - [`source`]: the client address of the audit trail (`server.trusted_proxies`).
//! - [`listener`]: serving connections (plain or TLS) with the slow-client
//!   timeouts and the peer of each request.
//! - `tls`: HTTPS when `server.tls` is set.

mod admission;
mod auth;
pub mod console;
pub mod gateway;
mod health;
pub mod listener;
pub mod metrics;
pub mod source;
mod tls;

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use kayra_catalog::api::{self, ApiError, ApiState};
use kayra_catalog::cache::AuthCache;
use kayra_catalog::repo::Repository;
use kayra_config::Config;
use kayra_store::Store;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower_http::trace::TraceLayer;

use crate::admission::Admission;

/// How long startup waits for the auth caches' first lists.
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// How long in-flight requests may take to finish after shutdown begins.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What the server's handlers share. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The catalog API's state: this deployment's repository, the body limit.
    pub api: ApiState,
    /// The process's Prometheus handle, rendered by `/metrics`.
    pub metrics: PrometheusHandle,
    /// `/openapi.json`, rendered once at startup.
    openapi: Bytes,
    /// The gateway to registered APIs; tests shorten its response timeout.
    pub gateway: gateway::Gateway,
    /// How long a catalog request body may go without a byte
    /// (`server.request_header_timeout`; see [`listener::stalled_bodies`]).
    pub body_stall_timeout: Duration,
    /// `server.trusted_proxies`: peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: std::sync::Arc<[kayra_config::Cidr]>,
}

impl AppState {
    /// State for the deployment `config` describes, on `store`, reading
    /// the store for every decision.
    pub fn new(config: &Config, store: Store) -> Self {
        Self::with_repo(config, Repository::new(store, &config.platform, &config.region))
    }

    /// State whose authentication and RBAC decide from `cache`.
    pub fn cached(config: &Config, store: Store, cache: AuthCache) -> Self {
        Self::with_repo(config, Repository::new(store, &config.platform, &config.region).with_cache(cache))
    }

    fn with_repo(config: &Config, repo: Repository) -> Self {
        // Serializing utoipa's plain structs cannot fail; an empty document
        // would be caught by the OpenAPI tests.
        let openapi = serde_json::to_vec(&api::openapi::openapi()).unwrap_or_default();
        metrics::describe(metrics::SERVE);
        Self {
            gateway: gateway::Gateway::new(repo.clone()),
            api: ApiState::new(repo, config.server.max_body_bytes)
                .with_required_reasons(&config.audit.require_reason)
                .with_notifications(&config.notifications),
            metrics: metrics::handle(),
            openapi: Bytes::from(openapi),
            body_stall_timeout: config.server.request_header_timeout.0,
            trusted_proxies: config.server.trusted_proxies.clone().into(),
        }
    }
}

impl AppState {
    /// The same state with its watch streams served by `hub` (tests keep a
    /// handle on it, with shortened intervals).
    pub fn with_hub(mut self, hub: api::Hub) -> Self {
        self.api = self.api.with_hub(hub);
        self
    }
}

/// The whole application: `/healthz`, `/readyz`, `/metrics`,
/// `/openapi.json` without authentication; `/apis/...` (catalog API and
/// gateway) behind it.
pub fn router(state: AppState) -> Router {
    use axum::middleware::{from_fn, map_response};
    let admission = |body_stall| {
        Admission { trusted_proxies: state.trusted_proxies.clone(), repo: state.api.repo.clone(), body_stall }.layer()
    };
    let catalog = api::router(state.api.clone()).layer(admission(Some(state.body_stall_timeout)));
    let gateway = state.gateway.clone().router().layer(admission(None));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(health::openapi))
        .with_state(state)
        .merge(console::router())
        .merge(catalog)
        .merge(gateway)
        .fallback(|| async { ApiError::not_found("no such route") })
        // One layer, its middlewares composed first: axum boxes a route's
        // service once for every `.layer` call and clones the boxes on
        // every request.
        .layer(
            ServiceBuilder::new()
                // A span per request; errors are logged once, where they
                // are handled (`ApiError`), not again by the trace layer.
                .layer(TraceLayer::new_for_http().on_failure(()))
                .layer(from_fn(metrics::track))
                .layer(map_response(method_not_allowed)),
        )
}

/// How often `kayra serve` removes audit records past `audit.retention`.
pub const AUDIT_PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// Records deleted per store transaction by the retention.
const AUDIT_PRUNE_BATCH: usize = 256;

/// Removes audit records older than `retention` (platform §13): at
/// startup, then every [`AUDIT_PRUNE_INTERVAL`], in bounded batches. Every
/// `kayra serve` does it; several at once only delete the same keys.
async fn audit_retention(repo: Repository, retention: Duration, stopping: CancellationToken) {
    loop {
        let cutoff = std::time::SystemTime::now().checked_sub(retention).unwrap_or(std::time::UNIX_EPOCH);
        match repo.prune_audit(cutoff, AUDIT_PRUNE_BATCH).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, ?retention, "removed audit records past audit.retention"),
            Err(e) => tracing::warn!(error = %e, "audit retention: could not remove old records; trying again later"),
        }
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(AUDIT_PRUNE_INTERVAL) => {}
        }
    }
}

/// axum answers a route's unsupported method (`get` is not `GET`) with an
/// empty 405; the contract wants its error shape (§4), `Allow` kept.
async fn method_not_allowed(response: axum::response::Response) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED || response.headers().contains_key(header::CONTENT_TYPE) {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let allowed = allow.as_ref().and_then(|a| a.to_str().ok()).unwrap_or_default().to_string();
    let mut answer =
        ApiError::method_not_allowed(format!("method not allowed on this route; allowed: {allowed} (case-sensitive)"))
            .into_response();
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}

/// Runs `kayra serve` on `listener` until `shutdown` completes, then stops
/// accepting, lets in-flight requests finish (at most [`DRAIN_TIMEOUT`])
/// and returns.
///
/// With `auth.bootstrap_token` set, first makes sure the bootstrap admin
/// exists (§5.4). With `server.tls` set, serves HTTPS.
pub async fn run(
    config: Config,
    store: Store,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let hub = api::Hub::new(store.clone(), api::WatchOptions::default());
    run_with(config, store, listener, shutdown, hub).await
}

/// [`run`] with the watch streams served by `hub` (tests shorten its
/// intervals and count its store watches).
pub async fn run_with(
    config: Config,
    store: Store,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    hub: api::Hub,
) -> anyhow::Result<()> {
    let request_timeout = config.database.request_timeout.0;
    hub.set_stream_caps(config.server.max_streams, config.server.max_streams_per_user);
    let cache = AuthCache::start(&store, &config.platform, &config.region, request_timeout);
    let state = AppState::cached(&config, store, cache).with_hub(hub);
    // `/status` answers from this index: listed now, not on the first call.
    state.api.hub.subscribers(state.api.repo.layout());
    if !config.auth.bootstrap_token.is_empty() {
        state.api.repo.bootstrap_admin(&config.auth.bootstrap_token).await.context("bootstrap the admin user")?;
        tracing::info!(user = kayra_catalog::repo::auth::BOOTSTRAP_USER, "bootstrap admin ensured");
    }
    // Serving before the first lists would only answer 503s; a store that
    // stays silent this long is reported by /readyz instead.
    if let Some(cache) = state.api.repo.cache()
        && let Err(e) = cache.wait_synced(CACHE_SYNC_TIMEOUT.max(request_timeout)).await
    {
        tracing::warn!(error = %e, "serving before the auth caches are synced; requests answer 503 until they are");
    }
    let tls = match &config.server.tls {
        Some(tls) => Some(tls::acceptor(tls).context("load server.tls")?),
        None => None,
    };
    let timeouts = listener::Timeouts::from_config(&config.server);

    let stopping = CancellationToken::new();
    let hub = state.api.hub.clone();
    let upkeep = tokio::spawn(metrics::upkeep(state.metrics.clone(), stopping.clone()));
    tokio::spawn(audit_retention(state.api.repo.clone(), config.audit.retention.0, stopping.clone()));
    let app = router(state);
    {
        let stopping = stopping.clone();
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("shutting down: no new connections, finishing in-flight requests");
            // Open watch streams end now, so they do not hold the drain open.
            hub.shutdown();
            stopping.cancel();
        });
    }
    let served = async {
        match tls {
            Some(acceptor) => {
                let listener = tls::Listener::new(listener, acceptor, timeouts.request_header)?;
                listener::serve(listener, app, timeouts, true, stopping.clone()).await;
            }
            None => listener::serve(listener, app, timeouts, false, stopping.clone()).await,
        }
        Ok::<(), std::io::Error>(())
    };
    let drain_deadline = async {
        stopping.cancelled().await;
        tokio::time::sleep(DRAIN_TIMEOUT).await;
    };
    let result = tokio::select! {
        served = served => served.context("serve"),
        () = drain_deadline => {
            tracing::warn!(timeout = ?DRAIN_TIMEOUT, "in-flight requests did not finish in time; stopping anyway");
            Ok(())
        }
    };
    stopping.cancel();
    let _ = upkeep.await;
    result
}
