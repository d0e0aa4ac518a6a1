//! `GET /apiregistrations/{name}/status` (§4.2): every subscriber of one
//! API and the fan-out's counts, answered from the serve's watch-fed
//! [`SubscriberIndex`] after a consistent-read check; with `?watch=true`, a
//! stream of that document (`ADDED`, then a `MODIFIED` whenever it
//! changes, at most every [`COALESCE`]).
//!
//! The stream's object is the whole §4.2 document, the GET's answer: a
//! client renders it with the same code as a poll. Changes are coalesced:
//! during a fan-out of 10,000 subscribers each one's result is a change,
//! and the document is sent at most four times a second, always the newest.
//!
//! **Rollouts.** `held` and each subscriber's `wave` (§4.2, §12) come from
//! the registration's rollout record, read once per report (one key; the
//! stream follows it like its registration) and judged by the same
//! [`RolloutRecord::releases`] the reconcilers use, so a report never
//! disagrees with the fan-out about who waits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kayra_core::rollout::RolloutRecord;
use kayra_core::{ApiRegistration, SubscriptionState};
use kayra_store::Revision;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::extract::{Path, Query};
use super::hub::{Feed, FeedChange, Hub, KeyRange, StreamPermit};
use super::list::{ListQuery, continue_token};
use super::stream::{Framing, Kind, Outbox, WatchCheck, Watcher, frame, streaming};
use super::{ApiState, long_name, registration_not_found};
use crate::cache::subscribers::{Entry, Snapshot, SubscriberIndex};
use crate::repo::{Collection, RecordRef, Repository};

/// A status stream sends its document at most this often.
pub const COALESCE: Duration = Duration::from_millis(250);

/// `GET …/status`'s query (§4.2): one page of the subscribers
/// (`?limit=N&continue=TOKEN`, sorted by namespace), optionally only those
/// of one of the counts (`?category=`); the counts always cover every
/// subscriber. A stream (`?watch=true`) sends that page's document.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatusQuery {
    /// At most this many subscribers; absent or 0 means all.
    pub limit: Option<usize>,
    /// The `continue` of the previous page.
    #[serde(rename = "continue")]
    #[param(rename = "continue")]
    pub continue_token: Option<String>,
    /// Only the subscribers this count counts.
    pub category: Option<Category>,
}

/// One of the §4.2 counts, as a filter of the subscribers shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    Synced,
    Failed,
    Pending,
}

impl Category {
    fn counts(self, entry: &Entry, sync_id: &str) -> bool {
        let synced = entry.is_synced(sync_id);
        match self {
            Category::Synced => synced,
            Category::Failed => !synced && entry.state == SubscriptionState::Error,
            Category::Pending => !synced && entry.state != SubscriptionState::Error,
        }
    }
}

/// The subscribers a report shows: after namespace `after` (from the
/// first when empty), at most `limit` (0: all), of `category` if any.
#[derive(Debug, Clone, Default)]
pub(crate) struct Page {
    after: String,
    limit: usize,
    category: Option<Category>,
}

impl StatusQuery {
    /// The page asked for of `name`'s subscribers (400 for a continue
    /// token of another registration's report).
    pub(crate) fn page(self, name: &str) -> Result<Page, ApiError> {
        let scope = format!("{name}/");
        let list = ListQuery { limit: self.limit, continue_token: self.continue_token };
        let after = list.after(&scope)?.map(|key| key[scope.len()..].to_string()).unwrap_or_default();
        Ok(Page { after, limit: list.limit(), category: self.category })
    }
}

/// `GET /apiregistrations/{name}/status`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RegistrationStatus {
    pub api: String,
    /// The registration's current SyncID: every subscriber's expected one.
    pub sync_id: String,
    /// When `sync_id` last changed (RFC 3339 UTC, milliseconds).
    pub sync_id_updated_at: String,
    /// Sorted by namespace; one page of them with `?limit=`.
    pub subscribers: Vec<Subscriber>,
    /// Pass as `?continue=` for the next page of subscribers; absent when
    /// none remain (so an unpaged report is the §4.2 document as it was).
    /// The counts always cover every subscriber.
    #[serde(rename = "continue", default, skip_serializing_if = "String::is_empty")]
    pub continue_token: String,
    /// `synced + failed + pending`.
    pub total: usize,
    /// How many subscribers are synced.
    pub synced: usize,
    /// Not synced, and the last sync failed (`state: error`).
    pub failed: usize,
    /// Not synced, and not failed: the reconciler has yet to get to them.
    pub pending: usize,
    /// The pending ones a rollout holds back: their wave has not started,
    /// or the rollout is paused or aborted (§12). Never more than `pending`.
    #[serde(default)]
    pub held: usize,
}

