//! Staged rollouts of a SyncID change (platform §12): the policy written on
//! a registration, the rollout record the reconcilers advance, and the pure
//! functions that decide every transition.
//!
//! Nothing here reads a clock or a store: [`assign`] puts subscribers in
//! waves, [`RolloutRecord::step`] advances a rollout from its subscribers'
//! counts and the time, [`RolloutRecord::act`] applies an operator's
//! action, and [`RolloutRecord::releases`] says whether a subscriber's wave
//! may run. The reconciler's driver and the catalog API call them and
//! write the result by compare-and-swap on the record, so any reconciler
//! may advance a rollout and every timer is a timestamp in the record.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// At most this many waves (§12).
pub const MAX_WAVES: usize = 20;
/// The longest `bake` or `progress_deadline`.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// A registration's rollout policy, as written (§12).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RolloutPolicy {
    pub waves: Vec<WavePolicy>,
    #[serde(default)]
    pub on_failure: OnFailure,
    /// A duration (`1h`); empty: no deadline.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub progress_deadline: String,
}

/// One wave of a [`RolloutPolicy`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct WavePolicy {
    pub name: String,
    /// Label equality on the subscriber's namespace: every pair must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// `"N"` or `"P%"` of the rollout's total; empty: every remaining match.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub size: String,
    /// A duration; empty: `0s`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bake: String,
    /// One step of the §2 step shape (checked by the catalog, run by the reconciler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub gate: Option<serde_json::Value>,
    /// `"N"` or `"P%"` of the wave's subscribers; empty: `"0"`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub max_failures: String,
    #[serde(default)]
    pub approval: Approval,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    #[default]
    Pause,
    Abort,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Approval {
    #[default]
    Auto,
    Manual,
}

/// `"N"` or `"P%"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    Count(usize),
    Percent(u8),
}

impl Amount {
    /// Parses `"N"` (`N ≥ min`) or `"P%"` (1–100).
    pub fn parse(text: &str, min: usize) -> Result<Self, String> {
        let text = text.trim();
        if let Some(p) = text.strip_suffix('%') {
            return match p.parse::<u8>() {
                Ok(p @ 1..=100) => Ok(Amount::Percent(p)),
                _ => Err(format!("{:?} is not a percentage from 1% to 100%", cut(text))),
            };
        }
        match text.parse::<usize>() {
            Ok(n) if n >= min => Ok(Amount::Count(n)),
            _ => {
                Err(format!("{:?} is neither a whole number (at least {min}) nor a percentage like \"10%\"", cut(text)))
            }
        }
    }

    /// The amount of `of`, a percentage rounded up.
    pub fn of(self, of: usize) -> usize {
        match self {
            Amount::Count(n) => n,
            Amount::Percent(p) => (of * p as usize).div_ceil(100),
        }
    }
}

/// A hostile value, cut before it is echoed in an error.
fn cut(text: &str) -> String {
    crate::runs::cut(text, 64).into_owned()
}

/// Parses a policy duration; empty is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if text.trim().is_empty() {
        return Ok(Duration::ZERO);
    }
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{:?} is not a duration ({e}); write e.g. \"30s\", \"5m\", \"1h\"", cut(text)))?;
    if d > MAX_DURATION {
        return Err("must be at most 30 days".into());
    }
    Ok(d)
}

