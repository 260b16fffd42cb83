//! Plan-building helpers shared by the engine's smaller test files.

#![allow(dead_code)]

pub mod crashes;

use bytes::Bytes;
use refract_engine::coder::{
    encode_windowed_value, Coder, PaneInfo, TimerValue, WindowedValueHeader,
};
use refract_engine::executor::{BundleInput, BundleSplit, Residual, TimerInput};
use refract_engine::plan::{
    PCollection, PCollectionIdx, Plan, SdkStage, Stage, StageKind, TimeDomain, TimerFamily,
    WindowingStrategy,
};
use refract_engine::window::Window;

/// A bounded PCollection of `coder` values in the global window.
pub fn global_pcollection(id: &str, coder: Coder) -> PCollection {
    PCollection {
        id: id.into(),
        value_coder: coder,
        window_coder: Coder::GlobalWindow,
        bounded: true,
    }
}

/// A stage without side inputs, reading and writing the PCollections
/// numbered `inputs` and `outputs`.
pub fn stage(name: &str, kind: StageKind, inputs: Vec<usize>, outputs: Vec<usize>) -> Stage {
    Stage {
        name: name.into(),
        kind,
        inputs: inputs.into_iter().map(PCollectionIdx::new).collect(),
        side_inputs: vec![],
        outputs: outputs.into_iter().map(PCollectionIdx::new).collect(),
    }
}

/// impulse (PCollection 0) → SDK stage 1 "source" (PCollection 1 of
/// `values`) → stage 2, `consumer` (of `kind`, reading PCollection 1, no
/// outputs): the plan of tests about one stage fed by a fake source.
pub fn sourced_plan(values: Coder, consumer: &str, kind: StageKind) -> Plan {
    Plan {
        pcollections: vec![
            global_pcollection("impulse", Coder::Bytes),
            global_pcollection("source", values),
        ]
        .into(),
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage(
                "source",
                StageKind::Sdk(SdkStage::default()),
                vec![0],
                vec![1],
            ),
            stage(consumer, kind, vec![1], vec![]),
        ]
        .into(),
        names: Default::default(),
    }
}

/// `value` at `timestamp` in the global window, not yet fired.
pub fn global_windowed(value: &[u8], timestamp: i64) -> Bytes {
    let header = WindowedValueHeader {
        timestamp,
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    };
    let mut out = Vec::new();
    encode_windowed_value(&header, &Coder::GlobalWindow, value, &mut out).expect("encodes");
    Bytes::from(out)
}

/// The coder of `KV<bytes, bytes>` values.
pub fn kv_bytes_coder() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes))
}

/// `count` `KV<bytes, bytes>` values at time 0 in the global window, keyed
/// `k000`, `k001`, … in turn over `keys` keys, each valued `x`: what a
/// keyed source emits.
pub fn keyed_elements(count: usize, keys: usize) -> Bytes {
    let header = WindowedValueHeader {
        timestamp: 0,
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    };
    let mut out = Vec::new();
    for i in 0..count {
        let key = format!("k{:03}", i % keys.max(1)).into_bytes();
        let mut kv = vec![key.len() as u8];
        kv.extend_from_slice(&key);
        kv.extend_from_slice(&[1, b'x']);
        encode_windowed_value(&header, &Coder::GlobalWindow, &kv, &mut out).expect("encodes");
    }
    Bytes::from(out)
}

/// impulse (PCollection 0) → SDK stage 1 "source" (`KV<bytes, bytes>`, 1,
/// say [`keyed_elements`]) → each of `consumers` (SDK stages 2, 3, …, each
/// named and stateful or not) reading PCollection 1.
pub fn keyed_source_plan(consumers: &[(&str, bool)]) -> Plan {
    let sdk = |stateful| {
        StageKind::Sdk(SdkStage {
            stateful,
            ..SdkStage::default()
        })
    };
    let mut stages = vec![
        stage("impulse", StageKind::Impulse, vec![], vec![0]),
        stage("source", sdk(false), vec![0], vec![1]),
    ];
    for &(name, stateful) in consumers {
        stages.push(stage(name, sdk(stateful), vec![1], vec![]));
    }
    Plan {
        pcollections: vec![
            global_pcollection("impulse", Coder::Bytes),
            global_pcollection("keyed", kv_bytes_coder()),
        ]
        .into(),
        stages: stages.into(),
        names: Default::default(),
    }
}

