//! Namespaces, API registrations and subscriptions.
//!
//! The reconciler's writes live here too (`activate_namespace`,
//! `activate_subscription`, `set_subscription_sync_id`,
//! `mark_subscription_error`): each one is conditional on the revision the
//! caller's decision was based on and skips writing when nothing would
//! change, so the reconciler never loops on the events of its own writes.
//!
//! The catalog API's writes that need more than one record live here as
//! well: referential integrity (a namespace or registration with
//! subscriptions cannot be deleted), the subscription `/sync` reset and the
//! registration `/sync` bump. The store has no multi-key transactions, so
//! each check-then-write is followed by a re-check that undoes the write a
//! concurrent delete raced past (see `create_subscription`, `delete_namespace`).

use std::time::{Duration, SystemTime};

use kayra_core::{ApiRegistration, Namespace, RoleBinding, Subscription, SubscriptionState};
use kayra_store::Revision;

use super::{Change, Error, Repository, Result, Versioned, keys};

/// The outcome of a conditional reconciler write.
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

impl Repository {
    pub async fn get_namespace(&self, name: &str) -> Result<Option<Versioned<Namespace>>> {
        self.get(&keys::namespace(name)).await
    }

    pub async fn list_namespaces(&self) -> Result<(Vec<Versioned<Namespace>>, Revision)> {
        self.list_all(keys::NAMESPACES).await
    }

