//! `PUT …/runs/{id}/cancel` (§12) through the catalog API. The reconciler
//! is not running here: the test acts as the one holding the run, as
//! `kayra_reconciler` does (it sees the cancel request in the store and
//! answers it with the run, recorded `cancelled`, in the run's result
//! transaction); the real reconciler's side is tested in
//! `crates/reconciler/tests/cancel.rs` and across processes in
//! `crates/kayra/tests/cancel.rs`.

use kayra_catalog::repo::cancels::CancelRequest;
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_core::{Run, RunResult};
use reqwest::Method;
use serde_json::{Value, json};

use crate::api::runs::{put_run, run, run_id};
use crate::both_backends;
use crate::common::Server;
use kayra_testkit::eventually;

const API: &str = "compute.example.com";
const RUNS: &str = "/namespaces/core/subscriptions/compute.example.com/runs";

async fn setup(server: &Server) {
    server.namespace("core").await;
    server.registration(API, json!({"sync_id": "s1"})).await;
    server.subscribe("core", API).await;
}

fn rule(resources: &[&str], verbs: &[&str]) -> Value {
    json!([{"apis": ["catalog.example.com"], "resources": resources, "verbs": verbs}])
}

/// Acts as the reconciler holding run `id` of `core`'s subscription: waits
/// for its cancel request, then records the run `cancelled` with the
/// request's message and answers the request, as the run's result
/// transaction does. Returns the request it answered.
fn hold(repo: &Repository, id: &str) -> tokio::task::JoinHandle<CancelRequest> {
    let (repo, id) = (repo.clone(), id.to_string());
    tokio::spawn(async move {
        let record = RecordRef::CancelRequest { namespace: "core", api: API, id: &id };
        let found = std::sync::Mutex::new(None);
        eventually("the cancel request", || async {
            let got = repo.get::<CancelRequest>(record).await.unwrap();
            let present = got.is_some();
            *found.lock().unwrap() = got;
            present
        })
        .await;
        let request = found.into_inner().unwrap().unwrap();
        let mut cancelled: Run = run("core", 7, RunResult::Cancelled);
        cancelled.id.clone_from(&id);
        cancelled.error = request.value.message();
        put_run_record(&repo, &cancelled).await;
        repo.update(record, &request.value.answered(&cancelled), request.revision, "cancel request").await.unwrap();
        request.value
    })
}

async fn put_run_record(repo: &Repository, run: &Run) {
    repo.add_run(run, 20).await.expect("store the run");
}

both_backends! {
    async fn a_run_in_flight_is_cancelled_by_its_holder_and_answered(server: Server) {
        setup(&server).await;
        let id = run_id(7);
        let holder = hold(&server.repo, &id);
        let cancel = format!("{RUNS}/{id}/cancel");
        let run = server.put(&cancel, json!({"reason": "bad canary"})).await.expect(200);
        assert_eq!((run["id"].as_str(), run["result"].as_str()), (Some(id.as_str()), Some("cancelled")), "{run}");
        assert_eq!(run["error"], "cancelled by admin: bad canary");
        let request = holder.await.unwrap();
        assert_eq!((request.user.as_str(), request.reason.as_str()), ("admin", "bad canary"));
        // The answered request is gone; the run is what a GET shows.
        let record = RecordRef::CancelRequest { namespace: "core", api: API, id: &id };
        assert!(server.repo.get::<CancelRequest>(record).await.unwrap().is_none());
        assert_eq!(server.get(&format!("{RUNS}/{id}")).await.expect(200), run);
        // The cancel is in the audit trail, as the subscription's.
        let audit = server.get("/audit?resource=subscriptions/cancel").await.expect(200);
        let items = audit["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{audit}");
        assert_eq!((items[0]["namespace"].as_str(), items[0]["name"].as_str()), (Some("core"), Some(API)));
        assert_eq!(items[0]["user"], "admin");
    }

    async fn without_a_body_reason_the_request_header_gives_it(server: Server) {
        setup(&server).await;
        let id = run_id(7);
        let holder = hold(&server.repo, &id);
        let reply = server
            .client
            .put(server.url(&format!("{RUNS}/{id}/cancel")))
            .bearer_auth(&server.admin)
            .header("X-Kayra-Reason", "stuck for an hour")
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status().as_u16(), 200);
        let run: Value = reply.json().await.unwrap();
        assert_eq!(run["error"], "cancelled by admin: stuck for an hour");
        assert_eq!(holder.await.unwrap().reason, "stuck for an hour");
    }

    async fn a_finished_run_is_409_and_an_unknown_one_404(server: Server) {
        setup(&server).await;
        put_run(&server, &run("core", 1, RunResult::Success)).await;
        let id = run_id(1);
        server.put(&format!("{RUNS}/{id}/cancel"), json!({})).await.error(409, &[&id, "finished", "success"]);
        let unknown = run_id(99);
        server.put(&format!("{RUNS}/{unknown}/cancel"), json!({})).await.error(404, &[&unknown]);
        let record = RecordRef::CancelRequest { namespace: "core", api: API, id: &unknown };
        assert!(server.repo.get::<CancelRequest>(record).await.unwrap().is_none(), "no request is left behind");
        // Nothing was cancelled, so nothing is audited.
        let audit = server.get("/audit?resource=subscriptions/cancel").await.expect(200);
        assert_eq!(audit["items"], json!([]), "{audit}");
    }

    async fn bad_ids_and_bodies_are_400_and_missing_subscriptions_404(server: Server) {
        setup(&server).await;
        let id = run_id(1);
        server.put(&format!("{RUNS}/not-a-run/cancel"), json!({})).await.error(400, &["not-a-run", "UUID"]);
        server.put(&format!("{RUNS}/{id}/cancel"), json!({"reason": 5})).await.error(400, &[]);
        server.put(&format!("{RUNS}/{id}/cancel"), json!({"why": "x"})).await.error(400, &["why"]);
        server.put(&format!("{RUNS}/{id}/cancel"), json!({"reason": "a\nb"})).await.error(400, &["reason"]);
        server.raw(Method::PUT, &format!("{RUNS}/{id}/cancel"), Some(&server.admin), "{").await.error(400, &[]);
        let other = "/namespaces/core/subscriptions/other.example.com/runs";
        server.put(&format!("{other}/{id}/cancel"), json!({})).await.error(404, &[]);
        server.put(&format!("/namespaces/nope/subscriptions/{API}/runs/{id}/cancel"), json!({})).await.error(404, &[]);
    }

    async fn cancelling_needs_subscriptions_cancel_patch(server: Server) {
        setup(&server).await;
        put_run(&server, &run("core", 1, RunResult::Success)).await;
        let cancel = format!("{RUNS}/{}/cancel", run_id(1));
        let reader = server.user_with_rules("reader", rule(&["subscriptions", "subscriptions/runs"], &["*"])).await;
        server.call(Method::PUT, &cancel, Some(&reader), Some(json!({}))).await
            .error(403, &["reader", "subscriptions/cancel", "patch"]);
        let updater = server.user_with_rules("updater", rule(&["subscriptions/cancel"], &["update"])).await;
        server.call(Method::PUT, &cancel, Some(&updater), Some(json!({}))).await
            .error(403, &["subscriptions/cancel", "patch"]);
        let canceller = server.user_with_rules("canceller", rule(&["subscriptions/cancel"], &["patch"])).await;
        // Allowed: the run has finished.
        server.call(Method::PUT, &cancel, Some(&canceller), Some(json!({}))).await.error(409, &["finished"]);
    }
}
