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
//! `data` string) or an output that contains any of the run's secret values
//! is shown as [`REDACTED`], whole, wherever kayra shows it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use kayra_config::SecretSource;

use crate::error::PipelineError;

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

async fn read_source(source: &SecretSource) -> Result<String, String> {
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
        Self(names.into_iter().map(|name| (name.clone(), format!("\u{1}kayra-secret:{name}\u{1}"))).collect())
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

/// Finds secret values in what kayra is about to show.
#[derive(Default)]
pub(crate) struct Redactor {
    values: Vec<String>,
}

impl Redactor {
    pub(crate) fn new(secrets: &SecretValues) -> Self {
        // An empty value is in every string; it hides nothing.
        Self { values: secrets.0.values().filter(|v| !v.is_empty()).cloned().collect() }
    }

    /// Whether `text` contains a secret value.
    pub(crate) fn hides(&self, text: &str) -> bool {
        self.values.iter().any(|v| text.contains(v.as_str()))
    }

    /// `text`, or [`REDACTED`] when it contains a secret value.
    pub(crate) fn field(&self, text: String) -> String {
        if self.hides(&text) { REDACTED.to_string() } else { text }
    }

    /// `text` with every secret value replaced by [`REDACTED`]: the last
    /// line of defence for free text such as an error chain.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut text = text.to_string();
        for value in &self.values {
            if text.contains(value.as_str()) {
                text = text.replace(value.as_str(), REDACTED);
            }
        }
        text
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
}
