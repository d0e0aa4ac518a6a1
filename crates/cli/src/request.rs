//! From `API [-n NAMESPACE] RESOURCE [NAME[/SUBRESOURCE]]` and a verb to an
//! HTTP request (method, path, body). Pure: no I/O, so every mapping is
//! unit-tested.
//!
//! Two kinds of API:
//! - `catalog` (or `catalog.example.com`): kayra's own API at
//!   `/apis/catalog.example.com/v1/[namespaces/NS/]RESOURCE[/NAME[/SUB]]`.
//!   The CLI knows its resources, so it checks scope (`-n` where needed,
//!   refused where meaningless) and subresources before sending anything.
//! - any other name: a registered API, reached through the gateway at
//!   `/apis/<long name>/v1/namespaces/<ns>/<resource>[/<name>[/<rest>]]`.
//!   A short name (no dot) must first be resolved to the long one, which
//!   takes a catalog request ([`crate::client::Client::resolve`]).
//!
//! # NAME and subresources
//!
//! API long names contain dots (`dev.example.com`), names never contain `/`
//! (they are DNS labels or subdomains), so everything after the first `/`
//! of NAME is a subresource path. In the catalog that path must start with
//! a known subresource: `sync`, `status`, or `tokens` (optionally followed
//! by a token ID: `alice/tokens/ID`). A gateway path is the registered
//! API's business and passes through as given.

use reqwest::{Method, Url};
use serde_json::{Map, Value};

use crate::error::{Error, invalid};

/// The catalog API's long name.
pub const CATALOG: &str = "catalog.example.com";
/// The only API version there is.
pub const VERSION: &str = "v1";

/// Catalog subresources: what may follow `NAME/`.
pub const SUBRESOURCES: [&str; 5] = ["sync", "status", "rollout", "tokens", "runs"];

/// Catalog resources that live under `/namespaces/NS/`.
const NAMESPACED: [&str; 2] = ["subscriptions", "rolebindings"];
/// Catalog resources that are cluster-scoped (refuse `-n`).
const CLUSTER_SCOPED: [&str; 7] =
    ["namespaces", "apiregistrations", "users", "roles", "clusterrolebindings", "whoami", "audit"];

/// The API argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Api {
    /// kayra's catalog API.
    Catalog,
    /// A registered API by its long name (contains a dot).
    Long(String),
    /// A registered API by its short name, not yet resolved.
    Short(String),
}

impl Api {
    /// Reads the API argument. `catalog` and `catalog.example.com` are the
    /// catalog; a name with a dot is a long name; anything else a short one.
    pub fn parse(text: &str) -> Result<Api, Error> {
        if text == "catalog" || text == CATALOG {
            return Ok(Api::Catalog);
        }
        if text.is_empty() || text.contains('/') || text.chars().any(char::is_whitespace) {
            return Err(invalid(format!("invalid API {text:?}: expected catalog or a registered API's name")));
        }
        Ok(if text.contains('.') { Api::Long(text.to_string()) } else { Api::Short(text.to_string()) })
    }

    /// The name for the request path. An unresolved short name appears as
    /// given: such a request is only built to check the arguments before
    /// any network call (the gateway would refuse it with a 400 naming the
    /// long name); [`crate::client::Client::resolve`] runs before sending.
    pub fn path_name(&self) -> &str {
        match self {
            Api::Catalog => CATALOG,
            Api::Long(name) | Api::Short(name) => name,
        }
    }
}

/// What a command acts on, checked and split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub api: Api,
    pub namespace: Option<String>,
    pub resource: String,
    /// `None` means the collection.
    pub object: Option<ObjectRef>,
}

/// `NAME[/SUBRESOURCE...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    pub name: String,
    /// Path segments after the name: `["sync"]`, `["tokens", "ID"]`, or a
    /// gateway API's own.
    pub sub: Vec<String>,
}

