//! Frames, reports and notes as the exchange's protobuf messages, both
//! ways. A delivery larger than one message is cut into several
//! ([`frame_messages`]) and joined again on arrival ([`FrameReader`]), so
//! no message is larger than [`MAX_CHUNK_BYTES`] of elements whatever a
//! bundle made.

use bytes::{Bytes, BytesMut};
use refract_engine::plan::PCollectionIdx;
use refract_engine::shards::exchange::{Delivery, Handed};
use refract_engine::shards::frames::{Frame, Note, Report};
use refract_engine::shards::Epoch;
use refract_proto::exchange as pb;
use refract_proto::exchange::frame_message::Body as FrameBody;
use refract_proto::exchange::note_message::Note as NoteBody;
use refract_proto::exchange::report_message::Body as ReportBody;

use crate::error::ExchangeError;

/// Most bytes of elements in one message.
pub const MAX_CHUNK_BYTES: usize = 1 << 20;

/// Most bytes a delivery may reach once joined: a receiver refuses a
/// sender whose chunks never end.
pub const MAX_DELIVERY_BYTES: usize = 1 << 30;

/// The messages that carry `frame`, in order.
pub fn frame_messages(frame: Frame) -> Vec<pb::FrameMessage> {
    let body = |body| pb::FrameMessage { body: Some(body) };
    match frame {
        Frame::Deliver(handed) => {
            let (pcollection, side_input, elements) = handed.delivery.into_parts();
            let epoch = handed.epoch.number();
            let pcollection = pcollection.index() as u32;
            let mut chunks = Vec::new();
            let mut rest = elements;
            loop {
                let chunk = rest.split_to(rest.len().min(MAX_CHUNK_BYTES));
                let more = !rest.is_empty();
                chunks.push(body(FrameBody::Deliver(pb::Deliver {
                    epoch,
                    pcollection,
                    side_input,
                    elements: chunk,
                    more,
                })));
                if !more {
                    return chunks;
                }
            }
        }
        Frame::Watermarks(stages) => vec![body(FrameBody::Watermarks(pb::Watermarks {
            watermarks: stages.iter().map(|&(wm, _)| wm).collect(),
            over: stages.iter().map(|&(_, over)| over).collect(),
        }))],
        Frame::Cut(epoch) => vec![body(FrameBody::Cut(epoch.number()))],
        Frame::ProcessingTime(now) => vec![body(FrameBody::ProcessingTime(now))],
        Frame::StopAfter(epoch) => vec![body(FrameBody::StopAfter(epoch.number()))],
        Frame::Finished => vec![body(FrameBody::Finished(true))],
    }
}

/// A delivery whose chunks are still arriving.
struct Partial {
    epoch: u64,
    pcollection: u32,
    side_input: bool,
    elements: BytesMut,
}

/// Reads one stream's frame messages back into frames, joining the chunks
/// of each delivery.
#[derive(Default)]
pub struct FrameReader {
    partial: Option<Partial>,
}

impl FrameReader {
    /// The frame `message` completes, if it does; an error for a message
    /// no sender makes.
    pub fn read(&mut self, message: pb::FrameMessage) -> Result<Option<Frame>, ExchangeError> {
        let malformed = |what: &str| ExchangeError::Malformed(what.to_string());
        let body = message
            .body
            .ok_or_else(|| malformed("a frame message without a body"))?;
        if self.partial.is_some() && !matches!(body, FrameBody::Deliver(_)) {
            return Err(malformed("a frame inside a delivery's chunks"));
        }
        let frame = match body {
            FrameBody::Header(_) => return Err(malformed("a second header")),
            FrameBody::Deliver(d) => return self.chunk(d),
            FrameBody::Watermarks(w) => {
                if w.watermarks.len() != w.over.len() {
                    return Err(malformed("watermarks and bounds of different lengths"));
                }
                Frame::Watermarks(w.watermarks.into_iter().zip(w.over).collect())
            }
            FrameBody::Cut(epoch) => Frame::Cut(Epoch::from_number(epoch)),
            FrameBody::ProcessingTime(now) => Frame::ProcessingTime(now),
            FrameBody::StopAfter(epoch) => Frame::StopAfter(Epoch::from_number(epoch)),
            FrameBody::Finished(_) => Frame::Finished,
        };
        Ok(Some(frame))
    }

    /// Adds a delivery's chunk; the delivery once it is whole.
    fn chunk(&mut self, d: pb::Deliver) -> Result<Option<Frame>, ExchangeError> {
        let partial = match self.partial.take() {
            None => Partial {
                epoch: d.epoch,
                pcollection: d.pcollection,
                side_input: d.side_input,
                elements: BytesMut::new(),
            },
            Some(p)
                if (p.epoch, p.pcollection, p.side_input)
                    != (d.epoch, d.pcollection, d.side_input) =>
            {
                return Err(ExchangeError::Malformed(
                    "a delivery's chunks disagree on what they carry".into(),
                ));
            }
            Some(p) => p,
        };
        let mut partial = partial;
        if partial.elements.len() + d.elements.len() > MAX_DELIVERY_BYTES {
            return Err(ExchangeError::Malformed(format!(
                "a delivery over {MAX_DELIVERY_BYTES} bytes"
            )));
        }
        partial.elements.extend_from_slice(&d.elements);
        if d.more {
            self.partial = Some(partial);
            return Ok(None);
        }
        let elements: Bytes = partial.elements.freeze();
        Ok(Some(Frame::Deliver(Handed {
            epoch: Epoch::from_number(partial.epoch),
            delivery: Delivery::new(
                PCollectionIdx::new(partial.pcollection as usize),
                partial.side_input,
                elements,
            ),
        })))
    }
}

