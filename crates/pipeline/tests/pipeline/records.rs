//! What a run reports: per-step records, `.Run`, supersede, `Retry-After`,
//! redaction of header-feeding outputs, and the bound on detached requests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kayra_core::RunStep;
use kayra_pipeline::{PipelineError, PipelineSettings, RunControl, http_client};
use kayra_testkit::eventually;
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::logs::LogCapture;
use crate::support::*;

fn outputs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

// ---------------------------------------------------------------- records

#[tokio::test]
async fn every_called_step_is_recorded_exactly() {
    let server = TestServer::start(|r, n| match r.path.as_str() {
        "/trigger" => Reply { status: 202, body: json!({"job": 77}).to_string(), ..Reply::default() },
        "/poll/77" if n == 0 => ok(json!({"status": "running"})),
        "/poll/77" => ok(json!({"status": "done", "url": "u"})),
        _ => status(500),
    })
    .await;
    let steps = r#"
- {method: post, endpoint: "BASE/trigger", async: true, outputs: {JobID: .job}}
- {method: get, endpoint: "BASE/poll/{{ .Previous.Outputs.JobID }}", outputs: {Url: .url, Missing: .nope}, wait: [{key: .status, successes: [done]}]}
- {method: delete, endpoint: "BASE/fails"}
- {method: get, endpoint: "BASE/never"}
"#;
    let report = report(&compile(steps, &server.base)).await;
    assert!(matches!(report.result, Err(PipelineError::Status { step: 2, status: 500 })), "{:?}", report.result);
    assert_eq!(report.retry_after, None);
    assert_eq!(report.steps.len(), 3, "one entry per step called: {:?}", report.steps);
    let base = &server.base;
    let strip = |s: &RunStep| RunStep { duration_ms: 0, ..s.clone() };
    assert_eq!(
        strip(&report.steps[0]),
        RunStep {
            index: 0,
            method: "POST".into(),
            endpoint: format!("{base}/trigger"),
            is_async: true,
            attempts: 1,
            status: 202,
            error: String::new(),
            duration_ms: 0,
            outputs: outputs(&[("JobID", "77")]),
        }
    );
    assert_eq!(
        strip(&report.steps[1]),
        RunStep {
            index: 1,
            method: "GET".into(),
            endpoint: format!("{base}/poll/77"),
            is_async: false,
            attempts: 2,
            status: 200,
            error: String::new(),
            duration_ms: 0,
            outputs: outputs(&[("Url", "u")]),
        }
    );
    assert!(
        report.steps[1].duration_ms >= SETTINGS.wait_poll_interval.as_millis() as u64,
        "spans both calls: {:?}",
        report.steps[1]
    );
    assert_eq!(
        strip(&report.steps[2]),
        RunStep {
            index: 2,
            method: "DELETE".into(),
            endpoint: format!("{base}/fails"),
            is_async: false,
            attempts: 1,
            status: 500,
            error: "step 2: answered HTTP 500".into(),
            duration_ms: 0,
            outputs: BTreeMap::new(),
        }
    );
}

#[tokio::test]
async fn no_response_is_status_zero_and_the_error_has_no_url() {
    let dead = closed_port().await;
    let steps = format!("- {{method: get, endpoint: \"{dead}/x?token=abc\"}}");
    let report = report(&compile(&steps, "")).await;
    let step = &report.steps[0];
    assert_eq!((step.status, step.attempts), (0, 1));
    assert!(step.error.starts_with("step 0: request failed"), "{}", step.error);
    assert!(!step.error.contains("token") && !step.error.contains("/x"), "{}", step.error);
    assert_eq!(step.endpoint, format!("{dead}/x?token=abc"));
}

#[tokio::test]
async fn run_id_and_fencing_token_reach_templates() {
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let pipelines = compile(
        r#"
- method: put
  endpoint: "BASE/r/{{ .Run.ID }}/{{ .Run.FencingToken }}"
  headers: {Idempotency-Key: "{{ .Run.ID }}", X-Fence: "{{ .Run.FencingToken }}"}
  data: {run: "{{ .Run.ID }}"}
"#,
        &server.base,
    );
    let report = report(&pipelines).await;
    report.result.expect("run");
    let r = &server.requests()[0];
    assert_eq!(r.path, "/r/0193a6c1-run/41");
    assert_eq!(r.header("idempotency-key"), Some("0193a6c1-run"));
    assert_eq!(r.header("x-fence"), Some("41"));
    assert_eq!(r.json(), json!({"run": "0193a6c1-run"}));
    assert_eq!(report.steps[0].endpoint, format!("{}/r/0193a6c1-run/41", server.base), "not a secret");
}

