//! `get --watch` and `--until-synced`.
//!
//! `--watch` on a catalog object or collection follows the server's watch
//! stream (§4.5, `?watch=true`, NDJSON) and prints one row per event as it
//! arrives, with the event's type in front ([`Printer`]). A gateway answer
//! has no stream, so there `--watch` polls like `--until-synced` does.
//!
//! `--until-synced` polls: a subscription or a registration's status is
//! one small GET, and the decision "synced yet?" is made on the whole
//! answer. The loop is written against a `fetch` closure and a `show`
//! callback so it is tested with paused tokio time, without a server.
//!
//! Failures while watching: a 4xx (the object was deleted, the token
//! revoked) ends the watch at once; a 5xx or transport error is reported
//! once on stderr and retried, since a restarting server is exactly what
//! someone watching a rollout may see.

use std::future::Future;
use std::time::Duration;

use serde_json::Value;

use crate::client::Client;
use crate::error::{Error, invalid};
use crate::escape::escape_controls;
use crate::output::{Format, json, render, table};
use crate::request::{Request, View};

/// The watch flags of `get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Time between two fetches.
    pub interval: Duration,
    /// Stop with success once [`synced`] says so.
    pub until_synced: bool,
    /// With `until_synced`: give up after this long.
    pub timeout: Duration,
}

/// What the watch loop reports to its caller.
#[derive(Debug)]
pub enum Update<'a> {
    /// A fresh answer (the caller prints it if it changed).
    Answer(&'a Value),
    /// A transient failure that will be retried.
    Retrying(&'a Error),
}

/// Whether an answer says everything is synced, `None` when it has no such
/// notion: a subscription's `synced: true`; a registration status's
/// `synced == total`; a list of subscriptions whose every item is synced.
pub fn synced(value: &Value) -> Option<bool> {
    match value.get("items").and_then(Value::as_array) {
        Some(items) => items.iter().map(synced_one).try_fold(true, |all, one| Some(all && one?)),
        None => synced_one(value),
    }
}

fn synced_one(value: &Value) -> Option<bool> {
    match (value.get("synced")?, value.get("total")) {
        (Value::Bool(synced), _) => Some(*synced),
        (Value::Number(synced), Some(Value::Number(total))) => Some(synced == total),
        _ => None,
    }
}

/// Fetches every `interval` and reports each answer to `show`, until
/// `show` or a non-transient fetch error stops it, or, with
/// `until_synced`, until [`synced`] is true (`Ok`) or `timeout` passes
/// ([`Error::NotSynced`]). Without `until_synced` it runs until the process
/// is interrupted.
pub async fn run<F, Fut, S>(options: Options, mut fetch: F, mut show: S) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Value, Error>>,
    S: FnMut(Update<'_>) -> Result<(), Error>,
{
    let work = async {
        loop {
            match fetch().await {
                Ok(value) => {
                    show(Update::Answer(&value))?;
                    if options.until_synced {
                        match synced(&value) {
                            Some(true) => return Ok(()),
                            Some(false) => {}
                            None => {
                                return Err(invalid("--until-synced: this answer has no `synced` field to wait for"));
                            }
                        }
                    }
                }
                Err(error) if error.is_transient() => show(Update::Retrying(&error))?,
                Err(error) => return Err(error),
            }
            tokio::time::sleep(options.interval).await;
        }
    };
    if !options.until_synced {
        return work.await;
    }
    match tokio::time::timeout(options.timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::NotSynced(format!("not synced after {}", human(options.timeout)))),
    }
}

/// Follows the watch stream of `request` and hands each event's printed
/// form to `emit`, until the server ends the stream (an error: the watch
/// did not run "until Ctrl-C") or `emit` fails.
pub async fn follow(
    client: &Client,
    request: &Request,
    mut printer: Printer,
    mut emit: impl FnMut(&str) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut response = client.watch(request).await?;
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(bytes)) => buffer.extend_from_slice(&bytes),
            Ok(None) => return Err(Error::Transport("the server ended the watch stream".into())),
            Err(e) => return Err(client.transport(&e)),
        }
        while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=at).collect();
            let line = String::from_utf8_lossy(&line);
            if line.trim().is_empty() {
                continue;
            }
            let text = printer.event(line.trim())?;
            emit(&text)?;
        }
    }
}

