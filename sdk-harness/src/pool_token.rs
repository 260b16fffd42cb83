//! The credential a Refract server shows a `refract worker-pool`: whoever
//! can call a pool's `StartWorker` has it run the boot program against a
//! provision service of their choosing, which is running code on the
//! pool's host. Beam's pool protocol carries no credential, so the token
//! travels in a gRPC header Beam's own pools ignore; a Refract pool given
//! one refuses calls without it.

use std::path::Path;

use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::error::HarnessError;

/// The header the token travels in.
pub const POOL_TOKEN_HEADER: &str = "x-refract-pool-token";

/// The shortest token accepted: guessing one must be hopeless.
const MIN_TOKEN_BYTES: usize = 16;

/// The environment variable a token may come in instead of a file, as
/// Kubernetes hands a Secret to a container that does not run as root (a
/// Secret's files are root's): a process's environment is readable by its
/// user only.
pub const POOL_TOKEN_ENV: &str = "REFRACT_POOL_TOKEN";

/// A shared secret between a server and its worker pools (read from a
/// file or the environment, never from a flag: a command line is readable
/// by every user).
#[derive(Clone)]
pub struct PoolToken(String);

impl std::fmt::Debug for PoolToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolToken(***)")
    }
}

impl PoolToken {
    /// The token in the file at `path` (its first line, trimmed). The file
    /// must be readable by its owner only, and the token at least 16
    /// bytes long.
    pub fn read_file(path: &Path) -> Result<PoolToken, HarnessError> {
        let text = read_private_file(path)?;
        Self::parse(text.lines().next().unwrap_or_default())
            .map_err(|reason| refuse_file(path, reason))
    }

    /// The token in [`POOL_TOKEN_ENV`], if it is set (the same rules as a
    /// file's first line), taken out of this process's environment so that
    /// no process it starts inherits it: SDK workers run the job's code.
    /// Call it before any other thread runs (changing the environment is
    /// not safe while another thread may read it).
    pub fn take_from_env() -> Result<Option<PoolToken>, HarnessError> {
        let Some(text) = std::env::var_os(POOL_TOKEN_ENV) else {
            return Ok(None);
        };
        std::env::remove_var(POOL_TOKEN_ENV);
        let refuse = |reason: String| HarnessError::PoolToken {
            from: format!("${POOL_TOKEN_ENV}"),
            reason,
        };
        let text = text
            .into_string()
            .map_err(|_| refuse("not UTF-8".to_string()))?;
        Self::parse(&text).map(Some).map_err(refuse)
    }

    /// A token from its text, trimmed: at least 16 bytes of printable
    /// ASCII (it travels in a header).
    fn parse(text: &str) -> Result<PoolToken, String> {
        let token = text.trim().to_string();
        if token.len() < MIN_TOKEN_BYTES {
            return Err(format!(
                "the token is {} bytes; at least {MIN_TOKEN_BYTES}",
                token.len()
            ));
        }
        if tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(token.as_str())
            .is_err()
        {
            return Err("the token is not printable ASCII".to_string());
        }
        Ok(PoolToken(token))
    }

    /// The token of `file` if one is given, else `from_env` (what
    /// [`Self::take_from_env`] found).
    pub fn from_file_or(
        file: Option<&Path>,
        from_env: Option<&PoolToken>,
    ) -> Result<Option<PoolToken>, HarnessError> {
        match file {
            Some(path) => Self::read_file(path).map(Some),
            None => Ok(from_env.cloned()),
        }
    }

    /// Adds the token to a call's headers.
    pub(crate) fn attach<T>(&self, request: &mut tonic::Request<T>) {
        if let Ok(value) = self.0.parse() {
            request.metadata_mut().insert(POOL_TOKEN_HEADER, value);
        }
    }

