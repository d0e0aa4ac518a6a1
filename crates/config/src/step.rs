//! One HTTP call of a reconcile pipeline (seed, "HTTP step pipeline").
//!
//! Only the shape lives here; rendering and running steps belongs to
//! `kayra-pipeline`, which also parses every template and resolves every
//! secret name at startup.

use std::collections::BTreeMap;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::Duration;

/// The longest `timeout` a step may have (platform §2). Longer is refused
/// at startup: nothing legitimate waits for a day, and a huge value would
/// overflow the clock arithmetic of the run that uses it.
pub const MAX_STEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Methods a step may use (case-insensitive in the file).
pub const METHODS: [&str; 6] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub method: String,
    pub endpoint: String,
    /// JSON-encoded after templating every string inside it.
    #[serde(default)]
    pub data: Option<serde_json::Value>,
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderValue>,
    /// Defaults to 60s.
    #[serde(default)]
    pub timeout: Option<Duration>,
    #[serde(default, rename = "async")]
    pub is_async: bool,
    /// Output name → dot path into the JSON response body.
    #[serde(default)]
    pub outputs: BTreeMap<String, String>,
    /// Conditions polled until resolved; ignored on async steps.
    #[serde(default)]
    pub wait: Vec<WaitCondition>,
}

impl Step {
    /// The upper-cased method.
    pub fn method_upper(&self) -> String {
        self.method.to_ascii_uppercase()
    }

    /// Shape checks; the error is `(field, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !METHODS.contains(&self.method_upper().as_str()) {
            return Err((
                "method".into(),
                format!("unsupported method {:?}; use one of get, post, put, patch, delete, head", self.method),
            ));
        }
        if self.endpoint.trim().is_empty() {
            return Err(("endpoint".into(), "must not be empty".into()));
        }
        if self.timeout.is_some_and(|t| t.0.is_zero()) {
            return Err(("timeout".into(), "must be greater than zero".into()));
        }
        if self.timeout.is_some_and(|t| t.0 > MAX_STEP_TIMEOUT) {
            return Err(("timeout".into(), "must be at most 24h".into()));
        }
        for (name, value) in &self.headers {
            if let HeaderValue::Typed(typed) = value {
                typed.validate().map_err(|message| (format!("headers.{name}"), message))?;
            }
        }
        for (name, path) in &self.outputs {
            if !path.starts_with('.') {
                return Err((format!("outputs.{name}"), format!("dot path {path:?} must start with '.'")));
            }
        }
        for (i, w) in self.wait.iter().enumerate() {
            if !w.key.starts_with('.') {
                return Err((format!("wait[{i}].key"), format!("dot path {:?} must start with '.'", w.key)));
            }
            if w.successes.is_empty() && w.failures.is_empty() {
                return Err((format!("wait[{i}]"), "needs at least one of successes / failures".into()));
            }
        }
        Ok(())
    }

    pub fn timeout_or_default(&self) -> std::time::Duration {
        self.timeout.map(|d| d.0).unwrap_or(crate::DEFAULT_STEP_TIMEOUT)
    }
}

/// A header value: a verbatim string (a template), `{type, value}` →
/// `"<type> <value>"`, `{type, secret}` → `"<type> <secret's value>"`, or
/// `{secret}` → the secret's value (platform §2).
#[derive(Debug, Clone)]
pub enum HeaderValue {
    Plain(String),
    Typed(TypedHeader),
}

/// The map form of a header value; [`TypedHeader::validate`] checks which
/// keys go together.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedHeader {
    /// A template, e.g. `Bearer`; required with `value`, optional with `secret`.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// A template.
    #[serde(default)]
    pub value: Option<String>,
    /// The name of an entry of `reconciler.secrets`.
    #[serde(default)]
    pub secret: Option<String>,
}

impl TypedHeader {
    pub(crate) fn validate(&self) -> Result<(), String> {
        match (&self.value, &self.secret) {
            (Some(_), Some(_)) => Err("set one of value and secret, not both".into()),
            (None, None) => Err("needs value (with type) or secret".into()),
            (Some(_), None) if self.kind.is_none() => {
                Err("needs type with value (or write the header as a string)".into())
            }
            (None, Some(name)) if name.is_empty() => Err("secret must name an entry of reconciler.secrets".into()),
            _ => Ok(()),
        }
    }
}

// By hand rather than `#[serde(untagged)]`, so that a mistyped key inside
// the map form is named ("unknown field `secrt`") instead of "did not match
// any variant".
impl<'de> Deserialize<'de> for HeaderValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct HeaderVisitor;
        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = HeaderValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, {type, value}, {type, secret} or {secret}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HeaderValue, E> {
                Ok(HeaderValue::Plain(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<HeaderValue, E> {
                Ok(HeaderValue::Plain(v))
            }
            // A YAML scalar such as `50` or `true` is a header's text too.
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HeaderValue, E> {
                Ok(HeaderValue::Plain(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HeaderValue, E> {
                Ok(HeaderValue::Plain(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<HeaderValue, E> {
                Ok(HeaderValue::Plain(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<HeaderValue, E> {
                Ok(HeaderValue::Plain(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<HeaderValue, A::Error> {
                TypedHeader::deserialize(de::value::MapAccessDeserializer::new(map)).map(HeaderValue::Typed)
            }
        }
        d.deserialize_any(HeaderVisitor)
    }
}

/// One `wait` condition.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitCondition {
    /// Dot path into the JSON response body.
    pub key: String,
    #[serde(default)]
    pub successes: Vec<String>,
    #[serde(default)]
    pub failures: Vec<String>,
}
