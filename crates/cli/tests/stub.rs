//! The built binary against a small stub server: exit statuses, stderr
//! text, the token, paging and the watch loop's retries, each provoked on
//! purpose (a real server cannot be made to fail on demand).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use common::Cli;
use serde_json::{Value, json};

const TOKEN: &str = "stub-s3cr3t-token";
const BASE: &str = "/apis/catalog.example.com/v1";

#[derive(Default)]
struct Stub {
    /// Fetches of the flaky subscription so far.
    flaky_fetches: AtomicUsize,
}

fn error(status: StatusCode, reason: &str, message: &str) -> Response {
    (status, axum::Json(json!({"code": status.as_u16(), "reason": reason, "message": message}))).into_response()
}

fn subscription(synced: bool) -> Value {
    json!({"api": "flaky.example.com", "namespace": "core", "active": true, "state": "success",
           "current_sync_id": if synced { "2" } else { "1" }, "expected_sync_id": "2", "synced": synced})
}

async fn handle(State(stub): State<Arc<Stub>>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let authorized =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"));
    if !authorized {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized", "missing or unknown bearer token");
    }
    let path = uri.path().strip_prefix(BASE).unwrap_or(uri.path());
    match (method.as_str(), path, uri.query()) {
        ("GET", "/namespaces/missing", _) => {
            error(StatusCode::NOT_FOUND, "NotFound", "namespace \"missing\" not found")
        }
        ("GET", "/namespaces/boom", _) => error(StatusCode::INTERNAL_SERVER_ERROR, "Internal", "internal error"),
        ("GET", "/namespaces/plain", _) => (StatusCode::SERVICE_UNAVAILABLE, "backend warming up\n").into_response(),
        ("POST", "/namespaces", _) => error(StatusCode::CONFLICT, "Conflict", "namespace \"core\" already exists"),
        ("DELETE", "/namespaces/core", _) => StatusCode::NO_CONTENT.into_response(),
        ("GET", "/namespaces", None) => axum::Json(json!({
            "items": [{"name": "a", "description": "", "active": true}], "continue": "page2"
        }))
        .into_response(),
        ("GET", "/namespaces", Some("continue=page2")) => axum::Json(json!({
            "items": [{"name": "b", "description": "", "active": false}], "continue": ""
        }))
        .into_response(),
        ("PUT", "/namespaces/echo", _) => {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            axum::Json(json!({"name": "echo", "description": body.to_string(), "active": false})).into_response()
        }
        ("GET", "/namespaces/core/subscriptions/flaky.example.com", _) => {
            match stub.flaky_fetches.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => error(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", "store unavailable"),
                2 | 3 => axum::Json(subscription(false)).into_response(),
                _ => axum::Json(subscription(true)).into_response(),
            }
        }
        ("GET", "/namespaces/core/subscriptions/stuck.example.com", _) => {
            axum::Json(json!({"synced": false, "api": "stuck.example.com"})).into_response()
        }
        _ => error(StatusCode::NOT_FOUND, "NotFound", &format!("stub has no route {method} {}", uri.path())),
    }
}

/// Starts the stub on a free port; returns its base URL.
async fn start() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(handle).with_state(Arc::new(Stub::default()));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn cli() -> Cli {
    Cli::new(start().await, Some(TOKEN))
}

#[tokio::test]
async fn a_4xx_prints_the_server_message_and_exits_1() {
    let run = cli().await.run(&["get", "catalog", "namespaces", "missing"]).await.expect_code(1);
    assert_eq!(run.stdout, "");
    assert_eq!(run.stderr, "Error from server (NotFound): namespace \"missing\" not found\n");

    let run = cli().await.run(&["create", "catalog", "namespaces", "core"]).await.expect_code(1);
    assert_eq!(run.stderr, "Error from server (Conflict): namespace \"core\" already exists\n");
}

#[tokio::test]
async fn a_5xx_exits_2() {
    let run = cli().await.run(&["get", "catalog", "namespaces", "boom"]).await.expect_code(2);
    assert_eq!(run.stderr, "Error from server (Internal): internal error\n");
    // Not kayra's error shape: the body's text is the message.
    let run = cli().await.run(&["get", "catalog", "namespaces", "plain"]).await.expect_code(2);
    assert_eq!(run.stderr, "Error from server (HTTP 503): backend warming up\n");
}

#[tokio::test]
async fn an_unreachable_server_exits_2() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cli = Cli::new(format!("http://127.0.0.1:{port}"), Some(TOKEN));
    let run = cli.run(&["get", "catalog", "namespaces"]).await.expect_code(2);
    assert!(run.stderr.starts_with(&format!("error: cannot reach http://127.0.0.1:{port}/")), "{run:#?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:#?}");
}

