//! The OpenAPI 3 document of the catalog API, generated — never written by
//! hand — from the `#[utoipa::path]` attributes on the handlers and the
//! `ToSchema` derives of the very types they take and return.
//!
//! Two things are added from the route table rather than repeated on every
//! handler: each operation's RBAC requirement (`x-kayra-rbac: {resource,
//! verb}`, or `{authenticated: true}` for `/whoami`), and the error answers
//! any route can give (401, 403, 413 where there is a body, 500, 503).
//! Tests check that the document and the live router list the same
//! (method, path) pairs.

use axum::http::Method;
use serde_json::json;
use utoipa::OpenApi;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, Response, ResponseBuilder};

use super::error::ErrorBody;
use super::stream::WatchEvent;
use super::{
    Access, BASE_PATH, audit, bindings, namespaces, notifications, registrations, roles, rollouts, routes, runs,
    status, subscriptions, users,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "kayra catalog API",
        version = "v1",
        description = "Namespaces, API registrations, subscriptions, users, tokens, roles and bindings of one kayra deployment."
    ),
    paths(
        namespaces::list,
        namespaces::create,
        namespaces::get,
        namespaces::update,
        namespaces::patch,
        namespaces::delete,
        registrations::list,
        registrations::create,
        registrations::get,
        registrations::update,
        registrations::patch,
        registrations::delete,
        registrations::sync,
        status::status,
        rollouts::get,
        rollouts::act,
        subscriptions::list,
        subscriptions::create,
        subscriptions::get,
        subscriptions::update,
        subscriptions::patch,
        subscriptions::sync,
        subscriptions::delete,
        runs::list,
        runs::get,
        runs::cancel,
        users::list,
        users::create,
        users::get,
        users::update,
        users::patch,
        users::delete,
        users::list_tokens,
        users::create_token,
        users::get_token,
        users::delete_token,
        users::whoami,
        roles::list,
        roles::create,
        roles::get,
        roles::update,
        roles::patch,
        roles::delete,
        bindings::cluster_list,
        bindings::cluster_create,
        bindings::cluster_get,
        bindings::cluster_update,
        bindings::cluster_patch,
        bindings::cluster_delete,
        bindings::list,
        bindings::create,
        bindings::get,
        bindings::update,
        bindings::patch,
        bindings::delete,
        audit::list,
        audit::get,
        notifications::list,
        notifications::retry,
    ),
    components(schemas(ErrorBody, WatchEvent))
)]
struct CatalogApi;

/// The catalog API's OpenAPI document, paths absolute (under [`BASE_PATH`]).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = utoipa::openapi::OpenApiBuilder::new()
        .info(CatalogApi::openapi().info)
        .build()
        .nest(BASE_PATH, CatalogApi::openapi());
    let components = doc.components.get_or_insert_with(Default::default);
    components
        .add_security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
    doc.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);

    for route in routes() {
        let path = format!("{BASE_PATH}{}", route.path);
        let Some(item) = doc.paths.paths.get_mut(&path) else { continue };
        let operation = match route.method {
            Method::GET => item.get.as_mut(),
            Method::POST => item.post.as_mut(),
            Method::PUT => item.put.as_mut(),
            Method::PATCH => item.patch.as_mut(),
            Method::DELETE => item.delete.as_mut(),
            _ => None,
        };
        let Some(operation) = operation else { continue };
        let rbac = match route.access {
            Access::Cluster { resource, verb } => {
                json!({"api": kayra_core::CATALOG_API, "resource": resource, "verb": verb.as_str()})
            }
            Access::Authenticated => json!({"authenticated": true}),
        };
        operation
            .extensions
            .get_or_insert_with(Default::default)
            .merge(ExtensionsBuilder::new().add("x-kayra-rbac", rbac).build());
        if let (true, Access::Cluster { resource, .. }) = (route.watchable, route.access) {
            document_watch(operation, resource);
        }
        let mut common = vec![
            ("401", "missing, unknown or revoked bearer token"),
            ("403", "no cluster role of the caller grants this; the message names user, api, resource and verb"),
            ("500", "internal error (logged by the server)"),
            ("503", "the store is unavailable"),
        ];
        if operation.request_body.is_some() {
            common.push((
                "400",
                "the body is not valid JSON, not an object, or has an unknown, computed or mistyped field",
            ));
            common.push(("413", "the body exceeds server.max_body_bytes"));
        }
        for (code, description) in common {
            operation.responses.responses.entry(code.to_string()).or_insert_with(|| error_response(description));
        }
    }
    doc
}

