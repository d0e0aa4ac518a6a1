//! Test setup shared by every kayra test, written once.
//!
//! - [`Etcd`]: a real, private etcd per test on free loopback ports, with a
//!   throwaway data dir, killed on drop. etcd tests never skip: when the
//!   `etcd` binary is missing it is installed (Debian's `etcd-server`), and
//!   a failed install fails the test loudly.
//! - [`local_config`]: a local (SQLite) store config in a test's temp dir.
//! - [`eventually`]: wait for a condition with a generous upper bound,
//!   instead of sleeping and hoping.
//! - [`free_port`]: a loopback port nobody listens on right now.
//! - [`backend`]: a recording HTTP backend for reconciler tests.
//!
//! Timeouts here are deliberately long (30s): they only matter when
//! something is broken, and CI machines are slow and shared.

pub mod backend;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kayra_config::{EtcdConfig, LocalConfig};

/// The upper bound of every wait in this crate.
pub const WAIT: Duration = Duration::from_secs(30);

/// Where concurrent test processes serialise installing etcd.
const INSTALL_LOCK: &str = "/tmp/kayra-etcd-install.lock";

/// A loopback TCP port that was free a moment ago (the OS picked it).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// Polls `check` every 10ms until it holds; panics after [`WAIT`] naming `what`.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out after {WAIT:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A local store at `dir/kayra.db`, polling every 20ms so watch tests are quick.
pub fn local_config(dir: &Path) -> LocalConfig {
    LocalConfig { path: dir.join("kayra.db"), poll_interval: kayra_config::Duration::from_millis(20) }
}

/// A single-member etcd of this test's own, tuned for speed (10ms
/// heartbeats, no fsync): never point it at data you care about.
pub struct Etcd {
    binary: PathBuf,
    child: Option<Child>,
    /// Data dir (`data/`) and the server's log (`etcd.log`).
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

impl Etcd {
    /// Starts etcd (installing it first if needed) and waits until it
    /// answers reads. Panics with etcd's log if it never does.
    pub async fn start() -> Etcd {
        let binary = tokio::task::spawn_blocking(etcd_binary).await.expect("locating etcd");
        // A port picked by free_port can be taken by someone else before
        // etcd binds it; then etcd exits at once and we try other ports.
        let mut failures = Vec::new();
        for _ in 0..5 {
            let client_port = free_port();
            let peer_port = std::iter::repeat_with(free_port).find(|p| *p != client_port).unwrap_or_default();
            let dir = tempfile::Builder::new().prefix("kayra-etcd-").tempdir().expect("temp dir for etcd");
            let mut etcd = Etcd { binary: binary.clone(), child: None, dir, client_port, peer_port };
            match etcd.run().await {
                Ok(()) => return etcd,
                Err(e) => failures.push(e),
            }
        }
        panic!("etcd did not start:\n{}", failures.join("\n---\n"));
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A store config for this etcd under `prefix`, with a short lock TTL
    /// (2s) and lock retry interval (50ms) so lock tests are quick.
    pub fn config(&self, prefix: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints: vec![self.endpoint()],
            prefix: prefix.to_string(),
            lock_ttl: kayra_config::Duration::from_secs(2),
            lock_retry_interval: kayra_config::Duration::from_millis(50),
            tls: None,
            username: None,
        }
    }

    /// A raw etcd client, for what the store API does not offer (compaction).
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.endpoint()], None).await.expect("etcd client")
    }

    /// Kills the server (SIGKILL), keeping its data and ports for [`Etcd::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data.
    pub async fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.run().await {
            panic!("etcd did not restart:\n{e}");
        }
    }

    /// Spawns the server and waits until it serves reads.
    async fn run(&mut self) -> Result<(), String> {
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .map_err(|e| format!("open etcd.log: {e}"))?;
        let child = Command::new(&self.binary)
            .args(["--name", "kayra-test", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &url(self.client_port)])
            .args(["--advertise-client-urls", &url(self.client_port)])
            .args(["--listen-peer-urls", &url(self.peer_port)])
            .args(["--initial-advertise-peer-urls", &url(self.peer_port)])
            .args(["--initial-cluster", &format!("kayra-test={}", url(self.peer_port))])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100", "--unsafe-no-fsync"])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| format!("etcd.log: {e}"))?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        let options = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(1));
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("etcd exited ({status}); its log:\n{}", self.log()));
            }
            let probe = async {
                let mut client = etcd_client::Client::connect([self.endpoint()], Some(options.clone())).await?;
                client.get("/kayra-testkit-ready", None).await
            };
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), probe).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!("etcd not ready after {WAIT:?}; its log:\n{}", self.log()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `etcd` binary, installed with apt-get when it is not on `PATH`.
fn etcd_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(path) = find_on_path("etcd") {
                return path;
            }
            install_etcd();
            find_on_path("etcd").unwrap_or_else(|| panic!("etcd is still not on PATH after installing etcd-server"))
        })
        .clone()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file())
}

/// `apt-get install etcd-server etcd-client`, once per machine: parallel
/// test processes queue on a file lock, and whoever comes second finds etcd
/// already installed.
fn install_etcd() {
    const SCRIPT: &str = r#"
        command -v etcd >/dev/null 2>&1 && exit 0
        if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo -n"; fi
        $sudo apt-get update &&
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server etcd-client
    "#;
    eprintln!("kayra-testkit: etcd is not on PATH; installing etcd-server and etcd-client with apt-get");
    let output = Command::new("flock")
        .args([INSTALL_LOCK, "sh", "-c", SCRIPT])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `flock {INSTALL_LOCK} sh -c ...` to install etcd: {e}"));
    assert!(
        output.status.success(),
        "installing etcd failed ({}); install etcd-server by hand.\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}
