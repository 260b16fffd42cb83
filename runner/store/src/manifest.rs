//! A checkpoint's manifest: its number and, per part, the version (the
//! checkpoint that wrote it) and digest of the bytes to read.
//!
//! Encoding: magic `RFM1`, id (u64 LE), part count (u32 LE), then per
//! part: name length (u32 LE), name, version (u64 LE), SHA-256 (32 bytes).

/// One part as a manifest names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartRef {
    pub name: String,
    pub version: u64,
    pub digest: [u8; 32],
}

/// A checkpoint's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub id: u64,
    pub parts: Vec<PartRef>,
}

const MAGIC: &[u8; 4] = b"RFM1";

impl Manifest {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.parts.len() * 64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&(self.parts.len() as u32).to_le_bytes());
        for p in &self.parts {
            out.extend_from_slice(&(p.name.len() as u32).to_le_bytes());
            out.extend_from_slice(p.name.as_bytes());
            out.extend_from_slice(&p.version.to_le_bytes());
            out.extend_from_slice(&p.digest);
        }
        out
    }

    pub(crate) fn decode(mut buf: &[u8]) -> Result<Manifest, String> {
        fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
            if buf.len() < n {
                return Err(format!(
                    "truncated: wanted {n} more bytes, {} left",
                    buf.len()
                ));
            }
            let (head, rest) = buf.split_at(n);
            *buf = rest;
            Ok(head)
        }
        fn u64_le(buf: &mut &[u8]) -> Result<u64, String> {
            let b = take(buf, 8)?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| "u64")?))
        }
        fn u32_le(buf: &mut &[u8]) -> Result<u32, String> {
            let b = take(buf, 4)?;
            Ok(u32::from_le_bytes(b.try_into().map_err(|_| "u32")?))
        }
        if take(&mut buf, 4)? != MAGIC {
            return Err("not a manifest (bad magic)".into());
        }
        let id = u64_le(&mut buf)?;
        let n = u32_le(&mut buf)? as usize;
        let mut parts = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let len = u32_le(&mut buf)? as usize;
            let name = String::from_utf8(take(&mut buf, len)?.to_vec())
                .map_err(|_| "part name is not UTF-8".to_string())?;
            let version = u64_le(&mut buf)?;
            let digest = take(&mut buf, 32)?
                .try_into()
                .map_err(|_| "digest".to_string())?;
            parts.push(PartRef {
                name,
                version,
                digest,
            });
        }
        if !buf.is_empty() {
            return Err(format!("{} bytes after the last part", buf.len()));
        }
        Ok(Manifest { id, parts })
    }
}
