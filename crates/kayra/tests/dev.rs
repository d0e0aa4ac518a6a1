//! `kayra dev` end to end: two child processes on the local store, the
//! printed URL and admin token work, the seed's subscription example goes
//! from `init` to `success` and `synced: true` by itself, and Ctrl-C
//! (SIGINT) stops both children.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kayra_testkit::{eventually, free_port};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_runs_the_seed_example_to_synced() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    std::fs::write(
        dir.path().join("kayra.yaml"),
        format!("server:\n  listen: 127.0.0.1:{port}\nreconciler:\n  listen: 127.0.0.1:{}\n", free_port()),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kayra"))
        .arg("dev")
        .current_dir(dir.path())
        .env_remove("KAYRA_BOOTSTRAP_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let token = loop {
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("kayra dev prints its token");
        if let Some(rest) = line.strip_prefix("kayra dev: admin token ") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let saved = std::fs::read_to_string(dir.path().join(".kayra/admin-token")).unwrap();
    assert_eq!(saved.trim(), token);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join(".kayra/admin-token")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let base = format!("http://127.0.0.1:{port}/apis/catalog.example.com/v1");
    let http = reqwest::Client::new();
    let send = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut req = http.request(method, format!("{base}{path}")).bearer_auth(&token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        req.send()
    };
    eventually("serve answers", || async {
        matches!(send(reqwest::Method::GET, "/namespaces", None).await, Ok(r) if r.status() == 200)
    })
    .await;
    let created = send(reqwest::Method::POST, "/namespaces", Some(json!({"name": "core"}))).await.unwrap();
    assert_eq!(created.status(), 201);
    let reg = json!({"name": "compute.example.com", "short_name": "compute", "mode": "api"});
    assert_eq!(send(reqwest::Method::POST, "/apiregistrations", Some(reg)).await.unwrap().status(), 201);
    // The seed's curl example, as written.
    let sub =
        send(reqwest::Method::POST, "/namespaces/core/subscriptions", Some(json!({"api": "compute.example.com"})))
            .await
            .unwrap();
    assert_eq!(sub.status(), 201);
    let sub: Value = sub.json().await.unwrap();
    assert_eq!(sub["active"], false);
    assert_eq!(sub["current_sync_id"], "");

    eventually("subscription synced", || async {
        let r = send(reqwest::Method::GET, "/namespaces/core/subscriptions/compute.example.com", None).await;
        let Ok(r) = r else { return false };
        let v: Value = r.json().await.unwrap_or_default();
        v["state"] == "success" && v["synced"] == true && v["active"] == true
    })
    .await;

    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "kayra dev did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "serve is still listening");
}
