//! Namespaces, API registrations and subscriptions.
//!
//! The reconciler's namespace activation lives here too
//! (`activate_namespace`): it skips writing when nothing would change, so
//! the reconciler never loops on the events of its own writes. Its result
//! write is [`Repository::write_result`].
//!
//! The catalog API's writes that need more than one record live here as
//! well: referential integrity (a namespace or registration with
//! subscriptions cannot be deleted), the subscription `/sync` reset and the
//! registration `/sync` bump. Each of them is one store transaction
//! (`kayra_store::Txn`: one etcd Txn, one SQLite transaction) whose
//! compares carry the checks, over guard and index keys written with the
//! records (`keys::short_name`, `keys::subscriber`,
//! `keys::namespace_subscriber`): a short name is claimed atomically, a
//! subscription cannot be created against a namespace or registration
//! being deleted, a delete cannot miss a subscription created meanwhile.
//! Records written before the index keys existed are still found by the
//! (non-atomic) listings that name them in the 409.

use std::time::{Duration, SystemTime};

use kayra_core::{ApiRegistration, Namespace, RoleBinding, Subscription};
use kayra_store::{Compare, Op, Revision, Txn};
use serde::Deserialize;
use serde_json::Value;

use super::audit::shown;
use super::{Change, Collection, Error, RecordRef, Repository, Result, Versioned, decode, encode, keys};

/// Attempts of a guarded write whose guards moved underneath it.
const GUARDED_ATTEMPTS: usize = 20;

/// How many subscribed namespaces a refused registration delete names:
/// a registration may have a hundred thousand subscribers.
const NAMED_SUBSCRIBERS: usize = 20;

/// The outcome of [`Repository::activate_namespace`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Written; the record's new revision.
    Written(Revision),
    /// Nothing to change: the record already said so.
    Unchanged,
    /// The record changed (or vanished) since the decision was made: the
    /// fresh record must decide again.
    Stale,
}

/// A subscription read with what its views and 404s need
/// ([`Repository::read_subscription`]).
#[derive(Debug, Clone)]
pub struct SubscriptionRead {
    pub subscription: Option<Versioned<Subscription>>,
    /// The registration's current SyncID, or "" when it is gone.
    pub sync_id: String,
    pub namespace_exists: bool,
}

/// The one field of a registration a subscription's view needs: decoding
/// only it skips the rest of the record (its pipeline, its policy) without
/// building them, on every GET.
#[derive(Deserialize)]
struct CurrentSyncId {
    #[serde(default)]
    sync_id: String,
}

/// Why [`Repository::create_subscription`] wrote nothing, told apart by the
/// failure branch's reads of the same transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateRefused {
    NoNamespace,
    NoRegistration,
    Exists,
}

impl Repository {
    pub async fn get_namespace(&self, name: &str) -> Result<Option<Versioned<Namespace>>> {
        self.get(RecordRef::Namespace(name)).await
    }

    /// Sets `active: true` (and nothing else) unless it already is.
    pub async fn activate_namespace(&self, name: &str) -> Result<Recorded> {
        let mut wrote = false;
        let result = self
            .modify::<Namespace, _>(RecordRef::Namespace(name), &format!("namespace {name:?}"), |ns| {
                if ns.active {
                    wrote = false;
                    Change::Keep
                } else {
                    ns.active = true;
                    wrote = true;
                    Change::Write
                }
            })
            .await;
        match result {
            Ok(v) if wrote => Ok(Recorded::Written(v.revision)),
            Ok(_) => Ok(Recorded::Unchanged),
            Err(Error::NotFound(_)) => Ok(Recorded::Stale),
            Err(e) => Err(e),
        }
    }

    /// A registration of this deployment, by long name.
    pub async fn get_registration(&self, name: &str) -> Result<Option<Versioned<ApiRegistration>>> {
        self.get(RecordRef::Registration(name)).await
    }

