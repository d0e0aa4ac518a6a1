//! What a gateway path names: `/apis/<api>/<version>/namespaces/<ns>/<resource>[/<rest>]`.
//!
//! The path is parsed from the request as it arrived (not from axum's
//! decoded route parameters) because the very same string is what the
//! backend receives: the gateway must authorize exactly what it forwards
//! (the forwarding side checks that the URL it builds carries this path
//! byte for byte). Refused before any lookup:
//!
//! - any segment that [`kayra_core::validation::path_segment`] refuses —
//!   dot segments, `/` or `\` (also percent-encoded), NUL and control
//!   characters: a backend (or a URL parser on the way) that resolves
//!   `..\..\b` or `%2e%2e/` would serve another namespace or another
//!   resource than the one RBAC and the subscription check looked at;
//! - percent-encoding in `<api>`, `<version>`, `<ns>` or `<resource>`:
//!   RBAC compares `<resource>` with the rules literally, while a backend
//!   decodes it, so `vm%73` must not slip past a rule about `vms`. Names
//!   are DNS labels and resources plain words, so nothing legitimate is lost.

/// The parts of a gateway path, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target<'p> {
    /// The API's name as the caller wrote it (long or short).
    pub api: &'p str,
    pub version: &'p str,
    pub namespace: &'p str,
    /// The RBAC resource: the one segment after the namespace.
    pub resource: &'p str,
    /// Everything after `<resource>/`; empty for the collection itself.
    pub rest: &'p str,
}

impl Target<'_> {
    /// Whether the request names one object (`GET` is then `get`, not `list`).
    pub fn names_an_object(&self) -> bool {
        !self.rest.is_empty()
    }
}

/// Why a path is not a gateway path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not of the shape `/apis/<api>/<version>/namespaces/<ns>/<resource>…` (404).
    NotAGatewayPath,
    /// Unsafe to authorize and forward (400); says why, naming the segment.
    Unsafe(String),
}

/// Parses a request path (without the query).
pub(crate) fn parse(path: &str) -> Result<Target<'_>, Refusal> {
    let rest = path.strip_prefix("/apis/").ok_or(Refusal::NotAGatewayPath)?;
    for segment in rest.split('/') {
        kayra_core::validation::path_segment(segment).map_err(|invalid| Refusal::Unsafe(invalid.to_string()))?;
    }
    let mut parts = rest.splitn(5, '/');
    let (Some(api), Some(version), Some("namespaces"), Some(namespace), Some(tail)) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::NotAGatewayPath);
    };
    let (resource, rest) = tail.split_once('/').unwrap_or((tail, ""));
    if [api, version, namespace, resource].iter().any(|s| s.is_empty()) {
        return Err(Refusal::NotAGatewayPath);
    }
    if let Some(encoded) = [api, version, namespace, resource].into_iter().find(|s| s.contains('%')) {
        return Err(Refusal::Unsafe(format!(
            "path segment {encoded:?} must not be percent-encoded: the api, version, namespace and resource \
             segments are authorized as written"
        )));
    }
    Ok(Target { api, version, namespace, resource, rest })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_collections_and_objects() {
        let t = parse("/apis/compute.example.com/v1/namespaces/core/vms").unwrap();
        assert_eq!(
            t,
            Target { api: "compute.example.com", version: "v1", namespace: "core", resource: "vms", rest: "" }
        );
        assert!(!t.names_an_object());
        // A trailing slash still names the collection.
        assert!(!parse("/apis/compute.example.com/v1/namespaces/core/vms/").unwrap().names_an_object());

        let t = parse("/apis/compute/v2beta/namespaces/core/vms/web-1/console").unwrap();
        assert_eq!((t.api, t.version, t.resource, t.rest), ("compute", "v2beta", "vms", "web-1/console"));
        assert!(t.names_an_object());
    }

    #[test]
    fn other_shapes_are_not_gateway_paths() {
        for path in [
            "/",
            "/apis",
            "/apis/compute.example.com/v1",
            "/apis/compute.example.com/v1/namespaces/core",
            "/apis/compute.example.com/v1/namespaces/core/",
            "/apis/compute.example.com/v1/clusters/core/vms",
            "/apis//v1/namespaces/core/vms",
            "/apis/compute.example.com//namespaces/core/vms",
            "/apis/compute.example.com/v1/namespaces//vms",
            "/other/compute.example.com/v1/namespaces/core/vms",
        ] {
            assert_eq!(parse(path), Err(Refusal::NotAGatewayPath), "{path}");
        }
    }

    #[test]
    fn dot_segments_are_refused_anywhere() {
        for path in [
            "/apis/compute.example.com/v1/namespaces/a/vms/../../b/vms",
            "/apis/compute.example.com/v1/namespaces/a/vms/x/./y",
            "/apis/compute.example.com/v1/namespaces/a/vms/%2e%2E/x",
            "/apis/compute.example.com/v1/namespaces/a/vms/.%2e",
            "/apis/compute.example.com/v1/namespaces/../vms",
            "/apis/compute.example.com/v1/namespaces/a/widgets/..\\..\\b\\widgets\\w1",
            "/apis/compute.example.com/v1/namespaces/a/widgets/..%5c..%5cb",
            "/apis/compute.example.com/v1/namespaces/a/widgets/x%2f..%2f..",
            "/apis/compute.example.com/v1/namespaces/a/widgets/..;/..;/b",
            "/apis/compute.example.com/v1/namespaces/a/widgets/x%00",
            "/apis/compute.example.com/v1/namespaces/a/widgets/x%0d%0aX-Injected:%201",
            "/apis/../../internal/admin",
        ] {
            assert!(matches!(parse(path), Err(Refusal::Unsafe(_))), "{path}");
        }
        // Dots inside a segment are ordinary characters.
        assert!(parse("/apis/compute.example.com/v1/namespaces/a/vms/web.1/..x").is_ok());
    }

    #[test]
    fn percent_encoding_is_refused_where_it_is_authorized() {
        assert!(matches!(parse("/apis/compute.example.com/v1/namespaces/a/vm%73"), Err(Refusal::Unsafe(_))));
        assert!(matches!(parse("/apis/compute%2eexample.com/v1/namespaces/a/vms"), Err(Refusal::Unsafe(_))));
        // The object part is the backend's business.
        assert_eq!(parse("/apis/compute.example.com/v1/namespaces/a/vms/a%20b").unwrap().rest, "a%20b");
    }
}
