//! The etcd v3 backend: kayra's production store.
//!
//! # Keys
//! Every record lives under one root, `database.etcd.prefix` (trailing `/`
//! ignored), so several installations can share a cluster. API keys are
//! `/`-rooted and relative to it: prefix `/kayra` and key `/namespaces/a`
//! is the etcd key `/kayra/namespaces/a`. A key without its leading `/` is
//! read as if it had one, so it can never escape the root or glue onto it
//! (`/kayra` + `x` must not become `/kayrax`). For the same reason the
//! listing prefix `""` ranges over `<root>/`, never over `/kayra2/...`.
//!
//! # Writes
//! Every conditional write is one etcd transaction, so the check and the
//! write are atomic and cost one round trip. Update and delete compare
//! `create_revision > 0` as well as `mod_revision`, because etcd reports a
//! missing key's `mod_revision` as 0 and a CAS on 0 would otherwise create
//! the key. Their `else` branch reads the key at the same revision, which
//! tells `NotFound` from `Conflict` without a second, racy read.
//!
//! # Change feed
//! etcd's native watch on the pinned member, with progress requests, as
//! [`Backend::changes`]; see [`watcher`](self::watcher). Reconnecting and
//! re-listing after a compaction are `Store::watcher`'s.
//!
//! # Job locks
//! One leased session per store and one etcd mutex per job, driven as a
//! non-blocking TryLock; see [`EtcdJobLocker`].
//!
//! # Several members
//! Every call goes through [`cluster`](self::cluster): one connection per
//! member, calls pinned to a healthy one, failover within
//! `database.request_timeout`. A write whose first attempt's outcome is
//! unknown is retried with the same compare, and what the retry finds is
//! checked against the write itself (see [`Backend::create`] below), so a
//! write that did land is reported as done, not as a conflict with itself.
//!
//! # Errors
//! Every transport or server failure that outlasts the failover becomes
//! [`Error::Unavailable`] with etcd's text: the caller cannot fix it, but a
//! retry may succeed.
//!
//! # Layout
//! - this file: connecting, the key space, get/list/create/update/delete.
//! - `etcd/cluster.rs`: the failover client and its metrics.
//! - `etcd/watcher.rs`: the change feed (one native watch).
//! - `etcd/locker.rs`: the session lease and the per-job mutexes.
//! - `etcd/lease.rs`: keys bound to leases ([`crate::Leases`]).
//! - `etcd/batch.rs`: several transactions as one Txn (group commit).

mod batch;
mod cluster;
mod lease;
mod locker;
mod pages;
mod renewal;
mod watcher;

pub use cluster::{METRIC_ENDPOINT, METRIC_ENDPOINT_HEALTHY, METRIC_ERRORS, METRIC_FAILOVERS, describe_metrics};
pub use locker::EtcdJobLocker;

/// Group commit (transactions, lock acquisitions): batches on their way at once.
const GROUP_IN_FLIGHT: usize = 2;

/// etcd's default `--max-txn-ops`: the most compares, and operations of
/// each branch, one Txn may carry (shared Txns stay within it).
const MAX_TXN_OPS: usize = 128;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity, ResponseHeader, TlsOptions,
    Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use kayra_config::EtcdConfig;

use self::cluster::{Attempted, Cluster};
use self::pages::{PageCursor, successor};
use tokio_util::sync::CancellationToken;

use crate::{Backend, ChangeStream, Error, JobLocker, KeyValue, Leases, ListPage, Result, Revision};

/// The environment variable holding the password of `database.etcd.username`.
pub const PASSWORD_ENV: &str = "KAYRA_ETCD_PASSWORD";

/// How long establishing a connection to an endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on open streams, so a watch or keep-alive on a dead
/// connection fails instead of hanging. etcd refuses pings more often than
/// every 5s (`--grpc-keepalive-min-time`) and pings on idle connections.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The etcd backend. Use it through [`crate::Store`].
pub struct EtcdStore {
    keys: Keyspace,
    locker: Arc<EtcdJobLocker>,
    /// Cancelled when the store is dropped: ends its watch streams.
    shutdown: CancellationToken,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("root", &self.keys.root).finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to `cfg.endpoints` with the default `database.request_timeout`.
    /// With `cfg.username`, the password is read from [`PASSWORD_ENV`] and
    /// must be set.
    pub async fn connect(cfg: &EtcdConfig) -> Result<Self> {
        Self::connect_within(cfg, kayra_config::DEFAULT_REQUEST_TIMEOUT).await
    }

