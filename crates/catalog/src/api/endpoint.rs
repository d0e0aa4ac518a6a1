//! Authorization in one place: every route declares what it demands, and
//! the router enforces it before the handler runs.
//!
//! A route is built only from [`Endpoint`]s, and an `Endpoint` cannot be
//! made without an [`Access`]: either `rbac.RequireClusterRBAC(repo,
//! resource, verb)` of the seed ([`super::authz::cluster`]) or "any
//! authenticated caller" ([`Access::Authenticated`], for `/whoami`). The
//! requirement becomes a route layer of that one method ([`super::guard`]), so it runs before
//! any extractor — an unauthorized caller never gets a body parsed or a
//! record read — and no handler can forget it. The same declarations
//! produce [`RouteSpec`]s, which the OpenAPI document and the RBAC tests
//! are checked against.
//!
//! A watchable GET's `?watch=true` is served here too: verb `watch` on the
//! route's resource, the route's own GET as validation, then the stream
//! ([`super::watch`], or [`super::status`] for a registration's report).

use std::collections::HashMap;

use axum::extract::{FromRequestParts, RawPathParams, Request};
use axum::handler::Handler;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use futures::future::BoxFuture;
use kayra_rbac::Verb;

use super::authz::{Access, Caller, require_cluster_rbac};
use super::error::ApiError;
use super::extract::Query;
use super::guard::{Guard, Next};
use super::hub::Refused;
use super::list::ListQuery;
use super::namespaces::SelectorQuery;
use super::status;
use super::stream::{Framing, WatchCheck, Watcher};
use super::watch::{self, Watched};
use super::{ApiState, audit};

/// One method of one catalog route, as declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub method: Method,
    /// Relative to `/apis/catalog.example.com/v1`, in axum's `{param}` syntax.
    pub path: &'static str,
    pub access: Access,
    /// Answers `?watch=true` with a watch stream (RBAC verb `watch`).
    pub watchable: bool,
}

/// A handler for one HTTP method, with the access it demands.
pub(crate) struct Endpoint {
    method: Method,
    access: Access,
    handler: MethodRouter<ApiState>,
    /// A GET that also answers `?watch=true` with a stream of these objects.
    watch: Option<Watched>,
}

macro_rules! endpoint_constructors {
    ($($name:ident => $method:ident),* $(,)?) => {
        $(
            pub(crate) fn $name<H, T>(access: Access, handler: H) -> Self
            where
                H: Handler<T, ApiState>,
                T: 'static,
            {
                Self { method: Method::$method, access, handler: on(MethodFilter::$method, handler), watch: None }
            }
        )*
    };
}

impl Endpoint {
    endpoint_constructors!(get => GET, post => POST, put => PUT, patch => PATCH, delete => DELETE);

    /// A GET that answers `?watch=true` too (§4.5), with verb `watch`.
    pub(crate) fn watch(mut self, kind: Watched) -> Self {
        debug_assert_eq!(self.method, Method::GET);
        self.watch = Some(kind);
        self
    }

    pub(crate) fn spec(&self, path: &'static str) -> RouteSpec {
        RouteSpec { method: self.method.clone(), path, access: self.access, watchable: self.watch.is_some() }
    }

    /// The handler behind its requirement.
    pub(crate) fn guarded(self, state: &ApiState) -> MethodRouter<ApiState> {
        let requirement = Requirement { state: state.clone(), access: self.access, watch: self.watch };
        self.handler.route_layer(Guard::new(requirement, guard))
    }
}

#[derive(Clone)]
struct Requirement {
    state: ApiState,
    access: Access,
    watch: Option<Watched>,
}

/// The requirement's guard: boxes [`enforce`]'s future.
fn guard(requirement: Requirement, request: Request, next: Next) -> BoxFuture<'static, Response> {
    Box::pin(enforce(requirement, request, next))
}

