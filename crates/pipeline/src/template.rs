//! Go `text/template` rendering of a step's strings (seed, "Templating").
//!
//! Operators write templates the way the seed (a Go product) shows them, so
//! they are rendered by `gotmpl`, a port of Go's `text/template`, rather than
//! a look-alike engine: an output the previous step did not have prints
//! `<no value>` exactly as Go does, and an unterminated action is a parse
//! error instead of a hang.
//!
//! Every template is parsed when [`super::Pipelines::compile`] runs, at
//! startup (and by `kayra check`). `gotmpl` is more lenient than Go where it
//! matters here: it notices an undefined function or template only when it
//! executes it, and it stops reading at an `{{ end }}` with no block open or
//! at the end of a block left open, dropping the rest without a word. Go
//! rejects all of these at parse time, so [`Text::parse`] does too. It also
//! refuses a field the data does not have (`.Subscription.Namespce`): the
//! data's shape is fixed, and Go, executing on it, would fail too, where
//! gotmpl would print `<no value>` into a URL. A typo stops the process
//! instead of failing, or misdirecting, every reconcile.
//!
//! [`Data`] is a step's `data` with every string, at any depth, compiled to a
//! [`Text`]; object keys, numbers, booleans and nulls are kept as they are.
//!
//! # `pathescape`
//!
//! `{{ pathescape X }}` is Go's `url.PathEscape`: `X` made safe as one path
//! segment (`/`, `?`, `#`, `%`, `;`, `,` and space escaped among others),
//! for an output or field that goes into an endpoint's path. Go's builtin
//! `urlquery` (`url.QueryEscape`) is its counterpart for a query value. A
//! value pasted into a path unescaped may move the request elsewhere; the
//! rendered endpoint is checked (see `step::check_url`), but only escaping
//! keeps such a value a value.
//!
//! # `secret`
//!
//! `{{ secret "NAME" }}` is the other function added to Go's builtins. Its
//! argument must be a quoted name, so every template's secret names are
//! known at compile time (and unknown ones refused at startup). gotmpl's
//! functions see only their arguments, not the data, so the values read
//! for the current run reach the function through a thread-local that
//! [`Text::render`] sets around the (synchronous) execution and clears after.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use gotmpl::Template;
use gotmpl::parse::{CommandNode, Expr, ListNode, Node, Parser, PipeNode};

use super::SubscriptionContext;
use super::http::path_escape;
use super::secrets::SecretValues;

/// Go's builtin functions, which are all `gotmpl` knows too.
const BUILTIN_FUNCTIONS: [&str; 19] = [
    "and", "call", "eq", "ge", "gt", "html", "index", "js", "le", "len", "lt", "ne", "not", "or", "print", "printf",
    "println", "slice", "urlquery",
];

/// kayra's own template function (see the module docs).
const SECRET_FUNCTION: &str = "secret";

/// Go's `url.PathEscape`, which `text/template` does not have but kayra
/// templates do (see the module docs).
const PATHESCAPE_FUNCTION: &str = "pathescape";

/// A template that failed to parse or to render. `field` is the step-relative
/// key (`endpoint`, `headers.Authorization.value`, `data.variables[0].value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// Which of the previous step's outputs a template can read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum OutputUse {
    #[default]
    None,
    /// Only these, each through `.Previous.Outputs.<name>`.
    Names(BTreeSet<String>),
    /// Any of them: `.Previous.Outputs` as a whole, `.`, or a variable.
    All,
}

impl OutputUse {
    pub(crate) fn merge(&mut self, other: &OutputUse) {
        *self = match (std::mem::take(self), other) {
            (OutputUse::All, _) | (_, OutputUse::All) => OutputUse::All,
            (OutputUse::None, other) => other.clone(),
            (mine, OutputUse::None) => mine,
            (OutputUse::Names(mut mine), OutputUse::Names(theirs)) => {
                mine.extend(theirs.iter().cloned());
                OutputUse::Names(mine)
            }
        };
    }

    pub(crate) fn includes(&self, name: &str) -> bool {
        match self {
            OutputUse::None => false,
            OutputUse::Names(names) => names.contains(name),
            OutputUse::All => true,
        }
    }
}

/// What a gate's templates see as `.Rollout`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutContext {
    pub api: String,
    pub sync_id: String,
    /// The wave's name.
    pub wave: String,
    pub synced: usize,
    pub failed: usize,
}

/// The data every template is executed against: `.Subscription`, `.Run`
/// and `.Previous.Outputs`, plus the run's secret values for `secret`.
/// Built once per step.
pub(crate) struct Scope {
    root: gotmpl::Value,
    secrets: Arc<SecretValues>,
}

