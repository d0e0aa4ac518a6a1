//! The conformance suite every [`Store`] backend passes (garage's
//! `db/test.rs` shape): one set of cases written against the public API
//! only, run against each backend by `tests/conformance.rs`.
//!
//! Each case is a `pub async fn(&Store)` that panics on a violation. Cases
//! write only under their own key prefix, so they can share one store and
//! run in any order ([`run_all`] runs them one after the other). Waits are
//! bounded by [`WAIT`], a generous limit meant for loaded CI machines, never
//! by a sleep that hopes the backend has caught up.
//!
//! The suite is compiled into the library (it depends on nothing but the
//! store API) so that other crates can run it against a store they
//! configured, and so that a backend cannot drift from it unnoticed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::{
    Backend, Change, ChangeStream, Compare, Error, Event, JobLocker, KeyValue, Leases, ListPage, Op, Result, Revision,
    Store, Txn, TxnResponse, WatcherEvent,
};

/// The longest any single wait in the suite may take.
pub const WAIT: Duration = Duration::from_secs(20);

/// Every case, in order, on one store.
pub async fn run_all(store: &Store) {
    get_missing(store).await;
    create_then_conflict(store).await;
    update_compare_and_swap(store).await;
    delete_conditional(store).await;
    list_sorted_and_paginated(store).await;
    changes_order_puts_and_deletes(store).await;
    changes_replay_history_from_a_past_revision(store).await;
    list_then_changes_lose_nothing(store).await;
    revision_moves_only_on_writes(store).await;
    txn_compares_choose_the_branch(store).await;
    txn_ops_apply_in_order_atomically(store).await;
    txn_prefix_empty_guards(store).await;
    grouped_txns_answer_as_if_alone(store).await;
    watcher_lists_then_watches_in_order(store).await;
    watcher_reports_progress(store).await;
    watcher_lists_many_pages_at_one_revision(store).await;
    lists_of_uneven_keys_read_whole(store).await;
    snapshot_many_reads_one_revision(store).await;
}

/// `snapshot_many` reads every prefix at one revision: while a writer
/// moves two keys under two prefixes together (one transaction each
/// time), every snapshot sees them equal, and nothing newer than the
/// revision it reports.
pub async fn snapshot_many_reads_one_revision(store: &Store) {
    let (a, b) = ("/conformance/snapshot_many/a/", "/conformance/snapshot_many/b/");
    let put_both = move |n: u32| {
        Txn::new()
            .then(Op::Put { key: format!("{a}k"), value: n.to_string().into_bytes() })
            .then(Op::Put { key: format!("{b}k"), value: n.to_string().into_bytes() })
    };
    store.txn(put_both(0)).await.expect("first write");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 1;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                store.txn(put_both(n)).await.expect("write");
                n += 1;
            }
        })
    };
    let prefixes = [a.to_string(), b.to_string(), "/conformance/snapshot_many/none/".to_string()];
    for _ in 0..30 {
        let (lists, revision) = store.snapshot_many(&prefixes).await.expect("snapshot_many");
        assert_eq!(lists.len(), 3);
        assert!(lists[2].is_empty());
        let (in_a, in_b) = (&lists[0][0], &lists[1][0]);
        assert_eq!(in_a.value, in_b.value, "both prefixes read at one revision ({revision})");
        assert!(in_a.mod_revision <= revision && in_b.mod_revision <= revision);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.await.expect("writer");
}

/// A missing key reads as `None`, at the store's current revision.
pub async fn get_missing(store: &Store) {
    let before = store.revision().await.expect("revision");
    let (kv, revision) = store.get("/conformance/get_missing/nope").await.expect("get");
    assert_eq!(kv, None);
    assert!(revision >= before, "get reports the revision it read at ({revision} < {before})");
}

/// Create stores a record whose revisions are the write's; a second
/// create of the same key is a `Conflict` and changes nothing.
pub async fn create_then_conflict(store: &Store) {
    let key = "/conformance/create/a";
    let rev = store.create(key, b"one".to_vec()).await.expect("create");
    let (kv, read_at) = store.get(key).await.expect("get");
    let kv = kv.expect("created key is readable");
    assert_eq!(kv.key, key);
    assert_eq!(kv.value, b"one");
    assert_eq!((kv.create_revision, kv.mod_revision), (rev, rev));
    assert!(read_at >= rev);

    let err = store.create(key, b"two".to_vec()).await.expect_err("second create");
    assert!(matches!(err, Error::Conflict(ref k) if k == key), "want Conflict({key:?}), got {err:?}");
    assert_eq!(store.get(key).await.expect("get").0.expect("still there").value, b"one");
}

/// Update succeeds only at the expected revision, keeps `create_revision`,
/// tells a stale revision (`Conflict`) from a missing key (`NotFound`).
pub async fn update_compare_and_swap(store: &Store) {
    let key = "/conformance/update/a";
    let created = store.create(key, b"v1".to_vec()).await.expect("create");
    let updated = store.update(key, b"v2".to_vec(), created).await.expect("update at the current revision");
    assert!(updated > created);
    let kv = store.get(key).await.expect("get").0.expect("present");
    assert_eq!((kv.value.as_slice(), kv.create_revision, kv.mod_revision), (&b"v2"[..], created, updated));

    let err = store.update(key, b"v3".to_vec(), created).await.expect_err("update at a stale revision");
    assert!(matches!(err, Error::Conflict(ref k) if k == key), "want Conflict, got {err:?}");
    assert_eq!(store.get(key).await.expect("get").0.expect("present").value, b"v2");

    let missing = "/conformance/update/missing";
    for expected in [0, updated] {
        let err = store.update(missing, b"x".to_vec(), expected).await.expect_err("update of a missing key");
        assert!(matches!(err, Error::NotFound(ref k) if k == missing), "want NotFound, got {err:?}");
    }
    assert_eq!(store.get(missing).await.expect("get").0, None, "a failed update must not create the key");
}

