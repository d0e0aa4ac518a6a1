//! `kayra.yaml`: every key of platform contract §2, its defaults, the
//! environment overrides, and the checks that stop a process at startup.
//!
//! Unknown keys are refused by serde (`deny_unknown_fields` on every
//! struct), so a typo never silently falls back to a default. Durations are
//! strings (`500ms`, `5s`, `1h`) parsed with `humantime`.
//!
//! # Layout
//! - this file: the typed tree, [`Config::load`], overrides, validation.
//! - [`step`]: the reconciler's HTTP step types (`reconciler.mode.<mode>`).
//! - [`notifications`]: `notifications`, the sinks of §14.
//! - [`duration`]: the string-duration wrapper.
//! - [`net`]: CIDRs (`server.trusted_proxies`).

pub mod duration;
pub mod net;
pub mod notifications;
pub mod step;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

pub use duration::Duration;
pub use net::Cidr;
pub use notifications::{NotificationsConfig, SinkConfig};
pub use step::{HeaderValue, MAX_STEP_TIMEOUT, Step, TypedHeader, WaitCondition};

/// Default for `reconciler.max_concurrent_reconciles`
/// (seed: `catalog.DefaultMaxConcurrentReconciles`).
pub const DEFAULT_MAX_CONCURRENT_RECONCILES: usize = 30;
/// Default for `reconciler.async_ack_timeout` (seed: `catalog.AsyncStepAckTimeout`).
pub const ASYNC_STEP_ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Default for `reconciler.limits.<mode>.max_retry_after`.
pub const DEFAULT_MAX_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(5 * 60);
/// Upper bound of `reconciler.limits.<mode>.max_retry_after`.
pub const MAX_RETRY_AFTER_LIMIT: std::time::Duration = std::time::Duration::from_secs(3600);
/// Upper bound of `reconciler.limits.<mode>.run_timeout`.
pub const MAX_RUN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// Default for `reconciler.wait_poll_interval` (seed: `catalog.WaitPollInterval`).
pub const WAIT_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// A step without `timeout` gets this.
pub const DEFAULT_STEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum Error {
    /// The file could not be read.
    #[error("read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed, has an unknown key or a bad value.
    #[error("config {path}: {message}")]
    Parse { path: String, message: String },
    /// A value parsed but breaks a rule; `key` is its dotted path.
    #[error("config: {key}: {message}")]
    Invalid { key: String, message: String },
}

/// The whole of `kayra.yaml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub platform: String,
    pub region: String,
    pub server: ServerConfig,
    pub database: DatabaseConfig,
    pub auth: AuthConfig,
    pub logging: LoggingConfig,
    pub reconciler: ReconcilerConfig,
    pub audit: AuditConfig,
    /// Where events go (§14).
    pub notifications: NotificationsConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            platform: "dev".into(),
            region: "local".into(),
            server: ServerConfig::default(),
            database: DatabaseConfig::default(),
            auth: AuthConfig::default(),
            logging: LoggingConfig::default(),
            reconciler: ReconcilerConfig::default(),
            audit: AuditConfig::default(),
            notifications: NotificationsConfig::default(),
        }
    }
}

/// Default for `audit.retention`.
pub const DEFAULT_AUDIT_RETENTION: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);
/// Bounds of `audit.retention`.
pub const AUDIT_RETENTION_RANGE: (std::time::Duration, std::time::Duration) =
    (std::time::Duration::from_secs(3600), std::time::Duration::from_secs(3650 * 86_400));

/// The audit trail (platform §13).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Changes to these RBAC resources are refused without `X-Kayra-Reason`.
    pub require_reason: Vec<String>,
    /// Older records are removed by any `kayra serve` (1h to 3650d).
    pub retention: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self { require_reason: Vec::new(), retention: Duration(DEFAULT_AUDIT_RETENTION) }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    pub max_body_bytes: usize,
    /// A request head must be complete within this, else the connection is closed.
    pub request_header_timeout: Duration,
    /// An idle keep-alive connection is closed after this.
    pub idle_timeout: Duration,
    pub tls: Option<ServerTls>,
    /// Open watch streams one user may hold (§17); past it 429.
    pub max_streams_per_user: usize,
    /// Open watch streams in all (§17); past it 503.
    pub max_streams: usize,
    /// Peers whose `X-Forwarded-For` is believed (CIDRs; default none).
    pub trusted_proxies: Vec<Cidr>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 1_048_576,
            request_header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            tls: None,
            max_streams_per_user: 100,
            max_streams: 10_000,
            trusted_proxies: Vec::new(),
        }
    }
}

