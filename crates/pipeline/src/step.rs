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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kayra_config::{HeaderValue as HeaderConfig, Step};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use tokio::time::Instant;

use super::dotpath::DotPath;
use super::error::PipelineError;
use super::http::{Answer, Prepared, percent_decode, shown_url};
use super::secrets::{REDACTED, Redactor};
use super::template::{Data, OutputUse, Scope, TemplateError, Text};
use super::{PipelineSettings, RunControl, SubscriptionContext};
use crate::detached::{DetachedRequests, Owner};

/// A header's value template(s).
enum HeaderTemplate {
    Plain(Text),
    /// `{type, value}` or `{type, secret}`, rendered `"<type> <value>"`.
    Typed {
        kind: Text,
        value: Text,
    },
}

impl HeaderTemplate {
    fn texts(&self) -> Vec<&Text> {
        match self {
            Self::Plain(text) => vec![text],
            Self::Typed { kind, value } => vec![kind, value],
        }
    }
}

/// One configured header.
struct Header {
    name: HeaderName,
    /// As written in the config, for `kayra render`.
    written: String,
    template: HeaderTemplate,
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
    /// The endpoint as written, shown when it cannot even be rendered.
    endpoint_source: String,
    endpoint: Text,
    headers: Vec<Header>,
    data: Option<Data>,
    /// Data is present and no `Content-Type` header is configured.
    default_content_type: bool,
    timeout: Duration,
    is_async: bool,
    outputs: Vec<(String, DotPath)>,
    wait: Vec<Condition>,
    /// Outputs of this step that the next step's headers read: shown as
    /// `<redacted>` (platform §8). Set by the pipeline after compiling the next step.
    pub(crate) outputs_in_headers: OutputUse,
}

/// Everything a step's log line and run record report, plus the verdict.
pub(crate) struct Outcome {
    /// The endpoint as it may be shown: rendered without user info,
    /// [`REDACTED`] when it holds a secret, or the source when it could not
    /// be rendered.
    pub(crate) endpoint: String,
    pub(crate) attempts: u32,
    /// The last answer's status, when there was one.
    pub(crate) status: Option<StatusCode>,
    /// The real values, for the next step; shown through [`CompiledStep::shown_outputs`].
    pub(crate) outputs: BTreeMap<String, String>,
    pub(crate) result: Result<(), PipelineError>,
    /// From the first call's start to the last answer.
    pub(crate) duration: Duration,
    /// A 429 answer's `Retry-After`.
    pub(crate) retry_after: Option<Duration>,
}

/// What a step's templates produced, before it becomes an HTTP request.
pub(crate) struct Rendered {
    pub(crate) endpoint: String,
    /// Configured name and rendered value; the default `Content-Type` last.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Option<serde_json::Value>,
}

