//! `-f PATH`: reading files into documents, and checking every document
//! before anything is sent (platform §15).
//!
//! A PATH is a file, a directory (its `*.yaml`, `*.yml`, `*.json`, in name
//! order, not recursive) or `-` (stdin). A text starting with `{` or `[` is
//! JSON (an object, or a list of objects); anything else is YAML, any number
//! of `---`-separated documents, anchors, aliases and `<<` merge keys
//! resolved. Documents are numbered from 1 in their file (a JSON list's
//! elements too), empty YAML documents included, so "document 3" is the
//! third one a reader counts.
//!
//! Checking finds every problem of every document (up to [`MAX_PROBLEMS`])
//! and reports them all, naming file, document and field; one problem
//! anywhere means no request at all.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use kayra_core::rollout::RolloutPolicy;
use kayra_core::{json_kind, names, validation};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::kinds::Kind;

/// Problems listed before the rest are only counted.
pub const MAX_PROBLEMS: usize = 20;

/// Where a document came from: its file (or `stdin`) and 1-based index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    pub index: usize,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: document {}", self.file, self.index)
    }
}

/// One checked document: an object to create or bring up to date.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub kind: Kind,
    /// Only for namespaced kinds.
    pub namespace: Option<String>,
    /// `name`, or a subscription's `api`.
    pub name: String,
    /// The writable fields the document sets, besides the name (and the
    /// namespace), in the server's form: what is compared and written.
    pub fields: Map<String, Value>,
    pub origin: Origin,
}

impl Object {
    /// `Kind/name` or `Kind/namespace/name`, as every line shows it.
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.kind.as_str(), self.name),
            None => format!("{}/{}", self.kind.as_str(), self.name),
        }
    }

    /// The body of the create (POST): the name and the fields set.
    pub fn create_body(&self) -> Value {
        let mut body = Map::new();
        body.insert(self.kind.name_key().to_string(), Value::String(self.name.clone()));
        body.extend(self.fields.clone());
        Value::Object(body)
    }

    /// The fields the document sets whose value differs from `current`
    /// (the server's object): the merge patch to send, empty when the
    /// object is as the document says. An object field (a namespace's
    /// `labels`, a registration's `rollout`) is the document's whole
    /// object: the patch also removes (`null`) the keys it leaves out, at
    /// any depth. A field the document sets to `null` (`rollout: null`)
    /// equals one the server leaves out of its answer.
    pub fn changes(&self, current: &Value) -> Map<String, Value> {
        self.fields
            .iter()
            .filter_map(|(key, wanted)| Some((key.clone(), merge_patch(current.get(key.as_str()), wanted)?)))
            .collect()
    }
}

/// The JSON merge patch (RFC 7386) that turns `had` (absent: `None`) into
/// `wanted`, or `None` when they are already equal: objects key by key (a
/// key `had` holds and `wanted` does not is `null`), anything else whole;
/// `null` and absent are the same (a merge patch cannot tell them apart).
fn merge_patch(had: Option<&Value>, wanted: &Value) -> Option<Value> {
    let had = had.filter(|v| !v.is_null());
    match (had, wanted) {
        (None, Value::Null) => None,
        (Some(had), wanted) if had == wanted => None,
        (Some(Value::Object(had)), Value::Object(wanted)) => {
            let mut patch: Map<String, Value> = wanted
                .iter()
                .filter_map(|(key, value)| Some((key.clone(), merge_patch(had.get(key), value)?)))
                .collect();
            for gone in had.keys().filter(|k| !wanted.contains_key(*k)) {
                patch.insert(gone.clone(), Value::Null);
            }
            // Equal up to `null`s: nothing to send.
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        (_, wanted) => Some(wanted.clone()),
    }
}

/// One source's text and name.
#[derive(Debug)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// Reads every PATH into sources, in order; stdin at most once. A PATH
/// that cannot be read is a problem like a bad document.
pub fn read_sources(paths: &[String], mut stdin: impl Read) -> Result<Vec<Source>, String> {
    let mut sources = Vec::new();
    let mut stdin_read = false;
    for path in paths {
        if path == "-" {
            if std::mem::replace(&mut stdin_read, true) {
                return Err("-f -: stdin can be read only once".into());
            }
            let mut text = String::new();
            stdin.read_to_string(&mut text).map_err(|e| format!("-f -: read stdin: {e}"))?;
            sources.push(Source { name: "stdin".into(), text });
            continue;
        }
        let meta = std::fs::metadata(path).map_err(|e| format!("-f {path}: {e}"))?;
        if meta.is_dir() {
            for file in directory_files(Path::new(path))? {
                sources.push(read_file(&file)?);
            }
        } else {
            sources.push(read_file(Path::new(path))?);
        }
    }
    Ok(sources)
}

/// A directory's `*.yaml`, `*.yml` and `*.json` files, sorted by name.
fn directory_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let shown = dir.display();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("-f {shown}: {e}"))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("-f {shown}: {e}"))?.path();
        let wanted = path.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if wanted && path.is_file() {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

fn read_file(path: &Path) -> Result<Source, String> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{name}: not UTF-8 text"))?;
    Ok(Source { name, text })
}

