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
        let refuse = |reason: String| HarnessError::PoolToken {
            from: format!("the file {}", path.display()),
            reason,
        };
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
        let text = std::fs::read_to_string(path).map_err(|e| refuse(e.to_string()))?;
        Self::parse(text.lines().next().unwrap_or_default()).map_err(refuse)
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
    // `Status` is large, but it is what every tonic handler returns.
    #[allow(clippy::result_large_err)]
    pub(crate) fn check(&self, headers: &MetadataMap) -> Result<(), Status> {
        let shown = headers
            .get(POOL_TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        let expected = self.0.as_bytes();
        let differs = shown.len() != expected.len()
            || shown
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                != 0;
        if differs {
            return Err(Status::unauthenticated(format!(
                "this worker pool needs its token (--token_file or ${POOL_TOKEN_ENV}) in the \
                 {POOL_TOKEN_HEADER} header (refract serve --worker_pool_token_file or \
                 ${POOL_TOKEN_ENV})"
            )));
        }
        Ok(())
    }
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
    fn only_the_same_token_passes() {
        let dir = tempfile::tempdir().unwrap();
        let token =
            PoolToken::read_file(&token_file(dir.path(), "0123456789abcdef", 0o600)).unwrap();
        let mut request = tonic::Request::new(());
        assert!(token.check(request.metadata()).is_err());
        token.attach(&mut request);
        assert!(token.check(request.metadata()).is_ok());
        let mut other = tonic::Request::new(());
        other
            .metadata_mut()
            .insert(POOL_TOKEN_HEADER, "0123456789abcdeX".parse().unwrap());
        let refused = token.check(other.metadata()).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert_eq!(format!("{token:?}"), "PoolToken(***)");
    }
}
