//! Writes that span records are atomic (platform §3; issue 10 items 11,
//! 15, 16): many rounds of racing creates and deletes through the API, on
//! both backends, never leave a survivor, a dangling reference, or a
//! duplicate short name.

use futures::future::join;
use kayra_catalog::repo::{Collection, RecordRef};
use reqwest::Method;
use serde_json::json;

use crate::both_backends;

const ROUNDS: usize = 20;
/// The token race reproduced about once in 240 tries before the fix.
const TOKEN_ROUNDS: usize = 120;

both_backends! {
    async fn short_names_stay_unique_under_racing_writes(server: Server) {
        for round in 0..ROUNDS {
            let short = format!("s{round}");
            let (a, b) = join(
                server.post("/apiregistrations", json!({"name": format!("a{round}.example.com"), "short_name": short})),
                server.post("/apiregistrations", json!({"name": format!("b{round}.example.com"), "short_name": short})),
            )
            .await;
            let mut codes = [a.status, b.status];
            codes.sort_unstable();
            assert_eq!(codes, [201, 409], "round {round}: {} / {}", a.text, b.text);
        }
        // Racing renames onto one free short name: one wins.
        for round in 0..ROUNDS {
            let short = format!("r{round}");
            let (x, y) = (format!("x{round}.example.com"), format!("y{round}.example.com"));
            server.registration(&x, json!({})).await;
            server.registration(&y, json!({"short_name": format!("y{round}")})).await;
            let (a, b) = join(
                server.patch(&format!("/apiregistrations/{x}"), json!({"short_name": short})),
                server.patch(&format!("/apiregistrations/{y}"), json!({"short_name": short})),
            )
            .await;
            let mut codes = [a.status, b.status];
            codes.sort_unstable();
            assert_eq!(codes, [200, 409], "round {round}: {} / {}", a.text, b.text);
        }
        let all = server.get("/apiregistrations").await.expect(200);
        let mut shorts: Vec<&str> = all["items"].as_array().unwrap().iter().filter_map(|r| r["short_name"].as_str()).filter(|s| !s.is_empty()).collect();
        let count = shorts.len();
        shorts.sort_unstable();
        shorts.dedup();
        assert_eq!(shorts.len(), count, "no short name twice: {all}");
        // A short name freed by a rename or a delete can be claimed again.
        let holder = all["items"].as_array().unwrap().iter().find(|r| r["short_name"] == "s0").unwrap()["name"].as_str().unwrap().to_string();
        server.patch(&format!("/apiregistrations/{holder}"), json!({"short_name": "fresh"})).await.expect(200);
        server.post("/apiregistrations", json!({"name": "c.example.com", "short_name": "s0"})).await.expect(201);
        server.delete("/apiregistrations/c.example.com").await.expect(204);
        server.post("/apiregistrations", json!({"name": "d.example.com", "short_name": "s0"})).await.expect(201);
    }

    async fn a_token_issued_while_its_user_is_deleted_does_not_survive(server: Server) {
        for round in 0..TOKEN_ROUNDS {
            let user = format!("u{round}");
            server.post("/users", json!({"name": user})).await.expect(201);
            let (issued, deleted) = join(
                server.post(&format!("/users/{user}/tokens"), json!({})),
                server.delete(&format!("/users/{user}")),
            )
            .await;
            assert_eq!(deleted.status, 204, "{}", deleted.text);
            assert!(issued.status == 201 || issued.status == 404, "round {round}: {}", issued.text);
            // The same name again: the raced token must not authenticate it.
            server.post("/users", json!({"name": user})).await.expect(201);
            if issued.status == 201 {
                let token = issued.json["token"].as_str().expect("token").to_string();
                let reply = server.call(Method::GET, "/namespaces", Some(&token), None).await;
                assert_eq!(reply.status, 401, "round {round}: a token of the deleted user authenticates: {}", reply.text);
            }
            let tokens = server.get(&format!("/users/{user}/tokens")).await.expect(200);
            assert_eq!(tokens["items"], json!([]), "round {round}");
        }
    }

    async fn a_role_binding_created_while_its_namespace_is_deleted_does_not_survive(server: Server) {
        for round in 0..ROUNDS {
            let ns = format!("n{round}");
            server.namespace(&ns).await;
            let (bound, deleted) = join(
                server.post(&format!("/namespaces/{ns}/rolebindings"), json!({"name": "b", "role": "sysadmin", "user": "eve"})),
                server.delete(&format!("/namespaces/{ns}")),
            )
            .await;
            assert_eq!(deleted.status, 204, "{}", deleted.text);
            assert!(bound.status == 201 || bound.status == 404, "round {round}: {}", bound.text);
            server.namespace(&ns).await;
            let bindings = server.get(&format!("/namespaces/{ns}/rolebindings")).await.expect(200);
            assert_eq!(bindings["items"], json!([]), "round {round}: a binding survived into the re-created namespace");
        }
    }

    async fn a_subscription_never_outlives_its_registration_or_namespace(server: Server) {
        for round in 0..ROUNDS {
            let (ns, api) = (format!("n{round}"), format!("api{round}.example.com"));
            server.namespace(&ns).await;
            server.registration(&api, json!({})).await;
            let path = format!("/namespaces/{ns}/subscriptions");
            // Against the registration's delete.
            let (created, deleted) =
                join(server.post(&path, json!({"api": api})), server.delete(&format!("/apiregistrations/{api}"))).await;
            match (created.status, deleted.status) {
                (201, 409) => server.get(&format!("/apiregistrations/{api}")).await.expect(200),
                (404, 204) => server.get(&format!("{path}/{api}")).await.error(404, &[]).into(),
                other => panic!("round {round}: create/delete answered {other:?}: {} / {}", created.text, deleted.text),
            };
            // Against the namespace's delete (the subscription of a sibling deployment counts too).
            server.delete(&format!("{path}/{api}")).await;
            if server.repo.get_registration(&api).await.unwrap().is_none() {
                server.registration(&api, json!({})).await;
            }
            let (created, deleted) = join(server.post(&path, json!({"api": api})), server.delete(&format!("/namespaces/{ns}"))).await;
            match (created.status, deleted.status) {
                (201, 409) => server.get(&format!("{path}/{api}")).await.expect(200),
                (404, 204) => {
                    assert!(server.repo.get_subscription(&ns, &api).await.unwrap().is_none(), "round {round}: dangling subscription");
                    json!(null)
                }
                other => panic!("round {round}: create/delete answered {other:?}: {} / {}", created.text, deleted.text),
            };
        }
    }

    async fn deleting_a_subscription_deletes_its_runs_and_attempt_record(server: Server) {
        server.namespace("core").await;
        server.registration("compute.example.com", json!({})).await;
        server.subscribe("core", "compute.example.com").await;
        let (store, repo) = (server.repo.store(), &server.repo);
        let (namespace, api, neighbour) = ("core", "compute.example.com", "compute.example.comx");
        // Its run history, and run records and a run counter an earlier
        // build left.
        let run = |api: &str| kayra_core::Run { id: "r".into(), namespace: namespace.into(), api: api.into(), ..Default::default() };
        repo.add_run(&run(api), 20).await.unwrap();
        for slot in [1, 2] {
            store.create(&repo.store_key_of(RecordRef::RunSlot { namespace, api, slot }), b"{}".to_vec()).await.unwrap();
        }
        repo.add_run(&run(neighbour), 20).await.unwrap();
        let neighbour_run = repo.store_key_of(RecordRef::RunSlot { namespace, api: neighbour, slot: 1 });
        store.create(&neighbour_run, b"{}".to_vec()).await.unwrap();
        let attempt = repo.store_key_of(RecordRef::Attempt { namespace, api });
        store.create(&attempt, b"{}".to_vec()).await.unwrap();
        let cursor = repo.store_key_of(RecordRef::RunCursor { namespace, api });
        store.create(&cursor, b"{}".to_vec()).await.unwrap();
        let history = repo.store_key_of(RecordRef::Runs { namespace, api });
        let runs = repo.layout().prefix(Collection::RunSlots { namespace, api });
        let neighbour = repo.store_key_of(RecordRef::Runs { namespace, api: neighbour });

        server.delete("/namespaces/core/subscriptions/compute.example.com").await.expect(204);
        assert_eq!(store.get(&history).await.unwrap().0, None, "the run history deleted with the subscription");
        assert!(store.list_all(&runs).await.unwrap().0.is_empty(), "earlier builds' runs deleted with it");
        assert_eq!(store.get(&attempt).await.unwrap().0, None, "attempt record deleted with the subscription");
        assert_eq!(store.get(&cursor).await.unwrap().0, None, "an earlier build's run counter too");
        // Another subscription's runs stay (its key starts with this one's).
        assert_eq!(store.list_all(&neighbour).await.unwrap().0.len(), 2, "its history and its earlier run");
        // And the registration and the namespace can go now.
        server.delete("/apiregistrations/compute.example.com").await.expect(204);
        server.delete("/namespaces/core").await.expect(204);
    }

    async fn a_new_bootstrap_token_revokes_only_the_previous_one(server: Server) {
        let other = server.post("/users/admin/tokens", json!({})).await.expect(201)["token"].as_str().unwrap().to_string();
        let first = server.admin.clone();
        let second = "second-bootstrap-token-0123456789abcdef".to_string();
        let restarted = server.restart_with(|c| c.auth.bootstrap_token = second.clone()).await;
        let status = |token: String| {
            let restarted = &restarted;
            async move { restarted.call(Method::GET, "/namespaces", Some(&token), None).await.status }
        };
        assert_eq!(status(second.clone()).await, 200, "the new bootstrap token works");
        assert_eq!(status(first.clone()).await, 401, "the previous bootstrap token is revoked");
        assert_eq!(status(other.clone()).await, 200, "admin's other tokens are untouched");
        // The same token again changes nothing; going back revokes the second.
        let again = server.restart_with(|c| c.auth.bootstrap_token = second.clone()).await;
        assert_eq!(again.call(Method::GET, "/namespaces", Some(&second), None).await.status, 200);
        let back = server.restart_with(|c| c.auth.bootstrap_token = first.clone()).await;
        assert_eq!(back.call(Method::GET, "/namespaces", Some(&first), None).await.status, 200);
        assert_eq!(back.call(Method::GET, "/namespaces", Some(&second), None).await.status, 401);
        assert_eq!(back.call(Method::GET, "/namespaces", Some(&other), None).await.status, 200);
    }
}