/// Takes its `Requirement` by value (a clone the guard hands it) and then
/// borrows it: so that [`guard`] can box this `async fn`'s own future,
/// with no larger future around it to own the requirement.
async fn enforce(requirement: Requirement, request: Request, next: Next) -> Response {
    let requirement = &requirement;
    let Some(caller) = request.extensions().get::<Caller>().cloned() else {
        return ApiError::unauthorized("missing bearer token").into_response();
    };
    let watching = match watch_requested(request.method(), request.uri()) {
        Ok(watching) => watching,
        Err(e) => return e.into_response(),
    };
    // The watch and the change paths are boxed, each on its own: inline,
    // their state would make every request's future several KiB, a size
    // the allocator serves from its slow path.
    if watching {
        return match Box::pin(serve_watch(requirement, caller, request, next)).await {
            Ok(response) | Err(response) => response,
        };
    }
    let decided = match requirement.access {
        Access::Authenticated => Ok(()),
        Access::Cluster { resource, verb } => {
            require_cluster_rbac(&requirement.state.repo, &caller.user, resource, verb).await
        }
    };
    let Access::Cluster { resource, verb } = requirement.access else {
        return next.run(request).await;
    };
    let change = audit::is_change(request.method());
    if let Err(e) = decided {
        audit::log_denied(Some(&caller.user), resource, verb.as_str(), e.status());
        return e.into_response();
    }
    if !change {
        return next.run(request).await;
    }
    Box::pin(audited(requirement, caller, (resource, verb), request, next)).await
}

/// A change: its audit context (who, what, why, from where) goes to the
/// handler, whose write records it (§13); a refused change is a log line.
async fn audited(
    requirement: &Requirement,
    caller: Caller,
    (resource, verb): (&'static str, Verb),
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let params: Vec<(String, String)> = match RawPathParams::from_request_parts(&mut parts, &()).await {
        Ok(raw) => raw.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        Err(_) => Vec::new(),
    };
    match audit::context(&parts, &params, &caller, resource, verb, &requirement.state.audit) {
        Ok(context) => {
            parts.extensions.insert(context);
        }
        Err(e) => {
            audit::log_denied(Some(&caller.user), resource, verb.as_str(), e.status());
            return e.into_response();
        }
    }
    let response = next.run(Request::from_parts(parts, body)).await;
    if response.status().is_client_error() {
        audit::log_denied(Some(&caller.user), resource, verb.as_str(), response.status());
    }
    response
}

/// Whether a GET asks for a watch stream: `watch=true` (or `1`); `false`,
/// `0` or no `watch` is an ordinary GET; anything else is a 400.
fn watch_requested(method: &Method, uri: &Uri) -> Result<bool, ApiError> {
    if method != Method::GET {
        return Ok(false);
    }
    let mut watching = false;
    for pair in uri.query().unwrap_or_default().split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "watch" {
            continue;
        }
        watching = match value {
            "true" | "1" => true,
            "false" | "0" | "" => false,
            _ => return Err(ApiError::bad_request("query parameter \"watch\" must be true or false")),
        };
    }
    Ok(watching)
}

