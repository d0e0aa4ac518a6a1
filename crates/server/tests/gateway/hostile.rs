//! Hostile callers and hostile backends (platform contract §6, §8):
//! traversal, methods, spoofed identity headers, framing, cookies, and
//! user info in logged URLs. Hostile requests go over a raw `TcpStream`:
//! reqwest and hyper would normalise some of them before sending.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::{Backend, Server};
use crate::{COMPUTE, STORAGE, World, both_backends, gw, refused};

/// Rules of a user who may do anything, but only to `widgets` of compute.
pub fn widgets_only(verbs: &[&str]) -> serde_json::Value {
    json!([{"apis": [COMPUTE], "resources": ["widgets"], "verbs": verbs}])
}

/// A world with active namespaces `a` and `b`, both subscribed (active) to
/// compute, and a token of `alice`, who may use `widgets` in `a` only.
pub async fn two_tenants(server: Server, verbs: &[&str]) -> (World, String) {
    let world = World::new(server).await;
    for ns in ["a", "b"] {
        world.namespace(ns).await;
        world.server.subscribe(ns, COMPUTE).await;
        world.activate(ns, COMPUTE).await;
    }
    let token = world.user_in_namespace("alice", "a", widgets_only(verbs)).await;
    (world, token)
}

/// One raw answer: status (0 when the server closed without one), head, body.
#[derive(Debug)]
pub struct RawReply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// Sends `method target` with `headers` (CRLF lines) over a fresh
/// connection, exactly as given, and reads the whole answer.
pub async fn raw(base: &str, method: &[u8], target: &[u8], headers: &str) -> RawReply {
    let addr = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut request = Vec::new();
    request.extend_from_slice(method);
    request.push(b' ');
    request.extend_from_slice(target);
    request.extend_from_slice(format!(" HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n").as_bytes());
    stream.write_all(&request).await.expect("send");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer within 30s to {:?}", String::from_utf8_lossy(target));
    let answer = String::from_utf8_lossy(&answer).to_string();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    RawReply { status, head: head.to_string(), body: body.to_string() }
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

both_backends! {
    async fn traversal_never_leaves_the_checked_path(server: Server) {
        let (world, token) = two_tenants(server, &["*"]).await;
        let base = world.server.base.clone();
        let prefix = "/apis/compute.example.com/v1/namespaces/a/widgets/";
        for (tail, segment) in [
            ("..\\..\\b\\widgets\\w1", "..\\\\..\\\\b"),
            ("..\\..\\..\\..\\..\\..\\internal\\admin", "internal"),
            ("..%2f..%2fb%2fwidgets%2fw1", "..%2f"),
            ("..%5c..%5cb", "..%5c"),
            ("%2e%2e/%2e%2e/b/widgets/w1", "%2e%2e"),
            ("x/..;/..;/b/widgets", "..;"),
            ("w1%00", "w1%00"),
            ("w1%0d%0aX-Kayra-User:%20admin", "w1%0d%0a"),
        ] {
            let target = format!("{prefix}{tail}");
            let reply = raw(&base, b"GET", target.as_bytes(), &bearer(&token)).await;
            assert_eq!(reply.status, 400, "{target}: {reply:?}");
            let body: serde_json::Value = serde_json::from_str(&reply.body).expect("an error body");
            assert_eq!(body["reason"], "BadRequest", "{target}");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains("path segment"), "{target}: {message}");
            assert!(message.contains(segment.split('\\').next().unwrap()), "{target}: {message} names the segment");
        }
        assert!(world.backend.seen().is_empty(), "nothing reached the backend: {:?}", world.backend.seen());

        // The legitimate request is forwarded, byte for byte.
        let reply = raw(&base, b"GET", format!("{prefix}w1").as_bytes(), &bearer(&token)).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(world.backend.last().uri, format!("{prefix}w1"));
        // And `b` stays out of reach the plain way too.
        let reply = world.call(Method::GET, &gw(COMPUTE, "b", "widgets/w1"), Some(&token)).await;
        refused(reply, 403, &["namespace \"b\""]);
    }

    async fn methods_are_exactly_the_six(server: Server) {
        let (world, token) = two_tenants(server, &["get", "list"]).await;
        let base = world.server.base.clone();
        let path = gw(COMPUTE, "a", "widgets");
        for method in ["get", "Get", "FOO", "PROPFIND", "OPTIONS", "TRACE", "CONNECTX"] {
            let reply = raw(&base, method.as_bytes(), path.as_bytes(), &bearer(&token)).await;
            assert_eq!(reply.status, 405, "{method}: {reply:?}");
            let body: serde_json::Value = serde_json::from_str(&reply.body).expect("an error body");
            assert_eq!(body["reason"], "MethodNotAllowed", "{method}");
            assert_eq!(body["code"], 405);
        }
        assert!(world.backend.seen().is_empty(), "nothing reached the backend: {:?}", world.backend.seen());
        let reply = raw(&base, b"GET", path.as_bytes(), &bearer(&token)).await;
        assert_eq!(reply.status, 200, "{reply:?}");

        // The catalog API and the operational routes answer in the same shape.
        let admin = bearer(&world.server.admin);
        for (method, target) in [
            ("get", "/apis/catalog.example.com/v1/namespaces"),
            ("FOO", "/apis/catalog.example.com/v1/namespaces/a"),
            ("OPTIONS", "/apis/catalog.example.com/v1/apiregistrations"),
            ("post", "/healthz"),
            ("DELETE", "/metrics"),
        ] {
            let reply = raw(&base, method.as_bytes(), target.as_bytes(), &admin).await;
            assert_eq!(reply.status, 405, "{method} {target}: {reply:?}");
            let body: serde_json::Value = serde_json::from_str(&reply.body).expect("an error body");
            assert_eq!(body["reason"], "MethodNotAllowed", "{method} {target}");
            assert_eq!(body.as_object().unwrap().len(), 3, "{body}");
            assert!(reply.head.to_ascii_lowercase().contains("\r\nallow: "), "{}", reply.head);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_and_forwarded_headers_cannot_be_spoofed() {
    let (world, token) = two_tenants(Server::start(Backend::Local).await, &["*"]).await;
    let spoofed = [
        "X_Kayra_User: admin",
        "x-kayra-user: admin",
        "X-KAYRA-NAMESPACE: b",
        "X_kayra-Namespace: b",
        "X-Kayra-Role: sysadmin",
        "X-Forwarded-For: 10.9.9.9",
        "X_Forwarded_For: 10.9.9.9",
        "X-Forwarded-Host: evil.example",
        "X-Forwarded-Proto: https",
        "X-Forwarded-Prefix: /admin",
        "Forwarded: for=10.9.9.9;host=evil.example",
        "Cookie: console-session=stolen",
    ];
    let headers: String = spoofed.iter().map(|h| format!("{h}\r\n")).collect();
    let path = gw(COMPUTE, "a", "widgets/w1");
    let reply = raw(&world.server.base, b"GET", path.as_bytes(), &format!("{}{headers}", bearer(&token))).await;
    assert_eq!(reply.status, 200, "{reply:?}");

    let seen = world.backend.last();
    let values = |name: &str| {
        seen.headers
            .iter()
            .filter(|(n, _)| n.as_str().replace('_', "-") == name)
            .map(|(_, v)| v.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(values("x-kayra-user"), ["alice"], "{:?}", seen.headers);
    assert_eq!(values("x-kayra-namespace"), ["a"]);
    assert_eq!(values("x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(values("x-forwarded-proto"), ["http"]);
    assert_eq!(values("x-forwarded-host"), [world.server.base.trim_start_matches("http://")]);
    for gone in ["x-kayra-role", "x-forwarded-prefix", "forwarded", "cookie"] {
        assert!(values(gone).is_empty(), "{gone} reached the backend: {:?}", seen.headers);
    }
}

/// A backend speaking raw HTTP: answers every request with `answer`.
async fn raw_backend(answer: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_cannot_confuse_framing_set_cookies_or_script_the_origin() {
    let (world, _) = two_tenants(Server::start(Backend::Local).await, &["*"]).await;
    let backend = raw_backend(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\nSet-Cookie: kayra-console=planted; Path=/\r\n\
          X-Backend: raw\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    world.register(STORAGE, json!({"endpoint": backend})).await;
    world.server.subscribe("a", STORAGE).await;
    world.activate("a", STORAGE).await;
    let token = world.user("carol", json!([{"apis": [STORAGE], "resources": ["*"], "verbs": ["*"]}])).await;

    let reply = raw(&world.server.base, b"GET", gw(STORAGE, "a", "files").as_bytes(), &bearer(&token)).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let head = reply.head.to_ascii_lowercase();
    assert!(head.contains("x-backend: raw"), "{head}");
    assert!(!head.contains("content-length: 100"), "the backend's Content-Length came along with chunking: {head}");
    assert!(!head.contains("set-cookie"), "a backend set a cookie on kayra's origin: {head}");
    assert!(head.contains("content-security-policy: sandbox"), "a backend's page could script kayra's origin: {head}");
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    let body = if head.contains("transfer-encoding: chunked") {
        reply.body.split("\r\n").nth(1).unwrap_or_default().to_string()
    } else {
        reply.body.clone()
    };
    assert_eq!(body, "hello", "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_user_info_never_reaches_the_log() {
    crate::gateway::forwarding::capture_logs();
    let (world, _) = two_tenants(Server::start(Backend::Local).await, &["*"]).await;
    // The API refuses such an endpoint now; one written before the rule
    // existed is in the store as it was.
    let api = "legacy.example.com";
    let mut registration = world.server.registration(api, json!({"sync_id": crate::SYNC_ID})).await;
    registration["endpoint"] = json!("http://legacy-user:s3cret-password@127.0.0.1:1");
    let registration: kayra_core::ApiRegistration = serde_json::from_value(registration).unwrap();
    let key = kayra_catalog::repo::RecordRef::Registration(api);
    world.server.repo.store().delete(&world.server.repo.store_key_of(key), None).await.expect("delete");
    world.server.repo.create(key, &registration, "registration").await.expect("rewrite");
    world.server.subscribe("a", api).await;
    world.activate("a", api).await;
    let token = world.user("erin", json!([{"apis": [api], "resources": ["*"], "verbs": ["*"]}])).await;

    // The rewrite went to the store behind the server's back, so its caches
    // learn of it from their watch a moment later.
    kayra_testkit::eventually("the gateway forwards to the rewritten endpoint", || async {
        world.call(Method::GET, &gw(api, "a", "things"), Some(&token)).await.status != 503
    })
    .await;
    let reply = world.call(Method::GET, &gw(api, "a", "things"), Some(&token)).await;
    refused(reply, 502, &[]);
    kayra_testkit::eventually("the backend failure is logged", || async {
        crate::gateway::forwarding::logged().contains("backend request failed")
    })
    .await;
    let log = crate::gateway::forwarding::logged();
    assert!(!log.contains("s3cret-password"), "the endpoint's password was logged: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_backend_learns_the_caller_used_https() {
    let (world, token) = two_tenants(Server::start(Backend::Local).await, &["*"]).await;
    let dir = tempfile::tempdir().unwrap();
    let certs = kayra_testkit::Certificates::generate(dir.path());
    let tls = kayra_config::ServerTls { cert_file: certs.server_cert.clone(), key_file: certs.server_key.clone() };
    let mut https = world.server.restart_with(|c| c.server.tls = Some(tls)).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&certs.ca).unwrap()).unwrap();
    https.client = reqwest::Client::builder().tls_certs_only([ca]).build().unwrap();
    https.wait_ready().await;

    let reply = https
        .client
        .get(https.url(&gw(COMPUTE, "a", "widgets/w1")))
        .bearer_auth(&token)
        .header("x-forwarded-proto", "http")
        .send()
        .await
        .expect("request");
    assert_eq!(reply.status(), 200);
    let seen = world.backend.last();
    let proto: Vec<_> = seen.headers.get_all("x-forwarded-proto").iter().collect();
    assert_eq!(proto, ["https"], "{:?}", seen.headers);
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
}

/// §13: a refused catalog request stores no audit record; it is one log
/// line with `audit: "denied"`, the user when known, resource and verb —
/// and never the token that was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_catalog_requests_are_logged_as_denied_without_the_token() {
    crate::gateway::forwarding::capture_logs();
    let server = Server::start(Backend::Local).await;
    let unknown = "unknown-token-0123456789abcdef0123456789";
    let reply = server.call(Method::POST, "/namespaces", Some(unknown), Some(json!({"name": "x"}))).await;
    assert_eq!(reply.status, 401, "{reply:?}");
    let token = server
        .user_with_rules(
            "mallory",
            json!([{"apis": ["catalog.example.com"], "resources": ["namespaces"], "verbs": ["get"]}]),
        )
        .await;
    let reply = server.call(Method::POST, "/namespaces", Some(&token), Some(json!({"name": "x"}))).await;
    assert_eq!(reply.status, 403, "{reply:?}");
    kayra_testkit::eventually("both refusals are logged", || async {
        let log = crate::gateway::forwarding::logged();
        log.lines().any(|l| l.contains("denied") && l.contains("code=401"))
            && log.lines().any(|l| {
                l.contains("denied") && l.contains("mallory") && l.contains("namespaces") && l.contains("create")
            })
    })
    .await;
    let log = crate::gateway::forwarding::logged();
    assert!(!log.contains(unknown) && !log.contains(&token), "a token was logged: {log}");
}
