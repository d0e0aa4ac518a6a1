//! Startup validation, and `examples/kayra.yaml` driving real runs.

use axum::http::Method;
use kayra_config::Config;
use kayra_pipeline::{PipelineError, PipelineSettings, Pipelines, RunControl, http_client};
use serde_json::json;

use crate::support::*;

// ---------------------------------------------------------------- validation

fn compile_error(steps_yaml: &str) -> String {
    try_compile(steps_yaml, "http://backend").expect_err("refused").to_string()
}

#[test]
fn validation_errors_name_mode_step_and_field() {
    let ok_step = "- {method: get, endpoint: \"BASE/ok\"}\n";
    let cases = [
        (
            "- method: get\n  endpoint: BASE/x\n  headers: {Authorization: \"Bearer {{ .Subscription.Namespace \"}",
            "reconciler.mode.m[1].headers.Authorization: template: 1:",
            "unclosed action",
        ),
        (
            "- method: get\n  endpoint: BASE/x\n  headers: {Authorization: {type: Bearer, value: \"{{ .X }\"}}",
            "reconciler.mode.m[1].headers.Authorization.value: ",
            "unexpected",
        ),
        ("- {method: fetch, endpoint: BASE/x}", "reconciler.mode.m[1].method: ", "fetch"),
        (
            "- {method: get, endpoint: \"BASE/{{ .Subscription.Namespace\"}",
            "reconciler.mode.m[1].endpoint: ",
            "unclosed",
        ),
        (
            "- method: post\n  endpoint: BASE/x\n  data: {variables: [{key: A, value: \"{{ .A | nosuch }}\"}]}",
            "reconciler.mode.m[1].data.variables[0].value: ",
            "function \"nosuch\" not defined",
        ),
        (
            "- {method: get, endpoint: BASE/x, outputs: {Id: \".items[x]\"}}",
            "reconciler.mode.m[1].outputs.Id: ",
            "index",
        ),
        (
            "- {method: get, endpoint: BASE/x, wait: [{key: \".a..b\", successes: [x]}]}",
            "reconciler.mode.m[1].wait[0].key: ",
            "empty",
        ),
        (
            "- {method: get, endpoint: BASE/x, headers: {\"Bad Header\": v}}",
            "reconciler.mode.m[1].headers.Bad Header: ",
            "header name",
        ),
        ("- {method: get, endpoint: BASE/x, headers: {X-A: v, x-a: w}}", "reconciler.mode.m[1].headers.x-a: ", "twice"),
        ("- {method: get, endpoint: \"ftp://h/x\"}", "reconciler.mode.m[1].endpoint: ", "scheme"),
        ("- {method: get, endpoint: \"not a url\"}", "reconciler.mode.m[1].endpoint: ", "not a URL"),
        ("- {method: get, endpoint: BASE/x, timeout: 0s}", "reconciler.mode.m[1].timeout: ", "greater than zero"),
    ];
    for (step, prefix, detail) in cases {
        let err = compile_error(&format!("{ok_step}{step}"));
        assert!(err.starts_with(prefix) && err.contains(detail), "expected {prefix}…{detail}, got: {err}");
    }
}

#[test]
fn empty_modes_get_no_pipeline() {
    let config = Config::parse("reconciler:\n  mode:\n    api: []\n", "t").expect("parse");
    let pipelines = Pipelines::compile(&config.reconciler).expect("compile");
    assert!(pipelines.get("api").is_none());
    assert!(pipelines.get("other").is_none());
    assert_eq!(pipelines.settings(), PipelineSettings::default());
}

// ---------------------------------------------------------------- examples/kayra.yaml

fn example_yaml() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/kayra.yaml");
    std::fs::read_to_string(path).expect("read examples/kayra.yaml")
}
const SYNC_API_TOKEN: &str = "yyyyyyyyyyyyyyyy";

/// The example, with its backends moved to `base`, fast timings, and its
/// secrets read from files in `dir` (tests cannot set environment variables).
fn example_pipelines(base: &str, dir: &std::path::Path) -> Pipelines {
    let mut yaml = example_yaml()
        .replace("https://gitlab.example.com", base)
        .replace("https://{{ .Subscription.ShortName }}.local.services", base);
    for (var, token) in [("GITLAB_TOKEN", GITLAB_TOKEN), ("SYNC_API_TOKEN", SYNC_API_TOKEN)] {
        let path = dir.join(var);
        std::fs::write(&path, format!("{token}\n")).unwrap();
        let source = format!("{{env: {var}}}");
        assert!(yaml.contains(&source), "the example reads {var}");
        yaml = yaml.replace(&source, &format!("{{file: {}}}", path.display()));
    }
    let mut config = Config::parse(&yaml, "examples/kayra.yaml").expect("example parses");
    config.validate().expect("example validates");
    config.reconciler.async_ack_timeout = kayra_config::Duration(SETTINGS.async_ack_timeout);
    config.reconciler.wait_poll_interval = kayra_config::Duration(SETTINGS.wait_poll_interval);
    let pipelines = Pipelines::compile(&config.reconciler).expect("example compiles");
    assert_eq!(pipelines.settings(), SETTINGS);
    pipelines
}

