//! Trigger state machines, one per (key, window).
//!
//! A trigger decides *when* a window's buffered data is emitted as a pane.
//! Each node of a [`Trigger`] tree has a little state (a count, a deadline,
//! whether it has finished) and answers three questions: did an element
//! arrive (`on_element`), should the pane fire now (`should_fire`), and what
//! changes once it has fired (`on_fire`). Composite triggers combine their
//! children's answers. A trigger that has *finished* never fires again; the
//! window is then closed and further data for it is dropped.
//!
//! The "context" a trigger sees is the window's end, the input watermark and
//! processing time — everything else is the node's own state.
//!
//! What can be told of a trigger before it runs — whether it may fire
//! before the end of the window, on processing time alone, or first at
//! the end of the window — is answered here too, by methods on
//! [`Trigger`], so that every stage that plans around a trigger (side
//! inputs, a GroupByKey's evaluation and its spill) reads the same
//! answers. They follow Beam's model: `Never` fires only the final pane
//! when its window expires, and `Repeatedly(t)` fires whenever `t` would.

use crate::plan::Trigger;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

/// What a trigger may look at when deciding.
#[derive(Debug, Clone, Copy)]
pub struct TriggerContext {
    /// The window's max timestamp.
    pub window_end: Timestamp,
    /// The grouping stage's input watermark.
    pub watermark: Timestamp,
    /// Processing time, in ms.
    pub now: Timestamp,
}

impl TriggerContext {
    fn past_end_of_window(&self) -> bool {
        self.watermark > self.window_end
    }
}

impl Trigger {
    /// Whether this trigger can fire a pane before the watermark passes the
    /// end of its window. Only then may a reader see a window's data while
    /// the window is still open (a streaming side input, for one): with any
    /// other trigger the first pane comes when the window closes. It is
    /// also why a GroupByKey evaluates a key after an element arrives: if
    /// not, an element before the end cannot make the trigger ready, and
    /// the key waits for the watermark. (Composites answer for any part
    /// that can: a safe over-estimate.)
    pub fn fires_before_window_end(&self) -> bool {
        match self {
            // `Never` fires only the final pane, when its window expires.
            Trigger::Default | Trigger::Never => false,
            Trigger::AfterEndOfWindow { early, .. } => early.is_some(),
            Trigger::OrFinally { main, finally } => {
                main.fires_before_window_end() || finally.fires_before_window_end()
            }
            Trigger::AfterAll(parts) | Trigger::AfterAny(parts) | Trigger::AfterEach(parts) => {
                parts.iter().any(Trigger::fires_before_window_end)
            }
            Trigger::Repeat(inner) => inner.fires_before_window_end(),
            Trigger::ElementCount(_)
            | Trigger::AfterProcessingTime { .. }
            | Trigger::AfterSynchronizedProcessingTime
            | Trigger::Always => true,
        }
    }

    /// Whether this trigger can fire on processing time alone, with no
    /// element arriving and the watermark standing still: a GroupByKey
    /// with such a trigger has deadlines to wake up for, and looks at
    /// every key whenever it evaluates.
    pub(crate) fn fires_on_processing_time(&self) -> bool {
        match self {
            Trigger::AfterProcessingTime { .. } | Trigger::AfterSynchronizedProcessingTime => true,
            Trigger::AfterEndOfWindow { early, late } => {
                early
                    .as_deref()
                    .is_some_and(Trigger::fires_on_processing_time)
                    || late
                        .as_deref()
                        .is_some_and(Trigger::fires_on_processing_time)
            }
            Trigger::AfterAll(parts) | Trigger::AfterAny(parts) | Trigger::AfterEach(parts) => {
                parts.iter().any(Trigger::fires_on_processing_time)
            }
            Trigger::OrFinally { main, finally } => {
                main.fires_on_processing_time() || finally.fires_on_processing_time()
            }
            Trigger::Repeat(inner) => inner.fires_on_processing_time(),
            Trigger::Default | Trigger::ElementCount(_) | Trigger::Always | Trigger::Never => false,
        }
    }

