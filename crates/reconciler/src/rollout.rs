//! The rollout driver (platform §12): every reconciler runs one, and any
//! of them may advance any rollout.
//!
//! On every watch event that can move a rollout (after [`WAKE_GATHER`]),
//! and at least each [`TICK`], for every API with a rollout policy or a
//! rollout record,
//! the driver looks at its watch-fed [`View`] and decides with the pure
//! functions of [`kayra_core::rollout`]:
//!
//! - the registration's SyncID has a policy and no rollout yet (or the
//!   record is of an older SyncID): the active subscribers not at the new
//!   SyncID are [`assign`]ed to waves and a new record is written, its
//!   first wave started (the old rollout is replaced: superseded);
//! - a record whose SyncID moved while the registration lost its policy
//!   ends `superseded`;
//! - a live rollout's per-wave counts are taken from the view
//!   ([`counts`]) and [`RolloutRecord::step`] advances it (a wave done,
//!   a bake over, a deadline passed, a failure beyond `max_failures`).
//!
//! Every write is a compare-and-swap on the record's revision as this
//! reconciler's view saw it, carrying the deliveries of the `rollout.*`
//! events it makes: of the reconcilers that decide the same move at once,
//! one writes it; the others see it through their watch and decide afresh.
//! Timers (bake, deadline, a gate's claim) are timestamps in the record, so
//! a restart or the loss of a reconciler neither restarts nor stops them.
//!
//! Held subscribers are not in the work queue: the fan-out skips them
//! ([`crate::decide::holds`]) and the watch queues them when the record
//! shows their wave started ([`released`]).
//!
//! A wave's gate runs once after its bake: the driver that claims it (a
//! compare-and-swap writing `gate_claim` with an expiry) runs the step and
//! writes its result; a claim whose holder died expires and another
//! reconciler runs the gate again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use kayra_catalog::repo::Repository;
use kayra_catalog::repo::rollouts::rollout_event;
use kayra_core::notifications::Delivery;
use kayra_core::rollout::{Counts, GateResult, RolloutRecord, RolloutState, Transition, Work, assign};
use kayra_core::{ApiRegistration, SubscriptionState};
use kayra_store::Revision;
use tokio_util::sync::CancellationToken;

use crate::decide::{Decision, Idle};
use crate::ensure::Worker;
use crate::notify::Sinks;
use crate::view::View;

/// How often every rollout is looked at without a watch event (bakes and
/// deadlines are timestamps: this is their resolution).
pub const TICK: Duration = Duration::from_millis(200);
/// After a watch event wakes the driver, how long it lets more arrive
/// before it looks (a fan-out's results come in bursts).
const WAKE_GATHER: Duration = Duration::from_millis(20);
/// A gate's claim outlives its step's timeout by this much.
const GATE_CLAIM_SLACK: Duration = Duration::from_secs(10);

pub const METRIC_WAVE: &str = "kayra_rollout_wave";
pub const METRIC_ROLLOUTS: &str = "kayra_rollouts";

/// Namespaces of `api` whose job has something to do now that the
/// rollout lets them run (not held, behind, not given up).
pub(crate) fn released(view: &View, api: &str) -> Vec<String> {
    let mut out: Vec<String> = view
        .subscribers_of(api)
        .filter(|(ns, sub)| sub.active && matches!(view.decide(ns, api, false), Decision::Reconcile { .. }))
        .map(|(ns, _)| ns.to_string())
        .collect();
    out.sort();
    out
}

/// Each wave's subscribers as the view shows them: synced (at the
/// rollout's SyncID), failed (given up toward it in `state: error`), or
/// pending; a deleted subscription is in no count.
pub fn counts(view: &View, record: &RolloutRecord) -> Vec<Counts> {
    let api = &record.rollout.api;
    let sync_id = &record.rollout.sync_id;
    let current = view.registration(api).is_some_and(|(reg, _)| reg.sync_id == *sync_id);
    record
        .records
        .iter()
        .map(|wave| {
            let mut c = Counts::default();
            for ns in &wave.namespaces {
                let Some(sub) = view.subscription(ns, api) else { continue };
                if sub.is_synced(sync_id) {
                    c.synced += 1;
                } else if current
                    && sub.state == SubscriptionState::Error
                    && view.decide(ns, api, false) == Decision::Nothing(Idle::GivenUp)
                {
                    c.failed += 1;
                } else {
                    c.pending += 1;
                }
            }
            c
        })
        .collect()
}

