//! The table of a subscription's runs (platform §9): `ID`, `TRIGGER`,
//! `SYNC ID`, `RESULT`, `STARTED`, `DURATION`, `STEPS`, newest first as the
//! server sends them. One run's steps are shown with `-o yaml` or
//! `-o json` on `subscriptions API/runs/ID`.

use std::time::SystemTime;

use serde_json::Value;

use crate::grid::{cell, layout};

const HEADERS: [&str; 7] = ["ID", "TRIGGER", "SYNC ID", "RESULT", "STARTED", "DURATION", "STEPS"];

/// A `{"items": [run, ...]}` answer as a table.
pub fn table(list: &Value) -> String {
    let runs: Vec<&Value> = list["items"].as_array().map(|items| items.iter().collect()).unwrap_or_default();
    if runs.is_empty() {
        return String::new();
    }
    let rows = runs
        .iter()
        .map(|run| {
            vec![
                cell(run.get("id")),
                cell(run.get("trigger")),
                cell(run.get("sync_id")),
                cell(run.get("result")),
                cell(run.get("started_at")),
                duration(run),
                run.get("steps").and_then(Value::as_array).map_or_else(|| "<none>".into(), |s| s.len().to_string()),
            ]
        })
        .collect();
    layout(HEADERS.iter().map(|h| h.to_string()).collect(), rows)
}

/// `finished_at - started_at`, e.g. `1.7s`, `41ms`, `2m5s`; `<none>` when
/// either is missing or unreadable.
fn duration(run: &Value) -> String {
    let at = |key: &str| -> Option<SystemTime> { humantime::parse_rfc3339(run.get(key)?.as_str()?).ok() };
    let (Some(start), Some(end)) = (at("started_at"), at("finished_at")) else {
        return "<none>".into();
    };
    let Ok(took) = end.duration_since(start) else {
        return "<none>".into();
    };
    let millis = took.as_millis();
    match millis {
        0..1000 => format!("{millis}ms"),
        1000..60_000 => format!("{:.1}s", took.as_secs_f64()),
        _ => format!("{}m{}s", took.as_secs() / 60, took.as_secs() % 60),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn runs_table_has_the_contract_columns() {
        let list = json!({"items": [
            {"id": "0193-b", "trigger": "ongoing", "sync_id": "s2", "result": "error",
             "started_at": "2026-02-01T00:00:03.200Z", "finished_at": "2026-02-01T00:00:04.900Z",
             "steps": [{"index": 0}, {"index": 1}]},
            {"id": "0193-a", "trigger": "initial", "sync_id": "s1", "result": "success",
             "started_at": "2026-02-01T00:00:00.000Z", "finished_at": "2026-02-01T00:00:00.041Z", "steps": []},
        ], "continue": ""});
        let text = table(&list);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0].split("   ").map(str::trim).filter(|s| !s.is_empty()).collect::<Vec<_>>(), HEADERS);
        let first: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(first, ["0193-b", "ongoing", "s2", "error", "2026-02-01T00:00:03.200Z", "1.7s", "2"]);
        let second: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(&second[5..], ["41ms", "0"]);
        assert_eq!(table(&json!({"items": []})), "");
        assert_eq!(duration(&json!({"started_at": "x"})), "<none>");
        let long = json!({"started_at": "2026-02-01T00:00:00Z", "finished_at": "2026-02-01T00:02:05Z"});
        assert_eq!(duration(&long), "2m5s");
    }
}
