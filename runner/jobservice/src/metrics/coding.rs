//! The few Beam coders MonitoringInfo payloads use: varint, double and an
//! iterable of UTF-8 strings. Decoding never panics on malformed input; it
//! reports what was wrong so one bad payload from an SDK can be skipped.

/// A payload did not match its declared type's encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    /// The payload ended in the middle of a value.
    #[error("payload truncated")]
    Truncated,
    /// A varint ran over 10 bytes.
    #[error("varint too long")]
    VarintTooLong,
    /// An iterable declared a negative count other than the -1 of the
    /// chunked form.
    #[error("invalid iterable count {0}")]
    BadCount(i32),
    /// A string was not UTF-8.
    #[error("string is not UTF-8")]
    BadUtf8,
}

/// A cursor over a payload.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// Whether every byte has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    /// `beam:coder:varint:v1`: LEB128 of the two's-complement 64-bit value
    /// (negative numbers take 10 bytes).
    pub(crate) fn varint(&mut self) -> Result<i64, DecodeError> {
        let mut value: u64 = 0;
        for shift in (0..70).step_by(7) {
            let byte = self
                .take(1)?
                .first()
                .copied()
                .ok_or(DecodeError::Truncated)?;
            value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
            if byte & 0x80 == 0 {
                return Ok(value as i64);
            }
        }
        Err(DecodeError::VarintTooLong)
    }

    /// `beam:coder:double:v1`: big-endian IEEE 754.
    pub(crate) fn double(&mut self) -> Result<f64, DecodeError> {
        let bytes = self.take(8)?;
        let mut buf = [0u8; 8];
        buf.copy_from_slice(bytes);
        Ok(f64::from_be_bytes(buf))
    }

    fn int32(&mut self) -> Result<i32, DecodeError> {
        let bytes = self.take(4)?;
        let mut buf = [0u8; 4];
        buf.copy_from_slice(bytes);
        Ok(i32::from_be_bytes(buf))
    }

    /// A nested `beam:coder:string_utf8:v1`: varint length, then the bytes.
    fn nested_string(&mut self) -> Result<String, DecodeError> {
        let len = usize::try_from(self.varint()?).map_err(|_| DecodeError::Truncated)?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::BadUtf8)
    }

    /// `beam:coder:iterable:v1` of nested strings: a big-endian int32 count
    /// and the elements, or -1 followed by varint-counted blocks ending in a
    /// zero count.
    pub(crate) fn string_iterable(&mut self) -> Result<Vec<String>, DecodeError> {
        let count = self.int32()?;
        let mut out = Vec::new();
        match count {
            n if n >= 0 => {
                for _ in 0..n {
                    out.push(self.nested_string()?);
                }
            }
            -1 => loop {
                let block = self.varint()?;
                if block == 0 {
                    break;
                }
                if block < 0 {
                    return Err(DecodeError::Truncated);
                }
                for _ in 0..block {
                    out.push(self.nested_string()?);
                }
            },
            n => return Err(DecodeError::BadCount(n)),
        }
        Ok(out)
    }
}

/// Appends a `beam:coder:varint:v1` encoding of `value`.
pub(crate) fn put_varint(out: &mut Vec<u8>, value: i64) {
    let mut v = value as u64;
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Appends a `beam:coder:double:v1` encoding of `value`.
pub(crate) fn put_double(out: &mut Vec<u8>, value: f64) {
    out.extend_from_slice(&value.to_be_bytes());
}

/// Appends an iterable of nested UTF-8 strings with a known count.
pub(crate) fn put_string_iterable<'a>(
    out: &mut Vec<u8>,
    strings: impl ExactSizeIterator<Item = &'a String>,
) {
    let count = i32::try_from(strings.len()).unwrap_or(i32::MAX);
    out.extend_from_slice(&count.to_be_bytes());
    for s in strings.take(usize::try_from(count).unwrap_or(0)) {
        put_varint(out, s.len() as i64);
        out.extend_from_slice(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trips_including_negatives_and_extremes() {
        for v in [0i64, 1, 127, 128, 300, -1, i64::MAX, i64::MIN] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            let mut r = Reader::new(&buf);
            assert_eq!(r.varint(), Ok(v));
            assert!(r.is_empty());
        }
        let mut buf = Vec::new();
        put_varint(&mut buf, -1);
        assert_eq!(buf.len(), 10);
    }

    #[test]
    fn malformed_varints_are_errors() {
        assert_eq!(Reader::new(&[0x80]).varint(), Err(DecodeError::Truncated));
        assert_eq!(
            Reader::new(&[0xff; 11]).varint(),
            Err(DecodeError::VarintTooLong)
        );
    }

    #[test]
    fn string_set_matches_python_encoding() {
        // Python: IterableCoder(StrUtf8Coder()).encode(["a"]).
        let bytes = [0, 0, 0, 1, 1, b'a'];
        assert_eq!(
            Reader::new(&bytes).string_iterable(),
            Ok(vec!["a".to_string()])
        );
        let mut out = Vec::new();
        put_string_iterable(&mut out, ["a".to_string()].iter());
        assert_eq!(out, bytes);
    }

    #[test]
    fn chunked_iterable_is_read() {
        let bytes = [0xff, 0xff, 0xff, 0xff, 2, 1, b'x', 1, b'y', 1, 1, b'z', 0];
        assert_eq!(
            Reader::new(&bytes).string_iterable(),
            Ok(vec!["x".into(), "y".into(), "z".into()])
        );
        assert!(Reader::new(&[0, 0, 0, 2, 1, b'a'])
            .string_iterable()
            .is_err());
        assert!(Reader::new(&[0xff, 0xff, 0xff, 0xfe])
            .string_iterable()
            .is_err());
    }
}