    /// Like [`EtcdStore::connect`], every call (all failover attempts
    /// included) bounded by `request_timeout`.
    pub async fn connect_within(cfg: &EtcdConfig, request_timeout: Duration) -> Result<Self> {
        let password = match &cfg.username {
            Some(user) => Some(std::env::var(PASSWORD_ENV).map_err(|_| {
                Error::Unavailable(format!("database.etcd.username is {user:?} but {PASSWORD_ENV} is not set"))
            })?),
            None => None,
        };
        Self::connect_with_password_within(cfg, password.as_deref(), request_timeout).await
    }

    /// Like [`EtcdStore::connect`], with the password passed in rather than
    /// read from the environment (tests, embedders). It is used only when
    /// `cfg.username` is set.
    pub async fn connect_with_password(cfg: &EtcdConfig, password: Option<&str>) -> Result<Self> {
        Self::connect_with_password_within(cfg, password, kayra_config::DEFAULT_REQUEST_TIMEOUT).await
    }

    /// [`EtcdStore::connect_with_password`] and [`EtcdStore::connect_within`] in one.
    pub async fn connect_with_password_within(
        cfg: &EtcdConfig,
        password: Option<&str>,
        request_timeout: Duration,
    ) -> Result<Self> {
        if cfg.endpoints.is_empty() {
            return Err(Error::Unavailable("database.etcd.endpoints is empty".into()));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT)
            .with_keep_alive_while_idle(false);
        if let Some(user) = &cfg.username {
            // Auth tokens expire (5 min with etcd's default simple tokens);
            // a control plane runs for months.
            options = options.with_user(user, password.unwrap_or_default()).with_auto_token_refresh(true);
        }
        if let Some(tls) = &cfg.tls {
            options = options.with_tls(tls_options(tls)?);
        }
        describe_metrics();
        let cluster = Cluster::new(&cfg.endpoints, options, request_timeout);
        cluster.connect_one().await?;
        let keys = Keyspace { cluster, root: cfg.prefix.trim_end_matches('/').to_string() };
        let locker = Arc::new(EtcdJobLocker::new(keys.clone(), cfg.lock_ttl.0, cfg.lock_retry_interval.0));
        Ok(Self { keys, locker, shutdown: CancellationToken::new() })
    }

    /// A view of which members this store uses and finds healthy; it
    /// stays valid after the store is moved into a [`crate::Store`].
    pub fn endpoints(&self) -> Endpoints {
        Endpoints(self.keys.cluster.clone())
    }

    /// The job locker of this store (also reachable as [`Backend::job_locker`]).
    pub fn locker(&self) -> &Arc<EtcdJobLocker> {
        &self.locker
    }

    /// Whether `full` was created at `revision` holding `value` (read at
    /// that revision; `false` when it is compacted away or unreadable).
    async fn created_with(&self, full: &str, revision: Revision, value: &[u8]) -> bool {
        let options = GetOptions::new().with_revision(revision);
        match self.keys.cluster.get(full.to_string(), Some(options)).await {
            Ok(resp) => resp.kvs().first().is_some_and(|kv| kv.create_revision() == revision && kv.value() == value),
            Err(_) => false,
        }
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn tls_options(tls: &kayra_config::EtcdTls) -> Result<TlsOptions> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| Error::Unavailable(format!("read {}: {e}", path.display())))
    };
    let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca_file)?));
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => options = options.identity(Identity::from_pem(read(cert)?, read(key)?)),
        (None, None) => {}
        _ => {
            return Err(Error::Unavailable("database.etcd.tls: cert_file and key_file must be given together".into()));
        }
    }
    Ok(options)
}

/// Which cluster members an [`EtcdStore`] uses (endpoints without user info).
#[derive(Clone)]
pub struct Endpoints(Cluster);

impl Endpoints {
    /// The member calls go to now.
    pub fn in_use(&self) -> String {
        self.0.pinned_endpoint()
    }

