//! Hostile input: malformed JSON, wrong types, unknown and computed fields,
//! oversized bodies, odd names. Every one is a 4xx in the error shape,
//! never a 5xx, and nothing is stored.

use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::common::Server;

/// Collection routes that take a create body, with a valid body for each.
fn creates() -> Vec<(&'static str, Value)> {
    vec![
        ("/namespaces", json!({"name": "x"})),
        ("/apiregistrations", json!({"name": "x.example.com"})),
        ("/namespaces/core/subscriptions", json!({"api": "compute.example.com"})),
        ("/users", json!({"name": "x"})),
        ("/roles", json!({"name": "x", "rules": []})),
        ("/clusterrolebindings", json!({"name": "x", "role": "r", "user": "u"})),
        ("/namespaces/core/rolebindings", json!({"name": "x", "role": "r", "user": "u"})),
    ]
}

async fn setup(server: &Server) {
    server.namespace("core").await;
    server.registration("compute.example.com", json!({"short_name": "compute"})).await;
}

both_backends! {
    async fn malformed_bodies_are_400_naming_the_problem(server: Server) {
        setup(&server).await;
        let bodies: [(&str, &[&str]); 14] = [
            ("{\"name\": \"x\", \"name\": \"y\"}", &["duplicate key", "name"]),
            ("{\"name\": \"x\", \"rules\": [{\"verbs\": [], \"verbs\": []}]}", &["duplicate key", "verbs"]),
            ("{", &["JSON"]),
            ("{\"name\": }", &["JSON"]),
            ("not json", &["JSON"]),
            ("{\"name\": \"x\",}", &["JSON"]),
            ("", &["empty"]),
            ("[]", &["object"]),
            ("null", &["object"]),
            ("\"x\"", &["object"]),
            ("42", &["object"]),
            ("{\"name\": \"x\"} trailing", &["JSON"]),
            ("\u{feff}{}", &["JSON"]),
            ("{\"name\": \"\\ud800\"}", &[]),
        ];
        for (path, _) in creates() {
            for (body, mentions) in bodies {
                server.raw(Method::POST, path, Some(&server.admin), body).await.error(400, mentions);
            }
            let invalid_utf8: &'static [u8] = b"{\"name\": \"\xff\xfe\"}";
            server.raw(Method::POST, path, Some(&server.admin), invalid_utf8).await.error(400, &[]);
        }
        assert_eq!(server.get("/users").await.expect(200)["items"].as_array().unwrap().len(), 1);
    }

    async fn wrong_types_and_unknown_fields_are_named(server: Server) {
        setup(&server).await;
        for (path, valid) in creates() {
            let object = valid.as_object().unwrap().clone();
            for (field, _) in &object {
                for wrong in [json!(1), json!(true), json!(["a"]), json!({"a": 1}), json!(null)] {
                    let mut body = valid.clone();
                    body[field] = wrong;
                    server.post(path, body).await.error(400, &[field]);
                }
            }
            let mut body = valid.clone();
            body["surprise"] = json!("x");
            server.post(path, body).await.error(400, &["surprise"]);
        }
        server.post("/roles", json!({"name": "r", "rules": [{"resources": ["*"], "verbs": ["*"], "resource": "x"}]})).await
            .error(400, &["resource"]);
        server.post("/roles", json!({"name": "r", "rules": [{"resources": [""], "verbs": ["*"]}]})).await.error(400, &["resources"]);
        server.post("/roles", json!({"name": "r", "rules": [{"verbs": ["*"]}]})).await.error(400, &["resources"]);
        server.patch("/namespaces/core", json!({"description": ["x"]})).await.error(400, &["description"]);
        server.raw(Method::PATCH, "/namespaces/core", Some(&server.admin), "[1]").await.error(400, &["object"]);
    }

    async fn bodies_over_the_limit_are_413(server: Server) {
        setup(&server).await;
        let limit = server.config.server.max_body_bytes;
        let huge = format!("{{\"name\": \"x\", \"description\": \"{}\"}}", "a".repeat(limit + 1));
        for path in ["/namespaces", "/users", "/apiregistrations"] {
            server.raw(Method::POST, path, Some(&server.admin), huge.clone()).await.error(413, &[&limit.to_string()]);
        }
        server.raw(Method::PUT, "/namespaces/core", Some(&server.admin), huge.clone()).await.error(413, &[]);
        // Streamed without a Content-Length: counted as it arrives.
        let chunks: Vec<Result<String, std::io::Error>> = vec![Ok("{\"description\": \"".into()), Ok("b".repeat(limit)), Ok("\"}".into())];
        let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
        server.raw(Method::PUT, "/namespaces/core", Some(&server.admin), body).await.error(413, &[]);
        // Just under the limit is fine.
        let fits = format!("{{\"description\": \"{}\"}}", "c".repeat(limit - 64));
        server.raw(Method::PUT, "/namespaces/core", Some(&server.admin), fits).await.expect(200);
    }

    async fn deeply_nested_json_is_400(server: Server) {
        let depth = 10_000;
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        server.raw(Method::POST, "/namespaces", Some(&server.admin), body).await.error(400, &[]);
        let body = format!("{{\"name\": {}{}}}", "{\"a\":".repeat(depth), "1}".repeat(depth));
        server.raw(Method::POST, "/namespaces", Some(&server.admin), body).await.error(400, &[]);
    }

    async fn odd_names_in_bodies_are_400(server: Server) {
        setup(&server).await;
        let long = "a".repeat(300);
        let long_api = format!("{}.example.com", "a".repeat(300));
        for name in ["..", "../etc", "a/b", "a%2Fb", "ünïcode", "名前", "UPPER", "-x", "x-", "a b", "", "a\u{0}b", long.as_str(), "\u{202e}x"] {
            server.post("/namespaces", json!({"name": name})).await.error(400, &[]);
            server.post("/users", json!({"name": name})).await.error(400, &[]);
            server.post("/roles", json!({"name": name})).await.error(400, &[]);
            server.post("/clusterrolebindings", json!({"name": name, "role": "r", "user": "u"})).await.error(400, &[]);
            server.post("/apiregistrations", json!({"name": format!("{name}.example.com")})).await.error(400, &[]);
            server.post("/namespaces/core/subscriptions", json!({"api": name})).await.error(400, &[]);
        }
        server.post("/apiregistrations", json!({"name": long_api})).await.error(400, &[]);
        server.post("/namespaces/core/subscriptions", json!({"api": long_api})).await.error(400, &[]);
        // Error messages stay short even for huge names.
        let huge = "x".repeat(100_000);
        for (path, body) in [
            ("/namespaces", json!({"name": huge})),
            ("/namespaces/core/subscriptions", json!({"api": huge})),
            ("/namespaces/core/subscriptions", json!({"api": "compute.example.com", "namespace": huge})),
            ("/apiregistrations", json!({"name": "h.example.com", "endpoint": huge})),
            ("/clusterrolebindings", json!({"name": "b", "role": huge, "user": "u"})),
        ] {
            let message = server.post(path, body).await.error(400, &[]);
            assert!(message.len() < 500, "{path}: {}", message.len());
        }
        let message = server.put("/namespaces/core", json!({"name": huge})).await.error(400, &[]);
        assert!(message.len() < 500, "{}", message.len());
        let names: Vec<_> = server.get("/namespaces").await.expect(200)["items"].as_array().unwrap()
            .iter().map(|n| n["name"].as_str().unwrap().to_string()).collect();
        assert_eq!(names, ["core"]);
    }

    async fn odd_names_in_paths_are_4xx(server: Server) {
        setup(&server).await;
        let long = "a".repeat(300);
        let paths = [
            "/namespaces/..".to_string(),
            "/namespaces/%2E%2E".to_string(),
            "/namespaces/..%2F..%2Fusers%2Fadmin".to_string(),
            "/namespaces/a%2Fb".to_string(),
            "/namespaces/%C3%BC".to_string(),
            "/namespaces/%FF".to_string(),
            format!("/namespaces/{long}"),
            "/namespaces/core/subscriptions/..".to_string(),
            "/namespaces/core/subscriptions/compute.example.com%2F..".to_string(),
            format!("/namespaces/core/subscriptions/{long}.example.com"),
            "/namespaces/core/subscriptions/%E5%90%8D.example.com/sync".to_string(),
            "/apiregistrations/..".to_string(),
            "/apiregistrations/a%2Fb.example.com".to_string(),
            format!("/apiregistrations/{long}.com/status"),
            "/users/%00".to_string(),
            "/users/admin%2Ftokens".to_string(),
            "/users/admin/tokens/..%2F..".to_string(),
            "/roles/%2E".to_string(),
            "/clusterrolebindings/%20".to_string(),
            "/namespaces/core/rolebindings/..".to_string(),
        ];
        for path in &paths {
            for method in [Method::GET, Method::PUT, Method::PATCH, Method::DELETE] {
                let body = (method == Method::PUT || method == Method::PATCH).then(|| json!({}));
                let reply = server.call(method.clone(), path, Some(&server.admin), body).await;
                let status = reply.status;
                assert!((400..500).contains(&status), "{method} {path}: {status} {}", reply.text);
                reply.error(status, &[]);
            }
        }
        // Nothing was created or destroyed on the way.
        server.get("/namespaces/core").await.expect(200);
        server.get("/users/admin").await.expect(200);
    }
}
