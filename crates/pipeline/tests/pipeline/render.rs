//! `Pipeline::render` and `format_rendered`: what `kayra render` prints.

use kayra_pipeline::{PipelineError, format_rendered};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn render_shows_each_request_redacted_with_output_placeholders_and_sends_nothing() {
    let server = TestServer::start(|_, _| ok(json!({}))).await;
    let base = &server.base;
    let steps = r#"
- method: post
  endpoint: "BASE/api/v1/namespaces/{{ .Subscription.Namespace }}/sync"
  async: true
  headers:
    Authorization: {type: Bearer, secret: tok}
    X-Tenant: "{{ .Subscription.Namespace }}-{{ .Subscription.Region }}"
  data:
    nested: [{n: 1, s: "{{ .Subscription.Api }}"}]
    sync_id: "{{ .Subscription.ExpectedSyncID }}"
    token: 'x-{{ secret "tok" }}'
  outputs: {JobID: .id, Other Name: .o}
- method: get
  endpoint: "BASE/jobs/{{ .Previous.Outputs.JobID }}?n={{ index .Previous.Outputs \"Other Name\" }}"
  headers: {X-Run: "{{ .Run.ID }}/{{ .Run.FencingToken }}", X-Job: "{{ .Previous.Outputs.JobID }}"}
  data: {job: "{{ .Previous.Outputs.JobID }}"}
- method: Delete
  endpoint: "BASE/x/{{ .Previous.Outputs.JobID }}"
  headers: {Content-Type: text/plain}
- method: get
  endpoint: 'BASE/k/{{ secret "file" }}'
"#;
    let pipelines = compile_with(
        steps,
        base,
        "  secrets:\n    tok: {env: KAYRA_NOBODY_SETS_THIS}\n    file: {file: /nonexistent}\n",
    );
    let rendered = pipelines.get("m").unwrap().render(&ctx()).expect("render");
    let expected = format!(
        "# step 0 (async)\n\
         POST {base}/api/v1/namespaces/core/sync\n\
         Authorization: <redacted>\n\
         X-Tenant: core-local\n\
         Content-Type: application/json\n\
         \n\
         {{\"nested\":[{{\"n\":1,\"s\":\"compute.example.com\"}}],\"sync_id\":\"2026-02-01T00Z\",\"token\":\"<redacted>\"}}\n\
         # step 1\n\
         GET {base}/jobs/<output JobID of step 0>?n=<output Other Name of step 0>\n\
         X-Job: <output JobID of step 0>\n\
         X-Run: <run id>/0\n\
         Content-Type: application/json\n\
         \n\
         {{\"job\":\"<output JobID of step 0>\"}}\n\
         # step 2\n\
         DELETE {base}/x/%3Cno%20value%3E\n\
         Content-Type: text/plain\n\
         \n\
         # step 3\n\
         GET <redacted>\n\
         \n"
    );
    assert_eq!(format_rendered(&rendered), expected);
    assert!(server.requests().is_empty(), "render sends nothing");
}

#[test]
fn render_fails_as_a_run_would() {
    let pipelines = compile("- {method: get, endpoint: \"{{ .Subscription.Api }}/x\"}", "");
    let err = pipelines.get("m").unwrap().render(&ctx()).expect_err("not a URL");
    assert!(matches!(err, PipelineError::InvalidRequest { step: 0, .. }), "{err:?}");
    let pipelines = compile("- {method: get, endpoint: \"http://h/{{ range .Subscription.Api }}{{ end }}\"}", "");
    let err = pipelines.get("m").unwrap().render(&ctx()).expect_err("cannot range");
    assert!(matches!(err, PipelineError::Render { step: 0, .. }), "{err:?}");
}
