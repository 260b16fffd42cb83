//! Where savepoints may be written and read: inside one directory
//! (`--savepoint_dir`), under a plain file name, never over an existing
//! file and never through a symlink. A savepoint is asked for through the
//! web UI port, and a job starts from one named in its options; without
//! these rules, whoever can reach those ports could have the server write
//! over any file it can write, or read any file it can read (a FIFO or a
//! device, which never ends) into a job.

use std::path::{Component, Path, PathBuf};

/// The directory savepoints go to; made (private to this user) when the
/// first savepoint is written, so a server that takes none leaves nothing
/// behind.
#[derive(Debug)]
pub struct SavepointDir {
    dir: PathBuf,
    max_read_bytes: u64,
}

/// The largest savepoint read unless [`SavepointDir::with_max_read_bytes`]
/// says otherwise (`--max_savepoint_bytes`).
pub const DEFAULT_MAX_SAVEPOINT_BYTES: u64 = 2 << 30;

impl SavepointDir {
    /// Savepoints in `dir`, read up to [`DEFAULT_MAX_SAVEPOINT_BYTES`].
    pub fn new(dir: PathBuf) -> SavepointDir {
        SavepointDir {
            dir,
            max_read_bytes: DEFAULT_MAX_SAVEPOINT_BYTES,
        }
    }

    /// The same directory, reading savepoints of at most `bytes`.
    pub fn with_max_read_bytes(mut self, bytes: u64) -> SavepointDir {
        self.max_read_bytes = bytes;
        self
    }

    /// Reads the savepoint `requested` names (as [`Self::target`] takes
    /// names): a regular file in the directory of at most the read limit.
    /// Blocks on the file system: call it off the async runtime.
    pub fn read(&self, requested: &str) -> Result<Vec<(String, bytes::Bytes)>, String> {
        let path = self.resolve(requested, "started from")?;
        crate::read_savepoint(&path, self.max_read_bytes).map_err(|e| e.to_string())
    }

    /// Where savepoints go unless `--savepoint_dir` says: beside the
    /// state with `--state_dir`, else in the user's data directory.
    pub fn default_location(state_dir: Option<&Path>) -> Option<PathBuf> {
        if let Some(state) = state_dir {
            return Some(state.join("savepoints"));
        }
        let data = std::env::var_os("XDG_DATA_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|h| !h.is_empty())
                    .map(|h| PathBuf::from(h).join(".local/share"))
            })?;
        Some(data.join("refract/savepoints"))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The file a savepoint asked for as `requested` goes to: a plain file
    /// name in the directory, or an absolute path whose directory is this
    /// one. Anything else is refused with the reason. That nothing is at
    /// the path yet is checked when the file is created
    /// (`crate::write_savepoint`).
    pub fn target(&self, requested: &str) -> Result<PathBuf, String> {
        self.resolve(requested, "written")
    }

    /// `requested` as a path in the directory (made if missing), or why
    /// not; `use_` says what savepoints are there ("written").
    fn resolve(&self, requested: &str, use_: &str) -> Result<PathBuf, String> {
        if !self.dir.exists() {
            refract_private_dirs::create_private_dir_all(&self.dir).map_err(|e| {
                format!(
                    "cannot create the savepoint directory {}: {e}",
                    self.dir.display()
                )
            })?;
        }
        let root = self.dir.canonicalize().map_err(|e| {
            format!(
                "cannot use the savepoint directory {}: {e}",
                self.dir.display()
            )
        })?;
        let path = Path::new(requested);
        let refuse = |why: &str| {
            Err(format!(
                "savepoint '{requested}' refused: {why}; savepoints are {use_} only as files \
                 directly in {} (--savepoint_dir)",
                root.display()
            ))
        };
        let name = match path.file_name() {
            Some(name) if !requested.ends_with('/') => name,
            _ => return refuse("it names no file"),
        };
        if path.is_absolute() {
            let parent = path.parent().unwrap_or(Path::new("/"));
            match parent.canonicalize() {
                Ok(dir) if dir == root => {}
                _ => return refuse("its directory is not the savepoint directory"),
            }
        } else {
            let mut components = path.components();
            let plain = matches!(components.next(), Some(Component::Normal(_)))
                && components.next().is_none();
            if !plain {
                return refuse("a relative path must be a plain file name");
            }
        }
        Ok(root.join(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_in_the_directory_are_accepted() {
        let base = tempfile::tempdir().expect("a temp dir");
        let dir = SavepointDir::new(base.path().join("savepoints"));
        let root = base
            .path()
            .canonicalize()
            .expect("canonical")
            .join("savepoints");
        assert_eq!(dir.target("job.sp"), Ok(root.join("job.sp")));
        let absolute = root.join("other.sp");
        assert_eq!(
            dir.target(&absolute.to_string_lossy()),
            Ok(absolute.clone())
        );
        for bad in [
            "../escape.sp",
            "sub/job.sp",
            "/etc/passwd",
            "",
            ".",
            "..",
            "job.sp/",
        ] {
            let error = dir.target(bad).expect_err(bad);
            assert!(error.contains("refused"), "{bad}: {error}");
        }
        // A symlinked directory inside does not lead out.
        std::os::unix::fs::symlink(base.path(), root.join("out")).expect("symlink");
        assert!(dir
            .target(&root.join("out").join("x.sp").to_string_lossy())
            .is_err());
    }

    #[test]
    fn savepoints_are_read_only_from_regular_files_in_the_directory() {
        let base = tempfile::tempdir().expect("a temp dir");
        let dir = SavepointDir::new(base.path().join("savepoints"));
        let target = dir.target("job.sp").expect("a target");
        let parts = vec![("engine".to_string(), bytes::Bytes::from_static(b"e"))];
        let size = crate::write_savepoint(&target, &parts).expect("written");
        assert_eq!(dir.read("job.sp"), Ok(parts.clone()));
        assert_eq!(dir.read(&target.to_string_lossy()), Ok(parts));
        // Outside the directory, however the path is written.
        let outside = base.path().join("elsewhere.sp");
        std::fs::copy(&target, &outside).expect("copied");
        for bad in [
            outside.to_string_lossy().into_owned(),
            "../elsewhere.sp".into(),
        ] {
            let error = dir.read(&bad).expect_err(&bad);
            assert!(error.contains("started from only as files"), "{error}");
        }
        // A symlink in the directory to a file elsewhere is not followed.
        let root = target.parent().expect("a parent");
        std::os::unix::fs::symlink(&outside, root.join("link.sp")).expect("symlink");
        assert!(dir.read("link.sp").is_err());
        // Over the size limit.
        let small = SavepointDir::new(base.path().join("savepoints")).with_max_read_bytes(size - 1);
        let error = small.read("job.sp").expect_err("too big");
        assert!(error.contains("over the limit"), "{error}");
    }

    #[test]
    fn the_directory_is_made_private_when_first_used() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().expect("a temp dir");
        let dir = SavepointDir::new(base.path().join("a/b"));
        assert!(!dir.path().exists());
        dir.target("x.sp").expect("a target");
        let mode = std::fs::metadata(dir.path())
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
