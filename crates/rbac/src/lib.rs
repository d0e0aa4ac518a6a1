//! `rbac`: who may do what, decided from roles alone.
//!
//! This crate is pure — no I/O, no async — so every rule of platform
//! contract §5.3 is pinned down by unit tests that run in microseconds, and
//! the catalog API and the gateway share one decision procedure. The caller
//! gathers the roles that apply (through cluster role bindings, and for the
//! gateway also role bindings of one namespace) and asks [`authorize`].
//!
//! Matching rules:
//! - a [`Rule`] grants a request when its `apis`, `resources` and `verbs`
//!   each match the request's api, resource and verb;
//! - an entry `"*"` matches anything in its list; every other entry matches
//!   only exactly (case-sensitive, no prefixes), so `subscriptions` does not
//!   grant `subscriptions/sync`;
//! - `apis` omitted means every API (the serde default of
//!   [`kayra_core::Rule`] is `["*"]`); an empty list matches nothing.
//!
//! # Layout
//! - [`Verb`]: the catalog verbs and the HTTP → verb mapping.
//! - [`Request`], [`Decision`], [`rule_grants`], [`authorize`].

use std::fmt;

pub use kayra_core::{Role, Rule};

/// The wildcard entry of a rule list.
pub const WILDCARD: &str = "*";

/// A verb of the catalog API (§5.3). Rules hold verbs as plain strings (the
/// gateway may see any verb); this enum names the ones kayra's own routes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH, and the `/sync` shorthands.
    Patch,
    /// DELETE.
    Delete,
    /// A GET with `?watch=true` (§4.5): neither `get` nor `list` grants it.
    Watch,
}

impl Verb {
    /// Every verb, for exhaustive tests and docs.
    pub const ALL: [Verb; 7] =
        [Verb::Get, Verb::List, Verb::Create, Verb::Update, Verb::Patch, Verb::Delete, Verb::Watch];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::Watch => "watch",
        }
    }

    /// The verb of an HTTP request (§5.3): GET of one object is `get`, of a
    /// collection `list`; POST `create`; PUT `update`; PATCH `patch`; DELETE
    /// `delete`. `None` for methods without a verb (HEAD, OPTIONS, …).
    /// Method names are matched case-sensitively, as HTTP defines them.
    pub fn from_http(method: &str, collection: bool) -> Option<Verb> {
        Some(match method {
            "GET" if collection => Verb::List,
            "GET" => Verb::Get,
            "POST" => Verb::Create,
            "PUT" => Verb::Update,
            "PATCH" => Verb::Patch,
            "DELETE" => Verb::Delete,
            _ => return None,
        })
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a caller asks to do: `verb` on `resource` of `api`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The API's long name, e.g. `catalog.example.com`.
    pub api: &'a str,
    /// e.g. `subscriptions`, `subscriptions/sync`, `users/tokens`.
    pub resource: &'a str,
    /// e.g. `get`, `patch`.
    pub verb: &'a str,
}

impl<'a> Request<'a> {
    pub fn new(api: &'a str, resource: &'a str, verb: &'a str) -> Self {
        Self { api, resource, verb }
    }
}

impl fmt::Display for Request<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "verb {:?} on resource {:?} of api {:?}", self.verb, self.resource, self.api)
    }
}

/// The outcome of [`authorize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed by rule `rule` (an index into its rules) of role `role`.
    Allow { role: String, rule: usize },
    /// No rule of any given role grants the request.
    Deny,
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }
}

/// Whether `list` admits `value`: it holds `"*"` or exactly `value`.
fn admits(list: &[String], value: &str) -> bool {
    list.iter().any(|entry| entry == WILDCARD || entry == value)
}

/// Whether one rule grants `request`.
pub fn rule_grants(rule: &Rule, request: &Request<'_>) -> bool {
    admits(&rule.apis, request.api) && admits(&rule.resources, request.resource) && admits(&rule.verbs, request.verb)
}

