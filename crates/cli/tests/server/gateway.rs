//! Registered APIs through the gateway, by short and by long name.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, Method, Uri};
use serde_json::{Value, json};

use crate::common::server::Kayra;

/// What the backend saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    user: Option<String>,
    namespace: Option<String>,
    authorization: bool,
    body: String,
}

/// A registered API's backend: answers a VM list, records every request.
async fn backend() -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new().fallback({
        let seen = seen.clone();
        move |method: Method, uri: Uri, headers: HeaderMap, body: String| {
            let seen = seen.clone();
            async move {
                let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
                seen.lock().unwrap().push(Seen {
                    method: method.clone(),
                    path: uri.path().to_string(),
                    user: header("x-kayra-user"),
                    namespace: header("x-kayra-namespace"),
                    authorization: headers.contains_key("authorization"),
                    body,
                });
                axum::Json(
                    json!({"items": [{"name": "web-1", "cpus": 2, "spec": {"image": "debian"}}], "continue": ""}),
                )
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_and_long_names_reach_the_backend() {
    let kayra = Kayra::with_reconciler().await;
    let cli = &kayra.cli;
    let (endpoint, seen) = backend().await;
    kayra.register("core", "compute.example.com", "compute", &endpoint).await;
    kayra.subscribe_synced("core", "compute.example.com").await;

    let run = cli.run(&["get", "compute", "-n", "core", "vms"]).await.ok();
    assert_eq!(run.stdout, "NAME    CPUS\nweb-1   2\n");
    let run = cli.run(&["get", "compute.example.com", "-n", "core", "vms", "-o", "json"]).await.ok();
    assert_eq!(run.json()["items"][0]["spec"], json!({"image": "debian"}));
    cli.run(&["create", "compute", "-n", "core", "vms", "-d", "name: web-2\ncpus: 4"]).await.ok();

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    for request in &seen {
        assert_eq!(request.path, "/apis/compute.example.com/v1/namespaces/core/vms");
        assert_eq!(request.user.as_deref(), Some("admin"));
        assert_eq!(request.namespace.as_deref(), Some("core"));
        assert!(!request.authorization, "the caller's token reached the backend");
    }
    assert_eq!(seen[2].method, Method::POST);
    assert_eq!(serde_json::from_str::<Value>(&seen[2].body).unwrap(), json!({"name": "web-2", "cpus": 4}));
}
