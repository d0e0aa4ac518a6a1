//! Bounds on what a backend's answer can do to the shared store (platform
//! §17): an output over `reconciler.max_output_bytes` fails its step, and
//! the decision ends in `state: error` after its one retry instead of
//! looping; output values, errors and endpoints are cut to 1 KiB in run
//! records and log lines, so a tenant re-syncing against a backend that
//! answers a megabyte cannot fill etcd's quota (nor a log line grow with
//! the answer); and a result the store refuses is recorded once as a
//! failed run without its outputs, never looping.

mod common;

use std::time::Duration;

use common::backend::{TestBackend, noise};
use common::{Kind, Seed, eventually, logs, start_reconciler, store};
use kayra_catalog::repo::Repository;
use kayra_config::ReconcilerConfig;
use kayra_core::{Run, RunResult, SubscriptionState};
use kayra_store::Store;
use serde_json::Value;

const API: &str = "compute.example.com";

/// A mode `api` of one POST to `endpoint` keeping `outputs` (name → path).
fn config(endpoint: &str, outputs: &[(&str, &str)], max_output_bytes: usize) -> ReconcilerConfig {
    let outputs: String = outputs.iter().map(|(name, path)| format!("    {name}: {path}\n")).collect();
    let yaml = format!("- method: post\n  endpoint: \"{endpoint}\"\n  timeout: 30s\n  outputs:\n{outputs}");
    let mut cfg = ReconcilerConfig { max_output_bytes, ..Default::default() };
    cfg.mode.insert("api".into(), serde_norway::from_str(&yaml).unwrap());
    cfg
}

/// The subscription's runs, oldest first.
async fn runs(repo: &Repository, ns: &str) -> Vec<Run> {
    let mut runs = repo.runs_page(ns, API, None, 0).await.unwrap().items;
    runs.reverse();
    runs
}

/// Waits until the subscription has given up in `state: error` after
/// `calls` backend calls, then checks that no further call comes: the
/// decision does not loop (the pause is the negative check's only
/// measure; every store retry in the reconciler is shorter).
async fn gives_up_after(seed: &Seed<'_>, backend: &TestBackend, ns: &str, calls: usize) {
    eventually("state: error", || async { seed.get(ns, API).await.state == SubscriptionState::Error }).await;
    eventually("the retry's run", || async { runs(seed.0, ns).await.len() >= calls }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(backend.count("/"), calls, "the run and its one retry, then nothing: {:?}", backend.calls());
}

async fn an_outsized_output_fails_its_step_and_the_decision_gives_up(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    // 1.6 MB, past the default 64 KiB (and past etcd's request limit).
    let cfg = config(&format!("{}/big/1600000/x", backend.base), &[("ID", ".id")], 65536);
    seed.registration(API, "api", "s1").await;
    let running = start_reconciler(&repo, cfg);
    seed.subscription("core", API).await;
    gives_up_after(&seed, &backend, "core", 2).await;
    let runs = runs(&repo, "core").await;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    for run in &runs {
        assert_eq!(run.result, RunResult::Error);
        assert!(
            run.error.contains("output ID is 1600000 bytes, over reconciler.max_output_bytes (65536)"),
            "{}",
            run.error
        );
        assert!(run.steps[0].outputs.is_empty(), "no output of the failed step is kept");
    }
    assert!(!seed.get("core", API).await.active, "never synced");
    running.stop().await;
}

async fn outputs_are_cut_to_a_kibibyte_in_run_records(kind: Kind) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let cfg = config(&format!("{}/big/5000/x", backend.base), &[("ID", ".id")], 1 << 20);
    seed.registration(API, "api", "s1").await;
    let running = start_reconciler(&repo, cfg);
    seed.subscription("core", API).await;
    eventually("synced", || async { seed.get("core", API).await.is_synced("s1") }).await;
    let runs = runs(&repo, "core").await;
    assert_eq!(runs[0].result, RunResult::Success);
    let shown = &runs[0].steps[0].outputs["ID"];
    assert_eq!(shown, &format!("{}…(5000 bytes)", noise(1024, 1)));
    running.stop().await;
}

