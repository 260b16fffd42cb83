//! Windowing strategies: from `beam_runner_api.proto` to the engine's
//! [`WindowingStrategy`].
//!
//! The engine groups by window and runs triggers itself, so it needs the whole
//! strategy: the window function (only as far as it can evaluate it — custom
//! window functions stay in the SDK and are known only by whether they
//! merge), the full trigger tree, accumulation, output time, allowed lateness
//! and the closing and on-time behaviours.

use refract_engine::plan::{
    AccumulationMode, ClosingBehavior, FinishedTrigger, OnTimeBehavior, OutputTime, Trigger,
    WindowFn, WindowingStrategy,
};
use refract_proto::pipeline::{self as pb, trigger::Trigger as PbTrigger};
use refract_proto::prost::Message;
use refract_proto::{prost_types, urns};

use crate::error::TranslateError;

/// Converts the windowing strategy `id` of `components` for the engine.
pub(crate) fn convert(
    components: &pb::Components,
    id: &str,
    referrer: &str,
) -> Result<WindowingStrategy, TranslateError> {
    let ws = components
        .windowing_strategies
        .get(id)
        .ok_or_else(|| TranslateError::missing("windowing strategy", id, referrer))?;
    let location = format!("windowing strategy '{id}'");
    let defaults = WindowingStrategy::global_default();
    Ok(WindowingStrategy {
        window_fn: window_fn(ws, &location)?,
        trigger: match &ws.trigger {
            Some(t) => trigger(t, &location)?,
            None => Trigger::Default,
        },
        accumulation: accumulation(ws.accumulation_mode, &location)?
            .unwrap_or(defaults.accumulation),
        output_time: output_time(ws.output_time, &location)?.unwrap_or(defaults.output_time),
        allowed_lateness: ws.allowed_lateness,
        closing_behavior: closing(ws.closing_behavior, &location)?
            .unwrap_or(defaults.closing_behavior),
        on_time_behavior: on_time(ws.on_time_behavior, &location)?
            .unwrap_or(defaults.on_time_behavior),
        // Beam's rule; the caller knows which SDK asks for Prism's.
        finished_trigger: FinishedTrigger::ClosesWindow,
    })
}

fn merge_status(value: i32, location: &str) -> Result<pb::merge_status::Enum, TranslateError> {
    pb::merge_status::Enum::try_from(value)
        .map_err(|_| TranslateError::unsupported(format!("merge status {value}"), location))
}

fn window_fn(ws: &pb::WindowingStrategy, location: &str) -> Result<WindowFn, TranslateError> {
    let status = merge_status(ws.merge_status, location)?;
    let Some(spec) = &ws.window_fn else {
        return Err(TranslateError::Invalid(format!(
            "{location} has no window function"
        )));
    };
    let what = |name: &str| format!("window function {name} of {location}");
    Ok(match spec.urn.as_str() {
        urns::window_fn::GLOBAL => WindowFn::Global,
        urns::window_fn::FIXED => {
            let p = pb::FixedWindowsPayload::decode(spec.payload.as_slice()).map_err(|e| {
                TranslateError::bad_payload("FixedWindowsPayload", what("payload"), e)
            })?;
            WindowFn::Fixed {
                size: duration_ms(p.size.as_ref()),
                offset: timestamp_ms(p.offset.as_ref()),
            }
        }
        urns::window_fn::SLIDING => {
            let p = pb::SlidingWindowsPayload::decode(spec.payload.as_slice()).map_err(|e| {
                TranslateError::bad_payload("SlidingWindowsPayload", what("payload"), e)
            })?;
            WindowFn::Sliding {
                size: duration_ms(p.size.as_ref()),
                period: duration_ms(p.period.as_ref()),
                offset: timestamp_ms(p.offset.as_ref()),
            }
        }
        urns::window_fn::SESSIONS => {
            let p = pb::SessionWindowsPayload::decode(spec.payload.as_slice()).map_err(|e| {
                TranslateError::bad_payload("SessionWindowsPayload", what("payload"), e)
            })?;
            WindowFn::Sessions {
                gap: duration_ms(p.gap_size.as_ref()),
            }
        }
        _ => WindowFn::Custom {
            merging: status == pb::merge_status::Enum::NeedsMerge,
        },
    })
}

fn duration_ms(d: Option<&prost_types::Duration>) -> i64 {
    d.map_or(0, |d| millis(d.seconds, d.nanos))
}

fn timestamp_ms(t: Option<&prost_types::Timestamp>) -> i64 {
    t.map_or(0, |t| millis(t.seconds, t.nanos))
}

fn millis(seconds: i64, nanos: i32) -> i64 {
    seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(nanos) / 1_000_000)
}

