//! `--watch --until-synced` against a real server and reconciler.

use std::time::Duration;

use crate::common::server::Kayra;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_synced_returns_once_a_subscription_converges() {
    let kayra = Kayra::with_reconciler().await;
    let cli = &kayra.cli;
    kayra.register("core", "compute.example.com", "compute", "").await;
    kayra.register("sre", "dev.example.com", "dev", "").await;
    cli.run(&["create", "catalog", "-n", "core", "subscriptions", "compute.example.com"]).await.ok();
    cli.run(&["create", "catalog", "-n", "sre", "subscriptions", "compute.example.com"]).await.ok();

    let sub = ["get", "catalog", "-n", "core", "subscriptions", "compute.example.com"];
    let run = cli.run(&[&sub[..], &["--until-synced", "--interval", "50ms", "--timeout", "30s"]].concat()).await.ok();
    // Printed as a table whenever it changed; the last row is synced.
    let last = run.stdout.lines().last().unwrap();
    assert!(last.starts_with("compute.example.com   true     success"), "{run:#?}");
    assert!(last.ends_with("true"), "{run:#?}");

    // The registration's status, until every subscriber is synced.
    let status = ["get", "catalog", "apiregistrations", "compute.example.com/status", "--until-synced"];
    let run = cli.run(&[&status[..], &["--interval", "50ms", "-o", "json"]].concat()).await.ok();
    let last: serde_json::Value = serde_json::Deserializer::from_str(&run.stdout)
        .into_iter()
        .last()
        .expect("at least one status")
        .expect("JSON documents");
    assert_eq!((last["synced"].as_u64(), last["total"].as_u64()), (Some(2), Some(2)), "{run:#?}");

    // Bump the SyncID: everyone is behind, then everyone catches up again.
    cli.run(&["update", "catalog", "apiregistrations", "compute.example.com/sync"]).await.ok();
    let run = cli.run(&[&status[..], &["--interval", "50ms"]].concat()).await.ok();
    assert!(run.stdout.trim_end().lines().last().unwrap().starts_with("2/2 synced to "), "{run:#?}");

    // A list of subscriptions waits for all of them.
    let list = ["get", "catalog", "-n", "sre", "subscriptions", "--until-synced", "--interval", "50ms"];
    cli.run(&list).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_synced_times_out_without_a_reconciler() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    kayra.register("core", "compute.example.com", "compute", "").await;
    cli.run(&["create", "catalog", "-n", "core", "subscriptions", "compute.example.com"]).await.ok();
    let args = [
        "get",
        "catalog",
        "-n",
        "core",
        "subscriptions",
        "compute.example.com",
        "--until-synced",
        "--interval",
        "50ms",
        "--timeout",
        "500ms",
    ];
    let run = cli.run(&args).await.expect_code(3);
    assert_eq!(run.stderr, "error: not synced after 0.5s\n");
    // The state was shown once, since it never changed.
    assert_eq!(run.stdout.lines().count(), 2, "{run:#?}");

    // Something without a synced field cannot be waited for.
    let run = cli.run(&["get", "catalog", "namespaces", "core", "--until-synced"]).await.expect_code(1);
    assert!(run.stderr.contains("no `synced` field"), "{run:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_change_until_interrupted() {
    use std::os::unix::process::ExitStatusExt;

    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    kayra.register("core", "compute.example.com", "compute", "").await;
    cli.run(&["create", "catalog", "-n", "core", "subscriptions", "compute.example.com"]).await.ok();

    let mut watch = cli.spawn(&["get", "catalog", "-n", "core", "subscriptions", "compute.example.com", "--watch"]);
    let patience = Duration::from_secs(15);

    // The header once, then a row per event, the event's type first.
    assert!(watch.next_line(patience).await.starts_with("EVENT      API "));
    let first = watch.next_line(patience).await;
    assert!(first.starts_with("ADDED      compute.example.com   false    init"), "{first}");
    // A new expected SyncID is a change of the subscription: one more row.
    cli.run(&["patch", "catalog", "apiregistrations", "compute.example.com", "-d", "sync_id: moved-on"]).await.ok();
    let second = watch.next_line(patience).await;
    assert!(second.starts_with("MODIFIED   compute.example.com"), "{second}");
    assert!(second.contains("moved-on"), "{second}");

    let status = watch.interrupt().await;
    assert_eq!(status.signal(), Some(2), "{status:?}");
}