/// Turns watch events into output, one event at a time.
#[derive(Debug)]
pub struct Printer {
    format: Format,
    view: View,
    header_shown: bool,
}

/// Width of the `EVENT` column: `MODIFIED` and three spaces.
const EVENT_WIDTH: usize = 11;

impl Printer {
    pub fn new(format: Format, view: View) -> Printer {
        Printer { format, view, header_shown: false }
    }

    /// The text for one NDJSON event line: a table row (the header before
    /// the first), one JSON line, or one YAML document.
    pub fn event(&mut self, line: &str) -> Result<String, Error> {
        let event: Value = serde_json::from_str(line)
            .map_err(|e| Error::Transport(format!("the watch stream sent something that is not JSON: {e}")))?;
        let kind = escape_controls(event.get("type").and_then(Value::as_str).unwrap_or("?"));
        let object = event.get("object").cloned().unwrap_or(Value::Null);
        match self.format {
            Format::Json => json(&event, false),
            Format::Yaml => Ok(format!("---\n{}", render(&event, self.view, Format::Yaml)?)),
            Format::Table => {
                // The object as a one-row table; its header once.
                let rendered = table(&serde_json::json!({"items": [object]}), self.view);
                let mut lines = rendered.lines();
                let header = lines.next().unwrap_or_default();
                let mut text = String::new();
                if !self.header_shown {
                    text.push_str(&format!("{:<EVENT_WIDTH$}{header}\n", "EVENT"));
                    self.header_shown = true;
                }
                for row in lines {
                    text.push_str(&format!("{kind:<EVENT_WIDTH$}{row}\n"));
                }
                Ok(text)
            }
        }
    }
}

