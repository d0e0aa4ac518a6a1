//! RBAC through HTTP (§5.3, seed "Forcing a re-sync"): every route is
//! gated by its declared (resource, verb), `subscriptions` and
//! `subscriptions/sync` are granted separately, `"*"` covers both, `list`
//! and `get` differ, and a denial names user, api, resource and verb.

use kayra_catalog::api::{Access, routes};
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::common::Server;

const SUB: &str = "/namespaces/core/subscriptions/compute.example.com";

async fn setup(server: &Server) {
    server.namespace("core").await;
    server.registration("compute.example.com", json!({"sync_id": "s1"})).await;
    server.subscribe("core", "compute.example.com").await;
}

fn rule(resources: &[&str], verbs: &[&str]) -> Value {
    json!([{"apis": ["catalog.example.com"], "resources": resources, "verbs": verbs}])
}

/// A concrete path for a route template: every parameter gets a value that
/// is valid for its position.
fn concrete(template: &str) -> String {
    let mut path = template
        .replace("{namespace}", "core")
        .replace("{api}", "compute.example.com")
        .replace("{id}", "0123456789abcdef");
    if path.starts_with("/apiregistrations/") {
        path = path.replace("{name}", "compute.example.com");
    } else if path.starts_with("/users/") {
        path = path.replace("{name}", "alice");
    } else {
        path = path.replace("{name}", "thing");
    }
    path
}

