//! Golden files of translation: for each pipeline the real Python SDK
//! wrote (`tests/data/*.pb`, from `gen_pipelines.py`), the plan and the
//! bundle descriptors translation makes, written out in full in
//! `tests/data/golden/NAME.txt`. The other tests check properties; these
//! show every change a translation change makes — fusion, coders, ports,
//! windowing — so a reviewer sees it in the diff.
//!
//! After an intended change: `REFRACT_BLESS=1 cargo test -p
//! refract-translate --test golden`, then read the diff of the files.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;

use refract_engine::plan::StageKind;
use refract_proto::pipeline as pb;
use refract_translate::Translated;

/// The pipelines with a golden file (every one in `tests/data` that
/// translates).
const PIPELINES: &[&str] = &[
    "combine_after_count_streaming",
    "combine_batch",
    "combine_streaming",
    "create_map_gbk",
    "custom_windows",
    "flatten_gbk_output",
    "flatten_twice",
    "read_text",
    "sdf",
    "side_input_downstream",
    "side_inputs",
    "stateful_custom_key",
    "stateful_timers",
    "test_stream",
    "windowing",
];

fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn urn_of(spec: Option<&pb::FunctionSpec>) -> &str {
    spec.map_or("", |s| s.urn.as_str())
}

/// The whole translation as stable text: maps sorted, ids as they are.
fn render(t: &Translated) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# pcollections");
    for (i, pc) in t.plan.pcollections.iter_enumerated() {
        let _ = writeln!(
            out,
            "{i}: {} bounded={} value={:?} window={:?}",
            pc.id, pc.bounded, pc.value_coder, pc.window_coder
        );
    }
    let _ = writeln!(out, "\n# stages");
    for (i, stage) in t.plan.stages.iter_enumerated() {
        let kind = match &stage.kind {
            StageKind::Impulse => "Impulse".to_string(),
            StageKind::Flatten => "Flatten".to_string(),
            StageKind::TestStream(events) => format!("TestStream({} events)", events.len()),
            StageKind::GroupByKey(ws) => format!("GroupByKey({ws:?})"),
            StageKind::Sdk(s) => format!("Sdk({s:?})"),
        };
        let sides = list(
            stage
                .side_inputs
                .iter()
                .map(|s| format!("{}/{}<-{}", s.id.transform_id, s.id.tag, s.pcollection)),
        );
        let _ = writeln!(
            out,
            "{i}: {} in=[{}] out=[{}] side=[{sides}]\n   {kind}",
            stage.name,
            list(stage.inputs.iter()),
            list(stage.outputs.iter()),
        );
    }
    let sdk_stages: BTreeMap<_, _> = t.sdk_stages.iter().collect();
    for (stage, d) in sdk_stages {
        let pbd = &d.descriptor;
        let _ = writeln!(
            out,
            "\n# descriptor of stage {stage}: {} (environment {}, input {:?}, outputs {:?})",
            pbd.id,
            d.environment_id,
            d.input_transform_id,
            d.outputs
                .iter()
                .map(|(t, p)| format!("{t}->{p}"))
                .collect::<Vec<_>>()
        );
        for (id, transform) in pbd.transforms.iter().collect::<BTreeMap<_, _>>() {
            let ins: BTreeMap<_, _> = transform.inputs.iter().collect();
            let outs: BTreeMap<_, _> = transform.outputs.iter().collect();
            let _ = writeln!(
                out,
                "transform {id} '{}' {} in={ins:?} out={outs:?}",
                transform.unique_name,
                urn_of(transform.spec.as_ref())
            );
        }
        for (id, pc) in pbd.pcollections.iter().collect::<BTreeMap<_, _>>() {
            let _ = writeln!(
                out,
                "pcollection {id} coder={} windowing={}",
                pc.coder_id, pc.windowing_strategy_id
            );
        }
        for (id, coder) in pbd.coders.iter().collect::<BTreeMap<_, _>>() {
            let _ = writeln!(
                out,
                "coder {id} {} [{}]",
                urn_of(coder.spec.as_ref()),
                coder.component_coder_ids.join(",")
            );
        }
        for (id, ws) in pbd.windowing_strategies.iter().collect::<BTreeMap<_, _>>() {
            let _ = writeln!(
                out,
                "windowing {id} {} coder={}",
                urn_of(ws.window_fn.as_ref()),
                ws.window_coder_id
            );
        }
    }
    out
}

#[test]
fn translations_match_their_golden_files() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden");
    let bless = std::env::var("REFRACT_BLESS").as_deref() == Ok("1");
    let mut stale = Vec::new();
    for name in PIPELINES {
        let rendered = render(&common::translated(name));
        let path = dir.join(format!("{name}.txt"));
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &rendered).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        if golden != rendered {
            stale.push(name.to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "translation differs from tests/data/golden for {stale:?}; if the change is \
         intended, run REFRACT_BLESS=1 cargo test -p refract-translate --test golden and \
         review the diff"
    );
}

#[test]
fn translation_renders_the_same_twice() {
    for name in PIPELINES {
        assert_eq!(
            render(&common::translated(name)),
            render(&common::translated(name)),
            "{name}"
        );
    }
}
