//! Black-box tests of `kayra export` and `kayra import` (platform §15) as
//! real processes: a catalog built through the API on one store, made
//! idle by a reconciler, exported and imported into the other kind of
//! store (local → etcd, etcd → local), answers every GET the same there,
//! its tokens still authenticate, and a reconciler started on it neither
//! calls a backend nor writes. Refusals (a store already holding a
//! record, a truncated or hand-broken file, randomly mangled files) write
//! nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::Proc;
use kayra_store::Store;
use kayra_testkit::backend::TestBackend;
use kayra_testkit::{Etcd, eventually, free_port};
use nix::sys::signal::Signal;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const TOKEN: &str = "backup-test-bootstrap-token";
const BASE: &str = "/apis/catalog.example.com/v1";
const API: &str = "compute.example.com";
const OTHER: &str = "storage.example.com";
/// How long an idle reconciler is watched for writes and calls.
const IDLE: Duration = Duration::from_secs(5);

/// Where a config's store lives.
enum Db<'a> {
    Local(&'a Path),
    Etcd(&'a Etcd),
}

struct World {
    dir: tempfile::TempDir,
    backend: TestBackend,
    http: reqwest::Client,
}

impl World {
    async fn new() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self { dir: tempfile::tempdir().unwrap(), backend: TestBackend::start().await, http: reqwest::Client::new() }
    }

    /// A config named `name` on `db`, serving on `port`, the reconciler's
    /// admin listener on `admin`; the reconciler's mode `api` POSTs to the
    /// test backend.
    fn config(&self, name: &str, db: &Db<'_>, port: u16, admin: u16) -> PathBuf {
        let database = match db {
            Db::Local(dir) => {
                format!("  local:\n    path: {}\n    poll_interval: 20ms", dir.join("kayra.db").display())
            }
            Db::Etcd(etcd) => format!(
                "  etcd:\n    endpoints: [\"{}\"]\n    prefix: /kayra\n    lock_ttl: 2s\n    lock_retry_interval: 50ms",
                etcd.endpoint()
            ),
        };
        let yaml = format!(
            r#"platform: dev
region: local
server:
  listen: 127.0.0.1:{port}
database:
{database}
reconciler:
  listen: 127.0.0.1:{admin}
  mode:
    api:
      - method: post
        endpoint: "{base}/ok/{{{{ .Subscription.Namespace }}}}"
        timeout: 60s
"#,
            base = self.backend.base,
        );
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn url(port: u16, path: &str) -> String {
        format!("http://127.0.0.1:{port}{BASE}{path}")
    }

    async fn send(
        &self,
        method: reqwest::Method,
        port: u16,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, Self::url(port, path)).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, port: u16, path: &str, body: Value) -> Value {
        let (status, answer) = self.send(reqwest::Method::POST, port, path, TOKEN, Some(body)).await;
        assert_eq!(status, 201, "POST {path}: {answer}");
        answer
    }

    async fn get(&self, port: u16, path: &str, token: &str) -> Value {
        let (status, answer) = self.send(reqwest::Method::GET, port, path, token, None).await;
        assert_eq!(status, 200, "GET {path}: {answer}");
        answer
    }

    /// `kayra serve` on `config`, once it answers.
    async fn serve(&self, config: &Path, port: u16, bootstrap: bool) -> Proc {
        let env: &[(&str, &str)] = if bootstrap { &[("KAYRA_BOOTSTRAP_TOKEN", TOKEN)] } else { &[] };
        let mut serve = Proc::start("serve", config, env);
        self.wait_ready(&mut serve, port).await;
        serve
    }

    /// Waits (bounded) until `proc` answers `/readyz` on `port`; panics with
    /// its log if it exits first.
    async fn wait_ready(&self, proc: &mut Proc, port: u16) {
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let deadline = std::time::Instant::now() + kayra_testkit::WAIT;
        loop {
            proc.assert_running();
            if self.http.get(&ready).send().await.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "not ready on {port}:\n{}", proc.lines().join("\n"));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A catalog of every kind through the API, then reconciled to idle by
    /// a reconciler (stopped again). Returns alice's token.
    async fn build_catalog(&self, config: &Path, port: u16) -> String {
        let serve = self.serve(config, port, true).await;
        for (name, description, labels) in
            [("core", "the core team", json!({"tier": "canary", "example.com/env": ""})), ("edge", "", json!({}))]
        {
            self.post(port, "/namespaces", json!({"name": name, "description": description, "labels": labels})).await;
        }
        self.post(port, "/users", json!({"name": "alice", "description": "a person"})).await;
        self.post(port, "/users", json!({"name": "robot"})).await;
        let token = self.post(port, "/users/alice/tokens", json!({})).await;
        self.post(port, "/users/robot/tokens", json!({})).await;
        let rule = json!({"apis": [API], "resources": ["*"], "verbs": ["get", "list"]});
        self.post(port, "/roles", json!({"name": "reader", "rules": [rule]})).await;
        self.post(port, "/clusterrolebindings", json!({"name": "alice-reader", "role": "reader", "user": "alice"}))
            .await;
        self.post(port, "/namespaces/core/rolebindings", json!({"name": "robot", "role": "reader", "user": "robot"}))
            .await;
        let registration = json!({"name": API, "short_name": "compute", "mode": "api", "sync_id": "s1",
            "endpoint": "http://127.0.0.1:9/backend", "description": "compute"});
        self.post(port, "/apiregistrations", registration).await;
        // A rollout policy (§12): shapes SyncID moves only, so the first
        // syncs below run at once and no rollout record is written.
        let rollout = json!({"waves": [
            {"name": "canary", "selector": {"tier": "canary"}, "size": "1", "bake": "5m",
             "gate": {"method": "get", "endpoint": "https://metrics.example.com/ok?api={{ .Rollout.Api }}",
                      "timeout": "2m"}},
            {"name": "rest", "approval": "manual", "max_failures": "10%"}],
            "on_failure": "abort", "progress_deadline": "1h"});
        self.post(port, "/apiregistrations", json!({"name": OTHER, "mode": "api", "rollout": rollout})).await;
        for (ns, api) in [("core", API), ("edge", API), ("core", OTHER)] {
            self.post(port, &format!("/namespaces/{ns}/subscriptions"), json!({"api": api})).await;
        }
        let reconciler = Proc::reconciler(config);
        eventually("every subscription synced and namespace active", || async {
            let status = self.get(port, &format!("/apiregistrations/{API}/status"), TOKEN).await;
            let other = self.get(port, &format!("/apiregistrations/{OTHER}/status"), TOKEN).await;
            let namespaces = self.get(port, "/namespaces", TOKEN).await;
            status["synced"] == 2
                && other["synced"] == 1
                && namespaces["items"].as_array().unwrap().iter().all(|n| n["active"] == true)
        })
        .await;
        // A force re-sync after the first sync, and a SyncID move: the
        // subscription state is more than a first sync.
        let (status, _) = self
            .send(reqwest::Method::PUT, port, &format!("/apiregistrations/{API}/sync"), TOKEN, Some(json!({})))
            .await;
        assert_eq!(status, 200);
        eventually("synced again", || async {
            self.get(port, &format!("/apiregistrations/{API}/status"), TOKEN).await["synced"] == 2
        })
        .await;
        let mut reconciler = reconciler;
        reconciler.signal(Signal::SIGTERM);
        assert!(reconciler.wait(Duration::from_secs(30)).success());
        drop(serve);
        token["token"].as_str().unwrap().to_string()
    }

    /// Every GET of the catalog (with the bootstrap token), by path.
    async fn snapshot(&self, port: u16) -> Vec<(String, Value)> {
        let mut paths = vec![
            "/namespaces".to_string(),
            "/users".into(),
            "/roles".into(),
            "/clusterrolebindings".into(),
            "/apiregistrations".into(),
            "/whoami".into(),
        ];
        for user in ["admin", "alice", "robot"] {
            paths.push(format!("/users/{user}"));
            paths.push(format!("/users/{user}/tokens"));
        }
        for ns in ["core", "edge"] {
            paths.push(format!("/namespaces/{ns}"));
            paths.push(format!("/namespaces/{ns}/rolebindings"));
            paths.push(format!("/namespaces/{ns}/subscriptions"));
        }
        for api in [API, OTHER] {
            paths.push(format!("/apiregistrations/{api}"));
            paths.push(format!("/apiregistrations/{api}/status"));
            paths.push(format!("/namespaces/core/subscriptions/{api}"));
        }
        paths.push("/roles/reader".into());
        paths.push("/clusterrolebindings/alice-reader".into());
        paths.push("/namespaces/core/rolebindings/robot".into());
        let mut out = Vec::new();
        for path in paths {
            let body = self.get(port, &path, TOKEN).await;
            out.push((path, body));
        }
        out
    }

    /// `kayra <args…>`, waited for.
    fn kayra(args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kayra"))
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kayra");
        if let Some(bytes) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(bytes).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    fn export(config: &Path) -> Vec<u8> {
        let out = Self::kayra(&["export", "--config", config.to_str().unwrap()], None);
        assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    }

    fn import(config: &Path, file: &[u8]) -> Output {
        Self::kayra(&["import", "--config", config.to_str().unwrap(), "-"], Some(file))
    }

    /// A reconciler on `config` makes no backend call and no store write
    /// over [`IDLE`] once its startup list is done.
    async fn assert_reconciler_idle(&self, config: &Path, admin: u16, store: &Store) {
        let calls = self.backend.calls().len();
        let before = store.revision().await.unwrap();
        let mut reconciler = Proc::reconciler(config);
        self.wait_ready(&mut reconciler, admin).await;
        tokio::time::sleep(IDLE).await;
        reconciler.assert_running();
        assert_eq!(self.backend.calls().len(), calls, "no pipeline call after the import: {:?}", self.backend.calls());
        assert_eq!(store.revision().await.unwrap(), before, "no store write after the import");
        reconciler.signal(Signal::SIGTERM);
        assert!(reconciler.wait(Duration::from_secs(30)).success());
    }
}

async fn local_store(dir: &Path) -> Store {
    let config = kayra_config::DatabaseConfig::local(kayra_testkit::local_config(dir));
    Store::open(&config).await.unwrap()
}

async fn etcd_store(etcd: &Etcd) -> Store {
    Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await.unwrap())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// local → etcd → local: every GET equal, tokens work, reconcilers idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_local_to_etcd_and_back_keeps_every_answer_and_stays_idle() {
    let world = World::new().await;
    let (local_a, local_c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let etcd = Etcd::start().await;
    let (port_a, port_b, port_c) = (free_port(), free_port(), free_port());
    let (admin_b, admin_c) = (free_port(), free_port());
    let config_a = world.config("a", &Db::Local(local_a.path()), port_a, free_port());
    let config_b = world.config("b", &Db::Etcd(&etcd), port_b, admin_b);
    let config_c = world.config("c", &Db::Local(local_c.path()), port_c, admin_c);

    let alice = world.build_catalog(&config_a, port_a).await;
    let serve = world.serve(&config_a, port_a, false).await;
    let want = world.snapshot(port_a).await;
    assert_eq!(world.get(port_a, "/whoami", &alice).await["user"], "alice");
    drop(serve);

    // local → etcd
    let file = World::export(&config_a);
    let text = String::from_utf8(file.clone()).unwrap();
    assert!(!text.contains(TOKEN) && !text.contains(&alice), "no secret token in an export");
    assert!(text.contains("kind: Subscription") && text.contains("hash: "), "{text}");
    assert!(text.contains("rollout:\n  on_failure: abort\n"), "the rollout policy is exported: {text}");
    let out = World::import(&config_b, &file);
    assert!(out.status.success(), "import into etcd: {}", stderr(&out));
    let store_b = etcd_store(&etcd).await;
    world.assert_reconciler_idle(&config_b, admin_b, &store_b).await;
    let serve = world.serve(&config_b, port_b, false).await;
    assert_eq!(world.snapshot(port_b).await, want, "every GET answers the same after local → etcd");
    assert_eq!(world.get(port_b, "/whoami", &alice).await["user"], "alice", "alice's token still works");
    drop(serve);

    // etcd → local, from a file written with -o
    let path = world.dir.path().join("backup.yaml");
    let out = World::kayra(&["export", "--config", config_b.to_str().unwrap(), "-o", path.to_str().unwrap()], None);
    assert!(out.status.success(), "export -o: {}", stderr(&out));
    let out = World::kayra(&["import", "--config", config_c.to_str().unwrap(), path.to_str().unwrap()], None);
    assert!(out.status.success(), "import into local: {}", stderr(&out));
    let store_c = local_store(local_c.path()).await;
    world.assert_reconciler_idle(&config_c, admin_c, &store_c).await;
    let serve = world.serve(&config_c, port_c, false).await;
    assert_eq!(world.snapshot(port_c).await, want, "every GET answers the same after etcd → local");
    assert_eq!(world.get(port_c, "/whoami", &alice).await["user"], "alice");
    drop(serve);

    // Into a store that holds the records already: exit 1 naming one, nothing written.
    let before = store_b.revision().await.unwrap();
    let out = World::import(&config_b, &file);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("already holds namespace \"core\""), "{}", stderr(&out));
    assert_eq!(store_b.revision().await.unwrap(), before, "a refused import writes nothing");
}

/// A small catalog written straight to a local store, exported.
async fn sample_export(world: &World) -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let catalog = common::Catalog::new(local_store(dir.path()).await);
    let repo = &catalog.repo;
    let registration = kayra_core::ApiRegistration {
        name: API.into(),
        short_name: "compute".into(),
        mode: "api".into(),
        sync_id: "s1".into(),
        platform: "dev".into(),
        region: "local".into(),
        ..Default::default()
    };
    repo.create_registration(&registration).await.unwrap();
    for ns in ["core", "edge"] {
        catalog.subscribe(ns).await;
    }
    repo.create(
        kayra_catalog::repo::RecordRef::User("alice"),
        &kayra_core::User { name: "alice".into(), description: String::new() },
        "user",
    )
    .await
    .unwrap();
    repo.issue_token("alice").await.unwrap();
    let config = world.config("sample", &Db::Local(dir.path()), free_port(), free_port());
    let file = World::export(&config);
    (dir, file)
}

