//! A seeded property test of the catalog API's bodies and query strings:
//! generated JSON (right fields with wrong types, hostile strings, deep
//! nesting, unknown and computed fields) and generated query strings sent
//! to every kind of route, as admin. Every answer is below 500 and in the
//! error shape when it is an error; the server never panics (a panic would
//! surface as a dropped connection or a 500).
//!
//! Run alone: `cargo test -p kayra-server --test api -- fuzz`.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

use crate::common::{Backend, Server};

const CASES: u32 = 600;

const FIELDS: &[&str] = &[
    "name",
    "description",
    "short_name",
    "mode",
    "sync_id",
    "endpoint",
    "api",
    "role",
    "user",
    "rules",
    "apis",
    "resources",
    "verbs",
    "active",
    "state",
    "platform",
    "region",
    "current_sync_id",
    "namespace",
    "token",
    "id",
    "expires_at",
    "continue",
    "limit",
    "extra",
];

const STRINGS: &[&str] = &[
    "",
    "x",
    "core",
    "compute.example.com",
    "catalog",
    "catalog.example.com",
    "..",
    "../../admin",
    "a/b",
    "a\\b",
    "\u{0}",
    "\n",
    "\u{1b}]0;pwned\u{7}",
    "http://u:p@h",
    "http://127.0.0.1:1",
    "%2e%2e",
    "ü",
    "\u{202e}",
    "*",
    "9223372036854775807",
    "-1",
    "null",
    "{}",
    "2026-02-01T00Z",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        proptest::sample::select(STRINGS).prop_map(|s| json!(s)),
        "\\PC{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((proptest::sample::select(FIELDS), inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

const PATHS: &[&str] = &[
    "/namespaces",
    "/namespaces/core",
    "/namespaces/core/subscriptions",
    "/namespaces/core/subscriptions/compute.example.com",
    "/namespaces/core/subscriptions/compute.example.com/sync",
    "/namespaces/core/subscriptions/compute.example.com/runs",
    "/apiregistrations",
    "/apiregistrations/compute.example.com",
    "/apiregistrations/compute.example.com/sync",
    "/apiregistrations/compute.example.com/status",
    "/users",
    "/users/bob",
    "/users/bob/tokens",
    "/roles",
    "/roles/reader",
    "/clusterrolebindings",
    "/clusterrolebindings/bob-reader",
    "/namespaces/core/rolebindings",
    "/namespaces/core/rolebindings/bob-reader",
];

const QUERIES: &[&str] = &[
    "limit=",
    "limit=0",
    "limit=-1",
    "limit=18446744073709551615",
    "limit=99999999999999999999999",
    "limit=1.5",
    "limit=abc",
    "limit=1&limit=2",
    "continue=",
    "continue=%00",
    "continue=..%2f..",
    "continue=eyJ4Ijp9",
    "continue=%ff%fe",
    "watch=true",
    "x=%zz",
    "%",
    "&&&",
    "limit=2&continue=\u{1b}",
];

fn request() -> impl Strategy<Value = (reqwest::Method, String, Option<Value>)> {
    let method = proptest::sample::select(vec![
        reqwest::Method::GET,
        reqwest::Method::POST,
        reqwest::Method::PUT,
        reqwest::Method::PATCH,
        reqwest::Method::DELETE,
    ]);
    let query = proptest::collection::vec(proptest::sample::select(QUERIES), 0..3).prop_map(|q| q.join("&"));
    (method, proptest::sample::select(PATHS), query, proptest::option::weighted(0.8, json_value())).prop_map(
        |(method, path, query, body)| {
            let target = if query.is_empty() { path.to_string() } else { format!("{path}?{query}") };
            (method, target, body)
        },
    )
}

#[test]
fn generated_bodies_and_queries_never_break_the_server() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let server = runtime.block_on(async {
        let server = Server::start(Backend::Local).await;
        server.namespace("core").await;
        server.registration("compute.example.com", json!({"short_name": "compute"})).await;
        server.subscribe("core", "compute.example.com").await;
        server.post("/users", json!({"name": "bob"})).await.expect(201);
        server.post("/roles", json!({"name": "reader", "rules": []})).await.expect(201);
        server
    });

    let config = Config { cases: CASES, failure_persistence: None, max_shrink_iters: 100, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[0x4b; 32]));
    let result = runner.run(&request(), |(method, target, body)| {
        let reply = runtime.block_on(async {
            let mut request = server.client.request(method.clone(), server.url(&target)).bearer_auth(&server.admin);
            if let Some(body) = &body {
                request = request.header("content-type", "application/json").body(body.to_string());
            }
            request.send().await
        });
        let reply = reply.map_err(|e| TestCaseError::fail(format!("{method} {target}: no answer: {e}")))?;
        let status = reply.status().as_u16();
        // A granted `?watch=true` is an endless stream: its head is the
        // answer, and dropping the reply closes it.
        let streaming = reply
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/x-ndjson") || t.starts_with("text/event-stream"));
        if streaming {
            prop_assert!(status == 200, "{method} {target}: a stream answered {status}");
            return Ok(());
        }
        let text = runtime.block_on(reply.text()).unwrap_or_default();
        prop_assert!(status < 500, "{method} {target} {body:?} answered {status}: {text}");
        if status >= 400 {
            let error: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            prop_assert!(error["code"] == status && error["message"].is_string(), "{method} {target}: {text}");
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    // The server is still whole.
    runtime.block_on(async { server.get("/namespaces").await.expect(200) });
    drop(server);
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
}
