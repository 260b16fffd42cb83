//! The secret a coordinator and its shard hosts share: a host proves it by
//! sending it when it attaches (and with every file it fetches); the
//! coordinator proves it back by hashing it with a nonce the host chose.
//! It comes from a file (a Kubernetes Secret mounted as one, say), never
//! from the command line, where every user of the machine could read it.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::HostsError;

/// The fewest bytes a secret may have: shorter ones can be guessed.
pub const MIN_SECRET_BYTES: usize = 16;

/// The shared secret, never printed.
#[derive(Clone)]
pub struct ClusterSecret(String);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// The secret in the file at `path`, without surrounding white space.
    pub fn read(path: &Path) -> Result<Self, HostsError> {
        let failed = |reason: String| HostsError::Secret {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        Self::new(text.trim()).map_err(failed)
    }

    /// `secret` itself, if it is long enough.
    pub fn new(secret: &str) -> Result<Self, String> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "holds {} bytes; a cluster secret needs at least {MIN_SECRET_BYTES} (`head -c 32 \
                 /dev/urandom | base64` makes one)",
                secret.len()
            ));
        }
        Ok(ClusterSecret(secret.to_string()))
    }

    /// The secret as a host sends it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `offered` is this secret, in time that does not depend on
    /// where they differ.
    pub fn matches(&self, offered: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), offered.as_bytes());
        let mut differ = a.len() ^ b.len();
        for (i, x) in a.iter().enumerate() {
            differ |= usize::from(x ^ b.get(i).copied().unwrap_or(!x));
        }
        differ == 0
    }

    /// The coordinator's proof for a host's `nonce`.
    pub fn proof(&self, nonce: &[u8]) -> Vec<u8> {
        let mut hash = Sha256::new();
        hash.update(b"refract coordinator\0");
        hash.update(self.0.as_bytes());
        hash.update(b"\0");
        hash.update(nonce);
        hash.finalize().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_matches_itself_only() {
        let secret = ClusterSecret::new("0123456789abcdef0123").expect("long enough");
        assert!(secret.matches("0123456789abcdef0123"));
        assert!(!secret.matches("0123456789abcdef012"));
        assert!(!secret.matches("0123456789abcdef01234"));
        assert!(!secret.matches("x123456789abcdef0123"));
        assert!(!secret.matches(""));
    }

    #[test]
    fn a_short_secret_is_refused() {
        let e = ClusterSecret::new("short").expect_err("too short");
        assert!(e.contains("at least 16"), "{e}");
    }

    #[test]
    fn proofs_differ_by_nonce_and_secret() {
        let a = ClusterSecret::new("0123456789abcdef0123").expect("long enough");
        let b = ClusterSecret::new("0123456789abcdef0124").expect("long enough");
        assert_eq!(a.proof(b"n1"), a.proof(b"n1"));
        assert_ne!(a.proof(b"n1"), a.proof(b"n2"));
        assert_ne!(a.proof(b"n1"), b.proof(b"n1"));
    }

    #[test]
    fn a_secret_file_is_read_without_its_newline() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef0123\n").expect("written");
        let secret = ClusterSecret::read(&path).expect("read");
        assert!(secret.matches("0123456789abcdef0123"));
        let missing = ClusterSecret::read(&dir.path().join("none")).expect_err("no file");
        assert!(missing.to_string().contains("none"), "{missing}");
    }
}
