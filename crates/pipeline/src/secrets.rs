//! Named secrets (platform §2, `reconciler.secrets`): where their values
//! come from, reading them afresh for every run, and keeping them out of
//! everything kayra shows.
//!
//! A pipeline knows at compile time which names it uses (every `secret`
//! call takes a quoted name, every header's `secret:` is a name), so a run
//! reads exactly those, before its first step: a missing variable or file
//! fails the run before any backend is called, and a rotated file is used
//! by the next run without a restart.
//!
//! [`Redactor`] is the other half: a rendered field (endpoint, header value,
//! `data` string), an output or an error value that contains any of the
//! run's secret values is shown as [`REDACTED`], whole, wherever kayra shows
//! it (platform §2, §17 "Secrets in any form").
//!
//! "Contains" covers the forms a value takes on its way through a template
//! or a backend, not only the value itself: JSON-escaped (`\"`, `\\`,
//! `\u00e9`, as a backend echoing a request body writes it, and Rust's
//! `{:?}` form an error message uses) and percent-encoded (`urlquery`,
//! `pathescape`, any URL encoder, `+` for space), and these nested a few
//! times. Rather than list every encoder's choice of characters, a text is
//! decoded (percent-decoding, with and without `+` as space, and JSON/Rust
//! unescaping, combined up to [`DECODE_DEPTH`] times) and each decoding is
//! searched for the plain value. A text that merely decodes to a secret is
//! hidden too: showing less than possible is the safe mistake.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use kayra_config::SecretSource;

use crate::error::PipelineError;
use crate::http::percent_decode;

/// What kayra shows instead of anything that holds a secret.
pub const REDACTED: &str = "<redacted>";

/// `reconciler.secrets`, by name.
#[derive(Debug, Clone, Default)]
pub(crate) struct SecretSources(BTreeMap<String, SecretSource>);

impl SecretSources {
    pub(crate) fn new(sources: &BTreeMap<String, SecretSource>) -> Self {
        Self(sources.clone())
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Reads every secret in `names` now. The error names the first secret
    /// that could not be read and why, never a value.
    pub(crate) async fn read(&self, names: &BTreeSet<String>) -> Result<SecretValues, PipelineError> {
        let mut values = BTreeMap::new();
        for name in names {
            let fail = |message: String| PipelineError::Secret { name: name.clone(), message };
            // Compile refuses unknown names; this only guards the invariant.
            let source = self.0.get(name).ok_or_else(|| fail("not defined under reconciler.secrets".into()))?;
            values.insert(name.clone(), read_source(source).await.map_err(fail)?);
        }
        Ok(SecretValues(values))
    }
}

/// Reads one secret's value now (the env var, or the file less one
/// trailing newline). The error says why, never a value.
pub async fn read_source(source: &SecretSource) -> Result<String, String> {
    match source {
        SecretSource::Env(var) => std::env::var(var).map_err(|e| match e {
            std::env::VarError::NotPresent => format!("environment variable {var} is not set"),
            std::env::VarError::NotUnicode(_) => format!("environment variable {var} is not valid UTF-8"),
        }),
        SecretSource::File(path) => {
            // The io error's text names the cause (not found, permission
            // denied), never the contents.
            let text = tokio::fs::read_to_string(path)
                .await
                .map_err(|e| format!("cannot read file {}: {}", path.display(), e.kind()))?;
            Ok(strip_one_newline(text))
        }
    }
}

/// One trailing newline (`\n` or `\r\n`) of a secret file is not part of
/// its value: editors and `echo` add one.
fn strip_one_newline(mut text: String) -> String {
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    text
}

/// The values one run read, by name.
#[derive(Clone, Default)]
pub(crate) struct SecretValues(BTreeMap<String, String>);

impl SecretValues {
    /// Stand-ins for `kayra render`, which must show where a secret goes
    /// without reading it: each value is unique to its name, so the field
    /// it lands in is found and redacted like a real one.
    pub(crate) fn placeholders<'a>(names: impl IntoIterator<Item = &'a String>) -> Self {
        // URL-safe (lower-case letters and hex), so a secret in a host or a
        // path renders to a URL that is checked as a real one would be.
        Self(names.into_iter().map(|name| (name.clone(), format!("kayrasecret{}x", hex(name)))).collect())
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub(crate) fn into_shared(self) -> Arc<Self> {
        Arc::new(self)
    }
}

impl fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only, ever.
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Lower-case hex of `name`'s bytes.
fn hex(name: &str) -> String {
    name.bytes().map(|b| format!("{b:02x}")).collect()
}

/// How many layers of escaping [`Redactor::hides`] looks through (a value
/// percent-encoded inside a JSON string inside a JSON string, say).
const DECODE_DEPTH: usize = 3;

/// Finds secret values, in any of their forms, in what kayra is about to show.
#[derive(Default)]
pub(crate) struct Redactor {
    /// Each non-empty secret value, as bytes.
    values: Vec<Vec<u8>>,
    /// Each value and its common escaped forms, longest first: looked for
    /// as they are by [`Self::hides`], replaced in free text by [`Self::scrub`].
    forms: Vec<String>,
}

impl Redactor {
    pub(crate) fn new(secrets: &SecretValues) -> Self {
        // An empty value is in every string; it hides nothing.
        let values: Vec<&String> = secrets.0.values().filter(|v| !v.is_empty()).collect();
        let mut forms: Vec<String> = values.iter().flat_map(|v| escaped_forms(v)).collect();
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Self { values: values.into_iter().map(|v| v.as_bytes().to_vec()).collect(), forms }
    }

