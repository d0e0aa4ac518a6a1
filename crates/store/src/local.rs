//! The local, file-backed store of `kayra dev`: one SQLite file in WAL mode.
//!
//! Why SQLite: it is the one embedded engine that lets two processes
//! (`kayra serve` and `kayra reconciler`) share one file safely, and WAL plus
//! transactions give us "a process killed at any instant leaves a readable
//! store with no committed write lost" for free.
//!
//! Schema:
//! - `kv(key, value, create_rev, mod_rev)`: the current records.
//! - `changes(rev, key, value, create_rev)`: the change log the change feed
//!   polls; a `NULL` value is a delete. Trimmed to the newest
//!   [`DEFAULT_RETAIN`] entries on every write, so it cannot grow without
//!   bound.
//! - `meta(revision, compacted)`: the store revision, and the newest trimmed
//!   revision (a feed starting at or below it ends with `Compacted`).
//!
//! Every write — single-key or [`Txn`] — runs in one `BEGIN IMMEDIATE`
//! transaction, and each put or delete in it takes the next revision (the
//! change log has one row per revision, so a transaction of three writes
//! moves the revision by three; its readers see all three or none).
//!
//! Reads never wait behind a pending write (platform §3): writes go through
//! one writer connection; a point read runs on the caller's thread on a
//! connection that never waits for a lock, everything else (and a point
//! read that met a lock) on a few reader threads (`readers`).
//! In WAL mode a reader needs no lock a writer holds, so a write waiting on
//! another process's lock (`busy_timeout`) delays only other writes.
//!
//! The file at `path` must stay the one opened: an operator deleting or
//! replacing it would silently turn every later commit into a write to an
//! unlinked inode, lost at the next restart. Each write checks the path's
//! device and inode before and after it commits, and [`Backend::revision`]
//! (readiness) checks them too: once they differ, the store refuses writes
//! and readiness with `Unavailable` until restarted.
//!
//! Every write runs in a `BEGIN IMMEDIATE` transaction: read-then-write
//! transactions started DEFERRED across two processes fail with
//! `SQLITE_BUSY` far more often than `busy_timeout` can cure, and even
//! IMMEDIATE can lose a race under heavy contention, so writes also retry
//! at the application level. `synchronous=NORMAL` in WAL mode is durable
//! against a process crash (only a power loss may lose the newest commits).
//!
//! The writer never checkpoints the log inside a commit: a thread of its
//! own does, in the background (`checkpoint`).
//!
//! Keys are stored as BLOBs so that prefix ranges compare byte-wise.
//!
//! # Layout
//! - this file: [`LocalStore`], opening it, and the [`Backend`] calls.
//! - `local/schema.rs`: connections, the tables, the file's identity.
//! - `local/write.rs`: the write path — [`Txn`]s applied to the tables and
//!   the change log, the writer's retry within the write timeout, the
//!   file check around every commit.
//! - `local/sql.rs`: the shared SQL pieces — reads, prefix bounds, row
//!   decoding, retry on BUSY.
//! - `local/feed.rs`: the change feed ([`Backend::changes`]), polling the
//!   change log.
//! - `local/readers.rs`: the reader threads; `local/checkpoint.rs`: the
//!   checkpoint thread.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream;
use rusqlite::Connection;

use crate::{
    Backend, Change, ChangeStream, Compare, Error, KeyValue, ListPage, Op, Result, Revision, Txn, TxnResponse,
};

use self::schema::{connect, file_identity};
use self::sql::{
    GETS_AT_ONCE, gets_at_once, in_snapshot, is_busy, list_in, read_revision, retry_busy, snapshot_in,
    snapshot_pages_in, snapshots_in, unavailable,
};
use self::write::apply;

/// How many change-log entries are kept for watchers.
pub const DEFAULT_RETAIN: i64 = 10_000;

/// Attempts of one write before giving up with `Unavailable`.
const WRITE_ATTEMPTS: u32 = 100;

/// Reader threads (each with its connection) at most: enough that a long
/// list does not hold up point reads, few enough that they stay busy.
const READER_THREADS: usize = 4;

mod checkpoint;
mod feed;
mod readers;
mod schema;
mod sql;
mod write;

/// The SQLite backend. Cheap to clone via `Store`.
pub struct LocalStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The one writer connection of this process (SQLite serialises writers anyway).
    writer: Mutex<Connection>,
    /// The threads every read runs on (see `readers`).
    readers: readers::Readers,
    /// The thread that checkpoints the log (see `checkpoint`).
    checkpointer: checkpoint::Checkpointer,
    /// `(device, inode)` of the file opened.
    identity: (u64, u64),
    /// Set once the file at `path` is no longer the one opened.
    lost: AtomicBool,
    poll_interval: Duration,
    retain: i64,
    /// How long a write may wait for the file's write lock, queueing
    /// behind this process's other writes included (the request timeout).
    write_timeout: Duration,
}

