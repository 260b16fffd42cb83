//! Keeping glibc's allocator from handing memory back only to fault it in
//! again.
//!
//! The engine frees and reallocates big buffers in a steady rhythm: a
//! GroupByKey's key table (tens of megabytes for a few hundred thousand
//! distinct keys) is emptied by its firing and refilled by the next
//! bundle's input, and firings emit megabytes at a time. glibc trims the
//! top of its heap back to the kernel whenever the free space there passes
//! its trim threshold, and that threshold moves with the sizes of the
//! mmapped blocks the process happened to free. Depending on that
//! history, a run either keeps its heap or returns and re-faults it every
//! cycle: the same engine benchmark measured 27 ms in one mode and 47 ms
//! in the other (2.2 million minor page faults and 4 s of system time
//! instead of 22 thousand and 0.1 s), and which mode a run lands in
//! changed with unrelated edits (a pane 16 bytes smaller flipped it).
//!
//! Fixing the thresholds makes it one mode: blocks under
//! [`MMAP_THRESHOLD`] come from the heap (re-used, not re-faulted), and up
//! to [`TRIM_THRESHOLD`] of free heap top is kept. That much freed memory
//! may stay resident: it is small next to any memory budget the runner
//! is given, and it does not grow with the input.

/// Allocations at least this big are mapped on their own (and unmapped
/// when freed), as glibc's dynamic threshold would settle at anyway.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Free memory at the top of the heap kept for re-use before trimming.
pub const TRIM_THRESHOLD: usize = 128 << 20;

/// Fixes glibc's mmap and trim thresholds (see the module docs). Call it
/// first thing in a binary's `main`, before threads start; elsewhere than
/// on glibc it does nothing. Whether glibc took the settings is returned,
/// for the caller to log.
pub fn tune_system_allocator() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let as_int = |n: usize| libc::c_int::try_from(n).unwrap_or(libc::c_int::MAX);
        // SAFETY: `mallopt` only changes the allocator's parameters; it
        // is safe to call at any time, and the values are in range.
        let mmap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, as_int(MMAP_THRESHOLD)) };
        // SAFETY: as above.
        let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, as_int(TRIM_THRESHOLD)) };
        mmap == 1 && trim == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_the_settings() {
        let took = super::tune_system_allocator();
        assert_eq!(took, cfg!(all(target_os = "linux", target_env = "gnu")));
    }
}
