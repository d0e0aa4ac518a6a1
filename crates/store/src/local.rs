//! The local, file-backed store of `kayra dev`: one SQLite file in WAL mode.
//!
//! Why SQLite: it is the one embedded engine that lets two processes
//! (`kayra serve` and `kayra reconciler`) share one file safely, and WAL plus
//! transactions give us "a process killed at any instant leaves a readable
//! store with no committed write lost" for free.
//!
//! Schema:
//! - `kv(key, value, create_rev, mod_rev)`: the current records.
//! - `changes(rev, key, value, create_rev)`: the change log Watch polls; a
//!   `NULL` value is a delete. Trimmed to the newest [`DEFAULT_RETAIN`]
//!   entries on every write, so it cannot grow without bound.
//! - `meta(revision, compacted)`: the store revision, and the newest trimmed
//!   revision (a watch starting at or below it must re-list).
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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::{
    Backend, Change, ChangeStream, Compare, Error, Event, KeyValue, ListPage, Op, Result, Revision, Txn, TxnResponse,
    WatchStream,
};

/// How many change-log entries are kept for watchers.
pub const DEFAULT_RETAIN: i64 = 10_000;

/// Attempts of one write before giving up with `Unavailable`.
const WRITE_ATTEMPTS: u32 = 100;

/// Reader threads (each with its connection) at most: enough that a long
/// list does not hold up point reads, few enough that they stay busy.
const READER_THREADS: usize = 4;

mod checkpoint;
mod readers;

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
        retry_busy(|| {
            conn.execute_batch(
                "BEGIN IMMEDIATE;
                 CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL,
                     create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL) WITHOUT ROWID;
                 CREATE TABLE IF NOT EXISTS changes (rev INTEGER PRIMARY KEY, key BLOB NOT NULL,
                     value BLOB, create_rev INTEGER NOT NULL);
                 CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 1),
                     revision INTEGER NOT NULL, compacted INTEGER NOT NULL);
                 INSERT OR IGNORE INTO meta (id, revision, compacted) VALUES (1, 0, 0);
                 COMMIT;",
            )
            .inspect_err(|_| {
                let _ = conn.execute_batch("ROLLBACK");
            })
        })
        .map_err(unavailable)?;
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
            let tx = conn.transaction()?;
            let resps = txns.iter().map(|txn| apply(&tx, txn, i64::MAX)).collect::<rusqlite::Result<Vec<_>>>()?;
            tx.finish()?;
            Ok(resps)
        })
        .await
    }

    /// Whether `txn` only reads, whichever branch runs.
    fn reads_only(txn: &Txn) -> bool {
        txn.success.iter().chain(&txn.failure).all(|op| matches!(op, Op::Get { .. }))
    }
}

impl Inner {
    /// One write transaction, retried on BUSY while time remains. Each
    /// attempt waits for the lock at most the time left, so no attempt
    /// starts — or commits — after the deadline.
    fn write_within<T>(
        &self,
        mut conn: std::sync::MutexGuard<'_, Connection>,
        started: std::time::Instant,
        f: impl Fn(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T> {
        // Stop a little before the caller's deadline (the same duration,
        // started a moment earlier) so that no attempt outlives it.
        let budget = self.write_timeout.saturating_sub((self.write_timeout / 10).min(Duration::from_millis(100)));
        let mut attempt = 0u32;
        loop {
            let Some(left) = budget.checked_sub(started.elapsed()).filter(|d| !d.is_zero()) else {
                return Err(Error::Unavailable(format!(
                    "the store file's write lock was not free within {:?}",
                    self.write_timeout
                )));
            };
            conn.busy_timeout(left.min(Duration::from_secs(5))).map_err(unavailable)?;
            let result = (|| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let resp = f(&tx)?;
                tx.commit()?;
                Ok(resp)
            })();
            match result {
                Err(e) if is_busy(&e) && attempt < WRITE_ATTEMPTS => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(u64::from(attempt.min(20)) * 2));
                }
                other => return other.map_err(unavailable),
            }
        }
    }

    /// `Unavailable` once the file at `path` is not the one opened (sticky).
    fn check_file(&self) -> Result<()> {
        if !self.lost.load(Ordering::Relaxed) && file_identity(&self.path) == Some(self.identity) {
            return Ok(());
        }
        if !self.lost.swap(true, Ordering::Relaxed) {
            tracing::error!(path = %self.path.display(),
                "the local store file was deleted or replaced under the running process; refusing writes until restarted");
        }
        Err(Error::Unavailable(format!(
            "the store file {} was deleted or replaced; restart to reopen it",
            self.path.display()
        )))
    }
}