    /// The registration the gateway admits a request to (§6 step 2): from
    /// the caches when attached and they know it, else from the store.
    pub async fn admit_registration(&self, name: &str) -> Result<Option<ApiRegistration>> {
        if let Some(cache) = self.cache() {
            cache.ready().await.map_err(super::auth::unavailable)?;
            if let Some(registration) = cache.registration(name) {
                return Ok(Some(registration));
            }
        }
        Ok(self.get_registration(name).await?.map(|r| r.value))
    }

    /// Whether namespace `name` is active, `None` when it does not exist
    /// (§6 step 3): "active" from the caches when attached, anything else
    /// confirmed against the store.
    pub async fn admit_namespace(&self, name: &str) -> Result<Option<bool>> {
        if let Some(cache) = self.cache() {
            cache.ready().await.map_err(super::auth::unavailable)?;
            if cache.namespace_active(name) == Some(true) {
                return Ok(Some(true));
            }
        }
        Ok(self.get_namespace(name).await?.map(|ns| ns.value.active))
    }

    /// A subscription with its registration's SyncID, read together in one
    /// round trip (one etcd Txn of two gets; one SQLite statement), so a GET of
    /// a subscription is as linearizable, and nearly as cheap, as one store
    /// read; and whether its namespace exists. That is implied by the
    /// subscription (a namespace is deleted only once it has none, in a
    /// transaction that checks it), so the namespace is read only when the
    /// subscription is missing, for the 404 to say which it is.
    pub async fn read_subscription(&self, namespace: &str, api: &str) -> Result<SubscriptionRead> {
        self.read_subscription_in(namespace, api, false).await
    }

    /// [`Repository::read_subscription`], the namespace read in the same
    /// round trip when `namespace_too` (a caller that expects misses).
    async fn read_subscription_in(&self, namespace: &str, api: &str, namespace_too: bool) -> Result<SubscriptionRead> {
        let (p, r) = (&*self.base.platform, &*self.base.region);
        let mut txn = Txn::new()
            .then(Op::Get { key: keys::subscription(p, r, namespace, api) })
            .then(Op::Get { key: keys::registration(p, r, api) });
        if namespace_too {
            txn = txn.then(Op::Get { key: keys::namespace(namespace) });
        }
        let mut gets = self.txn(txn).await?.gets.into_iter();
        let subscription = gets.next().flatten().map(|kv| decode::<Subscription>(&kv)).transpose()?;
        let sync_id =
            gets.next().flatten().map(|kv| decode::<CurrentSyncId>(&kv)).transpose()?.map(|r| r.value.sync_id);
        let sync_id = sync_id.unwrap_or_default();
        let namespace_exists = match (&subscription, namespace_too) {
            (Some(_), _) => true,
            (None, true) => gets.next().flatten().is_some(),
            (None, false) => self.store().get(&keys::namespace(namespace)).await?.0.is_some(),
        };
        Ok(SubscriptionRead { subscription, sync_id, namespace_exists })
    }

    /// Every registration of this deployment.
    pub async fn list_registrations(&self) -> Result<(Vec<Versioned<ApiRegistration>>, Revision)> {
        self.list_all(Collection::Registrations).await
    }

    /// The registration of this deployment whose `short_name` is `short`.
    pub async fn find_registration_by_short_name(&self, short: &str) -> Result<Option<ApiRegistration>> {
        if short.is_empty() {
            return Ok(None);
        }
        let (all, _) = self.list_registrations().await?;
        Ok(all.into_iter().map(|v| v.value).find(|r| r.short_name == short))
    }

    pub async fn get_subscription(&self, namespace: &str, api: &str) -> Result<Option<Versioned<Subscription>>> {
        self.get(RecordRef::Subscription { namespace, api }).await
    }

    /// Every subscription of this deployment.
    pub async fn list_subscriptions(&self) -> Result<(Vec<Versioned<Subscription>>, Revision)> {
        self.list_all(Collection::Subscriptions).await
    }