/// Converts a trigger tree. Sub-triggers that the proto marks required must be
/// present.
pub(crate) fn trigger(t: &pb::Trigger, location: &str) -> Result<Trigger, TranslateError> {
    let Some(kind) = &t.trigger else {
        return Err(TranslateError::Invalid(format!(
            "{location} has a trigger with no type"
        )));
    };
    let all = |subs: &[pb::Trigger]| -> Result<Vec<Trigger>, TranslateError> {
        subs.iter().map(|s| trigger(s, location)).collect()
    };
    let required =
        |sub: Option<&pb::Trigger>, what: &str| -> Result<Box<Trigger>, TranslateError> {
            match sub {
                Some(s) => Ok(Box::new(trigger(s, location)?)),
                None => Err(TranslateError::Invalid(format!(
                    "{location} has a {what} trigger without its sub-trigger"
                ))),
            }
        };
    Ok(match kind {
        PbTrigger::AfterAll(a) => Trigger::AfterAll(all(&a.subtriggers)?),
        PbTrigger::AfterAny(a) => Trigger::AfterAny(all(&a.subtriggers)?),
        PbTrigger::AfterEach(a) => Trigger::AfterEach(all(&a.subtriggers)?),
        PbTrigger::AfterEndOfWindow(a) => Trigger::AfterEndOfWindow {
            early: a
                .early_firings
                .as_deref()
                .map(|s| trigger(s, location).map(Box::new))
                .transpose()?,
            late: a
                .late_firings
                .as_deref()
                .map(|s| trigger(s, location).map(Box::new))
                .transpose()?,
        },
        PbTrigger::AfterProcessingTime(a) => processing_time(a, location)?,
        PbTrigger::AfterSynchronizedProcessingTime(_) => Trigger::AfterSynchronizedProcessingTime,
        PbTrigger::Always(_) => Trigger::Always,
        PbTrigger::Default(_) => Trigger::Default,
        PbTrigger::ElementCount(c) => Trigger::ElementCount(i64::from(c.element_count)),
        PbTrigger::Never(_) => Trigger::Never,
        PbTrigger::OrFinally(o) => Trigger::OrFinally {
            main: required(o.main.as_deref(), "OrFinally")?,
            finally: required(o.finally.as_deref(), "OrFinally")?,
        },
        PbTrigger::Repeat(r) => Trigger::Repeat(required(r.subtrigger.as_deref(), "Repeat")?),
    })
}

fn processing_time(
    a: &pb::trigger::AfterProcessingTime,
    location: &str,
) -> Result<Trigger, TranslateError> {
    use pb::timestamp_transform::TimestampTransform as T;
    let mut delay_ms = 0i64;
    let mut align = None;
    for transform in &a.timestamp_transforms {
        match &transform.timestamp_transform {
            Some(T::Delay(d)) => delay_ms = delay_ms.saturating_add(d.delay_millis),
            Some(T::AlignTo(al)) => {
                if align.is_some() {
                    return Err(TranslateError::unsupported(
                        "AfterProcessingTime trigger with more than one AlignTo",
                        location,
                    ));
                }
                align = Some((al.period, al.offset));
            }
            None => {
                return Err(TranslateError::Invalid(format!(
                    "{location} has an AfterProcessingTime timestamp transform with no type"
                )))
            }
        }
    }
    Ok(Trigger::AfterProcessingTime { delay_ms, align })
}

fn accumulation(value: i32, location: &str) -> Result<Option<AccumulationMode>, TranslateError> {
    use pb::accumulation_mode::Enum as E;
    match E::try_from(value) {
        Ok(E::Unspecified) => Ok(None),
        Ok(E::Discarding) => Ok(Some(AccumulationMode::Discarding)),
        Ok(E::Accumulating) => Ok(Some(AccumulationMode::Accumulating)),
        Ok(E::Retracting) => Err(TranslateError::unsupported(
            "accumulation mode RETRACTING",
            location,
        )),
        Err(_) => Err(TranslateError::unsupported(
            format!("accumulation mode {value}"),
            location,
        )),
    }
}

fn output_time(value: i32, location: &str) -> Result<Option<OutputTime>, TranslateError> {
    use pb::output_time::Enum as E;
    match E::try_from(value) {
        Ok(E::Unspecified) => Ok(None),
        Ok(E::EndOfWindow) => Ok(Some(OutputTime::EndOfWindow)),
        Ok(E::LatestInPane) => Ok(Some(OutputTime::LatestInPane)),
        Ok(E::EarliestInPane) => Ok(Some(OutputTime::EarliestInPane)),
        Err(_) => Err(TranslateError::unsupported(
            format!("output time {value}"),
            location,
        )),
    }
}

fn closing(value: i32, location: &str) -> Result<Option<ClosingBehavior>, TranslateError> {
    use pb::closing_behavior::Enum as E;
    match E::try_from(value) {
        Ok(E::Unspecified) => Ok(None),
        Ok(E::EmitAlways) => Ok(Some(ClosingBehavior::EmitAlways)),
        Ok(E::EmitIfNonempty) => Ok(Some(ClosingBehavior::EmitIfNonEmpty)),
        Err(_) => Err(TranslateError::unsupported(
            format!("closing behavior {value}"),
            location,
        )),
    }
}