/// Whether a subscriber of the current wave is still pending (stops at
/// the first).
fn wave_pending(view: &View, record: &RolloutRecord) -> bool {
    let (api, sync_id) = (&record.rollout.api, &record.rollout.sync_id);
    let Some(wave) = record.records.get(record.rollout.wave) else { return false };
    let done = |ns: &str, sub: &crate::view::Subscriber| {
        sub.is_synced(sync_id)
            || (sub.state == SubscriptionState::Error
                && view.decide(ns, api, false) == Decision::Nothing(Idle::GivenUp))
    };
    wave.namespaces.iter().any(|ns| view.subscription(ns, api).is_some_and(|sub| !done(ns, sub)))
}

/// The subscribers a new rollout of `reg`'s SyncID takes: active and not
/// at it, with their namespaces' labels when `labels` (a wave selects by
/// them). `None` while a namespace's labels are not known yet (the
/// namespaces' watch is behind the subscriptions'): the waves are chosen
/// once they are, at the next look, never from labels missing.
fn behind(view: &View, reg: &ApiRegistration, labels: bool) -> Option<Vec<(String, BTreeMap<String, String>)>> {
    view.subscribers_of(&reg.name)
        .filter(|(_, sub)| sub.active && sub.current_sync_id() != reg.sync_id)
        .map(|(ns, _)| match labels {
            true => view.namespace_labels(ns).map(|labels| (ns.to_string(), labels.clone())),
            false => Some((ns.to_string(), BTreeMap::new())),
        })
        .collect()
}

/// What one look at an API decided to write.
enum Next {
    Nothing,
    Write { seen: Option<Revision>, record: Box<RolloutRecord>, transitions: Vec<Transition>, gates: Vec<usize> },
}

/// Decides what `api`'s rollout needs now, from the view alone.
/// `counts`: whether a change of the waves' counts alone is worth a write
/// (at the tick; a watch event's look writes only moves).
fn look(view: &View, api: &str, now: SystemTime, counts_too: bool) -> Next {
    let Some((reg, _)) = view.registration(api) else { return Next::Nothing };
    let existing = view.rollout(api);
    let seen = existing.map(|(_, rev)| *rev);
    match (existing, &reg.rollout) {
        (Some((record, _)), _) if record.rollout.sync_id == reg.sync_id => {
            if record.rollout.state.is_final() {
                return Next::Nothing;
            }
            // Between ticks only a wave's end moves a progressing rollout:
            // while one of its subscribers is pending, that is all to know
            // (found without counting the rest; failures count at the tick).
            if !counts_too && record.rollout.state == RolloutState::Progressing && wave_pending(view, record) {
                return Next::Nothing;
            }
            let mut next = record.clone();
            let (transitions, work) = next.step(&counts(view, record), now);
            let gates: Vec<usize> = work.into_iter().map(|Work::RunGate { wave }| wave).collect();
            if gates.is_empty() && (next == *record || (!counts_too && only_counts_differ(record, &next))) {
                return Next::Nothing;
            }
            Next::Write { seen, record: Box::new(next), transitions, gates }
        }
        (existing, Some(policy)) => {
            let selects = policy.waves.iter().any(|wave| !wave.selector.is_empty());
            let Some(subscribers) = behind(view, reg, selects) else { return Next::Nothing };
            if subscribers.is_empty() {
                // Nobody to roll out to: no rollout (a superseded one ends).
                return match existing {
                    Some((record, _)) if !record.rollout.state.is_final() => supersede(record, seen, now),
                    _ => Next::Nothing,
                };
            }
            let assignment = assign(policy, &subscribers);
            let (record, transitions) = RolloutRecord::start(api, &reg.sync_id, policy, assignment, now);
            Next::Write { seen, record: Box::new(record), transitions, gates: Vec::new() }
        }
        (Some((record, _)), None) if !record.rollout.state.is_final() => supersede(record, seen, now),
        _ => Next::Nothing,
    }
}

/// Whether `next` differs from `record` in its waves' counts only.
fn only_counts_differ(record: &RolloutRecord, next: &RolloutRecord) -> bool {
    let mut same = next.clone();
    for (wave, was) in same.rollout.waves.iter_mut().zip(&record.rollout.waves) {
        (wave.total, wave.synced, wave.failed, wave.pending) = (was.total, was.synced, was.failed, was.pending);
    }
    same == *record
}

