//! Errors that end the job service itself (as opposed to one RPC, which gets
//! a gRPC status instead).

use std::path::PathBuf;

/// Why [`crate::serve`] could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum JobServiceError {
    /// The staging directory could not be created or resolved; without it no
    /// job with artifacts can be accepted, so the service refuses to start.
    #[error("cannot prepare staging directory {path}: {source}")]
    StagingDir {
        /// The configured directory.
        path: PathBuf,
        /// The underlying I/O failure.
        source: std::io::Error,
    },
    /// The listener's own address could not be read; it is needed to tell
    /// clients where to stage artifacts.
    #[error("cannot read the listener's local address: {0}")]
    LocalAddr(std::io::Error),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] refract_proto::tonic::transport::Error),
}
