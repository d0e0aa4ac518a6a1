//! The typed face of the key layout: a deployment's [`Layout`] names every
//! record ([`RecordRef`]) and collection ([`Collection`]) and spells and
//! parses their keys with `keys.rs`' functions. The Repository builds
//! every key through it; the caches and the watch hub name their
//! prefixes and parse their keys with it, so nothing outside
//! `crates/catalog/src/repo` spells a key. A leaf: it imports nothing else
//! of the crate, so the Repository and the caches it holds both stand on it.

use kayra_pipeline::{LimitKey, LimitKeys};

use super::keys::*;

/// One record of the catalog, named by what it is; only the Repository
/// turns it into a store key ([`Layout::key`]). Names are validated before
/// they get here, so they never contain `/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordRef<'a> {
    Namespace(&'a str),
    User(&'a str),
    /// A token record, by the hex SHA-256 of the token.
    Token(&'a str),
    Role(&'a str),
    ClusterRoleBinding(&'a str),
    RoleBinding {
        namespace: &'a str,
        name: &'a str,
    },
    /// A registration of this deployment, by long name.
    Registration(&'a str),
    Subscription {
        namespace: &'a str,
        api: &'a str,
    },
    /// The reconciler's record of the last failed attempt on a subscription:
    /// which (subscription revision, registration revision) it was made
    /// against, so no reconciler process attempts that exact state again.
    Attempt {
        namespace: &'a str,
        api: &'a str,
    },
    /// A subscription's run history: one record holding its newest runs
    /// (`kayra_core::run_ring::RunRing`, platform §4.4).
    Runs {
        namespace: &'a str,
        api: &'a str,
    },
    /// A run record of an earlier build: ring slot `slot` of the
    /// subscription's runs, one record a run (read until the next run).
    RunSlot {
        namespace: &'a str,
        api: &'a str,
        slot: u64,
    },
    /// An earlier build's run counter of a subscription (which slot its
    /// next run took): unused, deleted by the subscription's first history
    /// write and with the subscription.
    RunCursor {
        namespace: &'a str,
        api: &'a str,
    },
    /// One audit record (platform §13), by its order key
    /// ([`super::audit::order_key`] of its id).
    Audit(&'a str),
    /// One notification delivery (§14), by id (`<event id>.<sink>`).
    Delivery(&'a str),
    /// The last completed fan-out of an API (`kayra_core::notifications::FanoutMarker`).
    FanoutMarker(&'a str),
    /// The rollout of an API's latest SyncID change (`kayra_core::rollout::RolloutRecord`).
    Rollout(&'a str),
    /// A request to cancel run `id` of a subscription ([`super::cancels`]).
    CancelRequest {
        namespace: &'a str,
        api: &'a str,
        id: &'a str,
    },
}

/// A set of records read or watched together: one key prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collection<'a> {
    Namespaces,
    Users,
    Tokens,
    Roles,
    ClusterRoleBindings,
    /// Every namespace's role bindings.
    RoleBindings,
    /// One namespace's role bindings.
    NamespaceRoleBindings(&'a str),
    Registrations,
    Subscriptions,
    /// One namespace's subscriptions in this deployment.
    NamespaceSubscriptions(&'a str),
    /// Every run history record of this deployment (and earlier builds' run records).
    Runs,
    /// The run records an earlier build wrote for one subscription, one a
    /// ring slot ([`RecordRef::RunSlot`]).
    RunSlots {
        namespace: &'a str,
        api: &'a str,
    },
    /// The reconciler's given-up attempt records.
    Attempts,
    /// The reconciler's per-mode limit records (`kayra_pipeline::Limits`).
    Limits,
    /// This deployment's audit records, newest first.
    Audit,
    /// Every notification delivery of this deployment.
    Deliveries,
    /// Every API's fan-out marker.
    FanoutMarkers,
    /// Every API's rollout record.
    Rollouts,
    /// Every cancel request of this deployment.
    CancelRequests,
}

/// The key layout of one deployment (platform + region): the only code that
/// spells or parses a catalog key. Handed out by [`super::Repository::layout`]
/// to the parts that consume store keys without a Repository (the auth caches,
/// the watch hub, the subscriber index, the limits). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Layout {
    platform: std::sync::Arc<str>,
    region: std::sync::Arc<str>,
}

impl Layout {
    pub fn new(platform: impl Into<std::sync::Arc<str>>, region: impl Into<std::sync::Arc<str>>) -> Self {
        Self { platform: platform.into(), region: region.into() }
    }

    /// The store key of `record`.
    pub fn key(&self, record: RecordRef<'_>) -> String {
        let (p, r) = (&*self.platform, &*self.region);
        match record {
            RecordRef::Namespace(name) => namespace(name),
            RecordRef::User(name) => user(name),
            RecordRef::Token(hash) => token(hash),
            RecordRef::Role(name) => role(name),
            RecordRef::ClusterRoleBinding(name) => cluster_role_binding(name),
            RecordRef::RoleBinding { namespace, name } => role_binding(namespace, name),
            RecordRef::Registration(name) => registration(p, r, name),
            RecordRef::Subscription { namespace, api } => subscription(p, r, namespace, api),
            RecordRef::Attempt { namespace, api } => attempt(p, r, namespace, api),
            RecordRef::Runs { namespace, api } => runs(p, r, namespace, api),
            RecordRef::RunSlot { namespace, api, slot } => format!("{}{slot}", run_slots(p, r, namespace, api)),
            RecordRef::RunCursor { namespace, api } => run_cursor(p, r, namespace, api),
            RecordRef::Audit(order) => format!("{}{order}", audit(p, r)),
            RecordRef::Delivery(id) => format!("{}{id}", deliveries(p, r)),
            RecordRef::FanoutMarker(api) => format!("{}{api}", fanout_markers(p, r)),
            RecordRef::Rollout(api) => format!("{}{api}", rollouts(p, r)),
            RecordRef::CancelRequest { namespace, api, id } => {
                format!("{}{namespace}/{api}/{id}", cancel_requests(p, r))
            }
        }
    }

    /// The key prefix of `collection` (what a listing or a watch of it reads).
    pub fn prefix(&self, collection: Collection<'_>) -> String {
        let (p, r) = (&*self.platform, &*self.region);
        match collection {
            Collection::Namespaces => NAMESPACES.into(),
            Collection::Users => USERS.into(),
            Collection::Tokens => TOKENS.into(),
            Collection::Roles => ROLES.into(),
            Collection::ClusterRoleBindings => CLUSTER_ROLE_BINDINGS.into(),
            Collection::RoleBindings => ROLE_BINDINGS.into(),
            Collection::NamespaceRoleBindings(namespace) => role_bindings(namespace),
            Collection::Registrations => registrations(p, r),
            Collection::Subscriptions => subscriptions(p, r),
            Collection::NamespaceSubscriptions(namespace) => namespace_subscriptions(p, r, namespace),
            Collection::Runs => all_runs(p, r),
            Collection::RunSlots { namespace, api } => run_slots(p, r, namespace, api),
            Collection::Attempts => format!("/reconcileattempts/{p}/{r}/"),
            Collection::Limits => limits(p, r),
            Collection::Audit => audit(p, r),
            Collection::Deliveries => deliveries(p, r),
            Collection::FanoutMarkers => fanout_markers(p, r),
            Collection::Rollouts => rollouts(p, r),
            Collection::CancelRequests => cancel_requests(p, r),
        }
    }

    /// Which record of this deployment (or a shared one) `key` names;
    /// `None` for any other key, another deployment's included.
    pub fn parse<'k>(&self, key: &'k str) -> Option<RecordRef<'k>> {
        let (p, r) = (&*self.platform, &*self.region);
        // The key's name segments after `prefix`, exactly `n` of them, none empty.
        fn segments<'k, const N: usize>(key: &'k str, prefix: &str) -> Option<[&'k str; N]> {
            let mut parts = key.strip_prefix(prefix)?.split('/');
            let out: [&str; N] = std::array::from_fn(|_| parts.next().unwrap_or_default());
            (parts.next().is_none() && out.iter().all(|s| !s.is_empty())).then_some(out)
        }
        let scoped = |root: &str| format!("/{root}/{p}/{r}/");
        let one = |prefix: &str| segments::<1>(key, prefix).map(|[a]| a);
        let two = |prefix: &str| segments::<2>(key, prefix);
        let root = key.get(1..)?.split('/').next()?;
        Some(match root {
            "namespaces" => RecordRef::Namespace(one(NAMESPACES)?),
            "users" => RecordRef::User(one(USERS)?),
            "tokens" => RecordRef::Token(one(TOKENS)?),
            "roles" => RecordRef::Role(one(ROLES)?),
            "clusterrolebindings" => RecordRef::ClusterRoleBinding(one(CLUSTER_ROLE_BINDINGS)?),
            "rolebindings" => two(ROLE_BINDINGS).map(|[namespace, name]| RecordRef::RoleBinding { namespace, name })?,
            "apiregistrations" => RecordRef::Registration(one(&scoped(root))?),
            "subscriptions" => two(&scoped(root)).map(|[namespace, api]| RecordRef::Subscription { namespace, api })?,
            "reconcileattempts" => two(&scoped(root)).map(|[namespace, api]| RecordRef::Attempt { namespace, api })?,
            "runcursors" => two(&scoped(root)).map(|[namespace, api]| RecordRef::RunCursor { namespace, api })?,
            "runs" => match two(&scoped(root)) {
                Some([namespace, api]) => RecordRef::Runs { namespace, api },
                None => {
                    let [namespace, api, slot] = segments::<3>(key, &scoped(root))?;
                    RecordRef::RunSlot { namespace, api, slot: slot.parse().ok()? }
                }
            },
            "audit" => RecordRef::Audit(one(&scoped(root))?),
            "rollouts" => RecordRef::Rollout(one(&scoped(root))?),
            "cancelrequests" => {
                let [namespace, api, id] = segments::<3>(key, &scoped(root))?;
                RecordRef::CancelRequest { namespace, api, id }
            }
            "notifications" => match two(&scoped(root))? {
                ["deliveries", id] => RecordRef::Delivery(id),
                ["fanouts", api] => RecordRef::FanoutMarker(api),
                _ => return None,
            },
            _ => return None,
        })
    }
}

/// The limit records (`reconciler.limits`) live under
/// `/limits/<platform>/<region>/<mode>/`: `slot/<i>`, `start/<i>`, `backoff`.
impl LimitKeys for Layout {
    fn all_limits(&self) -> String {
        self.prefix(Collection::Limits)
    }

    fn mode_limits(&self, mode: &str) -> String {
        format!("{}{mode}/", self.prefix(Collection::Limits))
    }

    fn limit_key(&self, record: LimitKey<'_>) -> String {
        match record {
            LimitKey::Slot { mode, index } => format!("{}slot/{index}", self.mode_limits(mode)),
            LimitKey::Start { mode, index } => format!("{}start/{index}", self.mode_limits(mode)),
            LimitKey::Backoff { mode } => format!("{}backoff", self.mode_limits(mode)),
        }
    }

    fn parse_limit_key<'k>(&self, key: &'k str) -> Option<LimitKey<'k>> {
        let rest = key.strip_prefix(&self.prefix(Collection::Limits))?;
        if let Some(mode) = rest.strip_suffix("/backoff") {
            return (!mode.is_empty()).then_some(LimitKey::Backoff { mode });
        }
        let (mode, record) = rest.split_once('/')?;
        let (kind, index) = record.split_once('/')?;
        let index = index.parse().ok()?;
        match kind {
            _ if mode.is_empty() => None,
            "slot" => Some(LimitKey::Slot { mode, index }),
            "start" => Some(LimitKey::Start { mode, index }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_key_parses_back_to_its_record() {
        let layout = Layout::new("dev", "local");
        let records = [
            RecordRef::Namespace("core"),
            RecordRef::User("alice"),
            RecordRef::Token("ab12"),
            RecordRef::Role("reader"),
            RecordRef::ClusterRoleBinding("b"),
            RecordRef::RoleBinding { namespace: "core", name: "b" },
            RecordRef::Registration("compute.example.com"),
            RecordRef::Subscription { namespace: "core", api: "compute.example.com" },
            RecordRef::Attempt { namespace: "core", api: "compute.example.com" },
            RecordRef::Runs { namespace: "core", api: "compute.example.com" },
            RecordRef::RunSlot { namespace: "core", api: "compute.example.com", slot: 7 },
            RecordRef::RunCursor { namespace: "core", api: "compute.example.com" },
            RecordRef::Audit("fe6c4d"),
            RecordRef::Delivery("0190.subscription.failed.ops"),
            RecordRef::FanoutMarker("compute.example.com"),
            RecordRef::CancelRequest { namespace: "core", api: "compute.example.com", id: "0193a6c1" },
        ];
        for record in records {
            assert_eq!(layout.parse(&layout.key(record)), Some(record), "{record:?}");
        }
    }

    #[test]
    fn keys_of_other_deployments_and_prefixes_parse_to_nothing() {
        let (here, there) = (Layout::new("dev", "local"), Layout::new("prod", "eu"));
        let theirs = there.key(RecordRef::Subscription { namespace: "core", api: "compute.example.com" });
        assert_eq!(here.parse(&theirs), None);
        for collection in [Collection::Namespaces, Collection::Subscriptions, Collection::Runs, Collection::Attempts] {
            assert_eq!(here.parse(&here.prefix(collection)), None, "{collection:?}");
        }
        for key in ["", "/", "/namespaces/a/b", "/subscriptions/dev/local/core", "/runs/dev/local/a/b/x", "/x/y"] {
            assert_eq!(here.parse(key), None, "{key:?}");
        }
    }

    #[test]
    fn limit_keys_parse_back_and_stay_in_their_mode() {
        let layout = Layout::new("dev", "local");
        let records = [
            LimitKey::Slot { mode: "m", index: 0 },
            LimitKey::Start { mode: "m", index: 12 },
            LimitKey::Backoff { mode: "m" },
        ];
        for record in records {
            let key = layout.limit_key(record);
            assert_eq!(layout.parse_limit_key(&key), Some(record), "{key}");
            assert!(key.starts_with(&layout.mode_limits("m")) && key.starts_with(&layout.all_limits()));
            assert!(!key.starts_with(&layout.mode_limits("m2")), "a mode's records are not another's");
        }
        let theirs = Layout::new("prod", "eu").limit_key(LimitKey::Backoff { mode: "m" });
        assert_eq!(layout.parse_limit_key(&theirs), None);
        for key in ["/limits/dev/local/m/slot/x", "/limits/dev/local/m/other/1", "/limits/dev/local//backoff"] {
            assert_eq!(layout.parse_limit_key(key), None, "{key}");
        }
    }

    #[test]
    fn every_record_lies_in_its_collection() {
        let layout = Layout::new("dev", "local");
        let (namespace, api) = ("core", "compute.example.com");
        let pairs = [
            (RecordRef::Namespace(namespace), Collection::Namespaces),
            (RecordRef::RoleBinding { namespace, name: "b" }, Collection::NamespaceRoleBindings(namespace)),
            (RecordRef::RoleBinding { namespace, name: "b" }, Collection::RoleBindings),
            (RecordRef::Registration(api), Collection::Registrations),
            (RecordRef::Subscription { namespace, api }, Collection::NamespaceSubscriptions(namespace)),
            (RecordRef::Subscription { namespace, api }, Collection::Subscriptions),
            (RecordRef::RunSlot { namespace, api, slot: 0 }, Collection::RunSlots { namespace, api }),
            (RecordRef::RunSlot { namespace, api, slot: 0 }, Collection::Runs),
            (RecordRef::Runs { namespace, api }, Collection::Runs),
            (RecordRef::Attempt { namespace, api }, Collection::Attempts),
            (RecordRef::Audit("fe6c4d"), Collection::Audit),
            (RecordRef::Delivery("e.ops"), Collection::Deliveries),
            (RecordRef::FanoutMarker(api), Collection::FanoutMarkers),
            (RecordRef::CancelRequest { namespace, api, id: "r" }, Collection::CancelRequests),
        ];
        for (record, collection) in pairs {
            assert!(layout.key(record).starts_with(&layout.prefix(collection)), "{record:?} in {collection:?}");
        }
        // The markers stay outside the deliveries, so the notifier's watch never sees them.
        let marker = layout.key(RecordRef::FanoutMarker(api));
        assert!(!marker.starts_with(&layout.prefix(Collection::Deliveries)));
        // A history's key is outside its earlier slots' prefix, so the
        // write that deletes them can write it in the same transaction
        // (etcd refuses a put inside a deleted range).
        let history = layout.key(RecordRef::Runs { namespace, api });
        assert!(!history.starts_with(&layout.prefix(Collection::RunSlots { namespace, api })));
    }
}
