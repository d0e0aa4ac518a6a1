//! A registration's rollout (platform §12): `get catalog apiregistrations
//! NAME/rollout` as a table of its waves (WAVE, STATE, SYNCED, FAILED,
//! PENDING, TOTAL, STARTED) and a line with the rollout's state, and the
//! one-line progress `--wait` shows while a rollout paces a fan-out.

use std::fmt::Write as _;

use serde_json::Value;

use crate::escape::escape_controls;
use crate::grid::{cell, layout};

const HEADERS: [&str; 7] = ["WAVE", "STATE", "SYNCED", "FAILED", "PENDING", "TOTAL", "STARTED"];

/// A `GET …/rollout` answer as a table, then its state line.
pub fn table(rollout: &Value) -> String {
    let waves: Vec<&Value> = rollout["waves"].as_array().map(|w| w.iter().collect()).unwrap_or_default();
    let mut text = if waves.is_empty() {
        "no waves\n".to_string()
    } else {
        let rows = waves
            .iter()
            .map(|wave| {
                ["name", "state", "synced", "failed", "pending", "total"]
                    .iter()
                    .map(|key| cell(wave.get(key)))
                    .chain([started(wave)])
                    .collect()
            })
            .collect();
        layout(HEADERS.iter().map(|h| h.to_string()).collect(), rows)
    };
    let _ = writeln!(text, "{}", summary(rollout));
    text
}

/// A wave's `started_at`, `-` before it started.
fn started(wave: &Value) -> String {
    match wave.get("started_at").and_then(Value::as_str) {
        Some("") => "-".into(),
        _ => cell(wave.get("started_at")),
    }
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// `rollout to s2 (compute.example.com): waiting at wave 2/3 rest`, then
/// `: <reason>` when there is one; every server string escaped.
pub fn summary(rollout: &Value) -> String {
    let waves = rollout["waves"].as_array().map_or(0, Vec::len);
    let index = rollout["wave"].as_u64().unwrap_or_default() as usize;
    let name = rollout["waves"].get(index).map(|w| text(w, "name")).unwrap_or_default();
    let mut line = format!(
        "rollout to {} ({}): {} at wave {}/{} {}",
        escape_controls(text(rollout, "sync_id")),
        escape_controls(text(rollout, "api")),
        escape_controls(text(rollout, "state")),
        index + 1,
        waves,
        escape_controls(name),
    );
    let reason = text(rollout, "reason");
    if !reason.is_empty() {
        let _ = write!(line, ": {}", escape_controls(reason));
    }
    line
}

/// One line of `--wait`'s wave progress: the current wave's counts.
pub fn progress(rollout: &Value) -> String {
    let index = rollout["wave"].as_u64().unwrap_or_default() as usize;
    let wave = rollout["waves"].get(index).cloned().unwrap_or_default();
    let n = |key: &str| wave.get(key).and_then(Value::as_u64).unwrap_or_default();
    format!(
        "{} (wave {}: {}/{} synced, {} failed, {} pending)",
        summary(rollout),
        escape_controls(text(&wave, "state")),
        n("synced"),
        n("total"),
        n("failed"),
        n("pending")
    )
}

/// Whether the rollout stopped the fan-out: `paused` or `aborted` (`--wait` exits 4).
pub fn halted(rollout: &Value) -> bool {
    matches!(text(rollout, "state"), "paused" | "aborted")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rollout() -> Value {
        json!({"api": "compute.example.com", "sync_id": "s2", "state": "waiting", "reason": "", "wave": 1,
            "started_at": "2026-02-01T00:00:00.000Z", "updated_at": "2026-02-01T00:01:00.000Z",
            "waves": [
                {"name": "canary", "state": "completed", "total": 2, "synced": 2, "failed": 0, "pending": 0,
                 "started_at": "2026-02-01T00:00:00.000Z", "finished_at": "2026-02-01T00:00:30.000Z", "gate": null},
                {"name": "rest", "state": "waiting", "total": 8, "synced": 0, "failed": 0, "pending": 8,
                 "started_at": "", "finished_at": "", "gate": null}]})
    }

    #[test]
    fn the_waves_table_has_the_contract_columns_and_a_state_line() {
        let text = table(&rollout());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), HEADERS);
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["canary", "completed", "2", "0", "0", "2", "2026-02-01T00:00:00.000Z"]
        );
        assert_eq!(lines[2].split_whitespace().collect::<Vec<_>>(), ["rest", "waiting", "0", "0", "8", "8", "-"]);
        assert_eq!(lines[3], "rollout to s2 (compute.example.com): waiting at wave 2/2 rest");
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn a_reason_is_shown_escaped_and_halts_a_wait() {
        let mut paused = rollout();
        paused["state"] = json!("paused");
        paused["reason"] = json!("paused by alice: error rate\u{1b}[2J up");
        let line = summary(&paused);
        assert!(line.ends_with(": paused by alice: error rate\\u{1b}[2J up"), "{line}");
        assert!(halted(&paused) && !halted(&rollout()));
        assert_eq!(
            progress(&rollout()),
            "rollout to s2 (compute.example.com): waiting at wave 2/2 rest (wave waiting: 0/8 synced, 0 failed, 8 pending)"
        );
    }
}
