//! Labels and label selectors (platform contract §4.1).
//!
//! A namespace carries `labels`, a map of at most [`MAX_LABELS`] entries.
//! A key is an optional prefix and `/`, then a name: the prefix is a DNS
//! subdomain (lower-case DNS labels joined by dots, at most
//! [`MAX_PREFIX`] characters); the name is 1 to [`MAX_NAME`] characters
//! from `A-Z a-z 0-9 - _ .`, starting and ending with a letter or digit.
//! A value is empty or such a name.
//!
//! A [`Selector`] (`tier=canary,env,!legacy`) is a comma-separated list of
//! terms, all of which must hold: `k=v` (the label `k` equals `v`; `k=`
//! means the empty value), `k` (the label is present), `!k` (it is
//! absent). An empty selector selects everything.
//!
//! Messages quote keys, values and selectors cut to a bounded length, so a
//! hostile one cannot blow up the error it provokes.

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

use crate::names::is_label;

/// The most entries a label map may have.
pub const MAX_LABELS: usize = 64;
/// The longest name part of a key, and the longest value.
pub const MAX_NAME: usize = 63;
/// The longest prefix of a key (before its `/`).
pub const MAX_PREFIX: usize = 253;

/// The longest piece of a caller's text an error message quotes.
const SHOWN: usize = 80;

/// A label map, sorted by key.
pub type Labels = BTreeMap<String, String>;

/// Why a label map was refused; the message starts with `labels:` and
/// names the offending key.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Invalid {
    #[error("labels: at most {MAX_LABELS} entries are allowed, got {0}")]
    TooMany(usize),
    #[error("labels: key {key} is not valid: {rule}")]
    Key { key: String, rule: &'static str },
    #[error("labels: the value {value} of key {key} is not valid: {rule}")]
    Value { key: String, value: String, rule: &'static str },
}

/// Checks a whole label map: its size, then every key and value.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), Invalid> {
    if labels.len() > MAX_LABELS {
        return Err(Invalid::TooMany(labels.len()));
    }
    for (key, value) in labels {
        check_key(key).map_err(|rule| Invalid::Key { key: shown(key), rule })?;
        check_value(value).map_err(|rule| Invalid::Value { key: shown(key), value: shown(value), rule })?;
    }
    Ok(())
}

/// Whether `key` is a valid label key.
pub fn is_valid_key(key: &str) -> bool {
    check_key(key).is_ok()
}

/// Whether `value` is a valid label value.
pub fn is_valid_value(value: &str) -> bool {
    check_value(value).is_ok()
}

fn check_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if name.contains('/') {
            return Err("a key has at most one '/', between its prefix and its name");
        }
        if prefix.is_empty() || prefix.len() > MAX_PREFIX || !prefix.split('.').all(is_label) {
            return Err("its prefix (before '/') must be a DNS subdomain of at most 253 characters: \
                        lower-case DNS labels joined by dots");
        }
    }
    if name.is_empty() {
        return Err("its name must not be empty");
    }
    check_name(name).map_err(
        |_| "its name must be 1 to 63 characters of A-Z a-z 0-9 - _ . starting and ending with a letter or digit",
    )
}

fn check_value(value: &str) -> Result<(), &'static str> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value).map_err(
        |_| "a value is empty or 1 to 63 characters of A-Z a-z 0-9 - _ . starting and ending with a letter or digit",
    )
}

/// A key's name part or a non-empty value.
fn check_name(name: &str) -> Result<(), ()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= MAX_NAME
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric();
    if ok { Ok(()) } else { Err(()) }
}

/// One term of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// `k=v`: the label is present and equal to the value.
    Equals(String, String),
    /// `k`: the label is present.
    Exists(String),
    /// `!k`: the label is absent.
    Absent(String),
}

impl Term {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Term::Equals(key, value) => labels.get(key) == Some(value),
            Term::Exists(key) => labels.contains_key(key),
            Term::Absent(key) => !labels.contains_key(key),
        }
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Term::Equals(key, value) => write!(f, "{key}={value}"),
            Term::Exists(key) => write!(f, "{key}"),
            Term::Absent(key) => write!(f, "!{key}"),
        }
    }
}

/// A parsed label selector: every term must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    terms: Vec<Term>,
}

impl Selector {
    /// Parses `tier=canary,env,!legacy`. The empty string is the selector
    /// of everything; an empty term (`a,,b`, a trailing comma), a bad key
    /// or a bad value is an error naming `labelSelector`. Spaces around
    /// terms, keys and values are ignored.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let refuse = |term: &str, rule: &str| format!("labelSelector: term {} is not valid: {rule}", shown(term));
        let mut terms = Vec::new();
        for raw in text.split(',') {
            let term = raw.trim();
            if term.is_empty() {
                return Err(format!(
                    "labelSelector {} has an empty term: terms are k=v, k or !k separated by single commas",
                    shown(text)
                ));
            }
            let parsed = if let Some(key) = term.strip_prefix('!') {
                let key = key.trim();
                if key.contains('=') {
                    return Err(refuse(term, "!k takes a key only (k=v and !k cannot be combined)"));
                }
                check_key(key).map_err(|rule| refuse(term, rule))?;
                Term::Absent(key.to_string())
            } else if let Some((key, value)) = term.split_once('=') {
                let (key, value) = (key.trim(), value.trim());
                check_key(key).map_err(|rule| refuse(term, rule))?;
                check_value(value).map_err(|rule| refuse(term, rule))?;
                Term::Equals(key.to_string(), value.to_string())
            } else {
                check_key(term).map_err(|rule| refuse(term, rule))?;
                Term::Exists(term.to_string())
            };
            terms.push(parsed);
        }
        Ok(Self { terms })
    }

    /// Whether `labels` satisfy every term.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|term| term.matches(labels))
    }

    /// Whether it selects everything (no terms).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn terms(&self) -> &[Term] {
        &self.terms
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, term) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{term}")?;
        }
        Ok(())
    }
}

