//! What the Debian package and its systemd units rely on (`deploy/`):
//!
//! - `kayra --version` names the version and the commit built;
//! - `kayra completion SHELL` prints a completion script;
//! - under `Type=notify` (`$NOTIFY_SOCKET` set), `kayra serve` (plain and
//!   HTTPS) and `kayra reconciler` send `READY=1` once their `/readyz`
//!   answers 200, to a path or an abstract socket.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kayra_testkit::Certificates;
use kayra_testkit::free_port;

/// Generous: a debug build on a busy 2-core machine.
const READY_WITHIN: Duration = Duration::from_secs(60);

#[test]
fn version_names_the_version_and_the_commit() {
    let output = Command::new(env!("CARGO_BIN_EXE_kayra")).arg("--version").output().unwrap();
    assert!(output.status.success());
    let said = String::from_utf8(output.stdout).unwrap();
    let prefix = format!("kayra {} (commit ", env!("CARGO_PKG_VERSION"));
    let commit = said
        .trim_end()
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected --version: {said:?}"));
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "commit field {commit:?} in {said:?}"
    );
}

#[test]
fn completion_prints_a_script_for_each_shell() {
    for (shell, marker) in [("bash", "complete -F"), ("zsh", "#compdef kayra"), ("fish", "complete -c kayra")] {
        let output = Command::new(env!("CARGO_BIN_EXE_kayra")).args(["completion", shell]).output().unwrap();
        assert!(output.status.success(), "{shell}: {}", String::from_utf8_lossy(&output.stderr));
        let script = String::from_utf8(output.stdout).unwrap();
        assert!(script.contains(marker) && script.contains("reconciler"), "{shell} script:\n{script}");
    }
    let output = Command::new(env!("CARGO_BIN_EXE_kayra")).args(["completion", "tcsh"]).output().unwrap();
    assert!(!output.status.success(), "an unknown shell is refused");
}

/// A running kayra process, killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kayra COMMAND --config CONFIG` with `NOTIFY_SOCKET=notify`.
fn start(command: &str, config: &Path, notify: &str) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_kayra"))
        .args([command, "--config"])
        .arg(config)
        .env("NOTIFY_SOCKET", notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kayra");
    Running(child)
}

/// The first datagram on `socket` (bounded by [`READY_WITHIN`]).
fn first_message(socket: &UnixDatagram) -> String {
    socket.set_read_timeout(Some(READY_WITHIN)).unwrap();
    let mut buffer = [0u8; 4096];
    let n = socket.recv(&mut buffer).expect("no notification from kayra in time");
    String::from_utf8_lossy(&buffer[..n]).into_owned()
}

/// `GET url/readyz` (accepting the test CA's certificate): its status.
async fn readyz(url: &str, ca: Option<&Path>) -> u16 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut client = reqwest::Client::builder();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).unwrap();
        client = client.tls_certs_only([reqwest::Certificate::from_pem(&pem).unwrap()]);
    }
    client.build().unwrap().get(format!("{url}/readyz")).send().await.unwrap().status().as_u16()
}

fn local_store(dir: &Path) -> String {
    format!("database:\n  local:\n    path: {}\n", dir.join("kayra.db").display())
}

#[tokio::test]
async fn serve_tells_systemd_it_is_ready_when_readyz_answers() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let port = free_port();
    let config = dir.path().join("kayra.yaml");
    std::fs::write(&config, format!("server:\n  listen: 127.0.0.1:{port}\n{}", local_store(dir.path()))).unwrap();
    let _serve = start("serve", &config, socket_path.to_str().unwrap());

    let message = tokio::task::spawn_blocking(move || first_message(&socket)).await.unwrap();
    assert_eq!(message, "READY=1");
    assert_eq!(readyz(&format!("http://127.0.0.1:{port}"), None).await, 200);
}

#[tokio::test]
async fn serve_over_https_tells_systemd_it_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certificates::generate(&dir.path().join("certs"));
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let port = free_port();
    let config = dir.path().join("kayra.yaml");
    std::fs::write(
        &config,
        format!(
            "server:\n  listen: 0.0.0.0:{port}\n  tls: {{cert_file: {}, key_file: {}}}\n{}",
            certs.server_cert.display(),
            certs.server_key.display(),
            local_store(dir.path())
        ),
    )
    .unwrap();
    let _serve = start("serve", &config, socket_path.to_str().unwrap());

    let message = tokio::task::spawn_blocking(move || first_message(&socket)).await.unwrap();
    assert_eq!(message, "READY=1");
    assert_eq!(readyz(&format!("https://localhost:{port}"), Some(&certs.ca)).await, 200);
}

#[tokio::test]
async fn reconciler_tells_systemd_on_an_abstract_socket_when_ready() {
    use std::os::linux::net::SocketAddrExt;
    let dir = tempfile::tempdir().unwrap();
    let name = format!("kayra-test-notify-{}-{}", std::process::id(), free_port());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&address).unwrap();
    let port = free_port();
    let config = dir.path().join("kayra.yaml");
    std::fs::write(&config, format!("reconciler:\n  listen: 127.0.0.1:{port}\n{}", local_store(dir.path()))).unwrap();
    let _reconciler = start("reconciler", &config, &format!("@{name}"));

    let message = tokio::task::spawn_blocking(move || first_message(&socket)).await.unwrap();
    assert_eq!(message, "READY=1");
    assert_eq!(readyz(&format!("http://127.0.0.1:{port}"), None).await, 200);
}
