//! Outer ("last in the buffer") encodings, turned into nested ones.
//!
//! A few places hand the runner values in the *outer* context — TestStream
//! events carry `coder.encode(value)` — while everything the runner moves
//! between stages is nested. Only bytes-like coders (and a KV or nullable
//! whose last component is one) differ between the two contexts: outer
//! bytes are raw, nested bytes carry a length first.

use super::{encode_varint_u64, Coder, CoderError};

impl Coder {
    /// Re-encode one value given in the outer context into the nested
    /// context of this coder.
    pub fn outer_to_nested(&self, outer: &[u8]) -> Result<Vec<u8>, CoderError> {
        let mut out = Vec::with_capacity(outer.len() + 2);
        self.write_nested_from_outer(outer, &mut out)?;
        Ok(out)
    }

    fn write_nested_from_outer(&self, outer: &[u8], out: &mut Vec<u8>) -> Result<(), CoderError> {
        match self {
            Coder::Bytes | Coder::StringUtf8 | Coder::LengthPrefix => {
                encode_varint_u64(outer.len() as u64, out);
                out.extend_from_slice(outer);
                Ok(())
            }
            Coder::Kv(key, value) => {
                let key_len = key.nested_len(outer)?;
                let (key_bytes, value_bytes) = outer
                    .split_at_checked(key_len)
                    .ok_or(CoderError::Truncated("kv"))?;
                out.extend_from_slice(key_bytes);
                value.write_nested_from_outer(value_bytes, out)
            }
            Coder::Nullable(inner) => match outer.split_first() {
                Some((0, _)) => {
                    out.push(0);
                    Ok(())
                }
                Some((1, present)) => {
                    out.push(1);
                    inner.write_nested_from_outer(present, out)
                }
                Some((other, _)) => Err(CoderError::Invalid {
                    what: "nullable",
                    detail: format!("expected a 0 or 1 flag, got {other}"),
                }),
                None => Err(CoderError::Truncated("nullable")),
            },
            Coder::WindowedValue { .. } | Coder::ShardedKey(_) => Err(CoderError::Invalid {
                what: "outer-context value",
                detail: format!("cannot convert an outer-context {self:?}"),
            }),
            // Same bytes in both contexts; check the value is whole.
            _ => {
                let len = self.nested_len(outer)?;
                if len != outer.len() {
                    return Err(CoderError::Invalid {
                        what: "outer-context value",
                        detail: format!("{} trailing bytes", outer.len() - len),
                    });
                }
                out.extend_from_slice(outer);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_like_values_gain_a_length() {
        assert_eq!(Coder::Bytes.outer_to_nested(b"ab").unwrap(), b"\x02ab");
        assert_eq!(Coder::LengthPrefix.outer_to_nested(b"").unwrap(), b"\x00");
        let kv = Coder::Kv(Box::new(Coder::StringUtf8), Box::new(Coder::StringUtf8));
        // KV("a", "b") outer: key nested, value raw.
        assert_eq!(kv.outer_to_nested(b"\x01ab").unwrap(), b"\x01a\x01b");
    }

    #[test]
    fn fixed_width_values_are_unchanged_and_checked() {
        assert_eq!(
            Coder::Varint.outer_to_nested(&[0xac, 0x02]).unwrap(),
            [0xac, 0x02]
        );
        assert!(Coder::Varint.outer_to_nested(&[0x01, 0x02]).is_err());
        assert!(Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes))
            .outer_to_nested(b"\x05a")
            .is_err());
    }
}
