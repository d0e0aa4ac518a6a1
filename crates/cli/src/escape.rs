//! The one escaping of everything `kayra-cli` prints (platform §17,
//! "Terminal output"): C0, DEL and C1 control characters from the server
//! never reach the terminal raw, in any format, `--watch` included. A leaf
//! every printer stands on.

use std::fmt::Write as _;

/// How [`escape`] writes a control character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escaped {
    /// Rust's form, `\u{1b}`, `\n`, `\t`: for text shown as it is (table
    /// cells, messages, raw bodies).
    Text,
    /// `\u001b`: a JSON string escape (a YAML double-quoted one too) that
    /// decodes to the character itself.
    Json,
}

/// The one escaping of every output format (platform §17, "Terminal
/// output"): each C0, DEL and C1 control character of `text` that is not in
/// `keep` (a format's own line breaks) is written as `form` says; all else
/// is kept.
pub fn escape(text: &str, keep: &[char], form: Escaped) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if !c.is_control() || keep.contains(&c) {
            out.push(c);
            continue;
        }
        match form {
            Escaped::Text => out.extend(c.escape_default()),
            Escaped::Json => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
        }
    }
    out
}

/// Anything the server sent that goes to a terminal as one line —
/// messages, table cells — with its control characters escaped.
pub fn escape_controls(text: &str) -> String {
    escape(text, &[], Escaped::Text)
}

/// A raw body (a backend's non-JSON answer) made safe for a terminal: line
/// breaks and tabs stay, every other control character is escaped, and
/// bytes that are not UTF-8 are replaced.
pub fn escape_raw(bytes: &[u8]) -> Vec<u8> {
    escape(&String::from_utf8_lossy(bytes), &['\n', '\t'], Escaped::Text).into_bytes()
}
