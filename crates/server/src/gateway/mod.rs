//! The gateway (platform contract §6): how a namespace uses a registered API.
//!
//! Any method on `/apis/<api>/<version>/namespaces/<ns>/<resource>[/<rest>]`
//! for an API other than the catalog runs six steps, in this order, and the
//! first that fails answers in the contract's error shape with a message
//! that says what to fix:
//!
//! Before step 2 the request itself must be safe to authorize and forward:
//! the method is exactly one of [`METHODS`] (405; methods are
//! case-sensitive, so `get` is not `GET`), and every path segment passes
//! [`kayra_core::validation::path_segment`] (400 naming the segment).
//!
//! 1. the caller is authenticated (401) — by the server's authentication
//!    middleware, which puts a [`Caller`] into the request's extensions; a
//!    request without one is refused here, so the gateway fails closed when
//!    mounted without it;
//! 2. `<api>` is the long name of a registration of this deployment (404;
//!    a short name gets a 400 naming the long one);
//! 3. namespace `<ns>` exists (404) and is active (403);
//! 4. a cluster role binding of the user, or a role binding in `<ns>`,
//!    grants (`<api>`, `<resource>`, verb of the method) (403);
//! 5. the namespace's subscription to `<api>` exists and is `active` (403
//!    naming it and its state). `active` is set once and never cleared
//!    (seed, "State"), so a subscription whose later syncs fail
//!    (`state: error`) keeps working;
//! 6. the request is forwarded to the registration's `endpoint`, streaming
//!    (see [`forward`]): no endpoint 503, unreachable 502, no answer 504.
//!
//! Nothing is cached: every request reads its registration, namespace,
//! bindings and subscription from the store, so a revoked binding or a
//! deleted subscription takes effect on the next request, as revoked
//! tokens do for the catalog API.
//!
//! # Layout
//! - this file: [`Gateway`] (the state), [`Gateway::router`], steps 1–5.
//! - [`path`]: parsing (and refusing unsafe) gateway paths.
//! - [`forward`]: step 6, streaming proxying and header rules.
//! - [`access`]: the access-log line and metrics of each request.