impl LocalStore {
    /// Opens (creating if needed) the store file at `path`.
    pub fn open(path: &Path, poll_interval: Duration) -> Result<Self> {
        Self::open_with_retention(path, poll_interval, DEFAULT_RETAIN)
    }

    /// Like [`LocalStore::open`], keeping only `retain` change-log entries.
    pub fn open_with_retention(path: &Path, poll_interval: Duration, retain: i64) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::Unavailable(format!("create {}: {e}", dir.display())))?;
        }
        let conn = connect(path)?;
        // Checkpoints run on their own thread; this is only the safety valve.
        conn.pragma_update(None, "wal_autocheckpoint", checkpoint::WRITER_AUTOCHECKPOINT).map_err(unavailable)?;
        schema::create(&conn)?;
        let identity = file_identity(path)
            .ok_or_else(|| Error::Unavailable(format!("{} vanished while opening it", path.display())))?;
        Ok(Self {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                writer: Mutex::new(conn),
                readers: readers::Readers::new(path, READER_THREADS),
                checkpointer: checkpoint::Checkpointer::start(path, connect),
                identity,
                lost: AtomicBool::new(false),
                poll_interval,
                retain: retain.max(1),
                write_timeout: kayra_config::DEFAULT_REQUEST_TIMEOUT,
            }),
        })
    }

    /// Bounds every write's wait for the write lock by `timeout` (the
    /// store's request timeout): a write that could not start by then fails
    /// with `Unavailable` and never commits later behind the caller's back.
    pub fn with_write_timeout(mut self, timeout: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.write_timeout = timeout;
        }
        self
    }

    /// Runs `f` on a reader connection, off the async threads.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.inner.readers.read(connect, f).await
    }

    /// A read of a few keys: on the caller's thread when it need not wait
    /// for a lock (`readers::Readers::inline`), else on a reader thread
    /// with the usual retry on BUSY.
    async fn point_read<T: Send + 'static>(
        &self,
        f: impl Fn(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        if let Some(result) = self.inner.readers.inline(connect, is_busy, &f) {
            return result.map_err(unavailable);
        }
        self.read(move |conn| retry_busy(|| f(conn)).map_err(unavailable)).await
    }

    /// Runs `txn` in one write transaction, with application-level retry on
    /// BUSY, all within the write timeout.
    async fn write(&self, txn: Txn) -> Result<TxnResponse> {
        let retain = self.inner.retain;
        self.write_with(std::time::Instant::now(), move |tx| apply(tx, &txn, retain)).await
    }

    /// Runs `f` as one write transaction of its own (retried on BUSY
    /// within the write timeout counted from `started`), off the async
    /// threads, and acknowledges it only if the file is still the one opened.
    async fn write_with<T: Send + 'static>(
        &self,
        started: std::time::Instant,
        f: impl Fn(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let conn = inner.writer.lock().unwrap_or_else(|p| p.into_inner());
            inner.check_file()?;
            let resp = inner.write_within(conn, started, f)?;
            inner.checkpointer.committed();
            // A commit into a file no longer at `path` is lost at the next
            // start: it must not be acknowledged.
            inner.check_file()?;
            Ok(resp)
        })
        .await
        .map_err(|e| Error::Unavailable(format!("store task failed: {e}")))?
    }

    /// Read-only transactions in one snapshot (a point read: on the
    /// caller's thread when it need not wait, else on a reader thread).
    async fn read_txns(&self, txns: Vec<Txn>) -> Result<Vec<TxnResponse>> {
        self.point_read(move |conn| {
            // A lone transaction of gets alone (a GET's read): one statement.
            if let [txn] = txns.as_slice()
                && let Some(keys) = only_gets(txn)
            {
                let (revision, gets) = gets_at_once(conn, &keys)?;
                return Ok(vec![TxnResponse { succeeded: true, revision, gets }]);
            }
            in_snapshot(conn, |tx| {
                txns.iter().map(|txn| apply(tx, txn, i64::MAX)).collect::<rusqlite::Result<Vec<_>>>()
            })
        })
        .await
    }
}

/// The keys of `txn` when it is only gets, with no compares, and at most
/// [`GETS_AT_ONCE`] of them.
fn only_gets(txn: &Txn) -> Option<Vec<&str>> {
    if !txn.compares.is_empty() || txn.success.is_empty() || txn.success.len() > GETS_AT_ONCE {
        return None;
    }
    txn.success.iter().map(|op| if let Op::Get { key } = op { Some(key.as_str()) } else { None }).collect()
}

/// Why a failed single-key write failed, from its `else` branch's read.
fn failed_write(key: &str, resp: &TxnResponse) -> Error {
    match resp.gets.first() {
        Some(Some(_)) => Error::Conflict(key.to_string()),
        _ => Error::NotFound(key.to_string()),
    }
}