    /// Whether this trigger's first pane is the on-time one, fired when
    /// the watermark passes the end of the window, and nothing before then
    /// changes its state. A GroupByKey may spill a window's panes only
    /// then: a pane read back is one that has not fired, with fresh
    /// trigger state, and a window past its end has fired (or closed).
    /// Not `Never`, whose only pane comes when the window expires, which
    /// with allowed lateness is after its end; composites other than
    /// `Repeatedly` answer no (their parts may keep state).
    pub(crate) fn first_fires_at_window_end(&self) -> bool {
        match self {
            Trigger::Default => true,
            Trigger::AfterEndOfWindow { early, .. } => early.is_none(),
            Trigger::Repeat(inner) => inner.first_fires_at_window_end(),
            Trigger::Never
            | Trigger::ElementCount(_)
            | Trigger::AfterProcessingTime { .. }
            | Trigger::AfterSynchronizedProcessingTime
            | Trigger::AfterAll(_)
            | Trigger::AfterAny(_)
            | Trigger::AfterEach(_)
            | Trigger::Always
            | Trigger::OrFinally { .. } => false,
        }
    }
}

/// The run-time state of a trigger tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerState {
    node: Node,
    finished: bool,
    children: Box<[TriggerState]>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Node {
    /// Default: on time, then every late element.
    Default,
    /// AfterWatermark with optional early and late children (children[0]
    /// early, children[1] late, by presence flags).
    EndOfWindow {
        has_early: bool,
        has_late: bool,
        on_time_fired: bool,
    },
    /// 32-bit counts keep the node (held by every pane of a grouping
    /// buffer) at 16 bytes: Beam's `AfterCount` is an int32, and counting
    /// stops mattering once `seen` reaches `target`, so it saturates.
    ElementCount {
        target: i32,
        seen: i32,
    },
    /// Out of line: it is the biggest node, and every pane of a grouping
    /// buffer holds a node.
    ProcessingTime(Box<ProcessingTimeNode>),
    All,
    Any,
    Each {
        current: u32,
    },
    Always {
        pending: bool,
    },
    Never,
    OrFinally,
    Repeat,
}

/// An AfterProcessingTime trigger's delay and alignment, and when it fires
/// once an element has started its clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ProcessingTimeNode {
    delay: i64,
    align: Option<(i64, i64)>,
    deadline: Option<Timestamp>,
}

impl Node {
    fn processing_time(delay: i64, align: Option<(i64, i64)>) -> Self {
        Node::ProcessingTime(Box::new(ProcessingTimeNode {
            delay,
            align,
            deadline: None,
        }))
    }
}

impl TriggerState {
    /// Fresh state for `trigger`.
    pub fn new(trigger: &Trigger) -> Self {
        let (node, children) = match trigger {
            Trigger::Default => (Node::Default, vec![]),
            Trigger::AfterEndOfWindow { early, late } => {
                let mut children = Vec::new();
                if let Some(e) = early {
                    children.push(TriggerState::new(e));
                }
                if let Some(l) = late {
                    children.push(TriggerState::new(l));
                }
                (
                    Node::EndOfWindow {
                        has_early: early.is_some(),
                        has_late: late.is_some(),
                        on_time_fired: false,
                    },
                    children,
                )
            }
            Trigger::ElementCount(n) => (
                Node::ElementCount {
                    target: i32::try_from(*n).unwrap_or(i32::MAX).max(1),
                    seen: 0,
                },
                vec![],
            ),
            Trigger::AfterProcessingTime { delay_ms, align } => {
                (Node::processing_time(*delay_ms, *align), vec![])
            }
            Trigger::AfterSynchronizedProcessingTime => (Node::processing_time(0, None), vec![]),
            Trigger::AfterAll(subs) => (Node::All, subs.iter().map(TriggerState::new).collect()),
            Trigger::AfterAny(subs) => (Node::Any, subs.iter().map(TriggerState::new).collect()),
            Trigger::AfterEach(subs) => (
                Node::Each { current: 0 },
                subs.iter().map(TriggerState::new).collect(),
            ),
            Trigger::Always => (Node::Always { pending: false }, vec![]),
            Trigger::Never => (Node::Never, vec![]),
            Trigger::OrFinally { main, finally } => (
                Node::OrFinally,
                vec![TriggerState::new(main), TriggerState::new(finally)],
            ),
            Trigger::Repeat(sub) => (Node::Repeat, vec![TriggerState::new(sub)]),
        };
        TriggerState {
            node,
            finished: false,
            children: children.into_boxed_slice(),
        }
    }

