//! The etcd watch as a stream that never ends.
//!
//! etcd's own watch stream ends whenever the connection drops, and is
//! cancelled by the server when its start revision has been compacted away.
//! Callers of [`crate::Store::watch`] must not have to care (kube's watcher
//! makes the same promise), so [`Watcher`] is a small state machine over
//! one position, `next`, the first revision not yet delivered:
//!
//! - **watching**: a native etcd watch on the prefix from `next`. Events are
//!   delivered in revision order and `next` moves past each response.
//! - **reconnecting**: the stream failed or ended, or the member it is on
//!   failed a health check (a frozen member sends nothing and reports no
//!   error). After a capped exponential back-off a new watch starts from
//!   `next` on the member calls are pinned to now, so nothing is lost and
//!   nothing is delivered twice across a reconnect or a failover.
//! - **re-listing**: etcd answered with `compact_revision`: the history from
//!   `next` is gone. The prefix is read at one revision `r`, a `Put` is
//!   emitted for every key present (at its current `mod_revision`), and
//!   watching resumes from `r + 1`. A consumer that applies puts
//!   idempotently ends up with the latest value of every live key; what it
//!   cannot learn is which keys were deleted during the compacted gap,
//!   which is the documented contract of [`crate::WatchStream`].
//!
//! The stream ends only when the [`super::EtcdStore`] that made it is
//! dropped. Failures are logged (`warn`) and retried inside.
//!
//! [`changes`] is the raw feed under `Store::watcher` (whose state machine
//! does the listing and resuming): one etcd watch on the pinned cluster
//! member, progress requested every [`PROGRESS_INTERVAL`], ended by the
//! first failure or when that member fails a health check (the next feed
//! opens on the member calls moved to).
//!
//! # Progress on etcd 3.4
//! etcd 3.4 answers a progress request with the store's current revision
//! even when events below it are still queued for the stream (a watcher
//! still catching up, or the server's send loop picking the answer before
//! buffered events; fixed in 3.4.25 / 3.5.8). A revision is therefore
//! reported as progress only at the next answer, one interval later, by
//! which time every event at or below it has been sent: the consumer learns
//! "current as of r" a little late, never wrongly.

use std::collections::VecDeque;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions, WatchResponse};
use futures::stream;
use tokio_util::sync::CancellationToken;

use super::cluster::MemberHealth;
use super::{Keyspace, unavailable};
use crate::{Change, ChangeStream, Error, Event, PROGRESS_INTERVAL, Result, Revision, WatchStream};

/// A feed that gets no answer at all for this long has lost its connection.
const STALLED: Duration = Duration::from_secs(3);

/// First and longest wait before re-opening a failed watch.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Starts watching `prefix` from `from` (inclusive). The first watch is
/// opened before returning, so a store that cannot be reached at all (or a
/// user without access) is an error here rather than a silent retry loop.
pub(super) async fn watch(
    keys: Keyspace,
    prefix: &str,
    from: Revision,
    shutdown: CancellationToken,
) -> Result<WatchStream> {
    let (start, end) = keys.range(prefix);
    let mut watcher = Watcher {
        keys,
        start,
        end,
        // etcd reads start revision 0 as "now"; the API means "from the beginning".
        next: from.max(1),
        stream: None,
        member: 0,
        health: None,
        pending: VecDeque::new(),
        backoff: BACKOFF_MIN,
        shutdown,
    };
    watcher.open().await?;
    Ok(Box::pin(stream::unfold(watcher, |mut watcher| async move {
        let event = watcher.next_event().await?;
        Some((event, watcher))
    })))
}

struct Watcher {
    keys: Keyspace,
    /// The etcd key range watched, `[start, end)`.
    start: Vec<u8>,
    end: Vec<u8>,
    /// The first revision not yet delivered (or queued in `pending`).
    next: Revision,
    /// `None` while reconnecting.
    stream: Option<etcd_client::WatchStream>,
    /// The cluster member `stream` is open on, and its health.
    member: usize,
    health: Option<MemberHealth>,
    /// Events received but not yet handed to the consumer.
    pending: VecDeque<Event>,
    backoff: Duration,
    shutdown: CancellationToken,
}

impl Watcher {
    async fn open(&mut self) -> Result<()> {
        let options = WatchOptions::new().with_range(self.end.clone()).with_start_revision(self.next);
        let (stream, member) = self.keys.cluster.watch(self.start.clone(), options).await?;
        (self.stream, self.member, self.health) = (Some(stream), member, Some(self.keys.cluster.health(member)));
        Ok(())
    }

