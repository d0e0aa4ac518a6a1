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
//! **Consistent reads.** A report is answered only once the index has
//! reached the store revision read at the start of the request
//! ([`SubscriberIndex::wait_for`]): what it shows is at least as new as the
//! store when the request arrived, whichever process wrote it. An index
//! that cannot show that within the request timeout fails closed (503).

use std::sync::Arc;
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
    /// Bumped after every change applied to the map: what the report's
    /// watch streams wait on.
    changes: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for SubscriberIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberIndex").field("reflector", &self.reflector).finish()
    }
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
        let index = Self { reflector: Reflector::new(decode), changes: Arc::new(watch::channel(0).0) };
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
        self.reflector.apply(event);
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
        let start = format!("{api}/");
        self.reflector.read(|map| {
            let mut range = map
                .range(start.clone()..)
                .map_while(|(key, entry)| key.strip_prefix(start.as_str()).map(|namespace| (namespace, entry)));
            f(&mut range)
        })
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
        SubscriberIndex { reflector: Reflector::new(decode), changes: Arc::new(watch::channel(0).0) }
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
}
