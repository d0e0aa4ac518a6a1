//! The etcd change feed ([`crate::Backend::changes`]): one native etcd
//! watch on the pinned cluster member, progress requested every
//! [`PROGRESS_INTERVAL`], ended by the first failure — a lost or stalled
//! stream, a member that fails a health check (a frozen member sends
//! nothing and reports no error; the next feed opens on the member calls
//! moved to), or `Compacted` when etcd answers with `compact_revision`.
//! Resuming from the last delivered revision and re-listing after a
//! compaction are `Store::watcher`'s (`crate::watcher`), written once for
//! every backend.
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
use crate::{Change, ChangeStream, Error, Event, PROGRESS_INTERVAL, Result, Revision};

/// A feed that gets no answer at all for this long has lost its connection.
const STALLED: Duration = Duration::from_secs(3);

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
