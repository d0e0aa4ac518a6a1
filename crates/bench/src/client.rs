//! The benchmark's HTTP client for throughput figures: a fixed number of
//! keep-alive HTTP/1.1 connections over real loopback TCP, one task each,
//! every task driving its own hyper connection and the requests it sends.
//!
//! Why not `reqwest` here: client and server share the machine's two
//! cores, so whatever the client spends is taken from the server. reqwest
//! parses a URL, checks a connection out of its pool and hands each request
//! to a separate connection task (two cross-task wake-ups per request); all
//! 32 requests in flight were also polled from one task, which alone capped
//! `/healthz` at one core. This client does real requests (a request line,
//! headers, the whole response body read before the next request on the
//! connection) at a fraction of that cost, so a figure measures the
//! server. `reqwest` stays for setup and the propagation timing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;

/// One request of a measurement: method, path (with query), optional
/// bearer token, optional JSON body.
pub struct Call {
    pub method: hyper::Method,
    pub path: String,
    pub bearer: Option<Arc<str>>,
    pub json: Option<Vec<u8>>,
}

impl Call {
    pub fn get(path: String) -> Self {
        Self { method: hyper::Method::GET, path, bearer: None, json: None }
    }

    pub fn post(path: String, json: Vec<u8>) -> Self {
        Self { method: hyper::Method::POST, path, bearer: None, json: Some(json) }
    }

    pub fn bearer(mut self, token: &Arc<str>) -> Self {
        self.bearer = Some(token.clone());
        self
    }
}

/// `ops` calls (`call(i)` for each i), `connections` at a time on as many
/// keep-alive connections to `base` (`http://host:port`), each timed; any
/// answer but 2xx fails the measurement.
pub async fn measure(
    base: &str,
    ops: usize,
    connections: usize,
    call: impl Fn(usize) -> Call + Send + Sync + 'static,
) -> anyhow::Result<Figures> {
    let authority = base.strip_prefix("http://").context("an http:// base URL")?.trim_end_matches('/').to_string();
    let next = Arc::new(AtomicUsize::new(0));
    let call = Arc::new(call);
    let mut lanes = Vec::with_capacity(connections);
    // Every connection is open before the clock starts.
    for _ in 0..connections {
        let tcp = tokio::net::TcpStream::connect(&authority).await.with_context(|| format!("connect {authority}"))?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp)).await?;
        lanes.push((sender, conn));
    }
    let started = Instant::now();
    let tasks: Vec<_> = lanes
        .into_iter()
        .map(|(mut sender, conn)| {
            let (next, call, authority) = (next.clone(), call.clone(), authority.clone());
            tokio::spawn(async move {
                let work = async {
                    let mut latencies = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= ops {
                            return Ok::<_, anyhow::Error>(latencies);
                        }
                        let Call { method, path, bearer, json } = call(i);
                        let mut request = Request::builder().method(method).uri(path).header(HOST, &authority);
                        if let Some(token) = bearer {
                            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
                        }
                        if json.is_some() {
                            request = request.header(CONTENT_TYPE, "application/json");
                        }
                        let request = request.body(Full::new(Bytes::from(json.unwrap_or_default())))?;
                        let t = Instant::now();
                        sender.ready().await?;
                        let response = sender.send_request(request).await?;
                        let status = response.status();
                        let body = response.into_body().collect().await?.to_bytes();
                        anyhow::ensure!(status.is_success(), "HTTP {status}: {}", String::from_utf8_lossy(&body));
                        latencies.push(t.elapsed());
                    }
                };
                // The connection is driven by this task too: no hand-off
                // to another task per request.
                let mut conn = std::pin::pin!(conn);
                tokio::select! {
                    done = work => done,
                    ended = &mut conn => Err(anyhow::anyhow!("connection ended early: {ended:?}")),
                }
            })
        })
        .collect();
    let mut latencies: Vec<Duration> = Vec::with_capacity(ops);
    for task in tasks {
        latencies.extend(task.await??);
    }
    let rate = ops as f64 / started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Ok(Figures::from_sorted(rate, &latencies))
}

/// Throughput and latency of one measurement.
pub(crate) struct Figures {
    pub(crate) rate: f64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
}

impl Figures {
    pub(crate) fn from_sorted(rate: f64, latencies: &[Duration]) -> Self {
        Self { rate, p50: percentile(latencies, 0.50), p99: percentile(latencies, 0.99) }
    }
}

/// The `q` quantile of `sorted` latencies (zero for none).
pub(crate) fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}
