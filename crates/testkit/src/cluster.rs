//! A private 3-member etcd cluster per test, for failover tests.
//!
//! Members run on free loopback ports with 100ms heartbeats and a 1s
//! election timeout (a new leader about a second after the old one dies;
//! shorter timeouts cause spurious elections on a loaded 2-core machine)
//! and no fsync. A member can be killed (SIGKILL), frozen (SIGSTOP: its
//! sockets stay open and say nothing, the nastiest failure for a client),
//! thawed (SIGCONT) and restarted on its data.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kayra_config::EtcdConfig;

use crate::{Certificates, WAIT, free_port};

/// The number of members of an [`EtcdCluster`].
pub const MEMBERS: usize = 3;

/// A 3-member etcd cluster of this test's own; killed on drop.
pub struct EtcdCluster {
    binary: PathBuf,
    /// `m<i>/` data dirs and `m<i>.log` logs, `certs/`.
    dir: tempfile::TempDir,
    members: Vec<Member>,
    certs: Option<Certificates>,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    frozen: bool,
}

impl EtcdCluster {
    /// Starts three members over plain HTTP and waits until all serve reads.
    pub async fn start() -> EtcdCluster {
        Self::launch(false).await
    }

    /// Like [`EtcdCluster::start`], clients over TLS with a client
    /// certificate (`--client-cert-auth`), peers over plain HTTP.
    pub async fn start_tls() -> EtcdCluster {
        Self::launch(true).await
    }

