//! `update catalog apiregistrations NAME/sync --wait`: bump the SyncID,
//! then show the fan-out's progress until every subscriber is synced or
//! failed (platform §9).
//!
//! Progress comes from `GET .../apiregistrations/NAME/status` (its
//! `synced`, `failed`, `pending` of `total`), polled every [`POLL`]. It is
//! drawn as a progress bar when stdout is a terminal, and as one plain line
//! per change otherwise (logs, CI, tests). The fan-out is over once
//! `pending` has stayed 0 for [`SETTLE`]: a failure's immediate retry is
//! still pending-to-be for a moment, and must be given the chance to land.
//!
//! When the registration has a rollout policy (§12), its rollout is read
//! with each poll and its current wave's progress shown with the counts;
//! the wait ends with exit 4 when the rollout pauses or aborts.
//!
//! Exit: 0 when all are synced; 1 when any failed (or the PUT itself was
//! refused); 3 on `--timeout`; 4 when the rollout paused or aborted.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;
use tokio::time::Instant;

use crate::client::{Body, Client};
use crate::error::{Error, invalid};
use crate::escape::escape_controls;
use crate::request::{Request, Target, Verb};
use crate::watch::human;

/// Time between two status reads.
pub const POLL: Duration = Duration::from_millis(200);
/// How long `pending` must stay 0 before the fan-out counts as done.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The counts of a `/status` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub total: u64,
    pub synced: u64,
    pub failed: u64,
    pub pending: u64,
}

impl Counts {
    fn of(status: &Value) -> Option<Counts> {
        let n = |key: &str| status.get(key).and_then(Value::as_u64);
        Some(Counts { total: n("total")?, synced: n("synced")?, failed: n("failed")?, pending: n("pending")? })
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} synced, {} failed, {} pending", self.synced, self.total, self.failed, self.pending)
    }
}

/// Decides when the fan-out is over: `pending` 0 for [`SETTLE`] in a row.
#[derive(Debug, Default)]
pub struct Settle {
    zero_since: Option<Instant>,
}

impl Settle {
    /// Records one reading; true once the fan-out is over.
    pub fn observe(&mut self, counts: Counts, now: Instant) -> bool {
        if counts.pending > 0 {
            self.zero_since = None;
            return false;
        }
        let since = *self.zero_since.get_or_insert(now);
        now.duration_since(since) >= SETTLE
    }
}

/// How progress is shown.
enum Display {
    Bar(ProgressBar),
    /// The counts and the rollout line last printed.
    Lines(Option<Counts>, Option<String>),
}

