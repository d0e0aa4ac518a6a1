//! Runs (§4.4) through the catalog API: newest first by id, pagination,
//! one run by id, RBAC on `subscriptions/runs`, and 404s. The reconciler
//! that writes runs is not running here: records are put into the store
//! directly, under keys whose last segment deliberately does not sort like
//! the ids, since that segment is the reconciler's choice. A page decodes
//! only its own records, and a runs watch holds only its subscription's
//! runs, in a feed that goes with the stream (§17).

use kayra_core::{Run, RunResult};
use reqwest::Method;
use serde_json::{Value, json};

use crate::api::watch::Events;
use crate::both_backends;
use crate::common::Server;
use kayra_testkit::eventually;

const API: &str = "compute.example.com";
const RUNS: &str = "/namespaces/core/subscriptions/compute.example.com/runs";

pub use kayra_testkit::fixtures::run_id;

/// Run `n` of `namespace`'s subscription to [`API`].
pub fn run(namespace: &str, n: u64, result: RunResult) -> Run {
    kayra_testkit::fixtures::run(namespace, API, n, result)
}

/// Stores `run` as the newest of its subscription's run history, as the
/// reconciler's result would.
pub async fn put_run(server: &Server, run: &Run) {
    server.repo.add_run(run, 20).await.expect("store the run");
}

async fn setup(server: &Server) {
    server.namespace("core").await;
    server.registration(API, json!({"sync_id": "s1"})).await;
    server.subscribe("core", API).await;
}

