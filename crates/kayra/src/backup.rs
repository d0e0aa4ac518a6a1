//! `kayra export` and `kayra import` (platform §15): backups, and moving
//! from the local store to etcd, from the configured store without
//! `kayra serve`.
//!
//! The file is YAML documents in `kayra-cli apply`'s format, `{"kind": K,
//! …writable fields…, "status": {…computed fields…}}`, namespaces first and
//! subscriptions last, then a closing comment line naming the number of
//! documents: a file cut anywhere is refused even when what is left still
//! parses. A user's tokens are in its `status.tokens`, as ids and hashes
//! only (never a secret). `kayra-cli apply` reads the same file: it skips
//! comments and ignores `status` (computed, not its to write), and every
//! other field is one of its writable fields.
//!
//! Not in the file: a registration's rollout record (the state of its
//! rollout, §12), the reconcilers' runtime state; see `docs/decisions.md`.
//!
//! The import checks every document before anything is written (an error
//! names the document's index and the field), refuses a store holding any
//! of the records (exit 1 naming one, writing nothing), and writes through
//! [`kayra_catalog::repo::Repository::import`].

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use kayra_catalog::repo::Repository;
use kayra_catalog::repo::auth::{is_token_id, token_id};
use kayra_catalog::repo::backup::Record;
use kayra_core::rollout::{RolloutPolicy, RolloutState};
use kayra_core::{
    ApiRegistration, ClusterRoleBinding, Namespace, Role, RoleBinding, Subscription, TokenRecord, User, names,
    validation,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::Common;

/// `kayra export` flags.
#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    common: Common,
    /// Write to this file instead of stdout.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
}

/// `kayra import` flags.
#[derive(Args, Debug)]
pub struct ImportArgs {
    #[command(flatten)]
    common: Common,
    /// The file `kayra export` wrote; `-` reads stdin.
    path: PathBuf,
}

/// The last line of every export; `{}` is the number of documents.
const END: &str = "# end of kayra export:";

/// The fields of each kind that only kayra computes: in `status`.
fn computed(kind: &str) -> &'static [&'static str] {
    match kind {
        "Namespace" => &["active"],
        "User" => &["tokens"],
        "ApiRegistration" => &["sync_id_updated_at", "platform", "region"],
        "Subscription" => &["active", "state", "current_sync_id", "runs", "resync_requested"],
        _ => &[],
    }
}

/// Computed fields a record may leave out (stored only when set).
const OPTIONAL_STATUS: &[&str] = &["runs", "resync_requested"];

pub async fn export(args: ExportArgs) -> anyhow::Result<()> {
    let config = args.common.load()?;
    let store = kayra_store::Store::open(&config.database).await.context("open store")?;
    let repo = Repository::new(store, &config.platform, &config.region);
    let backup = repo.export().await.context("read the store")?;
    warn_of_rollouts(&repo, &backup.records).await?;
    let documents = render(&backup.records)?;
    let mut text = format!(
        "# kayra export of platform {:?}, region {:?}, at store revision {}\n",
        config.platform, config.region, backup.revision
    );
    for document in &documents {
        text.push_str("---\n");
        text.push_str(&serde_norway::to_string(document).context("render YAML")?);
    }
    text.push_str(&format!("{END} {} documents\n", documents.len()));
    match &args.output {
        None => std::io::stdout().lock().write_all(text.as_bytes()).context("write stdout")?,
        Some(path) => {
            // Whole or not at all: written beside it, then renamed over it.
            let partial = path.with_extension("partial");
            std::fs::write(&partial, &text).with_context(|| format!("write {}", partial.display()))?;
            std::fs::rename(&partial, path).with_context(|| format!("write {}", path.display()))?;
            eprintln!("kayra: exported {} documents to {}", documents.len(), path.display());
        }
    }
    Ok(())
}

/// Tells (stderr) of each registration whose rollout of its current SyncID
/// has not completed: the rollout record is not exported, so after an
/// import the first reconciler starts that rollout again from its first
/// wave, over the subscribers not at the SyncID (an aborted rollout's held
/// ones included). Finish, resume or supersede it first to avoid that.
async fn warn_of_rollouts(repo: &Repository, records: &[Record]) -> anyhow::Result<()> {
    for record in records {
        let Record::Registration(registration) = record else { continue };
        if registration.rollout.is_none() {
            continue;
        }
        let Some(rollout) = repo.rollout(&registration.name).await.context("read the rollouts")? else { continue };
        let rollout = &rollout.value.rollout;
        if rollout.sync_id != registration.sync_id
            || matches!(rollout.state, RolloutState::Completed | RolloutState::Superseded)
        {
            continue;
        }
        eprintln!(
            "kayra: warning: the rollout of api registration {:?} to SyncID {:?} is {} (wave {} of {}); \
             rollouts are not exported: after an import it starts again from its first wave",
            registration.name,
            rollout.sync_id,
            rollout.state.as_str(),
            rollout.wave + 1,
            rollout.waves.len()
        );
    }
    Ok(())
}

