//! The runner's own log (`tracing` to stderr), with secrets redacted on
//! the way out: SDK error texts, worker log lines and options reach the log
//! from many places (the engine's retry warnings among them), so every
//! line is passed through [`redact_text`] as it is written, whoever wrote
//! it.

use std::io::{self, Write};

use refract_jobservice::redact::redact_text;
use tracing_subscriber::fmt::MakeWriter;

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
