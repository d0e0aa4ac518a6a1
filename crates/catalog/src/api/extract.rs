//! Request extractors that answer in the contract's error shape.
//!
//! axum's own `Json`, `Path` and `Query` reject with plain-text bodies and
//! status codes of their choosing (415, 422). The contract wants every
//! refusal as `{code, reason, message}`: a body that is not JSON, not an
//! object, has an unknown field, a wrong type or a computed field is a 400
//! naming the problem; one larger than `server.max_body_bytes` is a 413.
//!
//! Bodies are parsed in two steps — bytes → `serde_json::Value` → the typed
//! body — so computed fields can be refused by name before serde would
//! report them as merely "unknown", and so PATCH can merge into a JSON
//! object before the typed parse (RFC 7386).

use std::fmt;
use std::time::Duration;

use axum::body::BodyDataStream;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_LENGTH;
use axum::http::request::Parts;
use futures::StreamExt;
use kayra_core::json_kind;
use serde::de::{self, DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Number, Value};

use super::ApiState;
use super::error::ApiError;

/// A typed JSON request body.
pub trait RequestBody: DeserializeOwned {
    /// Fields only kayra sets. A body naming one is refused with a 400 that
    /// names it, even when the value would not change anything.
    const COMPUTED: &'static [&'static str] = &[];
    /// Whether an empty body stands for `{}` (the `/sync` shorthands).
    const EMPTY_IS_OBJECT: bool = false;
}

/// A JSON body of type `T`, refused in the contract's shape.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: RequestBody> FromRequest<ApiState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, ApiError> {
        let object = read_object(req, state.max_body_bytes, T::EMPTY_IS_OBJECT).await?;
        reject_computed(&object, T::COMPUTED)?;
        parse(object).map(JsonBody)
    }
}

/// A JSON object body, untyped: a merge patch.
#[derive(Debug)]
pub struct JsonObject(pub Map<String, Value>);

impl FromRequest<ApiState> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, ApiError> {
        read_object(req, state.max_body_bytes, false).await.map(JsonObject)
    }
}

/// How much of an oversized body is still read (and discarded) before the
/// 413 is sent, and for how long. A server that answers while the client
/// is still sending, and closes, makes the client see a reset connection
/// instead of the 413; reading the rest first (as nginx's lingering close
/// does) lets an ordinary oversized request get its answer. Beyond these
/// bounds the connection is simply closed.
const DRAIN_BYTES: u64 = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads the body (at most `limit` bytes) and parses it as a JSON object.
async fn read_object(req: Request, limit: usize, empty_is_object: bool) -> Result<Map<String, Value>, ApiError> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let mut stream = req.into_body().into_data_stream();
    if let Some(declared) = declared.filter(|len| *len > limit as u64) {
        if declared - limit as u64 <= DRAIN_BYTES {
            drain(&mut stream).await;
        }
        return Err(ApiError::payload_too_large(limit));
    }
    // Counted while streaming too: a chunked body has no Content-Length.
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ApiError::bad_request("could not read the request body"))?;
        if bytes.len() + chunk.len() > limit {
            drain(&mut stream).await;
            return Err(ApiError::payload_too_large(limit));
        }
        bytes.extend_from_slice(&chunk);
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return if empty_is_object {
            Ok(Map::new())
        } else {
            Err(ApiError::bad_request("request body is empty; expected a JSON object"))
        };
    }
    match serde_json::from_slice::<UniqueKeys>(&bytes).map(|UniqueKeys(value)| value) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => {
            Err(ApiError::bad_request(format!("request body must be a JSON object, not {}", json_kind(&other))))
        }
        Err(e) => Err(ApiError::bad_request(format!("request body is not valid JSON: {e}"))),
    }
}

