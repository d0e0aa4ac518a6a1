//! `-d DATA`: the request body, as JSON or YAML, inline, `@FILE` or `@-`.
//!
//! Whatever the input, the body sent is JSON (the API speaks only JSON). A
//! document starting with `{` or `[` is JSON; anything else is YAML (of
//! which JSON is nearly a subset, but a lenient YAML reading of broken JSON
//! would send something other than what was meant).
//! The document must be an object or an array: a bare scalar is always a
//! mistake (typically a YAML reading of a JSON typo), so it is refused
//! rather than sent.

use std::io::Read;

use kayra_core::json_kind;
use serde_json::Value;

use crate::error::{Error, invalid};

/// Resolves `@FILE` / `@-` and parses the document. `stdin` is read only
/// for `@-`.
pub fn load(spec: &str, stdin: impl Read) -> Result<Value, Error> {
    let (text, origin) = match spec.strip_prefix('@') {
        Some("-") => (read_all(stdin).map_err(|e| invalid(format!("-d @-: read stdin: {e}")))?, "stdin".to_string()),
        Some(path) if !path.is_empty() => {
            let text = std::fs::read(path).map_err(|e| invalid(format!("-d @{path}: {e}")))?;
            let text = String::from_utf8(text).map_err(|_| invalid(format!("-d @{path}: not UTF-8 text")))?;
            (text, path.to_string())
        }
        Some(_) => return Err(invalid("-d @: a file name must follow @ (or @- for stdin)")),
        None => (spec.to_string(), "-d".to_string()),
    };
    parse(&text).map_err(|e| invalid(format!("{origin}: {e}")))
}

fn read_all(mut reader: impl Read) -> std::io::Result<String> {
    let mut text = String::new();
    reader.read_to_string(&mut text)?;
    Ok(text)
}

/// Parses a JSON or YAML document into the JSON value to send.
pub fn parse(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Err("empty document: expected a JSON or YAML object".into());
    }
    // A document that starts like JSON must be JSON: YAML would read a
    // JSON typo such as `{"api": }` as `{api: null}` and send it.
    let value = if text.trim_start().starts_with(['{', '[']) {
        serde_json::from_str::<Value>(text).map_err(|e| format!("invalid JSON: {e}"))?
    } else {
        serde_norway::from_str::<Value>(text).map_err(|e| format!("invalid YAML: {e}"))?
    };
    match value {
        Value::Object(_) | Value::Array(_) => Ok(value),
        Value::Null => Err("empty document: expected a JSON or YAML object".into()),
        other => Err(format!("expected a JSON or YAML object, got {}", json_kind(&other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn no_stdin() -> &'static [u8] {
        b""
    }

    #[test]
    fn inline_json() {
        assert_eq!(load(r#"{"api": "compute.example.com"}"#, no_stdin()), Ok(json!({"api": "compute.example.com"})));
        assert_eq!(load("{}", no_stdin()), Ok(json!({})));
    }

    #[test]
    fn inline_yaml_becomes_json() {
        let yaml = "name: compute.example.com\nshort_name: compute\nrules:\n  - resources: ['*']\n    verbs: [get]\n";
        assert_eq!(
            load(yaml, no_stdin()),
            Ok(json!({"name": "compute.example.com", "short_name": "compute",
                      "rules": [{"resources": ["*"], "verbs": ["get"]}]}))
        );
        // Starts like JSON, so it must be JSON.
        assert!(load("{api: dev.example.com}", no_stdin()).is_err());
    }

    #[test]
    fn yaml_scalars_keep_their_types() {
        assert_eq!(parse("a: 1\nb: true\nc: '1'\nd: null"), Ok(json!({"a": 1, "b": true, "c": "1", "d": null})));
    }

    #[test]
    fn at_file() {
        let dir = tempfile::tempdir().unwrap();
        let json_path = dir.path().join("sub.json");
        std::fs::write(&json_path, r#"{"api": "compute.example.com"}"#).unwrap();
        let yaml_path = dir.path().join("ns.yaml");
        std::fs::write(&yaml_path, "name: core\ndescription: the core team\n").unwrap();

        assert_eq!(load(&format!("@{}", json_path.display()), no_stdin()), Ok(json!({"api": "compute.example.com"})));
        assert_eq!(
            load(&format!("@{}", yaml_path.display()), no_stdin()),
            Ok(json!({"name": "core", "description": "the core team"}))
        );
    }

    #[test]
    fn at_missing_file_names_it() {
        let err = load("@/nonexistent/kayra.json", no_stdin()).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/kayra.json"), "{err}");
        assert_eq!(err.exit_code(), 1);
        assert!(load("@", no_stdin()).is_err());
    }

    #[test]
    fn at_dash_reads_stdin() {
        assert_eq!(load("@-", &br#"{"api": "a.b"}"#[..]), Ok(json!({"api": "a.b"})));
        assert_eq!(load("@-", &b"api: a.b\n"[..]), Ok(json!({"api": "a.b"})));
        // stdin is not touched unless asked for.
        assert_eq!(load("{}", &b"not: read"[..]), Ok(json!({})));
    }

    #[test]
    fn bad_documents_are_refused_with_the_reason() {
        let err = parse(r#"{"api": }"#).unwrap_err();
        assert!(err.starts_with("invalid JSON"), "{err}");
        assert!(parse("").is_err());
        assert!(parse("   \n").is_err());
        assert!(parse("~").is_err());
        assert_eq!(parse("just words").unwrap_err(), "expected a JSON or YAML object, got a string");
        assert_eq!(parse("42").unwrap_err(), "expected a JSON or YAML object, got a number");
        assert!(parse("a: [").unwrap_err().starts_with("invalid YAML"));
        assert!(parse("[1,").unwrap_err().starts_with("invalid JSON"));
    }

    #[test]
    fn arrays_pass() {
        assert_eq!(parse("[1, 2]"), Ok(json!([1, 2])));
        assert_eq!(parse("- a\n- b\n"), Ok(json!(["a", "b"])));
    }

    #[test]
    fn origin_is_named_in_errors() {
        let err = load("@-", &b"{oops"[..]).unwrap_err();
        assert!(err.to_string().starts_with("error: stdin: "), "{err}");
    }
}
