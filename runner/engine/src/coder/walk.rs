//! Finding where a value ends without decoding it.
//!
//! The data plane delivers elements back to back with no framing of their
//! own, so the only way to find the second element is to walk the first one
//! with its coder. Walking reads lengths, counts and flags and skips
//! everything else: user bytes are never copied or interpreted (a
//! `string_utf8` is not even checked to be UTF-8). The walk of a value must
//! consume exactly the bytes its coder wrote, so any strict prefix of an
//! encoding is an error, never a shorter value.
//!
//! Iterables can claim up to 2^31 elements (or 2^63 per chunk) that take no
//! bytes at all (global windows). The walk notices an element that consumed
//! nothing — such an element read nothing, so every later one would do the
//! same — and stops counting, so a few bytes of garbage cannot spin it.

use super::iterable::for_each_block;
use super::reader::Reader;
use super::timer::read_timer;
use super::windowed_value::read_header;
use super::{Coder, CoderError};

impl Coder {
    /// Length of the first nested-encoded value at the start of buf.
    ///
    /// This is how the runner splits concatenated values (data-plane
    /// elements, iterable contents, state pages) without understanding them.
    pub fn nested_len(&self, buf: &[u8]) -> Result<usize, CoderError> {
        let mut r = Reader::new(buf);
        self.skip(&mut r)?;
        Ok(r.pos())
    }

    /// For a Kv coder: length of the nested key at the start of an encoded
    /// KV value. Grouping and stateful routing compare these key bytes, so
    /// the runner must find them without decoding the key.
    pub fn kv_key_len(&self, value: &[u8]) -> Result<usize, CoderError> {
        match self {
            Coder::Kv(key, _) => key.nested_len(value),
            other => Err(CoderError::Invalid {
                what: "kv",
                detail: format!("expected a KV coder, got {other:?}"),
            }),
        }
    }

    /// Moves `r` past one nested value of this coder.
    pub(super) fn skip(&self, r: &mut Reader<'_>) -> Result<(), CoderError> {
        match self {
            Coder::Bytes | Coder::StringUtf8 | Coder::LengthPrefix => {
                let len = r.length("length-prefixed bytes")?;
                r.skip(len, "length-prefixed bytes")
            }
            Coder::Varint => r.varint_u64("varint").map(drop),
            Coder::Bool => match r.byte("bool")? {
                0 | 1 => Ok(()),
                other => Err(CoderError::Invalid {
                    what: "bool",
                    detail: format!("expected 0 or 1, got {other}"),
                }),
            },
            Coder::Double => r.skip(8, "double"),
            Coder::Kv(key, value) => {
                key.skip(r)?;
                value.skip(r)
            }
            Coder::Iterable(element) => {
                // A state-backed token ends the iterable's bytes: skipped.
                for_each_block(r, "iterable", |r, n| skip_elements(element, r, n)).map(drop)
            }
            Coder::Nullable(inner) => match r.byte("nullable flag")? {
                0 => Ok(()),
                1 => inner.skip(r),
                other => Err(CoderError::Invalid {
                    what: "nullable flag",
                    detail: format!("expected 0 or 1, got {other}"),
                }),
            },
            Coder::GlobalWindow | Coder::IntervalWindow | Coder::CustomWindow => {
                self.skip_window(r)
            }
            Coder::WindowedValue { value, window } => {
                read_header(r, window)?;
                value.skip(r)
            }
            Coder::Timer { key, window } => read_timer(r, key, window).map(drop),
            Coder::ShardedKey(key) => {
                let len = r.length("sharded key shard id")?;
                r.skip(len, "sharded key shard id")?;
                key.skip(r)
            }
        }
    }
}

