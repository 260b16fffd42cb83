//! Directories only this user can read: everything Refract keeps on disk
//! (staged artifacts, which carry user code; spilled and checkpointed
//! data; savepoints) may be private, and the machine may be shared. A
//! temporary directory gets an unpredictable name too, so another user
//! cannot create it first and have Refract write into it.
//!
//! A temporary directory also names the process that owns it, in a
//! `.refract-owner` file: a server that is killed (SIGKILL, a crash, the
//! machine's OOM killer) cannot remove its staging or spill directory, and
//! those hold hundreds of megabytes (staged jars, spilled runs). The next
//! server to start removes such directories of owners that are gone
//! ([`sweep_abandoned_temp_dirs`]); directories without the file, of a
//! live owner, or of an owner in another boot or pid namespace (a
//! container sharing the temp directory), are never touched.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
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
    if let Some(owner) = ProcessIdentity::of(std::process::id()) {
        std::fs::write(dir.path().join(OWNER_FILE), owner.to_line())?;
    }
    Ok(TempDirGuard(Some(dir)))
}

/// The file in a temporary directory that names the process owning it.
const OWNER_FILE: &str = ".refract-owner";

/// The prefix of every temporary directory Refract makes.
const TEMP_PREFIX: &str = "refract-";

/// A process, told apart from a later one given the same id: its id, its
/// start time in clock ticks since boot (Linux's `/proc/PID/stat`), and
/// the machine boot and pid namespace it runs in ([`world`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcessIdentity {
    pid: u32,
    started: u64,
    world: String,
}

/// This boot of the machine and this process's pid namespace, as one
/// token: a pid names the same process only within both. Containers that
/// share a temp directory but not a pid namespace see each other's pids
/// as free; their directories must not look abandoned.
fn world() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let namespace = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!(
        "{}/{}",
        boot.trim(),
        namespace.to_string_lossy().replace(char::is_whitespace, "")
    ))
}

impl ProcessIdentity {
    /// The running process `pid` (in this pid namespace), or `None` if
    /// there is none (or no `/proc` to ask).
    fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name, in parentheses, may hold spaces: fields are
        // counted after its closing parenthesis (state is field 3).
        let after_name = stat.rsplit_once(')')?.1;
        let mut fields = after_name.split_whitespace();
        let state = fields.next()?;
        if state == "Z" || state == "X" {
            return None;
        }
        let started = fields.nth(18)?.parse().ok()?;
        Some(Self {
            pid,
            started,
            world: world()?,
        })
    }

    fn to_line(&self) -> String {
        format!("{} {} {}\n", self.pid, self.started, self.world)
    }

    fn parse(line: &str) -> Option<Self> {
        let mut parts = line.split_whitespace();
        let pid = parts.next()?.parse().ok()?;
        let started = parts.next()?.parse().ok()?;
        let world = parts.next()?.to_string();
        Some(Self {
            pid,
            started,
            world,
        })
    }

    /// Whether this process is known to have ended: it ran in this boot
    /// and pid namespace (`here`), and no process of its id and start time
    /// runs now. An owner from elsewhere is never known dead.
    fn is_gone(&self, here: &str) -> bool {
        self.world == here && Self::of(self.pid).as_ref() != Some(self)
    }
}

/// What a sweep removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Directories removed.
    pub directories: usize,
    /// Bytes they held.
    pub bytes: u64,
}

/// Removes the temporary directories in `temp` that Refract processes now
/// gone left behind (see the module doc). Needs `/proc` to tell a live
/// owner; without it nothing is removed.
pub fn sweep_abandoned_temp_dirs(temp: &Path) -> Swept {
    let mut swept = Swept::default();
    let Some(here) = ProcessIdentity::of(std::process::id()).map(|me| me.world) else {
        return swept;
    };
    // Only this user's directories: another user's are theirs to judge,
    // and one made to look like Refract's must not be acted on.
    let Ok(me) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
        return swept;
    };
    let Ok(entries) = std::fs::read_dir(temp) else {
        return swept;
    };
    for entry in entries.flatten() {
        let owned_by_refract = entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX)
            && entry.file_type().is_ok_and(|t| t.is_dir())
            && entry.metadata().is_ok_and(|m| m.uid() == me);
        if !owned_by_refract {
            continue;
        }
        let dir = entry.path();
        let Ok(line) = std::fs::read_to_string(dir.join(OWNER_FILE)) else {
            continue;
        };
        match ProcessIdentity::parse(&line) {
            Some(owner) if owner.is_gone(&here) => {
                let bytes = size_of_tree(&dir);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {
                        swept.directories += 1;
                        swept.bytes += bytes;
                    }
                    Err(error) => {
                        tracing::debug!(%error, dir = %dir.display(), "cannot remove an abandoned temporary directory");
                    }
                }
            }
            _ => {}
        }
    }
    swept
}

/// The bytes of the files under `dir` (what removing it frees).
fn size_of_tree(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(t) if t.is_dir() => size_of_tree(&entry.path()),
            Ok(_) => entry.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
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
    fn directories_of_dead_owners_are_swept_and_others_kept() {
        let temp = tempfile::tempdir().expect("a temp dir");
        let make = |name: &str, owner: Option<String>| {
            let dir = temp.path().join(name);
            std::fs::create_dir(&dir).expect("mkdir");
            std::fs::write(dir.join("payload"), vec![0u8; 1000]).expect("write");
            if let Some(line) = owner {
                std::fs::write(dir.join(OWNER_FILE), line).expect("write");
            }
            dir
        };
        let me = ProcessIdentity::of(std::process::id()).expect("this process");
        // A process that has exited: its id is free (or a later process's).
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let child_pid = child.id();
        child.wait().expect("wait");
        let dead = ProcessIdentity {
            pid: child_pid,
            started: 1,
            world: me.world.clone(),
        };
        let reused_pid = ProcessIdentity {
            pid: me.pid,
            started: me.started + 1,
            world: me.world.clone(),
        };
        let elsewhere = ProcessIdentity {
            world: format!("another-boot/{}", me.world),
            ..dead.clone()
        };
        let live = make("refract-staging-live", Some(me.to_line()));
        let gone = make("refract-staging-gone", Some(dead.to_line()));
        let reused = make("refract-spill-reused", Some(reused_pid.to_line()));
        let unmarked = make("refract-staging-old", None);
        let garbled = make("refract-spill-garbled", Some("not a pid".to_string()));
        let other_container = make("refract-spill-elsewhere", Some(elsewhere.to_line()));
        let foreign = make("other-gone", Some(dead.to_line()));

        let swept = sweep_abandoned_temp_dirs(temp.path());
        assert_eq!(swept.directories, 2);
        assert!(swept.bytes >= 2000, "{swept:?}");
        assert!(!gone.exists() && !reused.exists());
        for kept in [live, unmarked, garbled, foreign, other_container] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
    }

    #[test]
    fn temporary_directories_name_their_owner() {
        let dir = private_temp_dir("refract-test-").expect("created");
        let line = std::fs::read_to_string(dir.path().join(OWNER_FILE)).expect("owner file");
        let owner = ProcessIdentity::parse(&line).expect("parses");
        assert_eq!(owner.pid, std::process::id());
        let here = world().expect("this machine has /proc");
        assert_eq!(owner.world, here);
        assert!(!owner.is_gone(&here));
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
