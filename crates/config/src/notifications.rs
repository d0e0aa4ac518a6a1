//! `notifications` (platform §14): the sinks events are delivered to, and
//! how hard kayra tries.
//!
//! Shape and values are checked by [`NotificationsConfig::validate`] with
//! the rest of the file, in every process. Secret names (`signing_secret`,
//! a header's `secret`) are resolved against `reconciler.secrets` only by
//! the processes that send (the reconciler and `kayra check`), through
//! [`NotificationsConfig::check_secrets`], as step secrets are.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::{Duration, Error, HeaderValue, SecretSource};

/// Default for `notifications.max_attempts`.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// Upper bound of `notifications.max_attempts`.
pub const MAX_ATTEMPTS_LIMIT: u32 = 1_000;
/// Default for `notifications.keep_delivered`.
pub const DEFAULT_KEEP_DELIVERED: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// A sink without `timeout` gets this.
pub const DEFAULT_SINK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The longest `timeout` a sink may have.
pub const MAX_SINK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// `notifications`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotificationsConfig {
    /// Sink name (a DNS label) → where and what to deliver.
    pub sinks: BTreeMap<String, SinkConfig>,
    /// Attempts per (event, sink); then the delivery is dead.
    pub max_attempts: u32,
    /// How long delivered ones stay listed before the reconciler deletes them.
    pub keep_delivered: Duration,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        Self {
            sinks: BTreeMap::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            keep_delivered: Duration(DEFAULT_KEEP_DELIVERED),
        }
    }
}

/// `notifications.sinks.<name>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    /// `http`/`https`, with a host, without user info.
    pub url: String,
    /// As step headers (§2), except that a string is sent as written (a
    /// sink's headers are no templates: there is no run to render them with).
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderValue>,
    /// A `reconciler.secrets` name: sign each request with HMAC-SHA256.
    #[serde(default)]
    pub signing_secret: Option<String>,
    /// Which events (§14) go to this sink; at least one.
    pub events: Vec<String>,
    /// Only events of these APIs; empty: every API.
    #[serde(default)]
    pub apis: Vec<String>,
    /// How long one attempt waits for an answer (default 10s).
    #[serde(default)]
    pub timeout: Option<Duration>,
}

impl SinkConfig {
    pub fn timeout_or_default(&self) -> std::time::Duration {
        self.timeout.map_or(DEFAULT_SINK_TIMEOUT, |d| d.0)
    }

    /// Whether an event of `kind` about `api` goes to this sink.
    pub fn wants(&self, kind: &str, api: &str) -> bool {
        self.events.iter().any(|e| e == kind) && (self.apis.is_empty() || self.apis.iter().any(|a| a == api))
    }

    /// The secret names this sink uses, each with the key that names it.
    pub fn secrets(&self, name: &str) -> Vec<(String, &str)> {
        let mut out = Vec::new();
        if let Some(secret) = &self.signing_secret {
            out.push((format!("notifications.sinks.{name}.signing_secret"), secret.as_str()));
        }
        for (header, value) in &self.headers {
            if let HeaderValue::Typed(typed) = value
                && let Some(secret) = &typed.secret
            {
                out.push((format!("notifications.sinks.{name}.headers.{header}.secret"), secret.as_str()));
            }
        }
        out
    }
}

