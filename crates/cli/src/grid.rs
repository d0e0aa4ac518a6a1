//! The text grid every table is drawn on: one cell's text from a JSON
//! value (`<none>` when empty, control characters escaped, always one
//! line), and the columns laid out kubectl's way — separated by three
//! spaces, padded to the widest cell, the last column never padded.

use serde_json::Value;

use crate::escape::escape_controls;

/// The shown empty value: an empty string or missing field.
const NONE: &str = "<none>";

/// One cell's text, on one line.
pub(crate) fn cell(value: Option<&Value>) -> String {
    let text = match value {
        None | Some(Value::Null) => return NONE.to_string(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(items)) if items.iter().all(|i| !i.is_array() && !i.is_object()) => {
            items.iter().map(|item| cell(Some(item))).collect::<Vec<_>>().join(",")
        }
        Some(other @ (Value::Array(_) | Value::Object(_))) => other.to_string(),
        Some(other) => other.to_string(),
    };
    if text.is_empty() {
        return NONE.to_string();
    }
    // A newline inside a cell would break the table's shape, an escape
    // sequence the terminal.
    escape_controls(&text)
}

/// Headers and rows as aligned lines, one per row.
pub(crate) fn layout(headers: Vec<String>, rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in std::iter::once(&headers).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = width - cell.chars().count();
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 3));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}
