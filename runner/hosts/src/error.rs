//! What can go wrong between a coordinator and its shard hosts.

use thiserror::Error;

/// Why the control plane refused, failed or lost something.
#[derive(Debug, Error)]
pub enum HostsError {
    /// The shared secret could not be read, or is too short to be one.
    #[error("the cluster secret {path}: {reason}")]
    Secret {
        /// Where it was looked for.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// The other end does not know the shared secret.
    #[error("{0}")]
    Unauthenticated(String),
    /// A message no well-behaved peer sends.
    #[error("malformed control message: {0}")]
    Malformed(String),
    /// The coordinator could not be reached, or its stream broke.
    #[error("the coordinator at {address}: {reason}")]
    Coordinator {
        /// Where it was dialled.
        address: String,
        /// What went wrong.
        reason: String,
    },
    /// The host a command was for is gone.
    #[error("shard host {0} is gone")]
    HostGone(u64),
    /// The coordinator's server could not listen.
    #[error("the coordinator cannot listen for shard hosts on {addr}: {source}")]
    Listen {
        /// Where it tried.
        addr: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// A staged file could not be fetched or kept.
    #[error("fetching staged file {sha256}: {reason}")]
    Fetch {
        /// The file's content hash.
        sha256: String,
        /// What went wrong.
        reason: String,
    },
    /// The kernel gave no randomness.
    #[error("no randomness: {0}")]
    Randomness(String),
}
