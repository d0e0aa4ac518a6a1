//! Namespace labels and `?labelSelector=` (§4.1): create and PUT/PATCH with
//! labels, each validation failure a 400 naming the key, selectors with
//! all three term kinds, with paging and with watch streams, and a seeded
//! property test that generated labels and selectors never give a 500 and
//! valid ones always round-trip.
//!
//! Run alone: `cargo test -p kayra-server --test api -- labels`.

use std::collections::BTreeMap;

use kayra_core::labels::{Selector, validate_labels};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

use super::watch::Events;
use crate::both_backends;
use crate::common::{Backend, Server};

/// Cases per backend of the property test (a few seconds each).
const CASES: u32 = 120;

fn names(list: &Value) -> Vec<String> {
    list["items"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap().to_string()).collect()
}

/// GET `/namespaces` with `selector` (query-encoded) and extra query pairs.
async fn select(server: &Server, selector: &str, extra: &[(&str, &str)]) -> (u16, Value) {
    let mut query = vec![("labelSelector", selector)];
    query.extend_from_slice(extra);
    let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
    let reply = server
        .client
        .get(server.url(&format!("/namespaces?{}", query.join("&"))))
        .bearer_auth(&server.admin)
        .send()
        .await
        .expect("list request");
    let status = reply.status().as_u16();
    (status, reply.json().await.expect("a JSON answer"))
}

/// `text` percent-encoded for a query value (every byte but `A-Z a-z 0-9 - _ . ~`).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every page of a selected list of `limit` items, asserting each page's size.
async fn pages(server: &Server, selector: &str, limit: usize) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut token = String::new();
    let limit_text = limit.to_string();
    loop {
        let (status, page) = select(server, selector, &[("limit", &limit_text), ("continue", &token)]).await;
        assert_eq!(status, 200, "{page}");
        let items = names(&page);
        assert!(items.len() <= limit, "{page}");
        token = page["continue"].as_str().unwrap().to_string();
        if !token.is_empty() {
            assert_eq!(items.len(), limit, "a page before the last one is full: {page}");
        }
        out.push(items);
        if token.is_empty() {
            return out;
        }
        assert!(out.len() < 100, "paging does not end");
    }
}