/// Delete with an expected revision is a compare-and-swap; without one it
/// is unconditional; a missing key is `NotFound` either way.
pub async fn delete_conditional(store: &Store) {
    let key = "/conformance/delete/a";
    let created = store.create(key, b"v1".to_vec()).await.expect("create");
    let updated = store.update(key, b"v2".to_vec(), created).await.expect("update");

    let err = store.delete(key, Some(created)).await.expect_err("delete at a stale revision");
    assert!(matches!(err, Error::Conflict(ref k) if k == key), "want Conflict, got {err:?}");
    assert!(store.get(key).await.expect("get").0.is_some(), "a failed delete keeps the key");

    let deleted = store.delete(key, Some(updated)).await.expect("delete at the current revision");
    assert!(deleted > updated);
    assert_eq!(store.get(key).await.expect("get").0, None);
    for expected in [None, Some(updated)] {
        let err = store.delete(key, expected).await.expect_err("delete of a missing key");
        assert!(matches!(err, Error::NotFound(ref k) if k == key), "want NotFound, got {err:?}");
    }

    let other = "/conformance/delete/b";
    store.create(other, b"x".to_vec()).await.expect("create");
    store.delete(other, None).await.expect("unconditional delete");
    assert_eq!(store.get(other).await.expect("get").0, None);
}

/// Listing returns exactly the keys under the prefix, sorted, and pages
/// through them with `start_after` / `limit` / `more`.
pub async fn list_sorted_and_paginated(store: &Store) {
    let prefix = "/conformance/list/p/";
    let names = ["d", "a", "c", "e", "b"];
    for name in names {
        store.create(&format!("{prefix}{name}"), name.as_bytes().to_vec()).await.expect("create");
    }
    // Neighbours that share the prefix's text but not the prefix.
    store.create("/conformance/list/p", b"parent".to_vec()).await.expect("create");
    store.create("/conformance/list/pp/a", b"sibling".to_vec()).await.expect("create");
    store.create("/conformance/list/p0", b"next".to_vec()).await.expect("create");
    let want: Vec<String> = ["a", "b", "c", "d", "e"].iter().map(|n| format!("{prefix}{n}")).collect();

    let all = store.list(prefix, None, 0).await.expect("list");
    assert_eq!(keys(&all.items), want);
    assert!(!all.more);
    assert_eq!(all.items[0].value, b"a");
    assert_eq!(all.revision, store.revision().await.expect("revision"));

    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store.list(prefix, after.as_deref(), 2).await.expect("page");
        pages += 1;
        assert!(page.items.len() <= 2);
        seen.extend(keys(&page.items));
        if !page.more {
            break;
        }
        after = page.items.last().map(|kv| kv.key.clone());
        assert!(pages < 10, "pagination does not terminate");
    }
    assert_eq!((seen, pages), (want.clone(), 3));

    let exact = store.list(prefix, None, 5).await.expect("list");
    assert_eq!((exact.items.len(), exact.more), (5, false), "`more` is false when the limit is met exactly");

    let mid = store.list(prefix, Some(&format!("{prefix}b")), 0).await.expect("list after b");
    assert_eq!(keys(&mid.items), want[2..]);
    let between = store.list(prefix, Some(&format!("{prefix}bb")), 1).await.expect("list after bb");
    assert_eq!((keys(&between.items), between.more), (vec![want[2].clone()], true));
    let past = store.list(prefix, Some(&format!("{prefix}z")), 0).await.expect("list after the end");
    assert!(past.items.is_empty() && !past.more);
    let empty = store.list("/conformance/list/none/", None, 0).await.expect("empty list");
    assert!(empty.items.is_empty() && !empty.more);
}

/// The change feed from "now" delivers puts and deletes under its prefix,
/// in revision order, with the revisions the writes returned.
pub async fn changes_order_puts_and_deletes(store: &Store) {
    let prefix = "/conformance/watch/";
    let from = store.revision().await.expect("revision") + 1;
    let mut watch = store.changes(prefix, from).await.expect("changes");
    let (a, b) = ("/conformance/watch/a", "/conformance/watch/b");
    let r1 = store.create(a, b"1".to_vec()).await.expect("create a");
    store.create("/conformance/watchers/x", b"outside".to_vec()).await.expect("create outside");
    let r2 = store.create(b, b"1".to_vec()).await.expect("create b");
    let r3 = store.update(a, b"2".to_vec(), r1).await.expect("update a");
    let r4 = store.delete(b, None).await.expect("delete b");
    let r5 = store.delete(a, Some(r3)).await.expect("delete a");

    let got = next_events(&mut watch, 5).await;
    assert_eq!(
        summary(&got),
        vec![
            ("put", a.to_string(), r1, Some(b"1".to_vec())),
            ("put", b.to_string(), r2, Some(b"1".to_vec())),
            ("put", a.to_string(), r3, Some(b"2".to_vec())),
            ("delete", b.to_string(), r4, None),
            ("delete", a.to_string(), r5, None),
        ]
    );
    if let Event::Put(kv) = &got[2] {
        assert_eq!(kv.create_revision, r1, "an update event keeps the key's create revision");
    }
}

/// The change feed from a past revision replays the history since then,
/// deletes included, and then carries on live.
pub async fn changes_replay_history_from_a_past_revision(store: &Store) {
    let (a, b) = ("/conformance/replay/a", "/conformance/replay/b");
    let r1 = store.create(a, b"1".to_vec()).await.expect("create a");
    let r2 = store.update(a, b"2".to_vec(), r1).await.expect("update a");
    let r3 = store.delete(a, None).await.expect("delete a");
    let r4 = store.create(b, b"1".to_vec()).await.expect("create b");

    let mut watch = store.changes("/conformance/replay/", r2).await.expect("changes from the past");
    let replayed = next_events(&mut watch, 2).await;
    assert_eq!(
        summary(&replayed),
        vec![("put", a.to_string(), r2, Some(b"2".to_vec())), ("delete", a.to_string(), r3, None),]
    );
    let more = next_events(&mut watch, 1).await;
    assert_eq!(summary(&more), vec![("put", b.to_string(), r4, Some(b"1".to_vec()))]);

    let r5 = store.delete(b, Some(r4)).await.expect("delete b");
    let live = next_events(&mut watch, 1).await;
    assert_eq!(summary(&live), vec![("delete", b.to_string(), r5, None)]);
}