/// A refused policy: the field (`rollout.waves[1].size`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl RolloutPolicy {
    /// The shape rules of §12, each violation naming its field. The gate's
    /// step shape is checked by the caller (it is the pipeline's).
    pub fn validate(&self) -> Result<(), PolicyError> {
        let err = |field: String, message: String| Err(PolicyError { field, message });
        if self.waves.is_empty() || self.waves.len() > MAX_WAVES {
            return err("rollout.waves".into(), format!("needs 1 to {MAX_WAVES} waves, got {}", self.waves.len()));
        }
        for (i, wave) in self.waves.iter().enumerate() {
            let field = |name: &str| format!("rollout.waves[{i}].{name}");
            if !crate::names::is_label(&wave.name) {
                return err(field("name"), format!("{:?} is not a DNS label", cut(&wave.name)));
            }
            if self.waves[..i].iter().any(|w| w.name == wave.name) {
                return err(field("name"), format!("{:?} is used by an earlier wave", wave.name));
            }
            if let Err(invalid) = crate::labels::validate_labels(&wave.selector) {
                return err(field("selector"), invalid.to_string());
            }
            if !wave.size.is_empty() {
                Amount::parse(&wave.size, 1).map_err(|m| PolicyError { field: field("size"), message: m })?;
            }
            if !wave.max_failures.is_empty() {
                Amount::parse(&wave.max_failures, 0)
                    .map_err(|m| PolicyError { field: field("max_failures"), message: m })?;
            }
            parse_duration(&wave.bake).map_err(|m| PolicyError { field: field("bake"), message: m })?;
            if wave.gate.as_ref().is_some_and(|g| !g.is_object()) {
                return err(field("gate"), "must be an object of the step shape".into());
            }
        }
        parse_duration(&self.progress_deadline)
            .map_err(|m| PolicyError { field: "rollout.progress_deadline".into(), message: m })?;
        Ok(())
    }

    fn deadline(&self) -> Option<Duration> {
        parse_duration(&self.progress_deadline).ok().filter(|d| !d.is_zero())
    }
}

impl WavePolicy {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    fn bake(&self) -> Duration {
        parse_duration(&self.bake).unwrap_or_default()
    }

    /// How many of `total` failed subscribers the wave tolerates.
    pub fn tolerated(&self, total: usize) -> usize {
        match self.max_failures.as_str() {
            "" => 0,
            text => Amount::parse(text, 0).map_or(0, |a| a.of(total)),
        }
    }
}

/// The assignment (§12): `subscribers` (namespace, its labels), taken in
/// namespace-name order, each into the first wave whose selector matches
/// and that has room; the last wave takes every subscriber left. Returns
/// each wave's namespaces, sorted.
pub fn assign(policy: &RolloutPolicy, subscribers: &[(String, BTreeMap<String, String>)]) -> Vec<Vec<String>> {
    let total = subscribers.len();
    let room: Vec<Option<usize>> = policy
        .waves
        .iter()
        .map(|w| match w.size.as_str() {
            "" => None,
            size => Some(Amount::parse(size, 1).map_or(0, |a| a.of(total))),
        })
        .collect();
    let mut order: Vec<&(String, BTreeMap<String, String>)> = subscribers.iter().collect();
    order.sort_by(|a, b| a.0.cmp(&b.0));
    let last = policy.waves.len().saturating_sub(1);
    let mut waves: Vec<Vec<String>> = vec![Vec::new(); policy.waves.len()];
    for (namespace, labels) in order {
        let wave = (0..last)
            .find(|&i| policy.waves[i].matches(labels) && room[i].is_none_or(|r| waves[i].len() < r))
            .unwrap_or(last);
        waves[wave].push(namespace.clone());
    }
    waves
}

/// A rollout's state (§12).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RolloutState {
    #[default]
    Progressing,
    Baking,
    Gating,
    Waiting,
    Paused,
    Aborted,
    Completed,
    Superseded,
}

impl RolloutState {
    pub const ALL: [RolloutState; 8] = [
        RolloutState::Progressing,
        RolloutState::Baking,
        RolloutState::Gating,
        RolloutState::Waiting,
        RolloutState::Paused,
        RolloutState::Aborted,
        RolloutState::Completed,
        RolloutState::Superseded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Progressing => "progressing",
            RolloutState::Baking => "baking",
            RolloutState::Gating => "gating",
            RolloutState::Waiting => "waiting",
            RolloutState::Paused => "paused",
            RolloutState::Aborted => "aborted",
            RolloutState::Completed => "completed",
            RolloutState::Superseded => "superseded",
        }
    }

    /// Whether the rollout is over: nothing moves it any more.
    pub fn is_final(self) -> bool {
        matches!(self, RolloutState::Aborted | RolloutState::Completed | RolloutState::Superseded)
    }
}

/// A wave's state (§12).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum WaveState {
    #[default]
    Pending,
    Progressing,
    Baking,
    Gating,
    Waiting,
    Completed,
    Failed,
}

