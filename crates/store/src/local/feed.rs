//! The change feed ([`crate::Backend::changes`]): polls the change log
//! from its position on, sends `Progress` after every complete poll, and
//! ends with `Compacted` when its position has been trimmed away (the
//! watcher re-lists then).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, params};

use super::sql::{bounds, read_revision, retry_busy, unavailable};
use crate::{Change, Error, Event, KeyValue, Result, Revision};

/// Events read per poll; a full batch is followed by another poll at once.
const POLL_BATCH: usize = 1000;

/// One feed: its own connection, so polling never waits behind this
/// process's writers.
pub(super) struct Feed {
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
    /// The position was trimmed away, up to this revision.
    Compacted(Revision),
}

impl Feed {
    pub(super) fn new(conn: Connection, prefix: &str, from: Revision) -> Self {
        Self { conn: Arc::new(Mutex::new(conn)), prefix: prefix.to_string(), next: from.max(1) }
    }

    pub(super) async fn run(mut self, tx: tokio::sync::mpsc::Sender<Result<Change>>, interval: Duration) {
        loop {
            let conn = self.conn.clone();
            let (prefix, next) = (self.prefix.clone(), self.next);
            let polled = tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                retry_busy(|| poll_once(&mut conn, &prefix, next))
            })
            .await;
            let mut complete = false;
            match polled {
                Ok(Ok(Batch::Events(events, next, covered))) => {
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
                Ok(Ok(Batch::Compacted(compacted))) => {
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

fn poll_once(conn: &mut Connection, prefix: &str, next: Revision) -> rusqlite::Result<Batch> {
    let tx = conn.transaction()?;
    let (revision, compacted) = read_revision(&tx)?;
    if next <= compacted {
        tx.finish()?;
        return Ok(Batch::Compacted(compacted));
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
