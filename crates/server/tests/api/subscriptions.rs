//! Subscriptions: the seed's "Managing one", "Forcing a re-sync" and
//! "Active/State/CurrentSyncID are computed", sentence by sentence.

use kayra_catalog::repo::RecordRef;
use kayra_core::Subscription;
use serde_json::{Value, json};

use crate::both_backends;
use crate::common::Server;

/// A namespace `core` subscribed-ready: `compute.example.com` (short name
/// `compute`) with a known sync id.
async fn setup(server: &Server) {
    server.namespace("core").await;
    server.registration("compute.example.com", json!({"short_name": "compute", "sync_id": "2026-02-01T00Z"})).await;
}

/// The stored record's revision, to tell whether a request wrote.
async fn revision(server: &Server, namespace: &str, api: &str) -> i64 {
    server.repo.get_subscription(namespace, api).await.unwrap().expect("subscription stored").revision
}

/// Plays the reconciler: a successful reconcile toward `sync_id`.
async fn reconcile(server: &Server, namespace: &str, api: &str, sync_id: &str) {
    let seen = server.repo.get_subscription(namespace, api).await.unwrap().unwrap();
    crate::common::record_result(&server.repo, &seen, Some(sync_id)).await;
}

const FIELDS: [&str; 7] = ["api", "namespace", "active", "state", "current_sync_id", "expected_sync_id", "synced"];

fn assert_view(view: &Value) {
    let object = view.as_object().expect("object");
    let mut keys: Vec<_> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut expected = FIELDS.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected, "a subscription response has exactly these fields, none omitted");
}

