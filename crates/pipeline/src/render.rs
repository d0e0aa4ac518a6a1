//! What a run would send, without sending it (`kayra render`, platform §10).
//!
//! The same compiled steps and the same rendering code as a real run
//! ([`crate::step::CompiledStep::render`]); only the inputs differ:
//!
//! - secrets are never read: each name gets a stand-in value unique to it,
//!   so the field it lands in is found and shown as `<redacted>` exactly as
//!   a real value would be;
//! - a step's `.Previous.Outputs.X` is `<output X of step N>` for every
//!   output the previous step declares (others render `<no value>`, as they
//!   would in a run). Templates see a URL-safe stand-in, replaced by that
//!   text once rendered, so it reads the same in an endpoint (which would
//!   otherwise show it percent-encoded), a header and a body;
//! - `.Run.ID` is `<run id>` and `.Run.FencingToken` 0: there is no run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use reqwest::header::HeaderValue;

use crate::error::PipelineError;
use crate::http::shown_url;
use crate::secrets::{Redactor, SecretValues};
use crate::step::check_url;
use crate::template::Scope;
use crate::{Pipeline, SubscriptionContext};

/// One step's request as `kayra render` shows it: redacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedStep {
    pub index: usize,
    pub is_async: bool,
    /// Upper-case.
    pub method: String,
    /// Without user info; `<redacted>` when it holds a secret.
    pub endpoint: String,
    /// Name as configured, value `<redacted>` when it holds a secret; the
    /// default `Content-Type` of a step with `data` last.
    pub headers: Vec<(String, String)>,
    /// The JSON body, each string holding a secret `<redacted>`.
    pub body: Option<serde_json::Value>,
}

impl Pipeline {
    /// Renders every step for `ctx` as a run would, without a call (see the
    /// module docs). Fails as a run would on a template that cannot execute
    /// or a rendered endpoint or header value that cannot be sent.
    pub fn render(&self, ctx: &SubscriptionContext) -> Result<Vec<RenderedStep>, PipelineError> {
        let ctx = SubscriptionContext { run_id: "<run id>".into(), fencing_token: 0, ..ctx.clone() };
        let secrets = SecretValues::placeholders(&self.secrets);
        let redactor = Redactor::new(&secrets);
        let secrets = secrets.into_shared();
        let mut previous_outputs = BTreeMap::new();
        // Stand-in → what to show, for the previous step's outputs.
        let mut stand_ins: Vec<(String, String)> = Vec::new();
        let mut rendered = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let scope = Scope::new(&ctx, &previous_outputs, secrets.clone());
            let request = step.render(&scope)?;
            let index = step.index();
            let invalid = |message: String| PipelineError::InvalidRequest { step: index, message };
            // Checked as a run checks it, secrets or not: a step the run
            // would refuse is refused here too.
            let url = check_url(&request.endpoint).map_err(|message| invalid(format!("endpoint: {message}")))?;
            let endpoint = if redactor.hides(&request.endpoint) {
                crate::REDACTED.to_string()
            } else {
                reveal(&stand_ins, shown_url(&url))
            };
            let mut headers = Vec::with_capacity(request.headers.len());
            for (name, value) in request.headers {
                if redactor.hides(&value) {
                    headers.push((name, crate::REDACTED.to_string()));
                    continue;
                }
                HeaderValue::from_str(&value)
                    .map_err(|_| invalid(format!("header {name}: rendered value is not a valid HTTP header value")))?;
                headers.push((name, reveal(&stand_ins, value)));
            }
            rendered.push(RenderedStep {
                index,
                is_async: step.is_async(),
                method: step.method().to_string(),
                endpoint,
                headers,
                body: request.body.map(|body| reveal_json(&stand_ins, redactor.json(body))),
            });
            stand_ins = step
                .output_names()
                .map(|name| (format!("kayraout{index}x{}x", hex(name)), format!("<output {name} of step {index}>")))
                .collect();
            previous_outputs =
                stand_ins.iter().zip(step.output_names()).map(|((s, _), n)| (n.to_string(), s.clone())).collect();
        }
        Ok(rendered)
    }
}

/// `text` with every stand-in replaced by what it stands for.
fn reveal(stand_ins: &[(String, String)], mut text: String) -> String {
    for (stand_in, shown) in stand_ins {
        if text.contains(stand_in.as_str()) {
            text = text.replace(stand_in.as_str(), shown);
        }
    }
    text
}

fn reveal_json(stand_ins: &[(String, String)], value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(reveal(stand_ins, s)),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| reveal_json(stand_ins, v)).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, reveal_json(stand_ins, v))).collect()),
        other => other,
    }
}

/// Lower-case hex, so any output name makes a URL-safe stand-in.
fn hex(name: &str) -> String {
    name.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The text `kayra render` prints (platform §10): for each step
/// `# step N` (or `# step N (async)`), `METHOD URL`, one `Name: value` line
/// a header, a blank line, and the body (compact JSON, as sent) if any.
pub fn format_rendered(steps: &[RenderedStep]) -> String {
    let mut out = String::new();
    for step in steps {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# step {}{}", step.index, if step.is_async { " (async)" } else { "" });
        let _ = writeln!(out, "{} {}", step.method, step.endpoint);
        for (name, value) in &step.headers {
            let _ = writeln!(out, "{name}: {value}");
        }
        out.push('\n');
        if let Some(body) = &step.body {
            let _ = writeln!(out, "{body}");
        }
    }
    out
}
