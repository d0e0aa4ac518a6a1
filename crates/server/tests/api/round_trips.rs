//! Store round trips per request: each handler is held to its budget on
//! both backends, counted at the store backend itself. Authentication and
//! RBAC are answered from the watch-fed caches (no round trip once they
//! have seen the caller); what remains is the handler's own reads and
//! writes. A create or delete of a subscription is one transaction whose
//! compares answer the 404s and the 409; a read is one transaction.

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::counted::RoundTrips;
use crate::common::{Backend, Server};

/// Runs one request as admin; its status and the round trips it cost.
async fn measured(
    server: &Server,
    trips: &RoundTrips,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, usize) {
    let before = trips.count();
    let reply = server.call(method, path, Some(&server.admin), body).await;
    (reply.status, trips.count() - before)
}

/// What a request is, and the (status, round trips) it must answer with.
type Expectation = (&'static str, Method, String, Option<Value>, u16, usize);

async fn case(backend: Backend) {
    let (server, trips) = Server::start_counted(backend).await;
    server.namespace("core").await;
    server.registration("compute.example.com", json!({"short_name": "compute", "sync_id": "s1"})).await;
    // Until the caches have seen the caller, authentication confirms
    // against the store; from then on a GET of a namespace is its one read.
    kayra_testkit::eventually("the caches to answer for admin", || async {
        measured(&server, &trips, Method::GET, "/namespaces/core", None).await == (200, 1)
    })
    .await;

    let subs = "/namespaces/core/subscriptions";
    let one = "/namespaces/core/subscriptions/compute.example.com";
    let body = || Some(json!({"api": "compute.example.com"}));
    let expectations: Vec<Expectation> = vec![
        ("create", Method::POST, subs.into(), body(), 201, 1),
        ("create again (409)", Method::POST, subs.into(), body(), 409, 1),
        ("create in a missing namespace", Method::POST, "/namespaces/nope/subscriptions".into(), body(), 404, 1),
        ("create of a missing registration", Method::POST, subs.into(), Some(json!({"api": "no.example.com"})), 404, 1),
        ("create by short name (400)", Method::POST, subs.into(), Some(json!({"api": "compute"})), 400, 2),
        ("get", Method::GET, one.into(), None, 200, 1),
        // A found subscription implies its namespace; a missing one reads
        // the namespace after, for the 404 to say which is missing.
        ("get missing", Method::GET, "/namespaces/core/subscriptions/no.example.com".into(), None, 404, 2),
        // A confirmation changes nothing but is recorded (§13): the read,
        // then the audit record's write, guarded by the revision read.
        ("put (no-op)", Method::PUT, one.into(), Some(json!({})), 200, 2),
        ("patch (no-op)", Method::PATCH, one.into(), Some(json!({})), 200, 2),
        ("sync", Method::PUT, format!("{one}/sync"), Some(json!({})), 200, 2),
        // The audit record shows what was deleted: read, then the delete.
        ("delete", Method::DELETE, one.into(), None, 204, 2),
        ("delete again (404)", Method::DELETE, one.into(), None, 404, 1),
        (
            "delete in a missing namespace",
            Method::DELETE,
            "/namespaces/nope/subscriptions/compute.example.com".into(),
            None,
            404,
            1,
        ),
        (
            "role binding create",
            Method::POST,
            "/namespaces/core/rolebindings".into(),
            Some(json!({"name": "b1", "role": "sysadmin", "user": "admin"})),
            201,
            1,
        ),
        (
            "role binding create in a missing namespace",
            Method::POST,
            "/namespaces/nope/rolebindings".into(),
            Some(json!({"name": "b1", "role": "sysadmin", "user": "admin"})),
            404,
            1,
        ),
    ];
    for (what, method, path, body, status, budget) in expectations {
        let got = measured(&server, &trips, method, &path, body).await;
        assert_eq!(got, (status, budget), "{what}: (status, store round trips)");
    }
}

/// Creates from many tenants at once share round trips (group commit of
/// the catalog's transactions), and each still answers as if alone: the
/// one whose subscription exists already gets its 409.
async fn concurrent_creates_share_round_trips(backend: Backend) {
    const TENANTS: usize = 40;
    let (server, trips) = Server::start_counted(backend).await;
    server.registration("compute.example.com", json!({"short_name": "compute", "sync_id": "s1"})).await;
    for i in 0..TENANTS {
        server.namespace(&format!("t{i}")).await;
    }
    let taken = "/namespaces/t0/subscriptions";
    let body = json!({"api": "compute.example.com"});
    assert_eq!(server.call(Method::POST, taken, Some(&server.admin), Some(body.clone())).await.status, 201);
    kayra_testkit::eventually("the caches to answer for admin", || async {
        measured(&server, &trips, Method::GET, "/namespaces/t1", None).await == (200, 1)
    })
    .await;

    let before = trips.count();
    let statuses = futures::future::join_all((0..TENANTS).map(|i| {
        let (server, body) = (&server, body.clone());
        async move {
            let path = format!("/namespaces/t{i}/subscriptions");
            server.call(Method::POST, &path, Some(&server.admin), Some(body)).await.status
        }
    }))
    .await;
    let spent = trips.count() - before;
    assert_eq!(statuses[0], 409, "t0's subscription was there already");
    assert!(statuses[1..].iter().all(|s| *s == 201), "{statuses:?}");
    assert!(spent < TENANTS, "{TENANTS} creates at once shared round trips ({spent})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_share_round_trips_local() {
    concurrent_creates_share_round_trips(Backend::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_share_round_trips_etcd() {
    concurrent_creates_share_round_trips(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_round_trips_local() {
    case(Backend::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_round_trips_etcd() {
    case(Backend::Etcd).await;
}
