//! `ensureReconciled` as one decision (seed, "Ongoing action"; platform
//! contract §7): pure functions of what was observed, with no store and no
//! clock, so every row of the seed's diagram is a unit test below.
//!
//! ```text
//! ensureReconciled(reg, sub):
//!   subscription gone, or registration gone/out of scope -> nothing to do
//!   already active and CurrentSyncID == reg.SyncID       -> nothing to do
//!   this exact state was given up on (not at startup)    -> nothing to do
//!   otherwise                                            -> reconcile toward reg.SyncID
//! after reconcile(reg):
//!   succeeds -> CurrentSyncID = reg.SyncID (+ Active = true, first time), done
//!   fails    -> state error (written once); retry once right away;
//!               after the second failure give up until the next write
//! ```
//!
//! The same [`decide`] answers the unlocked "anything to do?" against the
//! reconciler's watch-fed view and, under the job lock, against one fresh
//! read: the two can never disagree about what a row means.

use kayra_core::rollout::RolloutRecord;
use kayra_core::{ApiRegistration, Subscription, SubscriptionState};
use kayra_store::Revision;
use serde::{Deserialize, Serialize};

/// The record of a given-up decision (stored under `/reconcileattempts/…`):
/// the (subscription, registration) revisions whose reconcile failed twice,
/// or (`cancelled`) whose run a user cancelled (§12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub subscription_revision: Revision,
    pub registration_revision: Revision,
    /// A cancelled run's state: it waits for the next trigger, a write to
    /// the subscription or to its registration alike, whether or not the
    /// subscription ever activated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancelled: bool,
}

/// What a decision reads of a subscription: a whole record (a job's fresh
/// read) and the view's compact entry ([`crate::view::SubscriberRef`])
/// answer alike.
pub trait SubscriptionFacts {
    fn namespace(&self) -> &str;
    fn active(&self) -> bool;
    fn state(&self) -> SubscriptionState;
    fn current_sync_id(&self) -> &str;
    /// Active and at `expected_sync_id` ([`Subscription::is_synced`]).
    fn is_synced(&self, expected_sync_id: &str) -> bool {
        self.active() && self.current_sync_id() == expected_sync_id
    }
}

impl SubscriptionFacts for Subscription {
    fn namespace(&self) -> &str {
        &self.namespace
    }
    fn active(&self) -> bool {
        self.active
    }
    fn state(&self) -> SubscriptionState {
        self.state
    }
    fn current_sync_id(&self) -> &str {
        &self.current_sync_id
    }
}

/// What a decision is made on: records with the revisions they were read at.
#[derive(Debug)]
pub struct Observed<'a, S = Subscription> {
    pub subscription: Option<(&'a S, Revision)>,
    pub registration: Option<(&'a ApiRegistration, Revision)>,
    /// The last given-up attempt on this subscription, if any.
    pub given_up: Option<&'a Attempt>,
    /// A rollout holds this subscriber back from the fan-out (§12; see
    /// [`holds`]).
    pub held: bool,
}

impl<S> Clone for Observed<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Observed<'_, S> {}

/// Why nothing is to be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// The subscription no longer exists.
    Gone,
    /// Its registration does not exist in this deployment.
    NoRegistration,
    /// Active and at the registration's SyncID.
    Synced,
    /// This exact state already failed twice: wait for the next write.
    GivenUp,
    /// A rollout holds it back: its wave has not started, or the rollout
    /// is paused or aborted (§12).
    Held,
}

/// What `ensureReconciled` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Nothing(Idle),
    /// Reconcile toward `sync_id`; `activate` when this is the first sync.
    Reconcile {
        sync_id: String,
        activate: bool,
    },
}

/// `ensureReconciled`'s question. `startup` is reconcileExisting, which
/// retries every record unconditionally (seed), given-up ones included.
pub fn decide<S: SubscriptionFacts>(observed: &Observed<'_, S>, startup: bool) -> Decision {
    let Some((sub, sub_rev)) = observed.subscription else { return Decision::Nothing(Idle::Gone) };
    let Some((reg, reg_rev)) = observed.registration else { return Decision::Nothing(Idle::NoRegistration) };
    if sub.is_synced(&reg.sync_id) {
        return Decision::Nothing(Idle::Synced);
    }
    if !startup && observed.given_up.is_some_and(|a| gave_up_on(a, sub, sub_rev, reg_rev)) {
        return Decision::Nothing(Idle::GivenUp);
    }
    if observed.held {
        return Decision::Nothing(Idle::Held);
    }
    Decision::Reconcile { sync_id: reg.sync_id.clone(), activate: !sub.active() }
}

