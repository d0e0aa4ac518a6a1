//! The gateway (platform contract §6) against the real `kayra serve` on
//! 127.0.0.1:0 and a real backend on loopback.
//!
//! Records are set up the way they are in production: namespaces,
//! registrations, subscriptions, users, roles and bindings through the
//! catalog API; activation through the repository, as the reconciler does
//! it (`activate_namespace`, and its result write through
//! `common::record_result`). Cases that read the store run on both
//! backends; the forwarding failure and streaming cases do not depend on
//! it and run on the local store only.

#[path = "common/mod.rs"]
mod common;

mod gateway {
    pub mod backend;
    mod failures;
    mod forwarding;
    mod fuzz;
    mod hostile;
    mod steps;
    mod streaming;
}

use std::time::Duration;

use common::{Reply, Server};
use gateway::backend::TestBackend;
use reqwest::Method;
use serde_json::{Value, json};

pub const COMPUTE: &str = "compute.example.com";
pub const STORAGE: &str = "storage.example.com";
/// The sync id every registration here starts with.
pub const SYNC_ID: &str = "2026-02-01T00Z";

/// A gateway path of `api` into namespace `ns`.
pub fn gw(api: &str, ns: &str, rest: &str) -> String {
    format!("/apis/{api}/v1/namespaces/{ns}/{rest}")
}

/// A server and a backend with: namespace `core` (active); registration
/// `compute.example.com` (short name `compute`) served by the backend; and
/// `core`'s subscription to it, not yet active.
pub struct World {
    pub server: Server,
    pub backend: TestBackend,
}

impl World {
    pub async fn new(server: Server) -> World {
        let backend = TestBackend::start().await;
        let world = World { server, backend };
        world.namespace("core").await;
        world.register(COMPUTE, json!({"short_name": "compute"})).await;
        world.server.subscribe("core", COMPUTE).await;
        world
    }

    /// Creates namespace `name` and activates it, as the reconciler would.
    pub async fn namespace(&self, name: &str) {
        self.server.namespace(name).await;
        self.server.repo.activate_namespace(name).await.expect("activate namespace");
    }

    /// Registers `api`, served by the backend unless `fields` say otherwise.
    pub async fn register(&self, api: &str, fields: Value) {
        let mut body = json!({"endpoint": self.backend.base, "sync_id": SYNC_ID, "mode": "api"});
        common::merge(&mut body, fields);
        self.server.registration(api, body).await;
    }

    /// A successful initial sync of `ns`'s subscription to `api`.
    pub async fn activate(&self, ns: &str, api: &str) {
        let seen = self.server.repo.get_subscription(ns, api).await.unwrap().expect("subscription");
        crate::common::record_result(&self.server.repo, &seen, Some(SYNC_ID)).await;
    }

    /// A failed later sync of `ns`'s subscription to `api`.
    pub async fn fail_sync(&self, ns: &str, api: &str) {
        let seen = self.server.repo.get_subscription(ns, api).await.unwrap().expect("subscription");
        crate::common::record_result(&self.server.repo, &seen, None).await;
    }

    /// A user whose only cluster role has `rules`; their token.
    pub async fn user(&self, name: &str, rules: Value) -> String {
        self.server.user_with_rules(name, rules).await
    }

    /// A user with no cluster grants, bound in namespace `ns` to a role
    /// with `rules`; their token.
    pub async fn user_in_namespace(&self, name: &str, ns: &str, rules: Value) -> String {
        let (_, token) = self.server.user_with_token(name).await;
        let role = format!("{name}-in-{ns}");
        self.server.post("/roles", json!({"name": role, "rules": rules})).await.expect(201);
        let binding = json!({"name": role, "role": role, "user": name});
        self.server.post(&format!("/namespaces/{ns}/rolebindings"), binding).await.expect(201);
        token
    }

    /// A bodiless gateway request.
    pub async fn call(&self, method: Method, path: &str, token: Option<&str>) -> Reply {
        self.server.call(method, path, token, None).await
    }
}

/// Every rule on every API.
pub fn everything() -> Value {
    json!([{"apis": ["*"], "resources": ["*"], "verbs": ["*"]}])
}

/// Checks a gateway refusal: status, the contract's `{code, reason,
/// message}` with nothing else, and that the message mentions each of
/// `mentions`. Returns the message.
#[track_caller]
pub fn refused(reply: Reply, status: u16, mentions: &[&str]) -> String {
    let reason = match status {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        502 => "BadGateway",
        503 => "Unavailable",
        504 => "GatewayTimeout",
        other => panic!("not a gateway refusal: {other}"),
    };
    assert_eq!(reply.status, status, "unexpected status; body: {}", reply.text);
    let body = reply.json.as_object().unwrap_or_else(|| panic!("error body is not a JSON object: {}", reply.text));
    assert_eq!(body.len(), 3, "error body has fields other than code/reason/message: {}", reply.text);
    assert_eq!(reply.json["code"], status);
    assert_eq!(reply.json["reason"], reason);
    let message = reply.json["message"].as_str().expect("message").to_string();
    for mention in mentions {
        assert!(message.contains(mention), "message {message:?} does not mention {mention:?}");
    }
    message
}

/// A server of the same deployment and store as `server` whose gateway
/// gives backends `timeout` to answer: the router of `kayra serve` with
/// its gateway state changed, served on 127.0.0.1:0. Returns its base URL.
pub async fn with_response_timeout(server: &Server, timeout: Duration) -> String {
    let store = kayra_store::Store::open(&server.config.database).await.expect("open store");
    let mut state = kayra_server::AppState::new(&server.config, store);
    state.gateway = state.gateway.with_response_timeout(timeout);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let app = kayra_server::router(state);
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}
