//! The exchange's gRPC service: the receiving side of every stream into
//! the shards (and quiet detector) a process hosts.
//!
//! A stream is trusted only once its first message, a header, names a
//! session hosted here and a sender and receiver of that session; anything
//! else is refused with a status, and what a refused stream sent touches
//! no session. A malformed message on an accepted stream fails the
//! receiving shard's run, since a frame of its job was lost.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use parking_lot::Mutex;
use refract_engine::shards::frames::Frame;
use refract_proto::exchange as pb;
use refract_proto::exchange::shard_exchange_server::{ShardExchange, ShardExchangeServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::codec::{note_message, read_report, FrameReader, MAX_CHUNK_BYTES};
use crate::error::ExchangeError;
use crate::session::{HostedSession, SessionKey};

/// The sessions a process hosts, by key; what its exchange service
/// serves.
#[derive(Debug, Clone, Default)]
pub struct ExchangeHost {
    sessions: Arc<Mutex<HashMap<SessionKey, Arc<HostedSession>>>>,
}

impl ExchangeHost {
    /// Hosts `session` under `key` until [`ExchangeHost::remove`].
    pub fn insert(&self, key: SessionKey, session: Arc<HostedSession>) {
        self.sessions.lock().insert(key, session);
    }

    /// Stops hosting the session under `key`.
    pub fn remove(&self, key: &SessionKey) {
        self.sessions.lock().remove(key);
    }

    /// The gRPC service serving this host's sessions, which takes
    /// messages of at most one chunk and its framing.
    pub fn service(&self) -> ShardExchangeServer<ExchangeService> {
        ShardExchangeServer::new(ExchangeService { host: self.clone() })
            .max_decoding_message_size(MAX_CHUNK_BYTES + 64 * 1024)
    }

    /// The session a stream's header names.
    fn session(&self, header: &pb::StreamHeader) -> Result<Arc<HostedSession>, ExchangeError> {
        self.sessions
            .lock()
            .get(&SessionKey::from_header(&header.session))
            .cloned()
            .ok_or(ExchangeError::UnknownSession)
    }
}

/// The service over an [`ExchangeHost`].
#[derive(Debug, Clone)]
pub struct ExchangeService {
    host: ExchangeHost,
}

/// A stream of answers.
type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// An item of an answer stream, which tonic types with its `Status`.
#[allow(clippy::result_large_err)] // tonic's streams carry its Status
fn answer<T>(item: T) -> Result<T, Status> {
    Ok(item)
}

/// A stream's first message: its header, or why it has none.
async fn header<T>(
    stream: &mut Streaming<T>,
    header_of: impl Fn(T) -> Option<pb::StreamHeader>,
) -> Result<pb::StreamHeader, Status> {
    match stream.message().await? {
        Some(first) => header_of(first).ok_or_else(|| {
            Status::from(ExchangeError::Malformed(
                "a stream whose first message is no header".into(),
            ))
        }),
        None => Err(Status::from(ExchangeError::Malformed(
            "a stream without a header".into(),
        ))),
    }
}

/// Applies the frames of the stream from `from` to `end`, in order,
/// until the stream ends, breaks (which fails the shard's run), or brings
/// a malformed frame (likewise). Once the shard's engine is gone, what
/// still arrives is dropped with its credit given back, so that its sender
/// never waits on a shard that will not take.
async fn take_frames(
    mut inbound: Streaming<pb::FrameMessage>,
    from: refract_engine::shards::ShardId,
    end: std::sync::Weak<refract_engine::shards::peer::PeerEnd>,
    credit: &mpsc::UnboundedSender<u64>,
) {
    let mut reader = FrameReader::default();
    loop {
        let message = match inbound.message().await {
            Ok(Some(message)) => message,
            // The sender is done: its engine is gone.
            Ok(None) => return,
            Err(status) => {
                if let Some(end) = end.upgrade() {
                    end.lose(format!("the stream from {from} broke: {status}"));
                }
                return;
            }
        };
        let frame = match reader.read(message) {
            Ok(Some(frame)) => frame,
            Ok(None) => continue,
            Err(error) => {
                warn!(%from, %error, "a malformed frame: the shard's run fails");
                if let Some(end) = end.upgrade() {
                    end.lose(format!("{from} sent {error}"));
                }
                return;
            }
        };
        let charge = frame.charge() as u64;
        match end.upgrade() {
            // A delivery's credit goes back once the engine takes it; any
            // other frame is applied at once.
            Some(end) if matches!(frame, Frame::Deliver(_)) => end.receive(from, frame),
            Some(end) => {
                end.receive(from, frame);
                let _ = credit.send(charge);
            }
            None => {
                let _ = credit.send(charge);
            }
        }
    }
}

#[tonic::async_trait]
impl ShardExchange for ExchangeService {
    type FramesStream = Answers<pb::Credit>;
    type ReportsStream = Answers<pb::NoteMessage>;

    async fn frames(
        &self,
        request: Request<Streaming<pb::FrameMessage>>,
    ) -> Result<Response<Self::FramesStream>, Status> {
        let mut inbound = request.into_inner();
        let header = header(&mut inbound, |m| match m.body {
            Some(pb::frame_message::Body::Header(h)) => Some(h),
            _ => None,
        })
        .await?;
        let session = self.host.session(&header)?;
        let from = session.shard(header.from)?;
        let to = session.shard(header.to)?;
        if from == to {
            return Err(ExchangeError::Malformed("a stream from a shard to itself".into()).into());
        }
        let local = session.local(to)?;
        let (credit_tx, credit_rx) = mpsc::unbounded_channel();
        local.credit.open(from, to, credit_tx.clone())?;
        let end = local.end.clone();
        let routes = local.credit.clone();
        debug!(%from, %to, "a shard's frames stream opened");
        tokio::spawn(async move {
            take_frames(inbound, from, end, &credit_tx).await;
            // The credit stream ends with the frames stream, so that the
            // call completes on both sides.
            routes.close(from, &credit_tx);
        });
        let credit = UnboundedReceiverStream::new(credit_rx)
            .map(|bytes| pb::Credit { bytes })
            .map(answer);
        Ok(Response::new(Box::pin(credit)))
    }

    async fn reports(
        &self,
        request: Request<Streaming<pb::ReportMessage>>,
    ) -> Result<Response<Self::ReportsStream>, Status> {
        let mut inbound = request.into_inner();
        let header = header(&mut inbound, |m| match m.body {
            Some(pb::report_message::Body::Header(h)) => Some(h),
            _ => None,
        })
        .await?;
        let session = self.host.session(&header)?;
        let from = session.shard(header.from)?;
        let (notes_tx, notes_rx) = mpsc::unbounded_channel();
        session.open_reports(from, notes_tx)?;
        let shards = session.layout().shards() as usize;
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                match read_report(message, shards) {
                    Ok(report) => session.report(from, report),
                    Err(error) => {
                        warn!(%from, %error, "a malformed report: its stream is dropped");
                        break;
                    }
                }
            }
            // The note stream ends with the report stream.
            session.close_reports(from);
        });
        let notes = UnboundedReceiverStream::new(notes_rx)
            .map(note_message)
            .map(answer);
        Ok(Response::new(Box::pin(notes)))
    }
}
