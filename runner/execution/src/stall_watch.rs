//! Bundles that stop making progress: found from the SDK's progress
//! reports, listed in the UI (`refract_observability::stalled_bundles`), told in the job's messages, and optionally
//! failed so that the engine retries them (`--bundle_stall_timeout`,
//! `--fail_stalled_bundles`).
//!
//! A worker that answers the control stream can still be stuck: a DoFn
//! waiting on a lock, a remote call without a timeout, a loop that never
//! ends. The Fn API lets a runner ask how a running bundle is doing
//! (`ProcessBundleProgressRequest`); the answer is the bundle's metrics so
//! far: elements per PCollection, bytes read, user metrics, and the time
//! spent in each transform. A bundle has made progress when any of those
//! but time changed, or when it sent the runner output. A bundle whose
//! reports show nothing but time passing for the stall timeout is stalled,
//! and the transform whose time grew is where it is. (A DoFn that spends
//! that long on one element without a metric is reported too, as
//! Dataflow's "operation ongoing" warning does; only the report, unless
//! the server was told to fail them.)
//!
//! Failing a stalled bundle ends the runner's side of it: its output and
//! state requests are refused from then on and the engine runs its input
//! again. The SDK has no instruction to abandon a bundle, so the stuck
//! thread stays in the worker until it returns by itself.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use refract_engine::time::wall_clock_ms;
use refract_jobservice::{decode_int_metric, IntMetric, Job};
use refract_observability::stalled_bundles::{StalledBundle, StalledBundles};
use refract_proto::fn_api::{
    instruction_request, instruction_response, ProcessBundleProgressRequest,
};
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::pipeline::MonitoringInfo;
use refract_sdk_harness::Worker;

/// What the server does about bundles that make no progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallPolicy {
    /// How long a bundle may go without progress before it is reported.
    pub timeout: Duration,
    /// Fail a stalled bundle (the engine retries it) instead of only
    /// reporting it.
    pub fail: bool,
}

impl StallPolicy {
    /// Dataflow's "operation ongoing" warning comes after five minutes;
    /// the same here, reported and not failed.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

    /// How often a running bundle's progress is asked for: often enough
    /// to see a stall within a quarter of the timeout, never more than
    /// four times a second nor less than twice a minute.
    fn probe_every(&self) -> Duration {
        (self.timeout / 4).clamp(Duration::from_millis(250), Duration::from_secs(30))
    }
}

impl Default for StallPolicy {
    fn default() -> Self {
        StallPolicy {
            timeout: Self::DEFAULT_TIMEOUT,
            fail: false,
        }
    }
}

/// Metric URNs that measure time spent, which grows in a stuck bundle too.
fn measures_time(urn: &str) -> bool {
    urn.starts_with("beam:metric:pardo_execution_time:")
        || urn.starts_with("beam:metric:ptransform_execution_time:")
}

/// A digest of everything a progress report says the bundle has done, less
/// the time it took; the same for the same metrics in any order.
fn work_done(infos: &[MonitoringInfo]) -> u64 {
    let mut each: Vec<u64> = infos
        .iter()
        .filter(|info| !measures_time(&info.urn))
        .map(|info| {
            let mut labels: Vec<_> = info.labels.iter().collect();
            labels.sort();
            let mut hasher = DefaultHasher::new();
            (&info.urn, labels, &info.payload).hash(&mut hasher);
            hasher.finish()
        })
        .collect();
    each.sort_unstable();
    let mut hasher = DefaultHasher::new();
    each.hash(&mut hasher);
    hasher.finish()
}