pub async fn import(args: ImportArgs) -> anyhow::Result<()> {
    let config = args.common.load()?;
    let mut bytes = Vec::new();
    if args.path.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut bytes).context("read stdin")?;
    } else {
        bytes = std::fs::read(&args.path).with_context(|| format!("read {}", args.path.display()))?;
    }
    let records = parse(&bytes, &config.platform, &config.region)?;
    let store = kayra_store::Store::open(&config.database).await.context("open store")?;
    let repo = Repository::new(store, &config.platform, &config.region);
    let imported = repo.import(&records).await.map_err(|e| anyhow!("nothing imported: {e}"))?;
    eprintln!("kayra: imported {} records in {} transactions", imported.records, imported.transactions);
    Ok(())
}

/// The documents of `records`, in `apply`'s order.
fn render(records: &[Record]) -> anyhow::Result<Vec<serde_norway::Value>> {
    let bootstrap = records.iter().find_map(|r| match r {
        Record::BootstrapToken(hash) => Some(hash.as_str()),
        _ => None,
    });
    let mut tokens: BTreeMap<&str, Vec<&TokenRecord>> = BTreeMap::new();
    for record in records {
        if let Record::Token(t) = record {
            tokens.entry(t.user.as_str()).or_default().push(t);
        }
    }
    let mut out: Vec<(u8, serde_norway::Value)> = Vec::new();
    for record in records {
        let (rank, kind, value) = match record {
            Record::Namespace(v) => (0, "Namespace", serde_json::to_value(v)?),
            Record::User(v) => {
                let mut value = serde_json::to_value(v)?;
                let mine = tokens.get(v.name.as_str()).map(Vec::as_slice).unwrap_or_default();
                let list: Vec<Value> = mine
                    .iter()
                    .map(|t| {
                        let mut token = serde_json::json!({"id": t.id, "hash": t.hash, "created_at": t.created_at});
                        if bootstrap == Some(t.hash.as_str()) {
                            token["bootstrap"] = Value::Bool(true);
                        }
                        token
                    })
                    .collect();
                value["tokens"] = Value::Array(list);
                (1, "User", value)
            }
            Record::Role(v) => (2, "Role", serde_json::to_value(v)?),
            Record::Registration(v) => (3, "ApiRegistration", serde_json::to_value(v)?),
            Record::ClusterRoleBinding(v) => (4, "ClusterRoleBinding", serde_json::to_value(v)?),
            Record::RoleBinding(v) => (5, "RoleBinding", serde_json::to_value(v)?),
            Record::Subscription(v) => (6, "Subscription", serde_json::to_value(v)?),
            Record::Token(_) | Record::BootstrapToken(_) => continue,
        };
        out.push((rank, document(kind, value)?));
    }
    out.sort_by_key(|(rank, _)| *rank);
    Ok(out.into_iter().map(|(_, d)| d).collect())
}

/// `{kind, …writable…, status: {…computed…}}`, in that order.
fn document(kind: &str, value: Value) -> anyhow::Result<serde_norway::Value> {
    let Value::Object(fields) = value else { bail!("a {kind} record is not an object") };
    let mut doc = serde_norway::Mapping::new();
    doc.insert("kind".into(), kind.into());
    let mut status = serde_norway::Mapping::new();
    // What names the object first, then the rest (alphabetically).
    let mut fields: Vec<(String, Value)> = fields.into_iter().collect();
    fields.sort_by_key(|(field, _)| ["name", "namespace", "api"].iter().position(|f| f == field).unwrap_or(3));
    for (field, value) in fields {
        let value = serde_norway::to_value(value)?;
        if computed(kind).contains(&field.as_str()) {
            status.insert(field.into(), value);
        } else {
            doc.insert(field.into(), value);
        }
    }
    if !computed(kind).is_empty() {
        doc.insert("status".into(), serde_norway::Value::Mapping(status));
    }
    Ok(serde_norway::Value::Mapping(doc))
}

