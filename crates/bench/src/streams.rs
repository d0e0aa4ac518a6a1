//! Watch streams at scale (§4.5, issue 14), on a real `kayra serve`
//! process so its RSS is its own:
//!
//! - the API GET benchmark (one namespace, a narrow role, 32 in flight,
//!   at least 3 s each) without streams, with `streams` idle watch streams
//!   open, and without them again, all in the same run;
//! - memory per idle stream: the serve's RSS with the streams open minus
//!   its RSS before, divided by their number;
//! - delivery: `writes` namespace creations through the API, one at a
//!   time; for each, the time from its `201` reaching the client to its
//!   `ADDED` event arriving on each stream (p50/p99 over every delivery)
//!   and on the last stream (p50/p99 over the writes).
//!
//! Every stream is its own HTTP/1.1 connection (`GET
//! /namespaces?watch=true`, the NDJSON framing) and its own reader task.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::mpsc;

/// The stream caps of the measured server: past any `--stream-count`.
const MAX_STREAMS: usize = 1_000_000;

use crate::client::percentile;

const ADMIN: &str = "bench-admin-token-0123456789abcdef0123456789";
const CATALOG: &str = "/apis/catalog.example.com/v1";
const INFLIGHT: usize = 32;
/// Namespaces the GET benchmark reads (and every stream's initial state).
const PRESENT: usize = 100;

/// A private `kayra serve` process; killed on drop.
struct Serve {
    child: tokio::process::Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Serve {
    async fn start(binary: &std::path::Path, database_yaml: &str) -> anyhow::Result<Serve> {
        let dir = tempfile::tempdir()?;
        let config_file = dir.path().join("kayra.yaml");
        let listen = format!("127.0.0.1:{}", kayra_testkit::free_port());
        std::fs::write(
            &config_file,
            // One user holds every stream of the measurement: the caps of
            // §17 (100 a user by default) are lifted past it.
            format!(
                "server:\n  listen: {listen}\n  max_streams_per_user: {MAX_STREAMS}\n  max_streams: {MAX_STREAMS}\n\
                 database:\n{database_yaml}auth:\n  bootstrap_token: {ADMIN}\n"
            ),
        )?;
        // The serve runs in its temp dir (a local store's relative paths), so
        // the binary's path must not be relative.
        let binary = std::fs::canonicalize(binary).with_context(|| format!("find {}", binary.display()))?;
        let child = tokio::process::Command::new(&binary)
            .arg("serve")
            .arg("--config")
            .arg(&config_file)
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let base = format!("http://{listen}");
        let http = reqwest::Client::new();
        kayra_testkit::eventually("kayra serve ready", || async {
            http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success())
        })
        .await;
        Ok(Serve { child, base, _dir: dir })
    }

    /// The process's resident set, in KiB.
    fn rss_kib(&self) -> anyhow::Result<u64> {
        let pid = self.child.id().context("pid")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("VmRSS")?;
        Ok(line.trim_start_matches("VmRSS:").trim().trim_end_matches("kB").trim().parse()?)
    }
}

async fn ok(response: reqwest::Response) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    anyhow::ensure!(status.is_success(), "HTTP {status}: {}", response.text().await.unwrap_or_default());
    Ok(response)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// How long each GET measurement runs at least: a few thousand GETs take
/// a fifth of a second locally, too short for a ratio between two of them
/// to mean anything on a busy 2-core machine.
const GET_WINDOW: Duration = Duration::from_secs(3);

