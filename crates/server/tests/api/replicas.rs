//! Two `kayra serve` replicas on one store (§5.2 "replicas"): each decides
//! authentication and RBAC from its own watch-fed caches, yet a revocation
//! through one is enforced by it on its very next request and by the other
//! within 1 s; writes through one are read through the other; a frozen
//! etcd gives 503s, never decisions from stale caches; a replica that
//! missed a compacted window re-lists.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::both_backends;
use crate::common::{Backend, Server};

/// The replica bound of §5.2.
const PROPAGATION: Duration = Duration::from_secs(1);

/// Waits until `token`'s GET of `path` through `server` answers `status`;
/// returns how long that took.
async fn until_status(server: &Server, token: &str, path: &str, status: u16, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let reply = server.call(Method::GET, path, Some(token), None).await;
        if reply.status == status {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{path} did not answer {status} within {within:?} (last {}: {})",
            reply.status,
            reply.text
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Both replicas let `token` GET `path` now.
async fn both_allow(a: &Server, b: &Server, token: &str, path: &str) {
    for server in [a, b] {
        server.call(Method::GET, path, Some(token), None).await.expect(200);
    }
}

/// A revocation through `a`: refused by `a` on the very next request, by
/// `b` within [`PROPAGATION`].
async fn enforced(a: &Server, b: &Server, token: &str, path: &str, status: u16) {
    let reply = a.call(Method::GET, path, Some(token), None).await;
    assert_eq!(reply.status, status, "the replica that made the revocation enforces it at once: {}", reply.text);
    until_status(b, token, path, status, PROPAGATION).await;
}

both_backends! {
    async fn a_revoked_token_is_refused_by_both_replicas(a: Server) {
        let b = a.restart_with(|_| {}).await;
        let token = a.user_with_rules("alice", json!([{"resources": ["namespaces"], "verbs": ["list"]}])).await;
        both_allow(&a, &b, &token, "/namespaces").await;
        let id = a.get("/users/alice/tokens").await.expect(200)["items"][0]["id"].as_str().unwrap().to_string();
        a.delete(&format!("/users/alice/tokens/{id}")).await.expect(204);
        enforced(&a, &b, &token, "/namespaces", 401).await;
    }

    async fn a_role_losing_its_rule_is_enforced_by_both_replicas(a: Server) {
        let b = a.restart_with(|_| {}).await;
        let token = a.user_with_rules("alice", json!([
            {"resources": ["namespaces"], "verbs": ["list"]},
            {"resources": ["users"], "verbs": ["list"]},
        ])).await;
        both_allow(&a, &b, &token, "/namespaces").await;
        a.put("/roles/alice-role", json!({"name": "alice-role", "rules": [{"resources": ["users"], "verbs": ["list"]}]}))
            .await
            .expect(200);
        enforced(&a, &b, &token, "/namespaces", 403).await;
        both_allow(&a, &b, &token, "/users").await;
    }

    async fn a_deleted_binding_is_enforced_by_both_replicas(a: Server) {
        let b = a.restart_with(|_| {}).await;
        let token = a.user_with_rules("alice", json!([{"resources": ["namespaces"], "verbs": ["list"]}])).await;
        both_allow(&a, &b, &token, "/namespaces").await;
        a.delete("/clusterrolebindings/alice-binding").await.expect(204);
        enforced(&a, &b, &token, "/namespaces", 403).await;
    }

    async fn a_deleted_user_is_refused_by_both_replicas(a: Server) {
        let b = a.restart_with(|_| {}).await;
        let token = a.user_with_rules("alice", json!([{"resources": ["namespaces"], "verbs": ["list"]}])).await;
        both_allow(&a, &b, &token, "/namespaces").await;
        a.delete("/users/alice").await.expect(204);
        enforced(&a, &b, &token, "/namespaces", 401).await;
    }

    async fn revocations_through_the_other_replica_too(a: Server) {
        // The same, the other way round, for a namespace role binding used
        // through the gateway's RBAC step.
        let b = a.restart_with(|_| {}).await;
        let token = a.user_with_rules("alice", json!([{"resources": ["users"], "verbs": ["list"]}])).await;
        b.delete("/clusterrolebindings/alice-binding").await.expect(204);
        b.call(Method::GET, "/users", Some(&token), None).await.error(403, &["alice"]);
        until_status(&a, &token, "/users", 403, PROPAGATION).await;
    }

    async fn a_role_gaining_a_rule_is_honoured_by_both_replicas(a: Server) {
        let b = a.restart_with(|_| {}).await;
        let token = a.user_with_rules("alice", json!([{"resources": ["users"], "verbs": ["list"]}])).await;
        for server in [&a, &b] {
            server.call(Method::GET, "/namespaces", Some(&token), None).await.error(403, &["alice"]);
        }
        a.put("/roles/alice-role", json!({"name": "alice-role", "rules": [
            {"resources": ["users"], "verbs": ["list"]},
            {"resources": ["namespaces"], "verbs": ["list"]},
        ]}))
        .await
        .expect(200);
        a.call(Method::GET, "/namespaces", Some(&token), None).await.expect(200);
        until_status(&b, &token, "/namespaces", 200, PROPAGATION).await;
    }

    async fn a_token_issued_through_one_replica_works_at_once_on_the_other(a: Server) {
        let b = a.restart_with(|_| {}).await;
        for i in 0..10 {
            let user = format!("u{i}");
            let token = a.user_with_rules(&user, json!([{"resources": ["namespaces"], "verbs": ["list"]}])).await;
            // No waiting: what the other replica's cache does not know yet is
            // confirmed against the store.
            b.call(Method::GET, "/namespaces", Some(&token), None).await.expect(200);
        }
    }

    async fn every_read_through_one_replica_sees_the_write_before_it_through_the_other(a: Server) {
        let b = a.restart_with(|_| {}).await;
        a.namespace("core").await;
        for i in 0..50 {
            let (writer, reader) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
            let description = format!("write {i}");
            writer.put("/namespaces/core", json!({"name": "core", "description": description})).await.expect(200);
            let read = reader.get("/namespaces/core").await.expect(200);
            assert_eq!(read["description"], description.as_str(), "read {i} through the other replica");
            let listed = reader.get("/namespaces").await.expect(200);
            assert_eq!(listed["items"][0]["description"], description.as_str(), "list {i} through the other replica");
        }
    }

    async fn readyz_reports_the_caches(server: Server) {
        // Ready once the caches are current and the subscriber index has
        // listed, which may be a moment after `/healthz` first answers.
        kayra_testkit::eventually("/readyz to answer 200", || async { server.get("/readyz").await.status == 200 }).await;
        server.get("/readyz").await.expect(200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_etcd_gives_503s_and_recovers_without_a_restart() {
    let first = Server::start(Backend::Etcd).await;
    let timeout = Duration::from_secs(2);
    let server = first.restart_with(|c| c.database.request_timeout = kayra_config::Duration(timeout)).await;
    let token = server.user_with_rules("alice", json!([{"resources": ["namespaces"], "verbs": ["list", "get"]}])).await;
    server.namespace("core").await;
    server.call(Method::GET, "/namespaces/core", Some(&token), None).await.expect(200);
    kayra_testkit::eventually("ready", || async { server.get("/readyz").await.status == 200 }).await;

    let (pid, _) = server.etcd_process().await;
    kayra_testkit::freeze(pid);
    let frozen = Instant::now();
    let mut answers = Vec::new();
    while frozen.elapsed() < Duration::from_secs(10) {
        let sent = Instant::now();
        let reply = server.call(Method::GET, "/namespaces/core", Some(&token), None).await;
        let took = sent.elapsed();
        answers.push((sent - frozen, reply.status, took));
        assert!(took <= timeout + Duration::from_secs(1), "a request took {took:?} while etcd was frozen");
        assert_eq!(reply.status, 503, "while etcd is frozen: {}", reply.text);
        // Past the request timeout the caches themselves refuse: at once.
        if sent - frozen > timeout + Duration::from_millis(200) {
            assert!(took < Duration::from_secs(1), "a stale cache refuses at once, took {took:?}");
            let ready = server.get("/readyz").await;
            assert_eq!(ready.status, 503, "{}", ready.text);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    kayra_testkit::thaw(pid);
    kayra_testkit::eventually("the replica to recover", || async {
        server.call(Method::GET, "/namespaces/core", Some(&token), None).await.status == 200
    })
    .await;
    server.get("/readyz").await.expect(200);
    assert!(answers.len() >= 5, "{answers:?}");
}

/// A TCP proxy to `upstream` that can cut every connection and refuse new
/// ones: one replica's network to etcd, and only that replica's.
struct Proxy {
    address: String,
    cut: tokio::sync::watch::Sender<bool>,
    stop: CancellationToken,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = stopped.cancelled() => return,
                };
                let Ok((mut inbound, _)) = accepted else { continue };
                let mut cut = cut_rx.clone();
                if *cut.borrow_and_update() {
                    continue;
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream.trim_start_matches("http://")).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Proxy { address, cut, stop }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_missed_a_compacted_window_relists() {
    let a = Server::start(Backend::Etcd).await;
    let (_, endpoint) = a.etcd_process().await;
    let proxy = Proxy::start(endpoint).await;
    let timeout = Duration::from_secs(2);
    let b = a
        .restart_with(|c| {
            c.database.request_timeout = kayra_config::Duration(timeout);
            if let Some(etcd) = c.database.etcd.as_mut() {
                etcd.endpoints = vec![proxy.address.clone()];
            }
        })
        .await;
    let token = a.user_with_rules("alice", json!([{"resources": ["namespaces"], "verbs": ["list"]}])).await;
    both_allow(&a, &b, &token, "/namespaces").await;

    // b loses etcd; meanwhile the binding goes, and the history with it.
    proxy.set_cut(true);
    a.delete("/clusterrolebindings/alice-binding").await.expect(204);
    for i in 0..5 {
        a.namespace(&format!("gap-{i}")).await;
    }
    let (_, endpoint) = a.etcd_process().await;
    let mut client = etcd_client::Client::connect([endpoint], None).await.unwrap();
    let revision = client.get("x", None).await.unwrap().header().unwrap().revision();
    client.compact(revision, Some(etcd_client::CompactionOptions::new().with_physical())).await.unwrap();

    // Cut off, b cannot show its caches are current: past the request
    // timeout it decides nothing (503), and says so on /readyz.
    let cut = Instant::now();
    loop {
        let ready = b.get("/readyz").await;
        if ready.status == 503 && ready.text.contains("cache has not been confirmed current") {
            break;
        }
        assert!(cut.elapsed() < timeout + Duration::from_secs(3), "b's caches never went stale: {}", ready.text);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.call(Method::GET, "/namespaces", Some(&token), None).await.error(503, &[]);
    proxy.set_cut(false);
    kayra_testkit::eventually("b to be ready again", || async { b.get("/readyz").await.status == 200 }).await;
    // The re-listed cache no longer holds the binding deleted in the gap.
    a.call(Method::GET, "/namespaces", Some(&token), None).await.error(403, &["alice"]);
    b.call(Method::GET, "/namespaces", Some(&token), None).await.error(403, &["alice"]);
}
