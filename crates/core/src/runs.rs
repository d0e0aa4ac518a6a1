//! Runs: the record of one reconcile attempt of a subscription (platform §4.4).
//!
//! Written by the reconciler in the same store transaction as the attempt's
//! result; read by the catalog API (`.../subscriptions/:api/runs`), the CLI
//! and the console.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What made a job run: the cause of the newest write that triggered it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RunTrigger {
    /// A write to the subscription.
    #[default]
    Initial,
    /// Its registration's SyncID moved (also a run after `superseded`).
    Ongoing,
    /// The subscription's `/sync` reset.
    Resync,
    /// reconcileExisting after a reconciler start.
    Startup,
    /// The immediate retry after a failure.
    Retry,
}

/// How a run ended.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RunResult {
    #[default]
    Success,
    Error,
    /// Stopped between steps by a shutdown.
    Cancelled,
    /// Stopped because the expected SyncID moved past the one it worked toward.
    Superseded,
}

/// One reconcile attempt of one subscription.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Run {
    /// Unique and time-ordered (a UUIDv7); also `run_id` in logs and `.Run.ID`.
    pub id: String,
    pub namespace: String,
    pub api: String,
    /// The SyncID the run worked toward.
    pub sync_id: String,
    /// The resolved mode; empty when none resolved.
    pub mode: String,
    pub trigger: RunTrigger,
    pub result: RunResult,
    #[serde(default)]
    pub error: String,
    /// RFC 3339 UTC with milliseconds.
    pub started_at: String,
    pub finished_at: String,
    /// The pool slot that ran it.
    pub lock_id: usize,
    /// `<hostname>:<pid>` of the reconciler.
    pub reconciler: String,
    /// Empty for a placeholder run.
    #[serde(default)]
    pub steps: Vec<RunStep>,
}

/// One step of a run, as it was sent and answered (redacted as §2/§8 say).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RunStep {
    /// 0-based.
    pub index: usize,
    /// Upper-case.
    pub method: String,
    /// Rendered, without user info; `<redacted>` when it holds a secret.
    pub endpoint: String,
    #[serde(rename = "async")]
    pub is_async: bool,
    /// Calls made (a `wait` step counts each poll).
    pub attempts: u32,
    /// 0 when no response came.
    pub status: u16,
    #[serde(default)]
    pub error: String,
    /// Spans every attempt.
    pub duration_ms: u64,
    #[serde(default)]
    pub outputs: BTreeMap<String, String>,
}

/// How much of one value a run record, a log line or an error message shows
/// (platform §17): an output value, an `error`, a rendered endpoint.
pub const SHOWN_BYTES: usize = 1024;

/// The most a run record weighs, JSON-encoded (platform §17).
pub const MAX_RUN_RECORD_BYTES: usize = 16 * 1024;

/// `text` as it may be shown: whole when it is at most [`SHOWN_BYTES`]
/// long, else its first [`SHOWN_BYTES`] bytes (cut at a character
/// boundary) and `…(N bytes)`, N its whole length.
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    cut(text, SHOWN_BYTES)
}

/// `text` cut to at most `max` bytes, with `…(N bytes)` appended when it
/// was longer (N its whole length). A value cut before keeps the N it
/// says: cutting again only shortens what is kept.
pub fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    let (kept, whole) = match cut_before(text) {
        Some((kept, whole)) => (kept, whole),
        None => (text, text.len()),
    };
    if kept.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !kept.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…({whole} bytes)", &kept[..end]))
}

/// What a value [`cut`] before kept, and its whole length.
fn cut_before(text: &str) -> Option<(&str, usize)> {
    let (kept, note) = text.rsplit_once("…(")?;
    let whole = note.strip_suffix(" bytes)")?.parse().ok()?;
    Some((kept, whole))
}

