//! Name validation (platform contract §4 "Names").

use thiserror::Error;

/// Why a name was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The name is empty.
    #[error("{kind} name must not be empty")]
    Empty { kind: &'static str },
    /// The name is longer than its kind allows.
    #[error("{kind} name {name:?} is longer than {max} characters")]
    TooLong { kind: &'static str, name: String, max: usize },
    /// The name has a character or shape its kind does not allow.
    #[error("{kind} name {name:?} is invalid: {rule}")]
    Invalid { kind: &'static str, name: String, rule: &'static str },
}

const LABEL_RULE: &str =
    "must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit";
const SUBDOMAIN_RULE: &str = "must be a DNS subdomain with at least one dot: dot-separated DNS labels";

/// Whether `s` is a DNS label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63.
pub fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Validates a DNS label name (namespaces, users, roles, bindings, short names).
pub fn validate_label(kind: &'static str, name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::Empty { kind });
    }
    if name.chars().count() > 63 {
        return Err(Error::TooLong { kind, name: truncate(name), max: 63 });
    }
    if !is_label(name) {
        return Err(Error::Invalid { kind, name: truncate(name), rule: LABEL_RULE });
    }
    Ok(())
}

/// Validates an API registration's long name: a DNS subdomain with a dot.
pub fn validate_subdomain(kind: &'static str, name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::Empty { kind });
    }
    if name.chars().count() > 253 {
        return Err(Error::TooLong { kind, name: truncate(name), max: 253 });
    }
    if !name.contains('.') || !name.split('.').all(is_label) {
        return Err(Error::Invalid { kind, name: truncate(name), rule: SUBDOMAIN_RULE });
    }
    Ok(())
}

/// Whether `name` has the shape of a long API name (a subdomain with a dot).
pub fn is_subdomain(name: &str) -> bool {
    validate_subdomain("api", name).is_ok()
}

/// Keeps hostile names from blowing up an error message.
fn truncate(name: &str) -> String {
    if name.chars().count() <= 80 {
        name.to_string()
    } else {
        let mut s: String = name.chars().take(80).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["a", "core", "a-b", "0", "x1", &"a".repeat(63)] {
            assert!(validate_label("namespace", ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "..", "ü", &"a".repeat(64), "a b"] {
            assert!(validate_label("namespace", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subdomains() {
        for ok in ["compute.example.com", "a.b", "x-1.y"] {
            assert!(validate_subdomain("api", ok).is_ok(), "{ok}");
        }
        let long = format!("{}.com", "a".repeat(300));
        for bad in ["compute", "", ".a", "a..b", "a.", "A.b", "ü.com", long.as_str()] {
            assert!(validate_subdomain("api", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn long_names_are_truncated_in_messages() {
        let err = validate_label("namespace", &"ä".repeat(300)).unwrap_err();
        assert!(err.to_string().len() < 400);
    }
}
