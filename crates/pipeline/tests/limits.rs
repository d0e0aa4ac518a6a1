//! `Limits` directly, on the local store (one process) and on real etcd
//! (several `Limits` over their own connections standing for processes).

use std::time::{Duration, Instant};

use kayra_catalog::repo::Layout;
use kayra_config::{Config, DatabaseConfig};
use kayra_pipeline::{HoldCause, LimitKey, LimitKeys, Limits};
use kayra_store::Store;
use kayra_testkit::{Etcd, eventually};

/// Whose step got the 429, for the warning line.
const CAUSE: HoldCause<'static> = HoldCause { api: "compute.example.com", namespace: "team-a" };
/// A backend's `Retry-After` of 999999999 s (about 31 years).
const HUGE: Duration = Duration::from_secs(999_999_999);

fn reconciler_config(limits_yaml: &str) -> kayra_config::ReconcilerConfig {
    let config = Config::parse(&format!("reconciler:\n  limits:\n{limits_yaml}"), "t").expect("parse");
    config.validate().expect("validate");
    config.reconciler
}

async fn local_store(dir: &std::path::Path) -> Store {
    Store::open(&DatabaseConfig::local(kayra_testkit::local_config(dir))).await.unwrap()
}

async fn granted(limits: &Limits, mode: &str) -> Option<kayra_pipeline::LimitPermit> {
    limits.try_acquire(mode, "core").await.expect("store").ok()
}

#[tokio::test]
async fn local_max_in_flight_is_a_semaphore_released_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits::new(
        &reconciler_config("    m: {max_in_flight: 2}\n"),
        local_store(dir.path()).await,
        Layout::new("dev", "local"),
    );
    let a = granted(&limits, "m").await.expect("first");
    let b = granted(&limits, "m").await.expect("second");
    let wait = limits.try_acquire("m", "core").await.unwrap().expect_err("third waits");
    assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1), "{wait:?}");
    drop(a);
    let c = granted(&limits, "m").await.expect("a slot came back");
    // A panicking run gives its slot back too.
    let limits2 = limits.clone();
    let panicked = tokio::spawn(async move {
        let _permit = granted(&limits2, "m").await;
        panic!("run panicked");
    });
    assert!(panicked.await.is_err());
    assert!(granted(&limits, "m").await.is_none(), "still two held: b and c");
    drop((b, c));
    assert!(granted(&limits, "m").await.is_some());
    assert!(granted(&limits, "unlimited").await.is_some(), "other modes are not limited");
}

#[tokio::test]
async fn local_per_minute_counts_starts_in_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let window = Duration::from_millis(600);
    let limits = Limits::new(
        &reconciler_config("    m: {per_minute: 3}\n"),
        local_store(dir.path()).await,
        Layout::new("dev", "local"),
    )
    .with_window(window);
    let started = Instant::now();
    for _ in 0..3 {
        drop(granted(&limits, "m").await.expect("within the limit"));
    }
    let wait = limits.try_acquire("m", "core").await.unwrap().expect_err("a fourth start waits");
    assert!(wait <= window, "{wait:?}");
    tokio::time::sleep(wait).await;
    assert!(granted(&limits, "m").await.is_some(), "the window moved on");
    assert!(started.elapsed() >= window);
}

#[tokio::test]
async fn local_backoff_holds_new_starts_of_that_mode() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits::new(
        &reconciler_config("    m: {max_in_flight: 5}\n"),
        local_store(dir.path()).await,
        Layout::new("dev", "local"),
    );
    limits.backoff("free", Duration::from_millis(500), CAUSE).await.unwrap();
    let wait = limits.try_acquire("free", "core").await.unwrap().expect_err("backing off");
    assert!(wait <= Duration::from_millis(500));
    assert!(granted(&limits, "m").await.is_some(), "other modes go on");
    tokio::time::sleep(wait).await;
    assert!(granted(&limits, "free").await.is_some());
}

#[tokio::test]
async fn local_backoff_is_capped_by_max_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits::new(
        &reconciler_config("    m: {max_retry_after: 1s}\n"),
        local_store(dir.path()).await,
        Layout::new("dev", "local"),
    );
    let started = Instant::now();
    limits.backoff("m", HUGE, CAUSE).await.unwrap();
    limits.backoff("default", HUGE, CAUSE).await.unwrap();
    let wait = limits.try_acquire("m", "core").await.unwrap().expect_err("held");
    assert!(wait <= Duration::from_secs(1), "held past max_retry_after: {wait:?}");
    let wait = limits.try_acquire("default", "core").await.unwrap().expect_err("held");
    assert!(wait <= Duration::from_secs(300), "held past the default 5m: {wait:?}");
    assert!(wait > Duration::from_secs(290), "{wait:?}");
    eventually("the capped hold passes", || async { granted(&limits, "m").await.is_some() }).await;
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

