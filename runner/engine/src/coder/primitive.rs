//! The two number formats every standard coder is built from.
//!
//! *Varints* are unsigned LEB128 (seven bits per byte, low group first, high
//! bit set on every byte but the last) of a 64-bit value. Signed numbers are
//! written as their two's-complement bits, **not** zigzagged, so every
//! negative number takes the full ten bytes — a quirk that Java's
//! `VarLongCoder` fixed for all SDKs. Decoding accepts non-minimal encodings
//! (as the SDKs do) but rejects anything that does not fit in 64 bits.
//!
//! *Timestamps* inside windowed values, windows and timers are milliseconds
//! since the epoch, written as 8 big-endian bytes after adding 2^63 (the same
//! as flipping the sign bit). That shift makes the byte order of encoded
//! timestamps equal to their numeric order, so encoded windows sort by end
//! time. SDKs clamp to Beam's min/max timestamps when encoding; the runner
//! decodes any 64-bit value, because rejecting an SDK's bytes is worse than
//! carrying an odd timestamp.
//!
//! These are the bottom layer of the coders: they read plain slices, and
//! `reader`'s cursor is built on them.

use super::CoderError;
use crate::time::Timestamp;

/// The bit flipped by the timestamp encoding (adding 2^63 modulo 2^64).
const SIGN_BIT: u64 = 1 << 63;

/// A varint never takes more than ten bytes (10 × 7 ≥ 64 bits).
const MAX_VARINT_LEN: usize = 10;

/// Appends `v` as a Beam varint: the building block of lengths and counts.
pub fn encode_varint_u64(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a Beam varint at the start of `buf`, returning the value and the
/// number of bytes it took, so callers can walk on past it.
pub fn decode_varint_u64(buf: &[u8]) -> Result<(u64, usize), CoderError> {
    varint_u64(buf, "varint")
}

/// Appends a signed varint (`beam:coder:varint:v1`): the two's-complement
/// bits as [`encode_varint_u64`], so negatives take ten bytes.
pub fn encode_varint_i64(v: i64, out: &mut Vec<u8>) {
    encode_varint_u64(v as u64, out);
}

/// Reads a signed varint (`beam:coder:varint:v1`) at the start of `buf`,
/// returning the value and the number of bytes it took.
pub fn decode_varint_i64(buf: &[u8]) -> Result<(i64, usize), CoderError> {
    varint_u64(buf, "varint").map(|(v, n)| (v as i64, n))
}

/// Appends a timestamp as the 8 shifted big-endian bytes that windowed
/// values, interval windows and timers carry.
pub fn encode_timestamp(ts: Timestamp, out: &mut Vec<u8>) {
    out.extend_from_slice(&((ts as u64) ^ SIGN_BIT).to_be_bytes());
}

/// Reads an 8-byte shifted timestamp at the start of `buf`; the count
/// returned is always 8, for symmetry with the other decoders.
pub fn decode_timestamp(buf: &[u8]) -> Result<(Timestamp, usize), CoderError> {
    let bytes = buf
        .first_chunk::<8>()
        .ok_or(CoderError::Truncated("timestamp"))?;
    Ok((timestamp_from_be_bytes(*bytes), bytes.len()))
}

/// Undoes the timestamp shift on 8 big-endian bytes.
pub(super) fn timestamp_from_be_bytes(bytes: [u8; 8]) -> Timestamp {
    (u64::from_be_bytes(bytes) ^ SIGN_BIT) as i64
}

/// The varint decoder behind every reader, labelling its errors with `what`.
pub(super) fn varint_u64(buf: &[u8], what: &'static str) -> Result<(u64, usize), CoderError> {
    let mut value = 0u64;
    for (i, &byte) in buf.iter().take(MAX_VARINT_LEN).enumerate() {
        let bits = u64::from(byte & 0x7f);
        // The tenth byte holds only the 64th bit.
        if i == MAX_VARINT_LEN - 1 && bits > 1 {
            return Err(CoderError::Invalid {
                what,
                detail: "varint overflows 64 bits".to_string(),
            });
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    if buf.len() >= MAX_VARINT_LEN {
        Err(CoderError::Invalid {
            what,
            detail: "varint longer than 10 bytes".to_string(),
        })
    } else {
        Err(CoderError::Truncated(what))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn varint(v: i64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_varint_i64(v, &mut out);
        out
    }

    fn ts(t: Timestamp) -> Vec<u8> {
        let mut out = Vec::new();
        encode_timestamp(t, &mut out);
        out
    }

    #[test]
    fn varint_examples_from_the_notes() {
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(
            varint(-1),
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        assert_eq!(varint(0), [0x00]);
        assert_eq!(varint(127), [0x7f]);
        assert_eq!(varint(128), [0x80, 0x01]);
    }

    #[test]
    fn varint_accepts_non_minimal_and_rejects_overflow() {
        assert_eq!(decode_varint_u64(&[0x80, 0x00]), Ok((0, 2)));
        // Ten bytes whose last carries more than the 64th bit.
        let too_big = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(matches!(
            decode_varint_u64(&too_big),
            Err(CoderError::Invalid { .. })
        ));
        // Eleven bytes.
        let too_long = [
            0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x81, 0x00,
        ];
        assert!(matches!(
            decode_varint_u64(&too_long),
            Err(CoderError::Invalid { .. })
        ));
        assert_eq!(decode_varint_u64(&[]), Err(CoderError::Truncated("varint")));
        assert_eq!(
            decode_varint_u64(&[0x80]),
            Err(CoderError::Truncated("varint"))
        );
    }

    #[test]
    fn timestamp_examples_from_the_notes() {
        assert_eq!(ts(0), [0x80, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(ts(-1), [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            ts(crate::time::MIN_TIMESTAMP),
            [0x7f, 0xdf, 0x3b, 0x64, 0x5a, 0x1c, 0xac, 0x09]
        );
        assert_eq!(
            ts(crate::time::MAX_TIMESTAMP),
            [0x80, 0x20, 0xc4, 0x9b, 0xa5, 0xe3, 0x53, 0xf7]
        );
        assert_eq!(
            decode_timestamp(&[0x80; 7]),
            Err(CoderError::Truncated("timestamp"))
        );
    }

    proptest! {
        #[test]
        fn varint_u64_round_trips(v in any::<u64>(), tail in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut buf = Vec::new();
            encode_varint_u64(v, &mut buf);
            let len = buf.len();
            prop_assert!(len <= MAX_VARINT_LEN);
            buf.extend_from_slice(&tail);
            prop_assert_eq!(decode_varint_u64(&buf), Ok((v, len)));
        }

        #[test]
        fn varint_i64_round_trips(v in any::<i64>()) {
            let buf = varint(v);
            if v < 0 {
                prop_assert_eq!(buf.len(), MAX_VARINT_LEN);
            }
            prop_assert_eq!(decode_varint_i64(&buf), Ok((v, buf.len())));
        }

        #[test]
        fn varint_decoding_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..16)) {
            if let Ok((_, n)) = decode_varint_u64(&buf) {
                prop_assert!(n >= 1 && n <= buf.len().min(MAX_VARINT_LEN));
            }
        }

        #[test]
        fn timestamp_round_trips_and_sorts(a in any::<i64>(), b in any::<i64>()) {
            prop_assert_eq!(decode_timestamp(&ts(a)), Ok((a, 8)));
            prop_assert_eq!(a.cmp(&b), ts(a).cmp(&ts(b)));
        }
    }
}