#[async_trait]
impl Backend for LocalStore {
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision)> {
        let key = key.to_string();
        self.point_read(move |conn| {
            let (revision, mut found) = gets_at_once(conn, &[&key])?;
            Ok((found.pop().flatten(), revision))
        })
        .await
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Result<ListPage> {
        let (prefix, after) = (prefix.to_string(), start_after.map(str::to_string));
        self.read(move |conn| retry_busy(|| list_in(conn, &prefix, after.as_deref(), limit)).map_err(unavailable)).await
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision> {
        let txn = Txn::new().when(Compare::Absent(key.to_string())).then(Op::Put { key: key.to_string(), value });
        let resp = self.write(txn).await?;
        if !resp.succeeded {
            return Err(Error::Conflict(key.to_string()));
        }
        Ok(resp.revision)
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<Revision> {
        let txn = Txn::new()
            .when(Compare::ModRevision(key.to_string(), expected))
            .then(Op::Put { key: key.to_string(), value })
            .otherwise(Op::Get { key: key.to_string() });
        let resp = self.write(txn).await?;
        if !resp.succeeded {
            return Err(failed_write(key, &resp));
        }
        Ok(resp.revision)
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Revision> {
        let compare = match expected {
            Some(expected) => Compare::ModRevision(key.to_string(), expected),
            None => Compare::Exists(key.to_string()),
        };
        let txn = Txn::new()
            .when(compare)
            .then(Op::Delete { key: key.to_string() })
            .otherwise(Op::Get { key: key.to_string() });
        let resp = self.write(txn).await?;
        if !resp.succeeded {
            return Err(failed_write(key, &resp));
        }
        Ok(resp.revision)
    }

    async fn revision(&self) -> Result<Revision> {
        // Readiness: a store whose file is gone is not ready.
        self.inner.check_file()?;
        self.read(|conn| Ok(retry_busy(|| read_revision(conn)).map_err(unavailable)?.0)).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        // A transaction that only reads (whichever branch runs) is one
        // snapshot on a reader connection: it neither takes the file's
        // write lock nor queues behind this process's writers, as etcd
        // serves a read-only Txn without a raft proposal.
        if txn.reads_only() {
            return self.read_txns(vec![txn]).await.map(|mut resps| resps.remove(0));
        }
        self.write(txn).await
    }

    /// One SQLite transaction for the whole group, each of its
    /// transactions applied in turn (its own compares, its own revisions):
    /// exactly one after another, sharing one commit. A group that only
    /// reads is one snapshot on a reader connection.
    async fn txn_group(&self, txns: Vec<Txn>, started: std::time::Instant) -> Vec<Result<TxnResponse>> {
        let n = txns.len();
        let answer = if txns.iter().all(Txn::reads_only) {
            self.read_txns(txns).await
        } else {
            let retain = self.inner.retain;
            self.write_with(started, move |tx| txns.iter().map(|txn| apply(tx, txn, retain)).collect()).await
        };
        match answer {
            Ok(resps) => resps.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e); n],
        }
    }

    /// One writer: batches queue behind the one committing, and go as one.
    fn group_limits(&self) -> (usize, usize) {
        (1, 256)
    }

    /// A read shares no commit: each runs on the reader connection of the
    /// thread it is on, all at once, instead of queueing behind the one
    /// batch in flight.
    fn groups_reads(&self) -> bool {
        false
    }

    async fn snapshot(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
        let prefix = prefix.to_string();
        self.read(move |conn| retry_busy(|| snapshot_in(conn, &prefix)).map_err(unavailable)).await
    }

    /// One read transaction on a connection of its own, on a blocking
    /// thread that reads the next page only once the consumer has taken
    /// the one before (a channel of one page): a list of any size holds
    /// about two pages in memory, and its transaction keeps one snapshot.
    fn snapshot_pages(self: Arc<Self>, prefix: String) -> crate::SnapshotPages {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<(Vec<KeyValue>, Revision)>>(1);
        let path = self.inner.path.clone();
        tokio::task::spawn_blocking(move || {
            let read = connect(&path).and_then(|mut conn| {
                snapshot_pages_in(&mut conn, &prefix, |page, revision| tx.blocking_send(Ok((page, revision))).is_ok())
                    .map_err(unavailable)
            });
            if let Err(e) = read {
                let _ = tx.blocking_send(Err(e));
            }
        });
        Box::pin(stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|page| (page, rx)) }))
    }

    /// One read transaction over every prefix: one snapshot.
    async fn snapshot_many(&self, prefixes: &[String]) -> Result<(Vec<Vec<KeyValue>>, Revision)> {
        let prefixes = prefixes.to_vec();
        self.read(move |conn| retry_busy(|| snapshots_in(conn, &prefixes)).map_err(unavailable)).await
    }

    async fn changes(&self, prefix: &str, from: Revision) -> Result<ChangeStream> {
        let conn = connect(&self.inner.path)?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Change>>(256);
        let feed = feed::Feed::new(conn, prefix, from);
        tokio::spawn(feed.run(tx, self.inner.poll_interval));
        Ok(Box::pin(stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })))
    }
}