/// HTTPS for `kayra serve`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Exactly one of `local` / `etcd`; with no `database` key at all, `local`
/// with its defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub local: Option<LocalConfig>,
    pub etcd: Option<EtcdConfig>,
    /// Deadline of every store call, all retries included; past it the
    /// call fails as unavailable (the API answers 503).
    #[serde(default = "default_request_timeout")]
    pub request_timeout: Duration,
}

/// Default for `database.request_timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn default_request_timeout() -> Duration {
    Duration(DEFAULT_REQUEST_TIMEOUT)
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self::local(LocalConfig::default())
    }
}

impl DatabaseConfig {
    /// The local store, with the default request timeout.
    pub fn local(local: LocalConfig) -> Self {
        Self { local: Some(local), etcd: None, request_timeout: default_request_timeout() }
    }

    /// etcd, with the default request timeout.
    pub fn etcd(etcd: EtcdConfig) -> Self {
        Self { local: None, etcd: Some(etcd), request_timeout: default_request_timeout() }
    }
}

/// The file-backed development store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    pub path: PathBuf,
    /// How often Watch polls the change log.
    pub poll_interval: Duration,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self { path: PathBuf::from(".kayra/kayra.db"), poll_interval: Duration::from_millis(200) }
    }
}

/// The production store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// Every key lives under it.
    pub prefix: String,
    /// Session lease TTL of the job locker.
    pub lock_ttl: Duration,
    /// TryLock retry interval while blocked on a job lock.
    pub lock_retry_interval: Duration,
    pub tls: Option<EtcdTls>,
    /// etcd authentication; the password comes from `KAYRA_ETCD_PASSWORD`.
    pub username: Option<String>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/kayra".into(),
            lock_ttl: Duration::from_secs(10),
            lock_retry_interval: Duration::from_millis(250),
            tls: None,
            username: None,
        }
    }
}

/// Client TLS towards etcd.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdTls {
    pub ca_file: PathBuf,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `KAYRA_BOOTSTRAP_TOKEN` overrides; empty disables bootstrap.
    pub bootstrap_token: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    pub format: LogFormat,
}

/// Everything `kayra reconciler` reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcilerConfig {
    /// `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    pub max_concurrent_reconciles: usize,
    /// Used for registrations with no mode of their own.
    pub default_mode: String,
    pub async_ack_timeout: Duration,
    pub wait_poll_interval: Duration,
    /// Runs kept per subscription (platform §4.4); 0 keeps none.
    pub run_history: usize,
    /// The longest output value a step may take from an answer (§17);
    /// a longer one fails the step.
    pub max_output_bytes: usize,
    /// Async requests a process keeps open after their ack; past it the
    /// oldest is abandoned.
    pub max_detached_requests: usize,
    /// A newer SyncID stops a run still working toward an older one.
    pub supersede: bool,
    /// Mode name → limits on its pipelines (platform §7).
    pub limits: BTreeMap<String, ModeLimits>,
    /// Secret name → where its value is read from, afresh at every run.
    pub secrets: BTreeMap<String, SecretSource>,
    /// Mode name → HTTP step pipeline.
    pub mode: BTreeMap<String, Vec<Step>>,
}

/// `reconciler.limits.<mode>`: every key may be left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeLimits {
    /// Pipelines of the mode running at once (fleet-wide on etcd).
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    /// Pipeline starts of the mode in any 60 s (fleet-wide on etcd).
    #[serde(default)]
    pub per_minute: Option<usize>,
    /// The longest one `429`'s `Retry-After` holds the mode; unset is
    /// [`DEFAULT_MAX_RETRY_AFTER`] (see [`ModeLimits::max_retry_after`]).
    #[serde(default)]
    pub max_retry_after: Option<Duration>,
    /// The longest a run of the mode may take (platform §12, "Run
    /// deadline"): one still going is stopped and recorded as failed with
    /// `run timeout of <this> exceeded`. Unset: no deadline.
    #[serde(default)]
    pub run_timeout: Option<Duration>,
}

impl ModeLimits {
    /// The cap on one `429`'s hold of the mode.
    pub fn max_retry_after(&self) -> std::time::Duration {
        self.max_retry_after.map_or(DEFAULT_MAX_RETRY_AFTER, |d| d.0)
    }

    /// The deadline of one run of the mode, if any.
    pub fn run_timeout(&self) -> Option<std::time::Duration> {
        self.run_timeout.map(|d| d.0)
    }
}

/// `reconciler.secrets.<name>`: exactly one of `env` / `file`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawSecretSource")]
pub enum SecretSource {
    /// The value of this environment variable.
    Env(String),
    /// The contents of this file, less one trailing newline.
    File(PathBuf),
}

