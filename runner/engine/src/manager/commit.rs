//! Committing a finished bundle's effects, or retrying its input.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use super::{spill_failed, Engine, EngineConfig, EngineError, InFlight};
use crate::coder::{decode_timers, decode_windowed_values, DecodedElement};
use crate::executor::{BundleOutput, ExecError, Residual, TimerInput};
use crate::plan::{PCollectionIdx, StageIdx, StageKind};
use crate::spilled_output::{SpilledOutput, SpilledOutputError};

impl Engine {
    /// Apply a finished bundle's effects, or drop them if it failed.
    pub(super) fn commit(
        &mut self,
        bundle: u64,
        result: Result<BundleOutput, ExecError>,
    ) -> Result<(), EngineError> {
        let Some(flight) = self.in_flight.remove(&bundle) else {
            return Ok(());
        };
        let idx = flight.stage;
        self.slot_groups.give_back(idx);
        self.stages[idx]
            .queue
            .bundle_ended(flight.key_groups, &flight.holds, flight.input_bytes);
        let output = match result {
            Ok(output) => output,
            Err(error) => return self.retry_failed(flight, error),
        };
        // Strict mode: as if this attempt had been lost, its effects are
        // dropped and its input runs again (at once: nothing failed).
        if let Some(strict) = self.strict.as_mut() {
            let name = &self.topology.plan.stages[idx].name;
            let s = &mut self.stages[idx];
            if s.sdk().is_some() && strict.replays(idx, name, &flight.elements) {
                s.run_again(flight.fired_timers, flight.elements);
                tracing::debug!(stage = %name, "strict mode: running a bundle's input again");
                return Ok(());
            }
        }
        self.count_committed(&flight);
        if let Some(action) = output.on_commit {
            action.run();
        }
        if let Some(action) = output.on_durable {
            self.when_durable(action);
        }
        self.user_state[idx]
            .lock()
            .apply(flight.overlay.take_writes())
            .map_err(spill_failed(&self.topology.plan, idx))?;
        self.store_timers(idx, &output.timers)?;
        self.defer_residuals(idx, &output.residuals)?;
        self.route_outputs(output.spilled, output.outputs)
    }

    /// A failed bundle left nothing behind: its input and fired timers go
    /// back to its stage to run again after a backoff, or, past the
    /// attempts allowed (or for a runner-side error), the job fails with
    /// the error.
    fn retry_failed(&mut self, flight: InFlight, error: ExecError) -> Result<(), EngineError> {
        let idx = flight.stage;
        let s = &mut self.stages[idx];
        let Some(sdk) = s.sdk_mut() else {
            return Err(self.bundle_failed(idx, error));
        };
        let failures = sdk.retries.failed();
        let retryable = !matches!(error, ExecError::Runner(_));
        if !retryable || failures >= self.config.max_attempts {
            return Err(self.bundle_failed(idx, error));
        }
        let backoff = retry_delay(&self.config, &error, failures);
        sdk.retries.back_off_until(Instant::now() + backoff);
        s.run_again(flight.fired_timers, flight.elements);
        tracing::warn!(
            stage = %self.topology.plan.stages[idx].name,
            attempt = failures,
            ?backoff,
            %error,
            "bundle failed; retrying its input"
        );
        Ok(())
    }

    /// Counts a committed bundle, in its stage's counters (one pass over
    /// what it processed: what it kept and what its splits gave back as
    /// primaries) and the run's.
    fn count_committed(&mut self, flight: &InFlight) {
        let s = &mut self.stages[flight.stage];
        if let Some(sdk) = s.sdk_mut() {
            sdk.retries.succeeded();
        }
        let counters = &mut s.progress.counters;
        counters.bundles_committed += 1;
        let (elements, bytes) = flight
            .elements
            .iter()
            .fold((0, 0), |(n, b), q| (n + q.len(), b + q.encoded_len()));
        counters.elements_processed += elements as u64;
        counters.bytes_processed += bytes as u64;
        self.summary.bundles += 1;
        if let Some(sink) = &mut self.durability.checkpoints {
            sink.commits += 1;
        }
    }

