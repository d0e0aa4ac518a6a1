//! Watch streams (§4.5): `?watch=true` on a catalog GET of a collection or
//! of one object.
//!
//! The answer is NDJSON (`application/x-ndjson`), one
//! `{"type": "ADDED"|"MODIFIED"|"DELETED", "object": {...}}` a line, or
//! with `Accept: text/event-stream` server-sent events (`event: ADDED`,
//! `data: <the same JSON>`, a `: keep-alive` comment after
//! [`WatchOptions::keep_alive`] of silence). First an `ADDED` for every
//! object there is, then every change.
//!
//! A stream reads from the process's [`Hub`]: no store watch of its own.
//! It keeps the JSON of every object it has sent and, on each announced
//! key, renders that key's *current* record the way a GET would and
//! compares: a new object is `ADDED`, a different one `MODIFIED`, a gone
//! one `DELETED`, an equal one nothing. So a replayed or re-listed record
//! never shows twice, a write that changes nothing visible (a run record,
//! the same value again) is no event, and a subscription's computed
//! `expected_sync_id`/`synced` are re-rendered when its registration's
//! announcement comes from the registrations feed.
//!
//! Authorization is checked when the stream opens (the route's resource
//! with verb `watch`) and again every [`WatchOptions::recheck`]: a revoked
//! token, a deleted user or a lost right closes the stream.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use kayra_core::{
    ApiRegistration, ClusterRoleBinding, Namespace, Role, RoleBinding, Run, Subscription, TokenRecord, User,
};
use kayra_rbac::Verb;
use kayra_store::KeyValue;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::authz::require_cluster_rbac;
use super::error::ApiError;
use super::hub::{Feed, Hub, KeyRange, WatchOptions};
use super::users::TokenInfo;
use crate::repo::{Repository, keys};

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

/// What a watchable GET route shows, and so which feed it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    Namespaces,
    Registrations,
    Subscriptions,
    Runs,
    Users,
    Tokens,
    Roles,
    ClusterRoleBindings,
    RoleBindings,
    /// A registration's `/status` report (see [`super::status`]).
    Status,
}

/// How a record becomes the object a GET answers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum View {
    Namespace,
    Registration,
    /// With `expected_sync_id` from the registrations feed (its prefix).
    Subscription {
        registrations: String,
    },
    Run {
        id: Option<String>,
    },
    User,
    Token {
        user: String,
        id: Option<String>,
    },
    Role,
    ClusterRoleBinding,
    RoleBinding,
}

/// What one stream follows.
#[derive(Debug, Clone)]
struct Target {
    feed: String,
    range: KeyRange,
    view: View,
}

impl Target {
    /// The target of `kind` at the route's path parameters; `collection`
    /// when the route names a collection rather than one object.
    fn new(kind: Watched, params: &HashMap<String, String>, repo: &Repository) -> Target {
        let p = |name: &str| params.get(name).cloned().unwrap_or_default();
        let (platform, region) = (repo.platform(), repo.region());
        let one = |collection: String, name: Option<String>| match name {
            Some(name) => KeyRange::Exact(format!("{collection}{name}")),
            None => KeyRange::Prefix(collection),
        };
        match kind {
            Watched::Namespaces => Target {
                feed: keys::NAMESPACES.into(),
                range: one(keys::NAMESPACES.into(), params.get("namespace").cloned()),
                view: View::Namespace,
            },
            // A status stream follows its registration's record too.
            Watched::Registrations | Watched::Status => Target {
                feed: keys::registrations(platform, region),
                range: one(keys::registrations(platform, region), params.get("name").cloned()),
                view: View::Registration,
            },
            Watched::Subscriptions => Target {
                feed: keys::subscriptions(platform, region),
                range: one(
                    keys::namespace_subscriptions(platform, region, &p("namespace")),
                    params.get("api").cloned(),
                ),
                view: View::Subscription { registrations: keys::registrations(platform, region) },
            },
            Watched::Runs => Target {
                feed: keys::all_runs(platform, region),
                range: KeyRange::Prefix(keys::runs(platform, region, &p("namespace"), &p("api"))),
                view: View::Run { id: params.get("id").cloned() },
            },
            Watched::Users => Target {
                feed: keys::USERS.into(),
                range: one(keys::USERS.into(), params.get("name").cloned()),
                view: View::User,
            },
            Watched::Tokens => Target {
                feed: keys::TOKENS.into(),
                range: KeyRange::Prefix(keys::TOKENS.into()),
                view: View::Token { user: p("name"), id: params.get("id").cloned() },
            },
            Watched::Roles => Target {
                feed: keys::ROLES.into(),
                range: one(keys::ROLES.into(), params.get("name").cloned()),
                view: View::Role,
            },
            Watched::ClusterRoleBindings => Target {
                feed: keys::CLUSTER_ROLE_BINDINGS.into(),
                range: one(keys::CLUSTER_ROLE_BINDINGS.into(), params.get("name").cloned()),
                view: View::ClusterRoleBinding,
            },
            Watched::RoleBindings => Target {
                feed: keys::ROLE_BINDINGS.into(),
                range: one(keys::role_bindings(&p("namespace")), params.get("name").cloned()),
                view: View::RoleBinding,
            },
        }
    }