    /// The members whose last health check passed.
    pub fn healthy(&self) -> Vec<String> {
        self.0.healthy_endpoints()
    }
}

/// An etcd client bound to kayra's root: maps API keys to etcd keys and back.
#[derive(Clone)]
struct Keyspace {
    cluster: Cluster,
    /// The configured prefix without its trailing `/`; may be empty.
    root: String,
}

impl Keyspace {
    /// The etcd key of `key`.
    fn full(&self, key: &str) -> String {
        format!("{}/{}", self.root, key.strip_prefix('/').unwrap_or(key))
    }

    /// The API key of an etcd key, `None` when it is outside the root.
    fn relative(&self, full: &[u8]) -> Option<String> {
        let rest = full.strip_prefix(self.root.as_bytes())?;
        rest.starts_with(b"/").then(|| String::from_utf8_lossy(rest).into_owned())
    }

    /// The half-open etcd key range `[start, end)` of every key under `prefix`.
    fn range(&self, prefix: &str) -> (Vec<u8>, Vec<u8>) {
        let start = self.full(prefix).into_bytes();
        let end = prefix_end(&start);
        (start, end)
    }

    fn record(&self, kv: &etcd_client::KeyValue) -> Option<KeyValue> {
        Some(KeyValue {
            key: self.relative(kv.key())?,
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
        })
    }

    async fn txn(&self, txn: Txn) -> Result<Attempted<TxnResponse>> {
        self.cluster.txn(txn).await
    }

    /// The etcd compares of one [`crate::Compare`].
    fn compare(&self, compare: &crate::Compare) -> Vec<Compare> {
        use crate::Compare as C;
        match compare {
            C::Absent(key) => vec![Compare::create_revision(self.full(key), CompareOp::Equal, 0)],
            C::Exists(key) => vec![Compare::create_revision(self.full(key), CompareOp::Greater, 0)],
            // etcd reports a missing key's mod_revision as 0: require existence too.
            C::ModRevision(key, revision) => vec![
                Compare::create_revision(self.full(key), CompareOp::Greater, 0),
                Compare::mod_revision(self.full(key), CompareOp::Equal, *revision),
            ],
            // A range compare holds when it holds for every key in the range,
            // and an empty range compares as one absent key (create_revision 0):
            // `create_revision < 1` holds exactly when no key is in the range.
            C::PrefixEmpty(prefix) => {
                let (start, end) = self.range(prefix);
                vec![Compare::create_revision(start, CompareOp::Less, 1).with_range(end)]
            }
            C::PrefixUnchangedSince(prefix, revision) => {
                let (start, end) = self.range(prefix);
                vec![Compare::mod_revision(start, CompareOp::Less, revision.saturating_add(1)).with_range(end)]
            }
        }
    }

    /// The etcd operation of one [`crate::Op`].
    fn op(&self, op: &crate::Op) -> TxnOp {
        use crate::Op as O;
        match op {
            O::Put { key, value } => TxnOp::put(self.full(key), value.clone(), None),
            O::Delete { key } => TxnOp::delete(self.full(key), None),
            O::DeletePrefix { prefix } => {
                let (start, end) = self.range(prefix);
                TxnOp::delete(start, Some(DeleteOptions::new().with_range(end)))
            }
            O::Get { key } => TxnOp::get(self.full(key), None),
        }
    }

    /// Every key in `[start, end)` at one revision, read page by page.
    async fn snapshot(&self, start: &[u8], end: &[u8]) -> Result<(Vec<KeyValue>, Revision)> {
        self.snapshot_at(start, end, None).await
    }

    /// Every key in `[start, end)` at revision `at` (the current one when
    /// `None`), read page by page, each page one request for a bounded
    /// sub-range ([`pages`]: etcd's cost of a request is the keys of its
    /// whole range, not its page).
    async fn snapshot_at(&self, start: &[u8], end: &[u8], at: Option<Revision>) -> Result<(Vec<KeyValue>, Revision)> {
        let mut items = Vec::new();
        let mut cursor = PageCursor::new(start.to_vec(), at);
        loop {
            let (page, revision, more) = self.page(end, &mut cursor).await?;
            items.extend(page);
            if !more {
                return Ok((items, revision));
            }
        }
    }