impl Scope {
    pub(crate) fn new(
        subscription: &SubscriptionContext,
        previous_outputs: &BTreeMap<String, String>,
        secrets: Arc<SecretValues>,
    ) -> Self {
        let string = |s: &str| gotmpl::Value::from(s);
        // `lock_id` is deliberately absent: it is a logging concern, not
        // something a backend call should depend on.
        let fields = [
            ("Api", string(&subscription.api)),
            ("ShortName", string(&subscription.short_name)),
            ("Namespace", string(&subscription.namespace)),
            ("Platform", string(&subscription.platform)),
            ("Region", string(&subscription.region)),
            ("CurrentSyncID", string(&subscription.current_sync_id)),
            ("ExpectedSyncID", string(&subscription.expected_sync_id)),
        ];
        let map = |fields: Vec<(&str, gotmpl::Value)>| -> gotmpl::Value {
            gotmpl::Value::from(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>())
        };
        let run = map(vec![
            ("ID", string(&subscription.run_id)),
            ("FencingToken", gotmpl::Value::Int(subscription.fencing_token)),
        ]);
        let outputs: BTreeMap<String, gotmpl::Value> =
            previous_outputs.iter().map(|(k, v)| (k.clone(), string(v))).collect();
        let previous = map(vec![("Outputs", gotmpl::Value::from(outputs))]);
        let root = map(vec![("Subscription", map(fields.to_vec())), ("Run", run), ("Previous", previous)]);
        Self { root, secrets }
    }

    /// A rollout gate's scope (§12): `.Rollout` and the secrets.
    pub(crate) fn for_rollout(rollout: &RolloutContext, secrets: Arc<SecretValues>) -> Self {
        let string = |s: &str| gotmpl::Value::from(s);
        let count = |n: usize| gotmpl::Value::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let fields = [
            ("Api", string(&rollout.api)),
            ("SyncID", string(&rollout.sync_id)),
            ("Wave", string(&rollout.wave)),
            ("Synced", count(rollout.synced)),
            ("Failed", count(rollout.failed)),
        ];
        let map = |fields: Vec<(&str, gotmpl::Value)>| -> gotmpl::Value {
            gotmpl::Value::from(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>())
        };
        Self { root: map(vec![("Rollout", map(fields.to_vec()))]), secrets }
    }
}

thread_local! {
    /// The secret values of the template executing on this thread.
    static CURRENT_SECRETS: RefCell<Option<Arc<SecretValues>>> = const { RefCell::new(None) };
}

/// Clears [`CURRENT_SECRETS`] on drop, so a panicking template leaves no
/// values behind on the thread.
struct SecretsInstalled;

impl SecretsInstalled {
    fn install(secrets: &Arc<SecretValues>) -> Self {
        CURRENT_SECRETS.with(|c| *c.borrow_mut() = Some(secrets.clone()));
        Self
    }
}

impl Drop for SecretsInstalled {
    fn drop(&mut self) {
        CURRENT_SECRETS.with(|c| *c.borrow_mut() = None);
    }
}

/// `{{ secret "NAME" }}`. Names were checked at compile time and every
/// value the pipeline uses was read before its first step, so a miss here
/// is a bug; it fails the render without saying more than the name.
fn secret_function(args: &[gotmpl::Value]) -> gotmpl::Result<gotmpl::Value> {
    let [gotmpl::Value::String(name)] = args else {
        return Err(gotmpl::TemplateError::Exec("secret takes one quoted name".into()));
    };
    CURRENT_SECRETS.with(|c| {
        c.borrow()
            .as_ref()
            .and_then(|values| values.get(name))
            .map(gotmpl::Value::from)
            .ok_or_else(|| gotmpl::TemplateError::Exec(format!("secret {name:?} was not read for this run")))
    })
}

/// `{{ pathescape X }}`: Go's `url.PathEscape` of `X` printed as `print`
/// would (a missing output is `<no value>`, escaped).
fn pathescape_function(args: &[gotmpl::Value]) -> gotmpl::Result<gotmpl::Value> {
    let [arg] = args else {
        return Err(gotmpl::TemplateError::Exec(format!("pathescape takes one argument, got {}", args.len())));
    };
    let text = match arg {
        gotmpl::Value::String(s) => path_escape(s),
        gotmpl::Value::Nil => path_escape("<no value>"),
        other => path_escape(&other.to_string()),
    };
    Ok(gotmpl::Value::from(text.as_str()))
}

