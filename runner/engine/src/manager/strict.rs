//! Strict mode: the runner takes freedoms the Beam model gives every
//! runner, so that a test suite run on Refract fails where pipeline code
//! relies on what one runner happens to do, before production does.
//!
//! Any runner may run a bundle again (a worker died, a retry, a
//! speculative copy), cut a stage's input into bundles of any size, and
//! hand a stateless transform its input in any order. Beam's DirectRunner
//! and Prism, on a test's few elements, do none of that: one bundle, in
//! the order the elements came. Code that counts across bundles in a
//! DoFn's fields, emits "one result per bundle", or writes to the outside
//! world from `process` passes there and breaks on Dataflow or Flink.
//! Under strict mode:
//!
//! - **replays**: the first bundle every SDK stage completes, and one in
//!   [`REPLAY_ONE_IN`] after it, is run again: its effects (outputs, state,
//!   timers, metrics) are dropped, as for a failed attempt, and its input
//!   goes back to the front of the queue, to be the stage's next bundle,
//!   whole and alone, as a retry would. The SDK sees the same input
//!   twice, in a DoFn instance that already processed it once;
//! - **bundle sizes**: a stage's first bundle takes at most half of what
//!   waits, later ones a random share, so that no DoFn sees all of a
//!   test's input in one bundle;
//! - **order**: a stateless, unsorted stage's bundle takes its entries in
//!   random order. Keyed stages keep each key's order, time-sorted input
//!   its timestamps' order.
//!
//! A stage runs one bundle at a time until its first bundle and that
//! bundle's replay have both run: an SDK keeps one DoFn instance per
//! bundle running at once, so the replay then meets, on a one-worker job,
//! the very instance that processed its input the first time.
//!
//! With [`Strictness::coders`] the job runner takes one more before the
//! engine sees the plan: the pipeline's root transforms are not fused with
//! each other, so every element passing between them is encoded by the SDK
//! that made it and decoded by the one that reads it, as a runner that
//! fuses differently would.
//!
//! Every choice comes from one seed ([`Strictness::seed`]), reported with
//! what strict mode did ([`StrictReport`]) when a bundle fails, so a failing
//! test says which transforms ran twice and on what.

use super::pending::Queued;
use crate::plan::{StageIdx, StageVec};

/// How often a stage's bundles after its first run again: one in this many.
const REPLAY_ONE_IN: u64 = 8;

/// Most replays a report describes one by one (the count goes on).
const REPORTED_REPLAYS: usize = 8;

/// Elements of a replayed bundle shown in a report.
const SHOWN_ELEMENTS: usize = 3;

/// Bytes of an element shown in a report.
const SHOWN_BYTES: usize = 48;

/// Strict mode's settings (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strictness {
    /// Seed of every choice strict mode makes.
    pub seed: u64,
    /// Whether the plan keeps the pipeline's root transforms in stages of
    /// their own, so that elements cross their coders between them (the
    /// job runner's doing, reported with the rest).
    pub coders: bool,
}

/// What strict mode did during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrictReport {
    /// The seed the choices came from.
    pub seed: u64,
    /// Whether elements crossed their coders between the pipeline's root
    /// transforms ([`Strictness::coders`]).
    pub coders: bool,
    /// Bundles run a second time.
    pub replayed_bundles: u64,
    /// Bundles cut smaller than the runner would have made them.
    pub smaller_bundles: u64,
    /// Bundles whose input was reordered.
    pub reordered_bundles: u64,
    /// The first replays, one by one.
    pub replays: Vec<Replay>,
}

/// One replayed bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The stage (its transforms' names).
    pub stage: String,
    /// Elements in the bundle.
    pub elements: usize,
    /// The first few elements: their encoded bytes, printable ASCII as is
    /// and other bytes as `\xNN`, each cut after some 50 bytes.
    pub sample: Vec<String>,
}

impl StrictReport {
    /// The note a failed job's error ends with: what strict mode did, the
    /// rules it tests, and how to run without it.
    pub fn failure_note(&self) -> String {
        let mut note = format!(
            "Refract's strict mode (seed {}) ran {} bundle(s) twice, cut {} bundle(s) smaller \
             and reordered the input of {}, as any runner may. A DoFn must not depend on how \
             often its input is processed (no side effects outside the runner, no counts in \
             its fields across bundles), on bundle sizes, or on element order.",
            self.seed, self.replayed_bundles, self.smaller_bundles, self.reordered_bundles
        );
        if self.coders {
            note.push_str(
                " It ran each of the pipeline's transforms as stages of its own: every element \
                 crossed its coder between transforms (a coder that loses data fails here).",
            );
        }
        if !self.replays.is_empty() {
            note.push_str(" Run twice:");
            for replay in &self.replays {
                note.push_str(&format!(
                    "\n  - '{}', a bundle of {} element(s): {}",
                    replay.stage,
                    replay.elements,
                    replay.sample.join(", ")
                ));
            }
            if self.replayed_bundles > self.replays.len() as u64 {
                note.push_str("\n  - ...");
            }
        }
        note.push_str(
            "\nTo compare, run with --experiments=refract_strict=off (pytest: --refract-no-strict).",
        );
        note
    }
}

