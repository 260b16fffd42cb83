//! A checkpoint's manifest: its number and, per part, the version (the
//! checkpoint that wrote it) and digest of the bytes to read.
//!
//! Encoding: magic `RFM2`, id (u64 LE), part count (u32 LE), then per
//! part: name length (u32 LE), name, version (u64 LE), SHA-256 (32 bytes),
//! chunk count (u32 LE; 0: the part is stored whole). Manifests written
//! before parts could be chunked (`RFM1`) have no chunk count: every part
//! is whole.

/// One part as a manifest names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartRef {
    pub name: String,
    pub version: u64,
    pub digest: [u8; 32],
    /// How many chunks the part is stored in; 0: under one key.
    pub chunks: u32,
}

/// A checkpoint's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub id: u64,
    pub parts: Vec<PartRef>,
}

const MAGIC: &[u8; 4] = b"RFM2";

/// The magic of manifests without chunk counts.
const MAGIC_UNCHUNKED: &[u8; 4] = b"RFM1";

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
            out.extend_from_slice(&p.chunks.to_le_bytes());
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
        let magic = take(&mut buf, 4)?;
        let chunked = if magic == MAGIC {
            true
        } else if magic == MAGIC_UNCHUNKED {
            false
        } else {
            return Err("not a manifest (bad magic)".into());
        };
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
            let chunks = if chunked { u32_le(&mut buf)? } else { 0 };
            parts.push(PartRef {
                name,
                version,
                digest,
                chunks,
            });
        }
        if !buf.is_empty() {
            return Err(format!("{} bytes after the last part", buf.len()));
        }
        Ok(Manifest { id, parts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_reads_back_with_its_chunk_counts() {
        let manifest = Manifest {
            id: 7,
            parts: vec![
                PartRef {
                    name: "engine".into(),
                    version: 7,
                    digest: [1; 32],
                    chunks: 0,
                },
                PartRef {
                    name: "user_state/2".into(),
                    version: 5,
                    digest: [2; 32],
                    chunks: 64,
                },
            ],
        };
        assert_eq!(Manifest::decode(&manifest.encode()), Ok(manifest));
    }

    /// A state directory from before chunked parts still restores.
    #[test]
    fn a_manifest_without_chunk_counts_has_every_part_whole() {
        let mut old = b"RFM1".to_vec();
        old.extend_from_slice(&3u64.to_le_bytes());
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&6u32.to_le_bytes());
        old.extend_from_slice(b"engine");
        old.extend_from_slice(&2u64.to_le_bytes());
        old.extend_from_slice(&[9; 32]);
        assert_eq!(
            Manifest::decode(&old),
            Ok(Manifest {
                id: 3,
                parts: vec![PartRef {
                    name: "engine".into(),
                    version: 2,
                    digest: [9; 32],
                    chunks: 0,
                }],
            })
        );
    }
}
