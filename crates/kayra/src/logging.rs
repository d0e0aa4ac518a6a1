//! Tracing initialisation for every `kayra` process (platform contract §8).
//!
//! - `text`: one line per event, `key=value` fields, span fields in front.
//! - `json`: one JSON object per line with top-level `timestamp`, `level`,
//!   `message`, and every field of the event *and of its enclosing spans*
//!   as a top-level key. Flattening span fields matters: the reconciler
//!   opens one span per reconcile carrying `namespace`, `api`, `lock_id`
//!   and `sync_id`, and every line inside must show them.
//!
//! In both formats a field value never breaks a line (§8): JSON escapes
//! control characters itself; in `text` every value, the message included,
//! goes through [`text_fields`], which escapes them (`\n`, `\u{1b}`), so
//! a `sync_id` or a path with a newline cannot forge a log line.
//!
//! The filter comes from `KAYRA_LOG` (EnvFilter syntax), default `info`.

use std::fmt;

use kayra_config::LogFormat;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("KAYRA_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.with_ansi(false).fmt_fields(text_fields()).try_init(),
        LogFormat::Json => builder.fmt_fields(JsonFields::new()).event_format(FlatJson).try_init(),
    };
    if let Err(e) = result {
        eprintln!("kayra: logging already initialised: {e}");
    }
}

/// `text` fields: `name=value` separated by spaces (the message bare), each
/// value with its control characters escaped.
pub fn text_fields() -> impl for<'w> FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|writer: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug| {
        let value = kayra_core::validation::escape_controls(&format!("{value:?}"));
        if field.name() == "message" { write!(writer, "{value}") } else { write!(writer, "{}={value}", field.name()) }
    })
    .delimited(" ")
}

/// One flat JSON object per event.
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut map = Map::new();
        map.insert(
            "timestamp".into(),
            humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string().into(),
        );
        map.insert("level".into(), event.metadata().level().as_str().to_ascii_lowercase().into());
        map.insert("target".into(), event.metadata().target().into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(fields)
                {
                    map.extend(obj);
                }
            }
        }
        event.record(&mut JsonVisitor(&mut map));
        map.entry("message").or_insert_with(|| Value::String(String::new()));
        writeln!(writer, "{}", Value::Object(map))
    }
}

struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn text_values_never_break_a_line() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(text_fields())
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let forged = "x\nINFO kayra: forged line\u{1b}[2J";
            let span = tracing::info_span!("reconcile", sync_id = forged);
            let _entered = span.enter();
            let error = std::io::Error::other("bad\r\nthing");
            tracing::info!(sync_id = forged, error = %error, debug = ?forged, "message with {forged}");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "one event, one line: {text:?}");
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(!text.contains('\r'), "{text:?}");
        assert!(text.contains("sync_id="), "{text:?}");
        assert!(text.contains("\\n"), "the newline is shown escaped: {text:?}");
    }
}