    /// Whether `text` contains a secret value, plain or escaped (see the
    /// module docs).
    pub(crate) fn hides(&self, text: &str) -> bool {
        if self.values.is_empty() {
            return false;
        }
        if self.forms.iter().any(|form| text.contains(form.as_str())) {
            return true;
        }
        let mut seen: Vec<Vec<u8>> = vec![text.as_bytes().to_vec()];
        let mut layer = seen.clone();
        for _ in 0..=DECODE_DEPTH {
            if layer.iter().any(|t| self.values.iter().any(|v| contains(t, v))) {
                return true;
            }
            let mut next = Vec::new();
            for text in &layer {
                for decoded in [percent_decode(text, false), percent_decode(text, true), unescape(text)] {
                    if !seen.contains(&decoded) {
                        seen.push(decoded.clone());
                        next.push(decoded);
                    }
                }
            }
            if next.is_empty() {
                return false;
            }
            layer = next;
        }
        false
    }

    /// `text`, or [`REDACTED`] when it contains a secret value.
    pub(crate) fn field(&self, text: String) -> String {
        if self.hides(&text) { REDACTED.to_string() } else { text }
    }

    /// `text` with every secret value, and each of its common escaped
    /// forms, replaced by [`REDACTED`]: the last line of defence for free
    /// text such as an error chain. Should a less common form remain, the
    /// whole text is [`REDACTED`].
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut text = text.to_string();
        for form in &self.forms {
            if text.contains(form.as_str()) {
                text = text.replace(form.as_str(), REDACTED);
            }
        }
        self.field(text)
    }

    /// Every string inside `value` that contains a secret value becomes
    /// [`REDACTED`]; keys and other types are kept.
    pub(crate) fn json(&self, value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::String(s) => Value::String(self.field(s)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.json(v)).collect()),
            Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, self.json(v))).collect()),
            other => other,
        }
    }
}

/// `value` and the forms escaping commonly gives it: JSON, Rust `{:?}`,
/// `urlquery`, `pathescape`, every byte percent-encoded (either case), and
/// each of these applied to each of them once more. Looked for as they
/// are, they are found wherever they start (decoding a text from its
/// first byte may pair a `%` or `\\` before the value with the value's own
/// first characters).
fn escaped_forms(value: &str) -> Vec<String> {
    let quoted = |s: String| s.get(1..s.len().saturating_sub(1)).unwrap_or_default().to_string();
    let every_byte = |s: &str, upper: bool| -> String {
        s.bytes().map(|b| if upper { format!("%{b:02X}") } else { format!("%{b:02x}") }).collect()
    };
    let encoders: [&dyn Fn(&str) -> String; 6] = [
        &|s| quoted(serde_json::Value::from(s).to_string()),
        &|s| quoted(format!("{s:?}")),
        &|s| gotmpl::url_encode(s),
        &|s| crate::http::path_escape(s),
        &|s| every_byte(s, true),
        &|s| every_byte(s, false),
    ];
    let once: Vec<String> = encoders.iter().map(|encode| encode(value)).collect();
    let twice: Vec<String> = once.iter().flat_map(|form| encoders.iter().map(|encode| encode(form))).collect();
    std::iter::once(value.to_string()).chain(once).chain(twice).filter(|form| !form.is_empty()).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|window| window == needle)
}