impl NotificationsConfig {
    /// Shape and values, naming the key of the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |key: String, message: String| Error::Invalid { key, message };
        if !(1..=MAX_ATTEMPTS_LIMIT).contains(&self.max_attempts) {
            return Err(invalid(
                "notifications.max_attempts".into(),
                format!("must be between 1 and {MAX_ATTEMPTS_LIMIT}"),
            ));
        }
        if self.keep_delivered.0.is_zero() {
            return Err(invalid("notifications.keep_delivered".into(), "must be greater than zero".into()));
        }
        for (name, sink) in &self.sinks {
            let key = |field: &str| format!("notifications.sinks.{name}.{field}");
            if !kayra_core::names::is_label(name) {
                return Err(invalid(
                    format!("notifications.sinks.{name}"),
                    "a sink's name must be a DNS label (lower-case letters, digits and '-', at most 63)".into(),
                ));
            }
            check_sink_url(&sink.url).map_err(|message| invalid(key("url"), message))?;
            if sink.events.is_empty() {
                return Err(invalid(key("events"), "must list at least one event".into()));
            }
            for event in &sink.events {
                if !kayra_core::notifications::EVENT_TYPES.contains(&event.as_str()) {
                    return Err(invalid(
                        key("events"),
                        format!(
                            "unknown event {event:?}; use one of {}",
                            kayra_core::notifications::EVENT_TYPES.join(", ")
                        ),
                    ));
                }
            }
            if let Some(api) = sink.apis.iter().find(|api| !kayra_core::names::is_subdomain(api)) {
                return Err(invalid(key("apis"), format!("{api:?} is not an API name (a DNS subdomain)")));
            }
            if sink.timeout.is_some_and(|t| t.0.is_zero() || t.0 > MAX_SINK_TIMEOUT) {
                return Err(invalid(key("timeout"), "must be greater than zero and at most 5m".into()));
            }
            if sink.signing_secret.as_deref() == Some("") {
                return Err(invalid(key("signing_secret"), "must name an entry of reconciler.secrets".into()));
            }
            for (header, value) in &sink.headers {
                if let HeaderValue::Typed(typed) = value {
                    typed.validate().map_err(|message| invalid(key(&format!("headers.{header}")), message))?;
                }
            }
        }
        Ok(())
    }

    /// Every secret name a sink uses must be an entry of
    /// `reconciler.secrets` (`secrets`): the reconciler and `kayra check`
    /// refuse an unknown one, naming the key.
    pub fn check_secrets(&self, secrets: &BTreeMap<String, SecretSource>) -> Result<(), Error> {
        for (name, sink) in &self.sinks {
            for (key, secret) in sink.secrets(name) {
                if !secrets.contains_key(secret) {
                    return Err(Error::Invalid {
                        key,
                        message: format!("unknown secret {secret:?}: not defined under reconciler.secrets"),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A sink's `url`: an absolute `http`/`https` URL with a host and without
/// user info. The message never quotes the URL (it may hold a password).
fn check_sink_url(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("is not a URL: {e}"))?;
    match parsed.scheme() {
        "http" | "https" if parsed.has_host() => {}
        "http" | "https" => return Err("the URL has no host".into()),
        other => return Err(format!("unsupported scheme {other:?}; use http or https")),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("the URL has user info; send credentials in a header".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn refused(yaml: &str) -> String {
        let config = Config::parse(yaml, "test.yaml").unwrap();
        config.validate().expect_err("refused").to_string()
    }

    const SINK: &str = "notifications:\n  sinks:\n    ops:\n      url: https://hooks.example.com/kayra\n";

    #[test]
    fn the_contract_example_parses_with_defaults() {
        let yaml = format!(
            "{SINK}      headers: {{Authorization: {{type: Bearer, secret: hook}}}}\n      signing_secret: hooksign\n      \
             events: [subscription.failed, subscription.recovered, fanout.completed, rollout.halted]\n      \
             apis: [compute.example.com]\n      timeout: 10s\n  max_attempts: 10\n  keep_delivered: 24h\n"
        );
        let config = Config::parse(&yaml, "test.yaml").unwrap();
        config.validate().unwrap();
        let sink = &config.notifications.sinks["ops"];
        assert!(sink.wants("fanout.completed", "compute.example.com"));
        assert!(!sink.wants("fanout.completed", "other.example.com"));
        assert!(!sink.wants("subscription.activated", "compute.example.com"));
        let defaults = Config::parse("", "empty").unwrap().notifications;
        assert_eq!((defaults.max_attempts, defaults.keep_delivered.0.as_secs()), (10, 86_400));
        assert!(defaults.sinks.is_empty());
    }

    #[test]
    fn bad_sinks_are_refused_naming_the_key() {
        let e = refused(&format!("{SINK}      events: [subscription.failed, subscription.exploded]\n"));
        assert!(e.contains("notifications.sinks.ops.events") && e.contains("subscription.exploded"), "{e}");
        let e = refused(&format!("{SINK}      events: []\n"));
        assert!(e.contains("notifications.sinks.ops.events"), "{e}");
        let e = refused(
            "notifications:\n  sinks:\n    ops:\n      url: https://user:hunter2@hooks.example.com/\n      \
             events: [fanout.completed]\n",
        );
        assert!(e.contains("notifications.sinks.ops.url") && e.contains("user info"), "{e}");
        assert!(!e.contains("hunter2"), "the URL's password is never shown: {e}");
        let e = refused(
            "notifications:\n  sinks:\n    ops:\n      url: ftp://hooks.example.com/\n      events: [fanout.completed]\n",
        );
        assert!(e.contains("notifications.sinks.ops.url"), "{e}");
        let e = refused(&format!("{SINK}      events: [fanout.completed]\n      timeout: 0s\n"));
        assert!(e.contains("notifications.sinks.ops.timeout"), "{e}");
        let e = refused(&format!("{SINK}      events: [fanout.completed]\n      headers: {{X-A: {{type: Bearer}}}}\n"));
        assert!(e.contains("notifications.sinks.ops.headers.X-A"), "{e}");
        let e = refused(&format!("{SINK}      events: [fanout.completed]\n      apis: [\"Not An Api\"]\n"));
        assert!(e.contains("notifications.sinks.ops.apis"), "{e}");
        let e = refused(&format!("{SINK}      events: [fanout.completed]\n  max_attempts: 0\n"));
        assert!(e.contains("notifications.max_attempts"), "{e}");
        let e = refused(
            "notifications:\n  sinks:\n    Ops_1:\n      url: https://h.example.com/\n      events: [fanout.completed]\n",
        );
        assert!(e.contains("notifications.sinks.Ops_1"), "{e}");
        let e = Config::parse(&format!("{SINK}      events: [fanout.completed]\n      colour: red\n"), "t")
            .expect_err("unknown key")
            .to_string();
        assert!(e.contains("notifications.sinks.ops") && e.contains("colour"), "{e}");
    }

    #[test]
    fn unknown_secrets_are_named_by_the_key_that_uses_them() {
        let yaml = format!(
            "{SINK}      events: [fanout.completed]\n      signing_secret: sign\n      \
             headers: {{Authorization: {{type: Bearer, secret: hook}}}}\n"
        );
        let mut config = Config::parse(&yaml, "test.yaml").unwrap();
        config.validate().unwrap();
        let e = config.notifications.check_secrets(&config.reconciler.secrets).unwrap_err().to_string();
        assert!(e.contains("notifications.sinks.ops.signing_secret") && e.contains("\"sign\""), "{e}");
        config.reconciler.secrets.insert("sign".into(), crate::SecretSource::Env("SIGN".into()));
        let e = config.notifications.check_secrets(&config.reconciler.secrets).unwrap_err().to_string();
        assert!(e.contains("notifications.sinks.ops.headers.Authorization.secret") && e.contains("\"hook\""), "{e}");
        config.reconciler.secrets.insert("hook".into(), crate::SecretSource::Env("HOOK".into()));
        config.notifications.check_secrets(&config.reconciler.secrets).unwrap();
    }
}
