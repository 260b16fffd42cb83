//! Typed MonitoringInfo values and how two of them combine.
//!
//! The combination rules are the model's (see `metrics.proto`): counters
//! add, distributions merge count/sum/min/max, gauges keep the value with the
//! latest timestamp, string sets union. Types the runner cannot aggregate
//! keep the most recently committed payload, which is exact for a metric
//! reported once and the best available otherwise.

use std::collections::BTreeSet;

use super::coding::{put_double, put_string_iterable, put_varint, DecodeError, Reader};

/// Type URNs (`MonitoringInfo.type`) this module understands.
pub(crate) mod type_urn {
    /// An int64 counter.
    pub const SUM_INT64: &str = "beam:metrics:sum_int64:v1";
    pub const SUM_DOUBLE: &str = "beam:metrics:sum_double:v1";
    /// An int64 distribution (count, sum, min, max).
    pub const DISTRIBUTION_INT64: &str = "beam:metrics:distribution_int64:v1";
    pub const DISTRIBUTION_DOUBLE: &str = "beam:metrics:distribution_double:v1";
    /// An int64 gauge (timestamp, value).
    pub const LATEST_INT64: &str = "beam:metrics:latest_int64:v1";
    pub const LATEST_DOUBLE: &str = "beam:metrics:latest_double:v1";
    pub const SET_STRING: &str = "beam:metrics:set_string:v1";
}

/// count, sum, min, max of the values seen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Distribution<T> {
    pub count: i64,
    pub sum: T,
    pub min: T,
    pub max: T,
}

/// A decoded MonitoringInfo payload.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MetricValue {
    SumInt64(i64),
    SumDouble(f64),
    DistributionInt64(Distribution<i64>),
    /// An int64 distribution as the TypeScript SDK writes and reads it: its
    /// four numbers as an iterable (a 4-byte count, 4, then the varints).
    /// Kept in that layout so that the SDK's client reads the total back.
    CountedDistributionInt64(Distribution<i64>),
    DistributionDouble(Distribution<f64>),
    LatestInt64 {
        millis: i64,
        value: i64,
    },
    LatestDouble {
        millis: i64,
        value: f64,
    },
    StringSet(BTreeSet<String>),
    /// A type without aggregation support here: the latest payload, as sent.
    Opaque(Vec<u8>),
}

impl MetricValue {
    /// Decodes `payload` according to `type_urn`. Unknown types become
    /// [`MetricValue::Opaque`]; malformed known ones are an error.
    pub(crate) fn decode(type_urn: &str, payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let value = match type_urn {
            type_urn::SUM_INT64 => Self::SumInt64(r.varint()?),
            type_urn::SUM_DOUBLE => Self::SumDouble(r.double()?),
            type_urn::DISTRIBUTION_INT64 => match counted_four_varints(payload) {
                Some(d) => Self::CountedDistributionInt64(d),
                None => {
                    let count = r.varint()?;
                    // An empty distribution may omit the rest (proto comment).
                    if count == 0 {
                        Self::DistributionInt64(empty_int_distribution())
                    } else {
                        Self::DistributionInt64(Distribution {
                            count,
                            sum: r.varint()?,
                            min: r.varint()?,
                            max: r.varint()?,
                        })
                    }
                }
            },
            type_urn::DISTRIBUTION_DOUBLE => {
                let count = r.varint()?;
                if count == 0 {
                    Self::DistributionDouble(empty_double_distribution())
                } else {
                    Self::DistributionDouble(Distribution {
                        count,
                        sum: r.double()?,
                        min: r.double()?,
                        max: r.double()?,
                    })
                }
            }
            type_urn::LATEST_INT64 => Self::LatestInt64 {
                millis: r.varint()?,
                value: r.varint()?,
            },
            type_urn::LATEST_DOUBLE => Self::LatestDouble {
                millis: r.varint()?,
                value: r.double()?,
            },
            type_urn::SET_STRING => Self::StringSet(r.string_iterable()?.into_iter().collect()),
            _ => Self::Opaque(payload.to_vec()),
        };
        Ok(value)
    }