    /// Whether `headers` carry this token; the comparison takes the same
    /// time wherever the first difference is.
    fn is_shown_in(&self, headers: &MetadataMap) -> bool {
        let shown = headers
            .get(POOL_TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        let expected = self.0.as_bytes();
        shown.len() == expected.len()
            && shown
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// The callers a worker pool serves, each with a token of its own: a pool
/// shared by several servers (or teams) tells them apart, so that one
/// cannot stop or replace the workers another started.
#[derive(Debug, Clone)]
pub struct PoolCallers(Vec<PoolToken>);

/// Which of a pool's callers made a call: the place of its token among the
/// pool's. Every caller is the same one when the pool takes no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCaller(usize);

impl PoolCaller {
    /// The caller of a pool that takes no token: whoever reaches its port.
    pub const ANYONE: PoolCaller = PoolCaller(0);
}

impl PoolCallers {
    /// The tokens in the file at `path`, one per non-empty line, each under
    /// the rules of [`PoolToken::read_file`]; two callers may not share
    /// one.
    pub fn read_file(path: &Path) -> Result<PoolCallers, HarnessError> {
        let text = read_private_file(path)?;
        let mut tokens: Vec<PoolToken> = Vec::new();
        for (number, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let token = PoolToken::parse(line)
                .map_err(|reason| refuse_file(path, format!("line {}: {reason}", number + 1)))?;
            if tokens.iter().any(|t| t.0 == token.0) {
                return Err(refuse_file(
                    path,
                    format!("line {}: the same token as an earlier line", number + 1),
                ));
            }
            tokens.push(token);
        }
        if tokens.is_empty() {
            return Err(refuse_file(path, "it holds no token".to_string()));
        }
        Ok(PoolCallers(tokens))
    }

    /// The tokens of `file` if one is given, else the one caller of
    /// `from_env` (what [`PoolToken::take_from_env`] found).
    pub fn from_file_or(
        file: Option<&Path>,
        from_env: Option<&PoolToken>,
    ) -> Result<Option<PoolCallers>, HarnessError> {
        match file {
            Some(path) => Self::read_file(path).map(Some),
            None => Ok(from_env.map(|token| PoolCallers(vec![token.clone()]))),
        }
    }

    /// How many callers the pool has.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the pool has no callers (never, once read).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The caller whose token `headers` carry. Every token is compared, so
    /// the time taken does not tell which one came close.
    #[allow(clippy::result_large_err)]
    pub(crate) fn identify(&self, headers: &MetadataMap) -> Result<PoolCaller, Status> {
        let mut found = None;
        for (place, token) in self.0.iter().enumerate() {
            if token.is_shown_in(headers) {
                found = Some(PoolCaller(place));
            }
        }
        found.ok_or_else(unauthenticated)
    }
}

/// The refusal of a call without a token the pool knows.
fn unauthenticated() -> Status {
    Status::unauthenticated(format!(
        "this worker pool needs a token of its --token_file (or ${POOL_TOKEN_ENV}) in the \
         {POOL_TOKEN_HEADER} header (refract serve --worker_pool_token_file or \
         ${POOL_TOKEN_ENV})"
    ))
}

/// The longest token file read: a few tokens, not a log someone pointed
/// the flag at.
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

fn refuse_file(path: &Path, reason: String) -> HarnessError {
    HarnessError::PoolToken {
        from: format!("the file {}", path.display()),
        reason,
    }
}

/// The text of a token file, which must be a regular file only its owner
/// can read.
fn read_private_file(path: &Path) -> Result<String, HarnessError> {
    let refuse = |reason: String| refuse_file(path, reason);
    let meta = std::fs::metadata(path).map_err(|e| refuse(e.to_string()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(refuse(format!(
                "its mode is {:o}: other users can read it (chmod 600)",
                mode & 0o777
            )));
        }
    }
    if !meta.is_file() {
        return Err(refuse("not a regular file".to_string()));
    }
    if meta.len() > MAX_TOKEN_FILE_BYTES {
        return Err(refuse(format!(
            "it is {} bytes; a token file holds at most {MAX_TOKEN_FILE_BYTES}",
            meta.len()
        )));
    }
    std::fs::read_to_string(path).map_err(|e| refuse(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn token_file(dir: &Path, text: &str, mode: u32) -> std::path::PathBuf {
        let path = dir.join("token");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_token_file_must_be_private_and_the_token_long() {
        let dir = tempfile::tempdir().unwrap();
        let good = "0123456789abcdef0123\n";
        assert!(PoolToken::read_file(&token_file(dir.path(), good, 0o600)).is_ok());
        let shared = PoolToken::read_file(&token_file(dir.path(), good, 0o644)).unwrap_err();
        assert!(shared.to_string().contains("chmod 600"), "{shared}");
        let short = PoolToken::read_file(&token_file(dir.path(), "abc", 0o600)).unwrap_err();
        assert!(short.to_string().contains("at least 16"), "{short}");
        assert!(PoolToken::read_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn a_token_from_text_is_trimmed_long_and_printable() {
        assert_eq!(
            PoolToken::parse(" 0123456789abcdef \n").map(|t| t.0),
            Ok("0123456789abcdef".to_string())
        );
        assert!(PoolToken::parse("short")
            .unwrap_err()
            .contains("at least 16"));
        assert!(PoolToken::parse("0123456789abcdef\u{7}")
            .unwrap_err()
            .contains("printable"));
    }

    #[test]
    fn only_a_known_token_passes_and_names_its_caller() {
        let dir = tempfile::tempdir().unwrap();
        let file = token_file(dir.path(), "0123456789abcdef\n\nfedcba9876543210\n", 0o600);
        let callers = PoolCallers::read_file(&file).unwrap();
        assert_eq!(callers.len(), 2);
        let first = PoolToken::read_file(&file).unwrap();
        let mut request = tonic::Request::new(());
        assert!(callers.identify(request.metadata()).is_err());
        first.attach(&mut request);
        assert_eq!(callers.identify(request.metadata()).unwrap(), PoolCaller(0));
        let mut second = tonic::Request::new(());
        second
            .metadata_mut()
            .insert(POOL_TOKEN_HEADER, "fedcba9876543210".parse().unwrap());
        assert_eq!(callers.identify(second.metadata()).unwrap(), PoolCaller(1));
        let mut other = tonic::Request::new(());
        other
            .metadata_mut()
            .insert(POOL_TOKEN_HEADER, "0123456789abcdeX".parse().unwrap());
        let refused = callers.identify(other.metadata()).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert_eq!(format!("{first:?}"), "PoolToken(***)");
    }

    #[test]
    fn a_callers_file_refuses_short_repeated_or_missing_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let read = |text: &str| {
            PoolCallers::read_file(&token_file(dir.path(), text, 0o600))
                .unwrap_err()
                .to_string()
        };
        let short = read("0123456789abcdef\nabc\n");
        assert!(
            short.contains("line 2") && short.contains("at least 16"),
            "{short}"
        );
        let twice = read("0123456789abcdef\n0123456789abcdef\n");
        assert!(twice.contains("line 2: the same token"), "{twice}");
        assert!(read("\n\n").contains("no token"));
        let big = "0123456789abcdef\n".repeat(5000);
        assert!(read(&big).contains("at most"));
    }
}
