//! kayra's resource types and the rules every value must satisfy.
//!
//! Everything here is plain data: no I/O, no async. The server, the
//! reconciler and the CLI share these types, so a field name is spelled in
//! exactly one place.
//!
//! # Layout
//! - [`resources`]: the stored records (namespaces, API registrations,
//!   subscriptions, users, tokens, roles, bindings) and their wire forms.
//! - [`audit`]: audit records (platform §13) and the reason header's rules.
//! - [`notifications`]: events and their delivery records (§14).
//! - [`runs`]: run records (§4.4), [`run_codec`] their compact stored form
//!   and [`run_ring`] the one record that holds a subscription's (§16).
//! - [`labels`]: namespace labels and label selectors (§4.1).
//! - [`names`]: DNS label / subdomain validation of resource names.
//! - [`validation`]: path segments, `sync_id`, endpoints, reserved names,
//!   URL user info: values that reach backends, URLs and log lines.

pub mod audit;
pub mod labels;
pub mod names;
pub mod notifications;
pub mod resources;
pub mod rollout;
pub mod run_codec;
pub mod run_ring;
pub mod runs;
pub mod validation;

pub use audit::AuditRecord;
pub use resources::*;
pub use runs::{Run, RunResult, RunStep, RunTrigger};

/// The API group of kayra's own catalog API.
pub const CATALOG_API: &str = "catalog.example.com";

/// What kind of JSON value `value` is, as an error message names it
/// ("expected an object, got an array").
pub fn json_kind(value: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