    /// [`Keyspace::snapshot_at`] at the current revision, a page at a time
    /// ([`Backend::snapshot_pages`]): a page is read when the consumer
    /// asks for it, so only one page is held here at a time.
    fn snapshot_pages(self, start: Vec<u8>, end: Vec<u8>) -> crate::SnapshotPages {
        let cursor = Some(PageCursor::new(start, None));
        Box::pin(futures::stream::unfold((self, end, cursor), |(keys, end, cursor)| async move {
            let mut cursor = cursor?;
            match keys.page(&end, &mut cursor).await {
                Ok((page, revision, more)) => {
                    let next = more.then_some(cursor);
                    Some((Ok((page, revision)), (keys, end, next)))
                }
                Err(e) => Some((Err(e), (keys, end, None))),
            }
        }))
    }

    /// One page of a snapshot from `cursor`, and whether more follow;
    /// moves the cursor past it. One request, or a few when sub-ranges
    /// come back empty (never an empty page but the snapshot's last).
    async fn page(&self, end: &[u8], cursor: &mut PageCursor) -> Result<(Vec<KeyValue>, Revision, bool)> {
        loop {
            let request_end = cursor.request_end(end);
            let mut options = GetOptions::new().with_range(request_end.clone()).with_limit(cursor.limit as i64);
            if let Some(revision) = cursor.at {
                options = options.with_revision(revision);
            }
            let resp = self.cluster.get(cursor.from.clone(), Some(options)).await?;
            let revision = *cursor.at.get_or_insert(revision_of(resp.header())?);
            let bytes: usize = resp.kvs().iter().map(|kv| kv.key().len() + kv.value().len()).sum();
            let keys: Vec<&[u8]> = resp.kvs().iter().map(|kv| kv.key()).collect();
            let more = cursor.advance(&keys, bytes, resp.more(), request_end, end);
            if !keys.is_empty() || !more {
                let items = resp.kvs().iter().filter_map(|kv| self.record(kv)).collect();
                return Ok((items, revision, more));
            }
        }
    }
}

/// The smallest key after every key starting with `prefix`; `[0]` (etcd's
/// "to the end of the key space") when there is none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn unavailable(e: etcd_client::Error) -> Error {
    Error::Unavailable(e.to_string())
}

fn revision_of(header: Option<&ResponseHeader>) -> Result<Revision> {
    header.map(ResponseHeader::revision).ok_or_else(|| Error::Unavailable("etcd answered without a header".into()))
}