#[cfg(unix)]
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|_| (0, 0))
}

/// Evaluates `txn`'s compares and applies the chosen branch inside `tx`:
/// every put and delete takes the next revision and is written to the
/// change log, which is trimmed to `retain` entries.
fn apply(tx: &rusqlite::Transaction<'_>, txn: &Txn, retain: i64) -> rusqlite::Result<TxnResponse> {
    let (start, _) = read_revision(tx)?;
    let mut succeeded = true;
    for compare in &txn.compares {
        let holds = match compare {
            Compare::Absent(key) => revisions_of(tx, key)?.is_none(),
            Compare::Exists(key) => revisions_of(tx, key)?.is_some(),
            Compare::ModRevision(key, expected) => revisions_of(tx, key)?.is_some_and(|(_, m)| m == *expected),
            Compare::PrefixEmpty(prefix) => {
                let (lo, hi) = bounds(prefix);
                tx.query_row("SELECT 1 FROM kv WHERE key >= ?1 AND key < ?2 LIMIT 1", params![lo, hi], |_| Ok(()))
                    .optional()?
                    .is_none()
            }
            Compare::PrefixUnchangedSince(prefix, revision) => {
                let (lo, hi) = bounds(prefix);
                tx.query_row(
                    "SELECT 1 FROM kv WHERE key >= ?1 AND key < ?2 AND mod_rev > ?3 LIMIT 1",
                    params![lo, hi, revision],
                    |_| Ok(()),
                )
                .optional()?
                .is_none()
            }
        };
        if !holds {
            succeeded = false;
            break;
        }
    }
    let ops = if succeeded { &txn.success } else { &txn.failure };
    let mut revision = start;
    let mut gets = Vec::new();
    for op in ops {
        match op {
            Op::Put { key, value } => {
                revision += 1;
                // One statement: a new key is created at `revision`, an
                // existing one keeps its create revision, and either way the
                // row says which. Cached statements: a transaction's writes
                // are parsed once per connection, not once per row.
                let create_rev: Revision = tx
                    .prepare_cached(
                        "INSERT INTO kv (key, value, create_rev, mod_rev) VALUES (?1, ?2, ?3, ?3)
                         ON CONFLICT(key) DO UPDATE SET value = excluded.value, mod_rev = excluded.mod_rev
                         RETURNING create_rev",
                    )?
                    .query_row(params![key.as_bytes(), value, revision], |row| row.get(0))?;
                tx.prepare_cached("INSERT INTO changes (rev, key, value, create_rev) VALUES (?1, ?2, ?3, ?4)")?
                    .execute(params![revision, key.as_bytes(), value, create_rev])?;
            }
            Op::Delete { key } => {
                if let Some((create_rev, _)) = revisions_of(tx, key)? {
                    revision += 1;
                    delete_one(tx, key.as_bytes(), create_rev, revision)?;
                }
            }
            Op::DeletePrefix { prefix } => {
                let (lo, hi) = bounds(prefix);
                let doomed = {
                    let mut stmt =
                        tx.prepare_cached("SELECT key, create_rev FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key")?;
                    stmt.query_map(params![lo, hi], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Revision>(1)?)))?
                        .collect::<rusqlite::Result<Vec<_>>>()?
                };
                for (key, create_rev) in doomed {
                    revision += 1;
                    delete_one(tx, &key, create_rev, revision)?;
                }
            }
            Op::Get { key } => gets.push(get_in(tx, key)?),
        }
    }
    if revision > start {
        let trim_to = revision - retain;
        if trim_to > 0 {
            tx.prepare_cached("DELETE FROM changes WHERE rev <= ?1")?.execute(params![trim_to])?;
            tx.prepare_cached("UPDATE meta SET compacted = MAX(compacted, ?1) WHERE id = 1")?
                .execute(params![trim_to])?;
        }
        tx.prepare_cached("UPDATE meta SET revision = ?1 WHERE id = 1")?.execute(params![revision])?;
    }
    Ok(TxnResponse { succeeded, revision, gets })
}

