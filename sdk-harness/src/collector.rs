//! Collects what the SDK sends back for one bundle and decides when the
//! bundle is complete.
//!
//! A bundle is complete only when the `ProcessBundleResponse` **and** an
//! `is_last` for every expected sink and timer family have arrived, in either
//! order (the SDK sends them on different streams). An error response ends it
//! at once: a failed SDK bundle may never close its outputs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use refract_proto::fn_api::{
    elements, instruction_response, InstructionResponse, ProcessBundleResponse,
};

use crate::bundle::{BundleResult, OutputChunks, OutputSpill, StateHandler};
use crate::error::BundleError;

/// Where a bundle stands after an event.
#[derive(Debug)]
pub(crate) enum Progress {
    /// More is expected from the SDK.
    Waiting,
    /// The bundle is over, successfully or not.
    Done(Box<Result<BundleResult, BundleError>>),
}

/// Per-bundle accumulation of outputs, timers and the response.
pub(crate) struct BundleCollector {
    open_sinks: HashSet<String>,
    open_timer_families: HashSet<(String, String)>,
    closed_sinks: HashSet<String>,
    closed_timer_families: HashSet<(String, String)>,
    outputs: HashMap<String, OutputChunks>,
    timers: HashMap<(String, String), Vec<u8>>,
    response: Option<ProcessBundleResponse>,
    state: Arc<dyn StateHandler>,
    /// Output bytes received so far, for whoever runs the bundle (it may
    /// split a bundle whose output grows large).
    received: Arc<AtomicU64>,
    /// Where output goes once `outputs` holds more than its limit.
    overflow: Option<Arc<dyn OutputSpill>>,
    /// Bytes `outputs` holds.
    output_bytes: usize,
    /// Some output went to the overflow: the rest follows in parts of
    /// [`OVERFLOW_PART_BYTES`], not a whole limit's worth each.
    overflowed: bool,
}

/// Once a bundle's output overflows, how much of it is held before the
/// next part is written.
const OVERFLOW_PART_BYTES: usize = 4 << 20;

impl BundleCollector {
    /// Starts collecting for a bundle that will close `sinks` and `timer_families`.
    pub(crate) fn new(
        sinks: impl IntoIterator<Item = String>,
        timer_families: impl IntoIterator<Item = (String, String)>,
        state: Arc<dyn StateHandler>,
        received: Arc<AtomicU64>,
        overflow: Option<Arc<dyn OutputSpill>>,
    ) -> Self {
        Self {
            received,
            overflow,
            output_bytes: 0,
            overflowed: false,
            open_sinks: sinks.into_iter().collect(),
            open_timer_families: timer_families.into_iter().collect(),
            closed_sinks: HashSet::new(),
            closed_timer_families: HashSet::new(),
            outputs: HashMap::new(),
            timers: HashMap::new(),
            response: None,
            state,
        }
    }

    /// The handler for this bundle's state requests.
    pub(crate) fn state_handler(&self) -> Arc<dyn StateHandler> {
        Arc::clone(&self.state)
    }

    /// Takes one output Data entry.
    pub(crate) fn on_data(&mut self, data: elements::Data) -> Progress {
        if self.closed_sinks.contains(&data.transform_id) {
            return done(Err(BundleError::Protocol(format!(
                "instruction {}: data for sink {} after its is_last",
                data.instruction_id, data.transform_id
            ))));
        }
        if !data.data.is_empty() {
            self.received
                .fetch_add(data.data.len() as u64, Ordering::Relaxed);
            self.output_bytes += data.data.len();
            self.outputs
                .entry(data.transform_id.clone())
                .or_default()
                .push(Bytes::from(data.data));
            if let Err(e) = self.overflow_if_full() {
                return done(Err(BundleError::Overflow(format!(
                    "instruction {}: {e}",
                    data.instruction_id
                ))));
            }
        }
        if data.is_last {
            if !self.open_sinks.remove(&data.transform_id) {
                tracing::warn!(
                    instruction_id = %data.instruction_id,
                    transform_id = %data.transform_id,
                    "is_last for a sink the bundle did not expect"
                );
            }
            self.closed_sinks.insert(data.transform_id);
        }
        self.check()
    }

    /// Hands everything `outputs` holds to the overflow once it holds more
    /// than the overflow's limit (after the first time, more than a part).
    /// All of it, each sink's as one part: a sink's parts then go out in
    /// order, and what stays behind for it is what came after them.
    fn overflow_if_full(&mut self) -> Result<(), String> {
        let Some(overflow) = &self.overflow else {
            return Ok(());
        };
        let limit = if self.overflowed {
            OVERFLOW_PART_BYTES.min(overflow.memory_limit())
        } else {
            overflow.memory_limit()
        };
        if self.output_bytes <= limit {
            return Ok(());
        }
        self.overflowed = true;
        for (sink, chunks) in &mut self.outputs {
            if !chunks.is_empty() {
                overflow.write(sink, chunks.take_concat())?;
            }
        }
        self.output_bytes = 0;
        Ok(())
    }

