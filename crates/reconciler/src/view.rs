//! The reconciler's watch-fed view of this deployment: subscriptions,
//! registrations and given-up attempts with the revisions they were seen
//! at (a kube-style reflector store).
//!
//! It answers the unlocked "anything to do?" with no store read (the same
//! [`decide`] the job runs under its lock on a fresh read), and finds an
//! API's subscribers for the ongoing action's fan-out without a store
//! scan. Jobs feed their own writes back into it so that a job run again
//! right after its own write does not wait for the watch to echo it.
//! Updates are revision-monotonic: an older record never replaces a newer.
//!
//! # Memory
//! A deployment has up to a million subscriptions (platform §16), so the
//! view keeps of each only what [`decide`] and the fan-out read
//! ([`Subscriber`]: `active`, `state`, `current_sync_id` and the revision),
//! keyed by API, then namespace; the namespace, API and SyncID strings are
//! interned (one allocation each, shared by every subscription naming
//! them). A list gathers straight into that form ([`Subscribers`] is the
//! store reflector's [`Gather`]), so a restart never holds the list as
//! decoded records too.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use kayra_core::rollout::RolloutRecord;
use kayra_core::{ApiRegistration, Subscription, SubscriptionState};
use kayra_store::Revision;
use kayra_store::reflector::{Gather, Item};

use crate::decide::{Attempt, Decision, Idle, Observed, SubscriptionFacts, decide, holds};

/// What the view keeps of one subscription: what [`decide`] reads of it,
/// and the revision it was seen at. Its namespace and API are its keys in
/// [`Subscribers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriber {
    /// Interned ([`Subscribers`]).
    current_sync_id: Arc<str>,
    pub revision: Revision,
    pub active: bool,
    pub state: SubscriptionState,
}

impl Subscriber {
    pub fn current_sync_id(&self) -> &str {
        &self.current_sync_id
    }

    /// Active and at `expected_sync_id` ([`Subscription::is_synced`]).
    pub fn is_synced(&self, expected_sync_id: &str) -> bool {
        self.active && *self.current_sync_id == *expected_sync_id
    }
}

/// A [`Subscriber`] with its namespace: what [`decide`] reads.
#[derive(Debug, Clone, Copy)]
pub struct SubscriberRef<'a> {
    pub namespace: &'a str,
    pub subscriber: &'a Subscriber,
}

impl SubscriptionFacts for SubscriberRef<'_> {
    fn namespace(&self) -> &str {
        self.namespace
    }
    fn active(&self) -> bool {
        self.subscriber.active
    }
    fn state(&self) -> SubscriptionState {
        self.subscriber.state
    }
    fn current_sync_id(&self) -> &str {
        &self.subscriber.current_sync_id
    }
}

/// Strings shared by many entries, one allocation each. Strings nothing
/// else holds any more (a deleted namespace, a SyncID everyone moved past)
/// are forgotten once the set has doubled since it was last swept, so
/// interning stays O(1) amortized and the set bounded by what is in use.
#[derive(Debug, Default)]
struct Interner {
    set: HashSet<Arc<str>>,
    /// The set's size after the last sweep.
    swept: usize,
}

impl Interner {
    /// Fewest strings before a sweep is worth it.
    const SWEEP_MIN: usize = 1024;

    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(found) = self.set.get(s) {
            return found.clone();
        }
        if self.set.len() >= 2 * self.swept.max(Self::SWEEP_MIN) {
            self.sweep();
        }
        let new: Arc<str> = Arc::from(s);
        self.set.insert(new.clone());
        new
    }

    fn sweep(&mut self) {
        self.set.retain(|s| Arc::strong_count(s) > 1);
        self.swept = self.set.len();
    }
}

/// Every subscription the view knows of: api → namespace → [`Subscriber`],
/// the strings interned. Also what a list of subscriptions gathers into
/// ([`Gather`]): the map a restart builds is the one the view keeps.
#[derive(Debug, Default)]
pub struct Subscribers {
    by_api: HashMap<Arc<str>, HashMap<Arc<str>, Subscriber>>,
    strings: Interner,
}

impl Subscribers {
    fn get(&self, namespace: &str, api: &str) -> Option<&Subscriber> {
        self.by_api.get(api)?.get(namespace)
    }

    /// Keeps `sub` as of `revision` unless an entry as new or newer is
    /// there; true when kept.
    fn put(&mut self, sub: &Subscription, revision: Revision) -> bool {
        if self.get(&sub.namespace, &sub.api).is_some_and(|seen| seen.revision >= revision) {
            return false;
        }
        let subscriber = Subscriber {
            current_sync_id: self.strings.intern(&sub.current_sync_id),
            revision,
            active: sub.active,
            state: sub.state,
        };
        let namespace = self.strings.intern(&sub.namespace);
        match self.by_api.get_mut(sub.api.as_str()) {
            Some(subs) => {
                subs.insert(namespace, subscriber);
            }
            None => {
                let api = self.strings.intern(&sub.api);
                self.by_api.entry(api).or_default().insert(namespace, subscriber);
            }
        }
        true
    }

