//! A private etcd server per test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kayra_config::EtcdConfig;

use crate::{Certificates, WAIT, free_port};

/// A single-member etcd of this test's own, tuned for speed (10ms
/// heartbeats, no fsync): never point it at data you care about.
pub struct Etcd {
    binary: PathBuf,
    child: Option<Child>,
    /// Data dir (`data/`), certificates (`certs/`) and the log (`etcd.log`).
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    /// Set when clients must use TLS with a client certificate.
    certs: Option<Certificates>,
    /// More command-line flags ([`Etcd::start_with`]).
    flags: Vec<String>,
}

impl Etcd {
    /// Starts etcd over plain HTTP (installing it first if needed) and
    /// waits until it answers reads. Panics with etcd's log if it never does.
    pub async fn start() -> Etcd {
        Self::launch(false, &[]).await
    }

    /// Like [`Etcd::start`], with more etcd flags, such as a small
    /// `--quota-backend-bytes` or `--max-request-bytes`.
    pub async fn start_with(flags: &[&str]) -> Etcd {
        Self::launch(false, flags).await
    }

    /// Like [`Etcd::start`], serving clients over TLS only, with a
    /// throwaway CA and `--client-cert-auth`: the production setup.
    /// [`Etcd::config`] then carries the client certificate.
    pub async fn start_tls() -> Etcd {
        Self::launch(true, &[]).await
    }

    async fn launch(tls: bool, flags: &[&str]) -> Etcd {
        let binary = tokio::task::spawn_blocking(etcd_binary).await.expect("locating etcd");
        // A port picked by free_port can be taken by someone else before
        // etcd binds it; then etcd exits at once and we try other ports.
        let mut failures = Vec::new();
        for _ in 0..5 {
            let client_port = free_port();
            let peer_port = std::iter::repeat_with(free_port).find(|p| *p != client_port).unwrap_or_default();
            let dir = tempfile::Builder::new().prefix("kayra-etcd-").tempdir().expect("temp dir for etcd");
            let certs = if tls {
                let certs_dir = dir.path().join("certs");
                Some(tokio::task::spawn_blocking(move || Certificates::generate(&certs_dir)).await.expect("certs"))
            } else {
                None
            };
            let flags = flags.iter().map(ToString::to_string).collect();
            let mut etcd = Etcd { binary: binary.clone(), child: None, dir, client_port, peer_port, certs, flags };
            match etcd.run().await {
                Ok(()) => return etcd,
                Err(e) => failures.push(e),
            }
        }
        panic!("etcd did not start:\n{}", failures.join("\n---\n"));
    }

    /// `http://127.0.0.1:<port>`, or `https://` for [`Etcd::start_tls`].
    pub fn endpoint(&self) -> String {
        let scheme = if self.certs.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The throwaway CA and certificates of [`Etcd::start_tls`].
    pub fn certificates(&self) -> Option<&Certificates> {
        self.certs.as_ref()
    }

    /// A store config for this etcd under `prefix`, with a short lock TTL
    /// (2s) and lock retry interval (50ms) so lock tests are quick.
    pub fn config(&self, prefix: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints: vec![self.endpoint()],
            prefix: prefix.to_string(),
            lock_ttl: kayra_config::Duration::from_secs(2),
            lock_retry_interval: kayra_config::Duration::from_millis(50),
            tls: self.certs.as_ref().map(Certificates::client_config),
            username: None,
        }
    }

    /// A raw etcd client, for what the store API does not offer (compaction, auth setup).
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.endpoint()], Some(self.connect_options())).await.expect("etcd client")
    }

    fn connect_options(&self) -> etcd_client::ConnectOptions {
        connect_options(self.certs.as_ref())
    }

    /// The server's process id while it runs (to freeze it with SIGSTOP).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the server ([`crate::freeze`]): its connections stay open,
    /// unanswered, until [`Etcd::thaw`].
    pub fn freeze(&self) {
        crate::freeze(self.pid().expect("etcd runs"));
    }

    /// Thaws the server (SIGCONT).
    pub fn thaw(&self) {
        crate::thaw(self.pid().expect("etcd runs"));
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
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let client = self.endpoint();
        let child = spawn_member(&Member {
            binary: &self.binary,
            name: "kayra-test",
            data_dir: &self.dir.path().join("data"),
            client: &client,
            peer: &peer,
            initial_cluster: &format!("kayra-test={peer}"),
            cluster_token: None,
            timing_ms: ["10", "100"],
            log_level: "error",
            log: &self.dir.path().join("etcd.log"),
            certs: self.certs.as_ref(),
            flags: &self.flags,
        })?;
        self.child = Some(child);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("etcd exited ({status}); its log:\n{}", self.log()));
            }
            let probe = async {
                let mut client = etcd_client::Client::connect([self.endpoint()], Some(self.connect_options())).await?;
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

/// One etcd member to start: what differs between a lone test etcd and a
/// cluster's members.
pub(crate) struct Member<'a> {
    pub binary: &'a Path,
    pub name: &'a str,
    pub data_dir: &'a Path,
    pub client: &'a str,
    pub peer: &'a str,
    /// `name=peer,...` of every member.
    pub initial_cluster: &'a str,
    pub cluster_token: Option<&'a str>,
    /// Heartbeat interval and election timeout, in milliseconds.
    pub timing_ms: [&'a str; 2],
    pub log_level: &'a str,
    /// Where its stdout and stderr go (appended).
    pub log: &'a Path,
    pub certs: Option<&'a Certificates>,
    /// More flags, last.
    pub flags: &'a [String],
}

/// Spawns `member` (no fsync: tests measure kayra, not the disk).
pub(crate) fn spawn_member(member: &Member<'_>) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(member.log)
        .map_err(|e| format!("open {}: {e}", member.log.display()))?;
    let mut command = Command::new(member.binary);
    command
        .args(["--name", member.name, "--data-dir"])
        .arg(member.data_dir)
        .args(["--listen-client-urls", member.client, "--advertise-client-urls", member.client])
        .args(["--listen-peer-urls", member.peer, "--initial-advertise-peer-urls", member.peer])
        .args(["--initial-cluster", member.initial_cluster, "--initial-cluster-state", "new"]);
    if let Some(token) = member.cluster_token {
        command.args(["--initial-cluster-token", token]);
    }
    let [heartbeat, election] = member.timing_ms;
    command.args(["--heartbeat-interval", heartbeat, "--election-timeout", election, "--unsafe-no-fsync"]).args([
        "--logger",
        "zap",
        "--log-level",
        member.log_level,
    ]);
    if let Some(certs) = member.certs {
        command
            .arg("--cert-file")
            .arg(&certs.server_cert)
            .arg("--key-file")
            .arg(&certs.server_key)
            .arg("--trusted-ca-file")
            .arg(&certs.ca)
            .arg("--client-cert-auth");
    }
    command.args(member.flags);
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| format!("{}: {e}", member.log.display()))?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", member.binary.display()))
}

/// Raw-client options for an etcd with `certs` (TLS with a client certificate) or without.
pub(crate) fn connect_options(certs: Option<&Certificates>) -> etcd_client::ConnectOptions {
    let options = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(1));
    let Some(certs) = certs else { return options };
    let read = |path: &PathBuf| std::fs::read(path).expect("read certificate");
    options.with_tls(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(&certs.ca)))
            .identity(etcd_client::Identity::from_pem(read(&certs.client_cert), read(&certs.client_key))),
    )
}

/// The `etcd` binary, installed with apt-get when it is not on `PATH`.
pub(crate) fn etcd_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| crate::apt::ensure("etcd", &["etcd-server", "etcd-client"])).clone()
}
