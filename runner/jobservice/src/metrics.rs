//! A job's committed metrics, aggregated from the MonitoringInfos of its
//! successful bundles, and their presentation for `GetJobMetrics`.

mod coding;
mod int_metric;
mod value;

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use refract_proto::job_api::MetricResults;
use refract_proto::pipeline::MonitoringInfo;

use value::MetricValue;

pub use int_metric::{decode_int_metric, IntMetric, DISTRIBUTION_INT64, LATEST_INT64, SUM_INT64};

/// URN prefix of user metrics, the only ones `GetJobMetrics` returns (the
/// Python client would otherwise list system counters as user counters in
/// namespace `beam`).
const USER_METRIC_PREFIX: &str = "beam:metric:user:";
/// The one system metric reported: elements per PCollection, which people
/// (the UI, `/metrics`) read to see a job's progress. SDK clients skip it
/// (it has no namespace and name), and the per-bundle samples (sizes,
/// timings) stay out.
const ELEMENT_COUNT_URN: &str = "beam:metric:element_count:v1";
/// Label whose value names the transform a metric belongs to.
const PTRANSFORM_LABEL: &str = "PTRANSFORM";

/// Identity of one aggregated metric: contributions with the same URN, type
/// and labels are combined.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct MetricKey {
    urn: String,
    type_urn: String,
    labels: BTreeMap<String, String>,
}

