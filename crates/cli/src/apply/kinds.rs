//! The kinds `apply` knows and, per kind, the document it accepts: the
//! resource's writable fields (platform §4, §5; the server's types in
//! `kayra_core::resources`), every other key refused.
//!
//! Each document type is deserialized with `deny_unknown_fields`, so a
//! misspelt field is an error naming it, never a silent no-op. Optional
//! writable fields are `Option`s: a field the document leaves out is not
//! compared and not written, so it keeps its value on the server. A test
//! below keeps these field lists equal to the server's resource types minus
//! their computed fields (the fields each type's `Deserialize` reads, so a
//! field the server leaves out of its answers when empty counts too).

use kayra_core::rollout::RolloutPolicy;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// The kinds, in the order `apply` writes them: what a later kind refers to
/// (a namespace, a role, a user, a registration) exists by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Namespace,
    User,
    Role,
    ApiRegistration,
    ClusterRoleBinding,
    RoleBinding,
    Subscription,
}

impl Kind {
    /// Every kind, in apply order.
    pub const ALL: [Kind; 7] = [
        Kind::Namespace,
        Kind::User,
        Kind::Role,
        Kind::ApiRegistration,
        Kind::ClusterRoleBinding,
        Kind::RoleBinding,
        Kind::Subscription,
    ];

    /// The `kind` value of a document.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::User => "User",
            Kind::Role => "Role",
            Kind::ApiRegistration => "ApiRegistration",
            Kind::ClusterRoleBinding => "ClusterRoleBinding",
            Kind::RoleBinding => "RoleBinding",
            Kind::Subscription => "Subscription",
        }
    }

    pub fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    /// The catalog's collection (`namespaces`, `apiregistrations`, ...).
    pub fn resource(self) -> &'static str {
        match self {
            Kind::Namespace => "namespaces",
            Kind::User => "users",
            Kind::Role => "roles",
            Kind::ApiRegistration => "apiregistrations",
            Kind::ClusterRoleBinding => "clusterrolebindings",
            Kind::RoleBinding => "rolebindings",
            Kind::Subscription => "subscriptions",
        }
    }

    /// The key naming the object inside its collection: `api` for a
    /// subscription, `name` for everything else.
    pub fn name_key(self) -> &'static str {
        if self == Kind::Subscription { "api" } else { "name" }
    }

    /// Whether objects of this kind live in a namespace (their documents
    /// need `namespace`).
    pub fn is_namespaced(self) -> bool {
        matches!(self, Kind::RoleBinding | Kind::Subscription)
    }

    /// Reads a document's fields (`kind` and `status` already removed) as
    /// this kind's type: an unknown field, a missing required one or a value
    /// of the wrong type is an error naming its path (`rules[0].verbs`).
    /// On success, the document as JSON again, normalized (a rule without
    /// `apis` has `["*"]`, as the server stores it), with only the fields
    /// the document sets.
    pub fn read(self, fields: Map<String, Value>) -> Result<Map<String, Value>, String> {
        match self {
            Kind::Namespace => typed::<NamespaceDoc>(fields),
            Kind::User => typed::<UserDoc>(fields),
            Kind::Role => typed::<RoleDoc>(fields),
            Kind::ApiRegistration => typed::<RegistrationDoc>(fields),
            Kind::ClusterRoleBinding => typed::<ClusterRoleBindingDoc>(fields),
            Kind::RoleBinding => typed::<RoleBindingDoc>(fields),
            Kind::Subscription => typed::<SubscriptionDoc>(fields),
        }
    }
}

/// `fields` through `T` and back to JSON; errors name the field's path.
fn typed<T: DeserializeOwned + Serialize>(fields: Map<String, Value>) -> Result<Map<String, Value>, String> {
    let doc: T = serde_path_to_error::deserialize(Value::Object(fields)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // Unknown and missing fields name themselves (with the path for a nested one).
        let names_itself = inner.starts_with("unknown field") || inner.starts_with("missing field");
        match (path.as_str(), names_itself) {
            (".", _) => inner,
            (_, true) if !path.contains(['.', '[']) => inner,
            _ => format!("field `{path}`: {inner}"),
        }
    })?;
    match serde_json::to_value(doc) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) | Err(_) => Err("the document does not encode back to an object".into()),
    }
}

