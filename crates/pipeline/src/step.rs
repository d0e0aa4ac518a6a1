//! One compiled step and what running it means (seed, "HTTP step pipeline":
//! `async`, `outputs`, `wait`).
//!
//! A step runs in one of two shapes:
//!
//! - **awaited** (`async: false`): the request is sent and its answer read
//!   within `timeout`. With `wait`, it is sent again every
//!   `wait_poll_interval` until the conditions resolve; `timeout` bounds the
//!   whole polling, not each call. Every call must answer 2xx: a non-2xx
//!   answer or a transport error fails the step at once, even mid-polling.
//!   The seed lists only "not JSON" and "key missing" as "not yet", and a
//!   status endpoint that starts failing is not going to report success.
//!   A poll that could only start after `timeout` is not made: the step
//!   fails as soon as the next one would be too late.
//! - **async** (`async: true`): the request is sent from a task of its own,
//!   and the step waits only `async_ack_timeout` for its answer. If the
//!   answer is late, the step moves on and the task is detached: the request
//!   continues in the background, bounded by the step's own `timeout`, so a
//!   backend that cancels work when the client disconnects still gets the
//!   whole call. (At process exit the runtime drops it.) Its late result is
//!   not observed: the step's one log line has already been written.
//!   `wait` is ignored on async steps.
//!
//! Outputs are taken from a 2xx answer's JSON body only (for `wait`, from the
//! last answer): an error body's fields are not what a later step expects.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use kayra_config::{HeaderValue as HeaderConfig, Step};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use tokio::time::Instant;

use super::PipelineSettings;
use super::dotpath::DotPath;
use super::error::PipelineError;
use super::http::{Answer, Prepared, redact};
use super::template::{Data, Scope, TemplateError, Text};

/// A header's value template(s).
enum HeaderTemplate {
    Plain(Text),
    /// `{type, value}`, rendered `"<type> <value>"`.
    Typed {
        kind: Text,
        value: Text,
    },
}

/// One `wait` condition, its key parsed.
struct Condition {
    key: DotPath,
    successes: Vec<String>,
    failures: Vec<String>,
}

/// A step with every template parsed and every path checked.
pub(crate) struct CompiledStep {
    index: usize,
    method: Method,
    /// The endpoint as written, logged when it cannot even be rendered.
    endpoint_source: String,
    endpoint: Text,
    headers: Vec<(HeaderName, HeaderTemplate)>,
    data: Option<Data>,
    /// Data is present and no `Content-Type` header is configured.
    default_content_type: bool,
    timeout: Duration,
    is_async: bool,
    outputs: Vec<(String, DotPath)>,
    wait: Vec<Condition>,
}

/// Everything a step's log line reports, plus the verdict.
pub(crate) struct Outcome {
    /// The rendered endpoint (password redacted), or its source when it
    /// could not be rendered.
    pub(crate) endpoint: String,
    pub(crate) attempts: u32,
    /// The last answer's status, when there was one.
    pub(crate) status: Option<StatusCode>,
    pub(crate) outputs: BTreeMap<String, String>,
    pub(crate) result: Result<(), PipelineError>,
}

/// `wait`'s reading of one answer.
enum Verdict {
    Done,
    Failed {
        key: String,
        value: String,
    },
    /// Describes what was seen, for the timeout message.
    NotYet(String),
}