    /// Stores the timers a bundle of stage `idx` set or cleared, per
    /// timer family of the stage (timers of a family it does not have are
    /// ignored).
    fn store_timers(&mut self, idx: StageIdx, timers: &[TimerInput]) -> Result<(), EngineError> {
        let StageKind::Sdk(sdk) = &self.topology.plan.stages[idx].kind else {
            return Ok(());
        };
        for t in timers {
            let Some(fam) = sdk
                .timer_families
                .iter()
                .find(|f| f.transform_id == t.transform_id && f.family_id == t.family_id)
            else {
                continue;
            };
            let decoded =
                decode_timers(&t.data, &fam.key_coder, &fam.window_coder).map_err(|source| {
                    EngineError::Decode {
                        pcollection: format!("timers {}/{}", t.transform_id, t.family_id),
                        source,
                    }
                })?;
            if let Some(state) = self.stages[idx].sdk_mut() {
                state
                    .timers
                    .apply(&fam.transform_id, &t.family_id, fam.domain, decoded);
            }
        }
        Ok(())
    }

    /// Delivers a committed bundle's output. A PCollection's spilled
    /// output comes first, then its chunks in memory; the start of an
    /// element one of them ends inside waits in `rests` for the next, so
    /// only an element that spans two chunks costs a copy.
    fn route_outputs(
        &mut self,
        spilled: Vec<(PCollectionIdx, SpilledOutput)>,
        outputs: Vec<(PCollectionIdx, Bytes)>,
    ) -> Result<(), EngineError> {
        let mut rests: Vec<(PCollectionIdx, BytesMut)> = Vec::new();
        for (pcoll, spilled) in &spilled {
            self.summary.output_spilled_bytes += spilled.bytes();
            rests.push((*pcoll, self.route_spilled(*pcoll, spilled)?));
        }
        drop(spilled);
        let mut chunks_left: Vec<(PCollectionIdx, usize)> = Vec::new();
        for (pcoll, _) in &outputs {
            match chunks_left.iter_mut().find(|(p, _)| p == pcoll) {
                Some((_, n)) => *n += 1,
                None => chunks_left.push((*pcoll, 1)),
            }
        }
        for (pcoll, chunk) in outputs {
            let chunk = match rests.iter().position(|(p, _)| *p == pcoll) {
                Some(at) => {
                    let (_, mut rest) = rests.swap_remove(at);
                    rest.extend_from_slice(&chunk);
                    rest.freeze()
                }
                None => chunk,
            };
            let last = chunks_left
                .iter_mut()
                .find(|(p, _)| *p == pcoll)
                .map(|(_, n)| {
                    *n -= 1;
                    *n == 0
                })
                .unwrap_or(true);
            if last {
                self.route(pcoll, chunk)?;
                continue;
            }
            let whole = self.route_whole(pcoll, chunk.clone())?;
            if whole < chunk.len() {
                rests.push((pcoll, BytesMut::from(&chunk[whole..])));
            }
        }
        for (pcoll, rest) in rests {
            self.route(pcoll, rest.freeze())?;
        }
        Ok(())
    }

    /// Routes the whole elements of `pcoll`'s spilled output a page at a
    /// time, and returns the start of the element it ends inside (if any).
    fn route_spilled(
        &mut self,
        pcoll: PCollectionIdx,
        spilled: &SpilledOutput,
    ) -> Result<BytesMut, EngineError> {
        let pc = &self.topology.plan.pcollections[pcoll];
        let (value_coder, window_coder) = (pc.value_coder.clone(), pc.window_coder.clone());
        spilled
            .read(&value_coder, &window_coder, |page| {
                self.route(pcoll, page)
                    .and_then(|()| self.forward_flattens())
                    .map_err(ReadSpilled::Route)
            })
            .map_err(|e| {
                let pcollection = self.topology.plan.pcollections[pcoll].id.clone();
                match e {
                    ReadSpilled::Route(e) => e,
                    ReadSpilled::Read(SpilledOutputError::Decode(source)) => EngineError::Decode {
                        pcollection,
                        source,
                    },
                    ReadSpilled::Read(SpilledOutputError::Store(source)) => {
                        EngineError::OutputSpill {
                            pcollection,
                            source,
                        }
                    }
                }
            })
    }