/// `?watch=true`: authorize verb `watch` on the route's resource, run the
/// route's own GET (so a missing namespace, a short name or a missing
/// object answer exactly as a GET does), then stream.
async fn serve_watch(
    requirement: &Requirement,
    caller: Caller,
    request: Request,
    next: Next,
) -> Result<Response, Response> {
    let (Some(kind), Access::Cluster { resource, verb }) = (requirement.watch, requirement.access) else {
        return Err(
            ApiError::bad_request("this route cannot be watched: only a collection or one object can").into_response()
        );
    };
    let repo = &requirement.state.repo;
    require_cluster_rbac(repo, &caller.user, resource, Verb::Watch).await.map_err(IntoResponse::into_response)?;
    let (mut parts, body) = request.into_parts();
    let params: HashMap<String, String> = match RawPathParams::from_request_parts(&mut parts, &()).await {
        Ok(raw) => raw.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        Err(_) => return Err(ApiError::bad_request("malformed path").into_response()),
    };
    let token = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .map(|(_, token)| token.trim().to_string())
        .unwrap_or_default();
    let event_stream = parts
        .headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/event-stream"));
    // `limit` and `continue` page a list; a stream has no pages, so a
    // collection's watch ignores them, but a malformed one is the same 400
    // as the list's (a GET of one object ignores them either way).
    if verb == Verb::List && kind != Watched::Audit {
        Query::<ListQuery>::from_request_parts(&mut parts, &()).await.map_err(IntoResponse::into_response)?;
    }
    // A namespaces stream shows only what its label selector matches; a
    // malformed one is the same 400 as the list's.
    let selector = match kind {
        Watched::Namespaces => Query::<SelectorQuery>::from_request_parts(&mut parts, &())
            .await
            .map_err(IntoResponse::into_response)?
            .0
            .selector()
            .map_err(IntoResponse::into_response)?,
        _ => None,
    };
    // A status stream sends the page asked for; a malformed query is the
    // GET's 400.
    let status_page = match kind {
        Watched::Status => Some(
            Query::<status::StatusQuery>::from_request_parts(&mut parts, &())
                .await
                .map_err(IntoResponse::into_response)?
                .0
                .page(params.get("name").map_or("", String::as_str))
                .map_err(IntoResponse::into_response)?,
        ),
        _ => None,
    };
    // The audit trail's filters apply to its stream.
    let audit_query = match kind {
        Watched::Audit => Some(
            Query::<audit::AuditQuery>::from_request_parts(&mut parts, &())
                .await
                .map_err(IntoResponse::into_response)?
                .0,
        ),
        _ => None,
    };
    // The validation GET reads at most one item of a collection.
    if let Ok(uri) = format!("{}?limit=1", parts.uri.path()).parse::<Uri>() {
        parts.uri = uri;
    }
    parts.extensions.insert(WatchCheck);
    let checked = next.run(Request::from_parts(parts, body)).await;
    if checked.status() != StatusCode::OK {
        return Err(checked);
    }
    let hub = &requirement.state.hub;
    let permit = hub.admit(&caller.user).map_err(|refused| refusal(&caller.user, refused).into_response())?;
    let watcher = Watcher { user: caller.user, token, resource };
    let opened = match kind {
        Watched::Status => {
            let framing = if event_stream { Framing::Sse } else { Framing::Ndjson };
            status::open(hub, repo, &params, status_page.unwrap_or_default(), watcher, framing, permit).await
        }
        Watched::Audit => {
            let framing = if event_stream { Framing::Sse } else { Framing::Ndjson };
            let filter = audit_query.unwrap_or_default().filter().map_err(IntoResponse::into_response)?;
            audit::open(hub, repo, filter, watcher, framing, permit).await
        }
        kind => watch::open(hub, repo, kind, &params, watcher, watch::Asked { event_stream, selector }, permit).await,
    };
    opened.map_err(IntoResponse::into_response)
}

/// How long a caller over its own stream cap is asked to wait.
const STREAM_RETRY_AFTER_SECONDS: u32 = 5;

/// The answer to a stream past a cap (§17): 429 with `Retry-After` for
/// the user's own cap, 503 for the server's.
fn refusal(user: &str, refused: Refused) -> ApiError {
    match refused {
        Refused::User(cap) => ApiError::too_many_requests(
            format!(
                "user {user:?} has {cap} open watch streams, the most one user may hold \
                 (server.max_streams_per_user); close one or retry later"
            ),
            STREAM_RETRY_AFTER_SECONDS,
        ),
        Refused::All(cap) => {
            tracing::warn!(cap, "watch stream refused: the server holds server.max_streams streams");
            ApiError::unavailable(format!("the server holds {cap} open watch streams, its most; retry later"))
        }
    }
}
