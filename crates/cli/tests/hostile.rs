//! The built binary against a hostile server (platform §9): escape
//! sequences in messages, table cells and raw bodies never reach the
//! terminal raw, an echoed token is never shown, and arguments that would
//! be unsafe to send (`.`/`..` segments, a server URL with user info) are
//! refused with exit 2 before anything is sent.

mod common;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use common::{Cli, Run};
use serde_json::json;

const TOKEN: &str = "hostile-s3cr3t-token";
const EVIL: &str = "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m\ncleared";

type Seen = Arc<Mutex<Vec<String>>>;

async fn handle(State(seen): State<Seen>, uri: Uri) -> Response {
    seen.lock().unwrap().push(uri.path().to_string());
    let path = uri.path().strip_prefix("/apis/catalog.example.com/v1").unwrap_or(uri.path());
    match path {
        "/namespaces" => axum::Json(json!({
            "items": [{"name": EVIL, "description": EVIL, "active": true}], "continue": ""
        }))
        .into_response(),
        "/namespaces/evil" => {
            let message = format!("{EVIL} and your token is {TOKEN}");
            (StatusCode::BAD_REQUEST, axum::Json(json!({"code": 400, "reason": EVIL, "message": message})))
                .into_response()
        }
        "/namespaces/raw" => (StatusCode::BAD_GATEWAY, EVIL).into_response(),
        // Larger than the CLI reads (64 MiB).
        "/namespaces/endless" => vec![b' '; 65 << 20].into_response(),
        "/apis/shell.example.com/v1/namespaces/core/out" => (StatusCode::OK, format!("ok\n{EVIL}\n")).into_response(),
        _ => (StatusCode::NOT_FOUND, axum::Json(json!({"code": 404, "reason": "NotFound", "message": "no"})))
            .into_response(),
    }
}

async fn start() -> (String, Seen) {
    let seen = Seen::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(handle).with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

/// No raw control character but line breaks and tabs; and, unless the
/// output is a raw body (whose lines are its own), no line of the server's.
#[track_caller]
fn terminal_safe(run: &Run) {
    no_raw_controls(run);
    for (stream, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
        assert!(!text.contains("\ncleared"), "{stream} has a forged line: {run:#?}");
    }
}

#[track_caller]
fn no_raw_controls(run: &Run) {
    for (stream, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
        let raw = text.chars().find(|&c| c.is_control() && c != '\n' && c != '\t');
        assert!(raw.is_none(), "{stream} carries a raw control character {raw:?}: {run:#?}");
    }
}

#[tokio::test]
async fn server_text_is_escaped_before_the_terminal() {
    let (server, _) = start().await;
    let cli = Cli::new(server, Some(TOKEN));
    for output in ["table", "json", "yaml"] {
        let run = cli.run(&["get", "catalog", "namespaces", "-o", output]).await.ok();
        terminal_safe(&run);
        assert!(run.stdout.contains("pwned"), "the cell is shown, escaped: {run:#?}");
    }
    let run = cli.run(&["get", "catalog", "namespaces", "evil"]).await.expect_code(1);
    terminal_safe(&run);
    assert!(!run.stderr.contains(TOKEN), "the token was printed: {run:#?}");
    assert!(run.stderr.contains("<redacted>"), "{run:#?}");
    let run = cli.run(&["get", "catalog", "namespaces", "raw"]).await.expect_code(2);
    terminal_safe(&run);
    let run = cli.run(&["get", "shell.example.com", "-n", "core", "out"]).await.ok();
    no_raw_controls(&run);
    assert!(run.stdout.starts_with("ok\n"), "{run:#?}");
}

#[tokio::test]
async fn an_oversized_answer_is_cut_off() {
    let (server, _) = start().await;
    let run = Cli::new(server, Some(TOKEN)).run(&["get", "catalog", "namespaces", "endless"]).await.expect_code(2);
    assert!(run.stderr.contains("larger than"), "{run:#?}");
}

#[tokio::test]
async fn dot_segments_are_refused_before_sending() {
    let (server, seen) = start().await;
    let cli = Cli::new(server, Some(TOKEN));
    for args in [
        &["get", "catalog", "users", "../tokens"][..],
        &["get", "catalog", "users", "alice/tokens/.."],
        &["get", "catalog", "users", "."],
        &["get", "catalog", "-n", "..", "subscriptions"],
        &["get", "catalog", "..", "x"],
        &["delete", "compute.example.com", "-n", "a", "widgets", "w1/../../../b/widgets/w1"],
        &["get", "compute.example.com", "-n", "..", "widgets"],
        &["get", "compute.example.com", "-n", "a", "widgets", "x/..\\..\\b"],
        &["get", "..", "-n", "a", "widgets"],
    ] {
        let run = cli.run(args).await.expect_code(2);
        assert!(run.stderr.contains("refusing to send"), "{args:?}: {run:#?}");
        assert_eq!(run.stderr.lines().count(), 1, "{run:#?}");
    }
    assert!(seen.lock().unwrap().is_empty(), "something was sent: {:?}", seen.lock().unwrap());
}

#[tokio::test]
async fn a_server_url_with_user_info_is_refused_unshown() {
    let (server, seen) = start().await;
    let with_user = server.replace("http://", "http://admin:pa55-w0rd@");
    for url in [with_user.clone(), server.replace("http://", "http://pa55-w0rd@")] {
        let run = Cli::new(url.clone(), Some(TOKEN)).run(&["get", "catalog", "namespaces"]).await.expect_code(2);
        assert!(run.stderr.contains("user info"), "{run:#?}");
        assert!(!run.stderr.contains("pa55-w0rd") && !run.stdout.contains("pa55-w0rd"), "{run:#?}");
        let run = Cli::new(server.clone(), Some(TOKEN))
            .run(&["get", "catalog", "namespaces", "--server", &url])
            .await
            .expect_code(2);
        assert!(!run.stderr.contains("pa55-w0rd"), "{run:#?}");
    }
    assert!(seen.lock().unwrap().is_empty(), "something was sent: {:?}", seen.lock().unwrap());
}
