//! Hostile backends (platform §17): an output that would move the next
//! step's request elsewhere fails that step before anything is sent,
//! `pathescape` and `urlquery` keep such a value a value, a secret a
//! backend echoes back escaped is `<redacted>` like a plain one, and an
//! output of any size either fails its step (over
//! `reconciler.max_output_bytes`) or is recorded cut to 1 KiB.

use std::sync::{Arc, Mutex, PoisonError};

use kayra_pipeline::{PipelineError, RunControl, SubscriptionContext, http_client};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

use crate::logs::LogCapture;
use crate::support::*;

/// The output of finding 5: a traversal, a query and a fragment at once.
const TRAVERSAL: &str = "../../admin/delete-all?confirm=yes#";

/// Step 0 creates an item, step 1 acts on it with a Bearer secret, its
/// path built from step 0's `ID` output by `id_template`.
fn item_steps(id_template: &str) -> String {
    format!(
        r#"
- method: post
  endpoint: "BASE/api/v1/items"
  outputs: {{ID: .id}}
- method: post
  endpoint: "BASE/api/v1/items/{id_template}"
  headers:
    Authorization: {{type: Bearer, secret: tok}}
"#
    )
}

/// `reconciler.secrets.tok`, read from `CARGO_PKG_NAME` (set for every test).
const TOKEN_SECRET: &str = "  secrets:\n    tok: {env: CARGO_PKG_NAME}\n";

/// A server whose `POST /api/v1/items` answers `{"id": <id>}`.
async fn items_server(id: &str) -> TestServer {
    let id = id.to_string();
    TestServer::start(move |r, _| match r.path.as_str() {
        "/api/v1/items" => ok(json!({"id": id})),
        _ => ok(json!({"done": true})),
    })
    .await
}

#[tokio::test]
async fn an_output_that_leaves_the_path_fails_its_step_and_sends_nothing() {
    for id in [
        TRAVERSAL,
        "..",
        ".",
        "%2e%2e/%2E%2e/admin",
        ".%2e/admin",
        "..\\..\\admin",
        "x/./y",
        "x/.\t./admin",
        "x#fragment",
        "x?y#",
    ] {
        let server = items_server(id).await;
        let pipelines = compile_with(&item_steps("{{ .Previous.Outputs.ID }}"), &server.base, TOKEN_SECRET);
        let report = report(&pipelines).await;
        let err = report.result.expect_err(id);
        assert!(matches!(&err, PipelineError::InvalidRequest { step: 1, .. }), "{id:?}: {err:?}");
        let message = err.to_string();
        assert!(message.starts_with("step 1: invalid request: endpoint: the URL has a "), "{id:?}: {message}");
        let requests = server.requests();
        assert_eq!(requests.len(), 1, "{id:?}: only step 0 reached the backend: {requests:?}");
        assert!(requests.iter().all(|r| !r.path.starts_with("/api/admin")), "{id:?}");
        assert_eq!(report.steps.len(), 2);
        assert_eq!(report.steps[1].attempts, 0, "{id:?}: nothing sent");
        assert_eq!(report.steps[1].error, message);
        // The refused step shows its template, not what the backend made of it.
        assert_eq!(
            report.steps[1].endpoint,
            "BASE/api/v1/items/{{ .Previous.Outputs.ID }}".replace("BASE", &server.base)
        );
    }
    for (id, what) in [(TRAVERSAL, r#"a ".." path segment"#), ("x#fragment", "a fragment")] {
        let server = items_server(id).await;
        let pipelines = compile_with(&item_steps("{{ .Previous.Outputs.ID }}"), &server.base, TOKEN_SECRET);
        let message = run(&pipelines).await.expect_err(id).to_string();
        assert!(message.contains(what), "{id:?}: {message}");
    }
}

#[tokio::test]
async fn user_info_from_an_output_is_refused_before_sending() {
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let host = server.base.trim_start_matches("http://").to_string();
    let hostile = TestServer::start(move |_, _| ok(json!({"host": format!("u:pw@{host}")}))).await;
    let steps = r#"
- {method: get, endpoint: "BASE/host", outputs: {Host: .host}}
- {method: get, endpoint: "http://{{ .Previous.Outputs.Host }}/x"}
"#;
    let report = report(&compile(steps, &hostile.base)).await;
    let err = report.result.expect_err("user info");
    assert!(err.to_string().starts_with("step 1: invalid request: endpoint: the URL has user info"), "{err}");
    assert!(server.requests().is_empty(), "nothing was sent");
    assert_eq!(report.steps[1].endpoint, "http://{{ .Previous.Outputs.Host }}/x", "its source, not the user info");
}

#[tokio::test]
async fn pathescape_keeps_the_same_output_under_items_and_urlquery_in_the_query() {
    let server = items_server(TRAVERSAL).await;
    let pipelines = compile_with(&item_steps("{{ pathescape .Previous.Outputs.ID }}"), &server.base, TOKEN_SECRET);
    run(&pipelines).await.expect("escaped, the output is one segment");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].path, "/api/v1/items/..%2F..%2Fadmin%2Fdelete-all%3Fconfirm=yes%23");

    let server = items_server(TRAVERSAL).await;
    let pipelines =
        compile_with(&item_steps("x?id={{ .Previous.Outputs.ID | urlquery }}&n=1"), &server.base, TOKEN_SECRET);
    run(&pipelines).await.expect("escaped, the output is one query value");
    assert_eq!(server.requests()[1].path, "/api/v1/items/x?id=..%2F..%2Fadmin%2Fdelete-all%3Fconfirm%3Dyes%23&n=1");
}

