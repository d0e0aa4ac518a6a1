//! A reflector: a typed, read-only map kept current from a
//! [`WatcherEvent`] stream (kube-runtime's `reflector::store`).
//!
//! The writer side ([`Reflector::apply`], or [`Reflector::run`] over a
//! [`crate::Store::watcher`] stream) keeps one map of decoded values by key
//! and three facts readers decide with:
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
//! A re-list (`Init` … `InitDone`) is buffered and replaces the whole map
//! at `InitDone`, so a key deleted while the watch was lost (compaction,
//! a trimmed change log) disappears. Until then readers keep the old map;
//! its confirmation time keeps ageing, so a re-list that takes too long
//! shows as not current rather than as a silent half-view.
//!
//! A value that does not decode is logged and left out: a record kayra
//! cannot read grants nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::{KeyValue, Revision, WatcherEvent};

/// Turns a stored value into the reflector's type, or says why not.
pub type Decode<T> = dyn Fn(&KeyValue) -> Result<T, String> + Send + Sync;

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

impl<T: Send + Sync + 'static> fmt::Debug for Reflector<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reflector").field("revision", &self.revision()).field("synced", &self.synced()).finish()
    }
}

struct Shared<T> {
    decode: Box<Decode<T>>,
    view: RwLock<View<T>>,
    /// The revision reached, published after the map holds it.
    reached: watch::Sender<Revision>,
}

struct View<T> {
    map: BTreeMap<String, T>,
    /// A re-list in progress: `InitApply`s gathered until `InitDone`.
    relist: Option<BTreeMap<String, T>>,
    synced: bool,
    confirmed_at: Option<Instant>,
}

impl<T: Send + Sync + 'static> Reflector<T> {
    /// An empty, not yet synced reflector decoding values with `decode`.
    pub fn new(decode: impl Fn(&KeyValue) -> Result<T, String> + Send + Sync + 'static) -> Self {
        let view = View { map: BTreeMap::new(), relist: None, synced: false, confirmed_at: None };
        let (reached, _) = watch::channel(0);
        Self { shared: Arc::new(Shared { decode: Box::new(decode), view: RwLock::new(view), reached }) }
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
        {
            let mut view = self.shared.view.write().unwrap_or_else(|e| e.into_inner());
            match event {
                WatcherEvent::Init => view.relist = Some(BTreeMap::new()),
                WatcherEvent::InitApply(kv) => {
                    let decoded = self.decoded(&kv);
                    // An `InitApply` outside a re-list is a watcher bug;
                    // start one rather than mixing it into the live map.
                    let relist = view.relist.get_or_insert_with(BTreeMap::new);
                    if let Some(value) = decoded {
                        relist.insert(kv.key, value);
                    }
                }
                WatcherEvent::InitDone { revision } => {
                    view.map = view.relist.take().unwrap_or_default();
                    view.synced = true;
                    view.confirmed_at = Some(now);
                    reached = Some(revision);
                }
                WatcherEvent::Apply(kv) => {
                    let revision = kv.mod_revision;
                    match self.decoded(&kv) {
                        Some(value) => view.map.insert(kv.key, value),
                        None => view.map.remove(&kv.key),
                    };
                    view.confirmed_at = Some(now);
                    reached = Some(revision);
                }
                WatcherEvent::Delete { key, revision } => {
                    view.map.remove(&key);
                    view.confirmed_at = Some(now);
                    reached = Some(revision);
                }
                WatcherEvent::Progress { revision } => {
                    // Progress during a re-list confirms nothing: the map
                    // being rebuilt is not the one readers see.
                    if view.relist.is_none() {
                        view.confirmed_at = Some(now);
                        reached = Some(revision);
                    }
                }
            }
        }
        // Published after the map is written, so a reader woken by the new
        // revision finds the change in the map.
        if let Some(revision) = reached {
            self.shared.reached.send_if_modified(|current| {
                let advance = revision > *current;
                if advance {
                    *current = revision;
                }
                advance
            });
        }
    }

    fn decoded(&self, kv: &KeyValue) -> Option<T> {
        match (self.shared.decode)(kv) {
            Ok(value) => Some(value),
            Err(message) => {
                tracing::warn!(key = %kv.key, %message, "stored record does not decode; leaving it out");
                None
            }
        }
    }

    /// Reads the map under the lock; keep `f` short.
    pub fn read<R>(&self, f: impl FnOnce(&BTreeMap<String, T>) -> R) -> R {
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        f(&view.map)
    }

    /// A copy of one value.
    pub fn get(&self, key: &str) -> Option<T>
    where
        T: Clone,
    {
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
        *self.shared.reached.borrow()
    }

    /// Whether a first list has completed.
    pub fn synced(&self) -> bool {
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).synced
    }

    /// When the map was last confirmed current: the newest event,
    /// `Progress` or `InitDone`. `None` before the first `InitDone`.
    pub fn confirmed_at(&self) -> Option<Instant> {
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).confirmed_at
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
