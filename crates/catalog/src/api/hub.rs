//! The watch hub: one store watch per key prefix per `kayra serve`, fanned
//! out to every watch stream a client opens (§4.5).
//!
//! A [`Feed`] mirrors one prefix of the store: an announcing
//! [`Reflector`] of its records, kept current by a single store watcher.
//! Each change comes to the streams with the record **as of that change**
//! ([`kayra_store::reflector::Change`]), never re-read later: a stream
//! shows every transition of an object (a subscription's `init`, then its
//! `error`), in order, even when the store delivered both in one poll. A
//! re-list (compaction, a trimmed change log, a lost connection) needs no
//! special case downstream: the reflector diffs the re-listed state
//! against its map and announces exactly the records added, changed or
//! removed.
//!
//! A stream that falls more than [`WatchOptions::capacity`] changes
//! behind is closed (the client reconnects and gets a fresh initial state)
//! rather than allowed to buffer without bound.
//!
//! Each record carries what streams rendered of it ([`Record::rendered`]):
//! the first stream to show a change renders and frames it, every other
//! stream shares those bytes, so an event costs one JSON decode and encode
//! per feed rather than one per stream.
//!
//! Feeds start on first use and run until [`Hub::shutdown`].

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use kayra_store::reflector::{Change, Reflector};
use kayra_store::{KeyValue, Revision, Store};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::stream::{Rendered, WatchOptions};
use crate::cache::subscribers::SubscriberIndex;

/// The process's feeds, by prefix. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    options: WatchOptions,
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    /// Feeds of one stream each ([`Hub::private_feed`]), while they live.
    private: Mutex<Vec<Weak<Feed>>>,
    /// The `/status` reports' subscriber indexes, by subscriptions prefix.
    subscribers: Mutex<HashMap<String, SubscriberIndex>>,
    /// Open streams against their caps (§17).
    gate: Mutex<Gate>,
    shutdown: CancellationToken,
}

/// Open streams by user and in all, and the caps of §17
/// (`server.max_streams_per_user`, `server.max_streams`).
#[derive(Debug)]
struct Gate {
    by_user: HashMap<String, usize>,
    total: usize,
    max_streams: usize,
    max_per_user: usize,
}

/// Why a stream was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The user holds `server.max_streams_per_user` streams already.
    User(usize),
    /// The server holds `server.max_streams` streams already.
    All(usize),
}

/// One open stream's place under the caps, given back when dropped
/// (however the stream ends).
pub(crate) struct StreamPermit {
    hub: Arc<Inner>,
    user: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut gate = self.hub.gate.lock().unwrap_or_else(|p| p.into_inner());
        gate.total = gate.total.saturating_sub(1);
        if let Some(held) = gate.by_user.get_mut(&self.user) {
            *held -= 1;
            if *held == 0 {
                gate.by_user.remove(&self.user);
            }
        }
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("options", &self.inner.options).finish_non_exhaustive()
    }
}