mod access;
mod forward;
mod path;

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::extract::{OriginalUri, Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use kayra_catalog::api::authz::Caller;
use kayra_catalog::api::error::ApiError;
use kayra_catalog::repo::Repository;
use kayra_core::{ApiRegistration, CATALOG_API, SubscriptionState};
use kayra_rbac::{Decision, Verb};

use access::Exchange;
use path::{Refusal, Target};

pub use access::{DURATION, REQUESTS};
pub use forward::{NAMESPACE_HEADER, USER_HEADER};

/// The methods the gateway forwards (§6), compared exactly.
pub const METHODS: [Method; 6] = [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::PATCH, Method::DELETE];

/// How long a backend may go without progress before answering (§6: 60s).
/// Not configurable in `kayra.yaml`; tests shorten it with
/// [`Gateway::with_response_timeout`].
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// The gateway's state: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Gateway {
    repo: Repository,
    /// One client for every backend, so connections are pooled and reused.
    client: reqwest::Client,
    response_timeout: Duration,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("response_timeout", &self.response_timeout).finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway over `repo`'s deployment with the 60s response timeout.
    ///
    /// # Panics
    ///
    /// If the HTTP client's TLS backend cannot be initialised, as
    /// `reqwest::Client::new` does: a broken build rather than a runtime
    /// condition, and it happens at startup.
    pub fn new(repo: Repository) -> Self {
        Self { repo, client: client(), response_timeout: DEFAULT_RESPONSE_TIMEOUT }
    }

    /// The same gateway with another response timeout (see [`forward`]).
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The gateway's routes, every method, to be merged behind the server's
    /// authentication middleware and outside any body limit (gateway bodies
    /// stream without one). They match every `/apis/<api>/…` path; the
    /// catalog's own routes are static at `<api>` and win over them. Paths
    /// that are not gateway paths are answered 404 here.
    pub fn router<S>(self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        Router::new().route("/apis/{api}", any(serve)).route("/apis/{api}/{*rest}", any(serve)).with_state(self)
    }

    /// Runs the six steps for one request. Never fails: every refusal is a
    /// response in the contract's error shape.
    async fn handle(&self, request: Request) -> Response {
        let mut exchange = Exchange::begin(request.method().clone());
        match self.admit_and_forward(request, &mut exchange).await {
            Ok(response) => {
                exchange.answered(response.status());
                let (parts, body) = response.into_parts();
                Response::from_parts(parts, forward::hold_until_done(body, exchange))
            }
            Err(error) => {
                exchange.answered(error.status());
                error.into_response()
            }
        }
    }

    async fn admit_and_forward(&self, request: Request, exchange: &mut Exchange) -> Result<Response, ApiError> {
        let (parts, body) = request.into_parts();

        // Step 1 happened in the server's authentication middleware.
        let user = match parts.extensions.get::<Caller>() {
            Some(caller) => caller.user.clone(),
            None => {
                return Err(ApiError::unauthorized(
                    "missing or unknown bearer token; send Authorization: Bearer <token>",
                ));
            }
        };
        exchange.authenticated(&user);

        if !METHODS.contains(&parts.method) {
            return Err(ApiError::method_not_allowed(format!(
                "method {} is not allowed; the gateway forwards GET, HEAD, POST, PUT, PATCH and DELETE (case-sensitive)",
                shown_method(&parts.method)
            )));
        }

        // The path as it arrived: what is authorized is what is forwarded.
        let uri = parts.extensions.get::<OriginalUri>().map_or(&parts.uri, |original| &original.0).clone();
        let target = path::parse(uri.path()).map_err(|refusal| match refusal {
            Refusal::NotAGatewayPath => ApiError::not_found(format!(
                "no route for {:?}; gateway paths are /apis/<api>/<version>/namespaces/<namespace>/<resource>[/...]",
                uri.path()
            )),
            Refusal::Unsafe(why) => ApiError::bad_request(why),
        })?;
        exchange.target(&target);

        let registration = self.registration(target.api).await?;
        exchange.resolved(&registration.name);
        self.active_namespace(target.namespace).await?;
        self.authorize(&user, &target, &parts.method).await?;
        self.active_subscription(target.namespace, &registration.name).await?;

        // Step 6.
        let timeout = self.response_timeout;
        let failed = |failure: forward::Failure| failure.into_api_error(&registration.name, timeout);
        let url = forward::backend_url(&registration.endpoint, &uri).map_err(failed)?;
        let origin = parts.extensions.get::<crate::listener::Peer>().copied();
        let identity = forward::Identity { user: &user, namespace: target.namespace, origin };
        forward::forward(&self.client, url, parts, body, identity, timeout).await.map_err(failed)
    }

    /// Step 2: the registration `api` names, by long name only.
    async fn registration(&self, api: &str) -> Result<ApiRegistration, ApiError> {
        if api == CATALOG_API {
            // A catalog path that matched no catalog route: not a gateway target.
            return Err(ApiError::not_found(format!("the catalog api {CATALOG_API:?} has no such route")));
        }
        if let Some(registration) = self.repo.admit_registration(api).await? {
            return Ok(registration);
        }
        if let Some(registration) = self.repo.find_registration_by_short_name(api).await? {
            let long = registration.name;
            return Err(ApiError::bad_request(format!(
                "{api:?} is the short name of api {long:?}; gateway paths take the long name: /apis/{long}/..."
            )));
        }
        Err(ApiError::not_found(format!(
            "api registration {api:?} not found in platform {}, region {}",
            self.repo.platform(),
            self.repo.region()
        )))
    }

    /// Step 3: the namespace exists and the reconciler has activated it.
    async fn active_namespace(&self, namespace: &str) -> Result<(), ApiError> {
        match self.repo.admit_namespace(namespace).await? {
            None => Err(ApiError::not_found(format!("namespace {namespace:?} not found"))),
            Some(false) => Err(ApiError::forbidden(format!(
                "namespace {namespace:?} is not active yet; the reconciler activates new namespaces, retry shortly"
            ))),
            Some(_) => Ok(()),
        }
    }

    /// Step 4, RBAC: the user's cluster roles, and only when they do not
    /// grant the request, the roles of the user's role bindings in the
    /// target namespace (bindings elsewhere grant nothing here).
    async fn authorize(&self, user: &str, target: &Target<'_>, method: &Method) -> Result<(), ApiError> {
        let verb = verb(method, target.names_an_object());
        let request = kayra_rbac::Request::new(target.api, target.resource, &verb);
        match self.repo.decide(user, Some(target.namespace), &request).await? {
            Decision::Allow { role, .. } => {
                tracing::debug!(user, api = target.api, resource = target.resource, verb = &*verb, role, "allowed");
                Ok(())
            }
            Decision::Deny => Err(ApiError::forbidden(format!(
                "user {user:?} may not {verb:?} resource {resource:?} of api {api:?} in namespace {ns:?}: \
                 no cluster role binding of the user, and no role binding in namespace {ns:?}, grants it",
                resource = target.resource,
                api = target.api,
                ns = target.namespace,
            ))),
        }
    }

    /// Step 5: the namespace's subscription to `api` exists and is active.
    async fn active_subscription(&self, namespace: &str, api: &str) -> Result<(), ApiError> {
        let Some(subscription) = self.repo.get_subscription(namespace, api).await? else {
            return Err(ApiError::forbidden(format!(
                "namespace {namespace:?} has no subscription to api {api:?}; subscribe with \
                 POST /apis/{CATALOG_API}/v1/namespaces/{namespace}/subscriptions {{\"api\": {api:?}}}"
            )));
        };
        let subscription = subscription.value;
        if subscription.active {
            return Ok(());
        }
        let state = subscription.state.as_str();
        let what_next = match subscription.state {
            SubscriptionState::Error => format!(
                "its initial sync failed; fix the api's backend, then force a re-sync with \
                 PUT /apis/{CATALOG_API}/v1/namespaces/{namespace}/subscriptions/{api}/sync"
            ),
            SubscriptionState::Init | SubscriptionState::Success => {
                "requests are refused until its initial sync succeeds; retry shortly".to_string()
            }
        };
        Err(ApiError::forbidden(format!(
            "subscription of namespace {namespace:?} to api {api:?} is not active (state {state:?}): {what_next}"
        )))
    }
}