/// Every document of an export, checked, as records; the first problem
/// names its document (1-based, as `---` separated) and field.
pub fn parse(bytes: &[u8], platform: &str, region: &str) -> anyhow::Result<Vec<Record>> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| anyhow!("the file is not UTF-8 text (byte {}): not a kayra export", e.valid_up_to()))?;
    let mut documents = Vec::new();
    for (i, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let value = Value::deserialize(document).map_err(|e| anyhow!("document {index}: not valid YAML: {e}"))?;
        match value {
            Value::Null => bail!("document {index}: empty document"),
            value => documents.push(value),
        }
    }
    let mut records = Vec::new();
    let mut seen = Seen::default();
    for (i, value) in documents.into_iter().enumerate() {
        let index = i + 1;
        let checked = check(value, platform, region).map_err(|e| anyhow!("document {index}: {e}"))?;
        seen.add(index, &checked)?;
        records.extend(checked);
    }
    seen.references()?;
    let count = seen.documents;
    let last = text.trim_end_matches('\n').rsplit('\n').next().unwrap_or_default();
    if last != format!("{END} {count} documents") {
        bail!(
            "the file does not end with the line \"{END} {count} documents\" after document {count}: \
             it is truncated or not a kayra export (nothing imported)"
        );
    }
    Ok(records)
}

/// One document's problem: the field and what is wrong with it.
fn field_error(field: &str, message: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("field {field:?}: {message}")
}

/// The records of one document (a user's tokens are records of their own).
fn check(value: Value, platform: &str, region: &str) -> anyhow::Result<Vec<Record>> {
    let Value::Object(mut doc) = value else { bail!("not a mapping of fields") };
    let kind = match doc.remove("kind") {
        Some(Value::String(kind)) => kind,
        Some(_) => return Err(field_error("kind", "must be a string")),
        None => return Err(field_error("kind", "missing")),
    };
    let computed = match kind.as_str() {
        "Namespace" | "User" | "Role" | "ApiRegistration" | "ClusterRoleBinding" | "RoleBinding" | "Subscription" => {
            computed(&kind)
        }
        other => return Err(field_error("kind", format!("unknown kind {other:?}"))),
    };
    let status = match doc.remove("status") {
        Some(Value::Object(status)) => status,
        Some(_) => return Err(field_error("status", "must be a mapping")),
        None if computed.is_empty() => Map::new(),
        None => return Err(field_error("status", "missing")),
    };
    if let Some(field) = doc.keys().find(|f| computed.contains(&f.as_str())) {
        return Err(field_error(field, "is computed: it belongs in status"));
    }
    if let Some(field) = status.keys().find(|f| !computed.contains(&f.as_str())) {
        return Err(field_error(&format!("status.{field}"), "unknown field"));
    }
    if let Some(field) = computed.iter().find(|f| !OPTIONAL_STATUS.contains(f) && !status.contains_key(**f)) {
        return Err(field_error(&format!("status.{field}"), "missing"));
    }
    let mut fields = doc;
    let mut tokens = None;
    for (field, value) in status {
        if field == "tokens" {
            tokens = Some(value);
        } else {
            fields.insert(field, value);
        }
    }
    let name = |field: &str| fields.get(field).and_then(Value::as_str).unwrap_or_default().to_string();
    let label =
        |field: &str, kind: &'static str| names::validate_label(kind, &name(field)).map_err(|e| field_error(field, e));
    Ok(match kind.as_str() {
        "Namespace" => {
            let v: Namespace = typed(fields)?;
            names::validate_label("namespace", &v.name).map_err(|e| field_error("name", e))?;
            kayra_core::labels::validate_labels(&v.labels).map_err(|e| field_error("labels", e))?;
            vec![Record::Namespace(v)]
        }
        "User" => {
            let v: User = typed(fields)?;
            names::validate_label("user", &v.name).map_err(|e| field_error("name", e))?;
            let mut records = vec![Record::User(v.clone())];
            records.extend(user_tokens(&v.name, tokens.unwrap_or(Value::Array(Vec::new())))?);
            records
        }
        "Role" => {
            let v: Role = typed(fields)?;
            names::validate_label("role", &v.name).map_err(|e| field_error("name", e))?;
            for (i, rule) in v.rules.iter().enumerate() {
                for (field, list) in [("apis", &rule.apis), ("resources", &rule.resources), ("verbs", &rule.verbs)] {
                    if list.is_empty() || list.iter().any(String::is_empty) {
                        return Err(field_error(
                            &format!("rules[{i}].{field}"),
                            "must be a non-empty list of non-empty entries",
                        ));
                    }
                }
            }
            vec![Record::Role(v)]
        }
        "ApiRegistration" => {
            let v: ApiRegistration = typed(fields)?;
            names::validate_subdomain("api registration", &v.name).map_err(|e| field_error("name", e))?;
            if !v.short_name.is_empty() {
                names::validate_label("short name", &v.short_name).map_err(|e| field_error("short_name", e))?;
            }
            validation::validate_not_reserved(&v.name, &v.short_name).map_err(|e| field_error("name", e))?;
            validation::validate_sync_id(&v.sync_id).map_err(|e| field_error("sync_id", e))?;
            validation::validate_endpoint(&v.endpoint).map_err(|e| field_error("endpoint", e))?;
            if let Some(policy) = &v.rollout {
                check_rollout(policy)?;
            }
            // Empty on a record written before registrations were stamped.
            let stamped = |value: &str, ours: &str| value.is_empty() || value == ours;
            if !stamped(&v.platform, platform) || !stamped(&v.region, region) {
                return Err(field_error(
                    "status.platform",
                    format!(
                        "the registration belongs to platform {:?}, region {:?}; this deployment is platform {platform:?}, region {region:?}",
                        v.platform, v.region
                    ),
                ));
            }
            vec![Record::Registration(v)]
        }
        "ClusterRoleBinding" => {
            label("name", "binding")?;
            label("role", "role")?;
            label("user", "user")?;
            vec![Record::ClusterRoleBinding(typed::<ClusterRoleBinding>(fields)?)]
        }
        "RoleBinding" => {
            label("name", "binding")?;
            label("namespace", "namespace")?;
            label("role", "role")?;
            label("user", "user")?;
            vec![Record::RoleBinding(typed::<RoleBinding>(fields)?)]
        }
        "Subscription" => {
            label("namespace", "namespace")?;
            names::validate_subdomain("api", &name("api")).map_err(|e| field_error("api", e))?;
            let v: Subscription = typed(fields)?;
            if v.current_sync_id.len() > validation::MAX_SYNC_ID {
                return Err(field_error("status.current_sync_id", "longer than a sync_id may be"));
            }
            vec![Record::Subscription(v)]
        }
        _ => unreachable!("kinds are matched above"),
    })
}