/// Milliseconds spent per transform so far, from a report's time metrics.
fn busy_ms(infos: &[MonitoringInfo]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for info in infos.iter().filter(|info| measures_time(&info.urn)) {
        let (Some(transform), Some(IntMetric::Counter(ms))) = (
            info.labels.get("PTRANSFORM"),
            decode_int_metric(&info.r#type, &info.payload),
        ) else {
            continue;
        };
        *out.entry(transform.clone()).or_insert(0) += u64::try_from(ms).unwrap_or(0);
    }
    out
}

/// The transform whose time grew most between two reports, if any did.
fn busiest(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Option<String> {
    after
        .iter()
        .map(|(t, ms)| (ms.saturating_sub(before.get(t).copied().unwrap_or(0)), t))
        .filter(|(grew, _)| *grew > 0)
        .max()
        .map(|(_, t)| t.clone())
}

/// One running bundle, followed by its progress reports.
pub(crate) struct BundleWatch<'a> {
    pub(crate) worker: &'a Worker,
    pub(crate) bundle_id: &'a str,
    pub(crate) stage: &'a str,
    /// Bytes of output the runner has received from the bundle so far.
    pub(crate) received: &'a AtomicU64,
    pub(crate) policy: StallPolicy,
    pub(crate) job: &'a Job,
    pub(crate) stalled: &'a StalledBundles,
}

/// What a progress request found.
enum Report {
    /// The bundle's metrics so far.
    Metrics(Vec<MonitoringInfo>),
    /// No answer within the probe interval: a worker whose control thread
    /// is stuck too.
    Silent,
    /// The SDK does not report progress: nothing can be said.
    Unsupported,
}

impl BundleWatch<'_> {
    /// Follows the bundle until it has stalled past the timeout under a
    /// policy that fails stalled bundles, and returns why it failed;
    /// otherwise never returns: the caller drops it when the bundle ends.
    pub(crate) async fn until_failed(self) -> String {
        let every = self.policy.probe_every();
        let _listed = Listed {
            stalled: self.stalled,
            bundle_id: self.bundle_id,
        };
        let mut last_work: Option<(u64, u64)> = None;
        let mut busy_at_progress = BTreeMap::new();
        let mut progressed_at = Instant::now();
        let mut progressed_ms = wall_clock_ms();
        let mut reported = false;
        loop {
            tokio::time::sleep(every).await;
            let (work, busy) = match self.report(every).await {
                Report::Metrics(infos) => (Some(work_done(&infos)), busy_ms(&infos)),
                Report::Silent => (None, BTreeMap::new()),
                Report::Unsupported => return std::future::pending().await,
            };
            let received = self.received.load(Ordering::Relaxed);
            if let Some(work) = work.map(|w| (w, received)) {
                if last_work != Some(work) {
                    if reported {
                        self.stalled.clear(self.bundle_id);
                        self.job.message(
                            MessageImportance::JobMessageBasic,
                            format!(
                                "a bundle of stage '{}' makes progress again after {}",
                                self.stage,
                                seconds(progressed_at.elapsed())
                            ),
                        );
                        reported = false;
                    }
                    last_work = Some(work);
                    busy_at_progress = busy;
                    progressed_at = Instant::now();
                    progressed_ms = wall_clock_ms();
                    continue;
                }
            }
            let idle = progressed_at.elapsed();
            if reported || idle < self.policy.timeout {
                continue;
            }
            reported = true;
            let transform = busiest(&busy_at_progress, &busy).map(|id| self.unique_name(id));
            let text = self.stall_text(idle, transform.as_deref());
            tracing::warn!(job_id = %self.job.id(), bundle = self.bundle_id, "{text}");
            self.job
                .message(MessageImportance::JobMessageWarning, text.clone());
            self.stalled.mark(StalledBundle {
                stage: self.stage.to_string(),
                bundle_id: self.bundle_id.to_string(),
                worker: self.worker.id().to_string(),
                since_ms: progressed_ms,
                transform,
            });
            if self.policy.fail {
                return text;
            }
        }
    }

    /// Asks the SDK how the bundle is doing, waiting `within` at most.
    async fn report(&self, within: Duration) -> Report {
        let request =
            instruction_request::Request::ProcessBundleProgress(ProcessBundleProgressRequest {
                instruction_id: self.bundle_id.to_string(),
            });
        match tokio::time::timeout(within, self.worker.instruct(request)).await {
            Err(_elapsed) => Report::Silent,
            Ok(Ok(response)) if response.error.is_empty() => match response.response {
                Some(instruction_response::Response::ProcessBundleProgress(progress)) => {
                    Report::Metrics(progress.monitoring_infos)
                }
                _ => Report::Unsupported,
            },
            Ok(Ok(_)) | Ok(Err(refract_sdk_harness::BundleError::Sdk(_))) => Report::Unsupported,
            // The bundle itself fails with the same disconnect.
            Ok(Err(_)) => std::future::pending().await,
        }
    }

    /// The name the pipeline gave the transform with id `id` (the SDKs
    /// label metrics by id).
    fn unique_name(&self, id: String) -> String {
        self.job
            .pipeline()
            .components
            .as_ref()
            .and_then(|c| c.transforms.get(&id))
            .map_or(id, |t| t.unique_name.clone())
    }

    fn stall_text(&self, idle: Duration, transform: Option<&str>) -> String {
        let place = match transform {
            Some(t) => format!(", busy in '{t}'"),
            None => String::new(),
        };
        let outcome = if self.policy.fail {
            "; failed, to be retried (--fail_stalled_bundles)"
        } else {
            ""
        };
        format!(
            "a bundle of stage '{}' has made no progress for {} (worker {}{place}): no element, \
             metric or output changed in its progress reports{outcome}",
            self.stage,
            seconds(idle),
            self.worker.id(),
        )
    }
}

