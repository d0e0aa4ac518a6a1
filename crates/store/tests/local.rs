//! Local-backend specifics the conformance suite cannot show: two real
//! processes sharing one SQLite file, a writer killed -9 mid-stream, and a
//! change feed that fell behind the trimmed change log.
//!
//! Child processes are this test binary re-run in child mode (selected by
//! an environment variable), so no helper binary is needed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use kayra_store::local::LocalStore;
use kayra_store::testsuite::next_event;
use kayra_store::{Compare, Error, Op, Store, Txn};

const CHILD_PATH: &str = "KAYRA_TEST_LOCAL_CHILD";
const CHILD_ID: &str = "KAYRA_TEST_LOCAL_CHILD_ID";
const WRITES: usize = 300;

fn open(path: &Path) -> Store {
    Store::new(LocalStore::open(path, Duration::from_millis(20)).expect("open local store"))
}

/// Increments `/counter` with compare-and-swap, retrying on conflict.
async fn increment(store: &Store) {
    loop {
        let (current, _) = store.get("/counter").await.expect("get counter");
        let result = match current {
            None => store.create("/counter", b"1".to_vec()).await,
            Some(kv) => {
                let n: usize = String::from_utf8(kv.value).unwrap().parse().unwrap();
                store.update("/counter", (n + 1).to_string().into_bytes(), kv.mod_revision).await
            }
        };
        match result {
            Ok(_) => return,
            Err(Error::Conflict(_)) => continue,
            Err(e) => panic!("increment: {e}"),
        }
    }
}

/// Child mode: when `KAYRA_TEST_LOCAL_CHILD` names a store file, either
/// write `WRITES` keys plus counter increments (`CHILD_ID` = a writer id),
/// or (`CHILD_ID` = "endless") write keys forever, printing each
/// acknowledged one. Without the variable, this test does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_writer_child() {
    let Ok(path) = std::env::var(CHILD_PATH) else { return };
    let id = std::env::var(CHILD_ID).unwrap();
    let store = open(Path::new(&path));
    if id == "endless" {
        for i in 0.. {
            store.create(&format!("/acked/{i:08}"), vec![b'x'; 128]).await.expect("write");
            println!("kayra-test-ack {i}");
        }
    }
    for i in 0..WRITES {
        store.create(&format!("/writers/{id}/{i:04}"), id.clone().into_bytes()).await.expect("create");
        increment(&store).await;
    }
}

fn child(path: &Path, id: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "local_writer_child", "--nocapture", "--test-threads", "1"])
        .env(CHILD_PATH, path)
        .env(CHILD_ID, id)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_file_without_losing_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kayra.db");
    let store = open(&path);
    let mut events = store.changes("/writers/", 1).await.unwrap();
    let (mut a, mut b) = (child(&path, "a"), child(&path, "b"));
    let (sa, sb) = tokio::task::spawn_blocking(move || (a.wait().unwrap(), b.wait().unwrap())).await.unwrap();
    assert!(sa.success() && sb.success(), "writers failed: {sa:?} {sb:?}");

    let (a_keys, _) = store.list_all("/writers/a/").await.unwrap();
    let (b_keys, _) = store.list_all("/writers/b/").await.unwrap();
    assert_eq!((a_keys.len(), b_keys.len()), (WRITES, WRITES));
    let (counter, _) = store.get("/counter").await.unwrap();
    assert_eq!(counter.unwrap().value, (2 * WRITES).to_string().into_bytes(), "a compare-and-swap update was lost");

    // A third process (this one) watched both writers: every put, in
    // strictly increasing revision order.
    let mut seen = 0;
    let mut last = 0;
    while seen < 2 * WRITES {
        let event = next_event(&mut events).await;
        assert!(event.revision() > last, "events out of order");
        last = event.revision();
        seen += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_stream_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kayra.db");
    let mut writer = child(&path, "endless");
    let stdout = writer.stdout.take().unwrap();
    // Keep draining stdout until the kill, so the writer never sees a closed pipe.
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(i) = line.split("kayra-test-ack ").nth(1) {
                let _ = tx.send(i.trim().parse().unwrap());
            }
        }
    });
    let acked = tokio::task::spawn_blocking(move || {
        loop {
            let i = rx.recv_timeout(Duration::from_secs(60)).expect("writer acks");
            if i >= 500 {
                break i;
            }
        }
    })
    .await
    .unwrap();
    writer.kill().unwrap(); // SIGKILL, mid-stream
    writer.wait().unwrap();

    let store = open(&path);
    for i in 0..=acked {
        let (kv, _) = store.get(&format!("/acked/{i:08}")).await.unwrap();
        assert!(kv.is_some(), "acknowledged write {i} lost");
    }
    // Still fully usable.
    store.create("/after-crash", b"ok".to_vec()).await.unwrap();
    assert!(store.list_all("/acked/").await.unwrap().0.len() > acked);
}