impl ObjectRef {
    /// Splits NAME at its first `/` (a name never contains one; a long API
    /// name's dots stay in the name) and, in the catalog, checks what follows.
    fn parse(api: &Api, text: &str) -> Result<ObjectRef, Error> {
        let mut segments = text.split('/');
        let name = segments.next().unwrap_or_default();
        let sub: Vec<String> = segments.map(str::to_string).collect();
        if name.is_empty() || sub.iter().any(String::is_empty) {
            return Err(invalid(format!("invalid NAME {text:?}: expected NAME or NAME/SUBRESOURCE")));
        }
        for segment in std::iter::once(name).chain(sub.iter().map(String::as_str)) {
            safe_segment("NAME", segment)?;
        }
        if *api == Api::Catalog
            && let Some(first) = sub.first()
        {
            let allowed_len = match first.as_str() {
                "sync" | "status" | "rollout" => 1,
                // `runs/ID/cancel` stops a run in flight (§12).
                "runs" if sub.get(2).is_some_and(|s| s == "cancel") => 3,
                "tokens" | "runs" => 2,
                _ => {
                    return Err(invalid(format!(
                        "invalid NAME {text:?}: unknown subresource {first:?} (the catalog's are {})",
                        SUBRESOURCES.join(", ")
                    )));
                }
            };
            if sub.len() > allowed_len {
                return Err(invalid(format!("invalid NAME {text:?}: too many segments after {first:?}")));
            }
        }
        Ok(ObjectRef { name: name.to_string(), sub })
    }

    /// The first subresource segment, if any (`sync`, `status`, `tokens`).
    pub fn subresource(&self) -> Option<&str> {
        self.sub.first().map(String::as_str)
    }
}

/// A verb of the command line; each maps to one HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    Create,
    Update,
    Patch,
    Delete,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }
}

/// Which table fits a response (see [`crate::output`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Subscriptions,
    Registrations,
    RegistrationStatus,
    Namespaces,
    /// A subscription's runs (`subscriptions API/runs`).
    Runs,
    /// The audit trail (`audit`).
    Audit,
    /// A registration's rollout (`apiregistrations NAME/rollout`).
    Rollout,
    Generic,
}

impl Target {
    /// Checks the arguments and splits NAME. Nothing is resolved yet: a
    /// short API name stays [`Api::Short`].
    pub fn new(api: &str, namespace: Option<&str>, resource: &str, name: Option<&str>) -> Result<Target, Error> {
        let api = Api::parse(api)?;
        safe_segment("API", api.path_name())?;
        check_segment("RESOURCE", resource)?;
        if let Some(ns) = namespace {
            check_segment("namespace", ns)?;
        }
        match &api {
            Api::Catalog if NAMESPACED.contains(&resource) && namespace.is_none() => {
                return Err(invalid(format!("{resource} are namespaced: pass -n NAMESPACE")));
            }
            Api::Catalog if CLUSTER_SCOPED.contains(&resource) && namespace.is_some() => {
                return Err(invalid(format!("{resource} are cluster-scoped: drop -n")));
            }
            Api::Long(_) | Api::Short(_) if namespace.is_none() => {
                return Err(invalid("requests to a registered API go into a namespace: pass -n NAMESPACE"));
            }
            _ => {}
        }
        let object = name.map(|name| ObjectRef::parse(&api, name)).transpose()?;
        Ok(Target { api, namespace: namespace.map(str::to_string), resource: resource.to_string(), object })
    }

    pub fn is_catalog(&self) -> bool {
        self.api == Api::Catalog
    }

    /// Whether a GET of this target answers a list (`{"items": ..}`) the
    /// CLI should page through.
    pub fn is_collection(&self) -> bool {
        match &self.object {
            None => true,
            // `users NAME/tokens` lists a user's tokens, `subscriptions API/runs` its runs.
            Some(object) => {
                self.is_catalog() && object.sub.len() == 1 && matches!(object.subresource(), Some("tokens" | "runs"))
            }
        }
    }