fn ids(list: &Value) -> Vec<String> {
    list["items"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect()
}

fn rule(resources: &[&str], verbs: &[&str]) -> Value {
    json!([{"apis": ["catalog.example.com"], "resources": resources, "verbs": verbs}])
}

both_backends! {
    async fn runs_are_listed_newest_first_and_paginated(server: Server) {
        setup(&server).await;
        assert_eq!(server.get(RUNS).await.expect(200), json!({"items": [], "continue": ""}));
        for n in 1..=5u64 {
            let result = if n % 2 == 0 { RunResult::Error } else { RunResult::Success };
            put_run(&server, &run("core", n, result)).await;
        }
        // Another subscription's runs stay out of this one's list.
        server.namespace("web").await;
        server.subscribe("web", API).await;
        put_run(&server, &run("web", 9, RunResult::Success)).await;

        let all = server.get(RUNS).await.expect(200);
        assert_eq!(ids(&all), (1..=5).rev().map(run_id).collect::<Vec<_>>());
        assert_eq!(all["continue"], "");
        // Exactly the stored record, every field.
        assert_eq!(all["items"][0], serde_json::to_value(run("core", 5, RunResult::Success)).unwrap());
        assert_eq!(all["items"][1]["steps"][0]["async"], true);
        assert_eq!(all["items"][1]["result"], "error");

        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let page = server.get(&format!("{RUNS}?limit=2&continue={token}")).await.expect(200);
            assert!(ids(&page).len() <= 2, "{page}");
            seen.extend(ids(&page));
            token = page["continue"].as_str().unwrap().to_string();
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(seen, (1..=5).rev().map(run_id).collect::<Vec<_>>());
        // A token belongs to its subscription's runs.
        let first = server.get(&format!("{RUNS}?limit=1")).await.expect(200);
        let token = first["continue"].as_str().unwrap();
        server.get(&format!("/namespaces/web/subscriptions/{API}/runs?continue={token}")).await.error(400, &["continue"]);
        server.get(&format!("{RUNS}?continue=not-a-token!")).await.error(400, &["continue"]);
    }

    async fn a_page_decodes_only_its_own_runs(server: Server) {
        setup(&server).await;
        // An older run that no longer decodes (its id still reads): a page
        // that does not reach it never decodes it.
        let damaged = kayra_core::run_codec::encode(&run("core", 0, RunResult::Success));
        server.repo.add_stored_run("core", API, damaged[..1 + 1 + 16 + 3].to_vec(), 20).await.unwrap();
        for n in 1..=3u64 {
            put_run(&server, &run("core", n, RunResult::Success)).await;
        }
        let newest = server.get(&format!("{RUNS}?limit=1")).await.expect(200);
        assert_eq!(ids(&newest), vec![run_id(3)]);
        let page = server.get(&format!("{RUNS}?limit=3")).await.expect(200);
        assert_eq!(ids(&page), vec![run_id(3), run_id(2), run_id(1)]);
        let got = server.get(&format!("{RUNS}/{}", run_id(2))).await.expect(200);
        assert_eq!(got["id"], run_id(2));
    }

    async fn a_runs_watch_holds_only_its_subscriptions_runs(server: Server) {
        setup(&server).await;
        put_run(&server, &run("core", 1, RunResult::Success)).await;
        put_run(&server, &run("core", 2, RunResult::Error)).await;
        // Many runs of other subscriptions.
        server.namespace("web").await;
        server.subscribe("web", API).await;
        for slot in 0..300u64 {
            put_run(&server, &run("web", 10 + slot, RunResult::Success)).await;
        }
        let before = server.hub.held_records();
        let mut events = Events::open(&server, RUNS, &server.admin, false).await;
        events.expect("ADDED", "id", &run_id(1)).await;
        events.expect("ADDED", "id", &run_id(2)).await;
        let held = server.hub.held_records() - before;
        assert_eq!(held, 1, "the stream's feed holds its subscription's history, not the other's");
        put_run(&server, &run("core", 3, RunResult::Success)).await;
        events.expect("ADDED", "id", &run_id(3)).await;
        // A history kept to two runs: the two oldest leave it.
        server.repo.add_run(&run("core", 4, RunResult::Success), 2).await.unwrap();
        events.expect("DELETED", "id", &run_id(1)).await;
        events.expect("DELETED", "id", &run_id(2)).await;
        events.expect("ADDED", "id", &run_id(4)).await;
        drop(events);
        eventually("the stream's feed goes with it", || async { server.hub.held_records() == before }).await;
    }

    async fn one_run_by_id(server: Server) {
        setup(&server).await;
        let stored = run("core", 7, RunResult::Error);
        put_run(&server, &stored).await;
        let got = server.get(&format!("{RUNS}/{}", run_id(7))).await.expect(200);
        assert_eq!(got, serde_json::to_value(&stored).unwrap());
        server.get(&format!("{RUNS}/{}", run_id(8))).await.error(404, &[&run_id(8)]);
    }

    async fn runs_of_a_missing_subscription_are_404(server: Server) {
        setup(&server).await;
        server.registration("other.example.com", json!({})).await;
        server.get("/namespaces/core/subscriptions/other.example.com/runs").await
            .error(404, &["core", "other.example.com"]);
        server.get(&format!("/namespaces/core/subscriptions/other.example.com/runs/{}", run_id(1))).await
            .error(404, &["other.example.com"]);
        server.get(&format!("/namespaces/missing/subscriptions/{API}/runs")).await.error(404, &["missing"]);
        // A deleted subscription's leftover runs are not served.
        put_run(&server, &run("core", 1, RunResult::Success)).await;
        server.delete(&format!("/namespaces/core/subscriptions/{API}")).await.expect(204);
        server.get(RUNS).await.error(404, &["core", API]);
        server.get(&format!("{RUNS}/{}", run_id(1))).await.error(404, &[API]);
    }

    async fn runs_need_subscriptions_runs(server: Server) {
        setup(&server).await;
        put_run(&server, &run("core", 1, RunResult::Success)).await;
        let one = format!("{RUNS}/{}", run_id(1));
        let reader = server.user_with_rules("reader", rule(&["subscriptions"], &["get", "list"])).await;
        server.call(Method::GET, RUNS, Some(&reader), None).await
            .error(403, &["reader", "subscriptions/runs", "list"]);
        server.call(Method::GET, &one, Some(&reader), None).await.error(403, &["subscriptions/runs", "get"]);
        let lister = server.user_with_rules("lister", rule(&["subscriptions/runs"], &["list"])).await;
        server.call(Method::GET, RUNS, Some(&lister), None).await.expect(200);
        server.call(Method::GET, &one, Some(&lister), None).await.error(403, &["subscriptions/runs", "get"]);
        let getter = server.user_with_rules("getter", rule(&["subscriptions/runs"], &["get"])).await;
        server.call(Method::GET, &one, Some(&getter), None).await.expect(200);
        server.call(Method::GET, RUNS, Some(&getter), None).await.error(403, &["subscriptions/runs", "list"]);
    }
}
