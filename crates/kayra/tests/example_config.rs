//! `examples/kayra.yaml` drives real reconciles end to end: the real
//! `kayra reconciler` process, the local store file shared with this test
//! process, and a loopback server standing in for both the generic API
//! (trigger + poll, mode `api`) and GitLab (pipeline create + poll, mode
//! `trigger`, reached through `default_mode`). Subscriptions end `success`
//! and synced, and the backends saw exactly the calls the example describes.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_core::{ApiRegistration, Namespace, Subscription, SubscriptionState};
use kayra_store::Store;
use kayra_testkit::{eventually, free_port};
use serde_json::{Value, json};

#[derive(Default)]
struct Calls {
    /// "METHOD path" → count.
    seen: Mutex<HashMap<String, usize>>,
    bodies: Mutex<Vec<Value>>,
}

impl Calls {
    fn hit(&self, what: String) -> usize {
        let mut seen = self.seen.lock().unwrap();
        let n = seen.entry(what).or_default();
        *n += 1;
        *n
    }
    fn count(&self, what: &str) -> usize {
        self.seen.lock().unwrap().get(what).copied().unwrap_or(0)
    }
}

/// The example's secrets, handed to the reconciler in its environment.
const GITLAB_TOKEN: &str = "glpat-from-the-environment";
const SYNC_API_TOKEN: &str = "sync-api-from-the-environment";

/// The generic API and GitLab; each poll answers "running" once first;
/// a trigger without the right token is refused.
fn backend(calls: Arc<Calls>) -> Router {
    Router::new()
        .route(
            "/api/v1/namespaces/{ns}/sync",
            post(|State(c): State<Arc<Calls>>, Path(ns): Path<String>, headers: HeaderMap, Json(body): Json<Value>| async move {
                if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {SYNC_API_TOKEN}")) {
                    return StatusCode::UNAUTHORIZED;
                }
                c.hit(format!("POST /api/v1/namespaces/{ns}/sync"));
                c.bodies.lock().unwrap().push(body);
                StatusCode::ACCEPTED
            }),
        )
        .route(
            "/api/v1/namespaces/{ns}/sync/{id}",
            get(|State(c): State<Arc<Calls>>, Path((ns, id)): Path<(String, String)>| async move {
                let n = c.hit(format!("GET /api/v1/namespaces/{ns}/sync/{id}"));
                Json(json!({"status": if n == 1 { "running" } else { "done" }}))
            }),
        )
        .route(
            "/api/v4/projects/1234/pipeline",
            post(|State(c): State<Arc<Calls>>, headers: HeaderMap, Json(body): Json<Value>| async move {
                if headers.get("private-token").and_then(|v| v.to_str().ok()) != Some(GITLAB_TOKEN) {
                    return (StatusCode::UNAUTHORIZED, Json(json!({})));
                }
                c.hit("POST /api/v4/projects/1234/pipeline".into());
                c.bodies.lock().unwrap().push(body);
                (StatusCode::CREATED, Json(json!({"id": 42, "status": "created"})))
            }),
        )
        .route(
            "/api/v4/projects/1234/pipelines/{id}",
            get(|State(c): State<Arc<Calls>>, Path(id): Path<String>| async move {
                let n = c.hit(format!("GET /api/v4/projects/1234/pipelines/{id}"));
                Json(json!({"id": 42, "status": if n == 1 { "running" } else { "success" }}))
            }),
        )
        .with_state(calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_config_reconciles_both_modes_end_to_end() {
    let calls = Arc::new(Calls::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, backend(calls.clone())).into_future());

    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/kayra.yaml")).unwrap();
    let config = example
        .replace("https://gitlab.example.com", &base)
        .replace("https://{{ .Subscription.ShortName }}.local.services", &base)
        .replace("listen: 127.0.0.1:8081", &format!("listen: 127.0.0.1:{}", free_port()))
        .replace("wait_poll_interval: 5s", "wait_poll_interval: 50ms")
        .replace("async_ack_timeout: 2s", "async_ack_timeout: 500ms");
    std::fs::write(dir.path().join("kayra.yaml"), config).unwrap();

    // The same store file the reconciler uses (database.local.path is relative to its cwd).
    let store = Store::new(
        kayra_store::local::LocalStore::open(&dir.path().join(".kayra/kayra.db"), std::time::Duration::from_millis(20))
            .unwrap(),
    );
    let repo = Repository::new(store, "dev", "local");
    for (name, mode) in [("compute.example.com", "api"), ("ci.example.com", "")] {
        let reg = ApiRegistration {
            name: name.into(),
            short_name: name.split('.').next().unwrap().into(),
            mode: mode.into(),
            sync_id: "2026-02-01T00Z".into(),
            ..Default::default()
        };
        repo.create(RecordRef::Registration(name), &reg, "registration").await.unwrap();
        repo.create(
            RecordRef::Subscription { namespace: "core", api: name },
            &Subscription::new("core", name),
            "subscription",
        )
        .await
        .unwrap();
    }
    let ns = Namespace { name: "core".into(), ..Default::default() };
    repo.create(RecordRef::Namespace("core"), &ns, "namespace").await.unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_kayra"))
        .arg("reconciler")
        .env("GITLAB_TOKEN", GITLAB_TOKEN)
        .env("SYNC_API_TOKEN", SYNC_API_TOKEN)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for api in ["compute.example.com", "ci.example.com"] {
        eventually(&format!("{api} synced"), || async {
            let sub = repo.get_subscription("core", api).await.unwrap().unwrap().value;
            sub.state == SubscriptionState::Success && sub.is_synced("2026-02-01T00Z")
        })
        .await;
    }
    let _ = child.kill();
    let _ = child.wait();

    // Mode `api`: one trigger, polled until done.
    assert_eq!(calls.count("POST /api/v1/namespaces/core/sync"), 1);
    assert_eq!(calls.count("GET /api/v1/namespaces/core/sync/2026-02-01T00Z"), 2);
    // default_mode `trigger`: one GitLab pipeline, polled by the id step 1 returned.
    assert_eq!(calls.count("POST /api/v4/projects/1234/pipeline"), 1);
    assert_eq!(calls.count("GET /api/v4/projects/1234/pipelines/42"), 2);
    let bodies = calls.bodies.lock().unwrap().clone();
    assert!(bodies.contains(&json!({"sync_id": "2026-02-01T00Z"})), "{bodies:?}");
    assert!(
        bodies.contains(&json!({"ref": "dev", "variables": [
            {"key": "TENANT_NAME", "value": "core"},
            {"key": "CHECK_MAX", "value": "50"},
        ]})),
        "{bodies:?}"
    );
}