// ---------------------------------------------------------------- supersede

#[tokio::test]
async fn supersede_stops_a_wait_poll_at_once() {
    let control = RunControl::default();
    let superseded = control.superseded.clone();
    let server = TestServer::start(move |r, _| {
        if r.path == "/status" {
            // A newer SyncID arrives while the first poll is answered.
            superseded.cancel();
        }
        ok(json!({"status": "running"}))
    })
    .await;
    let pipelines = compile(
        "- {method: get, endpoint: \"BASE/status\", timeout: 1h, wait: [{key: .status, successes: [done]}]}\n\
         - {method: get, endpoint: \"BASE/next\"}",
        &server.base,
    );
    // A poll interval far longer than the test may take.
    let settings = PipelineSettings { wait_poll_interval: Duration::from_secs(60), ..SETTINGS };
    let started = Instant::now();
    let report = pipelines.get("m").unwrap().run(&http_client(), &ctx(), &settings, &control).await;
    assert!(started.elapsed() < Duration::from_secs(10), "stopped within the poll interval: {:?}", started.elapsed());
    assert!(matches!(report.result, Err(PipelineError::Superseded)), "{:?}", report.result);
    assert_eq!(server.calls("/status"), 1);
    assert_eq!(server.calls("/next"), 0);
    assert_eq!(report.steps.len(), 1);
    assert_eq!((report.steps[0].attempts, report.steps[0].status), (1, 200));
    assert_eq!(report.steps[0].error, "pipeline superseded by a newer SyncID");
}

#[tokio::test]
async fn supersede_stops_at_the_next_step_boundary() {
    let control = RunControl::default();
    let superseded = control.superseded.clone();
    let server = TestServer::start(move |_, _| {
        superseded.cancel();
        ok(json!({}))
    })
    .await;
    let pipelines =
        compile("- {method: get, endpoint: \"BASE/zero\"}\n- {method: get, endpoint: \"BASE/one\"}", &server.base);
    let report = report_with(&pipelines, &control).await;
    assert!(matches!(report.result, Err(PipelineError::Superseded)), "{:?}", report.result);
    assert_eq!(server.calls("/zero"), 1, "the step in flight finishes");
    assert_eq!(server.calls("/one"), 0);
    assert_eq!(report.steps.len(), 1);
    assert_eq!(report.steps[0].error, "");
}

// ---------------------------------------------------------------- stop

#[tokio::test]
async fn a_stop_ends_a_wait_step_at_once() {
    let control = RunControl::default();
    let stop = control.stop.clone();
    let server = TestServer::start(move |r, _| {
        if r.path == "/status" {
            stop.cancel();
        }
        ok(json!({"status": "running"}))
    })
    .await;
    let pipelines = compile(
        "- {method: get, endpoint: \"BASE/status\", timeout: 1h, wait: [{key: .status, successes: [done]}]}\n\
         - {method: get, endpoint: \"BASE/next\"}",
        &server.base,
    );
    let settings = PipelineSettings { wait_poll_interval: Duration::from_secs(60), ..SETTINGS };
    let started = Instant::now();
    let report = pipelines.get("m").unwrap().run(&http_client(), &ctx(), &settings, &control).await;
    assert!(started.elapsed() < Duration::from_secs(10), "stopped within the poll interval: {:?}", started.elapsed());
    assert!(matches!(report.result, Err(PipelineError::Stopped)), "{:?}", report.result);
    assert_eq!((server.calls("/status"), server.calls("/next")), (1, 0));
    assert_eq!(report.steps.len(), 1, "the stopped step is recorded");
    // Stopped while the poll was answered: the call was dropped.
    assert_eq!((report.steps[0].attempts, report.steps[0].status), (1, 0));
    assert_eq!(report.steps[0].error, "run stopped");
}

