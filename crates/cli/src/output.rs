//! Printing answers: JSON, YAML, or a table that shows what an operator
//! needs at a glance.
//!
//! Tables are chosen by [`View`] (what was asked for), and read the answer
//! as untyped JSON: a field the CLI does not know about is simply not a
//! column, a missing one is `<none>`, so an older or newer server never
//! breaks the client. Columns are separated by three spaces and padded to
//! the widest cell, the last column is never padded (kubectl's layout,
//! friendly to `awk` and `column -t`).

use std::fmt::Write as _;
use std::io::Write as _;

use serde_json::Value;

use crate::error::{Error, invalid};
use crate::escape::{Escaped, escape, escape_controls};
use crate::grid::{cell, layout};
use crate::request::View;

/// `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// Fields that identify an object; a generic table shows them first.
const IDENTITY_KEYS: [&str; 5] = ["name", "id", "user", "namespace", "api"];
/// Generic tables show at most this many columns.
const MAX_GENERIC_COLUMNS: usize = 6;

const SUBSCRIPTION_COLUMNS: &[(&str, &str)] = &[
    ("API", "api"),
    ("ACTIVE", "active"),
    ("STATE", "state"),
    ("CURRENT", "current_sync_id"),
    ("EXPECTED", "expected_sync_id"),
    ("SYNCED", "synced"),
];
const REGISTRATION_COLUMNS: &[(&str, &str)] =
    &[("NAME", "name"), ("SHORT", "short_name"), ("MODE", "mode"), ("SYNC ID", "sync_id")];
/// The audit trail (platform §13), newest first as the server sends it.
const AUDIT_COLUMNS: &[(&str, &str)] = &[
    ("TIME", "time"),
    ("USER", "user"),
    ("VERB", "verb"),
    ("RESOURCE", "resource"),
    ("NAMESPACE", "namespace"),
    ("NAME", "name"),
    ("REASON", "reason"),
];
const NAMESPACE_COLUMNS: &[(&str, &str)] = &[("NAME", "name"), ("ACTIVE", "active"), ("DESCRIPTION", "description")];
const SUBSCRIBER_COLUMNS: &[(&str, &str)] = &[
    ("NAMESPACE", "namespace"),
    ("ACTIVE", "active"),
    ("STATE", "state"),
    ("CURRENT", "current_sync_id"),
    ("SYNCED", "synced"),
];

/// Whether an answer is a list (`{"items": [...], ...}`).
pub fn is_list(value: &Value) -> bool {
    value.get("items").is_some_and(Value::is_array)
}

/// The items of a list answer, or the single object as a one-row list.
fn rows_of(value: &Value) -> Vec<&Value> {
    match value.get("items").and_then(Value::as_array) {
        Some(items) => items.iter().collect(),
        None => vec![value],
    }
}

/// Renders an answer in `format`. The text ends with a newline unless empty
/// (an empty list as a table renders as nothing; the caller says so on
/// stderr).
pub fn render(value: &Value, view: View, format: Format) -> Result<String, Error> {
    match format {
        Format::Json => json(value, true),
        Format::Yaml => yaml(value),
        Format::Table => Ok(table(value, view)),
    }
}

/// Renders an answer as a table.
pub fn table(value: &Value, view: View) -> String {
    let columns = match view {
        View::Subscriptions => SUBSCRIPTION_COLUMNS,
        View::Registrations => REGISTRATION_COLUMNS,
        View::Namespaces => NAMESPACE_COLUMNS,
        View::Audit => AUDIT_COLUMNS,
        View::RegistrationStatus if value.get("subscribers").is_some_and(Value::is_array) => {
            return status_table(value);
        }
        View::Runs if is_list(value) => return crate::runs::table(value),
        View::Rollout if value.get("waves").is_some_and(Value::is_array) => return crate::rollout::table(value),
        View::RegistrationStatus | View::Runs | View::Rollout | View::Generic => return generic_table(value),
    };
    let rows = rows_of(value);
    if rows.is_empty() {
        return String::new();
    }
    let headers = columns.iter().map(|(header, _)| header.to_string()).collect();
    let cells = rows.iter().map(|row| columns.iter().map(|(_, key)| cell(row.get(key))).collect()).collect();
    layout(headers, cells)
}