/// The reflector pattern: list, then follow the change feed from the
/// list's revision + 1, while another task keeps writing. Applying the
/// events to the listing must give exactly the final contents: no write
/// falls between the two.
pub async fn list_then_changes_lose_nothing(store: &Store) {
    const WRITES: usize = 60;
    let prefix = "/conformance/reflect/";
    for i in 0..5 {
        store.create(&format!("{prefix}seed{i}"), b"0".to_vec()).await.expect("seed");
    }
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn({
        let store = store.clone();
        async move {
            let mut listed = Some(listed_rx);
            for i in 0..WRITES {
                let key = format!("{prefix}k{:02}", i % 20);
                match store.get(&key).await.expect("get").0 {
                    Some(kv) if i % 3 == 0 => store.delete(&key, Some(kv.mod_revision)).await.map(drop),
                    Some(kv) => store.update(&key, i.to_string().into_bytes(), kv.mod_revision).await.map(drop),
                    None => store.create(&key, i.to_string().into_bytes()).await.map(drop),
                }
                .expect("write");
                if i == WRITES / 3 {
                    // Interleave: the listing happens while writes continue.
                    if let Some(rx) = listed.take() {
                        let _ = rx.await;
                    }
                }
            }
            store.create(&format!("{prefix}zz-done"), b"done".to_vec()).await.expect("marker")
        }
    });

    let (items, revision) = store.list_all(prefix).await.expect("list");
    let mut state: BTreeMap<String, Vec<u8>> = items.into_iter().map(|kv| (kv.key, kv.value)).collect();
    let mut watch = store.changes(prefix, revision + 1).await.expect("changes");
    let _ = listed_tx.send(());
    let done = writer.await.expect("writer task");

    let mut last = revision;
    while !state.contains_key(&format!("{prefix}zz-done")) {
        let event = next_event(&mut watch).await;
        assert!(
            event.revision() > last,
            "events arrive in revision order, once each ({} after {last})",
            event.revision()
        );
        last = event.revision();
        match event {
            Event::Put(kv) => state.insert(kv.key, kv.value),
            Event::Delete { key, .. } => state.remove(&key),
        };
    }
    assert_eq!(last, done);
    let (now, _) = store.list_all(prefix).await.expect("final list");
    let want: BTreeMap<String, Vec<u8>> = now.into_iter().map(|kv| (kv.key, kv.value)).collect();
    assert_eq!(state, want, "listing + events == final contents");
}

/// The revision moves on every successful write and on nothing else.
pub async fn revision_moves_only_on_writes(store: &Store) {
    let key = "/conformance/revision/a";
    let start = store.revision().await.expect("revision");
    let created = store.create(key, b"1".to_vec()).await.expect("create");
    assert!(created > start);
    assert_eq!(store.revision().await.expect("revision"), created);

    let _ = store.get(key).await.expect("get");
    let _ = store.get("/conformance/revision/missing").await.expect("get");
    let _ = store.list("/conformance/revision/", None, 0).await.expect("list");
    let watch = store.changes("/conformance/revision/", created + 1).await.expect("changes");
    drop(watch);
    assert!(store.create(key, b"2".to_vec()).await.is_err());
    assert!(store.update(key, b"2".to_vec(), created - 1).await.is_err());
    assert!(store.update("/conformance/revision/missing", b"2".to_vec(), created).await.is_err());
    assert!(store.delete(key, Some(created - 1)).await.is_err());
    assert!(store.delete("/conformance/revision/missing", None).await.is_err());
    assert_eq!(store.revision().await.expect("revision"), created, "reads and failed writes leave the revision alone");

    let updated = store.update(key, b"2".to_vec(), created).await.expect("update");
    assert!(updated > created);
    let deleted = store.delete(key, None).await.expect("delete");
    assert!(deleted > updated);
    assert_eq!(store.revision().await.expect("revision"), deleted);
}

/// The next event of a change feed, skipping `Progress`; a panic when the
/// feed fails or ends, or after [`WAIT`].
pub async fn next_event(feed: &mut ChangeStream) -> Event {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, feed.next()).await {
            Ok(Some(Ok(Change::Event(event)))) => return event,
            Ok(Some(Ok(Change::Progress(_)))) => continue,
            Ok(Some(Err(e))) => panic!("the change feed failed: {e}"),
            Ok(None) => panic!("the change feed ended"),
            Err(_) => panic!("no change event within {WAIT:?}"),
        }
    }
}

/// The next `n` events of a change feed.
pub async fn next_events(watch: &mut ChangeStream, n: usize) -> Vec<Event> {
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        events.push(next_event(watch).await);
    }
    events
}

fn keys(items: &[crate::KeyValue]) -> Vec<String> {
    items.iter().map(|kv| kv.key.clone()).collect()
}