    /// Whether this trigger will never fire again.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn early(&mut self) -> Option<&mut TriggerState> {
        match self.node {
            Node::EndOfWindow {
                has_early: true, ..
            } => self.children.first_mut(),
            _ => None,
        }
    }

    fn late(&mut self) -> Option<&mut TriggerState> {
        match self.node {
            Node::EndOfWindow {
                has_early,
                has_late: true,
                ..
            } => self.children.get_mut(usize::from(has_early)),
            _ => None,
        }
    }

    /// An element arrived in the window.
    pub fn on_element(&mut self, ctx: &TriggerContext) {
        if self.finished {
            return;
        }
        match &mut self.node {
            Node::ElementCount { seen, .. } => *seen = seen.saturating_add(1),
            Node::ProcessingTime(clock) => {
                if clock.deadline.is_none() {
                    let mut at = ctx.now.saturating_add(clock.delay);
                    if let Some((period, offset)) = clock.align {
                        if period > 0 {
                            let rem = (at - offset).rem_euclid(period);
                            if rem != 0 {
                                at += period - rem;
                            }
                        }
                    }
                    clock.deadline = Some(at);
                }
            }
            Node::Always { pending } => *pending = true,
            Node::EndOfWindow { on_time_fired, .. } => {
                let fired = *on_time_fired;
                if !ctx.past_end_of_window() || !fired {
                    if let Some(e) = self.early() {
                        e.on_element(ctx);
                    }
                } else if let Some(l) = self.late() {
                    l.on_element(ctx);
                }
            }
            Node::Each { current } => {
                let c = *current as usize;
                if let Some(child) = self.children.get_mut(c) {
                    child.on_element(ctx);
                }
            }
            _ => {
                for c in &mut self.children {
                    c.on_element(ctx);
                }
            }
        }
    }

    /// Merge another window's trigger state into this one (merging windows).
    pub fn merge(&mut self, other: &TriggerState) {
        self.finished = self.finished && other.finished;
        match (&mut self.node, &other.node) {
            (Node::ElementCount { seen, .. }, Node::ElementCount { seen: s2, .. }) => {
                *seen = seen.saturating_add(*s2)
            }
            (Node::ProcessingTime(clock), Node::ProcessingTime(other)) => {
                clock.deadline = crate::time::earliest(clock.deadline, other.deadline)
            }
            (Node::Always { pending }, Node::Always { pending: p2 }) => *pending |= p2,
            (
                Node::EndOfWindow { on_time_fired, .. },
                Node::EndOfWindow {
                    on_time_fired: o2, ..
                },
            ) => *on_time_fired &= o2,
            _ => {}
        }
        for (c, o) in self.children.iter_mut().zip(other.children.iter()) {
            c.merge(o);
        }
    }

    /// Whether the pane should fire now.
    pub fn should_fire(&self, ctx: &TriggerContext) -> bool {
        if self.finished {
            return false;
        }
        match &self.node {
            Node::Default => ctx.past_end_of_window(),
            Node::EndOfWindow {
                has_early,
                has_late,
                on_time_fired,
            } => {
                if !on_time_fired {
                    if ctx.past_end_of_window() {
                        return true;
                    }
                    *has_early && self.children[0].should_fire(ctx)
                } else {
                    *has_late && self.children[usize::from(*has_early)].should_fire(ctx)
                }
            }
            Node::ElementCount { target, seen } => seen >= target,
            Node::ProcessingTime(clock) => clock.deadline.is_some_and(|d| ctx.now >= d),
            Node::All => self
                .children
                .iter()
                .all(|c| c.finished || c.should_fire(ctx)),
            Node::Any => self.children.iter().any(|c| c.should_fire(ctx)),
            Node::Each { current } => self
                .children
                .get(*current as usize)
                .is_some_and(|c| c.should_fire(ctx)),
            Node::Always { pending } => *pending,
            Node::Never => false,
            Node::OrFinally => {
                self.children[0].should_fire(ctx) || self.children[1].should_fire(ctx)
            }
            Node::Repeat => self.children[0].should_fire(ctx),
        }
    }

    /// The pane fired: advance the state.
    pub fn on_fire(&mut self, ctx: &TriggerContext) {
        if self.finished {
            return;
        }
        match &mut self.node {
            Node::Default => {}
            Node::EndOfWindow {
                has_early,
                has_late,
                on_time_fired,
            } => {
                let (early, late) = (*has_early, *has_late);
                if !*on_time_fired {
                    if ctx.past_end_of_window() {
                        *on_time_fired = true;
                        if !late {
                            self.finished = true;
                        }
                    } else if early {
                        let e = &mut self.children[0];
                        e.on_fire(ctx);
                        // Early firings repeat until the end of the window.
                        if e.finished {
                            e.reset();
                        }
                    }
                } else if late {
                    let l = &mut self.children[usize::from(early)];
                    l.on_fire(ctx);
                    if l.finished {
                        l.reset();
                    }
                }
            }
            Node::ElementCount { .. } | Node::ProcessingTime(_) => self.finished = true,
            Node::All | Node::Any => {
                for c in &mut self.children {
                    c.finished = true;
                }
                self.finished = true;
            }
            Node::Each { current } => {
                let c = *current as usize;
                if let Some(child) = self.children.get_mut(c) {
                    child.on_fire(ctx);
                    if child.finished {
                        let next = c + 1;
                        match u32::try_from(next) {
                            Ok(next) if (next as usize) < self.children.len() => {
                                if let Node::Each { current } = &mut self.node {
                                    *current = next;
                                }
                            }
                            _ => self.finished = true,
                        }
                    }
                }
            }
            Node::Always { pending } => *pending = false,
            Node::Never => {}
            Node::OrFinally => {
                if self.children[1].should_fire(ctx) {
                    self.finished = true;
                } else {
                    self.children[0].on_fire(ctx);
                    if self.children[0].finished {
                        self.finished = true;
                    }
                }
            }
            Node::Repeat => {
                let child = &mut self.children[0];
                child.on_fire(ctx);
                if child.finished {
                    child.reset();
                }
            }
        }
    }

    /// Back to the initial state (for repeated sub-triggers).
    fn reset(&mut self) {
        self.finished = false;
        match &mut self.node {
            Node::ElementCount { seen, .. } => *seen = 0,
            Node::ProcessingTime(clock) => clock.deadline = None,
            Node::Each { current } => *current = 0,
            Node::Always { pending } => *pending = false,
            Node::EndOfWindow { on_time_fired, .. } => *on_time_fired = false,
            _ => {}
        }
        for c in &mut self.children {
            c.reset();
        }
    }

    /// The earliest processing time at which this trigger could fire, so the
    /// engine knows when to wake up.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        if self.finished {
            return None;
        }
        let own = match &self.node {
            Node::ProcessingTime(clock) => clock.deadline,
            _ => None,
        };
        self.children
            .iter()
            .filter_map(TriggerState::next_deadline)
            .chain(own)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every predicate of [`Trigger`] over every kind of trigger, as Beam
    /// models it: `Never` fires only when its window expires, and
    /// `Repeatedly(t)` whenever `t` would.
    #[test]
    fn trigger_predicates_answer_for_every_kind_of_trigger() {
        let count = || Box::new(Trigger::ElementCount(1));
        let clock = || {
            Box::new(Trigger::AfterProcessingTime {
                delay_ms: 1000,
                align: None,
            })
        };
        let at_end = |early: Option<Box<Trigger>>, late: Option<Box<Trigger>>| {
            Trigger::AfterEndOfWindow { early, late }
        };
        // (trigger, fires before the window's end, fires on processing
        // time, first fires at the window's end)
        let table: Vec<(Trigger, bool, bool, bool)> = vec![
            (Trigger::Default, false, false, true),
            (at_end(None, None), false, false, true),
            (at_end(None, Some(count())), false, false, true),
            (at_end(None, Some(clock())), false, true, true),
            (at_end(Some(count()), None), true, false, false),
            (at_end(Some(clock()), Some(count())), true, true, false),
            (Trigger::ElementCount(1), true, false, false),
            (*clock(), true, true, false),
            (Trigger::AfterSynchronizedProcessingTime, true, true, false),
            (
                Trigger::AfterAll(vec![Trigger::Default]),
                false,
                false,
                false,
            ),
            (
                Trigger::AfterAny(vec![Trigger::Default, *count()]),
                true,
                false,
                false,
            ),
            (
                Trigger::AfterEach(vec![*count(), *clock()]),
                true,
                true,
                false,
            ),
            (Trigger::Always, true, false, false),
            (Trigger::Never, false, false, false),
            (
                Trigger::OrFinally {
                    main: Box::new(Trigger::Default),
                    finally: Box::new(Trigger::Never),
                },
                false,
                false,
                false,
            ),
            (
                Trigger::OrFinally {
                    main: count(),
                    finally: clock(),
                },
                true,
                true,
                false,
            ),
            (
                Trigger::Repeat(Box::new(Trigger::Default)),
                false,
                false,
                true,
            ),
            (
                Trigger::Repeat(Box::new(at_end(None, None))),
                false,
                false,
                true,
            ),
            (Trigger::Repeat(count()), true, false, false),
            (Trigger::Repeat(clock()), true, true, false),
            (
                Trigger::Repeat(Box::new(Trigger::Never)),
                false,
                false,
                false,
            ),
        ];
        let mut kinds = std::collections::BTreeSet::new();
        for (trigger, before_end, processing_time, first_at_end) in &table {
            kinds.insert(kind(trigger));
            assert_eq!(
                trigger.fires_before_window_end(),
                *before_end,
                "fires_before_window_end of {trigger:?}"
            );
            assert_eq!(
                trigger.fires_on_processing_time(),
                *processing_time,
                "fires_on_processing_time of {trigger:?}"
            );
            assert_eq!(
                trigger.first_fires_at_window_end(),
                *first_at_end,
                "first_fires_at_window_end of {trigger:?}"
            );
            // A trigger that first fires at the end cannot fire before it.
            assert!(!(first_at_end & before_end), "{trigger:?}");
        }
        assert_eq!(kinds.len(), 12, "every kind of trigger is in the table");
    }

    /// The kind of `trigger`, by name; exhaustive, so a new kind of
    /// trigger must be added to the table above.
    fn kind(trigger: &Trigger) -> &'static str {
        match trigger {
            Trigger::Default => "Default",
            Trigger::AfterEndOfWindow { .. } => "AfterEndOfWindow",
            Trigger::ElementCount(_) => "ElementCount",
            Trigger::AfterProcessingTime { .. } => "AfterProcessingTime",
            Trigger::AfterSynchronizedProcessingTime => "AfterSynchronizedProcessingTime",
            Trigger::AfterAll(_) => "AfterAll",
            Trigger::AfterAny(_) => "AfterAny",
            Trigger::AfterEach(_) => "AfterEach",
            Trigger::Always => "Always",
            Trigger::Never => "Never",
            Trigger::OrFinally { .. } => "OrFinally",
            Trigger::Repeat(_) => "Repeat",
        }
    }

    fn ctx(watermark: Timestamp, now: Timestamp) -> TriggerContext {
        TriggerContext {
            window_end: 9,
            watermark,
            now,
        }
    }

    #[test]
    fn default_fires_at_end_of_window_and_repeats() {
        let mut t = TriggerState::new(&Trigger::Default);
        t.on_element(&ctx(0, 0));
        assert!(!t.should_fire(&ctx(9, 0)));
        assert!(t.should_fire(&ctx(10, 0)));
        t.on_fire(&ctx(10, 0));
        assert!(!t.is_finished());
    }

    #[test]
    fn element_count_fires_once() {
        let mut t = TriggerState::new(&Trigger::ElementCount(2));
        t.on_element(&ctx(0, 0));
        assert!(!t.should_fire(&ctx(0, 0)));
        t.on_element(&ctx(0, 0));
        assert!(t.should_fire(&ctx(0, 0)));
        t.on_fire(&ctx(0, 0));
        assert!(t.is_finished());
    }

    /// Counts are 32-bit: a count past an int32 (not in Beam's protos,
    /// but a `Trigger` can say it) waits as long as one can, and counting
    /// saturates instead of wrapping round to "not yet".
    #[test]
    fn element_counts_saturate() {
        let mut t = TriggerState::new(&Trigger::ElementCount(1 << 40));
        t.on_element(&ctx(0, 0));
        assert!(!t.should_fire(&ctx(0, 0)));
        for _ in 0..40 {
            let other = t.clone();
            t.merge(&other);
        }
        assert!(t.should_fire(&ctx(0, 0)));
        t.on_element(&ctx(0, 0));
        assert!(t.should_fire(&ctx(0, 0)));
    }

    /// Checkpoints written when the counts were 64-bit read back the same:
    /// postcard writes both widths as the same varints.
    #[test]
    fn narrower_counts_keep_the_checkpoint_bytes() {
        #[derive(Serialize)]
        enum WideNode {
            _Default,
            _EndOfWindow(bool, bool, bool),
            ElementCount { target: i64, seen: i64 },
        }
        #[derive(Serialize)]
        struct WideState {
            node: WideNode,
            finished: bool,
            children: Vec<WideState>,
        }
        let mut t = TriggerState::new(&Trigger::ElementCount(300));
        for _ in 0..200 {
            t.on_element(&ctx(0, 0));
        }
        let wide = WideState {
            node: WideNode::ElementCount {
                target: 300,
                seen: 200,
            },
            finished: false,
            children: Vec::new(),
        };
        let narrow = postcard::to_allocvec(&t).expect("encodes");
        assert_eq!(narrow, postcard::to_allocvec(&wide).expect("encodes"));
        let back: TriggerState = postcard::from_bytes(&narrow).expect("decodes");
        assert_eq!(back, t);
    }

    #[test]
    fn repeatedly_resets_its_child() {
        let mut t = TriggerState::new(&Trigger::Repeat(Box::new(Trigger::ElementCount(2))));
        for round in 0..3 {
            t.on_element(&ctx(0, 0));
            assert!(!t.should_fire(&ctx(0, 0)), "round {round}");
            t.on_element(&ctx(0, 0));
            assert!(t.should_fire(&ctx(0, 0)));
            t.on_fire(&ctx(0, 0));
            assert!(!t.is_finished());
        }
    }

    #[test]
    fn after_watermark_with_early_and_late_firings() {
        let trig = Trigger::AfterEndOfWindow {
            early: Some(Box::new(Trigger::ElementCount(1))),
            late: Some(Box::new(Trigger::ElementCount(1))),
        };
        let mut t = TriggerState::new(&trig);
        t.on_element(&ctx(0, 0));
        assert!(t.should_fire(&ctx(0, 0)));
        t.on_fire(&ctx(0, 0));
        assert!(!t.should_fire(&ctx(0, 0)));
        t.on_element(&ctx(0, 0));
        assert!(t.should_fire(&ctx(0, 0)), "early firings repeat");
        t.on_fire(&ctx(0, 0));
        assert!(t.should_fire(&ctx(10, 0)), "on time");
        t.on_fire(&ctx(10, 0));
        assert!(!t.should_fire(&ctx(11, 0)));
        t.on_element(&ctx(11, 0));
        assert!(t.should_fire(&ctx(11, 0)), "late");
        t.on_fire(&ctx(11, 0));
        assert!(!t.is_finished());
    }

    #[test]
    fn after_watermark_without_late_finishes_on_time() {
        let mut t = TriggerState::new(&Trigger::AfterEndOfWindow {
            early: None,
            late: None,
        });
        assert!(t.should_fire(&ctx(10, 0)));
        t.on_fire(&ctx(10, 0));
        assert!(t.is_finished());
    }

    #[test]
    fn processing_time_deadline_and_alignment() {
        let mut t = TriggerState::new(&Trigger::AfterProcessingTime {
            delay_ms: 5,
            align: Some((10, 0)),
        });
        t.on_element(&ctx(0, 1));
        assert_eq!(t.next_deadline(), Some(10));
        assert!(!t.should_fire(&ctx(0, 9)));
        assert!(t.should_fire(&ctx(0, 10)));
    }

    #[test]
    fn composites() {
        let two = || Box::new(Trigger::ElementCount(2));
        let mut each = TriggerState::new(&Trigger::AfterEach(vec![
            Trigger::ElementCount(1),
            Trigger::ElementCount(2),
        ]));
        each.on_element(&ctx(0, 0));
        assert!(each.should_fire(&ctx(0, 0)));
        each.on_fire(&ctx(0, 0));
        each.on_element(&ctx(0, 0));
        assert!(!each.should_fire(&ctx(0, 0)));
        each.on_element(&ctx(0, 0));
        assert!(each.should_fire(&ctx(0, 0)));
        each.on_fire(&ctx(0, 0));
        assert!(each.is_finished());

        let mut or = TriggerState::new(&Trigger::OrFinally {
            main: Box::new(Trigger::Repeat(two())),
            finally: Box::new(Trigger::ElementCount(3)),
        });
        or.on_element(&ctx(0, 0));
        or.on_element(&ctx(0, 0));
        or.on_fire(&ctx(0, 0));
        assert!(!or.is_finished());
        or.on_element(&ctx(0, 0));
        assert!(or.should_fire(&ctx(0, 0)));
        or.on_fire(&ctx(0, 0));
        assert!(or.is_finished());

        let mut all = TriggerState::new(&Trigger::AfterAll(vec![
            Trigger::ElementCount(1),
            Trigger::ElementCount(2),
        ]));
        all.on_element(&ctx(0, 0));
        assert!(!all.should_fire(&ctx(0, 0)));
        all.on_element(&ctx(0, 0));
        assert!(all.should_fire(&ctx(0, 0)));

        let mut any = TriggerState::new(&Trigger::AfterAny(vec![
            Trigger::ElementCount(3),
            Trigger::Default,
        ]));
        any.on_element(&ctx(0, 0));
        assert!(any.should_fire(&ctx(10, 0)));
        any.on_fire(&ctx(10, 0));
        assert!(any.is_finished());
    }
}
