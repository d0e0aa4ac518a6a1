//! The HTTP step pipeline against a real HTTP server on 127.0.0.1:0 that
//! records every request: rendering, outputs, async, wait, timeouts,
//! validation, the worked example in `examples/kayra.yaml`, and logs.
//!
//! Timing-sensitive cases use short settings (ack 200ms, poll 20ms) and
//! assert on recorded calls and returned errors; nothing sleeps and hopes.
//!
//! # Layout
//! - this file: rendering, outputs, async steps, failures, cancellation.
//! - `support`: the recording server and shared helpers.
//! - `wait`, `config` (validation and the example file), `logs`.
//! - `hostile`: outputs that would move a request, escaped secrets (§17).

#[path = "pipeline/config.rs"]
mod config;
#[path = "pipeline/hostile.rs"]
mod hostile;
#[path = "pipeline/logs.rs"]
mod logs;
#[path = "pipeline/records.rs"]
mod records;
#[path = "pipeline/render.rs"]
mod render;
#[path = "pipeline/secrets.rs"]
mod secrets;
#[path = "pipeline/support.rs"]
mod support;
#[path = "pipeline/wait.rs"]
mod wait;

use std::time::{Duration, Instant};

use axum::http::Method;
use kayra_pipeline::PipelineError;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::*;

// ---------------------------------------------------------------- rendering

#[tokio::test]
async fn renders_endpoint_headers_and_nested_json_body() {
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let pipelines = compile(
        r#"
- method: post
  endpoint: "BASE/api/v1/namespaces/{{ .Subscription.Namespace }}/sync/{{ .Subscription.ExpectedSyncID }}?api={{ .Subscription.Api }}"
  headers:
    Authorization: {type: "{{ if .Subscription.ShortName }}Bearer{{ end }}", value: "tok-{{ .Subscription.Region }}"}
    X-Plain: "{{ .Subscription.ShortName }}/{{ .Subscription.Platform }}"
    X-Literal: "as is"
  data:
    sync_id: "{{ .Subscription.ExpectedSyncID }}"
    current: "{{ .Subscription.CurrentSyncID }}"
    ref: "{{ .Subscription.Platform }}"
    variables:
      - key: TENANT_NAME
        value: "{{ .Subscription.Namespace }}"
      - key: CHECK_MAX
        value: "50"
    count: 3
    ratio: 0.5
    enabled: true
    nothing: null
    nested: {deep: [{x: "{{ .Subscription.Api }}"}, [1, "two"]]}
"#,
        &server.base,
    );
    run(&pipelines).await.expect("run");

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.method, Method::POST);
    assert_eq!(r.path, "/api/v1/namespaces/core/sync/2026-02-01T00Z?api=compute.example.com");
    assert_eq!(r.header("authorization"), Some("Bearer tok-local"));
    assert_eq!(r.header("x-plain"), Some("compute/dev"));
    assert_eq!(r.header("x-literal"), Some("as is"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.json(),
        json!({
            "sync_id": "2026-02-01T00Z",
            "current": "2026-01-01T00Z",
            "ref": "dev",
            "variables": [{"key": "TENANT_NAME", "value": "core"}, {"key": "CHECK_MAX", "value": "50"}],
            "count": 3,
            "ratio": 0.5,
            "enabled": true,
            "nothing": null,
            "nested": {"deep": [{"x": "compute.example.com"}, [1, "two"]]},
        })
    );
}

#[tokio::test]
async fn configured_content_type_wins_and_no_data_means_no_body() {
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let pipelines = compile(
        r#"
- method: PATCH
  endpoint: "BASE/patch"
  headers: {content-type: "application/merge-patch+json"}
  data: {a: 1}
- method: Delete
  endpoint: "BASE/delete"
"#,
        &server.base,
    );
    run(&pipelines).await.expect("run");
    let requests = server.requests();
    assert_eq!(requests[0].method, Method::PATCH);
    let types: Vec<_> = requests[0].headers.get_all("content-type").iter().collect();
    assert_eq!(types, ["application/merge-patch+json"], "configured, not doubled");
    assert_eq!(requests[0].json(), json!({"a": 1}));
    assert_eq!(requests[1].method, Method::DELETE);
    assert!(requests[1].body.is_empty());
    assert_eq!(requests[1].header("content-type"), None);
}

