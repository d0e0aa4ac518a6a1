//! Staged rollouts over HTTP (§12, §4.2 *(3rd)*): a registration's
//! `rollout` policy (validated, each violation naming its field),
//! `GET/PUT /apiregistrations/:name/rollout` (the §12 shape, operators'
//! actions, 409 for an action the state refuses, RBAC, audit, watch), and
//! what `/status` shows of a rollout (`held`, each subscriber's `wave`).
//! The reconcilers are played by writing rollout records and subscription
//! results through the repository.

use std::collections::BTreeMap;
use std::time::SystemTime;

use kayra_core::rollout::{Counts, RolloutPolicy, RolloutRecord, assign};
use reqwest::Method;
use serde_json::{Value, json};

use super::watch::Events;
use crate::both_backends;
use crate::common::Server;

const API: &str = "compute.example.com";

fn rollout_path() -> String {
    format!("/apiregistrations/{API}/rollout")
}

fn status_path() -> String {
    format!("/apiregistrations/{API}/status")
}

fn rule(resources: &[&str], verbs: &[&str]) -> Value {
    json!([{"apis": ["catalog.example.com"], "resources": resources, "verbs": verbs}])
}

/// Two waves: `canary` (one subscriber, automatic) and `rest` (manual).
fn two_waves() -> Value {
    json!({"waves": [{"name": "canary", "size": "1", "approval": "auto"}, {"name": "rest", "approval": "manual"}]})
}

/// Starts a rollout of [`API`] toward `sync_id` over `subscribers` as a
/// reconciler would, and writes its record.
async fn seed(server: &Server, sync_id: &str, policy: &Value, subscribers: &[&str]) -> RolloutRecord {
    let policy: RolloutPolicy = serde_json::from_value(policy.clone()).expect("a policy");
    let subscribers: Vec<(String, BTreeMap<String, String>)> =
        subscribers.iter().map(|ns| (ns.to_string(), BTreeMap::new())).collect();
    let (record, _) = RolloutRecord::start(API, sync_id, &policy, assign(&policy, &subscribers), SystemTime::now());
    let seen = server.repo.rollout(API).await.unwrap().map(|r| r.revision);
    server.repo.write_rollout(API, seen, &record, &[]).await.unwrap().expect("the record is written");
    record
}

/// Advances the stored rollout with these per-wave counts, as a reconciler's driver would.
async fn step(server: &Server, counts: &[Counts]) -> RolloutRecord {
    let current = server.repo.rollout(API).await.unwrap().expect("a rollout");
    let mut next = current.value.clone();
    next.step(counts, SystemTime::now());
    server.repo.write_rollout(API, Some(current.revision), &next, &[]).await.unwrap().expect("written");
    next
}

/// Namespaces `names`, each subscribed to [`API`] and synced to `sync_id`.
async fn synced_subscribers(server: &Server, names: &[&str], sync_id: &str) {
    for ns in names {
        server.namespace(ns).await;
        server.subscribe(ns, API).await;
        succeed(server, ns, sync_id).await;
    }
}

