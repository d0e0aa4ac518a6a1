//! The local store's checkpoints, off the commit path.
//!
//! In WAL mode every commit appends its pages to the `-wal` file, and a
//! checkpoint copies them back into the database file and syncs it. By
//! default SQLite runs that checkpoint inside the commit that crosses
//! 1,000 pages of log: one write in every few hundred then carries a copy
//! and an `fsync`, on the one writer connection every other write of this
//! process queues behind. Here a thread of its own runs a `PASSIVE`
//! checkpoint (which never blocks writers or readers) after commits, at
//! most every [`INTERVAL`], the way server applications on SQLite
//! (Litestream, rqlite) do. The writer keeps SQLite's own checkpoint only
//! as a safety valve far above what this thread lets the log reach
//! ([`WRITER_AUTOCHECKPOINT`] pages), should this thread ever fall behind.
//!
//! Another process on the same file runs its own checkpointer; a
//! checkpoint that finds another one running just returns (`SQLITE_BUSY`)
//! and the next one catches up.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::Connection;

/// The shortest time between two checkpoints of one process.
pub(super) const INTERVAL: Duration = Duration::from_millis(50);

/// The writer connection's own autocheckpoint, in pages of log.
pub(super) const WRITER_AUTOCHECKPOINT: u32 = 20_000;

/// The checkpoint thread of one store; it ends when the store is dropped.
pub(super) struct Checkpointer {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// Commits since the last checkpoint started.
    dirty: bool,
    closed: bool,
}

impl Checkpointer {
    /// Starts the thread for the store file at `path`. Its connection is
    /// opened by `connect` at its first checkpoint.
    pub(super) fn start(path: &Path, connect: fn(&Path) -> crate::Result<Connection>) -> Self {
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), wake: Condvar::new() });
        let (thread_shared, path) = (shared.clone(), path.to_path_buf());
        let spawned = std::thread::Builder::new()
            .name("kayra-store-ckpt".into())
            .spawn(move || run(&thread_shared, &path, connect));
        if let Err(e) = spawned {
            // The writer's own autocheckpoint still bounds the log.
            tracing::warn!(error = %e, "could not start the local store's checkpoint thread");
        }
        Self { shared }
    }

    /// A write committed: its pages are checkpointed soon.
    pub(super) fn committed(&self) {
        let mut state = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !state.dirty {
            state.dirty = true;
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
        self.shared.wake.notify_one();
    }
}

fn run(shared: &Shared, path: &Path, connect: fn(&Path) -> crate::Result<Connection>) {
    let mut conn: Option<Connection> = None;
    loop {
        {
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            while !state.dirty && !state.closed {
                state = shared.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
            if state.closed {
                return;
            }
            state.dirty = false;
        }
        if conn.is_none() {
            conn = connect(path).ok();
        }
        if let Some(c) = &conn {
            // Busy (another checkpoint running) or failed: the next one catches up.
            if let Err(e) = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::debug!(error = %e, "local store checkpoint did not run");
            }
        }
        std::thread::sleep(INTERVAL);
    }
}
