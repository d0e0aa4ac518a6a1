//! Authentication (§5.1): `Authorization: Bearer <token>` → a
//! [`Caller`] in the request's extensions, or 401 with
//! `WWW-Authenticate: Bearer`.
//!
//! The token's hash and its user are looked up in the watch-fed auth
//! caches (`kayra_catalog::cache`), which wait for this process's own
//! writes first, so a revocation made here is enforced on the very next
//! request; a token they do not know is confirmed against the store. The
//! token is never logged, and neither is the header that carries it.

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::response::{IntoResponse, Response};
use kayra_catalog::api::{ApiError, Caller};
use kayra_catalog::repo::Repository;

/// Authenticates `request` (its [`Caller`] put in) or answers 401.
pub(crate) async fn authenticate(repo: &Repository, request: &mut Request) -> Result<(), Response> {
    let token = match bearer_token(request.headers()) {
        Ok(token) => token,
        Err(e) => {
            denied(request);
            return Err(e.into_response());
        }
    };
    match repo.authenticate(token).await {
        Ok(Some(user)) => {
            request.extensions_mut().insert(Caller { user });
            Ok(())
        }
        Ok(None) => {
            denied(request);
            Err(ApiError::unauthorized("unknown or revoked bearer token").into_response())
        }
        Err(e) => Err(ApiError::from(e).into_response()),
    }
}

/// The log line of a request refused 401 (platform §13): no user is
/// known; the path stands for the resource, the method for the verb.
fn denied(request: &Request) {
    let verb = request.method().as_str().to_ascii_lowercase();
    let resource = request.uri().path();
    tracing::info!(audit = "denied", user = "", resource, verb = verb.as_str(), code = 401, "request refused");
}

/// The token of an `Authorization: Bearer <token>` header (scheme
/// case-insensitive, as RFC 7235 says).
fn bearer_token(headers: &HeaderMap) -> Result<&str, ApiError> {
    let missing = || ApiError::unauthorized("missing bearer token: send \"Authorization: Bearer <token>\"");
    let value = headers.get(AUTHORIZATION).ok_or_else(missing)?;
    let value = value.to_str().map_err(|_| ApiError::unauthorized("malformed Authorization header"))?;
    let (scheme, token) = value.trim().split_once(' ').ok_or_else(missing)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::unauthorized("the Authorization scheme must be Bearer"));
    }
    match token.trim() {
        "" => Err(missing()),
        token => Ok(token),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn parses_bearer_tokens() {
        assert_eq!(bearer_token(&headers("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer_token(&headers("bearer  abc ")).unwrap(), "abc");
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc", ""] {
            let e = bearer_token(&headers(bad)).unwrap_err();
            assert_eq!(e.status().as_u16(), 401, "{bad:?}");
        }
        assert!(bearer_token(&HeaderMap::new()).is_err());
    }

    #[test]
    fn errors_never_echo_the_token() {
        let e = bearer_token(&headers("Basic s3cr3t")).unwrap_err();
        assert!(!e.message().contains("s3cr3t"));
    }
}
