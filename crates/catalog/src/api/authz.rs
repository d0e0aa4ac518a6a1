//! Authorization in one place: every route declares what it demands, and
//! the router enforces it before the handler runs.
//!
//! A route is built only from [`Endpoint`]s, and an `Endpoint` cannot be
//! made without an [`Access`]: either `rbac.RequireClusterRBAC(repo,
//! resource, verb)` of the seed ([`cluster`]) or "any authenticated caller"
//! ([`Access::Authenticated`], for `/whoami`). The requirement becomes a
//! route layer of that one method, so it runs before any extractor — an
//! unauthorized caller never gets a body parsed or a record read — and no
//! handler can forget it. The same declarations produce [`RouteSpec`]s,
//! which the OpenAPI document and the RBAC tests are checked against.
//!
//! Authentication itself is the server's job: its middleware turns a bearer
//! token into a [`Caller`] in the request's extensions. A request without
//! one is refused with 401 here, so a router mounted without that
//! middleware fails closed.

use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use kayra_core::CATALOG_API;
use kayra_rbac::{Decision, Verb};

use super::ApiState;
use super::error::ApiError;
use crate::repo::Repository;

/// Who is calling: put into the request's extensions by authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user the bearer token belongs to.
    pub user: String,
}

/// What a route demands of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A cluster role binding of the caller must grant (api
    /// `catalog.example.com`, `resource`, `verb`).
    Cluster { resource: &'static str, verb: Verb },
    /// Any authenticated caller.
    Authenticated,
}

/// `rbac.RequireClusterRBAC(repo, resource, verb)`, as a route declares it.
pub const fn cluster(resource: &'static str, verb: Verb) -> Access {
    Access::Cluster { resource, verb }
}

/// One method of one catalog route, as declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub method: Method,
    /// Relative to `/apis/catalog.example.com/v1`, in axum's `{param}` syntax.
    pub path: &'static str,
    pub access: Access,
}

/// A handler for one HTTP method, with the access it demands.
pub(crate) struct Endpoint {
    method: Method,
    access: Access,
    handler: MethodRouter<ApiState>,
}

macro_rules! endpoint_constructors {
    ($($name:ident => $method:ident),* $(,)?) => {
        $(
            pub(crate) fn $name<H, T>(access: Access, handler: H) -> Self
            where
                H: Handler<T, ApiState>,
                T: 'static,
            {
                Self { method: Method::$method, access, handler: on(MethodFilter::$method, handler) }
            }
        )*
    };
}

impl Endpoint {
    endpoint_constructors!(get => GET, post => POST, put => PUT, patch => PATCH, delete => DELETE);

    pub(crate) fn spec(&self, path: &'static str) -> RouteSpec {
        RouteSpec { method: self.method.clone(), path, access: self.access }
    }

    /// The handler behind its requirement.
    pub(crate) fn guarded(self, repo: &Repository) -> MethodRouter<ApiState> {
        let requirement = Requirement { repo: repo.clone(), access: self.access };
        self.handler.route_layer(axum::middleware::from_fn_with_state(requirement, enforce))
    }
}

#[derive(Clone)]
struct Requirement {
    repo: Repository,
    access: Access,
}

async fn enforce(State(requirement): State<Requirement>, request: Request, next: Next) -> Response {
    let Some(caller) = request.extensions().get::<Caller>() else {
        return ApiError::unauthorized("missing bearer token").into_response();
    };
    let decided = match requirement.access {
        Access::Authenticated => Ok(()),
        Access::Cluster { resource, verb } => {
            require_cluster_rbac(&requirement.repo, &caller.user, resource, verb).await
        }
    };
    match decided {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// The seed's `rbac.RequireClusterRBAC(repo, resource, verb)`: allowed when
/// some cluster role binding of `user` grants (api `catalog.example.com`,
/// `resource`, `verb`); otherwise 403 naming user, api, resource and verb.
#[doc(alias = "RequireClusterRBAC")]
pub async fn require_cluster_rbac(repo: &Repository, user: &str, resource: &str, verb: Verb) -> Result<(), ApiError> {
    match repo.decide(user, None, &kayra_rbac::Request::new(CATALOG_API, resource, verb.as_str())).await? {
        Decision::Allow { role, .. } => {
            tracing::debug!(user, resource, %verb, role, "allowed");
            Ok(())
        }
        Decision::Deny => {
            tracing::debug!(user, resource, %verb, "denied");
            let verb = verb.as_str();
            Err(ApiError::forbidden(format!(
                "user {user:?} may not {verb:?} resource {resource:?} of api {CATALOG_API:?}: \
                 no cluster role bound to the user grants it"
            )))
        }
    }
}
