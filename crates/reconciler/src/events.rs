//! The reconciler's watch events, one handler per resource, each in three
//! steps:
//!
//! 1. **decode**: the store's [`reflect`] turns each prefix's watcher
//!    events into whole lists and decoded changes ([`Update`]); a record
//!    that does not decode is logged there and changes nothing here.
//! 2. **view**: the change is applied to the [`crate::view::View`], which
//!    answers what it changed (a new registration, the subscribers behind
//!    a new SyncID, whether a subscription write was this process's own).
//! 3. **queue policy**: what that means for the work queue — which keys,
//!    with which cause ([`RunTrigger`]) and class.

use futures::StreamExt;
use futures::stream::BoxStream;
use kayra_catalog::repo::{Collection, Layout, RecordRef, Repository};
use kayra_core::rollout::RolloutRecord;
use kayra_core::{ApiRegistration, Namespace, RunTrigger, Subscription};
use kayra_store::reflector::{Reflected, reflect, reflect_into};
use kayra_store::{KeyValue, Revision};

use crate::decide::{Attempt, Decision};
use crate::queue::{Cause, Class, JobKey};
use crate::view::Subscribers;
use crate::{METRIC_WATCH_EVENTS, Reconciler, ensure};

/// What the reconciler keeps of a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NamespaceState {
    pub name: String,
    pub active: bool,
    /// For the rollouts' wave selectors.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A given-up attempt record, with the subscription it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GivenUp {
    pub namespace: String,
    pub api: String,
    pub attempt: Attempt,
}

/// One decoded event of one of the four watched prefixes.
pub(crate) enum Update {
    Namespace(Reflected<NamespaceState>),
    Registration(Reflected<ApiRegistration>),
    /// A list gathers straight into the view's compact form.
    Subscription(Reflected<Subscription, Subscribers>),
    Attempt(Reflected<GivenUp>),
    Rollout(Reflected<RolloutRecord>),
}

/// The watched resources, for the "all listed" bookkeeping and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Resource {
    Namespace,
    Registration,
    Subscription,
    Attempt,
    Rollout,
}

impl Resource {
    pub(crate) const ALL: [Resource; 5] =
        [Resource::Namespace, Resource::Registration, Resource::Subscription, Resource::Attempt, Resource::Rollout];

    /// The `resource` label of [`METRIC_WATCH_EVENTS`].
    pub(crate) fn label(self) -> &'static str {
        match self {
            Resource::Namespace => "namespace",
            Resource::Registration => "apiregistration",
            Resource::Subscription => "subscription",
            Resource::Attempt => "reconcileattempt",
            Resource::Rollout => "rollout",
        }
    }
}

impl Update {
    pub(crate) fn resource(&self) -> Resource {
        match self {
            Update::Namespace(_) => Resource::Namespace,
            Update::Registration(_) => Resource::Registration,
            Update::Subscription(_) => Resource::Subscription,
            Update::Attempt(_) => Resource::Attempt,
            Update::Rollout(_) => Resource::Rollout,
        }
    }

    /// Whether this is a complete (re-)list.
    pub(crate) fn is_list(&self) -> bool {
        matches!(
            self,
            Update::Namespace(Reflected::Listed { .. })
                | Update::Registration(Reflected::Listed { .. })
                | Update::Subscription(Reflected::Listed { .. })
                | Update::Attempt(Reflected::Listed { .. })
                | Update::Rollout(Reflected::Listed { .. })
        )
    }

    /// The revision of a complete (re-)list.
    pub(crate) fn listed_at(&self) -> Option<Revision> {
        fn listed<T, L>(r: &Reflected<T, L>) -> Option<Revision> {
            match r {
                Reflected::Listed { revision, .. } => Some(*revision),
                _ => None,
            }
        }
        match self {
            Update::Namespace(r) => listed(r),
            Update::Registration(r) => listed(r),
            Update::Subscription(r) => listed(r),
            Update::Attempt(r) => listed(r),
            Update::Rollout(r) => listed(r),
        }
    }

    /// Whether this is one change (a put or a delete), for the metrics.
    fn is_change(&self) -> bool {
        fn change<T, L>(r: &Reflected<T, L>) -> bool {
            matches!(r, Reflected::Applied { .. } | Reflected::Deleted { .. })
        }
        match self {
            Update::Namespace(r) => change(r),
            Update::Registration(r) => change(r),
            Update::Subscription(r) => change(r),
            Update::Attempt(r) => change(r),
            Update::Rollout(r) => change(r),
        }
    }
}

/// What the view keeps of a namespace's record.
fn namespace_state(kv: &KeyValue) -> Result<NamespaceState, String> {
    json::<Namespace>(kv).map(|ns| NamespaceState { name: ns.name, active: ns.active, labels: ns.labels })
}

