//! The runner's own log (`tracing` to stderr), with secrets redacted on
//! the way out: SDK error texts, worker log lines and options reach the log
//! from many places (the engine's retry warnings among them), so every
//! line is passed through [`redact_text`] as it is written, whoever wrote
//! it.
//!
//! `--log_kind json` writes the shape of Go's `log/slog` JSON handler
//! ([`SlogJson`]), which is what Prism writes: Beam's Python SDK starts
//! the runner named by `--prism_location` with that flag and turns each
//! such line back into a log record (its level, time and message, and an
//! SDK worker's line under the worker's name), so a user of Python's
//! PrismRunner reads Refract's messages as readable log lines.

use std::io::{self, Write};

use refract_jobservice::redact::redact_text;
use serde_json::{json, Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// The target of an SDK worker's log line relayed into the runner's log
/// (with fields `worker`, `stage` and `transform`); [`SlogJson`] writes
/// such lines the way Prism writes its workers'.
pub use refract_execution::SDK_WORKER_TARGET;

/// Formats each event as one JSON object in `log/slog`'s shape: `time`
/// (RFC 3339 with an offset), `level` (`DEBUG`, `INFO`, `WARN`, `ERROR`;
/// `DEBUG-4` for trace), `msg`, then the event's fields and its spans (not
/// its target: the SDK shows every extra key on each line). A
/// worker's line is `{"msg": "log from SDK worker", "worker": {"ID"},
/// "sdk": {"msg", ...}}`, as Prism writes it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlogJson;

impl<S, N> FormatEvent<S, N> for SlogJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut fields = FieldMap::default();
        event.record(&mut fields);
        let mut fields = fields.0;
        let message = match fields.remove("message") {
            Some(Value::String(text)) => text,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let mut line = Map::new();
        line.insert(
            "time".into(),
            json!(slog_time(std::time::SystemTime::now())),
        );
        line.insert("level".into(), json!(slog_level(*event.metadata().level())));
        if event.metadata().target() == SDK_WORKER_TARGET {
            let worker = fields.remove("worker").unwrap_or(Value::Null);
            fields.insert("msg".into(), json!(message));
            line.insert("msg".into(), json!("log from SDK worker"));
            line.insert("worker".into(), json!({ "ID": worker }));
            line.insert("sdk".into(), Value::Object(fields));
        } else {
            line.insert("msg".into(), json!(message));
            let spans: Vec<String> = ctx
                .event_scope()
                .into_iter()
                .flat_map(|scope| scope.from_root())
                .map(|span| {
                    let extensions = span.extensions();
                    match extensions.get::<FormattedFields<N>>() {
                        Some(f) if !f.is_empty() => format!("{}{{{f}}}", span.name()),
                        _ => span.name().to_string(),
                    }
                })
                .collect();
            if !spans.is_empty() {
                line.insert("span".into(), json!(spans.join(":")));
            }
            for (key, value) in fields {
                line.entry(key).or_insert(value);
            }
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields as JSON values.
#[derive(Default)]
struct FieldMap(Map<String, Value>);

impl Visit for FieldMap {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), json!(format!("{value:?}")));
    }
}

/// `log/slog`'s level names.
fn slog_level(level: Level) -> &'static str {
    match level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "DEBUG-4",
    }
}

/// `t` in RFC 3339 with microseconds and a `+00:00` offset: what
/// Python's `datetime.fromisoformat` reads in every version Beam runs on
/// (a `Z`, or nanoseconds, it reads only from 3.11 on). The date and time
/// of day are prost's RFC 3339 rendering of the whole seconds.
fn slog_time(t: std::time::SystemTime) -> String {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let seconds = prost_types::Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }
    .to_string();
    format!(
        "{}.{:06}+00:00",
        seconds.trim_end_matches('Z'),
        since.subsec_micros()
    )
}

/// Makes a [`RedactedLine`] per log event, writing to stderr.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedactingStderr;

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = RedactedLine<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        RedactedLine::new(io::stderr())
    }
}

/// Collects one event's text and writes it, redacted, when dropped (the
/// formatter writes an event and then drops its writer).
pub struct RedactedLine<W: Write> {
    buffer: Vec<u8>,
    out: W,
}

impl<W: Write> RedactedLine<W> {
    /// A line for `out`.
    pub fn new(out: W) -> Self {
        RedactedLine {
            buffer: Vec::with_capacity(256),
            out,
        }
    }

    fn emit(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.buffer);
        let redacted = redact_text(&text);
        let written = self.out.write_all(redacted.as_bytes());
        self.buffer.clear();
        written
    }
}

impl<W: Write> Write for RedactedLine<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.emit()?;
        self.out.flush()
    }
}

impl<W: Write> Drop for RedactedLine<W> {
    fn drop(&mut self) {
        // Nowhere to report a failed write of the log itself.
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slog_times_are_rfc3339_with_an_offset() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(1_796_420_562_843_428);
        assert_eq!(slog_time(at), "2026-12-04T21:42:42.843428+00:00");
        assert_eq!(
            slog_time(std::time::UNIX_EPOCH),
            "1970-01-01T00:00:00.000000+00:00"
        );
        // A leap day.
        let leap = std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400);
        assert_eq!(slog_time(leap), "2000-02-29T00:00:00.000000+00:00");
    }

    /// Events through [`SlogJson`], as the lines it writes.
    fn slog_lines(emit: impl FnOnce()) -> Vec<Value> {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);
        impl Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                self.0.lock().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let out = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .event_format(SlogJson)
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(lines.0.lock().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn runner_and_worker_lines_take_prisms_shape() {
        let lines = slog_lines(|| {
            let span = tracing::info_span!("job", id = "job-1");
            let _in = span.enter();
            tracing::warn!(port = 8073u64, "refract is serving");
            tracing::info!(
                target: SDK_WORKER_TARGET,
                worker = "w0",
                transform = "Parse",
                "tick 1"
            );
        });
        assert_eq!(lines.len(), 2);
        let runner = &lines[0];
        assert_eq!(runner["level"], "WARN");
        assert_eq!(runner["msg"], "refract is serving");
        assert_eq!(runner["port"], 8073);
        assert_eq!(runner["span"], "job{id=\"job-1\"}");
        assert!(runner["time"].as_str().unwrap().ends_with("+00:00"));
        let worker = &lines[1];
        assert_eq!(worker["msg"], "log from SDK worker");
        assert_eq!(worker["worker"]["ID"], "w0");
        assert_eq!(worker["sdk"]["msg"], "tick 1");
        assert_eq!(worker["sdk"]["transform"], "Parse");
    }

    #[test]
    fn a_line_is_written_redacted_when_dropped() {
        let mut out = Vec::new();
        {
            let mut line = RedactedLine::new(&mut out);
            line.write_all(b"WARN bundle failed: connect(password=")
                .unwrap();
            line.write_all(b"hunter2) refused\n").unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "WARN bundle failed: connect(password=***) refused\n"
        );
    }
}