/// The file form of a [`SecretSource`], before "exactly one" is checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecretSource {
    #[serde(default)]
    env: Option<String>,
    #[serde(default)]
    file: Option<PathBuf>,
}

impl TryFrom<RawSecretSource> for SecretSource {
    type Error = String;
    fn try_from(raw: RawSecretSource) -> Result<Self, String> {
        match (raw.env, raw.file) {
            (Some(env), None) => Ok(Self::Env(env)),
            (None, Some(file)) => Ok(Self::File(file)),
            _ => Err("set exactly one of env and file".into()),
        }
    }
}

/// Upper bound of `reconciler.max_concurrent_reconciles`.
pub const MAX_CONCURRENT_RECONCILES_LIMIT: usize = 10_000;
/// Default for `reconciler.run_history`.
pub const DEFAULT_RUN_HISTORY: usize = 20;
/// Upper bound of `reconciler.run_history`.
pub const MAX_RUN_HISTORY: usize = 1_000;
/// Default for `reconciler.max_output_bytes`.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// Upper bound of `reconciler.max_output_bytes`.
pub const MAX_OUTPUT_BYTES_LIMIT: usize = 1024 * 1024;
/// Default for `reconciler.max_detached_requests`.
pub const DEFAULT_MAX_DETACHED_REQUESTS: usize = 1_000;

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8081".into(),
            max_concurrent_reconciles: DEFAULT_MAX_CONCURRENT_RECONCILES,
            default_mode: String::new(),
            async_ack_timeout: Duration(ASYNC_STEP_ACK_TIMEOUT),
            wait_poll_interval: Duration(WAIT_POLL_INTERVAL),
            run_history: DEFAULT_RUN_HISTORY,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_detached_requests: DEFAULT_MAX_DETACHED_REQUESTS,
            supersede: true,
            limits: BTreeMap::new(),
            secrets: BTreeMap::new(),
            mode: BTreeMap::new(),
        }
    }
}

impl ReconcilerConfig {
    /// The mode a registration reconciles with: its own, else `default_mode`.
    /// `None` when neither is set: reconcile must fail (seed, "Reconcile").
    pub fn resolve_mode<'a>(&'a self, registration_mode: &'a str) -> Option<&'a str> {
        [registration_mode, self.default_mode.as_str()].into_iter().find(|m| !m.is_empty())
    }
}

/// Environment overrides, passed in so tests never touch the process env.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub platform: Option<String>,
    pub region: Option<String>,
    pub bootstrap_token: Option<String>,
}

impl Env {
    /// `INFRAPI_APP_PLATFORM`, `INFRAPI_APP_REGION`, `KAYRA_BOOTSTRAP_TOKEN`.
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            platform: var("INFRAPI_APP_PLATFORM"),
            region: var("INFRAPI_APP_REGION"),
            bootstrap_token: var("KAYRA_BOOTSTRAP_TOKEN"),
        }
    }
}