/// `?watch=true` on a watchable GET (§4.5): the parameter, its RBAC
/// requirement (`x-kayra-watch-rbac`) and the two streaming answers.
fn document_watch(operation: &mut Operation, resource: &str) {
    let parameter = ParameterBuilder::new()
        .name("watch")
        .parameter_in(ParameterIn::Query)
        .required(Required::False)
        .description(Some(
            "true: answer with a stream of watch events (RBAC verb `watch`) instead of the object or list: \
             first ADDED for every object there is, then every change. NDJSON, or server-sent events with \
             `Accept: text/event-stream` (`event: <type>`, `data: <the event>`, `: keep-alive` after at most 15 s of silence).",
        ))
        .schema(Some(utoipa::openapi::schema::ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::Boolean)))
        .build();
    operation.parameters.get_or_insert_with(Vec::new).push(parameter);
    let watch_rbac = json!({"api": kayra_core::CATALOG_API, "resource": resource, "verb": "watch"});
    operation
        .extensions
        .get_or_insert_with(Default::default)
        .merge(ExtensionsBuilder::new().add("x-kayra-watch-rbac", watch_rbac).build());
    if let Some(RefOr::T(ok)) = operation.responses.responses.get_mut("200") {
        let event = || ContentBuilder::new().schema(Some(Ref::from_schema_name("WatchEvent"))).build();
        ok.content.insert("application/x-ndjson".to_string(), event());
        ok.content.insert("text/event-stream".to_string(), event());
    }
}

fn error_response(description: &str) -> RefOr<Response> {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
    RefOr::T(ResponseBuilder::new().description(description).content("application/json", content).build())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn documented() -> BTreeSet<(String, String)> {
        let doc = openapi();
        let mut pairs = BTreeSet::new();
        for (path, item) in &doc.paths.paths {
            for (method, op) in [
                ("GET", &item.get),
                ("POST", &item.post),
                ("PUT", &item.put),
                ("PATCH", &item.patch),
                ("DELETE", &item.delete),
                ("HEAD", &item.head),
                ("OPTIONS", &item.options),
                ("TRACE", &item.trace),
            ] {
                if op.is_some() {
                    pairs.insert((method.to_string(), path.clone()));
                }
            }
        }
        pairs
    }

    #[test]
    fn the_document_lists_exactly_the_declared_routes() {
        let declared: BTreeSet<_> =
            routes().iter().map(|r| (r.method.to_string(), format!("{BASE_PATH}{}", r.path))).collect();
        let documented = documented();
        let missing: Vec<_> = declared.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&declared).collect();
        assert!(missing.is_empty() && extra.is_empty(), "undocumented: {missing:?}; not routed: {extra:?}");
    }

    #[test]
    fn operations_carry_their_rbac_requirement_and_error_answers() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let sync = &doc["paths"]["/apis/catalog.example.com/v1/namespaces/{namespace}/subscriptions/{api}/sync"]["put"];
        assert_eq!(sync["x-kayra-rbac"]["resource"], "subscriptions/sync");
        assert_eq!(sync["x-kayra-rbac"]["verb"], "patch");
        assert!(sync["responses"]["401"].is_object());
        assert!(sync["responses"]["413"].is_object());
        let view = &doc["components"]["schemas"]["SubscriptionView"]["properties"];
        for field in ["api", "namespace", "active", "state", "current_sync_id", "expected_sync_id", "synced"] {
            assert!(view[field].is_object(), "SubscriptionView.{field} missing from the schema");
        }
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    }

    #[test]
    fn new_routes_fields_and_watch_streams_are_documented() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let paths = &doc["paths"];
        let runs = &paths["/apis/catalog.example.com/v1/namespaces/{namespace}/subscriptions/{api}/runs"]["get"];
        assert_eq!(runs["x-kayra-rbac"]["resource"], "subscriptions/runs");
        assert_eq!(runs["x-kayra-rbac"]["verb"], "list");
        let run = &paths["/apis/catalog.example.com/v1/namespaces/{namespace}/subscriptions/{api}/runs/{id}"]["get"];
        assert_eq!(run["x-kayra-rbac"]["verb"], "get");
        let schemas = &doc["components"]["schemas"];
        for field in
            ["id", "trigger", "sync_id", "result", "started_at", "finished_at", "lock_id", "reconciler", "steps"]
        {
            assert!(schemas["Run"]["properties"][field].is_object(), "Run.{field}");
        }
        assert!(schemas["ApiRegistration"]["properties"]["sync_id_updated_at"].is_object());
        for schema in ["Namespace", "NamespaceCreate", "NamespaceUpdate"] {
            assert_eq!(schemas[schema]["properties"]["labels"]["type"], "object", "{schema}.labels");
        }
        let list = &paths[format!("{BASE_PATH}/namespaces")]["get"]["parameters"];
        assert!(list.as_array().unwrap().iter().any(|p| p["name"] == "labelSelector"), "{list}");
        for field in ["sync_id_updated_at", "total", "synced", "failed", "pending", "held"] {
            assert!(schemas["RegistrationStatus"]["properties"][field].is_object(), "RegistrationStatus.{field}");
        }
        assert!(schemas["WatchEvent"]["properties"]["type"].is_object());
        // Every watchable GET documents `watch`, its RBAC and both stream types.
        for route in routes().iter().filter(|r| r.watchable) {
            let op = &paths[format!("{BASE_PATH}{}", route.path)]["get"];
            assert_eq!(op["x-kayra-watch-rbac"]["verb"], "watch", "{}", route.path);
            let params = op["parameters"].as_array().unwrap();
            assert!(params.iter().any(|p| p["name"] == "watch"), "{}", route.path);
            for ct in ["application/json", "application/x-ndjson", "text/event-stream"] {
                assert!(op["responses"]["200"]["content"][ct].is_object(), "{} {ct}", route.path);
            }
        }
        assert!(routes().iter().filter(|r| r.watchable).count() >= 18);
    }
}