fn supersede(record: &RolloutRecord, seen: Option<Revision>, now: SystemTime) -> Next {
    let mut next = record.clone();
    next.supersede(now);
    Next::Write { seen, record: Box::new(next), transitions: Vec::new(), gates: Vec::new() }
}

fn deliveries(sinks: &Sinks, record: &RolloutRecord, transitions: &[Transition]) -> Vec<Delivery> {
    transitions.iter().flat_map(|t| sinks.deliveries(&rollout_event(record, t))).collect()
}

/// Everything a driver needs: the worker's store, view, sinks, HTTP
/// client and config.
pub(crate) struct Driver {
    pub worker: Arc<Worker>,
    pub ready: Arc<AtomicBool>,
    pub tasks: tokio_util::task::TaskTracker,
}

impl Driver {
    /// Looks at every rollout each [`TICK`] until `cancel`.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let driver = Arc::new(self);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let wake = driver.worker.rollout_wake.clone();
        loop {
            let ticked = tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => true,
                () = wake.notified() => {
                    // Let a burst of results gather into one look.
                    tokio::time::sleep(WAKE_GATHER).await;
                    false
                }
            };
            if !driver.ready.load(Ordering::SeqCst) {
                continue;
            }
            let apis = driver.view().rollout_apis();
            for api in apis {
                driver.clone().advance(&api, &cancel, ticked).await;
            }
            driver.report();
        }
    }

    fn view(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.worker.view.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn repo(&self) -> &Repository {
        &self.worker.repo
    }

    /// One look at `api`'s rollout, and its write.
    /// `ticked`: counts alone are written too (see [`look`]).
    async fn advance(self: Arc<Self>, api: &str, cancel: &CancellationToken, ticked: bool) {
        let now = SystemTime::now();
        let next = look(&self.view(), api, now, ticked);
        let Next::Write { seen, mut record, transitions, gates } = next else { return };
        // Claim the gates to run in the same write.
        let holder = crate::runs::identity();
        let mut claimed = Vec::new();
        for wave in gates {
            let timeout = gate_timeout(&record, wave);
            if record.claim_gate(wave, holder, now + timeout + GATE_CLAIM_SLACK, now) {
                claimed.push(wave);
            }
        }
        let deliveries = deliveries(&self.worker.sinks, &record, &transitions);
        match self.repo().write_rollout(api, seen, &record, &deliveries).await {
            // The view learns the write from the watch, which also queues
            // the subscribers it released; until then a tick deciding on
            // the old record writes nothing (its compare fails).
            Ok(Some(_)) => {
                for t in &transitions {
                    tracing::info!(api, sync_id = %record.rollout.sync_id, state = record.rollout.state.as_str(),
                        wave = record.rollout.wave, transition = ?t, "rollout moved");
                }
                for wave in claimed {
                    let driver = self.clone();
                    let (record, cancel) = ((*record).clone(), cancel.clone());
                    let api = api.to_string();
                    self.tasks.spawn(async move { driver.run_gate(&api, record, wave, cancel).await });
                }
            }
            // Another reconciler moved it first: its write reaches the view.
            Ok(None) => {}
            Err(e) => tracing::warn!(api, error = %e, "could not write a rollout's move; trying again"),
        }
    }

    /// Runs wave `wave`'s gate (claimed by this process) and records its result.
    async fn run_gate(&self, api: &str, record: RolloutRecord, wave: usize, cancel: CancellationToken) {
        let name = record.rollout.waves[wave].name.clone();
        let result = match record.policy.waves[wave].gate.as_ref().map(kayra_pipeline::Gate::compile) {
            Some(Ok(gate)) => {
                let context = kayra_pipeline::RolloutContext {
                    api: api.to_string(),
                    sync_id: record.rollout.sync_id.clone(),
                    wave: name.clone(),
                    synced: record.rollout.waves[wave].synced,
                    failed: record.rollout.waves[wave].failed,
                };
                let control = kayra_pipeline::RunControl::new(cancel.clone());
                let (outcome, step) = gate.run(&self.worker.client, &self.worker.config, &context, &control).await;
                GateResult {
                    result: if outcome.is_ok() { "success" } else { "error" }.into(),
                    status: step.status,
                    error: step.error,
                }
            }
            Some(Err((field, message))) => {
                GateResult { result: "error".into(), status: 0, error: format!("gate {field}: {message}") }
            }
            None => GateResult { result: "success".into(), ..GateResult::default() },
        };
        if cancel.is_cancelled() {
            // Shutting down mid-gate: the claim runs out and another runs it.
            return;
        }
        tracing::info!(api, wave = %name, result = %result.result, status = result.status, error = %result.error,
            "rollout gate ran");
        // Record it on the latest record: a promote, pause or abort since
        // the claim wins (then `gate_done` changes nothing).
        loop {
            let current = match self.repo().rollout(api).await {
                Ok(Some(current)) => current,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(api, error = %e, "could not read a rollout to record its gate; trying again");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(TICK) => continue,
                    }
                }
            };
            if current.value.rollout.sync_id != record.rollout.sync_id {
                return;
            }
            let mut next = current.value.clone();
            let transitions = next.gate_done(wave, result.clone(), SystemTime::now());
            if next == current.value {
                return;
            }
            let deliveries = deliveries(&self.worker.sinks, &next, &transitions);
            match self.repo().write_rollout(api, Some(current.revision), &next, &deliveries).await {
                Ok(Some(_)) => return,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(api, error = %e, "could not record a rollout gate's result; trying again");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(TICK) => {}
                    }
                }
            }
        }
    }

    /// `kayra_rollout_wave{api}` and `kayra_rollouts{state}` from the view.
    fn report(&self) {
        let view = self.view();
        let mut by_state: BTreeMap<&str, usize> = RolloutState::ALL.iter().map(|s| (s.as_str(), 0)).collect();
        for api in view.rollout_apis() {
            if let Some((record, _)) = view.rollout(&api) {
                *by_state.entry(record.rollout.state.as_str()).or_default() += 1;
                metrics::gauge!(METRIC_WAVE, "api" => api.clone()).set(record.rollout.wave as f64);
            }
        }
        for (state, n) in by_state {
            metrics::gauge!(METRIC_ROLLOUTS, "state" => state).set(n as f64);
        }
    }
}