impl Hub {
    pub fn new(store: Store, options: WatchOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                options,
                feeds: Mutex::new(HashMap::new()),
                private: Mutex::new(Vec::new()),
                subscribers: Mutex::new(HashMap::new()),
                gate: Mutex::new(Gate {
                    by_user: HashMap::new(),
                    total: 0,
                    max_streams: kayra_config::ServerConfig::default().max_streams,
                    max_per_user: kayra_config::ServerConfig::default().max_streams_per_user,
                }),
                shutdown: CancellationToken::new(),
            }),
        }
    }

    pub fn options(&self) -> WatchOptions {
        self.inner.options
    }

    /// Ends every feed and every stream (at server shutdown, so open
    /// streams do not hold the graceful drain open).
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    pub(crate) fn stopping(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Caps open streams at `max_streams` in all and `max_per_user` per
    /// user (§17; `kayra serve` sets them from `server.*`).
    pub fn set_stream_caps(&self, max_streams: usize, max_per_user: usize) {
        let mut gate = self.inner.gate.lock().unwrap_or_else(|p| p.into_inner());
        (gate.max_streams, gate.max_per_user) = (max_streams.max(1), max_per_user.max(1));
    }

    /// Admits one more stream of `user`, or says which cap it would pass.
    pub(crate) fn admit(&self, user: &str) -> Result<StreamPermit, Refused> {
        let mut gate = self.inner.gate.lock().unwrap_or_else(|p| p.into_inner());
        let held = gate.by_user.get(user).copied().unwrap_or(0);
        if held >= gate.max_per_user {
            return Err(Refused::User(gate.max_per_user));
        }
        if gate.total >= gate.max_streams {
            return Err(Refused::All(gate.max_streams));
        }
        gate.total += 1;
        *gate.by_user.entry(user.to_string()).or_insert(0) += 1;
        Ok(StreamPermit { hub: self.inner.clone(), user: user.to_string() })
    }

    /// How many streams are open.
    pub fn stream_count(&self) -> usize {
        self.inner.gate.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// How many store watches this hub holds: one per prefix in use.
    pub fn feed_count(&self) -> usize {
        self.inner.feeds.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The feed of `prefix`, started on first use and shared by every
    /// stream of that prefix until [`Hub::shutdown`].
    pub(crate) fn feed(&self, prefix: &str) -> Arc<Feed> {
        let mut feeds = self.inner.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(feed) = feeds.get(prefix) {
            return feed.clone();
        }
        let feed = Arc::new(Feed::new(self.inner.options.capacity));
        feeds.insert(prefix.to_string(), feed.clone());
        self.start(prefix, &feed, self.inner.shutdown.clone());
        feed
    }

    /// A feed of `prefix` for one stream, stopped (its store watch closed,
    /// its records dropped) when the returned guard is: for prefixes of
    /// which the process may see very many, each watched rarely and
    /// briefly (one subscription's runs), where a shared feed kept for the
    /// process's life would end up holding them all (§17).
    pub(crate) fn private_feed(&self, prefix: &str) -> (Arc<Feed>, DropGuard) {
        let feed = Arc::new(Feed::new(self.inner.options.capacity));
        let stop = self.inner.shutdown.child_token();
        self.start(prefix, &feed, stop.clone());
        let mut private = self.inner.private.lock().unwrap_or_else(|p| p.into_inner());
        private.retain(|feed| feed.strong_count() > 0);
        private.push(Arc::downgrade(&feed));
        (feed, stop.drop_guard())
    }

    /// Runs `feed`'s reflector over a watch of `prefix` until `stop`.
    fn start(&self, prefix: &str, feed: &Feed, stop: CancellationToken) {
        let events = self.inner.store.watcher(prefix);
        let reflector = feed.records.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = reflector.run(events) => {}
            }
        });
    }

    /// How many records this hub's feeds hold now, shared and private.
    pub fn held_records(&self) -> usize {
        let shared: usize =
            self.inner.feeds.lock().unwrap_or_else(|p| p.into_inner()).values().map(|f| f.records.len()).sum();
        let private = self.inner.private.lock().unwrap_or_else(|p| p.into_inner());
        shared + private.iter().filter_map(Weak::upgrade).map(|f| f.records.len()).sum::<usize>()
    }
}

impl Hub {
    /// The subscriber index of `layout`'s deployment, started on first use
    /// (`kayra serve` starts it at startup) and kept until [`Hub::shutdown`].
    pub fn subscribers(&self, layout: &crate::repo::Layout) -> SubscriberIndex {
        let prefix = &layout.prefix(crate::repo::Collection::Subscriptions);
        let mut indexes = self.inner.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        let start = || SubscriberIndex::start(self.inner.store.watcher(prefix), layout, self.inner.shutdown.clone());
        indexes.entry(prefix.to_string()).or_insert_with(start).clone()
    }
}

/// One record of a feed, with its rendering shared by every stream.
pub(crate) struct Record {
    pub(crate) kv: KeyValue,
    /// The object rendered from `kv` (`None`: not one a stream shows), and
    /// the revision of the record the rendering also read (a
    /// subscription's registration; 0 for none).
    rendered: Mutex<Option<(Revision, Option<Arc<Rendered>>)>>,
}

impl Record {
    pub(crate) fn new(kv: KeyValue) -> Self {
        Self { kv, rendered: Mutex::new(None) }
    }

    /// The rendering of this record against the dependency at `dependency`
    /// (its revision), made by `render` when none is cached for it. A
    /// feed's records are always rendered by the same view, so the cache
    /// needs no other key.
    pub(crate) fn rendered(
        &self,
        dependency: Revision,
        render: impl FnOnce(&KeyValue) -> Option<Rendered>,
    ) -> Option<Arc<Rendered>> {
        let mut cached = self.rendered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((revision, rendered)) = cached.as_ref()
            && *revision == dependency
        {
            return rendered.clone();
        }
        let rendered = render(&self.kv).map(Arc::new);
        *cached = Some((dependency, rendered.clone()));
        rendered
    }
}

/// A change of a feed: a record as of its revision, or its removal.
pub(crate) type FeedChange = Change<Arc<Record>>;

/// One prefix of the store, mirrored.
pub(crate) struct Feed {
    /// Every record under the prefix, announcing each change.
    records: Reflector<Arc<Record>>,
}

impl Feed {
    fn new(capacity: usize) -> Self {
        let records = Reflector::announcing(
            |kv: &KeyValue| Ok(Arc::new(Record::new(kv.clone()))),
            capacity,
            // One write, one record: a re-listed key at the same revision is unchanged.
            |a: &Arc<Record>, b: &Arc<Record>| a.kv.mod_revision == b.kv.mod_revision,
        );
        Self { records }
    }

    /// Waits for the first listing (false on timeout).
    pub(crate) async fn wait_ready(&self, timeout: Duration) -> bool {
        self.records.wait_synced(timeout).await
    }

    /// Waits until the feed holds every change up to `revision` (false on
    /// timeout): a stream that starts then shows every write acknowledged
    /// before it opened (§17).
    pub(crate) async fn wait_for(&self, revision: Revision, timeout: Duration) -> bool {
        self.records.wait_for(revision, timeout).await.is_ok()
    }

