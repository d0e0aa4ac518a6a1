//! Notifications (platform §14): the configured sinks ([`Sinks`]), the
//! deliveries an event makes, and the notifier every reconciler runs to
//! send them ([`Notifier`]).
//!
//! Events are stored as deliveries (one per event and sink) in the same
//! transaction as the write that causes them: the reconciler's result
//! ([`crate::ensure`]) or a completed fan-out ([`crate::fanout`]). The
//! notifier watches the deliveries of this deployment (a [`Reflector`]),
//! picks the pending ones that are due and **claims** each by
//! compare-and-swap before it sends it: a claim `{owner, until}` makes the
//! others skip it until `until` (the sink's timeout plus a margin), so each
//! (event, sink) is sent by one process at a time, and a killed process's
//! claim runs out and another sends it again (at least once; the id stays).
//! The answer settles the delivery with compare-and-swap on the claimed
//! revision: a 2xx is `delivered`; anything else, or no answer within the
//! sink's `timeout`, is tried again after 1 s doubling to 5 min (with
//! jitter; a longer `Retry-After` wins), until `max_attempts`: then `dead`.
//! Delivered ones older than `keep_delivered` are deleted here too.
//!
//! A sink's secret values (its header secrets, its signing secret) are
//! read afresh for every attempt and appear in no log line, record or
//! error: errors name the secret, an answer's body that holds a value is
//! not shown.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use kayra_catalog::repo::{Collection, RecordRef, Repository};
use kayra_config::{HeaderValue, NotificationsConfig, ReconcilerConfig, SecretSource};
use kayra_core::notifications::{Claim, Delivery, DeliveryState, Event};
use kayra_core::runs::shown;
use kayra_store::Revision;
use kayra_store::reflector::Reflector;
use reqwest::header::{HeaderMap, HeaderName};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub const METRIC_NOTIFICATIONS: &str = "kayra_notifications_total";
pub const METRIC_PENDING: &str = "kayra_notifications_pending";

/// Deliveries one process sends at once.
pub const MAX_IN_FLIGHT: usize = 16;
/// The first pause after a failed attempt; it doubles up to [`MAX_BACKOFF`].
pub const RETRY_BASE: Duration = Duration::from_secs(1);
/// The longest pause between two attempts (a `Retry-After` may ask more,
/// up to [`MAX_RETRY_AFTER`]).
pub const MAX_BACKOFF: Duration = Duration::from_secs(5 * 60);
/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// A claim lasts the sink's timeout plus this: time to settle the answer.
const CLAIM_MARGIN: Duration = Duration::from_secs(2);
/// How often the notifier looks for due deliveries.
const TICK: Duration = Duration::from_millis(100);
/// How often delivered ones past `keep_delivered` are looked for.
const CLEANUP_EVERY: Duration = Duration::from_secs(10);
/// How much of an answer's body `last_error` quotes.
const BODY_SHOWN: usize = 256;

/// One header of a sink, as configured.
#[derive(Debug, Clone)]
enum SinkHeader {
    /// Sent as written.
    Text(String),
    /// `[<type> ]<secret's value>`.
    Secret { kind: Option<String>, name: String },
}

/// One compiled sink.
#[derive(Debug, Clone)]
struct Sink {
    url: reqwest::Url,
    headers: Vec<(HeaderName, SinkHeader)>,
    signing_secret: Option<String>,
    config: kayra_config::SinkConfig,
    timeout: Duration,
}

/// `notifications`, checked and ready to send: every header name parsed,
/// every secret name resolved against `reconciler.secrets`.
#[derive(Debug, Clone, Default)]
pub struct Sinks {
    sinks: BTreeMap<String, Sink>,
    secrets: BTreeMap<String, SecretSource>,
    max_attempts: u32,
    keep_delivered: Duration,
}