    async fn launch(tls: bool) -> EtcdCluster {
        let binary = tokio::task::spawn_blocking(crate::etcd::etcd_binary).await.expect("locating etcd");
        let mut failures = Vec::new();
        for _ in 0..3 {
            let dir = tempfile::Builder::new().prefix("kayra-etcd-cluster-").tempdir().expect("temp dir for etcd");
            let certs = if tls {
                let certs_dir = dir.path().join("certs");
                Some(tokio::task::spawn_blocking(move || Certificates::generate(&certs_dir)).await.expect("certs"))
            } else {
                None
            };
            let mut ports = Vec::new();
            while ports.len() < 2 * MEMBERS {
                let port = free_port();
                if !ports.contains(&port) {
                    ports.push(port);
                }
            }
            let members = (0..MEMBERS)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: ports[2 * i],
                    peer_port: ports[2 * i + 1],
                    child: None,
                    frozen: false,
                })
                .collect();
            let mut cluster = EtcdCluster { binary: binary.clone(), dir, members, certs };
            let spawned: Result<(), String> = (0..MEMBERS).try_for_each(|i| cluster.spawn(i));
            let ready = match spawned {
                Ok(()) => cluster.wait_ready((0..MEMBERS).collect()).await,
                Err(e) => Err(e),
            };
            match ready {
                Ok(()) => return cluster,
                Err(e) => {
                    cluster.stop_all();
                    failures.push(e);
                }
            }
        }
        panic!("etcd cluster did not start:\n{}", failures.join("\n---\n"));
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.certs.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client URL, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..MEMBERS).map(|i| self.endpoint(i)).collect()
    }

    /// The throwaway CA and certificates of [`EtcdCluster::start_tls`].
    pub fn certificates(&self) -> Option<&Certificates> {
        self.certs.as_ref()
    }

    /// A store config listing every member, with lock TTL `lock_ttl` and a
    /// 50ms lock retry interval.
    pub fn config(&self, prefix: &str, lock_ttl: Duration) -> EtcdConfig {
        EtcdConfig {
            endpoints: self.endpoints(),
            prefix: prefix.to_string(),
            lock_ttl: kayra_config::Duration(lock_ttl),
            lock_retry_interval: kayra_config::Duration::from_millis(50),
            tls: self.certs.as_ref().map(Certificates::client_config),
            username: None,
        }
    }

    /// A raw client of member `i` alone.
    pub async fn client(&self, i: usize) -> etcd_client::Client {
        let options = crate::etcd::connect_options(self.certs.as_ref());
        etcd_client::Client::connect([self.endpoint(i)], Some(options)).await.expect("etcd client")
    }

    /// The member that leads now, as seen by the running members
    /// (`leader == header.member_id` in a member's status). Waits for an
    /// election to finish; panics after [`WAIT`].
    pub async fn leader(&self) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            for i in (0..MEMBERS).filter(|&i| self.is_running(i)) {
                let probe = async {
                    let mut client = self.client(i).await;
                    client.status().await
                };
                if let Ok(Ok(status)) = tokio::time::timeout(Duration::from_secs(1), probe).await {
                    let me = status.header().map(|h| h.member_id()).unwrap_or_default();
                    if status.leader() != 0 && status.leader() == me {
                        return i;
                    }
                }
            }
            assert!(Instant::now() < deadline, "no etcd member leads after {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Hands leadership to member `to` (etcd's MoveLeader) and waits until it leads.
    pub async fn move_leader(&self, to: usize) {
        let leader = self.leader().await;
        if leader == to {
            return;
        }
        let target = self.client(to).await.status().await.expect("status of the new leader");
        let id = target.header().map(|h| h.member_id()).expect("member id");
        self.client(leader).await.move_leader(id).await.expect("move leader");
        crate::eventually("the moved leader to lead", || async { self.leader().await == to }).await;
    }

    /// Kills member `i` (SIGKILL), keeping its data for [`EtcdCluster::restart`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            signal(&child, "CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes member `i` (SIGSTOP): its connections stay open, unanswered.
    pub fn freeze(&mut self, i: usize) {
        if let Some(child) = &self.members[i].child {
            crate::freeze(child.id());
        }
        self.frozen_set(i, true);
    }

    /// Thaws member `i` (SIGCONT).
    pub fn thaw(&mut self, i: usize) {
        if let Some(child) = &self.members[i].child {
            crate::thaw(child.id());
        }
        self.frozen_set(i, false);
    }

    /// Starts member `i` again on its data and ports, and waits until it serves.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i);
        self.frozen_set(i, false);
        if let Err(e) = self.spawn(i) {
            panic!("etcd member m{i} did not restart: {e}");
        }
        if let Err(e) = self.wait_ready(vec![i]).await {
            panic!("etcd member m{i} did not restart: {e}");
        }
    }

    fn frozen_set(&mut self, i: usize, frozen: bool) {
        self.members[i].frozen = frozen;
    }

    /// Running and not frozen.
    fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some() && !self.members[i].frozen
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let peer = |m: &Member| format!("http://127.0.0.1:{}", m.peer_port);
        let initial_cluster =
            self.members.iter().map(|m| format!("{}={}", m.name, peer(m))).collect::<Vec<_>>().join(",");
        let member = &self.members[i];
        let client = self.endpoint(i);
        let child = crate::etcd::spawn_member(&crate::etcd::Member {
            binary: &self.binary,
            name: &member.name,
            data_dir: &self.dir.path().join(&member.name),
            client: &client,
            peer: &peer(member),
            initial_cluster: &initial_cluster,
            cluster_token: Some("kayra-test"),
            timing_ms: ["100", "1000"],
            log_level: "warn",
            log: &self.dir.path().join(format!("{}.log", member.name)),
            certs: self.certs.as_ref(),
            flags: &[],
        })?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Waits until each of `members` answers a linearizable read (so the
    /// cluster has a leader and the member has caught up).
    async fn wait_ready(&mut self, members: Vec<usize>) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        for i in members {
            loop {
                if let Some(status) = self.members[i].child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    self.members[i].child = None;
                    return Err(format!("etcd m{i} exited ({status}); logs:\n{}", self.logs()));
                }
                let probe = async {
                    let options = crate::etcd::connect_options(self.certs.as_ref());
                    let mut client = etcd_client::Client::connect([self.endpoint(i)], Some(options)).await?;
                    client.get("/kayra-testkit-ready", None).await
                };
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), probe).await {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("etcd m{i} not ready after {WAIT:?}; logs:\n{}", self.logs()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Every member's log, for failure messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = std::fs::read_to_string(self.dir.path().join(format!("{}.log", m.name))).unwrap_or_default();
                format!("== {} ==\n{log}", m.name)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn stop_all(&mut self) {
        for i in 0..MEMBERS {
            self.kill(i);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Sends `SIG<name>` to `child` with kill(1).
fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
