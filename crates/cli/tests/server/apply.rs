//! `kayra-cli apply -f` against a real server on the local store (platform
//! §15), and `--reason` arriving as `X-Kayra-Reason` (§13).
//!
//! "Nothing written" is read from the store itself: its revision moves with
//! every write, and the server alone (no reconciler) writes nothing else.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use serde_json::{Value, json};

use crate::common::Cli;
use crate::common::server::Kayra;

const EVERY_KIND: &str = "\
kind: Subscription
namespace: core
api: compute.example.com
---
kind: RoleBinding
namespace: core
name: alice-viewer
role: viewer
user: alice
---
kind: ClusterRoleBinding
name: alice-viewer
role: viewer
user: alice
---
kind: ApiRegistration
name: compute.example.com
short_name: compute
mode: noop
sync_id: v1
description: compute for everyone
---
kind: Role
name: viewer
rules:
- resources: [namespaces]
  verbs: [get, list]
---
kind: User
name: alice
description: Alice
---
kind: Namespace
name: core
description: the core team
";

const EVERY_KIND_APPLIED: [&str; 7] = [
    "Namespace/core",
    "User/alice",
    "Role/viewer",
    "ApiRegistration/compute.example.com",
    "ClusterRoleBinding/alice-viewer",
    "RoleBinding/core/alice-viewer",
    "Subscription/core/compute.example.com",
];

fn lines(ids: &[&str], word: &str) -> String {
    ids.iter().map(|id| format!("{id} {word}\n")).collect()
}

async fn revision(kayra: &Kayra) -> i64 {
    kayra.repo.store().revision().await.expect("store revision")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_then_unchanged_then_only_the_changed_object_is_written() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "platform.yaml", EVERY_KIND);

    // Kind order, whatever the file's order; namespaced kinds under their namespace.
    let first = cli.run(&["apply", "-f", &file]).await.ok();
    assert_eq!(first.stdout, lines(&EVERY_KIND_APPLIED, "created"), "{first:#?}");
    let sub = cli.run(&["get", "catalog", "-n", "core", "subscriptions", "compute.example.com"]).await.ok().json();
    assert_eq!(sub["expected_sync_id"], "v1");
    let rb = cli.run(&["get", "catalog", "-n", "core", "rolebindings", "alice-viewer"]).await.ok().json();
    assert_eq!((rb["role"].as_str(), rb["user"].as_str()), (Some("viewer"), Some("alice")));

    // The same again: nothing differs, nothing is written.
    let before = revision(&kayra).await;
    let again = cli.run(&["apply", "-f", &file]).await.ok();
    assert_eq!(again.stdout, lines(&EVERY_KIND_APPLIED, "unchanged"), "{again:#?}");
    assert_eq!(revision(&kayra).await, before, "an unchanged apply wrote");

    // One field changed, and a field left out (the user's description): only
    // the registration is written, with only that field; the rest keep their values.
    let changed = EVERY_KIND
        .replace("description: compute for everyone", "description: compute, reserved")
        .replace("description: Alice\n", "");
    std::fs::write(&file, changed).unwrap();
    let third = cli.run(&["apply", "-f", &file, "--reason", "describe compute"]).await.ok();
    let mut expected = lines(&EVERY_KIND_APPLIED, "unchanged");
    expected = expected
        .replace("ApiRegistration/compute.example.com unchanged", "ApiRegistration/compute.example.com configured");
    assert_eq!(third.stdout, expected, "{third:#?}");
    // One write: the registration, with its audit record in the same
    // transaction (the local store's revision counts both keys), and the
    // reason on that record.
    assert_eq!(revision(&kayra).await, before + 2, "more than the one object was written");
    let audit = cli.run(&["get", "catalog", "audit", "-o", "json"]).await.ok().json();
    let records = audit.get("items").unwrap_or(&audit).as_array().expect("audit records").clone();
    let newest = &records[0];
    assert_eq!(
        (newest["resource"].as_str(), newest["name"].as_str(), newest["reason"].as_str()),
        (Some("apiregistrations"), Some("compute.example.com"), Some("describe compute")),
        "{newest}"
    );
    assert_eq!(newest["after"]["description"], "compute, reserved");
    let reg = cli.run(&["get", "catalog", "apiregistrations", "compute.example.com"]).await.ok().json();
    assert_eq!((reg["description"].as_str(), reg["sync_id"].as_str()), (Some("compute, reserved"), Some("v1")));
    assert_eq!((reg["short_name"].as_str(), reg["mode"].as_str()), (Some("compute"), Some("noop")));
    let alice = cli.run(&["get", "catalog", "users", "alice"]).await.ok().json();
    assert_eq!(alice["description"], "Alice", "a field the document leaves out keeps its value");
    // Apply made no token for the user.
    let tokens = cli.run(&["get", "catalog", "users", "alice/tokens", "-o", "json"]).await.ok().json();
    assert_eq!(tokens["items"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_s_labels_are_the_document_s_whole_map() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    let dir = tempfile::tempdir().unwrap();
    let labelled = "kind: Namespace\nname: core\nlabels:\n  tier: canary\n  example.com/env: prod\n";
    let file = write(dir.path(), "core.yaml", labelled);
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, "Namespace/core created\n");
    let core = cli.run(&["get", "catalog", "namespaces", "core"]).await.ok().json();
    assert_eq!(core["labels"], json!({"tier": "canary", "example.com/env": "prod"}));
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, "Namespace/core unchanged\n");

    // One label changed, one left out: the server ends with exactly the document's.
    write(dir.path(), "core.yaml", "kind: Namespace\nname: core\nlabels:\n  tier: stable\n");
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, "Namespace/core configured\n");
    let core = cli.run(&["get", "catalog", "namespaces", "core"]).await.ok().json();
    assert_eq!(core["labels"], json!({"tier": "stable"}));
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, "Namespace/core unchanged\n");

    // A bad label stops the apply before any request.
    let before = revision(&kayra).await;
    write(dir.path(), "core.yaml", "kind: Namespace\nname: core\nlabels:\n  a/b/c: x\n");
    let refused = cli.run(&["apply", "-f", &file]).await.expect_code(1);
    assert!(refused.stderr.contains("labels") && refused.stderr.contains("a/b/c"), "{refused:#?}");
    assert_eq!(revision(&kayra).await, before);
}

