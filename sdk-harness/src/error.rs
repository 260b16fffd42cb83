//! Errors of this crate: one type for setting up servers and workers, one for
//! running instructions on a worker.

use std::time::Duration;

/// Why the Fn API server or a worker could not be set up.
///
/// The job service turns these into a FAILED job with a readable message, so
/// every variant says what went wrong and, where there is one, what to do.
#[derive(thiserror::Error, Debug)]
pub enum HarnessError {
    /// The server could not bind its listening socket.
    #[error("cannot bind the Fn API server on {host}: {source}")]
    Bind {
        /// The host we tried to bind.
        host: String,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A worker pool's boot program cannot be run.
    #[error("boot program {path}: {reason}")]
    BootProgram {
        /// The program's path, as given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A worker pool's gRPC server stopped with an error.
    #[error("the worker pool's server failed: {0}")]
    PoolServer(String),
    /// A worker pool token cannot be used.
    #[error("the worker pool token in {from}: {reason}")]
    PoolToken {
        /// Where it was read: a file as given, or the environment variable.
        from: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A worker id was used twice; ids route every gRPC call, so they must be unique.
    #[error("a worker with id {0:?} already exists")]
    DuplicateWorker(String),
    /// The environment's URN is not one Refract knows how to start.
    #[error("environment {urn:?} is not supported; use --environment_type=LOOPBACK, EXTERNAL, PROCESS or DOCKER")]
    UnsupportedEnvironment {
        /// The URN we could not handle.
        urn: String,
    },
    /// Embedded environments only work inside the SDK's own in-process runner.
    #[error("environment {urn:?} runs only inside the Python SDK's own runner; use --environment_type=LOOPBACK, EXTERNAL or PROCESS with Refract")]
    EmbeddedEnvironment {
        /// The embedded environment's URN.
        urn: String,
    },
    /// A DOCKER environment was requested on a machine without a Docker engine.
    #[error("DOCKER environments need a Docker engine, and none is reachable here; use --environment_type=LOOPBACK, EXTERNAL or PROCESS")]
    DockerUnavailable,
    /// A DOCKER environment names a Beam SDK image, no Docker engine is
    /// reachable, and its harness cannot run on this host either.
    #[error("no Docker engine is reachable, and {image} cannot run as a process here: {reason}")]
    NoHostHarness {
        /// The image, described.
        image: String,
        /// What is missing.
        reason: String,
    },
    /// The environment payload could not be decoded or lacks a required field.
    #[error("invalid payload for environment {urn:?}: {reason}")]
    InvalidPayload {
        /// The environment's URN.
        urn: String,
        /// What is wrong with the payload.
        reason: String,
    },
    /// Starting the worker failed before it could connect.
    #[error("cannot start worker {worker_id}: {reason}")]
    WorkerStart {
        /// The worker that failed.
        worker_id: String,
        /// Why it failed (for EXTERNAL, the pool's error text verbatim).
        reason: String,
    },
    /// A spawned worker process exited before it connected its control stream.
    #[error("worker {worker_id} exited ({status}) before connecting to the control service{}", stderr_suffix(.stderr_tail))]
    WorkerExited {
        /// The worker that exited.
        worker_id: String,
        /// Its exit status, as text.
        status: String,
        /// The last lines it wrote to stderr, to explain the exit.
        stderr_tail: String,
    },
    /// The worker did not connect its control stream in time.
    #[error("worker {worker_id} did not connect to the control service at {url} within {waited:?}{hint}")]
    ConnectTimeout {
        /// The worker that did not connect.
        worker_id: String,
        /// The address it was told to connect to.
        url: String,
        /// How long we waited.
        waited: Duration,
        /// What may be wrong, when something is known (empty otherwise).
        hint: String,
    },
    /// The worker connected, then went away before start-up finished.
    #[error("worker {worker_id} disconnected during start-up: {reason}")]
    StartupDisconnect {
        /// The worker that disconnected.
        worker_id: String,
        /// Why its link closed.
        reason: String,
    },
}

fn stderr_suffix(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("; its last stderr lines:\n{tail}")
    }
}

/// Why an instruction (a bundle, a finalization, …) sent to a worker failed.
///
/// Cloneable because one failure (a lost connection) is delivered to every
/// bundle in flight on that worker.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum BundleError {
    /// The SDK reported a failure: `InstructionResponse.error` verbatim (for
    /// Python a full traceback, which must reach the user untouched).
    #[error("{0}")]
    Sdk(String),
    /// The worker's connection went away (or the worker was stopped) before
    /// the instruction completed.
    #[error("SDK worker disconnected: {0}")]
    Disconnected(String),
    /// The SDK or the caller broke the Fn API protocol.
    #[error("Fn API protocol error: {0}")]
    Protocol(String),
    /// The bundle's output outgrew memory and could not be written where it
    /// overflows to (a full disk).
    #[error("keeping a bundle's output out of memory failed: {0}")]
    Overflow(String),
}