/// JSON string escapes (`\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t`
/// `\uXXXX`, surrogate pairs joined) and Rust's (`\'` `\0` `\u{X…}`)
/// decoded; anything else, a malformed escape included, kept.
fn unescape(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    let push_char = |out: &mut Vec<u8>, c: char| out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
    while i < text.len() {
        if text[i] != b'\\' || i + 1 == text.len() {
            out.push(text[i]);
            i += 1;
            continue;
        }
        let simple = match text[i + 1] {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'\'' => Some(b'\''),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'0' => Some(0),
            _ => None,
        };
        if let Some(byte) = simple {
            out.push(byte);
            i += 2;
            continue;
        }
        if text[i + 1] == b'u'
            && let Some((c, used)) = unicode_escape(&text[i..])
        {
            push_char(&mut out, c);
            i += used;
            continue;
        }
        out.push(text[i]);
        i += 1;
    }
    out
}

/// A `\uXXXX` (a surrogate pair as two of them) or `\u{X…}` escape at the
/// start of `text`: the character and how many bytes it took.
fn unicode_escape(text: &[u8]) -> Option<(char, usize)> {
    let hex = |digits: &[u8]| u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok();
    if text.get(2) == Some(&b'{') {
        let close = text.iter().take(10).position(|&b| b == b'}')?;
        let code = hex(text.get(3..close)?)?;
        return Some((char::from_u32(code)?, close + 1));
    }
    let four = |at: usize| text.get(at..at + 4).filter(|d| d.iter().all(u8::is_ascii_hexdigit)).and_then(hex);
    let high = four(2)?;
    if let Some(c) = char::from_u32(high) {
        return Some((c, 6));
    }
    if (0xd800..0xdc00).contains(&high) && text.get(6..8) == Some(b"\\u".as_slice()) {
        let low = four(8).filter(|low| (0xdc00..0xe000).contains(low))?;
        let code = 0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00);
        return Some((char::from_u32(code)?, 12));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_newline_is_stripped() {
        assert_eq!(strip_one_newline("tok\n".into()), "tok");
        assert_eq!(strip_one_newline("tok\r\n".into()), "tok");
        assert_eq!(strip_one_newline("tok\n\n".into()), "tok\n");
        assert_eq!(strip_one_newline("tok".into()), "tok");
        assert_eq!(strip_one_newline(" tok ".into()), " tok ", "other whitespace is part of the value");
    }

    #[tokio::test]
    async fn files_are_read_afresh_and_missing_sources_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let sources = SecretSources::new(&BTreeMap::from([
            ("file".to_string(), SecretSource::File(path.clone())),
            ("env".to_string(), SecretSource::Env("KAYRA_TEST_SURELY_UNSET_VARIABLE".into())),
        ]));
        let names = BTreeSet::from(["file".to_string()]);
        assert_eq!(sources.read(&names).await.unwrap().get("file"), Some("first"));
        std::fs::write(&path, "second").unwrap();
        assert_eq!(sources.read(&names).await.unwrap().get("file"), Some("second"), "rotated");

        let err = sources.read(&BTreeSet::from(["env".to_string()])).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"secret "env": environment variable KAYRA_TEST_SURELY_UNSET_VARIABLE is not set"#
        );
        std::fs::remove_file(&path).unwrap();
        let err = sources.read(&names).await.unwrap_err().to_string();
        assert!(err.starts_with(r#"secret "file": cannot read file "#) && err.contains("not found"), "{err}");
    }

    #[test]
    fn redaction_is_whole_field_and_debug_shows_names_only() {
        let values = SecretValues(BTreeMap::from([("a".into(), "s3cr3t".into()), ("empty".into(), String::new())]));
        assert_eq!(format!("{values:?}"), r#"{"a", "empty"}"#);
        let r = Redactor::new(&values);
        assert_eq!(r.field("Bearer s3cr3t".into()), REDACTED);
        assert_eq!(r.field("plain".into()), "plain", "an empty secret hides nothing");
        assert_eq!(r.scrub("x s3cr3t y s3cr3t"), "x <redacted> y <redacted>");
        let json = serde_json::json!({"k": ["s3cr3t-1", 2, "ok"], "s3cr3t": true});
        assert_eq!(r.json(json), serde_json::json!({"k": ["<redacted>", 2, "ok"], "s3cr3t": true}));
    }

    fn redactor(value: &str) -> Redactor {
        Redactor::new(&SecretValues(BTreeMap::from([("s".into(), value.into())])))
    }

    #[test]
    fn escaped_forms_are_redacted_whole() {
        let r = redactor("a\"b\\c/d é?&+ %\u{1}");
        for shown in [
            r#"{"echo":"a\"b\\c/d é?&+ %\u0001"}"#,
            r#"x a\"b\\c\/d \u00e9?&+ %\u0001 y"#,
            r#"last: .status="a\"b\\c/d é?&+ %\u{1}""#,
            "q=a%22b%5Cc%2Fd+%C3%A9%3F%26%2B+%25%01",
            "/k/a%22b%5Cc%2Fd%20%C3%A9%3F&+%20%25%01",
            "%61%22%62%5c%63%2f%64%20%c3%a9%3f%26%2b%20%25%01",
            // JSON inside JSON, and percent-encoding inside JSON.
            r#"{"outputs":"{\"E\":\"a\\\"b\\\\c/d é?&+ %\\u0001\"}"}"#,
            r#""a%22b%5Cc%2Fd+%C3%A9%3F%26%2B+%25\u0001""#,
        ] {
            assert_eq!(r.field(shown.to_string()), REDACTED, "{shown}");
        }
        for fine in ["a\"b", "plain", "%zz%", "\\u{110000} \\ud800 \\", "a%22b%5Cc"] {
            assert_eq!(r.field(fine.to_string()), fine, "{fine}");
        }
        // Astral characters escaped as a surrogate pair.
        assert!(redactor("x\u{1f600}y").hides(r#"x\ud83d\ude00y"#));
    }

    #[test]
    fn scrub_replaces_known_forms_and_hides_the_rest_whole() {
        let r = redactor("s3\"cr");
        assert_eq!(r.scrub(r#"step 1: value "s3\"cr" or s3%22cr"#), "step 1: value \"<redacted>\" or <redacted>");
        assert_eq!(r.scrub("odd: s3%22%63r"), REDACTED);
    }

    #[test]
    fn placeholders_are_url_safe_and_unique() {
        let names = ["tok".to_string(), "t".to_string(), "gitlab token".to_string()];
        let values = SecretValues::placeholders(&names);
        for name in &names {
            let value = values.get(name).unwrap();
            assert!(value.bytes().all(|b| b.is_ascii_alphanumeric()), "{value}");
            assert!(names.iter().filter(|n| *n != name).all(|n| !value.contains(values.get(n).unwrap())));
        }
    }

    /// The forms a secret may take, made without the redactor's own list.
    fn forms(value: &str) -> Vec<String> {
        let unquote = |s: String| s[1..s.len() - 1].to_string();
        let json = |s: &str| unquote(serde_json::to_string(s).unwrap());
        let debug = |s: &str| unquote(format!("{s:?}"));
        let every_byte = |s: &str| s.bytes().map(|b| format!("%{b:02x}")).collect::<String>();
        let query = gotmpl::url_encode;
        let path = crate::http::path_escape;
        let mut forms =
            vec![value.to_string(), json(value), debug(value), every_byte(value), query(value), path(value)];
        for outer in [json(value), query(value), path(value)] {
            forms.extend([json(&outer), debug(&outer), query(&outer), every_byte(&outer)]);
        }
        forms
    }

    #[test]
    fn secrets_with_any_characters_are_never_visible_in_any_form() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

        let secret = prop_oneof![
            "\\PC{3,16}",
            proptest::collection::vec(
                proptest::sample::select(
                    &["\"", "\\", "/", "%", "+", " ", "?", "#", "&", "é", "\u{1}", "\n", "😀", "a", "Z", "9", "\u{7f}"]
                        [..]
                ),
                3..10
            )
            .prop_map(|p| p.concat()),
        ]
        // "<redacted>" itself must not show the secret.
        .prop_filter("not inside the placeholder", |s| forms(s).iter().all(|f| !REDACTED.contains(f.as_str())));
        let around = "[ -~]{0,8}";
        let config = Config { cases: 2000, failure_persistence: None, max_shrink_iters: 500, ..Config::default() };
        let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[0x73; 32]));
        let result = runner.run(&(secret, around, around), |(secret, before, after)| {
            let r = redactor(&secret);
            for form in forms(&secret) {
                let text = format!("{before}{form}{after}");
                prop_assert_eq!(r.field(text.clone()), REDACTED, "{:?} in {:?}", secret, text);
                let scrubbed = r.scrub(&text);
                for shown in forms(&secret) {
                    prop_assert!(!scrubbed.contains(&shown), "{:?}: {:?} scrubbed to {:?}", secret, text, scrubbed);
                }
                let json = r.json(serde_json::json!({"k": [text]}));
                prop_assert_eq!(json, serde_json::json!({"k": [REDACTED]}));
            }
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }
}
