//! Pane info: which firing of a window's trigger produced an element.
//!
//! The first byte packs the pane's flags in its low nibble — bit 0 is_first,
//! bit 1 is_last, bits 2–3 the timing (early, on time, late, unknown) — and an
//! *encoding type* in its high nibble that says how many indices follow:
//!
//! * type 0: none. The indices are implied: a first pane has index 0 and any
//!   other -1 (the SDKs' lookup table, mirrored here so the runner sees what
//!   the Python SDK would), and the non-speculative index is -1 for early
//!   panes and 0 otherwise.
//! * type 1: one varint index; the non-speculative index is -1 for early panes
//!   and equal to the index otherwise.
//! * type 2: two varints, index then non-speculative index.
//!
//! The encoder makes the Python SDK's choice of type, so panes the runner
//! writes are byte-identical to the SDK's: type 0 when both indices are 0 or
//! the timing is unknown (an unknown pane carries no indices), type 1 when the
//! indices are equal or the pane is early, type 2 otherwise. Any other type is
//! an error, as it is in every SDK.

use super::primitive::encode_varint_i64;
use super::reader::Reader;
use super::{CoderError, PaneInfo, PaneTiming};

const WHAT: &str = "pane info";

const FIRST: u8 = 0x01;
const LAST: u8 = 0x02;
const TIMING_SHIFT: u8 = 2;
const TYPE_SHIFT: u8 = 4;

const TYPE_NO_INDEX: u8 = 0;
const TYPE_ONE_INDEX: u8 = 1;
const TYPE_TWO_INDICES: u8 = 2;

impl PaneTiming {
    fn bits(self) -> u8 {
        match self {
            PaneTiming::Early => 0,
            PaneTiming::OnTime => 1,
            PaneTiming::Late => 2,
            PaneTiming::Unknown => 3,
        }
    }

    fn from_bits(bits: u8) -> PaneTiming {
        match bits & 0x03 {
            0 => PaneTiming::Early,
            1 => PaneTiming::OnTime,
            2 => PaneTiming::Late,
            _ => PaneTiming::Unknown,
        }
    }
}

