//! The one error type of the HTTP API and its wire shape (§4):
//! `{"code": 404, "reason": "NotFound", "message": "..."}`.
//!
//! Client errors carry a message written for the caller. Server-side
//! failures (a store that is down, a record that does not decode) are logged
//! once, here, where they become a response, and answered with a generic
//! message: internal error text never reaches a client.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::repo;

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The HTTP status code, repeated.
    pub code: u16,
    /// `BadRequest`, `Unauthorized`, `Forbidden`, `NotFound`, `Conflict`,
    /// `PayloadTooLarge`, `TooManyRequests`, `BadGateway`, `GatewayTimeout`, `Unavailable` or `Internal`.
    pub reason: String,
    /// What went wrong, for a person.
    pub message: String,
}

/// An error answer. Build it with the constructor named after its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// Seconds for a `Retry-After` header (a 429).
    retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), retry_after: None }
    }
    /// 429: the caller holds too much of something shared; retry after `seconds`.
    pub fn too_many_requests(message: impl Into<String>, seconds: u32) -> Self {
        Self { retry_after: Some(seconds), ..Self::new(StatusCode::TOO_MANY_REQUESTS, message) }
    }
    /// 400: the request is malformed or breaks a rule.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    /// 401: no bearer token, or one that is unknown or revoked.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
    /// 403: authenticated, but not allowed.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }
    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    /// 405: the path exists, the method does not.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, message)
    }
    /// 409: exists already, still referenced, or changed concurrently.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }
    /// 413: the body exceeds `server.max_body_bytes`.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body exceeds the limit of {limit} bytes"))
    }
    /// 503: a dependency (the store) is unreachable; retrying may help.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }
    /// 500, with the generic message. Log the cause before calling this.
    pub fn internal() -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error; see the server log")
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The body this error is answered with.
    pub fn body(&self) -> ErrorBody {
        ErrorBody { code: self.status.as_u16(), reason: reason(self.status).to_string(), message: self.message.clone() }
    }
}

/// The contract's `reason` for a status code.
pub fn reason(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
        StatusCode::CONFLICT => "Conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "PayloadTooLarge",
        StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        StatusCode::BAD_GATEWAY => "BadGateway",
        StatusCode::SERVICE_UNAVAILABLE => "Unavailable",
        StatusCode::GATEWAY_TIMEOUT => "GatewayTimeout",
        s if s.is_client_error() => "BadRequest",
        _ => "Internal",
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut response = (status, Json(self.body())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<repo::Error> for ApiError {
    fn from(e: repo::Error) -> Self {
        match e {
            repo::Error::NotFound(what) => Self::not_found(format!("{what} not found")),
            repo::Error::Conflict(message) => Self::conflict(message),
            repo::Error::Store(kayra_store::Error::Unavailable(_)) => {
                tracing::error!(error = %e, "store unavailable");
                Self::unavailable("the store is unavailable; retry later")
            }
            repo::Error::Store(kayra_store::Error::Refused(_)) => {
                // Out of space, say: the operator's to mend, not the client's.
                tracing::error!(error = %e, "store refused a request");
                Self::unavailable("the store refused the request; retry later")
            }
            other => {
                tracing::error!(error = %other, "request failed");
                Self::internal()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_follow_the_contract() {
        for (status, expected) in [
            (400, "BadRequest"),
            (401, "Unauthorized"),
            (403, "Forbidden"),
            (404, "NotFound"),
            (409, "Conflict"),
            (413, "PayloadTooLarge"),
            (500, "Internal"),
            (502, "BadGateway"),
            (503, "Unavailable"),
            (504, "GatewayTimeout"),
        ] {
            assert_eq!(reason(StatusCode::from_u16(status).unwrap()), expected);
        }
    }

    #[test]
    fn internal_errors_hide_their_text() {
        let key = repo::Layout::new("dev", "local").key(repo::RecordRef::User("x"));
        let e: ApiError = repo::Error::Corrupt { key, message: "secret detail".into() }.into();
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!e.message().contains("secret"));
        let e: ApiError = repo::Error::Store(kayra_store::Error::Unavailable("dial tcp 10.0.0.1".into())).into();
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!e.message().contains("10.0.0.1"));
    }

    #[test]
    fn unauthorized_carries_www_authenticate() {
        let response = ApiError::unauthorized("no token").into_response();
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
