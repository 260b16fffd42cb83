//! Whether the server is busy, for `--idle_shutdown_timeout`.

/// Counts running jobs, so that an idle server can shut itself down
/// (`--idle_shutdown_timeout`, which Beam's SDKs pass to a Prism binary
/// they start, so that it does not outlive them).
#[derive(Debug)]
pub struct Activity {
    running: parking_lot::Mutex<(usize, std::time::Instant)>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            running: parking_lot::Mutex::new((0, std::time::Instant::now())),
        }
    }
}

impl Activity {
    pub(crate) fn job_started(&self) {
        let mut r = self.running.lock();
        r.0 += 1;
        r.1 = std::time::Instant::now();
    }

    pub(crate) fn job_ended(&self) {
        let mut r = self.running.lock();
        r.0 = r.0.saturating_sub(1);
        r.1 = std::time::Instant::now();
    }

    /// How long no job has been running (zero while one is).
    pub fn idle_for(&self) -> std::time::Duration {
        let r = self.running.lock();
        if r.0 > 0 {
            std::time::Duration::ZERO
        } else {
            r.1.elapsed()
        }
    }
}