#[tokio::test]
async fn a_missing_token_is_explained_in_one_line() {
    let mut cli = cli().await;
    cli.token = None;
    let run = cli.run(&["get", "catalog", "namespaces"]).await.expect_code(1);
    assert_eq!(run.stderr, "error: no token: pass --token or set KAYRA_TOKEN\n");
}

#[tokio::test]
async fn a_wrong_token_is_a_401_and_is_never_printed() {
    let mut cli = cli().await;
    cli.token = Some("wrong-token-value".into());
    let run = cli.run(&["get", "catalog", "namespaces", "missing"]).await.expect_code(1);
    assert!(run.stderr.contains("Unauthorized"), "{run:#?}");
    assert!(!run.stderr.contains("wrong-token-value") && !run.stdout.contains("wrong-token-value"));

    // --token works as well as the environment, and wins over it.
    let run = cli.run(&["get", "catalog", "namespaces", "missing", "--token", TOKEN]).await.expect_code(1);
    assert!(run.stderr.contains("NotFound"), "{run:#?}");
    let help = cli.run(&["get", "--help"]).await.ok();
    assert!(!help.stdout.contains("wrong-token-value"), "--help shows the token: {help:#?}");
}

#[tokio::test]
async fn usage_errors_exit_1_without_a_request() {
    let cli = cli().await;
    let run = cli.run(&["get", "catalog", "subscriptions"]).await.expect_code(1);
    assert_eq!(run.stderr, "error: subscriptions are namespaced: pass -n NAMESPACE\n");
    let run = cli.run(&["frobnicate", "catalog", "namespaces"]).await.expect_code(1);
    assert!(run.stderr.contains("unrecognized subcommand"), "{run:#?}");
    let run = cli.run(&["update", "catalog", "namespaces", "core", "-d", "{\"a\": }"]).await.expect_code(1);
    assert!(run.stderr.starts_with("error: -d: invalid JSON"), "{run:#?}");
    let run = cli.run(&["get", "catalog", "apiregistrations", "a.example.com/bogus"]).await.expect_code(1);
    assert!(run.stderr.contains("unknown subresource"), "{run:#?}");
}

#[tokio::test]
async fn delete_prints_nothing_on_stdout() {
    let run = cli().await.run(&["delete", "catalog", "namespaces", "core"]).await.ok();
    assert_eq!(run.stdout, "");
    assert_eq!(run.stderr, "deleted namespaces/core\n");
}

#[tokio::test]
async fn lists_are_paged_through() {
    let cli = cli().await;
    let run = cli.run(&["get", "catalog", "namespaces", "-o", "json"]).await.ok();
    assert_eq!(
        run.json(),
        json!({"items": [
        {"name": "a", "description": "", "active": true},
        {"name": "b", "description": "", "active": false},
    ], "continue": ""})
    );
    let run = cli.run(&["get", "catalog", "namespaces"]).await.ok();
    assert_eq!(run.stdout, "NAME   ACTIVE   DESCRIPTION\na      true     <none>\nb      false    <none>\n");
}

#[tokio::test]
async fn yaml_data_is_sent_as_json() {
    let run = cli().await.run(&["update", "catalog", "namespaces", "echo", "-d", "description: from yaml"]).await.ok();
    assert_eq!(run.json()["description"], r#"{"description":"from yaml"}"#);
}

#[tokio::test]
async fn until_synced_rides_out_5xx_and_returns_once_synced() {
    let args =
        ["get", "catalog", "-n", "core", "subscriptions", "flaky.example.com", "--until-synced", "--interval", "50ms"];
    let run = cli().await.run(&args).await.ok();
    // The 503 is reported once, not once per retry.
    assert_eq!(run.stderr.matches("store unavailable").count(), 1, "{run:#?}");
    // Two distinct answers, each printed once as a table.
    assert_eq!(run.stdout.matches("API ").count(), 2, "{run:#?}");
    assert!(run.stdout.trim_end().ends_with("true"), "{run:#?}");
}

#[tokio::test]
async fn until_synced_gives_up_after_the_timeout() {
    let args = [
        "get",
        "catalog",
        "-n",
        "core",
        "subscriptions",
        "stuck.example.com",
        "--until-synced",
        "--interval",
        "50ms",
        "--timeout",
        "300ms",
        "-o",
        "json",
    ];
    let run = cli().await.run(&args).await.expect_code(3);
    assert_eq!(run.stderr, "error: not synced after 0.3s\n");
    assert_eq!(run.json()["synced"], false);
}

#[tokio::test]
async fn completion_scripts() {
    let cli = cli().await;
    for shell in ["bash", "zsh", "fish"] {
        let run = cli.run(&["completion", shell]).await.ok();
        assert!(run.stdout.contains("kayra-cli"), "{shell}: {run:#?}");
    }
}
