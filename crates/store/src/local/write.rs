//! The write path: a [`Txn`] applied to the tables and the change log in
//! one `BEGIN IMMEDIATE` transaction, retried on BUSY within the write
//! timeout, and acknowledged only while the file is still the one opened.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::schema::file_identity;
use super::sql::{bounds, get_in, is_busy, read_revision, revisions_of, unavailable};
use super::{Inner, WRITE_ATTEMPTS};
use crate::{Compare, Error, Op, Result, Revision, Txn, TxnResponse};

impl Inner {
    /// One write transaction, retried on BUSY while time remains. Each
    /// attempt waits for the lock at most the time left, so no attempt
    /// starts — or commits — after the deadline.
    pub(super) fn write_within<T>(
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
    pub(super) fn check_file(&self) -> Result<()> {
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

/// Evaluates `txn`'s compares and applies the chosen branch inside `tx`,
/// a connection with a transaction open (a write's, or a read-only
/// transaction's snapshot): every put and delete takes the next revision
/// and is written to the change log, which is trimmed to `retain` entries.
pub(super) fn apply(tx: &rusqlite::Connection, txn: &Txn, retain: i64) -> rusqlite::Result<TxnResponse> {
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

fn delete_one(tx: &rusqlite::Connection, key: &[u8], create_rev: Revision, revision: Revision) -> rusqlite::Result<()> {
    tx.prepare_cached("DELETE FROM kv WHERE key = ?1")?.execute(params![key])?;
    tx.prepare_cached("INSERT INTO changes (rev, key, value, create_rev) VALUES (?1, ?2, NULL, ?3)")?
        .execute(params![revision, key, create_rev])?;
    Ok(())
}
