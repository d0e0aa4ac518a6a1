//! The rules for values that leave kayra's hands and land somewhere they
//! could do harm: a path segment a backend will interpret, a `sync_id`
//! rendered into step URLs and log lines, an endpoint URL the gateway and
//! the reconciler call (platform contract §4.2, §6, §8, §9).
//!
//! Each rule lives here once, so the gateway, the catalog API and the CLI
//! cannot drift apart on what is allowed.

use std::borrow::Cow;

use thiserror::Error;

use crate::CATALOG_API;

/// The short name reserved for the catalog API (`kayra-cli get catalog …`).
pub const CATALOG_SHORT_NAME: &str = "catalog";

/// The longest `sync_id` (§4.2).
pub const MAX_SYNC_ID: usize = 128;

/// Why a value was refused. Messages name the field (or segment) and, for
/// an endpoint, never repeat the value: it may carry a password.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Invalid {
    /// A path segment that a backend could read as something else.
    #[error("path segment {segment} is not allowed: {rule}")]
    Segment { segment: String, rule: &'static str },
    #[error("sync_id {shown} is invalid: {rule}")]
    SyncId { shown: String, rule: &'static str },
    #[error("endpoint is invalid: {rule}")]
    Endpoint { rule: &'static str },
    /// A name that would shadow the catalog API.
    #[error("{field} {value:?} is reserved for the catalog API")]
    Reserved { field: &'static str, value: &'static str },
}

/// Checks one path segment as it appears in a URL (still percent-encoded).
///
/// Refused: a segment that, percent-decoded once, contains `/`, `\`, NUL or
/// any control character, or is `.` or `..` — also when followed by
/// `;parameters`, which some servlet containers strip before resolving dot
/// segments (`/..;/`). A malformed `%` escape is refused too: backends
/// disagree on what it means. Dots inside a segment (`web.1`, `..x`) and
/// any other character are the backend's business.
pub fn path_segment(raw: &str) -> Result<(), Invalid> {
    let refuse = |rule| Invalid::Segment { segment: shown(raw), rule };
    let decoded = percent_decode(raw).ok_or_else(|| refuse("it has a malformed percent-escape"))?;
    let text = String::from_utf8_lossy(&decoded);
    if text.chars().any(|c| c == '/' || c == '\\') {
        return Err(refuse("it must not contain '/' or '\\', percent-encoded or not"));
    }
    if text.chars().any(char::is_control) {
        return Err(refuse("it must not contain NUL or control characters"));
    }
    let before_params = text.split(';').next().unwrap_or_default();
    if before_params == "." || before_params == ".." {
        return Err(refuse("\".\" and \"..\" segments are not allowed"));
    }
    Ok(())
}

/// `%XX` decoded once; `None` on a `%` not followed by two hex digits.
fn percent_decode(raw: &str) -> Option<Vec<u8>> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A `sync_id` (§4.2): 1 to 128 characters of `A-Z a-z 0-9 . _ : + -`, not
/// dots alone. It is rendered into step URLs and log lines, so nothing in
/// it may act as a path separator, a query, or a line break.
pub fn validate_sync_id(sync_id: &str) -> Result<(), Invalid> {
    let refuse = |rule| Invalid::SyncId { shown: shown(sync_id), rule };
    if sync_id.is_empty() || sync_id.chars().count() > MAX_SYNC_ID {
        return Err(refuse("it must be 1 to 128 characters long"));
    }
    if !sync_id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '+' | '-')) {
        return Err(refuse("only letters, digits and . _ : + - are allowed"));
    }
    if sync_id.chars().all(|c| c == '.') {
        return Err(refuse("it must not be made of dots alone"));
    }
    Ok(())
}

/// A registration's `endpoint` (§4.2): empty, or an absolute `http`/`https`
/// URL with a host, without user info and without a fragment. The value
/// itself is never part of the error: it may hold a password.
pub fn validate_endpoint(endpoint: &str) -> Result<(), Invalid> {
    if endpoint.is_empty() {
        return Ok(());
    }
    let refuse = |rule| Err(Invalid::Endpoint { rule });
    let lower = endpoint.get(..8).unwrap_or(endpoint).to_ascii_lowercase();
    let Some(after_scheme) =
        ["http://", "https://"].iter().find_map(|s| lower.starts_with(s).then(|| &endpoint[s.len()..]))
    else {
        return refuse("it must be an absolute URL starting with http:// or https://");
    };
    if endpoint.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("it must not contain whitespace or control characters");
    }
    let authority = after_scheme.split(['/', '?', '#', '\\']).next().unwrap_or_default();
    if authority.contains('@') {
        return refuse("it must not contain user info (user:password@); give backends credentials in the mode's steps");
    }
    if endpoint.contains('#') {
        return refuse("it must not have a fragment (#...)");
    }
    if endpoint.contains('\\') {
        return refuse("it must not contain '\\'");
    }
    match url::Url::parse(endpoint) {
        Ok(url) if url.has_host() && url.username().is_empty() && url.password().is_none() => Ok(()),
        _ => refuse("it must be an absolute http or https URL with a host, e.g. http://127.0.0.1:9000"),
    }
}