/// `90s` → `1m30s`, `1500ms` → `1.5s`, for messages.
pub(crate) fn human(duration: Duration) -> String {
    let millis = duration.as_millis();
    if !millis.is_multiple_of(1000) {
        return format!("{}s", duration.as_secs_f64());
    }
    let secs = duration.as_secs();
    match (secs / 3600, secs / 60 % 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    fn options(until_synced: bool) -> Options {
        Options { interval: Duration::from_secs(2), until_synced, timeout: Duration::from_secs(60) }
    }

    fn sub(synced: bool) -> Value {
        json!({"api": "a.b", "active": true, "state": "success", "synced": synced})
    }

    #[test]
    fn synced_shapes() {
        assert_eq!(synced(&sub(true)), Some(true));
        assert_eq!(synced(&sub(false)), Some(false));
        assert_eq!(synced(&json!({"subscribers": [], "total": 2, "synced": 2})), Some(true));
        assert_eq!(synced(&json!({"subscribers": [], "total": 2, "synced": 1})), Some(false));
        assert_eq!(synced(&json!({"items": [sub(true), sub(true)], "continue": ""})), Some(true));
        assert_eq!(synced(&json!({"items": [sub(true), sub(false)], "continue": ""})), Some(false));
        assert_eq!(synced(&json!({"items": [], "continue": ""})), Some(true));
        assert_eq!(synced(&json!({"name": "core", "active": true})), None);
        assert_eq!(synced(&json!({"items": [{"name": "x"}]})), None);
        assert_eq!(synced(&json!({"synced": 1})), None);
    }

    /// A scripted fetch: answers in order, the last one forever.
    fn script(answers: Vec<Result<Value, Error>>) -> impl FnMut() -> std::future::Ready<Result<Value, Error>> {
        let answers = RefCell::new(VecDeque::from(answers));
        move || {
            let mut answers = answers.borrow_mut();
            let next = if answers.len() > 1 { answers.pop_front() } else { answers.front().cloned() };
            std::future::ready(next.expect("script is not empty"))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn until_synced_returns_once_synced() {
        let start = tokio::time::Instant::now();
        let mut shown = 0;
        let fetch = script(vec![Ok(sub(false)), Ok(sub(false)), Ok(sub(true))]);
        let result = run(options(true), fetch, |update| {
            assert!(matches!(update, Update::Answer(_)));
            shown += 1;
            Ok(())
        })
        .await;
        assert_eq!(result, Ok(()));
        assert_eq!(shown, 3);
        assert_eq!(start.elapsed(), Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn until_synced_times_out() {
        let start = tokio::time::Instant::now();
        let result = run(options(true), script(vec![Ok(sub(false))]), |_| Ok(())).await;
        assert_eq!(result, Err(Error::NotSynced("not synced after 1m".into())));
        assert_eq!(result.unwrap_err().exit_code(), 3);
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_and_client_errors_stop() {
        let unavailable = Error::Api { status: 503, reason: "Unavailable".into(), message: "restarting".into() };
        let not_found = Error::Api { status: 404, reason: "NotFound".into(), message: "gone".into() };
        let mut retries = 0;
        let fetch = script(vec![Err(unavailable), Err(Error::Transport("refused".into())), Ok(sub(true))]);
        let result = run(options(true), fetch, |update| {
            if let Update::Retrying(_) = update {
                retries += 1;
            }
            Ok(())
        })
        .await;
        assert_eq!((result, retries), (Ok(()), 2));

        let result = run(options(true), script(vec![Ok(sub(false)), Err(not_found.clone())]), |_| Ok(())).await;
        assert_eq!(result, Err(not_found));
    }

    #[tokio::test(start_paused = true)]
    async fn until_synced_needs_a_synced_field() {
        let result = run(options(true), script(vec![Ok(json!({"name": "core"}))]), |_| Ok(())).await;
        assert_eq!(result.unwrap_err().exit_code(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn plain_watch_runs_until_show_stops_it() {
        let mut seen = 0;
        let result = run(options(false), script(vec![Ok(sub(true))]), |_| {
            seen += 1;
            if seen == 5 { Err(invalid("enough")) } else { Ok(()) }
        })
        .await;
        assert_eq!(result, Err(invalid("enough")));
        assert_eq!(seen, 5);
    }

    #[test]
    fn printer_shows_a_row_per_event_with_the_header_once() {
        let mut printer = Printer::new(Format::Table, View::Namespaces);
        let added = printer.event(r#"{"type":"ADDED","object":{"name":"core","active":false,"description":""}}"#);
        let added = added.unwrap();
        let lines: Vec<&str> = added.lines().collect();
        assert_eq!(lines.len(), 2, "{added}");
        assert!(lines[0].starts_with("EVENT      NAME"), "{added}");
        assert!(lines[1].starts_with("ADDED      core"), "{added}");
        let modified = printer.event(r#"{"type":"MODIFIED","object":{"name":"core","active":true}}"#).unwrap();
        assert_eq!(modified.lines().count(), 1);
        assert!(modified.starts_with("MODIFIED   core"), "{modified}");
        let mut json = Printer::new(Format::Json, View::Generic);
        let line = json.event(r#"{"type":"DELETED","object":{"name":"x"}}"#).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&line).unwrap()["type"], "DELETED");
        assert!(json.event("not json").is_err());
    }

    #[test]
    fn printer_escapes_what_the_server_sent_in_every_format() {
        let evil = "\u{1b}]0;pwned\u{7}\u{7f}\u{85}\u{9b}2J";
        let line = json!({"type": format!("ADDED{evil}"), "object": {"name": "x", "description": evil}}).to_string();
        for format in [Format::Table, Format::Json, Format::Yaml] {
            let text = Printer::new(format, View::Namespaces).event(&line).unwrap();
            assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{format:?}: {text:?}");
            assert!(text.contains("pwned"), "{format:?}: {text:?}");
        }
        let text = Printer::new(Format::Json, View::Namespaces).event(&line).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["object"]["description"], evil);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_secs(300)), "5m");
        assert_eq!(human(Duration::from_secs(90)), "1m30s");
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_secs(45)), "45s");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
    }
}