    /// Elements of stage `idx`'s main input, encoded in its port coder (a
    /// residual or primary the SDK handed back). Nothing for a stage
    /// without input.
    pub(super) fn decode_input(
        &self,
        idx: StageIdx,
        bytes: &Bytes,
    ) -> Result<Vec<DecodedElement>, EngineError> {
        let Some(&input) = self.topology.plan.stages[idx].inputs.first() else {
            return Ok(Vec::new());
        };
        let pc = &self.topology.plan.pcollections[input];
        decode_windowed_values(bytes, &pc.value_coder, &pc.window_coder).map_err(|source| {
            EngineError::Decode {
                pcollection: pc.id.clone(),
                source,
            }
        })
    }

    /// Queues residual work of stage `idx` (after its requested delay).
    pub(super) fn defer_residuals(
        &mut self,
        idx: StageIdx,
        residuals: &[Residual],
    ) -> Result<(), EngineError> {
        for r in residuals {
            for e in self.decode_input(idx, &r.element)? {
                let hold = r.watermark.unwrap_or(e.header.timestamp);
                let delay = if self.draining {
                    0
                } else {
                    r.delay_ms.max(0) as u64
                };
                let at = Instant::now() + Duration::from_millis(delay);
                self.stages[idx].queue.delay(at, e, hold);
            }
        }
        Ok(())
    }
}

/// Why routing a spilled output stopped: routing a page failed, or
/// reading one did.
enum ReadSpilled {
    Route(EngineError),
    Read(SpilledOutputError),
}

impl From<SpilledOutputError> for ReadSpilled {
    fn from(e: SpilledOutputError) -> Self {
        ReadSpilled::Read(e)
    }
}

impl Engine {
    /// The error that fails the job when a bundle of stage `idx` fails for
    /// good; under strict mode an SDK's error text ends with what strict
    /// mode did, so a test that fails because of it says so.
    fn bundle_failed(&self, idx: StageIdx, error: ExecError) -> EngineError {
        let error = match (error, &self.strict) {
            (ExecError::Sdk(text), Some(strict)) => {
                ExecError::Sdk(format!("{text}\n\n{}", strict.report().failure_note()))
            }
            (error, _) => error,
        };
        EngineError::BundleFailed {
            stage: self.topology.plan.stages[idx].name.clone(),
            error,
        }
    }
}

/// How long a stage waits before retrying after its `failures`-th failure
/// in a row (from 1) with `error`: the base for that kind of error,
/// doubling, at most ten seconds.
fn retry_delay(config: &EngineConfig, error: &ExecError, failures: u32) -> Duration {
    let base = match error {
        ExecError::Sdk(_) => config.sdk_error_backoff,
        ExecError::Harness(_) | ExecError::Runner(_) => config.retry_backoff,
    };
    base.saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sdk_error_is_retried_sooner_than_a_dead_harness() {
        let config = EngineConfig::default();
        let sdk = ExecError::Sdk("ValueError".into());
        let harness = ExecError::Harness("connection reset".into());
        let waits = |e: &ExecError| -> Vec<u128> {
            (1..=3)
                .map(|n| retry_delay(&config, e, n).as_millis())
                .collect()
        };
        assert_eq!(waits(&sdk), [10, 20, 40]);
        assert_eq!(waits(&harness), [100, 200, 400]);
        assert_eq!(retry_delay(&config, &harness, 40), Duration::from_secs(10));
    }
}
