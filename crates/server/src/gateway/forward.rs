//! Step 6: forwarding one request to an API's backend, streaming both ways.
//!
//! Bodies are never buffered: the caller's body is handed to reqwest as a
//! stream and the backend's body is handed back to hyper as a stream, so a
//! gateway request holds at most a few chunks in memory however large the
//! body is, and a backend may start answering before the upload ends.
//! `server.max_body_bytes` is about the catalog's JSON bodies; gateway
//! bodies are the backend's business and have no limit here.
//!
//! Headers pass through both ways except the hop-by-hop ones (RFC 9110
//! §7.6.1: they describe one connection, not the message, including any
//! header the `Connection` header names) and, toward the backend, the
//! caller's `Authorization` (a kayra token is no business of a backend) and
//! `Expect` (hyper already answered `100-continue` to the caller). The
//! backend learns who is calling from `X-Kayra-User` and
//! `X-Kayra-Namespace`, and where the request came from from
//! `X-Forwarded-For`, `-Proto` and `-Host`, all set by kayra: every caller
//! header named `X-Kayra-*`, `X-Forwarded-*` or `Forwarded` is dropped,
//! names compared with `_` and `-` alike (WSGI and CGI backends read
//! `X_Kayra_User` as `X-Kayra-User` and would join both values).
//!
//! Cookies do not cross: every backend shares kayra's origin, so a
//! `Set-Cookie` from one backend would be sent by browsers to every other
//! backend and to kayra itself, and a caller's `Cookie` (a web console
//! session, another backend's cookie) is no business of this backend.
//! `Cookie` is dropped toward backends and `Set-Cookie` on the way back.
//! For the same reason every answer carries `Content-Security-Policy:
//! sandbox` (added to any policy of the backend's, since browsers enforce
//! every policy given) and `X-Content-Type-Options: nosniff`: a page a
//! backend serves runs in an opaque origin, so its scripts cannot read the
//! web console's token from kayra's origin or call kayra as the user.
//!
//! Framing is hyper's: a message that arrived chunked never keeps a
//! `Content-Length` (RFC 9112 §6.3: with `Transfer-Encoding` it must be
//! ignored), so the next hop cannot be made to read a different body
//! length than this hop did.
//!
//! The response timeout (60s, [`super::DEFAULT_RESPONSE_TIMEOUT`]) is the
//! time the backend may go without progress before its response headers
//! arrive: it restarts whenever a chunk of the request body is forwarded,
//! so a slow multi-gigabyte upload is not cut off while it is still moving,
//! and once the body is sent the backend has the full timeout to answer.
//! After the headers, the response body streams for as long as it takes.

use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::request::Parts;
use axum::response::Response;
use futures::StreamExt;
use reqwest::Url;
use tokio::sync::watch;

use kayra_catalog::api::error::ApiError;

/// `X-Kayra-User`: the authenticated user the request is made for.
pub const USER_HEADER: HeaderName = HeaderName::from_static("x-kayra-user");
/// `X-Kayra-Namespace`: the namespace the request is made into.
pub const NAMESPACE_HEADER: HeaderName = HeaderName::from_static("x-kayra-namespace");

/// Hop-by-hop headers (RFC 9110 §7.6.1) and `Host`, which belongs to the
/// next hop's URL. `Proxy-*` is matched by prefix in [`strip_hop_by_hop`].
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HOST,
];

/// Who a forwarded request is made for, and where it came from.
pub(crate) struct Identity<'a> {
    pub user: &'a str,
    pub namespace: &'a str,
    /// The connection it came on; absent when served without kayra's listener.
    pub origin: Option<crate::listener::Peer>,
}

