//! In-memory homes for the state the SDK reads and writes.
//!
//! [`SideInputStore`] holds materialized side inputs by (consumer transform,
//! tag, window); [`UserStateStore`] holds user state — bags, ordered lists
//! and multimaps — by (transform, state id, window, key). A bundle never
//! writes to either directly: it writes to a [`BundleOverlay`], which reads
//! through to the stores and is applied by the engine only when the bundle
//! succeeded. That is what makes a bundle a transaction: a failed bundle's
//! state writes are simply dropped with its overlay.
//!
//! One module each: `side_inputs`, `user_state` (with `bag_spill`, where
//! bags go past the stage's share of memory) and `overlay`.

mod bag_spill;
#[cfg(test)]
mod bag_spill_tests;
mod overlay;
mod side_inputs;
#[cfg(test)]
mod tests;
mod user_state;

pub(crate) use bag_spill::SpilledBags;
pub use overlay::BundleOverlay;
pub(crate) use side_inputs::SideInputSnapshot;
pub use side_inputs::{SideInputId, SideInputStore};
pub(crate) use user_state::UserStateSnapshot;
pub use user_state::{
    BagWrite, MultimapWrite, OrderedListOp, OrderedListWrite, UserStateStore, UserStateWrites,
};