/// The client every gateway shares (tests run several servers in one
/// process): pooled connections, no redirects followed. A redirect is the
/// caller's to follow; following it here would carry the `X-Kayra-*`
/// headers and the body to wherever it points.
fn client() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            // reqwest is built without a crypto provider; installing one is
            // idempotent, and one installed by someone else wins.
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("the HTTP client's TLS backend initialises")
        })
        .clone()
}

async fn serve(State(gateway): State<Gateway>, request: Request) -> Response {
    gateway.handle(request).await
}

/// A caller's method for a message: methods are tokens (no spaces or
/// control characters), but may be long.
fn shown_method(method: &Method) -> String {
    let name: String = method.as_str().chars().take(32).collect();
    format!("{name:?}")
}

/// The RBAC verb of a gateway request (§5.3); HEAD is authorized as GET.
/// Only [`METHODS`] get here; the fallback (a lowercase method name) is
/// kept so that a method added to the list cannot map to another's verb.
fn verb(method: &Method, names_an_object: bool) -> Cow<'static, str> {
    let as_http = if method == Method::HEAD { Method::GET.as_str() } else { method.as_str() };
    match Verb::from_http(as_http, !names_an_object) {
        Some(verb) => Cow::Borrowed(verb.as_str()),
        None => Cow::Owned(method.as_str().to_ascii_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_follow_the_contract() {
        let cases = [
            (Method::GET, true, "get"),
            (Method::GET, false, "list"),
            (Method::HEAD, true, "get"),
            (Method::HEAD, false, "list"),
            (Method::POST, false, "create"),
            (Method::PUT, true, "update"),
            (Method::PATCH, true, "patch"),
            (Method::DELETE, true, "delete"),
        ];
        for (method, named, expected) in cases {
            assert_eq!(verb(&method, named), expected, "{method} named={named}");
        }
    }
}