    /// The feed a subscription's computed fields come from.
    fn dependency(&self) -> Option<&str> {
        match &self.view {
            View::Subscription { registrations } => Some(registrations),
            _ => None,
        }
    }

    /// The object a GET would answer for `kv`, as JSON text; `None` when
    /// the record is not one this stream shows.
    fn render(&self, kv: &KeyValue, registrations: Option<&Feed>) -> Option<String> {
        fn plain<T: DeserializeOwned + Serialize>(kv: &KeyValue) -> Option<String> {
            to_text(&serde_json::from_slice::<T>(&kv.value).ok()?)
        }
        match &self.view {
            View::Namespace => plain::<Namespace>(kv),
            View::Registration => plain::<ApiRegistration>(kv),
            View::User => plain::<User>(kv),
            View::Role => plain::<Role>(kv),
            View::ClusterRoleBinding => plain::<ClusterRoleBinding>(kv),
            View::RoleBinding => plain::<RoleBinding>(kv),
            View::Subscription { registrations: prefix } => {
                let subscription: Subscription = serde_json::from_slice(&kv.value).ok()?;
                let expected = registrations
                    .and_then(|feed| feed.get(&format!("{prefix}{}", subscription.api)))
                    .and_then(|kv| serde_json::from_slice::<ApiRegistration>(&kv.value).ok())
                    .map(|r| r.sync_id)
                    .unwrap_or_default();
                to_text(&subscription.view(&expected))
            }
            View::Run { id } => {
                let run: Run = serde_json::from_slice(&kv.value).ok()?;
                id.as_ref().is_none_or(|id| *id == run.id).then(|| to_text(&run)).flatten()
            }
            View::Token { user, id } => {
                let token: TokenRecord = serde_json::from_slice(&kv.value).ok()?;
                let shown = token.user == *user && id.as_ref().is_none_or(|id| *id == token.id);
                shown.then(|| to_text(&TokenInfo { id: token.id, created_at: token.created_at })).flatten()
            }
        }
    }

    /// The key of this stream whose object a registration's change may
    /// change (a subscription's key ends in its api's long name).
    fn affected_by_registration(&self, registration_key: &str) -> Option<String> {
        let prefix = self.dependency()?;
        let name = registration_key.strip_prefix(prefix)?;
        match &self.range {
            KeyRange::Prefix(p) => Some(format!("{p}{name}")),
            KeyRange::Exact(k) => k.ends_with(&format!("/{name}")).then(|| k.clone()),
        }
    }
}

fn to_text<T: Serialize>(value: &T) -> Option<String> {
    serde_json::to_string(value).ok()
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
    Ndjson,
    Sse,
}

/// Opens a watch stream of `kind` at the route's `params` for `watcher`.
pub(crate) async fn open(
    hub: &Hub,
    repo: &Repository,
    kind: Watched,
    params: &HashMap<String, String>,
    watcher: Watcher,
    event_stream: bool,
) -> Result<Response, ApiError> {
    let framing = if event_stream { Framing::Sse } else { Framing::Ndjson };
    if kind == Watched::Status {
        return super::status::open(hub, repo, params, watcher, framing).await;
    }
    let target = Target::new(kind, params, repo);
    let options = hub.options();
    let primary = hub.feed(&target.feed);
    let dependency = target.dependency().map(|prefix| hub.feed(prefix));
    for feed in std::iter::once(&primary).chain(dependency.as_ref()) {
        if !feed.wait_ready(options.ready_timeout).await {
            return Err(ApiError::unavailable("the watch could not list its objects in time; retry"));
        }
    }
    // Subscribing to the dependency first: a registration change that lands
    // between the two subscriptions is then announced rather than missed.
    let dependency = dependency.map(|feed| {
        let (rx, _) = feed.subscribe(&KeyRange::Exact(String::new()));
        (feed, rx)
    });
    let (rx, present) = primary.subscribe(&target.range);
    let now = Instant::now();
    let mut stream = Stream {
        target,
        primary,
        rx,
        dependency,
        sent: HashMap::new(),
        pending: VecDeque::new(),
        framing,
        repo: repo.clone(),
        watcher,
        options,
        stop: hub.stopping(),
        last_sent: now,
        next_check: now + options.recheck,
        closed: false,
    };
    for kv in present {
        stream.refresh_with(&kv.key, Some(kv.clone()));
    }
    let body = Body::from_stream(futures::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), stream))
    }));
    Ok(streaming(framing, body))
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

/// One open watch stream.
struct Stream {
    target: Target,
    primary: Arc<Feed>,
    rx: broadcast::Receiver<Arc<str>>,
    dependency: Option<(Arc<Feed>, broadcast::Receiver<Arc<str>>)>,
    /// The JSON last sent for each key shown: what the next render is
    /// compared with, and what a `DELETED` carries.
    sent: HashMap<String, String>,
    /// Framed events not yet handed to the connection.
    pending: VecDeque<Bytes>,
    framing: Framing,
    repo: Repository,
    watcher: Watcher,
    options: WatchOptions,
    stop: CancellationToken,
    last_sent: Instant,
    next_check: Instant,
    closed: bool,
}