impl CompiledStep {
    /// Compiles `step`; the error is `(field, message)`, the field relative
    /// to the step (`headers.Authorization.value`).
    pub(crate) fn compile(index: usize, step: &Step) -> Result<Self, (String, String)> {
        step.validate()?;
        let from_template = |e: TemplateError| (e.field, e.message);
        let method = Method::from_bytes(step.method_upper().as_bytes())
            .map_err(|_| ("method".to_string(), format!("unsupported method {:?}", step.method)))?;
        let endpoint = Text::parse("endpoint", &step.endpoint, false).map_err(from_template)?;
        if let Some(literal) = endpoint.literal() {
            check_url(literal).map_err(|message| ("endpoint".to_string(), message))?;
        }

        let mut headers: Vec<(HeaderName, HeaderTemplate)> = Vec::new();
        for (name, value) in &step.headers {
            let field = format!("headers.{name}");
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| (field.clone(), "not a valid HTTP header name".to_string()))?;
            if headers.iter().any(|(seen, _)| *seen == header) {
                return Err((field, "configured twice (header names are case-insensitive)".to_string()));
            }
            let template = match value {
                HeaderConfig::Plain(text) => {
                    HeaderTemplate::Plain(Text::parse(&field, text, true).map_err(from_template)?)
                }
                HeaderConfig::Typed(typed) => HeaderTemplate::Typed {
                    kind: Text::parse(format!("{field}.type"), &typed.kind, true).map_err(from_template)?,
                    value: Text::parse(format!("{field}.value"), &typed.value, true).map_err(from_template)?,
                },
            };
            headers.push((header, template));
        }

        let data = step.data.as_ref().map(|d| Data::compile("data", d)).transpose().map_err(from_template)?;
        let default_content_type = data.is_some() && !headers.iter().any(|(name, _)| name == CONTENT_TYPE);

        let outputs = step
            .outputs
            .iter()
            .map(|(name, path)| Ok((name.clone(), DotPath::parse(path).map_err(|m| (format!("outputs.{name}"), m))?)))
            .collect::<Result<_, (String, String)>>()?;
        let wait = step
            .wait
            .iter()
            .enumerate()
            .map(|(i, w)| {
                Ok(Condition {
                    key: DotPath::parse(&w.key).map_err(|m| (format!("wait[{i}].key"), m))?,
                    successes: w.successes.clone(),
                    failures: w.failures.clone(),
                })
            })
            .collect::<Result<Vec<_>, (String, String)>>()?;

        Ok(Self {
            index,
            method,
            endpoint_source: step.endpoint.clone(),
            endpoint,
            headers,
            data,
            default_content_type,
            timeout: step.timeout_or_default(),
            is_async: step.is_async,
            outputs,
            // Seed: wait "is ignored there rather than made to block".
            wait: if step.is_async { Vec::new() } else { wait },
        })
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn method(&self) -> &Method {
        &self.method
    }

    pub(crate) fn is_async(&self) -> bool {
        self.is_async
    }

    /// Renders and runs the step. Never returns early without an
    /// [`Outcome`]: the caller logs every step, win or lose.
    pub(crate) async fn run(&self, client: &reqwest::Client, scope: Scope, settings: &PipelineSettings) -> Outcome {
        let prepared = match self.prepare(&scope) {
            Ok(prepared) => prepared,
            Err((endpoint, error)) => {
                return self.outcome(endpoint, 0, None, BTreeMap::new(), Err(error));
            }
        };
        drop(scope);
        if self.is_async {
            self.run_async(client, prepared, settings.async_ack_timeout).await
        } else {
            self.run_awaited(client, prepared, settings.wait_poll_interval).await
        }
    }