impl Run {
    /// The run cut down to what a record holds (§17): every output value,
    /// `error` and endpoint at most [`SHOWN_BYTES`] (see [`shown`]), and the
    /// whole at most [`MAX_RUN_RECORD_BYTES`] encoded. When the cut values
    /// still weigh more (many steps, many outputs), they are cut shorter,
    /// then the outputs are left out, then the last steps, saying so in
    /// `error`: the record always keeps which steps ran and how they ended.
    pub fn bounded(mut self) -> Run {
        for max in [SHOWN_BYTES, 256, 64] {
            self.cut_values(max);
            if self.encoded_len() <= MAX_RUN_RECORD_BYTES {
                return self;
            }
        }
        let mut dropped = 0;
        for step in &mut self.steps {
            dropped += step.outputs.len();
            step.outputs.clear();
        }
        if dropped > 0 {
            self.note(&format!("{dropped} outputs not recorded: the run record is limited to 16 KiB"));
        }
        if self.encoded_len() <= MAX_RUN_RECORD_BYTES {
            return self;
        }
        let steps = std::mem::take(&mut self.steps);
        // What the record weighs without its steps, with room for the note below.
        let mut weight = self.encoded_len() + 160;
        let kept = steps
            .iter()
            .take_while(|step| {
                // Its encoding and the comma before it.
                weight += serde_json::to_vec(step).map_or(usize::MAX / 2, |v| v.len()) + 1;
                weight <= MAX_RUN_RECORD_BYTES
            })
            .count();
        let left_out = steps.len() - kept;
        self.steps = steps;
        self.steps.truncate(kept);
        if left_out > 0 {
            self.note(&format!("the last {left_out} steps not recorded: the run record is limited to 16 KiB"));
        }
        self
    }

    fn cut_values(&mut self, max: usize) {
        fn cut_in_place(text: &mut String, max: usize) {
            if let std::borrow::Cow::Owned(cut) = cut(text, max) {
                *text = cut;
            }
        }
        cut_in_place(&mut self.error, max);
        for step in &mut self.steps {
            cut_in_place(&mut step.endpoint, max);
            cut_in_place(&mut step.error, max);
            for value in step.outputs.values_mut() {
                cut_in_place(value, max);
            }
        }
    }

    fn note(&mut self, note: &str) {
        self.error = if self.error.is_empty() { note.to_string() } else { format!("{} ({note})", self.error) };
    }

    fn encoded_len(&self) -> usize {
        serde_json::to_vec(self).map_or(usize::MAX, |v| v.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_values_keep_their_first_kibibyte_and_say_how_long_they_were() {
        assert_eq!(shown("short"), "short");
        let long = "é".repeat(700); // 1400 bytes, two a character
        let once = shown(&long);
        assert!(once.ends_with("…(1400 bytes)"), "{once}");
        let kept = once.trim_end_matches("…(1400 bytes)");
        assert_eq!(kept.len(), 1024, "1024 bytes kept, at a character boundary");
        assert_eq!(shown(&"x".repeat(1024)).len(), 1024, "exactly the limit is whole");
        assert_eq!(shown(&once), once, "a value cut before is not cut again");
        assert_eq!(cut(&once, 4), "éé…(1400 bytes)", "cut shorter, it keeps its whole length");
    }

    fn step(outputs: usize, value: usize) -> RunStep {
        RunStep {
            endpoint: format!("https://backend.example.com/{}", "p".repeat(3000)),
            error: "e".repeat(3000),
            outputs: (0..outputs).map(|i| (format!("OUT{i}"), "v".repeat(value))).collect(),
            ..RunStep::default()
        }
    }

    #[test]
    fn a_run_record_is_at_most_sixteen_kibibytes_and_keeps_its_steps() {
        let small = Run { steps: vec![step(1, 10)], ..Run::default() };
        let bounded = small.clone().bounded();
        assert_eq!(bounded.steps[0].outputs, small.steps[0].outputs, "short outputs stay whole");
        assert!(bounded.steps[0].error.ends_with("…(3000 bytes)"));
        assert!(bounded.steps[0].endpoint.ends_with(&format!("…({} bytes)", small.steps[0].endpoint.len())));

        for (steps, outputs, value) in [(3, 4, 5000), (20, 30, 2000), (200, 0, 0), (2000, 1, 10)] {
            let run = Run {
                error: "x".repeat(100_000),
                steps: (0..steps).map(|_| step(outputs, value)).collect(),
                ..Run::default()
            };
            let bounded = run.bounded();
            let len = serde_json::to_vec(&bounded).unwrap().len();
            assert!(len <= MAX_RUN_RECORD_BYTES, "{steps} steps × {outputs} outputs: {len} bytes");
            assert!(!bounded.steps.is_empty(), "the first steps are kept");
        }
    }
}