/// A feed from a position the log no longer holds ends with `Compacted`
/// (the watcher re-lists then); a feed from the newest position goes on
/// with new changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_behind_the_trimmed_log_ends_compacted() {
    use futures::StreamExt;
    use kayra_store::Change;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(
        LocalStore::open_with_retention(&dir.path().join("kayra.db"), Duration::from_millis(20), 10).unwrap(),
    );
    for i in 0..50 {
        store.create(&format!("/k/{i:02}"), vec![b'v']).await.unwrap();
    }
    let deleted = store.delete("/k/00", None).await.unwrap();
    // Revision 1 is long trimmed.
    let mut behind = store.changes("/k/", 1).await.unwrap();
    match tokio::time::timeout(kayra_store::testsuite::WAIT, behind.next()).await.expect("an answer in time") {
        Some(Err(Error::Compacted(trimmed))) => assert!(trimmed >= 1 && trimmed < deleted, "trimmed up to {trimmed}"),
        other => panic!("expected Compacted, got {other:?}"),
    }
    assert!(behind.next().await.is_none(), "the feed is finished after Compacted");
    // From a retained position, it carries on with new changes.
    let mut current = store.changes("/k/", deleted).await.unwrap();
    let replayed = next_event(&mut current).await;
    assert_eq!((replayed.key(), replayed.revision()), ("/k/00", deleted));
    let rev = store.create("/k/new", vec![b'v']).await.unwrap();
    let next = next_event(&mut current).await;
    assert_eq!((next.key(), next.revision()), ("/k/new", rev));
    assert!(matches!(current.next().await, Some(Ok(Change::Progress(_)))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_resumes_or_relists_after_the_log_is_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open_with_retention(&dir.path().join("kayra.db"), Duration::from_millis(20), 10).unwrap();
    let (backend, switch) = kayra_store::testsuite::Switched::new(local);
    let store = Store::new(backend);
    kayra_store::testsuite::watcher_resumes_or_relists_across_outages(&store, &switch, || {
        let store = store.clone();
        async move {
            // More writes elsewhere than the log keeps.
            for i in 0..20 {
                store.create(&format!("/filler/{i}"), b"f".to_vec()).await.unwrap();
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_longer_than_the_request_timeout_still_lists() {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStore::open(&dir.path().join("kayra.db"), Duration::from_millis(20)).unwrap();
    let (backend, switch) = kayra_store::testsuite::Switched::new(local);
    kayra_store::testsuite::a_list_longer_than_the_request_timeout_still_lists(Store::new(backend), &switch).await;
}

fn open_config(path: &Path, request_timeout: Duration) -> kayra_config::DatabaseConfig {
    let mut config = kayra_config::DatabaseConfig::local(kayra_config::LocalConfig {
        path: path.to_path_buf(),
        poll_interval: kayra_config::Duration::from_millis(20),
    });
    config.request_timeout = kayra_config::Duration(request_timeout);
    config
}

/// Another connection (as another process would) holds the file's write
/// lock: a write waits at most the request timeout and then fails without
/// ever committing later; reads meanwhile answer at once (platform §3),
/// those by group commit included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_never_wait_behind_a_write_waiting_for_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kayra.db");
    let timeout = Duration::from_millis(1500);
    let store = Store::open(&open_config(&path, timeout)).await.unwrap();
    store.create("/present", b"x".to_vec()).await.unwrap();

    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    let write = tokio::spawn({
        let store = store.clone();
        async move { store.create("/blocked", b"y".to_vec()).await }
    });
    // A write by group commit too: it holds the group's one place in flight.
    let grouped = tokio::spawn({
        let store = store.clone();
        let txn = Txn::new()
            .when(Compare::Absent("/blocked-grouped".into()))
            .then(Op::Put { key: "/blocked-grouped".into(), value: b"y".to_vec() });
        async move { store.txn_grouped(txn).await }
    });
    // While the write waits, every read answers quickly.
    while started.elapsed() < Duration::from_millis(1000) {
        let begun = std::time::Instant::now();
        assert!(store.get("/present").await.unwrap().0.is_some());
        assert_eq!(store.list("/", None, 0).await.unwrap().items.len(), 1);
        store.revision().await.expect("readiness does not wait for the write lock");
        let txn = Txn::new().when(Compare::Exists("/present".into())).then(Op::Get { key: "/present".into() });
        let read = store.txn(txn.clone()).await.expect("a read-only transaction does not wait for the write lock");
        assert!(read.succeeded && read.gets[0].is_some());
        // Nor does one by group commit wait behind the grouped write.
        let read = store.txn_grouped(txn).await.expect("a grouped read does not wait for the write lock");
        assert!(read.succeeded && read.gets[0].is_some());
        assert!(begun.elapsed() < Duration::from_millis(500), "a read took {:?}", begun.elapsed());
        assert!(!write.is_finished() && !grouped.is_finished(), "the writes wait for the lock");
    }
    let result = write.await.unwrap();
    let took = started.elapsed();
    assert!(matches!(result, Err(Error::Unavailable(_))), "want Unavailable, got {result:?}");
    let result = grouped.await.unwrap();
    assert!(matches!(result, Err(Error::Unavailable(_))), "want Unavailable, got {result:?}");
    assert!(took < timeout + Duration::from_millis(700), "the write answered after {took:?}");

    // Released: the timed-out write never lands later, new writes work.
    holder.execute_batch("ROLLBACK").unwrap();
    store.create("/after", b"z".to_vec()).await.unwrap();
    tokio::time::sleep(timeout).await; // longer than any attempt could still run
    assert_eq!(store.get("/blocked").await.unwrap().0, None, "a write answered Unavailable must not commit later");
    assert_eq!(store.get("/blocked-grouped").await.unwrap().0, None, "nor a grouped one");
}

/// The store file deleted (with its `-wal` and `-shm`) or replaced under a
/// running store: writes are refused and readiness fails, so no write is
/// acknowledged into a file that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_replaced_file_refuses_writes_and_readiness() {
    for replace in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kayra.db");
        let store = open(&path);
        store.create("/before", b"x".to_vec()).await.unwrap();
        store.revision().await.expect("ready");
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        if replace {
            // Someone else's fresh store at the same path.
            let other = open(&path);
            other.create("/other", b"o".to_vec()).await.unwrap();
        }
        for i in 0..3 {
            let result = store.create(&format!("/after/{i}"), b"y".to_vec()).await;
            assert!(
                matches!(result, Err(Error::Unavailable(_))),
                "replace={replace}: want Unavailable, got {result:?}"
            );
        }
        let txn = kayra_store::Txn::new().then(kayra_store::Op::Put { key: "/t".into(), value: vec![] });
        assert!(matches!(store.txn(txn).await, Err(Error::Unavailable(_))));
        assert!(matches!(store.revision().await, Err(Error::Unavailable(_))), "readiness fails");
        // A restart opens whatever is at the path now; nothing was acknowledged after the loss.
        let reopened = open(&path);
        assert!(reopened.list_all("/after/").await.unwrap().0.is_empty());
    }
}

/// A huge `limit` (an API caller's u64::MAX) clamps instead of wrapping
/// into an empty page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_limit_lists_everything() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("kayra.db"));
    for i in 0..3 {
        store.create(&format!("/n/{i}"), b"x".to_vec()).await.unwrap();
    }
    for limit in [usize::MAX, usize::MAX - 1, i64::MAX as usize, 3] {
        let page = store.list("/n/", None, limit).await.unwrap();
        assert_eq!((page.items.len(), page.more), (3, false), "limit {limit}");
    }
    let page = store.list("/n/", None, 2).await.unwrap();
    assert_eq!((page.items.len(), page.more), (2, true));
}

/// Commits are checkpointed into the database file by the store's own
/// thread, not only when the log reaches the writer's (far higher)
/// autocheckpoint: 2 MiB of writes reach the main file soon after, while
/// the log holds fewer pages than the writer's threshold would wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_checkpointed_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kayra.db");
    let store = open(&path);
    let size = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let before = size();
    for i in 0..2000 {
        store.create(&format!("/ckpt/{i:05}"), vec![b'x'; 1024]).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while size() < before + 2 * 1024 * 1024 {
        assert!(std::time::Instant::now() < deadline, "the database file stayed at {} bytes", size());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (kv, _) = store.get("/ckpt/01999").await.unwrap();
    assert_eq!(kv.unwrap().value.len(), 1024);
}

/// A store call's future may be made anywhere and awaited in the runtime
/// later (`runtime.block_on(store.get(..))` makes it before entering):
/// its timeout's timer and a group's first submission wait for its first
/// poll, as an `async fn`'s body would.
#[test]
fn calls_made_outside_the_runtime_run_inside_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let store = runtime.block_on(async { open(&dir.path().join("kayra.db")) });
    let created = store.create("/made/outside", b"1".to_vec());
    let grouped = store.txn_grouped(Txn::new().then(Op::Put { key: "/made/grouped".into(), value: b"2".to_vec() }));
    let (created, grouped) = runtime.block_on(async { (created.await, grouped.await) });
    assert!(created.expect("create") > 0);
    assert!(grouped.expect("grouped txn").succeeded);
    let (read, _) = runtime.block_on(store.get("/made/grouped")).expect("get");
    assert_eq!(read.expect("written").value, b"2");
}