// ---------------------------------------------------------------- outputs

#[tokio::test]
async fn outputs_chain_to_the_next_step_only() {
    let server = TestServer::start(|r, _| match r.path.as_str() {
        "/first" => ok(json!({"id": 42, "items": [{"id": "a"}, {"id": "b"}], "ok": true, "name": "n1"})),
        _ => ok(json!({})),
    })
    .await;
    let pipelines = compile(
        r#"
- method: post
  endpoint: "BASE/first"
  outputs: {Id: ".id", Second: ".items[1].id", Flag: ".ok", Missing: ".nope.deeper", Name: ".name"}
- method: get
  endpoint: "BASE/second/{{ .Previous.Outputs.Id }}/{{ .Previous.Outputs.Second }}/{{ .Previous.Outputs.Flag }}/{{ .Previous.Outputs.Missing }}"
  data: {name: "{{ .Previous.Outputs.Name }}", count: "{{ len .Previous.Outputs }}"}
- method: get
  endpoint: "BASE/third/{{ .Previous.Outputs.Id }}"
"#,
        &server.base,
    );
    run(&pipelines).await.expect("run");
    let requests = server.requests();
    let paths: Vec<_> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/first", "/second/42/b/true/%3Cno%20value%3E", "/third/%3Cno%20value%3E"]);
    assert_eq!(requests[1].json(), json!({"name": "n1", "count": "4"}), "Missing was skipped, not set");
}

// ---------------------------------------------------------------- async

#[tokio::test]
async fn async_step_failure_is_ignored() {
    let server = TestServer::start(|r, _| if r.path == "/trigger" { status(500) } else { ok(json!({})) }).await;
    let pipelines = compile(
        r#"
- {method: post, endpoint: "BASE/trigger", async: true, outputs: {X: ".message"}}
- {method: get, endpoint: "BASE/check/{{ .Previous.Outputs.X }}"}
"#,
        &server.base,
    );
    run(&pipelines).await.expect("an async failure does not fail the run");
    assert_eq!(server.calls("/trigger"), 1);
    assert_eq!(server.calls("/check/%3Cno%20value%3E"), 1, "no outputs from a failed async step");
}

#[tokio::test]
async fn async_transport_error_is_ignored() {
    let dead = closed_port().await;
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let steps = format!(
        "- {{method: post, endpoint: \"{dead}/trigger\", async: true}}\n- {{method: get, endpoint: \"BASE/check\"}}"
    );
    run(&compile(&steps, &server.base)).await.expect("run");
    assert_eq!(server.calls("/check"), 1);
}

#[tokio::test]
async fn hanging_async_step_moves_on_after_the_ack_timeout() {
    let server = TestServer::start(|r, _| if r.path == "/trigger" { hang() } else { ok(json!({})) }).await;
    let pipelines = compile(
        r#"
- {method: post, endpoint: "BASE/trigger", async: true, timeout: 3600s, wait: [{key: .status, successes: [done]}]}
- {method: get, endpoint: "BASE/check"}
"#,
        &server.base,
    );
    let started = Instant::now();
    run(&pipelines).await.expect("run");
    let elapsed = started.elapsed();
    assert!(elapsed >= SETTINGS.async_ack_timeout, "waited for the ack window: {elapsed:?}");
    assert!(elapsed < SETTINGS.async_ack_timeout + Duration::from_secs(2), "did not wait for the answer: {elapsed:?}");
    assert_eq!(server.calls("/trigger"), 1, "sent once; wait is ignored on async steps");
    assert_eq!(server.calls("/check"), 1);
}

#[tokio::test]
async fn quick_async_answer_provides_outputs() {
    let server = TestServer::start(|r, _| match r.path.as_str() {
        "/trigger" => ok(json!({"pipeline_id": 99})),
        _ => ok(json!({})),
    })
    .await;
    let pipelines = compile(
        r#"
- {method: post, endpoint: "BASE/trigger", async: true, outputs: {PipelineID: ".pipeline_id"}}
- {method: get, endpoint: "BASE/status/{{ .Previous.Outputs.PipelineID }}"}
"#,
        &server.base,
    );
    run(&pipelines).await.expect("run");
    assert_eq!(server.calls("/status/99"), 1);
}

