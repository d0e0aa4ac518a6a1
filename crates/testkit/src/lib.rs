//! Test setup shared by every kayra test, written once.
//!
//! - [`Etcd`]: a real, private etcd per test on free loopback ports, with a
//!   throwaway data dir, killed on drop; [`Etcd::start_tls`] adds a
//!   throwaway CA and client-certificate auth. etcd tests never skip: when
//!   the `etcd` binary is missing it is installed (Debian's `etcd-server`),
//!   and a failed install fails the test loudly.
//! - [`EtcdCluster`]: three members on loopback, for failover tests: kill,
//!   freeze (SIGSTOP), thaw and restart a member; find the leader.
//! - [`local_config`]: a local (SQLite) store config in a test's temp dir.
//! - [`eventually`]: wait for a condition with a generous upper bound,
//!   instead of sleeping and hoping.
//! - [`free_port`]: a loopback port nobody listens on right now.
//! - [`backend`]: a recording HTTP backend for reconciler tests.
//! - [`fixtures`]: sample records (a run).
//! - [`freeze`] / [`thaw`]: SIGSTOP a process and wait until it has
//!   stopped; SIGCONT it.
//!
//! Timeouts here are deliberately long ([`WAIT`]): they only matter when
//! something is broken, and CI machines are slow and shared.
//!
//! # Layout
//! - `etcd.rs`: the etcd server process.
//! - `cluster.rs`: the 3-member etcd cluster.
//! - `tls.rs`: the throwaway CA (`openssl` command line).
//! - `apt.rs`: installing a missing tool, once per machine.
//! - `backend.rs`: the recording HTTP backend.
//! - `fixtures.rs`: sample records.
//! - `process.rs`: freezing and thawing a process.

mod apt;
pub mod backend;
mod cluster;
mod etcd;
pub mod fixtures;
mod process;
mod tls;

pub use cluster::{EtcdCluster, MEMBERS};
pub use etcd::Etcd;
pub use process::{freeze, thaw};
pub use tls::Certificates;

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use kayra_config::LocalConfig;

/// The upper bound of every wait in this crate.
pub const WAIT: Duration = Duration::from_secs(30);

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