/// Decides `request` against every rule of `roles`: allowed as soon as one
/// rule grants it (RBAC is purely additive: there are no deny rules).
pub fn authorize<'r>(roles: impl IntoIterator<Item = &'r Role>, request: &Request<'_>) -> Decision {
    for role in roles {
        if let Some(index) = role.rules.iter().position(|rule| rule_grants(rule, request)) {
            return Decision::Allow { role: role.name.clone(), rule: index };
        }
    }
    Decision::Deny
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOG: &str = "catalog.example.com";

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn rule(apis: &[&str], resources: &[&str], verbs: &[&str]) -> Rule {
        Rule { apis: strings(apis), resources: strings(resources), verbs: strings(verbs) }
    }

    fn role(name: &str, rules: Vec<Rule>) -> Role {
        Role { name: name.into(), rules }
    }

    fn allowed(roles: &[Role], resource: &str, verb: &str) -> bool {
        authorize(roles, &Request::new(CATALOG, resource, verb)).is_allowed()
    }

    /// Every resource value the catalog routes use.
    const RESOURCES: [&str; 13] = [
        "namespaces",
        "apiregistrations",
        "apiregistrations/sync",
        "apiregistrations/status",
        "subscriptions",
        "subscriptions/sync",
        "subscriptions/cancel",
        "users",
        "users/tokens",
        "roles",
        "clusterrolebindings",
        "rolebindings",
        "compute",
    ];

    #[test]
    fn http_verbs_map_as_the_contract_says() {
        assert_eq!(Verb::from_http("GET", false), Some(Verb::Get));
        assert_eq!(Verb::from_http("GET", true), Some(Verb::List));
        for collection in [false, true] {
            assert_eq!(Verb::from_http("POST", collection), Some(Verb::Create));
            assert_eq!(Verb::from_http("PUT", collection), Some(Verb::Update));
            assert_eq!(Verb::from_http("PATCH", collection), Some(Verb::Patch));
            assert_eq!(Verb::from_http("DELETE", collection), Some(Verb::Delete));
            assert_eq!(Verb::from_http("HEAD", collection), None);
            assert_eq!(Verb::from_http("OPTIONS", collection), None);
            assert_eq!(Verb::from_http("get", collection), None);
        }
        let names: Vec<_> = Verb::ALL.iter().map(|v| v.to_string()).collect();
        assert_eq!(names, ["get", "list", "create", "update", "patch", "delete", "watch"]);
    }

    #[test]
    fn sysadmin_wildcards_grant_everything() {
        let roles = [role("sysadmin", vec![rule(&["*"], &["*"], &["*"])])];
        for resource in RESOURCES {
            for verb in Verb::ALL {
                assert!(allowed(&roles, resource, verb.as_str()), "{resource} {verb}");
            }
            assert!(authorize(&roles, &Request::new("compute.example.com", resource, "frobnicate")).is_allowed());
        }
    }

    #[test]
    fn omitted_apis_means_every_api() {
        let rule: Rule = serde_json::from_str(r#"{"resources": ["subscriptions"], "verbs": ["get"]}"#).unwrap();
        let roles = [role("r", vec![rule])];
        for api in [CATALOG, "compute.example.com", "x.y"] {
            assert!(authorize(&roles, &Request::new(api, "subscriptions", "get")).is_allowed(), "{api}");
        }
    }

    #[test]
    fn empty_lists_match_nothing() {
        for r in [rule(&[], &["*"], &["*"]), rule(&["*"], &[], &["*"]), rule(&["*"], &["*"], &[])] {
            let roles = [role("r", vec![r])];
            assert!(!allowed(&roles, "namespaces", "get"));
        }
        assert!(!allowed(&[role("empty", vec![])], "namespaces", "get"));
        assert!(!allowed(&[], "namespaces", "get"));
    }

    #[test]
    fn subscription_update_does_not_grant_sync_and_vice_versa() {
        let update = [role("editor", vec![rule(&[CATALOG], &["subscriptions"], &["update"])])];
        assert!(allowed(&update, "subscriptions", "update"));
        assert!(!allowed(&update, "subscriptions/sync", "patch"));
        assert!(!allowed(&update, "subscriptions/sync", "update"));
        assert!(!allowed(&update, "subscriptions", "patch"));

        let sync = [role("syncer", vec![rule(&[CATALOG], &["subscriptions/sync"], &["patch"])])];
        assert!(allowed(&sync, "subscriptions/sync", "patch"));
        assert!(!allowed(&sync, "subscriptions", "update"));
        assert!(!allowed(&sync, "subscriptions", "patch"));

        let star = [role("all", vec![rule(&[CATALOG], &["*"], &["update", "patch"])])];
        assert!(allowed(&star, "subscriptions", "update"));
        assert!(allowed(&star, "subscriptions/sync", "patch"));
        assert!(allowed(&star, "subscriptions/cancel", "patch"));
    }

    #[test]
    fn cancelling_a_run_is_its_own_resource() {
        let sync = [role("syncer", vec![rule(&[CATALOG], &["subscriptions", "subscriptions/sync"], &["*"])])];
        assert!(!allowed(&sync, "subscriptions/cancel", "patch"), "re-syncing grants no cancel");
        let cancel = [role("canceller", vec![rule(&[CATALOG], &["subscriptions/cancel"], &["patch"])])];
        assert!(allowed(&cancel, "subscriptions/cancel", "patch"));
        assert!(!allowed(&cancel, "subscriptions/cancel", "update"));
        assert!(!allowed(&cancel, "subscriptions/sync", "patch"));
    }

    #[test]
    fn list_and_get_are_distinct() {
        let lister = [role("lister", vec![rule(&["*"], &["namespaces"], &["list"])])];
        assert!(allowed(&lister, "namespaces", "list"));
        assert!(!allowed(&lister, "namespaces", "get"));
        let getter = [role("getter", vec![rule(&["*"], &["namespaces"], &["get"])])];
        assert!(allowed(&getter, "namespaces", "get"));
        assert!(!allowed(&getter, "namespaces", "list"));
    }

    #[test]
    fn matching_is_exact_not_prefix_or_case_insensitive() {
        let roles = [role("r", vec![rule(&[CATALOG], &["subscriptions"], &["get"])])];
        for resource in ["subscription", "subscriptions/", "Subscriptions", "subscriptions/sync", "sub*", ""] {
            assert!(!allowed(&roles, resource, "get"), "{resource}");
        }
        for verb in ["GET", "gets", "", "*"] {
            assert!(!allowed(&roles, "subscriptions", verb), "{verb}");
        }
        for api in ["catalog.example.co", "CATALOG.example.com", "*", "compute.example.com"] {
            assert!(!authorize(&roles, &Request::new(api, "subscriptions", "get")).is_allowed(), "{api}");
        }
        // A wildcard is only a whole entry: "subscriptions/*" is a literal.
        let literal = [role("r", vec![rule(&["*"], &["subscriptions/*"], &["*"])])];
        assert!(!allowed(&literal, "subscriptions/sync", "patch"));
        assert!(allowed(&literal, "subscriptions/*", "patch"));
    }

    #[test]
    fn every_single_grant_matches_exactly_its_own_triple() {
        // Exhaustive over the catalog's resources × verbs: a rule naming one
        // (resource, verb) grants that pair and no other.
        for granted_resource in RESOURCES {
            for granted_verb in Verb::ALL {
                let roles = [role("one", vec![rule(&[CATALOG], &[granted_resource], &[granted_verb.as_str()])])];
                for resource in RESOURCES {
                    for verb in Verb::ALL {
                        let expected = resource == granted_resource && verb == granted_verb;
                        assert_eq!(
                            allowed(&roles, resource, verb.as_str()),
                            expected,
                            "grant {granted_resource}/{granted_verb}, ask {resource}/{verb}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn wildcard_in_one_list_only_widens_that_list() {
        let any_verb = [role("r", vec![rule(&[CATALOG], &["roles"], &["*"])])];
        let any_resource = [role("r", vec![rule(&[CATALOG], &["*"], &["get"])])];
        for resource in RESOURCES {
            for verb in Verb::ALL {
                assert_eq!(allowed(&any_verb, resource, verb.as_str()), resource == "roles");
                assert_eq!(allowed(&any_resource, resource, verb.as_str()), verb == Verb::Get);
            }
        }
    }

    #[test]
    fn roles_and_rules_are_additive_and_the_granting_one_is_named() {
        let roles = [
            role("reader", vec![rule(&["*"], &["namespaces"], &["get", "list"])]),
            role("writer", vec![rule(&["x.y"], &["*"], &["*"]), rule(&[CATALOG], &["namespaces"], &["create"])]),
        ];
        assert_eq!(
            authorize(&roles, &Request::new(CATALOG, "namespaces", "create")),
            Decision::Allow { role: "writer".into(), rule: 1 }
        );
        assert_eq!(
            authorize(&roles, &Request::new(CATALOG, "namespaces", "list")),
            Decision::Allow { role: "reader".into(), rule: 0 }
        );
        assert_eq!(authorize(&roles, &Request::new(CATALOG, "namespaces", "delete")), Decision::Deny);
        assert!(authorize(&roles, &Request::new("x.y", "anything", "delete")).is_allowed());
    }

    #[test]
    fn request_display_names_api_resource_and_verb() {
        let text = Request::new(CATALOG, "subscriptions/sync", "patch").to_string();
        assert!(text.contains("catalog.example.com") && text.contains("subscriptions/sync") && text.contains("patch"));
    }
}
