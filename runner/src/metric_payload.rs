//! Reading the integer MonitoringInfo payloads (counters, distributions,
//! gauges) for people and scrapers: the CLI's `status` and the UI's
//! `/metrics` show the same numbers the Job API returns.

/// Type URN of an int64 counter.
pub const SUM_INT64: &str = "beam:metrics:sum_int64:v1";
/// Type URN of an int64 distribution (count, sum, min, max).
pub const DISTRIBUTION_INT64: &str = "beam:metrics:distribution_int64:v1";
/// Type URN of an int64 gauge (timestamp, value).
pub const LATEST_INT64: &str = "beam:metrics:latest_int64:v1";

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
pub fn decode(type_urn: &str, payload: &[u8]) -> Option<IntMetric> {
    let values = varints(payload)?;
    match (type_urn, values.as_slice()) {
        (SUM_INT64, [v]) => Some(IntMetric::Counter(*v)),
        (DISTRIBUTION_INT64, [0]) => Some(IntMetric::Distribution {
            count: 0,
            sum: 0,
            min: 0,
            max: 0,
        }),
        (DISTRIBUTION_INT64, [count, sum, min, max]) => Some(IntMetric::Distribution {
            count: *count,
            sum: *sum,
            min: *min,
            max: *max,
        }),
        (LATEST_INT64, [_, v]) => Some(IntMetric::Gauge(*v)),
        _ => None,
    }
}

/// A payload of concatenated varints.
fn varints(payload: &[u8]) -> Option<Vec<i64>> {
    let mut values = Vec::new();
    let mut rest = payload;
    while !rest.is_empty() {
        let (v, n) = refract_engine::coder::decode_varint_i64(rest).ok()?;
        values.push(v);
        rest = &rest[n..];
    }
    Some(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_integer_kinds_and_refuses_the_rest() {
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
        assert_eq!(decode(LATEST_INT64, &[9, 3]), Some(IntMetric::Gauge(3)));
        assert_eq!(decode(SUM_INT64, &[0x80]), None, "truncated");
        assert_eq!(decode("beam:metrics:sum_double:v1", &[0; 8]), None);
    }
}