impl WaveState {
    pub fn as_str(self) -> &'static str {
        match self {
            WaveState::Pending => "pending",
            WaveState::Progressing => "progressing",
            WaveState::Baking => "baking",
            WaveState::Gating => "gating",
            WaveState::Waiting => "waiting",
            WaveState::Completed => "completed",
            WaveState::Failed => "failed",
        }
    }
}

/// How a wave's gate went.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GateResult {
    /// `success` or `error`.
    pub result: String,
    /// The last response's status; 0 when none came.
    pub status: u16,
    pub error: String,
}

/// A wave as `GET …/rollout` shows it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Wave {
    pub name: String,
    pub state: WaveState,
    pub total: usize,
    pub synced: usize,
    pub failed: usize,
    pub pending: usize,
    pub started_at: String,
    pub finished_at: String,
    pub gate: Option<GateResult>,
}

/// A rollout as `GET /apiregistrations/:name/rollout` shows it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Rollout {
    pub api: String,
    pub sync_id: String,
    pub state: RolloutState,
    pub reason: String,
    /// Index of the current wave.
    pub wave: usize,
    pub started_at: String,
    pub updated_at: String,
    pub waves: Vec<Wave>,
}

/// Why a wave failed, so `resume` knows what it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Failure {
    Failures,
    Gate,
    Deadline,
}

/// A claim on running a wave's gate: one reconciler runs it at a time;
/// once `until` passes another may.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateClaim {
    pub holder: String,
    /// RFC 3339.
    pub until: String,
}

/// What the record keeps of a wave beyond what is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct WaveRecord {
    /// The wave's subscribers, sorted: the assignment, fixed for the rollout.
    pub namespaces: Vec<String>,
    /// RFC 3339: when the bake ends; empty outside a bake.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bake_until: String,
    /// RFC 3339: when the wave fails unless done; empty: no deadline.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub deadline: String,
    /// Failures a `resume` accepted.
    #[serde(default)]
    pub accepted_failures: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_claim: Option<GateClaim>,
}

/// The stored rollout of one API: what is shown, the policy it started
/// with, and per wave its assignment and timers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RolloutRecord {
    #[serde(flatten)]
    pub rollout: Rollout,
    pub policy: RolloutPolicy,
    pub records: Vec<WaveRecord>,
}

/// One wave's subscribers as the reconciler sees them now: deleted ones
/// are in no count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub synced: usize,
    pub failed: usize,
    pub pending: usize,
}

/// A transition worth telling someone (§14 `rollout.*` events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    WaveCompleted {
        wave: String,
    },
    /// Paused by a failed wave.
    Halted {
        wave: String,
        reason: String,
    },
    Completed,
    Aborted {
        reason: String,
    },
}

/// What the driver must do beyond writing the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// Run wave `wave`'s gate (after claiming it).
    RunGate { wave: usize },
}

/// An operator's action (`PUT …/rollout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Pause,
    Resume,
    Abort,
    Promote,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Abort => "abort",
            Action::Promote => "promote",
        }
    }
}

/// An action the state does not allow (409).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAllowed {
    pub action: Action,
    pub state: RolloutState,
}

impl std::fmt::Display for NotAllowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot {} a rollout that is {}", self.action.as_str(), self.state.as_str())
    }
}

