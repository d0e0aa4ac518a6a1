//! Watch streams (§4.5): `?watch=true` on catalog GETs, NDJSON and SSE,
//! initial state then changes in order, subscriptions' computed fields
//! moving with their registration's SyncID, RBAC verb `watch`, streams
//! closed on revocation, and a stream that survives a store re-list.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::common::{Server, watch_options};

const API: &str = "compute.example.com";

/// How long any one event may take to arrive (a loaded machine, the local
/// store's poll interval).
const PATIENCE: Duration = Duration::from_secs(15);

/// An open watch stream, read incrementally.
pub struct Events {
    response: reqwest::Response,
    buffer: String,
    sse: bool,
}

impl Events {
    /// Opens `path?watch=true` as `token`, checking the 200 and the content type.
    pub async fn open(server: &Server, path: &str, token: &str, sse: bool) -> Events {
        let response = Self::request(server, path, token, sse).await;
        assert_eq!(response.status(), 200, "watch {path}: {:?}", response.text().await);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
        assert_eq!(content_type, if sse { "text/event-stream" } else { "application/x-ndjson" });
        Events { response, buffer: String::new(), sse }
    }

    pub async fn request(server: &Server, path: &str, token: &str, sse: bool) -> reqwest::Response {
        let separator = if path.contains('?') { '&' } else { '?' };
        let mut request = server.client.get(server.url(&format!("{path}{separator}watch=true"))).bearer_auth(token);
        if sse {
            request = request.header("accept", "text/event-stream");
        }
        request.send().await.expect("watch request")
    }

