//! Shared setup of the catalog's integration tests: a store on either
//! backend, records written straight through the repository, a reconciler
//! running in-process, and condition waits with generous upper bounds.

#![allow(dead_code)]

pub mod echo;
pub mod logs;

#[allow(unused_imports)]
pub use kayra_testkit::{backend, eventually};

use kayra_catalog::repo::{RecordRef, Repository};
use kayra_config::ReconcilerConfig;
use kayra_core::{ApiRegistration, Namespace, Subscription};
use kayra_reconciler::Reconciler;
use kayra_store::Store;
use tokio_util::sync::CancellationToken;

/// Which store backend a test runs against.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Local,
    Etcd,
}

/// A store and whatever keeps it alive (temp dir, etcd process).
pub struct TestStore {
    pub store: Store,
    _dir: Option<tempfile::TempDir>,
    _etcd: Option<kayra_testkit::Etcd>,
}

pub async fn store(kind: Kind) -> TestStore {
    match kind {
        Kind::Local => {
            let dir = tempfile::tempdir().unwrap();
            let config = kayra_testkit::local_config(dir.path());
            let store = Store::new(kayra_store::local::LocalStore::open(&config.path, config.poll_interval.0).unwrap());
            TestStore { store, _dir: Some(dir), _etcd: None }
        }
        Kind::Etcd => {
            let etcd = kayra_testkit::Etcd::start().await;
            let store = Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await.unwrap());
            TestStore { store, _dir: None, _etcd: Some(etcd) }
        }
    }
}

impl TestStore {
    /// A second, independent connection to the same etcd (its own lease
    /// and job locker), as another reconciler process would have.
    pub async fn connect_again(&self) -> Store {
        let etcd = self._etcd.as_ref().expect("an etcd store");
        Store::new(kayra_store::etcd::EtcdStore::connect(&etcd.config("/kayra")).await.unwrap())
    }
}

/// Writes records the way the API would, straight through the repository.
pub struct Seed<'a>(pub &'a Repository);

impl Seed<'_> {
    pub async fn namespace(&self, name: &str) {
        let ns = Namespace { name: name.into(), ..Default::default() };
        self.0.create(RecordRef::Namespace(name), &ns, "namespace").await.unwrap();
    }

    pub async fn registration(&self, name: &str, mode: &str, sync_id: &str) {
        let reg = ApiRegistration {
            name: name.into(),
            mode: mode.into(),
            sync_id: sync_id.into(),
            platform: self.0.platform().into(),
            region: self.0.region().into(),
            ..Default::default()
        };
        self.0.create(RecordRef::Registration(name), &reg, "registration").await.unwrap();
    }

    /// Moves a registration's SyncID (the ongoing action's trigger).
    pub async fn bump(&self, name: &str, sync_id: &str) {
        let key = RecordRef::Registration(name);
        self.0
            .modify::<ApiRegistration, _>(key, "registration", |r| {
                r.sync_id = sync_id.into();
                kayra_catalog::repo::Change::Write
            })
            .await
            .unwrap();
    }

    pub async fn subscription(&self, namespace: &str, api: &str) {
        let sub = Subscription::new(namespace, api);
        self.0.create(RecordRef::Subscription { namespace, api }, &sub, "subscription").await.unwrap();
    }

    /// The force re-sync write, as `PUT .../subscriptions/:api/sync` makes
    /// it: resets only current_sync_id, always writes, says it is a re-sync.
    pub async fn force_resync(&self, namespace: &str, api: &str) {
        let key = RecordRef::Subscription { namespace, api };
        loop {
            let current = self.0.get::<Subscription>(key).await.unwrap().unwrap();
            if self.0.reset_subscription_sync(namespace, api, &current).await.unwrap().is_some() {
                return;
            }
        }
    }

    pub async fn get(&self, namespace: &str, api: &str) -> Subscription {
        self.0.get_subscription(namespace, api).await.unwrap().unwrap().value
    }
}

/// A reconciler running in this process until dropped or stopped.
pub struct Running {
    pub cancel: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(h) = self.handle.take() {
            h.await.unwrap();
        }
    }
}

impl Running {
    /// Ends the reconciler's task where it is, as a killed process ends:
    /// no graceful shutdown, nothing in flight finishes.
    pub fn abort(mut self) {
        if let Some(h) = self.handle.take() {
            h.abort();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub fn start_reconciler(repo: &Repository, config: ReconcilerConfig) -> Running {
    let cancel = CancellationToken::new();
    let reconciler = Reconciler::new(repo.clone(), config, cancel.clone()).expect("valid reconciler config");
    Running::spawn(reconciler, cancel)
}

impl Running {
    /// Runs `reconciler`, built with `cancel`, until stopped or dropped.
    pub fn spawn(reconciler: Reconciler, cancel: CancellationToken) -> Self {
        let handle = tokio::spawn(async move { reconciler.run().await.expect("reconciler run") });
        Running { cancel, handle: Some(handle) }
    }
}

/// A reconciler config whose mode `name` runs one POST to `endpoint`.
pub fn one_step_mode(config: &mut ReconcilerConfig, name: &str, endpoint: &str) {
    let yaml = format!("- method: post\n  endpoint: \"{endpoint}\"\n  timeout: 30s\n");
    config.mode.insert(name.into(), serde_norway::from_str(&yaml).unwrap());
}

/// Runs each named `async fn(Kind)` test against both backends.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::common::Kind::Local).await }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::common::Kind::Etcd).await }
            )*
        }
    };
}
