//! Frames a bundle's input into outgoing `Elements` messages.
//!
//! Rules the Python harness imposes (see the Fn API notes, P7/P8):
//! * each caller chunk becomes its own Data entry, never split (Python decodes
//!   every entry on its own);
//! * `is_last` entries are separate and empty (Python drops an `is_last`
//!   entry's payload);
//! * every source and every `(transform, timer family)` gets an `is_last`,
//!   even with no data.
//!
//! Entries are batched into messages of bounded size so small chunks do not
//! cost one gRPC message each.

use std::collections::{HashSet, VecDeque};

use bytes::Bytes;
use refract_proto::fn_api::{elements, Elements};

/// Payload bytes after which a message is sent.
const MAX_FRAME_BYTES: usize = 4 << 20;
/// Entries after which a message is sent.
const MAX_FRAME_ENTRIES: usize = 100;

enum Entry {
    Data {
        transform_id: String,
        bytes: Bytes,
    },
    Timers {
        transform_id: String,
        family_id: String,
        bytes: Bytes,
    },
}

impl Entry {
    fn len(&self) -> usize {
        match self {
            Entry::Data { bytes, .. } | Entry::Timers { bytes, .. } => bytes.len(),
        }
    }
}

/// An iterator over the messages that carry one bundle's input.
pub(crate) struct InputFrames {
    instruction_id: String,
    entries: VecDeque<Entry>,
    last_sources: Vec<String>,
    last_timer_families: Vec<(String, String)>,
    finished: bool,
}

impl InputFrames {
    /// Frames `inputs` and `timers` for `instruction_id`, closing every source
    /// in `inputs` and every family in `timer_families` or `timers`.
    pub(crate) fn new(
        instruction_id: String,
        inputs: Vec<(String, Vec<Bytes>)>,
        timers: Vec<(String, String, Bytes)>,
        timer_families: &[(String, String)],
    ) -> Self {
        let mut entries = VecDeque::new();
        let mut last_sources = Vec::new();
        let mut seen_sources = HashSet::new();
        for (transform_id, chunks) in inputs {
            for bytes in chunks.into_iter().filter(|c| !c.is_empty()) {
                entries.push_back(Entry::Data {
                    transform_id: transform_id.clone(),
                    bytes,
                });
            }
            if seen_sources.insert(transform_id.clone()) {
                last_sources.push(transform_id);
            }
        }
        let mut last_timer_families = Vec::new();
        let mut seen_families = HashSet::new();
        for family in timer_families {
            if seen_families.insert(family.clone()) {
                last_timer_families.push(family.clone());
            }
        }
        for (transform_id, family_id, bytes) in timers {
            let family = (transform_id.clone(), family_id.clone());
            if seen_families.insert(family.clone()) {
                last_timer_families.push(family);
            }
            if !bytes.is_empty() {
                entries.push_back(Entry::Timers {
                    transform_id,
                    family_id,
                    bytes,
                });
            }
        }
        let finished =
            entries.is_empty() && last_sources.is_empty() && last_timer_families.is_empty();
        Self {
            instruction_id,
            entries,
            last_sources,
            last_timer_families,
            finished,
        }
    }

    fn push(&self, message: &mut Elements, entry: Entry) {
        match entry {
            Entry::Data {
                transform_id,
                bytes,
            } => message.data.push(elements::Data {
                instruction_id: self.instruction_id.clone(),
                transform_id,
                data: bytes.to_vec(),
                is_last: false,
            }),
            Entry::Timers {
                transform_id,
                family_id,
                bytes,
            } => message.timers.push(elements::Timers {
                instruction_id: self.instruction_id.clone(),
                transform_id,
                timer_family_id: family_id,
                timers: bytes.to_vec(),
                is_last: false,
            }),
        }
    }

