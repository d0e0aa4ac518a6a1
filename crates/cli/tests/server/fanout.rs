//! The CLI's view of what the reconciler does (platform §9): `get --watch`
//! on the server's watch stream, read incrementally from the running
//! child; `update ... NAME/sync --wait` and its exit statuses 0 / 1 / 3
//! with the counts it shows; a subscription's runs as a table, one run as
//! YAML with its steps. The reconciler is played by writing subscription
//! states and run records into the store directly.

use std::time::Duration;

use kayra_catalog::repo::{Repository, ResultWrite, Versioned};
use kayra_core::{Run, RunResult, Subscription, SubscriptionState};

use crate::common::server::Kayra;

const API: &str = "compute.example.com";

/// Plays the reconciler: once the registration's SyncID differs from
/// `before`, marks each namespace synced to it, or failed when listed in
/// `failing`.
fn reconcile_after_bump(repo: Repository, before: String, namespaces: &[&str], failing: &[&str]) {
    let namespaces: Vec<String> = namespaces.iter().map(|s| s.to_string()).collect();
    let failing: Vec<String> = failing.iter().map(|s| s.to_string()).collect();
    tokio::spawn(async move {
        let sync_id = loop {
            let reg = repo.get_registration(API).await.unwrap().unwrap().value;
            if reg.sync_id != before {
                break reg.sync_id;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for ns in &namespaces {
            let seen = repo.get_subscription(ns, API).await.unwrap().unwrap();
            if failing.contains(ns) {
                record_result(&repo, &seen, None).await;
            } else {
                record_result(&repo, &seen, Some(&sync_id)).await;
            }
        }
    });
}

/// Records a reconcile result on `seen` as the reconciler's result write
/// does (without a run record): synced to `sync_id`, or with `None` failed.
async fn record_result(repo: &Repository, seen: &Versioned<Subscription>, sync_id: Option<&str>) {
    let mut next = seen.value.clone();
    match sync_id {
        Some(sync_id) => {
            next.active = true;
            next.state = SubscriptionState::Success;
            next.current_sync_id = sync_id.into();
        }
        None => next.state = SubscriptionState::Error,
    }
    if next != seen.value {
        let write = ResultWrite { seen, next: Some(&next), clear_runs: false, lock: None, unlock: false, fanout: None };
        repo.write_result(&write, &[]).await.expect("record the result");
    }
}

/// A registration and `namespaces` subscribed to it, synced to its SyncID.
async fn fan_out(kayra: &Kayra, namespaces: &[&str]) -> String {
    kayra.register(namespaces[0], API, "compute", "").await;
    for ns in namespaces {
        kayra.cli.run(&["create", "catalog", "namespaces", ns]).await;
        kayra.cli.run(&["create", "catalog", "-n", ns, "subscriptions", API]).await.ok();
    }
    let sync_id = kayra.repo.get_registration(API).await.unwrap().unwrap().value.sync_id;
    for ns in namespaces {
        let seen = kayra.repo.get_subscription(ns, API).await.unwrap().unwrap();
        record_result(&kayra.repo, &seen, Some(&sync_id)).await;
    }
    sync_id
}

const WAIT: [&str; 7] = ["update", "catalog", "apiregistrations", "compute.example.com/sync", "-d", "{}", "--wait"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_0_once_every_subscriber_is_synced() {
    let kayra = Kayra::start().await;
    let before = fan_out(&kayra, &["core", "sre", "web"]).await;
    reconcile_after_bump(kayra.repo.clone(), before, &["core", "sre", "web"], &[]);
    let run = kayra.cli.run(&[&WAIT[..], &["--timeout", "30s"]].concat()).await.ok();
    // Plain lines (stdout is not a terminal), one per change of the counts.
    let last = run.stdout.lines().last().unwrap_or_default();
    assert_eq!(last, "3/3 synced, 0 failed, 0 pending", "{run:#?}");
    assert!(run.stderr.contains("sync_id is now"), "{run:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_1_when_any_subscriber_failed() {
    let kayra = Kayra::start().await;
    let before = fan_out(&kayra, &["core", "sre", "web"]).await;
    reconcile_after_bump(kayra.repo.clone(), before, &["core", "sre", "web"], &["sre"]);
    let run = kayra.cli.run(&[&WAIT[..], &["--timeout", "30s"]].concat()).await.expect_code(1);
    assert_eq!(run.stdout.lines().last(), Some("2/3 synced, 1 failed, 0 pending"), "{run:#?}");
    assert!(run.stderr.contains("1 of 3 subscribers failed") && run.stderr.contains("sre"), "{run:#?}");

    // A refused PUT is 1 too, and --wait fits only NAME/sync.
    let missing = ["update", "catalog", "apiregistrations", "missing.example.com/sync", "--wait"];
    let run = kayra.cli.run(&missing).await.expect_code(1);
    assert!(run.stderr.contains("missing.example.com"), "{run:#?}");
    let wrong = ["update", "catalog", "namespaces", "core", "-d", "{}", "--wait"];
    let run = kayra.cli.run(&wrong).await.expect_code(1);
    assert!(run.stderr.contains("--wait"), "{run:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_3_on_timeout_with_the_counts() {
    let kayra = Kayra::start().await;
    fan_out(&kayra, &["core", "sre"]).await;
    // Nobody reconciles: everyone stays pending.
    let run = kayra.cli.run(&[&WAIT[..], &["--timeout", "1s"]].concat()).await.expect_code(3);
    assert_eq!(run.stdout.lines().last(), Some("0/2 synced, 0 failed, 2 pending"), "{run:#?}");
    assert!(run.stderr.contains("not every subscriber synced after 1s: 0/2 synced"), "{run:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_prints_a_row_per_event_as_it_comes() {
    use std::os::unix::process::ExitStatusExt;

    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    cli.run(&["create", "catalog", "namespaces", "core"]).await.ok();
    let mut watch = cli.spawn(&["get", "catalog", "namespaces", "--watch"]);
    let patience = Duration::from_secs(15);
    assert!(watch.next_line(patience).await.starts_with("EVENT      NAME "));
    assert!(watch.next_line(patience).await.starts_with("ADDED      core "));
    // Each change shows while the command is still running.
    cli.run(&["create", "catalog", "namespaces", "web"]).await.ok();
    assert!(watch.next_line(patience).await.starts_with("ADDED      web "));
    cli.run(&["patch", "catalog", "namespaces", "web", "-d", "description: second"]).await.ok();
    let modified = watch.next_line(patience).await;
    assert!(modified.starts_with("MODIFIED   web ") && modified.ends_with("second"), "{modified}");
    cli.run(&["delete", "catalog", "namespaces", "web"]).await.ok();
    assert!(watch.next_line(patience).await.starts_with("DELETED    web "));

    let status = watch.interrupt().await;
    assert_eq!(status.signal(), Some(2), "{status:?}");

    // JSON: one event a line.
    let mut watch = cli.spawn(&["get", "catalog", "namespaces", "core", "--watch", "-o", "json"]);
    let line = watch.next_line(patience).await;
    let event: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!((event["type"].as_str(), event["object"]["name"].as_str()), (Some("ADDED"), Some("core")));
}

fn run_record(n: u64, result: RunResult) -> Run {
    kayra_testkit::fixtures::run("core", API, n, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_show_as_a_table_and_one_run_as_yaml() {
    let kayra = Kayra::start().await;
    fan_out(&kayra, &["core"]).await;
    let none = kayra.cli.run(&["get", "catalog", "-n", "core", "subscriptions", &format!("{API}/runs")]).await.ok();
    assert_eq!(
        (none.stdout.as_str(), none.stderr.as_str()),
        ("", "No runs found for the subscription of namespace core to compute.example.com.\n")
    );
    for (n, result) in [(1, RunResult::Success), (2, RunResult::Error)] {
        kayra.repo.add_run(&run_record(n, result), 20).await.unwrap();
    }
    let run = kayra.cli.run(&["get", "catalog", "-n", "core", "subscriptions", &format!("{API}/runs")]).await.ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split("   ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(header, ["ID", "TRIGGER", "SYNC ID", "RESULT", "STARTED", "DURATION", "STEPS"], "{run:#?}");
    // Newest first.
    let newest: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        newest,
        [
            run_record(2, RunResult::Error).id.as_str(),
            "ongoing",
            "s2",
            "error",
            "2026-02-01T00:00:03.200Z",
            "1.7s",
            "1"
        ]
    );
    assert!(lines[2].starts_with(&run_record(1, RunResult::Success).id), "{run:#?}");

    let id = run_record(2, RunResult::Error).id;
    let one = ["get", "catalog", "-n", "core", "subscriptions", &format!("{API}/runs/{id}"), "-o", "yaml"];
    let run = kayra.cli.run(&one).await.ok();
    let yaml: serde_json::Value = serde_norway::from_str(&run.stdout).unwrap();
    assert_eq!(yaml["id"], id.as_str());
    assert_eq!(yaml["steps"][0]["endpoint"], "https://compute.local/api/v1/namespaces/core/sync");
    assert_eq!(yaml["steps"][0]["status"], 500);
    assert_eq!(yaml["steps"][0]["outputs"]["JobID"], "77");
}
