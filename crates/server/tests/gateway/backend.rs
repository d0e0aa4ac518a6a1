//! A registered API's backend for gateway tests, on 127.0.0.1:0.
//!
//! It records what it received (method, path and query, headers) and
//! answers by the `<resource>` segment of the gateway path:
//!
//! - `slow`: 200 after 10s (for the 504 test);
//! - `moved`: 302 to `/elsewhere` (the gateway must not follow it);
//! - `upload`: counts the request body as it streams in and answers
//!   `{"bytes": n}`;
//! - `download`: streams `?bytes=N` bytes of response body;
//! - anything else: echoes `{"method", "path", "query", "body"}` with 201
//!   for POST and 200 otherwise, plus `X-Backend: echo` and a hop-by-hop
//!   header (`Connection: x-hop`, `X-Hop: 1`) the gateway must drop.
//!
//! For the streaming test both directions are generated and counted, never
//! held: each side waits, before producing the second half of its body,
//! until the far side has received something. A gateway that buffered a
//! whole body would stall that wait, which [`Streaming`] records.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::json;

/// Chunk size of generated bodies.
pub const CHUNK: usize = 64 * 1024;
/// How long one side of a stream waits for the far side to start receiving.
const FAR_SIDE_WAIT: Duration = Duration::from_secs(10);

/// One request as the backend received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    /// Path and query, exactly as received.
    pub uri: String,
    pub headers: HeaderMap,
}

/// Progress of the two streamed bodies, shared with the test.
#[derive(Debug, Default)]
pub struct Streaming {
    /// Upload bytes the backend has received so far.
    pub uploaded: AtomicU64,
    /// Download bytes the test client has received so far (the test updates it).
    pub downloaded: AtomicU64,
    /// The download's first half was received before its second half was produced.
    pub download_overlapped: AtomicBool,
}

#[derive(Default)]
struct State {
    seen: Mutex<Vec<Seen>>,
    streaming: Arc<Streaming>,
}

pub struct TestBackend {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    state: Arc<State>,
}

impl TestBackend {
    pub async fn start() -> TestBackend {
        let state = Arc::new(State::default());
        let app = Router::new().fallback({
            let state = state.clone();
            move |request: Request| {
                let state = state.clone();
                async move { answer(&state, request).await }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the backend");
        let base = format!("http://{}", listener.local_addr().expect("backend address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        TestBackend { base, state }
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("seen").clone()
    }

    /// The requests received after the first `skip`.
    pub fn seen_since(&self, skip: usize) -> Vec<Seen> {
        self.state.seen.lock().expect("seen").iter().skip(skip).cloned().collect()
    }

    /// The last request received.
    #[track_caller]
    pub fn last(&self) -> Seen {
        self.seen().pop().expect("the backend received a request")
    }

    pub fn streaming(&self) -> Arc<Streaming> {
        self.state.streaming.clone()
    }
}

async fn answer(state: &State, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let uri = parts.uri.path_and_query().map_or_else(String::new, |pq| pq.to_string());
    state.seen.lock().expect("seen").push(Seen { method: parts.method.clone(), uri, headers: parts.headers });
    match parts.uri.path().split('/').nth(6).unwrap_or_default() {
        "slow" => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            StatusCode::OK.into_response()
        }
        "moved" => (StatusCode::FOUND, [(header::LOCATION, "/elsewhere")]).into_response(),
        "upload" => {
            let mut stream = body.into_data_stream();
            let mut total = 0u64;
            while let Some(chunk) = stream.next().await {
                let Ok(chunk) = chunk else { return StatusCode::BAD_REQUEST.into_response() };
                total += chunk.len() as u64;
                state.streaming.uploaded.store(total, Ordering::SeqCst);
            }
            axum::Json(json!({"bytes": total})).into_response()
        }
        "download" => {
            let bytes: usize = parts
                .uri
                .query()
                .and_then(|q| q.strip_prefix("bytes="))
                .and_then(|n| n.parse().ok())
                .unwrap_or_default();
            Body::from_stream(generate(bytes, state.streaming.clone())).into_response()
        }
        _ => {
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
            let status = if parts.method == Method::POST { StatusCode::CREATED } else { StatusCode::OK };
            let echo = json!({
                "method": parts.method.as_str(),
                "path": parts.uri.path(),
                "query": parts.uri.query().unwrap_or_default(),
                "body": String::from_utf8_lossy(&body),
            });
            let mut response = (status, axum::Json(echo)).into_response();
            let headers = response.headers_mut();
            headers.insert("x-backend", HeaderValue::from_static("echo"));
            headers.insert(header::CONNECTION, HeaderValue::from_static("x-hop"));
            headers.insert("x-hop", HeaderValue::from_static("1"));
            response
        }
    }
}

/// `total` bytes in [`CHUNK`]s; before the second half, waits (at most
/// [`FAR_SIDE_WAIT`]) until the client has received some of the first.
fn generate(total: usize, streaming: Arc<Streaming>) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    let chunk = Bytes::from(vec![b'k'; CHUNK]);
    futures::stream::unfold(0usize, move |sent| {
        let chunk = chunk.clone();
        let streaming = streaming.clone();
        async move {
            if sent >= total {
                return None;
            }
            if sent >= total / 2 && sent < total / 2 + CHUNK {
                let received = wait_for(|| streaming.downloaded.load(Ordering::SeqCst) > 0).await;
                streaming.download_overlapped.store(received, Ordering::SeqCst);
            }
            let n = CHUNK.min(total - sent);
            Some((Ok(chunk.slice(..n)), sent + n))
        }
    })
}

/// Polls `done` until it holds or [`FAR_SIDE_WAIT`] passes; whether it held.
pub async fn wait_for(done: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + FAR_SIDE_WAIT;
    while !done() {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}
