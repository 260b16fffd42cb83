//! The runtime object-store calls run on: the store's callers are
//! synchronous (the engine's writer threads, `spawn_blocking` tasks, a
//! server's start), and the `object_store` crate is async, so each store
//! keeps a small runtime of its own and blocks on it.

use std::future::Future;

use crate::StoreError;

/// A store's own runtime; shut down in the background when dropped, on
/// any thread (an async one included).
#[derive(Debug)]
pub(crate) struct ObjectRuntime {
    runtime: Option<tokio::runtime::Runtime>,
}

impl ObjectRuntime {
    /// Two threads named `refract-object-store`.
    pub(crate) fn new() -> Result<Self, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("refract-object-store")
            .enable_all()
            .build()
            .map_err(|e| backend("starting its runtime", e))?;
        Ok(ObjectRuntime {
            runtime: Some(runtime),
        })
    }

    /// Runs `work` on the runtime and waits for it.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| backend("closed", "no runtime"))?;
        futures::executor::block_on(runtime.spawn(work))
            .map_err(|e| backend("a call crashed", e))?
    }
}

impl Drop for ObjectRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// An object store's failure, saying what was being done.
pub(crate) fn backend(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("object store: {what}: {e}"))
}