/// Skips `n` consecutive elements, stopping early once one takes no bytes
/// (then all the rest take none either).
fn skip_elements(element: &Coder, r: &mut Reader<'_>, n: u64) -> Result<(), CoderError> {
    for _ in 0..n {
        let before = r.pos();
        element.skip(r)?;
        if r.pos() == before {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: Coder, v: Coder) -> Coder {
        Coder::Kv(Box::new(k), Box::new(v))
    }

    fn iterable(e: Coder) -> Coder {
        Coder::Iterable(Box::new(e))
    }

    #[test]
    fn examples_from_the_notes() {
        assert_eq!(Coder::Bytes.nested_len(&[0x02, 0x61, 0x62, 0x99]), Ok(3));
        assert_eq!(
            kv(Coder::Bytes, Coder::Bytes).nested_len(&[1, 0x61, 1, 0x62]),
            Ok(4)
        );
        assert_eq!(
            iterable(Coder::Varint).nested_len(&[0, 0, 0, 2, 1, 2]),
            Ok(6)
        );
        assert_eq!(
            iterable(Coder::Varint).nested_len(&[0xff, 0xff, 0xff, 0xff, 2, 1, 2, 0, 7]),
            Ok(8)
        );
        assert_eq!(Coder::LengthPrefix.nested_len(&[0x02, 0xac, 0x02]), Ok(3));
        assert_eq!(
            Coder::Double.nested_len(&[0x3f, 0xf8, 0, 0, 0, 0, 0, 0]),
            Ok(8)
        );
        let nullable = Coder::Nullable(Box::new(Coder::Varint));
        assert_eq!(nullable.nested_len(&[0x00, 0x07]), Ok(1));
        assert_eq!(nullable.nested_len(&[0x01, 0x07]), Ok(2));
        assert_eq!(Coder::GlobalWindow.nested_len(&[]), Ok(0));
        assert_eq!(
            Coder::IntervalWindow.nested_len(&[0x80, 0, 0, 0, 0, 0, 0x27, 0x10, 0x90, 0x4e]),
            Ok(10)
        );
    }

    #[test]
    fn kv_key_len_needs_a_kv_coder() {
        let coder = kv(Coder::StringUtf8, Coder::LengthPrefix);
        assert_eq!(coder.kv_key_len(&[0x01, 0x6b, 0x02, 0xac, 0x02]), Ok(2));
        assert!(matches!(
            Coder::Bytes.kv_key_len(&[0]),
            Err(CoderError::Invalid { .. })
        ));
        assert_eq!(
            coder.kv_key_len(&[0x05, 0x6b]),
            Err(CoderError::Truncated("length-prefixed bytes"))
        );
    }

    #[test]
    fn chunked_iterable_with_many_blocks_and_state_token() {
        // Three blocks of LP bytes, then a state-backed continuation token.
        let mut buf = vec![0xff, 0xff, 0xff, 0xff];
        buf.extend([2, 1, 0xaa, 0]); // two elements: [aa], []
        buf.extend([1, 3, 1, 2, 3]); // one element: [01 02 03]
        buf.extend([0x01, 0x00]); // one element: []
        let terminated = [buf.clone(), vec![0]].concat();
        assert_eq!(
            iterable(Coder::Bytes).nested_len(&terminated),
            Ok(terminated.len())
        );
        let mut with_token = buf.clone();
        with_token.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        with_token.extend([2, 0xbe, 0xef]);
        assert_eq!(
            iterable(Coder::Bytes).nested_len(&with_token),
            Ok(with_token.len())
        );
        // Without its terminator the iterable is truncated.
        assert!(iterable(Coder::Bytes).nested_len(&buf).is_err());
    }

    #[test]
    fn invalid_bytes_are_errors() {
        assert!(matches!(
            Coder::Bool.nested_len(&[2]),
            Err(CoderError::Invalid { .. })
        ));
        assert!(matches!(
            Coder::Nullable(Box::new(Coder::Bytes)).nested_len(&[2]),
            Err(CoderError::Invalid { .. })
        ));
        // Known-length counts other than -1 may not be negative.
        assert!(matches!(
            iterable(Coder::Bytes).nested_len(&[0xff, 0xff, 0xff, 0xfe]),
            Err(CoderError::Invalid { .. })
        ));
        // Negative byte lengths.
        assert!(matches!(
            Coder::Bytes.nested_len(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(CoderError::Invalid { .. })
        ));
    }

    #[test]
    fn zero_width_elements_do_not_spin() {
        // 2^31 - 1 global windows, then 2^63 - 1 more in a chunk: no bytes.
        let known = [0x7f, 0xff, 0xff, 0xff];
        assert_eq!(iterable(Coder::GlobalWindow).nested_len(&known), Ok(4));
        let mut chunked = vec![0xff, 0xff, 0xff, 0xff];
        chunked.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x00]);
        let coder = iterable(kv(Coder::GlobalWindow, Coder::GlobalWindow));
        assert_eq!(coder.nested_len(&chunked), Ok(chunked.len()));
    }
}