    /// Parses a subscription key of this deployment into `(namespace, api)`.
    pub fn subscription_key_parts<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str)> {
        match self.base.layout.parse(key)? {
            RecordRef::Subscription { namespace, api } => Some((namespace, api)),
            _ => None,
        }
    }

    /// Parses a registration key of this deployment into the long name.
    pub fn registration_key_name<'k>(&self, key: &'k str) -> Option<&'k str> {
        match self.base.layout.parse(key)? {
            RecordRef::Registration(name) => Some(name),
            _ => None,
        }
    }

    /// Parses a namespace key into the namespace's name.
    pub fn namespace_key_name<'k>(&self, key: &'k str) -> Option<&'k str> {
        match self.base.layout.parse(key)? {
            RecordRef::Namespace(name) => Some(name),
            _ => None,
        }
    }
}

/// A subscription named by a referential-integrity error: namespaces are
/// shared by every deployment on a store, so it may be another deployment's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionRef {
    pub platform: String,
    pub region: String,
    pub namespace: String,
    pub api: String,
}

/// A fresh SyncID: the current UTC time, RFC 3339 with nanoseconds, and
/// never equal to `previous` (a clock that did not move, or a previous value
/// set by hand to the same instant, still yields a new value).
pub fn new_sync_id(previous: &str) -> String {
    let mut now = SystemTime::now();
    loop {
        let candidate = humantime::format_rfc3339_nanos(now).to_string();
        if candidate != previous {
            return candidate;
        }
        now += Duration::from_nanos(1);
    }
}