/// One templated string.
pub(crate) struct Text {
    field: String,
    /// Render errors of a sensitive text (a header, a `data` string) carry
    /// no detail: the engine's message may quote the template's own text,
    /// which is where tokens live.
    sensitive: bool,
    kind: TextKind,
    /// The names passed to `secret`, in order of appearance.
    secrets: Vec<String>,
    outputs: OutputUse,
}

enum TextKind {
    /// No `{{` at all: nothing to execute, the string is its own rendering.
    Literal(String),
    Template(Box<Template>),
}

impl Text {
    /// Parses `source`; `field` names it in errors.
    pub(crate) fn parse(field: impl Into<String>, source: &str, sensitive: bool) -> Result<Self, TemplateError> {
        let field = field.into();
        if !source.contains("{{") {
            return Ok(Self {
                field,
                sensitive,
                kind: TextKind::Literal(source.to_string()),
                secrets: Vec::new(),
                outputs: OutputUse::None,
            });
        }
        let error = |message: String| TemplateError { field: field.clone(), message };
        // Unnamed, so errors read `template: 1:7: unclosed action`; the
        // caller prefixes the full config key.
        let template = Template::new("")
            .func(SECRET_FUNCTION, secret_function)
            .func(PATHESCAPE_FUNCTION, pathescape_function)
            .parse(source)
            .map_err(|e| error(e.to_string()))?;
        let (tree, defines) =
            Parser::new(source, "{{", "}}").and_then(Parser::parse).map_err(|e| error(e.to_string()))?;
        blocks_closed(source).map_err(|e| error(e.to_string()))?;
        let mut walk = Walk { dot_is_root: true, ..Walk::default() };
        walk.list(&tree);
        walk.dot_is_root = false;
        for define in &defines {
            walk.list(&define.body);
        }
        if let Some(name) = walk.undefined.first() {
            return Err(error(format!("template: function {name:?} not defined")));
        }
        if let Some(name) = walk.called.iter().find(|name| !defines.iter().any(|d| d.name == **name)) {
            return Err(error(format!("template: no template {name:?} is defined")));
        }
        if let Some(field) = &walk.unknown_field {
            let fields = if SCHEMA.with(std::cell::Cell::get) == Schema::Gate { GATE_FIELDS } else { FIELDS };
            return Err(error(format!("template: can't evaluate field {field}: the fields are {fields}")));
        }
        if walk.bad_secret_call {
            return Err(error(r#"template: secret takes one quoted name: {{ secret "NAME" }}"#.into()));
        }
        Ok(Self {
            field,
            sensitive,
            kind: TextKind::Template(Box::new(template)),
            secrets: walk.secrets,
            outputs: walk.outputs,
        })
    }

    /// A text that is a secret's value and nothing else (a header's
    /// `secret:` form): the same thing as `{{ secret "NAME" }}`.
    pub(crate) fn secret(field: impl Into<String>, name: &str) -> Self {
        let source = format!("{{{{ secret {} }}}}", serde_json::Value::from(name));
        Self::parse(field, &source, true).expect("a quoted name is a valid secret call")
    }

    /// The string itself when it contains no action.
    pub(crate) fn literal(&self) -> Option<&str> {
        match &self.kind {
            TextKind::Literal(s) => Some(s),
            TextKind::Template(_) => None,
        }
    }

    pub(crate) fn field(&self) -> &str {
        &self.field
    }

    /// The secret names this text reads.
    pub(crate) fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// Which previous outputs this text reads.
    pub(crate) fn outputs(&self) -> &OutputUse {
        &self.outputs
    }

    pub(crate) fn render(&self, scope: &Scope) -> Result<String, TemplateError> {
        match &self.kind {
            TextKind::Literal(s) => Ok(s.clone()),
            TextKind::Template(t) => {
                let _installed = SecretsInstalled::install(&scope.secrets);
                t.execute_to_string(&scope.root).map_err(|e| TemplateError {
                    field: self.field.clone(),
                    message: if self.sensitive || !self.secrets.is_empty() {
                        "template execution failed (detail withheld: the field may hold a secret)".to_string()
                    } else {
                        e.to_string()
                    },
                })
            }
        }
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the source: a header's or data's text may be a token.
        f.debug_struct("Text").field("field", &self.field).finish_non_exhaustive()
    }
}

/// A step's `data`, compiled: the JSON shape, with a [`Text`] for every string.
#[derive(Debug)]
pub(crate) enum Data {
    /// A subtree with no template in it, rendered as itself.
    Literal(serde_json::Value),
    Text(Text),
    Array(Vec<Data>),
    Object(Vec<(String, Data)>),
}

impl Data {
    /// Compiles `value`; `field` is its key (`data`, then `data.a[0].b` …).
    pub(crate) fn compile(field: &str, value: &serde_json::Value) -> Result<Self, TemplateError> {
        let data =
            match value {
                serde_json::Value::String(s) => Self::Text(Text::parse(field, s, true)?),
                serde_json::Value::Array(items) => Self::Array(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| Self::compile(&format!("{field}[{i}]"), item))
                        .collect::<Result<_, _>>()?,
                ),
                serde_json::Value::Object(map) => Self::Object(
                    map.iter()
                        .map(|(k, v)| Ok((k.clone(), Self::compile(&format!("{field}.{k}"), v)?)))
                        .collect::<Result<_, TemplateError>>()?,
                ),
                other => Self::Literal(other.clone()),
            };
        Ok(data.collapse(value))
    }

    /// A subtree without templates becomes one literal, so rendering it is
    /// a clone rather than a walk.
    fn collapse(self, source: &serde_json::Value) -> Self {
        if self.is_literal() { Self::Literal(source.clone()) } else { self }
    }

    fn is_literal(&self) -> bool {
        match self {
            Self::Literal(_) => true,
            Self::Text(t) => t.literal().is_some(),
            Self::Array(items) => items.iter().all(Self::is_literal),
            Self::Object(fields) => fields.iter().all(|(_, v)| v.is_literal()),
        }
    }

    /// Every template in it, depth first.
    pub(crate) fn texts(&self) -> Vec<&Text> {
        match self {
            Self::Literal(_) => Vec::new(),
            Self::Text(t) => vec![t],
            Self::Array(items) => items.iter().flat_map(Self::texts).collect(),
            Self::Object(fields) => fields.iter().flat_map(|(_, v)| v.texts()).collect(),
        }
    }

    pub(crate) fn render(&self, scope: &Scope) -> Result<serde_json::Value, TemplateError> {
        Ok(match self {
            Self::Literal(v) => v.clone(),
            Self::Text(t) => serde_json::Value::String(t.render(scope)?),
            Self::Array(items) => {
                serde_json::Value::Array(items.iter().map(|d| d.render(scope)).collect::<Result<_, _>>()?)
            }
            Self::Object(fields) => serde_json::Value::Object(
                fields.iter().map(|(k, v)| Ok((k.clone(), v.render(scope)?))).collect::<Result<_, TemplateError>>()?,
            ),
        })
    }
}

/// What a step template can read, for the error that names a field
/// outside it.
const FIELDS: &str = ".Subscription.{Api, ShortName, Namespace, Platform, Region, CurrentSyncID, ExpectedSyncID}, \
                      .Previous.Outputs.NAME, .Run.{ID, FencingToken}";
/// What a rollout gate's template can read ([`Scope::for_rollout`]).
const GATE_FIELDS: &str = ".Rollout.{Api, SyncID, Wave, Synced, Failed}";

/// Which data a template being parsed will see: a pipeline step's
/// ([`Scope::new`]) or a rollout gate's ([`Scope::for_rollout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schema {
    Step,
    Gate,
}