/// Imports `file` into a fresh local store: the exit code, stderr, and
/// whether the store was left empty.
async fn import_fresh(world: &World, name: &str, file: &[u8]) -> (Option<i32>, String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let config = world.config(name, &Db::Local(dir.path()), free_port(), free_port());
    let out = World::import(&config, file);
    let empty = local_store(dir.path()).await.revision().await.unwrap() == 0;
    (out.status.code(), stderr(&out), empty)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_or_hand_broken_file_is_refused_naming_the_document_and_writes_nothing() {
    let world = World::new().await;
    let (_source, file) = sample_export(&world).await;
    let text = String::from_utf8(file.clone()).unwrap();
    let (code, err, empty) = import_fresh(&world, "whole", &file).await;
    assert_eq!((code, empty), (Some(0), false), "{err}");

    // Cut inside the last subscription's status: what is left still parses.
    let cut = text.rfind("current_sync_id").unwrap() + "current_sync_id: ".len();
    let (code, err, empty) = import_fresh(&world, "cut", &text.as_bytes()[..cut]).await;
    assert_eq!((code, empty), (Some(1), true), "{err}");
    let last = text[..cut].matches("---").count();
    assert!(err.contains(&format!("document {last}: field \"status.")), "{err}");
    // Cut between documents: only the end line tells.
    let cut = text.rfind("---").unwrap();
    let (code, err, empty) = import_fresh(&world, "between", &text.as_bytes()[..cut]).await;
    assert_eq!((code, empty), (Some(1), true), "{err}");
    assert!(err.contains("truncated"), "{err}");

    // A hand-broken field.
    let broken = text.replacen("state: init", "state: done", 1);
    let (code, err, empty) = import_fresh(&world, "broken", broken.as_bytes()).await;
    assert_eq!((code, empty), (Some(1), true), "{err}");
    let index = text[..text.find("state: init").unwrap()].matches("---").count();
    assert!(err.contains(&format!("document {index}: field \"state\"")), "{err}");
}

/// Seeded and bounded: truncations at random points and random byte flips
/// of a real export never panic the import, which either refuses writing
/// nothing or succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mangled_exports_are_refused_or_imported_never_half_written() {
    let world = World::new().await;
    let (_source, file) = sample_export(&world).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x006b_6179_7261);
    let (mut refused, mut imported) = (0, 0);
    for case in 0..48 {
        let mut mangled = file.clone();
        if case % 2 == 0 {
            mangled.truncate(rng.random_range(0..file.len()));
        } else {
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..mangled.len());
                mangled[at] ^= 1 << rng.random_range(0..8);
            }
        }
        let (code, err, empty) = import_fresh(&world, &format!("case{case}"), &mangled).await;
        assert!(!err.contains("panicked"), "case {case} panicked: {err}");
        match code {
            Some(0) => imported += 1,
            Some(1) => {
                assert!(empty, "case {case}: refused ({err}) but wrote something");
                refused += 1;
            }
            other => panic!("case {case}: exit {other:?}: {err}"),
        }
    }
    assert!(refused > 0 && imported > 0, "{refused} refused, {imported} imported: both outcomes are exercised");
}

