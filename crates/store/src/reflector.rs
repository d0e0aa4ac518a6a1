//! The one reflector of kayra: a watcher's events turned into whole lists
//! and decoded changes ([`Reflect`]), and a typed, read-only map kept
//! current from them ([`Reflector`], kube-runtime's `reflector::store`).
//!
//! Every consumer of a [`crate::Store::watcher`] stands on this file: the
//! serve caches and the `/status` subscriber index are [`Reflector`]s, the
//! watch hub's feeds are [`Reflector`]s that announce their changes
//! ([`Reflector::announcing`]), and the reconciler, whose view keeps
//! indexes of its own, reads [`Reflected`] items from [`reflect`]. So "buffer
//! a list until `InitDone`, then replace" is written once, here.
//!
//! # Lists and changes
//! A (re-)list (`Init`, `InitApply`…, `InitDone`) is decoded record by
//! record as it arrives (a large list is never held raw and decoded at
//! once) and comes out whole, as one [`Reflected::Listed`]: the consumer
//! replaces everything, so a key deleted while the watch was lost
//! (compaction, a trimmed change log) disappears. `Progress` during a
//! re-list confirms nothing: the map being rebuilt is not the one readers
//! see. A value that does not decode is logged and comes out as a change
//! to "unreadable" (`value: None`): a record kayra cannot read grants
//! nothing.
//!
//! # The map
//! [`Reflector`] keeps one map of decoded values by key and three facts
//! readers decide with:
//!
//! - **the revision it has reached**: every change up to it is in the map.
//!   [`Reflector::wait_for`] waits until a revision is reached — how a
//!   process reads its own writes, or serves a read consistent with the
//!   store's current revision.
//! - **when it was last confirmed current**: the time of the newest event,
//!   `Progress` or `InitDone`. A map nobody has confirmed for a while may
//!   be missing deletes; callers compare [`Reflector::confirmed_at`] with
//!   their deadline and fail closed.
//! - **whether it was ever synced**: before the first `InitDone` the map
//!   is empty, not "nothing exists".
//!
//! An announcing reflector also broadcasts every change of its map as a
//! [`Change`] carrying the value **as of that change's revision**, never
//! one read later: a subscriber sees every transition of a key, in order
//! (a create and an update that arrive in one poll are two changes). A
//! re-list announces exactly the keys whose value it added, changed or
//! removed.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::{KeyValue, Revision, WatcherEvent};

/// Turns a stored value into the reflector's type, or says why not.
pub type Decode<T> = dyn Fn(&KeyValue) -> Result<T, String> + Send + Sync;

/// One decoded record of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item<T> {
    pub key: String,
    pub value: T,
    /// The revision of the record's last write.
    pub revision: Revision,
}

/// Where a list's decoded records gather until `InitDone` (see
/// [`Reflect`]): a `Vec` of [`Item`]s by default; a consumer that keeps
/// indexes of its own can gather straight into them ([`reflect_into`]), so
/// that a list is never held twice, once as items and once as its index.
pub trait Gather<T>: Default + Send {
    /// One record of the list, in the order the list came.
    fn gather(&mut self, item: Item<T>);
    /// The list is complete.
    fn finish(&mut self) {}
}

impl<T: Send> Gather<T> for Vec<Item<T>> {
    fn gather(&mut self, item: Item<T>) {
        self.push(item);
    }

    /// Lists come sorted; a watcher that did not sort is not trusted to have.
    fn finish(&mut self) {
        if !self.is_sorted_by(|a, b| a.key <= b.key) {
            self.sort_by(|a, b| a.key.cmp(&b.key));
        }
    }
}

/// What a watcher's events come to (see [`Reflect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reflected<T, L = Vec<Item<T>>> {
    /// A complete (re-)list at `revision`: replace everything with `items`
    /// (by default a `Vec` sorted by key; unreadable records left out).
    Listed { items: L, revision: Revision },
    /// `key` was written at `revision`; `None`: the value does not decode
    /// (already logged).
    Applied { key: String, value: Option<T>, revision: Revision },
    /// `key` was deleted at `revision`.
    Deleted { key: String, revision: Revision },
    /// Nothing changed up to `revision`: what was delivered is current.
    Progress { revision: Revision },
}

