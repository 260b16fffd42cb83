//! Committing a finished bundle's effects, or retrying its input.

use super::*;
use crate::spilled_output::{SpilledOutput, SpilledOutputError};
use bytes::BytesMut;

impl Engine {
    /// Apply a finished bundle's effects, or drop them if it failed.
    pub(super) fn commit(&mut self, report: Report) -> Result<(), EngineError> {
        self.refill_fire_budgets();
        let (bundle, result) = match report {
            Report::Bundle { bundle, result } => (bundle, result),
            Report::Split { bundle, split } => return self.apply_split(bundle, split),
            Report::Merge {
                stage,
                keys,
                result,
            } => return self.commit_merge(stage, keys, result),
        };
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
            Err(error) => {
                let s = &mut self.stages[idx];
                let Some(sdk) = s.sdk_mut() else {
                    return Err(self.bundle_failed(idx, error));
                };
                let failures = sdk.retries.failed();
                let retryable = !matches!(error, ExecError::Runner(_));
                if !retryable || failures >= self.config.max_attempts {
                    return Err(self.bundle_failed(idx, error));
                }
                // The bundle left nothing behind: its work runs again after
                // a backoff.
                let backoff = retry_delay(&self.config, &error, failures);
                sdk.retries.back_off_until(Instant::now() + backoff);
                s.run_again(flight.fired_timers, flight.elements);
                tracing::warn!(
                    stage = %self.plan.stages[idx].name,
                    attempt = failures,
                    ?backoff,
                    %error,
                    "bundle failed; retrying its input"
                );
                return Ok(());
            }
        };
        // Strict mode: as if this attempt had been lost, its effects are
        // dropped and its input runs again (at once: nothing failed).
        if let Some(strict) = self.strict.as_mut() {
            let name = &self.plan.stages[idx].name;
            let s = &mut self.stages[idx];
            if s.sdk().is_some() && strict.replays(idx, name, &flight.elements) {
                s.run_again(flight.fired_timers, flight.elements);
                tracing::debug!(stage = %name, "strict mode: running a bundle's input again");
                return Ok(());
            }
        }
        {
            let s = &mut self.stages[idx];
            if let Some(sdk) = s.sdk_mut() {
                sdk.retries.succeeded();
            }
            let counters = &mut s.progress.counters;
            counters.bundles_committed += 1;
            // One pass over what the bundle processed (what it kept and
            // what its splits gave back as primaries).
            let (elements, bytes) = flight
                .elements
                .iter()
                .fold((0, 0), |(n, b), q| (n + q.len(), b + q.encoded_len()));
            counters.elements_processed += elements as u64;
            counters.bytes_processed += bytes as u64;
        }
        self.summary.bundles += 1;
        if let Some(sink) = &mut self.checkpoints {
            sink.commits += 1;
        }
        if let Some(action) = output.on_commit {
            action.run();
        }
        if let Some(action) = output.on_durable {
            self.when_durable(action);
        }
        self.user_state[idx]
            .lock()
            .apply(flight.overlay.take_writes())
            .map_err(spill_failed(&self.plan, idx))?;
        if let StageKind::Sdk(sdk) = &self.plan.stages[idx].kind {
            for t in &output.timers {
                let Some(fam) = sdk
                    .timer_families
                    .iter()
                    .find(|f| f.transform_id == t.transform_id && f.family_id == t.family_id)
                else {
                    continue;
                };
                let timers = decode_timers(&t.data, &fam.key_coder, &fam.window_coder).map_err(
                    |source| EngineError::Decode {
                        pcollection: format!("timers {}/{}", t.transform_id, t.family_id),
                        source,
                    },
                )?;
                if let Some(state) = self.stages[idx].sdk_mut() {
                    state
                        .timers
                        .apply(&fam.transform_id, &t.family_id, fam.domain, timers);
                }
            }
        }
        self.defer_residuals(idx, &output.residuals)?;
        // A PCollection's spilled output comes first, then its chunks in
        // memory; the start of an element one of them ends inside waits in
        // `rests` for the next.
        let mut rests: Vec<(PCollectionIdx, BytesMut)> = Vec::new();
        for (pcoll, spilled) in &output.spilled {
            self.summary.output_spilled_bytes += spilled.bytes();
            rests.push((*pcoll, self.route_spilled(*pcoll, spilled)?));
        }
        drop(output.spilled);
        let mut chunks_left: Vec<(PCollectionIdx, usize)> = Vec::new();
        for (pcoll, _) in &output.outputs {
            match chunks_left.iter_mut().find(|(p, _)| p == pcoll) {
                Some((_, n)) => *n += 1,
                None => chunks_left.push((*pcoll, 1)),
            }
        }
        for (pcoll, chunk) in output.outputs {
            let chunk = match rests.iter().position(|(p, _)| *p == pcoll) {
                // Only an element that spans two chunks costs a copy.
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
        let pc = &self.plan.pcollections[pcoll];
        let (value_coder, window_coder) = (pc.value_coder.clone(), pc.window_coder.clone());
        spilled
            .read(&value_coder, &window_coder, |page| {
                self.route(pcoll, page)
                    .and_then(|()| self.forward_flattens())
                    .map_err(ReadSpilled::Route)
            })
            .map_err(|e| {
                let pcollection = self.plan.pcollections[pcoll].id.clone();
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
    fn decode_input(
        &self,
        idx: StageIdx,
        bytes: &Bytes,
    ) -> Result<Vec<DecodedElement>, EngineError> {
        let Some(&input) = self.plan.stages[idx].inputs.first() else {
            return Ok(Vec::new());
        };
        let pc = &self.plan.pcollections[input];
        decode_windowed_values(bytes, &pc.value_coder, &pc.window_coder).map_err(|source| {
            EngineError::Decode {
                pcollection: pc.id.clone(),
                source,
            }
        })
    }

    /// Queues residual work of stage `idx` (after its requested delay).
    fn defer_residuals(
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

    /// A running bundle was split: what it gave up runs as work of its own
    /// now, and a retry of the bundle (if it fails) does only what it kept.
    /// The bundle's holds stay until it ends: what it kept is no earlier
    /// than what it took.
    fn apply_split(&mut self, bundle: u64, split: BundleSplit) -> Result<(), EngineError> {
        let Some(flight) = self.in_flight.get(&bundle) else {
            return Ok(());
        };
        let idx = flight.stage;
        let mut primaries = Vec::new();
        for p in &split.primaries {
            primaries.extend(self.decode_input(idx, p)?);
        }
        if let Some(flight) = self.in_flight.get_mut(&bundle) {
            truncate_elements(&mut flight.elements, split.kept_elements);
            flight
                .elements
                .extend(primaries.into_iter().map(Queued::One));
        }
        self.release_given_back_groups(bundle);
        self.defer_residuals(idx, &split.residuals)?;
        // Runnable at once (a split's residuals ask for no delay).
        self.release_delayed()?;
        Ok(())
    }

    /// A keyed stage's bundle that was split holds on to the key groups of
    /// what it kept (elements and timers) and lets the others go, so that
    /// what it gave back (split between key groups: see
    /// [`super::scheduling::group_by_key_group`]) can run beside it.
    fn release_given_back_groups(&mut self, bundle: u64) {
        let Some(flight) = self.in_flight.get_mut(&bundle) else {
            return;
        };
        if flight.key_groups == 0 {
            return;
        }
        let idx = flight.stage;
        let Some(&input) = self.plan.stages[idx].inputs.first() else {
            return;
        };
        let coder = &self.plan.pcollections[input].value_coder;
        let mut kept: KeyGroupSet = 0;
        for q in &flight.elements {
            q.for_each_element(|e| kept |= super::scheduling::element_key_group(coder, e));
        }
        for (_, t) in &flight.fired_timers {
            kept |= group_of(&t.timer.user_key);
        }
        let released = flight.key_groups & !kept;
        if released == 0 {
            return;
        }
        flight.key_groups &= kept;
        self.stages[idx].queue.unlock_key_groups(released);
        debug!(
            stage = %self.plan.stages[idx].name,
            bundle,
            groups = released.count_ones(),
            "split bundle let key groups go"
        );
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
            stage: self.plan.stages[idx].name.clone(),
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