impl Config {
    /// Loads `path`, or `./kayra.yaml` when present, or the defaults; then
    /// applies `env` and validates.
    pub fn load(path: Option<&Path>, env: &Env) -> Result<Self, Error> {
        let default_path = Path::new("kayra.yaml");
        let path = match path {
            Some(p) => Some(p),
            None if default_path.exists() => Some(default_path),
            None => None,
        };
        let mut config = match path {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|source| Error::Read { path: p.to_path_buf(), source })?;
                Self::parse(&text, &p.display().to_string())?
            }
            None => Self::default(),
        };
        config.apply_env(env);
        config.validate()?;
        Ok(config)
    }

    /// Parses YAML text; `origin` names it in errors. No env, no validation.
    pub fn parse(text: &str, origin: &str) -> Result<Self, Error> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        // serde_path_to_error names the full dotted key of a bad value, which
        // serde_norway alone only does for some errors.
        serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(text)).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner().to_string();
            let message =
                if key.is_empty() || key == "." || inner.starts_with(&key) { inner } else { format!("{key}: {inner}") };
            Error::Parse { path: origin.to_string(), message }
        })
    }

    pub fn apply_env(&mut self, env: &Env) {
        if let Some(p) = &env.platform {
            self.platform = p.clone();
        }
        if let Some(r) = &env.region {
            self.region = r.clone();
        }
        if let Some(t) = &env.bootstrap_token {
            self.auth.bootstrap_token = t.clone();
        }
    }

    /// Checks the rules serde cannot express.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |key: &str, message: &str| Error::Invalid { key: key.into(), message: message.into() };
        for (key, value) in [("platform", &self.platform), ("region", &self.region)] {
            if !kayra_core::names::is_label(value) {
                return Err(Error::Invalid {
                    key: key.into(),
                    message: format!(
                        "{value:?} is not a DNS label (lower-case letters, digits and '-', at most 63, \
                         starting and ending with a letter or digit)"
                    ),
                });
            }
        }
        if self.database.request_timeout.0.is_zero() {
            return Err(invalid("database.request_timeout", "must be greater than zero"));
        }
        if self.server.request_header_timeout.0.is_zero() {
            return Err(invalid("server.request_header_timeout", "must be greater than zero"));
        }
        if self.server.idle_timeout.0.is_zero() {
            return Err(invalid("server.idle_timeout", "must be greater than zero"));
        }
        match (&self.database.local, &self.database.etcd) {
            (Some(_), Some(_)) => {
                return Err(invalid("database", "set exactly one of database.local and database.etcd, not both"));
            }
            (None, None) => return Err(invalid("database", "set exactly one of database.local and database.etcd")),
            (None, Some(etcd)) => {
                if etcd.endpoints.is_empty() {
                    return Err(invalid("database.etcd.endpoints", "must list at least one endpoint"));
                }
                if etcd.lock_ttl.0 < std::time::Duration::from_secs(1) {
                    return Err(invalid("database.etcd.lock_ttl", "must be at least 1s"));
                }
                if etcd.lock_retry_interval.0.is_zero() {
                    return Err(invalid("database.etcd.lock_retry_interval", "must be greater than zero"));
                }
            }
            (Some(local), None) => {
                if local.poll_interval.0.is_zero() {
                    return Err(invalid("database.local.poll_interval", "must be greater than zero"));
                }
            }
        }
        for (key, value) in [("server.listen", &self.server.listen), ("reconciler.listen", &self.reconciler.listen)] {
            check_listen(value).map_err(|message| invalid(key, &message))?;
        }
        if self.server.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be greater than zero"));
        }
        if self.server.max_streams_per_user == 0 {
            return Err(invalid("server.max_streams_per_user", "must be greater than zero"));
        }
        if self.server.max_streams == 0 {
            return Err(invalid("server.max_streams", "must be greater than zero"));
        }
        let (shortest, longest) = AUDIT_RETENTION_RANGE;
        if !(shortest..=longest).contains(&self.audit.retention.0) {
            return Err(invalid("audit.retention", "must be between 1h and 3650d"));
        }
        for (i, resource) in self.audit.require_reason.iter().enumerate() {
            if !kayra_core::audit::CATALOG_RESOURCES.contains(&resource.as_str()) {
                return Err(Error::Invalid {
                    key: format!("audit.require_reason[{i}]"),
                    message: format!(
                        "{resource:?} is not an RBAC resource of the catalog API; known: {}",
                        kayra_core::audit::CATALOG_RESOURCES.join(", ")
                    ),
                });
            }
        }
        if !(1..=MAX_CONCURRENT_RECONCILES_LIMIT).contains(&self.reconciler.max_concurrent_reconciles) {
            return Err(Error::Invalid {
                key: "reconciler.max_concurrent_reconciles".into(),
                message: format!("must be between 1 and {MAX_CONCURRENT_RECONCILES_LIMIT}"),
            });
        }
        if self.reconciler.run_history > MAX_RUN_HISTORY {
            return Err(Error::Invalid {
                key: "reconciler.run_history".into(),
                message: format!("must be between 0 and {MAX_RUN_HISTORY}"),
            });
        }
        if !(1..=MAX_OUTPUT_BYTES_LIMIT).contains(&self.reconciler.max_output_bytes) {
            return Err(Error::Invalid {
                key: "reconciler.max_output_bytes".into(),
                message: format!("must be between 1 and {MAX_OUTPUT_BYTES_LIMIT}"),
            });
        }
        if self.reconciler.max_detached_requests == 0 {
            return Err(invalid("reconciler.max_detached_requests", "must be at least 1"));
        }
        for (mode, limits) in &self.reconciler.limits {
            for (name, value) in [("max_in_flight", limits.max_in_flight), ("per_minute", limits.per_minute)] {
                if value == Some(0) {
                    return Err(Error::Invalid {
                        key: format!("reconciler.limits.{mode}.{name}"),
                        message: "must be at least 1".into(),
                    });
                }
            }
            if let Some(Duration(cap)) = limits.max_retry_after
                && (cap.is_zero() || cap > MAX_RETRY_AFTER_LIMIT)
            {
                return Err(Error::Invalid {
                    key: format!("reconciler.limits.{mode}.max_retry_after"),
                    message: "must be greater than zero and at most 1h".into(),
                });
            }
            if let Some(Duration(deadline)) = limits.run_timeout
                && (deadline.is_zero() || deadline > MAX_RUN_TIMEOUT)
            {
                return Err(Error::Invalid {
                    key: format!("reconciler.limits.{mode}.run_timeout"),
                    message: "must be greater than zero and at most 24h".into(),
                });
            }
        }
        for (name, source) in &self.reconciler.secrets {
            let empty = match source {
                SecretSource::Env(var) => var.is_empty(),
                SecretSource::File(path) => path.as_os_str().is_empty(),
            };
            if empty {
                return Err(Error::Invalid {
                    key: format!("reconciler.secrets.{name}"),
                    message: "names no environment variable or file".into(),
                });
            }
        }
        if self.reconciler.wait_poll_interval.0.is_zero() {
            return Err(invalid("reconciler.wait_poll_interval", "must be greater than zero"));
        }
        // Both feed clock arithmetic at run time; a day is far past any use.
        for (key, value) in [
            ("reconciler.wait_poll_interval", self.reconciler.wait_poll_interval),
            ("reconciler.async_ack_timeout", self.reconciler.async_ack_timeout),
        ] {
            if value.0 > MAX_STEP_TIMEOUT {
                return Err(invalid(key, "must be at most 24h"));
            }
        }
        for (mode, steps) in &self.reconciler.mode {
            for (index, step) in steps.iter().enumerate() {
                step.validate().map_err(|(field, message)| Error::Invalid {
                    key: format!("reconciler.mode.{mode}[{index}].{field}"),
                    message,
                })?;
            }
        }
        self.notifications.validate()
    }
}

