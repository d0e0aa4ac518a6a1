//! The subscriber index of `kayra serve`: for every registration of this
//! deployment, each subscriber's (namespace, active, state,
//! current_sync_id), fed by one store watch of the deployment's
//! subscriptions. It answers `/apiregistrations/:name/status` (§4.2) from
//! memory instead of reading every subscription of the deployment on each
//! call, and feeds that report's watch stream.
//!
//! The map is a [`Reflector`] whose keys are rewritten from the store's
//! `/subscriptions/P/R/NAMESPACE/API` to `API/NAMESPACE`: one API's
//! subscribers are then one ordered range, sorted by namespace as the
//! report wants, and the reflector's revision, confirmation and re-list
//! rules apply unchanged. An entry keeps only what the report shows
//! (~100 bytes with its key), so 100,000 subscriptions stay around 10 MiB.
//!
//! **Counts.** Each API's counts are kept current as changes apply
//! ([`Counts`]): a report's `total`/`synced`/`failed`/`pending` never walk
//! the subscribers, so a page of 500 costs the same at 100,000 subscribers
//! as at 500 (§4.2 paging, §16).
//!
//! **Consistent reads.** A report is answered only once the index has
//! reached the store revision read at the start of the request
//! ([`SubscriberIndex::wait_for`]): what it shows is at least as new as the
//! store when the request arrived, whichever process wrote it. An index
//! that cannot show that within the request timeout fails closed (503).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kayra_core::{Subscription, SubscriptionState};
use kayra_store::reflector::{Reflector, WaitError};
use kayra_store::{KeyValue, Revision, WatcherEvent};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::repo::layout::{Layout, RecordRef};

/// What the report shows of one subscriber (its namespace is in the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub active: bool,
    pub state: SubscriptionState,
    pub current_sync_id: Box<str>,
}

impl Entry {
    /// `active && current_sync_id == sync_id`, as on the subscription.
    pub fn is_synced(&self, sync_id: &str) -> bool {
        self.active && &*self.current_sync_id == sync_id
    }
}

/// The subscriber index of one deployment. Cheap to clone; its watch stops
/// when the hub shuts down.
#[derive(Clone)]
pub struct SubscriberIndex {
    reflector: Reflector<Entry>,
    /// Each API's counts, changed with the map under this lock: a reader
    /// holding it sees counts and subscribers of the same moment.
    counts: Arc<Mutex<HashMap<String, Counts>>>,
    /// Bumped after every change applied to the map: what the report's
    /// watch streams wait on.
    changes: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for SubscriberIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberIndex").field("reflector", &self.reflector).finish()
    }
}

/// One API's subscribers counted by what the report needs, whatever the
/// registration's SyncID: synced to X are the active ones at X; failed
/// are those in `state: error` less the ones synced to X.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    total: usize,
    errors: usize,
    /// current_sync_id → (active, active in `state: error`).
    active_at: HashMap<Box<str>, (usize, usize)>,
}

/// The §4.2 counts of one API at one SyncID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub total: usize,
    pub synced: usize,
    pub failed: usize,
    pub pending: usize,
}

impl Counts {
    fn add(&mut self, entry: &Entry, sign: isize) {
        let step = |n: &mut usize| *n = n.saturating_add_signed(sign);
        step(&mut self.total);
        let error = entry.state == SubscriptionState::Error;
        if error {
            step(&mut self.errors);
        }
        if entry.active {
            let at = self.active_at.entry(entry.current_sync_id.clone()).or_default();
            step(&mut at.0);
            if error {
                step(&mut at.1);
            }
            if *at == (0, 0) {
                self.active_at.remove(&entry.current_sync_id);
            }
        }
    }

    /// The pending subscribers against `sync_id` that an ongoing action
    /// would move: active, not in `state: error`, and at another non-empty
    /// SyncID (inactive ones are first syncs, an empty `current_sync_id` a
    /// force re-sync).
    pub fn moving(&self, sync_id: &str) -> usize {
        self.active_at
            .iter()
            .filter(|(at, _)| !at.is_empty() && &***at != sync_id)
            .map(|(_, (active, in_error))| active - in_error)
            .sum()
    }

    /// The counts against `sync_id`.
    pub fn tally(&self, sync_id: &str) -> Tally {
        let (synced, synced_in_error) = self.active_at.get(sync_id).copied().unwrap_or_default();
        let failed = self.errors - synced_in_error;
        Tally { total: self.total, synced, failed, pending: self.total - synced - failed }
    }
}

/// One API's subscribers and counts at one moment ([`SubscriberIndex::snapshot`]).
pub struct Snapshot<'a> {
    api: &'a str,
    counts: Option<&'a Counts>,
    map: &'a BTreeMap<String, Entry>,
}

