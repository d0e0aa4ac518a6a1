//! Run records (platform §4.4): one per reconcile attempt, written in the
//! same store transaction as the attempt's result.
//!
//! A subscription's runs are one record, its history
//! ([`kayra_core::run_ring::RunRing`]): the job's one fresh read under its
//! lock reads it with the subscription, and the result's transaction
//! rewrites it with the run added as the newest and the oldest past
//! `run_history` dropped ([`kayra_catalog::repo::Rider::Runs`]). No other
//! writer touches it while the job holds the lock, and the result commits
//! only while the subscription is as read, so the history read is the one
//! replaced. It goes with the subscription (the catalog's delete).

use std::sync::OnceLock;
use std::time::SystemTime;

use kayra_catalog::repo::{Repository, Rider};
use kayra_core::run_ring::RunRing;
use kayra_core::{ApiRegistration, Run, RunResult, RunTrigger};

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

/// A subscription's run history as its job read it.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub ring: RunRing,
    /// No history record was read: the result's write is the first, and
    /// replaces the run records an earlier build kept (`ring` holds them).
    pub first: bool,
}

impl History {
    /// The history of a job that read `stored`: that record, or, without
    /// one, the runs an earlier build recorded one a record (a read of
    /// its own, made only then; none when no runs are kept).
    pub async fn read(
        repo: &Repository,
        (namespace, api): (&str, &str),
        stored: Option<RunRing>,
        keep: usize,
    ) -> kayra_catalog::repo::Result<Self> {
        Ok(match stored {
            Some(ring) => History { ring, first: false },
            None if keep == 0 => History { ring: RunRing::default(), first: true },
            None => History { ring: repo.earlier_runs(namespace, api).await?, first: true },
        })
    }
}

/// The subscription's run history as the job read it, with `run` added,
/// keeping `keep` runs; `None` when `keep` is 0 (the caller clears the
/// runs when it writes the subscription anyway).
pub fn recorded(keep: usize, read: &History, run: &Run) -> Option<RunRing> {
    if keep == 0 {
        return None;
    }
    let mut ring = read.ring.clone();
    ring.push(run, keep);
    Some(ring)
}

/// The rider that writes `ring`, the history of `run`'s subscription as
/// [`recorded`] left it from `read`.
pub fn rider<'a>(run: &'a Run, ring: &'a RunRing, read: &History) -> Rider<'a> {
    Rider::Runs { namespace: &run.namespace, api: &run.api, ring, first: read.first }
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
    fn a_run_is_added_to_the_history_as_read() {
        let run = |id: &str| Run { id: id.into(), namespace: "core".into(), api: "x.io".into(), ..Run::default() };
        let read = |ring: &RunRing| History { ring: ring.clone(), first: false };
        let none = History { first: true, ..History::default() };
        assert_eq!(recorded(0, &none, &run("a")), None, "a history of 0 records nothing");
        let first = recorded(2, &none, &run("a")).unwrap();
        let second = recorded(2, &read(&first), &run("b")).unwrap();
        let third = recorded(2, &read(&second), &run("c")).unwrap();
        let ids = |ring: &RunRing| ring.ids().into_iter().flatten().collect::<Vec<_>>();
        assert_eq!(ids(&second), ["b", "a"]);
        assert_eq!(ids(&third), ["c", "b"], "the oldest past the history goes");
        assert_eq!(ids(&recorded(5, &read(&third), &run("d")).unwrap()), ["d", "c", "b"]);
        let earlier = RunRing::of(&[run("y"), run("x")], 2);
        let migrated = History { ring: earlier, first: true };
        assert_eq!(ids(&recorded(3, &migrated, &run("z")).unwrap()), ["z", "y", "x"], "an earlier build's runs stay");
        let (z, ring) = (run("z"), RunRing::default());
        assert!(matches!(rider(&z, &ring, &migrated), Rider::Runs { first: true, .. }), "and their records go");
    }

    #[test]
    fn run_ids_are_time_ordered_uuids() {
        let (a, b) = (Begun::new(RunTrigger::Initial), Begun::new(RunTrigger::Initial));
        assert!(a.id < b.id);
        assert_eq!(uuid::Uuid::parse_str(&a.id).unwrap().get_version_num(), 7);
        assert!(a.started_at.ends_with('Z') && a.started_at.len() == "2026-01-01T00:00:00.000Z".len());
    }
}
