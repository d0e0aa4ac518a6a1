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
//! Every write runs in a `BEGIN IMMEDIATE` transaction: read-then-write
//! transactions started DEFERRED across two processes fail with
//! `SQLITE_BUSY` far more often than `busy_timeout` can cure, and even
//! IMMEDIATE can lose a race under heavy contention, so writes also retry
//! at the application level. `synchronous=NORMAL` in WAL mode is durable
//! against a process crash (only a power loss may lose the newest commits).
//!
//! Keys are stored as BLOBs so that prefix ranges compare byte-wise.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::{Backend, Error, Event, KeyValue, ListPage, Result, Revision, WatchStream};

/// How many change-log entries are kept for watchers.
pub const DEFAULT_RETAIN: i64 = 10_000;

/// Attempts of one write before giving up with `Unavailable`.
const WRITE_ATTEMPTS: u32 = 100;

/// The SQLite backend. Cheap to clone via `Store`; one connection per
/// process, serialised by a mutex (SQLite serialises writers anyway).
pub struct LocalStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    conn: Mutex<Connection>,
    poll_interval: Duration,
    retain: i64,
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
        Ok(Self {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                conn: Mutex::new(conn),
                poll_interval,
                retain: retain.max(1),
            }),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(|e| Error::Unavailable(format!("store task failed: {e}")))?
    }

    /// Runs one write transaction with application-level retry on BUSY.
    /// `f` returns `Ok(Err(e))` for a logical failure (conflict, not found),
    /// which rolls back without retrying.
    async fn write(
        &self,
        f: impl Fn(&rusqlite::Transaction<'_>, Revision) -> rusqlite::Result<Result<WriteOp>> + Send + 'static,
    ) -> Result<Revision> {
        let retain = self.inner.retain;
        self.blocking(move |conn| {
            retry_busy(|| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let current: Revision = tx.query_row("SELECT revision FROM meta WHERE id = 1", [], |r| r.get(0))?;
                let next = current + 1;
                let op = match f(&tx, next)? {
                    Ok(op) => op,
                    Err(e) => return Ok(Err(e)),
                };
                match &op {
                    WriteOp::Put { key, value, create_rev } => {
                        tx.execute(
                            "INSERT INTO kv (key, value, create_rev, mod_rev) VALUES (?1, ?2, ?3, ?4)
                             ON CONFLICT(key) DO UPDATE SET value = excluded.value, mod_rev = excluded.mod_rev",
                            params![key.as_bytes(), value, create_rev, next],
                        )?;
                        tx.execute(
                            "INSERT INTO changes (rev, key, value, create_rev) VALUES (?1, ?2, ?3, ?4)",
                            params![next, key.as_bytes(), value, create_rev],
                        )?;
                    }
                    WriteOp::Delete { key, create_rev } => {
                        tx.execute("DELETE FROM kv WHERE key = ?1", params![key.as_bytes()])?;
                        tx.execute(
                            "INSERT INTO changes (rev, key, value, create_rev) VALUES (?1, ?2, NULL, ?3)",
                            params![next, key.as_bytes(), create_rev],
                        )?;
                    }
                }
                let trim_to = next - retain;
                if trim_to > 0 {
                    tx.execute("DELETE FROM changes WHERE rev <= ?1", params![trim_to])?;
                    tx.execute("UPDATE meta SET compacted = MAX(compacted, ?1) WHERE id = 1", params![trim_to])?;
                }
                tx.execute("UPDATE meta SET revision = ?1 WHERE id = 1", params![next])?;
                tx.commit()?;
                Ok(Ok(next))
            })
            .map_err(unavailable)?
        })
        .await
    }
}

/// What a write transaction decided to do.
enum WriteOp {
    Put { key: String, value: Vec<u8>, create_rev: Revision },
    Delete { key: String, create_rev: Revision },
}

fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).map_err(|e| Error::Unavailable(format!("open {}: {e}", path.display())))?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(unavailable)?;
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
fn revisions_of(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Option<(Revision, Revision)>> {
    tx.query_row("SELECT create_rev, mod_rev FROM kv WHERE key = ?1", params![key.as_bytes()], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
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
    conn.query_row("SELECT revision, compacted FROM meta WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
}

fn list_in(conn: &mut Connection, prefix: &str, start_after: Option<&str>, limit: usize) -> rusqlite::Result<ListPage> {
    let tx = conn.transaction()?; // one snapshot for the page and its revision
    let (revision, _) = read_revision(&tx)?;
    let (lo, hi) = bounds(prefix);
    let after = start_after.map(|s| s.as_bytes().to_vec());
    let fetch = if limit == 0 { -1 } else { limit as i64 + 1 };
    let mut items = {
        let mut stmt = tx.prepare_cached(
            "SELECT key, value, create_rev, mod_rev FROM kv
             WHERE key >= ?1 AND key < ?2 AND (?3 IS NULL OR key > ?3)
             ORDER BY key LIMIT ?4",
        )?;
        stmt.query_map(params![lo, hi, after, fetch], read_kv)?.collect::<rusqlite::Result<Vec<_>>>()?
    };
    tx.finish()?;
    let more = limit != 0 && items.len() > limit;
    items.truncate(if limit == 0 { items.len() } else { limit });
    Ok(ListPage { items, more, revision })
}

#[async_trait]
impl Backend for LocalStore {
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision)> {
        let key = key.to_string();
        self.blocking(move |conn| {
            let tx = conn.transaction().map_err(unavailable)?;
            let (revision, _) = read_revision(&tx).map_err(unavailable)?;
            let kv = tx
                .query_row(
                    "SELECT key, value, create_rev, mod_rev FROM kv WHERE key = ?1",
                    params![key.as_bytes()],
                    read_kv,
                )
                .optional()
                .map_err(unavailable)?;
            tx.finish().map_err(unavailable)?;
            Ok((kv, revision))
        })
        .await
    }

    async fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Result<ListPage> {
        let (prefix, after) = (prefix.to_string(), start_after.map(str::to_string));
        self.blocking(move |conn| retry_busy(|| list_in(conn, &prefix, after.as_deref(), limit)).map_err(unavailable))
            .await
    }

    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision> {
        let key = key.to_string();
        self.write(move |tx, next| {
            let exists: Option<i64> = tx
                .query_row("SELECT mod_rev FROM kv WHERE key = ?1", params![key.as_bytes()], |r| r.get(0))
                .optional()?;
            Ok(match exists {
                Some(_) => Err(Error::Conflict(key.clone())),
                None => Ok(WriteOp::Put { key: key.clone(), value: value.clone(), create_rev: next }),
            })
        })
        .await
    }

    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<Revision> {
        let key = key.to_string();
        self.write(move |tx, _| {
            let found = revisions_of(tx, &key)?;
            Ok(match found {
                None => Err(Error::NotFound(key.clone())),
                Some((_, m)) if m != expected => Err(Error::Conflict(key.clone())),
                Some((c, _)) => Ok(WriteOp::Put { key: key.clone(), value: value.clone(), create_rev: c }),
            })
        })
        .await
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Revision> {
        let key = key.to_string();
        self.write(move |tx, _| {
            let found = revisions_of(tx, &key)?;
            Ok(match found {
                None => Err(Error::NotFound(key.clone())),
                Some((_, m)) if expected.is_some_and(|e| e != m) => Err(Error::Conflict(key.clone())),
                Some((c, _)) => Ok(WriteOp::Delete { key: key.clone(), create_rev: c }),
            })
        })
        .await
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream> {
        // A dedicated connection, so polling never waits behind this
        // process's own writers on the shared one.
        let conn = connect(&self.inner.path)?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Event>(256);
        let poller = Poller { conn: Arc::new(Mutex::new(conn)), prefix: prefix.to_string(), next: from.max(1) };
        tokio::spawn(poller.run(tx, self.inner.poll_interval));
        Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })))
    }

    async fn revision(&self) -> Result<Revision> {
        self.blocking(|conn| Ok(read_revision(conn).map_err(unavailable)?.0)).await
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
    Events(Vec<Event>, Revision),
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
                Ok(Ok(Batch::Events(events, next))) => {
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
        return Ok(Batch::Events(Vec::new(), next));
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
    let resume = if rows.len() >= POLL_BATCH { rows.last().map_or(next, |r| r.0 + 1) } else { revision + 1 };
    let events = rows
        .into_iter()
        .map(|(rev, key, value, create_rev)| match value {
            Some(value) => Event::Put(KeyValue { key, value, create_revision: create_rev, mod_revision: rev }),
            None => Event::Delete { key, revision: rev },
        })
        .collect();
    Ok(Batch::Events(events, resume))
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