/// One subscriber in a [`RegistrationStatus`].
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Subscriber {
    pub namespace: String,
    pub active: bool,
    pub state: SubscriptionState,
    pub current_sync_id: String,
    /// `active && current_sync_id == sync_id`, as on the subscription.
    pub synced: bool,
    /// The name of its wave in the rollout of the current SyncID; `""`
    /// outside a rollout.
    #[serde(default)]
    pub wave: String,
}

impl RegistrationStatus {
    /// The report of `registration` with these subscribers, counted
    /// (outside any rollout: nothing held).
    pub fn new(registration: ApiRegistration, subscribers: Vec<Subscriber>) -> Self {
        let synced = subscribers.iter().filter(|s| s.synced).count();
        let failed = subscribers.iter().filter(|s| !s.synced && s.state == SubscriptionState::Error).count();
        Self {
            api: registration.name,
            sync_id: registration.sync_id,
            sync_id_updated_at: registration.sync_id_updated_at,
            total: subscribers.len(),
            synced,
            failed,
            pending: subscribers.len() - synced - failed,
            held: 0,
            subscribers,
            continue_token: String::new(),
        }
    }

    /// The report of `registration` from the index as it is now: the
    /// counts kept current by the index, what `holds` holds back of them,
    /// and the subscribers of `page`.
    fn of(registration: ApiRegistration, index: &SubscriberIndex, holds: &Holds, page: &Page) -> Self {
        let sync_id = registration.sync_id.as_str();
        let limit = page.limit;
        let take = if limit == 0 { usize::MAX } else { limit.saturating_add(1) };
        // Counts, held and the page of one moment: `held ≤ pending` always.
        let (tally, held, mut subscribers) = index.snapshot(&registration.name, |snapshot| {
            let subscribers: Vec<Subscriber> = snapshot
                .after(&page.after)
                .filter(|(_, e)| page.category.is_none_or(|category| category.counts(e, sync_id)))
                .take(take)
                .map(|(namespace, e)| Subscriber {
                    namespace: namespace.to_string(),
                    active: e.active,
                    state: e.state,
                    current_sync_id: e.current_sync_id.to_string(),
                    synced: e.is_synced(sync_id),
                    wave: holds.wave(namespace),
                })
                .collect();
            (snapshot.tally(sync_id), holds.count(snapshot, sync_id), subscribers)
        });
        let mut next = None;
        if limit > 0 && subscribers.len() > limit {
            subscribers.truncate(limit);
            next = subscribers.last().map(|last| format!("{}/{}", registration.name, last.namespace));
        }
        Self {
            api: registration.name,
            sync_id: registration.sync_id,
            sync_id_updated_at: registration.sync_id_updated_at,
            subscribers,
            continue_token: continue_token(next.as_deref()),
            total: tally.total,
            synced: tally.synced,
            failed: tally.failed,
            pending: tally.pending,
            held,
        }
    }
}

/// What a rollout holds back of one registration's fan-out (§12).
#[derive(Debug, Default)]
enum Holds {
    /// No policy and no rollout of the current SyncID: nothing is held.
    #[default]
    Nothing,
    /// A policy, and the rollout of the current SyncID is not recorded
    /// yet (the reconcilers are about to start it): every subscriber the
    /// ongoing action would move waits for it.
    Starting,
    /// The rollout of the current SyncID (whatever the policy says now: a
    /// rollout keeps the policy it started with).
    Rollout(Arc<RolloutRecord>),
}

/// Whether the ongoing action toward `sync_id` would move `entry`: pending
/// (not synced, not failed), active (not a first sync) and at a SyncID
/// (not a force re-sync). Only such a subscriber can be held.
fn moving(entry: &Entry, sync_id: &str) -> bool {
    entry.active
        && !entry.current_sync_id.is_empty()
        && !entry.is_synced(sync_id)
        && entry.state != SubscriptionState::Error
}

impl Holds {
    /// The holds on `registration`'s fan-out, given its rollout record.
    fn new(registration: &ApiRegistration, record: Option<Arc<RolloutRecord>>) -> Self {
        match record {
            Some(record) if record.rollout.sync_id == registration.sync_id => Holds::Rollout(record),
            _ if registration.rollout.is_some() => Holds::Starting,
            _ => Holds::Nothing,
        }
    }

    /// The name of `namespace`'s wave; `""` outside the rollout.
    fn wave(&self, namespace: &str) -> String {
        match self {
            Holds::Rollout(record) => record
                .wave_of(namespace)
                .and_then(|w| record.rollout.waves.get(w))
                .map(|w| w.name.clone())
                .unwrap_or_default(),
            Holds::Nothing | Holds::Starting => String::new(),
        }
    }

