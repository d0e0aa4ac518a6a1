//! Namespaces (§4.1) and the shared list/pagination rules (§4).

use serde_json::json;

use crate::both_backends;

both_backends! {
    async fn crud(server: Server) {
        let created = server.post("/namespaces", json!({"name": "core", "description": "the core team"})).await.expect(201);
        assert_eq!(created, json!({"name": "core", "description": "the core team", "labels": {}, "active": false}));
        assert_eq!(server.get("/namespaces/core").await.expect(200), created);
        let bare = server.post("/namespaces", json!({"name": "sre"})).await.expect(201);
        assert_eq!(bare, json!({"name": "sre", "description": "", "labels": {}, "active": false}));

        let updated = server.put("/namespaces/core", json!({"description": "renamed"})).await.expect(200);
        assert_eq!(updated["description"], "renamed");
        // PUT replaces: an omitted description becomes empty.
        assert_eq!(server.put("/namespaces/core", json!({"name": "core"})).await.expect(200)["description"], "");
        assert_eq!(server.patch("/namespaces/core", json!({"description": "p"})).await.expect(200)["description"], "p");
        assert_eq!(server.patch("/namespaces/core", json!({})).await.expect(200)["description"], "p");

        server.post("/namespaces", json!({"name": "core"})).await.error(409, &["core"]);
        server.delete("/namespaces/core").await.expect(204);
        server.get("/namespaces/core").await.error(404, &["core"]);
        server.delete("/namespaces/core").await.error(404, &["core"]);
        server.put("/namespaces/core", json!({})).await.error(404, &["core"]);
        server.patch("/namespaces/core", json!({})).await.error(404, &["core"]);
    }

    async fn active_is_computed(server: Server) {
        server.post("/namespaces", json!({"name": "core", "active": true})).await.error(400, &["active"]);
        server.namespace("core").await;
        server.put("/namespaces/core", json!({"active": false})).await.error(400, &["active"]);
        server.patch("/namespaces/core", json!({"active": true})).await.error(400, &["active"]);
        server.put("/namespaces/core", json!({"name": "other"})).await.error(400, &["other"]);
        // The reconciler's activation shows through.
        server.repo.activate_namespace("core").await.unwrap();
        assert_eq!(server.get("/namespaces/core").await.expect(200)["active"], true);
        assert_eq!(server.put("/namespaces/core", json!({"description": "x"})).await.expect(200)["active"], true);
    }

    async fn delete_with_subscriptions_is_409_naming_them(server: Server) {
        server.namespace("core").await;
        for api in ["compute.example.com", "storage.example.com"] {
            server.registration(api, json!({})).await;
            server.subscribe("core", api).await;
        }
        server.delete("/namespaces/core").await.error(409, &["compute.example.com", "storage.example.com"]);
        server.get("/namespaces/core").await.expect(200);
        server.delete("/namespaces/core/subscriptions/compute.example.com").await.expect(204);
        server.delete("/namespaces/core").await.error(409, &["storage.example.com"]);
        server.delete("/namespaces/core/subscriptions/storage.example.com").await.expect(204);
        server.delete("/namespaces/core").await.expect(204);
    }

    async fn delete_sweeps_role_bindings(server: Server) {
        server.namespace("core").await;
        server.post("/namespaces/core/rolebindings", json!({"name": "b", "role": "r", "user": "u"})).await.expect(201);
        server.delete("/namespaces/core").await.expect(204);
        server.namespace("core").await;
        let bindings = server.get("/namespaces/core/rolebindings").await.expect(200);
        assert_eq!(bindings, json!({"items": [], "continue": ""}), "a re-created namespace inherits no grants");
    }

    async fn lists_are_sorted_paginated_and_never_omit_continue(server: Server) {
        assert_eq!(server.get("/namespaces").await.expect(200), json!({"items": [], "continue": ""}));
        for name in ["delta", "alpha", "charlie", "bravo", "echo"] {
            server.namespace(name).await;
        }
        let all = server.get("/namespaces").await.expect(200);
        let names: Vec<_> = all["items"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["alpha", "bravo", "charlie", "delta", "echo"]);
        assert_eq!(all["continue"], "");
        let first = server.get("/namespaces?limit=2").await.expect(200);
        assert_eq!(first["items"].as_array().unwrap().len(), 2);
        let token = first["continue"].as_str().unwrap().to_string();
        let second = server.get(&format!("/namespaces?limit=2&continue={token}")).await.expect(200);
        assert_eq!(second["items"][0]["name"], "charlie");
        // A page that ends exactly at the last item says so.
        let token = second["continue"].as_str().unwrap().to_string();
        let last = server.get(&format!("/namespaces?limit=1&continue={token}")).await.expect(200);
        assert_eq!((last["items"][0]["name"].clone(), last["continue"].clone()), (json!("echo"), json!("")));
        // limit=0 means all.
        assert_eq!(server.get("/namespaces?limit=0").await.expect(200)["items"].as_array().unwrap().len(), 5);
    }

    async fn bad_list_parameters_are_400(server: Server) {
        server.get("/namespaces?limit=abc").await.error(400, &[]);
        server.get("/namespaces?limit=-1").await.error(400, &[]);
        server.get("/namespaces?continue=!!!").await.error(400, &["continue"]);
        // A token from another collection is refused, not misread.
        server.namespace("core").await;
        server.namespace("sre").await;
        let token = server.get("/namespaces?limit=1").await.expect(200)["continue"].as_str().unwrap().to_string();
        server.get(&format!("/users?continue={token}")).await.error(400, &["continue"]);
    }
}