#[tokio::test]
async fn a_stop_drops_the_call_in_flight() {
    let server = TestServer::start(|_, _| hang()).await;
    for step in [
        "{method: post, endpoint: \"BASE/slow\", timeout: 1h}",
        "{method: post, endpoint: \"BASE/slow\", async: true, timeout: 1h}",
    ] {
        let control = RunControl::default();
        let stop = control.stop.clone();
        let pipelines = compile(&format!("- {step}\n- {{method: get, endpoint: \"BASE/next\"}}"), &server.base);
        // The ack window is longer than the test may take: only the stop ends the step.
        let settings = PipelineSettings { async_ack_timeout: Duration::from_secs(3600), ..SETTINGS };
        let calls = server.calls("/slow");
        let run = async { pipelines.get("m").unwrap().run(&http_client(), &ctx(), &settings, &control).await };
        let stopper = async {
            eventually("the slow call to arrive", || async { server.calls("/slow") > calls }).await;
            stop.cancel();
            Instant::now()
        };
        let (report, stopped_at) = tokio::join!(run, stopper);
        let took = stopped_at.elapsed();
        assert!(took < Duration::from_secs(1), "{step}: the call was dropped {took:?} after the stop");
        assert!(matches!(report.result, Err(PipelineError::Stopped)), "{step}: {:?}", report.result);
        assert_eq!(server.calls("/next"), 0);
        assert_eq!(report.steps.len(), 1);
        assert_eq!((report.steps[0].status, report.steps[0].error.as_str()), (0, "run stopped"));
    }
}

#[tokio::test]
async fn a_stop_before_a_step_stops_the_run_there() {
    let control = RunControl::default();
    let stop = control.stop.clone();
    let server = TestServer::start(move |_, _| {
        stop.cancel();
        ok(json!({}))
    })
    .await;
    let pipelines =
        compile("- {method: get, endpoint: \"BASE/zero\"}\n- {method: get, endpoint: \"BASE/one\"}", &server.base);
    let report = report_with(&pipelines, &control).await;
    assert!(matches!(report.result, Err(PipelineError::Stopped)), "{:?}", report.result);
    assert_eq!((server.calls("/zero"), server.calls("/one")), (1, 0));
    assert_eq!(report.steps.len(), 1);
}

// ---------------------------------------------------------------- 429

#[tokio::test]
async fn retry_after_of_a_429_is_reported() {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120));
    let server = TestServer::start(move |r, _| match r.path.as_str() {
        "/seconds" => Reply { status: 429, headers: vec![("retry-after", "3".into())], ..Reply::default() },
        "/date" => Reply { status: 429, headers: vec![("retry-after", date.clone())], ..Reply::default() },
        "/bare" => status(429),
        _ => Reply { status: 503, headers: vec![("retry-after", "9".into())], ..Reply::default() },
    })
    .await;
    let report_of = |path: &str| {
        let pipelines = compile(&format!("- {{method: post, endpoint: \"BASE{path}\"}}"), &server.base);
        async move { report(&pipelines).await }
    };
    let seconds = report_of("/seconds").await;
    assert!(matches!(seconds.result, Err(PipelineError::Status { status: 429, .. })));
    assert_eq!(seconds.retry_after, Some(Duration::from_secs(3)));
    assert_eq!(seconds.steps[0].status, 429);
    let date = report_of("/date").await.retry_after.expect("an HTTP date");
    assert!(date > Duration::from_secs(100) && date <= Duration::from_secs(120), "{date:?}");
    assert_eq!(report_of("/bare").await.retry_after, None, "no header, no delay");
    assert_eq!(report_of("/other").await.retry_after, None, "only a 429 asks to back off");

    // An async step's 429 fails nothing but still asks to back off.
    let pipelines = compile(
        "- {method: post, endpoint: \"BASE/seconds\", async: true}\n- {method: get, endpoint: \"BASE/date\"}",
        &server.base,
    );
    let report = report(&pipelines).await;
    assert!(report.retry_after.expect("longest") > Duration::from_secs(100));
}

// ---------------------------------------------------------------- redaction (issue 10, 7a)