    /// How many of the snapshot's subscribers are held.
    fn count(&self, snapshot: &Snapshot<'_>, sync_id: &str) -> usize {
        match self {
            Holds::Nothing => 0,
            Holds::Starting => snapshot.moving(sync_id),
            Holds::Rollout(record) => record
                .records
                .iter()
                // Whether a wave is released depends on the wave alone:
                // ask for its first subscriber, then count the wave's moving ones.
                .filter(|wave| wave.namespaces.first().is_some_and(|first| !record.releases(first)))
                .flat_map(|wave| &wave.namespaces)
                .filter(|namespace| snapshot.get(namespace).is_some_and(|e| moving(e, sync_id)))
                .count(),
        }
    }
}

/// The rollout record of `api` in `feed` (the rollouts' feed).
fn record_in(feed: &Feed, key: &str) -> Option<(Revision, RolloutRecord)> {
    let record = feed.get(key)?;
    let value = serde_json::from_slice(&record.kv.value)
        .map_err(|e| tracing::warn!(error = %e, key, "an unreadable rollout record"))
        .ok()?;
    Some((record.kv.mod_revision, value))
}

/// This deployment's subscriber index (started with the serve).
fn index_of(hub: &Hub, repo: &Repository) -> SubscriberIndex {
    hub.subscribers(repo.layout())
}

/// Waits until `index` has reached the store's `revision`, or fails closed.
async fn caught_up(index: &SubscriberIndex, repo: &Repository, revision: i64) -> Result<(), ApiError> {
    index.wait_for(revision, repo.store().request_timeout()).await.map_err(|e| {
        tracing::warn!(error = %e, "the subscriber index did not reach the store's revision in time");
        ApiError::unavailable("the subscriber index is not current; retry")
    })
}

/// Every subscriber of the registration and the fan-out's counts.
///
/// With `?watch=true`: an `ADDED` event with this document, then a
/// `MODIFIED` with the whole new document whenever it changes, at most
/// every 250 ms; `DELETED` when the registration is deleted.
#[utoipa::path(get, path = "/apiregistrations/{name}/status", tag = "apiregistrations", params(("name" = String, Path), StatusQuery),
    responses((status = 200, body = RegistrationStatus), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody, description = "the subscriber index could not show it is current")))]
pub(crate) async fn status(
    State(state): State<ApiState>,
    check: Option<Extension<WatchCheck>>,
    Path(name): Path<String>,
    Query(query): Query<StatusQuery>,
) -> Result<Response, ApiError> {
    long_name(&state, &name).await?;
    let index = index_of(&state.hub, &state.repo);
    // One round trip: the registration, and the store's revision now.
    let (registration, revision) =
        state.repo.get_with_revision::<ApiRegistration>(RecordRef::Registration(&name)).await?;
    let registration = registration.ok_or_else(|| registration_not_found(&state, &name))?.value;
    if check.is_some() {
        // A stream's validation: it renders (and waits) itself.
        return Ok(StatusCode::OK.into_response());
    }
    let holds = Holds::new(&registration, state.repo.rollout(&name).await?.map(|r| Arc::new(r.value)));
    let page = query.page(&name)?;
    caught_up(&index, &state.repo, revision).await?;
    // Encoded in one piece: ~1 MB for 10,000 subscribers unpaged.
    let report = RegistrationStatus::of(registration, &index, &holds, &page);
    let body = serde_json::to_vec(&report).map_err(|e| {
        tracing::error!(error = %e, "encode a status report");
        ApiError::internal()
    })?;
    Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response())
}

/// Opens the `?watch=true` stream of `name`'s status for `watcher` (whose
/// right to watch and the route's GET were checked by the caller): the
/// document of `page` (its subscribers as of each render).
pub(crate) async fn open(
    hub: &Hub,
    repo: &Repository,
    params: &HashMap<String, String>,
    page: Page,
    watcher: Watcher,
    framing: Framing,
    permit: StreamPermit,
) -> Result<Response, ApiError> {
    let name = params.get("name").cloned().unwrap_or_default();
    let key = repo.layout().key(RecordRef::Registration(&name));
    let options = hub.options();
    let feed = hub.feed(&repo.layout().prefix(Collection::Registrations));
    let rollouts = hub.feed(&repo.layout().prefix(Collection::Rollouts));
    let rollout_key = repo.layout().key(RecordRef::Rollout(&name));
    if !feed.wait_ready(options.ready_timeout).await || !rollouts.wait_ready(options.ready_timeout).await {
        return Err(ApiError::unavailable("the watch could not list its objects in time; retry"));
    }
    let index = index_of(hub, repo);
    // Subscribed before the consistent-read check: nothing after it is missed.
    let changes = index.changes();
    let (registrations, _) = feed.subscribe(&KeyRange::Exact(key.clone()));
    let (rollout_changes, _) = rollouts.subscribe(&KeyRange::Exact(rollout_key.clone()));
    let revision = repo.store().revision().await.map_err(crate::repo::Error::from)?;
    caught_up(&index, repo, revision).await?;
    // Read-your-writes (§17) for the registration's own record too.
    if !feed.wait_for(revision, options.ready_timeout).await
        || !rollouts.wait_for(revision, options.ready_timeout).await
    {
        return Err(ApiError::unavailable("the watch could not catch up with the store in time; retry"));
    }
    let now = Instant::now();
    let mut stream = Stream {
        key,
        feed,
        registrations,
        rollouts,
        rollout_key,
        rollout_changes,
        rollout: None,
        index,
        changes,
        page,
        sent: None,
        dirty: false,
        outbox: Outbox::new(framing, repo.clone(), watcher, options, hub.stopping()),
        last_render: now,
        _permit: permit,
    };
    stream.render();
    let body = Body::from_stream(futures::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), stream))
    }));
    Ok(streaming(framing, body))
}

