//! Keeping a job lock session's lease alive (see `locker`).
//!
//! The lease is renewed every third of its TTL on one keep-alive stream.
//! When that stream fails (an error, no answer within a period, its
//! member failing its health check) a new one is opened, and tried again
//! every [`RECONNECT_PAUSE`] until one opens or one TTL has passed since
//! the last renewal: only then may etcd have let the lease go, and the
//! session is given up (its locks are released). Opening a stream
//! renews the lease once.
//!
//! A failed attempt to reopen is not followed by a whole period's wait:
//! through an etcd election a reopen may fail for as long as the client's
//! request timeout, and with a period's pause after it the session could
//! see only one more attempt before its TTL ran out, and lose its locks
//! to an election that ended seconds before.
//!
//! The loop is written against [`KeepAlive`], so its timing is tested on
//! a paused clock (the tests below); [`EtcdKeepAlive`] is the stream on etcd.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;

/// The pause between two failed attempts to reopen the keep-alive stream.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

/// Why a keep-alive stream could not be reopened.
#[derive(Debug)]
pub(super) enum Reopen {
    /// etcd no longer knows the lease: nothing to keep alive.
    Gone(String),
    /// Anything else (no member answered, an election): try again.
    Failed(String),
}

/// A lease's keep-alive stream, as the renewal loop uses it.
#[async_trait]
pub(super) trait KeepAlive: Send {
    /// The lease's id, for the log.
    fn lease(&self) -> i64;
    /// One renewal on the open stream, answered within `wait`: `Ok(false)`
    /// when etcd no longer knows the lease.
    async fn renew(&mut self, wait: Duration) -> Result<bool, String>;
    /// Completes once the stream's member fails its health check.
    async fn member_failed(&mut self);
    /// Reports the open stream as failed (its member is avoided).
    fn failed(&self);
    /// Replaces the stream with a new one, which renews the lease once.
    async fn reopen(&mut self) -> Result<(), Reopen>;
    /// Revokes the lease (a shutdown: its locks are freed now, not after the TTL).
    async fn revoke(&mut self);
}

/// Keeps `link`'s lease alive until `shutdown` (which revokes it) or until
/// it is lost, which cancels `lost`.
pub(super) async fn run(mut link: impl KeepAlive, ttl: Duration, lost: CancellationToken, shutdown: CancellationToken) {
    let period = ttl / 3;
    let mut renewed = Instant::now();
    loop {
        let member_failed = tokio::select! {
            () = shutdown.cancelled() => return link.revoke().await,
            () = tokio::time::sleep(period) => false,
            () = link.member_failed() => true,
        };
        let mut failure = if member_failed {
            "the member of the keep-alive stream failed its health check".to_string()
        } else {
            match link.renew(period).await {
                Ok(true) => {
                    renewed = Instant::now();
                    continue;
                }
                Ok(false) => return give_up(&link, &lost, "etcd reports the lease expired"),
                Err(e) => e,
            }
        };
        link.failed();
        tracing::warn!(lease = format!("{:x}", link.lease()), error = %failure, "lease keep-alive failed; reconnecting");
        loop {
            let left = ttl.saturating_sub(renewed.elapsed());
            if left.is_zero() {
                return give_up(&link, &lost, &format!("no renewal for a whole TTL ({failure})"));
            }
            let reopened = tokio::select! {
                () = shutdown.cancelled() => None,
                reopened = tokio::time::timeout(left, link.reopen()) => Some(reopened),
            };
            let Some(reopened) = reopened else { return link.revoke().await };
            match reopened {
                Ok(Ok(())) => {
                    renewed = Instant::now();
                    break;
                }
                Ok(Err(Reopen::Gone(why))) => return give_up(&link, &lost, &why),
                Ok(Err(Reopen::Failed(why))) => failure = why,
                // The TTL ran out while it was trying: the check above gives up.
                Err(_) => continue,
            }
            tokio::select! {
                () = shutdown.cancelled() => return link.revoke().await,
                () = tokio::time::sleep(RECONNECT_PAUSE.min(left)) => {}
            }
        }
    }
}

fn give_up(link: &impl KeepAlive, lost: &CancellationToken, why: &str) {
    tracing::warn!(lease = format!("{:x}", link.lease()), why, "job lock session lost; its locks are released");
    lost.cancel();
}

