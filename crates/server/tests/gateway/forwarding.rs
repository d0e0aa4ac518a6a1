//! Step 6 when it works: what the backend sees, what the caller gets back,
//! and what the gateway records about it.

use std::io::Write;
use std::sync::{Mutex, Once};

use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderValue};

use crate::common::{Backend, Server};
use crate::{COMPUTE, World, everything, gw};

/// A world whose `core` subscription to compute is active, and a token of
/// `user`, who may do everything.
async fn ready(user: &str) -> (World, String) {
    let world = World::new(Server::start(Backend::Local).await).await;
    world.activate("core", COMPUTE).await;
    let token = world.user(user, everything()).await;
    (world, token)
}

fn names(headers: &HeaderMap) -> Vec<String> {
    let mut names: Vec<String> = headers.keys().map(|n| n.as_str().to_string()).collect();
    names.sort_unstable();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_sees_method_path_query_and_only_the_right_headers() {
    let (world, token) = ready("alice").await;
    let path = gw(COMPUTE, "core", "vms?dry-run=true&name=a%20b&name=c");
    let response = world
        .server
        .client
        .post(world.server.url(&path))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .header("x-request-id", "abc")
        .header("x-kayra-user", "mallory")
        .header("x-kayra-namespace", "elsewhere")
        .header("connection", "keep-alive, x-private")
        .header("x-private", "for the next hop only")
        .header("proxy-authorization", "Basic c2VjcmV0")
        .body(r#"{"name":"web-1"}"#)
        .send()
        .await
        .expect("request");

    let seen = world.backend.last();
    assert_eq!(seen.method, Method::POST);
    assert_eq!(seen.uri, "/apis/compute.example.com/v1/namespaces/core/vms?dry-run=true&name=a%20b&name=c");
    assert_eq!(
        names(&seen.headers),
        [
            "accept",
            "content-length",
            "content-type",
            "host",
            "x-forwarded-for",
            "x-forwarded-host",
            "x-forwarded-proto",
            "x-kayra-namespace",
            "x-kayra-user",
            "x-request-id"
        ],
        "exactly these headers reach the backend: {:?}",
        seen.headers
    );
    let values =
        |name: &str| seen.headers.get_all(name).iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(values("x-kayra-user"), ["alice"], "the caller cannot pose as someone else");
    assert_eq!(values("x-kayra-namespace"), ["core"]);
    assert_eq!(values("x-request-id"), ["abc"]);
    assert_eq!(values("content-length"), ["16"]);
    assert_ne!(values("host"), [world.server.base.trim_start_matches("http://")], "Host names the backend");

    // The answer comes back as the backend gave it, minus its hop-by-hop headers.
    assert_eq!(response.status(), 201);
    let headers = response.headers().clone();
    assert_eq!(headers.get("x-backend"), Some(&HeaderValue::from_static("echo")));
    assert!(headers.get("x-hop").is_none(), "a header named by Connection stays on its hop: {headers:?}");
    let echo: serde_json::Value = response.json().await.expect("echo");
    assert_eq!(echo["body"], r#"{"name":"web-1"}"#);
    assert_eq!(echo["query"], "dry-run=true&name=a%20b&name=c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_is_forwarded_as_it_came() {
    let (world, token) = ready("alice").await;
    for method in [Method::GET, Method::HEAD, Method::PUT, Method::PATCH, Method::DELETE] {
        let reply = world.call(method.clone(), &gw(COMPUTE, "core", "vms/web-1"), Some(&token)).await;
        assert_eq!(reply.status, 200, "{method}: {}", reply.text);
        assert_eq!(world.backend.last().method, method);
    }
    // A GET without a body is forwarded without one.
    let seen = world.backend.seen().into_iter().next().expect("the GET");
    assert!(seen.headers.get("transfer-encoding").is_none() && seen.headers.get("content-length").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_reach_the_caller_unfollowed() {
    let (world, token) = ready("alice").await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let response =
        client.get(world.server.url(&gw(COMPUTE, "core", "moved"))).bearer_auth(&token).send().await.expect("request");
    assert_eq!(response.status(), 302);
    assert_eq!(response.headers()["location"], "/elsewhere");
    assert_eq!(world.backend.seen().len(), 1, "the gateway did not follow the redirect");
}

/// Everything this test binary logs, for the access-log test.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        LOG.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(crate) fn capture_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| Capture)
            .with_ansi(false)
            .with_env_filter("kayra_server::gateway=info,kayra_server::auth=info,kayra_catalog::api::audit=info")
            .try_init();
    });
}

/// Everything logged so far.
pub(crate) fn logged() -> String {
    String::from_utf8_lossy(&LOG.lock().expect("log")).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_and_logged_once_without_secrets() {
    capture_logs();
    let (world, token) = ready("dave").await;
    let secret_header = "s3cret-header-value";
    let response = world
        .server
        .client
        .get(world.server.url(&gw(COMPUTE, "core", "vms")))
        .bearer_auth(&token)
        .header("x-api-key", secret_header)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    response.bytes().await.expect("body");
    let refused = world.call(Method::GET, &gw("nope.example.com", "core", "vms"), Some(&token)).await;
    assert_eq!(refused.status, 404);

    let metrics = world.server.call(Method::GET, "/metrics", None, None).await.text;
    let has = |name: &str, labels: &[&str]| {
        metrics.lines().any(|line| line.starts_with(name) && labels.iter().all(|l| line.contains(l)))
    };
    assert!(has("kayra_gateway_requests_total{", &["api=\"compute.example.com\"", "code=\"200\""]), "{metrics}");
    assert!(has("kayra_gateway_requests_total{", &["api=\"unknown\"", "code=\"404\""]), "{metrics}");
    assert!(has("kayra_gateway_request_duration_seconds", &["api=\"compute.example.com\""]), "{metrics}");

    // The line is written once the body is done; give the drop a moment.
    kayra_testkit::eventually("the access-log lines of dave", || async {
        String::from_utf8_lossy(&LOG.lock().expect("log")).lines().filter(|l| l.contains("user=\"dave\"")).count() == 2
    })
    .await;
    let log = String::from_utf8_lossy(&LOG.lock().expect("log")).to_string();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("user=\"dave\"")).collect();
    for field in
        ["method=\"GET\"", "api=\"compute.example.com\"", "namespace=\"core\"", "resource=\"vms\"", "status=200"]
    {
        assert!(lines[0].contains(field), "{field} missing from {}", lines[0]);
    }
    assert!(lines[0].contains("duration_ms="), "{}", lines[0]);
    assert!(lines[1].contains("status=404") && lines[1].contains("api=\"nope.example.com\""), "{}", lines[1]);
    assert!(!log.contains(&token) && !log.contains(secret_header), "a token or header value was logged");
}