impl Sinks {
    /// The reconciler's (and `kayra check`'s) startup check of the sinks:
    /// the error names the key (an unknown secret, a bad header).
    pub fn compile(
        notifications: &NotificationsConfig,
        reconciler: &ReconcilerConfig,
    ) -> Result<Self, kayra_config::Error> {
        notifications.validate()?;
        notifications.check_secrets(&reconciler.secrets)?;
        let mut sinks = BTreeMap::new();
        for (name, config) in &notifications.sinks {
            let invalid = |field: String, message: String| kayra_config::Error::Invalid {
                key: format!("notifications.sinks.{name}.{field}"),
                message,
            };
            let url =
                reqwest::Url::parse(&config.url).map_err(|e| invalid("url".into(), format!("is not a URL: {e}")))?;
            let mut headers = Vec::new();
            for (header, value) in &config.headers {
                let key = format!("headers.{header}");
                let parsed = HeaderName::from_bytes(header.as_bytes())
                    .map_err(|_| invalid(key.clone(), "is not a valid HTTP header name".into()))?;
                let value = match value {
                    HeaderValue::Plain(text) => SinkHeader::Text(text.clone()),
                    HeaderValue::Typed(typed) => match (&typed.kind, &typed.value, &typed.secret) {
                        (kind, None, Some(secret)) => SinkHeader::Secret { kind: kind.clone(), name: secret.clone() },
                        (Some(kind), Some(value), None) => SinkHeader::Text(format!("{kind} {value}")),
                        _ => return Err(invalid(key, "needs {type, value}, {type, secret} or {secret}".into())),
                    },
                };
                if let SinkHeader::Text(text) = &value
                    && reqwest::header::HeaderValue::from_str(text).is_err()
                {
                    return Err(invalid(key, "is not a valid HTTP header value".into()));
                }
                headers.push((parsed, value));
            }
            let sink = Sink {
                url,
                headers,
                signing_secret: config.signing_secret.clone(),
                config: config.clone(),
                timeout: config.timeout_or_default(),
            };
            sinks.insert(name.clone(), sink);
        }
        Ok(Self {
            sinks,
            secrets: reconciler.secrets.clone(),
            max_attempts: notifications.max_attempts,
            keep_delivered: notifications.keep_delivered.0,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }

    /// The sink names, for the metrics described at startup.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.sinks.keys().map(String::as_str)
    }

    /// Whether any sink wants events of `kind` about `api`.
    pub fn wants(&self, kind: &str, api: &str) -> bool {
        self.sinks.values().any(|s| s.config.wants(kind, api))
    }

    /// Whether any sink wants events of `kind` at all.
    pub fn wants_kind(&self, kind: &str) -> bool {
        self.sinks.values().any(|s| s.config.events.iter().any(|e| e == kind))
    }

    /// The deliveries of `event`: one per sink whose `events` and `apis` match.
    pub fn deliveries(&self, event: &Event) -> Vec<Delivery> {
        let wanting = self.sinks.iter().filter(|(_, s)| s.config.wants(&event.kind, &event.api));
        wanting.map(|(name, _)| Delivery::new(event, name)).collect()
    }

    /// Reads the values of the secrets `sink` uses, now.
    async fn read_secrets(&self, sink: &Sink) -> Result<BTreeMap<String, String>, String> {
        let names = sink.signing_secret.iter().chain(sink.headers.iter().filter_map(|(_, h)| match h {
            SinkHeader::Secret { name, .. } => Some(name),
            SinkHeader::Text(_) => None,
        }));
        let mut values = BTreeMap::new();
        for name in names {
            let source = self.secrets.get(name).ok_or_else(|| format!("secret {name:?} is not defined"))?;
            let value = kayra_pipeline::read_secret(source).await.map_err(|why| format!("secret {name:?}: {why}"))?;
            values.insert(name.clone(), value);
        }
        Ok(values)
    }
}

/// `Kayra-Signature`'s value for `body` sent at `timestamp` (Unix
/// seconds): `sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`.
pub fn signature(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The pause before attempt `attempts + 1`, after `attempts` failed ones:
/// `base` doubling per attempt, at most [`MAX_BACKOFF`], less up to a
/// fifth at random (jitter, so a sink that was down is not hit by every
/// delivery at once); a longer `Retry-After` wins.
pub fn backoff(base: Duration, attempts: u32, retry_after: Option<Duration>) -> Duration {
    let doubled = base.saturating_mul(1u32 << attempts.saturating_sub(1).min(20)).min(MAX_BACKOFF);
    let jittered = doubled.mul_f64(1.0 - rand::random::<f64>() * 0.2);
    retry_after.map_or(jittered, |r| jittered.max(r.min(MAX_RETRY_AFTER)))
}

/// Unix milliseconds now.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A stored delivery with the revision of its last write (its CAS token).
type Stored = (Delivery, Revision);

/// The delivery worker of one process.
pub struct Notifier {
    repo: Repository,
    sinks: Arc<Sinks>,
    client: reqwest::Client,
    /// `<hostname>:<pid>`: who holds a claim.
    owner: String,
    retry_base: Duration,
    /// Deliveries this process is sending now.
    sending: Arc<Mutex<HashSet<String>>>,
}

impl Notifier {
    pub fn new(repo: Repository, sinks: Arc<Sinks>, retry_base: Duration) -> Self {
        let owner = format!("{}/{}", crate::runs::identity(), uuid::Uuid::now_v7());
        let client = kayra_pipeline::http_client();
        Self { repo, sinks, client, owner, retry_base, sending: Arc::default() }
    }

    /// Describes the metrics, each configured sink's at 0.
    pub fn describe_metrics(sinks: &Sinks) {
        metrics::describe_counter!(
            METRIC_NOTIFICATIONS,
            "Notification delivery attempts by sink and result (delivered, failed, dead)."
        );
        metrics::describe_gauge!(METRIC_PENDING, "Notification deliveries still pending, by sink.");
        for sink in sinks.names() {
            for result in ["delivered", "failed", "dead"] {
                metrics::counter!(METRIC_NOTIFICATIONS, "sink" => sink.to_string(), "result" => result).increment(0);
            }
            metrics::gauge!(METRIC_PENDING, "sink" => sink.to_string()).set(0.0);
        }
    }

    /// Runs until `cancel`: deliveries in flight are dropped then (their
    /// claims run out and another process sends them).
    pub async fn run(self, cancel: CancellationToken) {
        let this = Arc::new(self);
        let repo = &this.repo;
        let reflector: Reflector<Stored> = Reflector::new(|kv| {
            serde_json::from_slice::<Delivery>(&kv.value).map(|d| (d, kv.mod_revision)).map_err(|e| e.to_string())
        });
        let watch = reflector.clone().run(repo.store().watcher(&repo.layout().prefix(Collection::Deliveries)));
        let mut watch = std::pin::pin!(watch);
        let mut tasks = JoinSet::new();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_cleanup = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = &mut watch => {
                    tracing::warn!("store gone; the notifier stops");
                    break;
                }
                _ = tick.tick() => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            }
            if !reflector.synced() {
                continue;
            }
            let now = now_ms();
            let (due, pending, expired) = reflector.read(|map| this.scan(map, now));
            for (sink, count) in pending {
                metrics::gauge!(METRIC_PENDING, "sink" => sink).set(count as f64);
            }
            for (delivery, revision) in due {
                if tasks.len() >= MAX_IN_FLIGHT {
                    break;
                }
                if !this.sending().insert(delivery.id.clone()) {
                    continue;
                }
                let this = this.clone();
                tasks.spawn(async move {
                    let id = delivery.id.clone();
                    this.deliver(delivery, revision).await;
                    this.sending().remove(&id);
                });
            }
            if last_cleanup.elapsed() >= CLEANUP_EVERY {
                last_cleanup = tokio::time::Instant::now();
                for (id, revision) in expired {
                    match repo.delete(RecordRef::Delivery(&id), Some(revision), "notification").await {
                        Ok(_)
                        | Err(kayra_catalog::repo::Error::NotFound(_) | kayra_catalog::repo::Error::Conflict(_)) => {}
                        Err(e) => tracing::warn!(id, error = %e, "could not delete a delivered notification"),
                    }
                }
            }
        }
        tasks.shutdown().await;
    }

