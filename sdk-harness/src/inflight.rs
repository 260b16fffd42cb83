//! The instructions in flight on one worker, keyed by instruction id, and the
//! routing of everything the SDK sends back (responses, output data, timers)
//! to them.
//!
//! One lock guards both the table and the "closed" flag, so a bundle can never
//! be registered on a worker whose connection is already gone and then wait
//! forever.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use refract_proto::fn_api::{Elements, InstructionResponse};
use tokio::sync::oneshot;

use crate::bundle::{BundleResult, StateHandler};
use crate::collector::{BundleCollector, Progress};
use crate::error::BundleError;

/// Receives the outcome of a bundle.
pub(crate) type BundleOutcome = oneshot::Receiver<Result<BundleResult, BundleError>>;
/// Receives the outcome of a non-bundle instruction.
pub(crate) type ControlOutcome = oneshot::Receiver<Result<InstructionResponse, BundleError>>;

enum Pending {
    Bundle {
        collector: Box<BundleCollector>,
        done: oneshot::Sender<Result<BundleResult, BundleError>>,
    },
    Control(oneshot::Sender<Result<InstructionResponse, BundleError>>),
}

impl Pending {
    fn fail(self, error: BundleError) {
        // A dropped receiver means the caller gave up; nothing to tell.
        match self {
            Pending::Bundle { done, .. } => {
                let _ = done.send(Err(error));
            }
            Pending::Control(done) => {
                let _ = done.send(Err(error));
            }
        }
    }
}

#[derive(Default)]
struct Table {
    closed: Option<String>,
    entries: HashMap<String, Pending>,
}

/// The in-flight instructions of one worker.
pub(crate) struct Inflight {
    worker_id: String,
    table: Mutex<Table>,
}

impl Inflight {
    /// An empty table for `worker_id` (used in log lines).
    pub(crate) fn new(worker_id: &str) -> Self {
        Self {
            worker_id: worker_id.to_string(),
            table: Mutex::new(Table::default()),
        }
    }

    /// Tracks a bundle; fails if the worker is gone or the id is in use.
    pub(crate) fn register_bundle(
        &self,
        instruction_id: &str,
        collector: BundleCollector,
    ) -> Result<BundleOutcome, BundleError> {
        let (done, outcome) = oneshot::channel();
        self.insert(
            instruction_id,
            Pending::Bundle {
                collector: Box::new(collector),
                done,
            },
        )?;
        Ok(outcome)
    }

    /// Tracks a non-bundle instruction; fails if the worker is gone or the id is in use.
    pub(crate) fn register_control(
        &self,
        instruction_id: &str,
    ) -> Result<ControlOutcome, BundleError> {
        let (done, outcome) = oneshot::channel();
        self.insert(instruction_id, Pending::Control(done))?;
        Ok(outcome)
    }

    fn insert(&self, instruction_id: &str, pending: Pending) -> Result<(), BundleError> {
        let mut table = self.table.lock();
        if let Some(reason) = &table.closed {
            return Err(BundleError::Disconnected(reason.clone()));
        }
        if table.entries.contains_key(instruction_id) {
            return Err(BundleError::Protocol(format!(
                "instruction id {instruction_id} is already in flight on worker {}",
                self.worker_id
            )));
        }
        table.entries.insert(instruction_id.to_string(), pending);
        Ok(())
    }

    /// Routes an InstructionResponse to its instruction.
    pub(crate) fn on_response(&self, response: InstructionResponse) {
        let mut table = self.table.lock();
        let id = response.instruction_id.clone();
        let Some(pending) = table.entries.get_mut(&id) else {
            tracing::debug!(
                worker_id = %self.worker_id,
                instruction_id = %id,
                "response for an instruction nobody waits for"
            );
            return;
        };
        match pending {
            Pending::Bundle { collector, .. } => {
                let progress = collector.on_response(response);
                Self::settle(&mut table, &id, progress);
            }
            Pending::Control(_) => {
                if let Some(Pending::Control(done)) = table.entries.remove(&id) {
                    let outcome = if response.error.is_empty() {
                        Ok(response)
                    } else {
                        Err(BundleError::Sdk(response.error))
                    };
                    let _ = done.send(outcome);
                }
            }
        }
    }

    /// Routes every entry of an Elements message to its bundle.
    pub(crate) fn on_elements(&self, elements: Elements) {
        let mut table = self.table.lock();
        for data in elements.data {
            let id = data.instruction_id.clone();
            match table.entries.get_mut(&id) {
                Some(Pending::Bundle { collector, .. }) => {
                    let progress = collector.on_data(data);
                    Self::settle(&mut table, &id, progress);
                }
                _ => tracing::debug!(
                    worker_id = %self.worker_id,
                    instruction_id = %id,
                    transform_id = %data.transform_id,
                    "dropping data for an instruction that is not in flight"
                ),
            }
        }
        for timers in elements.timers {
            let id = timers.instruction_id.clone();
            match table.entries.get_mut(&id) {
                Some(Pending::Bundle { collector, .. }) => {
                    let progress = collector.on_timers(timers);
                    Self::settle(&mut table, &id, progress);
                }
                _ => tracing::debug!(
                    worker_id = %self.worker_id,
                    instruction_id = %id,
                    transform_id = %timers.transform_id,
                    "dropping timers for an instruction that is not in flight"
                ),
            }
        }
    }

    fn settle(table: &mut Table, id: &str, progress: Progress) {
        if let Progress::Done(outcome) = progress {
            if let Some(Pending::Bundle { done, .. }) = table.entries.remove(id) {
                let _ = done.send(*outcome);
            }
        }
    }

    /// The state handler of a bundle in flight, if any.
    pub(crate) fn state_handler(&self, instruction_id: &str) -> Option<Arc<dyn StateHandler>> {
        match self.table.lock().entries.get(instruction_id) {
            Some(Pending::Bundle { collector, .. }) => Some(collector.state_handler()),
            _ => None,
        }
    }

    /// Fails one instruction (e.g. its input could not be sent).
    pub(crate) fn fail(&self, instruction_id: &str, error: BundleError) {
        let pending = self.table.lock().entries.remove(instruction_id);
        if let Some(pending) = pending {
            pending.fail(error);
        }
    }

    /// Stops tracking an instruction whose caller went away.
    pub(crate) fn forget(&self, instruction_id: &str) {
        self.table.lock().entries.remove(instruction_id);
    }

    /// Marks the worker gone and fails everything in flight with
    /// `Disconnected(reason)`. Later registrations fail at once. Idempotent:
    /// the first reason is kept.
    pub(crate) fn close(&self, reason: &str) {
        let drained: Vec<Pending> = {
            let mut table = self.table.lock();
            if table.closed.is_none() {
                table.closed = Some(reason.to_string());
            }
            table.entries.drain().map(|(_, p)| p).collect()
        };
        if !drained.is_empty() {
            tracing::warn!(
                worker_id = %self.worker_id,
                count = drained.len(),
                reason,
                "failing in-flight instructions of a disconnected worker"
            );
        }
        for pending in drained {
            pending.fail(BundleError::Disconnected(reason.to_string()));
        }
    }
}
