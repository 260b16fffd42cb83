//! Reading and writing the windows in element headers and timers.
//!
//! Three window coders can reach the runner:
//!
//! * `global_window`: zero bytes — there is only one global window.
//! * `interval_window`: the *end* as an 8-byte shifted timestamp, then
//!   `varint(end - start)`. End first, so that encoded windows sort by end.
//! * `custom_window`: for windows only the SDK understands. Translation wraps
//!   the SDK's window coder as `custom_window(length_prefix(W))`, so the
//!   bytes are the window's max timestamp (8 bytes, shifted) and then the
//!   window in a varint-length-prefixed envelope. The runner needs nothing
//!   more: it groups by the bytes and fires once the watermark passes the
//!   max timestamp. [`Window::Custom`] keeps the envelope *with* its length
//!   prefix, so re-encoding is just the timestamp plus those bytes.

use super::primitive::{decode_varint_u64, encode_timestamp, encode_varint_i64};
use super::reader::Reader;
use super::{Coder, CoderError};
use crate::window::Window;

impl Coder {
    /// For a window coder (GlobalWindow, IntervalWindow, CustomWindow):
    /// decode one nested window at the start of `buf`, returning it and the
    /// number of bytes it took. Used wherever windows travel on their own:
    /// state keys, side-input requests, timers.
    pub fn decode_window(&self, buf: &[u8]) -> Result<(Window, usize), CoderError> {
        let mut r = Reader::new(buf);
        let window = self.read_window(&mut r)?;
        Ok((window, r.pos()))
    }

    /// Appends `w` in this window coder's format. An error if this is not a
    /// window coder or `w` is not the kind of window it encodes; on error
    /// nothing is written.
    pub fn encode_window(&self, w: &Window, out: &mut Vec<u8>) -> Result<(), CoderError> {
        match (self, w) {
            (Coder::GlobalWindow, Window::Global) => Ok(()),
            (Coder::IntervalWindow, Window::Interval { start, end }) => {
                let span = end.checked_sub(*start).ok_or_else(|| CoderError::Invalid {
                    what: "interval window",
                    detail: format!("span of [{start}, {end}) overflows 64 bits"),
                })?;
                encode_timestamp(*end, out);
                encode_varint_i64(span, out);
                Ok(())
            }
            (Coder::CustomWindow, Window::Custom(custom)) => {
                check_length_prefixed(&custom.encoded)?;
                encode_timestamp(custom.max_timestamp, out);
                out.extend_from_slice(&custom.encoded);
                Ok(())
            }
            (Coder::GlobalWindow | Coder::IntervalWindow | Coder::CustomWindow, _) => {
                Err(CoderError::Invalid {
                    what: "window",
                    detail: format!("{self:?} cannot encode {w:?}"),
                })
            }
            (other, _) => Err(not_a_window_coder(other)),
        }
    }

    /// Reads one window; zero-copy for custom windows when `r` reads shared
    /// bytes.
    pub(super) fn read_window(&self, r: &mut Reader<'_>) -> Result<Window, CoderError> {
        match self {
            Coder::GlobalWindow => Ok(Window::Global),
            Coder::IntervalWindow => {
                let end = r.timestamp("interval window end")?;
                let span = r.varint_i64("interval window span")?;
                let start = end.checked_sub(span).ok_or_else(|| CoderError::Invalid {
                    what: "interval window",
                    detail: format!("start of a window ending at {end} with span {span} overflows"),
                })?;
                Ok(Window::Interval { start, end })
            }
            Coder::CustomWindow => {
                let max_timestamp = r.timestamp("custom window max timestamp")?;
                let start = r.pos();
                let len = r.length("custom window")?;
                r.skip(len, "custom window")?;
                Ok(Window::custom(max_timestamp, r.bytes_since(start)?))
            }
            other => Err(not_a_window_coder(other)),
        }
    }

