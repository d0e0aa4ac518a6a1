//! Local-backend specifics the conformance suite cannot show: two real
//! processes sharing one SQLite file, a writer killed -9 mid-stream, and a
//! watcher that fell behind the trimmed change log.
//!
//! Child processes are this test binary re-run in child mode (selected by
//! an environment variable), so no helper binary is needed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use kayra_store::local::LocalStore;
use kayra_store::{Error, Event, Store};

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
    let mut events = store.watch("/writers/", 1).await.unwrap();
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
        let event = tokio::time::timeout(Duration::from_secs(30), events.next()).await.unwrap().unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_behind_the_trimmed_log_relists_then_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(
        LocalStore::open_with_retention(&dir.path().join("kayra.db"), Duration::from_millis(20), 10).unwrap(),
    );
    for i in 0..50 {
        store.create(&format!("/k/{i:02}"), vec![b'v']).await.unwrap();
    }
    store.delete("/k/00", None).await.unwrap();
    // Revision 1 is long trimmed: the watcher re-lists what is present.
    let mut events = store.watch("/k/", 1).await.unwrap();
    let mut keys = Vec::new();
    for _ in 0..49 {
        match tokio::time::timeout(Duration::from_secs(30), events.next()).await.unwrap().unwrap() {
            Event::Put(kv) => keys.push(kv.key),
            other => panic!("expected the re-list's puts, got {other:?}"),
        }
    }
    keys.sort();
    assert_eq!(keys.first().map(String::as_str), Some("/k/01"));
    assert_eq!(keys.len(), 49);
    // Then it resumes with new changes.
    store.create("/k/new", vec![b'v']).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(30), events.next()).await.unwrap().unwrap();
    assert_eq!(next.key(), "/k/new");
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