/// A backend's long answer, in every place §17 cuts it: a 5,000-byte
/// output (step 0), the endpoint it is pasted into and the 3,000-byte
/// value a `wait` fails on (step 1) are each cut to 1 KiB with
/// `…(N bytes)` in the run record, the run's `error`, the step lines and
/// the `reconcile failed` line.
async fn long_outputs_errors_and_endpoints_are_cut_in_log_lines_and_run_errors(kind: Kind) {
    logs::capture(logs::Format::Json);
    let ns = match kind {
        Kind::Local => "cut-logs-local",
        Kind::Etcd => "cut-logs-etcd",
    };
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let (output, failure) = (noise(5000, 1), noise(3000, 1));
    let yaml = format!(
        "- method: post\n  endpoint: \"{base}/big/5000/x\"\n  outputs: {{ID: .id}}\n\
         - method: get\n  endpoint: \"{base}/big/3000/{{{{ .Previous.Outputs.ID }}}}\"\n  timeout: 30s\n\
         \x20 wait: [{{key: .id, successes: [done], failures: [\"{failure}\"]}}]\n",
        base = backend.base
    );
    let mut cfg = ReconcilerConfig { max_output_bytes: 1 << 20, ..Default::default() };
    cfg.mode.insert("api".into(), serde_norway::from_str(&yaml).unwrap());
    seed.registration(API, "api", "s1").await;
    let running = start_reconciler(&repo, cfg);
    seed.subscription(ns, API).await;
    eventually("state: error", || async { seed.get(ns, API).await.state == SubscriptionState::Error }).await;
    eventually("the retry's run", || async { runs(&repo, ns).await.len() >= 2 }).await;
    running.stop().await;
    assert_eq!(backend.count("/"), 4, "two steps in the run and in its retry: {:?}", backend.calls().len());

    // What each place must show: the first 1024 bytes and the whole length.
    let cut = |whole: &str| format!("{}…({} bytes)", &whole[..1024], whole.len());
    let output_shown = cut(&output);
    let endpoint_shown = cut(&format!("{}/big/3000/{output}", backend.base));
    let error_shown = cut(&format!("step 1: wait condition .id is \"{failure}\", one of its failures"));
    let runs = runs(&repo, ns).await;
    assert_eq!(runs.len(), 2, "the run and its retry: {runs:#?}");
    for run in &runs {
        assert_eq!(run.result, RunResult::Error);
        assert_eq!(run.error, error_shown);
        assert_eq!(run.steps[0].outputs["ID"], output_shown);
        assert_eq!(run.steps[1].endpoint, endpoint_shown);
        assert_eq!(run.steps[1].error, error_shown);
    }

    // The log lines of this subscription's reconciles.
    let lines: Vec<Value> =
        log_lines().into_iter().filter(|line| line["span"]["namespace"] == ns || line["namespace"] == ns).collect();
    let text = || lines.iter().map(Value::to_string).collect::<Vec<_>>().join("\n");
    let longest = lines.iter().map(|line| line.to_string().len()).max().unwrap_or(0);
    assert!(longest < 4096, "a line of {longest} bytes: {}", text());
    let steps = |step: u64| lines.iter().filter(move |l| l["step"] == step && l.get("attempts").is_some());
    assert_eq!(steps(0).count(), 2, "step 0's line in the run and its retry: {}", text());
    for line in steps(0) {
        let outputs: Value = serde_json::from_str(line["outputs"].as_str().unwrap()).unwrap();
        assert_eq!(outputs["ID"], output_shown, "{line}");
    }
    assert_eq!(steps(1).count(), 2, "step 1's line in the run and its retry: {}", text());
    for line in steps(1) {
        assert_eq!(line["endpoint"], endpoint_shown, "{line}");
        assert_eq!(line["error"], error_shown, "{line}");
    }
    let failed: Vec<&Value> = lines.iter().filter(|l| l["message"] == "reconcile failed").collect();
    assert_eq!(failed.len(), 2, "{}", text());
    for line in failed {
        assert_eq!(line["error"], error_shown, "{line}");
    }
}

