//! Where savepoints may be written: inside one directory
//! (`--savepoint_dir`), under a plain file name, never over an existing
//! file and never through a symlink. A savepoint is asked for through the
//! web UI port; without these rules, whoever can reach that port could
//! have the server write over any file it can write.

use std::path::{Component, Path, PathBuf};

/// The directory savepoints go to; made (private to this user) when the
/// first savepoint is written, so a server that takes none leaves nothing
/// behind.
#[derive(Debug)]
pub struct SavepointDir {
    dir: PathBuf,
}

impl SavepointDir {
    /// Savepoints in `dir`.
    pub fn new(dir: PathBuf) -> SavepointDir {
        SavepointDir { dir }
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
    /// (`refract_store::write_savepoint`).
    pub fn target(&self, requested: &str) -> Result<PathBuf, String> {
        if !self.dir.exists() {
            crate::private_dir::create_private_dir_all(&self.dir).map_err(|e| {
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
                "savepoint '{requested}' refused: {why}; savepoints are written only as files \
                 directly in {}",
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
