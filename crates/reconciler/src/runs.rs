//! Run records (platform §4.4): one per reconcile attempt, written in the
//! same store transaction as the attempt's result.
//!
//! Records: ring slot `seq % run_history` of the subscription's runs
//! ([`kayra_catalog::repo::Rider::Run`]),
//! so each new run overwrites the oldest and a subscription never holds more
//! than `run_history` runs, with no extra read or delete. `seq` counts the
//! subscription's runs. It is kept where the run's transaction writes
//! anyway: in the subscription record (`Subscription::runs`, stored only)
//! when the result rewrites it, as nearly every run's does; otherwise (a
//! second failure, a superseded or cancelled run, which leave the
//! subscription untouched) in a small cursor record ([`Cursor`], kept
//! apart from the run records so their readers never see it). The next run's
//! number is the greater of the two, both read in the job's one fresh read
//! under the lock; both go with the subscription (the cursor in the
//! catalog's delete transaction).

use std::sync::OnceLock;
use std::time::SystemTime;

use kayra_catalog::repo::Rider;
use kayra_core::{ApiRegistration, Run, RunResult, RunTrigger, Subscription};

/// The per-subscription run counter.
pub use kayra_catalog::repo::RunCursor as Cursor;

/// A run as it started: what the record needs before the result is known.
#[derive(Debug, Clone)]
pub struct Begun {
    pub id: String,
    pub trigger: RunTrigger,
    pub started_at: String,
}

impl Begun {
    pub fn new(trigger: RunTrigger) -> Self {
        Self { id: uuid::Uuid::now_v7().to_string(), trigger, started_at: now() }
    }
}

/// RFC 3339 UTC with milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// `<hostname>:<pid>` of this process.
pub fn identity() -> &'static str {
    static IDENTITY: OnceLock<String> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| "localhost".into());
        format!("{host}:{}", std::process::id())
    })
}

/// The number of the next run of a subscription whose record says `sub`
/// and whose run cursor says `cursor`.
pub fn next_seq(sub: Option<&Subscription>, cursor: Option<Cursor>) -> u64 {
    sub.map_or(0, |s| s.runs).max(cursor.map_or(0, |c| c.next))
}

/// The riders that record `run` as run number `seq` of its subscription,
/// keeping `history` runs; with `cursor`, also the cursor's advance (the
/// caller advances `Subscription::runs` instead when it rewrites the
/// subscription). Empty when `history` is 0 (the caller clears the runs
/// when it writes the subscription anyway).
pub fn riders(history: usize, seq: u64, run: &Run, cursor: bool) -> Vec<Rider<'_>> {
    if history == 0 {
        return Vec::new();
    }
    let mut riders = vec![Rider::Run { run, slot: seq % history as u64 }];
    if cursor {
        riders.push(Rider::RunCursor { namespace: &run.namespace, api: &run.api, cursor: Cursor { next: seq + 1 } });
    }
    riders
}

/// `run` as it is recorded when the store refused its result (§17): a
/// failure, saying why, without the outputs that may have made it too
/// large.
pub fn refused(run: &Run, why: &str) -> Run {
    let mut failed = run.clone();
    failed.result = RunResult::Error;
    failed.error = format!("the result could not be recorded: {why}");
    for step in &mut failed.steps {
        step.outputs.clear();
    }
    failed.bounded()
}

/// `kayra_sync_lag_seconds` of a sync to `reg`'s SyncID finishing now:
/// `None` when `sync_id_updated_at` is empty or unreadable.
pub fn sync_lag(reg: &ApiRegistration) -> Option<f64> {
    let at = humantime::parse_rfc3339_weak(reg.sync_id_updated_at.trim()).ok()?;
    Some(SystemTime::now().duration_since(at).map(|d| d.as_secs_f64()).unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sync_lag_needs_a_readable_timestamp() {
        let mut reg = ApiRegistration::default();
        assert_eq!(sync_lag(&reg), None);
        reg.sync_id_updated_at = "not a time".into();
        assert_eq!(sync_lag(&reg), None);
        reg.sync_id_updated_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        assert!(sync_lag(&reg).is_some_and(|lag| (0.0..60.0).contains(&lag)));
    }

    #[test]
    fn the_next_run_is_numbered_from_the_greater_count() {
        let sub = |runs| Subscription { runs, ..Subscription::new("core", "x.io") };
        let cursor = |next| Some(Cursor { next });
        assert_eq!(next_seq(None, None), 0, "a subscription's first run");
        assert_eq!(next_seq(Some(&sub(4)), None), 4);
        assert_eq!(next_seq(Some(&sub(4)), cursor(2)), 4, "later runs rewrote the subscription");
        assert_eq!(next_seq(Some(&sub(4)), cursor(5)), 5, "the last run left it untouched");
        assert_eq!(next_seq(None, cursor(3)), 3);
    }

    #[test]
    fn run_ids_are_time_ordered_uuids() {
        let (a, b) = (Begun::new(RunTrigger::Initial), Begun::new(RunTrigger::Initial));
        assert!(a.id < b.id);
        assert_eq!(uuid::Uuid::parse_str(&a.id).unwrap().get_version_num(), 7);
        assert!(a.started_at.ends_with('Z') && a.started_at.len() == "2026-01-01T00:00:00.000Z".len());
    }
}
