//! The server around the API: health, readiness, metrics, the OpenAPI
//! document against the live router, routing fallbacks, the gateway seam,
//! graceful shutdown and HTTPS.

use std::collections::BTreeSet;
use std::time::Duration;

use kayra_catalog::api::{BASE_PATH, routes};
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::common::Server;

both_backends! {
    async fn health_and_readiness_need_no_token(server: Server) {
        assert_eq!(server.call(Method::GET, "/healthz", None, None).await.expect(200), json!({"status": "ok"}));
        // Ready once the subscriber index has listed, which may be a moment
        // after `/healthz` first answers.
        kayra_testkit::eventually("ready", || async {
            server.call(Method::GET, "/readyz", None, None).await.status == 200
        })
        .await;
        assert_eq!(server.call(Method::GET, "/readyz", None, None).await.expect(200), json!({"status": "ready"}));
    }

    async fn metrics_count_requests_by_route_template_and_code(server: Server) {
        server.namespace("metered").await;
        server.get("/namespaces/metered").await.expect(200);
        server.get("/namespaces/missing").await.error(404, &[]);
        let reply = server.call(Method::GET, "/metrics", None, None).await;
        assert_eq!(reply.status, 200);
        assert!(reply.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
        let text = reply.text;
        let template = format!("route=\"{BASE_PATH}/namespaces/{{namespace}}\"");
        let counted = |code: &str| {
            text.lines().any(|l| l.starts_with("kayra_http_requests_total{") && l.contains(&template) && l.contains(&format!("code=\"{code}\"")) && l.contains("method=\"GET\""))
        };
        assert!(counted("200") && counted("404"), "{text}");
        assert!(!text.contains("namespaces/metered"), "concrete paths never become labels");
        assert!(text.lines().any(|l| l.starts_with("kayra_http_request_duration_seconds_bucket{") && l.contains(&template)), "{text}");
    }

    /// The document is generated from the handlers' types; its (method,
    /// path) pairs are exactly the live router's catalog routes.
    async fn openapi_matches_the_live_router(server: Server) {
        let doc = server.call(Method::GET, "/openapi.json", None, None).await.expect(200);
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let declared: BTreeSet<_> = routes().iter().map(|r| (r.method.to_string(), format!("{BASE_PATH}{}", r.path))).collect();
        assert_eq!(documented, declared);
        // Each documented operation is really routed: with the admin token,
        // no documented (method, path) is answered 404-no-route or 405.
        let (_, token) = server.user_with_token("nobody").await;
        for (method, path) in &documented {
            let concrete = path.replace("{namespace}", "core").replace("{api}", "a.example.com").replace("{name}", "a.example.com").replace("{id}", "0");
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            let reply = server.call(method.clone(), &concrete, Some(&token), None).await;
            assert!(reply.status == 403 || reply.status == 200, "{method} {concrete}: {}", reply.text);
        }
        // Types show through: the subscription view's fields, the error shape.
        let view = &doc["components"]["schemas"]["SubscriptionView"]["required"];
        for field in ["api", "namespace", "active", "state", "current_sync_id", "expected_sync_id", "synced"] {
            assert!(view.as_array().unwrap().contains(&json!(field)), "{field}");
        }
        assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    }

    async fn unknown_routes_and_methods_answer_in_the_error_shape(server: Server) {
        server.call(Method::GET, &format!("{}/nope", server.base), None, None).await.error(404, &[]);
        server.get("/nothing-here").await.error(404, &[]);
        server.get("/namespaces/core/things").await.error(404, &[]);
        server.call(Method::DELETE, "/namespaces", Some(&server.admin), None).await.error(405, &[]);
        server.call(Method::POST, "/namespaces/core/subscriptions/compute.example.com", Some(&server.admin), Some(json!({}))).await
            .error(405, &[]);
        // Every other path under the catalog's base: authenticated first,
        // then the catalog's own 404 (not the gateway's).
        for path in ["/apis/catalog.example.com/v1", "/apis/catalog.example.com/v1/", "/apis/catalog.example.com/v1/nope/deeper"] {
            server.call(Method::GET, path, None, None).await.error(401, &[]);
            server.call(Method::DELETE, path, Some(&server.admin), None).await.error(404, &["no such route in the catalog API"]);
        }
    }

    /// The seam for the gateway (§6): authenticated first, then 404.
    async fn other_apis_are_left_to_the_gateway(server: Server) {
        for path in ["/apis/compute.example.com/v1/namespaces/core/vms", "/apis/compute.example.com", "/apis/catalog.example.com/v2/namespaces"] {
            server.call(Method::GET, path, None, None).await.error(401, &[]);
            server.call(Method::POST, path, Some(&server.admin), Some(json!({}))).await.error(404, &[]);
        }
    }

    async fn store_failures_are_generic_5xx(server: Server) {
        // A record kayra did not write: answered 500 with no internal detail.
        let key = server.repo.store_key_of(kayra_catalog::repo::RecordRef::Namespace("broken"));
        server.repo.store().create(&key, b"{not json".to_vec()).await.unwrap();
        let message = server.get("/namespaces/broken").await.error(500, &[]);
        assert!(!message.contains("not json") && !message.contains(&key), "{message}");
        server.get("/namespaces").await.error(500, &[]);
    }

    async fn shutdown_finishes_in_flight_requests(server: Server) {
        server.namespace("core").await;
        // Keep a request in flight: a streamed body that is still arriving.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(1);
        let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let request = server.client.put(server.url("/namespaces/core")).bearer_auth(&server.admin).body(body).send();
        let in_flight = tokio::spawn(request);
        tx.send(Ok("{\"description\": ".into())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.begin_shutdown();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // New connections are refused while the old request finishes.
        assert!(reqwest::Client::new().get(server.url("/healthz")).send().await.is_err());
        tx.send(Ok("\"done\"}".into())).await.unwrap();
        drop(tx);
        let response = in_flight.await.unwrap().expect("the in-flight request completes");
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["description"], "done");
        tokio::time::timeout(Duration::from_secs(10), server.join()).await.expect("server stops").expect("run returns Ok");
    }
}

/// `/readyz` waits for the subscriber index `/status` answers from: while
/// its first list is on its way (slow here, as a million subscriptions
/// make it), the process is not ready; once it says ready, `/status`
/// answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_subscriber_index() {
    let slow = Duration::from_secs(5);
    let (server, _switch, _client) =
        Server::start_switched_with(|switch| switch.delay_snapshots("/subscriptions/", slow)).await;
    server.registration("compute.example.com", json!({})).await;
    server.call(Method::GET, "/readyz", None, None).await.error(503, &["subscriber index"]);
    kayra_testkit::eventually("ready", || async {
        server.call(Method::GET, "/readyz", None, None).await.status == 200
    })
    .await;
    server.get("/apiregistrations/compute.example.com/status").await.expect(200);
}

