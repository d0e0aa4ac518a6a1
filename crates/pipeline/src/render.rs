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
//!   would in a run);
//! - `.Run.ID` is `<run id>` and `.Run.FencingToken` 0: there is no run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use reqwest::Url;
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
        let mut rendered = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let scope = Scope::new(&ctx, &previous_outputs, secrets.clone());
            let request = step.render(&scope)?;
            let index = step.index();
            let invalid = |message: String| PipelineError::InvalidRequest { step: index, message };
            let endpoint = if redactor.hides(&request.endpoint) {
                crate::REDACTED.to_string()
            } else {
                let url = Url::parse(&request.endpoint)
                    .map_err(|e| invalid(format!("the rendered endpoint is not a URL: {e}")))?;
                check_url(url.as_str()).map_err(invalid)?;
                shown_url(&url)
            };
            let mut headers = Vec::with_capacity(request.headers.len());
            for (name, value) in request.headers {
                if redactor.hides(&value) {
                    headers.push((name, crate::REDACTED.to_string()));
                    continue;
                }
                HeaderValue::from_str(&value)
                    .map_err(|_| invalid(format!("header {name}: rendered value is not a valid HTTP header value")))?;
                headers.push((name, value));
            }
            rendered.push(RenderedStep {
                index,
                is_async: step.is_async(),
                method: step.method().to_string(),
                endpoint,
                headers,
                body: request.body.map(|body| redactor.json(body)),
            });
            previous_outputs = step
                .output_names()
                .map(|name| (name.to_string(), format!("<output {name} of step {index}>")))
                .collect();
        }
        Ok(rendered)
    }
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