    /// Folds `other` (a later contribution to the same metric) into `self`.
    pub(crate) fn merge(&mut self, other: MetricValue) {
        match (self, other) {
            (Self::SumInt64(a), Self::SumInt64(b)) => *a = a.saturating_add(b),
            (Self::SumDouble(a), Self::SumDouble(b)) => *a += b,
            (
                Self::DistributionInt64(a) | Self::CountedDistributionInt64(a),
                Self::DistributionInt64(b) | Self::CountedDistributionInt64(b),
            ) => {
                if b.count == 0 {
                    return;
                }
                if a.count == 0 {
                    *a = b;
                    return;
                }
                a.count = a.count.saturating_add(b.count);
                a.sum = a.sum.saturating_add(b.sum);
                a.min = a.min.min(b.min);
                a.max = a.max.max(b.max);
            }
            (Self::DistributionDouble(a), Self::DistributionDouble(b)) => {
                if b.count == 0 {
                    return;
                }
                if a.count == 0 {
                    *a = b;
                    return;
                }
                a.count = a.count.saturating_add(b.count);
                a.sum += b.sum;
                a.min = a.min.min(b.min);
                a.max = a.max.max(b.max);
            }
            (
                Self::LatestInt64 { millis, value },
                Self::LatestInt64 {
                    millis: m,
                    value: v,
                },
            ) => {
                if m >= *millis {
                    *millis = m;
                    *value = v;
                }
            }
            (
                Self::LatestDouble { millis, value },
                Self::LatestDouble {
                    millis: m,
                    value: v,
                },
            ) => {
                if m >= *millis {
                    *millis = m;
                    *value = v;
                }
            }
            (Self::StringSet(a), Self::StringSet(b)) => a.extend(b),
            // Opaque types, or (impossible, since the type is part of the
            // key) mismatched kinds: the latest contribution wins.
            (this, other) => *this = other,
        }
    }

    /// Encodes the value as its type's payload. Empty distributions are
    /// written in full (count 0, sum 0, min `MAX`, max `MIN`), as the Python
    /// SDK does and expects.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Self::SumInt64(v) => put_varint(&mut out, *v),
            Self::SumDouble(v) => put_double(&mut out, *v),
            Self::DistributionInt64(d) => {
                put_varint(&mut out, d.count);
                put_varint(&mut out, d.sum);
                put_varint(&mut out, d.min);
                put_varint(&mut out, d.max);
            }
            Self::CountedDistributionInt64(d) => {
                out.extend_from_slice(&COUNTED_FOUR);
                put_varint(&mut out, d.count);
                put_varint(&mut out, d.sum);
                put_varint(&mut out, d.min);
                put_varint(&mut out, d.max);
            }
            Self::DistributionDouble(d) => {
                put_varint(&mut out, d.count);
                put_double(&mut out, d.sum);
                put_double(&mut out, d.min);
                put_double(&mut out, d.max);
            }
            Self::LatestInt64 { millis, value } => {
                put_varint(&mut out, *millis);
                put_varint(&mut out, *value);
            }
            Self::LatestDouble { millis, value } => {
                put_varint(&mut out, *millis);
                put_double(&mut out, *value);
            }
            Self::StringSet(set) => put_string_iterable(&mut out, set.iter()),
            Self::Opaque(bytes) => out.extend_from_slice(bytes),
        }
        out
    }
}

/// The 4-byte big-endian count an iterable of four values starts with.
const COUNTED_FOUR: [u8; 4] = [0, 0, 0, 4];

/// The distribution in `payload` if it is written as an iterable of its
/// four numbers (the TypeScript SDK's layout). A standard payload never
/// reads so: one starting with those bytes would be the empty distribution
/// (count 0, sum 0, min 0, max 4) with bytes after its end.
fn counted_four_varints(payload: &[u8]) -> Option<Distribution<i64>> {
    let body = payload.strip_prefix(&COUNTED_FOUR)?;
    let mut r = Reader::new(body);
    let d = Distribution {
        count: r.varint().ok()?,
        sum: r.varint().ok()?,
        min: r.varint().ok()?,
        max: r.varint().ok()?,
    };
    r.is_empty().then_some(d)
}

fn empty_int_distribution() -> Distribution<i64> {
    Distribution {
        count: 0,
        sum: 0,
        min: i64::MAX,
        max: i64::MIN,
    }
}