#[test]
fn example_config_is_valid_as_shipped() {
    let config = Config::parse(&example_yaml(), "examples/kayra.yaml").expect("parse");
    config.validate().expect("validate");
    assert!(config.database.local.is_some() && config.database.etcd.is_none());
    let pipelines = Pipelines::compile(&config.reconciler).expect("compile");
    assert_eq!(pipelines.modes().collect::<Vec<_>>(), ["api", "trigger"]);
    assert_eq!(config.reconciler.resolve_mode(""), Some("trigger"));
}

const GITLAB_TOKEN: &str = "glpat-XXXXXXXXXXXXXXXXXXXX";

#[tokio::test]
async fn example_gitlab_trigger_then_poll() {
    let server = TestServer::start(|r, n| {
        if r.header("private-token") != Some(GITLAB_TOKEN) {
            return status(401);
        }
        match (r.method.as_str(), r.path.as_str()) {
            ("POST", "/api/v4/projects/1234/pipeline") => Reply {
                status: 201,
                body: json!({"id": 4711, "status": "created", "ref": "dev"}).to_string(),
                ..Reply::default()
            },
            ("GET", "/api/v4/projects/1234/pipelines/4711") => {
                let state = ["pending", "running", "running"].get(n).copied().unwrap_or("success");
                ok(json!({"id": 4711, "status": state}))
            }
            _ => status(404),
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let pipelines = example_pipelines(&server.base, dir.path());
    let pipeline = pipelines.get("trigger").expect("trigger mode");
    assert_eq!(pipeline.len(), 2);
    pipeline.run(&http_client(), &ctx(), &pipelines.settings(), &RunControl::default()).await.result.expect("run");

    let requests = server.requests();
    let trigger = &requests[0];
    assert_eq!(trigger.header("content-type"), Some("application/json"));
    assert_eq!(
        trigger.json(),
        json!({"ref": "dev", "variables": [{"key": "TENANT_NAME", "value": "core"}, {"key": "CHECK_MAX", "value": "50"}]})
    );
    assert_eq!(server.calls("/api/v4/projects/1234/pipelines/4711"), 4);
    assert_eq!(requests.len(), 5);
}

#[tokio::test]
async fn example_gitlab_poll_escapes_a_hostile_pipeline_id() {
    let server = TestServer::start(|r, _| match r.method.as_str() {
        "POST" => ok(json!({"id": "7/../../../../users?all=1#"})),
        _ => ok(json!({"status": "success"})),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let pipelines = example_pipelines(&server.base, dir.path());
    let pipeline = pipelines.get("trigger").expect("trigger mode");
    pipeline.run(&http_client(), &ctx(), &pipelines.settings(), &RunControl::default()).await.result.expect("run");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].path, "/api/v4/projects/1234/pipelines/7%2F..%2F..%2F..%2F..%2Fusers%3Fall=1%23");
}

#[tokio::test]
async fn example_gitlab_failed_pipeline_fails_the_run() {
    let server = TestServer::start(|r, _| match r.method.as_str() {
        "POST" => ok(json!({"id": 5})),
        _ => ok(json!({"id": 5, "status": "failed"})),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let pipelines = example_pipelines(&server.base, dir.path());
    let pipeline = pipelines.get("trigger").expect("trigger mode");
    let err = pipeline.run(&http_client(), &ctx(), &pipelines.settings(), &RunControl::default()).await.result;
    assert!(matches!(err, Err(PipelineError::WaitFailed { step: 1, .. })), "{err:?}");
}

#[tokio::test]
async fn example_api_mode_triggers_and_polls() {
    let server = TestServer::start(|r, n| match (r.method.as_str(), r.path.as_str()) {
        ("POST", "/api/v1/namespaces/core/sync") => hang(),
        ("GET", "/api/v1/namespaces/core/sync/2026-02-01T00Z") => {
            ok(json!({"status": if n < 2 { "syncing" } else { "done" }}))
        }
        _ => status(404),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let pipelines = example_pipelines(&server.base, dir.path());
    let pipeline = pipelines.get("api").expect("api mode");
    pipeline.run(&http_client(), &ctx(), &pipelines.settings(), &RunControl::default()).await.result.expect("run");
    let requests = server.requests();
    let trigger = requests.iter().find(|r| r.method == Method::POST).expect("trigger sent");
    assert_eq!(trigger.json(), json!({"sync_id": "2026-02-01T00Z"}));
    assert_eq!(trigger.header("authorization"), Some(format!("Bearer {SYNC_API_TOKEN}").as_str()));
    assert_eq!(server.calls("/api/v1/namespaces/core/sync/2026-02-01T00Z"), 3);
}
