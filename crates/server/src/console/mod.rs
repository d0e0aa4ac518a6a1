//! The web console (platform §11): a read-only view of the fleet at `/ui/`,
//! served from assets built into the binary.
//!
//! The console is a static single-page application: plain HTML, CSS and ES
//! modules, no build step. Its files need no token (they hold no data);
//! every data call the page makes goes to the catalog API with
//! `Authorization: Bearer`, so the console has exactly the caller's rights
//! and the server needs no session of its own.
//!
//! Every response under `/ui` carries the same security headers, errors
//! included: a Content-Security-Policy that allows only the console's own
//! files (no inline script or style at all, so injected markup cannot run),
//! `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`.
//!
//! # Layout
//! - this file: the routes and the headers layer.
//! - [`assets`]: the embedded files and their content types.

mod assets;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

pub use assets::{ASSETS, Asset};

/// The console's Content-Security-Policy. `default-src 'self'` covers
/// scripts, styles, images and fetches; nothing here allows inline code.
/// `form-action 'none'` keeps the sign-in form from ever being submitted by
/// the browser (the script reads it), so a token cannot end up in a URL
/// even if the script failed to load.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'";

/// `/ui` (a redirect to `/ui/`), `/ui/` (the page) and `/ui/<file>`.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { serve("index.html") }))
        .route("/ui/{*path}", get(|Path(path): Path<String>| async move { serve(&path) }))
        .layer(axum::middleware::map_response(secure))
}

/// One embedded file, or a plain-text 404 (still under the console's headers).
fn serve(path: &str) -> Response {
    match assets::find(path) {
        Some(asset) => (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type)),
                // Assets change with the binary; revalidating is cheap on
                // the loopback or LAN a console is used from.
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            asset.body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "not found\n")
            .into_response(),
    }
}

/// Adds the console's security headers to every response.
async fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(HeaderName::from_static("x-frame-options"), HeaderValue::from_static("DENY"));
    response
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn get(path: &str) -> Response {
        router::<()>().oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap()
    }

    fn assert_secure(response: &Response, path: &str) {
        let h = response.headers();
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY, "{path}");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
        assert_eq!(h[header::REFERRER_POLICY], "no-referrer", "{path}");
    }

    #[test]
    fn the_policy_allows_no_inline_code() {
        assert!(CONTENT_SECURITY_POLICY.starts_with("default-src 'self'"));
        for bad in ["unsafe-inline", "unsafe-eval", "nonce-", "sha256-", "sha384-", "sha512-", "*", "data:"] {
            assert!(!CONTENT_SECURITY_POLICY.contains(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn every_asset_is_served_with_its_type_and_the_headers() {
        for asset in ASSETS {
            let path = format!("/ui/{}", asset.path);
            let response = get(&path).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_secure(&response, &path);
            assert_eq!(response.headers()[header::CONTENT_TYPE], asset.content_type, "{path}");
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], asset.body, "{path}");
        }
    }

    #[tokio::test]
    async fn the_root_redirect_and_misses_carry_the_headers_too() {
        let root = get("/ui/").await;
        assert_eq!(root.status(), StatusCode::OK);
        assert_eq!(root.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_secure(&root, "/ui/");

        let redirect = get("/ui").await;
        assert_eq!(redirect.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(redirect.headers()[header::LOCATION], "/ui/");
        assert_secure(&redirect, "/ui");

        for miss in ["/ui/nope.js", "/ui/../Cargo.toml", "/ui/pages/", "/ui/%2e%2e/x"] {
            let response = get(miss).await;
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{miss}");
            assert_secure(&response, miss);
        }
    }
}