// ---------------------------------------------------------------- etcd

async fn etcd_limits(etcd: &Etcd, limits_yaml: &str) -> (Store, Limits) {
    let store = Store::open(&DatabaseConfig::etcd(etcd.config("/lim"))).await.unwrap();
    let limits = Limits::new(&reconciler_config(limits_yaml), store.clone(), Layout::new("dev", "local"));
    (store, limits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_max_in_flight_holds_across_processes_and_a_killed_one_frees_its_slot() {
    let etcd = Etcd::start().await;
    let yaml = "    m: {max_in_flight: 2}\n";
    let (_sa, a) = etcd_limits(&etcd, yaml).await;
    let (_sb, b) = etcd_limits(&etcd, yaml).await;

    // "Process" k takes a slot and is killed: its runtime stops without
    // releasing anything, so only its lease's expiry frees the slot.
    let config = etcd.config("/lim");
    let killed = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let kept = runtime.block_on(async {
            let store = Store::open(&DatabaseConfig::etcd(config)).await.unwrap();
            let limits = Limits::new(
                &reconciler_config("    m: {max_in_flight: 2}\n"),
                store.clone(),
                Layout::new("dev", "local"),
            );
            let permit = limits.try_acquire("m", "core").await.unwrap().expect("k gets a slot");
            std::mem::forget(permit);
            (store, limits)
        });
        drop(runtime); // the keep-alive task dies unpolled: no revoke
        drop(kept);
    });
    killed.join().unwrap();

    let held_a = granted(&a, "m").await.expect("one slot left");
    assert!(granted(&b, "m").await.is_none(), "k's and a's slots are taken");
    assert!(granted(&a, "m").await.is_none());
    let freed = Instant::now();
    let held_b = loop {
        if let Some(p) = granted(&b, "m").await {
            break p;
        }
        assert!(freed.elapsed() < Duration::from_secs(15), "k's slot never freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(freed.elapsed() < Duration::from_secs(2 * 2 + 3), "within the lease TTL (2s): {:?}", freed.elapsed());
    assert!(granted(&a, "m").await.is_none(), "a and b hold both");
    drop(held_a);
    eventually("a's release reaches etcd", || async { granted(&b, "m").await.map(drop).is_some() }).await;
    drop(held_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_per_minute_and_backoff_are_fleet_wide() {
    let etcd = Etcd::start().await;
    let yaml = "    m: {per_minute: 3}\n";
    let (_sa, a) = etcd_limits(&etcd, yaml).await;
    let (_sb, b) = etcd_limits(&etcd, yaml).await;
    let (a, b) = (a.with_window(Duration::from_secs(2)), b.with_window(Duration::from_secs(2)));
    let started = Instant::now();
    drop(granted(&a, "m").await.expect("1"));
    drop(granted(&b, "m").await.expect("2"));
    drop(granted(&a, "m").await.expect("3"));
    let wait = b.try_acquire("m", "core").await.unwrap().expect_err("a fourth start in the window waits");
    assert!(wait <= Duration::from_secs(2), "{wait:?}");
    eventually("the window moves on", || async { granted(&b, "m").await.is_some() }).await;
    assert!(started.elapsed() >= Duration::from_secs(2), "no fourth start before the window: {:?}", started.elapsed());

    // A 429 seen by a holds back b's starts of that mode, limited or not.
    a.backoff("m", Duration::from_secs(2), CAUSE).await.unwrap();
    a.backoff("free", Duration::from_secs(2), CAUSE).await.unwrap();
    let backoff_at = Instant::now();
    assert!(b.try_acquire("m", "core").await.unwrap().is_err());
    assert!(b.try_acquire("free", "core").await.unwrap().is_err());
    eventually("the backoff passes", || async { granted(&b, "free").await.is_some() }).await;
    assert!(backoff_at.elapsed() >= Duration::from_millis(1900), "{:?}", backoff_at.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_backoff_stores_the_capped_deadline() {
    let etcd = Etcd::start().await;
    let yaml = "    m: {max_retry_after: 1s}\n";
    let (store, a) = etcd_limits(&etcd, yaml).await;
    let (_sb, b) = etcd_limits(&etcd, yaml).await;
    let started = Instant::now();
    let before = std::time::SystemTime::now();
    a.backoff("m", HUGE, CAUSE).await.unwrap();
    a.backoff("free", HUGE, CAUSE).await.unwrap();
    // The record itself ends within the cap: no process reads a longer hold.
    let record = |mode: &'static str| {
        let store = store.clone();
        async move {
            let key = Layout::new("dev", "local").limit_key(LimitKey::Backoff { mode });
            let (kv, _) = store.get(&key).await.unwrap();
            let ms: u64 = String::from_utf8_lossy(&kv.expect("a backoff record").value).parse().unwrap();
            std::time::UNIX_EPOCH + Duration::from_millis(ms)
        }
    };
    let until = record("m").await;
    assert!(until <= std::time::SystemTime::now() + Duration::from_secs(1), "{until:?}");
    let until = record("free").await;
    let default_cap = before + Duration::from_secs(300);
    assert!(until <= std::time::SystemTime::now() + Duration::from_secs(300) && until >= default_cap, "{until:?}");
    let wait = b.try_acquire("m", "core").await.unwrap().expect_err("b is held too");
    assert!(wait <= Duration::from_secs(1), "{wait:?}");
    eventually("the capped hold passes for b", || async { granted(&b, "m").await.is_some() }).await;
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let wait = b.try_acquire("free", "core").await.unwrap().expect_err("free is held by the default cap");
    assert!(wait <= Duration::from_secs(300) && wait > Duration::from_secs(290), "{wait:?}");
}

/// Fair limits (§17): a mode's starts go round-robin across namespaces.
/// Namespace `a` asks again and again; `b` asks once, is refused, and
/// comes back when the limit says: `a` asking first at that moment is
/// refused for `b`'s turn, and `b` gets the start.
async fn starts_go_round_robin(limits: Limits, mode_yaml: &str) {
    let per_minute = mode_yaml.contains("per_minute");
    let first = granted_to(&limits, "a").await.expect("a's first start");
    let wait = limits.try_acquire("m", "b").await.unwrap().expect_err("b waits for the limit");
    // a keeps asking while b waits: never a second start before b's first.
    for _ in 0..5 {
        assert!(granted_to(&limits, "a").await.is_none(), "a started twice while b waited");
    }
    drop(first);
    if per_minute {
        tokio::time::sleep(wait).await;
    }
    // The limit frees; a asks first and still yields to b.
    let yielded = limits.try_acquire("m", "a").await.unwrap().expect_err("a's turn comes after b's");
    assert!(yielded < Duration::from_secs(5), "{yielded:?}");
    let b = eventually_granted(&limits, "b").await;
    // b started: now a's turn, and b would wait behind it.
    drop(b);
    let a = eventually_granted(&limits, "a").await;
    drop(a);
}

async fn granted_to(limits: &Limits, namespace: &str) -> Option<kayra_pipeline::LimitPermit> {
    limits.try_acquire("m", namespace).await.expect("store").ok()
}

/// Asks for `namespace` until granted, pausing as the limit says (the
/// etcd slot released by a dropped permit is deleted asynchronously).
async fn eventually_granted(limits: &Limits, namespace: &str) -> kayra_pipeline::LimitPermit {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match limits.try_acquire("m", namespace).await.expect("store") {
            Ok(permit) => return permit,
            Err(wait) => {
                assert!(Instant::now() < deadline, "{namespace} never got its start");
                tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
            }
        }
    }
}

#[tokio::test]
async fn local_starts_go_round_robin_across_namespaces() {
    for yaml in ["    m: {max_in_flight: 1}\n", "    m: {per_minute: 1}\n"] {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits::new(&reconciler_config(yaml), local_store(dir.path()).await, Layout::new("dev", "local"))
            .with_window(Duration::from_millis(500));
        starts_go_round_robin(limits, yaml).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_starts_go_round_robin_across_namespaces() {
    for yaml in ["    m: {max_in_flight: 1}\n", "    m: {per_minute: 1}\n"] {
        let etcd = Etcd::start().await;
        let (_store, limits) = etcd_limits(&etcd, yaml).await;
        starts_go_round_robin(limits.with_window(Duration::from_secs(1)), yaml).await;
    }
}

/// A namespace refused a start that never asks again (its subscription
/// was deleted) holds the others back only briefly.
#[tokio::test]
async fn a_claim_not_taken_up_lapses() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits::new(
        &reconciler_config("    m: {max_in_flight: 1}\n"),
        local_store(dir.path()).await,
        Layout::new("dev", "local"),
    );
    let first = granted_to(&limits, "a").await.expect("a's first start");
    limits.try_acquire("m", "gone").await.unwrap().expect_err("gone waits, then never asks again");
    drop(first);
    let started = Instant::now();
    let again = eventually_granted(&limits, "a").await;
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    drop(again);
}