/// A registration's names must not shadow the catalog API (§4.2).
pub fn validate_not_reserved(name: &str, short_name: &str) -> Result<(), Invalid> {
    if name == CATALOG_API || name == CATALOG_SHORT_NAME {
        return Err(Invalid::Reserved {
            field: "name",
            value: if name == CATALOG_API { CATALOG_API } else { CATALOG_SHORT_NAME },
        });
    }
    if short_name == CATALOG_SHORT_NAME || short_name == CATALOG_API {
        return Err(Invalid::Reserved {
            field: "short_name",
            value: if short_name == CATALOG_API { CATALOG_API } else { CATALOG_SHORT_NAME },
        });
    }
    Ok(())
}

/// `text` with the user info of every URL in it (`scheme://user:pw@`)
/// replaced by `***@`, for log lines and messages that quote URLs or
/// errors that do (§8: no URL user info is ever logged).
pub fn scrub_userinfo(text: &str) -> Cow<'_, str> {
    if !text.contains("://") || !text.contains('@') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end =
            tail.find(|c: char| matches!(c, '/' | '?' | '#' | '\\') || c.is_whitespace() || c == '"' || c == ')');
        let authority = &tail[..authority_end.unwrap_or(tail.len())];
        match authority.rfind('@') {
            Some(user_end) => {
                out.push_str("***@");
                rest = &tail[user_end + 1..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// `text` with every control character (C0, DEL, C1) shown escaped
/// (`\n`, `\u{1b}`), so it stays one line and cannot drive a terminal:
/// for log fields and for anything a client shows that a server sent.
pub fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A value quoted for a message: escaped, and cut at 80 characters.
fn shown(value: &str) -> String {
    if value.chars().count() <= 80 {
        format!("{value:?}")
    } else {
        format!("{:?}…", value.chars().take(80).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_the_rest_kept() {
        assert_eq!(escape_controls("a\nb\u{1b}[31m\u{7f}\u{85}ü"), "a\\nb\\u{1b}[31m\\u{7f}\\u{85}ü");
        assert_eq!(escape_controls("plain"), "plain");
    }

    #[test]
    fn segments() {
        for ok in ["a", "web.1", "..x", "x..", "a%20b", "%41", "ü", "a;b", "...", "%252e%252e", "%25"] {
            assert!(path_segment(ok).is_ok(), "{ok}");
        }
        for bad in [
            ".",
            "..",
            "%2e",
            "%2E%2e",
            ".%2e",
            "..;",
            "..;x=1",
            ".;",
            "a\\b",
            "..\\..\\b",
            "%5c",
            "%5C",
            "a%2fb",
            "%2F",
            "a%00",
            "%0a",
            "%7f",
            "\u{85}",
            "%c2%85",
            "%",
            "%4",
            "%zz",
            "a\u{1}",
        ] {
            let err = path_segment(bad).unwrap_err();
            assert!(err.to_string().contains("path segment"), "{bad}: {err}");
        }
    }

    #[test]
    fn sync_ids() {
        for ok in ["2026-02-01T00Z", "v1.2.3", "a", "a:b+c_d-e", "..a", &"x".repeat(128)] {
            assert!(validate_sync_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "...", "a/b", "../../admin", "a?x=", "a\nb", "a b", "ü", "a%2f", &"x".repeat(129)] {
            let err = validate_sync_id(bad).unwrap_err().to_string();
            assert!(err.contains("sync_id"), "{bad}: {err}");
        }
    }

    #[test]
    fn endpoints() {
        for ok in ["", "http://127.0.0.1:9000", "https://h.example/base/", "HTTP://h.example", "http://[::1]:80/x?y=1"]
        {
            assert!(validate_endpoint(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://user:s3cret@h.example",
            "http://s3cret@h.example/",
            "https://user:s3cret@h.example:443/x",
            "http://h.example/#frag",
            "ftp://h.example",
            "h.example",
            "http:/h.example",
            "http:\\\\h.example",
            "http://",
            "http://h.example/a b",
            "http://h.example\n",
            "//h.example",
        ] {
            let err = validate_endpoint(bad).unwrap_err().to_string();
            assert!(err.contains("endpoint"), "{bad}: {err}");
            assert!(!err.contains("s3cret"), "{bad}: the message echoes the password: {err}");
        }
    }

    #[test]
    fn reserved_names() {
        assert!(validate_not_reserved("catalog.example.com", "").is_err());
        assert!(validate_not_reserved("compute.example.com", "catalog").is_err());
        assert!(validate_not_reserved("compute.example.com", "catalog.example.com").is_err());
        assert!(validate_not_reserved("compute.example.com", "compute").is_ok());
        assert!(validate_not_reserved("compute.example.com", "").is_ok());
    }

    #[test]
    fn user_info_is_scrubbed() {
        assert_eq!(
            scrub_userinfo("error sending request for url (http://u:pw@h.example/x): refused"),
            "error sending request for url (http://***@h.example/x): refused"
        );
        assert_eq!(scrub_userinfo("a http://h/x@y b https://p@q"), "a http://h/x@y b https://***@q");
        assert_eq!(scrub_userinfo("no urls here"), "no urls here");
    }
}