/// impulse (PCollection 0) → SDK stage 1 "read" (`KV<bytes, bytes>`, 1) →
/// GroupByKey 2 in the global window (`KV<bytes, iterable<bytes>>`, 2) →
/// SDK stage 3 "sink".
pub fn group_plan() -> Plan {
    let sdk = || StageKind::Sdk(SdkStage::default());
    let kv = || Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes));
    Plan {
        pcollections: vec![
            global_pcollection("impulse", Coder::Bytes),
            global_pcollection("read", kv()),
            global_pcollection(
                "grouped",
                Coder::Kv(
                    Box::new(Coder::Bytes),
                    Box::new(Coder::Iterable(Box::new(Coder::Bytes))),
                ),
            ),
        ]
        .into(),
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage("read", sdk(), vec![0], vec![1]),
            stage(
                "group",
                StageKind::GroupByKey(WindowingStrategy::global_default()),
                vec![1],
                vec![2],
            ),
            stage("sink", sdk(), vec![2], vec![]),
        ]
        .into(),
        names: Default::default(),
    }
}

/// The step a self-checkpointing source's bundle reads: the last byte of
/// its element (the impulse's empty value reads as step 0).
pub fn source_step(input: &refract_engine::executor::BundleInput) -> u32 {
    let chunk = input.elements.first().cloned().unwrap_or_default();
    u32::from(chunk.last().copied().unwrap_or(0))
}

/// The residual that defers step `n + 1` of a source of `steps` steps (as
/// bytes `[n + 1]` in the global window), none after the last.
pub fn next_source_step(n: u32, steps: u32) -> Vec<Residual> {
    if n + 1 >= steps {
        return Vec::new();
    }
    let step = u8::try_from(n + 1).expect("under 256 steps");
    vec![Residual {
        element: global_windowed(&[1, step], 0),
        delay_ms: 0,
        watermark: None,
    }]
}

/// A bundle's input elements, one `Bytes` each, cut by their lengths.
pub fn elements(input: &BundleInput) -> Vec<Bytes> {
    let all = Bytes::from(input.elements.concat());
    let mut at = 0;
    input
        .element_lengths
        .iter()
        .map(|&len| {
            let element = all.slice(at..at + len);
            at += len;
            element
        })
        .collect()
}

/// A channel split of a bundle of `elements` that keeps the first `kept`
/// and gives back the rest.
pub fn split_at(elements: &[Bytes], kept: usize) -> BundleSplit {
    BundleSplit {
        kept_elements: kept,
        primaries: Vec::new(),
        residuals: elements[kept..]
            .iter()
            .map(|e| Residual {
                element: e.clone(),
                delay_ms: 0,
                watermark: None,
            })
            .collect(),
    }
}

/// An event-time timer family of `transform_id` with `Bytes` keys in the
/// global window.
pub fn global_timer_family(transform_id: &str, family_id: &str) -> TimerFamily {
    TimerFamily {
        transform_id: transform_id.into(),
        family_id: family_id.into(),
        domain: TimeDomain::EventTime,
        key_coder: Coder::Bytes,
        window_coder: Coder::GlobalWindow,
    }
}

/// A timer of `family` (see [`global_timer_family`]) for each of `keys`
/// (nested-encoded), due at 10 in the global window.
pub fn global_timers_at_10(
    family: &TimerFamily,
    keys: impl IntoIterator<Item = Bytes>,
) -> Vec<TimerInput> {
    let mut data = Vec::new();
    for user_key in keys {
        TimerValue {
            user_key,
            dynamic_tag: String::new(),
            windows: smallvec::smallvec![Window::Global],
            clear: false,
            fire_timestamp: 10,
            hold_timestamp: 10,
            pane: PaneInfo::NO_FIRING,
        }
        .encode(&Coder::GlobalWindow, &mut data)
        .expect("encodes");
    }
    vec![TimerInput {
        transform_id: family.transform_id.to_string(),
        family_id: family.family_id.clone(),
        data: Bytes::from(data),
    }]
}