/// A tenant (§4.1): `name`, `description`, `labels` (the whole map: a
/// label the document leaves out is removed).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceDoc {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<std::collections::BTreeMap<String, String>>,
}

/// A user (§5.2): the object only. Tokens are issued by `POST
/// /users/NAME/tokens` and shown once; apply never makes or changes them.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserDoc {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

/// A role (§5.3): its rules, as a whole list.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleDoc {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rules: Option<Vec<RuleDoc>>,
}

/// One rule, in the server's stored form once read: `apis` omitted is
/// every API (`["*"]`), so an unchanged role compares equal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleDoc {
    #[serde(default = "every")]
    apis: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

fn every() -> Vec<String> {
    vec!["*".to_string()]
}

/// An API registration (§4.2). An empty `sync_id` means "let the server
/// choose" and is dropped when the document is checked. `rollout` (§12) is
/// the whole policy: left out, the server's is kept; `null`, the
/// registration has none (a policy the server holds is removed); a policy
/// replaces the server's (a key it leaves out is removed with it, so
/// `progress_deadline` left out means no deadline).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistrationDoc {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    short_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sync_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    /// `None`: left out; `Some(None)`: `null`.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    rollout: Option<Option<RolloutPolicy>>,
}

/// A field the document holds, `null` included (`Some(None)`): with
/// `default`, a field left out stays `None`, which `null` alone would be too.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// A cluster role binding (§5.3): both ends are required, as on create.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterRoleBindingDoc {
    name: String,
    role: String,
    user: String,
}

/// A role binding (§5.3), in its namespace.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleBindingDoc {
    name: String,
    namespace: String,
    role: String,
    user: String,
}