    /// Renders every template into a request; on failure, also returns the
    /// endpoint to log.
    fn prepare(&self, scope: &Scope) -> Result<Prepared, (String, PipelineError)> {
        let step = self.index;
        let render_error = |e: TemplateError| PipelineError::Render { step, field: e.field, message: e.message };
        let endpoint = self.endpoint.render(scope).map_err(|e| (self.endpoint_source.clone(), render_error(e)))?;
        let url = Url::parse(&endpoint)
            .map_err(|e| e.to_string())
            .and_then(|url| check_url(url.as_str()).map(|()| url))
            .map_err(|message| (endpoint.clone(), PipelineError::InvalidRequest { step, message }))?;
        let shown = redact(&url);
        let fail = |error: PipelineError| (shown.clone(), error);

        let mut headers = HeaderMap::with_capacity(self.headers.len() + 1);
        for (name, template) in &self.headers {
            let text = match template {
                HeaderTemplate::Plain(value) => value.render(scope),
                HeaderTemplate::Typed { kind, value } => {
                    kind.render(scope).and_then(|k| Ok(format!("{k} {}", value.render(scope)?)))
                }
            }
            .map_err(|e| fail(render_error(e)))?;
            // The error names the header only: its value may be a token.
            let value = HeaderValue::from_str(&text).map_err(|_| {
                fail(PipelineError::InvalidRequest {
                    step,
                    message: format!("header {name}: rendered value is not a valid HTTP header value"),
                })
            })?;
            headers.insert(name.clone(), value);
        }

        let body = match &self.data {
            None => None,
            Some(data) => {
                let json = data.render(scope).map_err(|e| fail(render_error(e)))?;
                let bytes = serde_json::to_vec(&json).map_err(|_| {
                    fail(PipelineError::InvalidRequest { step, message: "data could not be encoded as JSON".into() })
                })?;
                if self.default_content_type {
                    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                }
                Some(bytes::Bytes::from(bytes))
            }
        };
        Ok(Prepared { method: self.method.clone(), url, headers, body })
    }

    async fn run_awaited(&self, client: &reqwest::Client, prepared: Prepared, poll_interval: Duration) -> Outcome {
        let step = self.index;
        let timeout = self.timeout;
        let endpoint = redact(&prepared.url);
        let deadline = Instant::now() + timeout;
        let mut attempts = 0;
        // What `wait` saw in the previous answer, if there was one.
        let mut last_seen: Option<String> = None;
        loop {
            attempts += 1;
            let answer = match tokio::time::timeout_at(deadline, prepared.send(client)).await {
                Err(_) => {
                    // Cut off mid-poll, the step failed for want of a
                    // resolved condition, and that is what to report.
                    let error = match last_seen {
                        Some(last) => PipelineError::WaitTimeout { step, timeout, attempts, last },
                        None => PipelineError::Timeout { step, timeout },
                    };
                    return self.outcome(endpoint, attempts, None, BTreeMap::new(), Err(error));
                }
                Ok(Err(source)) => {
                    let error = PipelineError::Transport { step, source };
                    return self.outcome(endpoint, attempts, None, BTreeMap::new(), Err(error));
                }
                Ok(Ok(answer)) => answer,
            };
            let status = Some(answer.status);
            if !answer.status.is_success() {
                let error = PipelineError::Status { step, status: answer.status.as_u16() };
                return self.outcome(endpoint, attempts, status, BTreeMap::new(), Err(error));
            }
            let outputs = self.extract_outputs(&answer);
            let last = match self.evaluate(answer.json.as_ref()) {
                Verdict::Done => return self.outcome(endpoint, attempts, status, outputs, Ok(())),
                Verdict::Failed { key, value } => {
                    let error = PipelineError::WaitFailed { step, key, value };
                    return self.outcome(endpoint, attempts, status, outputs, Err(error));
                }
                Verdict::NotYet(last) => last,
            };
            let next_poll = Instant::now() + poll_interval;
            if next_poll >= deadline {
                let error = PipelineError::WaitTimeout { step, timeout, attempts, last };
                return self.outcome(endpoint, attempts, status, outputs, Err(error));
            }
            last_seen = Some(last);
            tokio::time::sleep_until(next_poll).await;
        }
    }