    /// Takes one output Timers entry.
    pub(crate) fn on_timers(&mut self, timers: elements::Timers) -> Progress {
        let family = (timers.transform_id, timers.timer_family_id);
        if self.closed_timer_families.contains(&family) {
            return done(Err(BundleError::Protocol(format!(
                "instruction {}: timers for {}/{} after their is_last",
                timers.instruction_id, family.0, family.1
            ))));
        }
        if !timers.timers.is_empty() {
            append(&mut self.timers, family.clone(), timers.timers);
        }
        if timers.is_last {
            if !self.open_timer_families.remove(&family) {
                tracing::warn!(
                    instruction_id = %timers.instruction_id,
                    transform_id = %family.0,
                    timer_family_id = %family.1,
                    "is_last for a timer family the bundle did not expect"
                );
            }
            self.closed_timer_families.insert(family);
        }
        self.check()
    }

    /// Takes the bundle's InstructionResponse.
    pub(crate) fn on_response(&mut self, response: InstructionResponse) -> Progress {
        if !response.error.is_empty() {
            return done(Err(BundleError::Sdk(response.error)));
        }
        match response.response {
            Some(instruction_response::Response::ProcessBundle(r)) => {
                self.response = Some(r);
                self.check()
            }
            None => {
                tracing::warn!(
                    instruction_id = %response.instruction_id,
                    "process bundle response without a body; treating it as empty"
                );
                self.response = Some(ProcessBundleResponse::default());
                self.check()
            }
            Some(other) => done(Err(BundleError::Protocol(format!(
                "instruction {}: expected a process_bundle response, got {}",
                response.instruction_id,
                response_kind(&other)
            )))),
        }
    }

    fn check(&mut self) -> Progress {
        if !self.open_sinks.is_empty() || !self.open_timer_families.is_empty() {
            return Progress::Waiting;
        }
        let Some(response) = self.response.take() else {
            return Progress::Waiting;
        };
        done(Ok(BundleResult {
            response,
            outputs: std::mem::take(&mut self.outputs),
            timers: freeze(std::mem::take(&mut self.timers)),
        }))
    }
}

/// A finished outcome (boxed: results are large and rare next to `Waiting`).
fn done(outcome: Result<BundleResult, BundleError>) -> Progress {
    Progress::Done(Box::new(outcome))
}

fn append<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Vec<u8>>, key: K, chunk: Vec<u8>) {
    match map.entry(key) {
        std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().extend_from_slice(&chunk),
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(chunk);
        }
    }
}

fn freeze<K: std::hash::Hash + Eq>(map: HashMap<K, Vec<u8>>) -> HashMap<K, Bytes> {
    map.into_iter().map(|(k, v)| (k, Bytes::from(v))).collect()
}