fn delete_one(
    tx: &rusqlite::Transaction<'_>,
    key: &[u8],
    create_rev: Revision,
    revision: Revision,
) -> rusqlite::Result<()> {
    tx.prepare_cached("DELETE FROM kv WHERE key = ?1")?.execute(params![key])?;
    tx.prepare_cached("INSERT INTO changes (rev, key, value, create_rev) VALUES (?1, ?2, NULL, ?3)")?
        .execute(params![revision, key, create_rev])?;
    Ok(())
}

fn get_in(conn: &Connection, key: &str) -> rusqlite::Result<Option<KeyValue>> {
    // Cached statements: the hot reads are parsed once per connection, not per call.
    conn.prepare_cached("SELECT key, value, create_rev, mod_rev FROM kv WHERE key = ?1")?
        .query_row(params![key.as_bytes()], read_kv)
        .optional()
}

fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).map_err(|e| Error::Unavailable(format!("open {}: {e}", path.display())))?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(unavailable)?;
    // Every hot statement stays parsed (rusqlite keeps 16 by default).
    conn.set_prepared_statement_cache_capacity(64);
    retry_busy(|| {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")
    })
    .map_err(unavailable)?;
    Ok(conn)
}

fn unavailable(e: rusqlite::Error) -> Error {
    Error::Unavailable(format!("sqlite: {e}"))
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

/// Retries `f` while SQLite reports BUSY/LOCKED, with a growing pause.
fn retry_busy<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let mut attempt = 0;
    loop {
        match f() {
            Err(e) if is_busy(&e) && attempt < WRITE_ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(u64::from(attempt.min(20)) * 2));
            }
            other => return other,
        }
    }
}