/// The key the `else` branch of a failed conditional write read, if any.
fn else_branch_key(resp: &TxnResponse) -> Option<etcd_client::KeyValue> {
    match resp.op_responses().into_iter().next() {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
}

/// After a retry whose earlier attempt may have been applied: whether the
/// key found is that earlier attempt's write (our value, and newer than
/// the revision we compared against). Another writer storing the very same
/// bytes meanwhile is indistinguishable, and harmless: the key holds what
/// the caller asked for.
fn is_own_write(found: Option<&etcd_client::KeyValue>, value: &[u8], after: Revision) -> Option<Revision> {
    found.filter(|kv| kv.value() == value && kv.mod_revision() > after).map(etcd_client::KeyValue::mod_revision)
}

#[async_trait]
impl Backend for EtcdStore {
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision)> {
        let resp = self.keys.cluster.get(self.keys.full(key), None).await?;
        Ok((resp.kvs().first().and_then(|kv| self.keys.record(kv)), revision_of(resp.header())?))
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Result<ListPage> {
        let (mut start, end) = self.keys.range(prefix);
        if let Some(after) = start_after {
            start = start.max(successor(self.keys.full(after).as_bytes()));
        }
        if end != [0] && start >= end {
            // Nothing can follow `start_after` under `prefix`.
            return Ok(ListPage { items: Vec::new(), more: false, revision: self.revision().await? });
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let options = GetOptions::new().with_range(end).with_limit(limit);
        let resp = self.keys.cluster.get(start, Some(options)).await?;
        Ok(ListPage {
            items: resp.kvs().iter().filter_map(|kv| self.keys.record(kv)).collect(),
            more: resp.more(),
            revision: revision_of(resp.header())?,
        })
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision> {
        let full = self.keys.full(key);
        let txn = Txn::new()
            .when([Compare::create_revision(full.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(full.clone(), value.clone(), None)])
            .or_else([TxnOp::get(full.clone(), None)]);
        let Attempted { value: resp, ambiguous } = self.keys.txn(txn).await?;
        if resp.succeeded() {
            return revision_of(resp.header());
        }
        let found = else_branch_key(&resp);
        if !ambiguous {
            return Err(Error::Conflict(key.to_string()));
        }
        // Our own create, unchanged since (version 1), found by the retry.
        if let Some(revision) = is_own_write(found.as_ref().filter(|kv| kv.version() == 1), &value, 0) {
            return Ok(revision);
        }
        // Our own create, already written again by someone else (the
        // reconciler activates a new namespace within milliseconds): the
        // key as it was created holds our value.
        match found.filter(|kv| kv.version() > 1) {
            Some(kv) if self.created_with(&full, kv.create_revision(), &value).await => Ok(kv.create_revision()),
            _ => Err(Error::Conflict(key.to_string())),
        }
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<Revision> {
        let full = self.keys.full(key);
        let txn = Txn::new()
            .when([
                Compare::create_revision(full.clone(), CompareOp::Greater, 0),
                Compare::mod_revision(full.clone(), CompareOp::Equal, expected),
            ])
            .and_then([TxnOp::put(full.clone(), value.clone(), None)])
            .or_else([TxnOp::get(full.clone(), None)]);
        let Attempted { value: resp, ambiguous } = self.keys.txn(txn).await?;
        if resp.succeeded() {
            return revision_of(resp.header());
        }
        let found = else_branch_key(&resp);
        match (is_own_write(found.as_ref(), &value, expected), found) {
            (Some(revision), _) if ambiguous => Ok(revision),
            (_, Some(_)) => Err(Error::Conflict(key.to_string())),
            (_, None) => Err(Error::NotFound(key.to_string())),
        }
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Revision> {
        let full = self.keys.full(key);
        let mut compares = vec![Compare::create_revision(full.clone(), CompareOp::Greater, 0)];
        if let Some(expected) = expected {
            compares.push(Compare::mod_revision(full.clone(), CompareOp::Equal, expected));
        }
        let txn =
            Txn::new().when(compares).and_then([TxnOp::delete(full.clone(), None)]).or_else([TxnOp::get(full, None)]);
        let Attempted { value: resp, ambiguous } = self.keys.txn(txn).await?;
        match (resp.succeeded(), else_branch_key(&resp).is_some()) {
            (true, _) => revision_of(resp.header()),
            (false, true) => Err(Error::Conflict(key.to_string())),
            // Gone after an attempt that may have deleted it: that was us
            // (the revision is the one the retry read at, not the delete's).
            (false, false) if ambiguous => revision_of(resp.header()),
            (false, false) => Err(Error::NotFound(key.to_string())),
        }
    }

    async fn revision(&self) -> Result<Revision> {
        // Any read carries the store revision in its header; a count of one
        // key is the cheapest linearizable read there is.
        let options = GetOptions::new().with_count_only();
        let resp = self.keys.cluster.get(self.keys.root.clone(), Some(options)).await?;
        revision_of(resp.header())
    }

    async fn txn(&self, txn: crate::Txn) -> Result<crate::TxnResponse> {
        let compares: Vec<Compare> = txn.compares.iter().flat_map(|c| self.keys.compare(c)).collect();
        let success: Vec<TxnOp> = txn.success.iter().map(|op| self.keys.op(op)).collect();
        let failure: Vec<TxnOp> = txn.failure.iter().map(|op| self.keys.op(op)).collect();
        let Attempted { value: resp, ambiguous } =
            self.keys.txn(Txn::new().when(compares).and_then(success).or_else(failure)).await?;
        if ambiguous && !resp.succeeded() {
            // The compares failed on a retry, perhaps because the earlier
            // attempt applied the success branch: no general check can
            // tell, so say "unknown" rather than "the compares failed".
            return Err(Error::Unavailable(
                "etcd transaction: outcome unknown (a member failed while it ran; the retry found the compares \
                 false)"
                    .into(),
            ));
        }
        let gets = resp
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get.kvs().first().and_then(|kv| self.keys.record(kv))),
                _ => None,
            })
            .collect();
        Ok(crate::TxnResponse { succeeded: resp.succeeded(), revision: revision_of(resp.header())?, gets })
    }

    async fn txn_group(&self, txns: Vec<crate::Txn>, _started: std::time::Instant) -> Vec<Result<crate::TxnResponse>> {
        batch::run(&self.keys, txns, |txn| self.txn(txn)).await
    }

    /// Two batches in flight (one fills while the other is on its way),
    /// each of up to 32 transactions.
    fn group_limits(&self) -> (usize, usize) {
        (GROUP_IN_FLIGHT, 32)
    }

    async fn snapshot(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
        let (start, end) = self.keys.range(prefix);
        self.keys.snapshot(&start, &end).await
    }

    fn snapshot_pages(self: Arc<Self>, prefix: String) -> crate::SnapshotPages {
        let (start, end) = self.keys.range(&prefix);
        self.keys.clone().snapshot_pages(start, end)
    }

    /// The first prefix at the current revision, every other at that same
    /// revision (etcd reads at a past revision until it is compacted).
    async fn snapshot_many(&self, prefixes: &[String]) -> Result<(Vec<Vec<KeyValue>>, Revision)> {
        let mut at = None;
        let mut lists = Vec::with_capacity(prefixes.len());
        for prefix in prefixes {
            let (start, end) = self.keys.range(prefix);
            let (items, revision) = self.keys.snapshot_at(&start, &end, at).await?;
            at = Some(revision);
            lists.push(items);
        }
        let revision = match at {
            Some(revision) => revision,
            None => self.revision().await?,
        };
        Ok((lists, revision))
    }

    async fn changes(&self, prefix: &str, from: Revision) -> Result<ChangeStream> {
        watcher::changes(self.keys.clone(), prefix, from, self.shutdown.child_token()).await
    }

    fn leases(&self) -> Option<Arc<dyn Leases>> {
        Some(Arc::new(lease::EtcdLeases { keys: self.keys.clone(), locker: self.locker.clone() }))
    }

    fn round_trips(&self) -> Option<u64> {
        Some(self.keys.cluster.calls())
    }
    fn job_locker(&self) -> Option<Arc<dyn JobLocker>> {
        Some(self.locker.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn keyspace(root: &str) -> Keyspace {
        // Connecting is lazy: no etcd is needed to build a client.
        let cluster = Cluster::new(&["http://127.0.0.1:1".into()], ConnectOptions::new(), Duration::from_secs(1));
        Keyspace { cluster, root: root.into() }
    }

    #[tokio::test]
    async fn keys_are_joined_under_the_root_with_one_slash() {
        let ks = keyspace("/kayra").await;
        assert_eq!(ks.full("/namespaces/a"), "/kayra/namespaces/a");
        assert_eq!(ks.full("namespaces/a"), "/kayra/namespaces/a");
        assert_eq!(ks.full(""), "/kayra/");
        assert_eq!(ks.relative(b"/kayra/namespaces/a").as_deref(), Some("/namespaces/a"));
        assert_eq!(ks.relative(b"/kayra2/namespaces/a"), None);
        assert_eq!(ks.range(""), (b"/kayra/".to_vec(), b"/kayra0".to_vec()));
        let bare = keyspace("").await;
        assert_eq!(bare.full("/a"), "/a");
        assert_eq!(bare.relative(b"/a").as_deref(), Some("/a"));
    }

    /// How a create whose first attempt's outcome is unknown recognises
    /// its own write after someone else wrote the key again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_is_recognised_by_the_value_it_was_created_with() {
        let etcd = kayra_testkit::Etcd::start().await;
        let store = EtcdStore::connect(&etcd.config("/kayra")).await.expect("connect");
        let created = store.create("/namespaces/a", b"mine".to_vec()).await.expect("create");
        store.update("/namespaces/a", b"activated".to_vec(), created).await.expect("update");
        let full = store.keys.full("/namespaces/a");
        assert!(store.created_with(&full, created, b"mine").await);
        assert!(!store.created_with(&full, created, b"activated").await, "the value as created, not as now");
        assert!(!store.created_with(&full, created + 1, b"activated").await, "created at that revision");
    }

    #[test]
    fn prefix_end_increments_the_last_incrementable_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(successor(b"a"), b"a\0".to_vec());
    }
}