both_backends! {
    async fn create_put_and_patch_carry_labels(server: Server) {
        let created = server
            .post("/namespaces", json!({"name": "core", "labels": {"tier": "canary", "example.com/env": ""}}))
            .await
            .expect(201);
        assert_eq!(
            created,
            json!({"name": "core", "description": "", "labels": {"example.com/env": "", "tier": "canary"}, "active": false})
        );
        assert_eq!(server.get("/namespaces/core").await.expect(200), created);
        // Without labels: always an object.
        assert_eq!(server.namespace("sre").await["labels"], json!({}));

        let updated = server.put("/namespaces/core", json!({"labels": {"tier": "stable"}})).await.expect(200);
        assert_eq!(updated["labels"], json!({"tier": "stable"}));
        assert_eq!(server.get("/namespaces/core").await.expect(200)["labels"], json!({"tier": "stable"}));
        // PUT replaces: omitted labels become empty.
        assert_eq!(server.put("/namespaces/core", json!({"description": "d"})).await.expect(200)["labels"], json!({}));
        // PATCH merges (RFC 7386): null removes one label.
        server.put("/namespaces/core", json!({"description": "d", "labels": {"a": "1", "b": "2"}})).await.expect(200);
        let patched = server.patch("/namespaces/core", json!({"labels": {"a": null, "c": "3"}})).await.expect(200);
        assert_eq!(patched["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(patched["description"], "d", "a patch of labels leaves the description");
        assert_eq!(server.patch("/namespaces/core", json!({"labels": null})).await.expect(200)["labels"], json!({}));
        // The reconciler's activation keeps them.
        server.put("/namespaces/core", json!({"labels": {"tier": "canary"}})).await.expect(200);
        server.repo.activate_namespace("core").await.unwrap();
        let active = server.get("/namespaces/core").await.expect(200);
        assert_eq!((active["active"].clone(), active["labels"].clone()), (json!(true), json!({"tier": "canary"})));
    }

    async fn invalid_labels_are_400_naming_the_key(server: Server) {
        server.namespace("core").await;
        let long_name = "n".repeat(64);
        let long_prefix = format!("{}/x", "a.".repeat(127) + "a");
        let cases: Vec<(Value, Vec<String>)> = vec![
            (json!({"a/b/c": "x"}), vec!["labels".into(), "\"a/b/c\"".into()]),
            (json!({"-x": ""}), vec!["\"-x\"".into()]),
            (json!({"x-": ""}), vec!["\"x-\"".into()]),
            (json!({"": ""}), vec!["labels".into(), "key \"\"".into()]),
            (json!({"/x": ""}), vec!["\"/x\"".into(), "prefix".into()]),
            (json!({"Ex.com/x": ""}), vec!["\"Ex.com/x\"".into(), "prefix".into()]),
            (json!({"a b": ""}), vec!["\"a b\"".into()]),
            (json!({"ü": ""}), vec!["labels".into()]),
            (json!({long_name.clone(): ""}), vec![format!("{long_name:?}")]),
            (json!({long_prefix.clone(): ""}), vec!["prefix".into()]),
            (json!({"tier": "-canary"}), vec!["\"tier\"".into(), "value".into()]),
            (json!({"tier": "a/b"}), vec!["\"tier\"".into(), "value".into()]),
            (json!({"tier": "v".repeat(64)}), vec!["\"tier\"".into(), "value".into()]),
        ];
        for (labels, mentions) in cases {
            let mentions: Vec<&str> = mentions.iter().map(String::as_str).collect();
            server.post("/namespaces", json!({"name": "bad", "labels": labels})).await.error(400, &mentions);
            server.put("/namespaces/core", json!({"labels": labels})).await.error(400, &mentions);
            server.patch("/namespaces/core", json!({"labels": labels})).await.error(400, &mentions);
        }
        let many: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        server.post("/namespaces", json!({"name": "bad", "labels": many})).await.error(400, &["labels", "64"]);
        server.put("/namespaces/core", json!({"labels": many})).await.error(400, &["labels", "64"]);
        let enough: BTreeMap<String, String> = (0..64).map(|i| (format!("k{i}"), String::new())).collect();
        server.post("/namespaces", json!({"name": "full", "labels": enough})).await.expect(201);
        // Not a map of strings.
        server.post("/namespaces", json!({"name": "bad", "labels": {"a": 1}})).await.error(400, &[]);
        server.post("/namespaces", json!({"name": "bad", "labels": ["a"]})).await.error(400, &["labels"]);
        // A hostile key is cut in the message.
        let hostile = format!("{}/x", "K".repeat(20_000));
        let message = server.post("/namespaces", json!({"name": "bad", "labels": {hostile.clone(): ""}})).await.error(400, &["labels"]);
        assert!(message.len() < 600, "{message}");
        server.get("/namespaces/bad").await.error(404, &[]);
        assert_eq!(server.get("/namespaces/core").await.expect(200)["labels"], json!({}), "nothing was written");
    }

    async fn selectors_have_all_three_term_kinds(server: Server) {
        for (name, labels) in [
            ("a", json!({"tier": "canary", "env": "prod"})),
            ("b", json!({"tier": "canary", "env": "", "legacy": "yes"})),
            ("c", json!({"tier": "stable", "env": "prod"})),
            ("d", json!({"tier": "canary"})),
            ("e", json!({"example.com/team": "sre", "tier": ""})),
        ] {
            server.post("/namespaces", json!({"name": name, "labels": labels})).await.expect(201);
        }
        for (selector, want) in [
            ("tier=canary", vec!["a", "b", "d"]),
            ("tier=canary,env", vec!["a", "b"]),
            ("tier=canary,env,!legacy", vec!["a"]),
            ("!legacy", vec!["a", "c", "d", "e"]),
            ("env=", vec!["b"]),
            ("tier=", vec!["e"]),
            ("example.com/team=sre", vec!["e"]),
            ("example.com/team", vec!["e"]),
            (" tier = canary , !env ", vec!["d"]),
            ("nope", vec![]),
            ("", vec!["a", "b", "c", "d", "e"]),
        ] {
            let (status, list) = select(&server, selector, &[]).await;
            assert_eq!(status, 200, "{selector}: {list}");
            assert_eq!(names(&list), want, "{selector}");
            assert_eq!(list["continue"], "", "{selector}");
        }
        // The contract's own spelling, unencoded in the URL.
        assert_eq!(names(&server.get("/namespaces?labelSelector=tier=canary,env").await.expect(200)), ["a", "b"]);
        for bad in [",", "tier,", ",tier", "tier,,env", "=x", "!", "!a=b", "a/b/c", "tier=-x", "a==b", "a!=b", "a b"] {
            let (status, error) = select(&server, bad, &[]).await;
            assert_eq!(status, 400, "{bad}: {error}");
            assert!(error["message"].as_str().unwrap().contains("labelSelector"), "{bad}: {error}");
            assert_eq!(error["reason"], "BadRequest");
        }
    }

    async fn selected_lists_page_without_losing_or_repeating(server: Server) {
        for i in 0..13 {
            let labels = if i % 3 == 0 { json!({"tier": "canary"}) } else { json!({"tier": "stable"}) };
            server.post("/namespaces", json!({"name": format!("n{i:02}"), "labels": labels})).await.expect(201);
        }
        let canary = ["n00", "n03", "n06", "n09", "n12"];
        for limit in 1..=6 {
            let got = pages(&server, "tier=canary", limit).await;
            let flat: Vec<String> = got.iter().flatten().cloned().collect();
            assert_eq!(flat, canary, "limit {limit}: {got:?}");
            // `limit` counts matching items: no page but the last is short,
            // and a page ending at the last match says no more remain.
            assert_eq!(got.len(), canary.len().div_ceil(limit), "limit {limit}: {got:?}");
        }
        let stable = pages(&server, "!tier,x", 3).await;
        assert_eq!(stable, vec![Vec::<String>::new()]);
        // A namespace created behind the cursor is not repeated; one ahead is seen.
        let (_, first) = select(&server, "tier=canary", &[("limit", "2")]).await;
        assert_eq!(names(&first), ["n00", "n03"]);
        server.post("/namespaces", json!({"name": "n01a", "labels": {"tier": "canary"}})).await.expect(201);
        server.post("/namespaces", json!({"name": "n10a", "labels": {"tier": "canary"}})).await.expect(201);
        let token = first["continue"].as_str().unwrap();
        let (_, rest) = select(&server, "tier=canary", &[("continue", token)]).await;
        assert_eq!(names(&rest), ["n06", "n09", "n10a", "n12"]);
        // A token of a selected list is a token of the collection: a bad one is 400.
        let (status, _) = select(&server, "tier=canary", &[("continue", "!!")]).await;
        assert_eq!(status, 400);
    }

    async fn a_selected_watch_shows_what_starts_and_stops_matching(server: Server) {
        server.post("/namespaces", json!({"name": "a", "labels": {"tier": "canary"}})).await.expect(201);
        server.post("/namespaces", json!({"name": "b", "labels": {"tier": "stable"}})).await.expect(201);
        server.namespace("c").await;
        let mut events = Events::open(&server, "/namespaces?labelSelector=tier=canary", &server.admin, false).await;
        let a = events.expect("ADDED", "name", "a").await;
        assert_eq!(a, server.get("/namespaces/a").await.expect(200));
        // b starts matching: ADDED.
        server.put("/namespaces/b", json!({"labels": {"tier": "canary"}})).await.expect(200);
        let b = events.expect("ADDED", "name", "b").await;
        assert_eq!(b["labels"], json!({"tier": "canary"}));
        // a still matches and changes: MODIFIED.
        server.put("/namespaces/a", json!({"description": "x", "labels": {"tier": "canary"}})).await.expect(200);
        assert_eq!(events.expect("MODIFIED", "name", "a").await["description"], "x");
        // a stops matching: DELETED, carrying the object as last sent.
        server.put("/namespaces/a", json!({"labels": {"tier": "stable"}})).await.expect(200);
        let gone = events.expect("DELETED", "name", "a").await;
        assert_eq!((gone["description"].clone(), gone["labels"].clone()), (json!("x"), json!({"tier": "canary"})));
        // Changes of namespaces that do not match are no events: the next is d's.
        server.put("/namespaces/c", json!({"description": "unseen"})).await.expect(200);
        server.put("/namespaces/a", json!({"description": "unseen"})).await.expect(200);
        server.post("/namespaces", json!({"name": "d", "labels": {"tier": "canary"}})).await.expect(201);
        events.expect("ADDED", "name", "d").await;
        server.delete("/namespaces/b").await.expect(204);
        events.expect("DELETED", "name", "b").await;

        // With SSE and all three term kinds.
        let mut sse = Events::open(&server, "/namespaces?labelSelector=tier%3Dcanary,env,!legacy", &server.admin, true).await;
        server.post("/namespaces", json!({"name": "e", "labels": {"tier": "canary", "env": ""}})).await.expect(201);
        sse.expect("ADDED", "name", "e").await;
        server.patch("/namespaces/e", json!({"labels": {"legacy": "1"}})).await.expect(200);
        sse.expect("DELETED", "name", "e").await;
        server.patch("/namespaces/e", json!({"labels": {"legacy": null}})).await.expect(200);
        sse.expect("ADDED", "name", "e").await;

        // A malformed selector is the list's 400, before any stream.
        let refused = Events::request(&server, "/namespaces?labelSelector=a,,b", &server.admin, false).await;
        assert_eq!(refused.status(), 400);
        let error: Value = refused.json().await.unwrap();
        assert!(error["message"].as_str().unwrap().contains("labelSelector"), "{error}");
    }
}

/// A label key or value: mostly valid pieces, some hostile.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,8}[a-zA-Z0-9])?",
        2 => "[a-z0-9]{1,6}(\\.[a-z0-9]{1,4}){0,2}/[a-zA-Z0-9][a-zA-Z0-9_.-]{0,5}",
        1 => Just(String::new()),
        1 => "[ -~]{0,12}",
        1 => ".{0,8}",
        1 => "[a-z]{60,70}",
        1 => prop::sample::select(vec!["a/b/c", "/", "!", "=", ",", "a=b", "\u{0}", "\n", "ü", "-", "a.", "A.b/c"])
            .prop_map(String::from),
    ]
}