/// A subscription (§4.3): nothing to change once it exists.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscriptionDoc {
    namespace: String,
    api: String,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use kayra_core::resources;
    use serde_json::json;

    use super::*;

    /// The fields of a resource type: the names its derived `Deserialize`
    /// hands to `deserialize_struct`, recorded here by a deserializer that
    /// then stops. Unlike the keys of a serialized value, this holds the
    /// fields a `skip_serializing_if` leaves out (a registration's
    /// `rollout` when it has none).
    fn fields_of<T: DeserializeOwned>() -> BTreeSet<String> {
        use serde::de::{Error as _, Visitor, value::Error};

        struct Fields<'a>(&'a mut &'static [&'static str]);

        impl<'de> Deserializer<'de> for Fields<'_> {
            type Error = Error;

            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
                Err(Error::custom("not a struct"))
            }

            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Error> {
                *self.0 = fields;
                Err(Error::custom("fields recorded"))
            }

            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
                unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
            }
        }

        let mut fields: &'static [&'static str] = &[];
        let _ = T::deserialize(Fields(&mut fields));
        assert!(!fields.is_empty(), "{} is not a struct with named fields", std::any::type_name::<T>());
        fields.iter().map(|f| f.to_string()).collect()
    }

    /// The keys a document of `kind` may hold, found by reading a document
    /// holding every candidate key and keeping those it accepts.
    fn writable(kind: Kind, candidates: &BTreeSet<String>) -> BTreeSet<String> {
        candidates
            .iter()
            .filter(|key| {
                let mut doc = full(kind);
                doc.insert((*key).clone(), sample(key));
                kind.read(doc).is_ok()
            })
            .cloned()
            .collect()
    }

    /// The smallest valid document of `kind`.
    fn full(kind: Kind) -> Map<String, Value> {
        let doc = match kind {
            Kind::Subscription => json!({"namespace": "core", "api": "a.example.com"}),
            Kind::RoleBinding => json!({"name": "b", "namespace": "core", "role": "r", "user": "u"}),
            Kind::ClusterRoleBinding => json!({"name": "b", "role": "r", "user": "u"}),
            _ => json!({"name": "x"}),
        };
        doc.as_object().unwrap().clone()
    }

    fn sample(key: &str) -> Value {
        match key {
            "rules" => json!([]),
            "rollout" => json!({"waves": [{"name": "all"}]}),
            "active" => json!(true),
            "labels" => json!({"tier": "canary"}),
            _ => json!("v"),
        }
    }

    /// The document of each kind takes exactly the server type's fields but
    /// the computed ones: when a resource gains a writable field, this fails
    /// until apply knows it too.
    #[test]
    fn documents_take_the_resources_writable_fields() {
        let cases: [(Kind, BTreeSet<String>, &[&str]); 7] = [
            (Kind::Namespace, fields_of::<resources::Namespace>(), &["active"]),
            (Kind::User, fields_of::<resources::User>(), &[]),
            (Kind::Role, fields_of::<resources::Role>(), &[]),
            (
                Kind::ApiRegistration,
                fields_of::<resources::ApiRegistration>(),
                &["sync_id_updated_at", "platform", "region"],
            ),
            (Kind::ClusterRoleBinding, fields_of::<resources::ClusterRoleBinding>(), &[]),
            (Kind::RoleBinding, fields_of::<resources::RoleBinding>(), &[]),
            (
                Kind::Subscription,
                fields_of::<resources::SubscriptionView>(),
                &["active", "state", "current_sync_id", "expected_sync_id", "synced"],
            ),
        ];
        for (kind, server, computed) in cases {
            let expected: BTreeSet<String> =
                server.iter().filter(|k| !computed.contains(&k.as_str())).cloned().collect();
            let mut candidates = server.clone();
            candidates.extend(["labels", "tokens", "kind", "status", "bogus"].map(String::from));
            assert_eq!(writable(kind, &candidates), expected, "{kind:?}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let err = Kind::Namespace.read(json!({"name": "a", "descripton": "x"}).as_object().unwrap().clone());
        assert!(err.unwrap_err().contains("unknown field `descripton`"));
        let err = Kind::Role
            .read(json!({"name": "r", "rules": [{"resources": ["*"], "verbs": "get"}]}).as_object().unwrap().clone());
        assert!(err.unwrap_err().starts_with("field `rules[0].verbs`: invalid type"));
        let err = Kind::Role
            .read(json!({"name": "r", "rules": [{"resources": ["*"], "verb": ["get"]}]}).as_object().unwrap().clone());
        assert!(err.unwrap_err().contains("unknown field `verb`"));
        let err = Kind::Subscription.read(json!({"api": "a.b"}).as_object().unwrap().clone());
        assert!(err.unwrap_err().contains("missing field `namespace`"));
    }

    #[test]
    fn rules_are_read_in_the_stored_form() {
        let doc = Kind::Role
            .read(json!({"name": "r", "rules": [{"resources": ["*"], "verbs": ["get"]}]}).as_object().unwrap().clone())
            .unwrap();
        assert_eq!(
            Value::Object(doc),
            json!({"name": "r", "rules": [{"apis": ["*"], "resources": ["*"], "verbs": ["get"]}]})
        );
        let doc = Kind::Namespace.read(json!({"name": "a"}).as_object().unwrap().clone()).unwrap();
        assert_eq!(Value::Object(doc), json!({"name": "a"}), "a field left out stays out");
    }

    #[test]
    fn a_rollout_is_read_in_the_stored_form_and_null_is_kept() {
        let read = |doc: Value| Kind::ApiRegistration.read(doc.as_object().unwrap().clone());
        let doc = read(json!({"name": "a.example.com", "rollout": {"waves": [{"name": "canary", "size": "1"}]}}));
        assert_eq!(
            doc.unwrap()["rollout"],
            json!({"waves": [{"name": "canary", "size": "1", "approval": "auto"}], "on_failure": "pause"}),
            "defaults spelt out, as the server answers"
        );
        let doc = read(json!({"name": "a.example.com", "rollout": null})).unwrap();
        assert_eq!(doc.get("rollout"), Some(&Value::Null), "null is the document's: no policy");
        let doc = read(json!({"name": "a.example.com"})).unwrap();
        assert_eq!(doc.get("rollout"), None, "left out stays out");
        let err = read(json!({"name": "a.example.com", "rollout": {"waves": [{"name": "a", "sise": "1"}]}}));
        let err = err.unwrap_err();
        assert!(err.contains("rollout.waves[0]") && err.contains("unknown field `sise`"), "{err}");
        let err = read(json!({"name": "a.example.com", "rollout": {"waves": [{"name": "a", "approval": "maybe"}]}}));
        assert!(err.unwrap_err().starts_with("field `rollout.waves[0].approval`: unknown variant"));
    }

    #[test]
    fn kinds_round_trip_in_order() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.as_str()), Some(kind));
        }
        assert!(Kind::ALL.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(Kind::parse("namespace"), None);
    }
}