/// What running a step needs besides its scope.
pub(crate) struct StepEnv<'a> {
    pub(crate) client: &'a reqwest::Client,
    pub(crate) ctx: &'a SubscriptionContext,
    pub(crate) settings: &'a PipelineSettings,
    pub(crate) control: &'a RunControl,
    pub(crate) redactor: &'a Redactor,
    pub(crate) detached: &'a Arc<DetachedRequests>,
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

        let mut headers: Vec<Header> = Vec::new();
        for (written, value) in &step.headers {
            let field = format!("headers.{written}");
            let name = HeaderName::from_bytes(written.as_bytes())
                .map_err(|_| (field.clone(), "not a valid HTTP header name".to_string()))?;
            if headers.iter().any(|seen| seen.name == name) {
                return Err((field, "configured twice (header names are case-insensitive)".to_string()));
            }
            let template = match value {
                HeaderConfig::Plain(text) => {
                    HeaderTemplate::Plain(Text::parse(&field, text, true).map_err(from_template)?)
                }
                HeaderConfig::Typed(typed) => {
                    let value = match (&typed.value, &typed.secret) {
                        (_, Some(secret)) => Text::secret(format!("{field}.secret"), secret),
                        (Some(value), None) => {
                            Text::parse(format!("{field}.value"), value, true).map_err(from_template)?
                        }
                        // `Step::validate` refused it already.
                        (None, None) => return Err((field, "needs value or secret".into())),
                    };
                    match &typed.kind {
                        Some(kind) => HeaderTemplate::Typed {
                            kind: Text::parse(format!("{field}.type"), kind, true).map_err(from_template)?,
                            value,
                        },
                        None => HeaderTemplate::Plain(value),
                    }
                }
            };
            headers.push(Header { name, written: written.clone(), template });
        }

        let data = step.data.as_ref().map(|d| Data::compile("data", d)).transpose().map_err(from_template)?;
        let default_content_type = data.is_some() && !headers.iter().any(|h| h.name == CONTENT_TYPE);

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
            outputs_in_headers: OutputUse::None,
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

    /// The output names this step declares.
    pub(crate) fn output_names(&self) -> impl Iterator<Item = &str> {
        self.outputs.iter().map(|(name, _)| name.as_str())
    }

    /// Every template of the step.
    pub(crate) fn texts(&self) -> Vec<&Text> {
        let mut texts = vec![&self.endpoint];
        texts.extend(self.headers.iter().flat_map(|h| h.template.texts()));
        if let Some(data) = &self.data {
            texts.extend(data.texts());
        }
        texts
    }

    /// Which previous outputs the headers read.
    pub(crate) fn header_outputs(&self) -> OutputUse {
        let mut used = OutputUse::None;
        for text in self.headers.iter().flat_map(|h| h.template.texts()) {
            used.merge(text.outputs());
        }
        used
    }

    /// The secret names the step reads.
    pub(crate) fn secrets(&self) -> BTreeSet<String> {
        self.texts().into_iter().flat_map(|t| t.secrets().iter().cloned()).collect()
    }

    /// `outputs` as they may be shown: [`REDACTED`] for one the next step's
    /// headers read or one that holds a secret.
    pub(crate) fn shown_outputs(
        &self,
        outputs: &BTreeMap<String, String>,
        redactor: &Redactor,
    ) -> BTreeMap<String, String> {
        outputs
            .iter()
            .map(|(name, value)| {
                let hidden = self.outputs_in_headers.includes(name) || redactor.hides(value);
                (name.clone(), if hidden { REDACTED.to_string() } else { value.clone() })
            })
            .collect()
    }

    /// Renders and runs the step. Never returns early without an
    /// [`Outcome`]: the caller logs and records every step, win or lose.
    pub(crate) async fn run(&self, scope: Scope, env: &StepEnv<'_>) -> Outcome {
        let prepared = self
            .render(&scope)
            .map_err(|error| (self.endpoint_source.clone(), error))
            .and_then(|rendered| self.prepare(rendered, env.redactor));
        drop(scope);
        let (prepared, shown) = match prepared {
            Ok(prepared) => prepared,
            Err((endpoint, error)) => return self.outcome(endpoint, 0, None, BTreeMap::new(), Err(error)),
        };
        if self.is_async {
            self.run_async(prepared, shown, env).await
        } else {
            self.run_awaited(prepared, shown, env).await
        }
    }

    /// Executes every template (the shared half of running and of `kayra render`).
    pub(crate) fn render(&self, scope: &Scope) -> Result<Rendered, PipelineError> {
        let step = self.index;
        let render_error = |e: TemplateError| PipelineError::Render { step, field: e.field, message: e.message };
        let endpoint = self.endpoint.render(scope).map_err(render_error)?;
        let mut headers = Vec::with_capacity(self.headers.len() + 1);
        for header in &self.headers {
            let text = match &header.template {
                HeaderTemplate::Plain(value) => value.render(scope),
                HeaderTemplate::Typed { kind, value } => {
                    kind.render(scope).and_then(|k| Ok(format!("{k} {}", value.render(scope)?)))
                }
            }
            .map_err(render_error)?;
            headers.push((header.written.clone(), text));
        }
        let body = self.data.as_ref().map(|data| data.render(scope)).transpose().map_err(render_error)?;
        if body.is_some() && self.default_content_type {
            headers.push(("Content-Type".to_string(), "application/json".to_string()));
        }
        Ok(Rendered { endpoint, headers, body })
    }

    /// Turns rendered text into a request, and the endpoint as it may be
    /// shown; on failure, the endpoint to show and the error.
    fn prepare(&self, rendered: Rendered, redactor: &Redactor) -> Result<(Prepared, String), (String, PipelineError)> {
        let step = self.index;
        let hidden = redactor.hides(&rendered.endpoint);
        // Checked before anything is sent: a refused endpoint is never called.
        let url = check_url(&rendered.endpoint).map_err(|message| {
            // The rendered text might carry user info; its source does not.
            let shown = if hidden { REDACTED.to_string() } else { self.endpoint_source.clone() };
            (shown, PipelineError::InvalidRequest { step, message: format!("endpoint: {message}") })
        })?;
        let shown = shown_url(&url);
        let shown = if hidden || redactor.hides(&shown) { REDACTED.to_string() } else { shown };
        let fail = |error: PipelineError| (shown.clone(), error);

        let mut headers = HeaderMap::with_capacity(rendered.headers.len());
        for (written, text) in &rendered.headers {
            // Names were checked at compile time; the default one is valid.
            let name = HeaderName::from_bytes(written.as_bytes()).map_err(|_| {
                fail(PipelineError::InvalidRequest { step, message: format!("header {written}: invalid name") })
            })?;
            // The error names the header only: its value may be a token.
            let value = HeaderValue::from_str(text).map_err(|_| {
                fail(PipelineError::InvalidRequest {
                    step,
                    message: format!("header {name}: rendered value is not a valid HTTP header value"),
                })
            })?;
            headers.insert(name, value);
        }
        let body = match &rendered.body {
            None => None,
            Some(json) => Some(bytes::Bytes::from(serde_json::to_vec(json).map_err(|_| {
                fail(PipelineError::InvalidRequest { step, message: "data could not be encoded as JSON".into() })
            })?)),
        };
        Ok((Prepared { method: self.method.clone(), url, headers, body }, shown))
    }

    async fn run_awaited(&self, prepared: Prepared, endpoint: String, env: &StepEnv<'_>) -> Outcome {
        let step = self.index;
        let timeout = self.timeout;
        let started = Instant::now();
        // `timeout` is at most a day (config validation); the fallback only
        // keeps a hypothetical overflow from panicking.
        let deadline = started.checked_add(timeout).unwrap_or_else(far_future);
        let mut attempts = 0;
        // What `wait` saw in the previous answer, if there was one.
        let mut last_seen: Option<String> = None;
        loop {
            attempts += 1;
            // A stop drops the call in flight (platform §12).
            let sent = tokio::select! {
                biased;
                () = env.control.stop.cancelled() => None,
                sent = tokio::time::timeout_at(deadline, prepared.send(env.client)) => Some(sent),
            };
            let Some(sent) = sent else {
                let status = None;
                return self.timed(started, endpoint, attempts, status, BTreeMap::new(), Err(PipelineError::Stopped));
            };
            let answer = match sent {
                Err(_) => {
                    // Cut off mid-poll, the step failed for want of a
                    // resolved condition, and that is what to report.
                    let error = match last_seen {
                        Some(last) => PipelineError::WaitTimeout { step, timeout, attempts, last },
                        None => PipelineError::Timeout { step, timeout },
                    };
                    return self.timed(started, endpoint, attempts, None, BTreeMap::new(), Err(error));
                }
                Ok(Err(source)) => {
                    let error = PipelineError::Transport { step, source };
                    return self.timed(started, endpoint, attempts, None, BTreeMap::new(), Err(error));
                }
                Ok(Ok(answer)) => answer,
            };
            let status = Some(answer.status);
            if !answer.status.is_success() {
                let error = PipelineError::Status { step, status: answer.status.as_u16() };
                let mut outcome = self.timed(started, endpoint, attempts, status, BTreeMap::new(), Err(error));
                outcome.retry_after = answer.retry_after;
                return outcome;
            }
            let outputs = match self.extract_outputs(&answer, env.settings.max_output_bytes) {
                Ok(outputs) => outputs,
                Err(error) => return self.timed(started, endpoint, attempts, status, BTreeMap::new(), Err(error)),
            };
            let last = match self.evaluate(answer.json.as_ref(), env.redactor) {
                Verdict::Done => return self.timed(started, endpoint, attempts, status, outputs, Ok(())),
                Verdict::Failed { key, value } => {
                    let error = PipelineError::WaitFailed { step, key, value };
                    return self.timed(started, endpoint, attempts, status, outputs, Err(error));
                }
                Verdict::NotYet(last) => last,
            };
            let next_poll = Instant::now().checked_add(env.settings.wait_poll_interval).unwrap_or_else(far_future);
            if next_poll >= deadline {
                let error = PipelineError::WaitTimeout { step, timeout, attempts, last };
                return self.timed(started, endpoint, attempts, status, outputs, Err(error));
            }
            last_seen = Some(last);
            tokio::select! {
                biased;
                () = env.control.stop.cancelled() => {
                    return self.timed(started, endpoint, attempts, status, outputs, Err(PipelineError::Stopped));
                }
                () = env.control.superseded.cancelled() => {
                    return self.timed(started, endpoint, attempts, status, outputs, Err(PipelineError::Superseded));
                }
                () = tokio::time::sleep_until(next_poll) => {}
            }
            // Superseded while the last call was in flight: no further poll.
            if env.control.superseded.is_cancelled() {
                return self.timed(started, endpoint, attempts, status, outputs, Err(PipelineError::Superseded));
            }
        }
    }

    async fn run_async(&self, prepared: Prepared, endpoint: String, env: &StepEnv<'_>) -> Outcome {
        let step = self.index;
        let started = Instant::now();
        let client = env.client.clone();
        let timeout = self.timeout;
        let ack = env.settings.async_ack_timeout;
        let owner = Owner {
            step,
            endpoint: endpoint.clone(),
            lock_id: env.ctx.lock_id,
            sync_id: env.ctx.expected_sync_id.clone(),
            run_id: env.ctx.run_id.clone(),
        };
        // Owns everything it needs, so it can outlive this step (see the
        // module docs); bounded by the step's own timeout.
        let mut registered =
            env.detached.spawn(owner, async move { tokio::time::timeout(timeout, prepared.send(&client)).await });
        let acked = tokio::select! {
            biased;
            () = env.control.stop.cancelled() => None,
            acked = tokio::time::timeout(ack, &mut registered.task) => Some(acked),
        };
        let Some(acked) = acked else {
            // Stopped while waiting for the acknowledgement: the request is
            // dropped, not detached (platform §12).
            registered.task.abort();
            return self.timed(started, endpoint, 1, None, BTreeMap::new(), Err(PipelineError::Stopped));
        };
        let (status, outputs, result, retry_after) = match acked {
            Err(_) => {
                env.detached.detach(registered);
                (None, BTreeMap::new(), Err(PipelineError::NoAck { step, ack }), None)
            }
            Ok(Err(_join)) => (None, BTreeMap::new(), Err(PipelineError::TaskFailed { step }), None),
            Ok(Ok(Err(_elapsed))) => (None, BTreeMap::new(), Err(PipelineError::Timeout { step, timeout }), None),
            Ok(Ok(Ok(Err(source)))) => (None, BTreeMap::new(), Err(PipelineError::Transport { step, source }), None),
            Ok(Ok(Ok(Ok(answer)))) if !answer.status.is_success() => {
                let error = PipelineError::Status { step, status: answer.status.as_u16() };
                (Some(answer.status), BTreeMap::new(), Err(error), answer.retry_after)
            }
            Ok(Ok(Ok(Ok(answer)))) => match self.extract_outputs(&answer, env.settings.max_output_bytes) {
                Ok(outputs) => (Some(answer.status), outputs, Ok(()), None),
                Err(error) => (Some(answer.status), BTreeMap::new(), Err(error), None),
            },
        };
        let mut outcome = self.timed(started, endpoint, 1, status, outputs, result);
        outcome.retry_after = retry_after;
        outcome
    }

    /// Every configured output whose path resolves; the others are
    /// skipped. One longer than `max` bytes fails the step (§17): a
    /// backend cannot push a value of any size into the next step's
    /// request, the run record or the logs.
    fn extract_outputs(&self, answer: &Answer, max: usize) -> Result<BTreeMap<String, String>, PipelineError> {
        let Some(body) = &answer.json else {
            return Ok(BTreeMap::new());
        };
        let mut outputs = BTreeMap::new();
        for (name, path) in &self.outputs {
            let Some(value) = path.resolve_text(body) else { continue };
            if value.len() > max {
                return Err(PipelineError::OutputTooLarge {
                    step: self.index,
                    name: name.clone(),
                    len: value.len(),
                    max,
                });
            }
            outputs.insert(name.clone(), value);
        }
        Ok(outputs)
    }

    /// Any condition in its failures fails at once, whatever the others say;
    /// done only when every condition is in its successes. The values a
    /// verdict quotes came from the backend and end up in an error: one
    /// that holds a secret, in any form, is [`REDACTED`].
    fn evaluate(&self, body: Option<&serde_json::Value>, redactor: &Redactor) -> Verdict {
        if self.wait.is_empty() {
            return Verdict::Done;
        }
        let Some(body) = body else {
            return Verdict::NotYet("response body is not JSON".into());
        };
        let values: Vec<Option<String>> = self.wait.iter().map(|c| c.key.resolve_text(body)).collect();
        for (condition, value) in self.wait.iter().zip(&values) {
            if let Some(value) = value.as_ref().filter(|v| condition.failures.contains(v)) {
                return Verdict::Failed { key: condition.key.to_string(), value: redactor.field(value.clone()) };
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
                Some(v) => format!("{}={:?}", c.key, redactor.field(v.clone())),
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
        Outcome { endpoint, attempts, status, outputs, result, duration: Duration::ZERO, retry_after: None }
    }

    fn timed(
        &self,
        started: Instant,
        endpoint: String,
        attempts: u32,
        status: Option<StatusCode>,
        outputs: BTreeMap<String, String>,
        result: Result<(), PipelineError>,
    ) -> Outcome {
        Outcome { duration: started.elapsed(), ..self.outcome(endpoint, attempts, status, outputs, result) }
    }
}

/// A deadline that never comes (about 30 years away, as tokio does).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365 * 30)
}