    fn remove(&mut self, namespace: &str, api: &str) {
        if let Some(subs) = self.by_api.get_mut(api) {
            subs.remove(namespace);
            if subs.is_empty() {
                self.by_api.remove(api);
            }
        }
    }

    /// `api`'s subscribers: (namespace, subscriber).
    fn of<'a>(&'a self, api: &str) -> impl Iterator<Item = (&'a str, &'a Subscriber)> + 'a {
        self.by_api.get(api).into_iter().flatten().map(|(ns, sub)| (&**ns, sub))
    }

    /// How many subscriptions are kept.
    pub fn len(&self) -> usize {
        self.by_api.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_api.is_empty()
    }
}

impl Gather<Subscription> for Subscribers {
    fn gather(&mut self, item: Item<Subscription>) {
        self.put(&item.value, item.revision);
    }

    fn finish(&mut self) {
        self.strings.sweep();
    }
}

/// What the view keeps of a namespace.
#[derive(Debug, Default)]
struct NamespaceEntry {
    active: bool,
    /// `None` until a record of the namespace is seen: a job's own
    /// activation can come first, before the namespace's watch brings it.
    labels: Option<BTreeMap<String, String>>,
    revision: Revision,
}

#[derive(Debug, Default)]
pub struct View {
    /// api → namespace → what is kept of the subscription.
    subscribers: Subscribers,
    /// api → (registration, revision).
    registrations: HashMap<String, (ApiRegistration, Revision)>,
    /// (namespace, api) → the given-up attempt.
    given_up: HashMap<(String, String), Attempt>,
    /// namespace → what is kept of it.
    namespaces: HashMap<String, NamespaceEntry>,
    /// APIs whose subscriptions, registration or given-up records changed
    /// since [`View::take_dirty`] (the fan-out checks, [`crate::fanout`]).
    dirty: BTreeSet<String>,
    /// Every API is dirty (a list replaced a part of the view).
    all_dirty: bool,
    /// api → (its rollout record, revision) (§12).
    rollouts: HashMap<String, (RolloutRecord, Revision)>,
    /// With fan-outs tracked ([`View::track_fanouts`]): api → the
    /// subscribers not done with its registration's SyncID, kept current
    /// by every change that can move [`View::done`], so that whether a
    /// result is a fan-out's last is one lookup, not a walk. A rollout
    /// cannot: it only holds subscribers that are not done either way.
    open: Option<HashMap<Arc<str>, HashSet<Arc<str>>>>,
}

impl View {
    /// A namespace's `active` as of `revision` (a job's own write): its
    /// labels stay as last seen, until the watch brings that revision's
    /// record ([`View::put_namespace_record`]).
    pub fn put_namespace(&mut self, name: &str, active: bool, revision: Revision) {
        match self.namespaces.get_mut(name) {
            Some(entry) if entry.revision >= revision => {}
            Some(entry) => {
                entry.active = active;
                entry.revision = revision;
            }
            None => {
                self.namespaces.insert(name.to_string(), NamespaceEntry { active, labels: None, revision });
            }
        }
    }

    /// A namespace's record as of `revision` (from the watch): it also
    /// replaces an entry a job wrote at that same revision, whose labels
    /// were not known.
    pub fn put_namespace_record(
        &mut self,
        name: &str,
        active: bool,
        labels: BTreeMap<String, String>,
        revision: Revision,
    ) {
        match self.namespaces.get_mut(name) {
            // A job's newer write, made before any record of the namespace
            // was seen: this record's labels are the newest known (the
            // write's own echo brings its record later).
            Some(entry) if entry.revision > revision => {
                entry.labels.get_or_insert(labels);
            }
            _ => {
                self.namespaces.insert(name.to_string(), NamespaceEntry { active, labels: Some(labels), revision });
            }
        }
    }

    /// Replaces every namespace (a complete list of name, active, labels
    /// and revision).
    pub fn replace_namespaces(&mut self, namespaces: Vec<(String, bool, BTreeMap<String, String>, Revision)>) {
        self.namespaces = namespaces
            .into_iter()
            .map(|(name, active, labels, revision)| (name, NamespaceEntry { active, labels: Some(labels), revision }))
            .collect();
    }

    /// A namespace's labels, once a record of it has been seen (`None`
    /// before: unknown, not empty).
    pub fn namespace_labels(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.get(name).and_then(|entry| entry.labels.as_ref())
    }

    /// Replaces every registration (a complete list).
    pub fn replace_registrations(&mut self, registrations: Vec<(ApiRegistration, Revision)>) {
        self.all_dirty = true;
        self.registrations = registrations.into_iter().map(|(r, rev)| (r.name.clone(), (r, rev))).collect();
        self.reopen_all();
    }