/// `(create_rev, mod_rev)` of `key`, when present.
fn revisions_of(conn: &Connection, key: &str) -> rusqlite::Result<Option<(Revision, Revision)>> {
    conn.prepare_cached("SELECT create_rev, mod_rev FROM kv WHERE key = ?1")?
        .query_row(params![key.as_bytes()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
}

fn read_kv(row: &rusqlite::Row<'_>) -> rusqlite::Result<KeyValue> {
    let key: Vec<u8> = row.get(0)?;
    Ok(KeyValue {
        key: String::from_utf8_lossy(&key).into_owned(),
        value: row.get(1)?,
        create_revision: row.get(2)?,
        mod_revision: row.get(3)?,
    })
}

/// The smallest byte string greater than every string starting with `prefix`,
/// or `None` when there is none (empty prefix or all 0xFF).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// `(lower bound, upper bound)` of a prefix scan; the upper bound is a
/// large sentinel when the prefix has no end.
fn bounds(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    let end = prefix_end(prefix.as_bytes()).unwrap_or_else(|| vec![0xFF; 1024]);
    (prefix.as_bytes().to_vec(), end)
}

fn read_revision(conn: &Connection) -> rusqlite::Result<(Revision, Revision)> {
    conn.prepare_cached("SELECT revision, compacted FROM meta WHERE id = 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
}

/// One page of keys under `prefix` after `start_after`, inside an open read transaction.
fn page_in(
    conn: &Connection,
    prefix: &str,
    start_after: Option<&[u8]>,
    limit: usize,
) -> rusqlite::Result<(Vec<KeyValue>, bool)> {
    let (lo, hi) = bounds(prefix);
    // `limit + 1` tells whether more remain; a huge limit (u64::MAX from an
    // API caller) must clamp, never wrap to a negative or zero LIMIT.
    let fetch = if limit == 0 { -1 } else { i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1) };
    let mut items = {
        let mut stmt = conn.prepare_cached(
            "SELECT key, value, create_rev, mod_rev FROM kv
             WHERE key >= ?1 AND key < ?2 AND (?3 IS NULL OR key > ?3)
             ORDER BY key LIMIT ?4",
        )?;
        stmt.query_map(params![lo, hi, start_after, fetch], read_kv)?.collect::<rusqlite::Result<Vec<_>>>()?
    };
    let more = limit != 0 && items.len() > limit;
    if more {
        items.truncate(limit);
    }
    Ok((items, more))
}

fn list_in(conn: &mut Connection, prefix: &str, start_after: Option<&str>, limit: usize) -> rusqlite::Result<ListPage> {
    let tx = conn.transaction()?; // one snapshot for the page and its revision
    let (revision, _) = read_revision(&tx)?;
    let (items, more) = page_in(&tx, prefix, start_after.map(str::as_bytes), limit)?;
    tx.finish()?;
    Ok(ListPage { items, more, revision })
}

/// Every key under `prefix`, page by page inside one read transaction (one snapshot).
fn snapshot_in(conn: &mut Connection, prefix: &str) -> rusqlite::Result<(Vec<KeyValue>, Revision)> {
    const PAGE: usize = 1000;
    let tx = conn.transaction()?;
    let (revision, _) = read_revision(&tx)?;
    let mut items: Vec<KeyValue> = Vec::new();
    loop {
        let after = items.last().map(|kv| kv.key.as_bytes().to_vec());
        let (page, more) = page_in(&tx, prefix, after.as_deref(), PAGE)?;
        items.extend(page);
        if !more {
            break;
        }
    }
    tx.finish()?;
    Ok((items, revision))
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
            let tx = conn.transaction()?;
            let (revision, _) = read_revision(&tx)?;
            let kv = get_in(&tx, &key)?;
            tx.finish()?;
            Ok((kv, revision))
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

    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream> {
        // A dedicated connection, so polling never waits behind this
        // process's own writers.
        let conn = connect(&self.inner.path)?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Event>(256);
        let poller = Poller { conn: Arc::new(Mutex::new(conn)), prefix: prefix.to_string(), next: from.max(1) };
        tokio::spawn(poller.run(tx, self.inner.poll_interval));
        Ok(Box::pin(stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })))
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
        if Self::reads_only(&txn) {
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
        let answer = if txns.iter().all(Self::reads_only) {
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

    async fn snapshot(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
        let prefix = prefix.to_string();
        self.read(move |conn| retry_busy(|| snapshot_in(conn, &prefix)).map_err(unavailable)).await
    }

    async fn changes(&self, prefix: &str, from: Revision) -> Result<ChangeStream> {
        let conn = connect(&self.inner.path)?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Change>>(256);
        let feed = Feed { conn: Arc::new(Mutex::new(conn)), prefix: prefix.to_string(), next: from.max(1) };
        tokio::spawn(feed.run(tx, self.inner.poll_interval));
        Ok(Box::pin(stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })))
    }
}

/// The polling fallback for Watch: reads the change log from `next` on.
struct Poller {
    conn: Arc<Mutex<Connection>>,
    prefix: String,
    /// The next revision to deliver.
    next: Revision,
}

/// What one poll found.
enum Batch {
    /// Events, the next revision to read, and — unless the batch was full —
    /// the revision every change up to which has now been seen.
    Events(Vec<Event>, Revision, Option<Revision>),
    /// The position was trimmed away: everything present, and the revision it was read at.
    Relisted(Vec<KeyValue>, Revision),
}

impl Poller {
    async fn run(mut self, tx: tokio::sync::mpsc::Sender<Event>, interval: Duration) {
        loop {
            let conn = self.conn.clone();
            let (prefix, next) = (self.prefix.clone(), self.next);
            let polled = tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                retry_busy(|| poll_once(&mut conn, &prefix, next))
            })
            .await;
            let mut delivered_full_batch = false;
            match polled {
                Ok(Ok(Batch::Events(events, next, _))) => {
                    delivered_full_batch = events.len() >= POLL_BATCH;
                    for event in events {
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                    self.next = next;
                }
                Ok(Ok(Batch::Relisted(items, revision))) => {
                    tracing::warn!(prefix = %self.prefix, from = self.next, "watch position trimmed from the change log; re-listed");
                    for kv in items {
                        if tx.send(Event::Put(kv)).await.is_err() {
                            return;
                        }
                    }
                    self.next = revision + 1;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "local store watch poll failed; retrying"),
                Err(e) => tracing::warn!(error = %e, "local store watch task failed; retrying"),
            }
            if tx.is_closed() {
                return;
            }
            if !delivered_full_batch {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = tx.closed() => return,
                }
            }
        }
    }
}