    fn sending(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.sending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the map holds for this tick: the due deliveries (oldest
    /// first), the pending count per configured sink, and the delivered
    /// ones past `keep_delivered`.
    #[allow(clippy::type_complexity)]
    fn scan(
        &self,
        map: &BTreeMap<String, Stored>,
        now: u64,
    ) -> (Vec<Stored>, BTreeMap<String, usize>, Vec<(String, Revision)>) {
        let mut pending: BTreeMap<String, usize> = self.sinks.names().map(|s| (s.to_string(), 0)).collect();
        let mut due = Vec::new();
        let mut expired = Vec::new();
        let keep = self.sinks.keep_delivered;
        for (delivery, revision) in map.values() {
            match delivery.state {
                DeliveryState::Pending => {
                    if let Some(count) = pending.get_mut(&delivery.sink) {
                        *count += 1;
                        let free = delivery.claim.as_ref().is_none_or(|c| c.until_ms <= now);
                        if free && delivery.next_attempt_at_ms <= now {
                            due.push((delivery.clone(), *revision));
                        }
                    }
                }
                DeliveryState::Delivered => {
                    let at = humantime::parse_rfc3339_weak(&delivery.delivered_at).ok();
                    if at.and_then(|at| at.elapsed().ok()).is_some_and(|age| age > keep) {
                        expired.push((delivery.id.clone(), *revision));
                    }
                }
                DeliveryState::Dead => {}
            }
        }
        due.sort_by_key(|(d, _)| d.next_attempt_at_ms);
        (due, pending, expired)
    }

    /// One attempt at `delivery`, read at `revision`: claim, send, settle.
    async fn deliver(&self, mut delivery: Delivery, revision: Revision) {
        let Some(sink) = self.sinks.sinks.get(&delivery.sink) else { return };
        let record = RecordRef::Delivery(&delivery.id);
        delivery.claim = Some(Claim {
            owner: self.owner.clone(),
            until_ms: now_ms() + (sink.timeout + CLAIM_MARGIN).as_millis() as u64,
        });
        delivery.last_attempt_at = crate::runs::now();
        let claimed = match self.repo.update(record, &delivery, revision, "notification").await {
            Ok(claimed) => claimed,
            // Another process claimed or settled it first.
            Err(kayra_catalog::repo::Error::Conflict(_) | kayra_catalog::repo::Error::NotFound(_)) => return,
            Err(e) => {
                tracing::warn!(id = %delivery.id, sink = %delivery.sink, error = %e, "could not claim a notification");
                return;
            }
        };
        let (result, retry_after) = self.send(sink, &delivery.event).await;
        delivery.attempts += 1;
        delivery.claim = None;
        let outcome = match result {
            Ok(()) => {
                delivery.state = DeliveryState::Delivered;
                delivery.delivered_at = crate::runs::now();
                "delivered"
            }
            Err(error) => {
                delivery.last_error = shown(&error).into_owned();
                if delivery.attempts >= self.sinks.max_attempts {
                    delivery.state = DeliveryState::Dead;
                    "dead"
                } else {
                    let pause = backoff(self.retry_base, delivery.attempts, retry_after);
                    delivery.next_attempt_at_ms = now_ms() + pause.as_millis() as u64;
                    "failed"
                }
            }
        };
        metrics::counter!(METRIC_NOTIFICATIONS, "sink" => delivery.sink.clone(), "result" => outcome).increment(1);
        let event = (&delivery.event.kind, &delivery.event.id);
        match outcome {
            "delivered" => tracing::info!(id = %delivery.id, sink = %delivery.sink, event_type = %event.0,
                event_id = %event.1, attempts = delivery.attempts, "notification delivered"),
            _ => tracing::warn!(id = %delivery.id, sink = %delivery.sink, event_type = %event.0, event_id = %event.1,
                attempts = delivery.attempts, result = outcome, error = %delivery.last_error, "notification not delivered"),
        }
        match self.repo.update(record, &delivery, claimed, "notification").await {
            Ok(_) => {}
            Err(e) => tracing::warn!(id = %delivery.id, error = %e,
                "could not record a notification's attempt; it will be tried again"),
        }
    }

    /// One `POST` of `event` to `sink`: `Ok` on a 2xx; else why not (no
    /// secret value in it) and the answer's `Retry-After`.
    async fn send(&self, sink: &Sink, event: &Event) -> (Result<(), String>, Option<Duration>) {
        let secrets = match self.sinks.read_secrets(sink).await {
            Ok(secrets) => secrets,
            Err(why) => return (Err(why), None),
        };
        // Serializing our own plain struct cannot fail.
        let body = serde_json::to_vec(event).unwrap_or_default();
        let mut headers = HeaderMap::new();
        for (name, value) in &sink.headers {
            let text = match value {
                SinkHeader::Text(text) => text.clone(),
                SinkHeader::Secret { kind, name: secret } => {
                    let value = secrets.get(secret).map_or("", String::as_str);
                    kind.as_ref().map_or_else(|| value.to_string(), |kind| format!("{kind} {value}"))
                }
            };
            let Ok(mut value) = reqwest::header::HeaderValue::from_str(&text) else {
                return (Err(format!("header {name}'s value is not valid in an HTTP header")), None);
            };
            value.set_sensitive(true);
            headers.insert(name.clone(), value);
        }
        let fixed = |text: &str| reqwest::header::HeaderValue::from_str(text).unwrap_or_else(|_| unreachable!());
        headers.insert(reqwest::header::CONTENT_TYPE, fixed("application/json"));
        if let Ok(id) = reqwest::header::HeaderValue::from_str(&event.id) {
            headers.insert("kayra-event-id", id);
        }
        if let Ok(kind) = reqwest::header::HeaderValue::from_str(&event.kind) {
            headers.insert("kayra-event-type", kind);
        }
        if let Some(secret) = sink.signing_secret.as_ref().and_then(|name| secrets.get(name)) {
            let timestamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            headers.insert("kayra-timestamp", fixed(&timestamp.to_string()));
            headers.insert("kayra-signature", fixed(&signature(secret.as_bytes(), timestamp, &body)));
        }
        let request = self.client.post(sink.url.clone()).headers(headers).body(body).timeout(sink.timeout);
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_timeout() => return (Err(format!("no answer within {:?}", sink.timeout)), None),
            Err(e) => return (Err(hide(&secrets, format!("request failed: {}", error_chain(&e)))), None),
        };
        let status = response.status();
        if status.is_success() {
            return (Ok(()), None);
        }
        let retry_after =
            response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| parse_retry_after(v.to_str().ok()?));
        let text = tokio::time::timeout(sink.timeout, response.text()).await.ok().and_then(Result::ok);
        let body = text.map(|t| kayra_core::runs::cut(t.trim(), BODY_SHOWN).into_owned()).unwrap_or_default();
        let shown_body = hide(&secrets, body);
        let error =
            if shown_body.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status}: {shown_body}") };
        (Err(error), retry_after)
    }
}

