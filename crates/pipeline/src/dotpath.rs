//! Dot paths into a JSON response body: `.status`, `.pipeline.id`,
//! `.items[0].id` (seed, "outputs" and "wait").
//!
//! Deliberately not JSONPath: a path is a chain of object fields and array
//! indices, nothing else, so it can be parsed once at startup and resolving
//! it can never fail, only miss. `.` alone is the whole body.

use std::fmt;

use serde_json::Value;

/// One hop of a [`DotPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// `.name`: a field of an object.
    Field(String),
    /// `[n]`: an element of an array.
    Index(usize),
}

/// A parsed dot path; [`DotPath::resolve`] walks it through a JSON value.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct DotPath {
    source: String,
    segments: Vec<Segment>,
}

impl DotPath {
    /// Parses `path`; the error says what is wrong with it, for a
    /// startup message that already names the config key.
    pub(crate) fn parse(path: &str) -> Result<Self, String> {
        let invalid = |why: &str| format!("invalid dot path {path:?}: {why}");
        let Some(mut rest) = path.strip_prefix('.') else {
            return Err(invalid("must start with '.'"));
        };
        let mut segments = Vec::new();
        // `.` alone and `.[0]` address the body itself; everywhere else a
        // `.` must be followed by a field name.
        let mut expect_field = !rest.is_empty() && !rest.starts_with('[');
        while !rest.is_empty() || expect_field {
            if expect_field {
                let end = rest.find(['.', '[', ']']).unwrap_or(rest.len());
                if end == 0 {
                    return Err(invalid("empty field name"));
                }
                segments.push(Segment::Field(rest[..end].to_string()));
                rest = &rest[end..];
                expect_field = false;
            } else if let Some(after) = rest.strip_prefix('.') {
                rest = after;
                expect_field = true;
            } else if let Some(after) = rest.strip_prefix('[') {
                let close = after.find(']').ok_or_else(|| invalid("unclosed '['"))?;
                let digits = &after[..close];
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid("an index must be a non-negative integer"));
                }
                let index = digits.parse().map_err(|_| invalid("index out of range"))?;
                segments.push(Segment::Index(index));
                rest = &after[close + 1..];
            } else {
                return Err(invalid("expected '.' or '[' after a field or index"));
            }
        }
        Ok(Self { source: path.to_string(), segments })
    }

    /// The value at this path, or `None` when any hop misses (absent field,
    /// index past the end, or a hop into the wrong kind of value).
    pub(crate) fn resolve<'a>(&self, root: &'a Value) -> Option<&'a Value> {
        self.segments.iter().try_fold(root, |value, segment| match segment {
            Segment::Field(name) => value.as_object()?.get(name),
            Segment::Index(index) => value.as_array()?.get(*index),
        })
    }

    /// [`Self::resolve`], rendered with [`value_text`].
    pub(crate) fn resolve_text(&self, root: &Value) -> Option<String> {
        self.resolve(root).map(value_text)
    }
}

impl fmt::Debug for DotPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl fmt::Display for DotPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// How a JSON value reads as a string, for outputs and for `wait`'s
/// comparisons: a string is itself (no quotes), anything else its compact
/// JSON text (`42`, `true`, `null`, `{"a":1}`).
pub(crate) fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at(path: &str, body: &Value) -> Option<String> {
        DotPath::parse(path).expect("valid path").resolve_text(body)
    }

    #[test]
    fn fields_and_indices_resolve() {
        let body = json!({
            "id": 42,
            "status": "running",
            "pipeline": {"web_url": "https://x/p/1", "ok": true},
            "items": [{"id": "a"}, {"id": "b", "tags": [[1, 2], [3]]}],
        });
        assert_eq!(at(".status", &body).as_deref(), Some("running"));
        assert_eq!(at(".id", &body).as_deref(), Some("42"));
        assert_eq!(at(".pipeline.ok", &body).as_deref(), Some("true"));
        assert_eq!(at(".pipeline.web_url", &body).as_deref(), Some("https://x/p/1"));
        assert_eq!(at(".items[1].id", &body).as_deref(), Some("b"));
        assert_eq!(at(".items[1].tags[0][1]", &body).as_deref(), Some("2"));
        assert_eq!(at(".pipeline", &body).as_deref(), Some(r#"{"ok":true,"web_url":"https://x/p/1"}"#));
    }

    #[test]
    fn misses_are_none_not_errors() {
        let body = json!({"items": [{"id": "a"}], "n": null, "s": "x"});
        assert_eq!(at(".missing", &body), None);
        assert_eq!(at(".items[5].id", &body), None);
        assert_eq!(at(".items.id", &body), None, "a field of an array");
        assert_eq!(at(".s[0]", &body), None, "an index into a string");
        assert_eq!(at(".s.len", &body), None);
        assert_eq!(at(".n", &body).as_deref(), Some("null"), "null resolves");
    }

    #[test]
    fn root_paths() {
        assert_eq!(at(".", &json!("done")).as_deref(), Some("done"));
        assert_eq!(at(".[1]", &json!([1, 2])).as_deref(), Some("2"));
        assert_eq!(at(".[0].id", &json!([{"id": 7}])).as_deref(), Some("7"));
    }

    #[test]
    fn malformed_paths_are_refused() {
        for bad in ["", "status", ".a..b", ".a.", ".a[", ".a[x]", ".a[-1]", ".a[]", ".a]b", ".a[0]b", "..a"] {
            let err = DotPath::parse(bad).expect_err(bad);
            assert!(err.contains("invalid dot path"), "{bad}: {err}");
        }
    }
}