/// `/readyz` follows the store: 503 while etcd is down, ready again once
/// it is back. `/healthz` only says the process answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_store() {
    let server = Server::start(crate::common::Backend::Etcd).await;
    server.call(Method::GET, "/readyz", None, None).await.expect(200);
    server.stop_etcd().await;
    server.call(Method::GET, "/readyz", None, None).await.error(503, &["store"]);
    server.call(Method::GET, "/healthz", None, None).await.expect(200);
    // API requests fail as 503 with a generic message, never the store's own text.
    let started = std::time::Instant::now();
    let message = server.get("/namespaces").await.error(503, &["store"]);
    assert!(!message.contains("127.0.0.1") && !message.contains("transport"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    server.restart_etcd().await;
    kayra_testkit::eventually("readyz to recover", || async {
        server.call(Method::GET, "/readyz", None, None).await.status == 200
    })
    .await;
    server.get("/namespaces").await.expect(200);
}

/// HTTPS with `server.tls`: a throwaway CA and server certificate made by
/// `openssl`, the CA trusted by the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_when_tls_is_configured() {
    let plain = Server::start(crate::common::Backend::Local).await;
    let dir = tempfile::tempdir().unwrap();
    const SCRIPT: &str = r#"set -e
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=kayra-test-ca -keyout ca-key.pem -out ca.pem
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost -keyout server-key.pem -out server.csr
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n' > server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 1 -extfile server.ext -out server.pem"#;
    let output =
        std::process::Command::new("sh").args(["-c", SCRIPT]).current_dir(dir.path()).output().expect("run openssl");
    assert!(output.status.success(), "openssl: {}", String::from_utf8_lossy(&output.stderr));
    let tls = kayra_config::ServerTls {
        cert_file: dir.path().join("server.pem"),
        key_file: dir.path().join("server-key.pem"),
    };
    let mut server = plain.restart_with(|c| c.server.tls = Some(tls)).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.path().join("ca.pem")).unwrap()).unwrap();
    server.client = reqwest::Client::builder().tls_certs_only([ca]).build().unwrap();
    server.wait_ready().await;
    assert!(server.base.starts_with("https://"));
    server.namespace("secure").await;
    assert_eq!(server.get("/namespaces/secure").await.expect(200)["name"], "secure");
    // Plain HTTP on the TLS port gets nowhere.
    let http = server.base.replace("https://", "http://");
    assert!(reqwest::Client::new().get(format!("{http}/healthz")).send().await.is_err());
    server.shutdown().await.unwrap();
}