/// Events read per poll; a full batch is followed by another poll at once.
const POLL_BATCH: usize = 1000;

fn poll_once(conn: &mut Connection, prefix: &str, next: Revision) -> rusqlite::Result<Batch> {
    let tx = conn.transaction()?;
    let (revision, compacted) = read_revision(&tx)?;
    if next <= compacted {
        let (lo, hi) = bounds(prefix);
        let items = {
            let mut stmt = tx.prepare_cached(
                "SELECT key, value, create_rev, mod_rev FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key",
            )?;
            stmt.query_map(params![lo, hi], read_kv)?.collect::<rusqlite::Result<Vec<_>>>()?
        };
        tx.finish()?;
        return Ok(Batch::Relisted(items, revision));
    }
    if next > revision {
        tx.finish()?;
        return Ok(Batch::Events(Vec::new(), next, Some(revision)));
    }
    let (lo, hi) = bounds(prefix);
    let rows = {
        let mut stmt = tx.prepare_cached(
            "SELECT rev, key, value, create_rev FROM changes
             WHERE rev >= ?1 AND key >= ?2 AND key < ?3 ORDER BY rev LIMIT ?4",
        )?;
        stmt.query_map(params![next, lo, hi, POLL_BATCH as i64], |r| {
            let rev: Revision = r.get(0)?;
            let key: Vec<u8> = r.get(1)?;
            let value: Option<Vec<u8>> = r.get(2)?;
            let create_rev: Revision = r.get(3)?;
            Ok((rev, String::from_utf8_lossy(&key).into_owned(), value, create_rev))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?
    };
    tx.finish()?;
    // With a full batch, resume right after its last event; otherwise every
    // change up to `revision` has been seen.
    let full = rows.len() >= POLL_BATCH;
    let resume = if full { rows.last().map_or(next, |r| r.0 + 1) } else { revision + 1 };
    let events = rows
        .into_iter()
        .map(|(rev, key, value, create_rev)| match value {
            Some(value) => Event::Put(KeyValue { key, value, create_revision: create_rev, mod_revision: rev }),
            None => Event::Delete { key, revision: rev },
        })
        .collect();
    Ok(Batch::Events(events, resume, (!full).then_some(revision)))
}

/// The raw change feed of [`Backend::changes`]: polls the change log, sends
/// `Progress` after every complete poll, and ends with `Compacted` when its
/// position has been trimmed away.
struct Feed {
    conn: Arc<Mutex<Connection>>,
    prefix: String,
    next: Revision,
}

impl Feed {
    async fn run(mut self, tx: tokio::sync::mpsc::Sender<Result<Change>>, interval: Duration) {
        loop {
            let conn = self.conn.clone();
            let (prefix, next) = (self.prefix.clone(), self.next);
            let polled = tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                retry_busy(|| {
                    let tx = conn.transaction()?;
                    let (_, compacted) = read_revision(&tx)?;
                    tx.finish()?;
                    if next <= compacted {
                        return Ok(Err(compacted));
                    }
                    poll_once(&mut conn, &prefix, next).map(Ok)
                })
            })
            .await;
            let mut complete = false;
            match polled {
                Ok(Ok(Ok(Batch::Events(events, next, covered)))) => {
                    for event in events {
                        if tx.send(Ok(Change::Event(event))).await.is_err() {
                            return;
                        }
                    }
                    self.next = next;
                    if let Some(revision) = covered {
                        complete = true;
                        if tx.send(Ok(Change::Progress(revision))).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Ok(Ok(Batch::Relisted(..)))) | Ok(Ok(Err(_))) => {
                    let compacted = match polled {
                        Ok(Ok(Err(compacted))) => compacted,
                        _ => self.next,
                    };
                    let _ = tx.send(Err(Error::Compacted(compacted))).await;
                    return;
                }
                Ok(Err(e)) => {
                    let _ = tx.send(Err(unavailable(e))).await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(Error::Unavailable(format!("store task failed: {e}")))).await;
                    return;
                }
            }
            if complete {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = tx.closed() => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"/a/"), Some(b"/a0".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b""), None);
    }
}