fn json<T: serde::de::DeserializeOwned>(kv: &KeyValue) -> Result<T, String> {
    serde_json::from_slice(&kv.value).map_err(|e| e.to_string())
}

/// The five prefixes' list → watch → re-list streams, decoded, as one stream.
pub(crate) fn updates(repo: &Repository) -> BoxStream<'static, Update> {
    let store = repo.store();
    let layout = repo.layout().clone();
    let watch = |collection| store.watcher(&layout.prefix(collection));
    let namespaces = reflect(watch(Collection::Namespaces), namespace_state);
    let registrations = reflect(watch(Collection::Registrations), json::<ApiRegistration>);
    let subscriptions = reflect_into::<_, Subscribers>(watch(Collection::Subscriptions), json::<Subscription>);
    let given_up = {
        let layout = layout.clone();
        reflect(watch(Collection::Attempts), move |kv| {
            let (namespace, api) =
                attempt_parts(&layout, &kv.key).ok_or_else(|| "not a reconcile attempt key".to_string())?;
            let attempt = json::<Attempt>(kv)?;
            Ok(GivenUp { namespace: namespace.to_string(), api: api.to_string(), attempt })
        })
    };
    let rollouts = reflect(watch(Collection::Rollouts), json::<RolloutRecord>);
    futures::stream::select_all([
        namespaces.map(Update::Namespace).boxed(),
        registrations.map(Update::Registration).boxed(),
        subscriptions.map(Update::Subscription).boxed(),
        given_up.map(Update::Attempt).boxed(),
        rollouts.map(Update::Rollout).boxed(),
    ])
    .boxed()
}

impl Reconciler {
    /// Applies one update to the view and queues what it calls for.
    pub(crate) fn apply(&mut self, update: Update) {
        if update.is_change() {
            metrics::counter!(METRIC_WATCH_EVENTS, "resource" => update.resource().label()).increment(1);
        }
        if !matches!(update, Update::Namespace(_)) {
            self.worker.rollout_wake.notify_one();
        }
        match update {
            Update::Namespace(event) => self.on_namespace(event),
            Update::Registration(event) => self.on_registration(event),
            Update::Subscription(event) => self.on_subscription(event),
            Update::Attempt(event) => self.on_attempt(event),
            Update::Rollout(event) => self.on_rollout(event),
        }
    }

    fn on_namespace(&mut self, event: Reflected<NamespaceState>) {
        match event {
            Reflected::Listed { items, .. } => self.view().replace_namespaces(
                items.into_iter().map(|i| (i.value.name, i.value.active, i.value.labels, i.revision)).collect(),
            ),
            Reflected::Applied { value: Some(ns), revision, .. } => {
                self.view().put_namespace_record(&ns.name, ns.active, ns.labels.clone(), revision);
                // The initial action: an inactive namespace is activated.
                if !ns.active {
                    self.queue.add(JobKey::Namespace(ns.name), Cause::new(RunTrigger::Initial), Class::Activation);
                }
            }
            Reflected::Deleted { key, .. } => {
                if let Some(name) = self.worker.repo.namespace_key_name(&key) {
                    self.view().delete_namespace(name);
                }
            }
            Reflected::Applied { value: None, .. } | Reflected::Progress { .. } => {}
        }
    }

    fn on_registration(&mut self, event: Reflected<ApiRegistration>) {
        match event {
            Reflected::Listed { items, .. } => {
                self.view().replace_registrations(items.into_iter().map(|i| (i.value, i.revision)).collect())
            }
            Reflected::Applied { value: Some(reg), revision, .. } => self.registration_put(reg, revision),
            Reflected::Deleted { key, .. } => {
                if let Some(name) = self.worker.repo.registration_key_name(&key) {
                    self.view().delete_registration(name);
                }
            }
            Reflected::Applied { value: None, .. } | Reflected::Progress { .. } => {}
        }
    }

