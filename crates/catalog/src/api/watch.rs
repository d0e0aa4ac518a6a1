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
//! It keeps the JSON of every object it has sent and, on each change its
//! feed announces, renders the record **as of that change** the way a GET
//! would (once per record for all streams: the rendering and its frames
//! are shared through the feed's [`Record`], so a stream holds pointers,
//! not copies) and compares: a new object is `ADDED`, a different one
//! `MODIFIED`, a gone one `DELETED`, an equal one nothing. So every
//! transition is shown in order (never only the latest state read later),
//! a re-listed record never shows twice, a write that changes nothing
//! visible (a run record, the same value again) is no event, and a
//! subscription's computed `expected_sync_id`/`synced` are re-rendered,
//! from the record the stream showed last, when its registration's change
//! comes from the registrations feed.
//!
//! A runs stream shows the runs of one subscription's history record
//! ([`kayra_core::run_ring`]): each run an object of its own, `ADDED` when
//! a change of the record brings it, `DELETED` when one drops it (the
//! oldest, past `run_history`, or all with the subscription).
//!
//! A namespaces stream may have a label selector (`?labelSelector=`): it
//! shows only the namespaces that match, so a namespace that stops
//! matching is a `DELETED` event of that stream (carrying the object as
//! last sent) and one that starts matching is an `ADDED` (as Kubernetes
//! does).
//!
//! Authorization is checked when the stream opens (the route's resource
//! with verb `watch`) and again every [`WatchOptions::recheck`]: a revoked
//! token, a deleted user or a lost right closes the stream.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::response::Response;
use kayra_core::labels::Selector;
use kayra_core::{ApiRegistration, ClusterRoleBinding, Namespace, Role, RoleBinding, Subscription, TokenRecord, User};
use kayra_store::{KeyValue, Revision};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::error::ApiError;
use super::hub::{Feed, FeedChange, Hub, KeyRange, Record, StreamPermit};
use super::stream::{Framing, Kind, Outbox, Rendered, Watcher, streaming};
use super::users::TokenInfo;
use crate::repo::{Collection, RecordRef, Repository};

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
    /// A registration's `/status` report (served by its own stream).
    Status,
    /// The audit trail (served by its own stream, [`super::audit::open`]).
    Audit,
    /// A registration's rollout (§12).
    Rollout,
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
    /// One subscription's runs: the runs in its history record (their
    /// stored form leaves its names to the key), each an object.
    Run {
        namespace: String,
        api: String,
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
    /// The public part of a rollout record.
    Rollout,
}

/// What one stream follows.
#[derive(Debug, Clone)]
struct Target {
    feed: String,
    /// The feed is this stream's own ([`Hub::private_feed`]), not shared.
    private: bool,
    range: KeyRange,
    view: View,
    /// Only the namespaces it matches (a namespaces stream's selector).
    selector: Option<Selector>,
}

impl Target {
    /// The target of `kind` at the route's path parameters; `collection`
    /// when the route names a collection rather than one object.
    fn new(kind: Watched, params: &HashMap<String, String>, repo: &Repository, selector: Option<Selector>) -> Target {
        let target = Self::unselected(kind, params, repo);
        Target { selector: selector.filter(|_| target.view == View::Namespace), ..target }
    }

