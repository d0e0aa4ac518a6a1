//! `wait`: polling until every condition resolves, or one fails.

use std::time::{Duration, Instant};

use kayra_pipeline::PipelineError;
use serde_json::json;

use crate::support::*;

// ---------------------------------------------------------------- wait

const WAIT_STEP: &str = r#"
- method: get
  endpoint: "BASE/status"
  timeout: 10s
  outputs: {Last: ".status"}
  wait:
    - key: .status
      successes: [success]
      failures: [failed, canceled, skipped]
- {method: get, endpoint: "BASE/after/{{ .Previous.Outputs.Last }}"}
"#;

#[tokio::test]
async fn wait_polls_until_success() {
    let server =
        TestServer::start(
            |_, n| {
                if n < 3 { ok(json!({"status": "running"})) } else { ok(json!({"status": "success"})) }
            },
        )
        .await;
    run(&compile(WAIT_STEP, &server.base)).await.expect("run");
    assert_eq!(server.calls("/status"), 4, "3 × running, then success");
    assert_eq!(server.calls("/after/success"), 1, "outputs come from the final answer");
}

#[tokio::test]
async fn wait_failure_value_stops_at_once() {
    let server = TestServer::start(|r, n| match (r.path.as_str(), n) {
        ("/status", 0) => ok(json!({"status": "running"})),
        ("/status", _) => ok(json!({"status": "canceled"})),
        _ => ok(json!({})),
    })
    .await;
    let err = run(&compile(WAIT_STEP, &server.base)).await.expect_err("canceled");
    assert!(
        matches!(&err, PipelineError::WaitFailed { step: 0, key, value } if key == ".status" && value == "canceled"),
        "{err:?}"
    );
    assert_eq!(server.calls("/status"), 2, "no further polling");
    assert!(server.requests().iter().all(|r| !r.path.starts_with("/after")));
}

#[tokio::test]
async fn wait_requires_every_condition() {
    let answers = [
        json!({"status": "success", "deploy": {"ready": false}, "code": 1}),
        json!({"status": "running", "deploy": {"ready": true}, "code": 3}),
        json!({"status": "success", "deploy": {"ready": true}, "code": 2}),
        json!({"status": "success", "deploy": {"ready": true}, "code": 3}),
    ];
    let server = TestServer::start(move |_, n| ok(answers[n.min(3)].clone())).await;
    let pipelines = compile(
        r#"
- method: get
  endpoint: "BASE/status"
  wait:
    - {key: .status, successes: [success], failures: [failed]}
    - {key: .deploy.ready, successes: ["true"]}
    - {key: .code, successes: ["3"], failures: ["9"]}
"#,
        &server.base,
    );
    run(&pipelines).await.expect("run");
    assert_eq!(server.calls("/status"), 4);
}

#[tokio::test]
async fn one_failing_condition_fails_whatever_the_others_say() {
    let server = TestServer::start(|_, _| ok(json!({"status": "success", "check": "failed"}))).await;
    let pipelines = compile(
        r#"
- method: get
  endpoint: "BASE/status"
  wait:
    - {key: .status, successes: [success]}
    - {key: .check, successes: [passed], failures: [failed]}
"#,
        &server.base,
    );
    let err = run(&pipelines).await.expect_err("check failed");
    assert!(matches!(&err, PipelineError::WaitFailed { key, .. } if key == ".check"), "{err:?}");
    assert_eq!(server.calls("/status"), 1);
}

#[tokio::test]
async fn wait_treats_non_json_and_missing_keys_as_not_yet() {
    let server = TestServer::start(|_, n| match n {
        0 => text("<html>starting</html>"),
        1 => text(""),
        2 => ok(json!({"other": 1})),
        3 => ok(json!([1, 2])),
        _ => ok(json!({"status": "success"})),
    })
    .await;
    run(&compile(WAIT_STEP, &server.base)).await.expect("run");
    assert_eq!(server.calls("/status"), 5);
}

#[tokio::test]
async fn wait_times_out() {
    let server = TestServer::start(|_, _| ok(json!({"status": "running"}))).await;
    let pipelines = compile(
        "- {method: get, endpoint: \"BASE/status\", timeout: 300ms, wait: [{key: .status, successes: [success]}]}\n\
         - {method: get, endpoint: \"BASE/next\"}",
        &server.base,
    );
    let started = Instant::now();
    let err = run(&pipelines).await.expect_err("never succeeds");
    let PipelineError::WaitTimeout { step: 0, attempts, last, .. } = &err else { panic!("{err:?}") };
    assert!(*attempts > 1, "polled: {attempts}");
    assert_eq!(last, r#".status="running""#);
    // The last attempt may be cut off by the timeout before the server sees it.
    let calls = server.calls("/status") as u32;
    assert!(calls == *attempts || calls + 1 == *attempts, "{calls} calls, {attempts} attempts");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(server.calls("/next"), 0);
}

#[tokio::test]
async fn non_2xx_while_waiting_fails_the_step() {
    let server = TestServer::start(|_, n| if n == 0 { ok(json!({"status": "running"})) } else { status(502) }).await;
    let err = run(&compile(WAIT_STEP, &server.base)).await.expect_err("502");
    assert!(matches!(err, PipelineError::Status { step: 0, status: 502 }), "{err:?}");
    assert_eq!(server.calls("/status"), 2);
}