    /// A registration written: the view learns it; then first syncs that
    /// waited for it, superseded runs, and the ongoing action's fan-out.
    fn registration_put(&mut self, reg: ApiRegistration, revision: Revision) {
        let (name, sync_id) = (reg.name.clone(), reg.sync_id.clone());
        let (behind, waiting) = {
            let mut view = self.view();
            let new = view.registration(&name).is_none();
            view.put_registration(reg, revision);
            let waiting = if new { view.never_attempted(&name) } else { Vec::new() };
            (view.behind(&name, &sync_id), waiting)
        };
        // First syncs whose subscription event arrived before their
        // registration's (separate watches): decided then without a
        // registration, they are queued now.
        for namespace in waiting {
            let key = JobKey::subscription(namespace, name.clone());
            self.queue.add(key, Cause::new(RunTrigger::Initial), Class::Activation);
        }
        // Supersede: running pipelines toward an older SyncID stop, and
        // their jobs (first syncs included) run again toward this one. A
        // superseded first sync is still an activation.
        for namespace in self.worker.supersede(&name, &sync_id) {
            let first = self.view().subscription(&namespace, &name).is_none_or(|sub| !sub.active);
            let class = if first { Class::Activation } else { Class::Ongoing };
            let key = JobKey::subscription(namespace, name.clone());
            self.queue.add(key, Cause::new(RunTrigger::Ongoing), class);
        }
        // The ongoing action: every active subscriber behind the new SyncID
        // that no rollout holds back (held ones are queued when their wave
        // starts, `on_rollout`: they take no queue entry meanwhile).
        let behind: Vec<String> = {
            let view = self.view();
            behind.into_iter().filter(|ns| !view.held(ns, &name)).collect()
        };
        for namespace in behind {
            let key = JobKey::subscription(namespace, name.clone());
            self.queue.add(key, Cause::new(RunTrigger::Ongoing), Class::Ongoing);
        }
    }

    fn on_subscription(&mut self, event: Reflected<Subscription, Subscribers>) {
        match event {
            Reflected::Listed { items, .. } => {
                self.view().replace_subscribers(items);
                self.forget_orphaned_given_up();
            }
            Reflected::Applied { value: Some(sub), revision, .. } => self.subscription_put(sub, revision),
            Reflected::Deleted { key, .. } => {
                if let Some((namespace, api)) = self.worker.repo.subscription_key_parts(&key) {
                    let (namespace, api) = (namespace.to_string(), api.to_string());
                    let had_record = {
                        let mut view = self.view();
                        view.delete_subscription(&namespace, &api);
                        view.delete_given_up(&namespace, &api)
                    };
                    if had_record {
                        self.forget_given_up(namespace, api);
                    }
                }
            }
            Reflected::Applied { value: None, .. } | Reflected::Progress { .. } => {}
        }
    }

    /// A write to a subscription: the initial action (or a force re-sync,
    /// which the `/sync` reset says in the record it writes). The echo of
    /// this reconciler's own result write (the job put it in
    /// the view at its revision already) is no cause: when it finds the
    /// subscription behind, what moved is the registration (`ongoing`),
    /// and a trigger already queued for the key stays the run's.
    fn subscription_put(&mut self, sub: Subscription, revision: Revision) {
        let (namespace, api) = (sub.namespace.clone(), sub.api.clone());
        let resync = sub.resync_requested;
        let (decision, own_write) = {
            let mut view = self.view();
            let own_write = view.subscription(&namespace, &api).is_some_and(|seen| seen.revision >= revision);
            view.put_subscription(sub, revision);
            (view.decide(&namespace, &api, false), own_write)
        };
        if let Decision::Reconcile { activate, .. } = decision {
            let class = if activate { Class::Activation } else { Class::Ongoing };
            let cause = match (own_write, activate, resync) {
                (true, false, _) => Cause::own_write(RunTrigger::Ongoing),
                (true, true, _) => Cause::own_write(RunTrigger::Initial),
                (false, _, true) => Cause::new(RunTrigger::Resync),
                (false, _, false) => Cause::new(RunTrigger::Initial),
            };
            self.queue.add(JobKey::subscription(namespace, api), cause, class);
        }
    }

    /// A rollout record written: the view learns it; when it released
    /// subscribers (a wave started, a resume), their jobs are queued.
    fn on_rollout(&mut self, event: Reflected<RolloutRecord>) {
        match event {
            Reflected::Listed { items, .. } => {
                self.view().replace_rollouts(items.into_iter().map(|i| (i.value, i.revision)).collect())
            }
            Reflected::Applied { value: Some(record), revision, .. } => {
                let api = record.rollout.api.clone();
                let released = {
                    let mut view = self.view();
                    let Some(before) = view.put_rollout(record, revision) else { return };
                    let Some((now, _)) = view.rollout(&api) else { return };
                    let moved = before.as_ref().is_none_or(|b| {
                        (b.rollout.state, b.rollout.wave, b.rollout.sync_id.as_str())
                            != (now.rollout.state, now.rollout.wave, now.rollout.sync_id.as_str())
                    });
                    if moved { crate::rollout::released(&view, &api) } else { Vec::new() }
                };
                for namespace in released {
                    let key = JobKey::subscription(namespace, api.clone());
                    self.queue.add(key, Cause::new(RunTrigger::Ongoing), Class::Ongoing);
                }
            }
            Reflected::Deleted { key, .. } => {
                if let Some(RecordRef::Rollout(api)) = self.worker.repo.layout().parse(&key) {
                    self.view().delete_rollout(api);
                }
            }
            Reflected::Applied { value: None, .. } | Reflected::Progress { .. } => {}
        }
    }

