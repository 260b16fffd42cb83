//! Timers as they cross the data plane (`beam:coder:timer:v1`).
//!
//! The SDK sends the timers a bundle sets or clears on the timer family's
//! data stream, and the runner sends them back when they fire. In order:
//! the user key (nested, in the key coder), the dynamic timer tag (a nested
//! UTF-8 string, empty for plain timers), the windows (iterable framing), a
//! clear flag, and — only when the timer is set, not cleared — the fire
//! timestamp, the hold (output) timestamp and a pane.
//!
//! The key stays as the bytes the SDK wrote: the runner matches it against
//! element keys and state keys byte for byte, which is only sound because
//! translation gives timers, elements and state the same (length-prefixed)
//! key coder.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::primitive::{encode_timestamp, encode_varint_u64};
use super::reader::Reader;
use super::windowed_value::{encode_windows, read_windows};
use super::{Coder, CoderError, PaneInfo};
use crate::time::{Timestamp, MAX_TIMESTAMP};

/// A decoded timer (beam:coder:timer:v1). user_key holds the key's nested
/// bytes as-is. The engine keeps timers in this form: it needs the
/// timestamps to schedule them and the rest only to send them back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerValue {
    /// The user key, nested-encoded in the timer's key coder.
    pub user_key: Bytes,
    /// The dynamic timer tag (`""` for a timer that is not in a map).
    pub dynamic_tag: String,
    /// The windows the timer is set in.
    pub windows: super::Windows,
    /// Whether this clears the timer instead of setting it. A cleared timer
    /// carries no timestamps or pane on the wire: they decode as
    /// [`MAX_TIMESTAMP`] and [`PaneInfo::NO_FIRING`] and are not written.
    pub clear: bool,
    /// When the timer fires (event or processing time, per its family).
    pub fire_timestamp: Timestamp,
    /// The output timestamp: the watermark hold the timer keeps while set.
    pub hold_timestamp: Timestamp,
    /// The pane of the element that set the timer.
    pub pane: PaneInfo,
}

impl TimerValue {
    /// Appends this timer, nested, as the SDK expects to receive it when it
    /// fires. `user_key` is written as-is. On error nothing is written.
    pub fn encode(&self, window_coder: &Coder, out: &mut Vec<u8>) -> Result<(), CoderError> {
        let mark = out.len();
        let written = self.write(window_coder, out);
        if written.is_err() {
            out.truncate(mark);
        }
        written
    }

    fn write(&self, window_coder: &Coder, out: &mut Vec<u8>) -> Result<(), CoderError> {
        out.extend_from_slice(&self.user_key);
        encode_varint_u64(self.dynamic_tag.len() as u64, out);
        out.extend_from_slice(self.dynamic_tag.as_bytes());
        encode_windows(&self.windows, window_coder, out)?;
        out.push(u8::from(self.clear));
        if !self.clear {
            encode_timestamp(self.fire_timestamp, out);
            encode_timestamp(self.hold_timestamp, out);
            self.pane.encode(out);
        }
        Ok(())
    }
}

/// Splits a timer stream's payload (concatenated nested timers) into
/// timers; user keys are zero-copy slices of `buf`. Errors if the payload
/// does not end exactly at a timer boundary.
pub fn decode_timers(
    buf: &Bytes,
    key_coder: &Coder,
    window_coder: &Coder,
) -> Result<Vec<TimerValue>, CoderError> {
    let mut r = Reader::shared(buf);
    let mut timers = Vec::new();
    while !r.is_empty() {
        timers.push(read_timer(&mut r, key_coder, window_coder)?);
    }
    Ok(timers)
}

