//! The record of one gateway request: one access-log line and its metrics.
//!
//! An [`Exchange`] is created when a request arrives, learns what the
//! request turned out to be as the steps run, and logs one line when it is
//! dropped. For a forwarded request it rides along with the response body
//! (see `forward::hold_until_done`), so the line is written when the body
//! has been streamed (or the caller went away) and its `duration_ms` covers
//! the whole exchange. The metrics are recorded once the response head is
//! known, so the latency histogram measures how long callers wait for an
//! answer, not how long they take to download it.
//!
//! Only names go into the line — method, api, namespace, resource, user,
//! status — never a header value or a token. The `api` metric label is the
//! registration's long name once step 2 found one and `unknown` before
//! that, so a caller cannot mint label values by inventing API names.
//!
//! Metrics: [`REQUESTS`] `{api, code}` and [`DURATION`] `{api}`.

use std::time::Instant;

use axum::http::{Method, StatusCode};

use super::path::Target;

/// Counter: gateway requests by `api` and `code`.
pub const REQUESTS: &str = "kayra_gateway_requests_total";
/// Histogram: seconds until the response head, by `api`.
pub const DURATION: &str = "kayra_gateway_request_duration_seconds";

/// The status logged when the caller hung up before any answer (nginx's 499).
const CALLER_GONE: u16 = 499;
/// The `api` label before the registration is known.
const UNKNOWN_API: &str = "unknown";

/// One gateway request, from arrival until its response body is done.
pub(crate) struct Exchange {
    started: Instant,
    method: Method,
    /// The user, once authenticated.
    user: String,
    /// The path's parts, once parsed: what the caller asked for.
    api: String,
    namespace: String,
    resource: String,
    /// The registration's long name, once step 2 found it: the metric label.
    registration: Option<String>,
    /// The answer's status, once there is one.
    status: Option<StatusCode>,
}

impl Exchange {
    pub(crate) fn begin(method: Method) -> Self {
        Self {
            started: Instant::now(),
            method,
            user: String::new(),
            api: String::new(),
            namespace: String::new(),
            resource: String::new(),
            registration: None,
            status: None,
        }
    }

    pub(crate) fn authenticated(&mut self, user: &str) {
        self.user = user.to_string();
    }

    pub(crate) fn target(&mut self, target: &Target<'_>) {
        self.api = target.api.to_string();
        self.namespace = target.namespace.to_string();
        self.resource = target.resource.to_string();
    }

    pub(crate) fn resolved(&mut self, registration: &str) {
        self.registration = Some(registration.to_string());
    }

    /// The response head is ready: counts it and records its latency.
    pub(crate) fn answered(&mut self, status: StatusCode) {
        self.status = Some(status);
        metrics::counter!(REQUESTS, "api" => self.api_label(), "code" => status.as_str().to_string()).increment(1);
        metrics::histogram!(DURATION, "api" => self.api_label()).record(self.started.elapsed().as_secs_f64());
    }

    fn api_label(&self) -> String {
        self.registration.clone().unwrap_or_else(|| UNKNOWN_API.to_string())
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let status = match self.status {
            Some(status) => status.as_u16(),
            None => {
                metrics::counter!(REQUESTS, "api" => self.api_label(), "code" => CALLER_GONE.to_string()).increment(1);
                CALLER_GONE
            }
        };
        let duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            method = self.method.as_str(),
            api = self.api.as_str(),
            namespace = self.namespace.as_str(),
            resource = self.resource.as_str(),
            status,
            user = self.user.as_str(),
            duration_ms,
            "gateway request"
        );
    }
}
