//! API registrations (§4.2): defaults, computed fields, short names, PUT
//! and PATCH semantics, the `/sync` shorthand, `/status`, referential
//! integrity.

use serde_json::json;

use crate::both_backends;

fn parses_as_rfc3339(value: &str) -> bool {
    humantime::parse_rfc3339(value).is_ok()
}

both_backends! {
    async fn create_fills_defaults_and_stamps_the_deployment(server: Server) {
        let reply = server.post("/apiregistrations", json!({"name": "compute.example.com"})).await;
        let reg = reply.expect(201);
        let keys: Vec<_> = reg.as_object().unwrap().keys().cloned().collect();
        for field in ["name", "short_name", "mode", "sync_id", "sync_id_updated_at", "endpoint", "description", "platform", "region"] {
            assert!(keys.iter().any(|k| k == field), "{field} missing from {reg}");
        }
        assert_eq!(keys.len(), 9, "{reg}");
        assert_eq!((reg["platform"].clone(), reg["region"].clone()), (json!("dev"), json!("local")));
        assert_eq!((reg["short_name"].clone(), reg["mode"].clone(), reg["endpoint"].clone()), (json!(""), json!(""), json!("")));
        let sync_id = reg["sync_id"].as_str().unwrap();
        assert!(parses_as_rfc3339(sync_id), "{sync_id}");
        assert_eq!(server.get("/apiregistrations/compute.example.com").await.expect(200), reg);

        let full = json!({"name": "x.example.com", "short_name": "x", "mode": "api", "sync_id": "2026-02-01T00Z",
                          "endpoint": "http://127.0.0.1:9000", "description": "d"});
        let reg = server.post("/apiregistrations", full).await.expect(201);
        assert_eq!(reg["sync_id"], "2026-02-01T00Z");
        assert_eq!(reg["mode"], "api");
    }

    async fn platform_and_region_are_computed(server: Server) {
        for field in ["platform", "region"] {
            let mut body = json!({"name": "compute.example.com"});
            body[field] = json!("dev");
            server.post("/apiregistrations", body.clone()).await.error(400, &[field]);
        }
        server.registration("compute.example.com", json!({})).await;
        server.put("/apiregistrations/compute.example.com", json!({"platform": "p"})).await.error(400, &["platform"]);
        server.patch("/apiregistrations/compute.example.com", json!({"region": "r"})).await.error(400, &["region"]);
    }

    async fn names_and_short_names_are_validated(server: Server) {
        for bad in ["compute", "Compute.example.com", "a..b", "-a.b", "ü.example.com", ""] {
            server.post("/apiregistrations", json!({"name": bad})).await.error(400, &[]);
        }
        server.post("/apiregistrations", json!({"name": "a.example.com", "short_name": "a.b"})).await.error(400, &["a.b"]);
        server.post("/apiregistrations", json!({"name": "a.example.com", "endpoint": "ftp://x"})).await.error(400, &["endpoint"]);
        server.registration("compute.example.com", json!({"short_name": "compute"})).await;
        server.post("/apiregistrations", json!({"name": "other.example.com", "short_name": "compute"})).await
            .error(409, &["compute", "compute.example.com"]);
        server.post("/apiregistrations", json!({"name": "compute.example.com"})).await.error(409, &["compute.example.com"]);
        // The short name addresses nothing: a 400 naming the long name.
        server.get("/apiregistrations/compute").await.error(400, &["compute.example.com"]);
        server.get("/apiregistrations/missing.example.com").await
            .error(404, &["missing.example.com", "platform dev", "region local"]);
    }

    /// PUT replaces the writable fields; omitted ones become empty, except
    /// sync_id, which keeps its value unless given.
    async fn put_replaces_writable_fields(server: Server) {
        let created = server.registration("compute.example.com", json!({"short_name": "compute", "mode": "api", "sync_id": "s1",
            "endpoint": "http://127.0.0.1:1", "description": "d"})).await;
        let reg = server.put("/apiregistrations/compute.example.com", json!({"mode": "trigger"})).await.expect(200);
        assert_eq!(
            reg,
            json!({"name": "compute.example.com", "short_name": "", "mode": "trigger", "sync_id": "s1", "endpoint": "",
                   "description": "", "platform": "dev", "region": "local",
                   "sync_id_updated_at": created["sync_id_updated_at"]})
        );
        let reg = server.put("/apiregistrations/compute.example.com", json!({"name": "compute.example.com", "sync_id": "s2"})).await.expect(200);
        assert_eq!((reg["sync_id"].clone(), reg["mode"].clone()), (json!("s2"), json!("")));
        server.put("/apiregistrations/compute.example.com", json!({"name": "other.example.com"})).await.error(400, &["other.example.com"]);
        server.put("/apiregistrations/missing.example.com", json!({})).await.error(404, &["missing.example.com"]);
        server.registration("b.example.com", json!({"short_name": "b"})).await;
        server.put("/apiregistrations/compute.example.com", json!({"short_name": "b"})).await.error(409, &["b.example.com"]);
        // Keeping its own short name is no conflict.
        server.put("/apiregistrations/b.example.com", json!({"short_name": "b", "mode": "api"})).await.expect(200);
    }

    async fn patch_is_a_json_merge_patch(server: Server) {
        server.registration("compute.example.com", json!({"short_name": "compute", "mode": "api", "sync_id": "s1", "description": "d"})).await;
        let reg = server.patch("/apiregistrations/compute.example.com", json!({"description": "new", "short_name": null})).await.expect(200);
        assert_eq!(
            (reg["description"].clone(), reg["short_name"].clone(), reg["mode"].clone(), reg["sync_id"].clone()),
            (json!("new"), json!(""), json!("api"), json!("s1"))
        );
        server.patch("/apiregistrations/compute.example.com", json!({"mode": 3})).await.error(400, &["mode"]);
        server.patch("/apiregistrations/compute.example.com", json!({"bogus": true})).await.error(400, &["bogus"]);
        server.patch("/apiregistrations/compute.example.com", json!({"name": "x.example.com"})).await.error(400, &["x.example.com"]);
        server.patch("/apiregistrations/compute.example.com", json!({"endpoint": "not a url"})).await.error(400, &["endpoint"]);
    }

    /// PUT /apiregistrations/:name/sync: now, RFC 3339 with sub-second
    /// precision, always different from the old value.
    async fn sync_sets_a_fresh_sub_second_sync_id(server: Server) {
        server.registration("compute.example.com", json!({"sync_id": "2026-02-01T00Z"})).await;
        let mut previous = "2026-02-01T00Z".to_string();
        for _ in 0..5 {
            let reg = server.put("/apiregistrations/compute.example.com/sync", json!({})).await.expect(200);
            let sync_id = reg["sync_id"].as_str().unwrap().to_string();
            assert_ne!(sync_id, previous);
            assert!(parses_as_rfc3339(&sync_id), "{sync_id}");
            assert!(sync_id.contains('.') && sync_id.ends_with('Z'), "sub-second UTC: {sync_id}");
            previous = sync_id;
        }
        server.put("/apiregistrations/compute.example.com/sync", json!({"sync_id": "x"})).await.error(400, &["sync_id"]);
        server.put("/apiregistrations/missing.example.com/sync", json!({})).await.error(404, &["missing.example.com"]);
    }

    async fn status_reports_every_subscriber(server: Server) {
        let reg = server.registration("compute.example.com", json!({"sync_id": "s2"})).await;
        for ns in ["sre", "core", "web"] {
            server.namespace(ns).await;
            server.subscribe(ns, "compute.example.com").await;
        }
        for (ns, sync_id) in [("core", "s1"), ("sre", "s2")] {
            let seen = server.repo.get_subscription(ns, "compute.example.com").await.unwrap().unwrap();
            crate::common::record_result(&server.repo, &seen, Some(sync_id)).await;
        }
        let mut status = server.get("/apiregistrations/compute.example.com/status").await.expect(200);
        assert_eq!(status.as_object_mut().unwrap().remove("sync_id_updated_at"), Some(reg["sync_id_updated_at"].clone()));
        assert_eq!(
            status,
            json!({"api": "compute.example.com", "sync_id": "s2", "total": 3, "synced": 1, "failed": 0, "pending": 2, "held": 0, "subscribers": [
                {"namespace": "core", "active": true, "state": "success", "current_sync_id": "s1", "synced": false, "wave": ""},
                {"namespace": "sre", "active": true, "state": "success", "current_sync_id": "s2", "synced": true, "wave": ""},
                {"namespace": "web", "active": false, "state": "init", "current_sync_id": "", "synced": false, "wave": ""},
            ]})
        );
        let empty = server.registration("idle.example.com", json!({"sync_id": "z"})).await;
        assert_eq!(empty["name"], "idle.example.com");
        let mut status = server.get("/apiregistrations/idle.example.com/status").await.expect(200);
        assert_eq!(status.as_object_mut().unwrap().remove("sync_id_updated_at"), Some(empty["sync_id_updated_at"].clone()));
        assert_eq!(
            status,
            json!({"api": "idle.example.com", "sync_id": "z", "subscribers": [], "total": 0, "synced": 0, "failed": 0, "pending": 0, "held": 0})
        );
        server.get("/apiregistrations/missing.example.com/status").await.error(404, &["missing.example.com"]);
    }

    async fn delete_is_refused_while_subscribed(server: Server) {
        server.registration("compute.example.com", json!({})).await;
        for ns in ["core", "sre"] {
            server.namespace(ns).await;
            server.subscribe(ns, "compute.example.com").await;
        }
        server.delete("/apiregistrations/compute.example.com").await.error(409, &["core", "sre"]);
        for ns in ["core", "sre"] {
            server.delete(&format!("/namespaces/{ns}/subscriptions/compute.example.com")).await.expect(204);
        }
        server.delete("/apiregistrations/compute.example.com").await.expect(204);
        server.get("/apiregistrations/compute.example.com").await.error(404, &["compute.example.com"]);
        server.delete("/apiregistrations/compute.example.com").await.error(404, &["compute.example.com"]);
    }

    async fn list_is_sorted_and_paginated(server: Server) {
        for name in ["c.example.com", "a.example.com", "b.example.com", "d.example.com"] {
            server.registration(name, json!({})).await;
        }
        let mut names = Vec::new();
        let mut token = String::new();
        loop {
            let page = server.get(&format!("/apiregistrations?limit=3&continue={token}")).await.expect(200);
            names.extend(page["items"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_string()));
            token = page["continue"].as_str().unwrap().to_string();
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(names, ["a.example.com", "b.example.com", "c.example.com", "d.example.com"]);
    }
}
