//! The local store's reader threads: a few dedicated threads, each with
//! its own SQLite connection, take reads from one queue.
//!
//! Why not `spawn_blocking` per read: a point read is a few microseconds
//! of SQLite, while handing it to tokio's blocking pool wakes one of its
//! idle threads for every read (a futex wake and a context switch each
//! way, plus the pool's one mutex contended by every thread it has
//! grown). Here a read only wakes a thread when one is asleep; under load
//! the threads go from one queued read to the next without sleeping, and
//! a few connections stay warm (their statement caches included).
//!
//! A long read (a full list) holds one thread; the others keep serving,
//! which is why there are several. A read whose caller went away still
//! runs (like a blocking task), its answer dropped. A read that panics
//! loses its thread's connection, not the thread.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use rusqlite::Connection;

use crate::{Error, Result};

/// One read: runs on a reader thread with its connection slot (empty
/// until the first read, or after a failure to open or a panic).
type Job = Box<dyn FnOnce(&Path, &mut Option<Connection>) + Send>;

/// The reader threads of one store; they end when it is dropped.
pub(super) struct Readers {
    shared: Arc<Shared>,
    /// Idle connections for point reads on the caller's thread (see
    /// [`Readers::inline`]); they never wait for a lock.
    inline: Mutex<Vec<Connection>>,
}

/// Connections kept for point reads on callers' threads.
const INLINE_KEPT: usize = 8;

struct Shared {
    path: PathBuf,
    queue: Mutex<Queue>,
    work: Condvar,
    /// At most this many threads.
    threads: usize,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Threads started so far.
    started: usize,
    /// Threads asleep waiting for a job.
    asleep: usize,
    closed: bool,
}

impl Readers {
    /// Up to `threads` reader threads on the store file at `path`, started
    /// as reads come.
    pub(super) fn new(path: &Path, threads: usize) -> Self {
        let shared = Shared {
            path: path.to_path_buf(),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            threads: threads.max(1),
        };
        Self { shared: Arc::new(shared), inline: Mutex::new(Vec::new()) }
    }