/// Whether a rollout holds `sub` back from the fan-out toward `reg`'s
/// SyncID (§12): only the ongoing action is held — a first sync (not
/// active yet) or a force re-sync (`current_sync_id` emptied) never is.
/// While the registration has a policy but no rollout of its SyncID has
/// started yet (the reconcilers are about to start one), everyone behind
/// waits for it.
pub fn holds<S: SubscriptionFacts>(reg: &ApiRegistration, sub: &S, rollout: Option<&RolloutRecord>) -> bool {
    if reg.rollout.is_none() || !sub.active() || sub.current_sync_id().is_empty() || sub.is_synced(&reg.sync_id) {
        return false;
    }
    match rollout {
        Some(r) if r.rollout.sync_id == reg.sync_id => !r.releases(sub.namespace()),
        _ => true,
    }
}

/// Whether `attempt` covers this state (also: whether a held-back retry
/// is still of the state that failed). A subscription that never
/// activated is retried only by a write to itself: the seed's ongoing
/// action "never retries one that failed to activate" on a registration
/// write (docs/decisions.md, "Where the seed reads two ways").
pub(crate) fn gave_up_on<S: SubscriptionFacts>(
    attempt: &Attempt,
    sub: &S,
    sub_rev: Revision,
    reg_rev: Revision,
) -> bool {
    if attempt.cancelled {
        return attempt.subscription_revision == sub_rev && attempt.registration_revision == reg_rev;
    }
    attempt.subscription_revision == sub_rev && (!sub.active() || attempt.registration_revision == reg_rev)
}

/// How one reconcile ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    /// Stopped between steps by a shutdown: nothing is recorded.
    Cancelled,
    /// Stopped because the expected SyncID moved past the one it worked
    /// toward (§7 supersede): state and current_sync_id stay; the job runs
    /// again toward the new one.
    Superseded,
}

/// What to write to the subscription after a reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// `active: true`, `state: success`, `current_sync_id` (the first time
    /// this also activates the subscription).
    Success {
        sync_id: String,
    },
    /// `state: error`, everything else unchanged.
    Error,
    Nothing,
}

/// What the job does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    Done,
    /// Decide again on a fresh read, counting this failure.
    RetryNow,
    /// Record the given-up attempt, then stop.
    GiveUp,
}

/// Failures of one decision before it waits for the next write (§7: the
/// failure, then one immediate retry).
pub const ATTEMPTS_PER_DECISION: u32 = 2;

