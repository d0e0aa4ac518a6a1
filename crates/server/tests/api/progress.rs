//! Fan-out progress (§4.2): `sync_id_updated_at` on registrations and the
//! `synced` / `failed` / `pending` counts of `/status`. The reconciler is
//! played by writing subscription states through the repository.

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::both_backends;
use crate::common::Server;

const API: &str = "compute.example.com";

/// The time a `sync_id_updated_at` names, checking its format: RFC 3339,
/// UTC (`Z`), with a fractional second.
#[track_caller]
fn stamp(reg: &Value) -> SystemTime {
    let text = reg["sync_id_updated_at"].as_str().unwrap_or_else(|| panic!("no sync_id_updated_at in {reg}"));
    assert!(text.ends_with('Z') && text.contains('.'), "{text:?} is not UTC with sub-second precision");
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

/// The counts of `/status`, checking that they add up.
async fn counts(server: &Server) -> (u64, u64, u64, u64) {
    let status = server.get(&format!("/apiregistrations/{API}/status")).await.expect(200);
    let n = |k: &str| status[k].as_u64().unwrap_or_else(|| panic!("{k} missing from {status}"));
    let (total, synced, failed, pending) = (n("total"), n("synced"), n("failed"), n("pending"));
    assert_eq!(total, synced + failed + pending, "{status}");
    assert_eq!(total as usize, status["subscribers"].as_array().unwrap().len(), "{status}");
    (total, synced, failed, pending)
}

async fn succeed(server: &Server, ns: &str, sync_id: &str) {
    let seen = server.repo.get_subscription(ns, API).await.unwrap().unwrap();
    crate::common::record_result(&server.repo, &seen, Some(sync_id)).await;
}

async fn fail(server: &Server, ns: &str) {
    let seen = server.repo.get_subscription(ns, API).await.unwrap().unwrap();
    crate::common::record_result(&server.repo, &seen, None).await;
}

both_backends! {
    async fn sync_id_updated_at_moves_only_with_the_sync_id(server: Server) {
        let before = SystemTime::now();
        let created = server.registration(API, json!({"sync_id": "s1", "description": "d"})).await;
        let t0 = stamp(&created);
        assert!(t0 >= before - std::time::Duration::from_millis(1), "stamped in the past");
        assert_eq!(server.get(&format!("/apiregistrations/{API}")).await.expect(200), created);

        // Writes that leave the SyncID alone leave the stamp alone. The
        // stamps have millisecond resolution: a pause of 2 ms makes a
        // re-stamp visible.
        let tick = || tokio::time::sleep(std::time::Duration::from_millis(2));
        tick().await;
        let edited = server.put(&format!("/apiregistrations/{API}"), json!({"description": "e"})).await.expect(200);
        assert_eq!(edited["sync_id_updated_at"], created["sync_id_updated_at"]);
        let same = server.put(&format!("/apiregistrations/{API}"), json!({"sync_id": "s1"})).await.expect(200);
        assert_eq!(same["sync_id_updated_at"], created["sync_id_updated_at"]);
        let patched = server.patch(&format!("/apiregistrations/{API}"), json!({"mode": "api"})).await.expect(200);
        assert_eq!(patched["sync_id_updated_at"], created["sync_id_updated_at"]);

        // Each way of moving it stamps it anew.
        tick().await;
        let put = server.put(&format!("/apiregistrations/{API}"), json!({"sync_id": "s2"})).await.expect(200);
        let t1 = stamp(&put);
        assert!(t1 >= t0 && put["sync_id_updated_at"] != created["sync_id_updated_at"], "{put}");
        tick().await;
        let patched = server.patch(&format!("/apiregistrations/{API}"), json!({"sync_id": "s3"})).await.expect(200);
        let t2 = stamp(&patched);
        assert!(t2 >= t1 && patched["sync_id_updated_at"] != put["sync_id_updated_at"], "{patched}");
        tick().await;
        let synced = server.put(&format!("/apiregistrations/{API}/sync"), json!({})).await.expect(200);
        assert_ne!(synced["sync_id"], "s3");
        assert!(stamp(&synced) >= t2 && synced["sync_id_updated_at"] != patched["sync_id_updated_at"], "{synced}");
        let status = server.get(&format!("/apiregistrations/{API}/status")).await.expect(200);
        assert_eq!(status["sync_id_updated_at"], synced["sync_id_updated_at"]);
        assert_eq!(server.get(&format!("/apiregistrations/{API}")).await.expect(200), synced);
    }

    async fn sync_id_updated_at_is_computed(server: Server) {
        let body = json!({"name": API, "sync_id_updated_at": "2026-01-01T00:00:00.000Z"});
        server.post("/apiregistrations", body).await.error(400, &["sync_id_updated_at"]);
        server.registration(API, json!({})).await;
        let stamp = json!({"sync_id_updated_at": "2026-01-01T00:00:00.000Z"});
        server.put(&format!("/apiregistrations/{API}"), stamp.clone()).await.error(400, &["sync_id_updated_at"]);
        server.patch(&format!("/apiregistrations/{API}"), stamp).await.error(400, &["sync_id_updated_at"]);
    }

    async fn status_counts_add_up_during_a_fan_out_with_failures(server: Server) {
        server.registration(API, json!({"sync_id": "s1"})).await;
        let namespaces: Vec<String> = (0..6).map(|i| format!("team-{i}")).collect();
        for ns in &namespaces {
            server.namespace(ns).await;
            server.subscribe(ns, API).await;
        }
        assert_eq!(counts(&server).await, (6, 0, 0, 6));
        for ns in &namespaces {
            succeed(&server, ns, "s1").await;
        }
        assert_eq!(counts(&server).await, (6, 6, 0, 0));

        // The bump makes everyone pending; then the fan-out lands one by one.
        let bumped = server.put(&format!("/apiregistrations/{API}/sync"), json!({})).await.expect(200);
        let s2 = bumped["sync_id"].as_str().unwrap().to_string();
        assert_eq!(counts(&server).await, (6, 0, 0, 6));
        succeed(&server, &namespaces[0], &s2).await;
        succeed(&server, &namespaces[1], &s2).await;
        assert_eq!(counts(&server).await, (6, 2, 0, 4));
        fail(&server, &namespaces[2]).await;
        fail(&server, &namespaces[3]).await;
        assert_eq!(counts(&server).await, (6, 2, 2, 2));
        // A later success of a failed one moves it from failed to synced.
        succeed(&server, &namespaces[3], &s2).await;
        succeed(&server, &namespaces[4], &s2).await;
        assert_eq!(counts(&server).await, (6, 4, 1, 1));
        // A failed subscriber whose registration moves again is still failed
        // (its last sync failed), an inactive new one is pending.
        server.namespace("late").await;
        server.subscribe("late", API).await;
        assert_eq!(counts(&server).await, (7, 4, 1, 2));
        fail(&server, "late").await;
        succeed(&server, &namespaces[5], &s2).await;
        assert_eq!(counts(&server).await, (7, 5, 2, 0));
    }
}