const ROLLOUT: &str = "\
kind: ApiRegistration
name: compute.example.com
mode: noop
rollout:
  waves:
  - name: canary
    selector: {tier: canary}
    size: '2'
    bake: 5m
    gate:
      method: get
      endpoint: 'https://metrics.example.com/ok?api={{ .Rollout.Api }}'
      wait: [{key: .status, successes: [ok], failures: [bad]}]
      timeout: 2m
  - name: rest
    approval: manual
    max_failures: 2%
  progress_deadline: 1h
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_s_rollout_policy_is_created_kept_and_configured() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "compute.yaml", ROLLOUT);
    let id = "ApiRegistration/compute.example.com";
    let get = || async { cli.run(&["get", "catalog", "apiregistrations", "compute.example.com"]).await.ok().json() };

    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, format!("{id} created\n"));
    let policy = get().await["rollout"].clone();
    assert_eq!(policy["waves"][0]["gate"]["timeout"], "2m", "{policy}");
    assert_eq!(
        (policy["waves"][1]["approval"].as_str(), policy["on_failure"].as_str()),
        (Some("manual"), Some("pause"))
    );

    // Unchanged: the server's stored form (defaults spelt out) compares equal; nothing written.
    let before = revision(&kayra).await;
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, format!("{id} unchanged\n"));
    assert_eq!(revision(&kayra).await, before, "an unchanged rollout policy was written");

    // One wave field: configured, the rest of the policy as it was.
    write(dir.path(), "compute.yaml", &ROLLOUT.replace("size: '2'", "size: 10%"));
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, format!("{id} configured\n"));
    let mut want = policy.clone();
    want["waves"][0]["size"] = json!("10%");
    assert_eq!(get().await["rollout"], want);
    let configured = revision(&kayra).await;
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, format!("{id} unchanged\n"));

    // The policy is the document's whole: a key left out goes with it.
    write(
        dir.path(),
        "compute.yaml",
        &ROLLOUT.replace("size: '2'", "size: 10%").replace("  progress_deadline: 1h\n", ""),
    );
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, format!("{id} configured\n"));
    want.as_object_mut().unwrap().remove("progress_deadline");
    assert_eq!(get().await["rollout"], want);
    assert!(revision(&kayra).await > configured);

    // Left out: kept. `null`: removed, and then no policy is unchanged.
    let bare = "kind: ApiRegistration\nname: compute.example.com\nmode: noop\n";
    write(dir.path(), "compute.yaml", bare);
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, format!("{id} unchanged\n"));
    assert_eq!(get().await["rollout"], want);
    write(dir.path(), "compute.yaml", &format!("{bare}rollout: null\n"));
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, format!("{id} configured\n"));
    assert_eq!(get().await.get("rollout"), None, "null removes the policy");
    let before = revision(&kayra).await;
    assert_eq!(cli.run(&["apply", "-f", &file]).await.ok().stdout, format!("{id} unchanged\n"));
    assert_eq!(revision(&kayra).await, before);

    // A bad policy stops the apply before any request, naming file, document and field.
    write(
        dir.path(),
        "compute.yaml",
        &format!("kind: Namespace\nname: core\n---\n{}", ROLLOUT.replace("max_failures: 2%", "max_failures: 200%")),
    );
    let refused = cli.run(&["apply", "-f", &file]).await.expect_code(1);
    assert!(
        refused.stderr.starts_with(&format!("error: {file}: document 2: field `rollout.waves[1].max_failures`: ")),
        "{refused:#?}"
    );
    assert_eq!(revision(&kayra).await, before);
}

