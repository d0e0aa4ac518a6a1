use std::time::{Duration, SystemTime};

use super::*;

fn wave(name: &str) -> WavePolicy {
    WavePolicy { name: name.into(), ..WavePolicy::default() }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn subscribers(n: usize) -> Vec<(String, BTreeMap<String, String>)> {
    (0..n).map(|i| (format!("ns{i:03}"), BTreeMap::new())).collect()
}

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn at(secs: u64) -> SystemTime {
    t0() + Duration::from_secs(secs)
}

fn counts(synced: usize, failed: usize, pending: usize) -> Counts {
    Counts { synced, failed, pending }
}

#[test]
fn assignment_takes_selectors_counts_and_rounded_up_percentages_in_name_order() {
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { selector: labels(&[("tier", "canary")]), size: "2".into(), ..wave("canary") },
            WavePolicy { size: "10%".into(), ..wave("early") },
            wave("rest"),
        ],
        ..RolloutPolicy::default()
    };
    let mut subs = subscribers(15);
    for i in [3, 7, 9] {
        subs[i].1 = labels(&[("tier", "canary")]);
    }
    let waves = assign(&policy, &subs);
    assert_eq!(waves[0], ["ns003", "ns007"], "the first two canaries by name; the third has no room");
    // 10% of 15 rounds up to 2: the first two others by name.
    assert_eq!(waves[1], ["ns000", "ns001"]);
    assert_eq!(waves[2].len(), 11, "the last wave takes the rest, the third canary included");
    assert!(waves[2].contains(&"ns009".to_string()));
    // The same inputs in another order give the same assignment.
    subs.reverse();
    assert_eq!(assign(&policy, &subs), waves);
}

#[test]
fn the_last_wave_takes_the_rest_whatever_its_selector_and_size() {
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { selector: labels(&[("env", "dev")]), ..wave("dev") },
            WavePolicy { selector: labels(&[("env", "prod")]), size: "1".into(), ..wave("prod") },
        ],
        ..RolloutPolicy::default()
    };
    let subs = vec![
        ("a".to_string(), labels(&[("env", "dev")])),
        ("b".to_string(), labels(&[("env", "dev"), ("x", "y")])),
        ("c".to_string(), labels(&[])),
        ("d".to_string(), labels(&[("env", "prod")])),
    ];
    assert_eq!(assign(&policy, &subs), vec![vec!["a", "b"], vec!["c", "d"]]);
}

#[test]
fn amounts_parse_counts_and_percentages() {
    assert_eq!(Amount::parse("3", 1), Ok(Amount::Count(3)));
    assert_eq!(Amount::parse("0", 0), Ok(Amount::Count(0)));
    assert!(Amount::parse("0", 1).is_err());
    assert_eq!(Amount::parse("100%", 1), Ok(Amount::Percent(100)));
    assert!(Amount::parse("0%", 1).is_err());
    assert!(Amount::parse("101%", 1).is_err());
    assert!(Amount::parse("-1", 0).is_err());
    assert!(Amount::parse("1.5", 0).is_err());
    assert_eq!(Amount::Percent(2).of(101), 3);
    assert_eq!(Amount::Percent(10).of(0), 0);
}