/// A valid key: a name, or a DNS-subdomain prefix and a name.
fn valid_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,8}[a-zA-Z0-9])?",
        "[a-z0-9]{1,6}(\\.[a-z0-9]{1,4}){0,2}/[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,5}[a-zA-Z0-9])?",
    ]
}

/// A valid value: empty or a name.
fn valid_value() -> impl Strategy<Value = String> {
    prop_oneof![1 => Just(String::new()), 3 => "[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,8}[a-zA-Z0-9])?"]
}

/// Label maps: mostly valid ones, the rest with generated pieces.
fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop_oneof![
        3 => prop::collection::btree_map(valid_key(), valid_value(), 1..6),
        2 => prop::collection::btree_map(piece(), piece(), 0..6),
    ]
}

fn selector() -> impl Strategy<Value = String> {
    let key = prop_oneof![2 => valid_key(), 1 => piece()];
    let value = prop_oneof![2 => valid_value(), 1 => piece()];
    prop::collection::vec(
        (prop::sample::select(vec!["", "!", "="]), key, value).prop_map(|(kind, key, value)| match kind {
            "!" => format!("!{key}"),
            "=" => format!("{key}={value}"),
            _ => key,
        }),
        0..4,
    )
    .prop_map(|terms| terms.join(","))
}

