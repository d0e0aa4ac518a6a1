//! What only the etcd backend does: change feeds and watchers across
//! compactions and server restarts, job locks across clients and processes, and
//! authentication. Every test starts its own etcd (`kayra_testkit::Etcd`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions};
use kayra_store::etcd::EtcdStore;
use kayra_store::testsuite::{WAIT, follow_until, next_change, next_event, next_list};
use kayra_store::{Error, JobLocker, Store, WatcherEvent};
use kayra_testkit::{Etcd, eventually};

async fn store(etcd: &Etcd) -> Store {
    Store::new(EtcdStore::connect(&etcd.config("/kayra")).await.expect("connect"))
}

fn locker(store: &Store) -> Arc<dyn JobLocker> {
    store.job_locker().expect("the etcd store has a job locker")
}

async fn current(store: &Store, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let (items, _) = store.list_all(prefix).await.expect("list");
    items.into_iter().map(|kv| (kv.key, kv.value)).collect()
}

/// Writes a history of creates, updates and deletes under `prefix`.
async fn churn(store: &Store, prefix: &str, rounds: usize) {
    for round in 0..rounds {
        for i in 0..10 {
            let key = format!("{prefix}k{i}");
            let value = format!("{round}").into_bytes();
            match store.get(&key).await.expect("get").0 {
                Some(kv) if (i + round) % 4 == 0 => store.delete(&key, Some(kv.mod_revision)).await.map(drop),
                Some(kv) => store.update(&key, value, kv.mod_revision).await.map(drop),
                None => store.create(&key, value).await.map(drop),
            }
            .expect("write");
        }
    }
}

/// A change feed from a compacted revision ends with `Compacted` (the
/// watcher re-lists then); from the compaction on it replays as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_from_a_compacted_revision_ends_compacted() {
    use futures::StreamExt;
    let etcd = Etcd::start().await;
    let store = store(&etcd).await;
    let prefix = "/things/";
    let start = store.revision().await.expect("revision") + 1;
    churn(&store, prefix, 5).await;
    let compacted_at = store.revision().await.expect("revision");
    etcd.client().await.compact(compacted_at, None).await.expect("compact");

    let first = match store.changes(prefix, start).await {
        Ok(mut feed) => tokio::time::timeout(WAIT, feed.next()).await.expect("an answer in time"),
        Err(e) => Some(Err(e)),
    };
    match first {
        Some(Err(Error::Compacted(at))) => assert_eq!(at, compacted_at),
        other => panic!("expected Compacted, got {other:?}"),
    }

    let mut feed = store.changes(prefix, compacted_at + 1).await.expect("changes after the compaction");
    let rev = store.create("/things/after", b"x".to_vec()).await.expect("create");
    let event = next_event(&mut feed).await;
    assert_eq!((event.key(), event.revision()), ("/things/after", rev));
}

/// The watcher rides out a restart whose missed history is then compacted
/// away: it re-lists, and its view ends exactly as the store is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_survives_a_restart_and_a_compaction() {
    let mut etcd = Etcd::start().await;
    let store = store(&etcd).await;
    let prefix = "/things/";
    let mut watcher = store.watcher(prefix);
    let mut view = BTreeMap::new();
    churn(&store, prefix, 2).await;
    let want = current(&store, prefix).await;
    follow_until(&mut watcher, &mut view, |v| v == &want).await;

    // The feed's connection dies; meanwhile the history it would resume
    // from may be compacted away. Either way the view must converge.
    etcd.restart().await;
    churn(&store, prefix, 3).await;
    let compacted_at = store.revision().await.expect("revision");
    etcd.client().await.compact(compacted_at, None).await.expect("compact");
    store.create("/things/marker", b"m".to_vec()).await.expect("create marker");
    let want = current(&store, prefix).await;
    follow_until(&mut watcher, &mut view, |v| v == &want).await;
}

