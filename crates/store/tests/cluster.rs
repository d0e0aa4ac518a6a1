//! The etcd backend on a real 3-member cluster: losing or freezing one
//! member changes nothing a caller sees beyond `Unavailable` while no
//! leader exists, and no call outlasts `database.request_timeout`.
//! Every test starts its own cluster (`kayra_testkit::EtcdCluster`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kayra_store::etcd::EtcdStore;
use kayra_store::{Error, JobLocker, Store};
use kayra_testkit::{EtcdCluster, eventually};
use tokio::task::JoinSet;

/// The `database.request_timeout` of these tests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Scheduling slack on a loaded 2-core machine, on top of REQUEST_TIMEOUT.
const SLACK: Duration = Duration::from_millis(750);
const LOCK_TTL: Duration = Duration::from_secs(5);

async fn connect(cluster: &EtcdCluster) -> EtcdStore {
    EtcdStore::connect_within(&cluster.config("/kayra", LOCK_TTL), REQUEST_TIMEOUT).await.expect("connect")
}

/// One store call as the load saw it.
#[derive(Debug)]
struct Call {
    started: Instant,
    took: Duration,
    /// The key it created (creates only) when it succeeded.
    created: Option<String>,
    error: Option<String>,
}

/// Writers creating fresh keys and CAS-updating their own key until
/// stopped: any `Conflict` or `NotFound` is a lie (nobody else writes
/// these keys), and every acknowledged create must survive.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: JoinSet<Vec<Call>>,
}

impl Load {
    fn start(store: &Store, writers: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for w in 0..writers {
            let (store, stop) = (store.clone(), stop.clone());
            tasks.spawn(async move {
                let mut calls = Vec::new();
                let cas_key = format!("/cas/{w}");
                let mut cas_rev = store.create(&cas_key, b"0".to_vec()).await.expect("first create");
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = format!("/load/{w}/{n:06}");
                    let started = Instant::now();
                    let result = store.create(&key, format!("v{n}").into_bytes()).await;
                    calls.push(Call {
                        started,
                        took: started.elapsed(),
                        created: result.as_ref().ok().map(|_| key.clone()),
                        error: result.err().map(|e| format!("create {key}: {e:?}")),
                    });
                    let started = Instant::now();
                    let result = store.update(&cas_key, format!("u{n}").into_bytes(), cas_rev).await;
                    let error = match result {
                        Ok(rev) => {
                            cas_rev = rev;
                            None
                        }
                        Err(Error::Unavailable(e)) => {
                            // The outcome is unknown to us: learn it.
                            if let Ok((Some(kv), _)) = store.get(&cas_key).await {
                                cas_rev = kv.mod_revision;
                            }
                            Some(format!("update {cas_key}: Unavailable({e})"))
                        }
                        Err(e) => Some(format!("update {cas_key}: {e:?}")),
                    };
                    calls.push(Call { started, took: started.elapsed(), created: None, error });
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                calls
            });
        }
        Load { stop, tasks }
    }

    async fn stop(self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        self.tasks.join_all().await.into_iter().flatten().collect()
    }
}

/// What every failover test asserts about the calls made meanwhile.
async fn check_calls(store: &Store, calls: &[Call], errors_end_by: Instant) {
    assert!(calls.len() > 20, "the load made only {} calls", calls.len());
    for call in calls {
        assert!(call.took <= REQUEST_TIMEOUT + SLACK, "a call took {:?}: {call:?}", call.took);
        if let Some(error) = &call.error {
            assert!(error.contains("Unavailable"), "only Unavailable may fail a call, got {error}");
            let ended = call.started + call.took;
            assert!(ended <= errors_end_by, "a call failed {:?} too late: {error}", ended - errors_end_by);
        }
    }
    let (present, _) = store.list_all("/load/").await.expect("list after the failover");
    let present: BTreeSet<String> = present.into_iter().map(|kv| kv.key).collect();
    for key in calls.iter().filter_map(|c| c.created.as_ref()) {
        assert!(present.contains(key), "acknowledged create of {key} is lost");
    }
}

