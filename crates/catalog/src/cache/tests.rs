//! The caches fed by hand: one channel per watched prefix.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use kayra_core::Rule;
use serde_json::json;

use super::*;

const MAX_AGE: Duration = Duration::from_secs(2);

struct Feed {
    senders: Arc<Mutex<HashMap<String, UnboundedSender<WatcherEvent>>>>,
    cache: AuthCache,
}

impl Feed {
    fn new() -> Self {
        let senders: Arc<Mutex<HashMap<String, UnboundedSender<WatcherEvent>>>> = Arc::default();
        let source = {
            let senders = senders.clone();
            move |prefix: &str| {
                let (tx, rx) = unbounded();
                senders.lock().unwrap().insert(prefix.to_string(), tx);
                rx.boxed()
            }
        };
        let cache = AuthCache::from_source(source, "dev", "local", MAX_AGE);
        Self { senders, cache }
    }

    fn prefixes(&self) -> Vec<String> {
        self.senders.lock().unwrap().keys().cloned().collect()
    }

    fn send(&self, prefix: &str, event: WatcherEvent) {
        self.senders.lock().unwrap()[prefix].unbounded_send(event).unwrap();
    }

    /// A first list of every prefix, with `objects` (key, JSON) in theirs.
    async fn list(&self, revision: Revision, objects: &[(String, serde_json::Value)]) {
        for prefix in self.prefixes() {
            self.send(&prefix, WatcherEvent::Init);
            for (key, value) in objects.iter().filter(|(key, _)| key.starts_with(&prefix)) {
                self.send(&prefix, WatcherEvent::InitApply(kv(key, value, revision)));
            }
            self.send(&prefix, WatcherEvent::InitDone { revision });
        }
        self.cache.wait_synced(Duration::from_secs(5)).await.unwrap();
    }

    fn progress(&self, revision: Revision) {
        for prefix in self.prefixes() {
            self.send(&prefix, WatcherEvent::Progress { revision });
        }
    }
}

fn kv(key: &str, value: &serde_json::Value, revision: Revision) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: serde_json::to_vec(value).unwrap(),
        create_revision: revision,
        mod_revision: revision,
    }
}

/// Lets the reflector tasks drain their channels.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// This deployment's key of `record`.
fn key(record: RecordRef<'_>) -> String {
    Layout::new("dev", "local").key(record)
}

/// This deployment's prefix of `collection`.
fn prefix(collection: Collection<'_>) -> String {
    Layout::new("dev", "local").prefix(collection)
}