    /// The table that fits what this target answers.
    pub fn view(&self) -> View {
        if !self.is_catalog() {
            return View::Generic;
        }
        let sub = self.object.as_ref().and_then(ObjectRef::subresource);
        match (self.resource.as_str(), sub) {
            ("subscriptions", None | Some("sync")) => View::Subscriptions,
            ("apiregistrations", None | Some("sync")) => View::Registrations,
            ("apiregistrations", Some("status")) => View::RegistrationStatus,
            ("apiregistrations", Some("rollout")) => View::Rollout,
            ("subscriptions", Some("runs")) => View::Runs,
            ("namespaces", None) => View::Namespaces,
            ("audit", None) => View::Audit,
            _ => View::Generic,
        }
    }

    /// A short human name for messages: `subscriptions/dev.example.com in namespace sre`.
    pub fn describe(&self) -> String {
        let mut text = self.resource.clone();
        if let Some(object) = &self.object {
            text.push('/');
            text.push_str(&object.name);
            for segment in &object.sub {
                text.push('/');
                text.push_str(segment);
            }
        }
        if let Some(ns) = &self.namespace {
            text.push_str(" in namespace ");
            text.push_str(ns);
        }
        text
    }

    /// The path segments, after the server's base URL.
    pub fn path(&self) -> Vec<String> {
        let mut path = vec!["apis".to_string(), self.api.path_name().to_string(), VERSION.to_string()];
        if let Some(ns) = &self.namespace {
            path.extend(["namespaces".to_string(), ns.clone()]);
        }
        path.push(self.resource.clone());
        if let Some(object) = &self.object {
            path.push(object.name.clone());
            path.extend(object.sub.iter().cloned());
        }
        path
    }
}

fn check_segment(what: &str, value: &str) -> Result<(), Error> {
    if value.is_empty() || value.contains('/') || value.chars().any(char::is_whitespace) {
        return Err(invalid(format!("invalid {what} {value:?}")));
    }
    safe_segment(what, value)
}

/// Refuses (exit 2) a path argument that the URL would resolve away (`.`,
/// `..`: `users ../tokens` would become `GET /users/tokens`) or that the
/// server refuses as a path segment anyway (§6): the same rule as the
/// gateway's, applied to the segment as it will be sent. The CLI encodes
/// `%` itself, so the argument's `%` is literal.
fn safe_segment(what: &str, value: &str) -> Result<(), Error> {
    let as_sent = value.replace('%', "%25");
    kayra_core::validation::path_segment(&as_sent).map_err(|_| {
        Error::Unsafe(format!(
            "refusing to send {what} {value:?}: \".\", \"..\", '\\' and control characters are not allowed in a path"
        ))
    })
}

/// A request ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: Method,
    pub path: Vec<String>,
    pub body: Option<Value>,
}