thread_local! {
    /// The schema templates parsed on this thread are checked against;
    /// set for the span of one gate's compile ([`with_schema`]).
    static SCHEMA: std::cell::Cell<Schema> = const { std::cell::Cell::new(Schema::Step) };
}

/// Runs `compile` (synchronous) with templates checked against `schema`.
pub(crate) fn with_schema<T>(schema: Schema, compile: impl FnOnce() -> T) -> T {
    struct Restore(Schema);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCHEMA.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCHEMA.with(|s| s.replace(schema)));
    compile()
}

/// Whether `chain`, read from the template's root, names a field the data
/// has (see [`Scope::new`]); any name under `.Previous.Outputs` may be read
/// (an output the previous step did not have prints `<no value>`).
fn known_field(chain: &[gotmpl::parse::SmolStr]) -> bool {
    const SUBSCRIPTION: [&str; 7] =
        ["Api", "ShortName", "Namespace", "Platform", "Region", "CurrentSyncID", "ExpectedSyncID"];
    let names: Vec<&str> = chain.iter().map(gotmpl::parse::SmolStr::as_str).collect();
    if SCHEMA.with(std::cell::Cell::get) == Schema::Gate {
        return matches!(
            names.as_slice(),
            [] | ["Rollout"] | ["Rollout", "Api" | "SyncID" | "Wave" | "Synced" | "Failed"]
        );
    }
    match names.as_slice() {
        [] | ["Subscription" | "Run" | "Previous"] | ["Previous", "Outputs", ..] => true,
        ["Subscription", field] => SUBSCRIPTION.contains(field),
        ["Run", "ID" | "FencingToken"] => true,
        _ => false,
    }
}

