//! `/notifications` (§14) through the catalog API: the list by state and
//! sink without the stored-only scheduling fields, paging, the retry of a
//! dead delivery (409 when not dead, 404 when unknown; audited when it
//! succeeds), and RBAC on `notifications` and `notifications/retry`. The
//! reconciler that writes and settles deliveries is not running here:
//! records are put into the store directly.

use kayra_catalog::repo::RecordRef;
use kayra_core::notifications::{Claim, Delivery, DeliveryState, Event};
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::common::Server;

async fn put(server: &Server, event: &str, sink: &str, state: DeliveryState) -> String {
    let event =
        Event { id: event.into(), kind: "subscription.failed".into(), api: "x.example.com".into(), ..Event::default() };
    let delivery = Delivery {
        state,
        attempts: 10,
        last_error: "HTTP 500".into(),
        next_attempt_at_ms: 42,
        claim: Some(Claim { owner: "host:1".into(), until_ms: 7 }),
        ..Delivery::new(&event, sink)
    };
    server.repo.create(RecordRef::Delivery(&delivery.id), &delivery, "delivery").await.expect("store the delivery");
    delivery.id
}

fn ids(list: &Value) -> Vec<String> {
    list["items"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_string()).collect()
}

fn rule(resources: &[&str], verbs: &[&str]) -> Value {
    json!([{"apis": ["catalog.example.com"], "resources": resources, "verbs": verbs}])
}

both_backends! {
    async fn deliveries_are_listed_by_state_and_sink(server: Server) {
        assert_eq!(server.get("/notifications").await.expect(200), json!({"items": [], "continue": ""}));
        put(&server, "e1", "ops", DeliveryState::Dead).await;
        put(&server, "e2", "ops", DeliveryState::Delivered).await;
        put(&server, "e3", "dev", DeliveryState::Dead).await;
        put(&server, "e4", "ops", DeliveryState::Pending).await;
        let all = server.get("/notifications").await.expect(200);
        assert_eq!(ids(&all), ["e1.ops", "e2.ops", "e3.dev", "e4.ops"]);
        let first = &all["items"][0];
        let mut keys: Vec<&str> = first.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["attempts", "delivered_at", "event", "id", "last_attempt_at", "last_error", "sink", "state"]);
        assert_eq!((first["state"].as_str(), first["event"]["type"].as_str()), (Some("dead"), Some("subscription.failed")));
        assert_eq!(ids(&server.get("/notifications?state=dead").await.expect(200)), ["e1.ops", "e3.dev"]);
        assert_eq!(ids(&server.get("/notifications?state=dead&sink=ops").await.expect(200)), ["e1.ops"]);
        assert_eq!(ids(&server.get("/notifications?sink=dev").await.expect(200)), ["e3.dev"]);
        server.get("/notifications?state=lost").await.error(400, &["lost", "pending", "delivered", "dead"]);
        let page = server.get("/notifications?limit=3").await.expect(200);
        assert_eq!(ids(&page), ["e1.ops", "e2.ops", "e3.dev"]);
        let token = page["continue"].as_str().unwrap();
        assert_eq!(ids(&server.get(&format!("/notifications?limit=3&continue={token}")).await.expect(200)), ["e4.ops"]);
    }

    async fn a_dead_delivery_is_retried_and_nothing_else(server: Server) {
        let dead = put(&server, "e1", "ops", DeliveryState::Dead).await;
        let delivered = put(&server, "e2", "ops", DeliveryState::Delivered).await;
        let retried = server.put(&format!("/notifications/{dead}/retry"), json!({})).await.expect(200);
        assert_eq!((retried["state"].as_str(), retried["attempts"].as_u64()), (Some("pending"), Some(0)));
        let stored: Delivery = server.repo.get(RecordRef::Delivery(&dead)).await.unwrap().unwrap().value;
        assert_eq!((stored.next_attempt_at_ms, stored.claim), (0, None), "due now, unclaimed");
        server.put(&format!("/notifications/{dead}/retry"), json!({})).await.error(409, &["pending", "not dead"]);
        server.put(&format!("/notifications/{delivered}/retry"), json!({})).await.error(409, &["delivered"]);
        server.put("/notifications/nope.ops/retry", json!({})).await.error(404, &["nope.ops"]);
        // The retry is in the audit trail, the refused ones are not.
        let audit = server.get("/audit?resource=notifications/retry").await.expect(200);
        let items = audit["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{audit}");
        assert_eq!((&items[0]["user"], &items[0]["verb"], &items[0]["name"]), (&json!("admin"), &json!("patch"), &json!(dead)));
        assert_eq!((&items[0]["before"]["state"], &items[0]["after"]), (&json!("dead"), &retried), "{audit}");
    }

    async fn notifications_need_their_own_rules(server: Server) {
        let dead = put(&server, "e1", "ops", DeliveryState::Dead).await;
        let retry = format!("/notifications/{dead}/retry");
        let reader = server.user_with_rules("reader", rule(&["subscriptions"], &["get", "list"])).await;
        server.call(Method::GET, "/notifications", Some(&reader), None).await.error(403, &["notifications", "list"]);
        let lister = server.user_with_rules("lister", rule(&["notifications"], &["list", "patch"])).await;
        server.call(Method::GET, "/notifications", Some(&lister), None).await.expect(200);
        server.call(Method::PUT, &retry, Some(&lister), Some(json!({}))).await.error(403, &["notifications/retry", "patch"]);
        let retrier = server.user_with_rules("retrier", rule(&["notifications/retry"], &["patch"])).await;
        server.call(Method::PUT, &retry, Some(&retrier), Some(json!({}))).await.expect(200);
    }
}
