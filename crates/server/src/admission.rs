//! What every `/apis/` request passes before its route: its source
//! ([`crate::source`]), its caller ([`crate::auth`], 401), and for the
//! catalog API the body-stall guard ([`crate::listener::stalled_bodies`]).
//!
//! One guard ([`kayra_catalog::api::guard`]), not three `from_fn`
//! layers, each of which cloned the route it wraps, boxed it for `Next`
//! and boxed its future on every catalog GET.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use kayra_catalog::api::guard::{Guard, Next};
use kayra_catalog::repo::Repository;
use kayra_config::Cidr;

/// What [`admit`] needs to admit a request.
#[derive(Clone)]
pub(crate) struct Admission {
    /// `server.trusted_proxies`.
    pub trusted_proxies: Arc<[Cidr]>,
    /// Authenticates the caller.
    pub repo: Repository,
    /// How long a request body may go without a byte; `None` for the
    /// gateway, whose bodies stream to the backend as they come.
    pub body_stall: Option<Duration>,
}

impl Admission {
    /// The layer of every route it admits to.
    pub(crate) fn layer(self) -> Guard<Admission> {
        Guard::new(self, |admission, request, next| Box::pin(admit(admission, request, next)))
    }
}

/// The request's source, its caller (or 401), its body's guard; then the
/// route.
async fn admit(admission: Admission, mut request: Request, next: Next) -> Response {
    crate::source::resolve(&admission.trusted_proxies, &mut request);
    if let Err(refused) = crate::auth::authenticate(&admission.repo, &mut request).await {
        return refused;
    }
    if let Some(stall) = admission.body_stall {
        request = crate::listener::stalled_bodies(request, stall);
    }
    next.run(request).await
}