    fn unselected(kind: Watched, params: &HashMap<String, String>, repo: &Repository) -> Target {
        let p = |name: &str| params.get(name).cloned().unwrap_or_default();
        let (layout, name) = (repo.layout(), |param: &str| params.get(param).map(String::as_str));
        let namespace = p("namespace");
        let one = |collection: Collection<'_>, record: Option<RecordRef<'_>>| match record {
            Some(record) => KeyRange::Exact(layout.key(record)),
            None => KeyRange::Prefix(layout.prefix(collection)),
        };
        match kind {
            Watched::Namespaces => Target {
                feed: layout.prefix(Collection::Namespaces),
                private: false,
                range: one(Collection::Namespaces, name("namespace").map(RecordRef::Namespace)),
                view: View::Namespace,
                selector: None,
            },
            // A status stream follows its registration's record too; the
            // audit trail's stream has no target (it never reaches here).
            Watched::Registrations | Watched::Status | Watched::Audit => Target {
                feed: layout.prefix(Collection::Registrations),
                private: false,
                range: one(Collection::Registrations, name("name").map(RecordRef::Registration)),
                view: View::Registration,
                selector: None,
            },
            Watched::Subscriptions => Target {
                feed: layout.prefix(Collection::Subscriptions),
                private: false,
                range: one(
                    Collection::NamespaceSubscriptions(&namespace),
                    name("api").map(|api| RecordRef::Subscription { namespace: &namespace, api }),
                ),
                view: View::Subscription { registrations: layout.prefix(Collection::Registrations) },
                selector: None,
            },
            // One subscription's runs, in a feed of their own (§17): a feed
            // of every history record, kept for the process's life, would
            // hold the whole deployment's for one console page. The feed is
            // the key's prefix, so it also mirrors a history whose API's
            // name starts with this one's; the stream shows only its own.
            Watched::Runs => {
                let history = layout.key(RecordRef::Runs { namespace: &namespace, api: &p("api") });
                Target {
                    feed: history.clone(),
                    private: true,
                    range: KeyRange::Exact(history),
                    view: View::Run { namespace: namespace.clone(), api: p("api"), id: params.get("id").cloned() },
                    selector: None,
                }
            }
            Watched::Rollout => Target {
                feed: layout.prefix(Collection::Rollouts),
                private: false,
                range: KeyRange::Exact(layout.key(RecordRef::Rollout(&p("name")))),
                view: View::Rollout,
                selector: None,
            },
            Watched::Users => Target {
                feed: layout.prefix(Collection::Users),
                private: false,
                range: one(Collection::Users, name("name").map(RecordRef::User)),
                view: View::User,
                selector: None,
            },
            Watched::Tokens => Target {
                feed: layout.prefix(Collection::Tokens),
                private: false,
                range: KeyRange::Prefix(layout.prefix(Collection::Tokens)),
                view: View::Token { user: p("name"), id: params.get("id").cloned() },
                selector: None,
            },
            Watched::Roles => Target {
                feed: layout.prefix(Collection::Roles),
                private: false,
                range: one(Collection::Roles, name("name").map(RecordRef::Role)),
                view: View::Role,
                selector: None,
            },
            Watched::ClusterRoleBindings => Target {
                feed: layout.prefix(Collection::ClusterRoleBindings),
                private: false,
                range: one(Collection::ClusterRoleBindings, name("name").map(RecordRef::ClusterRoleBinding)),
                view: View::ClusterRoleBinding,
                selector: None,
            },
            Watched::RoleBindings => Target {
                feed: layout.prefix(Collection::RoleBindings),
                private: false,
                range: one(
                    Collection::NamespaceRoleBindings(&namespace),
                    name("name").map(|name| RecordRef::RoleBinding { namespace: &namespace, name }),
                ),
                view: View::RoleBinding,
                selector: None,
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

    /// The object a GET would answer for `kv` (`None` when the record is
    /// not one of this view's objects). The same for every stream of the
    /// view: what a stream's path selects is [`Target::shows`]'s to say.
    fn render(&self, kv: &KeyValue, registrations: Option<&Feed>) -> Option<Rendered> {
        fn plain<T: DeserializeOwned + Serialize>(kv: &KeyValue) -> Option<String> {
            to_text(&serde_json::from_slice::<T>(&kv.value).ok()?)
        }
        let (object, id, owner) = match &self.view {
            View::Namespace => {
                let namespace: Namespace = serde_json::from_slice(&kv.value).ok()?;
                return Some(Rendered::new(to_text(&namespace)?, None, None).with_labels(namespace.labels));
            }
            View::Registration => (plain::<ApiRegistration>(kv)?, None, None),
            View::User => (plain::<User>(kv)?, None, None),
            View::Role => (plain::<Role>(kv)?, None, None),
            View::ClusterRoleBinding => (plain::<ClusterRoleBinding>(kv)?, None, None),
            View::RoleBinding => (plain::<RoleBinding>(kv)?, None, None),
            View::Rollout => {
                let record: kayra_core::rollout::RolloutRecord = serde_json::from_slice(&kv.value).ok()?;
                (to_text(&record.rollout)?, None, None)
            }
            View::Subscription { registrations: prefix } => {
                let subscription: Subscription = serde_json::from_slice(&kv.value).ok()?;
                let expected = registrations
                    .and_then(|feed| feed.get(&format!("{prefix}{}", subscription.api)))
                    .and_then(|record| serde_json::from_slice::<ApiRegistration>(&record.kv.value).ok())
                    .map(|r| r.sync_id)
                    .unwrap_or_default();
                (to_text(&subscription.view(&expected))?, None, None)
            }
            // Each run is an object of its own ([`Stream::show_runs`]).
            View::Run { .. } => return None,
            View::Token { .. } => {
                let token: TokenRecord = serde_json::from_slice(&kv.value).ok()?;
                let object = to_text(&TokenInfo { id: token.id.clone(), created_at: token.created_at })?;
                (object, Some(token.id), Some(token.user))
            }
        };
        Some(Rendered::new(object, id, owner))
    }

    /// Whether this stream shows `rendered` (one run, one user's tokens).
    fn shows(&self, rendered: &Rendered) -> bool {
        let is = |wanted: &Option<String>, value: &Option<String>| wanted.is_none() || wanted == value;
        match &self.view {
            View::Run { id, .. } => is(id, &rendered.id),
            View::Token { user, id } => rendered.owner.as_deref() == Some(user.as_str()) && is(id, &rendered.id),
            View::Namespace => self
                .selector
                .as_ref()
                .is_none_or(|selector| rendered.labels.as_ref().is_some_and(|labels| selector.matches(labels))),
            _ => true,
        }
    }

    /// The revision of the record `key`'s rendering also reads: for a
    /// subscription, its registration's (a subscription's key ends in its
    /// api's long name); 0 when there is none.
    fn dependency_revision(&self, key: &str, registrations: Option<&Feed>) -> Revision {
        let (Some(prefix), Some(feed)) = (self.dependency(), registrations) else {
            return 0;
        };
        let name = key.rsplit('/').next().unwrap_or_default();
        feed.get(&format!("{prefix}{name}")).map_or(0, |record| record.kv.mod_revision)
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

/// What a request asks of its stream beyond the route.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    /// Server-sent events rather than NDJSON.
    pub event_stream: bool,
    /// A namespaces stream's `?labelSelector=` (other streams ignore it).
    pub selector: Option<Selector>,
}

/// Opens a watch stream of `kind` at the route's `params` for `watcher`.
pub(crate) async fn open(
    hub: &Hub,
    repo: &Repository,
    kind: Watched,
    params: &HashMap<String, String>,
    watcher: Watcher,
    asked: Asked,
    permit: StreamPermit,
) -> Result<Response, ApiError> {
    let framing = if asked.event_stream { Framing::Sse } else { Framing::Ndjson };
    let target = Target::new(kind, params, repo, asked.selector);
    let options = hub.options();
    let (primary, own) = if target.private {
        let (feed, guard) = hub.private_feed(&target.feed);
        (feed.clone(), Some((feed, guard)))
    } else {
        (hub.feed(&target.feed), None)
    };
    let dependency = target.dependency().map(|prefix| hub.feed(prefix));
    for feed in std::iter::once(&primary).chain(dependency.as_ref()) {
        if !feed.wait_ready(options.ready_timeout).await {
            return Err(ApiError::unavailable("the watch could not list its objects in time; retry"));
        }
    }
    // Read-your-writes (§17): the stream starts at or after every write
    // acknowledged before it opened, whichever process took it.
    let revision = repo.store().revision().await.map_err(crate::repo::Error::from)?;
    for feed in std::iter::once(&primary).chain(dependency.as_ref()) {
        if !feed.wait_for(revision, options.ready_timeout).await {
            return Err(ApiError::unavailable("the watch could not catch up with the store in time; retry"));
        }
    }
    // Subscribing to the dependency first: a registration change that lands
    // between the two subscriptions is then announced rather than missed.
    let dependency = dependency.map(|feed| {
        let (rx, _) = feed.subscribe(&KeyRange::Exact(String::new()));
        (feed, rx)
    });
    let (rx, present) = primary.subscribe(&target.range);
    let mut stream = Stream {
        target,
        rx,
        dependency,
        sent: HashMap::new(),
        outbox: Outbox::new(framing, repo.clone(), watcher, options, hub.stopping()),
        closed: false,
        _permit: permit,
        _own: own,
    };
    for record in present {
        let key = Arc::from(record.kv.key.as_str());
        stream.show(key, Some(record));
    }
    let body = Body::from_stream(futures::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), stream))
    }));
    Ok(streaming(framing, body))
}

