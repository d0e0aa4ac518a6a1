//! Cancelling a run across processes (platform §12): on one etcd, two
//! `kayra serve` and two `kayra reconciler` processes; a cancel taken by
//! either serve stops the run in whichever reconciler holds it, within a
//! second, and answers with the run recorded `cancelled`.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{API, Proc};
use kayra_testkit::backend::TestBackend;
use kayra_testkit::{Etcd, eventually, free_port};
use serde_json::{Value, json};

const TOKEN: &str = "cancel-test-bootstrap-token";
const BASE: &str = "/apis/catalog.example.com/v1";

struct World {
    etcd: Etcd,
    dir: tempfile::TempDir,
    backend: TestBackend,
    http: reqwest::Client,
}

impl World {
    async fn new() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            etcd: Etcd::start().await,
            dir: tempfile::tempdir().unwrap(),
            backend: TestBackend::start().await,
            http: reqwest::Client::new(),
        }
    }

    /// A config serving on `port`, its reconciler's admin listener on
    /// `admin`; mode `api` polls `/ok/<namespace>/<run id>` for a `.status`
    /// the test backend never gives.
    fn config(&self, name: &str, port: u16, admin: u16) -> PathBuf {
        let yaml = format!(
            r#"platform: dev
region: local
server:
  listen: 127.0.0.1:{port}
database:
  etcd:
    endpoints: ["{endpoint}"]
    prefix: /kayra
    lock_ttl: 2s
    lock_retry_interval: 50ms
reconciler:
  listen: 127.0.0.1:{admin}
  wait_poll_interval: 100ms
  mode:
    api:
      - method: get
        endpoint: "{base}/ok/{{{{ .Subscription.Namespace }}}}/{{{{ .Run.ID }}}}"
        timeout: 60s
        wait: [{{key: .status, successes: [done]}}]
"#,
            endpoint = self.etcd.endpoint(),
            base = self.backend.base,
        );
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    async fn send(&self, method: reqwest::Method, port: u16, path: &str, body: Value) -> (u16, Value) {
        let url = format!("http://127.0.0.1:{port}{BASE}{path}");
        let response = self.http.request(method, url).bearer_auth(TOKEN).json(&body).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, port: u16, path: &str, body: Value) {
        let (status, answer) = self.send(reqwest::Method::POST, port, path, body).await;
        assert_eq!(status, 201, "POST {path}: {answer}");
    }

    /// `kayra serve` on `config`, once it answers.
    async fn serve(&self, config: &std::path::Path, port: u16, bootstrap: bool) -> Proc {
        let env: &[(&str, &str)] = if bootstrap { &[("KAYRA_BOOTSTRAP_TOKEN", TOKEN)] } else { &[] };
        let mut serve = Proc::start("serve", config, env);
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let deadline = Instant::now() + kayra_testkit::WAIT;
        loop {
            serve.assert_running();
            if self.http.get(&ready).send().await.is_ok_and(|r| r.status().is_success()) {
                return serve;
            }
            assert!(Instant::now() < deadline, "not ready on {port}:\n{}", serve.lines().join("\n"));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The (namespace, run id) pairs the backend was polled for, each once.
    fn runs_polling(&self) -> Vec<(String, String)> {
        let mut runs = Vec::new();
        for call in self.backend.calls() {
            let mut parts = call.trim_start_matches("/ok/").split('/');
            if let (Some(ns), Some(id)) = (parts.next(), parts.next()) {
                let pair = (ns.to_string(), id.to_string());
                if !runs.contains(&pair) {
                    runs.push(pair);
                }
            }
        }
        runs
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_taken_by_any_serve_stops_the_run_in_the_reconciler_holding_it() {
    let world = World::new().await;
    let (port_a, port_b) = (free_port(), free_port());
    let config_a = world.config("a", port_a, free_port());
    let config_b = world.config("b", port_b, free_port());
    let serve_a = world.serve(&config_a, port_a, true).await;
    let serve_b = world.serve(&config_b, port_b, false).await;
    world.post(port_a, "/apiregistrations", json!({"name": API, "mode": "api", "sync_id": "s1"})).await;
    let namespaces = ["n1", "n2", "n3", "n4", "n5", "n6"];
    for ns in namespaces {
        world.post(port_a, "/namespaces", json!({"name": ns})).await;
        world.post(port_a, &format!("/namespaces/{ns}/subscriptions"), json!({"api": API})).await;
    }
    let reconcilers = [Proc::reconciler(&config_a), Proc::reconciler(&config_b)];
    let pids: BTreeSet<u32> = reconcilers.iter().map(|r| r.child.id()).collect();
    eventually("every subscription's run polling", || async { world.runs_polling().len() >= namespaces.len() }).await;

    let mut holders = BTreeSet::new();
    for (n, (ns, id)) in world.runs_polling().into_iter().enumerate() {
        // Alternate the serve that takes the request.
        let port = if n % 2 == 0 { port_a } else { port_b };
        let path = format!("/namespaces/{ns}/subscriptions/{API}/runs/{id}/cancel");
        let started = Instant::now();
        let (status, run) = world.send(reqwest::Method::PUT, port, &path, json!({"reason": "bad canary"})).await;
        let took = started.elapsed();
        assert_eq!(status, 200, "cancel of run {id} of {ns} through :{port}: {run}");
        assert!(took < Duration::from_secs(1), "the cancel of run {id} of {ns} took {took:?}, over the contract's 1 s");
        assert_eq!((run["id"].as_str(), run["result"].as_str()), (Some(id.as_str()), Some("cancelled")), "{run}");
        assert_eq!(run["error"], "cancelled by admin: bad canary");
        let holder: u32 = run["reconciler"].as_str().unwrap().rsplit(':').next().unwrap().parse().unwrap();
        assert!(pids.contains(&holder), "run {id} was held by a reconciler process: {run}");
        holders.insert(holder);
        // A second cancel of the same run: it has finished.
        let (status, answer) = world.send(reqwest::Method::PUT, port_b, &path, json!({})).await;
        assert_eq!(status, 409, "{answer}");
    }
    eprintln!("runs cancelled in {} of the 2 reconcilers", holders.len());
    // Every subscription keeps its state: none was retried or synced.
    for ns in namespaces {
        let (status, sub) = world
            .send(reqwest::Method::GET, port_b, &format!("/namespaces/{ns}/subscriptions/{API}"), json!(null))
            .await;
        assert_eq!(status, 200);
        assert_eq!((sub["active"].as_bool(), sub["current_sync_id"].as_str()), (Some(false), Some("")), "{sub}");
    }
    drop((serve_a, serve_b, reconcilers));
}
