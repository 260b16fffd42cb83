//! One job run's exchange session as a process hosts it: the secret that
//! names it, the ends of the shards that live here, where credit for
//! their inbound streams goes, and (on the coordinator) the quiet
//! detector with the streams its notes go down.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use refract_engine::shards::frames::{Note, Report};
use refract_engine::shards::peer::PeerEnd;
use refract_engine::shards::quiet::QuietDetector;
use refract_engine::shards::{ShardId, ShardLayout};
use tokio::sync::mpsc;

use crate::error::ExchangeError;

/// The secret that names a session: 128 random bits, in hex. Whoever
/// knows it may speak for the session's shards, so it is never logged.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SessionKey(String);

impl SessionKey {
    /// A new random key.
    pub fn random() -> Result<Self, ExchangeError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| ExchangeError::Randomness(e.to_string()))?;
        Ok(SessionKey(hex::encode(bytes)))
    }

    /// The key as a stream's header carries it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key a stream's header names.
    pub fn from_header(key: &str) -> Self {
        SessionKey(key.to_string())
    }
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

/// Where the credit for one local shard's inbound streams goes: per
/// sender, the open stream's credit channel.
#[derive(Debug)]
pub struct CreditRoutes {
    routes: Mutex<Vec<Option<mpsc::UnboundedSender<u64>>>>,
}

impl CreditRoutes {
    /// No stream open yet, from any of `shards` shards.
    pub fn new(shards: usize) -> Self {
        CreditRoutes {
            routes: Mutex::new(vec![None; shards]),
        }
    }

    /// The stream from `from` opened; its credit goes down `route`. A
    /// second open stream from one sender is refused: its frames would
    /// race the first's.
    pub fn open(
        &self,
        from: ShardId,
        to: ShardId,
        route: mpsc::UnboundedSender<u64>,
    ) -> Result<(), ExchangeError> {
        let mut routes = self.routes.lock();
        let slot = routes
            .get_mut(from.index())
            .ok_or_else(|| ExchangeError::UnknownShard(format!("no {from} in this job")))?;
        if slot.as_ref().is_some_and(|open| !open.is_closed()) {
            return Err(ExchangeError::Duplicate {
                from: from.number(),
                to: to.number(),
            });
        }
        *slot = Some(route);
        Ok(())
    }

    /// The stream from `from` whose credit went down `route` ended: its
    /// credit stream ends too, once the stream's own task lets go of its
    /// copy of `route` (a newer stream's route stays).
    pub fn close(&self, from: ShardId, route: &mpsc::UnboundedSender<u64>) {
        if let Some(slot) = self.routes.lock().get_mut(from.index()) {
            if slot.as_ref().is_some_and(|open| open.same_channel(route)) {
                *slot = None;
            }
        }
    }

    /// Gives `bytes` of credit back to `from`'s stream, if it is open.
    pub fn give(&self, from: ShardId, bytes: usize) {
        if let Some(Some(route)) = self.routes.lock().get(from.index()) {
            let _ = route.send(bytes as u64);
        }
    }
}

/// The quiet detector of a session, with the streams its notes go down.
#[derive(Debug)]
struct DetectorDesk {
    detector: QuietDetector,
    /// Per shard, its open report stream's note channel.
    notes: Vec<Option<mpsc::UnboundedSender<Note>>>,
    /// Per shard, notes decided before its stream opened.
    pending: Vec<Vec<Note>>,
}

/// A local shard of a session: its end, and its inbound credit.
#[derive(Debug)]
pub struct LocalShard {
    /// The shard's end of the frame protocol; gone once its engine is.
    pub end: Weak<PeerEnd>,
    /// Where its inbound streams' credit goes.
    pub credit: Arc<CreditRoutes>,
}

/// What one process hosts of a session.
#[derive(Debug)]
pub struct HostedSession {
    layout: ShardLayout,
    /// Per shard, its end if it lives here.
    local: Vec<Option<LocalShard>>,
    /// The quiet detector, on the process that runs it.
    detector: Option<Mutex<DetectorDesk>>,
}

impl HostedSession {
    /// A session of `layout` hosting `local` shards here, and the quiet
    /// detector if `detector`.
    pub fn new(
        layout: ShardLayout,
        local: Vec<(ShardId, LocalShard)>,
        detector: bool,
    ) -> HostedSession {
        let n = layout.shards() as usize;
        let mut slots: Vec<Option<LocalShard>> = (0..n).map(|_| None).collect();
        for (id, shard) in local {
            if let Some(slot) = slots.get_mut(id.index()) {
                *slot = Some(shard);
            }
        }
        HostedSession {
            layout,
            local: slots,
            detector: detector.then(|| {
                Mutex::new(DetectorDesk {
                    detector: QuietDetector::new(layout),
                    notes: vec![None; n],
                    pending: vec![Vec::new(); n],
                })
            }),
        }
    }

    /// The session's layout.
    pub fn layout(&self) -> ShardLayout {
        self.layout
    }

    /// Shard number `number` of the session's layout.
    pub fn shard(&self, number: u32) -> Result<ShardId, ExchangeError> {
        ShardId::of(self.layout, number).ok_or_else(|| {
            ExchangeError::UnknownShard(format!(
                "no shard {number} in a job of {} shards",
                self.layout.shards()
            ))
        })
    }

    /// Shard `id`, if it lives here.
    pub fn local(&self, id: ShardId) -> Result<&LocalShard, ExchangeError> {
        self.local
            .get(id.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| ExchangeError::UnknownShard(format!("{id} does not live here")))
    }

    /// Shard `from`'s report stream opened; notes for it go down `notes`.
    pub fn open_reports(
        &self,
        from: ShardId,
        notes: mpsc::UnboundedSender<Note>,
    ) -> Result<(), ExchangeError> {
        let desk = self
            .detector
            .as_ref()
            .ok_or_else(|| ExchangeError::UnknownShard("no quiet detector here".into()))?;
        let mut desk = desk.lock();
        let i = from.index();
        if desk.notes[i].as_ref().is_some_and(|open| !open.is_closed()) {
            return Err(ExchangeError::Duplicate {
                from: from.number(),
                to: from.number(),
            });
        }
        for note in std::mem::take(&mut desk.pending[i]) {
            let _ = notes.send(note);
        }
        desk.notes[i] = Some(notes);
        Ok(())
    }

    /// Shard `from`'s report stream is no good any more: its note stream
    /// ends, which fails the shard's run.
    pub fn close_reports(&self, from: ShardId) {
        if let Some(desk) = self.detector.as_ref() {
            if let Some(slot) = desk.lock().notes.get_mut(from.index()) {
                *slot = None;
            }
        }
    }

    /// Takes shard `from`'s report and sends the notes the detector
    /// decides.
    pub fn report(&self, from: ShardId, report: Report) {
        let Some(desk) = self.detector.as_ref() else {
            return;
        };
        let mut desk = desk.lock();
        for (to, note) in desk.detector.hear(from, report) {
            let i = to.index();
            match desk.notes.get(i).and_then(Option::as_ref) {
                Some(stream) if !stream.is_closed() => {
                    let _ = stream.send(note);
                }
                _ => desk.pending[i].push(note),
            }
        }
    }
}
