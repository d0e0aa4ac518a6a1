//! A store that hangs, is locked by another process, or loses its file:
//! every request answers within `database.request_timeout` (503 past it),
//! reads never wait behind a pending write, and no write is acknowledged
//! into a file that is gone (issue 10 items 6, 8, 9, 18).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{Backend, Server};

const TIMEOUT: Duration = Duration::from_secs(1);

async fn with_timeout(server: &Server, change: impl FnOnce(&mut kayra_config::Config)) -> Server {
    server
        .restart_with(|c| {
            change(c);
            c.database.request_timeout = kayra_config::Duration(TIMEOUT);
        })
        .await
}

/// etcd frozen with SIGSTOP: a catalog GET answers 503 within
/// request_timeout + 1 s, `/readyz` too; after SIGCONT all is well again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_etcd_answers_503_within_the_request_timeout() {
    let etcd = kayra_testkit::Etcd::start().await;
    let seed = Server::start(Backend::Local).await;
    let server = with_timeout(&seed, |c| c.database = kayra_config::DatabaseConfig::etcd(etcd.config("/kayra"))).await;
    server.namespace("core").await;
    server.get("/namespaces/core").await.expect(200);

    etcd.freeze();
    for path in ["/namespaces/core", "/namespaces", "/readyz"] {
        let started = Instant::now();
        let reply = server.get(path).await;
        let took = started.elapsed();
        assert_eq!(reply.status, 503, "{path}: {}", reply.text);
        assert!(took < TIMEOUT + Duration::from_secs(1), "{path} answered after {took:?}");
    }
    let started = Instant::now();
    server.post("/namespaces", json!({"name": "later"})).await.error(503, &[]);
    assert!(started.elapsed() < TIMEOUT + Duration::from_secs(1));
    etcd.thaw();

    kayra_testkit::eventually("the API to answer again", || async {
        server.get("/namespaces/core").await.status == 200
    })
    .await;
    server.get("/readyz").await.expect(200);
}

/// Another process holds the local file's write lock: a POST waits at most
/// the request timeout (503), while GETs and `/readyz` answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_local_write_does_not_freeze_reads() {
    let seed = Server::start(Backend::Local).await;
    let server = with_timeout(&seed, |_| {}).await;
    server.namespace("core").await;
    let path = server.config.database.local.as_ref().expect("local store").path.clone();

    let holder = rusqlite::Connection::open(&path).expect("open the store file");
    holder.execute_batch("BEGIN IMMEDIATE").expect("take the write lock");
    let started = Instant::now();
    let post = {
        let (client, url, admin) = (server.client.clone(), server.url("/namespaces"), server.admin.clone());
        tokio::spawn(async move {
            client.post(url).bearer_auth(admin).json(&json!({"name": "blocked"})).send().await.map(|r| r.status())
        })
    };
    while started.elapsed() < Duration::from_millis(700) {
        let begun = Instant::now();
        server.get("/namespaces/core").await.expect(200);
        server.get("/readyz").await.expect(200);
        assert!(begun.elapsed() < Duration::from_millis(500), "reads took {:?}", begun.elapsed());
    }
    let status = post.await.expect("task").expect("the POST is answered");
    assert_eq!(status.as_u16(), 503);
    assert!(started.elapsed() < TIMEOUT + Duration::from_secs(1), "the POST answered after {:?}", started.elapsed());
    holder.execute_batch("ROLLBACK").expect("release");
    server.post("/namespaces", json!({"name": "after"})).await.expect(201);
}

/// The local store file deleted under a running server: creates answer 503
/// and `/readyz` 503, so nothing acknowledged can be lost at the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_local_file_refuses_writes_and_readiness() {
    let server = Server::start(Backend::Local).await;
    server.namespace("core").await;
    let path = server.config.database.local.as_ref().expect("local store").path.clone();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    server.post("/namespaces", json!({"name": "lost"})).await.error(503, &[]);
    server.get("/readyz").await.error(503, &[]);
    let restarted = server.restart_with(|_| {}).await;
    restarted.get("/namespaces/lost").await.error(404, &["lost"]);
}

/// `?limit=18446744073709551615` (u64::MAX) lists everything on both
/// backends instead of wrapping into an empty page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_limit_lists_everything() {
    for backend in [Backend::Local, Backend::Etcd] {
        let server = Server::start(backend).await;
        for name in ["a", "b", "c"] {
            server.namespace(name).await;
        }
        let listed = server.get("/namespaces?limit=18446744073709551615").await.expect(200);
        let names: Vec<&str> =
            listed["items"].as_array().expect("items").iter().filter_map(|n| n["name"].as_str()).collect();
        assert_eq!(names, ["a", "b", "c"], "{backend:?}");
        assert_eq!(listed["continue"], "");
        // Beyond u64 is bad input, not a 500.
        let too_big = server.get("/namespaces?limit=18446744073709551616").await;
        assert_eq!(too_big.status, 400, "{backend:?}: {}", too_big.text);
    }
}