/// Go's parser refuses a block (`if`, `range`, `with`, `define`, `block`)
/// left without its `{{ end }}`, and an `{{ end }}` or `{{ else }}` with no
/// block open; gotmpl's stops reading at either end, silently. So the
/// source is parsed once more inside a wrapper of its own,
/// `{{ if true }}SOURCE{{ end }}` and a sentinel text: balanced, the top
/// level is the wrapper and then the sentinel. An unclosed block inside
/// swallows the wrapper's `end` (the sentinel ends up inside the wrapper);
/// a stray `end` closes the wrapper early, and the wrapper's own `end` then
/// stops the parse before the sentinel; a stray `else` becomes the
/// wrapper's.
fn blocks_closed(source: &str) -> Result<(), &'static str> {
    const SENTINEL: &str = "\u{0}kayra-sentinel\u{0}";
    const UNCLOSED: &str =
        "template: unexpected EOF: an {{ if }}, {{ range }}, {{ with }}, {{ define }} or {{ block }} has no {{ end }}";
    const STRAY: &str = "template: unexpected {{ end }}: no block is open";
    const STRAY_ELSE: &str = "template: unexpected {{ else }}: no {{ if }}, {{ range }} or {{ with }} is open";
    fn holds_sentinel(list: &ListNode) -> bool {
        list.nodes.iter().any(|node| match node {
            Node::Text(text) => &*text.text == SENTINEL,
            Node::List(inner) => holds_sentinel(inner),
            Node::If(b) | Node::Range(b) | Node::With(b) => {
                holds_sentinel(&b.body) || b.else_body.as_ref().is_some_and(holds_sentinel)
            }
            _ => false,
        })
    }
    let wrapped = format!("{{{{ if true }}}}{source}{{{{ end }}}}{SENTINEL}");
    let (tree, defines) = Parser::new(&wrapped, "{{", "}}").and_then(Parser::parse).map_err(|_| STRAY)?;
    match tree.nodes.as_slice() {
        // The wrapper has no `else`: one there is the source's, stray.
        [Node::If(wrapper), Node::Text(_)] if wrapper.else_body.is_some() => Err(STRAY_ELSE),
        [Node::If(_), Node::Text(text)] if &*text.text == SENTINEL => Ok(()),
        _ if holds_sentinel(&tree) || defines.iter().any(|d| holds_sentinel(&d.body)) => Err(UNCLOSED),
        _ => Err(STRAY),
    }
}

/// One pass over a parsed template: functions that are not defined,
/// templates called, fields read from the root that the data does not
/// have, `secret` calls, and reads of `.Previous.Outputs`.
#[derive(Default)]
struct Walk {
    /// Whether `.` is the template's root here: not inside a `with` or a
    /// `range` (which move it) or a `define` (whose caller sets it).
    dot_is_root: bool,
    unknown_field: Option<String>,
    called: Vec<String>,
    undefined: Vec<String>,
    secrets: Vec<String>,
    bad_secret_call: bool,
    outputs: OutputUse,
}

impl Walk {
    fn list(&mut self, list: &ListNode) {
        for node in &list.nodes {
            match node {
                Node::List(inner) => self.list(inner),
                Node::Action(action) => self.pipe(&action.pipe),
                Node::If(branch) => {
                    self.pipe(&branch.pipe);
                    self.list(&branch.body);
                    if let Some(else_body) = &branch.else_body {
                        self.list(else_body);
                    }
                }
                Node::Range(branch) | Node::With(branch) => {
                    self.pipe(&branch.pipe);
                    // Dot is the pipeline's value in the body; in `else`
                    // it is what it was.
                    let outer = std::mem::replace(&mut self.dot_is_root, false);
                    self.list(&branch.body);
                    self.dot_is_root = outer;
                    if let Some(else_body) = &branch.else_body {
                        self.list(else_body);
                    }
                }
                Node::Template(call) => {
                    self.called.push(call.name.to_string());
                    if let Some(pipe) = &call.pipe {
                        self.pipe(pipe);
                    }
                }
                Node::Define(define) => self.list(&define.body),
                _ => {}
            }
        }
    }

    fn pipe(&mut self, pipe: &PipeNode) {
        for (position, command) in pipe.commands.iter().enumerate() {
            self.secret_call(command, position == 0);
            for arg in &command.args {
                self.expr(arg);
            }
        }
    }