fn stamp(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn parse_stamp(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(text.trim()).ok()
}

fn reached(stamp: &str, now: SystemTime) -> bool {
    parse_stamp(stamp).is_some_and(|at| now >= at)
}

impl RolloutRecord {
    /// A new rollout of `api` toward `sync_id` with `assignment` (from
    /// [`assign`]), its first wave started.
    pub fn start(
        api: &str,
        sync_id: &str,
        policy: &RolloutPolicy,
        assignment: Vec<Vec<String>>,
        now: SystemTime,
    ) -> (Self, Vec<Transition>) {
        let waves = policy
            .waves
            .iter()
            .zip(&assignment)
            .map(|(w, namespaces)| Wave {
                name: w.name.clone(),
                total: namespaces.len(),
                pending: namespaces.len(),
                ..Wave::default()
            })
            .collect();
        let records =
            assignment.into_iter().map(|namespaces| WaveRecord { namespaces, ..Default::default() }).collect();
        let mut record = RolloutRecord {
            rollout: Rollout {
                api: api.into(),
                sync_id: sync_id.into(),
                state: RolloutState::Progressing,
                started_at: stamp(now),
                updated_at: stamp(now),
                waves,
                ..Rollout::default()
            },
            policy: policy.clone(),
            records,
        };
        let mut transitions = Vec::new();
        record.begin(0, now, false, &mut transitions);
        (record, transitions)
    }

    /// The wave `namespace` was assigned to.
    pub fn wave_of(&self, namespace: &str) -> Option<usize> {
        self.records.iter().position(|r| r.namespaces.binary_search_by(|n| n.as_str().cmp(namespace)).is_ok())
    }

    /// Whether the fan-out may run `namespace` toward this rollout's
    /// SyncID now: its wave has started and the rollout is neither paused
    /// nor aborted. A namespace outside the assignment is not the
    /// rollout's to hold.
    pub fn releases(&self, namespace: &str) -> bool {
        match self.rollout.state {
            RolloutState::Paused | RolloutState::Aborted => self.wave_of(namespace).is_none(),
            RolloutState::Completed | RolloutState::Superseded => true,
            _ => match self.wave_of(namespace) {
                None => true,
                Some(w) => {
                    w < self.rollout.wave
                        || (w == self.rollout.wave && self.rollout.waves[w].state != WaveState::Waiting)
                }
            },
        }
    }

    /// Whether wave `index` has started (the fan-out may run its subscribers).
    pub fn started(&self, index: usize) -> bool {
        self.rollout.waves.get(index).is_some_and(|w| !matches!(w.state, WaveState::Pending | WaveState::Waiting))
    }

    /// Advances the rollout from its subscribers' `counts` (one per wave)
    /// at `now`. Returns the transitions made and the work to do; the
    /// record is changed in place (compare with a copy to know whether to
    /// write).
    pub fn step(&mut self, counts: &[Counts], now: SystemTime) -> (Vec<Transition>, Vec<Work>) {
        for (wave, c) in self.rollout.waves.iter_mut().zip(counts) {
            (wave.synced, wave.failed, wave.pending) = (c.synced, c.failed, c.pending);
            wave.total = c.synced + c.failed + c.pending;
        }
        let mut transitions = Vec::new();
        let mut work = Vec::new();
        // Each pass moves at most one stage; a few passes settle waves that
        // need no waiting (no bake, no gate) in one step.
        for _ in 0..(3 * self.rollout.waves.len() + 3) {
            let before = (self.rollout.state, self.rollout.wave);
            self.advance(now, &mut transitions, &mut work);
            if (self.rollout.state, self.rollout.wave) == before {
                break;
            }
        }
        (transitions, work)
    }

    fn advance(&mut self, now: SystemTime, transitions: &mut Vec<Transition>, work: &mut Vec<Work>) {
        let i = self.rollout.wave;
        let Some(wave) = self.rollout.waves.get(i).cloned() else { return };
        let policy = self.policy.waves.get(i).cloned().unwrap_or_default();
        match self.rollout.state {
            RolloutState::Progressing => {
                let allowed = policy.tolerated(wave.total).max(self.records[i].accepted_failures);
                if wave.failed > allowed {
                    let why = format!(
                        "{} of {} subscribers failed, more than max_failures {}",
                        wave.failed,
                        wave.total,
                        policy.max_failures_text()
                    );
                    self.fail(i, Failure::Failures, why, now, transitions);
                } else if wave.pending == 0 {
                    self.done(i, now, transitions);
                } else if !self.records[i].deadline.is_empty() && reached(&self.records[i].deadline, now) {
                    let why = format!("not done within progress_deadline {}", self.policy.progress_deadline);
                    self.fail(i, Failure::Deadline, why, now, transitions);
                }
            }
            RolloutState::Baking => {
                if reached(&self.records[i].bake_until, now) {
                    self.records[i].bake_until.clear();
                    self.after_bake(i, now, transitions);
                }
            }
            RolloutState::Gating => {
                let claimed = self.records[i].gate_claim.as_ref().is_some_and(|c| !reached(&c.until, now));
                if !claimed && !work.contains(&Work::RunGate { wave: i }) {
                    work.push(Work::RunGate { wave: i });
                }
            }
            RolloutState::Waiting
            | RolloutState::Paused
            | RolloutState::Aborted
            | RolloutState::Completed
            | RolloutState::Superseded => {}
        }
    }

    /// Wave `i`'s subscribers are all done: bake, or on to the gate.
    fn done(&mut self, i: usize, now: SystemTime, transitions: &mut Vec<Transition>) {
        self.rollout.waves[i].finished_at = stamp(now);
        self.records[i].deadline.clear();
        let bake = self.policy.waves[i].bake();
        if !bake.is_zero() && self.rollout.waves[i].total > 0 {
            self.records[i].bake_until = stamp(now + bake);
            self.set(i, WaveState::Baking, RolloutState::Baking, now);
        } else {
            self.after_bake(i, now, transitions);
        }
    }

    fn after_bake(&mut self, i: usize, now: SystemTime, transitions: &mut Vec<Transition>) {
        if self.policy.waves[i].gate.is_some() && self.rollout.waves[i].total > 0 {
            self.set(i, WaveState::Gating, RolloutState::Gating, now);
        } else {
            self.complete(i, now, transitions);
        }
    }

    /// Wave `i` passed: the next one begins, or the rollout is complete.
    fn complete(&mut self, i: usize, now: SystemTime, transitions: &mut Vec<Transition>) {
        self.records[i].gate_claim = None;
        self.records[i].failure = None;
        if self.rollout.waves[i].finished_at.is_empty() {
            self.rollout.waves[i].finished_at = stamp(now);
        }
        self.rollout.waves[i].state = WaveState::Completed;
        transitions.push(Transition::WaveCompleted { wave: self.rollout.waves[i].name.clone() });
        if i + 1 < self.rollout.waves.len() {
            self.begin(i + 1, now, false, transitions);
        } else {
            self.rollout.state = RolloutState::Completed;
            self.rollout.reason.clear();
            self.rollout.updated_at = stamp(now);
            transitions.push(Transition::Completed);
        }
    }

    /// Wave `i` becomes current: it waits for a `promote` when manual
    /// (unless `promoted`), else it starts.
    fn begin(&mut self, i: usize, now: SystemTime, promoted: bool, transitions: &mut Vec<Transition>) {
        self.rollout.wave = i;
        if self.policy.waves[i].approval == Approval::Manual && !promoted {
            self.set(i, WaveState::Waiting, RolloutState::Waiting, now);
            return;
        }
        self.rollout.waves[i].started_at = stamp(now);
        if let Some(deadline) = self.policy.deadline() {
            self.records[i].deadline = stamp(now + deadline);
        }
        self.set(i, WaveState::Progressing, RolloutState::Progressing, now);
        let _ = transitions;
    }

    fn fail(&mut self, i: usize, failure: Failure, why: String, now: SystemTime, transitions: &mut Vec<Transition>) {
        let name = self.rollout.waves[i].name.clone();
        let reason = format!("wave {name} failed: {why}");
        self.records[i].failure = Some(failure);
        self.records[i].gate_claim = None;
        if self.rollout.waves[i].finished_at.is_empty() {
            self.rollout.waves[i].finished_at = stamp(now);
        }
        let state = match self.policy.on_failure {
            OnFailure::Pause => RolloutState::Paused,
            OnFailure::Abort => RolloutState::Aborted,
        };
        self.set(i, WaveState::Failed, state, now);
        self.rollout.reason = reason.clone();
        transitions.push(match state {
            RolloutState::Aborted => Transition::Aborted { reason },
            _ => Transition::Halted { wave: name, reason },
        });
    }

    fn set(&mut self, i: usize, wave: WaveState, rollout: RolloutState, now: SystemTime) {
        self.rollout.waves[i].state = wave;
        self.rollout.state = rollout;
        self.rollout.updated_at = stamp(now);
    }

    /// Claims wave `i`'s gate for `holder` until `until`, if it is gating
    /// and no live claim holds it.
    pub fn claim_gate(&mut self, i: usize, holder: &str, until: SystemTime, now: SystemTime) -> bool {
        let gating = self.rollout.state == RolloutState::Gating && self.rollout.wave == i;
        let free = self.records[i].gate_claim.as_ref().is_none_or(|c| reached(&c.until, now));
        if !(gating && free) {
            return false;
        }
        self.records[i].gate_claim = Some(GateClaim { holder: holder.into(), until: stamp(until) });
        true
    }

    /// Records wave `i`'s gate result; the wave passes or fails. Nothing
    /// when the rollout has moved on (a promote, a pause, an abort).
    pub fn gate_done(&mut self, i: usize, result: GateResult, now: SystemTime) -> Vec<Transition> {
        let mut transitions = Vec::new();
        if self.rollout.state != RolloutState::Gating || self.rollout.wave != i {
            return transitions;
        }
        let passed = result.result == "success";
        let error = result.error.clone();
        self.rollout.waves[i].gate = Some(result);
        if passed {
            self.complete(i, now, &mut transitions);
        } else {
            self.fail(i, Failure::Gate, format!("its gate failed: {error}"), now, &mut transitions);
        }
        transitions
    }

    /// An operator's action, with `by` (the user and their reason) for
    /// the rollout's `reason`.
    pub fn act(&mut self, action: Action, by: &str, now: SystemTime) -> Result<Vec<Transition>, NotAllowed> {
        use RolloutState::*;
        let state = self.rollout.state;
        let refused = Err(NotAllowed { action, state });
        let i = self.rollout.wave;
        let mut transitions = Vec::new();
        match (action, state) {
            (Action::Pause, Progressing | Baking | Gating | Waiting) => {
                self.rollout.state = Paused;
                self.rollout.reason = format!("paused by {by}");
                self.rollout.updated_at = stamp(now);
            }
            (Action::Resume, Paused) => {
                self.rollout.reason.clear();
                self.resume(i, now, &mut transitions);
            }
            (Action::Abort, Progressing | Baking | Gating | Waiting | Paused) => {
                self.rollout.state = Aborted;
                let reason = format!("aborted by {by}");
                self.rollout.reason = reason.clone();
                self.rollout.updated_at = stamp(now);
                transitions.push(Transition::Aborted { reason });
            }
            (Action::Promote, Waiting) => self.begin(i, now, true, &mut transitions),
            (Action::Promote, Baking) => {
                self.records[i].bake_until.clear();
                self.after_bake(i, now, &mut transitions);
            }
            (Action::Promote, Gating) => {
                let error = format!("promoted by {by}");
                self.rollout.waves[i].gate = Some(GateResult { result: "success".into(), status: 0, error });
                self.complete(i, now, &mut transitions);
            }
            _ => return refused,
        }
        Ok(transitions)
    }

    /// A paused rollout goes on where it stopped; a failed wave's failures
    /// are accepted.
    fn resume(&mut self, i: usize, now: SystemTime, transitions: &mut Vec<Transition>) {
        let wave = self.rollout.waves[i].state;
        match (wave, self.records[i].failure.take()) {
            (WaveState::Failed, Some(Failure::Gate)) => self.complete(i, now, transitions),
            (WaveState::Failed, failure) => {
                self.records[i].accepted_failures = self.rollout.waves[i].failed;
                if failure == Some(Failure::Deadline) || !self.records[i].deadline.is_empty() {
                    self.records[i].deadline = self.policy.deadline().map(|d| stamp(now + d)).unwrap_or_default();
                }
                self.rollout.waves[i].finished_at.clear();
                self.set(i, WaveState::Progressing, RolloutState::Progressing, now);
            }
            (WaveState::Baking, _) => self.set(i, wave, RolloutState::Baking, now),
            (WaveState::Gating, _) => {
                self.records[i].gate_claim = None;
                self.set(i, wave, RolloutState::Gating, now);
            }
            (WaveState::Waiting, _) => self.set(i, wave, RolloutState::Waiting, now),
            _ => self.set(i, WaveState::Progressing, RolloutState::Progressing, now),
        }
    }

    /// The rollout's SyncID moved again: it ends `superseded`.
    pub fn supersede(&mut self, now: SystemTime) -> bool {
        if self.rollout.state.is_final() {
            return false;
        }
        self.rollout.state = RolloutState::Superseded;
        self.rollout.reason = "the SyncID moved again".into();
        self.rollout.updated_at = stamp(now);
        true
    }
}

impl WavePolicy {
    fn max_failures_text(&self) -> &str {
        if self.max_failures.is_empty() { "0" } else { &self.max_failures }
    }
}

#[cfg(test)]
mod tests;