fn empty_double_distribution() -> Distribution<f64> {
    Distribution {
        count: 0,
        sum: 0.0,
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(count: i64, sum: i64, min: i64, max: i64) -> Vec<u8> {
        MetricValue::DistributionInt64(Distribution {
            count,
            sum,
            min,
            max,
        })
        .encode()
    }

    #[test]
    fn counters_add() {
        let mut a = MetricValue::decode(type_urn::SUM_INT64, &[2]).unwrap();
        a.merge(MetricValue::decode(type_urn::SUM_INT64, &[4]).unwrap());
        assert_eq!(a.encode(), vec![6]);
    }

    #[test]
    fn distributions_merge_and_ignore_empty_sides() {
        let mut a = MetricValue::decode(type_urn::DISTRIBUTION_INT64, &[0]).unwrap();
        a.merge(MetricValue::decode(type_urn::DISTRIBUTION_INT64, &dist(2, 4, 1, 3)).unwrap());
        a.merge(MetricValue::decode(type_urn::DISTRIBUTION_INT64, &dist(1, -5, -5, -5)).unwrap());
        a.merge(
            MetricValue::decode(
                type_urn::DISTRIBUTION_INT64,
                &dist(0, 0, i64::MAX, i64::MIN),
            )
            .unwrap(),
        );
        assert_eq!(a.encode(), dist(3, -1, -5, 3));
    }

    #[test]
    fn typescript_distributions_merge_and_keep_their_layout() {
        let counted = |count: u8, sum: u8, min: u8, max: u8| vec![0, 0, 0, 4, count, sum, min, max];
        let mut a =
            MetricValue::decode(type_urn::DISTRIBUTION_INT64, &counted(2, 3, 1, 2)).unwrap();
        a.merge(MetricValue::decode(type_urn::DISTRIBUTION_INT64, &counted(1, 3, 3, 3)).unwrap());
        assert_eq!(a.encode(), counted(3, 6, 1, 3));
        // Four standard varints are not mistaken for it.
        let standard =
            MetricValue::decode(type_urn::DISTRIBUTION_INT64, &dist(0, 0, 0, 4)).unwrap();
        assert!(matches!(standard, MetricValue::DistributionInt64(_)));
    }

    #[test]
    fn empty_distribution_encodes_in_full() {
        let a = MetricValue::decode(type_urn::DISTRIBUTION_INT64, &[0]).unwrap();
        assert_eq!(a.encode(), dist(0, 0, i64::MAX, i64::MIN));
    }

    #[test]
    fn gauge_keeps_latest_timestamp() {
        let g = |millis, value| MetricValue::LatestInt64 { millis, value };
        let mut a = g(10, 1);
        a.merge(g(5, 2));
        assert_eq!(a, g(10, 1));
        a.merge(g(20, 3));
        assert_eq!(a, g(20, 3));
    }

    #[test]
    fn string_sets_union() {
        let set = |items: &[&str]| {
            MetricValue::StringSet(items.iter().map(|s| s.to_string()).collect()).encode()
        };
        let mut a = MetricValue::decode(type_urn::SET_STRING, &set(&["a", "b"])).unwrap();
        a.merge(MetricValue::decode(type_urn::SET_STRING, &set(&["b", "zzz"])).unwrap());
        assert_eq!(a.encode(), set(&["a", "b", "zzz"]));
    }

    #[test]
    fn double_types_round_trip() {
        let mut a = MetricValue::SumDouble(1.5);
        a.merge(
            MetricValue::decode(type_urn::SUM_DOUBLE, &MetricValue::SumDouble(2.0).encode())
                .unwrap(),
        );
        assert_eq!(a, MetricValue::SumDouble(3.5));
        let d = MetricValue::DistributionDouble(Distribution {
            count: 2,
            sum: 3.0,
            min: 1.0,
            max: 2.0,
        });
        assert_eq!(
            MetricValue::decode(type_urn::DISTRIBUTION_DOUBLE, &d.encode()).unwrap(),
            d
        );
    }

    #[test]
    fn unknown_types_keep_latest_payload_and_bad_payloads_error() {
        let mut a = MetricValue::decode("beam:metrics:bounded_trie:v1", &[1, 2]).unwrap();
        a.merge(MetricValue::decode("beam:metrics:bounded_trie:v1", &[3]).unwrap());
        assert_eq!(a.encode(), vec![3]);
        assert!(MetricValue::decode(type_urn::SUM_INT64, &[]).is_err());
        assert!(MetricValue::decode(type_urn::DISTRIBUTION_INT64, &[2, 1]).is_err());
    }
}