    fn push_closers(&mut self, message: &mut Elements) {
        for transform_id in std::mem::take(&mut self.last_sources) {
            message.data.push(elements::Data {
                instruction_id: self.instruction_id.clone(),
                transform_id,
                data: Vec::new(),
                is_last: true,
            });
        }
        for (transform_id, timer_family_id) in std::mem::take(&mut self.last_timer_families) {
            message.timers.push(elements::Timers {
                instruction_id: self.instruction_id.clone(),
                transform_id,
                timer_family_id,
                timers: Vec::new(),
                is_last: true,
            });
        }
    }
}

impl Iterator for InputFrames {
    type Item = Elements;

    fn next(&mut self) -> Option<Elements> {
        if self.finished {
            return None;
        }
        let mut message = Elements::default();
        let mut bytes = 0usize;
        let mut count = 0usize;
        while let Some(entry) = self.entries.front() {
            if count > 0 && (bytes + entry.len() > MAX_FRAME_BYTES || count >= MAX_FRAME_ENTRIES) {
                break;
            }
            bytes += entry.len();
            count += 1;
            if let Some(entry) = self.entries.pop_front() {
                self.push(&mut message, entry);
            }
        }
        if self.entries.is_empty() {
            self.push_closers(&mut message);
            self.finished = true;
        }
        Some(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(frames: InputFrames) -> Vec<Elements> {
        frames.collect()
    }

    #[test]
    fn chunks_stay_whole_and_is_last_is_separate_and_empty() {
        let frames = InputFrames::new(
            "b1".into(),
            vec![
                (
                    "src".into(),
                    vec![Bytes::from_static(b"aa"), Bytes::from_static(b"bbb")],
                ),
                ("empty_src".into(), vec![]),
            ],
            vec![],
            &[("pardo".into(), "ts-t".into())],
        );
        let messages = all(frames);
        let data: Vec<_> = messages.iter().flat_map(|m| m.data.iter()).collect();
        assert_eq!(data.len(), 4);
        assert_eq!(data[0].data, b"aa");
        assert_eq!(data[1].data, b"bbb");
        assert!(data[..2]
            .iter()
            .all(|d| !d.is_last && d.instruction_id == "b1"));
        assert!(data[2].is_last && data[2].data.is_empty() && data[2].transform_id == "src");
        assert!(data[3].is_last && data[3].transform_id == "empty_src");
        let timers: Vec<_> = messages.iter().flat_map(|m| m.timers.iter()).collect();
        assert_eq!(timers.len(), 1);
        assert!(timers[0].is_last && timers[0].timer_family_id == "ts-t");
    }

    #[test]
    fn timers_close_their_families_once() {
        let frames = InputFrames::new(
            "b1".into(),
            vec![],
            vec![("p".into(), "f".into(), Bytes::from_static(b"t"))],
            &[("p".into(), "f".into())],
        );
        let timers: Vec<_> = all(frames).into_iter().flat_map(|m| m.timers).collect();
        assert_eq!(timers.len(), 2);
        assert!(!timers[0].is_last && timers[0].timers == b"t");
        assert!(timers[1].is_last && timers[1].timers.is_empty());
    }

    #[test]
    fn large_inputs_are_batched_by_size() {
        let chunk = Bytes::from(vec![7u8; MAX_FRAME_BYTES / 2 + 1]);
        let frames = InputFrames::new(
            "b1".into(),
            vec![("src".into(), vec![chunk.clone(), chunk.clone(), chunk])],
            vec![],
            &[],
        );
        let messages = all(frames);
        assert_eq!(messages.len(), 3);
        assert!(messages
            .iter()
            .all(|m| m.data.iter().filter(|d| !d.is_last).count() == 1));
        assert!(messages[2].data.last().is_some_and(|d| d.is_last));
    }

    #[test]
    fn nothing_to_send_yields_nothing() {
        assert_eq!(
            InputFrames::new("b1".into(), vec![], vec![], &[]).count(),
            0
        );
    }
}
