//! Refract's execution engine.
//!
//! # The model, briefly
//!
//! A Beam pipeline, once translated, is a graph of *stages* connected by
//! *PCollections*. Every element is a *windowed value*: bytes, an event-time
//! timestamp, the windows it belongs to and a pane. Each stage has an *input
//! watermark* — a promise that no element older than it will arrive any more —
//! which is the minimum of its producers' *output watermarks*; a stage's
//! output watermark is the minimum of its input watermark and of everything
//! it still holds (pending elements, in-flight bundles, timers). Grouping
//! emits a window's pane when the input watermark passes the window's end (or
//! its trigger says so); bounded inputs end with the watermark at +∞, which
//! flushes every window.
//!
//! The engine never sees a proto. Translation hands it a [`plan::Plan`], and
//! a [`executor::StageExecutor`] that runs SDK stages' bundles. Each bundle is
//! a transaction: its consumed input, outputs, state writes and timers are
//! committed together or not at all.

pub mod allocator;
pub mod bundle_slots;
#[cfg(test)]
mod checkpoint_format_tests;
pub mod coder;
pub mod executor;
pub mod grouping;
mod holds;
pub mod key_groups;
pub mod manager;
pub mod plan;
pub mod shards;
pub mod spill;
pub mod spilled_output;
pub mod state;
pub mod time;
pub mod timers;
pub mod trigger;
pub mod window;
pub mod window_merge;