/// Strict mode's state during a run.
#[derive(Debug)]
pub(super) struct Strict {
    rng: SplitMix64,
    /// Per stage: whether a bundle of it was already cut.
    cut: StageVec<bool>,
    /// Per stage: bundles that succeeded, counted up to two (the first is
    /// the one always run again).
    succeeded: StageVec<u8>,
    /// Per stage: the size of a bundle to run again, which its next bundle
    /// takes.
    replay_size: StageVec<Option<usize>>,
    report: StrictReport,
}

impl Strict {
    /// Strict mode for a plan of `stages` stages.
    pub(super) fn new(strictness: Strictness, stages: usize) -> Self {
        Strict {
            rng: SplitMix64(strictness.seed),
            cut: StageVec::from(vec![false; stages]),
            succeeded: StageVec::from(vec![0; stages]),
            replay_size: StageVec::from(vec![None; stages]),
            report: StrictReport {
                seed: strictness.seed,
                coders: strictness.coders,
                ..StrictReport::default()
            },
        }
    }

    /// What strict mode did so far.
    pub(super) fn report(&self) -> &StrictReport {
        &self.report
    }

    /// How many of `waiting` elements the next bundle of `stage` takes,
    /// where the runner would take `planned`: all of a bundle to run again,
    /// at most half of what waits for the stage's first bundle, a random
    /// share after it.
    pub(super) fn bundle_elements(
        &mut self,
        stage: StageIdx,
        planned: usize,
        waiting: usize,
    ) -> usize {
        if let Some(size) = self.replay_size[stage].take() {
            return size.min(waiting).max(1);
        }
        let limit = planned.min(waiting);
        if limit < 2 {
            return planned;
        }
        let first = !std::mem::replace(&mut self.cut[stage], true);
        let chosen = if first {
            limit / 2
        } else {
            1 + self.rng.below(limit as u64) as usize
        };
        if chosen < limit {
            self.report.smaller_bundles += 1;
        }
        chosen
    }

    /// How many bundles of `stage` may run at once where the runner would
    /// run `usual`: one until the stage's first bundle and its replay have
    /// both succeeded.
    pub(super) fn bundles_at_once(&self, stage: StageIdx, usual: usize) -> usize {
        if self.succeeded[stage] < 2 {
            usual.min(1)
        } else {
            usual
        }
    }

    /// Puts a bundle's entries in random order.
    pub(super) fn reorder(&mut self, entries: &mut [Queued]) {
        if entries.len() < 2 {
            return;
        }
        for i in (1..entries.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            entries.swap(i, j);
        }
        self.report.reordered_bundles += 1;
    }

    /// Whether a bundle of `stage` (named `name`) that succeeded with input
    /// `elements` is to run again instead of committing: the stage's first,
    /// then one in [`REPLAY_ONE_IN`].
    pub(super) fn replays(&mut self, stage: StageIdx, name: &str, elements: &[Queued]) -> bool {
        let first = self.succeeded[stage] == 0;
        self.succeeded[stage] = self.succeeded[stage].saturating_add(1).min(2);
        if !first && self.rng.below(REPLAY_ONE_IN) != 0 {
            return false;
        }
        self.report.replayed_bundles += 1;
        let size: usize = elements.iter().map(Queued::len).sum();
        self.replay_size[stage] = (size > 0).then_some(size);
        if self.report.replays.len() < REPORTED_REPLAYS {
            let mut sample = Vec::new();
            for entry in elements {
                entry.for_each_element(|e| {
                    if sample.len() < SHOWN_ELEMENTS {
                        sample.push(printable(e.value()));
                    }
                });
                if sample.len() >= SHOWN_ELEMENTS {
                    break;
                }
            }
            self.report.replays.push(Replay {
                stage: name.to_string(),
                elements: elements.iter().map(Queued::len).sum(),
                sample,
            });
        }
        true
    }
}