type Summary = (&'static str, String, Revision, Option<Vec<u8>>);

fn summary(events: &[Event]) -> Vec<Summary> {
    events
        .iter()
        .map(|e| match e {
            Event::Put(kv) => ("put", kv.key.clone(), kv.mod_revision, Some(kv.value.clone())),
            Event::Delete { key, revision } => ("delete", key.clone(), *revision, None),
        })
        .collect()
}

fn put(key: &str, value: &str) -> Op {
    Op::Put { key: key.into(), value: value.as_bytes().to_vec() }
}
fn get(key: &str) -> Op {
    Op::Get { key: key.into() }
}
fn value_of(kv: &Option<KeyValue>) -> Option<&[u8]> {
    kv.as_ref().map(|kv| kv.value.as_slice())
}

/// Each compare holds or fails exactly as documented; a failed compare
/// runs the `failure` branch (whose `Get`s answer in the same round trip)
/// and writes nothing of `success`.
pub async fn txn_compares_choose_the_branch(store: &Store) {
    let (present, missing) = ("/conformance/txn/cmp/present", "/conformance/txn/cmp/missing");
    let rev = store.create(present, b"p".to_vec()).await.expect("create");
    let cases = [
        (Compare::Absent(missing.into()), true),
        (Compare::Absent(present.into()), false),
        (Compare::Exists(present.into()), true),
        (Compare::Exists(missing.into()), false),
        (Compare::ModRevision(present.into(), rev), true),
        (Compare::ModRevision(present.into(), rev + 1000), false),
        (Compare::ModRevision(missing.into(), 0), false),
    ];
    for (i, (compare, holds)) in cases.into_iter().enumerate() {
        let marker = format!("/conformance/txn/cmp/ran-{i}");
        let before = store.revision().await.expect("revision");
        let txn = Txn::new().when(compare.clone()).then(put(&marker, "yes")).otherwise(get(present));
        let resp = store.txn(txn).await.expect("txn");
        assert_eq!(resp.succeeded, holds, "{compare:?}");
        let written = store.get(&marker).await.expect("get").0;
        assert_eq!(written.is_some(), holds, "{compare:?}: the success branch ran iff the compare held");
        if holds {
            assert!(resp.revision > before, "a writing txn moves the revision");
            assert!(resp.gets.is_empty());
        } else {
            assert_eq!(resp.revision, before, "a txn that wrote nothing leaves the revision");
            assert_eq!(resp.gets.len(), 1, "one answer per Get of the failure branch");
            assert_eq!(value_of(&resp.gets[0]), Some(&b"p"[..]));
        }
    }
    // All compares must hold; one failing one is enough to fail.
    let txn = Txn::new()
        .when(Compare::Exists(present.into()))
        .when(Compare::Exists(missing.into()))
        .then(put(missing, "x"))
        .otherwise(get(missing));
    let resp = store.txn(txn).await.expect("txn");
    assert!(!resp.succeeded);
    assert_eq!(resp.gets, vec![None], "a Get of a missing key answers None");
    assert_eq!(store.get(missing).await.expect("get").0, None);
}

/// Group-committed transactions ([`Store::txn_grouped`]) submitted at once
/// answer exactly as each would alone: their own branch, their own gets,
/// with one winner among those racing for one key; and they share round
/// trips.
pub async fn grouped_txns_answer_as_if_alone(store: &Store) {
    let base = "/conformance/txn/grouped/";
    let taken = format!("{base}taken");
    let rev = store.create(&taken, b"t".to_vec()).await.expect("create");
    // 40 that all succeed, at once: they share round trips.
    let before = store.round_trips();
    let fresh = futures::future::join_all((0..40).map(|i| {
        let key = format!("{base}fresh/{i:02}");
        store.txn_grouped(Txn::new().when(Compare::Absent(key.clone())).then(put(&key, "f")).otherwise(get(&taken)))
    }))
    .await;
    let trips = store.round_trips() - before;
    assert!(fresh.iter().all(|r| r.as_ref().is_ok_and(|r| r.succeeded)), "{fresh:?}");
    assert!(trips < 40, "40 transactions submitted at once shared round trips ({trips})");
    // 60 on keys of their own, a third of them with a compare that fails.
    let own = futures::future::join_all((0..60).map(|i| {
        let key = format!("{base}own/{i:02}");
        let compare =
            if i % 3 == 0 { Compare::ModRevision(taken.clone(), rev + 1000) } else { Compare::Absent(key.clone()) };
        let txn = Txn::new().when(compare).then(put(&key, &format!("v{i}"))).then(get(&key)).otherwise(get(&taken));
        store.txn_grouped(txn)
    }))
    .await;
    // 20 racing to create one key.
    let contested = format!("{base}contested");
    let racing = futures::future::join_all((0..20).map(|i| {
        let txn = Txn::new()
            .when(Compare::Absent(contested.clone()))
            .then(put(&contested, &format!("w{i}")))
            .otherwise(get(&contested));
        store.txn_grouped(txn)
    }))
    .await;
    for (i, resp) in own.into_iter().enumerate() {
        let resp = resp.expect("grouped txn");
        let key = format!("{base}own/{i:02}");
        if i % 3 == 0 {
            assert!(!resp.succeeded, "{i}: its compare fails");
            assert_eq!(resp.gets.len(), 1);
            assert_eq!(value_of(&resp.gets[0]), Some(&b"t"[..]), "{i}: its own failure branch ran");
            assert_eq!(store.get(&key).await.expect("get").0, None, "{i}: nothing written");
        } else {
            assert!(resp.succeeded, "{i}");
            let kv = resp.gets[0].as_ref().expect("its Get sees its own put");
            assert_eq!(kv.value, format!("v{i}").into_bytes());
            assert!(kv.mod_revision <= resp.revision);
            let stored = store.get(&key).await.expect("get").0.expect("written");
            assert_eq!((stored.value, stored.mod_revision), (kv.value.clone(), kv.mod_revision));
        }
    }
    let stored = store.get(&contested).await.expect("get").0.expect("one won");
    let winners: Vec<_> = racing.into_iter().map(|r| r.expect("grouped txn")).filter(|r| r.succeeded).collect();
    assert_eq!(winners.len(), 1, "exactly one create of the contested key succeeds");
    assert_eq!(stored.mod_revision, stored.create_revision);
    assert_eq!(Some(stored.value.as_slice()), winners.first().map(|_| stored.value.as_slice()));
}

/// Puts, deletes and prefix deletes apply in one revision step, readable
/// by `Get`s of the same branch; records keep their `create_revision`.
pub async fn txn_ops_apply_in_order_atomically(store: &Store) {
    let base = "/conformance/txn/ops/";
    let kept = format!("{base}kept");
    let created = store.create(&kept, b"v1".to_vec()).await.expect("create");
    for i in 0..3 {
        store.create(&format!("{base}doomed/{i}"), b"d".to_vec()).await.expect("create");
    }
    store.create(&format!("{base}doomedx"), b"neighbour".to_vec()).await.expect("create");
    store.create(&format!("{base}single"), b"s".to_vec()).await.expect("create");
    let txn = Txn::new()
        .when(Compare::ModRevision(kept.clone(), created))
        .then(put(&kept, "v2"))
        .then(put(&format!("{base}new"), "n"))
        .then(Op::Delete { key: format!("{base}single") })
        .then(Op::Delete { key: format!("{base}never-there") })
        .then(Op::DeletePrefix { prefix: format!("{base}doomed/") })
        .then(get(&kept))
        .then(get(&format!("{base}single")));
    let resp = store.txn(txn).await.expect("txn");
    assert!(resp.succeeded);
    assert_eq!(resp.gets.len(), 2);
    let kv = resp.gets[0].as_ref().expect("the Get sees the branch's own put");
    assert_eq!((kv.value.as_slice(), kv.create_revision), (&b"v2"[..], created));
    assert!(kv.mod_revision > created && kv.mod_revision <= resp.revision);
    assert_eq!(resp.gets[1], None, "the Get sees the branch's own delete");

    let (items, at) = store.list_all(base).await.expect("list");
    let keys: Vec<&str> = items.iter().map(|kv| kv.key.strip_prefix(base).unwrap_or(&kv.key)).collect();
    assert_eq!(keys, ["doomedx", "kept", "new"], "DeletePrefix removes the prefix's keys and nothing beside");
    assert!(at >= resp.revision);
    assert_eq!(store.get(&kept).await.expect("get").0.expect("kept").mod_revision, kv.mod_revision);
}

/// `PrefixEmpty` holds exactly when no key starts with the prefix — not
/// fooled by the prefix key itself being absent or by look-alike neighbours.
pub async fn txn_prefix_empty_guards(store: &Store) {
    let guard = "/conformance/txn/guard/users/alice/";
    let check = |prefix: &str| {
        let txn = Txn::new().when(Compare::PrefixEmpty(prefix.into()));
        async move { store.txn(txn).await.expect("txn").succeeded }
    };
    assert!(check(guard).await, "an unused prefix is empty");
    store.create("/conformance/txn/guard/users/alice", b"parent".to_vec()).await.expect("create");
    store.create("/conformance/txn/guard/users/alicex/t", b"neighbour".to_vec()).await.expect("create");
    assert!(check(guard).await, "neither the parent key nor a neighbour is under the prefix");
    let rev = store.create(&format!("{guard}t1"), b"t".to_vec()).await.expect("create");
    assert!(!check(guard).await, "one key under the prefix");
    // The guard makes "create the user's token unless the user is gone" and
    // "delete the user unless tokens remain" exclusive.
    let txn = Txn::new()
        .when(Compare::PrefixEmpty(guard.into()))
        .then(Op::Delete { key: "/conformance/txn/guard/users/alice".into() });
    assert!(!store.txn(txn).await.expect("txn").succeeded);
    store.delete(&format!("{guard}t1"), Some(rev)).await.expect("delete");
    assert!(check(guard).await, "empty again after the last key went");

    // PrefixUnchangedSince: no key under the prefix written after `at`.
    let unchanged = |prefix: &str, at: Revision| {
        let txn = Txn::new().when(Compare::PrefixUnchangedSince(prefix.into(), at));
        async move { store.txn(txn).await.expect("txn").succeeded }
    };
    let index = "/conformance/txn/guard/index/";
    assert!(unchanged(index, 0).await, "an empty prefix is unchanged since any revision");
    let first = store.create(&format!("{index}a"), b"a".to_vec()).await.expect("create");
    assert!(unchanged(index, first).await);
    assert!(!unchanged(index, first - 1).await);
    let second = store.create(&format!("{index}b"), b"b".to_vec()).await.expect("create");
    assert!(!unchanged(index, first).await, "a key created after the revision");
    assert!(unchanged(index, second).await);
    store.update(&format!("{index}a"), b"a2".to_vec(), first).await.expect("update");
    assert!(!unchanged(index, second).await, "a key modified after the revision");
    assert!(unchanged("/conformance/txn/guard/index/a/", 0).await, "a neighbour prefix is not the key");
}

/// The first event of `watcher` within [`WAIT`], skipping `Progress`.
pub async fn next_change(watcher: &mut BoxStream<'static, WatcherEvent>) -> WatcherEvent {
    loop {
        match tokio::time::timeout(WAIT, watcher.next()).await {
            Ok(Some(WatcherEvent::Progress { .. })) => continue,
            Ok(Some(event)) => return event,
            Ok(None) => panic!("the watcher ended"),
            Err(_) => panic!("no watcher event within {WAIT:?}"),
        }
    }
}

/// Reads a whole (re-)list: `Init`, the `InitApply`s, `InitDone`.
/// Returns the keys listed and the list's revision.
pub async fn next_list(watcher: &mut BoxStream<'static, WatcherEvent>) -> (BTreeMap<String, Vec<u8>>, Revision) {
    match next_change(watcher).await {
        WatcherEvent::Init => {}
        other => panic!("expected Init, got {other:?}"),
    }
    let mut listed = BTreeMap::new();
    loop {
        match next_change(watcher).await {
            WatcherEvent::InitApply(kv) => {
                assert!(listed.keys().next_back().is_none_or(|last: &String| last < &kv.key), "listed in key order");
                listed.insert(kv.key, kv.value);
            }
            WatcherEvent::InitDone { revision } => return (listed, revision),
            other => panic!("expected InitApply or InitDone, got {other:?}"),
        }
    }
}

/// The watcher lists what is present (at one revision), then delivers every
/// later change under the prefix — and nothing outside it — in order.
pub async fn watcher_lists_then_watches_in_order(store: &Store) {
    let prefix = "/conformance/watcher/order/";
    for i in 0..5 {
        store.create(&format!("{prefix}{i}"), vec![b'0' + i]).await.expect("create");
    }
    let (gone, _) = store.get(&format!("{prefix}4")).await.expect("get");
    store.delete(&format!("{prefix}4"), gone.map(|kv| kv.mod_revision)).await.expect("delete");
    let written = store.revision().await.expect("revision");
    let mut watcher = store.watcher(prefix);
    let (listed, at) = next_list(&mut watcher).await;
    assert_eq!(
        listed.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "/conformance/watcher/order/0",
            "/conformance/watcher/order/1",
            "/conformance/watcher/order/2",
            "/conformance/watcher/order/3",
        ]
    );
    assert!(at >= written, "the list is at or after the writes before it ({at} < {written})");

    store.create("/conformance/watcher/orderx", b"outside".to_vec()).await.expect("create");
    let a = store.create(&format!("{prefix}a"), b"a".to_vec()).await.expect("create");
    let a2 = store.update(&format!("{prefix}a"), b"a2".to_vec(), a).await.expect("update");
    let d = store.delete(&format!("{prefix}0"), None).await.expect("delete");
    let txn = Txn::new().then(put(&format!("{prefix}b"), "b")).then(Op::DeletePrefix { prefix: format!("{prefix}1") });
    let t = store.txn(txn).await.expect("txn").revision;
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(next_change(&mut watcher).await);
    }
    let shape: Vec<(String, Revision, bool)> = seen
        .iter()
        .map(|e| match e {
            WatcherEvent::Apply(kv) => (kv.key.clone(), kv.mod_revision, true),
            WatcherEvent::Delete { key, revision } => (key.clone(), *revision, false),
            other => panic!("expected Apply/Delete, got {other:?}"),
        })
        .collect();
    let keys: Vec<(&str, bool)> = shape.iter().map(|(k, _, put)| (k.strip_prefix(prefix).unwrap_or(k), *put)).collect();
    assert_eq!(keys, [("a", true), ("a", true), ("0", false), ("b", true), ("1", false)]);
    assert_eq!((shape[0].1, shape[1].1, shape[2].1), (a, a2, d));
    assert!(shape.windows(2).all(|w| w[0].1 <= w[1].1), "in revision order: {shape:?}");
    assert!(shape[4].1 <= t);
}