/// A rollout record is the reconcilers' runtime state, not exported: the
/// registration's policy is, and an export taken while a rollout of the
/// current SyncID is unfinished says so on stderr; the import holds no
/// rollout record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_rollout_is_not_exported_and_the_export_says_so() {
    use kayra_core::rollout::{RolloutPolicy, RolloutRecord, WavePolicy};

    let world = World::new().await;
    let dir = tempfile::tempdir().unwrap();
    let catalog = common::Catalog::new(local_store(dir.path()).await);
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { name: "canary".into(), size: "1".into(), ..Default::default() },
            WavePolicy { name: "rest".into(), ..Default::default() },
        ],
        ..Default::default()
    };
    let registration = kayra_core::ApiRegistration {
        name: API.into(),
        mode: "api".into(),
        sync_id: "s2".into(),
        platform: "dev".into(),
        region: "local".into(),
        rollout: Some(policy.clone()),
        ..Default::default()
    };
    catalog.repo.create_registration(&registration).await.unwrap();
    for ns in ["core", "edge"] {
        catalog.subscribe(ns).await;
    }
    let assignment = vec![vec!["core".to_string()], vec!["edge".to_string()]];
    let (record, _) = RolloutRecord::start(API, "s2", &policy, assignment, std::time::SystemTime::now());
    assert!(catalog.repo.write_rollout(API, None, &record, &[]).await.unwrap().is_some());

    let config = world.config("rolling", &Db::Local(dir.path()), free_port(), free_port());
    let out = World::kayra(&["export", "--config", config.to_str().unwrap()], None);
    assert!(out.status.success(), "export: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "the rollout of api registration \"{API}\" to SyncID \"s2\" is progressing (wave 1 of 2)"
        )),
        "{err}"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("rollout:\n") && text.contains("name: canary"), "the policy is exported: {text}");
    assert!(!text.contains("progressing") && !text.contains("started_at"), "no rollout record in it: {text}");

    let target = tempfile::tempdir().unwrap();
    let config = world.config("rolled", &Db::Local(target.path()), free_port(), free_port());
    let out = World::import(&config, text.as_bytes());
    assert!(out.status.success(), "import: {}", stderr(&out));
    let imported = kayra_catalog::repo::Repository::new(local_store(target.path()).await, "dev", "local");
    assert_eq!(imported.get_registration(API).await.unwrap().unwrap().value.rollout, Some(policy));
    assert!(imported.rollout(API).await.unwrap().is_none());
}