/// A registration's status: one row per subscriber, then `synced/total`.
fn status_table(status: &Value) -> String {
    let subscribers: Vec<&Value> = status["subscribers"].as_array().map(|s| s.iter().collect()).unwrap_or_default();
    let mut text = if subscribers.is_empty() {
        "no subscribers\n".to_string()
    } else {
        let headers = SUBSCRIBER_COLUMNS.iter().map(|(header, _)| header.to_string()).collect();
        let cells = subscribers
            .iter()
            .map(|row| SUBSCRIBER_COLUMNS.iter().map(|(_, key)| cell(row.get(key))).collect())
            .collect();
        layout(headers, cells)
    };
    let count = |key: &str| status.get(key).map_or_else(|| "?".to_string(), |v| cell(Some(v)));
    let _ = writeln!(
        text,
        "{}/{} synced to {} ({})",
        count("synced"),
        count("total"),
        cell(status.get("sync_id")),
        cell(status.get("api"))
    );
    text
}

/// Any other answer: identifying fields (NAME, ID, …) first, then scalar
/// fields.
fn generic_table(value: &Value) -> String {
    let rows = rows_of(value);
    if rows.is_empty() {
        return String::new();
    }
    if !rows.iter().all(|row| row.is_object()) {
        let cells = rows.iter().map(|row| vec![cell(Some(row))]).collect();
        return layout(vec!["VALUE".to_string()], cells);
    }
    // Identity first; the rest in key order (which is all a JSON map keeps).
    let mut keys: Vec<&str> =
        IDENTITY_KEYS.into_iter().filter(|key| rows.iter().any(|row| row.get(key).is_some_and(is_tabular))).collect();
    for row in &rows {
        for (key, field) in row.as_object().into_iter().flatten() {
            if keys.len() < MAX_GENERIC_COLUMNS && is_tabular(field) && !keys.contains(&key.as_str()) {
                keys.push(key);
            }
        }
    }
    if keys.is_empty() {
        let cells = rows.iter().map(|row| vec![cell(Some(row))]).collect();
        return layout(vec!["VALUE".to_string()], cells);
    }
    let headers = keys.iter().map(|key| escape_controls(&key.replace('_', " ").to_uppercase())).collect();
    let cells = rows.iter().map(|row| keys.iter().map(|key| cell(row.get(*key))).collect()).collect();
    layout(headers, cells)
}

/// A field worth a column: a scalar, or a list of scalars.
fn is_tabular(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.iter().all(|item| !item.is_array() && !item.is_object()),
        Value::Object(_) => false,
        _ => true,
    }
}

/// `value` as JSON, indented or on one line, ending with a newline.
/// serde_json escapes C0 controls in strings but leaves DEL and C1 (8-bit
/// CSI, OSC, ...) raw; outside strings there are none but the indenting
/// line breaks. So escaping the rendered text leaves valid JSON that
/// decodes to the same value.
pub(crate) fn json(value: &Value, pretty: bool) -> Result<String, Error> {
    let text = if pretty { serde_json::to_string_pretty(value) } else { serde_json::to_string(value) };
    let text = text.map_err(|e| invalid(format!("render JSON: {e}")))?;
    let mut text = escape(&text, &['\n'], Escaped::Json);
    text.push('\n');
    Ok(text)
}

/// `value` as a YAML document. The emitter writes any string holding a
/// character YAML calls non-printable (C0 but the line feed, DEL, C1) in
/// double quotes, every such character escaped, so it decodes to the same
/// value; [`escape`] then finds nothing to do. It runs all the same, so no
/// control character could reach the terminal raw even if the emitter
/// changed.
fn yaml(value: &Value) -> Result<String, Error> {
    let text = serde_norway::to_string(value).map_err(|e| invalid(format!("render YAML: {e}")))?;
    Ok(escape(&text, &['\n'], Escaped::Json))
}