/// The gate step's own timeout (60 s when it sets none).
fn gate_timeout(record: &RolloutRecord, wave: usize) -> Duration {
    record.policy.waves[wave]
        .gate
        .as_ref()
        .and_then(|g| serde_json::from_value::<kayra_config::Step>(g.clone()).ok())
        .map_or(kayra_config::DEFAULT_STEP_TIMEOUT, |s| s.timeout_or_default())
}

pub(crate) fn describe_metrics() {
    metrics::describe_gauge!(METRIC_WAVE, "Index of the current wave of the API's rollout.");
    metrics::describe_gauge!(METRIC_ROLLOUTS, "Rollouts by state, as this reconciler's view shows them.");
    for state in RolloutState::ALL {
        metrics::gauge!(METRIC_ROLLOUTS, "state" => state.as_str()).set(0.0);
    }
}

#[cfg(test)]
mod tests {
    use kayra_core::Subscription;
    use kayra_core::rollout::{RolloutPolicy, WavePolicy};

    use super::*;

    /// A job can activate a namespace before the namespaces' watch brings
    /// its record: a rollout whose waves select by label is not started
    /// from labels not known yet (they would read as none), only once
    /// every subscriber's are.
    #[test]
    fn waves_by_label_wait_for_the_namespaces_labels() {
        let canary = WavePolicy {
            name: "canary".into(),
            selector: [("tier".to_string(), "canary".to_string())].into(),
            ..WavePolicy::default()
        };
        let policy = RolloutPolicy {
            waves: vec![canary, WavePolicy { name: "rest".into(), ..WavePolicy::default() }],
            ..RolloutPolicy::default()
        };
        let mut view = View::default();
        let reg =
            ApiRegistration { name: "x.io".into(), sync_id: "2".into(), rollout: Some(policy), ..Default::default() };
        view.put_registration(reg, 1);
        for ns in ["a", "b"] {
            view.put_subscription(
                Subscription { active: true, current_sync_id: "1".into(), ..Subscription::new(ns, "x.io") },
                2,
            );
            view.put_namespace(ns, true, 3);
        }
        let started = |view: &View| match look(view, "x.io", SystemTime::now(), true) {
            Next::Write { record, .. } => Some(record.records.iter().map(|w| w.namespaces.clone()).collect::<Vec<_>>()),
            Next::Nothing => None,
        };
        assert_eq!(started(&view), None, "no labels known");
        view.put_namespace_record("a", true, [("tier".to_string(), "canary".to_string())].into(), 3);
        assert_eq!(started(&view), None, "b's labels not known");
        view.put_namespace_record("b", true, BTreeMap::new(), 3);
        assert_eq!(started(&view), Some(vec![vec!["a".to_string()], vec!["b".to_string()]]));
    }
}