/// Takes a bundle off the job's stalled list when its watch ends.
struct Listed<'a> {
    stalled: &'a StalledBundles,
    bundle_id: &'a str,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.stalled.clear(self.bundle_id);
    }
}

fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_jobservice::SUM_INT64;

    fn info(urn: &str, transform: &str, payload: Vec<u8>) -> MonitoringInfo {
        MonitoringInfo {
            urn: urn.to_string(),
            r#type: SUM_INT64.to_string(),
            labels: [("PTRANSFORM".to_string(), transform.to_string())]
                .into_iter()
                .collect(),
            payload,
            ..Default::default()
        }
    }

    const PROCESS_MSECS: &str = "beam:metric:pardo_execution_time:process_bundle_msecs:v1";
    const ELEMENTS: &str = "beam:metric:element_count:v1";

    #[test]
    fn time_alone_is_not_work_and_order_does_not_matter() {
        let before = [
            info(ELEMENTS, "A", vec![3]),
            info(PROCESS_MSECS, "A", vec![10]),
        ];
        let later = [
            info(PROCESS_MSECS, "A", vec![0xe8, 0x07]),
            info(ELEMENTS, "A", vec![3]),
        ];
        assert_eq!(work_done(&before), work_done(&later));
        let more = [info(ELEMENTS, "A", vec![4])];
        assert_ne!(work_done(&before[..1]), work_done(&more));
    }

    #[test]
    fn the_busiest_transform_is_the_one_whose_time_grew_most() {
        let before = busy_ms(&[
            info(PROCESS_MSECS, "A", vec![10]),
            info(PROCESS_MSECS, "B", vec![10]),
        ]);
        let after = busy_ms(&[
            info(PROCESS_MSECS, "A", vec![12]),
            info(PROCESS_MSECS, "B", vec![0xe8, 0x07]),
        ]);
        assert_eq!(after.get("B"), Some(&1000));
        assert_eq!(busiest(&before, &after).as_deref(), Some("B"));
        assert_eq!(busiest(&after, &after), None);
        // A malformed payload is no time at all.
        assert!(busy_ms(&[info(PROCESS_MSECS, "A", vec![0x80])]).is_empty());
    }

    #[test]
    fn probes_are_a_quarter_of_the_timeout_within_bounds() {
        let probe = |secs| {
            StallPolicy {
                timeout: Duration::from_secs(secs),
                fail: false,
            }
            .probe_every()
        };
        assert_eq!(probe(300), Duration::from_secs(30));
        assert_eq!(probe(8), Duration::from_secs(2));
        assert_eq!(probe(0), Duration::from_millis(250));
    }
}
