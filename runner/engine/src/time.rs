//! Event time as the Beam model defines it: milliseconds since the epoch,
//! bounded by the model's minimum and maximum timestamps.

/// Milliseconds since the Unix epoch, as carried in windowed values and timers.
pub type Timestamp = i64;

/// The smallest timestamp Beam can represent (`BoundedWindow.TIMESTAMP_MIN_VALUE`).
pub const MIN_TIMESTAMP: Timestamp = -9_223_372_036_854_775;
/// The largest timestamp Beam can represent; a watermark here means "no more data".
pub const MAX_TIMESTAMP: Timestamp = 9_223_372_036_854_775;
/// The global window's max timestamp (Java/Go value: MAX minus one day).
pub const GLOBAL_WINDOW_MAX_TIMESTAMP: Timestamp = 9_223_371_950_454_775;