/// A list of many pages, read a page at a time as the consumer takes them,
/// is still one snapshot: a write made while the list is under way (after
/// its first key arrived, before its last page is read) changes nothing
/// listed, and comes after the list as changes.
pub async fn watcher_lists_many_pages_at_one_revision(store: &Store) {
    let prefix = "/conformance/watcher/pages/";
    let key = |i: usize| format!("{prefix}{i:05}");
    const KEYS: usize = 5_000;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
        let txn = chunk.iter().fold(Txn::new(), |txn, i| txn.then(put(&key(*i), "0")));
        store.txn(txn).await.expect("seed");
    }
    let (first, last) = (key(0), key(KEYS - 1));
    let mut watcher = store.watcher(prefix);
    assert_eq!(next_change(&mut watcher).await, WatcherEvent::Init);
    match next_change(&mut watcher).await {
        WatcherEvent::InitApply(kv) => assert_eq!(kv.key, first),
        other => panic!("expected InitApply, got {other:?}"),
    }
    // First and last move together: a list read at two revisions would
    // show them apart.
    let moved = store.txn(Txn::new().then(put(&first, "1")).then(put(&last, "1"))).await.expect("txn").revision;
    let (mut listed, mut newest) = (1, 0);
    let at = loop {
        match next_change(&mut watcher).await {
            WatcherEvent::InitApply(kv) => {
                assert_eq!(kv.value, b"0", "{} listed after the write", kv.key);
                newest = newest.max(kv.mod_revision);
                listed += 1;
            }
            WatcherEvent::InitDone { revision } => break revision,
            other => panic!("expected InitApply or InitDone, got {other:?}"),
        }
    };
    assert_eq!(listed, KEYS, "every key, once");
    assert!(newest <= at && at < moved, "the list is at its first page's revision ({at}), before the write ({moved})");
    for expected in [&first, &last] {
        match next_change(&mut watcher).await {
            WatcherEvent::Apply(kv) => {
                assert_eq!((&kv.key, &kv.value[..]), (expected, &b"1"[..]));
                assert!(at < kv.mod_revision && kv.mod_revision <= moved, "the write's revision: {}", kv.mod_revision);
            }
            other => panic!("expected the write as Apply, got {other:?}"),
        }
    }
}