/// Why forwarding failed, as the caller is told.
pub(crate) enum Failure {
    /// The registration has no usable endpoint (see [`backend_url`]): 503.
    NoEndpoint,
    /// The URL to the backend would not carry the checked path unchanged: 400.
    NotForwardable,
    /// The backend could not be reached or broke off: 502.
    Unreachable(reqwest::Error),
    /// The backend did not answer in time: 504.
    Timeout,
    /// A stored name is not a valid header value (validation let it in): 500.
    Internal,
}

/// Sends the request (`parts`, `body`) to `url` and returns the backend's
/// response, its body still streaming.
pub(crate) async fn forward(
    client: &reqwest::Client,
    url: Url,
    parts: Parts,
    body: Body,
    identity: Identity<'_>,
    timeout: Duration,
) -> Result<Response, Failure> {
    let headers = request_headers(parts.headers, &identity).ok_or(Failure::Internal)?;

    let mut request = reqwest::Request::new(parts.method, url);
    *request.headers_mut() = headers;
    // A request without a body must stay without one: a wrapped stream would
    // turn every GET into a chunked request with an empty body.
    let (progress, progress_seen) = watch::channel(());
    if !body.is_end_stream() {
        let stream = body.into_data_stream().inspect(move |_| {
            progress.send_replace(());
        });
        *request.body_mut() = Some(reqwest::Body::wrap_stream(stream));
    }

    let mut answer = tokio::select! {
        answer = client.execute(request) => answer.map_err(Failure::Unreachable)?,
        () = backend_silent(progress_seen, timeout) => return Err(Failure::Timeout),
    };

    let status = answer.status();
    let mut headers = std::mem::take(answer.headers_mut());
    drop_content_length_if_chunked(&mut headers);
    strip_hop_by_hop(&mut headers);
    headers.remove(header::SET_COOKIE);
    headers.append(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("sandbox"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Ok(response)
}

/// Completes once the backend has gone `limit` without progress: no chunk
/// of the request body forwarded, and (once the body is sent, or when there
/// is none) no response headers.
async fn backend_silent(mut progress: watch::Receiver<()>, limit: Duration) {
    loop {
        match tokio::time::timeout(limit, progress.changed()).await {
            Ok(Ok(())) => continue,
            // The body stream is gone: sent (or failed); the clock runs out once more.
            Ok(Err(_)) => return tokio::time::sleep(limit).await,
            Err(_) => return,
        }
    }
}

/// `endpoint` (a base URL, maybe with a path prefix) + the original path
/// and query, exactly: a URL parser normalises (`\` becomes `/`, dot
/// segments resolve, some bytes get percent-encoded), so the result is
/// checked to carry the path and query byte for byte, and refused
/// otherwise — what the gateway checked is what the backend gets.
pub(crate) fn backend_url(endpoint: &str, uri: &axum::http::Uri) -> Result<Url, Failure> {
    let endpoint = endpoint.trim().trim_end_matches('/');
    if endpoint.is_empty() {
        return Err(Failure::NoEndpoint);
    }
    let base = Url::parse(endpoint).map_err(|_| Failure::NoEndpoint)?;
    if !matches!(base.scheme(), "http" | "https") || !base.has_host() {
        return Err(Failure::NoEndpoint);
    }
    let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
    let url = Url::parse(&format!("{endpoint}{path_and_query}")).map_err(|_| Failure::NotForwardable)?;
    let expected_path = format!("{}{}", base.path().trim_end_matches('/'), uri.path());
    if url.path() != expected_path || url.query() != uri.query() || url.host() != base.host() {
        return Err(Failure::NotForwardable);
    }
    Ok(url)
}

/// `X-Forwarded-For`: the caller's address.
const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`: `http` or `https`, as the caller reached kayra.
const FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`: the `Host` the caller sent to kayra.
const FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The caller's headers as the backend gets them.
fn request_headers(mut headers: HeaderMap, identity: &Identity<'_>) -> Option<HeaderMap> {
    let host = headers.get(header::HOST).cloned();
    drop_content_length_if_chunked(&mut headers);
    strip_hop_by_hop(&mut headers);
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::EXPECT);
    headers.remove(header::COOKIE);
    let spoofable: Vec<HeaderName> = headers.keys().filter(|name| is_kayras(name)).cloned().collect();
    for name in spoofable {
        headers.remove(name);
    }
    // Names are DNS labels, always valid header values; refuse rather than panic.
    headers.insert(USER_HEADER, HeaderValue::from_str(identity.user).ok()?);
    headers.insert(NAMESPACE_HEADER, HeaderValue::from_str(identity.namespace).ok()?);
    let origin = identity.origin;
    if let Some(peer) = origin {
        headers.insert(FORWARDED_FOR, HeaderValue::from_str(&peer.addr.ip().to_string()).ok()?);
    }
    let proto = if origin.is_some_and(|peer| peer.tls) { "https" } else { "http" };
    headers.insert(FORWARDED_PROTO, HeaderValue::from_static(proto));
    if let Some(host) = host {
        headers.insert(FORWARDED_HOST, host);
    }
    Some(headers)
}

/// Whether `name` is one only kayra may set toward a backend: `X-Kayra-*`,
/// `X-Forwarded-*`, `Forwarded`, with `_` read as `-`.
fn is_kayras(name: &HeaderName) -> bool {
    // Header names are stored lowercase.
    let name = name.as_str().replace('_', "-");
    name.starts_with("x-kayra-") || name.starts_with("x-forwarded-") || name == "forwarded"
}

/// A chunked message's `Content-Length` is meaningless (RFC 9112 §6.3) and,
/// forwarded next to a re-framed body, a request-smuggling vector.
fn drop_content_length_if_chunked(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
}

/// Removes hop-by-hop headers, `Proxy-*` and whatever `Connection` names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    let proxy: Vec<HeaderName> = headers.keys().filter(|name| name.as_str().starts_with("proxy-")).cloned().collect();
    for name in proxy {
        headers.remove(name);
    }
}

