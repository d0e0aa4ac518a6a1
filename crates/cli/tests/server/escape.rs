//! Terminal output (platform §17): a description holding control
//! characters, printed by `get` and `get --watch` in every format, never
//! reaches the terminal raw, and `-o json` still decodes to it.

use std::time::Duration;

use crate::common::server::Kayra;

/// ESC (a CSI and an OSC retitling the window), BEL, DEL, and C1: 8-bit
/// CSI, NEL, the last C1.
const HOSTILE: &str = "a\u{1b}[2J\u{1b}]0;pwned\u{7}b\u{7f}c\u{9b}31m\u{85}\u{80}\u{9f}d";
/// The same as a JSON string, so the argument itself is plain text.
const HOSTILE_JSON: &str = r#""a\u001b[2J\u001b]0;pwned\u0007b\u007fc\u009b31m\u0085\u0080\u009fd""#;

/// The first control character in `text` that is not a line break.
fn raw_control(text: &str) -> Option<char> {
    text.chars().find(|&c| c.is_control() && c != '\n')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_are_escaped_in_every_format_watch_included() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    let data = format!(r#"{{"name": "hostile", "description": {HOSTILE_JSON}}}"#);
    cli.run(&["create", "catalog", "namespaces", "-d", &data]).await.ok();

    for format in ["table", "json", "yaml"] {
        for args in [&["get", "catalog", "namespaces", "hostile"][..], &["get", "catalog", "namespaces"]] {
            let run = cli.run(&[args, &["-o", format]].concat()).await.ok();
            assert_eq!(raw_control(&run.stdout), None, "{format} {args:?}: {run:#?}");
            assert!(run.stdout.contains("pwned"), "{format} {args:?}: {run:#?}");
        }
    }
    let one = cli.run(&["get", "catalog", "namespaces", "hostile", "-o", "json"]).await.ok();
    assert_eq!(one.json()["description"], HOSTILE, "{one:#?}");
    let list = cli.run(&["get", "catalog", "namespaces", "-o", "json"]).await.ok();
    let items = list.json()["items"].as_array().cloned().unwrap_or_default();
    assert!(items.iter().any(|ns| ns["description"] == HOSTILE), "{list:#?}");

    // --watch: each format's first event, read line by line until the
    // description has been printed.
    let patience = Duration::from_secs(15);
    for format in ["table", "json", "yaml"] {
        let mut watch = cli.spawn(&["get", "catalog", "namespaces", "hostile", "--watch", "-o", format]);
        let mut lines = Vec::new();
        while !lines.iter().any(|line: &String| line.contains("pwned")) {
            let line = watch.next_line(patience).await;
            assert_eq!(raw_control(&line), None, "{format}: {line:?} after {lines:?}");
            lines.push(line);
        }
        if format == "json" {
            let event: serde_json::Value = serde_json::from_str(&lines[0]).expect("one JSON event per line");
            assert_eq!(event["type"], "ADDED", "{lines:?}");
            assert_eq!(event["object"]["description"], HOSTILE, "{lines:?}");
        }
        watch.interrupt().await;
    }
}