impl Snapshot<'_> {
    /// The §4.2 counts against `sync_id`.
    pub fn tally(&self, sync_id: &str) -> Tally {
        self.counts.map(|c| c.tally(sync_id)).unwrap_or_default()
    }

    /// [`Counts::moving`] of this API.
    pub fn moving(&self, sync_id: &str) -> usize {
        self.counts.map_or(0, |c| c.moving(sync_id))
    }

    /// The subscriber in `namespace`, if there is one.
    pub fn get(&self, namespace: &str) -> Option<&Entry> {
        self.map.get(&format!("{}/{namespace}", self.api))
    }

    /// The subscribers after namespace `after` (from the first when
    /// empty), sorted by namespace.
    pub fn after(&self, after: &str) -> impl Iterator<Item = (&str, &Entry)> {
        let start = format!("{}/", self.api);
        let from = if after.is_empty() { start.clone() } else { format!("{start}{after}\0") };
        self.map.range(from..).map_while(move |(key, entry)| {
            let namespace = key.strip_prefix(start.as_str())?;
            Some((namespace, entry))
        })
    }
}

/// The API of an index key `API/NAMESPACE`; `None` for any other key.
fn api_of(key: &str) -> Option<&str> {
    if key.starts_with('/') {
        return None;
    }
    key.split_once('/').map(|(api, _)| api)
}

/// `API/NAMESPACE` for a subscription key of `layout`'s deployment; any
/// other key is kept as it is (it starts with `/`, so it falls in no API's range).
fn index_key(layout: &Layout, key: String) -> String {
    match layout.parse(&key) {
        Some(RecordRef::Subscription { namespace, api }) => format!("{api}/{namespace}"),
        _ => key,
    }
}

fn decode(kv: &KeyValue) -> Result<Entry, String> {
    let s: Subscription = serde_json::from_slice(&kv.value).map_err(|e| e.to_string())?;
    Ok(Entry { active: s.active, state: s.state, current_sync_id: s.current_sync_id.into_boxed_str() })
}

impl SubscriberIndex {
    /// Starts indexing `events`, a watcher of the subscriptions of
    /// `layout`'s deployment, until `stop`.
    pub fn start(events: BoxStream<'static, WatcherEvent>, layout: &Layout, stop: CancellationToken) -> Self {
        let index = Self::new();
        let (writer, layout) = (index.clone(), layout.clone());
        tokio::spawn(async move {
            let mut events = events;
            loop {
                let event = tokio::select! {
                    () = stop.cancelled() => return,
                    event = events.next() => event,
                };
                let Some(event) = event else { return };
                writer.apply(&layout, event);
            }
        });
        index
    }

    fn new() -> Self {
        Self { reflector: Reflector::new(decode), counts: Arc::default(), changes: Arc::new(watch::channel(0).0) }
    }