/// A short name of a response kind, for error messages.
pub(crate) fn response_kind(r: &instruction_response::Response) -> &'static str {
    use instruction_response::Response as R;
    match r {
        R::ProcessBundle(_) => "process_bundle",
        R::ProcessBundleProgress(_) => "process_bundle_progress",
        R::ProcessBundleSplit(_) => "process_bundle_split",
        R::FinalizeBundle(_) => "finalize_bundle",
        R::MonitoringInfos(_) => "monitoring_infos",
        R::HarnessMonitoringInfos(_) => "harness_monitoring_infos",
        R::SampleData(_) => "sample_data",
        R::Register(_) => "register",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_proto::fn_api::{StateRequest, StateResponse};

    struct NoState;
    impl StateHandler for NoState {
        fn handle(&self, _r: &StateRequest) -> StateResponse {
            StateResponse::default()
        }
    }

    fn finished(p: Progress) -> Option<Result<BundleResult, BundleError>> {
        match p {
            Progress::Waiting => None,
            Progress::Done(outcome) => Some(*outcome),
        }
    }

    fn collector() -> BundleCollector {
        BundleCollector::new(
            ["sink".to_string()],
            [("pardo".to_string(), "ts-t".to_string())],
            Arc::new(NoState),
            Arc::default(),
            None,
        )
    }

    fn data(bytes: &[u8], is_last: bool) -> elements::Data {
        elements::Data {
            instruction_id: "b1".into(),
            transform_id: "sink".into(),
            data: bytes.to_vec(),
            is_last,
        }
    }

    fn timers(bytes: &[u8], is_last: bool) -> elements::Timers {
        elements::Timers {
            instruction_id: "b1".into(),
            transform_id: "pardo".into(),
            timer_family_id: "ts-t".into(),
            timers: bytes.to_vec(),
            is_last,
        }
    }

    fn ok_response() -> InstructionResponse {
        InstructionResponse {
            instruction_id: "b1".into(),
            error: String::new(),
            response: Some(instruction_response::Response::ProcessBundle(
                ProcessBundleResponse {
                    requires_finalization: true,
                    ..Default::default()
                },
            )),
        }
    }

    #[test]
    fn completes_only_when_response_and_all_is_last_arrived() {
        let mut c = collector();
        assert!(matches!(c.on_data(data(b"ab", false)), Progress::Waiting));
        assert!(matches!(c.on_response(ok_response()), Progress::Waiting));
        assert!(matches!(c.on_data(data(b"c", false)), Progress::Waiting));
        assert!(matches!(c.on_data(data(b"", true)), Progress::Waiting));
        assert!(matches!(
            c.on_timers(timers(b"t1", false)),
            Progress::Waiting
        ));
        let Some(Ok(result)) = finished(c.on_timers(timers(b"", true))) else {
            panic!("bundle should be complete");
        };
        assert_eq!(result.outputs["sink"].concat(), Bytes::from_static(b"abc"));
        // As received: two chunks, not copied into one.
        assert_eq!(result.outputs["sink"].clone().into_chunks(), ["ab", "c"]);
        let key = ("pardo".to_string(), "ts-t".to_string());
        assert_eq!(result.timers[&key], Bytes::from_static(b"t1"));
        assert!(result.response.requires_finalization);
    }

    #[test]
    fn response_last_also_completes() {
        let mut c = collector();
        assert!(matches!(c.on_data(data(b"x", true)), Progress::Waiting));
        assert!(matches!(c.on_timers(timers(b"", true)), Progress::Waiting));
        assert!(matches!(
            finished(c.on_response(ok_response())),
            Some(Ok(_))
        ));
    }

    #[test]
    fn error_response_ends_at_once() {
        let mut c = collector();
        let r = InstructionResponse {
            instruction_id: "b1".into(),
            error: "Traceback ...\nValueError: boom".into(),
            response: None,
        };
        match finished(c.on_response(r)) {
            Some(Err(BundleError::Sdk(text))) => assert!(text.contains("boom")),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Records what it is given; fails once told to.
    #[derive(Default)]
    struct Recorder {
        written: parking_lot::Mutex<Vec<(String, Vec<u8>)>>,
        fail: bool,
    }

    impl OutputSpill for Recorder {
        fn memory_limit(&self) -> usize {
            4
        }
        fn write(&self, sink: &str, bytes: Vec<u8>) -> Result<(), String> {
            if self.fail {
                return Err("disk full".into());
            }
            self.written.lock().push((sink.to_string(), bytes));
            Ok(())
        }
    }

    fn overflowing(overflow: Arc<Recorder>) -> BundleCollector {
        BundleCollector::new(
            ["sink".to_string()],
            [],
            Arc::new(NoState),
            Arc::default(),
            Some(overflow),
        )
    }

    #[test]
    fn output_past_the_limit_overflows_and_the_rest_stays() {
        let overflow = Arc::new(Recorder::default());
        let mut c = overflowing(overflow.clone());
        assert!(matches!(c.on_data(data(b"ab", false)), Progress::Waiting));
        assert!(overflow.written.lock().is_empty(), "under the limit");
        assert!(matches!(c.on_data(data(b"cde", false)), Progress::Waiting));
        assert!(matches!(c.on_data(data(b"fg", false)), Progress::Waiting));
        assert!(matches!(c.on_data(data(b"hij", false)), Progress::Waiting));
        assert!(matches!(c.on_data(data(b"k", true)), Progress::Waiting));
        let Some(Ok(result)) = finished(c.on_response(ok_response())) else {
            panic!("bundle should be complete");
        };
        let written = overflow.written.lock().clone();
        assert_eq!(
            written,
            [
                ("sink".to_string(), b"abcde".to_vec()),
                ("sink".to_string(), b"fghij".to_vec())
            ]
        );
        assert_eq!(result.outputs["sink"].concat(), Bytes::from_static(b"k"));
    }

    #[test]
    fn an_overflow_that_fails_fails_the_bundle() {
        let overflow = Arc::new(Recorder {
            fail: true,
            ..Recorder::default()
        });
        let mut c = overflowing(overflow);
        match finished(c.on_data(data(b"abcdef", false))) {
            Some(Err(BundleError::Overflow(msg))) => assert!(msg.contains("disk full")),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn data_after_is_last_is_a_protocol_error() {
        let mut c = collector();
        assert!(matches!(c.on_data(data(b"", true)), Progress::Waiting));
        assert!(matches!(
            finished(c.on_data(data(b"late", false))),
            Some(Err(BundleError::Protocol(_)))
        ));
    }

    #[test]
    fn wrong_response_kind_is_a_protocol_error() {
        let mut c = collector();
        let r = InstructionResponse {
            instruction_id: "b1".into(),
            error: String::new(),
            response: Some(instruction_response::Response::FinalizeBundle(
                Default::default(),
            )),
        };
        assert!(matches!(
            finished(c.on_response(r)),
            Some(Err(BundleError::Protocol(_)))
        ));
    }
}