/// Reads one timer; shared with walking.
pub(super) fn read_timer(
    r: &mut Reader<'_>,
    key_coder: &Coder,
    window_coder: &Coder,
) -> Result<TimerValue, CoderError> {
    let key_start = r.pos();
    key_coder.skip(r)?;
    let user_key = r.bytes_since(key_start)?;
    let tag_len = r.length("timer tag")?;
    let dynamic_tag = std::str::from_utf8(r.take(tag_len, "timer tag")?)
        .map_err(|e| CoderError::Invalid {
            what: "timer tag",
            detail: e.to_string(),
        })?
        .to_owned();
    let windows = read_windows(r, window_coder, "timer windows")?;
    let clear = match r.byte("timer clear flag")? {
        0 => false,
        1 => true,
        other => {
            return Err(CoderError::Invalid {
                what: "timer clear flag",
                detail: format!("expected 0 or 1, got {other}"),
            })
        }
    };
    let (fire_timestamp, hold_timestamp, pane) = if clear {
        (MAX_TIMESTAMP, MAX_TIMESTAMP, PaneInfo::NO_FIRING)
    } else {
        (
            r.timestamp("timer fire timestamp")?,
            r.timestamp("timer hold timestamp")?,
            PaneInfo::read(r)?,
        )
    };
    Ok(TimerValue {
        user_key,
        dynamic_tag,
        windows,
        clear,
        fire_timestamp,
        hold_timestamp,
        pane,
    })
}

#[cfg(test)]
// Tests index what they built: out of bounds is a failed test.
#[allow(clippy::indexing_slicing)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::coder::tests::{arb_timer_with, arb_window_coder, hex};
    use crate::window::Window;

    fn utf8_key() -> Bytes {
        Bytes::from_static(&[0x01, 0x6b])
    }

    #[test]
    fn examples_from_the_notes() -> Result<(), CoderError> {
        let set = TimerValue {
            user_key: utf8_key(),
            dynamic_tag: String::new(),
            windows: smallvec::smallvec![Window::Global],
            clear: false,
            fire_timestamp: 10_000,
            hold_timestamp: 10_000,
            pane: PaneInfo::NO_FIRING,
        };
        let set_bytes = hex("016b 00 00000001 00 8000000000002710 8000000000002710 0f");
        let clear = TimerValue {
            clear: true,
            fire_timestamp: MAX_TIMESTAMP,
            hold_timestamp: MAX_TIMESTAMP,
            ..set.clone()
        };
        let clear_bytes = hex("016b 00 00000001 01");
        let mut out = Vec::new();
        set.encode(&Coder::GlobalWindow, &mut out)?;
        assert_eq!(out, set_bytes);
        out.clear();
        clear.encode(&Coder::GlobalWindow, &mut out)?;
        assert_eq!(out, clear_bytes);
        let stream = Bytes::from([set_bytes, clear_bytes].concat());
        assert_eq!(
            decode_timers(&stream, &Coder::StringUtf8, &Coder::GlobalWindow)?,
            vec![set, clear]
        );
        Ok(())
    }

    #[test]
    fn invalid_timers_are_errors() {
        let bad_flag = Bytes::from(hex("016b 00 00000001 02"));
        assert!(decode_timers(&bad_flag, &Coder::StringUtf8, &Coder::GlobalWindow).is_err());
        let bad_tag = Bytes::from(hex("016b 01ff 00000001 01"));
        assert!(decode_timers(&bad_tag, &Coder::StringUtf8, &Coder::GlobalWindow).is_err());
        let mismatched = TimerValue {
            user_key: utf8_key(),
            dynamic_tag: String::new(),
            windows: smallvec::smallvec![Window::Global],
            clear: true,
            fire_timestamp: 0,
            hold_timestamp: 0,
            pane: PaneInfo::NO_FIRING,
        };
        let mut out = Vec::new();
        assert!(mismatched.encode(&Coder::IntervalWindow, &mut out).is_err());
        assert!(out.is_empty());
    }

    proptest! {
        #[test]
        fn timer_streams_round_trip(
            (window_coder, timers) in arb_window_coder().prop_flat_map(|c| {
                (Just(c.clone()), proptest::collection::vec(arb_timer_with(c), 0..4))
            }),
        ) {
            let mut buf = Vec::new();
            for timer in &timers {
                timer.encode(&window_coder, &mut buf).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            let buf = Bytes::from(buf);
            prop_assert_eq!(decode_timers(&buf, &Coder::LengthPrefix, &window_coder), Ok(timers.clone()));
            let coder = Coder::Timer {
                key: Box::new(Coder::LengthPrefix),
                window: Box::new(window_coder.clone()),
            };
            let mut walked = 0;
            while walked < buf.len() {
                walked += coder.nested_len(&buf[walked..]).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            prop_assert_eq!(walked, buf.len());
            if !buf.is_empty() {
                prop_assert!(decode_timers(&buf.slice(..buf.len() - 1), &Coder::LengthPrefix, &window_coder).is_err());
            }
        }
    }
}
