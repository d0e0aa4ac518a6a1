//! `kayra check` and `kayra render` (platform §10) as an operator runs them:
//! the real binary, a config file, and for render a store seeded by this
//! test (local SQLite file, and real etcd) and a backend that must never be
//! called.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kayra_catalog::repo::{RecordRef, Repository};
use kayra_core::{ApiRegistration, Subscription};
use kayra_store::Store;

fn kayra(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kayra"))
        .args(args)
        .current_dir(dir)
        .env("KAYRA_RENDER_TEST_TOKEN", "t0ken-from-env-4711")
        .output()
        .expect("run kayra")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn example_yaml() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/kayra.yaml")).unwrap()
}

// ---------------------------------------------------------------- check

#[test]
fn check_passes_the_example_config_without_touching_the_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kayra.yaml"), example_yaml()).unwrap();
    // Its secrets come from variables that are not set here: check resolves
    // names, it does not read values.
    let out = kayra(dir.path(), &["check", "--config", "kayra.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "config ok\n");
    assert!(!dir.path().join(".kayra").exists(), "no store was opened");
}

#[test]
fn check_names_mode_step_and_field_of_each_kind_of_error() {
    let dir = tempfile::tempdir().unwrap();
    let ok_step = "      - {method: get, endpoint: \"http://h/ok\"}\n";
    let cases = [
        (
            "      - {method: get, endpoint: \"http://h/{{ .Subscription.Namespace \"}\n",
            "reconciler.mode.m[1].endpoint: template:",
        ),
        ("      - {method: fetch, endpoint: \"http://h/x\"}\n", "reconciler.mode.m[1].method: unsupported method"),
        (
            "      - {method: get, endpoint: \"http://h/x\", timeout: 300000000000y}\n",
            "reconciler.mode.m[1].timeout: must be at most 24h",
        ),
        ("      - {method: get, endpoint: \"http://h/x\", timeout: soon}\n", "reconciler.mode.m[1].timeout"),
        (
            "      - {method: get, endpoint: \"http://h/x\", headers: {A: {secret: nope}}}\n",
            "reconciler.mode.m[1].headers.A.secret: unknown secret \"nope\"",
        ),
        (
            "      - {method: get, endpoint: \"http://h/x\", data: {a: [\"{{ .A | nosuch }}\"]}}\n",
            "reconciler.mode.m[1].data.a[0]: template: function \"nosuch\" not defined",
        ),
        (
            "      - {method: get, endpoint: \"http://h/{{ .Subscription.Namespce }}\"}\n",
            "reconciler.mode.m[1].endpoint: template: can't evaluate field .Subscription.Namespce",
        ),
        (
            "      - {method: get, endpoint: \"http://h/{{ if .Run.ID }}x\"}\n",
            "reconciler.mode.m[1].endpoint: template: unexpected EOF",
        ),
        (
            "      - {method: get, endpoint: \"http://h/x\", headers: {A: \"{{ end }}b\"}}\n",
            "reconciler.mode.m[1].headers.A: template: unexpected {{ end }}",
        ),
        ("      - {method: get, endpoint: \"http://h/x\", outputs: {Id: \"id\"}}\n", "reconciler.mode.m[1].outputs.Id"),
        ("      - {method: get, endpoint: \"ftp://h/x\"}\n", "reconciler.mode.m[1].endpoint: unsupported scheme"),
        ("      - {method: get, endpoint: \"http://h/x\", retries: 3}\n", "reconciler.mode.m[1]"),
    ];
    for (step, want) in cases {
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, format!("reconciler:\n  mode:\n    m:\n{ok_step}{step}")).unwrap();
        let out = kayra(dir.path(), &["check", "--config", "bad.yaml"]);
        assert_eq!(out.status.code(), Some(1), "{step}");
        assert!(stdout(&out).is_empty(), "{step}: {}", stdout(&out));
        assert!(stderr(&out).contains(want), "{step}: expected {want:?} in {}", stderr(&out));
    }
    std::fs::write(dir.path().join("bad.yaml"), "reconciler:\n  max_concurrent_reconcilez: 3\n").unwrap();
    let out = kayra(dir.path(), &["check", "--config", "bad.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("max_concurrent_reconcilez"), "{}", stderr(&out));
}

#[test]
fn check_refuses_an_unknown_sink_secret_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let sink = "notifications:\n  sinks:\n    ops:\n      url: https://hooks.example.com/k\n      \
                events: [subscription.failed]\n";
    let secrets = "reconciler:\n  secrets:\n    hook: {env: HOOK}\n";
    let cases = [
        ("      signing_secret: nope\n", "notifications.sinks.ops.signing_secret: unknown secret \"nope\""),
        (
            "      headers: {Authorization: {type: Bearer, secret: gone}}\n",
            "notifications.sinks.ops.headers.Authorization.secret: unknown secret \"gone\"",
        ),
        ("      headers: {\"Bad Header\": x}\n", "notifications.sinks.ops.headers.Bad Header"),
    ];
    for (line, want) in cases {
        std::fs::write(dir.path().join("bad.yaml"), format!("{secrets}{sink}{line}")).unwrap();
        let out = kayra(dir.path(), &["check", "--config", "bad.yaml"]);
        assert_eq!(out.status.code(), Some(1), "{line}");
        assert!(stderr(&out).contains(want), "{line}: expected {want:?} in {}", stderr(&out));
    }
    let good = format!("{secrets}{sink}      signing_secret: hook\n      headers: {{X-Token: {{secret: hook}}}}\n");
    std::fs::write(dir.path().join("good.yaml"), good).unwrap();
    let out = kayra(dir.path(), &["check", "--config", "good.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

// ---------------------------------------------------------------- render

/// A backend that counts connections: render must open none.
async fn recording_backend() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    (base, seen)
}

const TOKEN: &str = "t0ken-from-env-4711";

fn render_config(database_yaml: &str, base: &str) -> String {
    format!(
        r#"platform: dev
region: local
database:
{database_yaml}
reconciler:
  secrets:
    tok: {{env: KAYRA_RENDER_TEST_TOKEN}}
    key: {{file: /nonexistent/key}}
  mode:
    api:
      - method: post
        endpoint: "{base}/api/v1/namespaces/{{{{ .Subscription.Namespace }}}}/sync"
        async: true
        headers:
          Authorization: {{type: Bearer, secret: tok}}
          X-Api: "{{{{ .Subscription.ShortName }}}}"
        data:
          current: "{{{{ .Subscription.CurrentSyncID }}}}"
          sync_id: "{{{{ .Subscription.ExpectedSyncID }}}}"
          token: '{{{{ secret "tok" }}}}'
        outputs: {{JobID: .id}}
      - method: get
        endpoint: "{base}/jobs/{{{{ .Previous.Outputs.JobID }}}}"
        headers:
          X-Key: {{secret: key}}
        wait: [{{key: .status, successes: [done]}}]
"#
    )
}

fn expected_render(base: &str) -> String {
    format!(
        "# step 0 (async)\n\
         POST {base}/api/v1/namespaces/core/sync\n\
         Authorization: <redacted>\n\
         X-Api: compute\n\
         Content-Type: application/json\n\
         \n\
         {{\"current\":\"\",\"sync_id\":\"2026-02-01T00Z\",\"token\":\"<redacted>\"}}\n\
         # step 1\n\
         GET {base}/jobs/<output JobID of step 0>\n\
         X-Key: <redacted>\n\
         \n"
    )
}

async fn seed(store: Store) {
    let repo = Repository::new(store, "dev", "local");
    let registrations = [("compute.example.com", "compute", "api"), ("quiet.example.com", "quiet", "quiet")];
    for (name, short_name, mode) in registrations {
        let reg = ApiRegistration {
            name: name.into(),
            short_name: short_name.into(),
            mode: mode.into(),
            sync_id: "2026-02-01T00Z".into(),
            ..Default::default()
        };
        repo.create(RecordRef::Registration(name), &reg, "registration").await.unwrap();
        let sub = Subscription::new("core", name);
        repo.create(RecordRef::Subscription { namespace: "core", api: name }, &sub, "subscription").await.unwrap();
    }
    // A subscription whose registration is gone.
    let sub = Subscription::new("core", "gone.example.com");
    repo.create(RecordRef::Subscription { namespace: "core", api: "gone.example.com" }, &sub, "subscription")
        .await
        .unwrap();
}

/// Everything render promises, against whatever store `config` names.
async fn assert_render(
    dir: &Path,
    config: &str,
    base: &str,
    seen: &AtomicUsize,
    revision_before: kayra_store::Revision,
    store: &Store,
) {
    std::fs::write(dir.join("kayra.yaml"), config).unwrap();
    let out = kayra(dir, &["render", "--config", "kayra.yaml", "-n", "core", "compute.example.com"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), expected_render(base));
    assert!(!stdout(&out).contains(TOKEN) && !stderr(&out).contains(TOKEN));

    let out = kayra(dir, &["render", "--config", "kayra.yaml", "-n", "core", "quiet.example.com"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "mode \"quiet\" has no steps: the placeholder reconcile would succeed\n");

    let out = kayra(dir, &["render", "--config", "kayra.yaml", "-n", "other", "compute.example.com"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(r#"subscription not found (namespace "other", api "compute.example.com")"#),
        "{}",
        stderr(&out)
    );
    let out = kayra(dir, &["render", "--config", "kayra.yaml", "-n", "core", "gone.example.com"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(r#"api registration not found (namespace "core", api "gone.example.com")"#),
        "{}",
        stderr(&out)
    );

    assert_eq!(seen.load(Ordering::SeqCst), 0, "render made no HTTP call");
    assert_eq!(store.revision().await.unwrap(), revision_before, "render wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_prints_the_requests_from_a_local_store() {
    let dir = tempfile::tempdir().unwrap();
    let (base, seen) = recording_backend().await;
    let store = Store::new(
        kayra_store::local::LocalStore::open(&dir.path().join("store.db"), std::time::Duration::from_millis(20))
            .unwrap(),
    );
    seed(store.clone()).await;
    let revision = store.revision().await.unwrap();
    let config = render_config("  local: {path: store.db}", &base);
    assert_render(dir.path(), &config, &base, &seen, revision, &store).await;

    // A local store that does not exist is not created.
    let config = render_config("  local: {path: missing/store.db}", &base);
    std::fs::write(dir.path().join("kayra.yaml"), config).unwrap();
    let out = kayra(dir.path(), &["render", "--config", "kayra.yaml", "-n", "core", "compute.example.com"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("subscription not found"), "{}", stderr(&out));
    assert!(!dir.path().join("missing").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_prints_the_requests_from_etcd() {
    let etcd = kayra_testkit::Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (base, seen) = recording_backend().await;
    let store = Store::open(&kayra_config::DatabaseConfig::etcd(etcd.config("/render"))).await.unwrap();
    seed(store.clone()).await;
    let revision = store.revision().await.unwrap();
    let database = format!("  etcd:\n    endpoints: [\"{}\"]\n    prefix: /render", etcd.endpoint());
    assert_render(dir.path(), &render_config(&database, &base), &base, &seen, revision, &store).await;
}