    /// Runs the point read `f` right here, on the caller's thread, on a
    /// connection that never waits for a lock: `None` when it would have
    /// (SQLite reports BUSY, which in WAL mode only a recovery or a
    /// checkpoint restarting the log causes) or no connection could be
    /// opened; the caller then reads on a reader thread instead.
    ///
    /// Why on the caller's (async) thread: a point read of a few pages is
    /// microseconds of SQLite, while the hand-off to a reader thread and
    /// back costs two thread wake-ups, which on a busy two-core machine
    /// were most of a GET's CPU time. Lists stay on the reader threads:
    /// they can take long.
    pub(super) fn inline<T>(
        &self,
        open: fn(&Path) -> Result<Connection>,
        is_busy: fn(&rusqlite::Error) -> bool,
        f: &dyn Fn(&mut Connection) -> rusqlite::Result<T>,
    ) -> Option<rusqlite::Result<T>> {
        let idle = self.inline.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => {
                let conn = open(&self.shared.path).ok()?;
                conn.busy_timeout(std::time::Duration::ZERO).ok()?;
                conn
            }
        };
        let result = f(&mut conn);
        let busy = result.as_ref().is_err_and(is_busy);
        let mut idle = self.inline.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < INLINE_KEPT {
            idle.push(conn);
        }
        (!busy).then_some(result)
    }

    /// Runs `f` on a reader thread's connection, opened by `open` the
    /// first time; resolves to what it returns.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        open: fn(&Path) -> Result<Connection>,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(Box::new(move |path, slot| {
            let conn = match slot {
                Some(conn) => conn,
                None => match open(path) {
                    Ok(conn) => slot.insert(conn),
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                },
            };
            let _ = tx.send(f(conn));
        }))?;
        rx.await.map_err(|_| Error::Unavailable("store read failed: its reader thread panicked".into()))?
    }

    fn submit(&self, job: Job) -> Result<()> {
        let shared = &self.shared;
        let mut queue = shared.lock();
        queue.jobs.push_back(job);
        if queue.asleep > 0 {
            // One sleeper is enough: a thread that wakes takes jobs until
            // the queue is empty.
            shared.work.notify_one();
        } else if queue.started < shared.threads {
            queue.started += 1;
            let worker = shared.clone();
            let spawned = std::thread::Builder::new().name("kayra-store-read".into()).spawn(move || worker.run());
            if let Err(e) = spawned {
                queue.started -= 1;
                if queue.started == 0 {
                    queue.jobs.clear();
                    return Err(Error::Unavailable(format!("start a store reader thread: {e}")));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run(&self) {
        let mut conn: Option<Connection> = None;
        loop {
            let job = {
                let mut queue = self.lock();
                loop {
                    if let Some(job) = queue.jobs.pop_front() {
                        break job;
                    }
                    if queue.closed {
                        return;
                    }
                    queue.asleep += 1;
                    queue = self.work.wait(queue).unwrap_or_else(PoisonError::into_inner);
                    queue.asleep -= 1;
                }
            };
            let path = &self.path;
            if std::panic::catch_unwind(AssertUnwindSafe(|| job(path, &mut conn))).is_err() {
                // Whatever the connection was in the middle of, it is not reused.
                conn = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    fn readers(threads: usize) -> (tempfile::TempDir, Readers) {
        let dir = tempfile::tempdir().unwrap();
        let readers = Readers::new(&dir.path().join("store.db"), threads);
        (dir, readers)
    }

    #[tokio::test]
    async fn a_long_read_does_not_hold_up_the_others() {
        let (_dir, readers) = readers(2);
        let (tx, rx) = mpsc::channel::<()>();
        // The first read waits for the second: one thread would deadlock
        // (and time out).
        let long = readers.read(super::super::connect, move |_| Ok(rx.recv_timeout(Duration::from_secs(20)).is_ok()));
        let short = readers.read(super::super::connect, move |_| Ok(tx.send(()).is_ok()));
        let (long, short) = tokio::join!(long, short);
        assert!(short.unwrap());
        assert!(long.unwrap(), "the long read was never released: the short one waited behind it");
    }

    #[tokio::test]
    async fn reads_run_on_at_most_the_threads_given() {
        let (_dir, readers) = readers(3);
        let reads = (0..64).map(|_| {
            readers.read(super::super::connect, |conn| {
                conn.query_row("SELECT 1", [], |_| Ok(())).map_err(super::super::unavailable)?;
                std::thread::sleep(Duration::from_millis(1));
                Ok(std::thread::current().id())
            })
        });
        let threads: HashSet<_> = futures::future::try_join_all(reads).await.unwrap().into_iter().collect();
        assert!(!threads.is_empty() && threads.len() <= 3, "{} threads", threads.len());
    }

    #[tokio::test]
    async fn a_panicking_read_fails_alone() {
        let (_dir, readers) = readers(1);
        let panicked = readers.read(super::super::connect, |_| -> Result<()> { panic!("a bug in a read") }).await;
        assert!(matches!(panicked, Err(Error::Unavailable(_))), "{panicked:?}");
        // The one thread survived, with a fresh connection.
        let after = readers.read(super::super::connect, |conn| {
            conn.query_row("SELECT 41 + 1", [], |r| r.get::<_, i64>(0)).map_err(super::super::unavailable)
        });
        assert_eq!(after.await.unwrap(), 42);
    }

    #[tokio::test]
    async fn a_connection_that_cannot_open_is_an_error_and_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        // A directory is no database file.
        let readers = Readers::new(dir.path(), 1);
        let failed = readers.read(super::super::connect, |_| Ok(())).await;
        assert!(matches!(failed, Err(Error::Unavailable(_))), "{failed:?}");
        let again = readers.read(super::super::connect, |_| Ok(())).await;
        assert!(again.is_err(), "the slot stays empty after a failed open; each read tries again");
    }

    #[test]
    fn an_inline_read_that_would_wait_is_left_to_the_threads() {
        let (_dir, readers) = readers(1);
        let busy = || rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None);
        let none = readers.inline(super::super::connect, super::super::is_busy, &|_| Err::<(), _>(busy()));
        assert!(none.is_none());
        let done =
            readers.inline(super::super::connect, super::super::is_busy, &|conn| conn.busy_timeout(Duration::ZERO));
        assert!(matches!(done, Some(Ok(()))));
        let failed = readers.inline(super::super::connect, super::super::is_busy, &|conn| {
            conn.query_row("SELECT no_such_column FROM nowhere", [], |_| Ok(()))
        });
        assert!(matches!(failed, Some(Err(_))), "other errors are the read's answer");
    }

    #[tokio::test]
    async fn the_threads_end_with_the_store() {
        let (_dir, readers) = readers(2);
        readers.read(super::super::connect, |_| Ok(())).await.unwrap();
        let shared = Arc::downgrade(&readers.shared);
        drop(readers);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while shared.upgrade().is_some() {
            assert!(std::time::Instant::now() < deadline, "a reader thread outlived its store");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
