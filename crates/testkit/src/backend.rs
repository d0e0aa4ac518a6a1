//! A recording HTTP backend for reconciler tests, on 127.0.0.1:0.
//!
//! The first path segment picks the behaviour: `/ok/..` answers 200,
//! `/fail/..` 500, `/slow/..` 200 after 20ms, `/sleep/<ms>/..` 200 after
//! `<ms>` milliseconds, `/hold/..` waits for
//! [`TestBackend::release`] before answering 200, `/big/<n>/..` 200 with
//! the JSON body `{"id": V}`, V `n` bytes of `x` (a backend's outsized
//! answer), `/wide/<n>/..` the same with `"a"`, `"b"` and `"c"` too,
//! `/ns/<name>/..` 500 when `<name>` starts with `bad`, else 200 (a step
//! whose endpoint carries the namespace fails for some tenants only).
//! Every call is recorded,
//! and the highest number of concurrent calls is tracked.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, Uri};
use tokio::sync::Semaphore;

struct State {
    calls: Mutex<Vec<(std::time::Instant, String)>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    gate: Semaphore,
}

pub struct TestBackend {
    pub base: String,
    state: Arc<State>,
}

impl TestBackend {
    pub async fn start() -> Self {
        let state = Arc::new(State {
            calls: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            gate: Semaphore::new(0),
        });
        let app = Router::new().fallback({
            let state = state.clone();
            move |uri: Uri| {
                let state = state.clone();
                async move { answer(&state, uri).await }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { base, state }
    }

    /// Every call's path so far.
    pub fn calls(&self) -> Vec<String> {
        self.state.calls.lock().unwrap().iter().map(|(_, path)| path.clone()).collect()
    }

    /// When each call whose path starts with `prefix` arrived, in order.
    pub fn arrivals(&self, prefix: &str) -> Vec<std::time::Instant> {
        self.state.calls.lock().unwrap().iter().filter(|(_, p)| p.starts_with(prefix)).map(|(at, _)| *at).collect()
    }

    /// Calls whose path starts with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.calls().iter().filter(|c| c.starts_with(prefix)).count()
    }

    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// Lets `n` held calls answer.
    pub fn release(&self, n: usize) {
        self.state.gate.add_permits(n);
    }

    /// Waits until at least `n` calls start with `prefix`.
    pub async fn wait_for(&self, prefix: &str, n: usize) {
        crate::eventually(&format!("{n} calls to {prefix}"), || async { self.count(prefix) >= n }).await;
    }
}

/// Sleeps `d`, to within a few tens of microseconds: the runtime's timer
/// rounds a deadline up to its next millisecond tick (a 20 ms sleep takes
/// 20–21.5 ms), so the last millisecond is slept by the OS on a blocking
/// thread. A backend asked to take 20 ms takes 20 ms, and a benchmark's
/// ideal time is the backend's own.
async fn sleep_exactly(d: Duration) {
    let deadline = std::time::Instant::now() + d;
    if let Some(coarse) = d.checked_sub(Duration::from_millis(2)) {
        tokio::time::sleep(coarse).await;
    }
    let rest = deadline.saturating_duration_since(std::time::Instant::now());
    if !rest.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
}

async fn answer(state: &State, uri: Uri) -> axum::response::Response {
    use axum::response::IntoResponse;
    let path = uri.path();
    let first = path.split('/').nth(1);
    if matches!(first, Some("big" | "wide")) {
        let _ = status(state, uri.clone()).await;
        let n = path.split('/').nth(2).and_then(|n| n.parse().ok()).unwrap_or(0);
        let body = if first == Some("big") {
            format!(r#"{{"id":"{}"}}"#, noise(n, 1))
        } else {
            let [id, a, b, c] = [1, 2, 3, 4].map(|seed| noise(n, seed));
            format!(r#"{{"id":"{id}","a":"{a}","b":"{b}","c":"{c}"}}"#)
        };
        return (StatusCode::OK, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response();
    }
    status(state, uri).await.into_response()
}

/// `n` letters and digits of a xorshift sequence from `seed`: as good as
/// random to a compressor (under 6 bits a character), and the same on
/// every call (a shorter one is a prefix of a longer). `/big/<n>` answers
/// `noise(n, 1)` as its `id`, and `/wide/<n>` seeds 2–4 for `a`–`c`.
pub fn noise(n: usize, seed: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(ALPHABET[(x % ALPHABET.len() as u64) as usize])
        })
        .collect()
}

async fn status(state: &State, uri: Uri) -> StatusCode {
    let path = uri.path().to_string();
    state.calls.lock().unwrap().push((std::time::Instant::now(), path.clone()));
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let status = match path.split('/').nth(1).unwrap_or("") {
        "ok" => StatusCode::OK,
        "fail" => StatusCode::INTERNAL_SERVER_ERROR,
        "slow" => {
            sleep_exactly(Duration::from_millis(20)).await;
            StatusCode::OK
        }
        "sleep" => {
            let ms = path.split('/').nth(2).and_then(|ms| ms.parse().ok()).unwrap_or(0);
            sleep_exactly(Duration::from_millis(ms)).await;
            StatusCode::OK
        }
        "hold" => {
            state.gate.acquire().await.unwrap().forget();
            StatusCode::OK
        }
        "big" | "wide" => StatusCode::OK,
        "ns" if path.split('/').nth(2).is_some_and(|ns| ns.starts_with("bad")) => StatusCode::INTERNAL_SERVER_ERROR,
        "ns" => StatusCode::OK,
        _ => StatusCode::NOT_FOUND,
    };
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    status
}
