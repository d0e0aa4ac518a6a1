//! Step 6 with large bodies: both stream through the gateway, neither is
//! buffered.
//!
//! Two checks, one per kind of evidence. Causal: each side produces the
//! second half of its body only after the far side has received some of
//! the first, which a buffering gateway would never allow (the wait times
//! out and is recorded). Physical: the peak resident memory of this
//! process (client, gateway and backend all live in it) grows by far less
//! than one body while both go through.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;

use crate::common::{Backend, Server};
use crate::gateway::backend::{CHUNK, wait_for};
use crate::{COMPUTE, World, everything, gw};

/// Each body: 64 MiB.
const BODY: usize = 64 * 1024 * 1024;

/// VmRSS of this process in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// Samples RSS every few milliseconds and keeps the peak.
struct Peak {
    baseline: u64,
    peak: Arc<AtomicU64>,
    sampler: tokio::task::JoinHandle<()>,
}

impl Peak {
    fn start() -> Peak {
        let baseline = rss();
        let peak = Arc::new(AtomicU64::new(baseline));
        let sampler = tokio::spawn({
            let peak = peak.clone();
            async move {
                loop {
                    peak.fetch_max(rss(), Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        });
        Peak { baseline, peak, sampler }
    }

    /// The largest growth over the baseline seen.
    fn growth(&self) -> u64 {
        self.peak.load(Ordering::SeqCst).max(rss()).saturating_sub(self.baseline)
    }
}

impl Drop for Peak {
    fn drop(&mut self) {
        self.sampler.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_both_ways_with_bounded_memory() {
    let world = World::new(Server::start(Backend::Local).await).await;
    world.activate("core", COMPUTE).await;
    let token = world.user("alice", everything()).await;
    let streaming = world.backend.streaming();
    let peak = Peak::start();

    // Upload: the second half is produced only once the backend has bytes.
    let overlapped = Arc::new(AtomicBool::new(false));
    let body = futures::stream::unfold(0usize, {
        let streaming = streaming.clone();
        let overlapped = overlapped.clone();
        move |sent| {
            let streaming = streaming.clone();
            let overlapped = overlapped.clone();
            async move {
                if sent >= BODY {
                    return None;
                }
                if sent == BODY / 2 {
                    let received = wait_for(|| streaming.uploaded.load(Ordering::SeqCst) > 0).await;
                    overlapped.store(received, Ordering::SeqCst);
                }
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'u'; CHUNK])), sent + CHUNK))
            }
        }
    });
    let response = world
        .server
        .client
        .post(world.server.url(&gw(COMPUTE, "core", "upload")))
        .bearer_auth(&token)
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .expect("upload");
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value = response.json().await.expect("upload answer");
    assert_eq!(answer["bytes"], BODY as u64, "the backend received the whole body");
    assert!(overlapped.load(Ordering::SeqCst), "the backend received nothing until the upload was half done");

    // Download: counted as it arrives, never held.
    let url = world.server.url(&gw(COMPUTE, "core", &format!("download?bytes={BODY}")));
    let response = world.server.client.get(url).bearer_auth(&token).send().await.expect("download");
    assert_eq!(response.status(), 200);
    let mut chunks = response.bytes_stream();
    let mut received = 0u64;
    while let Some(chunk) = chunks.next().await {
        received += chunk.expect("download chunk").len() as u64;
        streaming.downloaded.store(received, Ordering::SeqCst);
    }
    assert_eq!(received, BODY as u64, "the caller received the whole body");
    assert!(
        streaming.download_overlapped.load(Ordering::SeqCst),
        "the caller received nothing until the backend was half done"
    );

    let growth = peak.growth();
    assert!(
        growth < (BODY / 2) as u64,
        "resident memory grew by {} MiB moving two {} MiB bodies",
        growth >> 20,
        BODY >> 20
    );

    // Neither body was refused for size: the catalog's limit is not the gateway's.
    assert!(world.server.config.server.max_body_bytes < BODY);
    assert_eq!(world.call(Method::GET, &gw(COMPUTE, "core", "vms"), Some(&token)).await.status, 200);
}
