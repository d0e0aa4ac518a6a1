//! A registration's rollout through the CLI (platform §12): `get … NAME/rollout`
//! as a table of its waves, `-o json` as the object, actions through
//! `update … NAME/rollout -d`, and `--wait` on a `/sync` showing the
//! current wave and exiting 4 when the rollout pauses. The reconcilers are
//! played by writing the rollout record into the store directly.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use kayra_catalog::repo::{Repository, ResultWrite};
use kayra_core::SubscriptionState;
use kayra_core::rollout::{Action, RolloutPolicy, RolloutRecord, assign};

use crate::common::server::Kayra;

const API: &str = "compute.example.com";
const POLICY: &str =
    r#"{"rollout": {"waves": [{"name": "canary", "size": "1"}, {"name": "rest", "approval": "manual"}]}}"#;

/// A registration with a two-wave policy and `namespaces` subscribed,
/// synced to its SyncID (returned).
async fn with_policy(kayra: &Kayra, namespaces: &[&str]) -> String {
    kayra.register(namespaces[0], API, "compute", "").await;
    kayra.cli.run(&["patch", "catalog", "apiregistrations", API, "-d", POLICY]).await.ok();
    let sync_id = kayra.repo.get_registration(API).await.unwrap().unwrap().value.sync_id;
    for ns in namespaces {
        kayra.cli.run(&["create", "catalog", "namespaces", ns]).await;
        kayra.cli.run(&["create", "catalog", "-n", ns, "subscriptions", API]).await.ok();
        let seen = kayra.repo.get_subscription(ns, API).await.unwrap().unwrap();
        let mut next = seen.value.clone();
        (next.active, next.state, next.current_sync_id) = (true, SubscriptionState::Success, sync_id.clone());
        let write =
            ResultWrite { seen: &seen, next: Some(&next), clear_runs: false, lock: None, unlock: false, fanout: None };
        kayra.repo.write_result(&write, &[]).await.unwrap();
    }
    sync_id
}

/// Starts the rollout toward `sync_id` over `namespaces`, as a reconciler would.
async fn start(repo: &Repository, sync_id: &str, namespaces: &[&str]) -> RolloutRecord {
    let policy: RolloutPolicy = repo.get_registration(API).await.unwrap().unwrap().value.rollout.expect("a policy");
    let subscribers: Vec<(String, BTreeMap<String, String>)> =
        namespaces.iter().map(|ns| (ns.to_string(), BTreeMap::new())).collect();
    let (record, _) = RolloutRecord::start(API, sync_id, &policy, assign(&policy, &subscribers), SystemTime::now());
    let seen = repo.rollout(API).await.unwrap().map(|r| r.revision);
    repo.write_rollout(API, seen, &record, &[]).await.unwrap().expect("written");
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_prints_as_a_table_of_its_waves_and_takes_actions() {
    let kayra = Kayra::start().await;
    let sync_id = with_policy(&kayra, &["core", "sre", "web"]).await;
    let get = ["get", "catalog", "apiregistrations", "compute.example.com/rollout"];
    let run = kayra.cli.run(&get).await.expect_code(1);
    assert!(run.stderr.contains("no rollout"), "{run:#?}");
    start(&kayra.repo, &sync_id, &["core", "sre", "web"]).await;

    let run = kayra.cli.run(&get).await.ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    let words = |line: &str| line.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(words(lines[0]), ["WAVE", "STATE", "SYNCED", "FAILED", "PENDING", "TOTAL", "STARTED"], "{run:#?}");
    assert_eq!(words(lines[1])[..6], ["canary", "progressing", "0", "0", "1", "1"], "{run:#?}");
    assert_eq!(words(lines[2]), ["rest", "pending", "0", "0", "2", "2", "-"], "{run:#?}");
    assert_eq!(lines[3], format!("rollout to {sync_id} (compute.example.com): progressing at wave 1/2 canary"));

    let json = kayra.cli.run(&[&get[..], &["-o", "json"]].concat()).await.ok().json();
    assert_eq!((&json["state"], json["waves"].as_array().map(Vec::len)), (&serde_json::json!("progressing"), Some(2)));

    // Actions go through `update`; the answer is the rollout.
    let pause = [
        "update",
        "catalog",
        "apiregistrations",
        "compute.example.com/rollout",
        "-d",
        r#"{"action": "pause", "reason": "look first"}"#,
    ];
    let paused = kayra.cli.run(&pause).await.ok().json();
    assert_eq!(paused["state"], "paused");
    assert!(paused["reason"].as_str().unwrap().contains(": look first"), "{paused}");
    let run = kayra.cli.run(&get).await.ok();
    assert!(run.stdout.contains("paused at wave 1/2 canary: paused by "), "{run:#?}");
    let run = kayra.cli.run(&pause).await.expect_code(1);
    assert!(run.stderr.contains("paused") && run.stderr.contains("pause"), "{run:#?}");
    let resume = ["update", "catalog", "apiregistrations", "compute.example.com/rollout", "-d", "action: resume"];
    assert_eq!(kayra.cli.run(&resume).await.ok().json()["state"], "progressing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_shows_the_waves_and_exits_4_when_the_rollout_pauses() {
    let kayra = Kayra::start().await;
    let before = with_policy(&kayra, &["core", "sre"]).await;
    // The reconcilers: once the SyncID moves, start the rollout, then a
    // failed canary pauses it.
    let repo = kayra.repo.clone();
    tokio::spawn(async move {
        let sync_id = loop {
            let reg = repo.get_registration(API).await.unwrap().unwrap().value;
            if reg.sync_id != before {
                break reg.sync_id;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut record = start(&repo, &sync_id, &["core", "sre"]).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let seen = repo.rollout(API).await.unwrap().unwrap().revision;
        record.act(Action::Pause, "driver: wave canary failed", SystemTime::now()).unwrap();
        repo.write_rollout(API, Some(seen), &record, &[]).await.unwrap().expect("written");
    });
    let wait =
        ["update", "catalog", "apiregistrations", "compute.example.com/sync", "-d", "{}", "--wait", "--timeout", "30s"];
    let run = kayra.cli.run(&wait).await.expect_code(4);
    assert!(run.stdout.contains("progressing at wave 1/2 canary (wave progressing: 0/1 synced"), "{run:#?}");
    assert!(run.stderr.contains("paused at wave 1/2 canary: paused by driver: wave canary failed"), "{run:#?}");
}
