//! Log lines captured for a whole test binary: one global subscriber (the
//! reconciler's tasks log from every worker thread), installed once, in
//! plain text or in JSON.

use std::sync::{Mutex, OnceLock};

static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        LOGS.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How captured lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `key=value` fields, no colours.
    Text,
    /// One JSON object a line, the event's fields flattened.
    Json,
}

/// Installs the capturing subscriber, once per test binary; the first
/// call's format holds for the binary.
pub fn capture(format: Format) {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        LOGS.get_or_init(Mutex::default);
        let _ = match format {
            Format::Text => tracing_subscriber::fmt().with_ansi(false).with_writer(|| Capture).try_init(),
            Format::Json => tracing_subscriber::fmt().json().flatten_event(true).with_writer(|| Capture).try_init(),
        };
    });
}

/// Everything logged so far.
pub fn captured() -> String {
    let buf = LOGS.get().expect("logging installed").lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(&buf).into_owned()
}