/// GETs per second of one namespace each, [`INFLIGHT`] at a time, in
/// rounds of `ops` until [`GET_WINDOW`] has passed.
async fn get_rate(http: &reqwest::Client, base: &str, token: &str, ops: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut done = 0;
    while done == 0 || started.elapsed() < GET_WINDOW {
        let gets = futures::stream::iter(0..ops).map(|i| {
            let url = format!("{base}{CATALOG}/namespaces/b{}", i % PRESENT);
            let request = http.get(url).bearer_auth(token);
            async move { ok(request.send().await?).await.map(|_| ()) }
        });
        for result in gets.buffer_unordered(INFLIGHT).collect::<Vec<_>>().await {
            result?;
        }
        done += ops;
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

/// The number in a line `{"type":"ADDED","object":{"name":"w<N>"...`.
fn written(line: &[u8]) -> Option<usize> {
    const MARK: &[u8] = br#""type":"ADDED","object":{"name":"w"#;
    let at = line.windows(MARK.len()).position(|w| w == MARK)? + MARK.len();
    let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&line[at..at + digits]).ok()?.parse().ok()
}

/// One stream: counts itself open at its first line, then reports the
/// arrival of every `w<N>` namespace's `ADDED` event.
async fn read_stream(
    response: reqwest::Response,
    open: Arc<AtomicUsize>,
    arrivals: mpsc::UnboundedSender<(usize, Instant)>,
) -> anyhow::Result<()> {
    let mut body = response.bytes_stream();
    let mut line = Vec::new();
    let mut counted = false;
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        let now = Instant::now();
        for part in chunk.split_inclusive(|b| *b == b'\n') {
            line.extend_from_slice(part);
            if line.last() != Some(&b'\n') {
                continue;
            }
            if !counted {
                counted = true;
                open.fetch_add(1, Ordering::SeqCst);
            }
            if let Some(n) = written(&line) {
                let _ = arrivals.send((n, now));
            }
            line.clear();
        }
    }
    Ok(())
}

