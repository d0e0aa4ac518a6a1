//! The step log lines: contract fields, and never a secret.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use kayra_pipeline::PipelineError;
use serde_json::{Value, json};

use crate::support::*;

// ---------------------------------------------------------------- logs

/// Captures this thread's log output as JSON lines.
///
/// tracing caches per call site whether anyone is interested in it, and a
/// thread-local `set_default` subscriber races with the other tests of this
/// binary hitting the same call sites. So one global subscriber is installed
/// for the whole binary and writes to whichever buffer the current thread
/// registered; `#[tokio::test]` runs every task of a test on its thread.
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

thread_local! {
    static CAPTURE: std::cell::RefCell<Option<Arc<Mutex<Vec<u8>>>>> = const { std::cell::RefCell::new(None) };
}

/// Writes to the current thread's capture buffer, if any.
struct ThreadWriter;

impl Write for ThreadWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(sink) = c.borrow().as_ref() {
                sink.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    pub fn start() -> Self {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_max_level(tracing::Level::TRACE)
                .with_writer(|| ThreadWriter)
                .finish();
            tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
        });
        let sink = Arc::new(Mutex::new(Vec::new()));
        CAPTURE.with(|c| *c.borrow_mut() = Some(sink.clone()));
        Self(sink)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Drop for LogCapture {
    fn drop(&mut self) {
        CAPTURE.with(|c| *c.borrow_mut() = None);
    }
}

#[tokio::test]
async fn step_lines_carry_the_contract_fields_and_never_a_secret() {
    const TOKEN: &str = "s3cr3t-t0ken-value";
    const BODY_SECRET: &str = "b0dy-s3cr3t";
    let logs = LogCapture::start();

    let server = TestServer::start(|r, n| match r.path.as_str() {
        "/trigger" => status(500),
        "/create" => ok(json!({"id": 12, "echo": "fine"})),
        "/poll/12" if n == 0 => ok(json!({"status": "running"})),
        "/poll/12" => ok(json!({"status": "success"})),
        _ => status(500),
    })
    .await;
    let steps = format!(
        r#"
- method: post
  endpoint: "BASE/trigger"
  async: true
  headers: {{Authorization: {{type: Bearer, value: "{TOKEN}"}}}}
  data: {{password: "{BODY_SECRET}"}}
- method: post
  endpoint: "BASE/create"
  headers: {{PRIVATE-TOKEN: "{TOKEN}"}}
  data: {{nested: [{{secret: "{BODY_SECRET}-{{{{ .Subscription.Namespace }}}}"}}]}}
  outputs: {{Id: .id}}
- method: get
  endpoint: "BASE/poll/{{{{ .Previous.Outputs.Id }}}}"
  headers: {{X-Token: "{{{{ .Subscription.Namespace }}}}-{TOKEN}"}}
  wait: [{{key: .status, successes: [success]}}]
- method: get
  endpoint: "BASE/fails"
  headers: {{Authorization: {{type: Bearer, value: "{TOKEN}"}}}}
- method: get
  endpoint: "BASE/never"
"#
    );
    let pipelines = compile(&steps, &server.base);
    let span = tracing::info_span!(
        "reconcile",
        namespace = "core",
        api = "compute.example.com",
        lock_id = 7,
        sync_id = "2026-02-01T00Z"
    );
    let err = tracing::Instrument::instrument(run(&pipelines), span).await.expect_err("step 3 fails");
    assert!(matches!(err, PipelineError::Status { step: 3, status: 500 }));
    assert!(!format!("{err} {err:?}").contains(TOKEN));
    assert!(!format!("{pipelines:?}").contains(TOKEN) && !format!("{pipelines:?}").contains(BODY_SECRET));

    let text = logs.text();
    assert!(!text.contains(TOKEN), "a token reached the logs:\n{text}");
    assert!(!text.contains(BODY_SECRET), "a request body reached the logs:\n{text}");

    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    let step_lines: Vec<&Value> = lines.iter().filter(|l| l.get("step").is_some()).collect();
    for line in &step_lines {
        assert_eq!(line["lock_id"], 7, "{line}");
        assert_eq!(line["sync_id"], "2026-02-01T00Z", "{line}");
    }
    let results: HashMap<u64, &Value> = step_lines
        .iter()
        .filter(|l| l.get("attempts").is_some())
        .map(|l| (l["step"].as_u64().expect("step index"), *l))
        .collect();
    assert_eq!(results.len(), 4, "one line per step run, none for the step never reached: {text}");
    for (step, line) in &results {
        for field in ["method", "endpoint", "async", "attempts", "outputs"] {
            assert!(line.get(field).is_some(), "step {step} lacks {field}: {line}");
        }
        assert!(line.get("status").is_some() || line.get("error").is_some(), "{line}");
    }
    assert_eq!(results[&0]["async"], true);
    assert_eq!(results[&0]["status"], 500);
    assert_eq!(results[&0]["level"], "WARN");
    assert_eq!(results[&1]["endpoint"], format!("{}/create", server.base));
    assert_eq!(results[&1]["outputs"], r#"{"Id":"12"}"#);
    assert_eq!(results[&1]["method"], "POST");
    assert_eq!(results[&2]["attempts"], 2);
    assert_eq!(results[&2]["level"], "INFO");
    assert_eq!(results[&3]["status"], 500);
    assert_eq!(results[&3]["error"], "step 3: answered HTTP 500");

    // The pipeline's own line about the async failure has no error detail.
    let ignored: Vec<_> =
        lines.iter().filter(|l| l["message"].as_str().is_some_and(|m| m.contains("ignoring"))).collect();
    assert_eq!(ignored.len(), 1, "{text}");
    assert_eq!(ignored[0]["step"], 0);
    assert!(ignored[0].get("error").is_none() && ignored[0].get("status").is_none(), "{}", ignored[0]);
}
