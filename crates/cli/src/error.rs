//! The one error type of the CLI, and the exit status each kind maps to.
//!
//! Exit statuses are part of the contract (platform §9): 1 when the request
//! was refused (a 4xx answer, or arguments that cannot make a request at
//! all), 2 when the server failed or could not be reached. `--until-synced`
//! giving up is 3, so a script can tell "not converged yet" from "broken";
//! `--wait` seeing the registration's rollout pause or abort is 4.

use std::fmt;

/// Why a command failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The arguments, `-d` data or local configuration cannot make a request.
    Invalid(String),
    /// The server answered with an error status.
    Api {
        /// The HTTP status code.
        status: u16,
        /// The error's `reason` (e.g. `NotFound`), empty when the body had none.
        reason: String,
        /// The error's `message`, or the body's text when it was not the
        /// kayra error shape (a backend's answer through the gateway).
        message: String,
    },
    /// No usable answer: connection refused, TLS, a reset, a body cut short.
    Transport(String),
    /// Arguments refused because sending them would be unsafe: a `.`/`..`
    /// path segment, a server URL with user info (§9: exit 2).
    Unsafe(String),
    /// `--until-synced` reached `--timeout` before everything was synced.
    NotSynced(String),
    /// `--wait`: the registration's rollout paused or aborted (§12: exit 4).
    Halted(String),
    /// Whoever read stdout went away (`| head`). Not a failure: it ends the
    /// command quietly with status 0.
    StdoutClosed,
}

impl Error {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Invalid(_) => 1,
            Error::Api { status, .. } if (400..500).contains(status) => 1,
            Error::Api { .. } | Error::Transport(_) | Error::Unsafe(_) => 2,
            Error::NotSynced(_) => 3,
            Error::Halted(_) => 4,
            Error::StdoutClosed => 0,
        }
    }

    /// Whether retrying the same request later may succeed (5xx, transport).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Api { .. } | Error::Transport(_)) && self.exit_code() == 2
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(message)
            | Error::Transport(message)
            | Error::NotSynced(message)
            | Error::Halted(message)
            | Error::Unsafe(message) => {
                write!(f, "error: {message}")
            }
            Error::StdoutClosed => Ok(()),
            Error::Api { status, reason, message } => {
                let reason = if reason.is_empty() { format!("HTTP {status}") } else { reason.clone() };
                if message.is_empty() {
                    write!(f, "Error from server ({reason})")
                } else {
                    write!(f, "Error from server ({reason}): {message}")
                }
            }
        }
    }
}

impl std::error::Error for Error {}

/// Shorthand for [`Error::Invalid`].
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::Invalid(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16) -> Error {
        Error::Api { status, reason: "X".into(), message: "m".into() }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(invalid("x").exit_code(), 1);
        assert_eq!(api(400).exit_code(), 1);
        assert_eq!(api(404).exit_code(), 1);
        assert_eq!(api(499).exit_code(), 1);
        assert_eq!(api(500).exit_code(), 2);
        assert_eq!(api(503).exit_code(), 2);
        assert_eq!(api(302).exit_code(), 2);
        assert_eq!(Error::Transport("refused".into()).exit_code(), 2);
        assert_eq!(Error::NotSynced("late".into()).exit_code(), 3);
        assert!(api(502).is_transient() && !api(409).is_transient());
    }

    #[test]
    fn server_message_is_shown_with_its_reason() {
        let err = Error::Api { status: 404, reason: "NotFound".into(), message: "namespace \"x\" not found".into() };
        assert_eq!(err.to_string(), "Error from server (NotFound): namespace \"x\" not found");
        let bare = Error::Api { status: 502, reason: String::new(), message: String::new() };
        assert_eq!(bare.to_string(), "Error from server (HTTP 502)");
    }
}
