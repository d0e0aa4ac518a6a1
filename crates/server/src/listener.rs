//! Serving connections, plain or TLS, with the slow-client rules of §2:
//! a request head must be complete within `server.request_header_timeout`
//! and an idle keep-alive connection is closed after `server.idle_timeout`.
//!
//! hyper's own `header_read_timeout` starts as soon as a connection waits
//! for a head, so on a keep-alive connection it would also cut idle time
//! to the head timeout. Each connection therefore keeps its own
//! [`Activity`]: the head clock starts when the connection is handed over
//! (a silent new connection) or at the first byte after a response (the
//! next request on a keep-alive connection), and the idle clock when the
//! last response finished. While a request is in flight neither runs.
//! hyper's timeout stays on as a backstop at the sum of both.
//!
//! A request body is the handler's to read; catalog bodies (small JSON)
//! must keep moving: [`stalled_bodies`] fails one that goes
//! `server.request_header_timeout` without a byte, so a client cannot hold
//! a connection by trickling a body either. Gateway bodies stream at the
//! backend's pace and are not limited here.
//!
//! Each request carries a [`Peer`] extension: the gateway's
//! `X-Forwarded-For` and `X-Forwarded-Proto` come from it.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Where a request came from: the connection's peer, and whether it is TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    pub tls: bool,
}

/// The slow-client limits of a listener.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A request head must be complete within this.
    pub request_header: Duration,
    /// An idle keep-alive connection is closed after this.
    pub idle: Duration,
}

impl Default for Timeouts {
    /// The defaults of `server.request_header_timeout` and `server.idle_timeout`.
    fn default() -> Self {
        Self::from_config(&kayra_config::ServerConfig::default())
    }
}

impl Timeouts {
    pub fn from_config(server: &kayra_config::ServerConfig) -> Self {
        Self { request_header: server.request_header_timeout.0, idle: server.idle_timeout.0 }
    }
}

/// Serves `app` on `listener` until `stopping` is cancelled; then stops
/// accepting, asks every connection to finish its request in flight and
/// close, and returns once all have closed.
pub async fn serve<L>(mut listener: L, app: Router, timeouts: Timeouts, tls: bool, stopping: CancellationToken)
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let connections = TaskTracker::new();
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopping.cancelled() => break,
        };
        let peer = Peer { addr, tls };
        connections.spawn(connection(io, peer, app.clone(), timeouts, stopping.clone()));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// One connection, until it closes, times out, or shutdown has let its
/// request in flight finish.
async fn connection<I>(io: I, peer: Peer, app: Router, timeouts: Timeouts, stopping: CancellationToken)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked { inner: io, activity: activity.clone() });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            let in_flight = InFlight::new(activity.clone());
            request.extensions_mut().insert(peer);
            let app = app.clone();
            async move {
                let response = match app.oneshot(request.map(Body::new)).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(response.map(|body| Guarded { inner: body, _in_flight: in_flight }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(timeouts.request_header + timeouts.idle);
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(peer = %peer.addr, error = %e, "connection ended with an error");
                }
                return;
            }
            why = activity.expired(timeouts) => {
                // No request is in flight: dropping the connection closes it.
                tracing::debug!(peer = %peer.addr, why, "closing connection");
                return;
            }
            () = stopping.cancelled(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The same request, whose body fails (the catalog answers 400) once it
/// has gone `stall` without a byte.
pub(crate) fn stalled_bodies(request: axum::extract::Request, stall: Duration) -> axum::extract::Request {
    use futures::StreamExt;
    let (parts, body) = request.into_parts();
    if http_body::Body::is_end_stream(&body) {
        return axum::extract::Request::from_parts(parts, body);
    }
    let chunks = futures::stream::unfold(Some(body.into_data_stream()), move |stream| async move {
        let mut stream = stream?;
        match tokio::time::timeout(stall, stream.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(stream))),
            Ok(None) => None,
            Err(_) => {
                Some((Err(axum::Error::new(io::Error::new(io::ErrorKind::TimedOut, "request body stalled"))), None))
            }
        }
    });
    axum::extract::Request::from_parts(parts, Body::from_stream(chunks))
}

/// What a connection is doing, for its timeouts.
struct Activity {
    state: Mutex<State>,
    changed: Notify,
}

struct State {
    /// Requests whose response is not finished yet.
    in_flight: usize,
    /// When a request head began: at hand-over for a new connection, at the
    /// first byte after a response otherwise. `None` while in flight or idle.
    head_started: Option<Instant>,
    /// When the connection last became idle.
    idle_since: Instant,
}

impl Activity {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            state: Mutex::new(State { in_flight: 0, head_started: Some(now), idle_since: now }),
            changed: Notify::new(),
        }
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_waiters();
    }

    fn read(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.in_flight == 0 && state.head_started.is_none() {
            state.head_started = Some(Instant::now());
            drop(state);
            self.changed.notify_waiters();
        }
    }

    /// The deadline that applies now, and what it is for.
    fn deadline(&self, timeouts: Timeouts) -> Option<(Instant, &'static str)> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.in_flight > 0 {
            None
        } else if let Some(started) = state.head_started {
            Some((started + timeouts.request_header, "request head not complete in time"))
        } else {
            Some((state.idle_since + timeouts.idle, "idle keep-alive connection"))
        }
    }

    /// Completes once a deadline has passed while nothing was in flight.
    async fn expired(&self, timeouts: Timeouts) -> &'static str {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            match self.deadline(timeouts) {
                None => changed.await,
                Some((deadline, why)) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {
                            if self.deadline(timeouts).is_some_and(|(now_due, _)| now_due <= Instant::now()) {
                                return why;
                            }
                        }
                        () = changed => {}
                    }
                }
            }
        }
    }
}

/// A request in flight on a connection, from its head until its response
/// body is finished (or abandoned).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: Arc<Activity>) -> Self {
        activity.update(|state| {
            state.in_flight += 1;
            state.head_started = None;
        });
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.update(|state| {
            state.in_flight -= 1;
            if state.in_flight == 0 {
                state.idle_since = Instant::now();
            }
        });
    }
}

/// A response body that keeps its request in flight until it is done.
struct Guarded {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's stream, telling its [`Activity`] when bytes arrive.
struct Tracked<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
