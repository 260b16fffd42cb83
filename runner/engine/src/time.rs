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

/// `t` if it lies strictly between the ends of time: a watermark at either
/// end is a state (nothing yet, or done), not a point that a lag can be
/// measured from.
pub fn finite(t: Timestamp) -> Option<Timestamp> {
    (t > MIN_TIMESTAMP && t < MAX_TIMESTAMP).then_some(t)
}

/// The earlier of two optional deadlines or holds, where none means no
/// bound (so `Option`'s own order, which puts `None` first, will not do).
pub fn earliest<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The wall clock in event-time units (ms since the epoch). The engine never
/// reads it itself — its processing time is a clock it is handed — but the
/// runner hands it this one and measures watermark lags against it.
pub fn wall_clock_ms() -> Timestamp {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Timestamp)
}