impl PaneInfo {
    /// Appends this pane as it appears in windowed values and timers, using
    /// the same (smallest) encoding type the Python SDK picks.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut flags = self.timing.bits() << TIMING_SHIFT;
        if self.is_first {
            flags |= FIRST;
        }
        if self.is_last {
            flags |= LAST;
        }
        let encoding = if (self.index == 0 && self.nonspeculative_index == 0)
            || self.timing == PaneTiming::Unknown
        {
            TYPE_NO_INDEX
        } else if self.index == self.nonspeculative_index || self.timing == PaneTiming::Early {
            TYPE_ONE_INDEX
        } else {
            TYPE_TWO_INDICES
        };
        out.push(flags | (encoding << TYPE_SHIFT));
        if encoding != TYPE_NO_INDEX {
            encode_varint_i64(self.index, out);
        }
        if encoding == TYPE_TWO_INDICES {
            encode_varint_i64(self.nonspeculative_index, out);
        }
    }

    /// Reads a pane at the start of `buf`, returning it and the number of
    /// bytes it took. Unknown encoding types are an error.
    pub fn decode(buf: &[u8]) -> Result<(PaneInfo, usize), CoderError> {
        let mut r = Reader::new(buf);
        let pane = PaneInfo::read(&mut r)?;
        Ok((pane, r.pos()))
    }

    /// Reads a pane from a reader; shared by windowed values and timers.
    pub(super) fn read(r: &mut Reader<'_>) -> Result<PaneInfo, CoderError> {
        let first_byte = r.byte(WHAT)?;
        let is_first = first_byte & FIRST != 0;
        let is_last = first_byte & LAST != 0;
        let timing = PaneTiming::from_bits(first_byte >> TIMING_SHIFT);
        let early = timing == PaneTiming::Early;
        let (index, nonspeculative_index) = match first_byte >> TYPE_SHIFT {
            TYPE_NO_INDEX => (if is_first { 0 } else { -1 }, if early { -1 } else { 0 }),
            TYPE_ONE_INDEX => {
                let index = r.varint_i64(WHAT)?;
                (index, if early { -1 } else { index })
            }
            TYPE_TWO_INDICES => (r.varint_i64(WHAT)?, r.varint_i64(WHAT)?),
            other => {
                return Err(CoderError::Invalid {
                    what: WHAT,
                    detail: format!("unknown encoding type {other} in byte {first_byte:#04x}"),
                })
            }
        };
        Ok(PaneInfo {
            is_first,
            is_last,
            timing,
            index,
            nonspeculative_index,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::coder::tests::arb_pane;

    fn pane(
        is_first: bool,
        is_last: bool,
        timing: PaneTiming,
        index: i64,
        nonspeculative_index: i64,
    ) -> PaneInfo {
        PaneInfo {
            is_first,
            is_last,
            timing,
            index,
            nonspeculative_index,
        }
    }

    fn encoded(p: &PaneInfo) -> Vec<u8> {
        let mut out = Vec::new();
        p.encode(&mut out);
        out
    }

    #[test]
    fn examples_from_the_notes() {
        assert_eq!(encoded(&PaneInfo::NO_FIRING), [0x0f]);
        assert_eq!(encoded(&pane(true, true, PaneTiming::OnTime, 0, 0)), [0x07]);
        assert_eq!(
            encoded(&pane(true, false, PaneTiming::Early, 1, -1)),
            [0x11, 0x01]
        );
        assert_eq!(
            encoded(&pane(false, false, PaneTiming::Late, 3, 2)),
            [0x28, 0x03, 0x02]
        );
        assert_eq!(
            PaneInfo::decode(&[0x11, 0x01]),
            Ok((pane(true, false, PaneTiming::Early, 1, -1), 2))
        );
        assert_eq!(
            PaneInfo::decode(&[0x28, 0x03, 0x02, 0xff]),
            Ok((pane(false, false, PaneTiming::Late, 3, 2), 3))
        );
    }

    #[test]
    fn type_zero_mirrors_python_table() {
        // Python: PaneInfoCoder().decode(bytes([b])) for each low nibble.
        assert_eq!(
            PaneInfo::decode(&[0x00]),
            Ok((pane(false, false, PaneTiming::Early, -1, -1), 1))
        );
        assert_eq!(
            PaneInfo::decode(&[0x03]),
            Ok((pane(true, true, PaneTiming::Early, 0, -1), 1))
        );
        assert_eq!(
            PaneInfo::decode(&[0x0a]),
            Ok((pane(false, true, PaneTiming::Late, -1, 0), 1))
        );
        assert_eq!(PaneInfo::decode(&[0x0f]), Ok((PaneInfo::NO_FIRING, 1)));
    }

    #[test]
    fn invalid_and_truncated_panes_are_errors() {
        for b in 0x30..=0xffu8 {
            assert!(matches!(
                PaneInfo::decode(&[b, 0, 0]),
                Err(CoderError::Invalid { .. })
            ));
        }
        assert_eq!(PaneInfo::decode(&[]), Err(CoderError::Truncated(WHAT)));
        assert_eq!(PaneInfo::decode(&[0x18]), Err(CoderError::Truncated(WHAT)));
        assert_eq!(
            PaneInfo::decode(&[0x28, 0x03]),
            Err(CoderError::Truncated(WHAT))
        );
    }

    proptest! {
        #[test]
        fn representable_panes_round_trip(p in arb_pane()) {
            let bytes = encoded(&p);
            prop_assert_eq!(PaneInfo::decode(&bytes), Ok((p, bytes.len())));
        }

        #[test]
        fn decoding_garbage_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..24)) {
            if let Ok((_, n)) = PaneInfo::decode(&buf) {
                prop_assert!(n >= 1 && n <= buf.len());
            }
        }
    }
}