/// After a restart the watcher resumes right after the last delivered
/// event: no re-list, nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_resumes_after_a_restart_without_duplicates() {
    let mut etcd = Etcd::start().await;
    let store = store(&etcd).await;
    let mut watcher = store.watcher("/w/");
    let (listed, _) = next_list(&mut watcher).await;
    assert!(listed.is_empty());
    let r1 = store.create("/w/a", b"1".to_vec()).await.expect("create");
    match next_change(&mut watcher).await {
        WatcherEvent::Apply(kv) => assert_eq!(kv.mod_revision, r1),
        other => panic!("expected the put of /w/a, got {other:?}"),
    }

    etcd.restart().await;
    let r2 = store.create("/w/b", b"1".to_vec()).await.expect("create after restart");
    match next_change(&mut watcher).await {
        WatcherEvent::Apply(kv) => assert_eq!((kv.key.as_str(), kv.mod_revision), ("/w/b", r2)),
        other => panic!("the watcher resumes right after the last delivered event, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_etcd_is_unavailable() {
    let config = kayra_config::EtcdConfig {
        endpoints: vec![format!("http://127.0.0.1:{}", kayra_testkit::free_port())],
        ..Default::default()
    };
    let store = Store::new(EtcdStore::connect(&config).await.expect("connecting is lazy"));
    let err = store.revision().await.expect_err("nobody listens");
    assert!(matches!(err, Error::Unavailable(_)), "want Unavailable, got {err:?}");
    let err = store.changes("/", 1).await.err().expect("opening a change feed fails fast too");
    assert!(matches!(err, Error::Unavailable(_)), "want Unavailable, got {err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_live_under_the_prefix() {
    let etcd = Etcd::start().await;
    let store = Store::new(EtcdStore::connect(&etcd.config("/kayra/")).await.expect("connect"));
    store.create("/namespaces/a", b"x".to_vec()).await.expect("create");
    let mut raw = etcd.client().await;
    let got = raw.get("/kayra/namespaces/a", None).await.expect("raw get");
    assert_eq!(got.kvs().len(), 1, "prefix \"/kayra/\" + key \"/namespaces/a\" is /kayra/namespaces/a");
    // A key next to the root is not ours.
    raw.put("/kayra2/namespaces/b", "y", None).await.expect("raw put");
    let all = store.list("", None, 0).await.expect("list");
    let keys: Vec<_> = all.items.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/namespaces/a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_lock_excludes_other_clients_until_unlocked() {
    let etcd = Etcd::start().await;
    let (one, two) = (store(&etcd).await, store(&etcd).await);
    let job = "subscriptions/core/compute.example.com";
    let held = locker(&one).lock(job).await.expect("lock");

    // Go's concurrency.Mutex layout: <prefix>/locks/<job>/<lease hex>.
    let key = held.key.clone();
    assert!(key.starts_with("/kayra/locks/subscriptions%2Fcore%2Fcompute.example.com/"), "{key}");

    let waiter = tokio::spawn({
        let two = two.clone();
        async move { locker(&two).lock(job).await }
    });
    // Blocked for many retry intervals (50ms each).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "a second client must block while the job is held");
    // Another job is independent.
    let other = locker(&two).lock("namespaces/core").await.expect("another job");
    locker(&two).unlock(other).await.expect("unlock");

    locker(&one).unlock(held).await.expect("unlock");
    let second = tokio::time::timeout(WAIT, waiter).await.expect("second client gets the lock").expect("task");
    let second = second.expect("lock");
    assert_ne!(second.key, key, "each client owns its own contender key");
    locker(&two).unlock(second).await.expect("unlock");
}

/// The reconciler's two round trips: the lock's transaction carries the
/// caller's reads; the caller's result transaction, fenced on the lock key,
/// deletes it (the unlock), and the next holder gets the job at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_carries_reads_and_a_fenced_txn_can_unlock_it() {
    let etcd = Etcd::start().await;
    let (one, two) = (store(&etcd).await, store(&etcd).await);
    let job = "subscriptions/core/compute.example.com";
    one.create("/records/a", b"A".to_vec()).await.expect("create");
    let keys = ["/records/a".to_string(), "/records/missing".to_string()];
    // The session lease is granted by the first lock.
    let warm = locker(&one).try_lock("namespaces/core").await.expect("try").expect("free");
    locker(&one).unlock(warm).await.expect("unlock");
    let before = one.round_trips();
    let read = locker(&one).try_lock_and_get(job, &keys).await.expect("try").expect("free");
    assert_eq!(one.round_trips() - before, 1, "lock and reads in one transaction");
    assert_eq!(read.gets.len(), 2);
    assert_eq!(read.gets[0].as_ref().map(|kv| kv.value.as_slice()), Some(&b"A"[..]));
    assert!(read.gets[1].is_none());
    assert!(read.revision >= read.lock.create_revision);
    assert!(locker(&two).try_lock_and_get(job, &keys).await.expect("try").is_none(), "held elsewhere");

    let fence = read.lock.store_key.clone();
    let txn = kayra_store::Txn::new()
        .when(kayra_store::Compare::Exists(fence.clone()))
        .then(kayra_store::Op::Put { key: "/records/a".into(), value: b"B".to_vec() })
        .then(kayra_store::Op::Delete { key: fence });
    assert!(one.txn(txn).await.expect("txn").succeeded);
    locker(&one).unlocked_by_txn(read.lock).await.expect("forget");
    let next = locker(&two).try_lock_and_get(job, &keys).await.expect("try").expect("free after the txn");
    assert_eq!(next.gets[0].as_ref().map(|kv| kv.value.as_slice()), Some(&b"B"[..]));
    // The first client's in-process lock was freed too.
    locker(&two).unlock(next.lock).await.expect("unlock");
    let again = locker(&one).try_lock(job).await.expect("try").expect("free in-process too");
    locker(&one).unlock(again).await.expect("unlock");
}

/// Lock acquisitions asked for at once share transactions (group commit),
/// and each is still a lock of its own: held against another process,
/// with its own reads and a fencing token that grows per job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_acquisitions_asked_for_at_once_share_transactions() {
    let etcd = Etcd::start().await;
    let (one, two) = (store(&etcd).await, store(&etcd).await);
    for i in 0..40 {
        one.create(&format!("/records/{i:02}"), format!("r{i}").into_bytes()).await.expect("create");
    }
    let warm = locker(&one).try_lock("namespaces/warm").await.expect("try").expect("free");
    locker(&one).unlock(warm).await.expect("unlock");
    let before = one.round_trips();
    let reads = futures::future::join_all((0..40).map(|i| {
        let one = one.clone();
        async move {
            let job = format!("subscriptions/t{i}/compute.example.com");
            locker(&one).try_lock_and_get(&job, &[format!("/records/{i:02}")]).await
        }
    }))
    .await;
    let trips = one.round_trips() - before;
    assert!(trips < 40, "40 acquisitions at once shared transactions ({trips} round trips)");
    let mut locks = Vec::new();
    for (i, read) in reads.into_iter().enumerate() {
        let read = read.expect("try").expect("every job is free");
        assert_eq!(read.gets[0].as_ref().map(|kv| kv.value.clone()), Some(format!("r{i}").into_bytes()));
        let job = format!("subscriptions/t{i}/compute.example.com");
        assert!(locker(&two).try_lock(&job).await.expect("try").is_none(), "{job} is held by the first store");
        locks.push((job, read.lock));
    }
    for (job, lock) in locks {
        let token = lock.create_revision;
        locker(&one).unlock(lock).await.expect("unlock");
        let next = locker(&two).try_lock(&job).await.expect("try").expect("free after the unlock");
        assert!(next.create_revision > token, "{job}: the fencing token grows");
        locker(&two).unlock(next).await.expect("unlock");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_lock_excludes_other_tasks_of_the_same_process() {
    let etcd = Etcd::start().await;
    let store = store(&etcd).await;
    let held = locker(&store).lock("namespaces/core").await.expect("lock");
    let waiter = tokio::spawn({
        let store = store.clone();
        async move { locker(&store).lock("namespaces/core").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "a second task must block while the job is held");
    locker(&store).unlock(held).await.expect("unlock");
    let second = tokio::time::timeout(WAIT, waiter).await.expect("second task gets the lock").expect("task");
    locker(&store).unlock(second.expect("lock")).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_lock_attempt_leaves_no_key_behind() {
    let etcd = Etcd::start().await;
    let (one, two) = (store(&etcd).await, store(&etcd).await);
    let held = locker(&one).lock("namespaces/core").await.expect("lock");
    let waiter = tokio::spawn({
        let two = two.clone();
        async move { locker(&two).lock("namespaces/core").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    waiter.abort();
    let _ = waiter.await;

    // Only the holder's key remains.
    let prefix = "/kayra/locks/namespaces%2Fcore/";
    eventually("the abandoned attempt's key is gone", || async {
        let mut raw = etcd.client().await;
        let resp = raw.get(prefix, Some(GetOptions::new().with_prefix())).await.expect("raw get");
        resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect::<Vec<_>>()
            == [held.key.clone()]
    })
    .await;
    locker(&one).unlock(held).await.expect("unlock");
    let again = tokio::time::timeout(WAIT, locker(&two).lock("namespaces/core")).await.expect("lock in time");
    locker(&two).unlock(again.expect("lock")).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_by_another_tool_blocks_until_it_is_released() {
    // Interoperability with Go's concurrency.Mutex (and `etcdctl lock`): a
    // contender key with a lower create revision owns the mutex.
    let etcd = Etcd::start().await;
    let store = store(&etcd).await;
    let mut raw = etcd.client().await;
    let lease = raw.lease_grant(30, None).await.expect("grant").id();
    let foreign = format!("/kayra/locks/namespaces%2Fcore/{lease:x}");
    raw.put(foreign.as_str(), "", Some(PutOptions::new().with_lease(lease))).await.expect("foreign lock");

    let waiter = tokio::spawn({
        let store = store.clone();
        async move { locker(&store).lock("namespaces/core").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the foreign holder owns the mutex");
    raw.delete(foreign.as_str(), None).await.expect("foreign unlock");
    let held = tokio::time::timeout(WAIT, waiter).await.expect("lock in time").expect("task").expect("lock");
    locker(&store).unlock(held).await.expect("unlock");
}

/// Child mode of [`a_killed_holder_frees_its_lock_after_the_lease_ttl`]: when
/// `KAYRA_TEST_LOCK_CHILD` names an etcd endpoint, take the job lock, say
/// so on stdout and wait to be killed. Without it, this test does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_holder_child() {
    let Ok(endpoint) = std::env::var(CHILD_ENV) else { return };
    let config = kayra_config::EtcdConfig { endpoints: vec![endpoint], lock_ttl: LOCK_TTL, ..Default::default() };
    let store = Store::new(EtcdStore::connect(&config).await.expect("child connect"));
    let _held = locker(&store).lock(CHILD_JOB).await.expect("child lock");
    println!("{CHILD_LOCKED}");
    std::future::pending::<()>().await;
}

/// A child process that is killed (SIGKILL) when the test ends, even by a panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const CHILD_ENV: &str = "KAYRA_TEST_LOCK_CHILD";
const CHILD_JOB: &str = "subscriptions/core/compute.example.com";
const CHILD_LOCKED: &str = "kayra-test-child: locked";
const LOCK_TTL: kayra_config::Duration = kayra_config::Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_its_lock_after_the_lease_ttl() {
    let etcd = Etcd::start().await;
    // Re-run this test binary in child mode: a real process holding the lock.
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "lock_holder_child", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, etcd.endpoint())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child"),
    );
    let stdout = child.0.stdout.take().expect("child stdout");
    // libtest prints "test lock_holder_child ... " before the test's own output.
    let locked = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout).lines().map_while(Result::ok).any(|line| line.ends_with(CHILD_LOCKED))
    });
    let locked = tokio::time::timeout(WAIT, locked).await.expect("child locks in time").expect("reader");
    assert!(locked, "the child exited without taking the lock");

    let mut config = etcd.config("/kayra");
    config.lock_ttl = LOCK_TTL;
    let store = Store::new(EtcdStore::connect(&config).await.expect("connect"));
    let waiter = tokio::spawn({
        let store = store.clone();
        async move { locker(&store).lock(CHILD_JOB).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the child holds the lock");

    child.0.kill().expect("SIGKILL the child");
    let killed = Instant::now();
    let _ = child.0.wait();
    let held = tokio::time::timeout(WAIT, waiter).await.expect("the lock frees in time").expect("task").expect("lock");
    let took = killed.elapsed();
    // The lease was renewed at most ttl/3 before the kill, so it expires
    // between 2/3 ttl and ttl later (plus etcd's expiry tick).
    assert!(took >= LOCK_TTL.0 / 2, "freed after {took:?}: too soon for a lease expiry");
    assert!(took <= LOCK_TTL.0 + Duration::from_secs(5), "freed after {took:?}, lease TTL is {:?}", LOCK_TTL.0);
    eprintln!("lock of a killed holder freed after {took:?} (lease TTL {:?})", LOCK_TTL.0);
    locker(&store).unlock(held).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_store_revokes_its_lease_at_once() {
    let etcd = Etcd::start().await;
    let (one, two) = (store(&etcd).await, store(&etcd).await);
    let _forgotten = locker(&one).lock("namespaces/core").await.expect("lock");
    drop(one);
    // Well before the 2s TTL could expire it.
    let started = Instant::now();
    let held = tokio::time::timeout(WAIT, locker(&two).lock("namespaces/core")).await.expect("in time").expect("lock");
    assert!(started.elapsed() < Duration::from_secs(1), "freed after {:?}: not revoked", started.elapsed());
    locker(&two).unlock(held).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_replaced_transparently() {
    let etcd = Etcd::start().await;
    let backend = EtcdStore::connect(&etcd.config("/kayra")).await.expect("connect");
    let first = backend.locker().lease_id().await.expect("lease");
    etcd.client().await.lease_revoke(first).await.expect("revoke behind the locker's back");
    // The keep-alive task notices at its next renewal (ttl/3) and the next
    // lock gets a fresh lease.
    let locker = backend.locker().clone();
    eventually("a new lease", || async { locker.lease_id().await.is_ok_and(|id| id != first) }).await;
    let held = locker.lock("namespaces/core").await.expect("lock on the new lease");
    locker.unlock(held).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_and_password_authenticate() {
    let etcd = Etcd::start().await;
    let mut raw = etcd.client().await;
    raw.user_add("root", "s3cret", None).await.expect("add root");
    raw.user_grant_role("root", "root").await.expect("grant root");
    raw.auth_enable().await.expect("enable auth");

    let mut config = etcd.config("/kayra");
    config.username = Some("root".into());
    let wrong = EtcdStore::connect_with_password(&config, Some("nope")).await;
    assert!(matches!(wrong, Err(Error::Unavailable(_))), "a wrong password is refused");

    let store = Store::new(EtcdStore::connect_with_password(&config, Some("s3cret")).await.expect("connect"));
    let mut watch = store.changes("/a/", 1).await.expect("changes");
    let rev = store.create("/a/b", b"x".to_vec()).await.expect("create");
    assert_eq!(next_event(&mut watch).await.revision(), rev);
    let held = locker(&store).lock("namespaces/core").await.expect("lock");
    locker(&store).unlock(held).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    let etcd = Etcd::start_tls().await;
    let config = etcd.config("/kayra");
    assert!(config.endpoints[0].starts_with("https://"));

    let store = Store::new(EtcdStore::connect(&config).await.expect("connect over TLS"));
    let mut watch = store.changes("/a/", 1).await.expect("changes");
    let rev = store.create("/a/b", b"x".to_vec()).await.expect("create");
    assert_eq!(next_event(&mut watch).await.revision(), rev);
    let held = locker(&store).lock("namespaces/core").await.expect("lock");
    locker(&store).unlock(held).await.expect("unlock");

    // --client-cert-auth: trusting the CA is not enough.
    let mut anonymous = config.clone();
    anonymous.tls = anonymous.tls.map(|tls| kayra_config::EtcdTls { cert_file: None, key_file: None, ..tls });
    let store = Store::new(EtcdStore::connect(&anonymous).await.expect("connecting is lazy"));
    let err = store.revision().await.expect_err("no client certificate");
    assert!(matches!(err, Error::Unavailable(_)), "want Unavailable, got {err:?}");

    // Half a client identity is a configuration error, named as such.
    let mut half = config.clone();
    half.tls = half.tls.map(|tls| kayra_config::EtcdTls { key_file: None, ..tls });
    let err = EtcdStore::connect(&half).await.expect_err("cert without key");
    assert!(err.to_string().contains("cert_file and key_file"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_longer_than_the_request_timeout_still_lists() {
    let etcd = Etcd::start().await;
    let (backend, switch) =
        kayra_store::testsuite::Switched::new(EtcdStore::connect(&etcd.config("/kayra")).await.expect("connect"));
    kayra_store::testsuite::a_list_longer_than_the_request_timeout_still_lists(Store::new(backend), &switch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_resumes_or_relists_after_compaction() {
    let etcd = Etcd::start().await;
    let (backend, switch) =
        kayra_store::testsuite::Switched::new(EtcdStore::connect(&etcd.config("/kayra")).await.expect("connect"));
    let store = Store::new(backend);
    let client = etcd.client().await;
    kayra_store::testsuite::watcher_resumes_or_relists_across_outages(&store, &switch, || {
        let (store, mut client) = (store.clone(), client.clone());
        async move {
            let at = store.revision().await.expect("revision");
            client.compact(at, None).await.expect("compact");
        }
    })
    .await;
}

/// A real outage: etcd killed and restarted under a running watcher; it
/// resumes from its position and reports progress again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_survives_an_etcd_restart() {
    let mut etcd = Etcd::start().await;
    let store = store(&etcd).await;
    store.create("/w/a", b"1".to_vec()).await.expect("create");
    let mut watcher = store.watcher("/w/");
    let mut view = BTreeMap::new();
    kayra_store::testsuite::follow_until(&mut watcher, &mut view, |v| v.len() == 1).await;
    etcd.restart().await;
    eventually("etcd answers after the restart", || {
        let store = store.clone();
        async move { store.create("/w/b", b"2".to_vec()).await.is_ok() }
    })
    .await;
    kayra_store::testsuite::follow_until(&mut watcher, &mut view, |v| v.len() == 2).await;
    let after = store.revision().await.expect("revision");
    loop {
        match kayra_store::testsuite::next_event_or_progress(&mut watcher).await {
            kayra_store::WatcherEvent::Progress { revision } if revision >= after => break,
            _ => {}
        }
    }
}

/// A frozen etcd (SIGSTOP) holds every call until the request timeout at
/// most: then `Unavailable`, for reads, writes and transactions alike; and
/// the watcher stops reporting progress (what a fail-closed cache needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_etcd_answers_unavailable_within_the_request_timeout() {
    let etcd = Etcd::start().await;
    let timeout = Duration::from_millis(800);
    let store = store(&etcd).await.with_request_timeout(timeout);
    store.create("/frozen/a", b"1".to_vec()).await.expect("create");
    let mut watcher = store.watcher("/frozen/");
    let mut view = BTreeMap::new();
    kayra_store::testsuite::follow_until(&mut watcher, &mut view, |v| v.len() == 1).await;

    etcd.freeze();
    let calls: Vec<(&str, futures::future::BoxFuture<'_, kayra_store::Result<()>>)> = vec![
        ("get", Box::pin(async { store.get("/frozen/a").await.map(drop) })),
        ("list", Box::pin(async { store.list("/frozen/", None, 0).await.map(drop) })),
        ("create", Box::pin(async { store.create("/frozen/b", b"2".to_vec()).await.map(drop) })),
        ("txn", Box::pin(async { store.txn(kayra_store::Txn::new()).await.map(drop) })),
        ("revision", Box::pin(async { store.revision().await.map(drop) })),
    ];
    for (what, call) in calls {
        let started = Instant::now();
        let result = call.await;
        let took = started.elapsed();
        assert!(matches!(result, Err(Error::Unavailable(_))), "{what}: want Unavailable, got {result:?}");
        assert!(took < timeout + Duration::from_millis(500), "{what} took {took:?}");
    }
    // No progress while frozen (the calls above took long enough for
    // anything in flight to have arrived).
    let frozen = tokio::time::timeout(Duration::from_millis(1500), futures::StreamExt::next(&mut watcher)).await;
    assert!(frozen.is_err(), "no watcher event while etcd is frozen, got {frozen:?}");
    etcd.thaw();

    // Everything recovers without a new handle.
    eventually("the store to answer again", || {
        let store = store.clone();
        async move { store.get("/frozen/a").await.is_ok() }
    })
    .await;
    store.create("/frozen/c", b"3".to_vec()).await.expect("create after thaw");
    kayra_store::testsuite::follow_until(&mut watcher, &mut view, |v| v.contains_key("/frozen/c")).await;
}
