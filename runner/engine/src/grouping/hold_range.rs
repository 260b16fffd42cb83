//! The earliest and latest output-time hold of a pane's unfired elements.
//!
//! A GroupByKey over distinct keys keeps one pane per element, so every
//! byte of a pane counts: two optional timestamps take 32 bytes, while the
//! range they describe fits in 16 — empty is a range whose start is after
//! its end, which no pair of real timestamps makes. It is written to
//! checkpoints as the two optional timestamps it stands for, so the
//! checkpoint format does not depend on this layout.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// The earliest and latest of a set of timestamps, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(Option<Timestamp>, Option<Timestamp>)")]
#[serde(into = "(Option<Timestamp>, Option<Timestamp>)")]
pub(crate) struct HoldRange {
    min: Timestamp,
    max: Timestamp,
}

impl HoldRange {
    /// No holds.
    pub(crate) const EMPTY: HoldRange = HoldRange {
        min: Timestamp::MAX,
        max: Timestamp::MIN,
    };

    /// Takes `hold` into the range.
    pub(crate) fn add(&mut self, hold: Timestamp) {
        self.min = self.min.min(hold);
        self.max = self.max.max(hold);
    }

    /// Takes every hold of `other` into the range.
    pub(crate) fn absorb(&mut self, other: HoldRange) {
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// The earliest hold, if any.
    pub(crate) fn min(&self) -> Option<Timestamp> {
        (self.min <= self.max).then_some(self.min)
    }

    /// The latest hold, if any.
    pub(crate) fn max(&self) -> Option<Timestamp> {
        (self.min <= self.max).then_some(self.max)
    }
}

impl From<(Option<Timestamp>, Option<Timestamp>)> for HoldRange {
    fn from((min, max): (Option<Timestamp>, Option<Timestamp>)) -> Self {
        let mut range = HoldRange::EMPTY;
        for hold in [min, max].into_iter().flatten() {
            range.add(hold);
        }
        range
    }
}

impl From<HoldRange> for (Option<Timestamp>, Option<Timestamp>) {
    fn from(range: HoldRange) -> Self {
        (range.min(), range.max())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{MAX_TIMESTAMP, MIN_TIMESTAMP};

    #[test]
    fn empty_until_a_hold_is_added_and_absorbed_either_way() {
        let mut range = HoldRange::EMPTY;
        assert_eq!((range.min(), range.max()), (None, None));
        range.absorb(HoldRange::EMPTY);
        assert_eq!(range.min(), None);
        // The extremes of Beam's time are holds like any other.
        range.add(MAX_TIMESTAMP);
        range.add(MIN_TIMESTAMP);
        assert_eq!(
            (range.min(), range.max()),
            (Some(MIN_TIMESTAMP), Some(MAX_TIMESTAMP))
        );
        let mut other = HoldRange::EMPTY;
        other.add(5);
        let mut empty = HoldRange::EMPTY;
        empty.absorb(other);
        assert_eq!((empty.min(), empty.max()), (Some(5), Some(5)));
        other.absorb(HoldRange::EMPTY);
        assert_eq!((other.min(), other.max()), (Some(5), Some(5)));
    }

    /// A checkpoint holds a range as the two optional timestamps it
    /// replaced, byte for byte.
    #[test]
    fn checkpoints_see_two_optional_timestamps() {
        let mut range = HoldRange::EMPTY;
        for expected in [(None, None), (Some(-3), Some(-3)), (Some(-3), Some(40))] {
            if let Some(h) = expected.1 {
                range.add(h);
            }
            let as_range = postcard::to_allocvec(&range).expect("encodes");
            let as_options = postcard::to_allocvec(&expected).expect("encodes");
            assert_eq!(as_range, as_options);
            let back: HoldRange = postcard::from_bytes(&as_options).expect("decodes");
            assert_eq!(back, range);
        }
    }
}