both_backends! {
    async fn subscriptions_update_does_not_grant_sync(server: Server) {
        setup(&server).await;
        let token = server.user_with_rules("editor", rule(&["subscriptions"], &["update"])).await;
        server.call(Method::PUT, SUB, Some(&token), Some(json!({}))).await.expect(200);
        server.call(Method::PUT, &format!("{SUB}/sync"), Some(&token), Some(json!({}))).await
            .error(403, &["editor", "catalog.example.com", "subscriptions/sync", "patch"]);
    }

    async fn subscriptions_sync_does_not_grant_update(server: Server) {
        setup(&server).await;
        let token = server.user_with_rules("syncer", rule(&["subscriptions/sync"], &["patch"])).await;
        server.call(Method::PUT, &format!("{SUB}/sync"), Some(&token), Some(json!({}))).await.expect(200);
        server.call(Method::PUT, SUB, Some(&token), Some(json!({}))).await
            .error(403, &["syncer", "catalog.example.com", "\"subscriptions\"", "update"]);
        server.call(Method::PATCH, SUB, Some(&token), Some(json!({}))).await.error(403, &["subscriptions", "patch"]);
    }

    async fn wildcard_resources_cover_both(server: Server) {
        setup(&server).await;
        let token = server.user_with_rules("star", json!([{"resources": ["*"], "verbs": ["update", "patch"]}])).await;
        server.call(Method::PUT, SUB, Some(&token), Some(json!({}))).await.expect(200);
        server.call(Method::PUT, &format!("{SUB}/sync"), Some(&token), Some(json!({}))).await.expect(200);
        server.call(Method::GET, SUB, Some(&token), None).await.error(403, &["get"]);
        // The bootstrap sysadmin role (resources: ["*"]) covers both too.
        server.put(SUB, json!({})).await.expect(200);
        server.put(&format!("{SUB}/sync"), json!({})).await.expect(200);
    }

    async fn list_and_get_are_separate_verbs(server: Server) {
        setup(&server).await;
        let lister = server.user_with_rules("lister", rule(&["subscriptions", "namespaces"], &["list"])).await;
        server.call(Method::GET, "/namespaces/core/subscriptions", Some(&lister), None).await.expect(200);
        server.call(Method::GET, "/namespaces", Some(&lister), None).await.expect(200);
        server.call(Method::GET, SUB, Some(&lister), None).await.error(403, &["lister", "subscriptions", "get"]);
        server.call(Method::GET, "/namespaces/core", Some(&lister), None).await.error(403, &["namespaces", "get"]);
        let getter = server.user_with_rules("getter", rule(&["subscriptions"], &["get"])).await;
        server.call(Method::GET, SUB, Some(&getter), None).await.expect(200);
        server.call(Method::GET, "/namespaces/core/subscriptions", Some(&getter), None).await.error(403, &["list"]);
    }

    async fn registration_shorthands_have_their_own_resources(server: Server) {
        setup(&server).await;
        let editor = server.user_with_rules("editor", rule(&["apiregistrations"], &["*"])).await;
        server.call(Method::GET, "/apiregistrations/compute.example.com", Some(&editor), None).await.expect(200);
        server.call(Method::PUT, "/apiregistrations/compute.example.com/sync", Some(&editor), Some(json!({}))).await
            .error(403, &["apiregistrations/sync", "patch"]);
        server.call(Method::GET, "/apiregistrations/compute.example.com/status", Some(&editor), None).await
            .error(403, &["apiregistrations/status", "get"]);
        let operator = server.user_with_rules("operator", rule(&["apiregistrations/sync", "apiregistrations/status"], &["patch", "get"])).await;
        server.call(Method::PUT, "/apiregistrations/compute.example.com/sync", Some(&operator), Some(json!({}))).await.expect(200);
        server.call(Method::GET, "/apiregistrations/compute.example.com/status", Some(&operator), None).await.expect(200);
        server.call(Method::GET, "/apiregistrations/compute.example.com", Some(&operator), None).await.error(403, &["apiregistrations"]);
    }

    async fn only_catalog_rules_of_cluster_bindings_count(server: Server) {
        setup(&server).await;
        // A rule for another API grants nothing here.
        let other = server.user_with_rules("other", json!([{"apis": ["compute.example.com"], "resources": ["*"], "verbs": ["*"]}])).await;
        server.call(Method::GET, "/namespaces", Some(&other), None).await.error(403, &["other", "namespaces", "list"]);
        // A namespace role binding is for the gateway, never the catalog.
        let (_, token) = server.user_with_token("tenant").await;
        server.post("/roles", json!({"name": "all", "rules": [{"resources": ["*"], "verbs": ["*"]}]})).await.expect(201);
        server.post("/namespaces/core/rolebindings", json!({"name": "tenant-all", "role": "all", "user": "tenant"})).await.expect(201);
        server.call(Method::GET, SUB, Some(&token), None).await.error(403, &["tenant"]);
        // A binding to a role that does not exist grants nothing; creating the role does.
        server.call(Method::GET, "/namespaces", Some(&token), None).await.error(403, &["tenant"]);
        server.post("/roles", json!({"name": "tenant-role", "rules": [{"resources": ["namespaces"], "verbs": ["list"]}]})).await.expect(201);
        server.call(Method::GET, "/namespaces", Some(&token), None).await.expect(200);
        // Unbinding takes effect at once.
        server.delete("/clusterrolebindings/tenant-binding").await.expect(204);
        server.call(Method::GET, "/namespaces", Some(&token), None).await.error(403, &["tenant"]);
    }

    /// Every declared route: 401 without a token, 403 for a user without
    /// roles (before any body is looked at), and `/whoami` for anyone.
    async fn every_route_is_gated(server: Server) {
        setup(&server).await;
        let (_, nobody) = server.user_with_token("nobody").await;
        for route in routes() {
            let path = concrete(route.path);
            let method = Method::from_bytes(route.method.as_str().as_bytes()).unwrap();
            let body = (method != Method::GET && method != Method::DELETE).then(|| json!({"anything": true}));
            server.call(method.clone(), &path, None, body.clone()).await.error(401, &[]);
            let reply = server.call(method.clone(), &path, Some(&nobody), body).await;
            match route.access {
                Access::Authenticated => assert_eq!(reply.status, 200, "{method} {path}"),
                Access::Cluster { resource, verb } => {
                    let message = reply.error(403, &["nobody", "catalog.example.com"]);
                    assert!(message.contains(&format!("{resource:?}")) && message.contains(verb.as_str()), "{method} {path}: {message}");
                }
            }
        }
    }

    /// Every declared route: its own (resource, verb) lets the caller past
    /// RBAC; the same resource with another verb does not.
    async fn every_route_demands_exactly_its_declared_permission(server: Server) {
        setup(&server).await;
        for (index, route) in routes().into_iter().enumerate() {
            let Access::Cluster { resource, verb } = route.access else { continue };
            let path = concrete(route.path);
            let method = Method::from_bytes(route.method.as_str().as_bytes()).unwrap();
            let body = (method != Method::GET && method != Method::DELETE).then(|| json!({}));
            let granted = server.user_with_rules(&format!("g{index}"), rule(&[resource], &[verb.as_str()])).await;
            let reply = server.call(method.clone(), &path, Some(&granted), body.clone()).await;
            assert!(reply.status != 403 && reply.status != 401, "{method} {path} with {resource}/{verb}: {}", reply.text);
            let other_verb = if verb.as_str() == "get" { "list" } else { "get" };
            let denied = server.user_with_rules(&format!("d{index}"), rule(&[resource], &[other_verb])).await;
            server.call(method.clone(), &path, Some(&denied), body).await.error(403, &[resource, verb.as_str()]);
        }
    }
}