fn world() -> Vec<(String, serde_json::Value)> {
    let elsewhere = Layout::new("prod", "eu").key(RecordRef::Registration("storage.example.com"));
    vec![
        (key(RecordRef::User("alice")), json!({"name": "alice", "description": ""})),
        (key(RecordRef::Token("h1")), json!({"id": "h1", "user": "alice", "hash": "h1", "created_at": ""})),
        (key(RecordRef::Token("h2")), json!({"id": "h2", "user": "ghost", "hash": "h2", "created_at": ""})),
        (
            key(RecordRef::Role("reader")),
            json!({"name": "reader", "rules": [{"apis": ["*"], "resources": ["namespaces"], "verbs": ["get"]}]}),
        ),
        (
            key(RecordRef::Role("writer")),
            json!({"name": "writer", "rules": [{"apis": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        ),
        (key(RecordRef::ClusterRoleBinding("a")), json!({"name": "a", "role": "reader", "user": "alice"})),
        (key(RecordRef::ClusterRoleBinding("b")), json!({"name": "b", "role": "reader", "user": "alice"})),
        (key(RecordRef::ClusterRoleBinding("c")), json!({"name": "c", "role": "missing", "user": "alice"})),
        (key(RecordRef::ClusterRoleBinding("d")), json!({"name": "d", "role": "writer", "user": "bob"})),
        (
            key(RecordRef::RoleBinding { namespace: "core", name: "w" }),
            json!({"name": "w", "namespace": "core", "role": "writer", "user": "alice"}),
        ),
        (
            key(RecordRef::RoleBinding { namespace: "core2", name: "w" }),
            json!({"name": "w", "namespace": "core2", "role": "reader", "user": "alice"}),
        ),
        (key(RecordRef::Namespace("core")), json!({"name": "core", "description": "", "active": true})),
        (key(RecordRef::Namespace("new")), json!({"name": "new", "description": "", "active": false})),
        (key(RecordRef::Registration("compute.example.com")), json!({"name": "compute.example.com"})),
        (elsewhere, json!({"name": "storage.example.com"})),
    ]
}

#[tokio::test]
async fn decides_from_what_was_listed() {
    let feed = Feed::new();
    feed.list(10, &world()).await;
    let cache = &feed.cache;
    cache.ready().await.unwrap();
    assert_eq!(cache.token_user("h1").as_deref(), Some("alice"));
    assert_eq!(cache.token_user("h2"), None, "a token of a missing user authenticates no one");
    assert_eq!(cache.token_user("nope"), None);
    let reader = Role {
        name: "reader".into(),
        rules: vec![Rule { apis: vec!["*".into()], resources: vec!["namespaces".into()], verbs: vec!["get".into()] }],
    };
    assert_eq!(cache.cluster_roles("alice"), vec![reader.clone()], "deduplicated; a missing role grants nothing");
    assert_eq!(cache.namespace_roles("core", "alice").iter().map(|r| &r.name).collect::<Vec<_>>(), ["writer"]);
    assert_eq!(cache.namespace_roles("core2", "alice"), vec![reader], "core2 is not under core's prefix");
    assert!(cache.namespace_roles("other", "alice").is_empty());
    // The decisions read the same roles in place.
    let get_namespaces = kayra_rbac::Request::new("catalog.example.com", "namespaces", "get");
    let allowed = kayra_rbac::Decision::Allow { role: "reader".into(), rule: 0 };
    assert_eq!(cache.cluster_decision("alice", &get_namespaces), allowed);
    assert_eq!(cache.cluster_decision("carol", &get_namespaces), kayra_rbac::Decision::Deny);
    assert_eq!(cache.namespace_decision("core2", "alice", &get_namespaces), allowed);
    assert_eq!(cache.namespace_decision("other", "alice", &get_namespaces), kayra_rbac::Decision::Deny);
    assert_eq!(cache.namespace_active("core"), Some(true));
    assert_eq!(cache.namespace_active("new"), Some(false));
    assert_eq!(cache.namespace_active("gone"), None);
    assert!(cache.registration("compute.example.com").is_some());
    assert!(cache.registration("storage.example.com").is_none(), "another deployment's registration");
}

#[tokio::test]
async fn not_synced_caches_decide_nothing() {
    let feed = Feed::new();
    assert!(matches!(feed.cache.ready().await, Err(Error::NotSynced(_))));
    assert!(feed.cache.wait_synced(Duration::from_millis(20)).await.is_err());
    assert!(feed.cache.check_current().is_err());
}

#[tokio::test(start_paused = true)]
async fn silence_longer_than_the_request_timeout_fails_closed() {
    let feed = Feed::new();
    feed.list(10, &world()).await;
    tokio::time::advance(Duration::from_millis(1900)).await;
    feed.cache.ready().await.unwrap();
    tokio::time::advance(Duration::from_millis(200)).await;
    let e = feed.cache.ready().await.unwrap_err();
    assert!(matches!(e, Error::Stale { .. }), "{e}");
    assert!(feed.cache.check_current().is_err());
    // Progress from every watch: current again, without a restart.
    feed.progress(11);
    settle().await;
    feed.cache.ready().await.unwrap();
    feed.cache.check_current().unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_silent_watch_is_enough_to_fail_closed() {
    let feed = Feed::new();
    feed.list(10, &world()).await;
    tokio::time::advance(Duration::from_secs(3)).await;
    for prefix in feed.prefixes().into_iter().filter(|p| *p != prefix(Collection::Roles)) {
        feed.send(&prefix, WatcherEvent::Progress { revision: 11 });
    }
    settle().await;
    let e = feed.cache.ready().await.unwrap_err();
    assert!(matches!(e, Error::Stale { cache: "roles", age } if age >= Duration::from_secs(3)), "{e}");
}

#[tokio::test(start_paused = true)]
async fn own_writes_are_waited_for_before_deciding() {
    let feed = Feed::new();
    feed.list(10, &world()).await;
    // This process revoked alice's token at revision 12.
    feed.cache.note_write(&key(RecordRef::Token("h1")), 12);
    let decision = {
        let cache = feed.cache.clone();
        tokio::spawn(async move {
            cache.ready().await?;
            Ok::<_, Error>(cache.token_user("h1"))
        })
    };
    settle().await;
    assert!(!decision.is_finished(), "the tokens cache has not seen revision 12 yet");
    feed.send(&prefix(Collection::Tokens), WatcherEvent::Delete { key: key(RecordRef::Token("h1")), revision: 12 });
    assert_eq!(decision.await.unwrap(), Ok(None), "enforced on the very next decision");
}

#[tokio::test(start_paused = true)]
async fn an_own_write_never_seen_is_a_503_after_the_request_timeout() {
    let feed = Feed::new();
    feed.list(10, &world()).await;
    feed.cache.note_write(&key(RecordRef::Role("reader")), 15);
    // Writes elsewhere do not hold decisions up.
    feed.cache.note_write(&key(RecordRef::Subscription { namespace: "core", api: "compute.example.com" }), 99);
    let started = Instant::now();
    let e = feed.cache.ready().await.unwrap_err();
    assert_eq!(e, Error::Behind { cache: "roles", wanted: 15 });
    assert_eq!(started.elapsed(), MAX_AGE);
}

#[tokio::test]
async fn a_deleted_prefix_marks_every_cache_under_it() {
    let feed = Feed::new();
    feed.list(10, &world()).await;
    feed.cache.note_write(&prefix(Collection::NamespaceRoleBindings("core")), 11);
    let marks: Vec<_> = feed
        .cache
        .inner
        .parts
        .iter()
        .map(|p| (p.name, p.mark.load(Ordering::Acquire)))
        .filter(|(_, m)| *m > 0)
        .collect();
    assert_eq!(marks, [("role bindings", 11)]);
}

#[tokio::test]
async fn changes_after_the_list_are_applied() {
    let feed = Feed::new();
    feed.list(10, &world()).await;
    let bindings = prefix(Collection::ClusterRoleBindings);
    feed.send(&bindings, WatcherEvent::Delete { key: key(RecordRef::ClusterRoleBinding("a")), revision: 11 });
    feed.send(&bindings, WatcherEvent::Delete { key: key(RecordRef::ClusterRoleBinding("b")), revision: 12 });
    feed.send(&prefix(Collection::Users), WatcherEvent::Delete { key: key(RecordRef::User("alice")), revision: 13 });
    feed.cache.note_write(&key(RecordRef::ClusterRoleBinding("b")), 12);
    feed.cache.note_write(&key(RecordRef::User("alice")), 13);
    feed.cache.ready().await.unwrap();
    assert!(feed.cache.cluster_roles("alice").is_empty());
    assert_eq!(feed.cache.token_user("h1"), None);
}