#[test]
fn bad_policies_are_refused_naming_the_field() {
    let field = |p: RolloutPolicy| p.validate().unwrap_err().field;
    assert_eq!(field(RolloutPolicy::default()), "rollout.waves");
    let many = RolloutPolicy { waves: (0..21).map(|i| wave(&format!("w{i}"))).collect(), ..Default::default() };
    assert_eq!(field(many), "rollout.waves");
    let dup = RolloutPolicy { waves: vec![wave("a"), wave("a")], ..Default::default() };
    assert_eq!(field(dup), "rollout.waves[1].name");
    let bad_name = RolloutPolicy { waves: vec![wave("Not A Label")], ..Default::default() };
    assert_eq!(field(bad_name), "rollout.waves[0].name");
    let size = RolloutPolicy { waves: vec![WavePolicy { size: "0".into(), ..wave("a") }], ..Default::default() };
    assert_eq!(field(size), "rollout.waves[0].size");
    let bake = RolloutPolicy { waves: vec![WavePolicy { bake: "soon".into(), ..wave("a") }], ..Default::default() };
    assert_eq!(field(bake), "rollout.waves[0].bake");
    let fails =
        RolloutPolicy { waves: vec![WavePolicy { max_failures: "x%".into(), ..wave("a") }], ..Default::default() };
    assert_eq!(field(fails), "rollout.waves[0].max_failures");
    let gate = RolloutPolicy {
        waves: vec![WavePolicy { gate: Some(serde_json::json!("GET /")), ..wave("a") }],
        ..Default::default()
    };
    assert_eq!(field(gate), "rollout.waves[0].gate");
    let deadline = RolloutPolicy { waves: vec![wave("a")], progress_deadline: "1y1y".into(), ..Default::default() };
    assert_eq!(field(deadline), "rollout.progress_deadline");
    let selector =
        RolloutPolicy { waves: vec![WavePolicy { selector: labels(&[("", "x")]), ..wave("a") }], ..Default::default() };
    assert_eq!(field(selector), "rollout.waves[0].selector");
    let ok = RolloutPolicy {
        waves: vec![
            WavePolicy { size: "2".into(), bake: "5m".into(), max_failures: "1".into(), ..wave("canary") },
            WavePolicy { approval: Approval::Manual, max_failures: "2%".into(), ..wave("rest") },
        ],
        on_failure: OnFailure::Abort,
        progress_deadline: "1h".into(),
    };
    assert_eq!(ok.validate(), Ok(()));
    // Unknown fields are refused when parsed.
    assert!(serde_json::from_str::<RolloutPolicy>(r#"{"waves": [{"name": "a", "sise": "1"}]}"#).is_err());
}

fn two_waves() -> RolloutPolicy {
    RolloutPolicy {
        waves: vec![
            WavePolicy { size: "2".into(), ..wave("canary") },
            WavePolicy { approval: Approval::Manual, ..wave("rest") },
        ],
        ..RolloutPolicy::default()
    }
}

fn started(policy: &RolloutPolicy, n: usize) -> RolloutRecord {
    let assignment = assign(policy, &subscribers(n));
    RolloutRecord::start("x.io", "s2", policy, assignment, t0()).0
}

#[test]
fn waves_start_in_order_and_a_manual_wave_waits_for_promote() {
    let policy = two_waves();
    let mut r = started(&policy, 5);
    assert_eq!((r.rollout.state, r.rollout.wave), (RolloutState::Progressing, 0));
    assert!(r.releases("ns000") && r.releases("ns001"));
    assert!(!r.releases("ns002"), "the second wave has not started");
    assert!(r.releases("other"), "outside the assignment");

    let (t, _) = r.step(&[counts(1, 0, 1), counts(0, 0, 3)], at(1));
    assert!(t.is_empty());
    assert_eq!((r.rollout.waves[0].synced, r.rollout.waves[0].pending), (1, 1));

    let (t, _) = r.step(&[counts(2, 0, 0), counts(0, 0, 3)], at(2));
    assert_eq!(t, vec![Transition::WaveCompleted { wave: "canary".into() }]);
    assert_eq!((r.rollout.state, r.rollout.wave), (RolloutState::Waiting, 1));
    assert_eq!(r.rollout.waves[1].state, WaveState::Waiting);
    assert!(!r.releases("ns004"), "a waiting wave holds its subscribers");

    assert_eq!(
        r.act(Action::Resume, "alice", at(3)),
        Err(NotAllowed { action: Action::Resume, state: RolloutState::Waiting })
    );
    r.act(Action::Promote, "alice", at(3)).unwrap();
    assert_eq!((r.rollout.state, r.rollout.waves[1].state), (RolloutState::Progressing, WaveState::Progressing));
    assert!(r.releases("ns004"));
    let (t, _) = r.step(&[counts(2, 0, 0), counts(3, 0, 0)], at(4));
    assert_eq!(t, vec![Transition::WaveCompleted { wave: "rest".into() }, Transition::Completed]);
    assert_eq!(r.rollout.state, RolloutState::Completed);
    assert!(r.act(Action::Pause, "alice", at(5)).is_err());
}

#[test]
fn a_bake_waits_its_time_then_the_gate_runs_once_and_decides() {
    let gate = serde_json::json!({"method": "get", "endpoint": "http://m/ok"});
    let policy = RolloutPolicy {
        waves: vec![WavePolicy { bake: "60s".into(), gate: Some(gate), ..wave("canary") }, wave("rest")],
        ..RolloutPolicy::default()
    };
    let mut r = started(&policy, 4);
    let done = [counts(4, 0, 0), counts(0, 0, 0)];
    r.step(&[counts(0, 0, 4), counts(0, 0, 0)], at(0));
    r.step(&done, at(10));
    assert_eq!((r.rollout.state, r.rollout.waves[0].state), (RolloutState::Baking, WaveState::Baking));
    r.step(&done, at(69));
    assert_eq!(r.rollout.state, RolloutState::Baking, "the bake is not over");
    let (_, work) = r.step(&done, at(70));
    assert_eq!(r.rollout.state, RolloutState::Gating);
    assert_eq!(work, vec![Work::RunGate { wave: 0 }]);
    assert!(r.claim_gate(0, "r1", at(100), at(70)));
    assert!(!r.claim_gate(0, "r2", at(100), at(71)), "claimed");
    assert!(r.step(&done, at(71)).1.is_empty(), "a live claim: no second run");
    assert_eq!(r.step(&done, at(101)).1, vec![Work::RunGate { wave: 0 }], "an expired claim is run again");
    let failed = GateResult { result: "error".into(), status: 500, error: "metrics say bad".into() };
    let t = r.gate_done(0, failed, at(102));
    assert_eq!(r.rollout.state, RolloutState::Paused);
    assert_eq!(r.rollout.waves[0].state, WaveState::Failed);
    assert!(r.rollout.reason.contains("wave canary failed") && r.rollout.reason.contains("metrics say bad"));
    assert!(matches!(&t[..], [Transition::Halted { wave, .. }] if wave == "canary"));
    // resume accepts the failed gate: the wave passes, the next one runs.
    let t = r.act(Action::Resume, "alice", at(103)).unwrap();
    assert_eq!(t, vec![Transition::WaveCompleted { wave: "canary".into() }]);
    assert_eq!((r.rollout.state, r.rollout.wave), (RolloutState::Progressing, 1));
}

#[test]
fn failures_beyond_max_failures_pause_naming_the_wave_and_resume_accepts_them() {
    let policy = RolloutPolicy {
        waves: vec![WavePolicy { max_failures: "1".into(), ..wave("early") }, wave("rest")],
        ..RolloutPolicy::default()
    };
    let mut r = started(&policy, 6);
    let total = r.rollout.waves[0].total;
    assert_eq!(total, 6, "one wave without size takes everything but the last wave's nothing");
    r.step(&[counts(2, 1, 3), counts(0, 0, 0)], at(1));
    assert_eq!(r.rollout.state, RolloutState::Progressing, "one failure is tolerated");
    let (t, _) = r.step(&[counts(2, 2, 2), counts(0, 0, 0)], at(2));
    assert_eq!(r.rollout.state, RolloutState::Paused);
    assert_eq!(r.rollout.reason, "wave early failed: 2 of 6 subscribers failed, more than max_failures 1");
    assert_eq!(t.len(), 1);
    assert!(!r.releases("ns005"), "a paused rollout starts no new run");
    r.act(Action::Resume, "alice", at(3)).unwrap();
    assert_eq!(r.rollout.state, RolloutState::Progressing);
    r.step(&[counts(4, 2, 0), counts(0, 0, 0)], at(4));
    assert_eq!(r.rollout.state, RolloutState::Completed, "the accepted failures no longer fail the wave");
}

#[test]
fn on_failure_abort_aborts_and_a_deadline_fails_a_wave() {
    let policy =
        RolloutPolicy { waves: vec![wave("all")], on_failure: OnFailure::Abort, progress_deadline: "30s".into() };
    let mut r = started(&policy, 3);
    r.step(&[counts(1, 0, 2)], at(29));
    assert_eq!(r.rollout.state, RolloutState::Progressing);
    let (t, _) = r.step(&[counts(1, 0, 2)], at(30));
    assert_eq!(r.rollout.state, RolloutState::Aborted);
    assert!(r.rollout.reason.contains("progress_deadline 30s"), "{}", r.rollout.reason);
    assert!(matches!(&t[..], [Transition::Aborted { .. }]));
    assert!(r.act(Action::Resume, "alice", at(31)).is_err(), "an aborted rollout is over");
    assert!(!r.releases("ns002"));
}

#[test]
fn actions_the_state_forbids_are_refused() {
    let mut r = started(&two_waves(), 3);
    let refused = |r: &mut RolloutRecord, a| r.act(a, "bob", at(1)).unwrap_err();
    assert_eq!(refused(&mut r, Action::Promote).to_string(), "cannot promote a rollout that is progressing");
    assert_eq!(refused(&mut r, Action::Resume).state, RolloutState::Progressing);
    r.act(Action::Pause, "bob: looks odd", at(1)).unwrap();
    assert_eq!(r.rollout.reason, "paused by bob: looks odd");
    assert_eq!(refused(&mut r, Action::Pause).state, RolloutState::Paused);
    r.act(Action::Resume, "bob", at(2)).unwrap();
    assert_eq!(r.rollout.state, RolloutState::Progressing);
    r.act(Action::Abort, "bob", at(3)).unwrap();
    assert_eq!(refused(&mut r, Action::Abort).state, RolloutState::Aborted);
}

#[test]
fn promote_ends_a_bake_at_once() {
    let policy =
        RolloutPolicy { waves: vec![WavePolicy { bake: "1h".into(), ..wave("a") }, wave("b")], ..Default::default() };
    let mut r = started(&policy, 2);
    r.step(&[counts(2, 0, 0), counts(0, 0, 0)], at(1));
    assert_eq!(r.rollout.state, RolloutState::Baking);
    r.act(Action::Promote, "ops", at(2)).unwrap();
    assert_eq!((r.rollout.state, r.rollout.wave), (RolloutState::Progressing, 1));
}

#[test]
fn the_record_round_trips_and_shows_the_public_shape_flat() {
    let r = started(&two_waves(), 3);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["state"], "progressing");
    assert_eq!(json["waves"][0]["state"], "progressing");
    assert_eq!(json["waves"][1]["gate"], serde_json::Value::Null);
    assert_eq!(serde_json::from_value::<RolloutRecord>(json).unwrap(), r);
}