/// A registration's rollout policy, by the API's rules (§12): its shape,
/// and each gate as a step.
fn check_rollout(policy: &RolloutPolicy) -> anyhow::Result<()> {
    policy.validate().map_err(|e| field_error(&e.field, e.message))?;
    for (i, wave) in policy.waves.iter().enumerate() {
        if let Some(gate) = &wave.gate {
            kayra_pipeline::Gate::compile(gate).map_err(|(field, message)| {
                let field = if field.is_empty() { String::new() } else { format!(".{field}") };
                field_error(&format!("rollout.waves[{i}].gate{field}"), message)
            })?;
        }
    }
    Ok(())
}

/// `fields` as `T`, refusing a field `T` does not have; a problem names the field.
fn typed<T: DeserializeOwned>(fields: Map<String, Value>) -> anyhow::Result<T> {
    let known = fields_of::<T>()?;
    if let Some(field) = fields.keys().find(|f| !known.contains(&f.as_str())) {
        return Err(field_error(field, "unknown field"));
    }
    serde_path_to_error::deserialize(Value::Object(fields)).map_err(|e| {
        let path = e.path().to_string();
        field_error(if path == "." { "(document)" } else { &path }, e.into_inner())
    })
}

/// The fields of a record type: the names its derived `Deserialize` hands
/// to `deserialize_struct`, which [`Fields`] records before it stops. Every
/// field the type reads, whether or not its `Serialize` skips it when
/// empty (a registration's `rollout`, a subscription's `runs`), so a
/// record's own export is never refused for a field it left out elsewhere.
fn fields_of<T: DeserializeOwned>() -> anyhow::Result<&'static [&'static str]> {
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Fields(&mut fields));
    if fields.is_empty() {
        bail!("{} is not a struct with named fields", std::any::type_name::<T>());
    }
    Ok(fields)
}

/// A deserializer that answers every request with an error, having kept
/// the field names of a `deserialize_struct`.
struct Fields<'a>(&'a mut &'static [&'static str]);

impl<'de> serde::Deserializer<'de> for Fields<'_> {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(serde::de::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// One entry of a user's `status.tokens`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    id: String,
    hash: String,
    created_at: String,
    #[serde(default)]
    bootstrap: bool,
}