    /// Moves past one window, accepting exactly what [`Coder::read_window`]
    /// accepts but without building it.
    pub(super) fn skip_window(&self, r: &mut Reader<'_>) -> Result<(), CoderError> {
        match self {
            Coder::CustomWindow => {
                r.skip(8, "custom window max timestamp")?;
                let len = r.length("custom window")?;
                r.skip(len, "custom window")
            }
            _ => self.read_window(r).map(drop),
        }
    }
}

/// The error for asking a non-window coder about windows: a translation bug.
fn not_a_window_coder(coder: &Coder) -> CoderError {
    CoderError::Invalid {
        what: "window coder",
        detail: format!("{coder:?} is not a window coder"),
    }
}

/// Custom window bytes must be exactly one varint-length-prefixed envelope,
/// or the runner would write bytes that the SDK (and the runner) cannot walk.
fn check_length_prefixed(encoded: &[u8]) -> Result<(), CoderError> {
    let (len, prefix) = decode_varint_u64(encoded)?;
    let whole = usize::try_from(len)
        .ok()
        .and_then(|len| len.checked_add(prefix));
    if whole == Some(encoded.len()) {
        Ok(())
    } else {
        Err(CoderError::Invalid {
            what: "custom window",
            detail: format!(
                "{} bytes are not one length-prefixed window (prefix says {len})",
                encoded.len()
            ),
        })
    }
}

#[cfg(test)]
// Tests index what they built: out of bounds is a failed test.
#[allow(clippy::indexing_slicing)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::coder::tests::arb_window;

    fn encoded(coder: &Coder, w: &Window) -> Result<Vec<u8>, CoderError> {
        let mut out = Vec::new();
        coder.encode_window(w, &mut out).map(|()| out)
    }

    #[test]
    fn interval_example_from_the_notes() {
        let w = Window::Interval {
            start: 0,
            end: 10_000,
        };
        let bytes = [0x80, 0, 0, 0, 0, 0, 0x27, 0x10, 0x90, 0x4e];
        assert_eq!(encoded(&Coder::IntervalWindow, &w), Ok(bytes.to_vec()));
        assert_eq!(Coder::IntervalWindow.decode_window(&bytes), Ok((w, 10)));
    }

    #[test]
    fn mismatches_are_errors_and_write_nothing() {
        let mut out = Vec::new();
        let interval = Window::Interval { start: 0, end: 1 };
        assert!(Coder::GlobalWindow
            .encode_window(&interval, &mut out)
            .is_err());
        assert!(Coder::IntervalWindow
            .encode_window(&Window::Global, &mut out)
            .is_err());
        assert!(Coder::Bytes
            .encode_window(&Window::Global, &mut out)
            .is_err());
        let overflowing = Window::Interval {
            start: i64::MIN,
            end: i64::MAX,
        };
        assert!(Coder::IntervalWindow
            .encode_window(&overflowing, &mut out)
            .is_err());
        let bad_custom = Window::custom(0, Bytes::from_static(&[3, 1, 2]));
        assert!(Coder::CustomWindow
            .encode_window(&bad_custom, &mut out)
            .is_err());
        assert!(out.is_empty());
        assert!(Coder::Varint.decode_window(&[0]).is_err());
    }

    #[test]
    fn decoded_interval_start_must_not_overflow() {
        // End at the minimum timestamp with a span of 1.
        let bytes = [0, 0, 0, 0, 0, 0, 0, 0, 0x01];
        assert!(matches!(
            Coder::IntervalWindow.decode_window(&bytes),
            Err(CoderError::Invalid { .. })
        ));
    }

    proptest! {
        #[test]
        fn windows_round_trip((coder, w) in arb_window(), tail in proptest::collection::vec(any::<u8>(), 0..3)) {
            let mut bytes = encoded(&coder, &w).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let len = bytes.len();
            bytes.extend_from_slice(&tail);
            prop_assert_eq!(coder.decode_window(&bytes), Ok((w, len)));
            prop_assert_eq!(coder.nested_len(&bytes), Ok(len));
            for cut in 0..len {
                prop_assert!(coder.decode_window(&bytes[..cut]).is_err());
            }
        }
    }
}