#[tokio::test]
async fn outputs_feeding_a_header_are_redacted_in_records_and_logs() {
    const TOKEN: &str = "minted-t0ken-4242";
    let logs = LogCapture::start();
    let server = TestServer::start(|r, _| match r.path.as_str() {
        "/login" => ok(json!({"token": TOKEN, "id": 5, "other": "visible"})),
        "/login2" => ok(json!({"token": TOKEN, "id": 6})),
        _ => ok(json!({})),
    })
    .await;
    let pipelines = compile(
        r#"
- {method: post, endpoint: "BASE/login", outputs: {Token: .token, Id: .id, Other: .other}}
- method: get
  endpoint: "BASE/use/{{ .Previous.Outputs.Id }}"
  headers: {Authorization: {type: Bearer, value: "{{ .Previous.Outputs.Token }}"}}
- {method: post, endpoint: "BASE/login2", outputs: {Token: .token, Id: .id}}
- method: get
  endpoint: "BASE/use2"
  headers: {X-Any: "{{ range $k, $v := .Previous.Outputs }}{{ $v }}{{ end }}"}
"#,
        &server.base,
    );
    let report = report(&pipelines).await;
    report.result.expect("run");
    assert_eq!(server.requests()[1].header("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
    assert_eq!(report.steps[0].outputs, outputs(&[("Token", "<redacted>"), ("Id", "5"), ("Other", "visible")]));
    assert_eq!(
        report.steps[2].outputs,
        outputs(&[("Token", "<redacted>"), ("Id", "<redacted>")]),
        "a header that may read any output hides them all"
    );
    let text = logs.text();
    assert!(!text.contains(TOKEN), "{text}");
    assert!(text.contains(r#"{\"Id\":\"5\",\"Other\":\"visible\",\"Token\":\"<redacted>\"}"#), "{text}");
}

// ---------------------------------------------------------------- detached requests (issue 10, 14)

/// A backend that accepts connections and never answers; counts the ones
/// still open.
async fn silent_backend() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let open = Arc::new(AtomicUsize::new(0));
    let counter = open.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counter = counter.clone();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                // Reads the request and never answers; 0 is the client closing.
                while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
                counter.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (base, open)
}

#[tokio::test]
async fn detached_async_requests_are_bounded() {
    let logs = LogCapture::start();
    let (base, open) = silent_backend().await;
    let pipelines = compile_with(
        "- {method: post, endpoint: \"BASE/trigger\", async: true, timeout: 1h}",
        &base,
        "  max_detached_requests: 3\n",
    );
    for round in 1..=8 {
        let report = report(&pipelines).await;
        assert!(report.result.is_ok(), "an unanswered async step fails nothing");
        assert!(matches!(report.steps[0].status, 0));
        let detached = pipelines.detached_requests();
        assert_eq!(detached, round.min(3), "round {round}");
    }
    eventually("the backend sees at most 3 open connections", || async { open.load(Ordering::SeqCst) == 3 }).await;
    let abandoned = logs.text().lines().filter(|l| l.contains("abandoning the oldest async request")).count();
    assert_eq!(abandoned, 5, "one line per abandoned request");
    let line = logs.text().lines().find(|l| l.contains("abandoning")).unwrap().to_string();
    for field in [r#""lock_id":7"#, r#""sync_id":"2026-02-01T00Z""#, r#""step":0"#, r#""run_id":"0193a6c1-run""#] {
        assert!(line.contains(field), "{field} in {line}");
    }
}

#[tokio::test]
async fn answered_async_requests_leave_nothing_detached() {
    let server = TestServer::start(|_, _| Reply { delay: Duration::from_millis(400), ..ok(json!({})) }).await;
    let pipelines = compile("- {method: post, endpoint: \"BASE/slow\", async: true}", &server.base);
    report(&pipelines).await.result.expect("run");
    assert_eq!(pipelines.detached_requests(), 1, "still running after the 200ms ack");
    eventually("the late answer ends it", || async { pipelines.detached_requests() == 0 }).await;
    let fast = compile("- {method: post, endpoint: \"BASE/x\", async: true}", &closed_port().await);
    report(&fast).await;
    assert_eq!(fast.detached_requests(), 0, "answered (or failed) within the ack: never detached");
}
