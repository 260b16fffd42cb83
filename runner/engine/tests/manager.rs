//! Engine tests with no SDK: a fake executor plays the SDK stages, so that
//! scheduling, watermarks, grouping, side inputs, timers and bundle
//! transactions are checked on their own, under several bundle shapes.
//!
//! One file per topic under `manager/`; `fixtures.rs` is what they share.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

#[path = "manager/backpressure.rs"]
mod backpressure;
#[path = "manager/failures.rs"]
mod failures;
#[path = "manager/fixtures.rs"]
mod fixtures;
#[path = "manager/grouping.rs"]
mod grouping;
#[path = "manager/resharding.rs"]
mod resharding;
#[path = "manager/shards.rs"]
mod shards;
#[path = "manager/side_inputs.rs"]
mod side_inputs;
#[path = "manager/state_and_timers.rs"]
mod state_and_timers;
