//! `kayra-cli apply -f PATH [--dry-run]` (platform §15): make the catalog
//! hold what the files say.
//!
//! 1. Read every PATH and check every document ([`manifest`]); any problem
//!    stops everything before the first request.
//! 2. Kind by kind in [`Kind::ALL`] order, file order within a kind, one
//!    object at a time: GET it; absent (404) → POST (`created`); present
//!    and a field the document sets differs → PATCH with those fields, a
//!    JSON merge patch, so fields the document leaves out keep their values
//!    (`configured`); else nothing is written (`unchanged`). `--dry-run`
//!    makes the GETs only.
//! 3. A failed object (a 403, a 409, ...) is reported with the server's
//!    message and the rest go on; the exit status is then 1.
//!
//! # Layout
//! - [`kinds`]: the kinds, their order, and the typed document of each.
//! - [`manifest`]: files → documents → checked [`Object`]s.

pub mod kinds;
pub mod manifest;

use reqwest::Method;
use serde_json::{Map, Value, json};

use crate::args::{ApplyArgs, GlobalArgs};
use crate::client::{Body, Client};
use crate::error::{Error, invalid};
use crate::escape::escape_controls;
use crate::output::{Format, emit, render};
use crate::request::{CATALOG, Request, VERSION, View};
pub use kinds::Kind;
pub use manifest::Object;

/// What became of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
    /// The server refused or failed; its message.
    Failed(String),
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
            Outcome::Failed(_) => "failed",
        }
    }
}

/// Runs `apply`: check everything, then apply in kind order.
pub async fn run(global: &GlobalArgs, args: &ApplyArgs) -> Result<(), Error> {
    // Flags first: a bad --reason or --server is refused before reading stdin.
    let client = crate::client(global)?;
    let format = global.output.unwrap_or(Format::Table);
    let sources =
        manifest::read_sources(&args.files, std::io::stdin().lock()).map_err(|e| invalid(escape_controls(&e)))?;
    let mut objects = manifest::check(&sources).map_err(refused)?;
    // Stable: file order stays within a kind.
    objects.sort_by_key(|object| object.kind);

    let mut results = Vec::with_capacity(objects.len());
    let mut failed = 0usize;
    for object in &objects {
        let outcome = match try_apply(&client, object, args.dry_run).await {
            Ok(outcome) => outcome,
            // No answer at all: the next object would fare no better.
            Err(error @ Error::Transport(_)) => {
                eprintln!("{} failed", escape_controls(&object.id()));
                return Err(error);
            }
            Err(error) => Outcome::Failed(error.to_string()),
        };
        if matches!(outcome, Outcome::Failed(_)) {
            failed += 1;
        }
        if format == Format::Table {
            print_line(object, &outcome, args.dry_run)?;
        }
        results.push((object, outcome));
    }
    if format != Format::Table {
        let list: Vec<Value> = results.iter().map(|(object, outcome)| entry(object, outcome, args.dry_run)).collect();
        emit(render(&Value::Array(list), View::Generic, format)?.as_bytes())?;
    }
    if failed > 0 {
        return Err(invalid(format!("{failed} of {} objects failed; the others were applied", objects.len())));
    }
    Ok(())
}

/// Every problem of the documents as one error: one `error:` line each.
fn refused(problems: Vec<String>) -> Error {
    let total = problems.len();
    let mut lines: Vec<String> =
        problems.iter().take(manifest::MAX_PROBLEMS).map(|problem| escape_controls(problem)).collect();
    if total > manifest::MAX_PROBLEMS {
        lines.push(format!("... and {} more problems", total - manifest::MAX_PROBLEMS));
    }
    lines.push(format!("nothing was applied ({total} invalid documents)"));
    invalid(lines.join("\nerror: "))
}

/// One object: GET, then create, patch or nothing.
async fn try_apply(client: &Client, object: &Object, dry_run: bool) -> Result<Outcome, Error> {
    let current = match client.send(&request(Method::GET, path(object, true), None)).await {
        Ok(Body::Json(current)) => Some(current),
        Ok(_) => return Err(Error::Transport(format!("GET {} did not answer a JSON object", object.id()))),
        Err(Error::Api { status: 404, .. }) => None,
        Err(error) => return Err(error),
    };
    let Some(current) = current else {
        if !dry_run {
            client.send(&request(Method::POST, path(object, false), Some(object.create_body()))).await?;
        }
        return Ok(Outcome::Created);
    };
    let changes = object.changes(&current);
    if changes.is_empty() {
        return Ok(Outcome::Unchanged);
    }
    if !dry_run {
        client.send(&request(Method::PATCH, path(object, true), Some(Value::Object(changes)))).await?;
    }
    Ok(Outcome::Configured)
}

fn request(method: Method, path: Vec<String>, body: Option<Value>) -> Request {
    Request { method, path, body }
}

/// The object's catalog path, or its collection's.
fn path(object: &Object, with_name: bool) -> Vec<String> {
    let mut path = vec!["apis".to_string(), CATALOG.to_string(), VERSION.to_string()];
    if let Some(ns) = &object.namespace {
        path.extend(["namespaces".to_string(), ns.clone()]);
    }
    path.push(object.kind.resource().to_string());
    if with_name {
        path.push(object.name.clone());
    }
    path
}

/// `Kind/[namespace/]name word[ (dry run)]` on stdout; a failure on
/// stderr with the server's message.
fn print_line(object: &Object, outcome: &Outcome, dry_run: bool) -> Result<(), Error> {
    let id = escape_controls(&object.id());
    match outcome {
        Outcome::Failed(message) => {
            eprintln!("{id} failed: {}", escape_controls(message));
            Ok(())
        }
        _ => {
            let note = if dry_run { " (dry run)" } else { "" };
            emit(format!("{id} {}{note}\n", outcome.word()).as_bytes())
        }
    }
}

/// One element of `-o json`: `{"kind", "namespace"?, "name", "result"}`,
/// `"error"` for a failure, `"dry_run": true` with `--dry-run`.
fn entry(object: &Object, outcome: &Outcome, dry_run: bool) -> Value {
    let mut entry = Map::new();
    entry.insert("kind".into(), json!(object.kind.as_str()));
    if let Some(ns) = &object.namespace {
        entry.insert("namespace".into(), json!(ns));
    }
    entry.insert("name".into(), json!(object.name));
    entry.insert("result".into(), json!(outcome.word()));
    if let Outcome::Failed(message) = outcome {
        entry.insert("error".into(), json!(message));
    }
    if dry_run {
        entry.insert("dry_run".into(), json!(true));
    }
    Value::Object(entry)
}