/// Assembles a watcher's events into [`Reflected`] items: buffers a list,
/// decoding each record as it arrives, and hands it out whole at
/// `InitDone`. The writer side of every consumer of a watcher.
pub struct Reflect<T, L = Vec<Item<T>>> {
    decode: Box<Decode<T>>,
    /// A (re-)list in progress: the records decoded so far.
    listing: Option<L>,
}

impl<T: Send> Reflect<T> {
    pub fn new(decode: impl Fn(&KeyValue) -> Result<T, String> + Send + Sync + 'static) -> Self {
        Self::gathering(decode)
    }
}

impl<T, L: Gather<T>> Reflect<T, L> {
    /// A reflect whose lists gather into `L` (see [`Gather`]).
    pub fn gathering(decode: impl Fn(&KeyValue) -> Result<T, String> + Send + Sync + 'static) -> Self {
        Self { decode: Box::new(decode), listing: None }
    }

    /// Whether a list is being gathered (between `Init` and `InitDone`).
    pub fn listing(&self) -> bool {
        self.listing.is_some()
    }

    /// Feeds one watcher event; `None` while a list is being gathered.
    pub fn feed(&mut self, event: WatcherEvent) -> Option<Reflected<T, L>> {
        match event {
            WatcherEvent::Init => {
                // Also what a list that failed half-way and starts over
                // sends: what it gathered so far is dropped.
                self.listing = Some(L::default());
                None
            }
            WatcherEvent::InitApply(kv) => {
                let value = self.decoded(&kv);
                // An `InitApply` outside a list is a watcher bug; start
                // one rather than mixing it into the live view.
                let listing = self.listing.get_or_insert_with(L::default);
                if let Some(value) = value {
                    listing.gather(Item { key: kv.key, value, revision: kv.mod_revision });
                }
                None
            }
            WatcherEvent::InitDone { revision } => {
                let mut items = self.listing.take().unwrap_or_default();
                items.finish();
                Some(Reflected::Listed { items, revision })
            }
            WatcherEvent::Apply(kv) => {
                let value = self.decoded(&kv);
                Some(Reflected::Applied { key: kv.key, value, revision: kv.mod_revision })
            }
            WatcherEvent::Delete { key, revision } => Some(Reflected::Deleted { key, revision }),
            WatcherEvent::Progress { revision } => self.listing.is_none().then_some(Reflected::Progress { revision }),
        }
    }

    fn decoded(&self, kv: &KeyValue) -> Option<T> {
        match (self.decode)(kv) {
            Ok(value) => Some(value),
            Err(message) => {
                tracing::warn!(key = %kv.key, %message, "stored record does not decode; leaving it out");
                None
            }
        }
    }
}

/// A watcher's events as [`Reflected`] items (see [`Reflect`]).
pub fn reflect<T: Send + 'static>(
    events: impl Stream<Item = WatcherEvent> + Send + 'static,
    decode: impl Fn(&KeyValue) -> Result<T, String> + Send + Sync + 'static,
) -> futures::stream::BoxStream<'static, Reflected<T>> {
    let mut reflect = Reflect::new(decode);
    events.filter_map(move |event| std::future::ready(reflect.feed(event))).boxed()
}

/// [`reflect`], gathering each list into `L` (see [`Gather`]).
pub fn reflect_into<T: Send + 'static, L: Gather<T> + 'static>(
    events: impl Stream<Item = WatcherEvent> + Send + 'static,
    decode: impl Fn(&KeyValue) -> Result<T, String> + Send + Sync + 'static,
) -> futures::stream::BoxStream<'static, Reflected<T, L>> {
    let mut reflect = Reflect::<T, L>::gathering(decode);
    events.filter_map(move |event| std::future::ready(reflect.feed(event))).boxed()
}

/// One change of an announcing reflector's map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<T> {
    pub key: Arc<str>,
    /// The value as of `revision`; `None`: the key is gone (deleted, or
    /// its new value does not decode).
    pub value: Option<T>,
    /// The revision of the change (a re-list's: the list's revision).
    pub revision: Revision,
}

/// Why [`Reflector::wait_for`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The revision was not reached within the deadline.
    #[error("revision {wanted} not reached in time (at {reached})")]
    Timeout { wanted: Revision, reached: Revision },
    /// The reflector's writer is gone: it will never advance again.
    #[error("the reflector has stopped")]
    Stopped,
}

/// A typed, read-only view of one key prefix. Cheap to clone; every clone
/// sees the same map.
pub struct Reflector<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Reflector<T> {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone() }
    }
}