    /// Sets `active: true` (and nothing else) unless it already is.
    pub async fn activate_namespace(&self, name: &str) -> Result<Recorded> {
        let mut wrote = false;
        let result = self
            .modify::<Namespace, _>(&keys::namespace(name), &format!("namespace {name:?}"), |ns| {
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
        self.get(&keys::registration(&self.platform, &self.region, name)).await
    }

    /// Every registration of this deployment.
    pub async fn list_registrations(&self) -> Result<(Vec<Versioned<ApiRegistration>>, Revision)> {
        self.list_all(&keys::registrations(&self.platform, &self.region)).await
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
        self.get(&keys::subscription(&self.platform, &self.region, namespace, api)).await
    }

    /// Every subscription of this deployment.
    pub async fn list_subscriptions(&self) -> Result<(Vec<Versioned<Subscription>>, Revision)> {
        self.list_all(&keys::subscriptions(&self.platform, &self.region)).await
    }

    /// One namespace's subscriptions in this deployment.
    pub async fn list_namespace_subscriptions(&self, namespace: &str) -> Result<Vec<Versioned<Subscription>>> {
        Ok(self.list_all(&keys::namespace_subscriptions(&self.platform, &self.region, namespace)).await?.0)
    }

    /// Parses a subscription key of this deployment into `(namespace, api)`.
    pub fn subscription_key_parts<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str)> {
        let rest = key.strip_prefix(&keys::subscriptions(&self.platform, &self.region))?;
        rest.split_once('/')
    }

    /// Parses a registration key of this deployment into the long name.
    pub fn registration_key_name<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&keys::registrations(&self.platform, &self.region))
    }

    /// Records a successful reconcile toward `sync_id` for the first time:
    /// `active: true`, `state: success`, `current_sync_id: sync_id`
    /// (seed: `Repository.ActivateSubscription`).
    pub async fn activate_subscription(&self, seen: &Versioned<Subscription>, sync_id: &str) -> Result<Recorded> {
        self.set_subscription_sync_id(seen, sync_id).await
    }

    /// Records a successful reconcile toward `sync_id`
    /// (seed: `Repository.SetSubscriptionSyncID`). Conditional on `seen`'s
    /// revision: a subscription changed meanwhile (a force re-sync, a
    /// delete) is `Stale` and must be decided again.
    pub async fn set_subscription_sync_id(&self, seen: &Versioned<Subscription>, sync_id: &str) -> Result<Recorded> {
        let mut next = seen.value.clone();
        next.active = true;
        next.state = SubscriptionState::Success;
        next.current_sync_id = sync_id.to_string();
        self.record(seen, next).await
    }

    /// Records a failed reconcile: `state: error`, everything else unchanged.
    pub async fn mark_subscription_error(&self, seen: &Versioned<Subscription>) -> Result<Recorded> {
        let mut next = seen.value.clone();
        next.state = SubscriptionState::Error;
        self.record(seen, next).await
    }

    async fn record(&self, seen: &Versioned<Subscription>, next: Subscription) -> Result<Recorded> {
        if next == seen.value {
            return Ok(Recorded::Unchanged);
        }
        let key = keys::subscription(&self.platform, &self.region, &seen.value.namespace, &seen.value.api);
        match self.update(&key, &next, seen.revision, "subscription").await {
            Ok(revision) => Ok(Recorded::Written(revision)),
            Err(Error::Conflict(_) | Error::NotFound(_)) => Ok(Recorded::Stale),
            Err(e) => Err(e),
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
    /// Every subscription, of any deployment, in namespace `namespace`.
    pub async fn subscriptions_in_namespace_everywhere(&self, namespace: &str) -> Result<Vec<SubscriptionRef>> {
        let (kvs, _) = self.store.list_all(keys::SUBSCRIPTIONS).await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| keys::subscription_parts(&kv.key))
            .filter(|[_, _, ns, _]| *ns == namespace)
            .map(|[platform, region, namespace, api]| SubscriptionRef {
                platform: platform.into(),
                region: region.into(),
                namespace: namespace.into(),
                api: api.into(),
            })
            .collect())
    }

    /// This deployment's subscriptions to registration `api`, by namespace.
    pub async fn registration_subscribers(&self, api: &str) -> Result<Vec<Versioned<Subscription>>> {
        let (all, _) = self.list_subscriptions().await?;
        Ok(all.into_iter().filter(|s| s.value.api == api).collect())
    }

    /// Deletes a namespace that has no subscriptions in any deployment
    /// (`Conflict` naming them otherwise), then sweeps its role bindings and
    /// any subscription that was created while the delete was under way.
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        let what = format!("namespace {name:?}");
        let current = self.get_namespace(name).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
        let subscriptions = self.subscriptions_in_namespace_everywhere(name).await?;
        if !subscriptions.is_empty() {
            let names: Vec<String> = subscriptions.iter().map(|s| self.describe(s)).collect();
            return Err(Error::Conflict(format!(
                "namespace {name:?} still has subscriptions: {}; delete them first",
                names.join(", ")
            )));
        }
        self.delete(&keys::namespace(name), Some(current.revision), &what).await?;
        for s in self.subscriptions_in_namespace_everywhere(name).await? {
            let key = keys::subscription(&s.platform, &s.region, &s.namespace, &s.api);
            self.delete_if_present(&key).await?;
        }
        let (bindings, _) = self.list_all::<RoleBinding>(&keys::role_bindings(name)).await?;
        for binding in bindings {
            self.delete_if_present(&keys::role_binding(name, &binding.value.name)).await?;
        }
        Ok(())
    }

    /// Deletes one of this deployment's registrations, refused (`Conflict`
    /// naming the namespaces) while any subscription references it.
    pub async fn delete_registration(&self, name: &str) -> Result<()> {
        let what = format!("api registration {name:?}");
        let current = self.get_registration(name).await?.ok_or_else(|| Error::NotFound(what.clone()))?;
        let subscribers = self.registration_subscribers(name).await?;
        if !subscribers.is_empty() {
            let namespaces: Vec<&str> = subscribers.iter().map(|s| s.value.namespace.as_str()).collect();
            return Err(Error::Conflict(format!(
                "api registration {name:?} still has subscriptions in namespaces {}; delete them first",
                namespaces.join(", ")
            )));
        }
        self.delete(&keys::registration(&self.platform, &self.region, name), Some(current.revision), &what).await?;
        Ok(())
    }

    /// Creates a brand-new subscription (inactive, `init`, never synced).
    /// The caller has checked that the namespace and the registration
    /// exist; if either was deleted while this ran, the subscription is
    /// removed again and the result is `NotFound`, so a racing delete never
    /// leaves a dangling subscription behind.
    pub async fn create_subscription(&self, namespace: &str, api: &str) -> Result<Versioned<Subscription>> {
        let subscription = Subscription::new(namespace, api);
        let key = keys::subscription(&self.platform, &self.region, namespace, api);
        let what = format!("subscription of namespace {namespace:?} to {api:?}");
        let revision = self.create(&key, &subscription, &what).await?;
        let namespace_gone = self.get_namespace(namespace).await?.is_none();
        if namespace_gone || self.get_registration(api).await?.is_none() {
            self.delete_if_present(&key).await?;
            let missing =
                if namespace_gone { format!("namespace {namespace:?}") } else { format!("api registration {api:?}") };
            return Err(Error::NotFound(missing));
        }
        Ok(Versioned { value: subscription, revision })
    }

    /// The subscription `/sync` shorthand: `current_sync_id` becomes empty
    /// and nothing else changes. Always written, even when it already is
    /// empty: the write itself is what the reconciler reacts to (seed,
    /// "Forcing a re-sync").
    pub async fn reset_subscription_sync(&self, namespace: &str, api: &str) -> Result<Versioned<Subscription>> {
        let key = keys::subscription(&self.platform, &self.region, namespace, api);
        let what = format!("subscription of namespace {namespace:?} to {api:?}");
        self.modify::<Subscription, _>(&key, &what, |s| {
            s.current_sync_id.clear();
            Change::Write
        })
        .await
    }

    /// The registration `/sync` shorthand: a fresh SyncID, always different
    /// from the previous one, which starts the ongoing action.
    pub async fn bump_registration_sync_id(&self, name: &str) -> Result<Versioned<ApiRegistration>> {
        let key = keys::registration(&self.platform, &self.region, name);
        self.modify::<ApiRegistration, _>(&key, &format!("api registration {name:?}"), |r| {
            r.sync_id = new_sync_id(&r.sync_id);
            r.sync_id_updated_at = sync_id_updated_now();
            Change::Write
        })
        .await
    }

    async fn delete_if_present(&self, key: &str) -> Result<()> {
        match self.delete(key, None, key).await {
            Ok(_) | Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn describe(&self, s: &SubscriptionRef) -> String {
        if s.platform == self.platform && s.region == self.region {
            s.api.clone()
        } else {
            format!("{} (platform {}, region {})", s.api, s.platform, s.region)
        }
    }
}
