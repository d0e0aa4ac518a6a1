//! The audit trail (platform §13): every catalog change writes exactly one
//! record in its own transaction, a refused one none; reasons, sources,
//! filters, paging and retention. Each case on both backends.
//!
//! Like the RBAC tests, the one-record-per-change test is checked against
//! the router's declared `routes()`: it fails when a declared change route
//! (POST, PUT, PATCH, DELETE) is not among those it exercised.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use kayra_catalog::api::routes;
use kayra_catalog::repo::audit::{id_at, order_key};
use kayra_catalog::repo::cancels::CancelRequest;
use kayra_catalog::repo::{Collection, RecordRef, Repository};
use kayra_core::notifications::{Delivery, DeliveryState, Event};
use kayra_core::rollout::{RolloutPolicy, RolloutRecord, assign};
use kayra_core::{Run, RunResult};
use proptest::prelude::*;
use reqwest::Method;
use serde_json::{Value, json};

use crate::api::runs::{run, run_id};
use crate::both_backends;
use crate::common::{Backend, Reply, Server};

/// A request as `admin` with `headers` (name, value bytes).
async fn send(server: &Server, method: Method, path: &str, body: Option<Value>, headers: &[(&str, &[u8])]) -> Reply {
    let mut request = server.client.request(method, server.url(path)).bearer_auth(&server.admin);
    for (name, value) in headers {
        request = request.header(*name, reqwest::header::HeaderValue::from_bytes(value).unwrap());
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request failed");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { status, headers, text, json }
}

/// Every record, newest first, read page by page.
async fn all_records(server: &Server) -> Vec<Value> {
    let mut records = Vec::new();
    let mut token = String::new();
    loop {
        let page = server.get(&format!("/audit?limit=7&continue={token}")).await.expect(200);
        records.extend(page["items"].as_array().unwrap().iter().cloned());
        token = page["continue"].as_str().unwrap().to_string();
        if token.is_empty() {
            return records;
        }
    }
}

async fn count(server: &Server) -> usize {
    all_records(server).await.len()
}

/// The one record `step` wrote (its reason is `step`).
async fn record_of(server: &Server, step: &str) -> Value {
    let records = all_records(server).await;
    let mine: Vec<&Value> = records.iter().filter(|r| r["reason"] == step).collect();
    assert_eq!(mine.len(), 1, "{step}: exactly one record: {records:#?}");
    mine[0].clone()
}

/// A change, its status, and the record it must write: (method, path,
/// body, status, resource, verb, namespace, name, before is null, after is null).
type Step = (Method, String, Option<Value>, u16, &'static str, &'static str, &'static str, &'static str, bool, bool);

/// The declared route (method, path pattern) that serves `method` on the
/// concrete `path`: each `{param}` segment matches any one segment.
fn route_of(method: &Method, path: &str) -> (String, &'static str) {
    let segments: Vec<&str> = path.split('/').collect();
    let matching: Vec<&'static str> = routes()
        .into_iter()
        .filter(|r| r.method.as_str() == method.as_str())
        .map(|r| r.path)
        .filter(|pattern| {
            let parts: Vec<&str> = pattern.split('/').collect();
            parts.len() == segments.len()
                && parts.iter().zip(&segments).all(|(p, s)| (p.starts_with('{') && p.ends_with('}')) || p == s)
        })
        .collect();
    assert_eq!(matching.len(), 1, "{method} {path}: one declared route, not {matching:?}");
    (method.to_string(), matching[0])
}

/// Every declared route that changes something (POST, PUT, PATCH, DELETE).
fn change_routes() -> BTreeSet<(String, &'static str)> {
    routes()
        .into_iter()
        .filter(|r| matches!(r.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE"))
        .map(|r| (r.method.to_string(), r.path))
        .collect()
}

/// The rollout of `api` toward `sync_id` over two subscribers, written as
/// a reconciler would (no audit record: the reconciler's own write).
async fn seed_rollout(repo: &Repository, api: &str, sync_id: &str) {
    let policy: RolloutPolicy = serde_json::from_value(json!({"waves": [
        {"name": "canary", "size": "1", "approval": "auto"}, {"name": "rest", "approval": "manual"}]}))
    .expect("a policy");
    let subscribers: Vec<(String, BTreeMap<String, String>)> =
        ["a", "b"].iter().map(|ns| (ns.to_string(), BTreeMap::new())).collect();
    let (record, _) = RolloutRecord::start(api, sync_id, &policy, assign(&policy, &subscribers), SystemTime::now());
    let seen = repo.rollout(api).await.unwrap().map(|r| r.revision);
    repo.write_rollout(api, seen, &record, &[]).await.unwrap().expect("the rollout is written");
}

/// Acts as the reconciler holding run `id` of `core`'s subscription to
/// `api`: waits for its cancel request, records the run `cancelled` and
/// answers the request, as the run's result transaction does.
fn hold_run(repo: &Repository, api: &str, id: &str) -> tokio::task::JoinHandle<()> {
    let (repo, api, id) = (repo.clone(), api.to_string(), id.to_string());
    tokio::spawn(async move {
        let record = RecordRef::CancelRequest { namespace: "core", api: &api, id: &id };
        let found = std::sync::Mutex::new(None);
        kayra_testkit::eventually("the cancel request", || async {
            let got = repo.get::<CancelRequest>(record).await.unwrap();
            let present = got.is_some();
            *found.lock().unwrap() = got;
            present
        })
        .await;
        let request = found.into_inner().unwrap().unwrap();
        let mut cancelled: Run = run("core", 7, RunResult::Cancelled);
        cancelled.id.clone_from(&id);
        cancelled.error = request.value.message();
        repo.add_run(&cancelled, 20).await.expect("store the run");
        repo.update(record, &request.value.answered(&cancelled), request.revision, "cancel request").await.unwrap();
    })
}

/// A dead delivery to sink `ops`, stored as the reconciler's notifier
/// leaves one after `max_attempts`; its id.
async fn dead_delivery(repo: &Repository, api: &str) -> String {
    let event = Event { id: "e1".into(), kind: "subscription.failed".into(), api: api.into(), ..Event::default() };
    let delivery = Delivery {
        state: DeliveryState::Dead,
        attempts: 10,
        last_error: "HTTP 500".into(),
        ..Delivery::new(&event, "ops")
    };
    repo.create(RecordRef::Delivery(&delivery.id), &delivery, "delivery").await.expect("store the delivery");
    delivery.id
}

/// Where a GET shows the object a change at `path` recorded as `after`.
fn shown_at(path: &str) -> &str {
    ["/sync", "/cancel"].iter().find_map(|suffix| path.strip_suffix(suffix)).unwrap_or(path)
}

both_backends! {
    async fn every_change_writes_exactly_one_record(server: Server) {
        let ns = "/namespaces/core";
        let reg = "/apiregistrations/compute.example.com";
        let sub = "/namespaces/core/subscriptions/compute.example.com";
        let api = "compute.example.com";
        let cancel = format!("{sub}/runs/{}/cancel", run_id(7));
        let retry = format!("/notifications/{}/retry", dead_delivery(&server.repo, api).await);
        // (method, path, body, status, resource, verb, namespace, name, before is null, after is null)
        let mut steps: Vec<Step> = vec![
            (Method::POST, "/namespaces".into(), Some(json!({"name": "core"})), 201, "namespaces", "create", "", "core", true, false),
            (Method::PUT, ns.into(), Some(json!({"description": "d1"})), 200, "namespaces", "update", "", "core", false, false),
            (Method::PATCH, ns.into(), Some(json!({"description": "d2"})), 200, "namespaces", "patch", "", "core", false, false),
            (Method::PUT, ns.into(), Some(json!({"description": "d2"})), 200, "namespaces", "update", "", "core", false, false),
            (Method::POST, "/apiregistrations".into(), Some(json!({"name": "compute.example.com", "sync_id": "s1"})), 201, "apiregistrations", "create", "", "compute.example.com", true, false),
            (Method::PUT, reg.into(), Some(json!({"sync_id": "s2"})), 200, "apiregistrations", "update", "", "compute.example.com", false, false),
            (Method::PATCH, reg.into(), Some(json!({"description": "x"})), 200, "apiregistrations", "patch", "", "compute.example.com", false, false),
            (Method::PUT, format!("{reg}/sync"), Some(json!({})), 200, "apiregistrations/sync", "patch", "", "compute.example.com", false, false),
            (Method::PUT, format!("{reg}/rollout"), Some(json!({"action": "pause"})), 200, "apiregistrations/rollout", "update", "", "compute.example.com", false, false),
            (Method::POST, "/namespaces/core/subscriptions".into(), Some(json!({"api": "compute.example.com"})), 201, "subscriptions", "create", "core", "compute.example.com", true, false),
            (Method::PUT, sub.into(), Some(json!({})), 200, "subscriptions", "update", "core", "compute.example.com", false, false),
            (Method::PATCH, sub.into(), Some(json!({})), 200, "subscriptions", "patch", "core", "compute.example.com", false, false),
            (Method::PUT, format!("{sub}/sync"), Some(json!({})), 200, "subscriptions/sync", "patch", "core", "compute.example.com", false, false),
            (Method::PUT, cancel.clone(), Some(json!({})), 200, "subscriptions/cancel", "patch", "core", "compute.example.com", true, false),
            (Method::DELETE, sub.into(), None, 204, "subscriptions", "delete", "core", "compute.example.com", false, true),
            (Method::POST, "/users".into(), Some(json!({"name": "bob"})), 201, "users", "create", "", "bob", true, false),
            (Method::PUT, "/users/bob".into(), Some(json!({"description": "b"})), 200, "users", "update", "", "bob", false, false),
            (Method::PATCH, "/users/bob".into(), Some(json!({"description": "c"})), 200, "users", "patch", "", "bob", false, false),
            (Method::POST, "/users/bob/tokens".into(), Some(json!({})), 201, "users/tokens", "create", "", "bob", true, false),
            (Method::POST, "/roles".into(), Some(json!({"name": "r", "rules": []})), 201, "roles", "create", "", "r", true, false),
            (Method::PUT, "/roles/r".into(), Some(json!({"rules": [{"resources": ["*"], "verbs": ["get"]}]})), 200, "roles", "update", "", "r", false, false),
            (Method::PATCH, "/roles/r".into(), Some(json!({"rules": []})), 200, "roles", "patch", "", "r", false, false),
            (Method::POST, "/clusterrolebindings".into(), Some(json!({"name": "b", "role": "r", "user": "bob"})), 201, "clusterrolebindings", "create", "", "b", true, false),
            (Method::PUT, "/clusterrolebindings/b".into(), Some(json!({"role": "r", "user": "admin"})), 200, "clusterrolebindings", "update", "", "b", false, false),
            (Method::PATCH, "/clusterrolebindings/b".into(), Some(json!({"user": "bob"})), 200, "clusterrolebindings", "patch", "", "b", false, false),
            (Method::DELETE, "/clusterrolebindings/b".into(), None, 204, "clusterrolebindings", "delete", "", "b", false, true),
            (Method::POST, "/namespaces/core/rolebindings".into(), Some(json!({"name": "nb", "role": "r", "user": "bob"})), 201, "rolebindings", "create", "core", "nb", true, false),
            (Method::PUT, "/namespaces/core/rolebindings/nb".into(), Some(json!({"role": "r", "user": "admin"})), 200, "rolebindings", "update", "core", "nb", false, false),
            (Method::PATCH, "/namespaces/core/rolebindings/nb".into(), Some(json!({"user": "bob"})), 200, "rolebindings", "patch", "core", "nb", false, false),
            (Method::DELETE, "/namespaces/core/rolebindings/nb".into(), None, 204, "rolebindings", "delete", "core", "nb", false, true),
            (Method::DELETE, "/roles/r".into(), None, 204, "roles", "delete", "", "r", false, true),
            (Method::PUT, retry.clone(), Some(json!({})), 200, "notifications/retry", "patch", "", "e1.ops", false, false),
        ];
        // Each change route this test exercises, to check against the declared ones at the end.
        let mut exercised = BTreeSet::new();
        let mut reasons = Vec::new();
        let mut issued = None;
        let before_all = count(&server).await;
        for (i, (method, path, body, status, resource, verb, namespace, name, before_null, after_null)) in steps.drain(..).enumerate() {
            let step = format!("step {i}: {method} {path}");
            exercised.insert(route_of(&method, &path));
            reasons.push(step.clone());
            // What the reconcilers would have done first: a rollout to act
            // on, a run in flight to cancel (and its holder to stop it).
            if path.ends_with("/rollout") {
                seed_rollout(&server.repo, api, "s3").await;
            }
            let holder = (path == cancel).then(|| hold_run(&server.repo, api, &run_id(7)));
            let reply = send(&server, method.clone(), &path, body, &[("x-kayra-reason", step.as_bytes())]).await;
            assert_eq!(reply.status, status, "{step}: {}", reply.text);
            if let Some(holder) = holder {
                holder.await.unwrap();
            }
            if path == "/users/bob/tokens" {
                issued = Some((reply.json["id"].as_str().unwrap().to_string(), reply.json["token"].as_str().unwrap().to_string()));
            }
            let record = record_of(&server, &step).await;
            assert_eq!(count(&server).await, before_all + i + 1, "{step}: one record more");
            let fields = (&record["user"], &record["resource"], &record["verb"], &record["namespace"], &record["name"], &record["code"]);
            assert_eq!(fields, (&json!("admin"), &json!(resource), &json!(verb), &json!(namespace), &json!(name), &json!(status)), "{step}: {record:#}");
            assert_eq!((record["before"].is_null(), record["after"].is_null()), (before_null, after_null), "{step}: {record:#}");
            assert_eq!(record["source"], "127.0.0.1", "{step}");
            assert!(!record["request_id"].as_str().unwrap().is_empty() && record["time"].as_str().unwrap().ends_with('Z'));
            // A GET of the object shows what the record's `after` shows.
            if path == retry {
                let listed = server.get("/notifications?sink=ops").await.expect(200);
                assert_eq!(record["after"], listed["items"][0], "{step}");
                assert_eq!((&record["before"]["state"], &record["after"]["state"]), (&json!("dead"), &json!("pending")), "{step}");
            } else if !after_null && method != Method::POST {
                let shown = server.get(shown_at(&path)).await.expect(200);
                assert_eq!(record["after"], shown, "{step}");
            }
            let by_id = server.get(&format!("/audit/{}", record["id"].as_str().unwrap())).await.expect(200);
            assert_eq!(by_id, record);
        }
        // Before/after show the change itself.
        let step_of = |change: &str| reasons.iter().find(|r| r.ends_with(change)).expect("a step").clone();
        let sync = record_of(&server, &step_of(": PUT /apiregistrations/compute.example.com/sync")).await;
        assert_eq!(sync["before"]["sync_id"], "s2");
        assert_ne!(sync["after"]["sync_id"], "s2");
        let noop = record_of(&server, "step 3: PUT /namespaces/core").await;
        assert_eq!(noop["before"], noop["after"], "a PUT that changes nothing is recorded as such");
        let paused = record_of(&server, &step_of(": PUT /apiregistrations/compute.example.com/rollout")).await;
        assert_eq!((&paused["before"]["state"], &paused["after"]["state"]), (&json!("progressing"), &json!("paused")));
        let cancelled = record_of(&server, &step_of(&format!(": PUT {cancel}"))).await;
        assert_eq!(cancelled["after"]["result"], "cancelled");
        // The token is only ever its id; revoking it is recorded too.
        let (id, token) = issued.unwrap();
        let create = record_of(&server, &step_of(": POST /users/bob/tokens")).await;
        assert_eq!(create["after"], json!({"id": id}));
        let step = "revoke";
        let revoke_path = format!("/users/bob/tokens/{id}");
        exercised.insert(route_of(&Method::DELETE, &revoke_path));
        send(&server, Method::DELETE, &revoke_path, None, &[("x-kayra-reason", step.as_bytes())]).await.expect(204);
        let revoke = record_of(&server, step).await;
        assert_eq!((&revoke["resource"], &revoke["before"], &revoke["after"]), (&json!("users/tokens"), &json!({"id": id}), &Value::Null));
        // Deletes of users, registrations and namespaces.
        for (path, resource) in [("/users/bob", "users"), (reg, "apiregistrations"), (ns, "namespaces")] {
            exercised.insert(route_of(&Method::DELETE, path));
            send(&server, Method::DELETE, path, None, &[("x-kayra-reason", path.as_bytes())]).await.expect(204);
            let record = record_of(&server, path).await;
            assert_eq!((&record["resource"], record["before"].is_object(), &record["after"]), (&json!(resource), true, &Value::Null), "{path}");
        }
        // Every declared change route was exercised above: a new one must
        // be added here, with the record it writes.
        let missing: Vec<_> = change_routes().difference(&exercised).cloned().collect();
        assert!(missing.is_empty(), "declared change routes this test does not exercise: {missing:?}");
        // No stored byte of the audit trail holds the token.
        let prefix = server.repo.layout().prefix(Collection::Audit);
        let (stored, _) = server.repo.store().list_all(&prefix).await.unwrap();
        assert!(stored.len() >= 36);
        for kv in &stored {
            assert!(!String::from_utf8_lossy(&kv.value).contains(&token), "a token in {}", kv.key);
            assert!(!String::from_utf8_lossy(&kv.value).contains(&server.admin), "the admin token in {}", kv.key);
        }
    }

    async fn refused_changes_write_no_record(server: Server) {
        server.namespace("core").await;
        server.registration("compute.example.com", json!({})).await;
        let reader = server.user_with_rules("reader", json!([{"resources": ["*"], "verbs": ["get", "list"]}])).await;
        let before = count(&server).await;
        // 409: a create whose compare fails (the record exists).
        server.post("/namespaces", json!({"name": "core"})).await.expect(409);
        server.post("/apiregistrations", json!({"name": "compute.example.com"})).await.expect(409);
        // 409: a delete refused while referenced.
        server.subscribe("core", "compute.example.com").await;
        let before = before + 1;
        server.delete("/apiregistrations/compute.example.com").await.expect(409);
        // 404, 400, 403, 401.
        server.delete("/namespaces/nope").await.expect(404);
        server.put("/namespaces/core", json!({"description": 3})).await.expect(400);
        server.call(Method::PUT, "/apiregistrations/compute.example.com/sync", Some(&reader), Some(json!({}))).await.expect(403);
        server.call(Method::POST, "/namespaces", Some("not-a-token"), Some(json!({"name": "x"}))).await.expect(401);
        server.call(Method::POST, "/namespaces", None, Some(json!({"name": "x"}))).await.expect(401);
        assert_eq!(count(&server).await, before, "{:#?}", all_records(&server).await);
        // The reader may list the trail only when granted `audit`.
        server.call(Method::GET, "/audit", Some(&reader), None).await.expect(200);
        let other = server.user_with_rules("other", json!([{"resources": ["namespaces"], "verbs": ["*"]}])).await;
        server.call(Method::GET, "/audit", Some(&other), None).await.expect(403);
        server.call(Method::GET, "/audit/x", Some(&other), None).await.expect(403);
        server.get("/audit/not-an-id").await.expect(404);
        server.get("/audit/0193b2c1-0000-7000-8000-000000000000").await.expect(404);
    }

    async fn reasons_are_bounded_and_can_be_required(server: Server) {
        server.registration("compute.example.com", json!({})).await;
        let sync = "/apiregistrations/compute.example.com/sync";
        let long = "é".repeat(1024);
        send(&server, Method::PUT, sync, Some(json!({})), &[("x-kayra-reason", long.as_bytes())]).await.expect(200);
        assert_eq!(all_records(&server).await[0]["reason"], json!(long));
        let before = count(&server).await;
        let too_long = "a".repeat(1025);
        for bad in [too_long.as_bytes(), b"tab\there", "next\u{85}line".as_bytes(), b"\xff\xfe"] {
            let reply = send(&server, Method::PUT, sync, Some(json!({})), &[("x-kayra-reason", bad)]).await;
            assert_eq!(reply.status, 400, "{bad:?}: {}", reply.text);
            assert!(reply.json["message"].as_str().unwrap().contains("X-Kayra-Reason"), "{}", reply.text);
        }
        assert_eq!(count(&server).await, before, "no record of a refused change");

        let strict = server.restart_with(|c| c.audit.require_reason = vec!["apiregistrations/sync".into()]).await;
        let reply = strict.put(sync, json!({})).await;
        assert_eq!(reply.status, 400, "{}", reply.text);
        assert!(reply.json["message"].as_str().unwrap().contains("X-Kayra-Reason"), "{}", reply.text);
        assert_eq!(count(&strict).await, before);
        send(&strict, Method::PUT, sync, Some(json!({})), &[("x-kayra-reason", b"roll out v2")]).await.expect(200);
        let record = record_of(&strict, "roll out v2").await;
        assert_eq!(record["resource"], "apiregistrations/sync");
        // Other resources need none.
        strict.patch("/apiregistrations/compute.example.com", json!({"description": "d"})).await.expect(200);
    }

    async fn listings_filter_and_page_newest_first(server: Server) {
        let bob = server.user_with_rules("bob", json!([{"resources": ["namespaces"], "verbs": ["*"]}])).await;
        let cutoff = server.get("/audit?limit=1").await.expect(200)["items"][0]["time"].as_str().unwrap().to_string();
        for i in 0..5 {
            server.call(Method::POST, "/namespaces", Some(&bob), Some(json!({"name": format!("n{i}")}))).await.expect(201);
            server.put(&format!("/namespaces/n{i}"), json!({"description": "x"})).await.expect(200);
        }
        let all = all_records(&server).await;
        let ids: Vec<&str> = all.iter().map(|r| r["id"].as_str().unwrap()).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(ids, sorted, "newest first");
        assert_eq!(all[0]["name"], "n4");

        let by_bob = server.get("/audit?user=bob").await.expect(200);
        let names: Vec<&str> = by_bob["items"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["n4", "n3", "n2", "n1", "n0"]);
        let page = server.get("/audit?user=bob&limit=2").await.expect(200);
        assert_eq!(page["items"].as_array().unwrap().len(), 2);
        let next = page["continue"].as_str().unwrap();
        let rest = server.get(&format!("/audit?user=bob&limit=2&continue={next}")).await.expect(200);
        assert_eq!(rest["items"][0]["name"], "n2");
        let one = server.get("/audit?resource=namespaces&name=n3&verb=update").await;
        assert_eq!(one.status, 400, "unknown filters are refused: {}", one.text);
        let n3 = server.get("/audit?resource=namespaces&name=n3").await.expect(200);
        assert_eq!(n3["items"].as_array().unwrap().len(), 2);
        assert_eq!(n3["items"][0]["user"], "admin");
        let in_ns = server.get("/audit?namespace=core").await.expect(200);
        assert_eq!(in_ns["items"], json!([]));
        let since = server.get(&format!("/audit?since={cutoff}")).await.expect(200);
        assert!(since["items"].as_array().unwrap().iter().all(|r| r["time"].as_str().unwrap() >= cutoff.as_str()));
        assert!(since["items"].as_array().unwrap().len() >= 10);
        let future = server.get("/audit?since=2999-01-01T00:00:00Z").await.expect(200);
        assert_eq!((&future["items"], &future["continue"]), (&json!([]), &json!("")));
        server.get("/audit?since=yesterday").await.expect(400);
        server.get("/audit?continue=bm9wZQ").await.expect(400);
    }

    async fn retention_removes_old_records(server: Server) {
        // A record made two hours ago, planted as the Repository would write it.
        let old = id_at(SystemTime::now() - Duration::from_secs(7200));
        let key = server.repo.store_key_of(RecordRef::Audit(&order_key(&old).unwrap()));
        let record = json!({"id": old, "time": "", "user": "ghost", "verb": "create", "resource": "namespaces",
            "namespace": "", "name": "x", "code": 201, "reason": "", "request_id": "", "source": "", "before": null, "after": null});
        server.repo.store().create(&key, serde_json::to_vec(&record).unwrap()).await.unwrap();
        server.get(&format!("/audit/{old}")).await.expect(200);
        server.namespace("fresh").await;
        // A serve with a one-hour retention removes it at startup; the fresh one stays.
        let pruning = server.restart_with(|c| c.audit.retention = kayra_config::Duration::from_secs(3600)).await;
        kayra_testkit::eventually("the old record is removed", || async {
            pruning.get(&format!("/audit/{old}")).await.status == 404
        })
        .await;
        let records = all_records(&pruning).await;
        assert!(records.iter().any(|r| r["name"] == "fresh"), "{records:#?}");
    }

    async fn a_watch_streams_the_records_made_from_now_on(server: Server) {
        server.registration("compute.example.com", json!({})).await;
        let reader = server.user_with_rules("reader", json!([{"resources": ["audit"], "verbs": ["get", "list"]}])).await;
        server.call(Method::GET, "/audit?watch=true", Some(&reader), None).await.expect(403);
        server.get("/audit?watch=true&verb=patch").await.expect(400);
        let mut stream = server
            .client
            .get(server.url("/audit?watch=true&resource=apiregistrations/sync"))
            .bearer_auth(&server.admin)
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status().as_u16(), 200);
        assert_eq!(stream.headers()["content-type"], "application/x-ndjson");
        // Filtered out, then the one it shows.
        server.namespace("core").await;
        send(&server, Method::PUT, "/apiregistrations/compute.example.com/sync", Some(json!({})), &[("x-kayra-reason", b"watched")]).await.expect(200);
        let mut text = String::new();
        while !text.contains('\n') {
            let chunk = tokio::time::timeout(Duration::from_secs(30), stream.chunk()).await.expect("an event in time");
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap().expect("the stream stays open")));
        }
        let event: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!((&event["type"], &event["object"]["reason"], &event["object"]["resource"]), (&json!("ADDED"), &json!("watched"), &json!("apiregistrations/sync")));
        assert_eq!(event["object"], server.get(&format!("/audit/{}", event["object"]["id"].as_str().unwrap())).await.expect(200));
    }

    async fn sources_believe_forwarded_for_only_from_trusted_proxies(server: Server) {
        let forwarded: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.1, 203.0.113.7"), ("x-kayra-reason", b"plain")];
        send(&server, Method::POST, "/namespaces", Some(json!({"name": "a"})), forwarded).await.expect(201);
        assert_eq!(record_of(&server, "plain").await["source"], "127.0.0.1");
        let behind = server.restart_with(|c| c.server.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()]).await;
        let forwarded: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.1, 203.0.113.7"), ("x-kayra-reason", b"proxied")];
        send(&behind, Method::POST, "/namespaces", Some(json!({"name": "b"})), forwarded).await.expect(201);
        assert_eq!(record_of(&behind, "proxied").await["source"], "203.0.113.7");
        send(&behind, Method::POST, "/namespaces", Some(json!({"name": "c"})), &[("x-kayra-reason", b"direct")]).await.expect(201);
        assert_eq!(record_of(&behind, "direct").await["source"], "127.0.0.1");
    }
}

