//! Values that would travel on to backends, URLs and log lines (§4.2), and
//! `/metrics` under hostile callers (§8).

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::both_backends;
use crate::common::Server;

const API: &str = "compute.example.com";

both_backends! {
    async fn sync_ids_are_refused_outside_their_alphabet(server: Server) {
        let long = "x".repeat(129);
        let bad = ["../../../../admin/delete-all?x=", "a\nINFO forged line", "a b", "...", ".", "ü", "a/b", "a%2f", &long];
        for sync_id in bad {
            let body = json!({"name": API, "sync_id": sync_id});
            server.post("/apiregistrations", body).await.error(400, &["sync_id"]);
        }
        assert_eq!(server.get("/apiregistrations").await.expect(200)["items"], json!([]), "nothing was stored");

        let max = "Z".repeat(128);
        for (i, good) in ["2026-02-01T00Z", "v1.2.3+build_7:rc-1", "..x", max.as_str()].iter().enumerate() {
            let name = format!("api{i}.example.com");
            let created = server.registration(&name, json!({"sync_id": good})).await;
            assert_eq!(created["sync_id"], *good);
        }
        server.registration(API, json!({"sync_id": "s1"})).await;
        let path = format!("/apiregistrations/{API}");
        for sync_id in bad {
            server.put(&path, json!({"sync_id": sync_id})).await.error(400, &["sync_id"]);
            server.patch(&path, json!({"sync_id": sync_id})).await.error(400, &["sync_id"]);
        }
        assert_eq!(server.get(&path).await.expect(200)["sync_id"], "s1");
    }

    async fn endpoints_are_absolute_http_urls_without_user_info(server: Server) {
        let password = "hunter2-s3cret";
        let bad = [
            format!("http://user:{password}@127.0.0.1:9000"),
            format!("https://{password}@backend.example/"),
            format!("http://user:{password}@backend.example/path#frag"),
            "http://backend.example/#fragment".to_string(),
            "ftp://backend.example".to_string(),
            "backend.example:9000".to_string(),
            "/relative/path".to_string(),
            "http://".to_string(),
            "http://backend.example/a b".to_string(),
        ];
        for endpoint in &bad {
            let message =
                server.post("/apiregistrations", json!({"name": API, "endpoint": endpoint})).await.error(400, &["endpoint"]);
            assert!(!message.contains(password), "the password was echoed: {message}");
        }
        server.registration(API, json!({"endpoint": "http://127.0.0.1:9000/base/"})).await;
        let path = format!("/apiregistrations/{API}");
        for endpoint in &bad {
            let message = server.put(&path, json!({"endpoint": endpoint})).await.error(400, &["endpoint"]);
            assert!(!message.contains(password), "the password was echoed: {message}");
            let message = server.patch(&path, json!({"endpoint": endpoint})).await.error(400, &["endpoint"]);
            assert!(!message.contains(password), "the password was echoed: {message}");
        }
        assert_eq!(server.get(&path).await.expect(200)["endpoint"], "http://127.0.0.1:9000/base/");
        server.patch(&path, json!({"endpoint": ""})).await.expect(200);
    }

    async fn the_catalog_api_names_are_reserved(server: Server) {
        server.post("/apiregistrations", json!({"name": "catalog.example.com"})).await.error(400, &["reserved"]);
        server
            .post("/apiregistrations", json!({"name": API, "short_name": "catalog"}))
            .await
            .error(400, &["short_name", "reserved"]);
        server.registration(API, json!({"short_name": "compute"})).await;
        let path = format!("/apiregistrations/{API}");
        server.patch(&path, json!({"short_name": "catalog"})).await.error(400, &["reserved"]);
        server.put(&path, json!({"short_name": "catalog"})).await.error(400, &["reserved"]);
        assert_eq!(server.get(&path).await.expect(200)["short_name"], "compute");
    }
}

/// One raw request; the status code.
async fn raw_status(server: &Server, method: &str, target: &str) -> u16 {
    let addr = server.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("answer");
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_described_from_startup_and_labels_stay_bounded() {
    let server = Server::start(crate::common::Backend::Local).await;
    let metrics = server.call(Method::GET, "/metrics", None, None).await.text;
    for (name, kind) in [
        ("kayra_http_requests_total", "counter"),
        ("kayra_http_request_duration_seconds", "histogram"),
        ("kayra_gateway_requests_total", "counter"),
        ("kayra_gateway_request_duration_seconds", "histogram"),
    ] {
        assert!(metrics.contains(&format!("# HELP {name} ")), "no HELP for {name}:\n{metrics}");
        assert!(metrics.contains(&format!("# TYPE {name} {kind}")), "no TYPE for {name}:\n{metrics}");
        assert!(metrics.lines().any(|l| l.starts_with(name)), "{name} is absent:\n{metrics}");
    }

    for i in 0..60 {
        let status = raw_status(&server, &format!("MADEUP{i}"), "/healthz").await;
        assert_eq!(status, 405);
        raw_status(&server, "GET", &format!("/no-such-route-{i}/x")).await;
        raw_status(&server, "get", &format!("/apis/catalog.example.com/v1/namespaces/n{i}")).await;
    }
    let after = server.call(Method::GET, "/metrics", None, None).await.text;
    assert!(!after.contains("MADEUP"), "a made-up method became a label value");
    assert!(!after.contains("method=\"get\""), "a lowercase method became a label value");
    assert!(!after.contains("no-such-route"), "a raw path became a label value");
    assert!(!after.contains("namespaces/n1"), "a raw path became a label value");
    assert!(after.contains("method=\"other\""), "{after}");
    let methods: std::collections::BTreeSet<&str> =
        after.split("method=\"").skip(1).filter_map(|rest| rest.split('"').next()).collect();
    let allowed = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"];
    assert!(methods.iter().all(|m| allowed.contains(m)), "{methods:?}");
}