/// One open status stream.
struct Stream {
    /// The registration's store key.
    key: String,
    feed: Arc<Feed>,
    registrations: broadcast::Receiver<FeedChange>,
    /// The rollouts' feed, and the key of this registration's rollout.
    rollouts: Arc<Feed>,
    rollout_key: String,
    rollout_changes: broadcast::Receiver<FeedChange>,
    /// The rollout record last read, by its revision: decoded once per write.
    rollout: Option<(Revision, Arc<RolloutRecord>)>,
    index: SubscriberIndex,
    changes: watch::Receiver<u64>,
    /// The subscribers the document shows.
    page: Page,
    /// The document last sent: what a render is compared with, and what a
    /// `DELETED` carries.
    sent: Option<String>,
    /// Something changed since the last render.
    dirty: bool,
    outbox: Outbox,
    last_render: Instant,
    /// Its place under the stream caps, for as long as it is open.
    _permit: StreamPermit,
}

impl Stream {
    /// The registration's rollout record now (decoded again only when it
    /// was written).
    fn record(&mut self) -> Option<Arc<RolloutRecord>> {
        let revision = self.rollouts.get(&self.rollout_key).map(|r| r.kv.mod_revision);
        if self.rollout.as_ref().map(|(at, _)| *at) != revision {
            self.rollout = record_in(&self.rollouts, &self.rollout_key).map(|(at, r)| (at, Arc::new(r)));
        }
        self.rollout.as_ref().map(|(_, r)| Arc::clone(r))
    }

    /// The next bytes to send; `None` ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if let Some(chunk) = self.outbox.pop() {
                return Some(chunk);
            }
            let render_at = self.last_render + COALESCE;
            tokio::select! {
                alive = self.outbox.housekeeping() => if !alive { return None },
                change = self.registrations.recv() => match change {
                    Ok(change) => self.dirty |= *change.key == *self.key,
                    // Missed announcements only mean "render again".
                    Err(RecvError::Lagged(_)) => self.dirty = true,
                    Err(RecvError::Closed) => return None,
                },
                change = self.rollout_changes.recv() => match change {
                    Ok(change) => self.dirty |= *change.key == *self.rollout_key,
                    Err(RecvError::Lagged(_)) => self.dirty = true,
                    Err(RecvError::Closed) => return None,
                },
                changed = self.changes.changed() => match changed {
                    Ok(()) => self.dirty = true,
                    Err(_) => return None,
                },
                () = tokio::time::sleep_until(render_at), if self.dirty => self.render(),
            }
        }
    }

    /// Renders the document as it is now and queues the event that tells
    /// the client, if it differs from what was sent.
    fn render(&mut self) {
        self.dirty = false;
        self.last_render = Instant::now();
        let registration = self
            .feed
            .get(&self.key)
            .and_then(|record| serde_json::from_slice::<ApiRegistration>(&record.kv.value).ok());
        let holds = registration.as_ref().map(|r| Holds::new(r, self.record())).unwrap_or_default();
        let document = registration
            .map(|r| RegistrationStatus::of(r, &self.index, &holds, &self.page))
            .and_then(|status| serde_json::to_string(&status).ok());
        let framing = self.outbox.framing();
        let event = match (document, self.sent.take()) {
            (Some(document), None) => Some((frame(Kind::Added, &document, framing), Some(document))),
            (Some(document), Some(previous)) if previous != document => {
                Some((frame(Kind::Modified, &document, framing), Some(document)))
            }
            (None, Some(previous)) => Some((frame(Kind::Deleted, &previous, framing), None)),
            (document, _) => {
                self.sent = document;
                None
            }
        };
        if let Some((event, sent)) = event {
            self.outbox.push(event);
            self.sent = sent;
        }
    }
}
