//! Go `text/template` rendering of a step's strings (seed, "Templating").
//!
//! Operators write templates the way the seed (a Go product) shows them, so
//! they are rendered by `gotmpl`, a port of Go's `text/template`, rather than
//! a look-alike engine: a missing key prints `<no value>` exactly as Go does,
//! and an unterminated action is a parse error instead of a hang.
//!
//! Every template is parsed when [`super::Pipelines::compile`] runs, at
//! startup. `gotmpl` is more lenient than Go in one way that matters here: it
//! only notices an undefined function when it executes it. Go rejects that at
//! parse time, so [`Text::parse`] walks the parsed tree and does the same; a
//! typo such as `{{ .Subscription.Namespace | uper }}` stops the process
//! instead of failing every reconcile.
//!
//! [`Data`] is a step's `data` with every string, at any depth, compiled to a
//! [`Text`]; object keys, numbers, booleans and nulls are kept as they are.

use std::collections::BTreeMap;
use std::fmt;

use gotmpl::Template;
use gotmpl::parse::{Expr, ListNode, Node, Parser, PipeNode};

use super::SubscriptionContext;

/// Go's builtin functions, which are all `gotmpl` knows too.
const BUILTIN_FUNCTIONS: [&str; 19] = [
    "and", "call", "eq", "ge", "gt", "html", "index", "js", "le", "len", "lt", "ne", "not", "or", "print", "printf",
    "println", "slice", "urlquery",
];

/// A template that failed to parse or to render. `field` is the step-relative
/// key (`endpoint`, `headers.Authorization.value`, `data.variables[0].value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// The data every template is executed against: `.Subscription` and
/// `.Previous.Outputs`. Built once per step.
pub(crate) struct Scope(gotmpl::Value);

impl Scope {
    pub(crate) fn new(subscription: &SubscriptionContext, previous_outputs: &BTreeMap<String, String>) -> Self {
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
        let subscription: BTreeMap<String, gotmpl::Value> =
            fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let outputs: BTreeMap<String, gotmpl::Value> =
            previous_outputs.iter().map(|(k, v)| (k.clone(), string(v))).collect();
        let previous = BTreeMap::from([("Outputs".to_string(), gotmpl::Value::from(outputs))]);
        let root = BTreeMap::from([
            ("Subscription".to_string(), gotmpl::Value::from(subscription)),
            ("Previous".to_string(), gotmpl::Value::from(previous)),
        ]);
        Self(gotmpl::Value::from(root))
    }
}

/// One templated string.
pub(crate) struct Text {
    field: String,
    /// Render errors of a sensitive text (a header, a `data` string) carry
    /// no detail: the engine's message may quote the template's own text,
    /// which is where tokens live.
    sensitive: bool,
    kind: TextKind,
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
            return Ok(Self { field, sensitive, kind: TextKind::Literal(source.to_string()) });
        }
        let error = |message: String| TemplateError { field: field.clone(), message };
        // Unnamed, so errors read `template: 1:7: unclosed action`; the
        // caller prefixes the full config key.
        let template = Template::new("").parse(source).map_err(|e| error(e.to_string()))?;
        let (tree, defines) =
            Parser::new(source, "{{", "}}").and_then(Parser::parse).map_err(|e| error(e.to_string()))?;
        let mut undefined = Vec::new();
        undefined_functions(&tree, &mut undefined);
        for define in &defines {
            undefined_functions(&define.body, &mut undefined);
        }
        if let Some(name) = undefined.first() {
            return Err(error(format!("template: function {name:?} not defined")));
        }
        Ok(Self { field, sensitive, kind: TextKind::Template(Box::new(template)) })
    }

    /// The string itself when it contains no action.
    pub(crate) fn literal(&self) -> Option<&str> {
        match &self.kind {
            TextKind::Literal(s) => Some(s),
            TextKind::Template(_) => None,
        }
    }

    pub(crate) fn render(&self, scope: &Scope) -> Result<String, TemplateError> {
        match &self.kind {
            TextKind::Literal(s) => Ok(s.clone()),
            TextKind::Template(t) => t.execute_to_string(&scope.0).map_err(|e| TemplateError {
                field: self.field.clone(),
                message: if self.sensitive {
                    "template execution failed (detail withheld: the field may hold a secret)".to_string()
                } else {
                    e.to_string()
                },
            }),
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

/// Collects every function a template calls that is not a builtin.
fn undefined_functions(list: &ListNode, out: &mut Vec<String>) {
    for node in &list.nodes {
        match node {
            Node::List(inner) => undefined_functions(inner, out),
            Node::Action(action) => pipe_functions(&action.pipe, out),
            Node::If(branch) | Node::Range(branch) | Node::With(branch) => {
                pipe_functions(&branch.pipe, out);
                undefined_functions(&branch.body, out);
                if let Some(else_body) = &branch.else_body {
                    undefined_functions(else_body, out);
                }
            }
            Node::Template(call) => {
                if let Some(pipe) = &call.pipe {
                    pipe_functions(pipe, out);
                }
            }
            Node::Define(define) => undefined_functions(&define.body, out),
            _ => {}
        }
    }
}

fn pipe_functions(pipe: &PipeNode, out: &mut Vec<String>) {
    for command in &pipe.commands {
        for arg in &command.args {
            expr_functions(arg, out);
        }
    }
}

fn expr_functions(expr: &Expr, out: &mut Vec<String>) {
    match expr {
        Expr::Identifier(_, name) if !BUILTIN_FUNCTIONS.contains(&name.as_str()) => out.push(name.to_string()),
        Expr::Pipe(_, pipe) => pipe_functions(pipe, out),
        Expr::Chain(_, inner, _) => expr_functions(inner, out),
        _ => {}
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
        }
    }

    fn render(source: &str, outputs: &[(&str, &str)]) -> Result<String, TemplateError> {
        let outputs = outputs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Text::parse("endpoint", source, false)?.render(&Scope::new(&subscription(), &outputs))
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
        assert_eq!(render("{{ .Subscription.Nope }}", &[]).unwrap(), "<no value>");
    }

    #[test]
    fn go_functions_work() {
        assert_eq!(render(r#"{{ printf "%q" .Subscription.Namespace }}"#, &[]).unwrap(), r#""core""#);
        assert_eq!(render("{{ if .Previous.Outputs }}has{{ else }}none{{ end }}", &[]).unwrap(), "none");
        assert_eq!(render("{{ len .Previous.Outputs }}", &[("a", "1"), ("b", "2")]).unwrap(), "2");
        assert_eq!(render("{{ .Subscription.Namespace | urlquery }}", &[]).unwrap(), "core");
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
        let nested = "{{ if .A }}{{ range .B }}{{ (frob .) }}{{ end }}{{ end }}";
        assert!(Text::parse("f", nested, false).unwrap_err().message.contains("frob"));
        assert!(Text::parse("f", r#"{{ define "x" }}{{ zap }}{{ end }}"#, false).is_err());
        Text::parse("f", r#"{{ printf "%s-%s" (index .M "k") (len .L) | html }}"#, false).unwrap();
    }

    #[test]
    fn sensitive_render_errors_withhold_detail() {
        let scope = Scope::new(&subscription(), &BTreeMap::new());
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
        let rendered = compiled.render(&Scope::new(&subscription(), &outputs)).unwrap();
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
