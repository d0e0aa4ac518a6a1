//! Concurrent writers never lose an update: every read-modify-write is a
//! compare-and-swap, retried; racing creates yield exactly one 201.

use std::collections::HashSet;

use futures::future::join_all;
use serde_json::json;

use crate::both_backends;

both_backends! {
    async fn concurrent_patches_of_different_fields_all_land(server: Server) {
        server.registration("compute.example.com", json!({})).await;
        for round in 0..5 {
            let patches = [
                json!({"short_name": format!("s{round}")}),
                json!({"mode": format!("m{round}")}),
                json!({"endpoint": format!("http://127.0.0.1:{}", 9000 + round)}),
                json!({"description": format!("d{round}")}),
                json!({"sync_id": format!("y{round}")}),
            ];
            let replies = join_all(patches.into_iter().map(|p| server.patch("/apiregistrations/compute.example.com", p))).await;
            for reply in replies {
                reply.expect(200);
            }
            let reg = server.get("/apiregistrations/compute.example.com").await.expect(200);
            assert_eq!(reg["short_name"], format!("s{round}"), "{reg}");
            assert_eq!(reg["mode"], format!("m{round}"), "{reg}");
            assert_eq!(reg["endpoint"], format!("http://127.0.0.1:{}", 9000 + round), "{reg}");
            assert_eq!(reg["description"], format!("d{round}"), "{reg}");
            assert_eq!(reg["sync_id"], format!("y{round}"), "{reg}");
        }
    }

    async fn racing_creates_yield_exactly_one_winner(server: Server) {
        let replies = join_all((0..8).map(|_| server.post("/namespaces", json!({"name": "contested"})))).await;
        let mut codes: Vec<_> = replies.iter().map(|r| r.status).collect();
        codes.sort_unstable();
        assert_eq!(codes, [201, 409, 409, 409, 409, 409, 409, 409]);

        server.registration("compute.example.com", json!({})).await;
        let path = "/namespaces/contested/subscriptions";
        let replies = join_all((0..8).map(|_| server.post(path, json!({"api": "compute.example.com"})))).await;
        assert_eq!(replies.iter().filter(|r| r.status == 201).count(), 1);
        assert!(replies.iter().all(|r| r.status == 201 || r.status == 409));
    }

    async fn concurrent_syncs_each_move_the_sync_id(server: Server) {
        server.registration("compute.example.com", json!({"sync_id": "start"})).await;
        let replies = join_all((0..10).map(|_| server.put("/apiregistrations/compute.example.com/sync", json!({})))).await;
        let ids: Vec<String> = replies.into_iter().map(|r| r.expect(200)["sync_id"].as_str().unwrap().to_string()).collect();
        let distinct: HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "every /sync wrote its own value: {ids:?}");
        let last = server.get("/apiregistrations/compute.example.com").await.expect(200)["sync_id"].as_str().unwrap().to_string();
        assert!(ids.contains(&last));
    }

    async fn resets_and_confirmations_race_safely(server: Server) {
        server.namespace("core").await;
        server.registration("compute.example.com", json!({"sync_id": "s1"})).await;
        server.subscribe("core", "compute.example.com").await;
        let seen = server.repo.get_subscription("core", "compute.example.com").await.unwrap().unwrap();
        crate::common::record_result(&server.repo, &seen, Some("s1")).await;
        let item = "/namespaces/core/subscriptions/compute.example.com";
        let before = server.repo.get_subscription("core", "compute.example.com").await.unwrap().unwrap().revision;
        let sync = format!("{item}/sync");
        let replies = join_all((0..6).map(|i| {
            if i % 2 == 0 { server.put(&sync, json!({})) } else { server.put(item, json!({})) }
        }))
        .await;
        for reply in replies {
            reply.expect(200);
        }
        let after = server.repo.get_subscription("core", "compute.example.com").await.unwrap().unwrap();
        assert!(after.revision > before);
        assert_eq!((after.value.active, after.value.current_sync_id.as_str()), (true, ""));
    }
}