    /// Applies one watcher event (the writer side), then tells the streams.
    fn apply(&self, layout: &Layout, event: WatcherEvent) {
        let event = match event {
            WatcherEvent::InitApply(mut kv) => {
                kv.key = index_key(layout, std::mem::take(&mut kv.key));
                WatcherEvent::InitApply(kv)
            }
            WatcherEvent::Apply(mut kv) => {
                kv.key = index_key(layout, std::mem::take(&mut kv.key));
                WatcherEvent::Apply(kv)
            }
            WatcherEvent::Delete { key, revision } => WatcherEvent::Delete { key: index_key(layout, key), revision },
            other => other,
        };
        // Only what can change a report wakes its streams.
        let wakes = !matches!(event, WatcherEvent::Progress { .. } | WatcherEvent::Init | WatcherEvent::InitApply(_));
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        match &event {
            WatcherEvent::Apply(KeyValue { key, .. }) | WatcherEvent::Delete { key, .. } => {
                let before = self.reflector.get(key);
                self.reflector.apply(event.clone());
                let after = self.reflector.get(key);
                if let Some(api) = api_of(key).filter(|_| before != after) {
                    let api_counts = counts.entry(api.to_string()).or_default();
                    if let Some(before) = &before {
                        api_counts.add(before, -1);
                    }
                    if let Some(after) = &after {
                        api_counts.add(after, 1);
                    }
                    if api_counts.total == 0 {
                        counts.remove(api);
                    }
                }
            }
            WatcherEvent::InitDone { .. } => {
                self.reflector.apply(event);
                // A (re-)list replaced the map: count it afresh, once.
                counts.clear();
                self.reflector.read(|map| {
                    for (key, entry) in map {
                        if let Some(api) = api_of(key) {
                            counts.entry(api.to_string()).or_default().add(entry, 1);
                        }
                    }
                });
            }
            _ => self.reflector.apply(event),
        }
        drop(counts);
        if wakes {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Waits until the index has reached `revision` (a store revision read
    /// by the caller), at most `timeout`.
    pub async fn wait_for(&self, revision: Revision, timeout: Duration) -> Result<(), WaitError> {
        self.reflector.wait_for(revision, timeout).await
    }

    /// Whether the first list has completed.
    pub fn synced(&self) -> bool {
        self.reflector.synced()
    }

    /// The revision the index has reached.
    pub fn revision(&self) -> Revision {
        self.reflector.revision()
    }

    /// A receiver that sees every change of the map.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Calls `f` with `api`'s subscribers, (namespace, entry) sorted by
    /// namespace, under the read lock (keep `f` short).
    pub fn subscribers<R>(&self, api: &str, f: impl FnOnce(&mut dyn Iterator<Item = (&str, &Entry)>) -> R) -> R {
        self.page(api, "", None, f).1
    }

    /// `api`'s counts against `sync_id`, and `f` over its subscribers after
    /// namespace `after` (all when empty), sorted by namespace; `limit`
    /// bounds nothing here (the caller takes what it wants), but the
    /// counts and the range are read at the same moment.
    pub fn page<R>(
        &self,
        api: &str,
        after: &str,
        sync_id: Option<&str>,
        f: impl FnOnce(&mut dyn Iterator<Item = (&str, &Entry)>) -> R,
    ) -> (Tally, R) {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let tally = sync_id.map(|sync_id| counts.get(api).map(|c| c.tally(sync_id)).unwrap_or_default());
        let start = format!("{api}/");
        let from = if after.is_empty() { start.clone() } else { format!("{start}{after}\0") };
        let result = self.reflector.read(|map| {
            let mut range = map
                .range(from..)
                .map_while(|(key, entry)| key.strip_prefix(start.as_str()).map(|namespace| (namespace, entry)));
            f(&mut range)
        });
        (tally.unwrap_or_default(), result)
    }

    /// Calls `f` with one API's subscribers and counts as they are at one
    /// moment (both locks held: keep `f` short).
    pub fn snapshot<R>(&self, api: &str, f: impl FnOnce(&Snapshot<'_>) -> R) -> R {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        self.reflector.read(|map| f(&Snapshot { api, counts: counts.get(api), map }))
    }

    /// How many subscriptions the index holds.
    pub fn len(&self) -> usize {
        self.reflector.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::layout::Collection;

    fn layout() -> Layout {
        Layout::new("dev", "local")
    }

    fn kv(namespace: &str, api: &str, active: bool, current: &str, revision: Revision) -> KeyValue {
        let mut s = Subscription::new(namespace, api);
        s.active = active;
        s.current_sync_id = current.into();
        KeyValue {
            key: layout().key(RecordRef::Subscription { namespace, api }),
            value: serde_json::to_vec(&s).unwrap(),
            create_revision: revision,
            mod_revision: revision,
        }
    }

    fn index() -> SubscriberIndex {
        SubscriberIndex::new()
    }

    fn of(index: &SubscriberIndex, api: &str) -> Vec<(String, bool)> {
        index.subscribers(api, |it| it.map(|(ns, e)| (ns.to_string(), e.is_synced("s1"))).collect())
    }

    #[test]
    fn keys_group_by_api_and_sort_by_namespace() {
        let (l, namespace, api) = (layout(), "core", "compute.example.com");
        assert_eq!(index_key(&l, l.key(RecordRef::Subscription { namespace, api })), "compute.example.com/core");
        assert_eq!(index_key(&l, "/elsewhere/x".into()), "/elsewhere/x");
        let only_namespace = format!("{}only-namespace", l.prefix(Collection::Subscriptions));
        assert_eq!(index_key(&l, only_namespace.clone()), only_namespace);
    }

    #[test]
    fn answers_one_api_in_namespace_order_through_lists_changes_and_deletes() {
        let index = index();
        let mut changes = index.changes();
        index.apply(&layout(), WatcherEvent::Init);
        for kv in [
            kv("b", "compute.example.com", true, "s1", 2),
            kv("a", "compute.example.com", false, "", 3),
            kv("a", "compute.example.com.other", true, "s1", 4),
            kv("a", "storage.example.com", true, "s1", 5),
        ] {
            index.apply(&layout(), WatcherEvent::InitApply(kv));
        }
        assert!(!changes.has_changed().unwrap(), "a list in progress wakes nobody");
        index.apply(&layout(), WatcherEvent::InitDone { revision: 5 });
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        assert_eq!(of(&index, "compute.example.com"), [("a".into(), false), ("b".into(), true)]);
        assert_eq!(of(&index, "storage.example.com"), [("a".into(), true)]);
        assert!(of(&index, "network.example.com").is_empty());

        index.apply(&layout(), WatcherEvent::Apply(kv("a", "compute.example.com", true, "s1", 6)));
        let key = layout().key(RecordRef::Subscription { namespace: "b", api: "compute.example.com" });
        index.apply(&layout(), WatcherEvent::Delete { key, revision: 7 });
        assert_eq!(of(&index, "compute.example.com"), [("a".into(), true)]);
        assert_eq!(index.revision(), 7);
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        index.apply(&layout(), WatcherEvent::Progress { revision: 9 });
        assert!(!changes.has_changed().unwrap(), "progress changes no report");
        assert_eq!((index.revision(), index.len()), (9, 3));
    }

    #[tokio::test]
    async fn waits_for_a_revision_and_gives_up_in_time() {
        let index = index();
        index.apply(&layout(), WatcherEvent::Init);
        index.apply(&layout(), WatcherEvent::InitDone { revision: 3 });
        index.wait_for(3, Duration::ZERO).await.unwrap();
        assert!(index.wait_for(4, Duration::from_millis(20)).await.is_err());
        let writer = index.clone();
        let waiting = tokio::spawn(async move { index.wait_for(4, Duration::from_secs(30)).await });
        writer.apply(&layout(), WatcherEvent::Progress { revision: 4 });
        waiting.await.unwrap().unwrap();
    }

    /// The kept counts equal a count of the map after any sequence of
    /// writes, deletes and re-lists (seeded, bounded).
    #[test]
    fn counts_always_equal_a_recount() {
        let l = layout();
        let index = index();
        let mut seed: u64 = 0x5eed;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let apis = ["a.example.com", "b.example.com"];
        let syncs = ["", "s1", "s2"];
        let mut revision = 1;
        index.apply(&l, WatcherEvent::Init);
        index.apply(&l, WatcherEvent::InitDone { revision });
        for round in 0..3000 {
            revision += 1;
            let (ns, api) = (format!("t{}", next(40)), apis[next(2) as usize]);
            match next(10) {
                0 => {
                    let key = l.key(RecordRef::Subscription { namespace: &ns, api });
                    index.apply(&l, WatcherEvent::Delete { key, revision });
                }
                1 if round % 500 == 1 => {
                    // A re-list of what is there now.
                    let present: Vec<KeyValue> = index.reflector.read(|map| {
                        map.iter()
                            .filter_map(|(k, e)| {
                                let (api, ns) = k.split_once('/')?;
                                let mut v = kv(ns, api, e.active, &e.current_sync_id, revision);
                                let mut s: Subscription = serde_json::from_slice(&v.value).unwrap();
                                s.state = e.state;
                                v.value = serde_json::to_vec(&s).unwrap();
                                Some(v)
                            })
                            .collect()
                    });
                    index.apply(&l, WatcherEvent::Init);
                    for v in present {
                        index.apply(&l, WatcherEvent::InitApply(v));
                    }
                    index.apply(&l, WatcherEvent::InitDone { revision });
                }
                _ => {
                    let mut v = kv(&ns, api, next(2) == 0, syncs[next(3) as usize], revision);
                    let mut s: Subscription = serde_json::from_slice(&v.value).unwrap();
                    s.state = if next(3) == 0 { SubscriptionState::Error } else { SubscriptionState::Success };
                    v.value = serde_json::to_vec(&s).unwrap();
                    index.apply(&l, WatcherEvent::Apply(v));
                }
            }
            for api in apis {
                for sync_id in syncs {
                    let (kept, recount) = index.page(api, "", Some(sync_id), |entries| {
                        let all: BTreeMap<String, Entry> = entries.map(|(n, e)| (n.to_string(), e.clone())).collect();
                        let synced = all.values().filter(|e| e.is_synced(sync_id)).count();
                        let failed = all
                            .values()
                            .filter(|e| !e.is_synced(sync_id) && e.state == SubscriptionState::Error)
                            .count();
                        Tally { total: all.len(), synced, failed, pending: all.len() - synced - failed }
                    });
                    assert_eq!(kept, recount, "round {round}, {api} at {sync_id:?}");
                    let (moving, recount) = index.snapshot(api, |snapshot| {
                        let moving = snapshot
                            .after("")
                            .filter(|(_, e)| {
                                e.active
                                    && !e.current_sync_id.is_empty()
                                    && !e.is_synced(sync_id)
                                    && e.state != SubscriptionState::Error
                            })
                            .count();
                        (snapshot.moving(sync_id), moving)
                    });
                    assert_eq!(moving, recount, "moving: round {round}, {api} at {sync_id:?}");
                }
            }
        }
    }
}