    /// `secret "NAME"` as a whole command, not fed by a pipe.
    fn secret_call(&mut self, command: &CommandNode, first_in_pipe: bool) {
        let calls_secret = |e: &Expr| matches!(e, Expr::Identifier(_, name) if name == SECRET_FUNCTION);
        match command.args.as_slice() {
            [head, Expr::String(_, name)] if calls_secret(head) && first_in_pipe => self.secrets.push(name.to_string()),
            [head, ..] if calls_secret(head) => self.bad_secret_call = true,
            _ => {}
        }
        if command.args.iter().skip(1).any(calls_secret) {
            self.bad_secret_call = true;
        }
    }

    fn expr(&mut self, expr: &Expr) {
        match expr {
            Expr::Identifier(_, name)
                if name != SECRET_FUNCTION
                    && name != PATHESCAPE_FUNCTION
                    && !BUILTIN_FUNCTIONS.contains(&name.as_str()) =>
            {
                self.undefined.push(name.to_string())
            }
            Expr::Pipe(_, pipe) => self.pipe(pipe),
            Expr::Chain(_, inner, _) => self.expr(inner),
            Expr::Field(_, chain) | Expr::Variable(_, _, chain) => {
                let from_root = match expr {
                    Expr::Variable(_, name, _) => name == "$",
                    _ => self.dot_is_root,
                };
                if from_root && !known_field(chain) && self.unknown_field.is_none() {
                    self.unknown_field = Some(format!(".{}", chain.join(".")));
                }
                self.outputs_read(expr, chain);
            }
            Expr::Dot(_) => self.outputs = OutputUse::All,
            _ => {}
        }
    }