    /// Replaces every subscription (a complete list): those not in it are gone.
    pub fn replace_subscriptions(&mut self, subscriptions: Vec<(Subscription, Revision)>) {
        let mut listed = Subscribers::default();
        for (sub, rev) in subscriptions {
            listed.put(&sub, rev);
        }
        self.replace_subscribers(listed);
    }

    /// Replaces every subscription with a complete list gathered as
    /// [`Subscribers`]: those not in it are gone.
    pub fn replace_subscribers(&mut self, listed: Subscribers) {
        self.all_dirty = true;
        self.subscribers = listed;
        // The open sets are rebuilt from the new list, with its strings.
        self.reopen_all();
    }

    /// Replaces every given-up record (a complete list).
    pub fn replace_given_up(&mut self, given_up: Vec<((String, String), Attempt)>) {
        self.all_dirty = true;
        self.given_up = given_up.into_iter().collect();
        self.reopen_all();
    }

    pub fn delete_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    /// Whether `name` exists and still needs activating.
    pub fn namespace_inactive(&self, name: &str) -> bool {
        self.namespaces.get(name).is_some_and(|entry| !entry.active)
    }

    /// Namespaces still `active: false`.
    pub fn inactive_namespaces(&self) -> Vec<String> {
        let mut out: Vec<_> = self.namespaces.iter().filter(|(_, e)| !e.active).map(|(n, _)| n.clone()).collect();
        out.sort();
        out
    }

    pub fn put_subscription(&mut self, sub: Subscription, revision: Revision) {
        self.mark(&sub.api);
        if self.subscribers.put(&sub, revision) {
            self.reopen(&sub.namespace, &sub.api);
        }
    }

    pub fn delete_subscription(&mut self, namespace: &str, api: &str) {
        self.mark(api);
        self.subscribers.remove(namespace, api);
        self.reopen(namespace, api);
    }

    pub fn subscription(&self, namespace: &str, api: &str) -> Option<&Subscriber> {
        self.subscribers.get(namespace, api)
    }

    /// How many subscriptions the view holds.
    pub fn subscription_count(&self) -> usize {
        self.subscribers.len()
    }

    pub fn put_registration(&mut self, reg: ApiRegistration, revision: Revision) {
        self.mark(&reg.name);
        match self.registrations.get(&reg.name) {
            Some((_, seen)) if *seen >= revision => {}
            _ => {
                let api = reg.name.clone();
                self.registrations.insert(reg.name.clone(), (reg, revision));
                self.reopen_api(&api);
            }
        }
    }

    pub fn delete_registration(&mut self, name: &str) {
        self.registrations.remove(name);
        self.reopen_api(name);
    }

    pub fn registration(&self, name: &str) -> Option<&(ApiRegistration, Revision)> {
        self.registrations.get(name)
    }

    pub fn put_given_up(&mut self, namespace: &str, api: &str, attempt: Attempt) {
        self.mark(api);
        self.given_up.insert((namespace.to_string(), api.to_string()), attempt);
        self.reopen(namespace, api);
    }

    /// Forgets a given-up record; true when there was one.
    pub fn delete_given_up(&mut self, namespace: &str, api: &str) -> bool {
        self.mark(api);
        let had = self.given_up.remove(&(namespace.to_string(), api.to_string())).is_some();
        self.reopen(namespace, api);
        had
    }

    pub fn has_given_up(&self, namespace: &str, api: &str) -> bool {
        self.given_up.contains_key(&(namespace.to_string(), api.to_string()))
    }

    /// Records `api`'s rollout; returns the one it replaces (older
    /// revisions never replace newer ones: then `None` and nothing changes).
    pub fn put_rollout(&mut self, record: RolloutRecord, revision: Revision) -> Option<Option<RolloutRecord>> {
        let api = record.rollout.api.clone();
        match self.rollouts.get(&api) {
            Some((_, seen)) if *seen >= revision => None,
            _ => Some(self.rollouts.insert(api, (record, revision)).map(|(r, _)| r)),
        }
    }

    pub fn delete_rollout(&mut self, api: &str) {
        self.rollouts.remove(api);
    }

    /// Replaces every rollout record (a complete list).
    pub fn replace_rollouts(&mut self, rollouts: Vec<(RolloutRecord, Revision)>) {
        self.rollouts = rollouts.into_iter().map(|(r, rev)| (r.rollout.api.clone(), (r, rev))).collect();
    }

    pub fn rollout(&self, api: &str) -> Option<&(RolloutRecord, Revision)> {
        self.rollouts.get(api)
    }

    /// APIs a rollout driver looks at: those with a policy or a rollout
    /// record, sorted.
    pub fn rollout_apis(&self) -> Vec<String> {
        let with_policy = self.registrations.values().filter(|(r, _)| r.rollout.is_some()).map(|(r, _)| &r.name);
        let mut out: Vec<String> = with_policy.chain(self.rollouts.keys()).cloned().collect();
        out.sort();
        out.dedup();
        out
    }

