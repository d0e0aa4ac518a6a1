//! The etcd client every call of the backend goes through: one connection
//! per cluster member, one member in use, failover when it fails.
//!
//! # Why not one balanced channel
//! `etcd-client` balances calls over all endpoints in one tonic channel,
//! and that channel fails whole calls while any one endpoint is down or
//! frozen (upstream etcdv3/etcd-client#39). clientv3, etcd's Go client, is
//! the model instead: each configured endpoint gets its own
//! [`etcd_client::Client`], and calls stick to one *pinned* member.
//!
//! # Failover
//! An attempt that fails with a transport error, gRPC `Unavailable`
//! (which is also how etcd says "no leader", "leader changed" and "request
//! timed out"), or that takes longer than the per-attempt timeout marks its
//! member unhealthy and moves the pin to the first healthy member in
//! configured order (round robin when none is healthy), and the call is
//! tried again there. Every call, all attempts and back-offs included, ends
//! within `database.request_timeout`. Requests carry etcd's `hasleader`
//! metadata, so a member without a leader answers at once instead of
//! holding the call until etcd's own internal timeout.
//!
//! # Health checks
//! A background task asks every member for its status each
//! [`HEALTH_INTERVAL`]: a member is healthy when it answers in time and
//! knows a leader. Recovered members are taken back (the next failover may
//! pick them, preferring configured order); an unhealthy pinned member is
//! left at once, before a call has to time out on it. Watches and lease
//! keep-alives are long-lived streams on one member: they subscribe to its
//! health and move when it goes bad (see [`Cluster::unhealthy`]).
//!
//! # Outcomes
//! A failed attempt may still have been applied (the member died after
//! committing, or the reply was lost). [`Attempted::ambiguous`] tells the
//! caller that an earlier attempt's outcome is unknown, so writes can check
//! what they find instead of reporting a conflict with themselves.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, DeleteOptions, DeleteResponse, GetOptions, GetResponse, LeaseGrantResponse,
    LeaseKeepAliveStream, LeaseKeeper, Txn, TxnResponse, WatchOptions, WatchStream,
};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::{Error, Result};

/// How often every member's health is checked.
pub(super) const HEALTH_INTERVAL: Duration = Duration::from_millis(500);
/// First and longest pause between attempts when no member is healthy
/// (an election in progress).
const RETRY_MIN: Duration = Duration::from_millis(25);
const RETRY_MAX: Duration = Duration::from_millis(500);
/// Bounds of one attempt's time, a third of the request timeout in between:
/// long enough for a loaded leader, short enough that a frozen member leaves
/// time for two more members within one call.
const ATTEMPT_MIN: Duration = Duration::from_millis(200);
const ATTEMPT_MAX: Duration = Duration::from_secs(2);

/// Metric names (described in [`describe_metrics`]).
pub const METRIC_ENDPOINT: &str = "kayra_store_endpoint";
pub const METRIC_ENDPOINT_HEALTHY: &str = "kayra_store_endpoint_healthy";
pub const METRIC_FAILOVERS: &str = "kayra_store_failovers_total";
pub const METRIC_ERRORS: &str = "kayra_store_errors_total";

/// Why an attempt failed, as counted in [`METRIC_ERRORS`] (`kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// No connection could be made, or it broke.
    Transport,
    /// The member has no leader: nothing was proposed.
    NoLeader,
    /// gRPC `Unavailable` for another reason (leader changed, etcd's own
    /// request timeout, a connection reset mid-call).
    Unavailable,
    /// The attempt took longer than the per-attempt timeout.
    Timeout,
}

impl Failure {
    const ALL: [Failure; 4] = [Failure::Transport, Failure::NoLeader, Failure::Unavailable, Failure::Timeout];

