//! Secrets in steps (platform §2): where they go, read afresh every run,
//! refused when unknown, and never shown.

use std::path::Path;

use kayra_pipeline::{PipelineError, Pipelines};
use serde_json::json;

use crate::logs::LogCapture;
use crate::support::*;

const FILE_SECRET: &str = "f1le-s3cret-value";

/// `reconciler.secrets` with `file_tok` read from `path` and `env_tok` from
/// `CARGO_PKG_NAME`, which cargo sets for every test process (tests cannot
/// set variables: `unsafe_code` is forbidden).
fn secrets_yaml(path: &Path) -> String {
    format!("  secrets:\n    file_tok: {{file: {}}}\n    env_tok: {{env: CARGO_PKG_NAME}}\n", path.display())
}

fn env_secret() -> String {
    std::env::var("CARGO_PKG_NAME").expect("cargo sets CARGO_PKG_NAME for tests")
}

#[tokio::test]
async fn secrets_from_env_and_file_reach_headers_endpoint_and_data_and_nowhere_else() {
    let logs = LogCapture::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, format!("{FILE_SECRET}\n")).unwrap();
    let server = TestServer::start(|r, _| {
        let echo = r.header("x-file").unwrap_or_default().to_string();
        ok(json!({"echo": echo, "plain": "p"}))
    })
    .await;
    let pipelines = compile_with(
        r#"
- method: post
  endpoint: 'BASE/a/{{ secret "file_tok" }}?q=1'
  headers:
    Authorization: {type: Bearer, secret: env_tok}
    X-File: {secret: file_tok}
    X-Mixed: 'k={{ secret "env_tok" }};ns={{ .Subscription.Namespace }}'
  data:
    nested: [{s: '{{ secret "file_tok" }}-x'}]
    plain: "{{ .Subscription.Namespace }}"
  outputs: {Echo: .echo, Plain: .plain}
- method: get
  endpoint: "BASE/b/{{ .Previous.Outputs.Plain }}"
"#,
        &server.base,
        &secrets_yaml(&path),
    );
    let report = report(&pipelines).await;
    report.result.expect("run");

    let env = env_secret();
    let r = &server.requests()[0];
    assert_eq!(r.path, format!("/a/{FILE_SECRET}?q=1"));
    assert_eq!(r.header("authorization"), Some(format!("Bearer {env}").as_str()));
    assert_eq!(r.header("x-file"), Some(FILE_SECRET));
    assert_eq!(r.header("x-mixed"), Some(format!("k={env};ns=core").as_str()));
    assert_eq!(r.json(), json!({"nested": [{"s": format!("{FILE_SECRET}-x")}], "plain": "core"}));

    assert_eq!(report.steps[0].endpoint, "<redacted>", "an endpoint holding a secret is hidden whole");
    assert_eq!(report.steps[0].outputs["Echo"], "<redacted>", "an output holding a secret is hidden");
    assert_eq!(report.steps[0].outputs["Plain"], "p");
    assert_eq!(report.steps[1].endpoint, format!("{}/b/p", server.base));
    let shown = format!("{:?} {pipelines:?} {}", report.steps, logs.text());
    assert!(!shown.contains(FILE_SECRET), "{shown}");
    assert!(!shown.contains(&format!("Bearer {env}")), "{shown}");
}

#[tokio::test]
async fn a_rotated_file_is_used_on_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "first\n").unwrap();
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let pipelines = compile_with(
        "- {method: get, endpoint: \"BASE/x\", headers: {X-T: {secret: file_tok}}}",
        &server.base,
        &secrets_yaml(&path),
    );
    run(&pipelines).await.expect("first run");
    std::fs::write(&path, "second\n").unwrap();
    run(&pipelines).await.expect("second run");
    let seen: Vec<_> = server.requests().iter().map(|r| r.header("x-t").unwrap().to_string()).collect();
    assert_eq!(seen, ["first", "second"]);
}

