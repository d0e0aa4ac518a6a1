//! Every verb, every output format parsed back, and `-d` from `@FILE`/`@-`.

use serde_json::{Value, json};

use crate::common::server::Kayra;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_on_a_namespace() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;

    // create, with NAME and with -d
    let core = cli.run(&["create", "catalog", "namespaces", "core", "-d", "description: the core team"]).await.ok();
    assert_eq!(core.json(), json!({"name": "core", "description": "the core team", "labels": {}, "active": false}));
    cli.run(&["create", "catalog", "namespaces", "-d", r#"{"name": "sre"}"#]).await.ok();

    // get one: JSON by default
    let got = cli.run(&["get", "catalog", "namespaces", "core"]).await.ok();
    assert_eq!(got.json()["description"], "the core team");

    // get the list: a table by default
    let list = cli.run(&["get", "catalog", "namespaces"]).await.ok();
    assert_eq!(list.stdout, "NAME   ACTIVE   DESCRIPTION\ncore   false    the core team\nsre    false    <none>\n");

    // update (PUT replaces the writable fields)
    let put = cli.run(&["update", "catalog", "namespaces", "core", "-d", r#"{"description": "replaced"}"#]).await.ok();
    assert_eq!(put.json()["description"], "replaced");

    // patch (merge patch)
    let patched = cli.run(&["patch", "catalog", "namespaces", "sre", "-d", "description: patched"]).await.ok();
    assert_eq!(patched.json(), json!({"name": "sre", "description": "patched", "labels": {}, "active": false}));

    // delete: nothing on stdout, a confirmation on stderr
    let deleted = cli.run(&["delete", "catalog", "namespaces", "sre"]).await.ok();
    assert_eq!((deleted.stdout.as_str(), deleted.stderr.as_str()), ("", "deleted namespaces/sre\n"));
    let gone = cli.run(&["get", "catalog", "namespaces", "sre"]).await.expect_code(1);
    assert!(gone.stderr.starts_with("Error from server (NotFound): "), "{gone:#?}");
    assert!(gone.stderr.contains("sre"), "{gone:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_on_registrations_and_subscriptions() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    kayra.register("core", "compute.example.com", "compute", "http://127.0.0.1:9").await;

    let regs = cli.run(&["get", "catalog", "apiregistrations"]).await.ok();
    let mut lines = regs.stdout.lines();
    assert_eq!(lines.next(), Some("NAME                  SHORT     MODE   SYNC ID"));
    assert!(lines.next().unwrap().starts_with("compute.example.com   compute   noop   "), "{regs:#?}");

    let before = cli.run(&["get", "catalog", "apiregistrations", "compute.example.com"]).await.ok().json();
    let bumped = cli.run(&["update", "catalog", "apiregistrations", "compute.example.com/sync"]).await.ok().json();
    assert_ne!(before["sync_id"], bumped["sync_id"]);
    let patched = cli
        .run(&["patch", "catalog", "apiregistrations", "compute.example.com", "-d", r#"{"mode": "api"}"#])
        .await
        .ok();
    assert_eq!(patched.json()["mode"], "api");
    assert_eq!(patched.json()["sync_id"], bumped["sync_id"]);

    // Subscriptions: create by NAME, the no-op PUT, the list table, status, delete.
    let sub = cli.run(&["create", "catalog", "-n", "core", "subscriptions", "compute.example.com"]).await.ok().json();
    assert_eq!(sub["expected_sync_id"], bumped["sync_id"]);
    cli.run(&["update", "catalog", "-n", "core", "subscriptions", "compute.example.com", "-d", "{}"]).await.ok();
    let table = cli.run(&["get", "catalog", "-n", "core", "subscriptions"]).await.ok();
    let sync_id = bumped["sync_id"].as_str().unwrap();
    let width = sync_id.len().max("EXPECTED".len());
    assert_eq!(
        table.stdout,
        format!(
            "API                   ACTIVE   STATE   CURRENT   {:width$}   SYNCED\n\
             compute.example.com   false    init    <none>    {sync_id:width$}   false\n",
            "EXPECTED"
        )
    );
    let status =
        cli.run(&["get", "catalog", "apiregistrations", "compute.example.com/status", "-o", "table"]).await.ok();
    assert!(
        status.stdout.starts_with(
            "NAMESPACE   ACTIVE   STATE   CURRENT   SYNCED\ncore        false    init    <none>    false\n"
        )
    );
    assert!(status.stdout.ends_with(&format!("0/1 synced to {sync_id} (compute.example.com)\n")), "{status:#?}");

    cli.run(&["delete", "catalog", "-n", "core", "subscriptions", "compute.example.com"]).await.ok();
    let empty = cli.run(&["get", "catalog", "-n", "core", "subscriptions"]).await.ok();
    assert_eq!((empty.stdout.as_str(), empty.stderr.as_str()), ("", "No subscriptions found in namespace core.\n"));
    cli.run(&["delete", "catalog", "apiregistrations", "compute.example.com"]).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_formats_parse_back() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    cli.run(&["create", "catalog", "namespaces", "core"]).await.ok();
    let expected_one = json!({"name": "core", "description": "", "labels": {}, "active": false});
    let expected_list = json!({"items": [expected_one], "continue": ""});

    let json_list = cli.run(&["get", "catalog", "namespaces", "-o", "json"]).await.ok();
    assert_eq!(json_list.json(), expected_list);
    let yaml_list = cli.run(&["-o", "yaml", "get", "catalog", "namespaces"]).await.ok();
    assert_eq!(serde_norway::from_str::<Value>(&yaml_list.stdout).unwrap(), expected_list);
    let yaml_one = cli.run(&["get", "catalog", "namespaces", "core", "--output", "yaml"]).await.ok();
    assert_eq!(serde_norway::from_str::<Value>(&yaml_one.stdout).unwrap(), expected_one);
    let json_one = cli.run(&["get", "catalog", "namespaces", "core"]).await.ok();
    assert_eq!(json_one.json(), expected_one);

    let table_one = cli.run(&["get", "catalog", "namespaces", "core", "-o", "table"]).await.ok();
    let rows: Vec<Vec<&str>> = table_one.stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows, vec![vec!["NAME", "ACTIVE", "DESCRIPTION"], vec!["core", "false", "<none>"]]);

    let whoami = cli.run(&["get", "catalog", "whoami"]).await.ok();
    assert_eq!(whoami.json()["user"], "admin");
    let whoami = cli.run(&["get", "catalog", "whoami", "-o", "table"]).await.ok();
    assert!(whoami.stdout.lines().nth(1).unwrap().starts_with("admin"), "{whoami:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_from_a_file_and_from_stdin() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("compute.yaml");
    std::fs::write(&yaml, "name: compute.example.com\nshort_name: compute\nmode: api\nsync_id: v1\n").unwrap();
    let json_file = dir.path().join("ns.json");
    std::fs::write(&json_file, r#"{"name": "core", "description": "from a file"}"#).unwrap();

    let reg = cli.run(&["create", "catalog", "apiregistrations", "-d", &format!("@{}", yaml.display())]).await.ok();
    assert_eq!(reg.json()["short_name"], "compute");
    assert_eq!(reg.json()["sync_id"], "v1");
    let ns = cli.run(&["create", "catalog", "namespaces", "-d", &format!("@{}", json_file.display())]).await.ok();
    assert_eq!(ns.json()["description"], "from a file");

    let patched = cli
        .run_with_stdin(
            &["patch", "catalog", "apiregistrations", "compute.example.com", "-d", "@-"],
            Some(b"sync_id: v2\n"),
        )
        .await
        .ok();
    assert_eq!(patched.json()["sync_id"], "v2");
    let sub = cli
        .run_with_stdin(
            &["create", "catalog", "-n", "core", "subscriptions", "-d", "@-"],
            Some(br#"{"api": "compute.example.com"}"#),
        )
        .await
        .ok();
    assert_eq!(sub.json()["expected_sync_id"], "v2");

    let missing = cli.run(&["create", "catalog", "namespaces", "-d", "@/nonexistent/ns.yaml"]).await.expect_code(1);
    assert!(missing.stderr.starts_with("error: -d @/nonexistent/ns.yaml: "), "{missing:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_their_tokens() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    cli.run(&["create", "catalog", "users", "alice"]).await.ok();
    let token = cli.run(&["create", "catalog", "users", "alice/tokens"]).await.ok().json();
    let (id, secret) = (token["id"].as_str().unwrap(), token["token"].as_str().unwrap());

    let tokens = cli.run(&["get", "catalog", "users", "alice/tokens"]).await.ok();
    let mut lines = tokens.stdout.lines();
    assert_eq!(lines.next().unwrap().split_whitespace().collect::<Vec<_>>(), ["ID", "CREATED", "AT"]);
    assert!(lines.next().unwrap().starts_with(id), "{tokens:#?}");
    assert!(!tokens.stdout.contains(secret));
    let one = cli.run(&["get", "catalog", "users", &format!("alice/tokens/{id}")]).await.ok();
    assert_eq!(one.json()["id"], id);

    // alice's token works, but alice has no role: 403 naming her.
    let mut alice = cli.clone();
    alice.token = Some(secret.to_string());
    let whoami = alice.run(&["get", "catalog", "whoami"]).await.ok();
    assert_eq!(whoami.json()["user"], "alice");
    let denied = alice.run(&["get", "catalog", "namespaces"]).await.expect_code(1);
    assert!(denied.stderr.starts_with("Error from server (Forbidden): "), "{denied:#?}");
    assert!(denied.stderr.contains("alice"), "{denied:#?}");

    cli.run(&["delete", "catalog", "users", &format!("alice/tokens/{id}")]).await.ok();
    let revoked = alice.run(&["get", "catalog", "whoami"]).await.expect_code(1);
    assert!(revoked.stderr.starts_with("Error from server (Unauthorized)"), "{revoked:#?}");
    assert!(!revoked.stderr.contains(secret));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_lists_as_a_table() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    cli.run(&["create", "catalog", "namespaces", "core"]).await.ok();
    cli.run(&["patch", "catalog", "namespaces", "core", "-d", "description: d"]).await.ok();
    let list = cli.run(&["get", "catalog", "audit"]).await.ok();
    let lines: Vec<&str> = list.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["TIME", "USER", "VERB", "RESOURCE", "NAMESPACE", "NAME", "REASON"], "{list:#?}");
    // Newest first; an empty namespace and reason show as <none>.
    let newest: Vec<&str> = lines[1].split_whitespace().skip(1).collect();
    assert_eq!(newest, ["admin", "patch", "namespaces", "<none>", "core", "<none>"], "{list:#?}");
    let oldest: Vec<&str> = lines[2].split_whitespace().skip(1).collect();
    assert_eq!(oldest[..3], ["admin", "create", "namespaces"], "{list:#?}");
    // One record by id, as JSON.
    let listed = cli.run(&["get", "catalog", "audit", "-o", "json"]).await.ok().json();
    let id = listed["items"][0]["id"].as_str().unwrap().to_string();
    let one = cli.run(&["get", "catalog", "audit", &id]).await.ok();
    assert_eq!(one.json()["after"]["description"], "d");
    // The trail is cluster-scoped.
    let scoped = cli.run(&["get", "catalog", "-n", "core", "audit"]).await;
    assert!(scoped.stderr.contains("cluster-scoped"), "{scoped:#?}");
}