/// A JSON value none of whose objects names a key twice. serde_json keeps
/// the last of `{"name": "x", "name": "y"}`; another parser (a proxy that
/// checked the body) may keep the first, so such a body is refused rather
/// than read one way here and another way there.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor).map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!("duplicate key {key:?}")));
            }
            let UniqueKeys(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Reads and discards what remains of a body, within the drain bounds.
async fn drain(stream: &mut BodyDataStream) {
    let discard = async {
        let mut total = 0u64;
        while let Some(Ok(chunk)) = stream.next().await {
            total += chunk.len() as u64;
            if total > DRAIN_BYTES {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, discard).await;
}

/// Refuses a body that sets one of `computed`, naming it.
pub fn reject_computed(object: &Map<String, Value>, computed: &[&str]) -> Result<(), ApiError> {
    match computed.iter().find(|field| object.contains_key(**field)) {
        Some(field) => Err(ApiError::bad_request(format!("field {field:?} is computed by kayra and cannot be set"))),
        None => Ok(()),
    }
}

/// Parses an object into `T`, naming the offending field on failure.
pub fn parse<T: DeserializeOwned>(object: Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(object)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::bad_request(format!("invalid request body: field {path:?}: {inner}"))
        }
    })
}

/// Applies `patch` to a record's writable fields (`writable`, a JSON
/// object) and parses the result like a PUT body.
pub fn merged<T: DeserializeOwned>(mut writable: Value, patch: &Value) -> Result<T, ApiError> {
    merge_patch(&mut writable, patch);
    match writable {
        Value::Object(object) => parse(object),
        _ => Err(ApiError::bad_request("a merge patch must be a JSON object")),
    }
}

/// Applies an RFC 7386 JSON merge patch to `target`: `null` removes a
/// member, an object merges recursively, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// `axum::extract::Path`, refusing in the contract's shape.
#[derive(Debug)]
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// `axum::extract::Query`, refusing in the contract's shape.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[test]
    fn a_key_named_twice_is_refused_at_any_depth() {
        let parse = |body: &str| serde_json::from_str::<UniqueKeys>(body).map(|UniqueKeys(value)| value);
        for body in [r#"{"a": 1, "a": 2}"#, r#"{"a": {"b": 1, "b": 1}}"#, r#"[{"c": [{"d": 0, "d": 0}]}]"#] {
            let error = parse(body).expect_err(body).to_string();
            assert!(error.starts_with("duplicate key"), "{body}: {error}");
        }
        // Anything else parses exactly as serde_json's own `Value` does.
        let body = r#"{"a": [1, -2, 3.5, 18446744073709551615, "x", true, null, {}], "b": {"a": 1}, "": 0}"#;
        assert_eq!(parse(body).unwrap(), serde_json::from_str::<Value>(body).unwrap());
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        // The examples of RFC 7386, appendix A.
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "b"}), json!({"b": "c"}), json!({"a": "b", "b": "c"})),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (json!({"a": "b", "b": "c"}), json!({"a": null}), json!({"b": "c"})),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (json!({"a": {"b": "c"}}), json!({"a": {"b": "d", "c": null}}), json!({"a": {"b": "d"}})),
            (json!({"a": [{"b": "c"}]}), json!({"a": [1]}), json!({"a": [1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (json!({"e": null}), json!({"a": 1}), json!({"e": null, "a": 1})),
            (json!([1, 2]), json!({"a": "b", "c": null}), json!({"a": "b"})),
            (json!({}), json!({"a": {"bb": {"ccc": null}}}), json!({"a": {"bb": {}}})),
        ];
        for (mut target, patch, expected) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, expected, "patch {patch}");
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        name: String,
        #[serde(default)]
        count: u32,
    }

    fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn parse_errors_name_the_field() {
        let e = parse::<Body>(object(json!({"name": 3}))).unwrap_err();
        assert!(e.message().contains("\"name\""), "{}", e.message());
        let e = parse::<Body>(object(json!({"name": "x", "bogus": 1}))).unwrap_err();
        assert!(e.message().contains("bogus"), "{}", e.message());
        let e = parse::<Body>(object(json!({}))).unwrap_err();
        assert!(e.message().contains("name"), "{}", e.message());
        assert!(parse::<Body>(object(json!({"name": "x"}))).is_ok());
    }

    #[test]
    fn computed_fields_are_named() {
        let e = reject_computed(&object(json!({"active": false})), &["state", "active"]).unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
        assert!(e.message().contains("\"active\""));
        assert!(reject_computed(&object(json!({"api": "x"})), &["active"]).is_ok());
    }
}