impl MetricKey {
    fn of(info: &MonitoringInfo) -> Self {
        Self {
            urn: info.urn.clone(),
            type_urn: info.r#type.clone(),
            labels: info
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

#[derive(Default)]
struct Inner {
    committed: BTreeMap<MetricKey, MetricValue>,
    transform_names: HashMap<String, String>,
}

/// Committed metric totals of one job. Shared by the runner (which commits)
/// and the job service (which answers `GetJobMetrics`); all methods take
/// `&self` and are safe to call from any thread.
#[derive(Default)]
pub struct JobMetrics {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for JobMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobMetrics")
            .field("metrics", &self.inner.lock().committed.len())
            .finish()
    }
}

impl JobMetrics {
    /// Folds one successful bundle's final MonitoringInfos (per-bundle
    /// deltas) into the committed totals: counters are summed, distributions
    /// merged (count, sum, min, max), gauges keep the latest timestamp,
    /// string sets are unioned. Contributions are keyed by (urn, type,
    /// labels). A payload that does not decode as its declared type is
    /// skipped with a warning rather than poisoning the totals. Call this only
    /// for bundles that succeeded, so failed attempts are never counted.
    pub fn commit(&self, infos: &[MonitoringInfo]) {
        let decoded: Vec<(MetricKey, MetricValue)> = infos
            .iter()
            .filter_map(
                |info| match MetricValue::decode(&info.r#type, &info.payload) {
                    Ok(value) => Some((MetricKey::of(info), value)),
                    Err(error) => {
                        tracing::warn!(
                            urn = %info.urn,
                            r#type = %info.r#type,
                            %error,
                            "skipping malformed monitoring info"
                        );
                        None
                    }
                },
            )
            .collect();
        let mut inner = self.inner.lock();
        for (key, value) in decoded {
            merge_into(&mut inner.committed, key, value);
        }
    }

    /// Every committed total as a MonitoringInfo with the labels bundles
    /// reported, for checkpoints: [`Self::restore`] of these gives back
    /// the same totals.
    pub fn committed_infos(&self) -> Vec<MonitoringInfo> {
        self.inner
            .lock()
            .committed
            .iter()
            .map(|(key, value)| MonitoringInfo {
                urn: key.urn.clone(),
                r#type: key.type_urn.clone(),
                payload: value.encode(),
                labels: key.labels.clone().into_iter().collect(),
                start_time: None,
            })
            .collect()
    }

    /// Replaces the committed totals with a checkpoint's (see
    /// [`Self::committed_infos`]), so that a recovered job's counters go on
    /// from where its checkpoint left them instead of from zero.
    pub fn restore(&self, infos: &[MonitoringInfo]) {
        self.inner.lock().committed.clear();
        self.commit(infos);
    }

    /// Maps `PTRANSFORM` label values (the transform ids used in bundle
    /// descriptors) to the pipeline's unique names, which is what SDK
    /// metric queries filter on (`MetricsFilter.with_step`). Entries are
    /// added to any set before, so it may be called once per stage.
    pub fn set_transform_names(&self, names: HashMap<String, String>) {
        self.inner.lock().transform_names.extend(names);
    }

    /// The other way round from [`Self::set_transform_names`]: each
    /// transform's id by its unique name, to move metrics kept under
    /// another version's ids onto this pipeline's.
    pub fn transform_ids_by_name(&self) -> HashMap<String, String> {
        (self.inner.lock().transform_names.iter())
            .map(|(id, name)| (name.clone(), id.clone()))
            .collect()
    }

    /// The job's metrics as `GetJobMetrics` returns them: user metrics and
    /// per-PCollection element counts,
    /// (`beam:metric:user:*`), `PTRANSFORM` labels replaced by unique names,
    /// in both `committed` and `attempted` (the runner only ever reports
    /// committed values, and clients read either).
    pub fn snapshot(&self) -> MetricResults {
        let inner = self.inner.lock();
        let mut relabelled: BTreeMap<MetricKey, MetricValue> = BTreeMap::new();
        for (key, value) in &inner.committed {
            if !key.urn.starts_with(USER_METRIC_PREFIX) && key.urn != ELEMENT_COUNT_URN {
                continue;
            }
            let mut key = key.clone();
            if let Some(step) = key.labels.get_mut(PTRANSFORM_LABEL) {
                if let Some(name) = inner.transform_names.get(step.as_str()) {
                    step.clone_from(name);
                }
            }
            // Two descriptor ids can name the same pipeline transform.
            merge_into(&mut relabelled, key, value.clone());
        }
        drop(inner);
        let committed: Vec<MonitoringInfo> = relabelled
            .into_iter()
            .map(|(key, value)| MonitoringInfo {
                urn: key.urn,
                r#type: key.type_urn,
                payload: value.encode(),
                labels: key.labels.into_iter().collect(),
                start_time: None,
            })
            .collect();
        MetricResults {
            attempted: committed.clone(),
            committed,
        }
    }
}

fn merge_into(map: &mut BTreeMap<MetricKey, MetricValue>, key: MetricKey, value: MetricValue) {
    match map.get_mut(&key) {
        Some(existing) => existing.merge(value),
        None => {
            map.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::value::type_urn;
    use super::*;

    fn counter(step: &str, name: &str, v: u8) -> MonitoringInfo {
        MonitoringInfo {
            urn: "beam:metric:user:sum_int64:v1".into(),
            r#type: type_urn::SUM_INT64.into(),
            payload: vec![v],
            labels: [
                ("PTRANSFORM".to_string(), step.to_string()),
                ("NAMESPACE".to_string(), "ns".to_string()),
                ("NAME".to_string(), name.to_string()),
            ]
            .into_iter()
            .collect(),
            start_time: None,
        }
    }

    #[test]
    fn restoring_committed_infos_gives_the_same_totals() {
        let m = JobMetrics::default();
        m.commit(&[counter("s1", "c", 2), counter("s1", "c", 3)]);
        m.commit(&[counter("s2", "d", 4)]);
        let restored = JobMetrics::default();
        restored.commit(&[counter("s9", "stale", 1)]);
        restored.restore(&m.committed_infos());
        assert_eq!(restored.snapshot(), m.snapshot());
        restored.commit(&[counter("s1", "c", 1)]);
        let totals: Vec<Vec<u8>> = restored
            .snapshot()
            .committed
            .into_iter()
            .map(|i| i.payload)
            .collect();
        assert_eq!(totals, vec![vec![6], vec![4]]);
    }

    #[test]
    fn sums_per_step_relabels_and_keeps_only_element_counts_of_system_metrics() {
        let m = JobMetrics::default();
        let sampled = MonitoringInfo {
            urn: "beam:metric:sampled_byte_size:v1".into(),
            r#type: type_urn::DISTRIBUTION_INT64.into(),
            payload: vec![1, 5, 5, 5],
            labels: [("PCOLLECTION".to_string(), "pc".to_string())]
                .into_iter()
                .collect(),
            start_time: None,
        };
        let system = MonitoringInfo {
            urn: "beam:metric:element_count:v1".into(),
            r#type: type_urn::SUM_INT64.into(),
            payload: vec![7],
            labels: [("PCOLLECTION".to_string(), "pc".to_string())]
                .into_iter()
                .collect(),
            start_time: None,
        };
        m.commit(&[
            counter("t1", "c", 1),
            counter("t2", "c", 2),
            system.clone(),
            sampled,
        ]);
        m.commit(&[counter("t1", "c", 3), system]);
        m.set_transform_names([("t1".to_string(), "count1".to_string())].into());
        let results = m.snapshot();
        assert_eq!(results.committed, results.attempted);
        let mut got: Vec<(String, Vec<u8>)> = results
            .committed
            .iter()
            .map(|i| {
                let label = i.labels.get("PTRANSFORM").or(i.labels.get("PCOLLECTION"));
                (label.cloned().unwrap_or_default(), i.payload.clone())
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("count1".into(), vec![4]),
                ("pc".into(), vec![14]),
                ("t2".into(), vec![2])
            ]
        );
    }

    #[test]
    fn ids_mapping_to_one_name_merge_and_bad_payloads_are_skipped() {
        let m = JobMetrics::default();
        let mut bad = counter("a", "c", 0);
        bad.payload = vec![0x80];
        m.commit(&[counter("a", "c", 1), counter("b", "c", 2), bad]);
        m.set_transform_names(
            [
                ("a".to_string(), "Step".to_string()),
                ("b".to_string(), "Step".to_string()),
            ]
            .into(),
        );
        let results = m.snapshot();
        assert_eq!(results.committed.len(), 1);
        assert_eq!(results.committed[0].payload, vec![3]);
    }
}
