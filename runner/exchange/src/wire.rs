//! The sending side: one local shard's [`FrameWire`] over gRPC. Each other
//! shard gets one Frames stream, fed in order by one task that spends
//! credit: a frame leaves once the receiver has given back enough of the
//! window for it, and the rest wait in the shard's queue. The engine sees
//! a queue past the window as a full exchange and holds back the
//! producers that feed it, so a slow receiver slows its producers on every
//! host. Reports go to the quiet detector on one stream, whose answers
//! come back on it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use refract_engine::shards::frames::{Frame, Report};
use refract_engine::shards::peer::{FrameWire, PeerEnd};
use refract_engine::shards::{ShardId, ShardLayout};
use refract_proto::exchange as pb;
use refract_proto::exchange::shard_exchange_client::ShardExchangeClient;
use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tracing::debug;

use crate::codec::{frame_messages, read_note, report_message, MAX_CHUNK_BYTES};
use crate::session::{CreditRoutes, SessionKey};

/// Credit per stream unless told otherwise, and at most: what may be in
/// flight from one shard to another before its producers wait.
pub const DEFAULT_WINDOW_BYTES: usize = 4 << 20;

/// How often, and how far apart, a stream is tried again while its
/// receiver is not listening yet.
const CONNECT_ATTEMPTS: u32 = 20;
const CONNECT_PAUSE: Duration = Duration::from_millis(100);

/// One outbound stream's credit: what was charged and not given back
/// (`outstanding`, what the engine's backpressure reads), and what may
/// still be sent (`available`, what the sending task spends).
#[derive(Debug)]
struct Flow {
    outstanding: AtomicI64,
    available: Mutex<i64>,
    credited: Notify,
    window: i64,
}

impl Flow {
    fn new(window: usize) -> Self {
        let window = window.max(1) as i64;
        Flow {
            outstanding: AtomicI64::new(0),
            available: Mutex::new(window),
            credited: Notify::new(),
            window,
        }
    }

    /// Spends `charge` once enough is available (all of the window, for
    /// a frame larger than it).
    async fn spend(&self, charge: i64) {
        let need = charge.min(self.window);
        loop {
            let credited = self.credited.notified();
            {
                let mut available = self.available.lock();
                if *available >= need {
                    *available -= charge;
                    return;
                }
            }
            credited.await;
        }
    }

    /// The receiver gave back `bytes`; says whether that brought the
    /// queue back within the window.
    fn credit(&self, bytes: i64) -> bool {
        {
            let mut available = self.available.lock();
            *available = (*available + bytes).min(self.window);
        }
        self.credited.notify_one();
        let before = self.outstanding.fetch_sub(bytes, Ordering::SeqCst);
        before > self.window && before - bytes <= self.window
    }
}

/// One outbound stream, as the wire queues into it.
#[derive(Debug)]
struct Outbound {
    frames: mpsc::UnboundedSender<Frame>,
    flow: Arc<Flow>,
}

/// One local shard's wire.
#[derive(Debug)]
struct GrpcWire {
    /// Per shard, the stream to it (none to this shard).
    outbound: Vec<Option<Outbound>>,
    reports: mpsc::UnboundedSender<Report>,
    credit: Arc<CreditRoutes>,
}

impl FrameWire for GrpcWire {
    fn to_peer(&self, to: ShardId, frame: Frame) {
        if let Some(Some(out)) = self.outbound.get(to.index()) {
            out.flow
                .outstanding
                .fetch_add(frame.charge() as i64, Ordering::SeqCst);
            // A closed queue: the stream is over, and so is the job's run.
            let _ = out.frames.send(frame);
        }
    }

    fn to_detector(&self, report: Report) {
        let _ = self.reports.send(report);
    }

    fn taken(&self, from: ShardId, bytes: usize) {
        self.credit.give(from, bytes);
    }

    fn full(&self) -> bool {
        self.outbound
            .iter()
            .flatten()
            .any(|out| out.flow.outstanding.load(Ordering::SeqCst) > out.flow.window)
    }
}

/// Where one shard's streams go: per shard, the channel to the process
/// hosting it, and the channel to the quiet detector's.
#[derive(Debug, Clone)]
pub struct Routes {
    /// Per shard, in shard order.
    pub shards: Vec<Channel>,
    /// The quiet detector's.
    pub detector: Channel,
}

/// One stream's task, before it is spawned.
type StreamTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The streams of a local shard, not opened yet: opened once the session
/// is hosted, so that the receivers know it when the streams arrive.
#[must_use = "the shard sends nothing until its streams start"]
pub struct Unopened {
    streams: Vec<StreamTask>,
}

impl Unopened {
    /// Opens the streams: each runs on a task until its end is dropped.
    /// In a Tokio runtime.
    pub fn open(self) {
        for stream in self.streams {
            tokio::spawn(stream);
        }
    }
}

