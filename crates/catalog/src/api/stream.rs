//! What every watch stream shares (§4.5), whatever it shows: the event
//! schema and its framing (NDJSON or server-sent events), an object's
//! rendering with its frames made once, the stream's [`Outbox`] (pending
//! frames, SSE keep-alives, re-checking that its [`Watcher`] may still
//! watch, closing at shutdown), and the streams' tunables.
//!
//! It sits below the hub (whose records cache [`Rendered`] objects), the
//! object streams and the `/status` report's stream, and knows only
//! authorization, for the re-checks.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use kayra_rbac::Verb;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::authz::require_cluster_rbac;
use crate::repo::Repository;

/// Tunables of the watch streams; shortened by tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchOptions {
    /// An SSE stream sends `: keep-alive` after this much silence (§4.5: ≤ 15 s).
    pub keep_alive: Duration,
    /// How often a stream re-checks its caller's token and right to watch
    /// (a revoked one is closed within 1 s).
    pub recheck: Duration,
    /// Announcements a stream may fall behind before it is closed.
    pub capacity: usize,
    /// How long a new stream waits for its feeds' first listing (503 after).
    pub ready_timeout: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            keep_alive: Duration::from_secs(10),
            recheck: Duration::from_millis(400),
            capacity: 4096,
            ready_timeout: Duration::from_secs(10),
        }
    }
}

/// One event of a watch stream (the schema of each NDJSON line and SSE `data:`).
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct WatchEvent {
    /// `ADDED`, `MODIFIED` or `DELETED`.
    #[serde(rename = "type")]
    #[schema(example = "ADDED")]
    pub kind: String,
    /// The object exactly as a GET answers it (for `DELETED`, as last sent).
    #[schema(value_type = Object)]
    pub object: serde_json::Value,
}

/// An object as a GET answers it, rendered once per record and shared by
/// every stream that shows it, with its event frames made on first use.
pub(crate) struct Rendered {
    pub(crate) object: Box<str>,
    /// A run's or a token's id, for the streams of one of them.
    pub(crate) id: Option<String>,
    /// A token's user.
    pub(crate) owner: Option<String>,
    /// A namespace's labels, for the streams of a label selector.
    pub(crate) labels: Option<std::collections::BTreeMap<String, String>>,
    /// By [`Kind`] and [`Framing`].
    frames: [OnceLock<Bytes>; 6],
}

impl Rendered {
    pub(crate) fn new(object: String, id: Option<String>, owner: Option<String>) -> Self {
        Self { object: object.into_boxed_str(), id, owner, labels: None, frames: Default::default() }
    }

    /// The same, carrying the object's labels.
    pub(crate) fn with_labels(mut self, labels: std::collections::BTreeMap<String, String>) -> Self {
        self.labels = Some(labels);
        self
    }

    pub(crate) fn frame(&self, kind: Kind, framing: Framing) -> Bytes {
        let slot = &self.frames[kind as usize * 2 + framing as usize];
        slot.get_or_init(|| frame(kind, &self.object, framing)).clone()
    }
}

/// The type of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Added = 0,
    Modified = 1,
    Deleted = 2,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Added => "ADDED",
            Kind::Modified => "MODIFIED",
            Kind::Deleted => "DELETED",
        }
    }
}

/// One event, `object` being its JSON text, framed as `framing` says.
pub(crate) fn frame(kind: Kind, object: &str, framing: Framing) -> Bytes {
    let kind = kind.name();
    let line = format!("{{\"type\":\"{kind}\",\"object\":{object}}}");
    Bytes::from(match framing {
        Framing::Ndjson => format!("{line}\n"),
        Framing::Sse => format!("event: {kind}\ndata: {line}\n\n"),
    })
}

/// Who is watching, to re-check while the stream is open.
#[derive(Debug, Clone)]
pub(crate) struct Watcher {
    pub user: String,
    /// The bearer token the stream was opened with (never logged).
    pub token: String,
    /// The route's RBAC resource; the verb is `watch`.
    pub resource: &'static str,
}

/// How the events are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Ndjson = 0,
    Sse = 1,
}

/// The 200 answer of a watch stream whose events `body` carries.
pub(crate) fn streaming(framing: Framing, body: Body) -> Response {
    let content_type = match framing {
        Framing::Ndjson => "application/x-ndjson",
        Framing::Sse => "text/event-stream",
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies such as nginx would otherwise buffer the events.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// What every watch stream does besides rendering its events: the frames
/// not yet sent, SSE keep-alives, re-checking that the caller may still
/// watch, and closing at shutdown.
pub(crate) struct Outbox {
    /// Framed events not yet handed to the connection.
    pending: VecDeque<Bytes>,
    framing: Framing,
    repo: Repository,
    watcher: Watcher,
    options: WatchOptions,
    stop: CancellationToken,
    last_sent: Instant,
    next_check: Instant,
}

impl Outbox {
    pub(crate) fn new(
        framing: Framing,
        repo: Repository,
        watcher: Watcher,
        options: WatchOptions,
        stop: CancellationToken,
    ) -> Self {
        let now = Instant::now();
        let next_check = now + options.recheck;
        Self { pending: VecDeque::new(), framing, repo, watcher, options, stop, last_sent: now, next_check }
    }

    pub(crate) fn framing(&self) -> Framing {
        self.framing
    }

    pub(crate) fn watcher(&self) -> &Watcher {
        &self.watcher
    }

    /// Queues one framed event.
    pub(crate) fn push(&mut self, event: Bytes) {
        self.pending.push_back(event);
    }

    /// The next queued bytes to send, if any.
    pub(crate) fn pop(&mut self) -> Option<Bytes> {
        let chunk = self.pending.pop_front()?;
        self.last_sent = Instant::now();
        Some(chunk)
    }

    /// Waits for the next piece of housekeeping and does it: `false` when
    /// the stream must end (shutdown, or the caller may no longer watch).
    /// Cancel-safe: a re-check interrupted by an event is done again.
    pub(crate) async fn housekeeping(&mut self) -> bool {
        let keep_alive = self.last_sent + self.options.keep_alive;
        let sse = self.framing == Framing::Sse;
        tokio::select! {
            () = self.stop.cancelled() => false,
            () = tokio::time::sleep_until(self.next_check) => {
                if !self.watcher.still_allowed(&self.repo).await {
                    tracing::info!(user = %self.watcher.user, resource = self.watcher.resource,
                        "watch stream closed: the caller may no longer watch");
                    return false;
                }
                self.next_check = Instant::now() + self.options.recheck;
                true
            },
            () = tokio::time::sleep_until(keep_alive), if sse => {
                self.pending.push_back(Bytes::from_static(b": keep-alive\n\n"));
                true
            },
        }
    }
}

/// Marks the GET a watch runs first to validate its route: a handler whose
/// answer is costly may skip the body (only the status matters).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchCheck;

impl Watcher {
    /// Whether the token still authenticates the same user and that user
    /// may still watch. A store failure is not a revocation: the stream
    /// stays open and the next check decides.
    pub(crate) async fn still_allowed(&self, repo: &Repository) -> bool {
        match repo.authenticate(&self.token).await {
            Ok(Some(user)) if user == self.user => {}
            Ok(_) => return false,
            Err(_) => return true,
        }
        match require_cluster_rbac(repo, &self.user, self.resource, Verb::Watch).await {
            Ok(()) => true,
            Err(e) => e.status() != StatusCode::FORBIDDEN,
        }
    }
}