impl Request {
    /// Maps a verb on a target to a request. `data` is the parsed `-d`.
    ///
    /// - get: GET of the object, or of the collection without NAME.
    /// - create: POST to the collection. A plain NAME (catalog only) fills
    ///   the body's key field: `name`, or `api` for subscriptions. With
    ///   `NAME/tokens` it POSTs there (a new token for that user).
    /// - update: PUT; patch: PATCH (a JSON merge patch); delete: DELETE. All
    ///   three need NAME.
    ///
    /// The body is required for create/update/patch except where `{}` is
    /// the only sensible one: the `/sync` shorthands and `tokens`.
    pub fn build(verb: Verb, target: &Target, data: Option<Value>) -> Result<Request, Error> {
        let needs_name = matches!(verb, Verb::Update | Verb::Patch | Verb::Delete);
        if needs_name && target.object.is_none() {
            return Err(invalid(format!(
                "{} needs a NAME: kayra-cli {} API RESOURCE NAME",
                verb.as_str(),
                verb.as_str()
            )));
        }
        let sub = target.object.as_ref().and_then(ObjectRef::subresource);
        let mut path = target.path();
        let cancel = target.object.as_ref().is_some_and(|o| o.sub.len() == 3 && o.sub[2] == "cancel");
        let empty_body_ok = matches!(sub, Some("sync" | "tokens")) || cancel;
        let body = match verb {
            Verb::Get | Verb::Delete => None,
            Verb::Create => match (&target.object, data) {
                // A plain catalog NAME on create: POST to the collection with the name in the body.
                (Some(object), data) if object.sub.is_empty() && target.is_catalog() => {
                    path.pop();
                    Some(with_key_field(&target.resource, &object.name, data)?)
                }
                (_, Some(data)) => Some(data),
                (_, None) if empty_body_ok => Some(Value::Object(Map::new())),
                (_, None) => {
                    return Err(invalid("create needs the object: -d DATA (JSON or YAML, @FILE, @-)"));
                }
            },
            Verb::Update | Verb::Patch => match data {
                Some(data) => Some(data),
                None if empty_body_ok => Some(Value::Object(Map::new())),
                None => {
                    return Err(invalid(format!("{} needs -d DATA (JSON or YAML, @FILE, @-)", verb.as_str())));
                }
            },
        };
        let method = match verb {
            Verb::Get => Method::GET,
            Verb::Create => Method::POST,
            Verb::Update => Method::PUT,
            Verb::Patch => Method::PATCH,
            Verb::Delete => Method::DELETE,
        };
        Ok(Request { method, path, body })
    }

    /// The full URL under `base` (which may carry a path prefix of its own).
    /// Every segment is percent-encoded.
    pub fn url(&self, base: &Url) -> Url {
        let mut url = base.clone();
        url.set_query(None);
        url.set_fragment(None);
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(&self.path);
        }
        url
    }
}