/// An error and its causes, for the log (reqwest's `Display` stops at the top).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Failure {
    /// The answer for a request to `api`, in the contract's error shape.
    pub(crate) fn into_api_error(self, api: &str, timeout: Duration) -> ApiError {
        use axum::http::StatusCode;
        match self {
            Failure::NoEndpoint => ApiError::unavailable(format!(
                "api {api:?} has no usable endpoint (an http or https base URL); \
                 an operator must set the endpoint of its api registration"
            )),
            Failure::NotForwardable => ApiError::bad_request(
                "the request path cannot be forwarded unchanged: it has characters a URL would rewrite; \
                 percent-encode them",
            ),
            Failure::Unreachable(error) => {
                // Logged here, once; the caller gets no internal detail. The
                // URL goes (it may carry an endpoint's user info), and any
                // user info a cause quotes is scrubbed.
                let connect = error.is_connect();
                let chain = error_chain(&error.without_url());
                let error = kayra_core::validation::scrub_userinfo(&chain);
                tracing::warn!(api, error = %error, connect, "backend request failed");
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    format!("the backend of api {api:?} could not be reached or failed to answer; retry later"),
                )
            }
            Failure::Internal => {
                tracing::error!(api, "a user or namespace name is not a valid header value");
                ApiError::internal()
            }
            Failure::Timeout => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the backend of api {api:?} did not answer within {}; retry later",
                    humantime::format_duration(timeout)
                ),
            ),
        }
    }
}