/// The documents of one source, each with its origin, as JSON. A source
/// that does not parse is one problem, naming where it stopped.
pub fn documents(source: &Source) -> Result<Vec<(Origin, Value)>, String> {
    let origin = |index| Origin { file: source.name.clone(), index };
    if source.text.trim_start().starts_with(['{', '[']) {
        let value: Value =
            serde_json::from_str(&source.text).map_err(|e| format!("{}: invalid JSON: {e}", source.name))?;
        let values = match value {
            Value::Array(items) => items,
            other => vec![other],
        };
        return Ok(values.into_iter().enumerate().map(|(i, v)| (origin(i + 1), v)).collect());
    }
    let mut docs = Vec::new();
    for (i, document) in serde_norway::Deserializer::from_str(&source.text).enumerate() {
        let at = origin(i + 1);
        let mut value = serde_norway::Value::deserialize(document).map_err(|e| format!("{at}: invalid YAML: {e}"))?;
        value.apply_merge().map_err(|e| format!("{at}: invalid YAML merge key: {e}"))?;
        let json = serde_json::to_value(&value).map_err(|e| format!("{at}: not representable as JSON: {e}"))?;
        docs.push((at, json));
    }
    Ok(docs)
}

/// Checks every document of every source. `Ok` only when all are valid
/// objects and no object appears twice; otherwise every problem found, in
/// order.
pub fn check(sources: &[Source]) -> Result<Vec<Object>, Vec<String>> {
    let mut objects = Vec::new();
    let mut problems = Vec::new();
    let mut seen: HashMap<(Kind, Option<String>, String), Origin> = HashMap::new();
    for source in sources {
        let docs = match documents(source) {
            Ok(docs) => docs,
            Err(problem) => {
                problems.push(problem);
                continue;
            }
        };
        for (origin, value) in docs {
            // An empty YAML document (a trailing `---`) holds nothing to apply.
            if value.is_null() && !source.text.trim_start().starts_with(['{', '[']) {
                continue;
            }
            match object(&origin, value) {
                Ok(object) => {
                    let key = (object.kind, object.namespace.clone(), object.name.clone());
                    if let Some(first) = seen.get(&key) {
                        problems.push(format!("{origin}: {} is already in {first}", object.id()));
                    } else {
                        seen.insert(key, origin);
                        objects.push(object);
                    }
                }
                Err(problem) => problems.push(format!("{origin}: {problem}")),
            }
        }
    }
    if problems.is_empty() { Ok(objects) } else { Err(problems) }
}

/// One document as an object, or why not.
fn object(origin: &Origin, value: Value) -> Result<Object, String> {
    let Value::Object(mut fields) = value else {
        return Err(format!("expected an object with a `kind`, got {}", json_kind(&value)));
    };
    let kind = match fields.remove("kind") {
        Some(Value::String(text)) => Kind::parse(&text).ok_or_else(|| {
            let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
            format!("field `kind`: unknown kind {text:?}, expected one of {}", known.join(", "))
        })?,
        Some(other) => return Err(format!("field `kind`: expected a string, got {}", json_kind(&other))),
        None => return Err("missing field `kind`".into()),
    };
    // What `kayra export` writes beside the writable fields: computed, so ignored.
    fields.remove("status");
    let mut fields = kind.read(fields)?;
    let name = match fields.remove(kind.name_key()) {
        Some(Value::String(name)) => name,
        _ => return Err(format!("missing field `{}`", kind.name_key())),
    };
    let namespace = match fields.remove("namespace") {
        Some(Value::String(ns)) => Some(ns),
        _ => None,
    };
    if kind == Kind::ApiRegistration && fields.get("sync_id").and_then(Value::as_str) == Some("") {
        fields.remove("sync_id");
    }
    let object = Object { kind, namespace, name, fields, origin: origin.clone() };
    validate(&object)?;
    Ok(object)
}