    fn label(self) -> &'static str {
        match self {
            Failure::Transport => "transport",
            Failure::NoLeader => "no_leader",
            Failure::Unavailable => "unavailable",
            Failure::Timeout => "timeout",
        }
    }

    /// Whether the failed request certainly changed nothing.
    fn certainly_not_applied(self, message: &str) -> bool {
        match self {
            Failure::NoLeader => true,
            // A connection that was never made carried no request.
            Failure::Transport | Failure::Unavailable => {
                message.contains("error trying to connect") || message.contains("tcp connect error")
            }
            Failure::Timeout => false,
        }
    }

    /// The failure kind of an etcd error; `None` when retrying cannot help
    /// (permission denied, invalid argument, lease not found…).
    fn of(error: &etcd_client::Error) -> Option<Failure> {
        match error {
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => Some(Failure::Transport),
            etcd_client::Error::GRpcStatus(status) => match status.code() {
                tonic::Code::Unavailable if status.message().contains("no leader") => Some(Failure::NoLeader),
                tonic::Code::Unavailable => Some(Failure::Unavailable),
                // etcd's load shedding; a request too large is exhausted too, and final.
                tonic::Code::ResourceExhausted if status.message().contains("too many requests") => {
                    Some(Failure::Unavailable)
                }
                tonic::Code::DeadlineExceeded => Some(Failure::Timeout),
                // hyper/h2 errors of a dying connection surface as Unknown.
                tonic::Code::Unknown | tonic::Code::Cancelled => Some(Failure::Transport),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A successful call, and whether an earlier attempt's outcome is unknown.
pub(super) struct Attempted<T> {
    pub value: T,
    /// An earlier attempt failed in a way that may have applied it.
    pub ambiguous: bool,
}

/// Registers HELP text and zero values for the store metrics, so they are
/// present from startup.
pub fn describe_metrics() {
    metrics::describe_gauge!(
        METRIC_ENDPOINT,
        "etcd endpoint in use by this process: 1 for the pinned member, 0 for the others"
    );
    metrics::describe_gauge!(METRIC_ENDPOINT_HEALTHY, "1 while the last health check of this etcd member passed");
    metrics::describe_counter!(METRIC_FAILOVERS, "times this process moved its etcd calls to another member");
    metrics::describe_counter!(
        METRIC_ERRORS,
        "failed etcd attempts by kind (transport, no_leader, unavailable, timeout) and calls that gave up \
         after database.request_timeout (request_timeout)"
    );
    metrics::counter!(METRIC_FAILOVERS).absolute(0);
    for kind in Failure::ALL.iter().map(|f| f.label()).chain(["request_timeout"]) {
        metrics::counter!(METRIC_ERRORS, "kind" => kind).absolute(0);
    }
}

/// The failover client. Cheap to clone; its health checker stops when the
/// last clone is dropped.
#[derive(Clone)]
pub(super) struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    members: Vec<Member>,
    /// Index of the member calls go to.
    pinned: AtomicUsize,
    options: ConnectOptions,
    request_timeout: Duration,
    attempt_timeout: Duration,
    /// Calls made through [`Cluster::run`] (each counted once, however many
    /// attempts it took): the store round trips a benchmark reports.
    calls: AtomicU64,
}

struct Member {
    endpoint: String,
    /// The endpoint without user info: safe for logs and metric labels.
    label: String,
    /// Made on first use: with etcd auth, connecting authenticates, which
    /// needs the member up.
    client: OnceCell<Client>,
    healthy: tokio::sync::watch::Sender<bool>,
}

impl Cluster {
    /// No I/O: members are connected on first use. Starts the health checker.
    pub(super) fn new(endpoints: &[String], options: ConnectOptions, request_timeout: Duration) -> Self {
        let members = endpoints
            .iter()
            .map(|endpoint| Member {
                endpoint: endpoint.clone(),
                label: without_user_info(endpoint),
                client: OnceCell::new(),
                healthy: tokio::sync::watch::Sender::new(true),
            })
            .collect();
        let attempt_timeout = (request_timeout / 3).clamp(ATTEMPT_MIN, ATTEMPT_MAX).min(request_timeout);
        let inner = Arc::new(Inner {
            members,
            pinned: AtomicUsize::new(0),
            options: options.with_require_leader(true),
            request_timeout,
            attempt_timeout,
            calls: AtomicU64::new(0),
        });
        inner.publish();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(health_checks(Arc::downgrade(&inner)));
        }
        Self { inner }
    }

    /// Connects to the members in order until one accepts, so that wrong
    /// credentials fail at startup. Members that cannot be reached are
    /// left for later: a cluster may start with a member down.
    pub(super) async fn connect_one(&self) -> Result<()> {
        for index in 0..self.inner.members.len() {
            match tokio::time::timeout(self.inner.attempt_timeout, self.inner.client(index)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) if Failure::of(&e).is_none() => return Err(Error::Unavailable(e.to_string())),
                Ok(Err(_)) | Err(_) => {}
            }
        }
        Ok(())
    }

    /// The endpoint calls go to now (without user info).
    pub(super) fn pinned_endpoint(&self) -> String {
        self.inner.members[self.inner.pinned()].label.clone()
    }

    /// The endpoints whose last health check passed (without user info).
    pub(super) fn healthy_endpoints(&self) -> Vec<String> {
        self.inner.members.iter().filter(|m| *m.healthy.borrow()).map(|m| m.label.clone()).collect()
    }

    /// Request/response calls made so far by this client (watch and
    /// keep-alive stream messages are not counted).
    pub(super) fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    /// Runs `call` on the pinned member until it succeeds, fails for good,
    /// or `database.request_timeout` has passed.
    pub(super) async fn run<T, F, Fut>(&self, what: &str, mut call: F) -> Result<Attempted<T>>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let inner = &self.inner;
        inner.calls.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + inner.request_timeout;
        let mut ambiguous = false;
        let mut pause = RETRY_MIN;
        let mut last_error = String::from("no attempt was made");
        loop {
            let now = Instant::now();
            if now >= deadline {
                metrics::counter!(METRIC_ERRORS, "kind" => "request_timeout").increment(1);
                return Err(Error::Unavailable(format!(
                    "etcd {what}: no member answered within {:?}; last error: {last_error}",
                    inner.request_timeout
                )));
            }
            let index = inner.pinned();
            let budget = inner.attempt_timeout.min(deadline - now);
            let attempt = async {
                let client = inner.client(index).await?;
                call(client).await
            };
            let (failure, message) = match tokio::time::timeout(budget, attempt).await {
                Ok(Ok(value)) => {
                    inner.succeeded(index);
                    return Ok(Attempted { value, ambiguous });
                }
                Ok(Err(e)) => match Failure::of(&e) {
                    Some(failure) => (failure, e.to_string()),
                    None => return Err(Error::Refused(e.to_string())),
                },
                Err(_) => (Failure::Timeout, format!("no answer within {budget:?}")),
            };
            metrics::counter!(METRIC_ERRORS, "kind" => failure.label()).increment(1);
            ambiguous |= !failure.certainly_not_applied(&message);
            let member = &inner.members[index].label;
            tracing::debug!(endpoint = %member, error = %message, kind = failure.label(), "etcd {what} attempt failed");
            last_error = format!("{member}: {message}");
            inner.failed(index);
            if inner.pinned() == index || !inner.any_healthy() {
                // Nowhere better to go right now (an election): wait a little.
                let wait = pause.min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(wait).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    }

    pub(super) async fn get(&self, key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> Result<GetResponse> {
        let key = key.into();
        let resp = self
            .run("get", |mut c| {
                let (key, options) = (key.clone(), options.clone());
                async move { c.get(key, options).await }
            })
            .await?;
        Ok(resp.value)
    }

    pub(super) async fn txn(&self, txn: Txn) -> Result<Attempted<TxnResponse>> {
        self.run("txn", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    pub(super) async fn delete(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<DeleteOptions>,
    ) -> Result<Attempted<DeleteResponse>> {
        let key = key.into();
        self.run("delete", |mut c| {
            let (key, options) = (key.clone(), options.clone());
            async move { c.delete(key, options).await }
        })
        .await
    }

    pub(super) async fn lease_grant(&self, ttl_secs: i64) -> Result<LeaseGrantResponse> {
        Ok(self.run("lease grant", |mut c| async move { c.lease_grant(ttl_secs, None).await }).await?.value)
    }

    pub(super) async fn lease_revoke(&self, id: i64) -> Result<()> {
        self.run("lease revoke", |mut c| async move { c.lease_revoke(id).await }).await?;
        Ok(())
    }

    /// A keep-alive stream for lease `id` on the pinned member, and that
    /// member's index for [`Cluster::health`].
    pub(super) async fn lease_keep_alive(&self, id: i64) -> Result<(LeaseKeeper, LeaseKeepAliveStream, usize)> {
        let resp = self
            .run("lease keep-alive", |mut c| {
                let index = self.inner.pinned();
                async move { c.lease_keep_alive(id).await.map(|(k, s)| (k, s, index)) }
            })
            .await?;
        Ok(resp.value)
    }

    /// A watch stream on the pinned member, and that member's index for
    /// [`Cluster::health`].
    pub(super) async fn watch(&self, key: Vec<u8>, options: WatchOptions) -> Result<(WatchStream, usize)> {
        let resp = self
            .run("watch", |mut c| {
                let (key, options, index) = (key.clone(), options.clone(), self.inner.pinned());
                async move { c.watch(key, Some(options)).await.map(|s| (s, index)) }
            })
            .await?;
        Ok(resp.value)
    }

    /// Follows member `index`'s health for a stream just opened on it (see
    /// [`MemberHealth::went_bad`]).
    pub(super) fn health(&self, index: usize) -> MemberHealth {
        let receiver = self.inner.members[index].healthy.subscribe();
        let seen_healthy = *receiver.borrow();
        MemberHealth { receiver, seen_healthy }
    }

    /// Reports that a stream on member `index` failed.
    pub(super) fn stream_failed(&self, index: usize) {
        self.inner.failed(index);
    }
}

impl Inner {
    fn pinned(&self) -> usize {
        self.pinned.load(Ordering::Acquire)
    }

    fn any_healthy(&self) -> bool {
        self.members.iter().any(|m| *m.healthy.borrow())
    }

    async fn client(&self, index: usize) -> Result<Client, etcd_client::Error> {
        let member = &self.members[index];
        let client = member
            .client
            .get_or_try_init(|| Client::connect([member.endpoint.as_str()], Some(self.options.clone())))
            .await?;
        Ok(client.clone())
    }

    /// Member `index` answered a call: it is healthy (with one member
    /// there are no health checks to say so).
    fn succeeded(&self, index: usize) {
        if self.members[index].healthy.send_if_modified(|h| !std::mem::replace(h, true)) {
            self.publish();
        }
    }

    /// Member `index` failed a call: mark it and move the pin off it.
    fn failed(&self, index: usize) {
        self.members[index].healthy.send_if_modified(|h| std::mem::replace(h, false));
        self.leave(index);
    }

    /// Moves the pin from `index` (if it is there) to the first healthy
    /// member in configured order, or the next one when none is healthy.
    fn leave(&self, index: usize) {
        let n = self.members.len();
        if n < 2 {
            return;
        }
        let next =
            (0..n).filter(|&i| i != index).find(|&i| *self.members[i].healthy.borrow()).unwrap_or((index + 1) % n);
        if self.pinned.compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            metrics::counter!(METRIC_FAILOVERS).increment(1);
            tracing::warn!(
                from = %self.members[index].label,
                to = %self.members[next].label,
                "etcd member failed; calls go to another member"
            );
            self.publish();
        }
    }

    /// Sets the endpoint gauges from the current state.
    fn publish(&self) {
        let pinned = self.pinned();
        for (i, member) in self.members.iter().enumerate() {
            let endpoint = member.label.clone();
            metrics::gauge!(METRIC_ENDPOINT, "endpoint" => endpoint.clone()).set(if i == pinned { 1.0 } else { 0.0 });
            let healthy = if *member.healthy.borrow() { 1.0 } else { 0.0 };
            metrics::gauge!(METRIC_ENDPOINT_HEALTHY, "endpoint" => endpoint).set(healthy);
        }
    }

    /// One health check of member `index`: it answers in time and knows a leader.
    async fn check(&self, index: usize) -> bool {
        let probe = async {
            let mut client = self.client(index).await?;
            client.status().await
        };
        let timeout = self.attempt_timeout.max(HEALTH_INTERVAL);
        matches!(tokio::time::timeout(timeout, probe).await, Ok(Ok(status)) if status.leader() != 0)
    }
}

/// Checks every member each [`HEALTH_INTERVAL`] until the cluster is dropped.
async fn health_checks(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(HEALTH_INTERVAL).await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.members.len() < 2 {
            // Nowhere to fail over to: calls find out for themselves.
            continue;
        }
        let results = futures::future::join_all((0..inner.members.len()).map(|i| inner.check(i))).await;
        for (i, healthy) in results.into_iter().enumerate() {
            let member = &inner.members[i];
            let changed = member.healthy.send_if_modified(|h| std::mem::replace(h, healthy) != healthy);
            if changed && healthy {
                tracing::info!(endpoint = %member.label, "etcd member healthy again");
            } else if changed {
                tracing::warn!(endpoint = %member.label, "etcd member failed its health check");
            }
        }
        let pinned = inner.pinned();
        if !*inner.members[pinned].healthy.borrow() && inner.any_healthy() {
            inner.leave(pinned);
        }
        inner.publish();
    }
}

/// One member's health as seen by a stream open on it. Kept with the
/// stream rather than asked afresh at each wait: a stream that nobody polled
/// while its member went bad must still move when it is polled again.
pub(super) struct MemberHealth {
    receiver: tokio::sync::watch::Receiver<bool>,
    /// Whether the member was healthy at any time since the stream opened.
    seen_healthy: bool,
}

impl MemberHealth {
    /// Completes once the member is unhealthy after having been healthy
    /// since the stream opened (at once if that already happened). A stream
    /// opened on a member already unhealthy (no better one at the time)
    /// waits for it to recover first, rather than being abandoned at once,
    /// again and again. Cancel-safe.
    pub(super) async fn went_bad(&mut self) {
        if !self.seen_healthy {
            if self.receiver.wait_for(|h| *h).await.is_err() {
                return std::future::pending().await;
            }
            self.seen_healthy = true;
        }
        if self.receiver.wait_for(|h| !*h).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// `https://user:secret@host:2379` → `https://host:2379`.
fn without_user_info(endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").map_or(("", endpoint), |(s, r)| (s, r));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let rest = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    if scheme.is_empty() { rest.to_string() } else { format!("{scheme}://{rest}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_labels_drop_user_info() {
        assert_eq!(without_user_info("https://u:p@127.0.0.1:2379"), "https://127.0.0.1:2379");
        assert_eq!(without_user_info("http://127.0.0.1:2379"), "http://127.0.0.1:2379");
        assert_eq!(without_user_info("u@host:1/x@y"), "host:1/x@y");
    }

    #[test]
    fn only_refused_connections_and_no_leader_are_known_not_applied() {
        assert!(Failure::NoLeader.certainly_not_applied("etcdserver: no leader"));
        assert!(Failure::Transport.certainly_not_applied("transport error: tcp connect error"));
        assert!(!Failure::Unavailable.certainly_not_applied("etcdserver: request timed out"));
        assert!(!Failure::Timeout.certainly_not_applied(""));
    }

    #[tokio::test]
    async fn a_call_gives_up_after_the_request_timeout() {
        // Nothing listens on port 1: every attempt fails to connect.
        let cluster = Cluster::new(
            &["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
            ConnectOptions::new(),
            Duration::from_millis(300),
        );
        let started = std::time::Instant::now();
        let err = cluster.get("k", None).await.expect_err("no member is up");
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
        assert!(err.to_string().contains("within 300ms"), "{err}");
        assert!(cluster.healthy_endpoints().is_empty());
    }
}