    fn on_attempt(&mut self, event: Reflected<GivenUp>) {
        match event {
            Reflected::Listed { items, .. } => {
                let given_up = items.into_iter().map(|i| ((i.value.namespace, i.value.api), i.value.attempt));
                self.view().replace_given_up(given_up.collect());
                self.forget_orphaned_given_up();
            }
            Reflected::Applied { value: Some(given_up), .. } => {
                self.view().put_given_up(&given_up.namespace, &given_up.api, given_up.attempt);
            }
            Reflected::Deleted { key, .. } => {
                if let Some((namespace, api)) = attempt_parts(self.worker.repo.layout(), &key) {
                    self.view().delete_given_up(namespace, api);
                }
            }
            Reflected::Applied { value: None, .. } | Reflected::Progress { .. } => {}
        }
    }

    /// Given-up records of subscriptions deleted while nobody watched go,
    /// from the view and the store. Only once both have been listed: before
    /// the subscriptions' first list, every record would look orphaned.
    fn forget_orphaned_given_up(&mut self) {
        if !(self.listed.contains(&Resource::Subscription) && self.listed.contains(&Resource::Attempt)) {
            return;
        }
        let orphans = {
            let mut view = self.view();
            let orphans = view.orphaned_given_up();
            for (namespace, api) in &orphans {
                view.delete_given_up(namespace, api);
            }
            orphans
        };
        for (namespace, api) in orphans {
            self.forget_given_up(namespace, api);
        }
    }

    fn forget_given_up(&self, namespace: String, api: String) {
        let repo = self.worker.repo.clone();
        self.tracker.spawn(async move { ensure::forget_given_up(&repo, &namespace, &api).await });
    }
}

/// `(namespace, api)` of the key of one of `layout`'s deployment's attempt records.
fn attempt_parts<'k>(layout: &Layout, key: &'k str) -> Option<(&'k str, &'k str)> {
    match layout.parse(key)? {
        RecordRef::Attempt { namespace, api } => Some((namespace, api)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use kayra_store::WatcherEvent;

    use super::*;

    fn kv(key: &str, value: &[u8], revision: Revision) -> KeyValue {
        KeyValue { key: key.into(), value: value.to_vec(), create_revision: revision, mod_revision: revision }
    }

    #[tokio::test]
    async fn a_list_is_decoded_as_it_arrives_and_unreadable_records_are_left_out() {
        let sub = Subscription::new("team-a", "compute.example.com");
        let events = futures::stream::iter([
            WatcherEvent::Init,
            WatcherEvent::InitApply(kv(
                "/subscriptions/p/r/team-a/compute.example.com",
                &serde_json::to_vec(&sub).unwrap(),
                7,
            )),
            WatcherEvent::InitApply(kv("/subscriptions/p/r/team-b/compute.example.com", b"{not json", 8)),
            WatcherEvent::InitDone { revision: 8 },
        ]);
        let listed: Vec<_> = reflect(events, json::<Subscription>).collect().await;
        let [Reflected::Listed { items, revision: 8 }] = listed.as_slice() else { panic!("one list: {listed:?}") };
        assert_eq!(items.iter().map(|i| (&i.value, i.revision)).collect::<Vec<_>>(), [(&sub, 7)]);
    }

    #[test]
    fn a_namespace_is_kept_with_its_labels() {
        let record = br#"{"name":"core","description":"","labels":{"tier":"canary"},"active":true}"#;
        let state = namespace_state(&kv("/namespaces/core", record, 3)).unwrap();
        let labels = [("tier".to_string(), "canary".to_string())].into();
        assert_eq!(state, NamespaceState { name: "core".into(), active: true, labels });
        let old = namespace_state(&kv("/namespaces/old", br#"{"name":"old","active":false}"#, 4)).unwrap();
        assert!(old.labels.is_empty(), "a record from before labels has none");
    }

    #[test]
    fn attempt_keys_name_their_subscription() {
        let layout = Layout::new("p", "r");
        let key = layout.key(RecordRef::Attempt { namespace: "team-a", api: "compute.example.com" });
        assert_eq!(attempt_parts(&layout, &key), Some(("team-a", "compute.example.com")));
        assert_eq!(attempt_parts(&layout, "/elsewhere/team-a/compute.example.com"), None);
        let other = Layout::new("p", "elsewhere").key(RecordRef::Attempt { namespace: "a", api: "b.example.com" });
        assert_eq!(attempt_parts(&layout, &other), None, "another deployment's record");
    }
}