/// A registration as `kayra export` writes it (its policy in the stored
/// form, computed fields under `status`, the closing comment) applies, and
/// applies again unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_registration_with_a_rollout_policy_applies() {
    let kayra = Kayra::start().await;
    let exported = "\
# kayra export of platform \"dev\", region \"local\", at store revision 7
---
kind: ApiRegistration
name: compute.example.com
description: ''
endpoint: ''
mode: noop
rollout:
  on_failure: pause
  waves:
  - approval: auto
    name: canary
    size: '1'
  - approval: manual
    name: rest
short_name: ''
sync_id: s1
status:
  platform: dev
  region: local
  sync_id_updated_at: 2026-01-01T00:00:00.000Z
# end of kayra export: 1 documents
";
    let run = |text: &'static str| kayra.cli.run_with_stdin(&["apply", "-f", "-"], Some(text.as_bytes()));
    assert_eq!(run(exported).await.ok().stdout, "ApiRegistration/compute.example.com created\n");
    let before = revision(&kayra).await;
    assert_eq!(run(exported).await.ok().stdout, "ApiRegistration/compute.example.com unchanged\n");
    assert_eq!(revision(&kayra).await, before);
    let reg = kayra.cli.run(&["get", "catalog", "apiregistrations", "compute.example.com"]).await.ok().json();
    assert_eq!(reg["rollout"]["waves"][1], json!({"name": "rest", "approval": "manual"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_in_name_order_kinds_first() {
    let kayra = Kayra::start().await;
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "20-teams.yaml", "kind: Namespace\nname: b\n---\nkind: Namespace\nname: c\n");
    write(
        dir.path(),
        "10-api.json",
        r#"[{"kind": "Subscription", "namespace": "c", "api": "x.example.com"},
            {"kind": "ApiRegistration", "name": "x.example.com", "mode": "noop"},
            {"kind": "Namespace", "name": "a"}]"#,
    );
    write(dir.path(), "README.txt", "not a manifest: {{{");
    write(dir.path(), "30-more.yml", "kind: Namespace\nname: d\n");
    let run = kayra.cli.run(&["apply", "-f", &dir.path().display().to_string()]).await.ok();
    assert_eq!(
        run.stdout,
        "Namespace/a created\nNamespace/b created\nNamespace/c created\nNamespace/d created\n\
         ApiRegistration/x.example.com created\nSubscription/c/x.example.com created\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_document_anywhere_writes_nothing() {
    let kayra = Kayra::start().await;
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", "kind: Namespace\nname: a\n---\nkind: User\nname: u\n");
    let last = write(dir.path(), "b.yaml", "kind: Namespace\nname: b\n---\nkind: Namespace\nname: c\ncolour: blue\n");
    let before = revision(&kayra).await;
    let run = kayra.cli.run(&["apply", "-f", &dir.path().display().to_string()]).await.expect_code(1);
    assert_eq!(run.stdout, "");
    assert!(run.stderr.starts_with(&format!("error: {last}: document 2: unknown field `colour`")), "{run:#?}");
    assert!(run.stderr.contains("nothing was applied"), "{run:#?}");
    assert_eq!(revision(&kayra).await, before);
    let list = kayra.cli.run(&["get", "catalog", "namespaces", "-o", "json"]).await.ok().json();
    assert_eq!(list["items"], json!([]));

    // A duplicate in the set, across files: the same.
    write(dir.path(), "b.yaml", "kind: User\nname: u\n");
    let run = kayra.cli.run(&["apply", "-f", &dir.path().display().to_string()]).await.expect_code(1);
    assert!(run.stderr.contains("document 1: User/u is already in "), "{run:#?}");
    assert_eq!(revision(&kayra).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_object_leaves_the_others_applied_and_exits_1() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    // bob may do anything to namespaces, nothing else.
    let setup = "\
kind: Role
name: namespace-admin
rules: [{resources: [namespaces], verbs: ['*']}]
---
kind: User
name: bob
---
kind: ClusterRoleBinding
name: bob-namespace-admin
role: namespace-admin
user: bob
";
    cli.run_with_stdin(&["apply", "-f", "-"], Some(setup.as_bytes())).await.ok();
    let token = cli.run(&["create", "catalog", "users", "bob/tokens"]).await.ok().json();
    let bob = Cli::new(cli.server.clone(), token["token"].as_str());

    let docs = "kind: Namespace\nname: a\n---\nkind: User\nname: carol\n---\nkind: Namespace\nname: b\n";
    let run = bob.run_with_stdin(&["apply", "-f", "-"], Some(docs.as_bytes())).await.expect_code(1);
    assert_eq!(run.stdout, "Namespace/a created\nNamespace/b created\n", "{run:#?}");
    assert!(run.stderr.starts_with("User/carol failed: Error from server (Forbidden): "), "{run:#?}");
    assert!(run.stderr.contains("bob"), "the server's message names the user: {run:#?}");
    assert!(run.stderr.contains("1 of 3 objects failed"), "{run:#?}");
    cli.run(&["get", "catalog", "namespaces", "b"]).await.ok();
    cli.run(&["get", "catalog", "users", "carol"]).await.expect_code(1);

    let json = bob.run_with_stdin(&["apply", "-f", "-", "-o", "json"], Some(docs.as_bytes())).await.expect_code(1);
    let list = json.json();
    assert_eq!(list[0], json!({"kind": "Namespace", "name": "a", "result": "unchanged"}));
    assert_eq!(list[1]["result"], "unchanged");
    assert_eq!((list[2]["name"].as_str(), list[2]["result"].as_str()), (Some("carol"), Some("failed")));
    assert!(list[2]["error"].as_str().unwrap().contains("Forbidden"), "{json:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_reads_but_writes_nothing() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    let docs = "kind: Namespace\nname: a\ndescription: one\n---\nkind: User\nname: u\n";
    let before = revision(&kayra).await;
    let run = cli.run_with_stdin(&["apply", "-f", "-", "--dry-run"], Some(docs.as_bytes())).await.ok();
    assert_eq!(run.stdout, "Namespace/a created (dry run)\nUser/u created (dry run)\n");
    assert_eq!(revision(&kayra).await, before);
    cli.run(&["get", "catalog", "namespaces", "a"]).await.expect_code(1);

    cli.run_with_stdin(&["apply", "-f", "-"], Some(docs.as_bytes())).await.ok();
    let after = revision(&kayra).await;
    let changed = docs.replace("one", "two");
    let run = cli.run_with_stdin(&["apply", "-f", "-", "--dry-run", "-o", "json"], Some(changed.as_bytes())).await.ok();
    assert_eq!(
        run.json(),
        json!([{"kind": "Namespace", "name": "a", "result": "configured", "dry_run": true},
               {"kind": "User", "name": "u", "result": "unchanged", "dry_run": true}])
    );
    assert_eq!(revision(&kayra).await, after);
    assert_eq!(cli.run(&["get", "catalog", "namespaces", "a"]).await.ok().json()["description"], "one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_anchors_a_json_list_and_stdin() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    let dir = tempfile::tempdir().unwrap();
    let yaml = "\
kind: Role
name: reader
rules:
- resources: &read [namespaces, apiregistrations]
  verbs: &verbs [get, list]
- resources: *read
  apis: [catalog.example.com]
  verbs: *verbs
---
kind: Namespace
<<: {name: merged, description: from a merge key}
";
    let file = write(dir.path(), "anchors.yaml", yaml);
    let list = r#"[{"kind": "Namespace", "name": "core"},
                   {"kind": "RoleBinding", "namespace": "core", "name": "rb", "role": "reader", "user": "admin"}]"#;
    let run = cli.run_with_stdin(&["apply", "-f", &file, "-f", "-", "-o", "json"], Some(list.as_bytes())).await.ok();
    let results: Vec<String> = run
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{} {} {}", e["kind"], e["name"], e["result"]).replace('"', ""))
        .collect();
    assert_eq!(
        results,
        ["Namespace merged created", "Namespace core created", "Role reader created", "RoleBinding rb created"]
    );
    assert_eq!(run.json()[3]["namespace"], "core");
    let role = cli.run(&["get", "catalog", "roles", "reader"]).await.ok().json();
    assert_eq!(
        role["rules"],
        json!([{"apis": ["*"], "resources": ["namespaces", "apiregistrations"], "verbs": ["get", "list"]},
               {"apis": ["catalog.example.com"], "resources": ["namespaces", "apiregistrations"], "verbs": ["get", "list"]}])
    );
    let merged = cli.run(&["get", "catalog", "namespaces", "merged"]).await.ok().json();
    assert_eq!(merged["description"], "from a merge key");
    // A rule without `apis` compares equal to the stored `["*"]`.
    let again = cli.run_with_stdin(&["apply", "-f", &file, "-f", "-"], Some(list.as_bytes())).await.ok();
    assert!(again.stdout.lines().all(|l| l.ends_with(" unchanged")), "{again:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_objects_in_one_run() {
    let kayra = Kayra::start().await;
    let docs: String = (0..1000).map(|i| format!("kind: Namespace\nname: team-{i:04}\n---\n")).collect();
    let started = Instant::now();
    let run = kayra.cli.run_with_stdin(&["apply", "-f", "-"], Some(docs.as_bytes())).await.ok();
    let took = started.elapsed();
    assert_eq!(run.stdout.lines().count(), 1000);
    assert!(run.stdout.lines().all(|l| l.ends_with(" created")));
    assert!(run.stdout.starts_with("Namespace/team-0000 created\nNamespace/team-0001 created\n"));
    assert!(took < Duration::from_secs(30), "1,000 namespaces took {took:?}");
    let list = kayra.cli.run(&["get", "catalog", "namespaces", "-o", "json"]).await.ok().json();
    assert_eq!(list["items"].as_array().unwrap().len(), 1000);
}

/// Hostile documents: random kinds, keys and values. The binary never
/// panics, and when any document is invalid it exits 1 having written
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_documents_never_panic_and_never_write_when_invalid() {
    let kayra = Kayra::start().await;
    let mut runner = TestRunner::new(Config {
        cases: 24,
        rng_seed: RngSeed::Fixed(0x006b_6179_7261),
        failure_persistence: None,
        ..Config::default()
    });
    let mut cases = Vec::new();
    for _ in 0..24 {
        cases.push(hostile_set().new_tree(&mut runner).unwrap().current());
    }
    let mut invalid = 0;
    for docs in cases {
        let text = serde_json::to_string(&docs).unwrap();
        let source = kayra_cli::apply::manifest::Source { name: "stdin".into(), text: text.clone() };
        let valid = kayra_cli::apply::manifest::check(&[source]).is_ok();
        let before = revision(&kayra).await;
        let run = kayra.cli.run_with_stdin(&["apply", "-f", "-"], Some(text.as_bytes())).await;
        assert!(run.code == 0 || run.code == 1, "{text}: {run:#?}");
        assert!(!run.stderr.contains("panicked"), "{text}: {run:#?}");
        assert!(!run.stdout.chars().chain(run.stderr.chars()).any(|c| c.is_control() && c != '\n'), "{run:#?}");
        if !valid {
            invalid += 1;
            assert_eq!(run.code, 1, "{text}: {run:#?}");
            assert_eq!(run.stdout, "", "{text}: {run:#?}");
            assert_eq!(revision(&kayra).await, before, "{text}: an invalid set wrote");
        }
    }
    assert!(invalid > 0, "no case was invalid: the generator tests nothing");
}

/// A JSON list of 1–4 documents, each a kind (real or not) and random keys
/// (real field names or not) with random values, control characters included.
fn hostile_set() -> impl Strategy<Value = Value> {
    let kinds = prop_oneof![
        Just("Namespace".to_string()),
        Just("User".to_string()),
        Just("Role".to_string()),
        Just("ApiRegistration".to_string()),
        Just("RoleBinding".to_string()),
        Just("Subscription".to_string()),
        "[A-Za-z\u{1b}\u{9b}]{0,12}",
    ];
    let keys = prop_oneof![
        Just("name".to_string()),
        Just("namespace".to_string()),
        Just("api".to_string()),
        Just("description".to_string()),
        Just("rules".to_string()),
        Just("sync_id".to_string()),
        Just("status".to_string()),
        "[a-z_\u{0}\u{7}]{1,10}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z0-9.\\-]{0,20}".prop_map(Value::from),
        "\\PC{0,20}|[\u{0}-\u{1f}\u{7f}-\u{9f}]{1,5}".prop_map(Value::from),
    ];
    let value = leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..3).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    let doc = (kinds, prop::collection::btree_map(keys, value, 0..5)).prop_map(|(kind, fields)| {
        let mut doc: serde_json::Map<String, Value> = fields.into_iter().collect();
        doc.insert("kind".into(), Value::String(kind));
        Value::Object(doc)
    });
    prop::collection::vec(doc, 1..5).prop_map(Value::Array)
}

/// Every request the capture server got, with its `X-Kayra-Reason`.
type Seen = Arc<Mutex<Vec<(String, String, Option<Vec<u8>>)>>>;

/// A server that records each request's reason header and answers like an
/// empty catalog: GET 404, POST 201, PATCH 200, DELETE 204.
async fn capture() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
        let record = record.clone();
        async move {
            let reason = headers.get("x-kayra-reason").map(|v| v.as_bytes().to_vec());
            record.lock().unwrap().push((method.to_string(), uri.path().to_string(), reason));
            let body = json!({"code": 404, "reason": "NotFound", "message": "not found"});
            let response: Response = match method.as_str() {
                "GET" => (StatusCode::NOT_FOUND, axum::Json(body)).into_response(),
                "POST" => (StatusCode::CREATED, axum::Json(json!({"name": "x"}))).into_response(),
                "DELETE" => StatusCode::NO_CONTENT.into_response(),
                _ => axum::Json(json!({"name": "x"})).into_response(),
            };
            response
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reason_travels_on_every_request() {
    let (server, seen) = capture().await;
    let cli = Cli::new(server, Some("capture-token"));
    let reason = "roll out v2 (TICKET-42) — déploiement";
    let docs = "kind: Namespace\nname: a\n---\nkind: User\nname: u\n";
    cli.run_with_stdin(&["--reason", reason, "apply", "-f", "-"], Some(docs.as_bytes())).await.ok();
    cli.run(&["create", "catalog", "namespaces", "b", "--reason", reason]).await.ok();
    let mut env = cli.clone();
    env.env.push(("KAYRA_REASON".into(), reason.into()));
    env.run(&["delete", "catalog", "namespaces", "b"]).await.ok();
    env.run(&["patch", "catalog", "namespaces", "b", "-d", "description: x"]).await.ok();
    {
        let seen = seen.lock().unwrap();
        let methods: Vec<&str> = seen.iter().map(|(m, _, _)| m.as_str()).collect();
        assert_eq!(methods, ["GET", "POST", "GET", "POST", "POST", "DELETE", "PATCH"]);
        for (method, path, got) in seen.iter() {
            assert_eq!(got.as_deref(), Some(reason.as_bytes()), "{method} {path}");
        }
    }

    // Without one, no header; a bad one is refused before any request.
    seen.lock().unwrap().clear();
    cli.run(&["create", "catalog", "namespaces", "c"]).await.ok();
    assert_eq!(seen.lock().unwrap()[0].2, None);
    seen.lock().unwrap().clear();
    for bad in ["two\nlines", "esc \u{1b}[2J", &"x".repeat(1025)] {
        let run = cli.run(&["--reason", bad, "apply", "-f", "-"]).await.expect_code(1);
        assert!(run.stderr.starts_with("error: --reason "), "{run:#?}");
        assert!(!run.stderr.contains('\u{1b}'), "{run:#?}");
    }
    assert!(seen.lock().unwrap().is_empty());
}
