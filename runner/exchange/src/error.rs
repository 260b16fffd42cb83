//! What can go wrong in the exchange.

use thiserror::Error;

/// Why the exchange refused a stream, could not start, or lost a
/// connection.
#[derive(Debug, Error)]
pub enum ExchangeError {
    /// A message no well-behaved shard sends.
    #[error("malformed exchange message: {0}")]
    Malformed(String),
    /// A stream named a session this server does not host.
    #[error("no exchange session of that name here")]
    UnknownSession,
    /// A stream named a shard the session does not have here.
    #[error("{0}")]
    UnknownShard(String),
    /// A second stream from the same sender to the same receiver.
    #[error("a stream from shard {from} to shard {to} is open already")]
    Duplicate {
        /// The sender.
        from: u32,
        /// The receiver.
        to: u32,
    },
    /// The exchange's server could not listen.
    #[error("the exchange cannot listen on {addr}: {source}")]
    Listen {
        /// Where it tried.
        addr: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The kernel gave no randomness for a session's secret.
    #[error("no randomness for the exchange session's secret: {0}")]
    Randomness(String),
}

impl From<ExchangeError> for tonic::Status {
    fn from(error: ExchangeError) -> Self {
        match &error {
            ExchangeError::Malformed(_) => tonic::Status::invalid_argument(error.to_string()),
            ExchangeError::UnknownSession => tonic::Status::permission_denied(error.to_string()),
            ExchangeError::UnknownShard(_) => tonic::Status::not_found(error.to_string()),
            ExchangeError::Duplicate { .. } => tonic::Status::already_exists(error.to_string()),
            ExchangeError::Listen { .. } | ExchangeError::Randomness(_) => {
                tonic::Status::internal(error.to_string())
            }
        }
    }
}