// ---------------------------------------------------------------- awaited failures

#[tokio::test]
async fn non_2xx_aborts_the_rest() {
    let server = TestServer::start(|r, _| if r.path == "/one" { status(503) } else { ok(json!({})) }).await;
    let pipelines = compile(
        "- {method: get, endpoint: \"BASE/zero\"}\n- {method: post, endpoint: \"BASE/one\"}\n- {method: get, endpoint: \"BASE/two\"}",
        &server.base,
    );
    let err = run(&pipelines).await.expect_err("503 fails");
    assert!(matches!(err, PipelineError::Status { step: 1, status: 503 }), "{err:?}");
    assert_eq!(err.to_string(), "step 1: answered HTTP 503");
    assert_eq!(server.calls("/two"), 0, "later steps never called");
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = TestServer::start(|r, _| match r.path.as_str() {
        "/moved" => Reply { status: 302, ..Reply::default() },
        _ => ok(json!({})),
    })
    .await;
    let err = run(&compile("- {method: get, endpoint: \"BASE/moved\"}", &server.base)).await.expect_err("302");
    assert!(matches!(err, PipelineError::Status { step: 0, status: 302 }), "{err:?}");
}

#[tokio::test]
async fn timeout_aborts_the_rest() {
    let server = TestServer::start(|r, _| if r.path == "/slow" { hang() } else { ok(json!({})) }).await;
    let pipelines = compile(
        "- {method: get, endpoint: \"BASE/slow\", timeout: 300ms}\n- {method: get, endpoint: \"BASE/next\"}",
        &server.base,
    );
    let started = Instant::now();
    let err = run(&pipelines).await.expect_err("times out");
    assert!(matches!(err, PipelineError::Timeout { step: 0, .. }), "{err:?}");
    assert_eq!(err.to_string(), "step 0: no answer within 300ms");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(server.calls("/next"), 0);
}

#[tokio::test]
async fn transport_error_aborts_the_rest() {
    let dead = closed_port().await;
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let steps = format!("- {{method: get, endpoint: \"{dead}/x\"}}\n- {{method: get, endpoint: \"BASE/next\"}}");
    let err = run(&compile(&steps, &server.base)).await.expect_err("connection refused");
    assert!(matches!(err, PipelineError::Transport { step: 0, .. }), "{err:?}");
    assert_eq!(server.calls("/next"), 0);
}

#[tokio::test]
async fn render_error_aborts_without_a_request() {
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let pipelines = compile("- {method: get, endpoint: \"BASE/{{ range .Subscription.Api }}{{ end }}\"}", &server.base);
    let err = run(&pipelines).await.expect_err("cannot range over a string");
    assert!(matches!(&err, PipelineError::Render { step: 0, field, .. } if field == "endpoint"), "{err:?}");
    assert!(server.requests().is_empty());
}

// ---------------------------------------------------------------- cancellation

#[tokio::test]
async fn cancellation_stops_between_steps_only() {
    let cancel = CancellationToken::new();
    let during_step = cancel.clone();
    // Shutdown begins while step 0 is in flight: it finishes, step 1 never starts.
    let server = TestServer::start(move |_, _| {
        during_step.cancel();
        ok(json!({}))
    })
    .await;
    let pipelines =
        compile("- {method: get, endpoint: \"BASE/zero\"}\n- {method: get, endpoint: \"BASE/one\"}", &server.base);
    let err = run_with(&pipelines, &cancel).await.expect_err("cancelled");
    assert!(matches!(err, PipelineError::Cancelled), "{err:?}");
    assert_eq!(server.calls("/zero"), 1);
    assert_eq!(server.calls("/one"), 0);

    let err = run_with(&pipelines, &cancel).await.expect_err("cancelled before step 0");
    assert!(matches!(err, PipelineError::Cancelled));
    assert_eq!(server.calls("/zero"), 1, "nothing started after shutdown");
}