impl Display {
    fn new() -> Display {
        if std::io::stdout().is_terminal() {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
            let style = ProgressStyle::with_template("{spinner} [{bar:40}] {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            Display::Bar(bar)
        } else {
            Display::Lines(None, None)
        }
    }

    fn show(&mut self, counts: Counts) -> Result<(), Error> {
        match self {
            Display::Bar(bar) => {
                bar.set_length(counts.total);
                bar.set_position(counts.synced + counts.failed);
                bar.set_message(counts.to_string());
                Ok(())
            }
            Display::Lines(last, _) if *last != Some(counts) => {
                *last = Some(counts);
                crate::output::emit(format!("{counts}\n").as_bytes())
            }
            Display::Lines(..) => Ok(()),
        }
    }

    /// The rollout's progress line, shown when it changes.
    fn show_rollout(&mut self, counts: Counts, line: String) -> Result<(), Error> {
        match self {
            Display::Bar(bar) => {
                bar.set_message(format!("{counts}; {line}"));
                Ok(())
            }
            Display::Lines(_, last) if last.as_deref() != Some(line.as_str()) => {
                let text = format!("{line}\n");
                *last = Some(line);
                crate::output::emit(text.as_bytes())
            }
            Display::Lines(..) => Ok(()),
        }
    }

    fn finish(&mut self, counts: Counts) {
        if let Display::Bar(bar) = self {
            bar.finish_with_message(counts.to_string());
        }
    }
}

/// Waits for the fan-out of registration `name` after its `/sync`.
pub async fn run(client: &Client, name: &str, timeout: Duration) -> Result<(), Error> {
    let target = Target::new("catalog", None, "apiregistrations", Some(&format!("{name}/status")))?;
    let request = Request::build(Verb::Get, &target, None)?;
    let rollout = rollout_request(client, name).await?;
    let mut display = Display::new();
    let mut settle = Settle::default();
    let mut warned: Option<String> = None;
    let mut counts: Option<Counts> = None;
    let deadline = Instant::now() + timeout;
    let (counts, status) = loop {
        // The counts only: one subscriber, not every one, per poll (§16).
        match client.send_with_query(&request, &[("limit", "1")]).await {
            Ok(Body::Json(answer)) => {
                let Some(now) = Counts::of(&answer) else {
                    return Err(invalid("the server's /status has no synced/failed/pending counts (too old?)"));
                };
                warned = None;
                display.show(now)?;
                counts = Some(now);
                if let Some(request) = &rollout
                    && let Some(rollout) = current_rollout(client, request, &answer).await?
                {
                    display.show_rollout(now, crate::rollout::progress(&rollout))?;
                    if crate::rollout::halted(&rollout) {
                        display.finish(now);
                        return Err(Error::Halted(crate::rollout::summary(&rollout)));
                    }
                }
                if settle.observe(now, Instant::now()) {
                    break (now, answer);
                }
            }
            Ok(_) => return Err(Error::Transport("the status answer is not JSON".into())),
            Err(e) if e.is_transient() => {
                let text = e.to_string();
                if warned.as_deref() != Some(text.as_str()) {
                    eprintln!("{text} (retrying)");
                    warned = Some(text);
                }
            }
            Err(e) => return Err(e),
        }
        if Instant::now() + POLL > deadline {
            let shown = counts.map_or_else(|| "no status yet".to_string(), |c| c.to_string());
            if let Some(counts) = counts {
                display.finish(counts);
            }
            return Err(Error::NotSynced(format!("not every subscriber synced after {}: {shown}", human(timeout))));
        }
        tokio::time::sleep(POLL).await;
    };
    display.finish(counts);
    if counts.failed > 0 {
        let failed = failed_namespaces(client, &request).await?;
        return Err(failure(counts, &status, &failed));
    }
    Ok(())
}

/// The request of registration `name`'s rollout when it has a rollout
/// policy; `None` when its SyncID changes reach everyone at once.
async fn rollout_request(client: &Client, name: &str) -> Result<Option<Request>, Error> {
    let target = Target::new("catalog", None, "apiregistrations", Some(name))?;
    let registration = match client.send(&Request::build(Verb::Get, &target, None)?).await? {
        Body::Json(registration) => registration,
        _ => return Err(Error::Transport("the registration's answer is not JSON".into())),
    };
    if registration.get("rollout").is_none_or(Value::is_null) {
        return Ok(None);
    }
    let target = Target::new("catalog", None, "apiregistrations", Some(&format!("{name}/rollout")))?;
    Ok(Some(Request::build(Verb::Get, &target, None)?))
}

/// The rollout toward the SyncID `status` shows; `None` while the
/// reconcilers have not started it (404, or the previous one). A transient
/// failure is `None` too: the next poll reads it again.
async fn current_rollout(client: &Client, request: &Request, status: &Value) -> Result<Option<Value>, Error> {
    match client.send(request).await {
        Ok(Body::Json(rollout)) if rollout.get("sync_id") == status.get("sync_id") => Ok(Some(rollout)),
        Ok(_) => Ok(None),
        Err(Error::Api { status: 404, .. }) => Ok(None),
        Err(e) if e.is_transient() => Ok(None),
        Err(e) => Err(e),
    }
}

/// At most this many failed namespaces are named in the error.
const NAMED_FAILURES: usize = 100;

/// The failed subscribers' namespaces (at most [`NAMED_FAILURES`]): the
/// report's page of its failed ones (`?category=failed`), never every
/// subscriber (a server that pages without the filter is read on until
/// enough are found).
async fn failed_namespaces(client: &Client, request: &Request) -> Result<Vec<String>, Error> {
    let mut failed = Vec::new();
    let mut token = String::new();
    let limit = NAMED_FAILURES.to_string();
    loop {
        let query = [("category", "failed"), ("limit", limit.as_str()), ("continue", token.as_str())];
        let Body::Json(page) = client.send_with_query(request, &query).await? else {
            return Err(Error::Transport("the status answer is not JSON".into()));
        };
        let subscribers = page["subscribers"].as_array().into_iter().flatten();
        let failing = subscribers.filter(|s| s["synced"] == false && s["state"] == "error");
        failed.extend(failing.filter_map(|s| s["namespace"].as_str()).map(escape_controls));
        token = page["continue"].as_str().unwrap_or_default().to_string();
        if token.is_empty() || failed.len() >= NAMED_FAILURES {
            failed.truncate(NAMED_FAILURES);
            return Ok(failed);
        }
    }
}

/// The error of a fan-out in which `counts.failed` subscribers failed:
/// which ones, and to which SyncID, as the server named them (escaped).
fn failure(counts: Counts, status: &Value, failed: &[String]) -> Error {
    let more = (counts.failed as usize).saturating_sub(failed.len());
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    invalid(format!(
        "{} of {} subscribers failed to sync to {}: {}{more}",
        counts.failed,
        counts.total,
        escape_controls(status["sync_id"].as_str().unwrap_or_default()),
        failed.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pending: u64) -> Counts {
        Counts { total: 3, synced: 3 - pending, failed: 0, pending }
    }

    #[test]
    fn settles_only_after_pending_stays_zero() {
        let start = Instant::now();
        let mut settle = Settle::default();
        assert!(!settle.observe(counts(2), start));
        assert!(!settle.observe(counts(0), start + Duration::from_secs(1)));
        // The immediate retry: pending again, the clock restarts.
        assert!(!settle.observe(counts(1), start + Duration::from_millis(2500)));
        assert!(!settle.observe(counts(0), start + Duration::from_secs(3)));
        assert!(!settle.observe(counts(0), start + Duration::from_millis(4900)));
        assert!(settle.observe(counts(0), start + Duration::from_secs(5)));
    }

    #[test]
    fn a_failure_names_what_failed_escaped() {
        let status = serde_json::json!({"sync_id": "s\u{1b}]0;x\u{7}\u{9b}2J"});
        let counts = Counts { total: 2, synced: 1, failed: 1, pending: 0 };
        let failed = [escape_controls("core\u{7f}\u{85}")];
        let text = failure(counts, &status, &failed).to_string();
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert_eq!(text, "error: 1 of 2 subscribers failed to sync to s\\u{1b}]0;x\\u{7}\\u{9b}2J: core\\u{7f}\\u{85}");
        let counts = Counts { total: 300, synced: 0, failed: 250, pending: 50 };
        let text = failure(counts, &status, &failed).to_string();
        assert!(text.ends_with("core\\u{7f}\\u{85} and 249 more"), "{text}");
    }

    #[test]
    fn counts_read_and_show() {
        let status = serde_json::json!({"total": 5, "synced": 2, "failed": 1, "pending": 2});
        let c = Counts::of(&status).unwrap();
        assert_eq!(c.to_string(), "2/5 synced, 1 failed, 2 pending");
        assert_eq!(Counts::of(&serde_json::json!({"total": 1, "synced": 1})), None);
    }
}