/// The checks the server would make on names and the values it must not
/// receive, made here so a bad one stops the whole apply up front.
fn validate(object: &Object) -> Result<(), String> {
    let text = |key: &str| object.fields.get(key).and_then(Value::as_str).unwrap_or_default();
    if let Some(ns) = &object.namespace {
        names::validate_label("namespace", ns).map_err(|e| at("namespace", e))?;
    }
    match object.kind {
        Kind::ApiRegistration => {
            names::validate_subdomain("api registration", &object.name).map_err(|e| at("name", e))?;
            if !text("short_name").is_empty() {
                names::validate_label("short", text("short_name")).map_err(|e| at("short_name", e))?;
            }
            validation::validate_not_reserved(&object.name, text("short_name")).map_err(|e| at("name", e))?;
            if object.fields.contains_key("sync_id") {
                validation::validate_sync_id(text("sync_id")).map_err(|e| at("sync_id", e))?;
            }
            validation::validate_endpoint(text("endpoint")).map_err(|e| at("endpoint", e))?;
            if let Some(policy) = object.fields.get("rollout").filter(|p| !p.is_null()) {
                // The shape rules of §12 (a gate's step shape is the server's to check).
                let policy: RolloutPolicy = serde_json::from_value(policy.clone()).map_err(|e| at("rollout", e))?;
                policy.validate().map_err(|e| at(&e.field, e.message))?;
            }
        }
        Kind::Subscription => {
            names::validate_subdomain("api", &object.name).map_err(|e| at("api", e))?;
        }
        kind => {
            let what = match kind {
                Kind::Namespace => "namespace",
                Kind::User => "user",
                Kind::Role => "role",
                _ => "binding",
            };
            names::validate_label(what, &object.name).map_err(|e| at("name", e))?;
            if let Some(labels) = object.fields.get("labels") {
                let labels: std::collections::BTreeMap<String, String> =
                    serde_json::from_value(labels.clone()).map_err(|e| at("labels", e))?;
                kayra_core::labels::validate_labels(&labels).map_err(|e| at("labels", e))?;
            }
        }
    }
    Ok(())
}