fn user_tokens(user: &str, tokens: Value) -> anyhow::Result<Vec<Record>> {
    let entries: Vec<TokenEntry> = serde_path_to_error::deserialize(tokens).map_err(|e| {
        field_error(&format!("status.tokens{}", e.path()).replace("tokens.[", "tokens["), e.into_inner())
    })?;
    let mut records = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let field = |f: &str| format!("status.tokens[{i}].{f}");
        if entry.hash.len() != 64 || !entry.hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(field_error(&field("hash"), "must be 64 lowercase hex digits (a SHA-256)"));
        }
        if !is_token_id(&entry.id) || entry.id != token_id(&entry.hash) {
            return Err(field_error(&field("id"), "must be the first 16 hex digits of the hash"));
        }
        if entry.bootstrap {
            records.push(Record::BootstrapToken(entry.hash.clone()));
        }
        records.push(Record::Token(TokenRecord {
            id: entry.id,
            user: user.to_string(),
            hash: entry.hash,
            created_at: entry.created_at,
        }));
    }
    Ok(records)
}

/// What the documents so far define, for duplicates and references.
#[derive(Default)]
struct Seen {
    documents: usize,
    /// `(kind, name)` → the document that defined it.
    defined: BTreeMap<(String, String), usize>,
    /// Subscriptions' and role bindings' references: (document, field, kind, name).
    references: Vec<(usize, &'static str, &'static str, String)>,
    bootstrap: BTreeSet<usize>,
}

impl Seen {
    fn add(&mut self, index: usize, records: &[Record]) -> anyhow::Result<()> {
        self.documents += 1;
        for record in records {
            let key = match record {
                Record::Namespace(v) => ("namespace", v.name.clone()),
                Record::User(v) => ("user", v.name.clone()),
                Record::Token(v) => ("token", v.hash.clone()),
                Record::Role(v) => ("role", v.name.clone()),
                Record::Registration(v) => ("api registration", v.name.clone()),
                Record::ClusterRoleBinding(v) => ("cluster role binding", v.name.clone()),
                Record::RoleBinding(v) => {
                    self.references.push((index, "namespace", "namespace", v.namespace.clone()));
                    ("role binding", format!("{}/{}", v.namespace, v.name))
                }
                Record::Subscription(v) => {
                    self.references.push((index, "namespace", "namespace", v.namespace.clone()));
                    self.references.push((index, "api", "api registration", v.api.clone()));
                    ("subscription", format!("{}/{}", v.namespace, v.api))
                }
                Record::BootstrapToken(_) => {
                    if !self.bootstrap.is_empty() {
                        bail!("document {index}: field \"status.tokens\": a second token marked bootstrap");
                    }
                    self.bootstrap.insert(index);
                    continue;
                }
            };
            if let Some(first) = self.defined.insert((key.0.to_string(), key.1.clone()), index) {
                bail!("document {index}: {} {:?} is already defined by document {first}", key.0, key.1);
            }
        }
        Ok(())
    }