/// Steps call http(s) backends and nothing else, at the path they name
/// (platform §17, "Rendered endpoints"): `endpoint`, as written or as
/// rendered, must be an absolute `http`/`https` URL with a host, without
/// user info, without a fragment and without a `.` or `..` path segment
/// (percent-decoded: `%2e%2e` is one too). Returns the URL to send.
///
/// A URL parser resolves dot segments (`/items/../../admin` becomes
/// `/admin`), so they are looked for in the text as written, read the way
/// the parser reads it (see [`dot_segment`]): what is sent is then exactly
/// what the template's literal path says, with rendered values inside it.
/// Used by compile (a literal endpoint), by a run before anything is sent,
/// and by `kayra render`, so all three agree.
///
/// The message never quotes the endpoint: it may carry user info or a
/// secret.
pub(crate) fn check_url(endpoint: &str) -> Result<Url, String> {
    let url = Url::parse(endpoint).map_err(|e| format!("is not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.has_host() => {}
        "http" | "https" => return Err("the URL has no host".into()),
        other => return Err(format!("unsupported scheme {other:?}; use http or https")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the URL has user info; send credentials in a header".into());
    }
    if let Some(segment) = dot_segment(endpoint) {
        return Err(format!(
            "the URL has a {segment:?} path segment (percent-decoded); pass a value that may hold '/' through \
             pathescape"
        ));
    }
    if url.fragment().is_some() {
        return Err("the URL has a fragment (#); pass a value that may hold '#' through pathescape or urlquery".into());
    }
    Ok(url)
}

/// The first `.` or `..` segment of `endpoint`'s path, percent-decoded.
///
/// The path is found as the WHATWG URL parser finds it for http(s):
/// leading and trailing C0 controls and spaces are ignored, tabs and
/// newlines anywhere; after the scheme's `:`, any run of `/` and `\`
/// starts the authority, which ends at the first `/`, `\`, `?` or `#`; the
/// path ends at `?` or `#`; segments are separated by `/` and `\`.
fn dot_segment(endpoint: &str) -> Option<&'static str> {
    let cleaned: String =
        endpoint.trim_matches(|c: char| c <= ' ').chars().filter(|c| !matches!(c, '\t' | '\n' | '\r')).collect();
    let (_scheme, rest) = cleaned.split_once(':')?;
    let rest = rest.trim_start_matches(['/', '\\']);
    let rest = &rest[rest.find(['/', '\\', '?', '#'])?..];
    let path = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    path.split(['/', '\\']).find_map(|segment| match percent_decode(segment.as_bytes(), false).as_slice() {
        b"." => Some("."),
        b".." => Some(".."),
        _ => None,
    })
}

impl fmt::Debug for CompiledStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Header values and data are left out: they may hold secrets.
        f.debug_struct("CompiledStep")
            .field("index", &self.index)
            .field("method", &self.method)
            .field("endpoint", &self.endpoint_source)
            .field("headers", &self.headers.iter().map(|h| &h.name).collect::<Vec<_>>())
            .field("data", &self.data.is_some())
            .field("timeout", &self.timeout)
            .field("async", &self.is_async)
            .field("outputs", &self.outputs)
            .field("wait", &self.wait.iter().map(|c| &c.key).collect::<Vec<_>>())
            .finish()
    }
}