/// A listen address is `ip:port` or `hostname:port`: a host that looks
/// like an IPv4 address (digits and dots only) must be one, so
/// `999.1.1.1:80` is refused here instead of at bind time, after a DNS
/// lookup of a name no resolver has.
pub fn check_listen(value: &str) -> Result<(), String> {
    if value.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(format!("{value:?} is not host:port"));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("{value:?}: port {port:?} is not a number from 0 to 65535"));
    }
    if host.starts_with('[') || host.contains(':') {
        return Err(format!("{value:?}: {host:?} is not an IPv6 address"));
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("{value:?}: {host:?} is not an IPv4 address"));
    }
    if !host.split('.').all(|label| kayra_core::names::is_label(&label.to_ascii_lowercase())) {
        return Err(format!("{value:?}: {host:?} is not an IP address or a host name"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        let r = Config::parse(text, "test.yaml").and_then(|c| c.validate().map(|_| c));
        r.expect_err("config should be refused").to_string()
    }

    #[test]
    fn defaults_work_without_a_file() {
        let c = Config::load(Some(Path::new("/nonexistent/kayra.yaml")), &Env::default());
        assert!(c.is_err(), "an explicit missing file is an error");
        let c = Config::parse("", "empty").unwrap();
        c.validate().unwrap();
        assert_eq!(c.platform, "dev");
        assert_eq!(c.region, "local");
        assert_eq!(c.server.listen, "127.0.0.1:8080");
        assert_eq!(c.database.local.as_ref().unwrap().path, PathBuf::from(".kayra/kayra.db"));
        assert_eq!(c.reconciler.max_concurrent_reconciles, 30);
        assert_eq!(c.reconciler.async_ack_timeout.0, ASYNC_STEP_ACK_TIMEOUT);
        assert_eq!(c.reconciler.wait_poll_interval.0, WAIT_POLL_INTERVAL);
    }

    #[test]
    fn full_contract_example_parses() {
        let text = r#"
platform: dev
region: local
server:
  listen: 127.0.0.1:8080
  max_body_bytes: 1048576
  tls: {cert_file: server.pem, key_file: server-key.pem}
database:
  etcd:
    endpoints: ["http://127.0.0.1:2379"]
    prefix: /kayra
    lock_ttl: 10s
    lock_retry_interval: 250ms
    tls: {ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem}
    username: kayra
auth:
  bootstrap_token: ""
logging:
  format: json
reconciler:
  listen: 127.0.0.1:8081
  max_concurrent_reconciles: 30
  default_mode: trigger
  async_ack_timeout: 2s
  wait_poll_interval: 5s
  mode:
    api:
      - method: post
        endpoint: "https://x/{{ .Subscription.Namespace }}"
        data: {sync_id: "{{ .Subscription.ExpectedSyncID }}", n: 3}
        headers:
          Authorization: {type: Bearer, value: "tok"}
          X-Plain: "v"
        timeout: "3600s"
        async: true
      - method: GET
        endpoint: "https://x/status"
        outputs: {PipelineID: ".id"}
        wait:
          - key: .status
            successes: [done]
            failures: [failed]
"#;
        let c = Config::parse(text, "t").unwrap();
        c.validate().unwrap();
        assert_eq!(c.logging.format, LogFormat::Json);
        let etcd = c.database.etcd.as_ref().unwrap();
        assert_eq!(etcd.lock_retry_interval.0, std::time::Duration::from_millis(250));
        let steps = &c.reconciler.mode["api"];
        assert!(steps[0].is_async);
        assert_eq!(steps[0].timeout.unwrap().0, std::time::Duration::from_secs(3600));
        assert_eq!(steps[0].data.as_ref().unwrap()["n"], 3);
        assert_eq!(steps[1].wait[0].failures, vec!["failed"]);
    }

    #[test]
    fn audit_settings_are_checked_naming_the_key() {
        let c = Config::parse("", "t").unwrap();
        assert_eq!(c.audit.retention.0, DEFAULT_AUDIT_RETENTION);
        assert!(c.audit.require_reason.is_empty() && c.server.trusted_proxies.is_empty());
        let text = "audit: {retention: 90d, require_reason: [apiregistrations/sync, apiregistrations/rollout]}\n\
                    server: {trusted_proxies: [10.0.0.0/8, \"::1\"]}";
        let c = Config::parse(text, "t").unwrap();
        c.validate().unwrap();
        assert_eq!(c.audit.retention.0, std::time::Duration::from_secs(90 * 86_400));
        assert!(c.server.trusted_proxies[0].contains("10.9.8.7".parse().unwrap()));
        for (text, key) in [
            ("audit: {retention: 59m}", "audit.retention"),
            ("audit: {retention: 3651d}", "audit.retention"),
            ("audit: {require_reason: [namespaces, apiregistration/sync]}", "audit.require_reason[1]"),
        ] {
            let e = err(text);
            assert!(e.contains(key), "{text}: {e}");
        }
        let e = err("server: {trusted_proxies: [10.0.0.0/40]}");
        assert!(e.contains("trusted_proxies") && e.contains("prefix length"), "{e}");
        let e = err("audit: {retention: soon}");
        assert!(e.contains("retention"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        assert!(err("servr: {}").contains("servr"));
        assert!(err("server:\n  lisen: x\n").contains("lisen"));
        assert!(
            err("reconciler:\n  mode:\n    api:\n      - method: get\n        endpoint: x\n        retries: 3\n")
                .contains("retries")
        );
    }

    #[test]
    fn bad_durations_are_named() {
        let e = err("reconciler:\n  wait_poll_interval: soon\n");
        assert!(e.contains("wait_poll_interval"), "{e}");
        let e = err("database:\n  local:\n    poll_interval: 5 parsecs\n");
        assert!(e.contains("poll_interval"), "{e}");
    }

    #[test]
    fn exactly_one_database() {
        assert!(err("database: {}").contains("exactly one"));
        assert!(err("database:\n  local: {}\n  etcd: {}\n").contains("not both"));
    }

    #[test]
    fn bad_step_names_mode_index_and_field() {
        let e = err(
            "reconciler:\n  mode:\n    api:\n      - method: get\n        endpoint: x\n      - method: fetch\n        endpoint: x\n",
        );
        assert!(e.contains("reconciler.mode.api[1].method"), "{e}");
    }

    #[test]
    fn new_keys_parse_with_defaults() {
        let c = Config::parse(
            "server:\n  request_header_timeout: 3s\n  idle_timeout: 30s\ndatabase:\n  request_timeout: 2s\n  local: {}\n\
             reconciler:\n  run_history: 5\n  max_detached_requests: 10\n  supersede: false\n  limits:\n    trigger: {max_in_flight: 2}\n\
             \x20 secrets:\n    gitlab: {env: GITLAB_TOKEN}\n    other: {file: /run/secrets/x}\n",
            "t",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.server.request_header_timeout.0, std::time::Duration::from_secs(3));
        assert_eq!(c.database.request_timeout.0, std::time::Duration::from_secs(2));
        assert_eq!(c.reconciler.run_history, 5);
        assert!(!c.reconciler.supersede);
        assert_eq!(c.reconciler.limits["trigger"], ModeLimits { max_in_flight: Some(2), ..ModeLimits::default() });
        assert_eq!(c.reconciler.limits["trigger"].max_retry_after(), DEFAULT_MAX_RETRY_AFTER);
        assert_eq!(c.reconciler.secrets["gitlab"], SecretSource::Env("GITLAB_TOKEN".into()));
        let d = Config::default();
        assert_eq!(d.database.request_timeout.0, DEFAULT_REQUEST_TIMEOUT);
        assert_eq!((d.reconciler.run_history, d.reconciler.max_detached_requests), (20, 1000));
        assert_eq!(d.reconciler.max_output_bytes, 65536);
        let c = Config::parse("reconciler:\n  max_output_bytes: 1048576\n", "t").unwrap();
        c.validate().unwrap();
        assert_eq!(c.reconciler.max_output_bytes, 1048576);
        assert!(d.reconciler.supersede);
    }

    #[test]
    fn out_of_range_values_are_named() {
        let e = err("reconciler:\n  max_concurrent_reconciles: 4611686018427387904\n");
        assert!(e.contains("max_concurrent_reconciles"), "{e}");
        let e = err("reconciler:\n  max_concurrent_reconciles: 10001\n");
        assert!(e.contains("max_concurrent_reconciles"), "{e}");
        let e = err("reconciler:\n  limits:\n    trigger: {per_minute: 0}\n");
        assert!(e.contains("reconciler.limits.trigger.per_minute"), "{e}");
        for bad in ["0", "1048577", "-1", "\"64k\""] {
            let e = err(&format!("reconciler:\n  max_output_bytes: {bad}\n"));
            assert!(e.contains("max_output_bytes"), "{bad}: {e}");
        }
        let e = err("reconciler:\n  secrets:\n    x: {env: A, file: /b}\n");
        assert!(e.contains("secrets"), "{e}");
        let e = err("platform: prod/eu\n");
        assert!(e.contains("platform"), "{e}");
        let e = err("region: EU\n");
        assert!(e.contains("region"), "{e}");
        let e = err("database:\n  request_timeout: 0s\n  local: {}\n");
        assert!(e.contains("database.request_timeout"), "{e}");
        let e = err("reconciler:\n  wait_poll_interval: 300000000000y\n");
        assert!(e.contains("reconciler.wait_poll_interval: must be at most 24h"), "{e}");
        let e = err("reconciler:\n  async_ack_timeout: 25h\n");
        assert!(e.contains("reconciler.async_ack_timeout"), "{e}");
    }

    #[test]
    fn stream_caps_default_to_100_and_10000_and_refuse_zero_naming_the_key() {
        let c = Config::parse("", "t").unwrap();
        c.validate().unwrap();
        assert_eq!((c.server.max_streams_per_user, c.server.max_streams), (100, 10_000));
        let c = Config::parse("server: {max_streams_per_user: 1, max_streams: 1}", "t").unwrap();
        c.validate().unwrap();
        assert_eq!((c.server.max_streams_per_user, c.server.max_streams), (1, 1));
        for (text, key) in [
            ("server: {max_streams_per_user: 0}", "server.max_streams_per_user"),
            ("server: {max_streams: 0}", "server.max_streams"),
        ] {
            let e = err(text);
            assert_eq!(e, format!("config: {key}: must be greater than zero"), "{text}");
        }
        for text in ["server: {max_streams: -1}", "server: {max_streams_per_user: many}"] {
            let e = err(text);
            assert!(e.contains("max_streams"), "{text}: {e}");
        }
    }

    #[test]
    fn max_retry_after_is_above_zero_and_at_most_an_hour() {
        let limits = |v: &str| format!("reconciler:\n  limits:\n    trigger: {{max_retry_after: \"{v}\"}}\n");
        for bad in ["0s", "0ms", "3601s", "2h", "300000000000y"] {
            let e = err(&limits(bad));
            assert!(
                e.contains("reconciler.limits.trigger.max_retry_after: must be greater than zero and at most 1h"),
                "{bad}: {e}"
            );
        }
        let e = err(&limits("soon"));
        assert!(e.contains("reconciler.limits.trigger.max_retry_after") && e.contains("invalid duration"), "{e}");
        for (good, want) in [("1s", 1), ("5m", 300), ("1h", 3600)] {
            let c = Config::parse(&limits(good), "t").unwrap();
            c.validate().unwrap();
            let cap = c.reconciler.limits["trigger"].max_retry_after();
            assert_eq!(cap, std::time::Duration::from_secs(want), "{good}");
        }
        let c = Config::parse("reconciler:\n  limits:\n    trigger: {per_minute: 3}\n", "t").unwrap();
        assert_eq!(c.reconciler.limits["trigger"].max_retry_after(), std::time::Duration::from_secs(300));
    }

    #[test]
    fn run_timeout_is_above_zero_and_at_most_a_day() {
        let limits = |v: &str| format!("reconciler:\n  limits:\n    trigger: {{run_timeout: \"{v}\"}}\n");
        for bad in ["0s", "0ms", "24h 1s", "25h", "300000000000y"] {
            let e = err(&limits(bad));
            assert!(
                e.contains("reconciler.limits.trigger.run_timeout: must be greater than zero and at most 24h"),
                "{bad}: {e}"
            );
        }
        let e = err(&limits("soon"));
        assert!(e.contains("reconciler.limits.trigger.run_timeout") && e.contains("invalid duration"), "{e}");
        for (good, want) in [("1s", 1), ("30m", 1800), ("24h", 86400)] {
            let c = Config::parse(&limits(good), "t").unwrap();
            c.validate().unwrap();
            assert_eq!(c.reconciler.limits["trigger"].run_timeout(), Some(std::time::Duration::from_secs(want)));
        }
        let c = Config::parse("reconciler:\n  limits:\n    trigger: {per_minute: 3}\n", "t").unwrap();
        assert_eq!(c.reconciler.limits["trigger"].run_timeout(), None, "no deadline unless configured");
    }

    #[test]
    fn step_timeouts_over_a_day_are_refused() {
        let step = |t: &str| {
            format!("reconciler:\n  mode:\n    api:\n      - {{method: get, endpoint: x, timeout: \"{t}\"}}\n")
        };
        for t in ["300000000000y", "25h", "86401s"] {
            let e = err(&step(t));
            assert!(e.contains("reconciler.mode.api[0].timeout: must be at most 24h"), "{t}: {e}");
        }
        let c = Config::parse(&step("24h"), "t").unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn header_forms_parse_and_bad_ones_are_named() {
        let yaml = "reconciler:\n  mode:\n    api:\n      - method: get\n        endpoint: x\n        headers:\n\
                    \x20         A: plain\n          B: {type: Bearer, value: v}\n          C: {type: Bearer, secret: s}\n\
                    \x20         D: {secret: s}\n          E: 50\n";
        let c = Config::parse(yaml, "t").unwrap();
        c.validate().unwrap();
        let headers = &c.reconciler.mode["api"][0].headers;
        assert!(matches!(&headers["A"], HeaderValue::Plain(v) if v == "plain"));
        assert!(
            matches!(&headers["C"], HeaderValue::Typed(TypedHeader { kind: Some(k), value: None, secret: Some(s) }) if k == "Bearer" && s == "s")
        );
        assert!(matches!(&headers["D"], HeaderValue::Typed(TypedHeader { kind: None, secret: Some(_), .. })));
        assert!(matches!(&headers["E"], HeaderValue::Plain(v) if v == "50"));
        let header = |h: &str| {
            format!(
                "reconciler:\n  mode:\n    api:\n      - method: get\n        endpoint: x\n        headers: {{X: {h}}}\n"
            )
        };
        for (h, want) in [
            ("{type: Bearer, value: v, secret: s}", "reconciler.mode.api[0].headers.X: set one of value and secret"),
            ("{type: Bearer}", "reconciler.mode.api[0].headers.X: needs value"),
            ("{value: v}", "reconciler.mode.api[0].headers.X: needs type with value"),
            ("{secret: \"\"}", "reconciler.mode.api[0].headers.X: secret must name"),
        ] {
            let e = err(&header(h));
            assert!(e.contains(want), "{h}: {e}");
        }
        let e = err(&header("{secrt: s}"));
        assert!(e.contains("secrt"), "{e}");
    }

    #[test]
    fn env_overrides_file() {
        let mut c = Config::parse("platform: p1\nregion: r1\n", "t").unwrap();
        c.apply_env(&Env { platform: Some("p2".into()), region: None, bootstrap_token: Some("t".into()) });
        assert_eq!((c.platform.as_str(), c.region.as_str()), ("p2", "r1"));
        assert_eq!(c.auth.bootstrap_token, "t");
    }

    #[test]
    fn mode_resolution() {
        let mut r = ReconcilerConfig::default();
        assert_eq!(r.resolve_mode(""), None);
        r.default_mode = "trigger".into();
        assert_eq!(r.resolve_mode(""), Some("trigger"));
        assert_eq!(r.resolve_mode("api"), Some("api"));
    }

    #[test]
    fn listen_addresses_are_ip_or_host_name_with_a_port() {
        for good in ["127.0.0.1:8080", "0.0.0.0:0", "[::1]:8081", "localhost:8080", "api.Example.com:443"] {
            assert_eq!(check_listen(good), Ok(()), "{good}");
        }
        for bad in
            ["999.1.1.1:80", "127.0.0.1", "127.0.0.1:99999", "localhost:", ":8080", "[::1:80", "a b:80", "x..y:80"]
        {
            assert!(check_listen(bad).is_err(), "{bad} accepted");
        }
        let mut c = Config::default();
        c.database.local = Some(Default::default());
        c.validate().unwrap();
        c.reconciler.listen = "999.1.1.1:80".into();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("reconciler.listen") && err.contains("999.1.1.1"), "{err}");
    }
}