fn on_time(value: i32, location: &str) -> Result<Option<OnTimeBehavior>, TranslateError> {
    use pb::on_time_behavior::Enum as E;
    match E::try_from(value) {
        Ok(E::Unspecified) => Ok(None),
        Ok(E::FireAlways) => Ok(Some(OnTimeBehavior::FireAlways)),
        Ok(E::FireIfNonempty) => Ok(Some(OnTimeBehavior::FireIfNonEmpty)),
        Err(_) => Err(TranslateError::unsupported(
            format!("on-time behavior {value}"),
            location,
        )),
    }
}

/// Whether combiner lifting preserves the trigger's semantics. Triggers that
/// count elements (`Always`, `AfterCount`) must see each one: a lifted
/// combine hands the GroupByKey one accumulator per key and bundle, so
/// `Always` would fire once for a bundle's three elements, not three times
/// (Beam's Go trigger tests count those panes, and Prism does not lift them
/// either). Anything not listed needs the unlifted form too.
pub(crate) fn allows_combiner_lifting(t: Option<&pb::Trigger>) -> bool {
    let Some(t) = t else { return true };
    match &t.trigger {
        None => false,
        Some(
            PbTrigger::Default(_)
            | PbTrigger::Never(_)
            | PbTrigger::AfterProcessingTime(_)
            | PbTrigger::AfterSynchronizedProcessingTime(_),
        ) => true,
        Some(PbTrigger::Always(_) | PbTrigger::ElementCount(_)) => false,
        Some(PbTrigger::AfterEndOfWindow(a)) => {
            allows_combiner_lifting(a.early_firings.as_deref())
                && allows_combiner_lifting(a.late_firings.as_deref())
        }
        Some(PbTrigger::AfterAny(a)) => a
            .subtriggers
            .iter()
            .all(|s| allows_combiner_lifting(Some(s))),
        Some(PbTrigger::Repeat(r)) => allows_combiner_lifting(r.subtrigger.as_deref()),
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(kind: PbTrigger) -> pb::Trigger {
        pb::Trigger {
            trigger: Some(kind),
        }
    }

    #[test]
    fn converts_nested_triggers() {
        let early = t(PbTrigger::AfterProcessingTime(
            pb::trigger::AfterProcessingTime {
                timestamp_transforms: vec![pb::TimestampTransform {
                    timestamp_transform: Some(pb::timestamp_transform::TimestampTransform::Delay(
                        pb::timestamp_transform::Delay { delay_millis: 10 },
                    )),
                }],
            },
        ));
        let late = t(PbTrigger::ElementCount(pb::trigger::ElementCount {
            element_count: 2,
        }));
        let tree = t(PbTrigger::Repeat(Box::new(pb::trigger::Repeat {
            subtrigger: Some(Box::new(t(PbTrigger::AfterEndOfWindow(Box::new(
                pb::trigger::AfterEndOfWindow {
                    early_firings: Some(Box::new(early)),
                    late_firings: Some(Box::new(late)),
                },
            ))))),
        })));
        let converted = trigger(&tree, "test").unwrap();
        assert_eq!(
            converted,
            Trigger::Repeat(Box::new(Trigger::AfterEndOfWindow {
                early: Some(Box::new(Trigger::AfterProcessingTime {
                    delay_ms: 10,
                    align: None
                })),
                late: Some(Box::new(Trigger::ElementCount(2))),
            }))
        );
        assert!(!allows_combiner_lifting(Some(&tree)));
    }

    #[test]
    fn rejects_empty_trigger_and_missing_subtrigger() {
        let err = trigger(&pb::Trigger { trigger: None }, "windowing strategy 'w'").unwrap_err();
        assert!(err.to_string().contains("windowing strategy 'w'"), "{err}");
        let repeat = t(PbTrigger::Repeat(Box::new(pb::trigger::Repeat {
            subtrigger: None,
        })));
        assert!(trigger(&repeat, "w").is_err());
    }

    #[test]
    fn lifting_rules() {
        assert!(allows_combiner_lifting(None));
        assert!(allows_combiner_lifting(Some(&t(PbTrigger::Default(
            pb::trigger::Default {}
        )))));
        assert!(!allows_combiner_lifting(Some(&t(PbTrigger::ElementCount(
            pb::trigger::ElementCount { element_count: 1 }
        )))));
        assert!(!allows_combiner_lifting(Some(&t(PbTrigger::Always(
            pb::trigger::Always {}
        )))));
        assert!(!allows_combiner_lifting(Some(&t(PbTrigger::AfterAll(
            pb::trigger::AfterAll {
                subtriggers: vec![]
            }
        )))));
    }

    #[test]
    fn retracting_is_unsupported() {
        let err =
            accumulation(pb::accumulation_mode::Enum::Retracting as i32, "ws 'x'").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported accumulation mode RETRACTING in ws 'x'"
        );
    }
}
