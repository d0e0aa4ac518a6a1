//! The HTTP side: one authenticated client for one server, turning answers
//! into [`Body`] or [`Error`].
//!
//! - Error answers become [`Error::Api`] carrying the server's `message`
//!   (error shape `{code, reason, message}`); a body of another shape (a
//!   backend's own error through the gateway) is shown as text.
//! - Catalog lists are paged through (`continue`) so the caller always sees
//!   the whole list.
//! - The token travels only in a header marked sensitive; no message built
//!   here ever contains it, and a server that echoes it back in an error
//!   message gets it replaced by `<redacted>`.
//! - Whatever the server says in an error (`reason`, `message`, a raw body,
//!   a redirect's `Location`) has its control characters escaped: a hostile
//!   server must not drive the terminal (clear it, retitle it, forge lines).
//! - A server URL with user info is refused (exit 2) without repeating it:
//!   reqwest would send it as Basic auth next to the Bearer token.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::header::{self, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

use crate::error::{Error, invalid};
use crate::escape::escape_controls;
use crate::output::is_list;
use crate::request::{Api, Request, Target};

/// How long to wait for a TCP (and TLS) connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Error bodies that are not kayra's shape are shown up to this many characters.
const MAX_ERROR_TEXT: usize = 1000;
/// The largest answer read (a catalog list of every registration is far smaller).
const MAX_BODY: usize = 64 << 20;
/// A server that keeps answering `continue` is stopped after this many pages.
const MAX_PAGES: usize = 10_000;
/// The header carrying `--reason` (platform §13).
pub const REASON_HEADER: &str = "x-kayra-reason";
/// The longest `--reason`, in characters (platform §13).
pub const MAX_REASON: usize = 1024;

/// A successful answer's body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// No body (204, or an empty 200).
    Empty,
    /// A JSON document.
    Json(Value),
    /// Anything else, byte for byte (a gateway backend's answer).
    Raw(Vec<u8>),
}

/// An authenticated client of one kayra server.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    authorization: HeaderValue,
    /// `--reason`, sent with every request when given.
    reason: Option<HeaderValue>,
    /// Only to redact it from what the server says.
    token: String,
}