    /// Subscribes to changes, and reads under the same lock the records of
    /// `range` present now: what a new stream starts from.
    pub(crate) fn subscribe(&self, range: &KeyRange) -> (broadcast::Receiver<FeedChange>, Vec<Arc<Record>>) {
        self.records.subscribe(|map| range.select(map).cloned().collect())
    }

    /// The record at `key` now.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Record>> {
        self.records.get(key)
    }
}

/// The keys a stream is about: everything under a prefix, or one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyRange {
    Prefix(String),
    Exact(String),
}

impl KeyRange {
    pub(crate) fn contains(&self, key: &str) -> bool {
        match self {
            KeyRange::Prefix(prefix) => key.starts_with(prefix.as_str()),
            KeyRange::Exact(exact) => key == exact,
        }
    }

    fn select<'m>(&self, map: &'m BTreeMap<String, Arc<Record>>) -> impl Iterator<Item = &'m Arc<Record>> + 'm {
        let (start, prefix) = match self {
            KeyRange::Prefix(p) | KeyRange::Exact(p) => (p.clone(), self.clone()),
        };
        map.range::<String, _>((Bound::Included(start), Bound::Unbounded))
            .take_while(move |(k, _)| match &prefix {
                KeyRange::Prefix(p) => k.starts_with(p.as_str()),
                KeyRange::Exact(e) => *k == e,
            })
            .map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use kayra_store::WatcherEvent;

    use super::*;

    fn kv(key: &str, rev: Revision) -> KeyValue {
        KeyValue { key: key.into(), value: b"{}".to_vec(), create_revision: 1, mod_revision: rev }
    }

    fn drain(rx: &mut broadcast::Receiver<FeedChange>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(change) = rx.try_recv() {
            let revision = change.value.map_or(0, |record| record.kv.mod_revision);
            out.push(format!("{}@{revision}", change.key));
        }
        out
    }

    #[test]
    fn changes_carry_their_record_and_relists_announce_only_differences() {
        let feed = Feed::new(64);
        let apply = |event| feed.records.apply(event);
        apply(WatcherEvent::Init);
        apply(WatcherEvent::InitDone { revision: 1 });
        let (mut rx, present) = feed.subscribe(&KeyRange::Prefix("/a/".into()));
        assert!(present.is_empty());
        apply(WatcherEvent::Apply(kv("/a/1", 2)));
        apply(WatcherEvent::Apply(kv("/a/2", 3)));
        apply(WatcherEvent::Apply(kv("/a/1", 4)));
        apply(WatcherEvent::Delete { key: "/a/3".into(), revision: 5 }); // never seen
        assert_eq!(drain(&mut rx), ["/a/1@2", "/a/2@3", "/a/1@4"]);
        // A re-list: /a/1 unchanged, /a/2 changed, /a/3 new.
        apply(WatcherEvent::Init);
        for kv in [kv("/a/1", 4), kv("/a/2", 7), kv("/a/3", 6)] {
            apply(WatcherEvent::InitApply(kv));
        }
        apply(WatcherEvent::InitDone { revision: 8 });
        assert_eq!(drain(&mut rx), ["/a/2@7", "/a/3@6"]);
        // A re-list that lacks /a/1: its delete was missed.
        apply(WatcherEvent::Init);
        for kv in [kv("/a/2", 7), kv("/a/3", 6)] {
            apply(WatcherEvent::InitApply(kv));
        }
        apply(WatcherEvent::InitDone { revision: 9 });
        assert_eq!(drain(&mut rx), ["/a/1@0"]);
        assert!(feed.get("/a/1").is_none());
    }

    #[test]
    fn defaults_keep_the_contract() {
        let options = WatchOptions::default();
        // §4.5: a keep-alive after at most 15 s of silence; a revoked
        // stream closed within 1 s, re-check latency included.
        assert!(options.keep_alive <= Duration::from_secs(15));
        assert!(options.recheck <= Duration::from_millis(500));
        assert!(options.capacity >= 1024);
    }

    #[test]
    fn key_ranges_select_their_keys_only() {
        let mut map = BTreeMap::new();
        for key in ["/a/", "/a/x", "/a/x/1", "/a/xy", "/b/x"] {
            map.insert(key.to_string(), Arc::new(Record::new(kv(key, 1))));
        }
        let keys = |range: KeyRange| range.select(&map).map(|r| r.kv.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(KeyRange::Prefix("/a/x/".into())), ["/a/x/1"]);
        assert_eq!(keys(KeyRange::Prefix("/a/".into())), ["/a/", "/a/x", "/a/x/1", "/a/xy"]);
        assert_eq!(keys(KeyRange::Exact("/a/x".into())), ["/a/x"]);
        assert!(KeyRange::Exact("/a/x".into()).contains("/a/x") && !KeyRange::Exact("/a/x".into()).contains("/a/xy"));
    }
}