    /// The next event; `None` once the store is gone.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            let shutdown = self.shutdown.clone();
            let stepped = tokio::select! {
                biased;
                () = shutdown.cancelled() => return None,
                stepped = self.step() => stepped,
            };
            if let Err(e) = stepped {
                tracing::warn!(
                    prefix = %String::from_utf8_lossy(&self.start),
                    next = self.next,
                    retry_in = ?self.backoff,
                    error = %e,
                    "etcd watch failed; re-watching from the last delivered revision"
                );
                if self.stream.take().is_some() {
                    self.keys.cluster.stream_failed(self.member);
                }
                tokio::select! {
                    () = self.shutdown.cancelled() => return None,
                    () = tokio::time::sleep(self.backoff) => {}
                }
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// One unit of progress: open a watch, or handle one response.
    async fn step(&mut self) -> Result<()> {
        let (Some(stream), Some(health)) = (self.stream.as_mut(), self.health.as_mut()) else {
            return self.open().await;
        };
        let response = tokio::select! {
            message = stream.message() => message
                .map_err(unavailable)?
                .ok_or_else(|| Error::Unavailable("etcd closed the watch stream".into()))?,
            () = health.went_bad() => {
                return Err(Error::Unavailable("the etcd member of this watch failed its health check".into()));
            }
        };
        if response.compact_revision() > 0 {
            return self.relist(response.compact_revision()).await;
        }
        if response.canceled() {
            return Err(Error::Unavailable(format!("etcd cancelled the watch: {}", response.cancel_reason())));
        }
        self.backoff = BACKOFF_MIN;
        self.queue(&response);
        Ok(())
    }

    fn queue(&mut self, response: &WatchResponse) {
        for event in response.events().iter().filter_map(|e| event_of(&self.keys, e)) {
            self.next = self.next.max(event.revision() + 1);
            self.pending.push_back(event);
        }
    }

    /// The history from `next` was compacted: emit the present state instead.
    async fn relist(&mut self, compacted: Revision) -> Result<()> {
        self.stream = None;
        let (items, revision) = self.keys.snapshot(&self.start, &self.end).await?;
        tracing::warn!(
            prefix = %String::from_utf8_lossy(&self.start),
            from = self.next,
            compacted,
            relisted = items.len(),
            "etcd watch position was compacted; re-listed and resuming after the listing"
        );
        self.pending.extend(items.into_iter().map(Event::Put));
        self.next = revision + 1;
        Ok(())
    }
}

/// Opens the raw change feed of `prefix` from `from` (inclusive).
pub(super) async fn changes(
    keys: Keyspace,
    prefix: &str,
    from: Revision,
    shutdown: CancellationToken,
) -> Result<ChangeStream> {
    let (start, end) = keys.range(prefix);
    let options = WatchOptions::new().with_range(end).with_start_revision(from.max(1));
    let (stream, member) = keys.cluster.watch(start.clone(), options).await?;
    let (requests, responses) = stream.split();
    let mut ticker = tokio::time::interval(PROGRESS_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let health = keys.cluster.health(member);
    let feed = Feed {
        keys,
        member,
        health,
        requests,
        responses,
        ticker,
        shutdown,
        pending: VecDeque::new(),
        delivered: from.max(1) - 1,
        answered: None,
        last_answer: tokio::time::Instant::now(),
        done: false,
    };
    Ok(Box::pin(stream::unfold(feed, |mut feed| async move {
        let item = feed.next_item().await?;
        Some((item, feed))
    })))
}

struct Feed {
    keys: Keyspace,
    /// The cluster member the watch is open on, and its health.
    member: usize,
    health: MemberHealth,
    requests: etcd_client::WatchRequestSender,
    responses: etcd_client::WatchResponseStream,
    ticker: tokio::time::Interval,
    shutdown: CancellationToken,
    pending: VecDeque<Result<Change>>,
    /// The revision of the last event delivered.
    delivered: Revision,
    /// The revision of the last progress answer, reported at the next one.
    answered: Option<Revision>,
    last_answer: tokio::time::Instant,
    done: bool,
}

impl Feed {
    async fn next_item(&mut self) -> Option<Result<Change>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            if self.done {
                return None;
            }
            let shutdown = self.shutdown.clone();
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return None,
                message = self.responses.message() => self.on_message(message),
                () = self.health.went_bad() => {
                    self.fail(Error::Unavailable("the etcd member of this watch failed its health check".into()));
                }
                _ = self.ticker.tick() => {
                    if self.last_answer.elapsed() > STALLED {
                        self.fail(Error::Unavailable(format!("etcd watch answered nothing for {STALLED:?}")));
                    } else if let Err(e) = self.requests.request_progress().await {
                        self.fail(unavailable(e));
                    }
                }
            }
        }
    }

    fn fail(&mut self, e: Error) {
        if matches!(e, Error::Unavailable(_)) {
            // Resume elsewhere: the consumer re-opens on the pinned member.
            self.keys.cluster.stream_failed(self.member);
        }
        self.pending.push_back(Err(e));
        self.done = true;
    }

    fn on_message(&mut self, message: Result<Option<WatchResponse>, etcd_client::Error>) {
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => return self.fail(Error::Unavailable("etcd closed the watch stream".into())),
            Err(e) => return self.fail(unavailable(e)),
        };
        self.last_answer = tokio::time::Instant::now();
        if response.compact_revision() > 0 {
            return self.fail(Error::Compacted(response.compact_revision()));
        }
        if response.canceled() {
            return self.fail(Error::Unavailable(format!("etcd cancelled the watch: {}", response.cancel_reason())));
        }
        if response.created() && response.events().is_empty() {
            return;
        }
        if response.events().is_empty() {
            let revision = response.header().map(|h| h.revision()).unwrap_or_default();
            if let Some(previous) = self.answered.replace(revision) {
                self.pending.push_back(Ok(Change::Progress(previous.max(self.delivered))));
            }
            return;
        }
        for event in response.events().iter().filter_map(|e| event_of(&self.keys, e)) {
            self.delivered = self.delivered.max(event.revision());
            self.pending.push_back(Ok(Change::Event(event)));
        }
    }
}

/// An etcd watch event as a store [`Event`] (`None` for a key outside this
/// store's root or an event without its key-value).
fn event_of(keys: &Keyspace, event: &etcd_client::Event) -> Option<Event> {
    let kv = event.kv()?;
    let key = keys.relative(kv.key())?;
    let revision = kv.mod_revision();
    Some(match event.event_type() {
        EventType::Put => Event::Put(crate::KeyValue {
            key,
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: revision,
        }),
        EventType::Delete => Event::Delete { key, revision },
    })
}