/// The figures for one backend; `database_yaml` is the `database:` block
/// of the serve's config (indented), `store` the same database for setup.
pub async fn run(
    backend: &str,
    binary: &std::path::Path,
    database_yaml: &str,
    streams: usize,
    writes: usize,
    ops: usize,
) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let serve = Serve::start(binary, database_yaml).await?;
    let base = serve.base.clone();
    let http = reqwest::Client::new();
    let admin = |request: reqwest::RequestBuilder| request.bearer_auth(ADMIN);

    // The watcher: a user whose one role grants get and watch on namespaces.
    let role = json!({"name": "watcher", "rules": [{
        "apis": ["catalog.example.com"], "resources": ["namespaces"], "verbs": ["get", "watch"]}]});
    ok(admin(http.post(format!("{base}{CATALOG}/roles"))).json(&role).send().await?).await?;
    ok(admin(http.post(format!("{base}{CATALOG}/users"))).json(&json!({"name": "watcher"})).send().await?).await?;
    let binding = json!({"name": "watcher", "role": "watcher", "user": "watcher"});
    ok(admin(http.post(format!("{base}{CATALOG}/clusterrolebindings"))).json(&binding).send().await?).await?;
    let issued: serde_json::Value =
        ok(admin(http.post(format!("{base}{CATALOG}/users/watcher/tokens"))).json(&json!({})).send().await?)
            .await?
            .json()
            .await?;
    let token = issued["token"].as_str().context("token")?.to_string();
    for i in 0..PRESENT {
        ok(admin(http.post(format!("{base}{CATALOG}/namespaces")))
            .json(&json!({"name": format!("b{i}")}))
            .send()
            .await?)
        .await?;
    }
    // The caches have seen the role, binding and token once a GET passes.
    kayra_testkit::eventually("the watcher may get", || async {
        let url = format!("{base}{CATALOG}/namespaces/b0");
        http.get(url).bearer_auth(&token).send().await.is_ok_and(|r| r.status().is_success())
    })
    .await;

    // Warm-up: connections, caches and the allocator, before anything counts.
    get_rate(&http, &base, &token, ops).await?;
    let get_before = get_rate(&http, &base, &token, ops).await?;
    let rss_before = serve.rss_kib()?;

    // The streams, each on its own connection (a streamed response holds
    // its HTTP/1.1 connection, so the pool opens one per request).
    let streaming = reqwest::Client::builder().http1_only().build()?;
    let open = Arc::new(AtomicUsize::new(0));
    let (arrivals_tx, mut arrivals) = mpsc::unbounded_channel();
    let opened = Instant::now();
    let requests = futures::stream::iter(0..streams).map(|_| {
        let url = format!("{base}{CATALOG}/namespaces?watch=true");
        let request = streaming.get(url).bearer_auth(&token);
        async move { ok(request.send().await?).await }
    });
    let mut readers = tokio::task::JoinSet::new();
    let mut responses = requests.buffer_unordered(INFLIGHT);
    while let Some(response) = responses.next().await {
        readers.spawn(read_stream(response?, open.clone(), arrivals_tx.clone()));
    }
    drop(responses);
    kayra_testkit::eventually("every stream open with its initial state", || async {
        open.load(Ordering::SeqCst) == streams
    })
    .await;
    let open_time = opened.elapsed();
    // Let the serve's allocator settle before reading its RSS.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_streams = serve.rss_kib()?;
    let get_with = get_rate(&http, &base, &token, ops).await?;

    // Delivery: one write at a time, each awaited on every stream.
    let mut every = Vec::with_capacity(streams * writes);
    let mut last = Vec::with_capacity(writes);
    for n in 0..writes {
        let name = format!("w{n}");
        ok(admin(http.post(format!("{base}{CATALOG}/namespaces"))).json(&json!({"name": name})).send().await?).await?;
        let acknowledged = Instant::now();
        let mut seen = 0;
        let mut latest = Duration::ZERO;
        let deadline = acknowledged + Duration::from_secs(30);
        while seen < streams {
            let (got, at) = tokio::time::timeout_at(deadline.into(), arrivals.recv())
                .await
                .with_context(|| format!("write {n} reached {seen} of {streams} streams in 30 s"))?
                .context("streams ended")?;
            anyhow::ensure!(got == n, "an event of write {got} while waiting for write {n}");
            // An event may beat the 201 to the client: that is 0, not negative.
            let latency = at.saturating_duration_since(acknowledged);
            every.push(latency);
            latest = latest.max(latency);
            seen += 1;
        }
        last.push(latest);
    }
    every.sort_unstable();
    last.sort_unstable();

    readers.abort_all();
    while readers.join_next().await.is_some() {}
    // The serve notices the closed connections on its next write to them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let get_after = get_rate(&http, &base, &token, ops).await?;

    let per_stream = (rss_streams.saturating_sub(rss_before)) as f64 / streams as f64;
    println!(
        "| {backend} | {streams} streams opened (initial state of {PRESENT} namespaces each) | {:.0} ms | |",
        ms(open_time)
    );
    println!(
        "| {backend} | event after the write's 201, each of {} deliveries | p50 {:.2} ms | p99 {:.2} ms |",
        every.len(),
        ms(percentile(&every, 0.5)),
        ms(percentile(&every, 0.99))
    );
    println!(
        "| {backend} | event after the write's 201, on the last stream ({writes} writes) | p50 {:.2} ms | p99 {:.2} ms |",
        ms(percentile(&last, 0.5)),
        ms(percentile(&last, 0.99))
    );
    println!("| {backend} | API GET namespace, no streams | {get_before:.0}/s | 1.00 |");
    println!(
        "| {backend} | API GET namespace, {streams} idle streams open | {get_with:.0}/s | {:.2} |",
        get_with / get_before
    );
    println!(
        "| {backend} | API GET namespace, streams closed again | {get_after:.0}/s | {:.2} |",
        get_after / get_before
    );
    println!(
        "| {backend} | serve RSS: {rss_before} KiB without, {rss_streams} KiB with {streams} streams | {per_stream:.1} KiB per stream | |"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_reads_only_added_w_namespaces() {
        assert_eq!(written(br#"{"type":"ADDED","object":{"name":"w17","description":""}}"#), Some(17));
        assert_eq!(written(br#"{"type":"ADDED","object":{"name":"b17"}}"#), None);
        assert_eq!(written(br#"{"type":"MODIFIED","object":{"name":"w17"}}"#), None);
    }
}
