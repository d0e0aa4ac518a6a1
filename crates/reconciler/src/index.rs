//! The reconciler's in-memory view of subscriptions and registrations,
//! kept current from the startup list and the watch (a kube-style
//! reflector).
//!
//! It exists so the ongoing action can find an API's subscribers without
//! scanning the store: a registration with 10,000 subscribers among
//! 100,000 costs a lookup of those 10,000, not a list of all 100,000. It is
//! only ever used to decide *whether to dispatch*; every job re-reads the
//! records fresh under its lock before acting.

use std::collections::HashMap;

use kayra_core::{ApiRegistration, Subscription};

/// What the index remembers of one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    active: bool,
    current_sync_id: String,
}

#[derive(Debug, Default)]
pub struct Index {
    /// api → namespace → subscription summary.
    subscribers: HashMap<String, HashMap<String, Seen>>,
    /// api → its current SyncID.
    sync_ids: HashMap<String, String>,
}

impl Index {
    pub fn put_subscription(&mut self, sub: &Subscription) {
        let seen = Seen { active: sub.active, current_sync_id: sub.current_sync_id.clone() };
        self.subscribers.entry(sub.api.clone()).or_default().insert(sub.namespace.clone(), seen);
    }

    pub fn delete_subscription(&mut self, namespace: &str, api: &str) {
        if let Some(subs) = self.subscribers.get_mut(api) {
            subs.remove(namespace);
            if subs.is_empty() {
                self.subscribers.remove(api);
            }
        }
    }

    pub fn put_registration(&mut self, reg: &ApiRegistration) {
        self.sync_ids.insert(reg.name.clone(), reg.sync_id.clone());
    }

    pub fn delete_registration(&mut self, name: &str) {
        self.sync_ids.remove(name);
    }

    /// Whether `sub` is known converged: active and at its registration's
    /// current SyncID. Unknown registrations are never converged.
    pub fn is_converged(&self, sub: &Subscription) -> bool {
        sub.active && self.sync_ids.get(&sub.api).is_some_and(|s| *s == sub.current_sync_id)
    }

    /// The ongoing action's fan-out: namespaces with an *active*
    /// subscription to `api` whose CurrentSyncID differs from `sync_id`.
    pub fn behind(&self, api: &str, sync_id: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .subscribers
            .get(api)
            .into_iter()
            .flatten()
            .filter(|(_, s)| s.active && s.current_sync_id != sync_id)
            .map(|(ns, _)| ns.clone())
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(ns: &str, api: &str, active: bool, current: &str) -> Subscription {
        Subscription { active, current_sync_id: current.into(), ..Subscription::new(ns, api) }
    }

    #[test]
    fn fan_out_only_reaches_active_subscribers_behind() {
        let mut idx = Index::default();
        idx.put_subscription(&sub("a", "x.io", true, "1"));
        idx.put_subscription(&sub("b", "x.io", true, "2"));
        idx.put_subscription(&sub("c", "x.io", false, ""));
        idx.put_subscription(&sub("d", "y.io", true, "1"));
        assert_eq!(idx.behind("x.io", "2"), vec!["a"]);
        idx.delete_subscription("a", "x.io");
        assert!(idx.behind("x.io", "2").is_empty());
        assert!(idx.behind("z.io", "1").is_empty());
    }

    #[test]
    fn convergence_needs_a_known_registration() {
        let mut idx = Index::default();
        let s = sub("a", "x.io", true, "1");
        assert!(!idx.is_converged(&s));
        idx.put_registration(&ApiRegistration { name: "x.io".into(), sync_id: "1".into(), ..Default::default() });
        assert!(idx.is_converged(&s));
        assert!(!idx.is_converged(&sub("a", "x.io", false, "1")));
    }
}
