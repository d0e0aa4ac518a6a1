//! Namespaces, API registrations and subscriptions.
//!
//! The reconciler's writes live here too (`activate_namespace`,
//! `activate_subscription`, `set_subscription_sync_id`,
//! `mark_subscription_error`): each one is conditional on the revision the
//! caller's decision was based on and skips writing when nothing would
//! change, so the reconciler never loops on the events of its own writes.

use kayra_core::{ApiRegistration, Namespace, Subscription, SubscriptionState};
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