fn generated_labels_and_selectors(backend: Backend, seed: u8) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let server = runtime.block_on(Server::start(backend));
    let config = Config { cases: CASES, failure_persistence: None, max_shrink_iters: 50, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]));
    let n = std::sync::atomic::AtomicUsize::new(0);
    let valid_cases = std::sync::atomic::AtomicUsize::new(0);
    let result = runner.run(&(labels(), selector()), |(labels, selector)| {
        let name = format!("p{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let valid = validate_labels(&labels).is_ok();
        if valid && !labels.is_empty() {
            valid_cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let (status, body) = runtime.block_on(async {
            let reply = server.post("/namespaces", json!({"name": name, "labels": labels})).await;
            (reply.status, reply.json)
        });
        prop_assert!(status < 500, "labels {labels:?}: {status} {body}");
        if valid {
            prop_assert_eq!(status, 201, "valid labels {:?} refused: {}", labels, body);
            let got = runtime.block_on(server.get(&format!("/namespaces/{name}"))).expect(200);
            prop_assert_eq!(&got["labels"], &json!(labels));
            // The selector of all its labels selects it.
            let all: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let (status, list) = runtime.block_on(select(&server, &all.join(","), &[]));
            prop_assert_eq!(status, 200, "{}", list);
            prop_assert!(names(&list).contains(&name), "{all:?}: {list}");
        } else {
            prop_assert_eq!(status, 400, "invalid labels {:?} taken: {}", labels, body);
            prop_assert!(body["message"].as_str().unwrap_or_default().starts_with("labels"), "{body}");
        }
        let (status, list) = runtime.block_on(select(&server, &selector, &[("limit", "3")]));
        match Selector::parse(&selector) {
            Ok(parsed) => {
                prop_assert_eq!(status, 200, "selector {:?}: {}", selector, list);
                for item in list["items"].as_array().unwrap() {
                    let labels: BTreeMap<String, String> = serde_json::from_value(item["labels"].clone()).unwrap();
                    prop_assert!(parsed.matches(&labels), "{selector:?} listed {item}");
                }
            }
            Err(_) => {
                prop_assert_eq!(status, 400, "selector {:?}: {}", selector, list);
                prop_assert!(list["message"].as_str().unwrap_or_default().contains("labelSelector"), "{list}");
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let valid_cases = valid_cases.into_inner();
    assert!(valid_cases >= CASES as usize / 10, "only {valid_cases} cases had valid, non-empty labels");
    runtime.block_on(async { server.get("/namespaces").await.expect(200) });
    drop(server);
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
}

#[test]
fn generated_labels_and_selectors_never_break_the_server_local() {
    generated_labels_and_selectors(Backend::Local, 0x31);
}

#[test]
fn generated_labels_and_selectors_never_break_the_server_etcd() {
    generated_labels_and_selectors(Backend::Etcd, 0x32);
}