both_backends! {
    /// The seed's curl example, as written.
    async fn seed_create_example(server: Server) {
        setup(&server).await;
        let reply = server
            .raw(
                reqwest::Method::POST,
                "/namespaces/core/subscriptions",
                Some(&server.admin),
                r#"{"api": "compute.example.com"}"#,
            )
            .await;
        let view = reply.expect(201);
        assert_view(&view);
        assert_eq!(
            view,
            json!({"api": "compute.example.com", "namespace": "core", "active": false, "state": "init",
                   "current_sync_id": "", "expected_sync_id": "2026-02-01T00Z", "synced": false})
        );
        let stored = server.repo.get_subscription("core", "compute.example.com").await.unwrap().unwrap().value;
        assert_eq!(stored, Subscription::new("core", "compute.example.com"));
        let got = server.get("/namespaces/core/subscriptions/compute.example.com").await.expect(200);
        assert_eq!(got, view);
    }

    async fn short_name_is_refused_naming_the_long_name(server: Server) {
        setup(&server).await;
        server.post("/namespaces/core/subscriptions", json!({"api": "compute"})).await
            .error(400, &["compute.example.com"]);
        server.get("/namespaces/core/subscriptions/compute").await.error(400, &["compute.example.com"]);
        server.put("/namespaces/core/subscriptions/compute/sync", json!({})).await.error(400, &["compute.example.com"]);
        // A name that is neither a long name nor anyone's short name.
        server.post("/namespaces/core/subscriptions", json!({"api": "nothing"})).await.error(400, &["nothing"]);
    }

    async fn unknown_api_and_missing_namespace_are_404(server: Server) {
        setup(&server).await;
        server.post("/namespaces/core/subscriptions", json!({"api": "storage.example.com"})).await
            .error(404, &["storage.example.com", "platform dev", "region local"]);
        server.post("/namespaces/nope/subscriptions", json!({"api": "compute.example.com"})).await
            .error(404, &["nope"]);
        server.get("/namespaces/nope/subscriptions").await.error(404, &["nope"]);
        server.get("/namespaces/core/subscriptions/compute.example.com").await.error(404, &["compute.example.com"]);
    }

    async fn duplicate_create_is_409(server: Server) {
        setup(&server).await;
        server.subscribe("core", "compute.example.com").await;
        server.post("/namespaces/core/subscriptions", json!({"api": "compute.example.com"})).await
            .error(409, &["already exists"]);
    }

    async fn create_requires_only_api_and_refuses_everything_else(server: Server) {
        setup(&server).await;
        let path = "/namespaces/core/subscriptions";
        server.post(path, json!({})).await.error(400, &["api"]);
        server.post(path, json!({"api": 7})).await.error(400, &["api"]);
        server.post(path, json!({"api": "compute.example.com", "mode": "x"})).await.error(400, &["mode"]);
        server.post(path, json!({"api": "compute.example.com", "namespace": "other"})).await.error(400, &["other"]);
        // Repeating the path's namespace is harmless.
        server.post(path, json!({"api": "compute.example.com", "namespace": "core"})).await.expect(201);
    }

    /// "None of the three are accepted from the request body, on create or update."
    async fn computed_fields_are_refused_by_name(server: Server) {
        setup(&server).await;
        for (field, value) in [
            ("active", json!(true)),
            ("active", json!(false)),
            ("state", json!("success")),
            ("state", json!("init")),
            ("current_sync_id", json!("x")),
            ("current_sync_id", json!("")),
            ("expected_sync_id", json!("x")),
            ("synced", json!(true)),
        ] {
            let mut body = json!({"api": "compute.example.com"});
            body[field] = value.clone();
            server.post("/namespaces/core/subscriptions", body.clone()).await.error(400, &[field]);
            assert!(server.repo.get_subscription("core", "compute.example.com").await.unwrap().is_none());
        }
        server.subscribe("core", "compute.example.com").await;
        let item = "/namespaces/core/subscriptions/compute.example.com";
        for field in ["active", "state", "current_sync_id"] {
            let mut body = json!({"api": "compute.example.com"});
            body[field] = json!("x");
            server.put(item, body.clone()).await.error(400, &[field]);
            server.patch(item, body).await.error(400, &[field]);
        }
    }

    /// PUT .../subscriptions/:api is a no-op confirmation: `{}` or
    /// `{"api": same}`, anything else 400, and nothing is written.
    async fn put_is_a_no_op_confirmation(server: Server) {
        setup(&server).await;
        server.subscribe("core", "compute.example.com").await;
        reconcile(&server, "core", "compute.example.com", "2026-02-01T00Z").await;
        let item = "/namespaces/core/subscriptions/compute.example.com";
        let before = revision(&server, "core", "compute.example.com").await;
        let expected = server.get(item).await.expect(200);
        assert_eq!(server.put(item, json!({})).await.expect(200), expected);
        assert_eq!(server.put(item, json!({"api": "compute.example.com"})).await.expect(200), expected);
        server.put(item, json!({"api": "other.example.com"})).await.error(400, &["other.example.com"]);
        server.put(item, json!({"bogus": 1})).await.error(400, &["bogus"]);
        server.put(item, json!({"namespace": "core"})).await.error(400, &["namespace"]);
        assert_eq!(revision(&server, "core", "compute.example.com").await, before, "a confirmation never writes");
        server.put("/namespaces/core/subscriptions/other.example.com", json!({})).await.error(404, &["other.example.com"]);
    }

    /// The seed's re-sync curl example: resets current_sync_id, nothing else.
    async fn seed_sync_example_resets_only_current_sync_id(server: Server) {
        server.namespace("sre").await;
        server.registration("dev.example.com", json!({"sync_id": "s1"})).await;
        server.subscribe("sre", "dev.example.com").await;
        reconcile(&server, "sre", "dev.example.com", "s1").await;
        let synced = server.get("/namespaces/sre/subscriptions/dev.example.com").await.expect(200);
        assert_eq!((synced["active"].clone(), synced["state"].clone(), synced["synced"].clone()), (json!(true), json!("success"), json!(true)));

        let before = revision(&server, "sre", "dev.example.com").await;
        let reply = server
            .raw(reqwest::Method::PUT, "/namespaces/sre/subscriptions/dev.example.com/sync", Some(&server.admin), "{}")
            .await;
        let view = reply.expect(200);
        assert_view(&view);
        assert_eq!(
            view,
            json!({"api": "dev.example.com", "namespace": "sre", "active": true, "state": "success",
                   "current_sync_id": "", "expected_sync_id": "s1", "synced": false})
        );
        let after = revision(&server, "sre", "dev.example.com").await;
        assert!(after > before, "the reset is a write");

        // Already empty: still written, because the write is the trigger.
        server.put("/namespaces/sre/subscriptions/dev.example.com/sync", json!({})).await.expect(200);
        assert!(revision(&server, "sre", "dev.example.com").await > after, "an already-empty reset still writes");
        // An empty body counts as {}; any field is refused.
        server.raw(reqwest::Method::PUT, "/namespaces/sre/subscriptions/dev.example.com/sync", Some(&server.admin), "").await.expect(200);
        server.put("/namespaces/sre/subscriptions/dev.example.com/sync", json!({"current_sync_id": "x"})).await
            .error(400, &["current_sync_id"]);
        server.put("/namespaces/sre/subscriptions/nope.example.com/sync", json!({})).await.error(404, &["nope.example.com"]);
    }

    /// The reset says it is a re-sync request in the record it writes, for
    /// the reconciler's run `trigger`; no response shows that and no
    /// request sets it, and the reconciler's result clears it.
    async fn a_resync_request_is_stored_never_shown_nor_accepted(server: Server) {
        setup(&server).await;
        let stored = || async { server.repo.get_subscription("core", "compute.example.com").await.unwrap().unwrap().value };
        let field = json!({"api": "compute.example.com", "resync_requested": true});
        server.post("/namespaces/core/subscriptions", field.clone()).await.error(400, &["resync_requested"]);
        server.subscribe("core", "compute.example.com").await;
        assert!(!stored().await.resync_requested);
        let item = "/namespaces/core/subscriptions/compute.example.com";
        server.put(item, field.clone()).await.error(400, &["resync_requested"]);
        server.put(&format!("{item}/sync"), json!({"resync_requested": false})).await.error(400, &["resync_requested"]);
        assert!(!stored().await.resync_requested, "a refused request writes nothing");
        // Never synced: the reset changes nothing the API shows, yet it is a request.
        let view = server.put(&format!("{item}/sync"), json!({})).await.expect(200);
        assert_view(&view);
        assert!(stored().await.resync_requested);
        assert_view(&server.get(item).await.expect(200));
        reconcile(&server, "core", "compute.example.com", "2026-02-01T00Z").await;
        assert!(!stored().await.resync_requested, "a result is no re-sync request");
    }

    async fn a_failed_subscription_keeps_its_state_on_reset(server: Server) {
        setup(&server).await;
        server.subscribe("core", "compute.example.com").await;
        let seen = server.repo.get_subscription("core", "compute.example.com").await.unwrap().unwrap();
        crate::common::record_result(&server.repo, &seen, None).await;
        let view = server.put("/namespaces/core/subscriptions/compute.example.com/sync", json!({})).await.expect(200);
        assert_eq!((view["active"].clone(), view["state"].clone()), (json!(false), json!("error")));
    }

    /// expected_sync_id is read fresh from the registration on every response.
    async fn expected_sync_id_is_read_fresh(server: Server) {
        setup(&server).await;
        server.subscribe("core", "compute.example.com").await;
        reconcile(&server, "core", "compute.example.com", "2026-02-01T00Z").await;
        let item = "/namespaces/core/subscriptions/compute.example.com";
        assert_eq!(server.get(item).await.expect(200)["synced"], true);

        let bumped = server.put("/apiregistrations/compute.example.com/sync", json!({})).await.expect(200);
        let new_sync_id = bumped["sync_id"].as_str().unwrap().to_string();
        for view in [
            server.get(item).await.expect(200),
            server.get("/namespaces/core/subscriptions").await.expect(200)["items"][0].clone(),
            server.put(item, json!({})).await.expect(200),
        ] {
            assert_eq!(view["expected_sync_id"], new_sync_id.as_str());
            assert_eq!(view["current_sync_id"], "2026-02-01T00Z");
            assert_eq!(view["synced"], false);
        }

        // The registration gone (removed behind the API's back): empty, never missing.
        let key = RecordRef::Registration("compute.example.com");
        server.repo.delete(key, None, "registration").await.unwrap();
        let view = server.get(item).await.expect(200);
        assert_view(&view);
        assert_eq!((view["expected_sync_id"].clone(), view["synced"].clone()), (json!(""), json!(false)));
    }

    async fn list_is_sorted_and_paginated(server: Server) {
        server.namespace("core").await;
        for api in ["c.example.com", "a.example.com", "b.example.com"] {
            server.registration(api, json!({"sync_id": format!("sync-{api}")})).await;
            server.subscribe("core", api).await;
        }
        let all = server.get("/namespaces/core/subscriptions").await.expect(200);
        let apis: Vec<_> = all["items"].as_array().unwrap().iter().map(|v| v["api"].as_str().unwrap().to_string()).collect();
        assert_eq!(apis, ["a.example.com", "b.example.com", "c.example.com"]);
        assert_eq!(all["continue"], "");
        assert_eq!(all["items"][1]["expected_sync_id"], "sync-b.example.com");
        let first = server.get("/namespaces/core/subscriptions?limit=2").await.expect(200);
        assert_eq!(first["items"].as_array().unwrap().len(), 2);
        let token = first["continue"].as_str().unwrap();
        assert!(!token.is_empty());
        let rest = server.get(&format!("/namespaces/core/subscriptions?limit=2&continue={token}")).await.expect(200);
        assert_eq!(rest["items"][0]["api"], "c.example.com");
        assert_eq!(rest["continue"], "");
    }

    async fn delete_removes_it(server: Server) {
        setup(&server).await;
        server.subscribe("core", "compute.example.com").await;
        let item = "/namespaces/core/subscriptions/compute.example.com";
        assert_eq!(server.delete(item).await.expect(204), Value::Null);
        server.get(item).await.error(404, &["compute.example.com"]);
        server.delete(item).await.error(404, &["compute.example.com"]);
    }
}