#[test]
fn literal_endpoints_that_leave_their_path_are_refused_at_startup() {
    for (endpoint, what) in [
        ("http://h/a/../b", r#"a ".." path segment"#),
        ("http://h/a/%2E%2e/b", r#"a ".." path segment"#),
        ("http://h/a/./b", r#"a "." path segment"#),
        ("http://h\\a\\..\\b", r#"a ".." path segment"#),
        ("http://h/a#f", "a fragment"),
        ("http://user:pw@h/a", "user info"),
    ] {
        let err = try_compile(&format!("- {{method: get, endpoint: '{endpoint}'}}"), "").expect_err(endpoint);
        let err = err.to_string();
        assert!(err.starts_with("reconciler.mode.m[0].endpoint: the URL has "), "{endpoint}: {err}");
        assert!(err.contains(what) && !err.contains("pw"), "{endpoint}: {err}");
    }
    for fine in ["http://h/a/..b/.c/c./...?x=../..", "http://h/%2e%2e%2fx", "https://h:8443/a/b/"] {
        try_compile(&format!("- {{method: get, endpoint: '{fine}'}}"), "").unwrap_or_else(|e| panic!("{fine}: {e}"));
    }
}

#[tokio::test]
async fn render_refuses_what_a_run_refuses() {
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let pipelines = compile("- {method: get, endpoint: 'BASE/t/{{ .Subscription.ShortName }}/x'}", &server.base);
    let pipeline = pipelines.get("m").unwrap();
    let hostile = SubscriptionContext { short_name: "..".into(), ..ctx() };
    let rendered = pipeline.render(&hostile).expect_err("dot segment").to_string();
    let ran = pipeline.run(&http_client(), &hostile, &SETTINGS, &RunControl::default()).await;
    assert_eq!(ran.result.expect_err("dot segment").to_string(), rendered);
    assert!(
        rendered.starts_with(r#"step 0: invalid request: endpoint: the URL has a ".." path segment"#),
        "{rendered}"
    );
    assert!(server.requests().is_empty());
    let fine = SubscriptionContext { short_name: "..x".into(), ..ctx() };
    assert_eq!(pipeline.render(&fine).expect("fine")[0].endpoint, format!("{}/t/..x/x", server.base));
}

// ---------------------------------------------------------------- secrets

/// A secret with every character JSON, Rust and URLs escape.
const SECRET: &str = "s3\"cr\\et/ é?&=+%;\u{1}";

/// The forms `value` may take on its way to something kayra shows.
fn forms(value: &str) -> Vec<String> {
    let unquote = |s: String| s[1..s.len() - 1].to_string();
    let json = |s: &str| unquote(serde_json::to_string(s).unwrap());
    let debug = |s: &str| unquote(format!("{s:?}"));
    let every_byte = |s: &str| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
    let query = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => char::from(b).to_string(),
                b' ' => "+".into(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    let mut forms = vec![value.to_string(), json(value), debug(value), every_byte(value), query(value)];
    // Nested once: a JSON log line of an escaped value, say.
    for outer in [json(value), query(value)] {
        forms.extend([json(&outer), query(&outer), debug(&outer)]);
    }
    forms.sort();
    forms.dedup();
    forms
}

fn visible_form<'a>(text: &str, forms: &'a [String]) -> Option<&'a String> {
    forms.iter().find(|form| text.contains(form.as_str()))
}

/// Every string inside a JSON value.
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.iter().for_each(|(k, v)| {
            out.push(k.clone());
            strings(v, out)
        }),
        _ => {}
    }
}

#[tokio::test]
async fn a_secret_echoed_back_escaped_is_redacted_everywhere() {
    let logs = LogCapture::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, SECRET).unwrap();
    let forms = forms(SECRET);
    let echoed: Vec<String> = forms.clone();
    let server = TestServer::start(move |r, _| {
        if r.path.starts_with("/status") {
            // A wait value that is the secret JSON-escaped: it ends up in the error.
            let json_escaped = serde_json::to_string(SECRET).unwrap().trim_matches('"').to_string();
            return ok(json!({"status": json_escaped, "again": format!("{SECRET:?}")}));
        }
        let mut body = serde_json::Map::new();
        for (i, form) in echoed.iter().enumerate() {
            body.insert(format!("f{i}"), json!(form));
        }
        body.insert("path".into(), json!(r.path));
        body.insert("plain".into(), json!("p"));
        ok(Value::Object(body))
    })
    .await;
    let outputs: Vec<String> = (0..forms.len()).map(|i| format!("F{i}: .f{i}")).collect();
    let steps = format!(
        r#"
- method: post
  endpoint: 'BASE/echo?q={{{{ secret "tok" | urlquery }}}}'
  data: {{s: '{{{{ secret "tok" }}}}'}}
  outputs: {{Path: .path, Plain: .plain, {}}}
- method: get
  endpoint: 'BASE/status?q={{{{ .Previous.Outputs.Plain }}}}'
  timeout: 300ms
  outputs: {{Status: .status, Again: .again}}
  wait: [{{key: .status, successes: [done]}}]
"#,
        outputs.join(", ")
    );
    let pipelines = compile_with(&steps, &server.base, &format!("  secrets:\n    tok: {{file: {}}}\n", path.display()));
    let report = report(&pipelines).await;

    let requests = server.requests();
    assert!(requests.len() >= 2, "{:?}", report.result);
    assert_eq!(requests[0].path, "/echo?q=s3%22cr%5Cet%2F+%C3%A9%3F%26%3D%2B%25%3B%01");
    let err = report.result.expect_err("the wait never resolves");
    assert!(matches!(err, PipelineError::WaitTimeout { step: 1, .. }), "{err:?}");
    assert!(err.to_string().contains(r#".status="<redacted>""#), "{err}");

    assert_eq!(report.steps[0].endpoint, "<redacted>");
    for (name, value) in &report.steps[0].outputs {
        let expected = if name == "Plain" { "p" } else { "<redacted>" };
        assert_eq!(value, expected, "output {name}");
    }
    // Present when the last poll was answered before the timeout.
    for value in report.steps[1].outputs.values() {
        assert_eq!(value, "<redacted>");
    }
    assert_eq!(report.steps[1].endpoint, format!("{}/status?q=p", server.base));

    let shown = format!("{err} {err:?} {:?} {:?}", report.steps, report.steps);
    assert_eq!(visible_form(&shown, &forms), None, "{shown}");
    let mut values = Vec::new();
    for line in logs.text().lines() {
        strings(&serde_json::from_str(line).expect("a JSON log line"), &mut values);
    }
    assert!(values.iter().any(|v| v.contains("wait unresolved")), "the step lines were captured: {values:?}");
    for value in &values {
        assert_eq!(visible_form(value, &forms), None, "log value {value:?}");
    }
}

// ---------------------------------------------------------------- properties

/// Pieces hostile outputs are made of.
const PIECES: &[&str] = &[
    "..", ".", "/", "\\", "?", "#", "%2e", "%2E", "%2f", "%5c", "%25", "%", "%zz", "%252e", "a", "admin", " ", "\t",
    "\n", "\u{0}", "é", "\u{ff0e}", "&", "=", ";", "@", ":", "+", "~", "[", "]",
];

fn hostile_output() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::collection::vec(proptest::sample::select(PIECES), 0..8).prop_map(|p| p.concat()),
        1 => "\\PC{0,12}",
    ]
}

/// Whether `path` (as received) has a `.` or `..` segment, percent-decoded.
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|segment| {
        let decoded = segment.replace("%2e", ".").replace("%2E", ".");
        decoded == "." || decoded == ".."
    })
}