/// A caller's text quoted for a message: escaped, and cut.
fn shown(value: &str) -> String {
    if value.chars().count() <= SHOWN {
        format!("{value:?}")
    } else {
        format!("{:?}…", value.chars().take(SHOWN).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn keys() {
        let long_prefix = format!("{}.{}", "a".repeat(63), "b".repeat(63));
        for ok in [
            "tier",
            "a",
            "A",
            "a.b_c-D9",
            "example.com/tier",
            "a/b",
            "x-1.y/Name_1",
            &"n".repeat(63),
            &format!("{long_prefix}/x"),
        ] {
            assert!(is_valid_key(ok), "{ok}");
        }
        for bad in [
            "",
            "/",
            "/a",
            "a/",
            "a/b/c",
            "-a",
            "a-",
            "_a",
            "a.",
            "a b",
            "ü",
            "a=b",
            "!a",
            "A.com/x",
            "a..b/x",
            "-a.com/x",
            &"n".repeat(64),
            &format!("{}/x", "a.".repeat(127) + "a"),
        ] {
            assert!(!is_valid_key(bad), "{bad}");
        }
    }

    #[test]
    fn values() {
        for ok in ["", "canary", "v1.2", "A_b-c", &"v".repeat(63)] {
            assert!(is_valid_value(ok), "{ok}");
        }
        for bad in ["-a", "a-", "a/b", "a b", "ü", "=", &"v".repeat(64)] {
            assert!(!is_valid_value(bad), "{bad}");
        }
    }

    #[test]
    fn maps_name_the_offending_key_and_cut_it() {
        assert!(validate_labels(&labels(&[("tier", "canary"), ("env", "")])).is_ok());
        let err = validate_labels(&labels(&[("ok", "x"), ("a/b/c", "x")])).unwrap_err().to_string();
        assert!(err.starts_with("labels: key \"a/b/c\" is not valid: "), "{err}");
        let err = validate_labels(&labels(&[("tier", "-x")])).unwrap_err().to_string();
        assert!(err.contains("\"tier\"") && err.contains("value"), "{err}");
        let hostile = "k".repeat(10_000) + "/";
        let err = validate_labels(&labels(&[(&hostile, "")])).unwrap_err().to_string();
        assert!(err.len() < 400, "{err}");
        let many: Labels = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert_eq!(validate_labels(&many), Err(Invalid::TooMany(65)));
        let enough: Labels = (0..64).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(validate_labels(&enough).is_ok());
    }

    #[test]
    fn selectors_parse_every_term_kind() {
        let selector = Selector::parse("tier=canary, env ,!legacy,x.io/k=").unwrap();
        assert_eq!(
            selector.terms(),
            [
                Term::Equals("tier".into(), "canary".into()),
                Term::Exists("env".into()),
                Term::Absent("legacy".into()),
                Term::Equals("x.io/k".into(), String::new()),
            ]
        );
        assert_eq!(selector.to_string(), "tier=canary,env,!legacy,x.io/k=");
        assert!(Selector::parse("").unwrap().is_empty());
        for bad in [",", "a,", ",a", "a,,b", "=v", "!", "!a=b", "a=b=c", "a/b/c", "a=-x", "a b", "ü", "a==b", "a!=b"] {
            let err = Selector::parse(bad).unwrap_err();
            assert!(err.starts_with("labelSelector"), "{bad}: {err}");
        }
        let err = Selector::parse(&"k".repeat(100_000)).unwrap_err();
        assert!(err.len() < 400, "{err}");
    }

    #[test]
    fn matching() {
        let selector = Selector::parse("tier=canary,env,!legacy").unwrap();
        assert!(selector.matches(&labels(&[("tier", "canary"), ("env", "")])));
        assert!(!selector.matches(&labels(&[("tier", "canary")])), "env missing");
        assert!(!selector.matches(&labels(&[("tier", "stable"), ("env", "x")])), "tier differs");
        assert!(!selector.matches(&labels(&[("tier", "canary"), ("env", "x"), ("legacy", "")])), "legacy present");
        let empty_value = Selector::parse("k=").unwrap();
        assert!(empty_value.matches(&labels(&[("k", "")])));
        assert!(!empty_value.matches(&labels(&[("k", "x")])));
        assert!(!empty_value.matches(&labels(&[])));
        assert!(Selector::default().matches(&labels(&[])));
    }
}
