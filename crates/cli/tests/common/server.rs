//! A real `kayra serve` on `127.0.0.1:0` over a fresh local store, with the
//! bootstrap admin, and optionally a reconciler in the same process on the
//! same store. Both stop when the [`Kayra`] is dropped.

use kayra_catalog::repo::Repository;
use kayra_config::{Config, DatabaseConfig};
use kayra_reconciler::Reconciler;
use kayra_store::Store;
use tokio_util::sync::CancellationToken;

use super::Cli;

/// The bootstrap token: `admin`, role `sysadmin`.
pub const ADMIN_TOKEN: &str = "kayra-cli-test-bootstrap-token-0123456789abcdef";

/// A running server (and maybe reconciler) for one test.
pub struct Kayra {
    /// `kayra-cli` pointed at this server with the admin token.
    pub cli: Cli,
    /// This deployment's repository on the server's store.
    pub repo: Repository,
    stop: CancellationToken,
    server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Kayra {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Kayra {
    /// The server alone: nothing activates namespaces or subscriptions.
    pub async fn start() -> Kayra {
        Self::start_inner(false).await
    }

    /// The server and a reconciler: namespaces and subscriptions converge
    /// (registration modes with no configured steps succeed at once).
    pub async fn with_reconciler() -> Kayra {
        Self::start_inner(true).await
    }

    async fn start_inner(reconcile: bool) -> Kayra {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config =
            Config { database: DatabaseConfig::local(kayra_testkit::local_config(dir.path())), ..Config::default() };
        config.auth.bootstrap_token = ADMIN_TOKEN.into();
        let store = Store::open(&config.database).await.expect("open store");
        let repo = Repository::new(store.clone(), &config.platform, &config.region);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let stop = CancellationToken::new();
        let server = tokio::spawn(kayra_server::run(config.clone(), store, listener, stop.clone().cancelled_owned()));
        if reconcile {
            let reconciler = Reconciler::new(repo.clone(), config.reconciler.clone(), stop.child_token())
                .expect("reconciler config");
            tokio::spawn(reconciler.run());
        }
        let kayra = Kayra {
            cli: Cli::new(format!("http://{addr}"), Some(ADMIN_TOKEN)),
            repo,
            stop,
            server: Some(server),
            _dir: dir,
        };
        kayra.wait_ready().await;
        kayra
    }

    /// Waits until the bootstrap admin can list namespaces.
    async fn wait_ready(&self) {
        kayra_testkit::eventually("kayra serve to answer", || async {
            self.cli.run(&["get", "catalog", "namespaces", "-o", "json"]).await.code == 0
        })
        .await;
    }

    /// Stops the server (the store stays), for "server gone" tests.
    pub async fn stop_server(&mut self) {
        self.stop.cancel();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    /// Creates a namespace, a registration (long name, short name, mode
    /// `noop`, the given endpoint) and nothing else, through the CLI.
    pub async fn register(&self, namespace: &str, api: &str, short: &str, endpoint: &str) {
        self.cli.run(&["create", "catalog", "namespaces", namespace]).await.ok();
        let body = format!(
            "{{\"name\": \"{api}\", \"short_name\": \"{short}\", \"mode\": \"noop\", \"endpoint\": \"{endpoint}\"}}"
        );
        self.cli.run(&["create", "catalog", "apiregistrations", "-d", &body]).await.ok();
    }

    /// Subscribes `namespace` to `api` through the CLI and waits, with
    /// `--until-synced`, until the reconciler has synced it.
    pub async fn subscribe_synced(&self, namespace: &str, api: &str) {
        self.cli.run(&["create", "catalog", "-n", namespace, "subscriptions", api]).await.ok();
        let wait = ["get", "catalog", "-n", namespace, "subscriptions", api, "--until-synced", "--interval", "50ms"];
        self.cli.run(&wait).await.ok();
    }
}
