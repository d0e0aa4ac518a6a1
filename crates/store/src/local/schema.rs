//! The store file: connections to it, its tables, and its identity.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::sql::{retry_busy, unavailable};
use crate::{Error, Result};

/// Creates the tables (see the module docs of `local`) unless they exist.
pub(super) fn create(conn: &Connection) -> Result<()> {
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
    .map_err(unavailable)
}

pub(super) fn connect(path: &Path) -> Result<Connection> {
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

#[cfg(unix)]
pub(super) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
pub(super) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|_| (0, 0))
}