impl Client {
    /// Checks the server URL and the token; does not connect yet.
    pub fn new(server: &str, token: Option<&str>) -> Result<Client, Error> {
        let base = parse_server(server)?;
        let token = token.map(str::trim).filter(|t| !t.is_empty());
        let Some(token) = token else {
            return Err(invalid("no token: pass --token or set KAYRA_TOKEN"));
        };
        let mut authorization = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| invalid("the token contains characters an HTTP header cannot carry"))?;
        authorization.set_sensitive(true);

        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .user_agent(concat!("kayra-cli/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            // A redirect would turn a PUT into a GET; say where to point --server instead.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Transport(format!("set up the HTTP client: {}", chain(&e))))?;
        Ok(Client { http, base, authorization, reason: None, token: token.to_string() })
    }

    /// Sends `reason` as `X-Kayra-Reason` with every request. Refused
    /// before anything is sent: more than [`MAX_REASON`] characters, or a
    /// control character (a line break would end the header; the reason is
    /// shown to people reading the audit trail). An empty reason is none
    /// (`KAYRA_REASON=` unsets it).
    pub fn with_reason(mut self, reason: Option<&str>) -> Result<Client, Error> {
        self.reason = reason.filter(|r| !r.is_empty()).map(reason_header).transpose()?;
        Ok(self)
    }

    /// The server's base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// Sends one request and returns the answer's body.
    pub async fn send(&self, request: &Request) -> Result<Body, Error> {
        self.send_with_query(request, &[]).await
    }

    /// Sends a GET, and when the answer is a list with a `continue` token,
    /// fetches the remaining pages too; the result is one list with every
    /// item and an empty `continue`.
    pub async fn get_all(&self, request: &Request) -> Result<Body, Error> {
        let first = self.send_with_query(request, &[]).await?;
        let Body::Json(mut list) = first else {
            return Ok(first);
        };
        if !is_list(&list) {
            return Ok(Body::Json(list));
        }
        let mut seen = HashSet::new();
        for _ in 0..MAX_PAGES {
            let token = match list.get("continue").and_then(Value::as_str) {
                Some(token) if !token.is_empty() => token.to_string(),
                _ => return Ok(Body::Json(list)),
            };
            if !seen.insert(token.clone()) {
                return Err(Error::Transport("the server sent the same continue token twice".into()));
            }
            let page = match self.send_with_query(request, &[("continue", &token)]).await? {
                Body::Json(page) if is_list(&page) => page,
                _ => {
                    return Err(Error::Transport("a later page of the list was not a list".into()));
                }
            };
            let more = page["items"].as_array().cloned().unwrap_or_default();
            if let Some(items) = list["items"].as_array_mut() {
                items.extend(more);
            }
            list["continue"] = page.get("continue").cloned().unwrap_or_else(|| Value::String(String::new()));
        }
        Err(Error::Transport(format!("the list did not end after {MAX_PAGES} pages")))
    }

    /// Turns a short API name into the long one by listing the catalog's
    /// registrations and matching `short_name`. Other APIs are returned
    /// unchanged.
    pub async fn resolve(&self, api: &Api) -> Result<Api, Error> {
        let Api::Short(short) = api else {
            return Ok(api.clone());
        };
        let target = Target::new("catalog", None, "apiregistrations", None)?;
        let request = Request { method: Method::GET, path: target.path(), body: None };
        let Body::Json(list) = self.get_all(&request).await? else {
            return Err(Error::Transport("listing API registrations did not answer JSON".into()));
        };
        let items = list.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        items
            .iter()
            .find(|reg| reg.get("short_name").and_then(Value::as_str) == Some(short))
            .and_then(|reg| reg.get("name").and_then(Value::as_str))
            .map(|long| Api::Long(long.to_string()))
            .ok_or_else(|| {
                invalid(format!(
                    "no API registration has the short name {short:?} (see: kayra-cli get catalog apiregistrations)"
                ))
            })
    }

    /// [`Client::send`] with `query` added to the URL.
    pub async fn send_with_query(&self, request: &Request, query: &[(&str, &str)]) -> Result<Body, Error> {
        let mut url = request.url(&self.base);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut builder = self
            .http
            .request(request.method.clone(), url)
            .header(header::AUTHORIZATION, self.authorization.clone())
            .header(header::ACCEPT, "application/json");
        if let Some(reason) = &self.reason {
            builder = builder.header(REASON_HEADER, reason.clone());
        }
        if let Some(body) = &request.body {
            let bytes = serde_json::to_vec(body).map_err(|e| invalid(format!("encode the body: {e}")))?;
            builder = builder.header(header::CONTENT_TYPE, "application/json").body(bytes);
        }
        let response = builder.send().await.map_err(|e| self.transport(&e))?;
        let status = response.status();
        let location = response.headers().get(header::LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
        let bytes = self.read_body(response).await?;
        if status.is_success() {
            return Ok(body_of(&bytes));
        }
        Err(self.redacted(api_error(status, &bytes, location.as_deref())))
    }

    /// `error` without the token in it, should the server have echoed it.
    fn redacted(&self, error: Error) -> Error {
        match error {
            // Real tokens are long; a short one would redact ordinary words.
            Error::Api { status, reason, message }
                if self.token.len() >= 8 && (message.contains(&self.token) || reason.contains(&self.token)) =>
            {
                Error::Api {
                    status,
                    reason: reason.replace(&self.token, "<redacted>"),
                    message: message.replace(&self.token, "<redacted>"),
                }
            }
            other => other,
        }
    }

    /// The whole body, up to [`MAX_BODY`]: a server that never stops
    /// sending must not take the CLI's memory with it.
    async fn read_body(&self, mut response: reqwest::Response) -> Result<Vec<u8>, Error> {
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.transport(&e))? {
            if bytes.len() + chunk.len() > MAX_BODY {
                return Err(Error::Transport(format!(
                    "the answer from {} is larger than {} MiB; refusing to read more",
                    self.base,
                    MAX_BODY >> 20
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// Opens the watch stream of a catalog GET (`?watch=true`, NDJSON).
    /// An error answer becomes [`Error::Api`] as for any request.
    pub async fn watch(&self, request: &Request) -> Result<reqwest::Response, Error> {
        let mut url = request.url(&self.base);
        url.query_pairs_mut().append_pair("watch", "true");
        let mut builder = self
            .http
            .get(url)
            .header(header::AUTHORIZATION, self.authorization.clone())
            .header(header::ACCEPT, "application/x-ndjson");
        if let Some(reason) = &self.reason {
            builder = builder.header(REASON_HEADER, reason.clone());
        }
        let response = builder.send().await.map_err(|e| self.transport(&e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let bytes = response.bytes().await.map_err(|e| self.transport(&e))?;
        Err(api_error(status, &bytes, None))
    }

    pub(crate) fn transport(&self, error: &reqwest::Error) -> Error {
        let what = if error.is_timeout() { "timed out talking to" } else { "cannot reach" };
        // reqwest's own text only repeats the URL; its sources say what happened.
        let why = match std::error::Error::source(error) {
            Some(source) => chain(source),
            None => error.to_string(),
        };
        // The causes may quote what the server sent (a malformed header).
        Error::Transport(format!("{what} {}: {}", self.base, escape_controls(&why)))
    }
}

/// Checks `--reason` / `KAYRA_REASON` and makes its header. UTF-8 beyond
/// ASCII travels as its bytes (HTTP's `obs-text`), as any header value may.
fn reason_header(reason: &str) -> Result<HeaderValue, Error> {
    if reason.chars().count() > MAX_REASON {
        return Err(invalid(format!("--reason is longer than {MAX_REASON} characters")));
    }
    if reason.chars().any(char::is_control) {
        return Err(invalid("--reason must not contain control characters (line breaks, tabs, escapes)"));
    }
    HeaderValue::from_bytes(reason.as_bytes())
        .map_err(|_| invalid("--reason contains characters an HTTP header cannot carry"))
}

/// Reads `--server`. A URL with user info is refused without being shown
/// (it holds a password); nothing that looks like user info is ever echoed.
fn parse_server(server: &str) -> Result<Url, Error> {
    let shown = if server.contains('@') { "(not shown: it contains '@')".to_string() } else { format!("{server:?}") };
    let bad = |why: &str| invalid(format!("invalid server URL {shown}: {why} (set --server or KAYRA_SERVER)"));
    if server.trim().is_empty() {
        return Err(bad("empty"));
    }
    let url = Url::parse(server).map_err(|e| bad(&e.to_string()))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::Unsafe(
            "the server URL (--server or KAYRA_SERVER) must not contain user info (user:password@); \
             authenticate with --token or KAYRA_TOKEN"
                .into(),
        ));
    }
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() || url.host_str().is_none() {
        return Err(bad("expected http://HOST:PORT or https://HOST:PORT"));
    }
    Ok(url)
}

fn body_of(bytes: &[u8]) -> Body {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Body::Empty;
    }
    match serde_json::from_slice(bytes) {
        Ok(value) => Body::Json(value),
        Err(_) => Body::Raw(bytes.to_vec()),
    }
}

/// An error answer as an [`Error::Api`].
fn api_error(status: StatusCode, bytes: &[u8], location: Option<&str>) -> Error {
    let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
    let field = |key: &str| parsed.as_ref().and_then(|v| v.get(key)).and_then(Value::as_str).map(str::to_string);
    let reason = escape_controls(&field("reason").unwrap_or_default());
    let message = match field("message") {
        Some(message) => message,
        None => {
            let text = String::from_utf8_lossy(bytes);
            let text = text.trim();
            let mut shown: String = text.chars().take(MAX_ERROR_TEXT).collect();
            if shown.len() < text.len() {
                shown.push('…');
            }
            match location {
                Some(to) if status.is_redirection() => {
                    format!("redirected to {to}: point --server there")
                }
                _ => shown,
            }
        }
    };
    Error::Api { status: status.as_u16(), reason, message: escape_controls(&message) }
}

/// An error and its sources, `: `-separated, without repeats.
fn chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_missing_token_is_one_line() {
        for token in [None, Some(""), Some("  ")] {
            let err = Client::new("http://localhost:8080", token).err().unwrap();
            assert_eq!(err.to_string(), "error: no token: pass --token or set KAYRA_TOKEN");
            assert_eq!(err.exit_code(), 1);
        }
    }

    #[test]
    fn server_urls() {
        assert!(Client::new("http://localhost:8080", Some("t")).is_ok());
        assert!(Client::new("https://kayra.example.com/prefix", Some("t")).is_ok());
        for bad in ["", "localhost:8080", "ftp://x", "http://", "not a url"] {
            let err = Client::new(bad, Some("t")).err().unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(err.to_string().contains("KAYRA_SERVER"), "{err}");
            assert_eq!(err.exit_code(), 1);
        }
    }

    #[test]
    fn server_urls_with_user_info_are_refused_unshown() {
        for url in
            ["http://user:pw-s3cret@localhost:8080", "https://pw-s3cret@kayra.example.com/", "http://u:pw-s3cret@"]
        {
            let err = Client::new(url, Some("t")).err().unwrap_or_else(|| panic!("{url:?} accepted"));
            assert!(!err.to_string().contains("pw-s3cret"), "{err}");
            if url.ends_with('@') {
                assert_eq!(err.exit_code(), 1, "{err}");
            } else {
                assert_eq!(err.exit_code(), 2, "{err}");
                assert!(err.to_string().contains("user info"), "{err}");
            }
        }
    }

    #[test]
    fn hostile_error_messages_are_escaped() {
        let body = json!({"code": 400, "reason": "Bad\u{1b}[2J", "message": "x\u{1b}]0;pwned\u{7}\nforged line\u{9b}"});
        let body = serde_json::to_vec(&body).unwrap();
        let Error::Api { reason, message, .. } = api_error(StatusCode::BAD_REQUEST, &body, None) else { panic!() };
        for text in [&reason, &message] {
            assert!(!text.chars().any(char::is_control), "{text:?}");
        }
        assert!(message.contains("\\u{1b}]0;pwned"), "{message}");
        let Error::Api { message, .. } = api_error(StatusCode::BAD_GATEWAY, b"\x1b[2Jcleared\r\n", None) else {
            panic!()
        };
        assert!(!message.chars().any(char::is_control), "{message:?}");
        let Error::Api { message, .. } = api_error(StatusCode::FOUND, b"", Some("http://x/\x1b]2;title\x07")) else {
            panic!()
        };
        assert!(!message.chars().any(char::is_control), "{message:?}");
    }

    #[test]
    fn an_echoed_token_is_redacted() {
        let client = Client::new("http://localhost:8080", Some("tok-123456")).unwrap();
        let echoed = Error::Api { status: 401, reason: "Unauthorized".into(), message: "bad token tok-123456".into() };
        assert_eq!(client.redacted(echoed).to_string(), "Error from server (Unauthorized): bad token <redacted>");
    }

    #[test]
    fn reasons() {
        let client = || Client::new("http://localhost:8080", Some("t")).unwrap();
        assert!(client().with_reason(None).unwrap().reason.is_none());
        assert!(client().with_reason(Some("")).unwrap().reason.is_none());
        let ok = client().with_reason(Some("roll out v2 (TICKET-42), déploiement")).unwrap();
        assert_eq!(ok.reason.unwrap().as_bytes(), "roll out v2 (TICKET-42), déploiement".as_bytes());
        assert!(client().with_reason(Some(&"é".repeat(MAX_REASON))).is_ok());
        for bad in ["line\nbreak", "tab\there", "esc\u{1b}[2J", "c1\u{9b}", &"x".repeat(MAX_REASON + 1)] {
            let err = client().with_reason(Some(bad)).err().unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(err.exit_code(), 1, "{err}");
            assert!(err.to_string().contains("--reason"), "{err}");
            assert!(!err.to_string().chars().any(char::is_control), "{err:?}");
        }
    }

    #[test]
    fn a_bad_token_is_not_echoed() {
        let err = Client::new("http://localhost:8080", Some("secret\nvalue")).err().unwrap();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn error_bodies() {
        let body = br#"{"code": 404, "reason": "NotFound", "message": "namespace \"x\" not found"}"#;
        assert_eq!(
            api_error(StatusCode::NOT_FOUND, body, None),
            Error::Api { status: 404, reason: "NotFound".into(), message: "namespace \"x\" not found".into() }
        );
        assert_eq!(
            api_error(StatusCode::BAD_GATEWAY, b"upstream exploded\n", None),
            Error::Api { status: 502, reason: String::new(), message: "upstream exploded".into() }
        );
        let long = "x".repeat(5000);
        let Error::Api { message, .. } = api_error(StatusCode::INTERNAL_SERVER_ERROR, long.as_bytes(), None) else {
            panic!()
        };
        assert_eq!(message.chars().count(), MAX_ERROR_TEXT + 1);
        let Error::Api { message, status, .. } =
            api_error(StatusCode::MOVED_PERMANENTLY, b"", Some("https://kayra.example.com/"))
        else {
            panic!()
        };
        assert_eq!(status, 301);
        assert!(message.contains("https://kayra.example.com/"), "{message}");
    }

    #[test]
    fn bodies() {
        assert_eq!(body_of(b""), Body::Empty);
        assert_eq!(body_of(b" \n"), Body::Empty);
        assert_eq!(body_of(br#"{"a": 1}"#), Body::Json(json!({"a": 1})));
        assert_eq!(body_of(b"plain text"), Body::Raw(b"plain text".to_vec()));
    }
}