/// Any output pasted into step 1's path: with `pathescape`, the request goes
/// to exactly `/api/v1/items/<escaped>` or (`.` and `..`) the step fails
/// without sending; pasted as is, it goes somewhere under `/api/v1/items/`
/// without a dot segment, or the step fails without sending.
#[test]
fn any_output_in_a_path_stays_under_its_prefix_or_is_not_sent() {
    const CASES: u32 = 300;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let output = Arc::new(Mutex::new(String::new()));
    let answer = output.clone();
    let server = runtime.block_on(TestServer::start(move |r, _| match r.path.as_str() {
        "/api/v1/items" => ok(json!({"id": *answer.lock().unwrap_or_else(PoisonError::into_inner)})),
        _ => ok(json!({})),
    }));
    let escaped = compile_with(&item_steps("{{ pathescape .Previous.Outputs.ID }}"), &server.base, TOKEN_SECRET);
    let pasted = compile_with(&item_steps("{{ .Previous.Outputs.ID }}"), &server.base, TOKEN_SECRET);

    let config = Config { cases: CASES, failure_persistence: None, max_shrink_iters: 200, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[0x5e; 32]));
    let (sent, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let result = runner.run(&hostile_output(), |id| {
        *output.lock().unwrap_or_else(PoisonError::into_inner) = id.clone();
        for (escape, pipelines) in [(true, &escaped), (false, &pasted)] {
            server.requests.lock().unwrap_or_else(PoisonError::into_inner).clear();
            let report = runtime.block_on(report(pipelines));
            let new = server.requests();
            match report.result {
                Ok(()) => {
                    sent.set(sent.get() + 1);
                    prop_assert_eq!(new.len(), 2);
                    let path = new[1].path.split('?').next().unwrap_or_default().to_string();
                    let rest = path.strip_prefix("/api/v1/items/");
                    prop_assert!(rest.is_some(), "{:?} (escape {}) went to {:?}", id, escape, new[1].path);
                    prop_assert!(!has_dot_segment(&path), "{:?} (escape {}) went to {:?}", id, escape, path);
                    if escape {
                        prop_assert_eq!(rest.unwrap_or_default(), escape_path(&id), "{:?}", id);
                    }
                }
                Err(PipelineError::InvalidRequest { step: 1, message }) => {
                    refused.set(refused.get() + 1);
                    prop_assert!(message.starts_with("endpoint: "), "{}", message);
                    prop_assert_eq!(new.len(), 1, "{:?} (escape {}): step 1 was sent: {:?}", id, escape, new);
                    if escape {
                        prop_assert!(id == "." || id == "..", "{:?} refused though escaped: {}", id, message);
                    }
                }
                Err(other) => prop_assert!(false, "{:?} (escape {}): {}", id, escape, other),
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    // The generator must reach both outcomes, or it proves nothing.
    let (sent, refused) = (sent.get(), refused.get());
    assert!(sent > 100 && refused > 25, "sent {sent}, refused {refused}");
}

/// Go's `url.PathEscape`, written out independently of the crate's.
fn escape_path(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => char::from(b).to_string(),
            b'$' | b'&' | b'+' | b':' | b'=' | b'@' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn a_wait_failure_quoting_a_secret_is_redacted_in_the_run_error() {
    // Contrived (a failure value that is a secret), but the value quoted is
    // still the backend's answer.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "fail-s3cr3t").unwrap();
    let server = TestServer::start(|_, _| ok(json!({"status": "fail-s3cr3t"}))).await;
    let steps = r#"
- {method: get, endpoint: "BASE/s", headers: {X-T: {secret: tok}}, wait: [{key: .status, successes: [ok], failures: [fail-s3cr3t]}]}
"#;
    let pipelines = compile_with(steps, &server.base, &format!("  secrets:\n    tok: {{file: {}}}\n", path.display()));
    let report = report(&pipelines).await;
    let err = report.result.expect_err("failed");
    assert_eq!(err.to_string(), r#"step 0: wait condition .status is "<redacted>", one of its failures"#);
    assert!(!format!("{err:?} {:?}", report.steps).contains("s3cr3t"));
}

/// Outputs of any size and content: over the limit, the step fails naming
/// the output and its length and keeps no output; within it, the next
/// step would get the value whole and the record shows it cut to 1 KiB
/// with its length.
#[test]
fn any_output_fails_over_its_limit_or_is_recorded_cut() {
    const CASES: u32 = 120;
    const MAX: usize = 4096;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let output = Arc::new(Mutex::new(String::new()));
    let answer = output.clone();
    let server = runtime.block_on(TestServer::start(move |_, _| {
        ok(json!({"id": *answer.lock().unwrap_or_else(PoisonError::into_inner)}))
    }));
    let pipelines = compile("- {method: post, endpoint: \"BASE/api/v1/items\", outputs: {ID: .id}}", &server.base);
    let settings = kayra_pipeline::PipelineSettings { max_output_bytes: MAX, ..SETTINGS };
    let value = prop_oneof![
        // Around the limit, in characters of one to four bytes.
        (0usize..3000, any::<char>()).prop_map(|(n, c)| c.to_string().repeat(n)),
        proptest::collection::vec(any::<char>(), 0..6000).prop_map(|cs| cs.into_iter().collect::<String>()),
        "[\"\\\\/\\u{0}-\\u{1f}\\u{7f}-\\u{9f}a]{0,5000}",
    ];
    let config = Config { cases: CASES, failure_persistence: None, max_shrink_iters: 100, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[0x0b; 32]));
    let (over, within) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let result = runner.run(&value, |value| {
        *output.lock().unwrap_or_else(PoisonError::into_inner) = value.clone();
        let pipeline = pipelines.get("m").expect("mode m");
        let report = runtime.block_on(pipeline.run(&http_client(), &ctx(), &settings, &RunControl::default()));
        let step = &report.steps[0];
        if value.len() > MAX {
            over.set(over.get() + 1);
            let expected =
                format!("step 0: output ID is {} bytes, over reconciler.max_output_bytes ({MAX})", value.len());
            prop_assert!(matches!(&report.result, Err(PipelineError::OutputTooLarge { .. })), "{:?}", report.result);
            prop_assert_eq!(&step.error, &expected);
            prop_assert!(step.outputs.is_empty());
        } else {
            within.set(within.get() + 1);
            prop_assert!(report.result.is_ok(), "{:?}", report.result);
            let shown = &step.outputs["ID"];
            prop_assert_eq!(shown, &kayra_core::runs::shown(&value).into_owned());
            prop_assert!(shown.len() <= 1024 + "…(4096 bytes)".len());
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    assert!(over.get() > 10 && within.get() > 10, "over {}, within {}", over.get(), within.get());
}
