//! Directories only this user can read: everything Refract keeps on disk
//! (staged artifacts, which carry user code; spilled and checkpointed
//! data; savepoints) may be private, and the machine may be shared. A
//! temporary directory gets an unpredictable name too, so another user
//! cannot create it first and have Refract write into it.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Creates `path` and any missing parents, each new one with mode 0700.
pub fn create_private_dir_all(path: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// A new directory in the system's temp directory, named `prefix` and a
/// random suffix, mode 0700. It stays until the returned guard is dropped.
pub fn private_temp_dir(prefix: &str) -> io::Result<TempDirGuard> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()?;
    Ok(TempDirGuard(Some(dir)))
}

/// Removes a directory from [`private_temp_dir`] when dropped.
#[derive(Debug)]
pub struct TempDirGuard(Option<tempfile::TempDir>);

impl TempDirGuard {
    /// Where it is.
    pub fn path(&self) -> PathBuf {
        self.0
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default()
    }
}

impl Drop for TempDirGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let path = dir.path().to_path_buf();
            if let Err(error) = dir.close() {
                tracing::debug!(%error, dir = %path.display(), "cannot remove a temporary directory");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn temporary_directories_are_private_unpredictable_and_removed() {
        let a = private_temp_dir("refract-test-").expect("created");
        let b = private_temp_dir("refract-test-").expect("created");
        assert_ne!(a.path(), b.path());
        let mode = std::fs::metadata(a.path())
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let path = a.path();
        drop(a);
        assert!(!path.exists());
    }

    #[test]
    fn created_parents_are_private_too() {
        let base = tempfile::tempdir().expect("a temp dir");
        let deep = base.path().join("x/y/z");
        create_private_dir_all(&deep).expect("created");
        for dir in [base.path().join("x"), deep] {
            let mode = std::fs::metadata(&dir)
                .expect("exists")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        }
    }
}
