//! The watch hub: one store watch per key prefix per `kayra serve`, fanned
//! out to every watch stream a client opens (§4.5).
//!
//! A [`Feed`] mirrors one prefix of the store — a map of key → record, kept
//! current by a single store watcher — and announces which key changed on a
//! tokio broadcast channel. Streams do not get values from the channel:
//! they re-read the key from the feed's map, so a stream always renders the
//! present state (level-triggered, as kube-runtime's reflector), can never
//! go back in time, and a re-list (compaction, a trimmed change log, a lost
//! connection) needs no special case downstream: the feed diffs the
//! re-listed state against its map and announces exactly the keys whose
//! record was added, changed or removed.
//!
//! A stream that falls more than [`WatchOptions::capacity`] announcements
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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kayra_store::{KeyValue, Revision, Store, WatcherEvent};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::watch::Rendered;
use crate::cache::subscribers::SubscriberIndex;

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

/// The process's feeds, by prefix. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    options: WatchOptions,
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    /// The `/status` reports' subscriber indexes, by subscriptions prefix.
    subscribers: Mutex<HashMap<String, SubscriberIndex>>,
    shutdown: CancellationToken,
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
                subscribers: Mutex::new(HashMap::new()),
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

    /// How many store watches this hub holds: one per prefix in use.
    pub fn feed_count(&self) -> usize {
        self.inner.feeds.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The feed of `prefix`, started on first use.
    pub(crate) fn feed(&self, prefix: &str) -> Arc<Feed> {
        let mut feeds = self.inner.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(feed) = feeds.get(prefix) {
            return feed.clone();
        }
        let (announce, _) = broadcast::channel(self.inner.options.capacity);
        let (ready, _) = watch::channel(false);
        let feed = Arc::new(Feed { state: Mutex::new(BTreeMap::new()), announce, ready });
        feeds.insert(prefix.to_string(), feed.clone());
        let events = self.inner.store.watcher(prefix);
        tokio::spawn(feed.clone().run(events, self.inner.shutdown.clone(), prefix.to_string()));
        feed
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

/// One prefix of the store, mirrored.
pub(crate) struct Feed {
    /// Every record under the prefix, as of the last event applied.
    state: Mutex<BTreeMap<String, Arc<Record>>>,
    /// The key that changed. Sent while `state` is locked, so a subscriber
    /// that reads `state` and subscribes under the same lock misses nothing.
    announce: broadcast::Sender<Arc<str>>,
    /// True once the first listing is in.
    ready: watch::Sender<bool>,
}

impl Feed {
    /// Waits for the first listing (false on timeout or shutdown).
    pub(crate) async fn wait_ready(&self, timeout: Duration) -> bool {
        let mut ready = self.ready.subscribe();
        matches!(tokio::time::timeout(timeout, ready.wait_for(|r| *r)).await, Ok(Ok(_)))
    }

    /// Subscribes to announcements, and reads under the same lock the keys
    /// of `range` present now: what a new stream starts from.
    pub(crate) fn subscribe(&self, range: &KeyRange) -> (broadcast::Receiver<Arc<str>>, Vec<Arc<Record>>) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let present = range.select(&state).cloned().collect();
        (self.announce.subscribe(), present)
    }

    /// The record at `key` now.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Record>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    async fn run(
        self: Arc<Self>,
        mut events: BoxStream<'static, WatcherEvent>,
        stop: CancellationToken,
        prefix: String,
    ) {
        // A re-list in progress: the records listed so far.
        let mut listing: Option<BTreeMap<String, Arc<Record>>> = None;
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => event,
            };
            let Some(event) = event else { return };
            match event {
                WatcherEvent::Init => listing = Some(BTreeMap::new()),
                WatcherEvent::InitApply(kv) => {
                    listing.get_or_insert_with(BTreeMap::new).insert(kv.key.clone(), Arc::new(Record::new(kv)));
                }
                WatcherEvent::InitDone { revision } => {
                    let listed = listing.take().unwrap_or_default();
                    let changed = self.replace(listed);
                    tracing::debug!(prefix, revision, changed, "watch feed listed");
                    self.ready.send_replace(true);
                }
                WatcherEvent::Apply(kv) => self.apply(kv),
                WatcherEvent::Delete { key, revision } => self.delete(&key, revision),
                WatcherEvent::Progress { .. } => {}
            }
        }
    }

    /// Replaces the whole map with a listing, announcing every key whose
    /// record appeared, changed or vanished. Returns how many did.
    fn replace(&self, listed: BTreeMap<String, Arc<Record>>) -> usize {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed: Vec<String> = state.keys().filter(|k| !listed.contains_key(*k)).cloned().collect();
        changed.extend(
            listed
                .iter()
                .filter(|(k, r)| state.get(*k).is_none_or(|old| old.kv.mod_revision != r.kv.mod_revision))
                .map(|(k, _)| k.clone()),
        );
        *state = listed;
        for key in &changed {
            let _ = self.announce.send(Arc::from(key.as_str()));
        }
        changed.len()
    }

    fn apply(&self, kv: KeyValue) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // A replayed event (the same write seen twice across a re-watch) changes nothing.
        if state.get(&kv.key).is_some_and(|old| old.kv.mod_revision >= kv.mod_revision) {
            return;
        }
        let key: Arc<str> = Arc::from(kv.key.as_str());
        state.insert(kv.key.clone(), Arc::new(Record::new(kv)));
        let _ = self.announce.send(key);
    }

    fn delete(&self, key: &str, revision: Revision) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.get(key).is_some_and(|old| old.kv.mod_revision < revision) {
            state.remove(key);
            let _ = self.announce.send(Arc::from(key));
        }
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
    use super::*;

    fn kv(key: &str, rev: Revision) -> KeyValue {
        KeyValue { key: key.into(), value: b"{}".to_vec(), create_revision: 1, mod_revision: rev }
    }

    fn feed() -> Feed {
        let (announce, _) = broadcast::channel(64);
        let (ready, _) = watch::channel(false);
        Feed { state: Mutex::new(BTreeMap::new()), announce, ready }
    }

    fn drain(rx: &mut broadcast::Receiver<Arc<str>>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(key) = rx.try_recv() {
            out.push(key.to_string());
        }
        out
    }

    #[test]
    fn replays_are_ignored_and_relists_announce_only_differences() {
        let feed = feed();
        let (mut rx, present) = feed.subscribe(&KeyRange::Prefix("/a/".into()));
        assert!(present.is_empty());
        feed.apply(kv("/a/1", 2));
        feed.apply(kv("/a/2", 3));
        feed.apply(kv("/a/1", 2)); // replayed
        feed.delete("/a/3", 4); // never seen
        assert_eq!(drain(&mut rx), ["/a/1", "/a/2"]);
        // A re-list: /a/1 unchanged, /a/2 changed, /a/3 new, and a delete of
        // /a/4 that was missed entirely is not noticed (never seen).
        let mut listed = BTreeMap::new();
        for kv in [kv("/a/1", 2), kv("/a/2", 7), kv("/a/3", 6)] {
            listed.insert(kv.key.clone(), Arc::new(Record::new(kv)));
        }
        assert_eq!(feed.replace(listed), 2);
        assert_eq!(drain(&mut rx), ["/a/2", "/a/3"]);
        // A re-list that lacks /a/1: its delete was missed.
        let mut listed = BTreeMap::new();
        for kv in [kv("/a/2", 7), kv("/a/3", 6)] {
            listed.insert(kv.key.clone(), Arc::new(Record::new(kv)));
        }
        assert_eq!(feed.replace(listed), 1);
        assert_eq!(drain(&mut rx), ["/a/1"]);
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
