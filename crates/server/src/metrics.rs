//! `/metrics`: Prometheus text format (§8) — every request counted by
//! method, route template and status code, and its latency in a histogram.
//!
//! Routes are labelled by their template (`/apis/catalog.example.com/v1/
//! namespaces/{namespace}`), never by the concrete path, so the number of
//! series stays bounded whatever callers send; requests that match no
//! route share the label `unmatched`.
//!
//! The `metrics` facade has one recorder per process. [`handle`] installs
//! kayra's Prometheus recorder on first use and hands out the same handle
//! afterwards, so several servers in one process (tests) share it; the
//! reconciler process uses the same recorder for its own metrics.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

/// Counter: requests by `method`, `route` and `code`.
pub const REQUESTS: &str = "kayra_http_requests_total";
/// Histogram: request latency in seconds by `method` and `route`.
pub const DURATION: &str = "kayra_http_request_duration_seconds";

/// Buckets (seconds) of every histogram of a kayra process: a store read is
/// ~1ms, an etcd write ~1–10ms, a gateway call or a lock wait up to a minute,
/// a reconcile running HTTP step pipelines up to an hour.
const BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0];

/// A metric a process exposes, for [`describe`].
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    /// The `# HELP` text.
    pub help: &'static str,
    /// Label sets to show at zero from startup; `&[&[]]` for an unlabelled
    /// metric. Labels whose values are only known later (a route, an api)
    /// get one representative set, so the metric is never absent.
    pub zero: &'static [&'static [(&'static str, &'static str)]],
}

/// The kind of a [`Metric`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// `kayra serve`'s metrics.
pub const SERVE: &[Metric] = &[
    Metric {
        name: REQUESTS,
        kind: Kind::Counter,
        help: "HTTP requests answered, by method, route template and status code.",
        zero: &[&[("method", "GET"), ("route", "/healthz"), ("code", "200")]],
    },
    Metric {
        name: DURATION,
        kind: Kind::Histogram,
        help: "Seconds until an HTTP request was answered, by method and route template.",
        zero: &[&[("method", "GET"), ("route", "/healthz")]],
    },
    Metric {
        name: crate::gateway::REQUESTS,
        kind: Kind::Counter,
        help: "Gateway requests, by api (the registration's long name, or unknown) and status code.",
        zero: &[&[("api", "unknown"), ("code", "200")]],
    },
    Metric {
        name: crate::gateway::DURATION,
        kind: Kind::Histogram,
        help: "Seconds until a gateway request's response head, by api.",
        zero: &[&[("api", "unknown")]],
    },
];

/// Describes `metrics` (`# HELP`, `# TYPE`) and makes each present from now
/// on: counters and gauges at 0, histograms with no samples. Installs the
/// recorder first if needed; idempotent (a counter already counting keeps
/// its value).
pub fn describe(metrics: &[Metric]) {
    let _ = handle();
    for metric in metrics {
        for labels in metric.zero {
            let labels: Vec<metrics::Label> = labels.iter().map(|&(k, v)| metrics::Label::new(k, v)).collect();
            match metric.kind {
                Kind::Counter => {
                    metrics::describe_counter!(metric.name, metric.help);
                    metrics::counter!(metric.name, labels).increment(0);
                }
                Kind::Gauge => {
                    metrics::describe_gauge!(metric.name, metric.help);
                    metrics::gauge!(metric.name, labels).increment(0.0);
                }
                Kind::Histogram => {
                    metrics::describe_histogram!(metric.name, metric.help);
                    let _ = metrics::histogram!(metric.name, labels);
                }
            }
        }
    }
}

/// The `method` label of a request: bounded whatever the caller sends.
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    const KNOWN: [(Method, &str); 7] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::PATCH, "PATCH"),
        (Method::DELETE, "DELETE"),
        (Method::OPTIONS, "OPTIONS"),
    ];
    KNOWN.iter().find(|(known, _)| known == method).map_or("other", |(_, label)| label)
}

/// How often histogram samples are folded in when nobody scrapes.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The process's Prometheus handle, installing the recorder on first use.
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            // Only fails for an empty bucket list, which BUCKETS is not;
            // without buckets a histogram would render as a summary.
            let builder = builder.set_buckets(BUCKETS).unwrap_or_default();
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is already installed; /metrics will stay empty");
            }
            handle
        })
        .clone()
}

/// Middleware counting and timing every request. Layer it on the whole
/// router (with `Router::layer`) so it sees the matched route template.
pub async fn track(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned());
    let route = route.filter(|r| !r.contains("__private__")).unwrap_or_else(|| "unmatched".to_owned());
    let method = method_label(request.method());
    let response = next.run(request).await;
    let code = response.status().as_u16().to_string();
    metrics::histogram!(DURATION, "method" => method, "route" => route.clone()).record(started.elapsed().as_secs_f64());
    metrics::counter!(REQUESTS, "method" => method, "route" => route, "code" => code).increment(1);
    response
}

/// Folds histogram samples in periodically, so memory stays bounded even
/// when nobody scrapes `/metrics`.
pub async fn upkeep(handle: PrometheusHandle, stopping: CancellationToken) {
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(UPKEEP_INTERVAL) => handle.run_upkeep(),
        }
    }
}