/// The response body as a stream that keeps `guard` alive until the body
/// is finished or abandoned, so whatever `guard` does on drop (the access
/// log) sees the whole exchange.
pub(crate) fn hold_until_done<G: Send + 'static>(body: Body, guard: G) -> Body {
    let stream = body.into_data_stream().map(move |chunk| {
        let _ = &guard;
        chunk
    });
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_urls_join_endpoint_and_path() {
        let uri: axum::http::Uri = "/apis/a.b/v1/namespaces/core/vms?x=1&y=%20".parse().unwrap();
        let url = |endpoint: &str| backend_url(endpoint, &uri).ok().map(String::from);
        assert_eq!(
            url("http://127.0.0.1:9000").unwrap(),
            "http://127.0.0.1:9000/apis/a.b/v1/namespaces/core/vms?x=1&y=%20"
        );
        assert_eq!(
            url("http://127.0.0.1:9000/").unwrap(),
            "http://127.0.0.1:9000/apis/a.b/v1/namespaces/core/vms?x=1&y=%20"
        );
        assert_eq!(
            url("https://h.example/base/").unwrap(),
            "https://h.example/base/apis/a.b/v1/namespaces/core/vms?x=1&y=%20"
        );
        assert_eq!(url(""), None);
        assert_eq!(url("  "), None);
        assert_eq!(url("ftp://h.example"), None);
        assert_eq!(url("not a url"), None);
        // A path a URL parser would rewrite is not forwarded at all.
        for rewritten in [
            "/apis/a.b/v1/namespaces/a/vms/..\\..\\b",
            "/apis/a.b/v1/namespaces/a/vms/x\"y",
            "/apis/a.b/v1/namespaces/a/vms/{x}",
        ] {
            let Ok(uri) = rewritten.parse::<axum::http::Uri>() else { continue };
            assert!(matches!(backend_url("http://h.example", &uri), Err(Failure::NotForwardable)), "{rewritten}");
        }
    }

    #[test]
    fn hop_by_hop_headers_and_authorization_do_not_pass() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "1"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("host", "kayra.example"),
            ("authorization", "Bearer secret"),
            ("expect", "100-continue"),
            ("x-kayra-user", "mallory"),
            ("x_kayra_user", "mallory"),
            ("x-kayra-anything", "1"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x_forwarded_host", "evil.example"),
            ("forwarded", "for=10.0.0.1"),
            ("cookie", "session=abc"),
            ("content-type", "application/json"),
            ("content-length", "12"),
            ("x-request-id", "abc"),
        ] {
            headers.append(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        let forwarded = request_headers(headers, &Identity { user: "alice", namespace: "core", origin: None }).unwrap();
        let mut names: Vec<&str> = forwarded.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        // `transfer-encoding` came with it, so `content-length` goes too.
        assert_eq!(
            names,
            [
                "content-type",
                "x-forwarded-host",
                "x-forwarded-proto",
                "x-kayra-namespace",
                "x-kayra-user",
                "x-request-id"
            ]
        );
        assert_eq!(forwarded[FORWARDED_HOST], "kayra.example");
        assert_eq!(forwarded.get_all(USER_HEADER).iter().collect::<Vec<_>>(), ["alice"]);
        assert_eq!(forwarded[NAMESPACE_HEADER], "core");
    }

    #[tokio::test]
    async fn the_backend_clock_restarts_with_request_progress() {
        let limit = Duration::from_millis(150);
        let (progress, seen) = watch::channel(());
        let started = tokio::time::Instant::now();
        let feeder = tokio::spawn(async move {
            for _ in 0..6 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                progress.send_replace(());
            }
            // Dropping the sender: the body is sent.
        });
        backend_silent(seen, limit).await;
        feeder.await.unwrap();
        // 6 × 50ms of progress, then the full limit once the body is done.
        assert!(started.elapsed() >= Duration::from_millis(300) + limit, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn the_backend_clock_runs_out_without_progress() {
        let (_progress, seen) = watch::channel(());
        let started = tokio::time::Instant::now();
        backend_silent(seen, Duration::from_millis(50)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn held_bodies_release_their_guard_when_done() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let body = hold_until_done(Body::from("hello"), tx);
        let collected: Vec<_> = body.into_data_stream().collect().await;
        assert_eq!(collected.len(), 1);
        assert!(rx.await.is_err(), "the guard was dropped with the stream");
    }
}
