//! Step 6 when the backend fails: 503 without an endpoint, 502 when it is
//! unreachable, 504 when it does not answer in time.

use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::Method;
use serde_json::json;

use crate::common::{Backend, Server};
use crate::{World, everything, gw, refused, with_response_timeout};

/// A world with `api` registered with `fields`, subscribed and active in
/// `core`, and a token that may do everything.
async fn world_with(api: &str, fields: serde_json::Value) -> (World, String) {
    let world = World::new(Server::start(Backend::Local).await).await;
    world.register(api, fields).await;
    world.server.subscribe("core", api).await;
    world.activate("core", api).await;
    let token = world.user("alice", everything()).await;
    (world, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoint_is_503() {
    let (world, token) = world_with("bare.example.com", json!({"endpoint": ""})).await;
    let reply = world.call(Method::GET, &gw("bare.example.com", "core", "vms"), Some(&token)).await;
    refused(reply, 503, &["bare.example.com", "endpoint"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_backend_is_502() {
    // Port 1: no test's server can be given it (a free port found here
    // could be bound by a concurrent test's server before the call).
    let down = "http://127.0.0.1:1".to_string();
    let (world, token) = world_with("down.example.com", json!({"endpoint": down})).await;
    let reply = world.call(Method::POST, &gw("down.example.com", "core", "vms"), Some(&token)).await;
    let message = refused(reply, 502, &["down.example.com"]);
    assert!(!message.contains("127.0.0.1"), "internal detail leaked: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_backend_is_504_after_the_response_timeout() {
    let world = World::new(Server::start(Backend::Local).await).await;
    world.activate("core", crate::COMPUTE).await;
    let token = world.user("alice", everything()).await;
    let base = with_response_timeout(&world.server, Duration::from_millis(300)).await;

    let started = Instant::now();
    let url = format!("{base}{}", gw(crate::COMPUTE, "core", "slow"));
    let reply = world.server.call(Method::GET, &url, Some(&token), None).await;
    let waited = started.elapsed();
    refused(reply, 504, &[crate::COMPUTE, "300ms"]);
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(5), "answered after {waited:?}");
    assert_eq!(world.backend.seen().len(), 1, "the request did reach the backend");

    // The same gateway answers a prompt backend as usual.
    let url = format!("{base}{}", gw(crate::COMPUTE, "core", "vms"));
    let response = world.server.client.get(url).bearer_auth(&token).send().await.expect("request");
    assert_eq!(response.status(), 200);
}

/// The timeout is about a silent backend, not a long upload: it restarts
/// with every chunk forwarded, so a body that keeps moving for longer than
/// the timeout still gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_that_keep_moving_outlast_the_response_timeout() {
    let world = World::new(Server::start(Backend::Local).await).await;
    world.activate("core", crate::COMPUTE).await;
    let token = world.user("alice", everything()).await;
    let base = with_response_timeout(&world.server, Duration::from_millis(300)).await;

    let chunks = futures::stream::iter(0..10).then(|_| async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok::<_, std::io::Error>(vec![b'x'; 1024])
    });
    let started = Instant::now();
    let url = format!("{base}{}", gw(crate::COMPUTE, "core", "upload"));
    let response = world
        .server
        .client
        .post(url)
        .bearer_auth(&token)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .expect("upload");
    assert_eq!(response.status(), 200, "cut off after {:?}", started.elapsed());
    assert!(started.elapsed() >= Duration::from_secs(1));
    let answer: serde_json::Value = response.json().await.expect("answer");
    assert_eq!(answer["bytes"], 10 * 1024);
}
