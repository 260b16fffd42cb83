//! The runner's end of one worker: the queues towards the SDK's Control and
//! Data streams, the in-flight instructions, and the connection status.
//!
//! Outgoing messages are queued here before the SDK connects: the SDK opens
//! its Data stream only after its first ProcessBundleRequest, so bundle input
//! must wait in this queue rather than make the control send wait for it.

use std::sync::Arc;

use parking_lot::Mutex;
use refract_proto::fn_api::{Elements, InstructionRequest, ProvisionInfo};
use refract_proto::pipeline::ApiServiceDescriptor;
use tokio::sync::{mpsc, watch};

use crate::config::{ArtifactSource, LogSink, WorkerConfig};
use crate::error::BundleError;
use crate::inflight::Inflight;

/// Messages the data queue holds before senders wait (each up to ~4 MiB).
const DATA_QUEUE_MESSAGES: usize = 16;

/// Where a worker's connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkStatus {
    /// Started, control stream not yet connected.
    Waiting,
    /// The control stream is connected.
    Connected,
    /// Gone for good, with the reason.
    Closed(String),
}

/// Shared state of one worker, reached by the gRPC services through the
/// `worker_id` header and by [`crate::Worker`].
pub(crate) struct WorkerLink {
    id: String,
    provision: ProvisionInfo,
    artifacts: Arc<dyn ArtifactSource>,
    logs: Arc<dyn LogSink>,
    inflight: Inflight,
    control_tx: Mutex<Option<mpsc::UnboundedSender<InstructionRequest>>>,
    control_rx: Mutex<Option<mpsc::UnboundedReceiver<InstructionRequest>>>,
    data_tx: Mutex<Option<mpsc::Sender<Elements>>>,
    data_rx: Mutex<Option<mpsc::Receiver<Elements>>>,
    status: watch::Sender<LinkStatus>,
}

impl WorkerLink {
    /// A link for `config`, whose provisioning points at `url`.
    pub(crate) fn new(config: &WorkerConfig, url: &str) -> Arc<Self> {
        let endpoint = || {
            Some(ApiServiceDescriptor {
                url: url.to_string(),
                authentication: None,
            })
        };
        let mut provision = config.provision.clone();
        provision.control_endpoint = endpoint();
        provision.logging_endpoint = endpoint();
        provision.artifact_endpoint = endpoint();
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (data_tx, data_rx) = mpsc::channel(DATA_QUEUE_MESSAGES);
        Arc::new(Self {
            id: config.worker_id.clone(),
            provision,
            artifacts: Arc::clone(&config.artifacts),
            logs: Arc::clone(&config.logs),
            inflight: Inflight::new(&config.worker_id),
            control_tx: Mutex::new(Some(control_tx)),
            control_rx: Mutex::new(Some(control_rx)),
            data_tx: Mutex::new(Some(data_tx)),
            data_rx: Mutex::new(Some(data_rx)),
            status: watch::Sender::new(LinkStatus::Waiting),
        })
    }

    /// The worker id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Provisioning with our endpoints filled in.
    pub(crate) fn provision(&self) -> &ProvisionInfo {
        &self.provision
    }

    /// The worker's artifact files.
    pub(crate) fn artifacts(&self) -> &dyn ArtifactSource {
        self.artifacts.as_ref()
    }

    /// The worker's log destination.
    pub(crate) fn logs(&self) -> &dyn LogSink {
        self.logs.as_ref()
    }

    /// The worker's in-flight instructions.
    pub(crate) fn inflight(&self) -> &Inflight {
        &self.inflight
    }

    /// Hands the control queue to the SDK's Control stream (once) and marks
    /// the worker connected.
    pub(crate) fn attach_control(&self) -> Option<mpsc::UnboundedReceiver<InstructionRequest>> {
        if self.closed_reason().is_some() {
            return None;
        }
        let rx = self.control_rx.lock().take()?;
        self.status.send_if_modified(|s| {
            if *s == LinkStatus::Waiting {
                *s = LinkStatus::Connected;
                true
            } else {
                false
            }
        });
        Some(rx)
    }

    /// Hands the data queue to the SDK's Data stream (once).
    pub(crate) fn attach_data(&self) -> Option<mpsc::Receiver<Elements>> {
        if self.closed_reason().is_some() {
            return None;
        }
        self.data_rx.lock().take()
    }

    /// Queues an instruction for the Control stream; never waits.
    pub(crate) fn send_instruction(&self, request: InstructionRequest) -> Result<(), BundleError> {
        let guard = self.control_tx.lock();
        let sent = match guard.as_ref() {
            Some(tx) => tx.send(request).is_ok(),
            None => false,
        };
        drop(guard);
        if sent {
            Ok(())
        } else {
            Err(self.gone())
        }
    }

    /// A sender into the data queue.
    pub(crate) fn data_sender(&self) -> Result<mpsc::Sender<Elements>, BundleError> {
        self.data_tx.lock().clone().ok_or_else(|| self.gone())
    }

    fn gone(&self) -> BundleError {
        BundleError::Disconnected(
            self.closed_reason()
                .unwrap_or_else(|| format!("worker {} is not reachable", self.id)),
        )
    }

    /// Closes the worker for good: fails everything in flight, ends the
    /// outgoing streams (which tells the SDK to shut down). Idempotent.
    pub(crate) fn close(&self, reason: &str) {
        let first = self.status.send_if_modified(|s| {
            if matches!(s, LinkStatus::Closed(_)) {
                false
            } else {
                *s = LinkStatus::Closed(reason.to_string());
                true
            }
        });
        if first {
            tracing::info!(worker_id = %self.id, reason, "worker link closed");
        }
        self.inflight.close(reason);
        self.control_tx.lock().take();
        self.data_tx.lock().take();
        // Unattached queues go too, so pending sends fail instead of waiting
        // for a stream that will never come.
        self.control_rx.lock().take();
        self.data_rx.lock().take();
    }

    /// Why the link is closed, if it is.
    pub(crate) fn closed_reason(&self) -> Option<String> {
        match &*self.status.borrow() {
            LinkStatus::Closed(reason) => Some(reason.clone()),
            _ => None,
        }
    }

    /// Watches the connection status.
    pub(crate) fn subscribe(&self) -> watch::Receiver<LinkStatus> {
        self.status.subscribe()
    }

    /// Resolves once the link is closed; ends outgoing streams.
    pub(crate) async fn closed(self: Arc<Self>) {
        let mut rx = self.status.subscribe();
        loop {
            if matches!(&*rx.borrow_and_update(), LinkStatus::Closed(_)) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}