/// The diagram's second half. `failures` counts failures of this decision
/// before this outcome.
pub fn after(sub: &Subscription, sync_id: &str, outcome: Outcome, failures: u32) -> (Write, Then) {
    match outcome {
        Outcome::Succeeded => (Write::Success { sync_id: sync_id.to_string() }, Then::Done),
        Outcome::Cancelled | Outcome::Superseded => (Write::Nothing, Then::Done),
        Outcome::Failed => {
            // `state: error` is written once, not once per failure.
            let write = if sub.state == SubscriptionState::Error { Write::Nothing } else { Write::Error };
            let then = if failures + 1 >= ATTEMPTS_PER_DECISION { Then::GiveUp } else { Then::RetryNow };
            (write, then)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(active: bool, current: &str, state: SubscriptionState) -> Subscription {
        Subscription { active, current_sync_id: current.into(), state, ..Subscription::new("core", "x.io") }
    }

    fn reg(sync_id: &str) -> ApiRegistration {
        ApiRegistration { name: "x.io".into(), sync_id: sync_id.into(), ..Default::default() }
    }

    fn decide_on(
        s: Option<&Subscription>,
        r: Option<&ApiRegistration>,
        given_up: Option<Attempt>,
        startup: bool,
    ) -> Decision {
        let observed = Observed {
            subscription: s.map(|s| (s, 10)),
            registration: r.map(|r| (r, 20)),
            given_up: given_up.as_ref(),
            held: false,
        };
        decide(&observed, startup)
    }

    const SAME: Attempt = Attempt { subscription_revision: 10, registration_revision: 20, cancelled: false };
    const REG_MOVED: Attempt = Attempt { subscription_revision: 10, registration_revision: 19, cancelled: false };
    const SUB_MOVED: Attempt = Attempt { subscription_revision: 9, registration_revision: 20, cancelled: false };

    fn reconcile(sync_id: &str, activate: bool) -> Decision {
        Decision::Reconcile { sync_id: sync_id.into(), activate }
    }

    #[test]
    fn already_active_and_at_the_sync_id_is_nothing_to_do() {
        let s = sub(true, "s1", SubscriptionState::Success);
        assert_eq!(decide_on(Some(&s), Some(&reg("s1")), None, false), Decision::Nothing(Idle::Synced));
        // Even at startup, and even in state error (a later success moved it).
        assert_eq!(decide_on(Some(&s), Some(&reg("s1")), Some(SAME), true), Decision::Nothing(Idle::Synced));
    }

    #[test]
    fn a_new_subscription_is_activated_toward_the_current_sync_id() {
        let s = sub(false, "", SubscriptionState::Init);
        assert_eq!(decide_on(Some(&s), Some(&reg("s1")), None, false), reconcile("s1", true));
        // Inactive with a matching current_sync_id is still not synced.
        let s = sub(false, "s1", SubscriptionState::Error);
        assert_eq!(decide_on(Some(&s), Some(&reg("s1")), None, false), reconcile("s1", true));
    }

    #[test]
    fn an_active_subscription_behind_is_reconciled_without_activation() {
        let s = sub(true, "s1", SubscriptionState::Success);
        assert_eq!(decide_on(Some(&s), Some(&reg("s2")), None, false), reconcile("s2", false));
    }

    #[test]
    fn a_force_resync_reconciles_again() {
        let s = sub(true, "", SubscriptionState::Success);
        assert_eq!(decide_on(Some(&s), Some(&reg("s1")), None, false), reconcile("s1", false));
    }

    #[test]
    fn gone_records_mean_nothing_to_do() {
        let s = sub(false, "", SubscriptionState::Init);
        assert_eq!(decide_on(None, Some(&reg("s1")), None, true), Decision::Nothing(Idle::Gone));
        assert_eq!(decide_on(Some(&s), None, None, true), Decision::Nothing(Idle::NoRegistration));
    }

    #[test]
    fn a_given_up_state_waits_for_the_next_write() {
        let s = sub(true, "s1", SubscriptionState::Error);
        let r = reg("s2");
        assert_eq!(decide_on(Some(&s), Some(&r), Some(SAME), false), Decision::Nothing(Idle::GivenUp));
        // A write to the subscription or to its registration allows it again.
        assert_eq!(decide_on(Some(&s), Some(&r), Some(SUB_MOVED), false), reconcile("s2", false));
        assert_eq!(decide_on(Some(&s), Some(&r), Some(REG_MOVED), false), reconcile("s2", false));
    }

    #[test]
    fn startup_retries_a_given_up_state_unconditionally() {
        let s = sub(true, "s1", SubscriptionState::Error);
        assert_eq!(decide_on(Some(&s), Some(&reg("s2")), Some(SAME), true), reconcile("s2", false));
    }

    #[test]
    fn a_registration_write_alone_never_retries_a_failed_activation() {
        let s = sub(false, "", SubscriptionState::Error);
        let r = reg("s2");
        assert_eq!(decide_on(Some(&s), Some(&r), Some(REG_MOVED), false), Decision::Nothing(Idle::GivenUp));
        assert_eq!(decide_on(Some(&s), Some(&r), Some(SUB_MOVED), false), reconcile("s2", true));
    }

    #[test]
    fn a_cancelled_run_waits_for_any_next_write_or_a_restart() {
        let cancelled = |a: Attempt| Some(Attempt { cancelled: true, ..a });
        for s in [sub(false, "", SubscriptionState::Init), sub(true, "s1", SubscriptionState::Success)] {
            let r = reg("s2");
            assert_eq!(decide_on(Some(&s), Some(&r), cancelled(SAME), false), Decision::Nothing(Idle::GivenUp));
            let again = reconcile("s2", !s.active);
            assert_eq!(decide_on(Some(&s), Some(&r), cancelled(SUB_MOVED), false), again, "a write to it");
            assert_eq!(decide_on(Some(&s), Some(&r), cancelled(REG_MOVED), false), again, "a SyncID move");
            assert_eq!(decide_on(Some(&s), Some(&r), cancelled(SAME), true), again, "a restart");
        }
    }

    #[test]
    fn success_moves_current_sync_id_and_activates() {
        let s = sub(false, "", SubscriptionState::Init);
        assert_eq!(after(&s, "s1", Outcome::Succeeded, 0), (Write::Success { sync_id: "s1".into() }, Then::Done));
        // Also after an earlier failure of the same decision.
        assert_eq!(after(&s, "s1", Outcome::Succeeded, 1), (Write::Success { sync_id: "s1".into() }, Then::Done));
    }

    #[test]
    fn a_failure_writes_error_once_retries_once_then_gives_up() {
        let fresh = sub(true, "s1", SubscriptionState::Success);
        assert_eq!(after(&fresh, "s2", Outcome::Failed, 0), (Write::Error, Then::RetryNow));
        let errored = sub(true, "s1", SubscriptionState::Error);
        assert_eq!(after(&errored, "s2", Outcome::Failed, 1), (Write::Nothing, Then::GiveUp));
        // A subscription already in error from an earlier decision is not rewritten.
        assert_eq!(after(&errored, "s2", Outcome::Failed, 0), (Write::Nothing, Then::RetryNow));
    }

    #[test]
    fn a_cancelled_reconcile_records_nothing() {
        let s = sub(true, "s1", SubscriptionState::Success);
        assert_eq!(after(&s, "s2", Outcome::Cancelled, 0), (Write::Nothing, Then::Done));
    }

    #[test]
    fn a_superseded_reconcile_leaves_state_and_sync_id_and_counts_no_failure() {
        let s = sub(false, "", SubscriptionState::Init);
        assert_eq!(after(&s, "s1", Outcome::Superseded, 1), (Write::Nothing, Then::Done));
    }
}
