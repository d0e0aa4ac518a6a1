//! What every `/apis/` request passes before its route: its source
//! ([`crate::source`]), its caller ([`crate::auth`], 401), and for the
//! catalog API the body-stall guard ([`crate::listener::stalled_bodies`]).
//!
//! One layer, not three, and a plain tower service rather than axum's
//! `from_fn`, which clones the route it wraps, boxes it for `Next` and
//! boxes the future on every request: three such layers paid that three
//! times on every catalog GET.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use axum::routing::Route;
use futures::future::BoxFuture;
use kayra_catalog::repo::Repository;
use kayra_config::Cidr;
use tower::{Layer, Service, ServiceExt};

/// The layer: what [`Admitted`] needs to admit a request.
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

impl Layer<Route> for Admission {
    type Service = Admitted;

    fn layer(&self, route: Route) -> Admitted {
        Admitted { admission: self.clone(), route }
    }
}

/// A route behind [`Admission`].
#[derive(Clone)]
pub(crate) struct Admitted {
    admission: Admission,
    route: Route,
}

impl Service<Request> for Admitted {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    /// A route is always ready (axum's `Route` is).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let (admission, route) = (self.admission.clone(), self.route.clone());
        Box::pin(async move { Ok(admit(&admission, request, route).await) })
    }
}

/// The request's source, its caller (or 401), its body's guard; then the
/// route.
async fn admit(admission: &Admission, mut request: Request, route: Route) -> Response {
    crate::source::resolve(&admission.trusted_proxies, &mut request);
    let mut request = match crate::auth::authenticate(&admission.repo, request).await {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    if let Some(stall) = admission.body_stall {
        request = crate::listener::stalled_bodies(request, stall);
    }
    let Ok(response) = route.oneshot(request).await;
    response
}