    /// Which outputs of the previous step `expr` (a field or variable
    /// chain) may read.
    fn outputs_read(&mut self, expr: &Expr, chain: &[gotmpl::parse::SmolStr]) {
        match expr {
            Expr::Field(..) => match chain {
                [previous, outputs, name, ..] if previous == "Previous" && outputs == "Outputs" => {
                    self.outputs.merge(&OutputUse::Names(BTreeSet::from([name.to_string()])))
                }
                [previous, ..] if previous == "Previous" => self.outputs = OutputUse::All,
                _ => {}
            },
            // A variable may hold anything, `.Previous` included.
            _ => self.outputs = OutputUse::All,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn subscription() -> SubscriptionContext {
        SubscriptionContext {
            api: "compute.example.com".into(),
            short_name: "compute".into(),
            namespace: "core".into(),
            platform: "dev".into(),
            region: "local".into(),
            current_sync_id: "s1".into(),
            expected_sync_id: "s2".into(),
            lock_id: 3,
            run_id: "run-1".into(),
            fencing_token: 17,
        }
    }

    fn render(source: &str, outputs: &[(&str, &str)]) -> Result<String, TemplateError> {
        let outputs = outputs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Text::parse("endpoint", source, false)?.render(&Scope::new(&subscription(), &outputs, Default::default()))
    }

    #[test]
    fn subscription_fields_and_previous_outputs() {
        let s = "{{ .Subscription.Api }} {{ .Subscription.ShortName }} {{ .Subscription.Namespace }} \
                 {{ .Subscription.Platform }} {{ .Subscription.Region }} {{ .Subscription.CurrentSyncID }} \
                 {{ .Subscription.ExpectedSyncID }} {{ .Previous.Outputs.PipelineID }}";
        assert_eq!(render(s, &[("PipelineID", "42")]).unwrap(), "compute.example.com compute core dev local s1 s2 42");
    }

    #[test]
    fn missing_keys_render_like_go() {
        assert_eq!(render("id={{ .Previous.Outputs.PipelineID }}", &[]).unwrap(), "id=<no value>");
    }

    #[test]
    fn fields_the_data_does_not_have_are_parse_errors() {
        for (source, field) in [
            ("{{ .Subscription.Namespce }}", ".Subscription.Namespce"),
            ("{{ .Nope }}", ".Nope"),
            ("{{ .Run.Id }}", ".Run.ID"),
            ("{{ .Previous.Status }}", ".Previous.Status"),
            ("{{ .Subscription.Api.Length }}", ".Subscription.Api.Length"),
            ("{{ if .Subscription.ShortName }}{{ .Subscription.shortname }}{{ end }}", ".Subscription.shortname"),
            ("{{ with .Subscription }}{{ $.Subscription.Nope }}{{ end }}", ".Subscription.Nope"),
        ] {
            let err = Text::parse("endpoint", source, false).expect_err(source);
            let named = field.trim_end_matches(".ID").trim_end_matches(".Length");
            assert!(
                err.message.contains("can't evaluate field") && err.message.contains(named),
                "{source}: {}",
                err.message
            );
            assert!(err.message.contains(".Subscription.{Api"), "the error lists the fields: {}", err.message);
        }
        // Inside `with` and `range` dot moves, and a `define`'s is its caller's.
        for source in [
            "{{ .Subscription.ExpectedSyncID }}/{{ .Run.ID }}/{{ .Run.FencingToken }}/{{ .Previous.Outputs.Anything }}",
            "{{ with .Subscription }}{{ .Namespace }}{{ end }}",
            "{{ range $k, $v := .Previous.Outputs }}{{ $k }}={{ $v.Whatever }}{{ else }}{{ .Run.ID }}{{ end }}",
            r#"{{ define "ns" }}{{ .Namespace }}{{ end }}{{ template "ns" .Subscription }}"#,
            "{{ $.Subscription.Region }} {{ . }} {{ .Subscription }}",
        ] {
            Text::parse("endpoint", source, false).unwrap_or_else(|e| panic!("{source}: {}", e.message));
        }
    }

    #[test]
    fn blocks_without_their_end_and_ends_without_a_block_are_parse_errors() {
        for source in
            ["a/{{ if .Run.ID }}b", "{{ range .Previous.Outputs }}", "{{ with .Subscription }}{{ if . }}{{ end }}"]
        {
            let err = Text::parse("endpoint", source, false).expect_err(source);
            assert!(err.message.contains("unexpected EOF"), "{source}: {}", err.message);
        }
        for source in ["a{{ end }}b", "{{ if .Run.ID }}{{ end }}{{ end }}"] {
            let err = Text::parse("endpoint", source, false).expect_err(source);
            assert!(err.message.contains("unexpected {{ end }}"), "{source}: {}", err.message);
        }
        for source in ["a{{ else }}b", "{{ if .Run.ID }}{{ end }}{{ else }}"] {
            let err = Text::parse("endpoint", source, false).expect_err(source);
            assert!(err.message.contains("unexpected {{ else }}"), "{source}: {}", err.message);
        }
        for source in [
            "{{ if .Run.ID }}a{{ else if .Run.FencingToken }}b{{ else }}c{{ end }}",
            "{{- if .Run.ID -}} x {{- end -}}",
        ] {
            Text::parse("endpoint", source, false).unwrap_or_else(|e| panic!("{source}: {}", e.message));
        }
    }

    #[test]
    fn calling_a_template_that_is_not_defined_is_a_parse_error() {
        let err = Text::parse("endpoint", r#"{{ template "nope" }}"#, false).unwrap_err();
        assert!(err.message.contains(r#"no template "nope""#), "{}", err.message);
        Text::parse("endpoint", r#"{{ block "b" . }}{{ .Run.ID }}{{ end }}{{ template "b" . }}"#, false).unwrap();
    }

    #[test]
    fn go_functions_work() {
        assert_eq!(render(r#"{{ printf "%q" .Subscription.Namespace }}"#, &[]).unwrap(), r#""core""#);
        assert_eq!(render("{{ if .Previous.Outputs }}has{{ else }}none{{ end }}", &[]).unwrap(), "none");
        assert_eq!(render("{{ len .Previous.Outputs }}", &[("a", "1"), ("b", "2")]).unwrap(), "2");
        assert_eq!(render("{{ .Subscription.Namespace | urlquery }}", &[]).unwrap(), "core");
    }

    #[test]
    fn pathescape_and_urlquery_escape_like_go() {
        let id = "../../admin/delete-all?confirm=yes#";
        // Go: url.PathEscape and url.QueryEscape of the same string.
        assert_eq!(
            render("{{ pathescape .Previous.Outputs.ID }}", &[("ID", id)]).unwrap(),
            "..%2F..%2Fadmin%2Fdelete-all%3Fconfirm=yes%23"
        );
        assert_eq!(
            render("{{ .Previous.Outputs.ID | urlquery }}", &[("ID", id)]).unwrap(),
            "..%2F..%2Fadmin%2Fdelete-all%3Fconfirm%3Dyes%23"
        );
        assert_eq!(
            render("{{ pathescape .Previous.Outputs.ID }}", &[("ID", "a b;c,d$e&f+g:h=i@j%k~l\u{e9}")]).unwrap(),
            "a%20b%3Bc%2Cd$e&f+g:h=i@j%25k~l%C3%A9"
        );
        assert_eq!(render("{{ urlquery \"a b&c\" }}", &[]).unwrap(), "a+b%26c");
        assert_eq!(render("{{ pathescape .Run.FencingToken }}", &[]).unwrap(), "17");
        assert_eq!(render("{{ pathescape .Previous.Outputs.Nope }}", &[]).unwrap(), "%3Cno%20value%3E");
        let err = Text::parse("endpoint", "{{ pathescape }}", false).unwrap().render(&Scope::new(
            &subscription(),
            &BTreeMap::new(),
            Default::default(),
        ));
        assert!(err.unwrap_err().message.contains("pathescape takes one argument"));
    }

    #[test]
    fn literals_pass_through() {
        let text = Text::parse("f", "plain 50 %s {x}", true).unwrap();
        assert_eq!(text.literal(), Some("plain 50 %s {x}"));
    }

    #[test]
    fn syntax_errors_are_parse_errors_not_hangs() {
        let err = Text::parse("headers.Authorization", "Bearer {{ .Subscription.Namespace ", true).unwrap_err();
        assert_eq!(err.field, "headers.Authorization");
        assert!(err.message.contains("unclosed action"), "{}", err.message);
        assert!(Text::parse("f", "{{ .A }", false).is_err());
        assert!(Text::parse("f", "{{ .A | }}", false).is_err());
    }

    #[test]
    fn undefined_functions_are_parse_errors() {
        let err = Text::parse("f", "{{ .Subscription.Namespace | uper }}", false).unwrap_err();
        assert!(err.message.contains(r#"function "uper" not defined"#), "{}", err.message);
        let nested = "{{ if .Run.ID }}{{ range .Previous.Outputs }}{{ (frob .) }}{{ end }}{{ end }}";
        assert!(Text::parse("f", nested, false).unwrap_err().message.contains("frob"));
        assert!(Text::parse("f", r#"{{ define "x" }}{{ zap }}{{ end }}"#, false).is_err());
        let calls = r#"{{ printf "%s-%s" (index .Previous.Outputs "k") (len .Subscription.Api) | html }}"#;
        Text::parse("f", calls, false).unwrap();
    }

    #[test]
    fn sensitive_render_errors_withhold_detail() {
        let scope = Scope::new(&subscription(), &BTreeMap::new(), Default::default());
        let tpl = r#"{{ range "tok-secret" }}{{ end }}"#;
        let err = Text::parse("headers.X", tpl, true).unwrap().render(&scope).unwrap_err();
        assert!(!err.message.contains("tok-secret") && err.message.contains("withheld"), "{}", err.message);
        let err = Text::parse("endpoint", "{{ range .Subscription.Api }}{{ end }}", false).unwrap().render(&scope);
        assert!(err.unwrap_err().message.contains("range"));
    }

    #[test]
    fn data_renders_every_string_and_keeps_types() {
        let data = json!({
            "ref": "{{ .Subscription.Platform }}",
            "variables": [
                {"key": "TENANT_NAME", "value": "{{ .Subscription.Namespace }}"},
                {"key": "CHECK_MAX", "value": "50"},
            ],
            "n": 3, "f": 1.5, "ok": true, "none": null,
            "nested": {"deep": [["{{ .Previous.Outputs.X }}", 7]]},
            "{{ .Subscription.Namespace }}": "keys are not templates",
        });
        let compiled = Data::compile("data", &data).unwrap();
        let outputs = BTreeMap::from([("X".to_string(), "x!".to_string())]);
        let rendered = compiled.render(&Scope::new(&subscription(), &outputs, Default::default())).unwrap();
        assert_eq!(
            rendered,
            json!({
                "ref": "dev",
                "variables": [{"key": "TENANT_NAME", "value": "core"}, {"key": "CHECK_MAX", "value": "50"}],
                "n": 3, "f": 1.5, "ok": true, "none": null,
                "nested": {"deep": [["x!", 7]]},
                "{{ .Subscription.Namespace }}": "keys are not templates",
            })
        );
    }

    #[test]
    fn data_without_templates_is_one_literal() {
        let data = json!({"a": [1, "two", {"b": false}]});
        assert!(matches!(Data::compile("data", &data).unwrap(), Data::Literal(v) if v == data));
    }

    #[test]
    fn data_errors_name_the_nested_field() {
        let data = json!({"variables": [{"key": "A"}, {"value": "{{ .X "}]});
        let err = Data::compile("data", &data).unwrap_err();
        assert_eq!(err.field, "data.variables[1].value");
    }
}