/// A keep-alive stream on one etcd member.
pub(super) struct EtcdKeepAlive {
    cluster: Cluster,
    id: i64,
    keeper: LeaseKeeper,
    responses: LeaseKeepAliveStream,
    member: usize,
}

impl EtcdKeepAlive {
    /// The stream `Cluster::lease_keep_alive` opened for lease `id`.
    pub(super) fn new(
        cluster: Cluster,
        id: i64,
        (keeper, responses, member): (LeaseKeeper, LeaseKeepAliveStream, usize),
    ) -> Self {
        Self { cluster, id, keeper, responses, member }
    }
}

#[async_trait]
impl KeepAlive for EtcdKeepAlive {
    fn lease(&self) -> i64 {
        self.id
    }

    async fn renew(&mut self, wait: Duration) -> Result<bool, String> {
        self.keeper.keep_alive().await.map_err(|e| e.to_string())?;
        match tokio::time::timeout(wait, self.responses.message()).await {
            Err(_) => Err("no keep-alive response".into()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(None)) => Err("keep-alive stream closed".into()),
            Ok(Ok(Some(resp))) => Ok(resp.ttl() > 0),
        }
    }

    async fn member_failed(&mut self) {
        // Asked afresh each period: a member that went bad between two
        // periods is found by the renewal failing instead.
        self.cluster.health(self.member).went_bad().await;
    }

    fn failed(&self) {
        self.cluster.stream_failed(self.member);
    }

    async fn reopen(&mut self) -> Result<(), Reopen> {
        match self.cluster.lease_keep_alive(self.id).await {
            Ok((keeper, responses, member)) => {
                (self.keeper, self.responses, self.member) = (keeper, responses, member);
                Ok(())
            }
            Err(e) if e.to_string().contains("lease not found") => Err(Reopen::Gone(e.to_string())),
            Err(e) => Err(Reopen::Failed(e.to_string())),
        }
    }