/// The body of `create catalog RESOURCE NAME`: `data` (or `{}`) with the
/// key field set to NAME, refusing a `-d` that names something else.
fn with_key_field(resource: &str, name: &str, data: Option<Value>) -> Result<Value, Error> {
    let key = if resource == "subscriptions" { "api" } else { "name" };
    let mut object = match data {
        None => Map::new(),
        Some(Value::Object(object)) => object,
        Some(_) => return Err(invalid("-d must be an object")),
    };
    match object.get(key) {
        Some(Value::String(given)) if given == name => {}
        Some(given) => {
            return Err(invalid(format!("NAME {name:?} and -d's {key:?} ({given}) disagree: give one of them")));
        }
        None => {
            object.insert(key.to_string(), Value::String(name.to_string()));
        }
    }
    Ok(Value::Object(object))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target(api: &str, ns: Option<&str>, resource: &str, name: Option<&str>) -> Target {
        Target::new(api, ns, resource, name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn build(verb: Verb, target: &Target, data: Option<Value>) -> Request {
        Request::build(verb, target, data).unwrap_or_else(|e| panic!("{e}"))
    }

    fn url(request: &Request) -> String {
        request.url(&Url::parse("http://localhost:8080").unwrap()).to_string()
    }

    const BASE: &str = "http://localhost:8080/apis/catalog.example.com/v1";

    #[test]
    fn seed_create_example() {
        let t = target("catalog", Some("core"), "subscriptions", None);
        let r = build(Verb::Create, &t, Some(json!({"api": "compute.example.com"})));
        assert_eq!(r.method, Method::POST);
        assert_eq!(url(&r), format!("{BASE}/namespaces/core/subscriptions"));
        assert_eq!(r.body, Some(json!({"api": "compute.example.com"})));
    }

    #[test]
    fn seed_resync_example() {
        let t = target("catalog", Some("sre"), "subscriptions", Some("dev.example.com/sync"));
        assert_eq!(t.object, Some(ObjectRef { name: "dev.example.com".into(), sub: vec!["sync".into()] }));
        let r = build(Verb::Update, &t, Some(json!({})));
        assert_eq!(r.method, Method::PUT);
        assert_eq!(url(&r), format!("{BASE}/namespaces/sre/subscriptions/dev.example.com/sync"));
        assert_eq!(r.body, Some(json!({})));
    }

    #[test]
    fn every_verb() {
        let one = target("catalog", None, "namespaces", Some("core"));
        let all = target("catalog", None, "namespaces", None);
        let body = json!({"description": "x"});

        let r = build(Verb::Get, &all, None);
        assert_eq!((r.method.clone(), url(&r), r.body), (Method::GET, format!("{BASE}/namespaces"), None));
        let r = build(Verb::Get, &one, None);
        assert_eq!((r.method.clone(), url(&r), r.body), (Method::GET, format!("{BASE}/namespaces/core"), None));
        let r = build(Verb::Create, &all, Some(json!({"name": "core"})));
        assert_eq!((r.method.clone(), url(&r)), (Method::POST, format!("{BASE}/namespaces")));
        let r = build(Verb::Update, &one, Some(body.clone()));
        assert_eq!(
            (r.method.clone(), url(&r), r.body),
            (Method::PUT, format!("{BASE}/namespaces/core"), Some(body.clone()))
        );
        let r = build(Verb::Patch, &one, Some(body.clone()));
        assert_eq!((r.method.clone(), url(&r), r.body), (Method::PATCH, format!("{BASE}/namespaces/core"), Some(body)));
        let r = build(Verb::Delete, &one, None);
        assert_eq!((r.method.clone(), url(&r), r.body), (Method::DELETE, format!("{BASE}/namespaces/core"), None));
    }

    #[test]
    fn catalog_long_name_is_the_catalog() {
        assert_eq!(target("catalog.example.com", None, "namespaces", None).api, Api::Catalog);
    }

    #[test]
    fn write_verbs_need_a_name() {
        let all = target("catalog", None, "namespaces", None);
        for verb in [Verb::Update, Verb::Patch, Verb::Delete] {
            let err = Request::build(verb, &all, Some(json!({}))).unwrap_err();
            assert!(err.to_string().contains("needs a NAME"), "{err}");
        }
    }

    #[test]
    fn bodies_are_required_where_they_matter() {
        let one = target("catalog", None, "namespaces", Some("core"));
        assert!(Request::build(Verb::Update, &one, None).is_err());
        assert!(Request::build(Verb::Patch, &one, None).is_err());
        let all = target("catalog", None, "namespaces", None);
        assert!(Request::build(Verb::Create, &all, None).is_err());
    }

    #[test]
    fn a_run_is_cancelled_with_an_update_of_its_cancel() {
        let id = "0193a6c1-0000-7000-8000-000000000001";
        let t = target("catalog", Some("sre"), "subscriptions", Some(&format!("dev.example.com/runs/{id}/cancel")));
        let r = build(Verb::Update, &t, None);
        assert_eq!(r.method, Method::PUT);
        assert_eq!(url(&r), format!("{BASE}/namespaces/sre/subscriptions/dev.example.com/runs/{id}/cancel"));
        assert_eq!(r.body, Some(json!({})), "the reason is optional");
        let r = build(Verb::Update, &t, Some(json!({"reason": "bad canary"})));
        assert_eq!(r.body, Some(json!({"reason": "bad canary"})));
        for bad in [format!("dev.example.com/runs/{id}/other"), format!("dev.example.com/runs/{id}/cancel/x")] {
            let err = Target::new("catalog", Some("sre"), "subscriptions", Some(&bad)).unwrap_err();
            assert!(err.to_string().contains("too many segments"), "{bad}: {err}");
        }
    }

    #[test]
    fn sync_shorthands_default_to_an_empty_body() {
        let reg = target("catalog", None, "apiregistrations", Some("compute.example.com/sync"));
        let r = build(Verb::Update, &reg, None);
        assert_eq!(url(&r), format!("{BASE}/apiregistrations/compute.example.com/sync"));
        assert_eq!(r.body, Some(json!({})));
        let sub = target("catalog", Some("sre"), "subscriptions", Some("dev.example.com/sync"));
        assert_eq!(build(Verb::Update, &sub, None).body, Some(json!({})));
    }

    #[test]
    fn create_with_name_fills_the_key_field() {
        let ns = target("catalog", None, "namespaces", Some("core"));
        let r = build(Verb::Create, &ns, None);
        assert_eq!(url(&r), format!("{BASE}/namespaces"));
        assert_eq!(r.body, Some(json!({"name": "core"})));

        let r = build(Verb::Create, &ns, Some(json!({"description": "d"})));
        assert_eq!(r.body, Some(json!({"name": "core", "description": "d"})));
        let r = build(Verb::Create, &ns, Some(json!({"name": "core"})));
        assert_eq!(r.body, Some(json!({"name": "core"})));
        let err = Request::build(Verb::Create, &ns, Some(json!({"name": "other"}))).unwrap_err();
        assert!(err.to_string().contains("disagree"), "{err}");

        let sub = target("catalog", Some("core"), "subscriptions", Some("compute.example.com"));
        let r = build(Verb::Create, &sub, None);
        assert_eq!(url(&r), format!("{BASE}/namespaces/core/subscriptions"));
        assert_eq!(r.body, Some(json!({"api": "compute.example.com"})));
    }

    #[test]
    fn registration_status_and_names_with_dots() {
        let t = target("catalog", None, "apiregistrations", Some("compute.example.com/status"));
        assert_eq!(t.view(), View::RegistrationStatus);
        assert!(!t.is_collection());
        let r = build(Verb::Get, &t, None);
        assert_eq!(url(&r), format!("{BASE}/apiregistrations/compute.example.com/status"));

        let t = target("catalog", None, "apiregistrations", Some("compute.example.com"));
        assert_eq!(t.object, Some(ObjectRef { name: "compute.example.com".into(), sub: vec![] }));
        assert_eq!(t.view(), View::Registrations);
    }

    #[test]
    fn user_tokens() {
        let list = target("catalog", None, "users", Some("alice/tokens"));
        assert!(list.is_collection());
        let r = build(Verb::Get, &list, None);
        assert_eq!(url(&r), format!("{BASE}/users/alice/tokens"));
        let r = build(Verb::Create, &list, None);
        assert_eq!(
            (r.method.clone(), url(&r), r.body),
            (Method::POST, format!("{BASE}/users/alice/tokens"), Some(json!({})))
        );

        let one = target("catalog", None, "users", Some("alice/tokens/0a1b2c"));
        assert_eq!(one.object, Some(ObjectRef { name: "alice".into(), sub: vec!["tokens".into(), "0a1b2c".into()] }));
        assert!(!one.is_collection());
        let r = build(Verb::Delete, &one, None);
        assert_eq!((r.method.clone(), url(&r)), (Method::DELETE, format!("{BASE}/users/alice/tokens/0a1b2c")));
    }

    #[test]
    fn unknown_or_malformed_subresources_are_refused() {
        for name in [
            "a.b/bogus",
            "a.b/sync/x",
            "a.b/status/x",
            "a.b/rollout/x",
            "alice/tokens/id/x",
            "a.b/",
            "/sync",
            "a//sync",
            "",
        ] {
            let err = Target::new("catalog", None, "apiregistrations", Some(name)).unwrap_err();
            assert_eq!(err.exit_code(), 1, "{name}");
        }
        let err = Target::new("catalog", None, "apiregistrations", Some("a.b/bogus")).unwrap_err();
        assert!(err.to_string().contains("sync, status, rollout, tokens"), "{err}");
        let rollout = Target::new("catalog", None, "apiregistrations", Some("a.b/rollout")).unwrap();
        assert_eq!(rollout.view(), View::Rollout);
    }

    #[test]
    fn catalog_scope_is_checked() {
        let err = Target::new("catalog", None, "subscriptions", None).unwrap_err();
        assert!(err.to_string().contains("pass -n"), "{err}");
        assert!(Target::new("catalog", None, "rolebindings", None).is_err());
        let err = Target::new("catalog", Some("core"), "namespaces", None).unwrap_err();
        assert!(err.to_string().contains("cluster-scoped"), "{err}");

        let t = target("catalog", Some("core"), "rolebindings", Some("dev-read"));
        assert_eq!(url(&build(Verb::Get, &t, None)), format!("{BASE}/namespaces/core/rolebindings/dev-read"));
        // A resource the CLI does not know goes where -n says.
        let t = target("catalog", None, "widgets", None);
        assert_eq!(url(&build(Verb::Get, &t, None)), format!("{BASE}/widgets"));
        let t = target("catalog", Some("x"), "widgets", None);
        assert_eq!(url(&build(Verb::Get, &t, None)), format!("{BASE}/namespaces/x/widgets"));
    }

    #[test]
    fn whoami() {
        let t = target("catalog", None, "whoami", None);
        assert_eq!(url(&build(Verb::Get, &t, None)), format!("{BASE}/whoami"));
    }

    #[test]
    fn gateway_paths() {
        let t = target("compute.example.com", Some("core"), "vms", None);
        assert_eq!(t.api, Api::Long("compute.example.com".into()));
        assert_eq!(t.view(), View::Generic);
        let r = build(Verb::Get, &t, None);
        assert_eq!(url(&r), "http://localhost:8080/apis/compute.example.com/v1/namespaces/core/vms");

        // A gateway API's own subresources pass through; create posts where told.
        let t = target("compute.example.com", Some("core"), "vms", Some("web-1/console/log"));
        let r = build(Verb::Create, &t, Some(json!({"lines": 10})));
        assert_eq!(r.method, Method::POST);
        assert_eq!(url(&r), "http://localhost:8080/apis/compute.example.com/v1/namespaces/core/vms/web-1/console/log");

        let err = Target::new("compute.example.com", None, "vms", None).unwrap_err();
        assert!(err.to_string().contains("pass -n"), "{err}");
    }

    #[test]
    fn short_names_are_resolved_before_sending() {
        let mut t = target("compute", Some("core"), "vms", Some("web-1"));
        assert_eq!(t.api, Api::Short("compute".into()));
        // Building still checks the verb and body before any network call.
        assert!(Request::build(Verb::Update, &t, None).is_err());
        t.api = Api::Long("compute.example.com".into());
        let r = build(Verb::Get, &t, None);
        assert_eq!(url(&r), "http://localhost:8080/apis/compute.example.com/v1/namespaces/core/vms/web-1");
    }

    #[test]
    fn bad_arguments() {
        assert!(Api::parse("").is_err());
        assert!(Api::parse("a/b").is_err());
        assert!(Target::new("catalog", None, "", None).is_err());
        assert!(Target::new("catalog", None, "a/b", None).is_err());
        assert!(Target::new("catalog", Some(""), "subscriptions", None).is_err());
        assert!(Target::new("catalog", Some("a/b"), "subscriptions", None).is_err());
    }

    #[test]
    fn urls_keep_a_base_path_and_encode_segments() {
        let t = target("catalog", None, "namespaces", Some("we?ird#name"));
        let r = build(Verb::Get, &t, None);
        let base = Url::parse("https://kayra.example.com/prefix/").unwrap();
        assert_eq!(
            r.url(&base).as_str(),
            "https://kayra.example.com/prefix/apis/catalog.example.com/v1/namespaces/we%3Fird%23name"
        );
    }

    #[test]
    fn describe() {
        let t = target("catalog", Some("sre"), "subscriptions", Some("dev.example.com"));
        assert_eq!(t.describe(), "subscriptions/dev.example.com in namespace sre");
    }
}