/// `report` as a message.
pub fn report_message(report: Report) -> pb::ReportMessage {
    let body = match report {
        Report::Parked {
            can_step,
            waking,
            sent,
            received,
        } => ReportBody::Parked(pb::Parked {
            can_step,
            waking,
            sent,
            received,
        }),
        Report::Unparked => ReportBody::Unparked(true),
        Report::Finished { sent } => ReportBody::Finished(pb::Finished { sent }),
    };
    pb::ReportMessage { body: Some(body) }
}

/// The report `message` carries, for a job of `shards` shards.
pub fn read_report(message: pb::ReportMessage, shards: usize) -> Result<Report, ExchangeError> {
    let counts = |v: &Vec<u64>| {
        if v.len() == shards {
            Ok(())
        } else {
            Err(ExchangeError::Malformed(format!(
                "counts of {} shards in a job of {shards}",
                v.len()
            )))
        }
    };
    match message.body {
        Some(ReportBody::Parked(p)) => {
            counts(&p.sent)?;
            counts(&p.received)?;
            Ok(Report::Parked {
                can_step: p.can_step,
                waking: p.waking,
                sent: p.sent,
                received: p.received,
            })
        }
        Some(ReportBody::Unparked(_)) => Ok(Report::Unparked),
        Some(ReportBody::Finished(f)) => {
            counts(&f.sent)?;
            Ok(Report::Finished { sent: f.sent })
        }
        Some(ReportBody::Header(_)) => Err(ExchangeError::Malformed("a second header".into())),
        None => Err(ExchangeError::Malformed("a report without a body".into())),
    }
}

/// `note` as a message.
pub fn note_message(note: Note) -> pb::NoteMessage {
    pb::NoteMessage {
        note: Some(match note {
            Note::Turn => NoteBody::Turn(true),
            Note::Stuck => NoteBody::Stuck(true),
        }),
    }
}

/// The note `message` carries.
pub fn read_note(message: pb::NoteMessage) -> Result<Note, ExchangeError> {
    match message.note {
        Some(NoteBody::Turn(_)) => Ok(Note::Turn),
        Some(NoteBody::Stuck(_)) => Ok(Note::Stuck),
        None => Err(ExchangeError::Malformed("a note without a body".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(bytes: usize) -> Frame {
        Frame::Deliver(Handed {
            epoch: Epoch::from_number(3),
            delivery: Delivery::new(
                PCollectionIdx::new(2),
                true,
                Bytes::from((0..bytes).map(|i| i as u8).collect::<Vec<u8>>()),
            ),
        })
    }

    fn round_trip(frame: Frame) -> (usize, Frame) {
        let messages = frame_messages(frame);
        let n = messages.len();
        let mut reader = FrameReader::default();
        let mut out = None;
        for (i, m) in messages.into_iter().enumerate() {
            let got = reader.read(m).expect("a well-formed message");
            assert_eq!(got.is_some(), i + 1 == n, "only the last chunk completes");
            out = got;
        }
        (n, out.expect("a frame"))
    }

    #[test]
    fn a_large_delivery_goes_in_chunks_and_comes_back_whole() {
        for (bytes, chunks) in [
            (0, 1),
            (10, 1),
            (MAX_CHUNK_BYTES, 1),
            (2 * MAX_CHUNK_BYTES + 1, 3),
        ] {
            let (n, back) = round_trip(delivery(bytes));
            assert_eq!(n, chunks, "{bytes} bytes");
            assert_eq!(format!("{back:?}"), format!("{:?}", delivery(bytes)));
        }
    }

    #[test]
    fn every_other_frame_comes_back_as_it_went() {
        for frame in [
            Frame::Watermarks(vec![(1, false), (-5, true)]),
            Frame::Cut(Epoch::from_number(4)),
            Frame::ProcessingTime(77),
            Frame::StopAfter(Epoch::from_number(9)),
            Frame::Finished,
        ] {
            let (n, back) = round_trip(frame.clone());
            assert_eq!(n, 1);
            assert_eq!(format!("{back:?}"), format!("{frame:?}"));
        }
    }

    #[test]
    fn messages_no_sender_makes_are_refused() {
        let mut reader = FrameReader::default();
        assert!(reader.read(pb::FrameMessage { body: None }).is_err());
        let lopsided = pb::FrameMessage {
            body: Some(FrameBody::Watermarks(pb::Watermarks {
                watermarks: vec![1, 2],
                over: vec![true],
            })),
        };
        assert!(reader.read(lopsided).is_err());
        // A cut in the middle of a delivery's chunks.
        let mut chunks = frame_messages(delivery(MAX_CHUNK_BYTES + 1));
        assert!(reader.read(chunks.remove(0)).expect("a chunk").is_none());
        let cut = pb::FrameMessage {
            body: Some(FrameBody::Cut(1)),
        };
        assert!(reader.read(cut).is_err());
        let report = pb::ReportMessage {
            body: Some(ReportBody::Finished(pb::Finished { sent: vec![1] })),
        };
        assert!(read_report(report, 3).is_err());
        assert!(read_note(pb::NoteMessage { note: None }).is_err());
    }

    #[test]
    fn reports_and_notes_come_back_as_they_went() {
        for report in [
            Report::Parked {
                can_step: true,
                waking: false,
                sent: vec![0, 1],
                received: vec![2, 0],
            },
            Report::Unparked,
            Report::Finished { sent: vec![4, 0] },
        ] {
            assert_eq!(
                read_report(report_message(report.clone()), 2).ok(),
                Some(report)
            );
        }
        for note in [Note::Turn, Note::Stuck] {
            assert_eq!(read_note(note_message(note)).ok(), Some(note));
        }
    }
}
