//! A started SDK harness worker: run bundles and other instructions on it,
//! and stop it.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use refract_proto::fn_api::{
    instruction_request, FinalizeBundleRequest, InstructionRequest, InstructionResponse,
    ProcessBundleRequest,
};
use tokio::sync::mpsc;

use crate::bundle::{BundleRequest, BundleResult};
use crate::collector::BundleCollector;
use crate::endpoint::Endpoint;
use crate::environment::Launched;
use crate::error::BundleError;
use crate::framing::InputFrames;
use crate::link::WorkerLink;

/// One connected SDK harness worker. Many bundles may run on it at once.
pub struct Worker {
    /// Keeps the server's port serving while the worker lives, and takes
    /// the worker out of its routing when it stops.
    endpoint: Arc<Endpoint>,
    link: Arc<WorkerLink>,
    launched: tokio::sync::Mutex<Option<Launched>>,
}

impl Worker {
    /// The worker behind `link`, started as `launched`, routed (and kept
    /// served) by `endpoint`.
    pub(crate) fn new(endpoint: Arc<Endpoint>, link: Arc<WorkerLink>, launched: Launched) -> Self {
        Self {
            endpoint,
            link,
            launched: tokio::sync::Mutex::new(Some(launched)),
        }
    }

    /// The worker id (as in the SDK's `worker_id` header).
    pub fn id(&self) -> &str {
        self.link.id()
    }

    /// Why the worker can no longer run instructions, if it cannot; lets a
    /// scheduler replace a dead worker before sending it work.
    pub fn disconnected(&self) -> Option<String> {
        self.link.closed_reason()
    }

    /// Runs one bundle: sends the ProcessBundleRequest first, then the input
    /// (without making the request wait for it), and returns once the response
    /// and every expected sink and timer `is_last` arrived. An SDK error ends
    /// it at once. Dropping the future abandons the bundle.
    pub async fn process_bundle(&self, req: BundleRequest) -> Result<BundleResult, BundleError> {
        self.process_bundle_counted(req, Arc::default()).await
    }

    /// [`Self::process_bundle`], adding the bytes of output the bundle
    /// sends back to `received` as they arrive (all of a bundle's output
    /// waits in memory until it ends: a caller may split a bundle whose
    /// output grows too large).
    pub async fn process_bundle_counted(
        &self,
        req: BundleRequest,
        received: Arc<AtomicU64>,
    ) -> Result<BundleResult, BundleError> {
        let BundleRequest {
            instruction_id,
            descriptor_id,
            inputs,
            timers,
            expected_sinks,
            expected_timer_families,
            state,
            overflow,
        } = req;
        let collector = BundleCollector::new(
            expected_sinks,
            expected_timer_families.iter().cloned(),
            state,
            received,
            overflow,
        );
        let outcome = self
            .link
            .inflight()
            .register_bundle(&instruction_id, collector)?;
        let guard = ForgetOnDrop {
            link: &self.link,
            instruction_id: &instruction_id,
        };
        let data = self.link.data_sender()?;
        self.link.send_instruction(InstructionRequest {
            instruction_id: instruction_id.clone(),
            request: Some(instruction_request::Request::ProcessBundle(
                ProcessBundleRequest {
                    process_bundle_descriptor_id: descriptor_id,
                    ..Default::default()
                },
            )),
        })?;
        let frames = InputFrames::new(
            instruction_id.clone(),
            inputs,
            timers,
            &expected_timer_families,
        );
        tokio::spawn(send_input(
            Arc::clone(&self.link),
            instruction_id.clone(),
            data,
            frames,
        ));
        let result = outcome.await.unwrap_or_else(|_| {
            Err(BundleError::Disconnected(format!(
                "bundle {instruction_id} was dropped by worker {}",
                self.id()
            )))
        });
        drop(guard);
        result
    }

    /// Tells the SDK to run the finalization callbacks of a committed bundle
    /// whose response had `requires_finalization`.
    pub async fn finalize_bundle(&self, instruction_id: &str) -> Result<(), BundleError> {
        self.instruct(instruction_request::Request::FinalizeBundle(
            FinalizeBundleRequest {
                instruction_id: instruction_id.to_string(),
            },
        ))
        .await
        .map(|_| ())
    }

    /// Sends any other instruction (progress, split, monitoring metadata …)
    /// under a fresh instruction id and returns the SDK's response; an SDK
    /// error becomes [`BundleError::Sdk`].
    pub async fn instruct(
        &self,
        request: instruction_request::Request,
    ) -> Result<InstructionResponse, BundleError> {
        let instruction_id = format!("control-{}", uuid::Uuid::new_v4().simple());
        let outcome = self.link.inflight().register_control(&instruction_id)?;
        let guard = ForgetOnDrop {
            link: &self.link,
            instruction_id: &instruction_id,
        };
        self.link.send_instruction(InstructionRequest {
            instruction_id: instruction_id.clone(),
            request: Some(request),
        })?;
        let result = outcome.await.unwrap_or_else(|_| {
            Err(BundleError::Disconnected(format!(
                "instruction {instruction_id} was dropped by worker {}",
                self.id()
            )))
        });
        drop(guard);
        result
    }

    /// Stops the worker: fails what is in flight, closes its streams, then
    /// StopWorker (EXTERNAL) or kills the process (PROCESS, DOCKER).
    /// Idempotent.
    pub async fn stop(&self) {
        self.link
            .close(&format!("worker {} was stopped", self.id()));
        self.endpoint.hub().remove(&self.link);
        let launched = self.launched.lock().await.take();
        if let Some(launched) = launched {
            tracing::info!(worker_id = %self.id(), "stopping worker");
            launched.stop().await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.link
            .close(&format!("worker {} was dropped", self.link.id()));
        self.endpoint.hub().remove(&self.link);
        if let Some(launched) = self.launched.get_mut().take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(launched.stop());
                }
                Err(_) => tracing::warn!(
                    worker_id = %self.link.id(),
                    "worker dropped outside a runtime; it may outlive the runner"
                ),
            }
        }
    }
}

/// Stops tracking an instruction if its caller goes away before the end.
struct ForgetOnDrop<'a> {
    link: &'a WorkerLink,
    instruction_id: &'a str,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        self.link.inflight().forget(self.instruction_id);
    }
}

/// Sends a bundle's input in order. Runs on its own task so an abandoned
/// bundle still gets its `is_last`s (the SDK would wait for them forever).
async fn send_input(
    link: Arc<WorkerLink>,
    instruction_id: String,
    data: mpsc::Sender<refract_proto::fn_api::Elements>,
    frames: InputFrames,
) {
    for message in frames {
        if data.send(message).await.is_err() {
            link.inflight().fail(
                &instruction_id,
                BundleError::Disconnected(format!(
                    "the data stream of worker {} closed before the input of {instruction_id} was sent",
                    link.id()
                )),
            );
            return;
        }
    }
}