#[tokio::test]
async fn a_missing_variable_or_file_fails_the_run_naming_the_secret() {
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    let pipelines = compile_with(
        "- {method: get, endpoint: \"BASE/x\", headers: {X-T: {secret: missing_env}}}",
        &server.base,
        "  secrets:\n    missing_env: {env: KAYRA_TEST_VARIABLE_NOBODY_SETS}\n",
    );
    let report = report(&pipelines).await;
    let err = report.result.expect_err("cannot read");
    assert!(matches!(&err, PipelineError::Secret { name, .. } if name == "missing_env"), "{err:?}");
    assert_eq!(
        err.to_string(),
        r#"secret "missing_env": environment variable KAYRA_TEST_VARIABLE_NOBODY_SETS is not set"#
    );
    assert!(report.steps.is_empty(), "no step was called");

    let pipelines = compile_with(
        "- {method: get, endpoint: \"BASE/x\", data: {t: '{{ secret \"f\" }}'}}",
        &server.base,
        &format!("  secrets:\n    f: {{file: {}}}\n", gone.display()),
    );
    let err = run(&pipelines).await.expect_err("no file").to_string();
    assert!(err.starts_with(r#"secret "f": cannot read file "#) && err.contains("gone"), "{err}");
    assert!(server.requests().is_empty(), "nothing was sent");
}

#[test]
fn unknown_secret_names_are_refused_naming_mode_step_and_field() {
    let ok_step = "- {method: get, endpoint: \"BASE/ok\", headers: {X-Known: {secret: known}}}\n";
    let cases = [
        (
            "- {method: get, endpoint: BASE/x, headers: {Authorization: {type: Bearer, secret: nope}}}",
            "headers.Authorization.secret",
        ),
        ("- {method: get, endpoint: BASE/x, headers: {X-T: {secret: nope}}}", "headers.X-T.secret"),
        ("- {method: get, endpoint: 'BASE/{{ secret \"nope\" }}'}", "endpoint"),
        ("- {method: get, endpoint: BASE/x, headers: {X-T: 't {{ secret \"nope\" }}'}}", "headers.X-T"),
        (
            "- {method: get, endpoint: BASE/x, headers: {X-T: {type: '{{ secret \"nope\" }}', value: v}}}",
            "headers.X-T.type",
        ),
        ("- {method: post, endpoint: BASE/x, data: {a: [{b: '{{ secret \"nope\" }}'}]}}", "data.a[0].b"),
    ];
    for (step, field) in cases {
        let err = try_compile_with(&format!("{ok_step}{step}"), "http://h", "  secrets:\n    known: {env: X}\n")
            .expect_err(step)
            .to_string();
        assert_eq!(
            err,
            format!(r#"reconciler.mode.m[1].{field}: unknown secret "nope"; define it under reconciler.secrets"#),
            "{step}"
        );
    }
    for call in [
        "{{ secret .Subscription.Api }}",
        r#"{{ "known" | secret }}"#,
        "{{ printf \"%s\" (secret) }}",
        r#"{{ secret "known" "x" }}"#,
    ] {
        let step = format!("- {{method: get, endpoint: BASE/x, headers: {{X-T: '{call}'}}}}");
        let err = try_compile_with(&step, "http://h", "  secrets:\n    known: {env: X}\n").expect_err(call).to_string();
        assert!(
            err.starts_with("reconciler.mode.m[0].headers.X-T: ") && err.contains("secret takes one quoted name"),
            "{call}: {err}"
        );
    }
}

#[tokio::test]
async fn secret_values_never_reach_error_messages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    // A value no header may carry, and no host may be.
    std::fs::write(&path, "bad\u{7f}host s3cr3t").unwrap();
    let yaml = secrets_yaml(&path);
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    for steps in [
        "- {method: get, endpoint: BASE/x, headers: {X-T: {secret: file_tok}}}",
        "- {method: get, endpoint: 'http://{{ secret \"file_tok\" }}/x'}",
        "- {method: get, endpoint: 'http://127.0.0.1:1/{{ secret \"file_tok\" }}'}",
    ] {
        let report = report(&compile_with(steps, &server.base, &yaml)).await;
        let err = report.result.expect_err(steps);
        let shown = format!("{err} {err:?} {:?}", report.steps);
        assert!(!shown.contains("s3cr3t"), "{steps}: {shown}");
    }
    // Whatever fails, the file's value is not in a Debug of the compiled pipelines.
    let pipelines: Pipelines =
        compile_with("- {method: get, endpoint: BASE/x, headers: {X-T: {secret: file_tok}}}", &server.base, &yaml);
    assert!(!format!("{pipelines:?}").contains("s3cr3t"));
}
