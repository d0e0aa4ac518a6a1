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

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode, Url};

/// The largest response body a step reads.
pub(crate) const MAX_RESPONSE_BODY: usize = 4 * 1024 * 1024;

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
}

impl Prepared {
    /// Sends the request once and reads its answer. No timeout here: the
    /// caller bounds the whole attempt, body included.
    pub(crate) async fn send(&self, client: &reqwest::Client) -> Result<Answer, reqwest::Error> {
        let mut request = client.request(self.method.clone(), self.url.clone()).headers(self.headers.clone());
        if let Some(body) = &self.body {
            request = request.body(body.clone());
        }
        let mut response = request.send().await?;
        let status = response.status();
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
        Ok(Answer { status, json })
    }
}

/// The endpoint as logged: the rendered URL without a userinfo password.
///
/// Endpoints must not carry secrets (tokens belong in headers, which are
/// never logged); this only limits the damage when one does anyway.
pub(crate) fn redact(url: &Url) -> String {
    if url.password().is_none() {
        return url.to_string();
    }
    let mut shown = url.clone();
    // Fails only for URLs that cannot have a password, which this one has.
    let _ = shown.set_password(Some("redacted"));
    shown.to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_endpoints_are_redacted() {
        let url = Url::parse("https://user:hunter2@h.example/p?q=1").unwrap();
        let shown = redact(&url);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("user:redacted@h.example/p?q=1"), "{shown}");
        assert_eq!(redact(&Url::parse("http://h/x").unwrap()), "http://h/x");
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
