//! `/apiregistrations/:name/status` (§4.2) answered from the serve's
//! watch-fed subscriber index: consistent with writes made behind the
//! server's back, fail closed while the index cannot show it is current,
//! and streamed with `?watch=true` (coalesced `MODIFIED` events of the
//! same document, RBAC `apiregistrations/status` + `watch`). The reconciler
//! is played by writing subscription states through the repository.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::watch::Events;
use crate::both_backends;
use crate::common::Server;

const API: &str = "compute.example.com";

fn status_path() -> String {
    format!("/apiregistrations/{API}/status")
}

fn rule(resources: &[&str], verbs: &[&str]) -> Value {
    json!([{"apis": ["catalog.example.com"], "resources": resources, "verbs": verbs}])
}

/// Namespaces `names`, each subscribed to [`API`].
async fn subscribers(server: &Server, names: &[&str]) {
    for ns in names {
        server.namespace(ns).await;
        server.subscribe(ns, API).await;
    }
}

/// What a reconciler's success writes, made directly to the store.
async fn succeed(server: &Server, ns: &str, sync_id: &str) {
    let seen = server.repo.get_subscription(ns, API).await.unwrap().unwrap();
    crate::common::record_result(&server.repo, &seen, Some(sync_id)).await;
}

fn counts(status: &Value) -> [u64; 4] {
    ["total", "synced", "failed", "pending"].map(|k| status[k].as_u64().unwrap_or_else(|| panic!("{k}: {status}")))
}

