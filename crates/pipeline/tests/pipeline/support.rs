//! The recording HTTP server and the helpers every pipeline test uses.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use kayra_config::Config;
use kayra_pipeline::{
    PipelineError, PipelineReport, PipelineSettings, Pipelines, RunControl, SubscriptionContext, ValidationError,
    http_client,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------- server

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    /// Path and query, as sent (percent-encoding kept).
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

/// What the server answers.
#[derive(Default)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub delay: Duration,
    pub headers: Vec<(&'static str, String)>,
}

pub fn ok(body: Value) -> Reply {
    Reply { status: 200, body: body.to_string(), delay: Duration::ZERO, headers: Vec::new() }
}

pub fn status(code: u16) -> Reply {
    Reply { status: code, body: json!({"message": "nope"}).to_string(), delay: Duration::ZERO, headers: Vec::new() }
}

pub fn text(body: &str) -> Reply {
    Reply { status: 200, body: body.to_string(), delay: Duration::ZERO, headers: Vec::new() }
}

pub fn hang() -> Reply {
    Reply { status: 200, body: json!({"late": true}).to_string(), delay: Duration::from_secs(30), headers: Vec::new() }
}

/// `(request, how many earlier requests had this path) -> reply`.
pub type Responder = dyn Fn(&Recorded, usize) -> Reply + Send + Sync;

#[derive(Clone)]
pub struct ServerState {
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    pub responder: Arc<Responder>,
}

pub struct TestServer {
    pub base: String,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
}

impl TestServer {
    pub async fn start(responder: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static) -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let state = ServerState { requests: requests.clone(), responder: Arc::new(responder) };
        let app = axum::Router::new().fallback(handle).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base: format!("http://{addr}"), requests }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn calls(&self, path: &str) -> usize {
        self.requests().iter().filter(|r| r.path == path).count()
    }
}

pub async fn handle(
    State(state): State<ServerState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let request = Recorded { method, path, headers, body };
    let reply = {
        let mut requests = state.requests.lock().unwrap_or_else(PoisonError::into_inner);
        let earlier = requests.iter().filter(|r| r.path == request.path).count();
        requests.push(request.clone());
        (state.responder)(&request, earlier)
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let code = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (code, reply.body).into_response();
    for (name, value) in reply.headers {
        response.headers_mut().insert(name, value.parse().expect("header value"));
    }
    response
}

/// A port nothing listens on.
pub async fn closed_port() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

// ---------------------------------------------------------------- helpers

pub const SETTINGS: PipelineSettings = PipelineSettings {
    async_ack_timeout: Duration::from_millis(200),
    wait_poll_interval: Duration::from_millis(20),
    max_output_bytes: kayra_config::DEFAULT_MAX_OUTPUT_BYTES,
};

pub fn ctx() -> SubscriptionContext {
    SubscriptionContext {
        api: "compute.example.com".into(),
        short_name: "compute".into(),
        namespace: "core".into(),
        platform: "dev".into(),
        region: "local".into(),
        current_sync_id: "2026-01-01T00Z".into(),
        expected_sync_id: "2026-02-01T00Z".into(),
        lock_id: 7,
        run_id: "0193a6c1-run".into(),
        fencing_token: 41,
    }
}

/// Compiles the steps of mode `m`, written as YAML with `BASE` standing
/// for the server's base URL.
pub fn compile(steps_yaml: &str, base: &str) -> Pipelines {
    try_compile(steps_yaml, base).unwrap_or_else(|e| panic!("compile: {e}"))
}

pub fn try_compile(steps_yaml: &str, base: &str) -> Result<Pipelines, ValidationError> {
    try_compile_with(steps_yaml, base, "")
}

/// [`try_compile`] with more `reconciler` keys (YAML, indented two spaces:
/// `"  secrets:\n    s: {env: X}\n"`).
pub fn try_compile_with(steps_yaml: &str, base: &str, reconciler_yaml: &str) -> Result<Pipelines, ValidationError> {
    let indented: String = steps_yaml.lines().map(|l| format!("      {l}\n")).collect();
    let yaml = format!("reconciler:\n{reconciler_yaml}  mode:\n    m:\n{}", indented.replace("BASE", base));
    let config = Config::parse(&yaml, "test.yaml").unwrap_or_else(|e| panic!("parse: {e}\n{yaml}"));
    Pipelines::compile(&config.reconciler)
}

pub fn compile_with(steps_yaml: &str, base: &str, reconciler_yaml: &str) -> Pipelines {
    try_compile_with(steps_yaml, base, reconciler_yaml).unwrap_or_else(|e| panic!("compile: {e}"))
}

pub async fn run(pipelines: &Pipelines) -> Result<(), PipelineError> {
    run_with(pipelines, &CancellationToken::new()).await
}

pub async fn run_with(pipelines: &Pipelines, cancel: &CancellationToken) -> Result<(), PipelineError> {
    report_with(pipelines, &RunControl::new(cancel.clone())).await.result
}

pub async fn report(pipelines: &Pipelines) -> PipelineReport {
    report_with(pipelines, &RunControl::default()).await
}

pub async fn report_with(pipelines: &Pipelines, control: &RunControl) -> PipelineReport {
    let pipeline = pipelines.get("m").expect("mode m");
    pipeline.run(&http_client(), &ctx(), &SETTINGS, control).await
}