/// Every log line of this test binary, as JSON (the event's fields
/// flattened, the current span's under `span`).
fn log_lines() -> Vec<Value> {
    logs::captured().lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// An etcd of `flags` and a store on it.
async fn etcd_with(flags: &[&str]) -> (kayra_testkit::Etcd, Store) {
    let etcd = kayra_testkit::Etcd::start_with(flags).await;
    let store = Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await.unwrap());
    (etcd, store)
}

/// Finding: one tenant re-syncing against a backend answering megabytes
/// filled etcd's quota, and then every tenant's writes failed. With values
/// cut in run records, forty re-syncs of a 1 MB output stay small in an
/// etcd whose quota (16 MiB) forty uncut records would have overrun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_syncs_against_a_megabyte_answer_stay_within_a_small_etcd_quota() {
    let (etcd, store) = etcd_with(&["--quota-backend-bytes", "16777216"]).await;
    let repo = Repository::new(store, "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    let cfg = config(&format!("{}/big/1000000/x", backend.base), &[("ID", ".id")], 1 << 20);
    seed.registration(API, "api", "s1").await;
    let running = start_reconciler(&repo, cfg);
    seed.subscription("core", API).await;
    let mut newest = String::new();
    for round in 1..=40u64 {
        eventually(&format!("run {round}"), || async {
            let sub = seed.get("core", API).await;
            let runs = repo.runs_page("core", API, None, 1).await.unwrap().items;
            let new = runs.first().is_some_and(|run| run.id != newest && run.result == RunResult::Success);
            new && sub.is_synced("s1") && sub.state == SubscriptionState::Success
        })
        .await;
        newest = repo.runs_page("core", API, None, 1).await.unwrap().items[0].id.clone();
        if round < 40 {
            seed.force_resync("core", API).await;
        }
    }
    let mut client = etcd.client().await;
    let alarms = client.alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None).await.unwrap();
    assert!(alarms.alarms().is_empty(), "no NOSPACE alarm: {} raised", alarms.alarms().len());
    let size = client.status().await.unwrap().db_size();
    assert!(size < 8 << 20, "etcd holds {size} bytes after 40 re-syncs of a 1 MB output");
    for run in runs(&repo, "core").await {
        assert!(serde_json::to_vec(&run).unwrap().len() <= kayra_core::runs::MAX_RUN_RECORD_BYTES);
    }
    running.stop().await;
}

/// A result etcd refuses (here: over a `--max-request-bytes` of 2 KiB) is
/// recorded once as a failed run without its outputs; the retry does the
/// same and the decision gives up: two calls, never a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_store_refuses_is_recorded_as_a_failure_without_outputs() {
    let (_etcd, store) = etcd_with(&["--max-request-bytes", "2048"]).await;
    let repo = Repository::new(store, "dev", "local");
    let (seed, backend) = (Seed(&repo), TestBackend::start().await);
    // Four outputs of 3000 bytes that do not compress, each cut to 1 KiB:
    // a record of about 3 KiB even deflated.
    let outputs = [("ID", ".id"), ("A", ".a"), ("B", ".b"), ("C", ".c")];
    let cfg = config(&format!("{}/wide/3000/x", backend.base), &outputs, 1 << 20);
    seed.registration(API, "api", "s1").await;
    let running = start_reconciler(&repo, cfg);
    seed.subscription("core", API).await;
    gives_up_after(&seed, &backend, "core", 2).await;
    let runs = runs(&repo, "core").await;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    for run in &runs {
        assert_eq!(run.result, RunResult::Error);
        assert!(run.error.starts_with("the result could not be recorded: "), "{}", run.error);
        assert!(run.error.contains("too large"), "{}", run.error);
        assert!(run.steps[0].outputs.is_empty());
        assert_eq!(run.steps[0].status, 200, "the step itself succeeded");
    }
    running.stop().await;
}

both_backends!(
    an_outsized_output_fails_its_step_and_the_decision_gives_up,
    outputs_are_cut_to_a_kibibyte_in_run_records,
    long_outputs_errors_and_endpoints_are_cut_in_log_lines_and_run_errors
);