/// A `sync_id_updated_at` for a write made now: RFC 3339, UTC, milliseconds.
pub fn sync_id_updated_now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Repository {
    /// Every subscription, of any deployment, in namespace `namespace`:
    /// from its index (the keys its namespace's delete compares empty),
    /// not a read of every subscription.
    pub async fn subscriptions_in_namespace_everywhere(&self, namespace: &str) -> Result<Vec<SubscriptionRef>> {
        let (kvs, _) = self.base.store.list_all(&keys::namespace_subscribers(namespace)).await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| keys::namespace_subscriber_parts(namespace, &kv.key))
            .map(|[platform, region, api]| SubscriptionRef {
                platform: platform.into(),
                region: region.into(),
                namespace: namespace.into(),
                api: api.into(),
            })
            .collect())
    }

    /// Up to `limit` namespaces subscribed to this deployment's
    /// registration `api`, from its subscriber index, and whether there
    /// are more.
    async fn some_subscriber_namespaces(&self, api: &str, limit: usize) -> Result<(Vec<String>, bool)> {
        let prefix = keys::subscribers(&self.base.platform, &self.base.region, api);
        let page = self.base.store.list(&prefix, None, limit).await?;
        let names =
            page.items.iter().filter_map(|kv| kv.key.strip_prefix(prefix.as_str())).map(str::to_string).collect();
        Ok((names, page.more))
    }

    /// This deployment's subscriptions to registration `api`, by namespace.
    pub async fn registration_subscribers(&self, api: &str) -> Result<Vec<Versioned<Subscription>>> {
        let (all, _) = self.list_subscriptions().await?;
        Ok(all.into_iter().filter(|s| s.value.api == api).collect())
    }

    /// Deletes a namespace that has no subscriptions in any deployment
    /// (`Conflict` naming them otherwise), with its role bindings, in one
    /// transaction that holds only while no subscription index entry exists
    /// under the namespace: a subscription or role binding created
    /// concurrently either makes the delete fail or fails itself.
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        let what = format!("namespace {name:?}");
        for _ in 0..GUARDED_ATTEMPTS {
            let current = self.get_namespace(name).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
            let subscriptions = self.subscriptions_in_namespace_everywhere(name).await?;
            if !subscriptions.is_empty() {
                let names: Vec<String> = subscriptions.iter().map(|s| self.describe(s)).collect();
                return Err(Error::Conflict(format!(
                    "namespace {name:?} still has subscriptions: {}; delete them first",
                    names.join(", ")
                )));
            }
            let txn = Txn::new()
                .when(Compare::ModRevision(keys::namespace(name), current.revision))
                .when(Compare::PrefixEmpty(keys::namespace_subscribers(name)))
                .then(Op::Delete { key: keys::namespace(name) })
                .then(Op::DeletePrefix { prefix: keys::role_bindings(name) });
            if self.auditing(shown(&current.value), Value::Null).txn(txn).await?.succeeded {
                return Ok(());
            }
        }
        Err(Error::Conflict(format!("{what} keeps changing; try again")))
    }

    /// Deletes one of this deployment's registrations, refused (`Conflict`
    /// naming the namespaces) while any subscription references it; its
    /// short-name claim goes with it, in the same transaction.
    pub async fn delete_registration(&self, name: &str) -> Result<()> {
        let what = format!("api registration {name:?}");
        let key = keys::registration(&self.base.platform, &self.base.region, name);
        for _ in 0..GUARDED_ATTEMPTS {
            let current = self.get_registration(name).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
            // From the subscriber index (the keys the delete compares
            // empty), naming at most a few of them.
            let (namespaces, more) = self.some_subscriber_namespaces(name, NAMED_SUBSCRIBERS).await?;
            if !namespaces.is_empty() {
                let more = if more { ", and more" } else { "" };
                return Err(Error::Conflict(format!(
                    "api registration {name:?} still has subscriptions in namespaces {}{more}; delete them first",
                    namespaces.join(", ")
                )));
            }
            let mut txn = Txn::new()
                .when(Compare::ModRevision(key.clone(), current.revision))
                .when(Compare::PrefixEmpty(keys::subscribers(&self.base.platform, &self.base.region, name)))
                .then(Op::Delete { key: key.clone() });
            if let Some((guard, revision)) = self.short_name_claim(&current.value.short_name, name).await? {
                txn = txn.when(Compare::ModRevision(guard.clone(), revision)).then(Op::Delete { key: guard });
            }
            if self.auditing(shown(&current.value), Value::Null).txn(txn).await?.succeeded {
                return Ok(());
            }
        }
        Err(Error::Conflict(format!("{what} keeps changing; try again")))
    }

    /// The guard key of `short` and its revision, when `name` holds the claim.
    async fn short_name_claim(&self, short: &str, name: &str) -> Result<Option<(String, Revision)>> {
        if short.is_empty() {
            return Ok(None);
        }
        let guard = keys::short_name(&self.base.platform, &self.base.region, short);
        let claim = self.get_key::<String>(&guard).await?;
        Ok(claim.filter(|c| c.value == name).map(|c| (guard, c.revision)))
    }

    /// Creates a registration, claiming its short name in the same
    /// transaction: two concurrent creates with one new short name cannot
    /// both succeed, and a short name never equals another registration's
    /// long name (nor a long name another's short name).
    pub async fn create_registration(&self, registration: &ApiRegistration) -> Result<Revision> {
        let (name, short) = (registration.name.as_str(), registration.short_name.as_str());
        let key = keys::registration(&self.base.platform, &self.base.region, name);
        let name_as_short = keys::short_name(&self.base.platform, &self.base.region, name);
        let mut txn = Txn::new()
            .when(Compare::Absent(key.clone()))
            .when(Compare::Absent(name_as_short.clone()))
            .then(Op::Put { key: key.clone(), value: encode(registration) })
            .otherwise(Op::Get { key })
            .otherwise(Op::Get { key: name_as_short });
        if !short.is_empty() {
            let guard = keys::short_name(&self.base.platform, &self.base.region, short);
            let short_as_name = keys::registration(&self.base.platform, &self.base.region, short);
            txn = txn
                .when(Compare::Absent(guard.clone()))
                .when(Compare::Absent(short_as_name.clone()))
                .then(Op::Put { key: guard.clone(), value: encode(&name) })
                .otherwise(Op::Get { key: guard })
                .otherwise(Op::Get { key: short_as_name });
        }
        let resp = self.txn(txn).await?;
        if resp.succeeded {
            return Ok(resp.revision);
        }
        let owner = |i: usize| -> Option<String> {
            let kv = resp.gets.get(i)?.as_ref()?;
            decode::<String>(kv).map(|v| v.value).ok().or_else(|| Some(kv.key.rsplit('/').next()?.to_string()))
        };
        Err(Error::Conflict(if resp.gets.first().is_some_and(Option::is_some) {
            format!("api registration {name:?} already exists")
        } else if let Some(other) = owner(1) {
            format!("name {name:?} is already the short name of api registration {other:?}")
        } else if let Some(other) = owner(2).or_else(|| owner(3)) {
            format!("short name {short:?} is already used by api registration {other:?}")
        } else {
            format!("api registration {name:?} was changed concurrently")
        }))
    }

    /// Replaces a registration read at `current.revision` with `next`,
    /// moving its short-name claim in the same transaction. `Ok(None)` when
    /// the registration or a claim changed meanwhile: re-read and retry.
    /// `Conflict` when the new short name is taken.
    pub async fn update_registration(
        &self,
        current: &Versioned<ApiRegistration>,
        next: &ApiRegistration,
    ) -> Result<Option<Revision>> {
        let name = current.value.name.as_str();
        let key = keys::registration(&self.base.platform, &self.base.region, name);
        let mut txn = Txn::new()
            .when(Compare::ModRevision(key.clone(), current.revision))
            .then(Op::Put { key, value: encode(next) });
        let (old, new) = (current.value.short_name.as_str(), next.short_name.as_str());
        let held = self.short_name_claim(old, name).await?;
        if old != new
            && let Some((guard, revision)) = &held
        {
            txn = txn.when(Compare::ModRevision(guard.clone(), *revision)).then(Op::Delete { key: guard.clone() });
        }
        let mut taken_checks = None;
        if !new.is_empty() {
            let guard = keys::short_name(&self.base.platform, &self.base.region, new);
            match (&held, old == new) {
                // Already ours: keep it ours.
                (Some((_, revision)), true) => txn = txn.when(Compare::ModRevision(guard, *revision)),
                // New to us (or a record from before claims existed): claim it.
                _ => {
                    let short_as_name = keys::registration(&self.base.platform, &self.base.region, new);
                    txn = txn
                        .when(Compare::Absent(guard.clone()))
                        .when(Compare::Absent(short_as_name.clone()))
                        .then(Op::Put { key: guard.clone(), value: encode(&name) });
                    taken_checks = Some((guard, short_as_name));
                }
            }
        }
        if let Some((guard, short_as_name)) = &taken_checks {
            txn = txn.otherwise(Op::Get { key: guard.clone() }).otherwise(Op::Get { key: short_as_name.clone() });
        }
        let resp = self.txn(txn).await?;
        if resp.succeeded {
            return Ok(Some(resp.revision));
        }
        let taken_by = resp.gets.iter().flatten().find_map(|kv| {
            decode::<String>(kv).map(|v| v.value).ok().or_else(|| kv.key.rsplit('/').next().map(str::to_string))
        });
        match taken_by {
            Some(other) if other != name => {
                Err(Error::Conflict(format!("short name {new:?} is already used by api registration {other:?}")))
            }
            _ => Ok(None),
        }
    }

    /// Creates a brand-new subscription (inactive, `init`, never synced) in
    /// one transaction: the namespace and the registration exist and the
    /// subscription does not, as its compares; the failure branch's reads
    /// tell which one failed ([`CreateRefused`]), and the success branch
    /// reads the registration for the view's `expected_sync_id` (returned
    /// with the subscription). One round trip either way. Its index keys
    /// are written with it, so the namespace's and the registration's
    /// deletes see it atomically.
    pub async fn create_subscription(
        &self,
        namespace: &str,
        api: &str,
    ) -> Result<Result<(Versioned<Subscription>, String), CreateRefused>> {
        let (p, r) = (&*self.base.platform, &*self.base.region);
        let subscription = Subscription::new(namespace, api);
        let key = keys::subscription(p, r, namespace, api);
        // The audit record shows the new subscription as a GET would, with
        // its registration's SyncID: from the caches (`kayra serve`; no
        // round trip, "" when they do not know it yet), else read.
        let handle = match self.audit_context() {
            Some(_) => {
                let sync_id = match self.cache() {
                    Some(cache) => cache.registration(api).map(|r| r.sync_id).unwrap_or_default(),
                    None => self.get_registration(api).await?.map(|r| r.value.sync_id).unwrap_or_default(),
                };
                self.auditing(Value::Null, shown(&subscription.view(&sync_id)))
            }
            None => self.clone(),
        };
        let txn = Txn::new()
            .when(Compare::Exists(keys::namespace(namespace)))
            .when(Compare::Exists(keys::registration(p, r, api)))
            .when(Compare::Absent(key.clone()))
            .then(Op::Put { key: key.clone(), value: encode(&subscription) })
            .then(Op::Put { key: keys::subscriber(p, r, api, namespace), value: encode(&key) })
            .then(Op::Put { key: keys::namespace_subscriber(namespace, p, r, api), value: encode(&key) })
            .then(Op::Get { key: keys::registration(p, r, api) })
            .otherwise(Op::Get { key: keys::namespace(namespace) })
            .otherwise(Op::Get { key: keys::registration(p, r, api) });
        let resp = handle.txn(txn).await?;
        if resp.succeeded {
            let registration = resp.gets.into_iter().next().flatten().map(|kv| decode::<ApiRegistration>(&kv));
            let sync_id = registration.transpose()?.map(|r| r.value.sync_id).unwrap_or_default();
            return Ok(Ok((Versioned { value: subscription, revision: resp.revision }, sync_id)));
        }
        Ok(Err(match (resp.gets.first(), resp.gets.get(1)) {
            (Some(None), _) => CreateRefused::NoNamespace,
            (_, Some(None)) => CreateRefused::NoRegistration,
            _ => CreateRefused::Exists,
        }))
    }

    /// Deletes a subscription with its index keys, its run records
    /// (`/runs/<platform>/<region>/<namespace>/<api>/`) and run cursor, and its attempt
    /// record, in one transaction.
    pub async fn delete_subscription(&self, namespace: &str, api: &str) -> Result<Revision> {
        let (p, r) = (&*self.base.platform, &*self.base.region);
        let key = keys::subscription(p, r, namespace, api);
        for _ in 0..GUARDED_ATTEMPTS {
            // Audited, the delete is of the subscription as read (its
            // record shows it), so it compares that revision.
            let (guard, handle) = match self.audit_context() {
                Some(_) => match self.read_subscription_in(namespace, api, true).await? {
                    SubscriptionRead { subscription: Some(current), sync_id, .. } => {
                        let before = shown(&current.value.view(&sync_id));
                        (Compare::ModRevision(key.clone(), current.revision), self.auditing(before, Value::Null))
                    }
                    // Nothing to delete: the read says which 404.
                    SubscriptionRead { namespace_exists: false, .. } => {
                        return Err(Error::NotFound(format!("namespace {namespace:?}")));
                    }
                    SubscriptionRead { .. } => {
                        return Err(Error::NotFound(format!("subscription of namespace {namespace:?} to {api:?}")));
                    }
                },
                None => (Compare::Exists(key.clone()), self.clone()),
            };
            let txn = Txn::new()
                .when(guard)
                .then(Op::Delete { key: key.clone() })
                .otherwise(Op::Get { key: keys::namespace(namespace) })
                .otherwise(Op::Get { key: key.clone() })
                .then(Op::Delete { key: keys::subscriber(p, r, api, namespace) })
                .then(Op::Delete { key: keys::namespace_subscriber(namespace, p, r, api) })
                .then(Op::Delete { key: keys::runs(p, r, namespace, api) })
                .then(Op::DeletePrefix { prefix: keys::run_slots(p, r, namespace, api) })
                .then(Op::Delete { key: keys::run_cursor(p, r, namespace, api) })
                .then(Op::Delete { key: keys::attempt(p, r, namespace, api) });
            let resp = handle.txn(txn).await?;
            if resp.succeeded {
                return Ok(resp.revision);
            }
            if resp.gets.get(1).is_some_and(Option::is_some) {
                // It exists but changed since it was read: read again.
                continue;
            }
            // Which 404, from the same round trip: the namespace is named
            // when it is what is missing.
            if resp.gets.first().is_some_and(Option::is_none) {
                return Err(Error::NotFound(format!("namespace {namespace:?}")));
            }
            return Err(Error::NotFound(format!("subscription of namespace {namespace:?} to {api:?}")));
        }
        Err(Error::Conflict(format!("subscription of namespace {namespace:?} to {api:?} keeps changing; try again")))
    }

    /// Creates a role binding in a namespace that exists, in one
    /// transaction; the namespace's delete removes its bindings in its own,
    /// so a binding created during the delete cannot survive it.
    pub async fn create_role_binding(&self, binding: &RoleBinding) -> Result<Revision> {
        let key = keys::role_binding(&binding.namespace, &binding.name);
        let txn = Txn::new()
            .when(Compare::Exists(keys::namespace(&binding.namespace)))
            .when(Compare::Absent(key.clone()))
            .then(Op::Put { key, value: encode(binding) })
            .otherwise(Op::Get { key: keys::namespace(&binding.namespace) });
        let resp = self.txn(txn).await?;
        if resp.succeeded {
            return Ok(resp.revision);
        }
        if resp.gets.first().is_some_and(Option::is_none) {
            return Err(Error::NotFound(format!("namespace {:?}", binding.namespace)));
        }
        Err(Error::Conflict(format!(
            "role binding {:?} in namespace {:?} already exists",
            binding.name, binding.namespace
        )))
    }

    /// The subscription `/sync` shorthand on `current` (as read):
    /// `current_sync_id` becomes empty and nothing else the API shows
    /// changes; the stored record is marked `resync_requested`. Always
    /// written, even when it already is empty: the write itself is what the
    /// reconciler reacts to (seed, "Forcing a re-sync"). One transaction,
    /// conditional on `current.revision`, whose success branch reads the
    /// registration for the view's `expected_sync_id`; `Ok(None)` when the
    /// subscription changed or vanished meanwhile: re-read and retry.
    pub async fn reset_subscription_sync(
        &self,
        namespace: &str,
        api: &str,
        current: &Versioned<Subscription>,
    ) -> Result<Option<(Versioned<Subscription>, String)>> {
        let (p, r) = (&*self.base.platform, &*self.base.region);
        let key = keys::subscription(p, r, namespace, api);
        let mut next = current.value.clone();
        next.current_sync_id.clear();
        // The cause travels with the write: the reconciler records the
        // run it makes as `resync` from this, not from the emptied
        // `current_sync_id` (already empty before a first sync).
        next.resync_requested = true;
        let txn = Txn::new()
            .when(Compare::ModRevision(key.clone(), current.revision))
            .then(Op::Put { key, value: encode(&next) })
            .then(Op::Get { key: keys::registration(p, r, api) });
        let resp = self.txn(txn).await?;
        if !resp.succeeded {
            return Ok(None);
        }
        let registration = resp.gets.into_iter().next().flatten().map(|kv| decode::<ApiRegistration>(&kv));
        let sync_id = registration.transpose()?.map(|r| r.value.sync_id).unwrap_or_default();
        Ok(Some((Versioned { value: next, revision: resp.revision }, sync_id)))
    }

    /// The registration `/sync` shorthand: a fresh SyncID, always different
    /// from the previous one, which starts the ongoing action.
    pub async fn bump_registration_sync_id(&self, name: &str) -> Result<Versioned<ApiRegistration>> {
        let what = format!("api registration {name:?}");
        let record = RecordRef::Registration(name);
        loop {
            let current = self.get::<ApiRegistration>(record).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
            let mut next = current.value.clone();
            next.sync_id = new_sync_id(&next.sync_id);
            next.sync_id_updated_at = sync_id_updated_now();
            let handle = self.auditing(shown(&current.value), shown(&next));
            match handle.update(record, &next, current.revision, &what).await {
                Ok(revision) => return Ok(Versioned { value: next, revision }),
                Err(Error::Conflict(_)) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn describe(&self, s: &SubscriptionRef) -> String {
        if *s.platform == *self.base.platform && *s.region == *self.base.region {
            s.api.clone()
        } else {
            format!("{} (platform {}, region {})", s.api, s.platform, s.region)
        }
    }
}

#[cfg(test)]
mod tests {
    use kayra_core::{ApiRegistration, Namespace};

    use super::super::tests::local_repo;
    use super::*;

    const API: &str = "compute.example.com";

    async fn subscribed(repo: &Repository, from: usize, to: usize) {
        for chunk in (from..to).collect::<Vec<_>>().chunks(100) {
            futures::future::join_all(chunk.iter().map(|i| async move {
                let name = format!("t{i:05}");
                let ns = Namespace { name: name.clone(), ..Namespace::default() };
                repo.create(RecordRef::Namespace(&name), &ns, "namespace").await.unwrap();
                repo.create_subscription(&name, API).await.unwrap().unwrap();
            }))
            .await;
        }
    }

    /// A namespace's and a registration's delete check their subscribers
    /// from the indexes their transactions compare empty, never from a
    /// read of every subscription: the same round trips with 10 and with
    /// 2,500 subscriptions, and a refusal names a few subscribers, not
    /// every one.
    #[tokio::test]
    async fn deletes_read_the_indexes_not_every_subscription() {
        let (_dir, repo) = local_repo().await;
        let registration = ApiRegistration {
            name: API.into(),
            sync_id: "s1".into(),
            platform: "dev".into(),
            region: "local".into(),
            ..ApiRegistration::default()
        };
        repo.create_registration(&registration).await.unwrap();
        let mut trips = Vec::new();
        for (round, (from, to)) in [(0, 10), (10, 2_500)].into_iter().enumerate() {
            subscribed(&repo, from, to).await;
            let empty = format!("empty{round}");
            let ns = Namespace { name: empty.clone(), ..Namespace::default() };
            repo.create(RecordRef::Namespace(&empty), &ns, "namespace").await.unwrap();
            let before = repo.store().round_trips();
            repo.delete_namespace(&empty).await.unwrap();
            let e = repo.delete_namespace("t00003").await.unwrap_err();
            assert!(matches!(&e, Error::Conflict(m) if m.contains(API)), "{e}");
            let e = repo.delete_registration(API).await.unwrap_err();
            trips.push(repo.store().round_trips() - before);
            let Error::Conflict(message) = e else { panic!("{e}") };
            assert!(message.contains("t00000") && message.contains("t00003"), "{message}");
            assert_eq!(message.contains("and more"), to > NAMED_SUBSCRIBERS, "{message}");
            assert!(message.len() < 1_000, "a few names, not every one: {message}");
        }
        assert_eq!(trips[0], trips[1], "round trips with 10 and with 2,500 subscriptions");
    }
}