async fn succeed(server: &Server, ns: &str, sync_id: &str) {
    let seen = server.repo.get_subscription(ns, API).await.unwrap().unwrap();
    crate::common::record_result(&server.repo, &seen, Some(sync_id)).await;
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value.as_object().expect("an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

/// `(held, pending)` and each subscriber's `(namespace, wave)`.
fn holds(status: &Value) -> (u64, u64, Vec<(String, String)>) {
    let waves = status["subscribers"].as_array().unwrap().iter();
    let waves = waves.map(|s| (s["namespace"].as_str().unwrap().into(), s["wave"].as_str().unwrap().into()));
    (status["held"].as_u64().expect("held"), status["pending"].as_u64().unwrap(), waves.collect())
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

both_backends! {
    async fn a_policy_round_trips_through_create_put_and_patch_and_null_clears_it(server: Server) {
        let policy = json!({
            "waves": [
                {"name": "canary", "selector": {"tier": "canary"}, "size": "2", "bake": "5m", "approval": "auto",
                 "gate": {"method": "get", "endpoint": "https://metrics.example.com/ok?api=compute",
                          "wait": [{"key": ".status", "successes": ["ok"], "failures": ["bad"]}], "timeout": "2m"}},
                {"name": "early", "size": "10%", "bake": "15m", "max_failures": "1", "approval": "auto"},
                {"name": "rest", "approval": "manual", "max_failures": "2%"}
            ],
            "on_failure": "abort",
            "progress_deadline": "1h"
        });
        let created = server.registration(API, json!({"rollout": policy})).await;
        assert_eq!(created["rollout"]["waves"], policy["waves"], "{created}");
        assert_eq!(created["rollout"]["on_failure"], "abort");
        assert_eq!(server.get(&format!("/apiregistrations/{API}")).await.expect(200)["rollout"], created["rollout"]);
        let put = server.put(&format!("/apiregistrations/{API}"), json!({"rollout": two_waves()})).await.expect(200);
        assert_eq!(put["rollout"]["waves"], two_waves()["waves"], "{put}");
        assert_eq!(put["rollout"]["on_failure"], "pause", "the default");
        let patched = server
            .patch(&format!("/apiregistrations/{API}"), json!({"rollout": {"progress_deadline": "30m"}}))
            .await
            .expect(200);
        assert_eq!(patched["rollout"]["progress_deadline"], "30m");
        assert_eq!(patched["rollout"]["waves"], two_waves()["waves"], "a merge patch keeps the waves");
        let cleared = server.patch(&format!("/apiregistrations/{API}"), json!({"rollout": null})).await.expect(200);
        assert!(cleared.get("rollout").is_none_or(Value::is_null), "{cleared}");
        let again = server.get(&format!("/apiregistrations/{API}")).await.expect(200);
        assert!(again.get("rollout").is_none_or(Value::is_null), "{again}");
        // A PUT without the field clears it too.
        server.put(&format!("/apiregistrations/{API}"), json!({"rollout": two_waves()})).await.expect(200);
        let put = server.put(&format!("/apiregistrations/{API}"), json!({"description": "d"})).await.expect(200);
        assert!(put.get("rollout").is_none_or(Value::is_null), "{put}");
    }

    async fn a_bad_policy_is_400_naming_its_field(server: Server) {
        let wave = |extra: Value| {
            let mut wave = json!({"name": "w"});
            crate::common::merge(&mut wave, extra);
            json!({"waves": [wave]})
        };
        let many: Vec<Value> = (0..21).map(|i| json!({"name": format!("w{i}")})).collect();
        let cases = [
            (json!({"waves": []}), "rollout.waves"),
            (json!({"waves": many}), "rollout.waves"),
            (json!({"waves": [{"name": "a"}, {"name": "a"}]}), "rollout.waves[1].name"),
            (wave(json!({"name": "Not_A_Label"})), "rollout.waves[0].name"),
            (wave(json!({"size": "0"})), "rollout.waves[0].size"),
            (wave(json!({"size": "101%"})), "rollout.waves[0].size"),
            (wave(json!({"size": "lots"})), "rollout.waves[0].size"),
            (wave(json!({"bake": "soon"})), "rollout.waves[0].bake"),
            (wave(json!({"max_failures": "-1"})), "rollout.waves[0].max_failures"),
            (wave(json!({"max_failures": "0%"})), "rollout.waves[0].max_failures"),
            (wave(json!({"gate": "https://example.com"})), "rollout.waves[0].gate"),
            (wave(json!({"gate": {"method": "get", "endpoint": "https://m.example.com/{{ .Rollout.Api"}})),
             "rollout.waves[0].gate"),
            (json!({"waves": [{"name": "w"}], "progress_deadline": "never"}), "rollout.progress_deadline"),
        ];
        for (policy, field) in &cases {
            let message = server
                .post("/apiregistrations", json!({"name": API, "rollout": policy}))
                .await
                .error(400, &[field]);
            assert!(!message.contains("internal"), "{message}");
        }
        // Unknown fields and values are refused too.
        server.post("/apiregistrations", json!({"name": API, "rollout": wave(json!({"approval": "later"}))})).await.error(400, &[]);
        server.post("/apiregistrations", json!({"name": API, "rollout": {"waves": [{"name": "w"}], "on_failure": "explode"}})).await.error(400, &[]);
        // Nothing was created; PUT and PATCH check the same rules.
        server.get(&format!("/apiregistrations/{API}")).await.error(404, &[API]);
        server.registration(API, json!({})).await;
        server.put(&format!("/apiregistrations/{API}"), json!({"rollout": wave(json!({"size": "0"}))})).await
            .error(400, &["rollout.waves[0].size"]);
        server.patch(&format!("/apiregistrations/{API}"), json!({"rollout": {"waves": [{"name": "a"}, {"name": "b", "bake": "x"}]}})).await
            .error(400, &["rollout.waves[1].bake"]);
        let unchanged = server.get(&format!("/apiregistrations/{API}")).await.expect(200);
        assert!(unchanged.get("rollout").is_none_or(Value::is_null), "{unchanged}");
    }

    async fn the_rollout_shows_its_waves_and_takes_actions(server: Server) {
        server.registration(API, json!({"sync_id": "s2", "rollout": two_waves()})).await;
        server.get(&rollout_path()).await.error(404, &[API]);
        server.put(&rollout_path(), json!({"action": "pause"})).await.error(404, &[API]);
        server.get("/apiregistrations/missing.example.com/rollout").await.error(404, &["missing.example.com"]);
        seed(&server, "s2", &two_waves(), &["a", "b", "c"]).await;

        let rollout = server.get(&rollout_path()).await.expect(200);
        assert_eq!(keys(&rollout), ["api", "reason", "started_at", "state", "sync_id", "updated_at", "wave", "waves"], "{rollout}");
        assert_eq!((&rollout["api"], &rollout["sync_id"], &rollout["state"], &rollout["wave"]),
            (&json!(API), &json!("s2"), &json!("progressing"), &json!(0)));
        for wave in rollout["waves"].as_array().unwrap() {
            assert_eq!(keys(wave), ["failed", "finished_at", "gate", "name", "pending", "started_at", "state", "synced", "total"], "{wave}");
        }
        let waves = &rollout["waves"];
        assert_eq!((&waves[0]["name"], &waves[0]["state"], &waves[0]["total"], &waves[0]["pending"]),
            (&json!("canary"), &json!("progressing"), &json!(1), &json!(1)));
        assert!(waves[0]["started_at"].as_str().unwrap().ends_with('Z'));
        assert_eq!((&waves[1]["name"], &waves[1]["state"], &waves[1]["total"], &waves[1]["started_at"], &waves[1]["gate"]),
            (&json!("rest"), &json!("pending"), &json!(2), &json!(""), &Value::Null));

        // pause, pause again (409), resume.
        let paused = server.call(Method::PUT, &rollout_path(), Some(&server.admin), Some(json!({"action": "pause", "reason": "error rate up"})))
            .await.expect(200);
        assert_eq!(paused["state"], "paused");
        let reason = paused["reason"].as_str().unwrap();
        assert!(reason.contains("admin: error rate up"), "{reason}");
        assert_eq!(server.get(&rollout_path()).await.expect(200), paused);
        server.put(&rollout_path(), json!({"action": "pause"})).await.error(409, &["paused", "pause"]);
        server.put(&rollout_path(), json!({"action": "promote"})).await.error(409, &["paused", "promote"]);
        let resumed = server.put(&rollout_path(), json!({"action": "resume"})).await.expect(200);
        assert_eq!((&resumed["state"], &resumed["reason"]), (&json!("progressing"), &json!("")));

        // The canary is done: the manual wave waits for a promote.
        let record = step(&server, &[Counts { synced: 1, ..Counts::default() }, Counts { pending: 2, ..Counts::default() }]).await;
        assert_eq!(record.rollout.state.as_str(), "waiting");
        server.put(&rollout_path(), json!({"action": "resume"})).await.error(409, &["waiting", "resume"]);
        let promoted = server.put(&rollout_path(), json!({"action": "promote", "reason": "canary looks fine"})).await.expect(200);
        assert_eq!((&promoted["state"], &promoted["wave"], &promoted["waves"][1]["state"]),
            (&json!("progressing"), &json!(1), &json!("progressing")));
        assert_eq!(promoted["waves"][0]["state"], "completed");

        let aborted = server.put(&rollout_path(), json!({"action": "abort", "reason": "stop"})).await.expect(200);
        assert_eq!(aborted["state"], "aborted");
        assert!(aborted["reason"].as_str().unwrap().contains("admin: stop"), "{aborted}");
        server.put(&rollout_path(), json!({"action": "resume"})).await.error(409, &["aborted", "resume"]);

        // Bad bodies.
        server.put(&rollout_path(), json!({"action": "restart"})).await.error(400, &["action"]);
        server.put(&rollout_path(), json!({})).await.error(400, &["action"]);
        server.put(&rollout_path(), json!({"action": "pause", "extra": 1})).await.error(400, &["extra"]);
    }

    async fn rollout_actions_need_their_rbac_and_are_audited(server: Server) {
        server.registration(API, json!({"sync_id": "s2", "rollout": two_waves()})).await;
        seed(&server, "s2", &two_waves(), &["a", "b"]).await;
        let nobody = server.user_with_rules("nobody", rule(&["apiregistrations", "apiregistrations/status"], &["get", "update"])).await;
        server.call(Method::GET, &rollout_path(), Some(&nobody), None).await.error(403, &["apiregistrations/rollout", "get"]);
        let reader = server.user_with_rules("reader", rule(&["apiregistrations/rollout"], &["get"])).await;
        server.call(Method::GET, &rollout_path(), Some(&reader), None).await.expect(200);
        server.call(Method::PUT, &rollout_path(), Some(&reader), Some(json!({"action": "pause"}))).await
            .error(403, &["apiregistrations/rollout", "update"]);
        let url = format!("{}?watch=true", rollout_path());
        server.call(Method::GET, &url, Some(&reader), None).await.error(403, &["apiregistrations/rollout", "watch"]);
        let operator = server.user_with_rules("operator", rule(&["apiregistrations/rollout"], &["get", "update"])).await;
        let before = server.get("/audit?resource=apiregistrations/rollout").await.expect(200)["items"].as_array().unwrap().len();
        assert_eq!(before, 0, "refused actions leave no record");
        let paused = server.call(Method::PUT, &rollout_path(), Some(&operator), Some(json!({"action": "pause", "reason": "look"}))).await.expect(200);
        assert!(paused["reason"].as_str().unwrap().contains("operator: look"), "{paused}");
        // A refused action (409) writes nothing.
        server.call(Method::PUT, &rollout_path(), Some(&operator), Some(json!({"action": "pause"}))).await.error(409, &["paused"]);
        let audit = server.get("/audit?resource=apiregistrations/rollout").await.expect(200);
        let items = audit["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{audit}");
        let item = &items[0];
        assert_eq!((&item["user"], &item["verb"], &item["name"], &item["code"]), (&json!("operator"), &json!("update"), &json!(API), &json!(200)));
        assert_eq!((&item["before"]["state"], &item["after"]["state"]), (&json!("progressing"), &json!("paused")), "{item}");
        assert!(item["after"].get("records").is_none() && item["after"].get("policy").is_none(), "{item}");
    }

    async fn a_rollout_watch_streams_each_action(server: Server) {
        server.registration(API, json!({"sync_id": "s2", "rollout": two_waves()})).await;
        seed(&server, "s2", &two_waves(), &["a", "b"]).await;
        let mut events = Events::open(&server, &rollout_path(), &server.admin, false).await;
        let (kind, first) = events.next().await;
        assert_eq!((kind.as_str(), &first), ("ADDED", &server.get(&rollout_path()).await.expect(200)));
        let paused = server.put(&rollout_path(), json!({"action": "pause"})).await.expect(200);
        let (kind, modified) = events.next().await;
        assert_eq!((kind.as_str(), &modified), ("MODIFIED", &paused));
        assert!(modified.get("records").is_none(), "no assignment leaks: {modified}");
    }

    async fn the_status_shows_who_a_rollout_holds_and_each_ones_wave(server: Server) {
        server.registration(API, json!({"sync_id": "s1", "rollout": two_waves()})).await;
        synced_subscribers(&server, &["a", "b", "c", "d"], "s1").await;
        let status = server.get(&status_path()).await.expect(200);
        assert_eq!(holds(&status).0, 0, "{status}");

        // The SyncID moves: until the reconcilers record the rollout, every
        // subscriber it will move is held; a force re-sync and a first sync are not.
        server.put(&format!("/apiregistrations/{API}"), json!({"sync_id": "s2", "rollout": two_waves()})).await.expect(200);
        server.namespace("e").await;
        server.subscribe("e", API).await;
        succeed(&server, "e", "s1").await;
        server.put(&format!("/namespaces/e/subscriptions/{API}/sync"), json!({})).await.expect(200);
        server.namespace("f").await;
        server.subscribe("f", API).await;
        let status = server.get(&status_path()).await.expect(200);
        assert_eq!(holds(&status), (4, 6, pairs(&[("a", ""), ("b", ""), ("c", ""), ("d", ""), ("e", ""), ("f", "")])), "{status}");

        // The rollout starts: the canary (a) runs, the rest wait.
        seed(&server, "s2", &two_waves(), &["a", "b", "c", "d"]).await;
        let mut events = Events::open(&server, &status_path(), &server.admin, false).await;
        let status = server.get(&status_path()).await.expect(200);
        let waves = pairs(&[("a", "canary"), ("b", "rest"), ("c", "rest"), ("d", "rest"), ("e", ""), ("f", "")]);
        assert_eq!(holds(&status), (3, 6, waves.clone()), "{status}");
        assert_eq!(events.next().await, ("ADDED".to_string(), status));
        // Paged: the count still covers everyone.
        let page = server.get(&format!("{}?limit=2", status_path())).await.expect(200);
        assert_eq!(holds(&page), (3, 6, waves[..2].to_vec()), "{page}");

        succeed(&server, "a", "s2").await;
        assert_eq!(holds(&server.get(&status_path()).await.expect(200)).0, 3);
        let record = step(&server, &[Counts { synced: 1, ..Counts::default() }, Counts { pending: 3, ..Counts::default() }]).await;
        assert_eq!(record.rollout.state.as_str(), "waiting");
        assert_eq!(holds(&server.get(&status_path()).await.expect(200)).0, 3, "a waiting wave has not started");

        // A promote releases the rest; the stream follows the record.
        server.put(&rollout_path(), json!({"action": "promote"})).await.expect(200);
        let released = loop {
            let (kind, status) = events.next().await;
            assert_eq!(kind, "MODIFIED");
            if holds(&status).0 == 0 {
                break status;
            }
        };
        assert_eq!(holds(&released), (0, 5, waves.clone()));
        assert_eq!(released, server.get(&status_path()).await.expect(200));
        succeed(&server, "b", "s2").await;
        // A pause holds the started wave's pending ones too; b is synced.
        server.put(&rollout_path(), json!({"action": "pause"})).await.expect(200);
        let paused = loop {
            let (_, status) = events.next().await;
            if holds(&status).0 == 2 {
                break status;
            }
        };
        assert_eq!(holds(&paused), (2, 4, waves.clone()), "{paused}");
        server.put(&rollout_path(), json!({"action": "abort"})).await.expect(200);
        assert_eq!(holds(&server.get(&status_path()).await.expect(200)), (2, 4, waves.clone()));
        // A failed subscriber is not pending, so not held.
        let c = server.repo.get_subscription("c", API).await.unwrap().unwrap();
        crate::common::record_result(&server.repo, &c, None).await;
        let status = server.get(&status_path()).await.expect(200);
        assert_eq!((holds(&status).0, &status["failed"]), (1, &json!(1)), "{status}");

        // The SyncID moves again: the record is for another SyncID (no
        // waves shown), and the next rollout is about to start.
        server.put(&format!("/apiregistrations/{API}"), json!({"sync_id": "s3", "rollout": two_waves()})).await.expect(200);
        let status = server.get(&status_path()).await.expect(200);
        let none = pairs(&[("a", ""), ("b", ""), ("c", ""), ("d", ""), ("e", ""), ("f", "")]);
        // a, b at s2 and d at s1 are moving; c failed, e re-syncs, f is a first sync.
        assert_eq!(holds(&status), (3, 5, none.clone()), "{status}");
        // Without a policy nothing is held.
        server.patch(&format!("/apiregistrations/{API}"), json!({"rollout": null})).await.expect(200);
        assert_eq!(holds(&server.get(&status_path()).await.expect(200)), (0, 5, none));
    }
}