/// Keys of uneven shapes (two clusters far apart, long shared names,
/// scattered bytes), large enough values that a list takes several
/// pages: the watcher's list and `snapshot_many` read every key once, in
/// order (etcd reads a list in sub-ranges whose ends are estimated from
/// the keys before them).
pub async fn lists_of_uneven_keys_read_whole(store: &Store) {
    let prefix = "/conformance/uneven/";
    let mut names: Vec<String> = (0..1_500).map(|n| format!("a{n:05}")).collect();
    names.extend((0..1_500).map(|n| format!("organization-production-team-{n:08}/compute.example.com")));
    names.extend((0..1_500u64).map(|n| format!("{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15))));
    names.extend((0..1_500).map(|n| format!("zz{n:05}")));
    let value = vec![b'v'; 1_500];
    for chunk in names.chunks(100) {
        let txn = chunk
            .iter()
            .fold(Txn::new(), |txn, name| txn.then(Op::Put { key: format!("{prefix}{name}"), value: value.clone() }));
        store.txn(txn).await.expect("seed");
    }
    let mut expected: Vec<String> = names.iter().map(|name| format!("{prefix}{name}")).collect();
    expected.sort();
    let (listed, _) = next_list(&mut store.watcher(prefix)).await;
    assert_eq!(listed.into_keys().collect::<Vec<_>>(), expected, "the watcher's list");
    let (snapshots, _) = store.snapshot_many(&[prefix.to_string()]).await.expect("snapshot");
    let keys: Vec<String> = snapshots.into_iter().flatten().map(|kv| kv.key).collect();
    assert_eq!(keys, expected, "snapshot_many");
}

/// A healthy watcher reports progress often (consumers that fail closed
/// rely on it arriving at least every second or so), at revisions that
/// move with the store.
pub async fn watcher_reports_progress(store: &Store) {
    let prefix = "/conformance/watcher/progress/";
    let mut watcher = store.watcher(prefix);
    let (_, listed_at) = next_list(&mut watcher).await;
    let written = store.create("/conformance/watcher/elsewhere", b"x".to_vec()).await.expect("create");
    let mut last = tokio::time::Instant::now();
    let mut progress = Vec::new();
    while progress.len() < 6 {
        match tokio::time::timeout(WAIT, watcher.next()).await.expect("an event").expect("not ended") {
            WatcherEvent::Progress { revision } => {
                // Generous for a loaded machine; the target cadence is well under a second.
                assert!(last.elapsed() < Duration::from_secs(3), "progress gap of {:?}", last.elapsed());
                last = tokio::time::Instant::now();
                progress.push(revision);
            }
            other => panic!("nothing changed under the prefix, got {other:?}"),
        }
    }
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "progress never goes back: {progress:?}");
    assert!(progress[0] >= listed_at);
    assert!(
        *progress.last().unwrap_or(&0) >= written,
        "progress reaches a write outside the prefix ({progress:?} < {written})"
    );
}

/// A real backend whose change feeds can be cut, as a lost connection
/// would: [`FeedSwitch::cut`] ends every open feed and makes new ones fail
/// until [`FeedSwitch::restore`]; and whose transactions can fail, as an
/// unreachable store's would ([`FeedSwitch::fail_txns`]). Everything else
/// passes straight through. For testing what consumers of the store do
/// across outages.
pub struct Switched<B> {
    inner: B,
    /// `(on, cuts so far)`: a feed ends once the count moves past its own.
    on: tokio::sync::watch::Receiver<(bool, u64)>,
    failing: Arc<Mutex<Failing>>,
}

/// Transactions a [`Switched`] backend fails: the next `left` that
/// `matches`; and how long each of its snapshots (lists) takes at least.
#[derive(Default)]
struct Failing {
    left: usize,
    matches: Option<TxnFilter>,
    /// Snapshots of prefixes under `.0` take at least `.1`.
    snapshot_delay: Option<(String, Duration)>,
}

type TxnFilter = Box<dyn Fn(&Txn) -> bool + Send + Sync>;

impl Failing {
    /// Whether `txn` fails (and is counted).
    fn take(&mut self, txn: &Txn) -> bool {
        let hit = self.left > 0 && self.matches.as_ref().is_some_and(|m| m(txn));
        if hit {
            self.left -= 1;
        }
        hit
    }
}

/// Turns the feeds of a [`Switched`] backend off and on, and fails its
/// transactions.
#[derive(Clone)]
pub struct FeedSwitch(Arc<tokio::sync::watch::Sender<(bool, u64)>>, Arc<Mutex<Failing>>);

impl FeedSwitch {
    /// Fails the next `n` transactions that `matches` with
    /// [`Error::Unavailable`], applying nothing of them.
    pub fn fail_txns(&self, n: usize, matches: impl Fn(&Txn) -> bool + Send + Sync + 'static) {
        let mut failing = self.1.lock().unwrap_or_else(PoisonError::into_inner);
        failing.left = n;
        failing.matches = Some(Box::new(matches));
    }

    /// Makes every snapshot (a watcher's list) of a prefix under `under`
    /// take at least `delay`, as a large prefix does.
    pub fn delay_snapshots(&self, under: &str, delay: Duration) {
        self.1.lock().unwrap_or_else(PoisonError::into_inner).snapshot_delay = Some((under.into(), delay));
    }

    /// How many of the transactions [`FeedSwitch::fail_txns`] asked for are
    /// still to fail.
    pub fn txns_left_to_fail(&self) -> usize {
        self.1.lock().unwrap_or_else(PoisonError::into_inner).left
    }

    pub fn cut(&self) {
        self.0.send_modify(|(on, cuts)| {
            *on = false;
            *cuts += 1;
        });
    }
    pub fn restore(&self) {
        self.0.send_modify(|(on, _)| *on = true);
    }
}

impl<B: Backend> Switched<B> {
    pub fn new(inner: B) -> (Self, FeedSwitch) {
        let (tx, rx) = tokio::sync::watch::channel((true, 0));
        let failing = Arc::new(Mutex::new(Failing::default()));
        (Self { inner, on: rx, failing: failing.clone() }, FeedSwitch(Arc::new(tx), failing))
    }

    fn fails(&self, txn: &Txn) -> bool {
        self.failing.lock().unwrap_or_else(PoisonError::into_inner).take(txn)
    }
}

fn failed_by_the_test() -> Error {
    Error::Unavailable("transaction failed by the test".into())
}

#[async_trait]
impl<B: Backend> Backend for Switched<B> {
    async fn get(&self, key: &str) -> Result<(Option<KeyValue>, Revision)> {
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> Result<ListPage> {
        self.inner.list(prefix, start_after, limit).await
    }
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision> {
        self.inner.create(key, value).await
    }
    async fn update(&self, key: &str, value: Vec<u8>, expected: Revision) -> Result<Revision> {
        self.inner.update(key, value, expected).await
    }
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Revision> {
        self.inner.delete(key, expected).await
    }
    async fn revision(&self) -> Result<Revision> {
        self.inner.revision().await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        if self.fails(&txn) {
            return Err(failed_by_the_test());
        }
        self.inner.txn(txn).await
    }
    /// The failing ones answer alone; the others still go as one group.
    async fn txn_group(&self, txns: Vec<Txn>, started: std::time::Instant) -> Vec<Result<TxnResponse>> {
        let failed: Vec<bool> = txns.iter().map(|t| self.fails(t)).collect();
        let sent: Vec<Txn> = txns.into_iter().zip(&failed).filter(|(_, f)| !**f).map(|(t, _)| t).collect();
        let answers = if sent.is_empty() { Vec::new() } else { self.inner.txn_group(sent, started).await };
        let mut answers = answers.into_iter();
        failed
            .into_iter()
            .map(|f| {
                if f { Err(failed_by_the_test()) } else { answers.next().unwrap_or_else(|| Err(failed_by_the_test())) }
            })
            .collect()
    }
    fn group_limits(&self) -> (usize, usize) {
        self.inner.group_limits()
    }
    async fn snapshot(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
        let delay = match &self.failing.lock().unwrap_or_else(PoisonError::into_inner).snapshot_delay {
            Some((under, delay)) if prefix.starts_with(under.as_str()) => *delay,
            _ => Duration::ZERO,
        };
        tokio::time::sleep(delay).await;
        self.inner.snapshot(prefix).await
    }
    async fn snapshot_many(&self, prefixes: &[String]) -> Result<(Vec<Vec<KeyValue>>, Revision)> {
        self.inner.snapshot_many(prefixes).await
    }
    async fn changes(&self, prefix: &str, from: Revision) -> Result<ChangeStream> {
        let (on, epoch) = *self.on.borrow();
        if !on {
            return Err(Error::Unavailable("feed cut by the test".into()));
        }
        let feed = self.inner.changes(prefix, from).await?;
        let mut on = self.on.clone();
        let cut = async move {
            let _ = on.wait_for(|(_, cuts)| *cuts != epoch).await;
        };
        Ok(Box::pin(feed.take_until(cut)))
    }
    fn job_locker(&self) -> Option<Arc<dyn JobLocker>> {
        self.inner.job_locker()
    }
    fn leases(&self) -> Option<Arc<dyn Leases>> {
        self.inner.leases()
    }
    fn round_trips(&self) -> Option<u64> {
        self.inner.round_trips()
    }
}

/// Applies watcher events to `view` until `done` holds; a re-list replaces
/// the view at `InitDone`. Returns how many re-lists were seen.
pub async fn follow_until(
    watcher: &mut BoxStream<'static, WatcherEvent>,
    view: &mut BTreeMap<String, Vec<u8>>,
    done: impl Fn(&BTreeMap<String, Vec<u8>>) -> bool,
) -> usize {
    let mut relists = 0;
    let mut listing: Option<BTreeMap<String, Vec<u8>>> = None;
    while listing.is_some() || !done(view) {
        match next_change(watcher).await {
            WatcherEvent::Init => listing = Some(BTreeMap::new()),
            WatcherEvent::InitApply(kv) => {
                listing.as_mut().expect("InitApply inside a list").insert(kv.key, kv.value);
            }
            WatcherEvent::InitDone { .. } => {
                *view = listing.take().expect("InitDone after Init");
                relists += 1;
            }
            WatcherEvent::Apply(kv) => {
                view.insert(kv.key, kv.value);
            }
            WatcherEvent::Delete { key, .. } => {
                view.remove(&key);
            }
            WatcherEvent::Progress { .. } => {}
        }
    }
    relists
}

/// Across a lost feed the watcher resumes where it was (no re-list, no
/// event twice); when the history of the gap is gone as well
/// (`lose_history`: an etcd compaction, a trimmed local log) it re-lists,
/// and the keys deleted in the gap are absent from the new list.
pub async fn watcher_resumes_or_relists_across_outages<F, Fut>(store: &Store, switch: &FeedSwitch, lose_history: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let prefix = "/conformance/watcher/outage/";
    for i in 0..6 {
        store.create(&format!("{prefix}{i}"), b"v".to_vec()).await.expect("create");
    }
    let mut watcher = store.watcher(prefix);
    let mut view = BTreeMap::new();
    let relists = follow_until(&mut watcher, &mut view, |v| v.len() == 6).await;
    assert_eq!(relists, 1);

    // An outage the history covers: resumed, changes delivered as events.
    switch.cut();
    store.delete(&format!("{prefix}0"), None).await.expect("delete");
    store.create(&format!("{prefix}new"), b"n".to_vec()).await.expect("create");
    switch.restore();
    let relists = follow_until(&mut watcher, &mut view, |v| v.contains_key(&format!("{prefix}new"))).await;
    assert_eq!(relists, 0, "a resumable outage must not re-list");
    assert!(!view.contains_key(&format!("{prefix}0")));

    // An outage whose history is lost: re-listed; the gap's deletes show.
    switch.cut();
    for i in 1..4 {
        store.delete(&format!("{prefix}{i}"), None).await.expect("delete");
    }
    store.create(&format!("{prefix}late"), b"l".to_vec()).await.expect("create");
    lose_history().await;
    switch.restore();
    let relists = follow_until(&mut watcher, &mut view, |v| v.contains_key(&format!("{prefix}late"))).await;
    assert_eq!(relists, 1, "lost history means one re-list");
    let want: Vec<String> = ["4", "5", "late", "new"].iter().map(|k| format!("{prefix}{k}")).collect();
    assert_eq!(view.keys().cloned().collect::<Vec<_>>(), want, "keys deleted in the gap are gone from the view");

    // And it carries on watching.
    store.create(&format!("{prefix}after"), b"a".to_vec()).await.expect("create");
    match next_change(&mut watcher).await {
        WatcherEvent::Apply(kv) => assert_eq!(kv.key, format!("{prefix}after")),
        other => panic!("expected the put after the re-list, got {other:?}"),
    }
}

/// The next event of `watcher` within [`WAIT`], `Progress` included.
pub async fn next_event_or_progress(watcher: &mut BoxStream<'static, WatcherEvent>) -> WatcherEvent {
    tokio::time::timeout(WAIT, watcher.next()).await.expect("a watcher event in time").expect("the watcher ended")
}

/// A watcher's list that takes longer than the store's request timeout (a
/// million subscriptions do) still lists: the list is bounded by each of
/// its reads, not as a whole, so a large prefix is never unlistable.
pub async fn a_list_longer_than_the_request_timeout_still_lists(store: Store, switch: &FeedSwitch) {
    let timeout = Duration::from_millis(200);
    let store = store.with_request_timeout(timeout);
    for i in 0..3 {
        store.create(&format!("/long/{i}"), b"v".to_vec()).await.expect("create");
    }
    switch.delay_snapshots("", timeout * 3);
    let mut watcher = store.watcher("/long/");
    let mut view = BTreeMap::new();
    let listed = tokio::time::timeout(Duration::from_secs(30), follow_until(&mut watcher, &mut view, |v| v.len() == 3));
    assert!(listed.await.is_ok(), "a list three request timeouts long never completed");
    switch.delay_snapshots("", Duration::ZERO);
    store.create("/long/after", b"v".to_vec()).await.expect("create");
    follow_until(&mut watcher, &mut view, |v| v.contains_key("/long/after")).await;
}