    /// Whether a rollout holds `namespace`'s subscription to `api` back (§12).
    pub fn held(&self, namespace: &str, api: &str) -> bool {
        let (Some(subscriber), Some((reg, _))) = (self.subscription(namespace, api), self.registration(api)) else {
            return false;
        };
        holds(reg, &SubscriberRef { namespace, subscriber }, self.rollout(api).map(|(r, _)| r))
    }

    /// `api`'s subscribers: (namespace, what is kept of the subscription).
    pub fn subscribers_of<'a>(&'a self, api: &str) -> impl Iterator<Item = (&'a str, &'a Subscriber)> + 'a {
        self.subscribers.of(api)
    }

    fn mark(&mut self, api: &str) {
        if !self.all_dirty && !self.dirty.contains(api) {
            self.dirty.insert(api.to_string());
        }
    }

    /// The APIs changed since the last call (after a list: every
    /// registration's), and forgets them.
    pub fn take_dirty(&mut self) -> BTreeSet<String> {
        let mut dirty = std::mem::take(&mut self.dirty);
        if std::mem::take(&mut self.all_dirty) {
            dirty.extend(self.registrations.keys().cloned());
        }
        dirty
    }

    /// Every subscription with anything to do ([`View::decide`]), as
    /// (namespace, api, whether its job is an activation), in key order.
    /// Only those are copied out: a restart over a million converged
    /// subscriptions allocates nothing for each of them.
    pub fn to_reconcile(&self, startup: bool) -> Vec<(String, String, bool)> {
        let mut out: Vec<(&str, &str, bool)> = Vec::new();
        for (api, subs) in &self.subscribers.by_api {
            for ns in subs.keys() {
                if let Decision::Reconcile { activate, .. } = self.decide(ns, api, startup) {
                    out.push((ns, api, activate));
                }
            }
        }
        out.sort_unstable();
        out.into_iter().map(|(ns, api, activate)| (ns.to_string(), api.to_string(), activate)).collect()
    }

    /// Every subscription as (namespace, api).
    #[cfg(test)]
    pub fn subscription_keys(&self) -> Vec<(String, String)> {
        let mut out: Vec<_> = self
            .subscribers
            .by_api
            .iter()
            .flat_map(|(api, subs)| subs.keys().map(move |ns| (ns.to_string(), api.to_string())))
            .collect();
        out.sort();
        out
    }

    /// Given-up records whose subscription is not in the view (left over
    /// by deletes the reconciler did not see).
    pub fn orphaned_given_up(&self) -> Vec<(String, String)> {
        self.given_up.keys().filter(|(ns, api)| self.subscription(ns, api).is_none()).cloned().collect()
    }

    /// [`decide`] on the view.
    pub fn decide(&self, namespace: &str, api: &str, startup: bool) -> Decision {
        let subscriber = self.subscription(namespace, api).map(|subscriber| SubscriberRef { namespace, subscriber });
        let observed = Observed {
            subscription: subscriber.as_ref().map(|s| (s, s.subscriber.revision)),
            registration: self.registration(api).map(|(r, rev)| (r, *rev)),
            // Without given-up records (the usual case) no key is built:
            // a restart decides once for every subscription.
            given_up: match self.given_up.is_empty() {
                true => None,
                false => self.given_up.get(&(namespace.to_string(), api.to_string())),
            },
            held: self.held(namespace, api),
        };
        decide(&observed, startup)
    }

    /// Whether `namespace`'s subscription to `api` is new (not active yet):
    /// its job is an activation, taken before ongoing fan-out.
    pub fn is_activation(&self, namespace: &str, api: &str) -> bool {
        self.subscription(namespace, api).is_none_or(|s| !s.active)
    }

    /// Keeps, from now on, which subscribers of every API are not done
    /// with its registration's SyncID ([`View::done`]), for
    /// [`View::only_open`]. Off by default: it costs a decision per
    /// subscriber on every registration change.
    pub fn track_fanouts(&mut self) {
        self.open = Some(HashMap::new());
        self.reopen_all();
    }

    /// Whether `namespace`'s subscription to `api` is done with the
    /// registration's SyncID, as `fanout.completed` counts it (§14): synced
    /// to it, or given up on in `state: error`.
    pub fn done(&self, namespace: &str, api: &str) -> bool {
        let Some(sub) = self.subscription(namespace, api) else { return false };
        match self.decide(namespace, api, false) {
            Decision::Nothing(Idle::Synced) => true,
            Decision::Nothing(Idle::GivenUp) => sub.state == SubscriptionState::Error,
            _ => false,
        }
    }

    /// With fan-outs tracked: whether every subscriber of `api` but
    /// `namespace` is done ([`View::done`]). `None` when not tracked.
    pub fn only_open(&self, api: &str, namespace: &str) -> Option<bool> {
        let open = self.open.as_ref()?;
        Some(open.get(api).is_none_or(|open| open.iter().all(|ns| **ns == *namespace)))
    }

    /// Brings `namespace`'s entry in the open set of `api` up to date.
    fn reopen(&mut self, namespace: &str, api: &str) {
        if self.open.is_none() {
            return;
        }
        // Without a registration there is no fan-out to finish.
        let open = self.registration(api).is_some()
            && self.subscription(namespace, api).is_some()
            && !self.done(namespace, api);
        let Some(sets) = self.open.as_mut() else { return };
        if open {
            match sets.get_mut(api) {
                Some(set) => {
                    if !set.contains(namespace) {
                        set.insert(self.subscribers.strings.intern(namespace));
                    }
                }
                None => {
                    let (api, namespace) =
                        (self.subscribers.strings.intern(api), self.subscribers.strings.intern(namespace));
                    sets.entry(api).or_default().insert(namespace);
                }
            }
        } else if let Some(set) = sets.get_mut(api) {
            set.remove(namespace);
            if set.is_empty() {
                sets.remove(api);
            }
        }
    }

    /// [`View::reopen`] for every subscriber of `api`.
    fn reopen_api(&mut self, api: &str) {
        let Some(sets) = self.open.as_ref() else { return };
        let mut namespaces: Vec<Arc<str>> =
            self.subscribers.by_api.get(api).into_iter().flatten().map(|(ns, _)| ns.clone()).collect();
        namespaces.extend(sets.get(api).into_iter().flatten().cloned());
        for namespace in namespaces {
            self.reopen(&namespace, api);
        }
    }

    /// [`View::reopen`] for every subscriber of every API.
    fn reopen_all(&mut self) {
        let Some(sets) = self.open.as_mut() else { return };
        sets.clear();
        let apis: Vec<Arc<str>> = self.subscribers.by_api.keys().cloned().collect();
        for api in apis {
            self.reopen_api(&api);
        }
    }

    /// Per registration: active subscribers whose CurrentSyncID differs
    /// (`kayra_subscriptions_behind{api}`).
    pub fn behind_counts(&self) -> Vec<(String, usize)> {
        let mut out: Vec<_> = self
            .registrations
            .iter()
            .map(|(api, (reg, _))| {
                let subs = self.subscribers.of(api);
                (api.clone(), subs.filter(|(_, s)| s.active && *s.current_sync_id != *reg.sync_id).count())
            })
            .collect();
        out.sort();
        out
    }

    /// Namespaces whose subscription to `api` was never attempted: inactive,
    /// still `init`, nothing given up. Their subscription's own watch event
    /// can arrive before the registration's (the prefixes are watched
    /// separately), and was then decided without a registration; the
    /// registration's arrival is what lets them activate. A failed
    /// activation (`state: error`) is not among them: a registration write
    /// alone never retries it (seed, "Ongoing action").
    pub fn never_attempted(&self, api: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .subscribers
            .of(api)
            .filter(|(ns, s)| {
                !s.active
                    && s.state == SubscriptionState::Init
                    && !self.given_up.contains_key(&(ns.to_string(), api.to_string()))
            })
            .map(|(ns, _)| ns.to_string())
            .collect();
        out.sort();
        out
    }

    /// The ongoing action's fan-out: namespaces with an *active*
    /// subscription to `api` whose CurrentSyncID differs from `sync_id`.
    pub fn behind(&self, api: &str, sync_id: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .subscribers
            .of(api)
            .filter(|(_, s)| s.active && *s.current_sync_id != *sync_id)
            .map(|(ns, _)| ns.to_string())
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

    fn reg(name: &str, sync_id: &str) -> ApiRegistration {
        ApiRegistration { name: name.into(), sync_id: sync_id.into(), ..Default::default() }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn namespaces_keep_their_labels_through_activation_and_watch_echoes() {
        let mut view = View::default();
        assert_eq!(view.namespace_labels("core"), None);
        view.replace_namespaces(vec![("core".into(), false, labels(&[("tier", "canary")]), 5)]);
        assert_eq!(view.namespace_labels("core"), Some(&labels(&[("tier", "canary")])));
        // A job's own activation keeps the labels it does not know.
        view.put_namespace("core", true, 7);
        assert!(!view.namespace_inactive("core"));
        assert_eq!(view.namespace_labels("core"), Some(&labels(&[("tier", "canary")])));
        // A relabel written before the activation, echoed late, is older: ignored...
        view.put_namespace_record("core", false, labels(&[("tier", "stable")]), 6);
        assert_eq!(view.namespace_labels("core"), Some(&labels(&[("tier", "canary")])));
        // ...and the activation's own echo, at the same revision, brings its record's labels.
        view.put_namespace_record("core", true, labels(&[("tier", "stable")]), 7);
        assert_eq!(view.namespace_labels("core"), Some(&labels(&[("tier", "stable")])));
        view.put_namespace_record("core", true, labels(&[]), 9);
        assert_eq!(view.namespace_labels("core"), Some(&labels(&[])));
        view.put_namespace_record("core", true, labels(&[("x", "")]), 8);
        assert_eq!(view.namespace_labels("core"), Some(&labels(&[])), "never an older record");
        view.delete_namespace("core");
        assert_eq!(view.namespace_labels("core"), None);
        // Activated by a job before the namespace's watch brought it: its
        // labels are unknown (not empty) until a record of it comes; the
        // creation's, older than the activation, tells them.
        view.put_namespace("late", true, 12);
        assert_eq!(view.namespace_labels("late"), None);
        view.put_namespace_record("late", false, labels(&[("tier", "canary")]), 10);
        assert_eq!(view.namespace_labels("late"), Some(&labels(&[("tier", "canary")])));
        assert!(!view.namespace_inactive("late"), "the job's newer activation stands");
    }

    #[test]
    fn fan_out_only_reaches_active_subscribers_behind() {
        let mut view = View::default();
        view.put_subscription(sub("a", "x.io", true, "1"), 1);
        view.put_subscription(sub("b", "x.io", true, "2"), 2);
        view.put_subscription(sub("c", "x.io", false, ""), 3);
        view.put_subscription(sub("d", "y.io", true, "1"), 4);
        assert_eq!(view.behind("x.io", "2"), vec!["a"]);
        view.delete_subscription("a", "x.io");
        assert!(view.behind("x.io", "2").is_empty());
        assert!(view.behind("z.io", "1").is_empty());
    }

    #[test]
    fn first_syncs_seen_before_their_registration_are_found_when_it_arrives() {
        let mut view = View::default();
        view.put_subscription(sub("new", "x.io", false, ""), 1);
        view.put_subscription(sub("live", "x.io", true, "1"), 2);
        let failed = Subscription { state: kayra_core::SubscriptionState::Error, ..sub("failed", "x.io", false, "") };
        view.put_subscription(failed, 3);
        view.put_subscription(sub("other", "y.io", false, ""), 4);
        assert_eq!(view.never_attempted("x.io"), vec!["new"], "only the never-attempted inactive one");
        assert!(view.never_attempted("z.io").is_empty());
    }

    #[test]
    fn behind_counts_active_subscribers_off_their_registration() {
        let mut view = View::default();
        view.put_registration(reg("x.io", "2"), 1);
        view.put_registration(reg("y.io", "1"), 2);
        view.put_subscription(sub("a", "x.io", true, "1"), 3);
        view.put_subscription(sub("b", "x.io", true, "2"), 4);
        view.put_subscription(sub("c", "x.io", false, ""), 5);
        assert_eq!(view.behind_counts(), vec![("x.io".to_string(), 1), ("y.io".to_string(), 0)]);
    }

    #[test]
    fn updates_never_go_back_in_revision() {
        let mut view = View::default();
        view.put_subscription(sub("a", "x.io", true, "2"), 5);
        view.put_subscription(sub("a", "x.io", true, "1"), 4);
        assert_eq!(view.subscription("a", "x.io").unwrap().current_sync_id(), "2");
        view.put_registration(reg("x.io", "2"), 7);
        view.put_registration(reg("x.io", "1"), 6);
        assert_eq!(view.registration("x.io").unwrap().0.sync_id, "2");
    }

    #[test]
    fn the_interner_shares_strings_and_forgets_those_nothing_holds() {
        let mut strings = Interner::default();
        let a = strings.intern("sync-1");
        assert!(Arc::ptr_eq(&a, &strings.intern("sync-1")), "one allocation per string");
        // Strings interned and let go: the set is swept as it grows, so it
        // stays bounded by what is held, never by what was ever seen.
        for i in 0..10 * Interner::SWEEP_MIN {
            drop(strings.intern(&format!("gone-{i}")));
        }
        assert!(strings.set.len() <= 2 * Interner::SWEEP_MIN, "{} strings kept", strings.set.len());
        assert!(Arc::ptr_eq(&a, &strings.intern("sync-1")), "a string still held is kept");
        drop(a);
        strings.sweep();
        assert!(strings.set.is_empty());
    }

    #[test]
    fn a_list_gathers_into_the_kept_form_and_updates_stay_revision_monotonic() {
        // What the view keeps of a subscription stays small (platform §16).
        assert!(std::mem::size_of::<Subscriber>() <= 32);
        let mut listed = Subscribers::default();
        let item =
            |sub: Subscription, revision| Item { key: format!("{}/{}", sub.namespace, sub.api), value: sub, revision };
        listed.gather(item(sub("a", "x.io", true, "1"), 5));
        listed.gather(item(sub("b", "x.io", true, "1"), 6));
        listed.gather(item(sub("a", "y.io", false, ""), 7));
        listed.finish();
        let mut view = View::default();
        view.put_subscription(sub("gone", "x.io", true, "1"), 2);
        view.replace_subscribers(listed);
        assert_eq!(
            view.subscription_keys(),
            [("a", "x.io"), ("a", "y.io"), ("b", "x.io")].map(|(n, a)| (n.into(), a.into()))
        );
        let (a, b) = (view.subscription("a", "x.io").unwrap(), view.subscription("b", "x.io").unwrap());
        assert!(Arc::ptr_eq(&a.current_sync_id, &b.current_sync_id), "one SyncID string for both");
        assert_eq!((a.revision, a.active, a.state), (5, true, SubscriptionState::Init));
        // A watch echo older than the list is ignored; a newer one is kept.
        view.put_subscription(sub("a", "x.io", true, "0"), 4);
        assert_eq!(view.subscription("a", "x.io").unwrap().current_sync_id(), "1");
        view.put_subscription(sub("a", "x.io", true, "2"), 8);
        assert_eq!(view.subscription("a", "x.io").unwrap().current_sync_id(), "2");
        assert_eq!(view.subscription("a", "x.io").unwrap().revision, 8);
        view.put_registration(reg("x.io", "2"), 9);
        assert_eq!(view.decide("a", "x.io", false), Decision::Nothing(Idle::Synced));
        assert_eq!(view.to_reconcile(false), [("b".to_string(), "x.io".to_string(), false)]);
        view.delete_subscription("b", "x.io");
        assert_eq!(view.subscription_count(), 2);
        assert!(view.to_reconcile(false).is_empty());
    }

    #[test]
    fn the_view_decides_like_a_fresh_read() {
        let mut view = View::default();
        assert_eq!(view.decide("a", "x.io", false), Decision::Nothing(Idle::Gone));
        view.put_subscription(sub("a", "x.io", true, "1"), 3);
        assert_eq!(view.decide("a", "x.io", false), Decision::Nothing(Idle::NoRegistration));
        view.put_registration(reg("x.io", "1"), 4);
        assert_eq!(view.decide("a", "x.io", false), Decision::Nothing(Idle::Synced));
        view.put_registration(reg("x.io", "2"), 5);
        assert_eq!(view.decide("a", "x.io", false), Decision::Reconcile { sync_id: "2".into(), activate: false });
        view.put_given_up(
            "a",
            "x.io",
            Attempt { subscription_revision: 3, registration_revision: 5, cancelled: false },
        );
        assert_eq!(view.decide("a", "x.io", false), Decision::Nothing(Idle::GivenUp));
        view.delete_subscription("a", "x.io");
        assert_eq!(view.orphaned_given_up(), vec![("a".to_string(), "x.io".to_string())]);
    }

    #[test]
    fn a_relist_drops_what_was_deleted_in_the_gap() {
        let mut view = View::default();
        view.put_subscription(sub("a", "x.io", true, "1"), 3);
        view.put_subscription(sub("b", "x.io", true, "1"), 4);
        view.put_given_up(
            "a",
            "x.io",
            Attempt { subscription_revision: 3, registration_revision: 1, cancelled: false },
        );
        view.replace_subscriptions(vec![(sub("b", "x.io", true, "1"), 4)]);
        assert!(view.subscription("a", "x.io").is_none());
        assert_eq!(view.behind("x.io", "2"), vec!["b"]);
        assert_eq!(view.orphaned_given_up(), vec![("a".to_string(), "x.io".to_string())]);
    }

    /// One change to a view, of the few namespaces, APIs and SyncIDs a
    /// sequence draws from.
    #[derive(Debug, Clone)]
    enum Change {
        Subscription { ns: u8, api: u8, active: bool, current: u8, error: bool },
        DeleteSubscription { ns: u8, api: u8 },
        Registration { api: u8, sync_id: u8, staged: bool },
        DeleteRegistration { api: u8 },
        GivenUp { ns: u8, api: u8, stale: bool },
        DeleteGivenUp { ns: u8, api: u8 },
        Rollout { api: u8, sync_id: u8 },
        DeleteRollout { api: u8 },
        Relist { keep: u8 },
        Track,
    }

    fn change() -> impl proptest::strategy::Strategy<Value = Change> {
        use proptest::prelude::*;
        let (ns, api, id) = (0u8..4, 0u8..2, 0u8..3);
        prop_oneof![
            4 => (ns.clone(), api.clone(), any::<bool>(), id.clone(), any::<bool>())
                .prop_map(|(ns, api, active, current, error)| Change::Subscription { ns, api, active, current, error }),
            1 => (ns.clone(), api.clone()).prop_map(|(ns, api)| Change::DeleteSubscription { ns, api }),
            2 => (api.clone(), id.clone(), any::<bool>())
                .prop_map(|(api, sync_id, staged)| Change::Registration { api, sync_id, staged }),
            1 => api.clone().prop_map(|api| Change::DeleteRegistration { api }),
            2 => (ns.clone(), api.clone(), any::<bool>()).prop_map(|(ns, api, stale)| Change::GivenUp { ns, api, stale }),
            1 => (ns, api.clone()).prop_map(|(ns, api)| Change::DeleteGivenUp { ns, api }),
            1 => (api.clone(), id).prop_map(|(api, sync_id)| Change::Rollout { api, sync_id }),
            1 => api.prop_map(|api| Change::DeleteRollout { api }),
            1 => any::<u8>().prop_map(|keep| Change::Relist { keep }),
            1 => Just(Change::Track),
        ]
    }

    /// Applies `change` as of `revision`.
    fn apply(view: &mut View, change: &Change, revision: Revision) {
        let name = |api: u8| format!("{api}.io");
        match *change {
            Change::Subscription { ns, api, active, current, error } => {
                let state = if error { kayra_core::SubscriptionState::Error } else { Default::default() };
                let current = if active { current.to_string() } else { String::new() };
                let sub = Subscription { state, ..sub(&ns.to_string(), &name(api), active, &current) };
                view.put_subscription(sub, revision);
            }
            Change::DeleteSubscription { ns, api } => view.delete_subscription(&ns.to_string(), &name(api)),
            Change::Registration { api, sync_id, staged } => {
                let rollout = staged.then(kayra_core::rollout::RolloutPolicy::default);
                view.put_registration(ApiRegistration { rollout, ..reg(&name(api), &sync_id.to_string()) }, revision);
            }
            Change::DeleteRegistration { api } => view.delete_registration(&name(api)),
            Change::GivenUp { ns, api, stale } => {
                let ns = ns.to_string();
                let subscription_revision = view.subscription(&ns, &name(api)).map_or(0, |s| s.revision);
                let registration_revision =
                    view.registration(&name(api)).map_or(0, |(_, r)| *r) + Revision::from(stale);
                let attempt = Attempt { subscription_revision, registration_revision, cancelled: false };
                view.put_given_up(&ns, &name(api), attempt);
            }
            Change::DeleteGivenUp { ns, api } => {
                view.delete_given_up(&ns.to_string(), &name(api));
            }
            Change::Rollout { api, sync_id } => {
                let rollout =
                    kayra_core::rollout::Rollout { api: name(api), sync_id: sync_id.to_string(), ..Default::default() };
                view.put_rollout(RolloutRecord { rollout, ..Default::default() }, revision);
            }
            Change::DeleteRollout { api } => view.delete_rollout(&name(api)),
            Change::Relist { keep } => {
                let all: Vec<(Subscription, Revision)> = view
                    .subscription_keys()
                    .into_iter()
                    .map(|(ns, api)| {
                        let s = view.subscription(&ns, &api).unwrap();
                        let record = Subscription {
                            active: s.active,
                            state: s.state,
                            current_sync_id: s.current_sync_id().to_string(),
                            ..Subscription::new(ns, api)
                        };
                        (record, s.revision)
                    })
                    .collect();
                let kept = all.into_iter().enumerate().filter(|(i, _)| keep & (1 << (i % 8)) != 0).map(|(_, s)| s);
                view.replace_subscriptions(kept.collect());
            }
            Change::Track => view.track_fanouts(),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 256,
            max_shrink_time: 10_000,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// The open index answers as a walk over every subscriber would,
        /// after any sequence of changes (started tracked or not).
        #[test]
        fn the_open_index_answers_like_a_walk(
            tracked in proptest::prelude::any::<bool>(),
            changes in proptest::collection::vec(change(), 1..60),
        ) {
            let mut view = View::default();
            if tracked {
                view.track_fanouts();
            }
            for (i, change) in changes.iter().enumerate() {
                apply(&mut view, change, i as Revision + 1);
                let Some(open) = &view.open else {
                    proptest::prop_assert_eq!(view.only_open("0.io", "0"), None);
                    continue;
                };
                let open: HashMap<String, HashSet<String>> = open
                    .iter()
                    .map(|(api, set)| (api.to_string(), set.iter().map(|ns| ns.to_string()).collect()))
                    .collect();
                let mut walked: HashMap<String, HashSet<String>> = HashMap::new();
                for (ns, api) in view.subscription_keys() {
                    if view.registration(&api).is_some() && !view.done(&ns, &api) {
                        walked.entry(api).or_default().insert(ns);
                    }
                }
                proptest::prop_assert_eq!(&open, &walked, "after {:?}", change);
                for api in ["0.io", "1.io"] {
                    for ns in ["0", "1", "2", "3"] {
                        let others_done = view.subscribers_of(api).all(|(other, _)| {
                            other == ns || view.registration(api).is_none() || view.done(other, api)
                        });
                        proptest::prop_assert_eq!(view.only_open(api, ns), Some(others_done));
                    }
                }
            }
        }
    }
}