/// Writes to stdout. A reader that went away (`| head`) is not an error
/// worth a message: [`Error::StdoutClosed`] ends the command quietly.
pub(crate) fn emit(bytes: &[u8]) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Error::StdoutClosed),
        Err(e) => Err(invalid(format!("write to stdout: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::escape_raw;
    use serde_json::json;

    fn sub(api: &str, active: bool, state: &str, current: &str, expected: &str) -> Value {
        json!({"api": api, "namespace": "core", "active": active, "state": state,
               "current_sync_id": current, "expected_sync_id": expected,
               "synced": active && current == expected})
    }

    #[test]
    fn subscription_list() {
        let list = json!({"items": [
            sub("compute.example.com", true, "success", "2026-02-01T00Z", "2026-02-01T00Z"),
            sub("dev.example.com", false, "init", "", "2026-01-01T00Z"),
        ], "continue": ""});
        assert_eq!(
            table(&list, View::Subscriptions),
            "\
API                   ACTIVE   STATE     CURRENT          EXPECTED         SYNCED
compute.example.com   true     success   2026-02-01T00Z   2026-02-01T00Z   true
dev.example.com       false    init      <none>           2026-01-01T00Z   false
"
        );
    }

    #[test]
    fn single_subscription_is_one_row() {
        let one = sub("compute.example.com", true, "error", "a", "b");
        let text = table(&one, View::Subscriptions);
        assert_eq!(text.lines().count(), 2);
        assert_eq!(text.lines().nth(1).unwrap(), "compute.example.com   true     error   a         b          false");
    }

    #[test]
    fn registrations() {
        let list = json!({"items": [
            {"name": "compute.example.com", "short_name": "compute", "mode": "api", "sync_id": "2026-02-01T00Z",
             "endpoint": "http://127.0.0.1:9000", "description": "", "platform": "dev", "region": "local"},
            {"name": "dev.example.com", "short_name": "", "mode": "", "sync_id": "x",
             "endpoint": "", "description": "", "platform": "dev", "region": "local"},
        ], "continue": ""});
        assert_eq!(
            table(&list, View::Registrations),
            "\
NAME                  SHORT     MODE     SYNC ID
compute.example.com   compute   api      2026-02-01T00Z
dev.example.com       <none>    <none>   x
"
        );
    }

    #[test]
    fn hostile_strings_cannot_drive_the_terminal() {
        let evil = "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m\u{7f}";
        let list = json!({"items": [{"name": evil, "description": evil, "active": true, evil: evil}], "continue": ""});
        for view in [View::Namespaces, View::Generic] {
            let text = table(&list, view);
            assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        }
        for format in [Format::Json, Format::Yaml] {
            let text = render(&list, View::Generic, format).unwrap();
            assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{format:?}: {text:?}");
            let back: Value = if format == Format::Json {
                serde_json::from_str(&text).unwrap()
            } else {
                serde_norway::from_str(&text).unwrap()
            };
            assert_eq!(back, list, "{format:?} still round-trips");
        }
        let raw = escape_raw(b"line 1\n\x1b[2Jline 2\tend\r\n\xff");
        let raw = String::from_utf8(raw).unwrap();
        assert!(!raw.chars().any(|c| c.is_control() && c != '\n' && c != '\t'), "{raw:?}");
        assert!(raw.starts_with("line 1\n\\u{1b}[2Jline 2\tend"), "{raw:?}");
    }

    #[test]
    fn escape_forms() {
        let text = "a\nb\tc\u{1b}[31m\u{7}\u{7f}\u{85}\u{9b}\u{9f}\u{a0}ü";
        assert_eq!(escape_controls(text), "a\\nb\\tc\\u{1b}[31m\\u{7}\\u{7f}\\u{85}\\u{9b}\\u{9f}\u{a0}ü");
        assert_eq!(
            escape(text, &['\n'], Escaped::Json),
            "a\nb\\u0009c\\u001b[31m\\u0007\\u007f\\u0085\\u009b\\u009f\u{a0}ü"
        );
        assert_eq!(String::from_utf8(escape_raw(text.as_bytes())).unwrap().lines().count(), 2);
    }

    /// Any string, however hostile, as a cell, a key, a raw body, and in
    /// every format `get` and `get --watch` print: no control character
    /// but the format's own line breaks, and JSON and YAML decode to the
    /// very same value.
    #[test]
    fn no_string_reaches_the_terminal_raw() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

        let character = prop_oneof![any::<char>(), proptest::char::range('\0', '\u{a0}')];
        let text = proptest::collection::vec(character, 0..24).prop_map(String::from_iter);
        let config = Config { cases: 512, failure_persistence: None, max_shrink_iters: 500, ..Config::default() };
        let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[0x1b; 32]));
        let raw = |text: &str| text.chars().find(|&c| c.is_control() && c != '\n');
        let result = runner.run(&text, |s| {
            let escaped = escape_controls(&s);
            prop_assert!(!escaped.chars().any(char::is_control), "{:?} escaped to {:?}", s, escaped);
            let body = String::from_utf8(escape_raw(s.as_bytes())).unwrap();
            prop_assert!(!body.chars().any(|c| c.is_control() && c != '\n' && c != '\t'), "{:?}", body);

            let object = serde_json::json!({"name": s, "active": true, "description": s, s.clone(): s});
            let list = serde_json::json!({"items": [object.clone()], "continue": ""});
            let event = serde_json::json!({"type": "ADDED", "object": object});
            let line = serde_json::to_string(&event).unwrap();
            for view in [View::Namespaces, View::Generic] {
                let text = table(&list, view);
                prop_assert_eq!(raw(&text), None, "{:?}", text);
                prop_assert_eq!(text.lines().count(), 2, "{:?}", text);
                let row = crate::watch::Printer::new(Format::Table, view).event(&line).unwrap();
                prop_assert_eq!(raw(&row), None, "{:?}", row);
                prop_assert_eq!(row.lines().count(), 2, "{:?}", row);
            }
            for format in [Format::Json, Format::Yaml] {
                let printed = [
                    (render(&list, View::Namespaces, format).unwrap(), &list),
                    (render(&object, View::Namespaces, format).unwrap(), &object),
                    (crate::watch::Printer::new(format, View::Namespaces).event(&line).unwrap(), &event),
                ];
                for (text, value) in printed {
                    prop_assert_eq!(raw(&text), None, "{:?}: {:?}", format, text);
                    let back: Value = match format {
                        Format::Json => serde_json::from_str(&text).unwrap(),
                        _ => serde_norway::from_str(&text).unwrap(),
                    };
                    prop_assert_eq!(&back, value, "{:?}: {:?}", format, text);
                }
            }
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }

    #[test]
    fn namespaces() {
        let list = json!({"items": [
            {"name": "core", "description": "the core\nteam", "active": true},
            {"name": "sre", "description": "", "active": false},
        ], "continue": ""});
        assert_eq!(
            table(&list, View::Namespaces),
            "\
NAME   ACTIVE   DESCRIPTION
core   true     the core\\nteam
sre    false    <none>
"
        );
    }

    #[test]
    fn registration_status() {
        let status = json!({"api": "compute.example.com", "sync_id": "2026-02-01T00Z",
            "subscribers": [
                {"namespace": "core", "active": true, "state": "success", "current_sync_id": "2026-01-01T00Z", "synced": false},
                {"namespace": "sre", "active": true, "state": "success", "current_sync_id": "2026-02-01T00Z", "synced": true},
            ], "total": 2, "synced": 1});
        assert_eq!(
            table(&status, View::RegistrationStatus),
            "\
NAMESPACE   ACTIVE   STATE     CURRENT          SYNCED
core        true     success   2026-01-01T00Z   false
sre         true     success   2026-02-01T00Z   true
1/2 synced to 2026-02-01T00Z (compute.example.com)
"
        );
        let none = json!({"api": "a.b", "sync_id": "1", "subscribers": [], "total": 0, "synced": 0});
        assert_eq!(table(&none, View::RegistrationStatus), "no subscribers\n0/0 synced to 1 (a.b)\n");
    }

    #[test]
    fn generic_puts_name_first_and_keeps_scalars() {
        let roles = json!({"items": [
            {"rules": [{"resources": ["*"]}], "name": "sysadmin", "description": "all"},
        ], "continue": ""});
        assert_eq!(table(&roles, View::Generic), "NAME       DESCRIPTION\nsysadmin   all\n");

        let tokens = json!({"items": [{"id": "t1", "created_at": "2026-01-01T00:00:00Z"}], "continue": ""});
        assert_eq!(table(&tokens, View::Generic), "ID   CREATED AT\nt1   2026-01-01T00:00:00Z\n");

        let whoami = json!({"user": "admin", "cluster_roles": ["sysadmin", "viewer"]});
        assert_eq!(table(&whoami, View::Generic), "USER    CLUSTER ROLES\nadmin   sysadmin,viewer\n");
    }

    #[test]
    fn generic_caps_columns_and_handles_odd_shapes() {
        let wide = json!({"name": "x", "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7});
        assert_eq!(table(&wide, View::Generic).lines().next().unwrap(), "NAME   A   B   C   D   E");
        let scalars = json!({"items": ["a", 1], "continue": ""});
        assert_eq!(table(&scalars, View::Generic), "VALUE\na\n1\n");
        let nested = json!({"spec": {"x": 1}});
        assert_eq!(table(&nested, View::Generic), "VALUE\n{\"spec\":{\"x\":1}}\n");
    }

    #[test]
    fn empty_lists_render_nothing() {
        let empty = json!({"items": [], "continue": ""});
        for view in [View::Subscriptions, View::Registrations, View::Namespaces, View::Generic] {
            assert_eq!(table(&empty, view), "");
        }
    }

    #[test]
    fn json_and_yaml_parse_back() {
        let value = json!({"items": [sub("a.b", true, "success", "1", "1")], "continue": ""});
        let json = render(&value, View::Subscriptions, Format::Json).unwrap();
        assert!(json.ends_with('\n'));
        assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), value);
        let yaml = render(&value, View::Subscriptions, Format::Yaml).unwrap();
        assert_eq!(serde_norway::from_str::<Value>(&yaml).unwrap(), value);
    }

    #[test]
    fn unicode_cells_align() {
        let list = json!({"items": [{"name": "ä", "description": "x"}, {"name": "bb", "description": "y"}]});
        assert_eq!(table(&list, View::Generic), "NAME   DESCRIPTION\nä      x\nbb     y\n");
    }
}
