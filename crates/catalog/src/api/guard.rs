//! A route behind an async guard: what `axum::middleware::from_fn` does,
//! without its cost on every request.
//!
//! `from_fn` clones the route it wraps once more than a call needs, boxes
//! it again for its `Next`, and clones its state for the extractor that
//! hands it over. A [`Guard`] clones the route and the state once a call
//! and boxes only the guard's future. The catalog's route requirements
//! ([`super::endpoint`]) and `/apis/`'s admission (`kayra-server`) run on
//! every request, so they are guards.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use axum::routing::Route;
use futures::FutureExt;
use futures::future::{BoxFuture, Map};
use tower::{Layer, Service, ServiceExt};

/// A guard's function: the state, the request, and the route behind it
/// ([`Next`]), which it runs or answers in its place. Boxed by the
/// function itself, which knows its future's type.
pub type GuardFn<S> = fn(S, Request, Next) -> BoxFuture<'static, Response>;

/// The layer: every route it is put on runs behind `run` with `state`.
#[derive(Clone)]
pub struct Guard<S> {
    state: S,
    run: GuardFn<S>,
}

impl<S> Guard<S> {
    pub fn new(state: S, run: GuardFn<S>) -> Self {
        Self { state, run }
    }
}

impl<S: Clone> Layer<Route> for Guard<S> {
    type Service = Guarded<S>;

    fn layer(&self, route: Route) -> Guarded<S> {
        Guarded { guard: self.clone(), route }
    }
}

/// A route behind a [`Guard`].
#[derive(Clone)]
pub struct Guarded<S> {
    guard: Guard<S>,
    route: Route,
}

impl<S: Clone> Service<Request> for Guarded<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = Map<BoxFuture<'static, Response>, fn(Response) -> Result<Response, Infallible>>;

    /// A route is always ready (axum's `Route` is).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let next = Next(self.route.clone());
        (self.guard.run)(self.guard.state.clone(), request, next).map(Ok)
    }
}

/// The route behind a guard.
pub struct Next(Route);

impl Next {
    /// Runs the route on `request`. A plain function, not an `async fn`,
    /// whose future would hold the request once more beside the route's.
    pub fn run(self, request: Request) -> impl Future<Output = Response> + Send {
        self.0.oneshot(request).map(|Ok(response)| response)
    }
}
