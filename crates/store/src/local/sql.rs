//! The SQL pieces the read and write paths share: point and page reads,
//! prefix bounds, row decoding, and the retry on BUSY.

use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

use super::WRITE_ATTEMPTS;
use crate::{Error, KeyValue, ListPage, Revision};

pub(super) fn get_in(conn: &Connection, key: &str) -> rusqlite::Result<Option<KeyValue>> {
    // Cached statements: the hot reads are parsed once per connection, not per call.
    conn.prepare_cached("SELECT key, value, create_rev, mod_rev FROM kv WHERE key = ?1")?
        .query_row(params![key.as_bytes()], read_kv)
        .optional()
}

/// At most this many keys are read by [`gets_at_once`].
pub(super) const GETS_AT_ONCE: usize = 8;

/// The store revision and the records at `keys` (`None` where there is
/// none), in order, read by one statement: one statement is one snapshot,
/// so no `BEGIN`/`COMMIT` is needed, and the revision and every key cost
/// one statement's execution instead of one each. A GET of a subscription
/// (two keys) was five statements; it is one. Callers keep `keys` to
/// [`GETS_AT_ONCE`] or fewer (more are read all the same, with an SQL text
/// built for the call).
pub(super) fn gets_at_once(conn: &Connection, keys: &[&str]) -> rusqlite::Result<(Revision, Vec<Option<KeyValue>>)> {
    static SQL: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let built;
    let sql = match SQL.get_or_init(|| (1..=GETS_AT_ONCE).map(gets_sql).collect()).get(keys.len().wrapping_sub(1)) {
        Some(sql) => sql.as_str(),
        None => {
            built = gets_sql(keys.len());
            built.as_str()
        }
    };
    let mut statement = conn.prepare_cached(sql)?;
    let mut rows = statement.query(rusqlite::params_from_iter(keys.iter().map(|k| k.as_bytes())))?;
    let (mut revision, mut found) = (0, vec![None; keys.len()]);
    while let Some(row) = rows.next()? {
        revision = row.get(4)?;
        let index: i64 = row.get(5)?;
        if row.get_ref(0)? != rusqlite::types::ValueRef::Null
            && let Some(slot) = usize::try_from(index).ok().and_then(|i| found.get_mut(i))
        {
            *slot = Some(read_kv(row)?);
        }
    }
    Ok((revision, found))
}

/// The SQL of [`gets_at_once`] for `n` keys: the keys as a table of
/// (position, key), each looked up in `kv` by its primary key; a row's
/// record in [`read_kv`]'s columns, then the revision and the position.
fn gets_sql(n: usize) -> String {
    let keys: Vec<String> = (1..=n).map(|i| format!("({}, ?{i})", i - 1)).collect();
    format!(
        "WITH wanted(i, key) AS (VALUES {}) \
         SELECT kv.key, kv.value, kv.create_rev, kv.mod_rev, (SELECT revision FROM meta WHERE id = 1), wanted.i \
         FROM wanted LEFT JOIN kv ON kv.key = wanted.key",
        keys.join(", ")
    )
}

/// Runs `f` in one read snapshot of `conn`: `BEGIN` … `COMMIT` from
/// cached statements. rusqlite's `transaction()` parses both on every
/// call, which a profile of a point read showed as a tenth of it. Whatever
/// `f` does (an error, a panic), the connection is left outside any
/// transaction.
pub(super) fn in_snapshot<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    /// Rolls back a snapshot that did not commit.
    struct Open<'c>(&'c Connection);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            if !self.0.is_autocommit() {
                let _ = self.0.execute_batch("ROLLBACK");
            }
        }
    }
    conn.prepare_cached("BEGIN")?.execute([])?;
    let open = Open(conn);
    let value = f(conn)?;
    conn.prepare_cached("COMMIT")?.execute([])?;
    drop(open);
    Ok(value)
}

/// A disk that is full or a value too big for SQLite is refused, as etcd
/// refuses them: sending the same write again does not help.
pub(super) fn unavailable(e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::DiskFull | ErrorCode::TooBig) => Error::Refused(format!("sqlite: {e}")),
        _ => Error::Unavailable(format!("sqlite: {e}")),
    }
}

pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

/// Retries `f` while SQLite reports BUSY/LOCKED, with a growing pause.
pub(super) fn retry_busy<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
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
pub(super) fn revisions_of(conn: &Connection, key: &str) -> rusqlite::Result<Option<(Revision, Revision)>> {
    conn.prepare_cached("SELECT create_rev, mod_rev FROM kv WHERE key = ?1")?
        .query_row(params![key.as_bytes()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
}

pub(super) fn read_kv(row: &rusqlite::Row<'_>) -> rusqlite::Result<KeyValue> {
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
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
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
pub(super) fn bounds(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    let end = prefix_end(prefix.as_bytes()).unwrap_or_else(|| vec![0xFF; 1024]);
    (prefix.as_bytes().to_vec(), end)
}

pub(super) fn read_revision(conn: &Connection) -> rusqlite::Result<(Revision, Revision)> {
    conn.prepare_cached("SELECT revision, compacted FROM meta WHERE id = 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
}

/// One page of keys under `prefix` after `start_after`, inside an open read transaction.
pub(super) fn page_in(
    conn: &Connection,
    prefix: &str,
    start_after: Option<&[u8]>,
    limit: usize,
) -> rusqlite::Result<(Vec<KeyValue>, bool)> {
    let (lo, hi) = bounds(prefix);
    // `limit + 1` tells whether more remain; a huge limit (u64::MAX from an
    // API caller) must clamp, never wrap to a negative or zero LIMIT.
    let fetch = if limit == 0 { -1 } else { i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1) };
    // The page starts where the index seek can: strictly after `start_after`
    // when it lies in the prefix, else at the prefix. (One statement with
    // `key >= lo AND (?3 IS NULL OR key > ?3)` scanned from the prefix's
    // start on every page: a million-key list in pages of 1,000 took
    // minutes.)
    let mut items = match start_after.filter(|after| *after >= lo.as_slice()) {
        Some(after) => conn
            .prepare_cached(
                "SELECT key, value, create_rev, mod_rev FROM kv WHERE key > ?1 AND key < ?2 ORDER BY key LIMIT ?3",
            )?
            .query_map(params![after, hi, fetch], read_kv)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
        None => conn
            .prepare_cached(
                "SELECT key, value, create_rev, mod_rev FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key LIMIT ?3",
            )?
            .query_map(params![lo, hi, fetch], read_kv)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
    };
    let more = limit != 0 && items.len() > limit;
    if more {
        items.truncate(limit);
    }
    Ok((items, more))
}

pub(super) fn list_in(
    conn: &mut Connection,
    prefix: &str,
    start_after: Option<&str>,
    limit: usize,
) -> rusqlite::Result<ListPage> {
    let tx = conn.transaction()?; // one snapshot for the page and its revision
    let (revision, _) = read_revision(&tx)?;
    let (items, more) = page_in(&tx, prefix, start_after.map(str::as_bytes), limit)?;
    tx.finish()?;
    Ok(ListPage { items, more, revision })
}

/// Every key under `prefix`, page by page inside one read transaction (one snapshot).
pub(super) fn snapshot_in(conn: &mut Connection, prefix: &str) -> rusqlite::Result<(Vec<KeyValue>, Revision)> {
    let (mut lists, revision) = snapshots_in(conn, std::slice::from_ref(&prefix.to_string()))?;
    Ok((lists.pop().unwrap_or_default(), revision))
}

/// Every key under `prefix` inside ONE read transaction, handed to `page`
/// a page at a time with the snapshot's revision (at least one page, maybe
/// empty), until there are no more or `page` answers false.
pub(super) fn snapshot_pages_in(
    conn: &mut Connection,
    prefix: &str,
    mut page: impl FnMut(Vec<KeyValue>, Revision) -> bool,
) -> rusqlite::Result<()> {
    const PAGE: usize = 1000;
    let tx = conn.transaction()?;
    let (revision, _) = read_revision(&tx)?;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let (items, more) = page_in(&tx, prefix, after.as_deref(), PAGE)?;
        after = items.last().map(|kv| kv.key.as_bytes().to_vec());
        if !page(items, revision) || !more {
            break;
        }
    }
    tx.finish()
}

/// Every key under each of `prefixes`, page by page inside ONE read
/// transaction (one snapshot for all of them).
pub(super) fn snapshots_in(
    conn: &mut Connection,
    prefixes: &[String],
) -> rusqlite::Result<(Vec<Vec<KeyValue>>, Revision)> {
    const PAGE: usize = 1000;
    let tx = conn.transaction()?;
    let (revision, _) = read_revision(&tx)?;
    let mut lists = Vec::with_capacity(prefixes.len());
    for prefix in prefixes {
        let mut items: Vec<KeyValue> = Vec::new();
        loop {
            let after = items.last().map(|kv| kv.key.as_bytes().to_vec());
            let (page, more) = page_in(&tx, prefix, after.as_deref(), PAGE)?;
            items.extend(page);
            if !more {
                break;
            }
        }
        lists.push(items);
    }
    tx.finish()?;
    Ok((lists, revision))
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

    /// The one-statement read answers like a get per key: in the order
    /// asked, `None` for a missing key, a key asked twice twice, with the
    /// store's revision; past [`GETS_AT_ONCE`] keys too.
    #[test]
    fn gets_at_once_answer_as_gets_would() {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::schema::connect(&dir.path().join("store.db")).unwrap();
        super::super::schema::create(&conn).unwrap();
        conn.execute_batch(
            "INSERT INTO kv VALUES (CAST('/a' AS BLOB), CAST('1' AS BLOB), 3, 5), (CAST('/b' AS BLOB), CAST('2' AS BLOB), 4, 4);
             UPDATE meta SET revision = 7 WHERE id = 1;",
        )
        .unwrap();
        let (revision, found) = gets_at_once(&conn, &["/b", "/nope", "/a", "/b"]).unwrap();
        assert_eq!(revision, 7);
        let kv = |key: &str, value: &[u8], create_revision, mod_revision| {
            Some(KeyValue { key: key.into(), value: value.to_vec(), create_revision, mod_revision })
        };
        assert_eq!(found, [kv("/b", b"2", 4, 4), None, kv("/a", b"1", 3, 5), kv("/b", b"2", 4, 4)]);
        for key in ["/a", "/b", "/nope"] {
            let (_, found) = gets_at_once(&conn, &[key]).unwrap();
            assert_eq!(found, [get_in(&conn, key).unwrap()], "{key}");
        }
        let many: Vec<&str> = std::iter::repeat_n("/a", GETS_AT_ONCE + 3).collect();
        let (_, found) = gets_at_once(&conn, &many).unwrap();
        assert!(found.len() == GETS_AT_ONCE + 3 && found.iter().all(Option::is_some));
    }

    /// A snapshot is one: a write from another connection between its
    /// reads is not seen; and after an error or a panic inside it, the
    /// connection is outside any transaction, ready for the next.
    #[test]
    fn snapshots_are_consistent_and_always_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let (reader, writer) = (Connection::open(&path).unwrap(), Connection::open(&path).unwrap());
        writer
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (v INTEGER); INSERT INTO t VALUES (1);")
            .unwrap();
        let count = |conn: &Connection| conn.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0));

        let seen = in_snapshot(&reader, |tx| {
            let before = count(tx)?;
            writer.execute("INSERT INTO t VALUES (2)", []).unwrap();
            Ok((before, count(tx)?))
        })
        .unwrap();
        assert_eq!(seen, (1, 1));
        assert!(reader.is_autocommit());
        assert_eq!(count(&reader).unwrap(), 2);

        let failed = in_snapshot(&reader, |tx| tx.query_row("SELECT nothing FROM t", [], |r| r.get::<_, i64>(0)));
        assert!(failed.is_err());
        assert!(reader.is_autocommit(), "an error leaves the snapshot open");

        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            in_snapshot(&reader, |_| -> rusqlite::Result<()> { panic!("inside a snapshot") })
        }));
        assert!(panicked.is_err());
        assert!(reader.is_autocommit(), "a panic leaves the snapshot open");
        assert_eq!(in_snapshot(&reader, |tx| count(tx)).unwrap(), 2);
    }
}