#[test]
fn generated_reasons_never_break_the_server() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let server = runtime.block_on(async {
        let server = Server::start(Backend::Local).await;
        server.registration("compute.example.com", json!({})).await;
        server
    });
    let strategy = proptest::collection::vec(
        prop_oneof![any::<char>(), proptest::sample::select(vec!['\t', '\u{7f}', '\u{85}', '\u{9f}', 'é', ' '])],
        0..1100,
    );
    let mut runner =
        proptest::test_runner::TestRunner::new(proptest::test_runner::Config { cases: 64, ..Default::default() });
    runner
        .run(&strategy, |chars| {
            let reason: String = chars.into_iter().collect();
            // What HTTP can carry at all (no C0 but tab, no DEL) reaches the server.
            let Ok(value) = reqwest::header::HeaderValue::from_bytes(reason.as_bytes()) else { return Ok(()) };
            let reply = runtime.block_on(send(
                &server,
                Method::PUT,
                "/apiregistrations/compute.example.com/sync",
                Some(json!({})),
                &[("x-kayra-reason", value.as_bytes())],
            ));
            // HTTP may drop the value's surrounding blanks on the way.
            let sent = reason.trim_matches([' ', '\t']);
            let fine = |text: &str| !text.chars().any(char::is_control) && text.chars().count() <= 1024;
            match reply.status {
                200 => prop_assert!(fine(sent), "accepted {reason:?}"),
                400 => prop_assert!(!fine(&reason), "refused {reason:?}: {}", reply.text),
                other => prop_assert!(false, "{other} for {reason:?}: {}", reply.text),
            }
            Ok(())
        })
        .unwrap();
}