/// One open watch stream.
struct Stream {
    target: Target,
    rx: broadcast::Receiver<FeedChange>,
    dependency: Option<(Arc<Feed>, broadcast::Receiver<FeedChange>)>,
    /// What was last sent for each key shown: the next rendering is
    /// compared with it, a `DELETED` carries it, and a dependency's change
    /// re-renders its record.
    sent: HashMap<Arc<str>, Shown>,
    outbox: Outbox,
    closed: bool,
    /// Its place under the stream caps, for as long as it is open.
    _permit: StreamPermit,
    /// Its own feed, stopped with the stream.
    _own: Option<(Arc<Feed>, tokio_util::sync::DropGuard)>,
}

/// One object a stream has sent: the record and its rendering.
struct Shown {
    record: Arc<Record>,
    rendered: Arc<Rendered>,
}

impl Stream {
    /// The next bytes to send; `None` ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if let Some(chunk) = self.outbox.pop() {
                return Some(chunk);
            }
            if self.closed {
                return None;
            }
            let dependency = async {
                match self.dependency.as_mut() {
                    Some((_, rx)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                alive = self.outbox.housekeeping() => if !alive { return None },
                change = self.rx.recv() => match change {
                    Ok(change) => {
                        if self.target.range.contains(&change.key) {
                            self.show(change.key, change.value);
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::info!(user = %self.outbox.watcher().user, missed, "watch stream fell behind; closing it");
                        return None;
                    }
                    Err(RecvError::Closed) => return None,
                },
                change = dependency => match change {
                    Ok(change) => {
                        if let Some(affected) = self.target.affected_by_registration(&change.key) {
                            // The record this stream showed last, against the new registration.
                            if let Some((key, shown)) = self.sent.get_key_value(affected.as_str()) {
                                let (key, record) = (key.clone(), shown.record.clone());
                                self.show(key, Some(record));
                            }
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::info!(user = %self.outbox.watcher().user, missed, "watch stream fell behind; closing it");
                        return None;
                    }
                    Err(RecvError::Closed) => return None,
                },
            }
        }
    }

    /// Renders `key`'s record as of its change (`None`: gone) and queues
    /// the event that tells the client, if any.
    fn show(&mut self, key: Arc<str>, record: Option<Arc<Record>>) {
        if let View::Run { namespace, api, .. } = &self.target.view {
            let (namespace, api) = (namespace.clone(), api.clone());
            return self.show_runs(&key, record, &namespace, &api);
        }
        let registrations = self.dependency.as_ref().map(|(feed, _)| feed.as_ref());
        let target = &self.target;
        let shown = record.and_then(|record| {
            let dependency = target.dependency_revision(&key, registrations);
            let rendered =
                record.rendered(dependency, |kv| target.render(kv, registrations)).filter(|r| target.shows(r))?;
            Some(Shown { record, rendered })
        });
        let framing = self.outbox.framing();
        let event = match (shown, self.sent.get(&key)) {
            (Some(shown), None) => {
                let event = shown.rendered.frame(Kind::Added, framing);
                self.sent.insert(key, shown);
                event
            }
            (Some(shown), Some(previous)) => {
                let changed = !Arc::ptr_eq(&shown.rendered, &previous.rendered)
                    && previous.rendered.object != shown.rendered.object;
                let event = changed.then(|| shown.rendered.frame(Kind::Modified, framing));
                // Holding the newest rendering lets the feed free the old one.
                self.sent.insert(key, shown);
                match event {
                    Some(event) => event,
                    None => return,
                }
            }
            (None, Some(_)) => match self.sent.remove(&key) {
                Some(previous) => previous.rendered.frame(Kind::Deleted, framing),
                None => return,
            },
            (None, None) => return,
        };
        self.outbox.push(event);
    }

    /// A runs stream's change of the history record `key` (`None`: gone):
    /// each run in it is an object, under `<key>#<id>`. Runs new to the
    /// record are `ADDED`, oldest first, decoded only then (a run never
    /// changes once recorded); runs gone from it are `DELETED`.
    fn show_runs(&mut self, key: &str, record: Option<Arc<Record>>, namespace: &str, api: &str) {
        let ring = record.as_ref().and_then(|record| kayra_core::run_ring::RunRing::decode(&record.kv.value).ok());
        let ids: Vec<(usize, String)> = ring
            .as_ref()
            .map(|ring| ring.ids().into_iter().enumerate().filter_map(|(i, id)| Some((i, id?))).collect())
            .unwrap_or_default();
        let run_key = |id: &str| -> Arc<str> { Arc::from(format!("{key}#{id}")) };
        let kept: std::collections::HashSet<Arc<str>> = ids.iter().map(|(_, id)| run_key(id)).collect();
        let framing = self.outbox.framing();
        let mut gone: Vec<Arc<str>> = self
            .sent
            .keys()
            .filter(|sent| sent.strip_prefix(key).is_some_and(|rest| rest.starts_with('#')) && !kept.contains(*sent))
            .cloned()
            .collect();
        gone.sort();
        for sent in gone {
            if let Some(previous) = self.sent.remove(&sent) {
                self.outbox.push(previous.rendered.frame(Kind::Deleted, framing));
            }
        }
        let (Some(ring), Some(record)) = (ring, record) else {
            return;
        };
        for (index, id) in ids.into_iter().rev() {
            let run_key = run_key(&id);
            if self.sent.contains_key(&run_key) {
                continue;
            }
            let Some(Ok(run)) = ring.run(index, namespace, api) else {
                continue;
            };
            let Some(object) = to_text(&run) else {
                continue;
            };
            let rendered = Rendered::new(object, Some(id), None);
            if !self.target.shows(&rendered) {
                continue;
            }
            let rendered = Arc::new(rendered);
            self.outbox.push(rendered.frame(Kind::Added, framing));
            self.sent.insert(run_key, Shown { record: record.clone(), rendered });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use kayra_store::Store;

    use super::*;
    use crate::api::stream::WatchOptions;

    /// A hub over a fresh local store (kept while the `TempDir` lives),
    /// its re-checks far apart: the empty token of these tests would fail them.
    async fn local_hub(options: WatchOptions) -> (tempfile::TempDir, Repository, Hub) {
        let dir = tempfile::tempdir().unwrap();
        let config = kayra_config::DatabaseConfig::local(kayra_testkit::local_config(dir.path()));
        let store = Store::open(&config).await.unwrap();
        let repo = Repository::new(store.clone(), "dev", "local");
        let hub = Hub::new(store, WatchOptions { recheck: Duration::from_secs(600), ..options });
        (dir, repo, hub)
    }

    fn namespace(name: &str) -> Namespace {
        Namespace { name: name.into(), ..Namespace::default() }
    }

    /// A stream of every namespace, as the admin.
    async fn watch_namespaces(hub: &Hub, repo: &Repository) -> axum::body::BodyDataStream {
        let watcher = Watcher { user: "admin".into(), token: String::new(), resource: "namespaces" };
        let permit = hub.admit("admin").unwrap_or_else(|_| panic!("under the stream caps"));
        let response =
            open(hub, repo, Watched::Namespaces, &HashMap::new(), watcher, Asked::default(), permit).await.unwrap();
        response.into_body().into_data_stream()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streams_share_one_rendering_of_each_event() {
        let (_dir, repo, hub) = local_hub(WatchOptions::default()).await;
        repo.create(RecordRef::Namespace("a"), &namespace("a"), "namespace").await.unwrap();
        let mut bodies = Vec::new();
        for _ in 0..2 {
            bodies.push(watch_namespaces(&hub, &repo).await);
        }
        let mut firsts = Vec::new();
        for body in &mut bodies {
            firsts.push(body.next().await.unwrap().unwrap());
        }
        repo.create(RecordRef::Namespace("b"), &namespace("b"), "namespace").await.unwrap();
        let mut seconds = Vec::new();
        for body in &mut bodies {
            seconds.push(body.next().await.unwrap().unwrap());
        }
        for chunks in [&firsts, &seconds] {
            assert_eq!(chunks[0], chunks[1]);
            // The very same bytes: rendered and framed once, not per stream.
            assert_eq!(chunks[0].as_ptr(), chunks[1].as_ptr(), "{chunks:?}");
        }
        assert!(std::str::from_utf8(&seconds[0]).unwrap().starts_with(r#"{"type":"ADDED","object":{"name":"b""#));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_that_falls_behind_is_closed() {
        let (_dir, repo, hub) = local_hub(WatchOptions { capacity: 4, ..WatchOptions::default() }).await;
        repo.create(RecordRef::Namespace("a"), &namespace("a"), "namespace").await.unwrap();
        let mut body = watch_namespaces(&hub, &repo).await;
        let first = body.next().await.unwrap().unwrap();
        assert!(std::str::from_utf8(&first).unwrap().starts_with(r#"{"type":"ADDED","object":{"name":"a""#));

        // Many more changes than the stream may fall behind, while it is not read.
        for i in 0..20 {
            repo.create(RecordRef::Namespace(&format!("n{i:02}")), &namespace(&format!("n{i:02}")), "namespace")
                .await
                .unwrap();
        }
        let feed = hub.feed(&repo.layout().prefix(Collection::Namespaces));
        let last = repo.layout().key(RecordRef::Namespace("n19"));
        kayra_testkit::eventually("the feed to see every write", || async { feed.get(&last).is_some() }).await;
        let rest = tokio::time::timeout(Duration::from_secs(10), body.collect::<Vec<_>>()).await.expect("closed");
        assert!(rest.is_empty(), "a lagging stream ends instead of catching up: {rest:?}");
        assert_eq!(hub.feed_count(), 1);
    }
}
