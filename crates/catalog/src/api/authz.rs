//! Authorization: who is calling ([`Caller`]), what a route demands
//! ([`Access`]), and the seed's `rbac.RequireClusterRBAC(repo, resource,
//! verb)` ([`require_cluster_rbac`]). Routes declare their access as
//! endpoints, which enforce it before any handler runs.
//!
//! Authentication itself is the server's job: its middleware turns a bearer
//! token into a [`Caller`] in the request's extensions. A request without
//! one is refused with 401 by every endpoint, so a router mounted
//! without that middleware fails closed.

use kayra_core::CATALOG_API;
use kayra_rbac::{Decision, Verb};

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
