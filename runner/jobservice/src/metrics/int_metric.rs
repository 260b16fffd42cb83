//! The integer metrics (counters, distributions, gauges) as people and
//! scrapers read them: the CLI's `status` and the UI's `/metrics` show the
//! numbers the Job API returns, decoded by the same code.

use super::value::{type_urn, MetricValue};

pub use type_urn::{DISTRIBUTION_INT64, LATEST_INT64, SUM_INT64};

/// A decoded integer metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntMetric {
    /// A counter's total.
    Counter(i64),
    /// A distribution's summary.
    Distribution {
        /// Values seen.
        count: i64,
        /// Their sum.
        sum: i64,
        /// The smallest.
        min: i64,
        /// The largest.
        max: i64,
    },
    /// A gauge's latest value.
    Gauge(i64),
}

/// The payload of a metric of type `type_urn` as an integer metric; `None`
/// for other types and for payloads that do not decode.
pub fn decode_int_metric(type_urn: &str, payload: &[u8]) -> Option<IntMetric> {
    match MetricValue::decode(type_urn, payload).ok()? {
        MetricValue::SumInt64(total) => Some(IntMetric::Counter(total)),
        // An empty distribution shows as zeros, not as the extremes it
        // starts from.
        MetricValue::DistributionInt64(d) | MetricValue::CountedDistributionInt64(d)
            if d.count == 0 =>
        {
            Some(IntMetric::Distribution {
                count: 0,
                sum: 0,
                min: 0,
                max: 0,
            })
        }
        MetricValue::DistributionInt64(d) | MetricValue::CountedDistributionInt64(d) => {
            Some(IntMetric::Distribution {
                count: d.count,
                sum: d.sum,
                min: d.min,
                max: d.max,
            })
        }
        MetricValue::LatestInt64 { value, .. } => Some(IntMetric::Gauge(value)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_integer_kinds_and_refuses_the_rest() {
        let decode = decode_int_metric;
        assert_eq!(decode(SUM_INT64, &[7]), Some(IntMetric::Counter(7)));
        assert_eq!(
            decode(DISTRIBUTION_INT64, &[2, 5, 1, 4]),
            Some(IntMetric::Distribution {
                count: 2,
                sum: 5,
                min: 1,
                max: 4
            })
        );
        assert_eq!(
            decode(DISTRIBUTION_INT64, &[0]),
            Some(IntMetric::Distribution {
                count: 0,
                sum: 0,
                min: 0,
                max: 0
            })
        );
        assert_eq!(decode(LATEST_INT64, &[9, 3]), Some(IntMetric::Gauge(3)));
        assert_eq!(decode(SUM_INT64, &[0x80]), None, "truncated");
        assert_eq!(decode("beam:metrics:sum_double:v1", &[0; 8]), None);
    }
}
