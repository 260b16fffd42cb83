//! Savepoints: a job's checkpoint written to a file of its own, to stop
//! the job and start the same pipeline from it later (on this server or
//! another one).
//!
//! Format: magic `RFSP1`, part count (u32 LE), then per part its name
//! length (u32 LE), name, data length (u64 LE) and data, and last the
//! SHA-256 of everything before it. The file is written beside its final
//! path under a fresh name and linked into place, so a savepoint is either
//! whole or absent, and never replaces a file (or follows a symlink) that
//! is already at its path.

use std::io::Write;
use std::path::Path;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::StoreError;

const MAGIC: &[u8; 5] = b"RFSP1";

fn io(path: &Path, what: &str, e: std::io::Error) -> StoreError {
    StoreError::Backend(format!("{what} savepoint {}: {e}", path.display()))
}

fn corrupt(path: &Path, why: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        what: format!("savepoint {}", path.display()),
        why: why.into(),
    }
}

/// Writes `parts` as a savepoint at `path`, which must not exist yet (not
/// even as a dangling symlink); returns its size in bytes.
pub fn write_savepoint(path: &Path, parts: &[(String, Bytes)]) -> Result<u64, StoreError> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for (name, data) in parts {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    if std::fs::symlink_metadata(path).is_ok() {
        return Err(StoreError::Backend(format!(
            "savepoint {} was not written: something is already there",
            path.display()
        )));
    }
    let tmp = partial_path(path);
    // `create_new` fails on anything at the path, a symlink included.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| io(path, "creating", e))?;
    let written = file
        .write_all(&out)
        .and_then(|()| file.sync_all())
        .map_err(|e| io(path, "writing", e))
        // A link fails, unlike a rename, when the final path exists.
        .and_then(|()| std::fs::hard_link(&tmp, path).map_err(|e| io(path, "placing", e)));
    if let Err(error) = std::fs::remove_file(&tmp) {
        tracing::debug!(path = %tmp.display(), %error, "cannot remove a partial savepoint");
    }
    written.map(|()| out.len() as u64)
}

/// The bytes of the regular file at `path`, refusing anything else before
/// reading: opened without following a symlink and without waiting (a
/// FIFO opens at once instead of waiting for a writer), then its type and
/// size are taken from the open file itself, so nothing can be swapped in
/// between the check and the read.
fn read_regular_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, StoreError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| io(path, "opening", e))?;
    let meta = file.metadata().map_err(|e| io(path, "reading", e))?;
    if !meta.is_file() {
        return Err(StoreError::Backend(format!(
            "savepoint {} is not a regular file",
            path.display()
        )));
    }
    if meta.len() > max_bytes {
        return Err(StoreError::Backend(format!(
            "savepoint {} is {} bytes, over the limit of {max_bytes} (--max_savepoint_bytes)",
            path.display(),
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // The file may grow after the check: read no more than the limit.
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io(path, "reading", e))?;
    if bytes.len() as u64 > max_bytes {
        return Err(StoreError::Backend(format!(
            "savepoint {} grew past the limit of {max_bytes} bytes while it was read",
            path.display()
        )));
    }
    Ok(bytes)
}

/// A fresh name beside `path` for the file being written.
fn partial_path(path: &Path) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path
        .file_name()
        .map_or_else(|| "savepoint".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}-{n}.partial", std::process::id()))
}

/// Reads the savepoint at `path`, which must be a regular file of at most
/// `max_bytes` (not a symlink, a FIFO or a device, which could make the
/// read block or never end).
pub fn read_savepoint(path: &Path, max_bytes: u64) -> Result<Vec<(String, Bytes)>, StoreError> {
    let bytes = read_regular_file(path, max_bytes)?;
    if bytes.len() < MAGIC.len() + 4 + 32 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(corrupt(path, "not a Refract savepoint"));
    }
    let (body, digest) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != digest {
        return Err(corrupt(
            path,
            "its checksum does not match (truncated or altered)",
        ));
    }
    let body = Bytes::copy_from_slice(body);
    let mut at = MAGIC.len();
    let take = |at: &mut usize, n: usize| -> Result<Bytes, StoreError> {
        if body.len() < *at + n {
            return Err(corrupt(path, "truncated part"));
        }
        let slice = body.slice(*at..*at + n);
        *at += n;
        Ok(slice)
    };
    let count = u32::from_le_bytes(
        take(&mut at, 4)?
            .as_ref()
            .try_into()
            .map_err(|_| corrupt(path, "count"))?,
    );
    let mut parts = Vec::with_capacity((count as usize).min(1 << 16));
    for _ in 0..count {
        let len = u32::from_le_bytes(
            take(&mut at, 4)?
                .as_ref()
                .try_into()
                .map_err(|_| corrupt(path, "name length"))?,
        );
        let name = String::from_utf8(take(&mut at, len as usize)?.to_vec())
            .map_err(|_| corrupt(path, "a part name is not UTF-8"))?;
        let len = u64::from_le_bytes(
            take(&mut at, 8)?
                .as_ref()
                .try_into()
                .map_err(|_| corrupt(path, "data length"))?,
        );
        let len = usize::try_from(len).map_err(|_| corrupt(path, "part too large"))?;
        parts.push((name, take(&mut at, len)?));
    }
    if at != body.len() {
        return Err(corrupt(path, "bytes after the last part"));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn savepoints_round_trip_and_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.savepoint");
        let parts = vec![
            ("engine".to_string(), Bytes::from_static(b"e")),
            ("stage/0".to_string(), Bytes::from(vec![7u8; 1000])),
            ("empty".to_string(), Bytes::new()),
        ];
        let size = write_savepoint(&path, &parts).unwrap();
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());
        assert_eq!(read_savepoint(&path, u64::MAX).unwrap(), parts);
        let error = read_savepoint(&path, size - 1).unwrap_err().to_string();
        assert!(error.contains("over the limit"), "{error}");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = read_savepoint(&path, u64::MAX).unwrap_err().to_string();
        assert!(error.contains("checksum"), "{error}");
        std::fs::write(&path, b"hello").unwrap();
        let error = read_savepoint(&path, u64::MAX).unwrap_err().to_string();
        assert!(error.contains("not a Refract savepoint"), "{error}");
    }

    #[test]
    fn only_regular_files_are_read_as_savepoints() {
        let dir = tempfile::tempdir().unwrap();
        let parts = vec![("engine".to_string(), Bytes::from_static(b"e"))];
        let real = dir.path().join("real");
        write_savepoint(&real, &parts).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(read_savepoint(&link, u64::MAX).is_err(), "a symlink");
        // A FIFO with no writer: opening it for reading would block.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let error = read_savepoint(&fifo, u64::MAX).unwrap_err().to_string();
            assert!(error.contains("not a regular file"), "{error}");
        }
        let error = read_savepoint(dir.path(), u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(error.contains("not a regular file"), "{error}");
        let error = read_savepoint(Path::new("/dev/zero"), u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(error.contains("not a regular file"), "{error}");
    }

    #[test]
    fn a_savepoint_never_replaces_a_file_or_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let parts = vec![("engine".to_string(), Bytes::from_static(b"e"))];
        let existing = dir.path().join("existing");
        std::fs::write(&existing, b"keep me").unwrap();
        let error = write_savepoint(&existing, &parts).unwrap_err().to_string();
        assert!(error.contains("already there"), "{error}");
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");

        let outside = dir.path().join("outside");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        assert!(write_savepoint(&link, &parts).is_err());
        assert!(!outside.exists(), "wrote through a dangling symlink");
        // Nothing partial is left behind.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["existing", "link"]);
    }
}
