//! Two deployments (different `INFRAPI_APP_PLATFORM`) on one store — one
//! etcd prefix, or one SQLite file: registrations and subscriptions are
//! scoped to their deployment; namespaces, users, roles and bindings are
//! shared.

use serde_json::json;

use crate::both_backends;

both_backends! {
    async fn registrations_and_subscriptions_are_per_deployment(server: Server) {
        let other = server.sibling("prod", "eu-west").await;
        server.registration("compute.example.com", json!({"short_name": "compute", "sync_id": "dev-1"})).await;

        // Invisible to the other deployment, by name, by listing, by short name.
        other.get("/apiregistrations/compute.example.com").await
            .error(404, &["compute.example.com", "platform prod", "region eu-west"]);
        assert_eq!(other.get("/apiregistrations").await.expect(200), json!({"items": [], "continue": ""}));
        other.get("/apiregistrations/compute").await.error(400, &[]);
        other.put("/apiregistrations/compute.example.com/sync", json!({})).await.error(404, &["compute.example.com"]);
        other.delete("/apiregistrations/compute.example.com").await.error(404, &["compute.example.com"]);

        // The same long and short name can be registered there independently.
        let theirs = other.registration("compute.example.com", json!({"short_name": "compute", "sync_id": "prod-1"})).await;
        assert_eq!((theirs["platform"].clone(), theirs["region"].clone()), (json!("prod"), json!("eu-west")));
        assert_eq!(server.get("/apiregistrations/compute.example.com").await.expect(200)["sync_id"], "dev-1");

        // Namespaces are shared; subscriptions are not.
        server.namespace("core").await;
        other.get("/namespaces/core").await.expect(200);
        server.subscribe("core", "compute.example.com").await;
        other.get("/namespaces/core/subscriptions/compute.example.com").await.error(404, &[]);
        assert_eq!(other.get("/namespaces/core/subscriptions").await.expect(200)["items"], json!([]));
        let mine = server.get("/namespaces/core/subscriptions/compute.example.com").await.expect(200);
        assert_eq!(mine["expected_sync_id"], "dev-1", "a subscription reads its own deployment's registration");
        let theirs = other.subscribe("core", "compute.example.com").await;
        assert_eq!(theirs["expected_sync_id"], "prod-1");
        let status = other.get("/apiregistrations/compute.example.com/status").await.expect(200);
        assert_eq!(status["total"], 1);

        // Deleting the shared namespace is refused while either deployment subscribes, naming both.
        server.delete("/namespaces/core").await.error(409, &["compute.example.com", "platform prod", "region eu-west"]);
        other.delete("/namespaces/core/subscriptions/compute.example.com").await.expect(204);
        other.delete("/namespaces/core").await.error(409, &["compute.example.com"]);
        server.delete("/namespaces/core/subscriptions/compute.example.com").await.expect(204);
        other.delete("/namespaces/core").await.expect(204);
    }

    async fn a_registration_only_in_another_deployment_cannot_be_subscribed(server: Server) {
        let other = server.sibling("prod", "local").await;
        other.registration("vault.example.com", json!({"short_name": "vault"})).await;
        server.namespace("core").await;
        server.post("/namespaces/core/subscriptions", json!({"api": "vault.example.com"})).await
            .error(404, &["vault.example.com", "platform dev"]);
        // Another deployment's short name is no hint here either.
        server.post("/namespaces/core/subscriptions", json!({"api": "vault"})).await.error(400, &[]);
    }

    async fn identities_are_shared(server: Server) {
        let other = server.sibling("prod", "eu-west").await;
        let token = server.user_with_rules("alice", json!([{"resources": ["namespaces"], "verbs": ["list"]}])).await;
        let reply = other.call(reqwest::Method::GET, "/namespaces", Some(&token), None).await;
        reply.expect(200);
        assert_eq!(other.get("/roles/alice-role").await.expect(200)["name"], "alice-role");
    }
}