/// An element's encoded bytes as text a person can read: printable ASCII
/// as is, other bytes as `\xNN`, cut after [`SHOWN_BYTES`] bytes. The
/// runner does not know user coders: this is the bytes, not the value.
fn printable(bytes: &[u8]) -> String {
    let mut text = String::from("\"");
    for &b in bytes.iter().take(SHOWN_BYTES) {
        match b {
            b'"' | b'\\' => {
                text.push('\\');
                text.push(b as char);
            }
            0x20..=0x7e => text.push(b as char),
            _ => text.push_str(&format!("\\x{b:02x}")),
        }
    }
    text.push('"');
    if bytes.len() > SHOWN_BYTES {
        text.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    text
}

/// A small, seedable generator (SplitMix64): the same seed makes the
/// same choices.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::TypedIndex;

    fn stage(i: usize) -> StageIdx {
        StageIdx::from_index(i)
    }

    #[test]
    fn a_stage_first_bundle_takes_half_then_random_shares() {
        let mut strict = Strict::new(
            Strictness {
                seed: 7,
                coders: false,
            },
            2,
        );
        assert_eq!(strict.bundle_elements(stage(0), 100, 3), 1);
        for _ in 0..100 {
            let n = strict.bundle_elements(stage(0), 100, 10);
            assert!((1..=10).contains(&n), "{n}");
        }
        // One element, or a plan of one, is left as it is.
        assert_eq!(strict.bundle_elements(stage(1), 100, 1), 100);
        assert_eq!(strict.bundle_elements(stage(1), 1, 50), 1);
        assert_eq!(strict.bundle_elements(stage(1), 100, 4), 2);
    }

    #[test]
    fn a_bundle_to_run_again_is_the_next_bundle_whole() {
        let mut strict = Strict::new(
            Strictness {
                seed: 9,
                coders: false,
            },
            1,
        );
        strict.replay_size[stage(0)] = Some(3);
        // The first bundle would take half (5), a later one a random share.
        assert_eq!(strict.bundle_elements(stage(0), 100, 10), 3);
        assert_eq!(strict.bundle_elements(stage(0), 100, 10), 5);
        // A bundle of nothing but timers leaves sizes to the usual rules.
        assert!(strict.replays(stage(0), "A", &[]));
        assert_eq!(strict.replay_size[stage(0)], None);
    }

    #[test]
    fn the_first_bundle_of_each_stage_replays_then_about_one_in_eight() {
        let mut strict = Strict::new(
            Strictness {
                seed: 3,
                coders: false,
            },
            2,
        );
        assert!(strict.replays(stage(0), "A", &[]));
        assert!(strict.replays(stage(1), "B", &[]));
        let later = (0..8000)
            .filter(|_| strict.replays(stage(0), "A", &[]))
            .count();
        assert!((800..1200).contains(&later), "{later}");
        assert_eq!(strict.report().replays.len(), REPORTED_REPLAYS);
        assert_eq!(strict.report().replayed_bundles, 2 + later as u64);
    }

    #[test]
    fn a_stage_runs_one_bundle_at_a_time_until_its_first_replay_ran() {
        let mut strict = Strict::new(
            Strictness {
                seed: 1,
                coders: false,
            },
            2,
        );
        assert_eq!(strict.bundles_at_once(stage(0), 4), 1);
        assert!(strict.replays(stage(0), "A", &[]));
        assert_eq!(strict.bundles_at_once(stage(0), 4), 1);
        strict.replays(stage(0), "A", &[]);
        assert_eq!(strict.bundles_at_once(stage(0), 4), 4);
        assert_eq!(strict.bundles_at_once(stage(1), 4), 1);
        assert_eq!(strict.bundles_at_once(stage(1), 0), 0);
    }

    #[test]
    fn the_same_seed_makes_the_same_choices() {
        let choices = |seed| {
            let mut strict = Strict::new(
                Strictness {
                    seed,
                    coders: false,
                },
                1,
            );
            (0..50)
                .map(|_| strict.bundle_elements(stage(0), 1000, 1000))
                .collect::<Vec<_>>()
        };
        assert_eq!(choices(11), choices(11));
        assert_ne!(choices(11), choices(12));
    }

    #[test]
    fn elements_show_as_readable_bytes() {
        assert_eq!(printable(b"\x05\x01a"), "\"\\x05\\x01a\"");
        assert_eq!(printable(b"say \"hi\""), "\"say \\\"hi\\\"\"");
        let long = vec![b'x'; 100];
        assert!(printable(&long).ends_with("... (100 bytes)"));
    }

    #[test]
    fn the_failure_note_names_replayed_stages_and_the_way_out() {
        let mut strict = Strict::new(
            Strictness {
                seed: 5,
                coders: false,
            },
            1,
        );
        strict.replays(stage(0), "Number", &[]);
        let note = strict.report().failure_note();
        assert!(
            note.contains("strict mode (seed 5) ran 1 bundle(s) twice"),
            "{note}"
        );
        assert!(
            note.contains("'Number', a bundle of 0 element(s)"),
            "{note}"
        );
        assert!(note.contains("--experiments=refract_strict=off"), "{note}");
    }
}