    async fn run_async(&self, client: &reqwest::Client, prepared: Prepared, ack: Duration) -> Outcome {
        let step = self.index;
        let endpoint = redact(&prepared.url);
        let client = client.clone();
        let timeout = self.timeout;
        // Owns everything it needs, so it can outlive this step (see the
        // module docs); bounded by the step's own timeout.
        let mut task = tokio::spawn(async move { tokio::time::timeout(timeout, prepared.send(&client)).await });
        let (status, outputs, result) = match tokio::time::timeout(ack, &mut task).await {
            // Dropping the handle detaches the task; it is not aborted.
            Err(_) => (None, BTreeMap::new(), Err(PipelineError::NoAck { step, ack })),
            Ok(Err(_join)) => (None, BTreeMap::new(), Err(PipelineError::TaskFailed { step })),
            Ok(Ok(Err(_elapsed))) => (None, BTreeMap::new(), Err(PipelineError::Timeout { step, timeout })),
            Ok(Ok(Ok(Err(source)))) => (None, BTreeMap::new(), Err(PipelineError::Transport { step, source })),
            Ok(Ok(Ok(Ok(answer)))) if !answer.status.is_success() => {
                let error = PipelineError::Status { step, status: answer.status.as_u16() };
                (Some(answer.status), BTreeMap::new(), Err(error))
            }
            Ok(Ok(Ok(Ok(answer)))) => (Some(answer.status), self.extract_outputs(&answer), Ok(())),
        };
        self.outcome(endpoint, 1, status, outputs, result)
    }

    /// Every configured output whose path resolves; the others are skipped.
    fn extract_outputs(&self, answer: &Answer) -> BTreeMap<String, String> {
        let Some(body) = &answer.json else {
            return BTreeMap::new();
        };
        self.outputs.iter().filter_map(|(name, path)| Some((name.clone(), path.resolve_text(body)?))).collect()
    }

    /// Any condition in its failures fails at once, whatever the others say;
    /// done only when every condition is in its successes.
    fn evaluate(&self, body: Option<&serde_json::Value>) -> Verdict {
        if self.wait.is_empty() {
            return Verdict::Done;
        }
        let Some(body) = body else {
            return Verdict::NotYet("response body is not JSON".into());
        };
        let values: Vec<Option<String>> = self.wait.iter().map(|c| c.key.resolve_text(body)).collect();
        for (condition, value) in self.wait.iter().zip(&values) {
            if let Some(value) = value.as_ref().filter(|v| condition.failures.contains(v)) {
                return Verdict::Failed { key: condition.key.to_string(), value: value.clone() };
            }
        }
        let done = self.wait.iter().zip(&values).all(|(c, v)| v.as_ref().is_some_and(|v| c.successes.contains(v)));
        if done {
            return Verdict::Done;
        }
        let seen = self
            .wait
            .iter()
            .zip(&values)
            .map(|(c, v)| match v {
                Some(v) => format!("{}={v:?}", c.key),
                None => format!("{} missing", c.key),
            })
            .collect::<Vec<_>>()
            .join(", ");
        Verdict::NotYet(seen)
    }

    fn outcome(
        &self,
        endpoint: String,
        attempts: u32,
        status: Option<StatusCode>,
        outputs: BTreeMap<String, String>,
        result: Result<(), PipelineError>,
    ) -> Outcome {
        Outcome { endpoint, attempts, status, outputs, result }
    }
}

/// Steps call http(s) backends and nothing else.
fn check_url(endpoint: &str) -> Result<(), String> {
    let url = Url::parse(endpoint).map_err(|e| format!("{endpoint:?} is not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.has_host() => Ok(()),
        "http" | "https" => Err(format!("{endpoint:?} has no host")),
        other => Err(format!("{endpoint:?}: unsupported scheme {other:?}; use http or https")),
    }
}

impl fmt::Debug for CompiledStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Header values and data are left out: they may hold secrets.
        f.debug_struct("CompiledStep")
            .field("index", &self.index)
            .field("method", &self.method)
            .field("endpoint", &self.endpoint_source)
            .field("headers", &self.headers.iter().map(|(name, _)| name).collect::<Vec<_>>())
            .field("data", &self.data.is_some())
            .field("timeout", &self.timeout)
            .field("async", &self.is_async)
            .field("outputs", &self.outputs)
            .field("wait", &self.wait.iter().map(|c| &c.key).collect::<Vec<_>>())
            .finish()
    }
}
