//! Audit records: who changed what in the catalog, when and why (platform §13).
//!
//! Written by `kayra serve` in the same store transaction as the change it
//! records; read by the catalog API (`/audit`), the CLI and the console.

use serde::{Deserialize, Serialize};

/// The longest `X-Kayra-Reason` accepted, in characters.
pub const MAX_REASON_CHARS: usize = 1024;

/// The header that carries a change's reason.
pub const REASON_HEADER: &str = "X-Kayra-Reason";

/// Every RBAC resource of the catalog API (platform §5, §12, §13): what
/// `audit.require_reason` may name.
pub const CATALOG_RESOURCES: &[&str] = &[
    "namespaces",
    "apiregistrations",
    "apiregistrations/sync",
    "apiregistrations/status",
    "apiregistrations/rollout",
    "subscriptions",
    "subscriptions/sync",
    "subscriptions/runs",
    "subscriptions/cancel",
    "users",
    "users/tokens",
    "roles",
    "clusterrolebindings",
    "rolebindings",
    "audit",
    "notifications",
    "notifications/retry",
];

/// One successful catalog change.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AuditRecord {
    /// Unique and time-ordered (a UUIDv7).
    pub id: String,
    /// RFC 3339 UTC with milliseconds: when the change was made.
    pub time: String,
    /// The authenticated caller.
    pub user: String,
    /// The RBAC verb of the route (`create`, `update`, `patch`, `delete`).
    pub verb: String,
    /// The RBAC resource of the route (`apiregistrations/sync`, …).
    pub resource: String,
    /// The namespace in the path; empty for a cluster-scoped resource.
    pub namespace: String,
    /// The object's name (a token's id for `users/tokens`).
    pub name: String,
    /// The status the route answered.
    pub code: u16,
    /// The request's `X-Kayra-Reason`; empty when none was given.
    pub reason: String,
    pub request_id: String,
    /// The caller's address (see `server.trusted_proxies`).
    pub source: String,
    /// The object as a GET showed it before the change; `null` when it did not exist.
    #[cfg_attr(feature = "openapi", schema(value_type = Object, nullable))]
    pub before: serde_json::Value,
    /// The object as a GET shows it after the change; `null` when it no longer exists.
    #[cfg_attr(feature = "openapi", schema(value_type = Object, nullable))]
    pub after: serde_json::Value,
}

/// Why an `X-Kayra-Reason` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidReason {
    #[error("header {REASON_HEADER} is {0} characters long, at most {MAX_REASON_CHARS} are allowed")]
    TooLong(usize),
    #[error("header {REASON_HEADER} must not contain control characters")]
    ControlCharacter,
    #[error("header {REASON_HEADER} must be UTF-8 text")]
    NotText,
}

/// Checks a reason: at most [`MAX_REASON_CHARS`] characters, none of them a
/// control character (C0, DEL, C1).
pub fn validate_reason(reason: &str) -> Result<(), InvalidReason> {
    let count = reason.chars().count();
    if count > MAX_REASON_CHARS {
        return Err(InvalidReason::TooLong(count));
    }
    if reason.chars().any(char::is_control) {
        return Err(InvalidReason::ControlCharacter);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_bounded_text() {
        assert_eq!(validate_reason(""), Ok(()));
        assert_eq!(validate_reason("roll out the v2 pipeline ✓"), Ok(()));
        assert_eq!(validate_reason(&"é".repeat(MAX_REASON_CHARS)), Ok(()));
        assert_eq!(validate_reason(&"a".repeat(MAX_REASON_CHARS + 1)), Err(InvalidReason::TooLong(1025)));
        for bad in ["a\nb", "tab\there", "\u{7f}", "\u{85}", "\u{1b}[31m"] {
            assert_eq!(validate_reason(bad), Err(InvalidReason::ControlCharacter), "{bad:?}");
        }
    }
}