both_backends! {
    async fn a_report_shows_writes_made_behind_the_servers_back_at_once(server: Server) {
        server.registration(API, json!({"sync_id": "s1"})).await;
        let names: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        subscribers(&server, &names).await;
        // No waiting: each report after a write, made by "another process"
        // (the test's own repository), must already show it.
        for (i, ns) in names.iter().enumerate() {
            succeed(&server, ns, "s1").await;
            let status = server.get(&status_path()).await.expect(200);
            assert_eq!(counts(&status), [12, i as u64 + 1, 0, 11 - i as u64], "after {ns}: {status}");
        }
        let status = server.get(&status_path()).await.expect(200);
        let first = &status["subscribers"][0];
        assert_eq!(
            *first,
            json!({"namespace": "t00", "active": true, "state": "success", "current_sync_id": "s1", "synced": true, "wave": ""})
        );
        let order: Vec<&str> = status["subscribers"].as_array().unwrap().iter().map(|s| s["namespace"].as_str().unwrap()).collect();
        assert_eq!(order, names, "sorted by namespace");
        // A deleted subscription is gone from the next report.
        server.delete(&format!("/namespaces/t05/subscriptions/{API}")).await.expect(204);
        let status = server.get(&status_path()).await.expect(200);
        assert_eq!(counts(&status), [11, 11, 0, 0], "{status}");
        // Another API's subscribers are not counted.
        server.registration("storage.example.com", json!({})).await;
        server.subscribe("t00", "storage.example.com").await;
        assert_eq!(counts(&server.get(&status_path()).await.expect(200))[0], 11);
        assert_eq!(counts(&server.get("/apiregistrations/storage.example.com/status").await.expect(200))[0], 1);
    }

    async fn subscribers_page_while_the_counts_cover_all(server: Server) {
        server.registration(API, json!({"sync_id": "s1"})).await;
        let names = ["ns-a", "ns-b", "ns-c", "ns-d", "ns-e", "ns-f", "ns-g"];
        subscribers(&server, &names).await;
        for ns in ["ns-a", "ns-b", "ns-c"] {
            succeed(&server, ns, "s1").await;
        }
        for ns in ["ns-d", "ns-e"] {
            let seen = server.repo.get_subscription(ns, API).await.unwrap().unwrap();
            crate::common::record_result(&server.repo, &seen, None).await;
        }
        let pages = |status: &Value| -> (Vec<String>, String) {
            let names = status["subscribers"].as_array().unwrap().iter();
            (names.map(|s| s["namespace"].as_str().unwrap().to_string()).collect(), status["continue"].as_str().unwrap_or_default().to_string())
        };
        let read_all = |limit: usize| {
            let server = &server;
            async move {
                let (mut seen, mut token, mut all_counts) = (Vec::new(), String::new(), Vec::new());
                loop {
                    let status = server.get(&format!("{}?limit={limit}&continue={token}", status_path())).await.expect(200);
                    let (names, next) = pages(&status);
                    assert!(names.len() <= limit, "{status}");
                    all_counts.push(counts(&status));
                    seen.extend(names);
                    token = next;
                    if token.is_empty() {
                        return (seen, all_counts);
                    }
                }
            }
        };
        let (seen, every) = read_all(3).await;
        assert_eq!(seen, names, "every subscriber once, sorted by namespace");
        assert_eq!(every.len(), 3);
        assert!(every.iter().all(|c| *c == [7, 3, 2, 2]), "every page counts them all: {every:?}");
        // Unpaged: all of them, no continue.
        let whole = server.get(&status_path()).await.expect(200);
        assert_eq!(pages(&whole), (names.map(String::from).to_vec(), String::new()));
        // A bump: nobody is synced to the new SyncID; the failed stay failed.
        server.put(&format!("/apiregistrations/{API}"), json!({"sync_id": "s2"})).await.expect(200);
        let status = server.get(&format!("{}?limit=1", status_path())).await.expect(200);
        assert_eq!(counts(&status), [7, 0, 2, 5], "{status}");
        succeed(&server, "ns-d", "s2").await;
        succeed(&server, "ns-g", "s2").await;
        assert_eq!(counts(&server.get(&format!("{}?limit=1", status_path())).await.expect(200)), [7, 2, 1, 4]);
        server.delete(&format!("/namespaces/ns-g/subscriptions/{API}")).await.expect(204);
        assert_eq!(counts(&server.get(&format!("{}?limit=2", status_path())).await.expect(200)), [6, 1, 1, 4]);
        // A token belongs to its API's report.
        let first = server.get(&format!("{}?limit=1", status_path())).await.expect(200);
        let token = first["continue"].as_str().expect("more pages").to_string();
        server.registration("storage.example.com", json!({})).await;
        server.get(&format!("/apiregistrations/storage.example.com/status?continue={token}")).await.error(400, &["continue"]);
    }

    /// `?category=` pages only the subscribers one count counts, and a
    /// stream sends the page it was opened with, its counts covering all:
    /// what the console's API page reads instead of every subscriber.
    async fn a_category_pages_what_its_count_counts_and_a_stream_sends_its_page(server: Server) {
        server.registration(API, json!({"sync_id": "s1"})).await;
        let names = ["ns-a", "ns-b", "ns-c", "ns-d", "ns-e", "ns-f", "ns-g"];
        subscribers(&server, &names).await;
        for ns in ["ns-a", "ns-c", "ns-f"] {
            succeed(&server, ns, "s1").await;
        }
        for ns in ["ns-b", "ns-g"] {
            let seen = server.repo.get_subscription(ns, API).await.unwrap().unwrap();
            crate::common::record_result(&server.repo, &seen, None).await;
        }
        let shown = |status: &Value| -> Vec<String> {
            let subscribers = status["subscribers"].as_array().unwrap().iter();
            subscribers.map(|s| s["namespace"].as_str().unwrap().to_string()).collect()
        };
        for (category, expected) in
            [("synced", vec!["ns-a", "ns-c", "ns-f"]), ("failed", vec!["ns-b", "ns-g"]), ("pending", vec!["ns-d", "ns-e"])]
        {
            let status = server.get(&format!("{}?category={category}", status_path())).await.expect(200);
            assert_eq!(shown(&status), expected, "{category}: {status}");
            assert_eq!(counts(&status), [7, 3, 2, 2], "the counts cover everyone");
            // Paged one at a time, the same subscribers in the same order.
            let (mut seen, mut token) = (Vec::new(), String::new());
            loop {
                let path = format!("{}?category={category}&limit=1&continue={token}", status_path());
                let page = server.get(&path).await.expect(200);
                seen.extend(shown(&page));
                token = page["continue"].as_str().unwrap_or_default().to_string();
                if token.is_empty() {
                    break;
                }
            }
            assert_eq!(seen, expected, "{category}, paged");
        }
        for bad in ["error", "SYNCED", "", "all"] {
            server.get(&format!("{}?category={bad}", status_path())).await.error(400, &["category"]);
        }

        // A stream of one page: its subscribers, every count, and a change
        // on another page still moves the counts it sends.
        let path = format!("{}?category=failed&limit=1", status_path());
        let mut events = Events::open(&server, &path, &server.admin, false).await;
        let (kind, first) = events.next().await;
        assert_eq!(kind, "ADDED");
        assert_eq!(first, server.get(&path).await.expect(200), "the page a GET answers");
        assert_eq!(shown(&first), ["ns-b"]);
        assert!(!first["continue"].as_str().unwrap_or_default().is_empty(), "{first}");
        succeed(&server, "ns-d", "s1").await;
        let (kind, moved) = events.next().await;
        assert_eq!(kind, "MODIFIED");
        assert_eq!((counts(&moved), shown(&moved)), ([7, 4, 2, 1], vec!["ns-b".to_string()]), "{moved}");
        let refused = Events::request(&server, &format!("{}?category=bogus", status_path()), &server.admin, false).await;
        assert_eq!(refused.status(), 400, "a stream's bad category is the GET's 400");
    }

    /// §16 during a real fan-out (an in-process reconciler, a backend that
    /// fails some tenants): every report's counts are what its own list of
    /// subscribers counts, pages of a category only ever hold that
    /// category, and the settled report is exact, page by page.
    async fn counts_and_pages_stay_exact_through_a_fan_out_with_failures(server: Server) {
        const N: usize = 300;
        let backend = kayra_testkit::backend::TestBackend::start().await;
        let mut config = kayra_config::ReconcilerConfig { max_concurrent_reconciles: 8, ..Default::default() };
        let endpoint = format!("{}/ns/{{{{ .Subscription.Namespace }}}}/sync", backend.base);
        let yaml = format!("- method: post\n  endpoint: '{endpoint}'\n  timeout: 30s\n");
        config.mode.insert("api".into(), serde_norway::from_str(&yaml).unwrap());
        server.registration(API, json!({"sync_id": "s1", "mode": "api"})).await;
        // One in ten fails (the backend refuses namespaces named bad…).
        let names: Vec<String> =
            (0..N).map(|i| if i % 10 == 3 { format!("bad-{i:03}") } else { format!("ok-{i:03}") }).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        subscribers(&server, &names).await;
        let stop = tokio_util::sync::CancellationToken::new();
        let reconciler = kayra_reconciler::Reconciler::new(server.repo.clone(), config, stop.clone()).unwrap();
        let running = tokio::spawn(reconciler.run());

        let listed = |status: &Value, sync_id: &str| -> [u64; 4] {
            let subscribers = status["subscribers"].as_array().unwrap();
            let synced = subscribers.iter().filter(|s| s["active"] == true && s["current_sync_id"] == sync_id).count();
            let failed =
                subscribers.iter().filter(|s| !(s["active"] == true && s["current_sync_id"] == sync_id) && s["state"] == "error").count();
            let total = subscribers.len();
            [total, synced, failed, total - synced - failed].map(|n| n as u64)
        };
        let settled = [N as u64, (N - N / 10) as u64, (N / 10) as u64, 0];
        let mut reports = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let whole = server.get(&status_path()).await.expect(200);
            assert_eq!(counts(&whole), listed(&whole, "s1"), "the counts are the list's own: {}", counts(&whole)[1]);
            let page = server.get(&format!("{}?category=failed&limit=7", status_path())).await.expect(200);
            for s in page["subscribers"].as_array().unwrap() {
                assert_eq!(s["state"], "error", "a failed page holds failed subscribers: {s}");
                assert!(s["namespace"].as_str().unwrap().starts_with("bad-"), "{s}");
            }
            reports += 1;
            if counts(&whole) == settled {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "not settled within 120 s: {:?}", counts(&whole));
        }
        assert!(reports > 1, "the fan-out was read while it moved ({reports} reports)");
        for (category, expected) in [
            ("failed", names.iter().filter(|n| n.starts_with("bad-")).copied().collect::<Vec<_>>()),
            ("synced", names.iter().filter(|n| n.starts_with("ok-")).copied().collect()),
            ("pending", Vec::new()),
        ] {
            let (mut seen, mut token) = (Vec::new(), String::new());
            loop {
                let path = format!("{}?category={category}&limit=25&continue={token}", status_path());
                let page = server.get(&path).await.expect(200);
                assert_eq!(counts(&page), settled, "every page counts everyone");
                seen.extend(page["subscribers"].as_array().unwrap().iter().map(|s| s["namespace"].as_str().unwrap().to_string()));
                token = page["continue"].as_str().unwrap_or_default().to_string();
                if token.is_empty() {
                    break;
                }
            }
            assert_eq!(seen, expected, "{category}, page by page");
        }
        stop.cancel();
        running.await.unwrap().unwrap();
    }

    async fn the_status_stream_follows_a_fan_out_in_coalesced_documents(server: Server) {
        server.registration(API, json!({"sync_id": "s1"})).await;
        let names: Vec<String> = (0..20).map(|i| format!("t{i:02}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        subscribers(&server, &names).await;
        let mut events = Events::open(&server, &status_path(), &server.admin, false).await;
        let (kind, first) = events.next().await;
        assert_eq!(kind, "ADDED");
        // Exactly the document a GET answers.
        assert_eq!(first, server.get(&status_path()).await.expect(200));
        assert_eq!(counts(&first), [20, 0, 0, 20]);

        // A SyncID bump is a MODIFIED with the new expected SyncID.
        let bumped = server.put(&format!("/apiregistrations/{API}/sync"), json!({})).await.expect(200);
        let sync_id = bumped["sync_id"].as_str().unwrap().to_string();
        let (kind, moved) = events.next().await;
        assert_eq!((kind.as_str(), &moved["sync_id"]), ("MODIFIED", &bumped["sync_id"]), "{moved}");
        assert_eq!(moved["sync_id_updated_at"], bumped["sync_id_updated_at"]);

        // Twenty results in quick succession come as a few documents, the
        // last one the settled state.
        for ns in &names {
            succeed(&server, ns, &sync_id).await;
        }
        let mut documents = 0;
        let last = loop {
            let (kind, status) = events.next().await;
            assert_eq!(kind, "MODIFIED");
            documents += 1;
            let [total, synced, failed, pending] = counts(&status);
            assert_eq!(total, synced + failed + pending, "{status}");
            if synced == 20 {
                break status;
            }
        };
        assert!(documents < 10, "{documents} documents for 20 results: not coalesced");
        assert_eq!(last, server.get(&status_path()).await.expect(200));

        // A write that changes nothing the report shows sends nothing; the
        // next visible change is the next event.
        server.put(&format!("/apiregistrations/{API}"), json!({"description": "d"})).await.expect(200);
        server.namespace("zz").await;
        server.subscribe("zz", API).await;
        let (kind, grown) = events.next().await;
        assert_eq!((kind.as_str(), counts(&grown)), ("MODIFIED", [21, 20, 0, 1]), "{grown}");

        // SSE framing carries the same document.
        let mut sse = Events::open(&server, &status_path(), &server.admin, true).await;
        let (kind, same) = sse.next().await;
        assert_eq!((kind.as_str(), &same), ("ADDED", &grown));
    }

    async fn watching_a_status_needs_the_watch_verb_on_status(server: Server) {
        server.registration(API, json!({"short_name": "compute"})).await;
        let reader = server.user_with_rules("reader", rule(&["apiregistrations/status"], &["get"])).await;
        server.call(Method::GET, &status_path(), Some(&reader), None).await.expect(200);
        let url = format!("{}?watch=true", status_path());
        server.call(Method::GET, &url, Some(&reader), None).await
            .error(403, &["reader", "apiregistrations/status", "watch"]);
        // `watch` on the registrations grants no watch of their status.
        let other = server.user_with_rules("other", rule(&["apiregistrations"], &["watch", "get"])).await;
        server.call(Method::GET, &url, Some(&other), None).await.error(403, &["apiregistrations/status"]);
        let watcher =
            server.user_with_rules("watcher", rule(&["apiregistrations/status"], &["get", "watch"])).await;
        let mut events = Events::open(&server, &status_path(), &watcher, false).await;
        assert_eq!(events.next().await.0, "ADDED");
        // The GET's own answers come first.
        server.get("/apiregistrations/missing.example.com/status?watch=true").await.error(404, &["missing.example.com"]);
        server.get("/apiregistrations/compute/status?watch=true").await.error(400, &["compute.example.com"]);
        server.get(&format!("{}?watch=maybe", status_path())).await.error(400, &["watch"]);
        // A revoked right closes the stream.
        server.delete("/clusterrolebindings/watcher-binding").await.expect(204);
        assert!(events.ended(Duration::from_secs(10)).await < Duration::from_secs(10));
    }
}

/// An index whose feed is cut cannot show it has reached the store's
/// revision: `/status` answers 503 rather than an old report, and is right
/// again once the feed is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_fails_closed_while_its_index_cannot_catch_up() {
    let (server, switch, _etcd) = Server::start_switched().await;
    server.registration(API, json!({"sync_id": "s1"})).await;
    subscribers(&server, &["core"]).await;
    assert_eq!(counts(&server.get(&status_path()).await.expect(200)), [1, 0, 0, 1]);
    switch.cut();
    succeed(&server, "core", "s1").await;
    let message = server.get(&status_path()).await.error(503, &["subscriber index"]);
    assert!(message.contains("retry"), "{message}");
    switch.restore();
    kayra_testkit::eventually("the report after the feed is back", || async {
        let reply = server.get(&status_path()).await;
        reply.status == 200 && counts(&reply.json) == [1, 1, 0, 0]
    })
    .await;
}