impl<T: Clone + Send + Sync + 'static> fmt::Debug for Reflector<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reflector").field("revision", &self.revision()).field("synced", &self.synced()).finish()
    }
}

/// Whether two values of one key are the same record (no change to announce).
type Same<T> = dyn Fn(&T, &T) -> bool + Send + Sync;

struct Announcer<T> {
    sender: broadcast::Sender<Change<T>>,
    same: Box<Same<T>>,
}

struct Shared<T> {
    view: RwLock<View<T>>,
    /// The revision reached, published after the map holds it: to waiters
    /// by the channel, to readers by the atomic (a load, which readers on
    /// every core can do at once without taking turns on a lock).
    reached: watch::Sender<Revision>,
    revision: AtomicI64,
    /// When the map was last confirmed current, as nanoseconds after
    /// `epoch` plus one (0: never), read the same way.
    confirmed: AtomicU64,
    epoch: Instant,
    /// True once the first list is in.
    synced: watch::Sender<bool>,
    announcer: Option<Announcer<T>>,
}

struct View<T> {
    map: BTreeMap<String, T>,
    reflect: Reflect<T>,
}

impl<T: Clone + Send + Sync + 'static> Reflector<T> {
    /// An empty, not yet synced reflector decoding values with `decode`.
    pub fn new(decode: impl Fn(&KeyValue) -> Result<T, String> + Send + Sync + 'static) -> Self {
        Self::build(decode, None)
    }

    /// A reflector that also announces every change of its map to
    /// [`Reflector::subscribe`]rs, who may fall `capacity` changes behind
    /// (then they see `Lagged`). `same` tells when a re-listed value is the
    /// one already held (e.g. equal mod revisions), so a re-list announces
    /// only what it changed.
    pub fn announcing(
        decode: impl Fn(&KeyValue) -> Result<T, String> + Send + Sync + 'static,
        capacity: usize,
        same: impl Fn(&T, &T) -> bool + Send + Sync + 'static,
    ) -> Self {
        let (sender, _) = broadcast::channel(capacity.max(1));
        Self::build(decode, Some(Announcer { sender, same: Box::new(same) }))
    }

    fn build(
        decode: impl Fn(&KeyValue) -> Result<T, String> + Send + Sync + 'static,
        announcer: Option<Announcer<T>>,
    ) -> Self {
        let view = View { map: BTreeMap::new(), reflect: Reflect::new(decode) };
        let (reached, _) = watch::channel(0);
        let (synced, _) = watch::channel(false);
        let shared = Shared {
            view: RwLock::new(view),
            reached,
            revision: AtomicI64::new(0),
            confirmed: AtomicU64::new(0),
            epoch: Instant::now(),
            synced,
            announcer,
        };
        Self { shared: Arc::new(shared) }
    }

    /// Applies every event of `events` until the stream ends.
    pub async fn run(self, events: impl Stream<Item = WatcherEvent>) {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            self.apply(event);
        }
    }

    /// Applies one event: the writer side.
    pub fn apply(&self, event: WatcherEvent) {
        let now = Instant::now();
        let mut reached = None;
        let mut first_list = false;
        {
            let mut view = self.shared.view.write().unwrap_or_else(|e| e.into_inner());
            let announcer = self.shared.announcer.as_ref();
            let announce = |key: &str, value: Option<&T>, revision: Revision| {
                if let Some(announcer) = announcer {
                    // Sent under the write lock, so a subscriber that reads
                    // the map under the read lock misses nothing.
                    let _ = announcer.sender.send(Change { key: Arc::from(key), value: value.cloned(), revision });
                }
            };
            match view.reflect.feed(event) {
                None => {}
                Some(Reflected::Listed { items, revision }) => {
                    let mut listed: BTreeMap<String, T> =
                        items.into_iter().map(|item| (item.key, item.value)).collect();
                    std::mem::swap(&mut view.map, &mut listed);
                    if let Some(announcer) = announcer {
                        let (new, old) = (&view.map, &listed);
                        for key in old.keys().filter(|k| !new.contains_key(*k)) {
                            announce(key, None, revision);
                        }
                        for (key, value) in new {
                            if old.get(key).is_none_or(|previous| !(announcer.same)(previous, value)) {
                                announce(key, Some(value), revision);
                            }
                        }
                    }
                    reached = Some(revision);
                    first_list = true;
                }
                Some(Reflected::Applied { key, value, revision }) => {
                    match value {
                        Some(value) => {
                            announce(&key, Some(&value), revision);
                            view.map.insert(key, value);
                        }
                        None => {
                            if view.map.remove(&key).is_some() {
                                announce(&key, None, revision);
                            }
                        }
                    }
                    reached = Some(revision);
                }
                Some(Reflected::Deleted { key, revision }) => {
                    if view.map.remove(&key).is_some() {
                        announce(&key, None, revision);
                    }
                    reached = Some(revision);
                }
                Some(Reflected::Progress { revision }) => {
                    reached = Some(revision);
                }
            }
        }
        // Published after the map is written, so a reader woken by the new
        // revision finds the change in the map.
        if let Some(revision) = reached {
            let since = now.saturating_duration_since(self.shared.epoch).as_nanos();
            self.shared.confirmed.store(u64::try_from(since).unwrap_or(u64::MAX - 1) + 1, Ordering::Release);
            self.shared.revision.fetch_max(revision, Ordering::AcqRel);
            self.shared.reached.send_if_modified(|current| {
                let advance = revision > *current;
                if advance {
                    *current = revision;
                }
                advance
            });
        }
        if first_list {
            self.shared.synced.send_if_modified(|synced| !std::mem::replace(synced, true));
        }
    }

    /// Subscribes to the changes of an announcing reflector and, under the
    /// same lock, reads the map with `f` (what a new subscriber starts
    /// from): every change after what `f` saw is received, none before.
    /// A reflector built with [`Reflector::new`] announces nothing.
    pub fn subscribe<R>(&self, f: impl FnOnce(&BTreeMap<String, T>) -> R) -> (broadcast::Receiver<Change<T>>, R) {
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        let receiver = match &self.shared.announcer {
            Some(announcer) => announcer.sender.subscribe(),
            // A receiver of a channel with no sender: closed at once.
            None => broadcast::channel(1).1,
        };
        (receiver, f(&view.map))
    }

    /// Reads the map under the lock; keep `f` short.
    pub fn read<R>(&self, f: impl FnOnce(&BTreeMap<String, T>) -> R) -> R {
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        f(&view.map)
    }

    /// A copy of one value.
    pub fn get(&self, key: &str) -> Option<T> {
        self.read(|map| map.get(key).cloned())
    }

    /// Whether a key is present.
    pub fn contains(&self, key: &str) -> bool {
        self.read(|map| map.contains_key(key))
    }

    /// How many keys the map holds.
    pub fn len(&self) -> usize {
        self.read(BTreeMap::len)
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The revision the map has reached (0 before the first `InitDone`).
    pub fn revision(&self) -> Revision {
        self.shared.revision.load(Ordering::Acquire)
    }

    /// Whether a first list has completed.
    pub fn synced(&self) -> bool {
        *self.shared.synced.borrow()
    }

    /// Waits for the first list, at most `timeout`: false when it did not come.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let mut synced = self.shared.synced.subscribe();
        matches!(tokio::time::timeout(timeout, synced.wait_for(|s| *s)).await, Ok(Ok(_)))
    }

    /// When the map was last confirmed current: the newest event,
    /// `Progress` or `InitDone`. `None` before the first `InitDone`.
    pub fn confirmed_at(&self) -> Option<Instant> {
        match self.shared.confirmed.load(Ordering::Acquire) {
            0 => None,
            since => Some(self.shared.epoch + Duration::from_nanos(since - 1)),
        }
    }

    /// Whether the map is synced and was confirmed current within `max_age`.
    pub fn is_current(&self, max_age: Duration) -> bool {
        self.confirmed_at().is_some_and(|at| at.elapsed() <= max_age)
    }

    /// Waits until the map has reached `revision`, at most `timeout`.
    pub async fn wait_for(&self, revision: Revision, timeout: Duration) -> Result<(), WaitError> {
        let mut reached = self.shared.reached.subscribe();
        if *reached.borrow_and_update() >= revision {
            return Ok(());
        }
        match tokio::time::timeout(timeout, reached.wait_for(|r| *r >= revision)).await {
            Ok(Ok(_)) => Ok(()),
            // The sender lives in `shared`, which `self` holds: it cannot
            // be dropped while we wait. Kept for completeness.
            Ok(Err(_)) => Err(WaitError::Stopped),
            Err(_) => Err(WaitError::Timeout { wanted: revision, reached: self.revision() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, revision: Revision) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            create_revision: revision,
            mod_revision: revision,
        }
    }

    /// Values are strings; a value "bad" does not decode.
    fn reflector() -> Reflector<String> {
        Reflector::new(|kv: &KeyValue| {
            let s = String::from_utf8(kv.value.clone()).map_err(|e| e.to_string())?;
            if s == "bad" { Err("bad value".into()) } else { Ok(s) }
        })
    }

    fn keys(r: &Reflector<String>) -> Vec<String> {
        r.read(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
    }

    #[tokio::test]
    async fn not_synced_until_the_first_list_is_done() {
        let r = reflector();
        assert!(!r.synced());
        assert_eq!(r.confirmed_at(), None);
        assert!(!r.is_current(Duration::from_secs(3600)));
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitApply(kv("/a", "1", 3)));
        // The list is not visible before it is complete.
        assert!(r.is_empty());
        assert_eq!(r.revision(), 0);
        r.apply(WatcherEvent::InitDone { revision: 5 });
        assert!(r.synced());
        assert_eq!(keys(&r), ["/a=1"]);
        assert_eq!(r.revision(), 5);
        assert!(r.is_current(Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn changes_apply_in_order_and_advance_the_revision() {
        let r = reflector();
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitApply(kv("/a", "1", 2)));
        r.apply(WatcherEvent::InitApply(kv("/b", "1", 3)));
        r.apply(WatcherEvent::InitDone { revision: 3 });
        r.apply(WatcherEvent::Apply(kv("/a", "2", 4)));
        r.apply(WatcherEvent::Apply(kv("/c", "1", 5)));
        r.apply(WatcherEvent::Delete { key: "/b".into(), revision: 6 });
        assert_eq!(keys(&r), ["/a=2", "/c=1"]);
        assert_eq!(r.revision(), 6);
        assert_eq!(r.get("/a").as_deref(), Some("2"));
        assert!(!r.contains("/b"));
        r.apply(WatcherEvent::Progress { revision: 9 });
        assert_eq!(r.revision(), 9);
        // A stale progress never moves the revision back.
        r.apply(WatcherEvent::Progress { revision: 7 });
        assert_eq!(r.revision(), 9);
    }

    #[tokio::test]
    async fn a_relist_replaces_the_map_at_init_done() {
        let r = reflector();
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitApply(kv("/a", "1", 2)));
        r.apply(WatcherEvent::InitApply(kv("/b", "1", 3)));
        r.apply(WatcherEvent::InitDone { revision: 3 });
        // The watch was lost; meanwhile /b was deleted and /c created.
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitApply(kv("/a", "1", 2)));
        // Readers keep the old view while the re-list runs.
        assert_eq!(keys(&r), ["/a=1", "/b=1"]);
        r.apply(WatcherEvent::InitApply(kv("/c", "1", 8)));
        r.apply(WatcherEvent::InitDone { revision: 10 });
        assert_eq!(keys(&r), ["/a=1", "/c=1"]);
        assert_eq!(r.revision(), 10);
    }

    #[tokio::test]
    async fn undecodable_values_are_left_out() {
        let r = reflector();
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitApply(kv("/a", "bad", 2)));
        r.apply(WatcherEvent::InitApply(kv("/b", "1", 3)));
        r.apply(WatcherEvent::InitDone { revision: 3 });
        assert_eq!(keys(&r), ["/b=1"]);
        // An update to something unreadable removes the old, readable value.
        r.apply(WatcherEvent::Apply(kv("/b", "bad", 4)));
        assert!(r.is_empty());
        assert_eq!(r.revision(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn confirmation_ages_without_events_and_progress_renews_it() {
        let r = reflector();
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitDone { revision: 1 });
        let max_age = Duration::from_secs(2);
        assert!(r.is_current(max_age));
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(r.is_current(max_age));
        r.apply(WatcherEvent::Progress { revision: 1 });
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(r.is_current(max_age), "progress renewed the confirmation");
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(!r.is_current(max_age), "2.1 s without a word is not current");
        r.apply(WatcherEvent::Delete { key: "/x".into(), revision: 2 });
        assert!(r.is_current(max_age), "an event confirms too");
    }

    #[tokio::test(start_paused = true)]
    async fn progress_during_a_relist_confirms_nothing() {
        let r = reflector();
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitDone { revision: 1 });
        tokio::time::advance(Duration::from_secs(3)).await;
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::Progress { revision: 5 });
        assert!(!r.is_current(Duration::from_secs(2)));
        assert_eq!(r.revision(), 1);
        r.apply(WatcherEvent::InitDone { revision: 5 });
        assert!(r.is_current(Duration::from_secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_for_returns_once_the_revision_is_reached() {
        let r = reflector();
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitDone { revision: 3 });
        assert_eq!(r.wait_for(3, Duration::ZERO).await, Ok(()));
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move {
                r.wait_for(7, Duration::from_secs(5)).await?;
                // Woken by the revision: the change that carried it is visible.
                Ok::<_, WaitError>(r.get("/k"))
            })
        };
        tokio::time::advance(Duration::from_millis(100)).await;
        r.apply(WatcherEvent::Apply(kv("/k", "v", 6)));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        r.apply(WatcherEvent::Apply(kv("/k", "w", 7)));
        assert_eq!(waiter.await.unwrap(), Ok(Some("w".to_string())));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_for_times_out_naming_both_revisions() {
        let r = reflector();
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitDone { revision: 3 });
        let started = Instant::now();
        let e = r.wait_for(4, Duration::from_secs(2)).await.unwrap_err();
        assert_eq!(e, WaitError::Timeout { wanted: 4, reached: 3 });
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    fn announcing() -> Reflector<String> {
        Reflector::announcing(
            |kv: &KeyValue| String::from_utf8(kv.value.clone()).map_err(|e| e.to_string()),
            64,
            |a, b| a == b,
        )
    }

    fn drain(rx: &mut broadcast::Receiver<Change<String>>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(change) = rx.try_recv() {
            out.push(format!("{}={}@{}", change.key, change.value.as_deref().unwrap_or("-"), change.revision));
        }
        out
    }

    #[tokio::test]
    async fn every_change_is_announced_with_its_value_as_of_its_revision() {
        let r = announcing();
        let (mut rx, present) = r.subscribe(|map| map.len());
        assert_eq!(present, 0);
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitApply(kv("/a", "1", 2)));
        r.apply(WatcherEvent::InitDone { revision: 2 });
        // A create and two updates applied before anyone reads: three
        // changes, each with its own value, not three times the last one.
        r.apply(WatcherEvent::Apply(kv("/b", "init", 3)));
        r.apply(WatcherEvent::Apply(kv("/b", "error", 4)));
        r.apply(WatcherEvent::Apply(kv("/b", "success", 5)));
        r.apply(WatcherEvent::Delete { key: "/a".into(), revision: 6 });
        // A delete of a key never seen changes nothing.
        r.apply(WatcherEvent::Delete { key: "/zz".into(), revision: 7 });
        r.apply(WatcherEvent::Progress { revision: 8 });
        assert_eq!(drain(&mut rx), ["/a=1@2", "/b=init@3", "/b=error@4", "/b=success@5", "/a=-@6"]);
        assert_eq!(r.get("/b").as_deref(), Some("success"));
    }

    #[tokio::test]
    async fn a_relist_announces_only_what_it_changed() {
        let r = announcing();
        r.apply(WatcherEvent::Init);
        for (key, value) in [("/a", "1"), ("/b", "1"), ("/c", "1")] {
            r.apply(WatcherEvent::InitApply(kv(key, value, 2)));
        }
        r.apply(WatcherEvent::InitDone { revision: 2 });
        let (mut rx, present) = r.subscribe(|map| map.keys().cloned().collect::<Vec<_>>());
        assert_eq!(present, ["/a", "/b", "/c"]);
        // Re-listed after a gap: /a the same, /b changed, /c deleted, /d new.
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitApply(kv("/d", "1", 9)));
        r.apply(WatcherEvent::InitApply(kv("/a", "1", 2)));
        r.apply(WatcherEvent::InitApply(kv("/b", "2", 8)));
        assert!(drain(&mut rx).is_empty(), "nothing is announced before the list is complete");
        r.apply(WatcherEvent::InitDone { revision: 10 });
        assert_eq!(drain(&mut rx), ["/c=-@10", "/b=2@10", "/d=1@10"]);
        assert_eq!(keys(&r), ["/a=1", "/b=2", "/d=1"]);
    }

    #[tokio::test]
    async fn a_plain_reflector_announces_nothing_and_wait_synced_waits_for_the_first_list() {
        let r = reflector();
        let (mut rx, _) = r.subscribe(|_| ());
        assert!(matches!(rx.try_recv(), Err(broadcast::error::TryRecvError::Closed)));
        assert!(!r.wait_synced(Duration::from_millis(10)).await);
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move { r.wait_synced(Duration::from_secs(30)).await })
        };
        r.apply(WatcherEvent::Init);
        r.apply(WatcherEvent::InitDone { revision: 0 });
        assert!(waiter.await.unwrap(), "an empty store at revision 0 is synced too");
    }

    #[test]
    fn reflect_hands_out_whole_decoded_lists_and_changes() {
        let mut reflect = Reflect::new(|kv: &KeyValue| {
            let s = String::from_utf8(kv.value.clone()).map_err(|e| e.to_string())?;
            if s == "bad" { Err("bad value".to_string()) } else { Ok(s) }
        });
        assert_eq!(reflect.feed(WatcherEvent::Init), None);
        assert!(reflect.listing());
        assert_eq!(reflect.feed(WatcherEvent::InitApply(kv("/b", "1", 3))), None);
        assert_eq!(reflect.feed(WatcherEvent::InitApply(kv("/a", "bad", 2))), None);
        assert_eq!(reflect.feed(WatcherEvent::InitApply(kv("/a0", "2", 4))), None);
        assert_eq!(reflect.feed(WatcherEvent::Progress { revision: 4 }), None, "progress in a list confirms nothing");
        let item = |key: &str, value: &str, revision| Item { key: key.into(), value: value.to_string(), revision };
        assert_eq!(
            reflect.feed(WatcherEvent::InitDone { revision: 5 }),
            Some(Reflected::Listed { items: vec![item("/a0", "2", 4), item("/b", "1", 3)], revision: 5 })
        );
        assert!(!reflect.listing());
        assert_eq!(
            reflect.feed(WatcherEvent::Apply(kv("/b", "bad", 6))),
            Some(Reflected::Applied { key: "/b".into(), value: None, revision: 6 })
        );
        assert_eq!(
            reflect.feed(WatcherEvent::Delete { key: "/b".into(), revision: 7 }),
            Some(Reflected::Deleted { key: "/b".into(), revision: 7 })
        );
        assert_eq!(reflect.feed(WatcherEvent::Progress { revision: 8 }), Some(Reflected::Progress { revision: 8 }));
    }

    /// A consumer's own index: the list's total, and whether it was told
    /// the list is complete.
    #[derive(Debug, Default, PartialEq, Eq)]
    struct Total {
        sum: u32,
        items: usize,
        finished: bool,
    }

    impl Gather<u32> for Total {
        fn gather(&mut self, item: Item<u32>) {
            self.sum += item.value;
            self.items += 1;
        }

        fn finish(&mut self) {
            self.finished = true;
        }
    }

    #[tokio::test]
    async fn a_list_gathers_into_the_consumers_own_index_and_starts_over_on_init() {
        let decode =
            |kv: &KeyValue| std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse().ok()).ok_or("nan".into());
        let events = futures::stream::iter(vec![
            WatcherEvent::Init,
            WatcherEvent::InitApply(kv("/a", "100", 1)),
            // A list that failed half-way starts over: what it gathered goes.
            WatcherEvent::Init,
            WatcherEvent::InitApply(kv("/a", "1", 1)),
            WatcherEvent::InitApply(kv("/b", "x", 2)),
            WatcherEvent::InitApply(kv("/c", "2", 3)),
            WatcherEvent::InitDone { revision: 4 },
            WatcherEvent::Apply(kv("/d", "5", 5)),
        ]);
        let out: Vec<Reflected<u32, Total>> = reflect_into(events, decode).collect().await;
        assert_eq!(
            out,
            [
                Reflected::Listed { items: Total { sum: 3, items: 2, finished: true }, revision: 4 },
                Reflected::Applied { key: "/d".into(), value: Some(5), revision: 5 },
            ]
        );
    }

    #[tokio::test]
    async fn run_applies_a_stream() {
        let r = reflector();
        let events = futures::stream::iter(vec![
            WatcherEvent::Init,
            WatcherEvent::InitApply(kv("/a", "1", 1)),
            WatcherEvent::InitDone { revision: 1 },
            WatcherEvent::Apply(kv("/b", "1", 2)),
        ]);
        r.clone().run(events).await;
        assert_eq!(keys(&r), ["/a=1", "/b=1"]);
        assert_eq!(r.revision(), 2);
    }
}
