//! What every `/apis/` request passes before its route: its source
//! ([`crate::source`]), its caller ([`crate::auth`], 401), and for the
//! catalog API the body-stall guard ([`crate::listener::stalled_bodies`]).
//!
//! One middleware, not three: axum's `from_fn` clones the service it wraps,
//! boxes it for `Next` and boxes the future on every request, which three
//! layers paid three times on every catalog GET.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use kayra_catalog::repo::Repository;
use kayra_config::Cidr;

/// The state of [`admit`].
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

/// Middleware: the request's source, its caller (or 401), its body's guard.
pub(crate) async fn admit(State(admission): State<Admission>, mut request: Request, next: Next) -> Response {
    crate::source::resolve(&admission.trusted_proxies, &mut request);
    let mut request = match crate::auth::authenticate(&admission.repo, request).await {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    if let Some(stall) = admission.body_stall {
        request = crate::listener::stalled_bodies(request, stall);
    }
    next.run(request).await
}
