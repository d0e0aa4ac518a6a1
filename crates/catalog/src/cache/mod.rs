//! The auth caches of `kayra serve`: users, tokens (by hash), roles,
//! cluster role bindings, namespace role bindings, namespaces and this
//! deployment's registrations, each a [`Reflector`] fed by the store's
//! list → watch → re-list [`Store::watcher`] (Kubernetes' informers).
//!
//! Authentication, RBAC and the gateway's admission checks (§6 steps 1–4)
//! answer from memory. Three rules keep every guarantee of reading the
//! store on each request:
//!
//! - **Fail closed.** A decision is made from the caches only while every
//!   one of them was confirmed current (an event, a `Progress`, a list)
//!   within `database.request_timeout`; otherwise the request is refused
//!   as unavailable (503) and `/readyz` says so.
//! - **Read your writes.** The repository reports every write it makes
//!   ([`AuthCache::note_write`]); the highest revision written under each
//!   cached prefix is that cache's mark, and a decision first waits (up to
//!   the request timeout) until each cache has reached its mark. So a
//!   revocation made through this process is enforced on its very next
//!   request; other processes see it when their watch delivers it
//!   (milliseconds; the contract allows 1 s).
//! - **Positive answers only.** Only what the cache *grants* is final: a
//!   token, namespace or registration the cache does not know, an inactive
//!   namespace, or an RBAC denial is confirmed against the store before it
//!   is answered (see `repo::auth`), so an object just created through
//!   another replica is never refused for a watch's few milliseconds.
//!
//! Object reads of the API (GET one, lists) do not come from here: they
//! read the store, one round trip, which keeps them linearizable.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kayra_core::{ApiRegistration, ClusterRoleBinding, Namespace, Role, RoleBinding, TokenRecord, User};
use kayra_store::reflector::{Reflector, WaitError};
use kayra_store::{KeyValue, Revision, Store, WatcherEvent};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::repo::layout::{Collection, Layout, RecordRef};

/// Why the caches cannot decide right now (answered as 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A cache has not completed its first list yet.
    #[error("the {0} cache is not synced yet")]
    NotSynced(&'static str),
    /// A cache has not been confirmed current for longer than allowed.
    #[error("the {cache} cache has not been confirmed current for {age:?}")]
    Stale { cache: &'static str, age: Duration },
    /// A cache did not reach this process's own write in time.
    #[error("the {cache} cache did not reach revision {wanted} in time")]
    Behind { cache: &'static str, wanted: Revision },
}

/// The auth caches of one deployment. Cheap to clone; the watch tasks stop
/// when the last clone is dropped.
#[derive(Clone)]
pub struct AuthCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AuthCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthCache").field("parts", &self.inner.parts.len()).finish()
    }
}

struct Inner {
    /// Token hash → user name.
    tokens: Reflector<String>,
    users: Reflector<()>,
    roles: Reflector<Role>,
    cluster_bindings: Reflector<ClusterRoleBinding>,
    bindings: Reflector<RoleBinding>,
    /// Namespace → active.
    namespaces: Reflector<bool>,
    registrations: Reflector<ApiRegistration>,
    /// The keys the caches are indexed by.
    layout: Layout,
    /// Every cache, with its prefix and own-write mark, for the checks
    /// that concern them all.
    parts: Vec<Part>,
    /// `database.request_timeout`: the oldest confirmation still trusted,
    /// and how long a decision waits for a cache to reach its mark.
    max_age: Duration,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

struct Part {
    name: &'static str,
    prefix: String,
    /// The highest revision this process wrote under `prefix`.
    mark: AtomicI64,
    status: Box<dyn Status>,
}

/// What the cache-wide checks need of a reflector, whatever its type.
trait Status: Send + Sync {
    fn synced(&self) -> bool;
    fn revision(&self) -> Revision;
    fn confirmed_at(&self) -> Option<Instant>;
    fn wait_for(&self, revision: Revision, timeout: Duration) -> BoxFuture<'_, Result<(), WaitError>>;
}

impl<T: Clone + Send + Sync + 'static> Status for Reflector<T> {
    fn synced(&self) -> bool {
        Reflector::synced(self)
    }
    fn revision(&self) -> Revision {
        Reflector::revision(self)
    }
    fn confirmed_at(&self) -> Option<Instant> {
        Reflector::confirmed_at(self)
    }
    fn wait_for(&self, revision: Revision, timeout: Duration) -> BoxFuture<'_, Result<(), WaitError>> {
        Box::pin(Reflector::wait_for(self, revision, timeout))
    }
}