    async fn revoke(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.cluster.lease_revoke(self.id)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    const TTL: Duration = Duration::from_secs(6);

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// A keep-alive that cannot reach etcd during `outage` (counted from
    /// the test's start), with etcd's side of the lease: it is let go one
    /// TTL after its last renewal, and from `forgotten_from` on.
    struct Fake {
        start: Instant,
        outage: std::ops::Range<Duration>,
        /// A stream that failed stays failed until reopened.
        broken: bool,
        /// A reopen through the outage fails after this long, or succeeds
        /// as soon as the outage ends, whichever comes first (a request
        /// waiting through an election).
        reopen_takes: Duration,
        forgotten_from: Option<Duration>,
        /// Set once the lease is revoked.
        revoked: Arc<Mutex<bool>>,
        /// Every renewal etcd took, the grant's at 0 first.
        renewals: Arc<Mutex<Vec<Duration>>>,
    }

    impl Fake {
        fn new(outage: std::ops::Range<Duration>) -> (Self, Arc<Mutex<Vec<Duration>>>) {
            let renewals = Arc::new(Mutex::new(vec![Duration::ZERO]));
            let fake = Fake {
                start: Instant::now(),
                outage,
                broken: false,
                reopen_takes: Duration::ZERO,
                forgotten_from: None,
                revoked: Arc::default(),
                renewals: renewals.clone(),
            };
            (fake, renewals)
        }

        fn now(&self) -> Duration {
            self.start.elapsed()
        }

        fn down(&self) -> bool {
            self.outage.contains(&self.now())
        }

        /// etcd's answer to a renewal: false when it has let the lease go.
        fn renewed(&self) -> bool {
            let mut renewals = self.renewals.lock().unwrap();
            let expired = self.now() > *renewals.last().unwrap() + TTL;
            if expired || self.forgotten_from.is_some_and(|from| self.now() >= from) {
                return false;
            }
            renewals.push(self.now());
            true
        }
    }

    #[async_trait]
    impl KeepAlive for Fake {
        fn lease(&self) -> i64 {
            7
        }

        async fn renew(&mut self, _wait: Duration) -> Result<bool, String> {
            if self.broken || self.down() {
                self.broken = true;
                return Err("connection reset".into());
            }
            Ok(self.renewed())
        }

        async fn member_failed(&mut self) {
            std::future::pending().await
        }

        fn failed(&self) {}

        async fn reopen(&mut self) -> Result<(), Reopen> {
            if self.down() {
                let until = (self.now() + self.reopen_takes).min(self.outage.end);
                tokio::time::sleep(until - self.now()).await;
            }
            if self.down() {
                return Err(Reopen::Failed("no member answered".into()));
            }
            self.broken = false;
            match self.renewed() {
                true => Ok(()),
                false => Err(Reopen::Gone("lease not found".into())),
            }
        }

        async fn revoke(&mut self) {
            *self.revoked.lock().unwrap() = true;
        }
    }

    /// Runs the loop over `fake` for 30 s of paused time: when the session
    /// was lost, if it was.
    async fn session(fake: Fake) -> Option<Duration> {
        let (lost, shutdown) = (CancellationToken::new(), CancellationToken::new());
        let start = Instant::now();
        let task = tokio::spawn(run(fake, TTL, lost.clone(), shutdown.clone()));
        let lost_at = tokio::select! {
            () = lost.cancelled() => Some(start.elapsed()),
            () = tokio::time::sleep(Duration::from_secs(30)) => None,
        };
        shutdown.cancel();
        task.await.unwrap();
        lost_at
    }

    /// Down from just after the renewal at 2 s until 6.9 s: the renewal at
    /// 4 s fails, and etcd keeps the lease until 8 s. Tried again every
    /// pause, a reopen finds etcd back at 7 s; with a period's wait after
    /// each failure it would be tried at 4 s only, and the stream found
    /// still broken at 6 s and 8 s: given up at 8 s.
    #[tokio::test(start_paused = true)]
    async fn an_outage_shorter_than_the_ttl_since_the_last_renewal_keeps_the_session() {
        let (fake, renewals) = Fake::new(ms(2_500)..ms(6_900));
        assert_eq!(session(fake).await, None, "the session was kept");
        let renewals = renewals.lock().unwrap().clone();
        let back = renewals.iter().find(|at| **at > ms(2_500)).expect("renewed after the outage");
        assert_eq!(*back, ms(7_000), "reconnected at the first pause's end after the outage");
        assert_eq!(renewals.last(), Some(&ms(29_000)), "and renewed every period after: {renewals:?}");
    }

    /// Reopens that take 2 s to fail (a request timing out through an
    /// election) are tried again at once, and the one waiting when etcd
    /// comes back at 7 s succeeds, inside the lease's 8 s.
    #[tokio::test(start_paused = true)]
    async fn slow_failed_reopens_are_tried_again_until_the_ttl() {
        let (mut fake, renewals) = Fake::new(ms(2_500)..ms(7_000));
        fake.reopen_takes = Duration::from_secs(2);
        assert_eq!(session(fake).await, None, "the session was kept");
        assert!(renewals.lock().unwrap().contains(&ms(7_000)), "renewed when etcd came back");
    }

    /// Down for longer than the TTL: given up exactly when one TTL since
    /// the last renewal (2 s) has passed.
    #[tokio::test(start_paused = true)]
    async fn an_outage_past_the_ttl_loses_the_session_at_the_ttl() {
        let (fake, _) = Fake::new(ms(2_500)..Duration::from_secs(60));
        assert_eq!(session(fake).await, Some(ms(8_000)));
    }

    /// A lease etcd no longer knows is given up at the renewal that says so.
    #[tokio::test(start_paused = true)]
    async fn a_lease_etcd_has_let_go_is_given_up_at_once() {
        let (mut fake, _) = Fake::new(Duration::MAX..Duration::MAX);
        fake.forgotten_from = Some(ms(3_000));
        assert_eq!(session(fake).await, Some(ms(4_000)));
    }

    /// A shutdown while a reopen waits through an outage revokes the lease
    /// at once, not once the reopen gives up.
    #[tokio::test(start_paused = true)]
    async fn a_shutdown_during_a_reopen_revokes_at_once() {
        let (mut fake, _) = Fake::new(ms(2_500)..Duration::from_secs(60));
        fake.reopen_takes = Duration::from_secs(30);
        let revoked = fake.revoked.clone();
        let (lost, shutdown) = (CancellationToken::new(), CancellationToken::new());
        let task = tokio::spawn(run(fake, TTL, lost, shutdown.clone()));
        tokio::time::sleep(ms(5_000)).await;
        let start = Instant::now();
        shutdown.cancel();
        task.await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO, "the loop ended at the shutdown");
        assert!(*revoked.lock().unwrap(), "and revoked the lease");
    }
}