    /// Every namespace and registration referred to is in the file.
    fn references(&self) -> anyhow::Result<()> {
        for (index, field, kind, name) in &self.references {
            if !self.defined.contains_key(&(kind.to_string(), name.clone())) {
                bail!("document {index}: field {field:?}: {kind} {name:?} is not in the file");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record::Namespace(Namespace {
                name: "core".into(),
                description: "d".into(),
                labels: [("tier".to_string(), "canary".to_string()), ("example.com/env".to_string(), String::new())]
                    .into(),
                active: true,
            }),
            Record::User(User { name: "admin".into(), description: String::new() }),
            Record::Token(TokenRecord {
                id: token_id(&"a".repeat(64)).into(),
                user: "admin".into(),
                hash: "a".repeat(64),
                created_at: "2026-01-01T00:00:00Z".into(),
            }),
            Record::BootstrapToken("a".repeat(64)),
            Record::Registration(ApiRegistration {
                name: "compute.example.com".into(),
                short_name: "compute".into(),
                sync_id: "s1".into(),
                sync_id_updated_at: "2026-01-01T00:00:00.123Z".into(),
                platform: "dev".into(),
                region: "local".into(),
                rollout: Some(RolloutPolicy {
                    waves: vec![
                        kayra_core::rollout::WavePolicy {
                            name: "canary".into(),
                            size: "10%".into(),
                            gate: Some(serde_json::json!({"method": "get", "endpoint": "https://m.example.com/ok"})),
                            ..Default::default()
                        },
                        kayra_core::rollout::WavePolicy { name: "rest".into(), ..Default::default() },
                    ],
                    progress_deadline: "1h".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            Record::Subscription(Subscription {
                active: true,
                state: kayra_core::SubscriptionState::Success,
                current_sync_id: "s1".into(),
                ..Subscription::new("core", "compute.example.com")
            }),
        ]
    }

    fn file(records: &[Record]) -> String {
        let documents = render(records).unwrap();
        let mut text = String::new();
        for d in &documents {
            text.push_str("---\n");
            text.push_str(&serde_norway::to_string(d).unwrap());
        }
        text + &format!("{END} {} documents\n", documents.len())
    }

    #[test]
    fn a_rendered_file_parses_back_to_its_records() {
        let records = sample();
        let text = file(&records);
        assert!(text.contains("\nrollout:\n  on_failure: pause\n  progress_deadline: 1h\n  waves:\n"), "{text}");
        assert!(
            text.contains(
                "kind: Namespace\nname: core\ndescription: d\nlabels:\n  example.com/env: ''\n  tier: canary\nstatus:\n  active: true\n"
            ),
            "{text}"
        );
        let mut parsed = parse(text.as_bytes(), "dev", "local").unwrap();
        let mut want = records;
        parsed.sort_by_key(|r| (r.rank(), r.describe()));
        want.sort_by_key(|r| (r.rank(), r.describe()));
        assert_eq!(parsed, want);
    }

    /// Earlier builds exported a subscription's run counter in `status`;
    /// their files still import, the counter read and ignored.
    #[test]
    fn an_earlier_builds_run_counter_is_read_and_ignored() {
        let text = file(&sample());
        assert!(!text.contains("runs:"), "{text}");
        let earlier = text.replace(
            "  current_sync_id: s1
",
            "  current_sync_id: s1
  runs: 3
",
        );
        assert_ne!(earlier, text);
        let parsed = parse(earlier.as_bytes(), "dev", "local").unwrap();
        assert_eq!(parsed.len(), sample().len());
        let Some(Record::Subscription(sub)) = parsed.iter().find(|r| matches!(r, Record::Subscription(_))) else {
            panic!("the subscription imports: {parsed:?}")
        };
        let stored = serde_json::to_string(sub).unwrap();
        assert!(!stored.contains("runs"), "the counter is never stored again: {stored}");
    }

    #[test]
    fn broken_documents_are_refused_naming_the_document_and_field() {
        let text = file(&sample());
        let cases = [
            (text.replace("state: success", "state: sucess"), "document 4: field \"state\""),
            (text.replace("description: d", "descripton: d"), "document 1: field \"descripton\""),
            (text.replace("  tier: canary", "  tier: -canary"), "document 1: field \"labels\""),
            (text.replace("sync_id: s1\n", "sync_id: s/1\n"), "document 3: field \"sync_id\""),
            (text.replace("  region: local", "  region: eu"), "document 3: field \"status.platform\""),
            (text.replace("size: 10%", "size: 0%"), "document 3: field \"rollout.waves[0].size\""),
            (text.replace("size: 10%", "sise: 10%"), "document 3: field \"rollout.waves[0]"),
            (text.replace("method: get", "method: fetch"), "document 3: field \"rollout.waves[0].gate"),
            (text.replace("kind: Subscription", "kind: Subscriptoin"), "document 4: field \"kind\""),
            (text.replace("api: compute.example.com", "api: other.example.com"), "document 4: field \"api\""),
            (text.replace("  current_sync_id: s1\n", ""), "document 4: field \"status.current_sync_id\""),
            (text.replace("    id: ", "    id: 0"), "document 2: field \"status.tokens[0].id\""),
            (text[..text.len() - 5].to_string(), "truncated"),
            (text[..text.find("kind: Subscription").unwrap()].to_string(), "document 4: empty document"),
        ];
        for (broken, want) in cases {
            let e = parse(broken.as_bytes(), "dev", "local").unwrap_err().to_string();
            assert!(e.contains(want), "want {want:?} in {e:?}");
        }
        assert!(parse(&[0xff, 0xfe], "dev", "local").is_err());
        // A registration written before registrations were stamped is this deployment's.
        let unstamped = text.replace("  platform: dev", "  platform: ''").replace("  region: local", "  region: ''");
        assert!(parse(unstamped.as_bytes(), "dev", "local").is_ok());
    }
}