async fn kill_the_leader_under_load(cluster: &mut EtcdCluster) {
    let backend = connect(cluster).await;
    let store = Store::new(backend);
    let load = Load::start(&store, 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leader = cluster.leader().await;
    cluster.kill(leader);
    let new_leader = cluster.leader().await;
    let elected = Instant::now();
    assert_ne!(new_leader, leader);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = load.stop().await;
    check_calls(&store, &calls, elected + REQUEST_TIMEOUT).await;
    // Successes after the election, not just an absence of errors.
    assert!(calls.iter().any(|c| c.started > elected && c.error.is_none()), "nothing succeeded after the election");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_loses_no_acknowledged_write_and_fails_only_during_the_election() {
    let mut cluster = EtcdCluster::start().await;
    kill_the_leader_under_load(&mut cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_of_a_tls_cluster_with_client_certificates_fails_over_too() {
    let mut cluster = EtcdCluster::start_tls().await;
    assert!(cluster.endpoint(0).starts_with("https://"));
    kill_the_leader_under_load(&mut cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_delays_no_call_beyond_the_request_timeout_and_is_used_again_after_thawing() {
    let mut cluster = EtcdCluster::start().await;
    let backend = connect(&cluster).await;
    let endpoints = backend.endpoints();
    assert_eq!(endpoints.in_use(), cluster.endpoint(0), "calls start on the first endpoint");
    let store = Store::new(backend);
    let load = Load::start(&store, 3);
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.freeze(0);
    let frozen = Instant::now();
    eventually("calls to move off the frozen member", || async { endpoints.in_use() != cluster.endpoint(0) }).await;
    // If m0 led, the others elect a new leader first; that is the only
    // window where calls may fail.
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, 0);
    let elected = Instant::now().max(frozen);
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(frozen.elapsed())).await;
    cluster.thaw(0);
    let calls = load.stop().await;
    check_calls(&store, &calls, elected + REQUEST_TIMEOUT).await;

    eventually("the thawed member to pass its health check", || async {
        endpoints.healthy().contains(&cluster.endpoint(0))
    })
    .await;
    // Lose the member in use (a follower, so no election muddles health):
    // the thawed one, first in order, takes over.
    let in_use = (0..3).find(|&i| endpoints.in_use() == cluster.endpoint(i)).expect("a member in use");
    assert_ne!(in_use, 0);
    cluster.move_leader(0).await;
    cluster.kill(in_use);
    store.create("/after-thaw", b"x".to_vec()).await.expect("create after losing the member in use");
    assert_eq!(endpoints.in_use(), cluster.endpoint(0), "the thawed member is used again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_on_a_frozen_member_moves_within_a_few_seconds() {
    use kayra_store::WatcherEvent;
    let mut cluster = EtcdCluster::start().await;
    let etcd = connect(&cluster).await;
    let endpoints = etcd.endpoints();
    let watching = Store::new(etcd).with_request_timeout(REQUEST_TIMEOUT);
    let mut events = watching.watcher("/w/");
    assert_eq!(next_watcher_event(&mut events).await, WatcherEvent::Init);
    assert!(matches!(next_watcher_event(&mut events).await, WatcherEvent::InitDone { .. }));
    let mut config = cluster.config("/kayra", LOCK_TTL);
    config.endpoints.remove(0);
    let writer = Store::new(EtcdStore::connect_within(&config, REQUEST_TIMEOUT).await.expect("writer"));
    assert_eq!(endpoints.in_use(), cluster.endpoint(0));
    cluster.freeze(0);
    let frozen = Instant::now();
    // Nobody polls the watcher while its member fails its health check:
    // the stream must still move when it is polled afterwards.
    kayra_testkit::eventually("the frozen member fails its health check", || async {
        !endpoints.healthy().contains(&cluster.endpoint(0))
    })
    .await;
    let rev = write_until_done(&writer, "/w/during-freeze").await;
    // Well before HTTP/2 keep-alives (10s + 5s) would notice the dead connection.
    let event = tokio::time::timeout(Duration::from_secs(12), async {
        loop {
            match next_watcher_event(&mut events).await {
                WatcherEvent::Progress { .. } => {}
                other => break other,
            }
        }
    })
    .await
    .expect("the event arrives");
    assert!(matches!(&event, WatcherEvent::Apply(kv) if kv.mod_revision == rev), "{event:?}");
    assert!(frozen.elapsed() < Duration::from_secs(12), "took {:?}", frozen.elapsed());
    cluster.thaw(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_locks_are_kept_through_a_leader_change() {
    let mut cluster = EtcdCluster::start().await;
    let holder = connect(&cluster).await;
    let rival = connect(&cluster).await;
    let held = holder.locker().lock("subscriptions/core/a").await.expect("lock");
    let lease = holder.locker().lease_id().await.expect("lease");

    // The holder's keep-alive stream is on m0: make m0 the leader and kill
    // it, so the session rides through an election and a failover at once.
    assert_eq!(holder.endpoints().in_use(), cluster.endpoint(0));
    cluster.move_leader(0).await;
    cluster.kill(0);
    // The rival tries for longer than the lease TTL: if the holder's
    // keep-alives stopped, the lock would fall to it.
    let attempt = tokio::time::timeout(LOCK_TTL * 2, rival.locker().lock("subscriptions/core/a")).await;
    assert!(attempt.is_err(), "a rival took a lock that was held through the election");
    assert_eq!(holder.locker().lease_id().await.expect("lease"), lease, "the session lease survived");

    holder.locker().unlock(held).await.expect("unlock");
    let taken = tokio::time::timeout(LOCK_TTL, rival.locker().lock("subscriptions/core/a")).await;
    let taken = taken.expect("the rival gets the lock once it is released").expect("lock");
    rival.locker().unlock(taken).await.expect("unlock");
}

/// Creates `key`, retrying `Unavailable` (an election); the create's revision.
async fn write_until_done(store: &Store, key: &str) -> i64 {
    let deadline = Instant::now() + kayra_testkit::WAIT;
    loop {
        match store.create(key, b"x".to_vec()).await {
            Ok(rev) => return rev,
            Err(Error::Unavailable(e)) if Instant::now() < deadline => eprintln!("retrying {key}: {e}"),
            Err(e) => panic!("create {key}: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_resumes_on_another_member_without_a_relist_or_a_repeat() {
    use kayra_store::WatcherEvent;
    let mut cluster = EtcdCluster::start().await;
    let watching = Store::new(connect(&cluster).await).with_request_timeout(REQUEST_TIMEOUT);
    let mut config = cluster.config("/kayra", LOCK_TTL);
    config.endpoints.remove(0);
    let writer = Store::new(EtcdStore::connect_within(&config, REQUEST_TIMEOUT).await.expect("writer"));
    writer.create("/w/before", b"x".to_vec()).await.expect("create");
    let mut events = watching.watcher("/w/");
    // The initial list.
    assert_eq!(next_watcher_event(&mut events).await, WatcherEvent::Init);
    assert!(matches!(next_watcher_event(&mut events).await, WatcherEvent::InitApply(kv) if kv.key == "/w/before"));
    assert!(matches!(next_watcher_event(&mut events).await, WatcherEvent::InitDone { .. }));

    let mut written = BTreeMap::new();
    for n in 0..10 {
        let key = format!("/w/{n:03}");
        written.insert(key.clone(), writer.create(&key, b"x".to_vec()).await.expect("create"));
    }
    cluster.kill(0);
    for n in 10..20 {
        let key = format!("/w/{n:03}");
        written.insert(key.clone(), write_until_done(&writer, &key).await);
    }
    let mut seen = BTreeMap::new();
    let mut last = 0;
    while seen.len() < written.len() {
        match next_watcher_event(&mut events).await {
            WatcherEvent::Apply(kv) => {
                assert!(kv.mod_revision > last, "events out of order or repeated: {kv:?} after {last}");
                last = kv.mod_revision;
                assert!(seen.insert(kv.key.clone(), kv.mod_revision).is_none(), "{kv:?} delivered twice");
            }
            WatcherEvent::Progress { .. } => {}
            other => panic!("the history covers the gap, so no re-list: got {other:?}"),
        }
    }
    assert_eq!(seen, written, "every create arrives exactly once");
}

async fn next_watcher_event(
    events: &mut futures::stream::BoxStream<'static, kayra_store::WatcherEvent>,
) -> kayra_store::WatcherEvent {
    use futures::StreamExt;
    let next = tokio::time::timeout(kayra_testkit::WAIT, events.next()).await;
    next.expect("a watcher event in time").expect("the watcher never ends")
}

/// A TCP proxy in front of one member that, once armed with a needle,
/// forwards the request containing it but loses every reply on that
/// connection and then cuts it: the write is applied, its caller cannot
/// know. (DATA frames of plain-text gRPC carry keys and values as is.)
struct LossyProxy {
    port: u16,
    needle: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    cuts: Arc<std::sync::atomic::AtomicUsize>,
}

impl LossyProxy {
    async fn start(upstream: String) -> LossyProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let needle: Arc<std::sync::Mutex<Option<Vec<u8>>>> = Arc::default();
        let cuts: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let upstream = upstream.trim_start_matches("http://").to_string();
        let (n, c) = (needle.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { continue };
                tokio::spawn(pipe(client, server, n.clone(), c.clone()));
            }
        });
        LossyProxy { port, needle, cuts }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn lose_reply_to(&self, needle: &[u8]) {
        *self.needle.lock().unwrap() = Some(needle.to_vec());
    }

    fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

async fn pipe(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    needle: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    cuts: Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let lost = Arc::new(AtomicBool::new(false));
    let cut = tokio_util::sync::CancellationToken::new();
    let up = {
        let (lost, cut) = (lost.clone(), cut.clone());
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match client_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &buf[..n];
                let hit = {
                    let mut needle = needle.lock().unwrap();
                    let hit = needle.as_ref().is_some_and(|x| chunk.windows(x.len()).any(|w| w == x.as_slice()));
                    if hit {
                        *needle = None;
                    }
                    hit
                };
                if hit {
                    lost.store(true, Ordering::SeqCst);
                    cuts.fetch_add(1, Ordering::SeqCst);
                    let cut = cut.clone();
                    tokio::spawn(async move {
                        // Long enough for the member to apply the write.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        cut.cancel();
                    });
                }
                if server_tx.write_all(chunk).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if !lost.load(Ordering::SeqCst) && client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
        () = cut.cancelled() => {}
    }
}

/// A store whose first (preferred) member is behind `proxy`.
async fn behind(cluster: &EtcdCluster, proxy: &LossyProxy) -> Store {
    let mut config = cluster.config("/kayra", LOCK_TTL);
    config.endpoints[0] = proxy.endpoint();
    Store::new(EtcdStore::connect_within(&config, REQUEST_TIMEOUT).await.expect("connect"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_whose_reply_was_lost_are_reported_as_they_happened() {
    let cluster = EtcdCluster::start().await;
    let proxy = LossyProxy::start(cluster.endpoint(0)).await;
    let direct = Store::new(connect(&cluster).await);

    // A create applied, its reply lost: the retry finds our own value.
    let store = behind(&cluster, &proxy).await;
    proxy.lose_reply_to(b"value-of-the-lost-create");
    let rev = store.create("/lost/create", b"value-of-the-lost-create".to_vec()).await.expect("not a conflict");
    assert_eq!(proxy.cuts(), 1, "the reply was lost");
    let (kv, _) = direct.get("/lost/create").await.expect("get");
    let kv = kv.expect("created once");
    assert_eq!(
        (kv.mod_revision, kv.create_revision, kv.value.as_slice()),
        (rev, rev, &b"value-of-the-lost-create"[..])
    );

    // A CAS update applied, its reply lost: the retry finds our own value.
    let store = behind(&cluster, &proxy).await;
    let base = direct.create("/lost/cas", b"before".to_vec()).await.expect("create");
    proxy.lose_reply_to(b"value-of-the-lost-update");
    let rev = store.update("/lost/cas", b"value-of-the-lost-update".to_vec(), base).await.expect("not a conflict");
    assert_eq!(proxy.cuts(), 2, "the reply was lost");
    let (kv, _) = direct.get("/lost/cas").await.expect("get");
    assert_eq!(kv.expect("present").mod_revision, rev, "updated once");

    // A create that really conflicted is still a conflict.
    let store = behind(&cluster, &proxy).await;
    direct.create("/lost/taken", b"theirs".to_vec()).await.expect("create");
    proxy.lose_reply_to(b"value-of-a-conflicting-create");
    let err = store.create("/lost/taken", b"value-of-a-conflicting-create".to_vec()).await.expect_err("conflict");
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    assert_eq!(proxy.cuts(), 3, "the reply was lost");
}