fn json<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, String> {
    serde_json::from_slice(&kv.value).map_err(|e| e.to_string())
}

impl AuthCache {
    /// Starts the watches of deployment `platform`/`region` on `store`.
    /// `max_age` is `database.request_timeout`. The caches are empty and
    /// refuse to decide until their first lists complete
    /// ([`AuthCache::wait_synced`]).
    pub fn start(store: &Store, platform: &str, region: &str, max_age: Duration) -> Self {
        let store = store.clone();
        Self::from_source(move |prefix| store.watcher(prefix), platform, region, max_age)
    }

    /// [`AuthCache::start`] over any source of watcher streams by prefix.
    pub fn from_source(
        source: impl Fn(&str) -> BoxStream<'static, WatcherEvent>,
        platform: &str,
        region: &str,
        max_age: Duration,
    ) -> Self {
        // Only what decisions read is kept: memory stays small with
        // thousands of users and namespaces.
        let tokens = Reflector::new(|kv| json::<TokenRecord>(kv).map(|t| t.user));
        let users = Reflector::new(|kv| json::<User>(kv).map(|_| ()));
        let roles = Reflector::new(json::<Role>);
        let cluster_bindings = Reflector::new(json::<ClusterRoleBinding>);
        let bindings = Reflector::new(json::<RoleBinding>);
        let namespaces = Reflector::new(|kv| json::<Namespace>(kv).map(|ns| ns.active));
        let registrations = Reflector::new(json::<ApiRegistration>);
        let layout = Layout::new(platform, region);

        let mut parts = Vec::new();
        let mut tasks = Vec::new();
        let mut watch = |name, prefix: &str, status: Box<dyn Status>, run: BoxFuture<'static, ()>| {
            parts.push(Part { name, prefix: prefix.to_string(), mark: AtomicI64::new(0), status });
            tasks.push(tokio::spawn(run));
        };
        macro_rules! watch {
            ($name:literal, $prefix:expr, $reflector:expr) => {
                watch($name, $prefix, Box::new($reflector.clone()), Box::pin($reflector.clone().run(source($prefix))))
            };
        }
        watch!("tokens", &layout.prefix(Collection::Tokens), tokens);
        watch!("users", &layout.prefix(Collection::Users), users);
        watch!("roles", &layout.prefix(Collection::Roles), roles);
        watch!("cluster role bindings", &layout.prefix(Collection::ClusterRoleBindings), cluster_bindings);
        watch!("role bindings", &layout.prefix(Collection::RoleBindings), bindings);
        watch!("namespaces", &layout.prefix(Collection::Namespaces), namespaces);
        watch!("api registrations", &layout.prefix(Collection::Registrations), registrations);
        let inner = Inner {
            tokens,
            users,
            roles,
            cluster_bindings,
            bindings,
            namespaces,
            registrations,
            layout,
            parts,
            max_age,
            tasks,
        };
        Self { inner: Arc::new(inner) }
    }

    /// Waits until every cache has completed its first list, at most `timeout`.
    pub async fn wait_synced(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.inner.parts.iter().find(|p| !p.status.synced()) {
                None => return Ok(()),
                Some(part) if Instant::now() >= deadline => return Err(Error::NotSynced(part.name)),
                Some(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    /// Records a write this process made (its acknowledged revision) to
    /// `key`, or to every key under it when it deleted a prefix.
    pub fn note_write(&self, key: &str, revision: Revision) {
        for part in &self.inner.parts {
            if key.starts_with(&part.prefix) || part.prefix.starts_with(key) {
                part.mark.fetch_max(revision, Ordering::AcqRel);
            }
        }
    }

    /// Whether the caches may decide now: all synced and confirmed current
    /// within the request timeout. For `/readyz`.
    pub fn check_current(&self) -> Result<(), Error> {
        // One clock read for every cache: this runs twice a request.
        let now = Instant::now();
        for part in &self.inner.parts {
            let Some(at) = part.status.confirmed_at() else {
                return Err(Error::NotSynced(part.name));
            };
            let age = now.saturating_duration_since(at);
            if age > self.inner.max_age {
                return Err(Error::Stale { cache: part.name, age });
            }
        }
        Ok(())
    }

    /// What every decision from the caches waits for first: each cache has
    /// reached this process's own writes (read-your-writes), and all are
    /// current (fail closed).
    pub async fn ready(&self) -> Result<(), Error> {
        let mut deadline = None;
        for part in &self.inner.parts {
            let wanted = part.mark.load(Ordering::Acquire);
            if part.status.revision() < wanted {
                let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.inner.max_age);
                let left = deadline.saturating_duration_since(Instant::now());
                part.status.wait_for(wanted, left).await.map_err(|_| Error::Behind { cache: part.name, wanted })?;
            }
        }
        self.check_current()
    }

    /// The user a token hash belongs to, when both the token and its user
    /// are cached.
    pub fn token_user(&self, hash: &str) -> Option<String> {
        let user = self.inner.tokens.get(&self.inner.layout.key(RecordRef::Token(hash)))?;
        self.inner.users.contains(&self.inner.layout.key(RecordRef::User(&user))).then_some(user)
    }

    /// The cached roles bound to `user` by cluster role bindings (a binding
    /// to a missing role grants nothing), deduplicated.
    pub fn cluster_roles(&self, user: &str) -> Vec<Role> {
        self.with_roles(self.cluster_role_names(user), |roles| roles.cloned().collect())
    }

    /// The cached roles bound to `user` by role bindings in `namespace`.
    pub fn namespace_roles(&self, namespace: &str, user: &str) -> Vec<Role> {
        self.with_roles(self.namespace_role_names(namespace, user), |roles| roles.cloned().collect())
    }

    /// `request` decided against the cached roles bound to `user` by
    /// cluster role bindings, read in place (not copied: this is every
    /// authenticated request's RBAC check).
    pub fn cluster_decision(&self, user: &str, request: &kayra_rbac::Request<'_>) -> kayra_rbac::Decision {
        self.with_roles(self.cluster_role_names(user), |roles| kayra_rbac::authorize(roles, request))
    }

    /// `request` decided against the cached roles bound to `user` by role
    /// bindings in `namespace`.
    pub fn namespace_decision(
        &self,
        namespace: &str,
        user: &str,
        request: &kayra_rbac::Request<'_>,
    ) -> kayra_rbac::Decision {
        self.with_roles(self.namespace_role_names(namespace, user), |roles| kayra_rbac::authorize(roles, request))
    }

    fn cluster_role_names(&self, user: &str) -> Vec<String> {
        self.inner
            .cluster_bindings
            .read(|bindings| bindings.values().filter(|b| b.user == user).map(|b| b.role.clone()).collect())
    }

    fn namespace_role_names(&self, namespace: &str, user: &str) -> Vec<String> {
        let prefix = self.inner.layout.prefix(Collection::NamespaceRoleBindings(namespace));
        self.inner.bindings.read(|bindings| {
            bindings
                .range(prefix.clone()..)
                .take_while(|(key, _)| key.starts_with(&prefix))
                .filter(|(_, b)| b.user == user)
                .map(|(_, b)| b.role.clone())
                .collect()
        })
    }

    /// `f` over the cached roles of `names` (each once; a missing role is
    /// left out), in place under the roles' read lock.
    fn with_roles<R>(&self, mut names: Vec<String>, f: impl FnOnce(&mut dyn Iterator<Item = &Role>) -> R) -> R {
        names.sort_unstable();
        names.dedup();
        self.inner.roles.read(|roles| {
            let mut found = names.iter().filter_map(|name| roles.get(&self.inner.layout.key(RecordRef::Role(name))));
            f(&mut found)
        })
    }

    /// This deployment's registration `name`, when cached.
    pub fn registration(&self, name: &str) -> Option<ApiRegistration> {
        self.inner.registrations.get(&self.inner.layout.key(RecordRef::Registration(name)))
    }

    /// Whether namespace `name` is active, when cached.
    pub fn namespace_active(&self, name: &str) -> Option<bool> {
        self.inner.namespaces.get(&self.inner.layout.key(RecordRef::Namespace(name)))
    }

    /// The cached object counts, for tests and the memory benchmark.
    pub fn sizes(&self) -> Vec<(&'static str, usize)> {
        let i = &self.inner;
        vec![
            ("tokens", i.tokens.len()),
            ("users", i.users.len()),
            ("roles", i.roles.len()),
            ("cluster role bindings", i.cluster_bindings.len()),
            ("role bindings", i.bindings.len()),
            ("namespaces", i.namespaces.len()),
            ("api registrations", i.registrations.len()),
        ]
    }
}

pub mod subscribers;

#[cfg(test)]
mod tests;