/// `text`, or [`kayra_pipeline::REDACTED`] when it holds any of `secrets`' values.
fn hide(secrets: &BTreeMap<String, String>, text: String) -> String {
    if secrets.values().any(|v| !v.is_empty() && text.contains(v.as_str())) {
        kayra_pipeline::REDACTED.to_string()
    } else {
        text
    }
}

/// An error and its sources, joined.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `Retry-After`: delay seconds or an HTTP date.
fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        // As docs/notifications.md's Python check computes it:
        // hmac.new(b"Jefe", b"1.x", hashlib.sha256).hexdigest()
        let sig = signature(b"Jefe", 1, b"x");
        assert_eq!(sig, "sha256=2f7ccbd0f043456ad29514b2d24a8aa345ec6673a5db1b44e91c8ac99d1841e3");
        assert_ne!(sig, signature(b"Jefe", 2, b"x"), "the timestamp is signed");
        assert_ne!(sig, signature(b"Jeff", 1, b"x"), "the key matters");
    }

    #[test]
    fn backoff_doubles_to_five_minutes_with_jitter_and_honours_retry_after() {
        let base = Duration::from_secs(1);
        for (attempts, full) in [(1, 1), (2, 2), (3, 4), (9, 256), (10, 300), (40, 300)] {
            let pause = backoff(base, attempts, None);
            let full = Duration::from_secs(full);
            assert!(pause <= full && pause >= full.mul_f64(0.8), "{attempts}: {pause:?}");
        }
        assert_eq!(backoff(base, 1, Some(Duration::from_secs(30))), Duration::from_secs(30));
        assert_eq!(backoff(base, 1, Some(Duration::from_secs(99_999))), MAX_RETRY_AFTER);
        assert!(backoff(base, 9, Some(Duration::from_secs(1))) >= Duration::from_secs(200));
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(60));
        assert!(parse_retry_after(&later).is_some_and(|d| d > Duration::from_secs(50)));
        assert_eq!(parse_retry_after("soon"), None);
    }
}
