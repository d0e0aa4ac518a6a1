//! Authentication, users and tokens, revocation, `/whoami` and the
//! bootstrap of §5.4.

use reqwest::Method;
use serde_json::json;

use crate::both_backends;

both_backends! {
    async fn requests_without_a_valid_token_are_401(server: Server) {
        for token in [None, Some("wrong"), Some("")] {
            let reply = server.call(Method::GET, "/namespaces", token, None).await;
            assert_eq!(reply.headers.get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"));
            reply.error(401, &[]);
        }
        let reply = server.client.get(server.url("/namespaces")).header("authorization", "Basic YWRtaW46YWRtaW4=").send().await.unwrap();
        assert_eq!(reply.status(), 401);
        // 401 comes first: before routing inside /apis, before RBAC, before the body.
        server.call(Method::POST, "/namespaces", None, Some(json!({"bogus": 1}))).await.error(401, &[]);
        server.call(Method::GET, "/no/such/route", None, None).await.error(401, &[]);
        server.call(Method::GET, "/apis/compute.example.com/v1/namespaces/core/things", None, None).await.error(401, &[]);
    }

    async fn tokens_are_shown_once_and_revoked_at_once(server: Server) {
        server.post("/users", json!({"name": "alice"})).await.expect(201);
        let created = server.post("/users/alice/tokens", json!({})).await.expect(201);
        let mut keys: Vec<_> = created.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["created_at", "id", "token"]);
        let token = created["token"].as_str().unwrap().to_string();
        assert!(token.len() >= 43, "at least 32 bytes of entropy: {token}");
        let id = created["id"].as_str().unwrap().to_string();

        let whoami = server.call(Method::GET, "/whoami", Some(&token), None).await.expect(200);
        assert_eq!(whoami, json!({"user": "alice", "cluster_roles": []}));

        let listed = server.get("/users/alice/tokens").await.expect(200);
        assert_eq!(listed, json!({"items": [{"id": id, "created_at": created["created_at"]}], "continue": ""}));
        assert!(!listed.to_string().contains(&token), "a listing never shows the secret");
        assert_eq!(server.get(&format!("/users/alice/tokens/{id}")).await.expect(200)["id"], id.as_str());

        // Stored only as a hash.
        let tokens = server.repo.layout().prefix(kayra_catalog::repo::Collection::Tokens);
        let (all, _) = server.repo.store().list_all(&tokens).await.unwrap();
        assert!(all.iter().all(|kv| !String::from_utf8_lossy(&kv.value).contains(&token) && !kv.key.contains(&token)));

        server.delete(&format!("/users/alice/tokens/{id}")).await.expect(204);
        server.call(Method::GET, "/whoami", Some(&token), None).await.error(401, &[]);
        server.delete(&format!("/users/alice/tokens/{id}")).await.error(404, &[&id]);
        server.get(&format!("/users/alice/tokens/{id}")).await.error(404, &[&id]);
        assert_eq!(server.get("/users/alice/tokens").await.expect(200)["items"], json!([]));
        server.post("/users/nobody/tokens", json!({})).await.error(404, &["nobody"]);
        server.post("/users/alice/tokens", json!({"token": "mine"})).await.error(400, &["token"]);
    }

    async fn a_token_is_revoked_only_for_its_owner(server: Server) {
        let (_, alice) = server.user_with_token("alice").await;
        server.user_with_token("bob").await;
        let alice_id = server.get("/users/alice/tokens").await.expect(200)["items"][0]["id"].as_str().unwrap().to_string();
        server.delete(&format!("/users/bob/tokens/{alice_id}")).await.error(404, &[]);
        server.call(Method::GET, "/whoami", Some(&alice), None).await.expect(200);
    }

    async fn deleting_a_user_revokes_its_tokens(server: Server) {
        let (_, token) = server.user_with_token("alice").await;
        server.call(Method::GET, "/whoami", Some(&token), None).await.expect(200);
        server.delete("/users/alice").await.expect(204);
        server.call(Method::GET, "/whoami", Some(&token), None).await.error(401, &[]);
        // Re-creating the user does not bring the old token back.
        server.post("/users", json!({"name": "alice"})).await.expect(201);
        server.call(Method::GET, "/whoami", Some(&token), None).await.error(401, &[]);
    }

    async fn users_crud(server: Server) {
        let alice = server.post("/users", json!({"name": "alice", "description": "ops"})).await.expect(201);
        assert_eq!(alice, json!({"name": "alice", "description": "ops"}));
        server.post("/users", json!({"name": "alice"})).await.error(409, &["alice"]);
        assert_eq!(server.put("/users/alice", json!({"description": "x"})).await.expect(200)["description"], "x");
        assert_eq!(server.patch("/users/alice", json!({"description": null})).await.expect(200)["description"], "");
        let names: Vec<_> = server.get("/users").await.expect(200)["items"].as_array().unwrap()
            .iter().map(|u| u["name"].as_str().unwrap().to_string()).collect();
        assert_eq!(names, ["admin", "alice"]);
        server.delete("/users/alice").await.expect(204);
        server.get("/users/alice").await.error(404, &["alice"]);
    }

    async fn whoami_lists_cluster_roles(server: Server) {
        let whoami = server.get("/whoami").await.expect(200);
        assert_eq!(whoami, json!({"user": "admin", "cluster_roles": ["sysadmin"]}));
        let (_, token) = server.user_with_token("alice").await;
        server.post("/clusterrolebindings", json!({"name": "alice-2", "role": "auditor", "user": "alice"})).await.expect(201);
        let whoami = server.call(Method::GET, "/whoami", Some(&token), None).await.expect(200);
        assert_eq!(whoami, json!({"user": "alice", "cluster_roles": ["alice-role", "auditor"]}));
    }

    /// §5.4: role sysadmin, user admin, binding admin-sysadmin and the
    /// token, made sure of idempotently on every start.
    async fn bootstrap_is_idempotent(server: Server) {
        let role = server.get("/roles/sysadmin").await.expect(200);
        assert_eq!(role, json!({"name": "sysadmin", "rules": [{"apis": ["*"], "resources": ["*"], "verbs": ["*"]}]}));
        server.get("/users/admin").await.expect(200);
        assert_eq!(
            server.get("/clusterrolebindings/admin-sysadmin").await.expect(200),
            json!({"name": "admin-sysadmin", "role": "sysadmin", "user": "admin"})
        );
        assert_eq!(server.get("/users/admin/tokens").await.expect(200)["items"].as_array().unwrap().len(), 1);

        // Narrowing the role and rebinding would lock the admin out; a
        // restart repairs both, and adds nothing twice.
        server.put("/clusterrolebindings/admin-sysadmin", json!({"role": "sysadmin", "user": "nobody"})).await.expect(200);
        server.get("/namespaces").await.error(403, &["admin"]);
        let narrowed = kayra_core::Role {
            name: "sysadmin".into(),
            rules: vec![kayra_core::Rule { apis: vec!["*".into()], resources: vec!["namespaces".into()], verbs: vec!["get".into()] }],
        };
        let key = kayra_catalog::repo::RecordRef::Role("sysadmin");
        let current = server.repo.get::<kayra_core::Role>(key).await.unwrap().unwrap();
        server.repo.update(key, &narrowed, current.revision, "role").await.unwrap();
        let again = server.restart_with(|_| {}).await;
        again.get("/namespaces").await.expect(200);
        assert_eq!(again.get("/clusterrolebindings/admin-sysadmin").await.expect(200)["user"], "admin");
        assert_eq!(again.get("/users/admin/tokens").await.expect(200)["items"].as_array().unwrap().len(), 1);
        let third = server.restart_with(|_| {}).await;
        let rules = third.get("/roles/sysadmin").await.expect(200)["rules"].as_array().unwrap().len();
        assert_eq!(rules, 2, "the narrowed rule is kept, the everything rule added once");

        // Without a bootstrap token nothing is created, and nothing works unauthenticated.
        let plain = server.restart_with(|c| c.auth.bootstrap_token.clear()).await;
        plain.call(Method::GET, "/namespaces", None, None).await.error(401, &[]);
        plain.call(Method::GET, "/namespaces", Some(&server.admin), None).await.expect(200);
    }
}