/// A problem with one field.
fn at(field: &str, problem: impl std::fmt::Display) -> String {
    format!("field `{field}`: {problem}")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn source(name: &str, text: &str) -> Source {
        Source { name: name.into(), text: text.into() }
    }

    fn check_one(text: &str) -> Result<Vec<Object>, Vec<String>> {
        check(&[source("a.yaml", text)])
    }

    #[test]
    fn yaml_documents_with_anchors_and_merge_keys() {
        let yaml = "\
kind: Namespace
name: core
---
---
kind: Role
name: viewer
rules:
- resources: &res [namespaces, users]
  verbs: [get]
- resources: *res
  verbs: [list]
---
base: &base {kind: ApiRegistration, mode: api}
---
defaults: &user {kind: User, description: merged}
<<: *user
name: alice
";
        let err = check_one(yaml).unwrap_err();
        assert_eq!(err.len(), 2, "{err:?}");
        assert!(err[0].starts_with("a.yaml: document 4: missing field `kind`"), "{err:?}");
        assert!(err[1].starts_with("a.yaml: document 5: unknown field `defaults`"), "{err:?}");
        let fixed =
            yaml.replace("base: &base {kind: ApiRegistration, mode: api}", "{kind: Namespace, name: sre}").replace(
                "defaults: &user {kind: User, description: merged}\n<<: *user",
                "<<: {kind: User, description: merged}",
            );
        let objects = check_one(&fixed).unwrap();
        let ids: Vec<String> = objects.iter().map(Object::id).collect();
        assert_eq!(ids, ["Namespace/core", "Role/viewer", "Namespace/sre", "User/alice"]);
        assert_eq!(objects[1].fields["rules"][1]["resources"], json!(["namespaces", "users"]));
        assert_eq!(objects[3].fields["description"], "merged");
        assert_eq!(objects[3].origin, Origin { file: "a.yaml".into(), index: 5 });
    }

    #[test]
    fn json_object_or_list() {
        let one = check(&[source("x.json", r#"{"kind": "User", "name": "bob"}"#)]).unwrap();
        assert_eq!(one[0].id(), "User/bob");
        let list = r#"[{"kind": "Namespace", "name": "core"},
                       {"kind": "Subscription", "namespace": "core", "api": "compute.example.com"}]"#;
        let objects = check(&[source("x.json", list)]).unwrap();
        assert_eq!(objects[1].id(), "Subscription/core/compute.example.com");
        assert_eq!(objects[1].origin.index, 2);
        assert_eq!(objects[1].create_body(), json!({"api": "compute.example.com"}));
        let err = check(&[source("x.json", r#"[{"kind": "User", "name": "bob"}, 3]"#)]).unwrap_err();
        assert_eq!(err, ["x.json: document 2: expected an object with a `kind`, got a number"]);
    }

    #[test]
    fn every_problem_is_named_with_file_document_and_field() {
        let err = check(&[
            source("a.yaml", "kind: Namespace\nname: ok\n---\nkind: Nope\nname: x\n"),
            source("b.yaml", "kind: RoleBinding\nname: rb\nrole: r\nuser: u\n---\nkind: Namespace\nname: Bad_Name\n"),
            source(
                "c.yaml",
                "kind: ApiRegistration\nname: a.example.com\nendpoint: 'http://u:pw@x'\n---\nkind: Namespace\nname: ok\n---\nkind: User\nname: u\ntoken: x\n",
            ),
        ])
        .unwrap_err();
        assert_eq!(err.len(), 6, "{err:#?}");
        assert!(err[0].starts_with("a.yaml: document 2: field `kind`: unknown kind \"Nope\""), "{err:#?}");
        assert!(err[1].starts_with("b.yaml: document 1: missing field `namespace`"), "{err:#?}");
        assert!(err[2].starts_with("b.yaml: document 2: field `name`: namespace name \"Bad_Name\""), "{err:#?}");
        assert!(err[3].starts_with("c.yaml: document 1: field `endpoint`: "), "{err:#?}");
        assert!(!err[3].contains("pw"), "{err:#?}");
        assert_eq!(err[4], "c.yaml: document 2: Namespace/ok is already in a.yaml: document 1");
        assert!(err[5].starts_with("c.yaml: document 3: unknown field `token`"), "{err:#?}");
    }

    #[test]
    fn status_is_ignored_and_empty_sync_id_is_dropped() {
        let yaml =
            "kind: ApiRegistration\nname: a.example.com\nsync_id: ''\nstatus: {platform: dev, sync_id_updated_at: x}\n";
        let objects = check_one(yaml).unwrap();
        assert!(objects[0].fields.is_empty(), "{:?}", objects[0].fields);
        let err = check_one("kind: ApiRegistration\nname: a.example.com\nsync_id: '..'\n").unwrap_err();
        assert!(err[0].contains("field `sync_id`"), "{err:?}");
        let err = check_one("kind: ApiRegistration\nname: catalog.example.com\n").unwrap_err();
        assert!(err[0].contains("reserved"), "{err:?}");
    }

    #[test]
    fn changes_are_the_set_fields_that_differ() {
        let objects = check_one("kind: ApiRegistration\nname: a.example.com\nmode: api\nsync_id: s1\n").unwrap();
        let current = json!({"name": "a.example.com", "mode": "api", "sync_id": "s0", "description": "kept"});
        assert_eq!(Value::Object(objects[0].changes(&current)), json!({"sync_id": "s1"}));
        let same = json!({"name": "a.example.com", "mode": "api", "sync_id": "s1", "description": "kept"});
        assert!(objects[0].changes(&same).is_empty());
    }

    #[test]
    fn a_label_map_is_whole_and_left_out_labels_are_removed() {
        let objects = check_one("kind: Namespace\nname: core\nlabels:\n  tier: canary\n").unwrap();
        let current = json!({"name": "core", "labels": {"tier": "stable", "legacy": ""}});
        assert_eq!(Value::Object(objects[0].changes(&current)), json!({"labels": {"tier": "canary", "legacy": null}}));
        let same = json!({"name": "core", "labels": {"tier": "canary"}});
        assert!(objects[0].changes(&same).is_empty());
        let err = check_one("kind: Namespace\nname: core\nlabels:\n  a/b/c: x\n").unwrap_err();
        assert!(err[0].contains("field `labels`") && err[0].contains("\"a/b/c\""), "{err:?}");
    }

    #[test]
    fn a_rollout_is_the_document_s_whole_policy_and_null_removes_it() {
        let yaml = "kind: ApiRegistration\nname: a.example.com\nrollout:\n  waves:\n  - {name: canary, size: '1'}\n  - {name: rest}\n";
        let objects = check_one(yaml).unwrap();
        let stored = json!({"waves": [{"name": "canary", "size": "1", "approval": "auto"},
                                      {"name": "rest", "approval": "auto"}], "on_failure": "pause"});
        assert!(objects[0].changes(&json!({"name": "a.example.com", "rollout": stored})).is_empty());
        // One wave field differs; a key the server holds and the document
        // leaves out (a deadline) is removed.
        let mut had = stored.clone();
        had["waves"][0]["size"] = json!("2");
        had["progress_deadline"] = json!("1h");
        let patch = objects[0].changes(&json!({"name": "a.example.com", "rollout": had}));
        assert_eq!(Value::Object(patch), json!({"rollout": {"waves": stored["waves"], "progress_deadline": null}}));
        // None on the server: the whole policy.
        let patch = objects[0].changes(&json!({"name": "a.example.com"}));
        assert_eq!(Value::Object(patch), json!({"rollout": stored}));

        // `null` is no policy: equal to none, and removes one.
        let objects = check_one("kind: ApiRegistration\nname: a.example.com\nrollout: null\n").unwrap();
        assert!(objects[0].changes(&json!({"name": "a.example.com"})).is_empty());
        let patch = objects[0].changes(&json!({"name": "a.example.com", "rollout": stored}));
        assert_eq!(Value::Object(patch), json!({"rollout": null}));
        // Left out: the server's is kept.
        let objects = check_one("kind: ApiRegistration\nname: a.example.com\n").unwrap();
        assert!(objects[0].changes(&json!({"name": "a.example.com", "rollout": stored})).is_empty());
    }

    #[test]
    fn a_bad_rollout_is_refused_naming_its_field() {
        let cases = [
            ("rollout: {waves: []}", "field `rollout.waves`: needs 1 to 20 waves"),
            ("rollout: {waves: [{name: a, size: '0'}]}", "field `rollout.waves[0].size`: "),
            ("rollout: {waves: [{name: a}, {name: a}]}", "field `rollout.waves[1].name`: "),
            ("rollout: {waves: [{name: a, bake: soon}]}", "field `rollout.waves[0].bake`: "),
            ("rollout: {waves: [{name: a, gate: yes}]}", "field `rollout.waves[0].gate`: "),
            ("rollout: {waves: [{name: a}], progress_deadline: 99d}", "field `rollout.progress_deadline`: "),
            ("rollout: {waves: [{name: a}], on_failure: retry}", "field `rollout.on_failure`: unknown variant"),
            ("rollout: {wave: [{name: a}]}", "unknown field `wave`"),
        ];
        for (rollout, want) in cases {
            let err = check_one(&format!("kind: ApiRegistration\nname: a.example.com\n{rollout}\n")).unwrap_err();
            assert!(err[0].starts_with("a.yaml: document 1: ") && err[0].contains(want), "{rollout}: {err:?}");
        }
    }

    #[test]
    fn broken_sources_are_named() {
        let err = check(&[source("a.yaml", "kind: [\n"), source("b.json", "{\"kind\": ")]).unwrap_err();
        assert!(err[0].starts_with("a.yaml: document 1: invalid YAML"), "{err:?}");
        assert!(err[1].starts_with("b.json: invalid JSON"), "{err:?}");
        let err = check_one("? [a, b]\n: 1\n").unwrap_err();
        assert!(err[0].starts_with("a.yaml: document 1: not representable as JSON"), "{err:?}");
    }

    #[test]
    fn directories_in_name_order_and_stdin_once() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.yml", "a.json", "c.yaml", "notes.txt", "d.YAML"] {
            std::fs::write(dir.path().join(name), "{}").unwrap();
        }
        std::fs::create_dir(dir.path().join("e.yaml")).unwrap();
        let sources = read_sources(&[dir.path().display().to_string()], &b""[..]).unwrap();
        let names: Vec<String> =
            sources.iter().map(|s| Path::new(&s.name).file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["a.json", "b.yml", "c.yaml"]);
        let sources = read_sources(&["-".into()], &b"kind: User\n"[..]).unwrap();
        assert_eq!((sources[0].name.as_str(), sources[0].text.as_str()), ("stdin", "kind: User\n"));
        assert!(read_sources(&["-".into(), "-".into()], &b""[..]).is_err());
        let err = read_sources(&["/nonexistent/x.yaml".into()], &b""[..]).unwrap_err();
        assert!(err.starts_with("-f /nonexistent/x.yaml: "), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 256,
            rng_seed: proptest::test_runner::RngSeed::Fixed(15),
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        /// Any text, YAML-ish or JSON-ish: an answer, never a panic.
        #[test]
        fn any_text_is_checked_without_panicking(
            text in "(kind: |name: |---\\n|- |\\{|\\[|&a |\\*a|<<: |[a-zA-Z0-9\"':,\\]\\} \\n\u{1b}])*"
        ) {
            let _ = check(&[source("p.yaml", &text)]);
        }
    }
}