impl Stream {
    /// The next bytes to send; `None` ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                self.last_sent = Instant::now();
                return Some(chunk);
            }
            if self.closed {
                return None;
            }
            let keep_alive = self.last_sent + self.options.keep_alive;
            let sse = self.framing == Framing::Sse;
            let dependency = async {
                match self.dependency.as_mut() {
                    Some((_, rx)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.stop.cancelled() => return None,
                key = self.rx.recv() => match key {
                    Ok(key) => self.refresh(&key),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::info!(user = %self.watcher.user, missed, "watch stream fell behind; closing it");
                        return None;
                    }
                    Err(RecvError::Closed) => return None,
                },
                key = dependency => match key {
                    Ok(key) => {
                        if let Some(affected) = self.target.affected_by_registration(&key) {
                            self.refresh(&affected);
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::info!(user = %self.watcher.user, missed, "watch stream fell behind; closing it");
                        return None;
                    }
                    Err(RecvError::Closed) => return None,
                },
                () = tokio::time::sleep_until(self.next_check) => {
                    if !self.watcher.still_allowed(&self.repo).await {
                        tracing::info!(user = %self.watcher.user, resource = self.watcher.resource,
                            "watch stream closed: the caller may no longer watch");
                        return None;
                    }
                    self.next_check = Instant::now() + self.options.recheck;
                },
                () = tokio::time::sleep_until(keep_alive), if sse => {
                    self.pending.push_back(Bytes::from_static(b": keep-alive\n\n"));
                },
            }
        }
    }

    /// Re-renders `key` from its feed's current record and queues the event
    /// that tells the client, if any.
    fn refresh(&mut self, key: &str) {
        if !self.target.range.contains(key) {
            return;
        }
        let current = self.primary.get(key);
        self.refresh_with(key, current);
    }

    fn refresh_with(&mut self, key: &str, current: Option<Arc<KeyValue>>) {
        let registrations = self.dependency.as_ref().map(|(feed, _)| feed.as_ref());
        let rendered = current.and_then(|kv| self.target.render(&kv, registrations));
        let event = match (rendered, self.sent.get(key)) {
            (Some(object), None) => {
                let event = self.frame("ADDED", &object);
                self.sent.insert(key.to_string(), object);
                event
            }
            (Some(object), Some(previous)) if *previous != object => {
                let event = self.frame("MODIFIED", &object);
                self.sent.insert(key.to_string(), object);
                event
            }
            (None, Some(_)) => {
                let previous = self.sent.remove(key).unwrap_or_default();
                self.frame("DELETED", &previous)
            }
            _ => return,
        };
        self.pending.push_back(event);
    }

    fn frame(&self, kind: &str, object: &str) -> Bytes {
        frame(self.framing, kind, object)
    }
}

/// One event, `object` being its JSON text, framed as `framing` says.
pub(crate) fn frame(framing: Framing, kind: &str, object: &str) -> Bytes {
    let line = format!("{{\"type\":\"{kind}\",\"object\":{object}}}");
    Bytes::from(match framing {
        Framing::Ndjson => format!("{line}\n"),
        Framing::Sse => format!("event: {kind}\ndata: {line}\n\n"),
    })
}

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use kayra_store::Store;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_that_falls_behind_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let config = kayra_config::DatabaseConfig::local(kayra_testkit::local_config(dir.path()));
        let store = Store::open(&config).await.unwrap();
        let repo = Repository::new(store.clone(), "dev", "local");
        // Re-checks far apart: the empty token would fail them.
        let options = WatchOptions { capacity: 4, recheck: Duration::from_secs(600), ..WatchOptions::default() };
        let hub = Hub::new(store, options);
        let namespace = |name: &str| Namespace { name: name.into(), ..Namespace::default() };
        repo.create(&keys::namespace("a"), &namespace("a"), "namespace").await.unwrap();
        let watcher = Watcher { user: "admin".into(), token: String::new(), resource: "namespaces" };
        let response = open(&hub, &repo, Watched::Namespaces, &HashMap::new(), watcher, false).await.unwrap();
        let mut body = response.into_body().into_data_stream();
        let first = body.next().await.unwrap().unwrap();
        assert!(std::str::from_utf8(&first).unwrap().starts_with(r#"{"type":"ADDED","object":{"name":"a""#));

        // Many more changes than the stream may fall behind, while it is not read.
        for i in 0..20 {
            repo.create(&keys::namespace(&format!("n{i:02}")), &namespace(&format!("n{i:02}")), "namespace")
                .await
                .unwrap();
        }
        let feed = hub.feed(keys::NAMESPACES);
        kayra_testkit::eventually("the feed to see every write", || async { feed.get("/namespaces/n19").is_some() })
            .await;
        let rest = tokio::time::timeout(Duration::from_secs(10), body.collect::<Vec<_>>()).await.expect("closed");
        assert!(rest.is_empty(), "a lagging stream ends instead of catching up: {rest:?}");
        assert_eq!(hub.feed_count(), 1);
    }
}