    /// The next frame (an NDJSON line, or an SSE block without its blank
    /// line); `None` when the server ended the stream.
    pub async fn frame(&mut self, within: Duration) -> Option<String> {
        let separator = if self.sse { "\n\n" } else { "\n" };
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(at) = self.buffer.find(separator) {
                let frame = self.buffer[..at].to_string();
                self.buffer.drain(..at + separator.len());
                return Some(frame);
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("no frame within {within:?}; buffered: {:?}", self.buffer));
            match chunk {
                Ok(Some(bytes)) => self.buffer.push_str(std::str::from_utf8(&bytes).expect("UTF-8")),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// The next event, `(type, object)`, skipping SSE keep-alives.
    pub async fn next(&mut self) -> (String, Value) {
        loop {
            let frame = self.frame(PATIENCE).await.expect("the stream ended");
            let json = if self.sse {
                if frame.starts_with(':') {
                    continue;
                }
                let (event, data) = frame.split_once('\n').expect("event and data lines");
                let data = data.strip_prefix("data: ").expect("data line");
                let value: Value = serde_json::from_str(data).expect("data is JSON");
                assert_eq!(event.strip_prefix("event: "), value["type"].as_str(), "{frame}");
                value
            } else {
                serde_json::from_str::<Value>(&frame).expect("a JSON line")
            };
            assert_eq!(json.as_object().unwrap().len(), 2, "{json}");
            return (json["type"].as_str().expect("type").to_string(), json["object"].clone());
        }
    }

    /// Checks that the next event is `kind` of the object named `name` (in
    /// `field`), returning the object.
    pub async fn expect(&mut self, kind: &str, field: &str, name: &str) -> Value {
        let (got, object) = self.next().await;
        assert_eq!((got.as_str(), object[field].as_str()), (kind, Some(name)), "{object}");
        object
    }

    /// Waits for the server to end the stream; how long that took.
    pub async fn ended(&mut self, within: Duration) -> Duration {
        let start = Instant::now();
        while self.frame(within).await.is_some() {}
        start.elapsed()
    }
}

fn rule(resources: &[&str], verbs: &[&str]) -> Value {
    json!([{"apis": ["catalog.example.com"], "resources": resources, "verbs": verbs}])
}

async fn subscribed(server: &Server, namespaces: &[&str], sync_id: &str) {
    for ns in namespaces {
        server.namespace(ns).await;
        server.subscribe(ns, API).await;
        let seen = server.repo.get_subscription(ns, API).await.unwrap().unwrap();
        crate::common::record_result(&server.repo, &seen, Some(sync_id)).await;
    }
}

both_backends! {
    async fn a_list_streams_added_modified_deleted_in_order(server: Server) {
        server.namespace("alpha").await;
        server.namespace("beta").await;
        let mut events = Events::open(&server, "/namespaces", &server.admin, false).await;
        let alpha = events.expect("ADDED", "name", "alpha").await;
        // Exactly the shape of a GET.
        assert_eq!(alpha, server.get("/namespaces/alpha").await.expect(200));
        events.expect("ADDED", "name", "beta").await;
        server.namespace("gamma").await;
        events.expect("ADDED", "name", "gamma").await;
        server.put("/namespaces/beta", json!({"description": "second"})).await.expect(200);
        let beta = events.expect("MODIFIED", "name", "beta").await;
        assert_eq!(beta["description"], "second");
        server.delete("/namespaces/alpha").await.expect(204);
        let gone = events.expect("DELETED", "name", "alpha").await;
        assert_eq!(gone, alpha);
        // A write that changes nothing visible is no event: the next one is gamma's.
        server.put("/namespaces/beta", json!({"description": "second"})).await.expect(200);
        server.put("/namespaces/gamma", json!({"description": "third"})).await.expect(200);
        events.expect("MODIFIED", "name", "gamma").await;
    }

    async fn every_transition_is_streamed_with_the_object_as_of_it(server: Server) {
        // Local polls far apart, so the create and the reconciler's result
        // below reach the server's feed in one poll, as a fast failing
        // first sync does: both must still be shown, in order.
        let server = server
            .restart_with(|config| {
                if let Some(local) = config.database.local.as_mut() {
                    local.poll_interval = kayra_config::Duration::from_secs(2);
                }
            })
            .await;
        server.registration(API, json!({"sync_id": "s1"})).await;
        server.namespace("core").await;
        let mut events = Events::open(&server, "/namespaces/core/subscriptions", &server.admin, false).await;
        server.subscribe("core", API).await;
        let created = server.repo.get_subscription("core", API).await.unwrap().expect("created");
        crate::common::record_result(&server.repo, &created, None).await;
        let added = events.expect("ADDED", "api", API).await;
        assert_eq!((added["state"].as_str(), added["active"].as_bool()), (Some("init"), Some(false)), "{added}");
        let failed = events.expect("MODIFIED", "api", API).await;
        assert_eq!((failed["state"].as_str(), failed["active"].as_bool()), (Some("error"), Some(false)), "{failed}");
        // And a stream opened now starts from the present state.
        let mut late = Events::open(&server, "/namespaces/core/subscriptions", &server.admin, false).await;
        let now = late.expect("ADDED", "api", API).await;
        assert_eq!(now, failed);
    }

    async fn one_object_streams_only_its_own_changes(server: Server) {
        server.registration(API, json!({"sync_id": "s1"})).await;
        server.registration("other.example.com", json!({})).await;
        let mut events = Events::open(&server, &format!("/apiregistrations/{API}"), &server.admin, false).await;
        let added = events.expect("ADDED", "name", API).await;
        assert_eq!(added, server.get(&format!("/apiregistrations/{API}")).await.expect(200));
        server.put("/apiregistrations/other.example.com", json!({"description": "x"})).await.expect(200);
        server.put(&format!("/apiregistrations/{API}"), json!({"sync_id": "s2"})).await.expect(200);
        let modified = events.expect("MODIFIED", "name", API).await;
        assert_eq!(modified["sync_id"], "s2");
        assert_ne!(modified["sync_id_updated_at"], added["sync_id_updated_at"]);
        server.delete(&format!("/apiregistrations/{API}")).await.expect(204);
        events.expect("DELETED", "name", API).await;
        server.registration(API, json!({"sync_id": "s3"})).await;
        let again = events.expect("ADDED", "name", API).await;
        assert_eq!(again["sync_id"], "s3");
    }

    async fn token_streams_show_only_their_users_tokens(server: Server) {
        server.user_with_token("alice").await;
        server.user_with_token("bob").await;
        let first = server.get("/users/alice/tokens").await.expect(200);
        let first = first["items"][0]["id"].as_str().expect("alice's token").to_string();
        let mut list = Events::open(&server, "/users/alice/tokens", &server.admin, false).await;
        list.expect("ADDED", "id", &first).await;
        let mut one = Events::open(&server, &format!("/users/alice/tokens/{first}"), &server.admin, false).await;
        one.expect("ADDED", "id", &first).await;
        // Bob's token and alice's second token, in this order: only the
        // latter is shown, and only on the list.
        server.post("/users/bob/tokens", json!({})).await.expect(201);
        let second = server.post("/users/alice/tokens", json!({})).await.expect(201);
        let second = second["id"].as_str().expect("id").to_string();
        let added = list.expect("ADDED", "id", &second).await;
        assert!(added.get("token").is_none(), "a stream never shows a token's secret: {added}");
        server.delete(&format!("/users/alice/tokens/{first}")).await.expect(204);
        list.expect("DELETED", "id", &first).await;
        one.expect("DELETED", "id", &first).await;
    }

    async fn a_sync_id_bump_is_one_modified_per_subscriber(server: Server) {
        server.registration(API, json!({"sync_id": "s1"})).await;
        server.registration("other.example.com", json!({"sync_id": "o1"})).await;
        let namespaces = ["core", "sre", "web"];
        subscribed(&server, &namespaces, "s1").await;
        server.subscribe("core", "other.example.com").await;
        let mut lists = Vec::new();
        for ns in namespaces {
            let mut events = Events::open(&server, &format!("/namespaces/{ns}/subscriptions"), &server.admin, false).await;
            let first = events.expect("ADDED", "api", API).await;
            assert_eq!((first["synced"].clone(), first["expected_sync_id"].clone()), (json!(true), json!("s1")));
            if ns == "core" {
                events.expect("ADDED", "api", "other.example.com").await;
            }
            lists.push((ns, events));
        }
        let mut one = Events::open(&server, &format!("/namespaces/sre/subscriptions/{API}"), &server.admin, true).await;
        one.expect("ADDED", "api", API).await;

        let bumped = server.put(&format!("/apiregistrations/{API}/sync"), json!({})).await.expect(200);
        let s2 = bumped["sync_id"].as_str().unwrap();
        for (ns, events) in lists.iter_mut() {
            let modified = events.expect("MODIFIED", "api", API).await;
            assert_eq!(modified["namespace"], *ns);
            assert_eq!((modified["expected_sync_id"].as_str(), modified["synced"].clone()), (Some(s2), json!(false)));
            assert_eq!(modified["current_sync_id"], "s1");
        }
        let modified = one.expect("MODIFIED", "api", API).await;
        assert_eq!(modified["expected_sync_id"].as_str(), Some(s2));

        // Exactly one each: the next event on every stream is the
        // reconciler's success, not a repeat of the bump.
        for ns in namespaces {
            let seen = server.repo.get_subscription(ns, API).await.unwrap().unwrap();
            crate::common::record_result(&server.repo, &seen, Some(s2)).await;
        }
        for (ns, events) in lists.iter_mut() {
            let synced = events.expect("MODIFIED", "api", API).await;
            assert_eq!((synced["namespace"].as_str(), synced["synced"].clone()), (Some(*ns), json!(true)));
        }
        let synced = one.expect("MODIFIED", "api", API).await;
        assert_eq!(synced["current_sync_id"].as_str(), Some(s2));
        assert_eq!(synced, server.get(&format!("/namespaces/sre/subscriptions/{API}")).await.expect(200));
    }

    async fn server_sent_events_are_framed_and_kept_alive(server: Server) {
        server.namespace("core").await;
        let mut events = Events::open(&server, "/namespaces/core", &server.admin, true).await;
        let first = events.frame(PATIENCE).await.expect("a frame");
        let object = server.get("/namespaces/core").await.expect(200);
        let data = first.strip_prefix("event: ADDED\ndata: ").unwrap_or_else(|| panic!("{first:?}"));
        assert!(!data.contains('\n'), "one data line: {first:?}");
        assert_eq!(serde_json::from_str::<Value>(data).unwrap(), json!({"type": "ADDED", "object": object}));
        assert!(watch_options().keep_alive <= Duration::from_secs(15));
        // Silence: a keep-alive comment comes after the configured interval.
        let started = Instant::now();
        let comment = events.frame(PATIENCE).await.expect("a keep-alive");
        assert_eq!(comment, ": keep-alive");
        assert!(started.elapsed() >= watch_options().keep_alive / 2, "{:?}", started.elapsed());
        server.put("/namespaces/core", json!({"description": "d"})).await.expect(200);
        let modified = events.expect("MODIFIED", "name", "core").await;
        assert_eq!(modified["description"], "d");
    }

    async fn watching_needs_the_watch_verb(server: Server) {
        server.namespace("core").await;
        let reader = server.user_with_rules("reader", rule(&["namespaces"], &["get", "list"])).await;
        for path in ["/namespaces", "/namespaces/core"] {
            server.call(Method::GET, path, Some(&reader), None).await.expect(200);
            server.call(Method::GET, &format!("{path}?watch=true"), Some(&reader), None).await
                .error(403, &["reader", "namespaces", "watch"]);
        }
        let watcher = server.user_with_rules("watcher", rule(&["namespaces"], &["watch"])).await;
        let mut events = Events::open(&server, "/namespaces", &watcher, false).await;
        events.expect("ADDED", "name", "core").await;
        // `watch` grants no plain GET, and a bad value or an unwatchable route is a 400.
        server.call(Method::GET, "/namespaces", Some(&watcher), None).await.error(403, &["list"]);
        server.get("/namespaces?watch=maybe").await.error(400, &["watch"]);
        // A stream has no pages: a collection's watch ignores `limit`, but
        // not a malformed one.
        for limit in ["abc", "-1"] {
            let refused = Events::request(&server, &format!("/namespaces?limit={limit}"), &watcher, false).await;
            assert_eq!(refused.status(), 400, "limit={limit}");
            let body = refused.text().await.expect("the error body");
            assert!(body.contains("limit"), "limit={limit}: {body}");
        }
        server.namespace("more").await;
        let mut unpaged = Events::open(&server, "/namespaces?limit=1", &watcher, false).await;
        unpaged.expect("ADDED", "name", "core").await;
        unpaged.expect("ADDED", "name", "more").await;
        server.registration(API, json!({})).await;
        server.get("/whoami?watch=true").await.error(400, &["watch"]);
        // Errors of the GET come first: a missing object is a 404.
        server.get("/namespaces/missing?watch=true").await.error(404, &["missing"]);
        server.get("/namespaces/missing/subscriptions?watch=true").await.error(404, &["missing"]);
        server.call(Method::GET, "/namespaces?watch=true", None, None).await.error(401, &[]);
    }

    async fn revoking_the_token_closes_the_stream_within_a_second(server: Server) {
        server.namespace("core").await;
        let token = server.user_with_rules("watcher", rule(&["namespaces"], &["watch"])).await;
        let mut events = Events::open(&server, "/namespaces", &token, false).await;
        events.expect("ADDED", "name", "core").await;
        let tokens = server.get("/users/watcher/tokens").await.expect(200);
        let id = tokens["items"][0]["id"].as_str().unwrap();
        let revoked = Instant::now();
        server.delete(&format!("/users/watcher/tokens/{id}")).await.expect(204);
        events.ended(PATIENCE).await;
        assert!(revoked.elapsed() < Duration::from_secs(1), "closed after {:?}", revoked.elapsed());
    }

    async fn losing_the_right_closes_the_stream_within_a_second(server: Server) {
        server.namespace("core").await;
        let token = server.user_with_rules("watcher", rule(&["namespaces"], &["watch"])).await;
        let mut sse = Events::open(&server, "/namespaces/core", &token, true).await;
        sse.expect("ADDED", "name", "core").await;
        let lost = Instant::now();
        server.put("/roles/watcher-role", json!({"rules": rule(&["namespaces"], &["get", "list"])})).await.expect(200);
        sse.ended(PATIENCE).await;
        assert!(lost.elapsed() < Duration::from_secs(1), "closed after {:?}", lost.elapsed());
        server.call(Method::GET, "/namespaces/core?watch=true", Some(&token), None).await.error(403, &["watch"]);
    }

    async fn streams_are_capped_per_user_and_in_all_and_everything_else_is_still_answered(server: Server) {
        let server = server
            .restart_with(|config| {
                config.server.max_streams_per_user = 2;
                config.server.max_streams = 3;
            })
            .await;
        server.namespace("core").await;
        let alice = server.user_with_rules("alice", rule(&["namespaces"], &["watch", "list", "get"])).await;
        let bob = server.user_with_rules("bob", rule(&["namespaces"], &["watch", "list", "get"])).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut events = Events::open(&server, "/namespaces", &alice, false).await;
            events.expect("ADDED", "name", "core").await;
            held.push(events);
        }
        // Alice's third: 429 with Retry-After, in the error shape.
        let refused = Events::request(&server, "/namespaces", &alice, false).await;
        assert_eq!(refused.status(), 429);
        let retry_after = refused.headers().get("retry-after").expect("Retry-After").to_str().unwrap().to_string();
        assert!(retry_after.parse::<u32>().is_ok_and(|s| s >= 1), "{retry_after}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!((body["code"].as_u64(), body["reason"].as_str()), (Some(429), Some("TooManyRequests")), "{body}");
        assert!(body["message"].as_str().unwrap().contains("server.max_streams_per_user"), "{body}");
        // Bob's first fills the server; his second passes the server's cap: 503.
        let mut third = Events::open(&server, "/namespaces/core", &bob, true).await;
        third.expect("ADDED", "name", "core").await;
        let full = Events::request(&server, "/namespaces", &bob, false).await;
        assert_eq!(full.status(), 503);
        // At the cap, health and ordinary requests are answered.
        let health = server.client.get(server.url("/healthz")).send().await.unwrap();
        assert_eq!(health.status(), 200);
        let ready = server.call(Method::GET, "/readyz", None, None).await.expect(200);
        assert_eq!(ready, json!({"status": "ready"}));
        server.get("/namespaces/core").await.expect(200);
        server.call(Method::GET, "/namespaces", Some(&bob), None).await.expect(200);
        assert_eq!(server.hub.stream_count(), 3);
        // A stream the server ends gives its place back: revoke bob's token.
        let tokens = server.get("/users/bob/tokens").await.expect(200);
        let id = tokens["items"][0]["id"].as_str().unwrap();
        server.delete(&format!("/users/bob/tokens/{id}")).await.expect(204);
        third.ended(PATIENCE).await;
        kayra_testkit::eventually("the ended stream's place to be given back", || async {
            server.hub.stream_count() == 2
        })
        .await;
        let mut again = Events::open(&server, "/namespaces/core", &server.admin, false).await;
        again.expect("ADDED", "name", "core").await;
    }

    async fn a_watch_opened_after_an_acknowledged_write_starts_at_or_after_it(server: Server) {
        server.namespace("core").await;
        // Each round: a write acknowledged, then a stream opened at once;
        // its first event shows that write (or a later one), never the one before.
        for round in 0..20 {
            let description = format!("round {round}");
            server.put("/namespaces/core", json!({"description": description})).await.expect(200);
            let mut events = Events::open(&server, "/namespaces/core", &server.admin, false).await;
            let first = events.expect("ADDED", "name", "core").await;
            assert_eq!(first["description"].as_str(), Some(description.as_str()), "round {round}: {first}");
        }
    }

    async fn open_streams_do_not_hold_up_shutdown(server: Server) {
        server.namespace("core").await;
        let mut ndjson = Events::open(&server, "/namespaces", &server.admin, false).await;
        let mut sse = Events::open(&server, "/namespaces/core", &server.admin, true).await;
        ndjson.expect("ADDED", "name", "core").await;
        sse.expect("ADDED", "name", "core").await;
        let started = Instant::now();
        server.shutdown().await.expect("clean shutdown");
        // Far below the 30 s drain: the streams end as shutdown begins.
        assert!(started.elapsed() < Duration::from_secs(5), "shutdown took {:?}", started.elapsed());
        ndjson.ended(PATIENCE).await;
        sse.ended(PATIENCE).await;
    }

    async fn many_streams_share_one_store_watch_per_prefix(server: Server) {
        server.namespace("core").await;
        let mut streams = Vec::new();
        for _ in 0..20 {
            let mut events = Events::open(&server, "/namespaces", &server.admin, false).await;
            events.expect("ADDED", "name", "core").await;
            streams.push(events);
        }
        assert_eq!(server.hub.feed_count(), 1, "one store watch for every stream of one prefix");
        server.namespace("web").await;
        for events in streams.iter_mut() {
            events.expect("ADDED", "name", "web").await;
        }
        let mut subscriptions = Events::open(&server, "/namespaces/core/subscriptions", &server.admin, false).await;
        let mut again = Events::open(&server, "/namespaces/web/subscriptions", &server.admin, false).await;
        server.registration(API, json!({})).await;
        server.subscribe("core", API).await;
        server.subscribe("web", API).await;
        subscriptions.expect("ADDED", "namespace", "core").await;
        again.expect("ADDED", "namespace", "web").await;
        // Subscriptions and the registrations their computed fields come from.
        assert_eq!(server.hub.feed_count(), 3);
    }
}

/// A stream across a store re-list: the server's feed is cut (a lost etcd
/// connection), changes are made and the history compacted away, so the
/// store watcher has to re-list; the client sees each change's effect
/// exactly once, a delete made in the gap included, and nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_a_compaction_relist() {
    let (server, switch, mut etcd) = Server::start_switched().await;
    for ns in ["keep", "change", "drop"] {
        server.namespace(ns).await;
    }
    let mut events = Events::open(&server, "/namespaces", &server.admin, false).await;
    for ns in ["change", "drop", "keep"] {
        events.expect("ADDED", "name", ns).await;
    }
    switch.cut();
    // The gap's writes go to the store directly: through the API they would
    // wait for this serve's (cut) caches to see them, and answer 503.
    let store = server.repo.store();
    let namespace = |name: &str, description: &str| {
        serde_json::to_vec(&json!({"name": name, "description": description, "active": false})).unwrap()
    };
    let key = |name| server.repo.store_key_of(kayra_catalog::repo::RecordRef::Namespace(name));
    let (change, _) = store.get(&key("change")).await.expect("read change");
    let change = change.expect("namespace change exists");
    store.update(&key("change"), namespace("change", "changed in the gap"), change.mod_revision).await.unwrap();
    store.delete(&key("drop"), None).await.expect("delete drop");
    store.create(&key("new"), namespace("new", "")).await.expect("create new");
    let at = server.repo.store().revision().await.expect("revision");
    etcd.compact(at, None).await.expect("compact");
    switch.restore();

    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..3 {
        let (kind, object) = events.next().await;
        let name = object["name"].as_str().unwrap().to_string();
        assert!(seen.insert(name.clone(), kind.clone()).is_none(), "{name} twice");
    }
    let want: std::collections::BTreeMap<String, String> =
        [("change", "MODIFIED"), ("drop", "DELETED"), ("new", "ADDED")]
            .iter()
            .map(|(n, k)| (n.to_string(), k.to_string()))
            .collect();
    assert_eq!(seen, want);
    // And it carries on: the next change is the next event (nothing was
    // queued twice behind the re-list).
    server.put("/namespaces/keep", json!({"description": "after"})).await.expect(200);
    let after = events.expect("MODIFIED", "name", "keep").await;
    assert_eq!(after["description"], "after");
}
