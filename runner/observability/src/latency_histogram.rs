//! A fixed-bucket histogram of bundle durations, kept per stage so that
//! `/metrics` can render it as a Prometheus histogram without an OTLP
//! pipeline, and so that the OTLP histogram uses the same bounds.

/// Upper bounds of the buckets, in seconds: bundles range from a fraction
/// of a millisecond (a tiny batch stage) to many seconds (a long SDF
/// restriction).
pub const BOUNDS_SECONDS: [f64; 14] = [
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Counts of bundle durations per bucket, with their sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencyHistogram {
    /// Observations per bucket: `counts[i]` ≤ `BOUNDS_SECONDS[i]`, the last
    /// one above every bound.
    counts: [u64; BOUNDS_SECONDS.len() + 1],
    /// Sum of the observations, in seconds.
    sum: f64,
}

impl LatencyHistogram {
    /// Adds one bundle that took `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        let bucket = BOUNDS_SECONDS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(BOUNDS_SECONDS.len());
        self.counts[bucket] += 1;
        self.sum += seconds;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Their sum, in seconds.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// `(upper bound, observations at or below it)` for every bound and
    /// then `+Inf`, as Prometheus' cumulative `le` buckets.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        BOUNDS_SECONDS
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts)
            .map(|(bound, n)| {
                total += n;
                (bound, total)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_inclusive() {
        let mut h = LatencyHistogram::default();
        h.observe(0.001);
        h.observe(0.003);
        h.observe(100.0);
        let buckets = h.cumulative();
        assert_eq!(buckets[0], (0.001, 1));
        assert_eq!(buckets[1], (0.002, 1));
        assert_eq!(buckets[2], (0.005, 2));
        assert_eq!(buckets.last().copied(), Some((f64::INFINITY, 3)));
        assert_eq!(h.count(), 3);
        assert!((h.sum() - 100.004).abs() < 1e-9);
    }
}