/// Shard `me` of `layout` in session `key`, sending through gRPC along
/// `routes` with `window` bytes of credit per stream, and giving credit
/// back through `credit`; and its streams, to open once the session is
/// hosted.
pub fn local_end(
    me: ShardId,
    layout: ShardLayout,
    key: &SessionKey,
    routes: &Routes,
    window: usize,
    credit: Arc<CreditRoutes>,
) -> (Arc<PeerEnd>, Unopened) {
    let mut outbound = Vec::new();
    let mut senders = Vec::new();
    for to in layout.ids() {
        if to == me {
            outbound.push(None);
            continue;
        }
        let (frames, rx) = mpsc::unbounded_channel();
        let flow = Arc::new(Flow::new(window));
        senders.push((to, rx, flow.clone()));
        outbound.push(Some(Outbound { frames, flow }));
    }
    let (reports, reports_rx) = mpsc::unbounded_channel();
    let end = PeerEnd::new(
        me,
        layout,
        Arc::new(GrpcWire {
            outbound,
            reports,
            credit,
        }),
    );
    let header = |to: ShardId| pb::StreamHeader {
        session: key.as_str().to_string(),
        from: me.number(),
        to: to.number(),
    };
    let mut streams: Vec<StreamTask> = Vec::new();
    for (to, rx, flow) in senders {
        let channel = routes.shards[to.index()].clone();
        let stream = Stream {
            channel,
            header: header(to),
            end: Arc::downgrade(&end),
        };
        streams.push(Box::pin(send_frames(stream, rx, flow)));
    }
    let stream = Stream {
        channel: routes.detector.clone(),
        header: header(me),
        end: Arc::downgrade(&end),
    };
    streams.push(Box::pin(send_reports(stream, reports_rx)));
    (end, Unopened { streams })
}

/// One outbound stream's parts.
struct Stream {
    channel: Channel,
    header: pb::StreamHeader,
    end: Weak<PeerEnd>,
}

impl Stream {
    /// The transport failed: the shard's run fails, if it still runs.
    fn lose(&self, why: String) {
        if let Some(end) = self.end.upgrade() {
            end.lose(why);
        }
    }

    fn client(&self) -> ShardExchangeClient<Channel> {
        ShardExchangeClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_CHUNK_BYTES + 64 * 1024)
    }
}

/// Opens a stream with `open`, trying again while the receiver is not
/// ready yet (see [`receiver_not_ready`]).
async fn open_with_retries<M, R, F, Fut>(
    stream: &Stream,
    header: M,
    open: F,
) -> Result<(mpsc::Sender<M>, tonic::Streaming<R>), tonic::Status>
where
    M: Clone,
    F: Fn(ReceiverStream<M>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<tonic::Streaming<R>>, tonic::Status>>,
{
    let mut attempt = 0;
    loop {
        let (tx, rx) = mpsc::channel(8);
        // The receiver's channel has room for the header.
        let _ = tx.try_send(header.clone());
        match open(ReceiverStream::new(rx)).await {
            Ok(response) => return Ok((tx, response.into_inner())),
            Err(status) if receiver_not_ready(&status) && attempt + 1 < CONNECT_ATTEMPTS => {
                attempt += 1;
                debug!(to = stream.header.to, %status, "the exchange stream waits for its receiver");
                tokio::time::sleep(CONNECT_PAUSE).await;
            }
            Err(status) => return Err(status),
        }
    }
}

/// Whether a stream was refused because its receiver is not there yet:
/// its server is not listening (its process is starting), or it does not
/// host the session yet (its host is joining the run a moment later).
fn receiver_not_ready(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::PermissionDenied
    )
}

/// Carries one shard's frames to another in order, spending credit.
async fn send_frames(stream: Stream, mut frames: mpsc::UnboundedReceiver<Frame>, flow: Arc<Flow>) {
    let header = pb::FrameMessage {
        body: Some(pb::frame_message::Body::Header(stream.header.clone())),
    };
    let client = stream.client();
    let opened = open_with_retries(&stream, header, |messages| {
        let mut client = client.clone();
        async move { client.frames(messages).await }
    })
    .await;
    let (tx, mut credits) = match opened {
        Ok(opened) => opened,
        Err(status) => {
            stream.lose(format!("cannot reach shard {}: {status}", stream.header.to));
            return;
        }
    };
    let reader_flow = flow.clone();
    let reader_end = stream.end.clone();
    let to = stream.header.to;
    tokio::spawn(async move {
        loop {
            match credits.message().await {
                Ok(Some(credit)) => {
                    let bytes = i64::try_from(credit.bytes).unwrap_or(i64::MAX);
                    if reader_flow.credit(bytes) {
                        if let Some(end) = reader_end.upgrade() {
                            end.wake();
                        }
                    }
                }
                // The receiver is done: nothing more goes to it.
                Ok(None) => return,
                Err(status) => {
                    if let Some(end) = reader_end.upgrade() {
                        end.lose(format!("the stream to shard {to} broke: {status}"));
                    }
                    return;
                }
            }
        }
    });
    while let Some(frame) = frames.recv().await {
        flow.spend(frame.charge() as i64).await;
        for message in frame_messages(frame) {
            if tx.send(message).await.is_err() {
                return;
            }
        }
    }
}

/// Carries one shard's reports to the quiet detector, and its notes back.
async fn send_reports(stream: Stream, mut reports: mpsc::UnboundedReceiver<Report>) {
    let header = pb::ReportMessage {
        body: Some(pb::report_message::Body::Header(stream.header.clone())),
    };
    let client = stream.client();
    let opened = open_with_retries(&stream, header, |messages| {
        let mut client = client.clone();
        async move { client.reports(messages).await }
    })
    .await;
    let (tx, mut notes) = match opened {
        Ok(opened) => opened,
        Err(status) => {
            stream.lose(format!("cannot reach the quiet detector: {status}"));
            return;
        }
    };
    let end = stream.end.clone();
    tokio::spawn(async move {
        let why = loop {
            match notes.message().await {
                Ok(Some(message)) => match (read_note(message), end.upgrade()) {
                    (Ok(note), Some(end)) => end.hear(note),
                    (Err(error), _) => break error.to_string(),
                    (_, None) => return,
                },
                Ok(None) => break "the quiet detector closed its stream".to_string(),
                Err(status) => break format!("the quiet detector's stream broke: {status}"),
            }
        };
        if let Some(end) = end.upgrade() {
            end.lose(why);
        }
    });
    while let Some(report) = reports.recv().await {
        if tx.send(report_message(report)).await.is_err() {
            return;
        }
    }
}
