//! One HTTP call of a reconcile pipeline (seed, "HTTP step pipeline").
//!
//! Only the shape lives here; rendering and running steps belongs to the
//! catalog's pipeline, which also parses every template at startup.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::Duration;

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

/// A header value: verbatim string, or `{type, value}` → `"<type> <value>"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum HeaderValue {
    Plain(String),
    Typed(TypedHeader),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedHeader {
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
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
