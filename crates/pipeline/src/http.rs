//! The HTTP side of a step: the shared client, one rendered request, and
//! one attempt at it.
//!
//! Redirects are not followed. A step's headers routinely carry tokens under
//! names reqwest does not know to strip on a cross-host redirect
//! (`PRIVATE-TOKEN`), so following one could hand a token to another host.
//! A 3xx is therefore just a non-2xx answer, which fails a non-async step.
//!
//! A response body is read up to [`MAX_RESPONSE_BODY`]; a larger one is
//! treated as not JSON (no outputs, `wait` says "not yet"), which bounds
//! the memory a misbehaving backend can make a reconcile hold.

use std::error::Error as StdError;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};

/// The largest response body a step reads.
pub(crate) const MAX_RESPONSE_BODY: usize = 4 * 1024 * 1024;

/// The longest `Retry-After` honoured: a backend asking for more is asked
/// again after this, so one bad answer cannot stop a mode for days.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The client every reconcile shares, so connections to a backend are reused
/// across steps and subscriptions.
///
/// Installs rustls' `ring` provider first (reqwest is built without one);
/// installing is idempotent and a provider installed by someone else wins.
///
/// # Panics
///
/// If the TLS backend cannot be initialised, which is a broken build rather
/// than a runtime condition; it happens on the first call, at startup.
pub fn http_client() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
            reqwest::Client::builder()
                .user_agent(concat!("kayra-reconciler/", env!("CARGO_PKG_VERSION")))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("the HTTP client's TLS backend initialises")
        })
        .clone()
}

/// A rendered request, kept so `wait` can send it again unchanged.
#[derive(Clone)]
pub(crate) struct Prepared {
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Option<bytes::Bytes>,
}

/// What one attempt got back.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    /// The body parsed as JSON; `None` when it is empty, not JSON, or over
    /// [`MAX_RESPONSE_BODY`].
    pub(crate) json: Option<serde_json::Value>,
    /// A 429's `Retry-After`, as a delay from now.
    pub(crate) retry_after: Option<Duration>,
}

impl Prepared {
    /// Sends the request once and reads its answer. No timeout here: the
    /// caller bounds the whole attempt, body included. An error carries no
    /// URL: the rendered endpoint may hold user info or a secret, and the
    /// step's own log line shows the endpoint as it may be shown.
    pub(crate) async fn send(&self, client: &reqwest::Client) -> Result<Answer, reqwest::Error> {
        self.send_once(client).await.map_err(reqwest::Error::without_url)
    }

    async fn send_once(&self, client: &reqwest::Client) -> Result<Answer, reqwest::Error> {
        let mut request = client.request(self.method.clone(), self.url.clone()).headers(self.headers.clone());
        if let Some(body) = &self.body {
            request = request.body(body.clone());
        }
        let mut response = request.send().await?;
        let status = response.status();
        let retry_after = if status == StatusCode::TOO_MANY_REQUESTS {
            parse_retry_after(response.headers(), SystemTime::now())
        } else {
            None
        };
        let mut body = Vec::new();
        let mut too_large = false;
        while let Some(chunk) = response.chunk().await? {
            if body.len() + chunk.len() > MAX_RESPONSE_BODY {
                too_large = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let json = if too_large { None } else { serde_json::from_slice(&body).ok() };
        Ok(Answer { status, json, retry_after })
    }
}

/// `Retry-After` as delay-seconds or an HTTP date (RFC 9110 §10.2.3),
/// capped at [`MAX_RETRY_AFTER`]; a date in the past is no delay.
pub(crate) fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value).ok()?.duration_since(now).unwrap_or(Duration::ZERO),
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// The endpoint as shown in logs, run records and errors: the rendered URL
/// without user info (platform §8: no URL user info is ever shown).
pub(crate) fn shown_url(url: &Url) -> String {
    if url.username().is_empty() && url.password().is_none() {
        return url.to_string();
    }
    let mut shown = url.clone();
    // Both fail only for URLs that cannot have user info, which this one has.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

/// `%XX` decoded (and `+` as a space when `plus`); anything else kept.
pub(crate) fn percent_decode(text: &[u8], plus: bool) -> Vec<u8> {
    let hex = |b: Option<&u8>| b.and_then(|&b| char::from(b).to_digit(16));
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'%'
            && let (Some(hi), Some(lo)) = (hex(text.get(i + 1)), hex(text.get(i + 2)))
        {
            // Two hex digits make a byte.
            out.push(u8::try_from(hi << 4 | lo).unwrap_or(b'%'));
            i += 3;
            continue;
        }
        out.push(if plus && text[i] == b'+' { b' ' } else { text[i] });
        i += 1;
    }
    out
}

/// An error with its sources, `a: b: c`, for the step's log line.
pub(crate) fn error_chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // hyper and reqwest sometimes repeat their source's text.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Go's `url.PathEscape`: every byte but the unreserved characters
/// (`A-Z a-z 0-9 - _ . ~`) and `$ & + : = @` becomes `%XX` (upper-case
/// hex), so the result is one path segment: no `/`, `?`, `#`, `;` or `,`.
pub(crate) fn path_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(char::from(byte)),
            b'$' | b'&' | b'+' | b':' | b'=' | b'@' => out.push(char::from(byte)),
            _ => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xf)]));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_is_never_shown() {
        let shown = |u: &str| shown_url(&Url::parse(u).unwrap());
        assert_eq!(shown("https://user:hunter2@h.example/p?q=1"), "https://h.example/p?q=1");
        assert_eq!(shown("https://tokenonly@h.example/p"), "https://h.example/p");
        assert_eq!(shown("http://h/x"), "http://h/x");
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let parse = |v: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, v.parse().unwrap());
            parse_retry_after(&headers, now)
        };
        assert_eq!(parse("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(parse(&httpdate::fmt_http_date(now + Duration::from_secs(30))), Some(Duration::from_secs(30)));
        assert_eq!(parse(&httpdate::fmt_http_date(now - Duration::from_secs(30))), Some(Duration::ZERO));
        assert_eq!(parse("99999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse("soon"), None);
        assert_eq!(parse("-1"), None);
        assert_eq!(parse_retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn error_chains_join_sources() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("request failed")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
        assert_eq!(error_chain(&e), "request failed: connection refused");
    }
}
