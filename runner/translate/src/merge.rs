//! Bundle descriptors that let an SDK merge windows for the runner.
//!
//! A GroupByKey whose windowing strategy needs merging with a window
//! function the runner does not know (anything but standard sessions) gets
//! a small descriptor of its own: data source → `beam:transform:merge_windows:v1`
//! (its payload is the window function's `FunctionSpec`) → data sink. The
//! engine sends it each key's windows and applies the answer (see the
//! engine's `window_merge` module for the element formats). Windows travel
//! in the GroupByKey input's runner-safe window coder, so the runner can
//! read the merged windows' end times.

use std::collections::{BTreeSet, HashMap};

use refract_engine::plan::StageIdx;
use refract_proto::fn_api;
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns::{coder as c, transform as t, window_fn};

use crate::error::TranslateError;
use crate::graph::{Graph, Node};
use crate::rewrite::{strategy_of, window_coder_of};
use crate::{TranslateOptions, WindowMerger};

/// The merger for GroupByKey `node` (plan stage `stage_idx`), if its window
/// function needs the SDK to merge.
pub(crate) fn window_merger(
    graph: &mut Graph,
    node: &Node,
    stage_idx: StageIdx,
    opts: &TranslateOptions,
) -> Result<Option<WindowMerger>, TranslateError> {
    let Some(input) = node.inputs.first() else {
        return Ok(None);
    };
    let location = format!("GroupByKey '{}'", node.name);
    let ws = strategy_of(graph, input)?.clone();
    let fn_spec = ws.window_fn.clone().unwrap_or_default();
    if ws.merge_status != pb::merge_status::Enum::NeedsMerge as i32
        || fn_spec.urn == window_fn::SESSIONS
    {
        return Ok(None);
    }
    let env = if ws.environment_id.is_empty() {
        graph
            .components
            .environments
            .keys()
            .min()
            .cloned()
            .unwrap_or_default()
    } else {
        ws.environment_id.clone()
    };
    let window = window_coder_of(graph, input)?;
    let window = graph.coders.safe_window(&window, &location)?;
    let coders = &mut graph.coders;
    let bytes = coders.add("bytes", c::BYTES, Vec::new());
    let windows = coders.add(
        &format!("{window}_iterable"),
        c::ITERABLE,
        vec![window.clone()],
    );
    let request = coders.add("merge_request", c::KV, vec![bytes.clone(), windows.clone()]);
    let merged = coders.add("merge_result", c::KV, vec![window.clone(), windows.clone()]);
    let all_merged = coders.add("merge_results", c::ITERABLE, vec![merged]);
    let answer_value = coders.add("merge_answer_value", c::KV, vec![windows, all_merged]);
    let answer = coders.add("merge_answer", c::KV, vec![bytes, answer_value]);
    let global = coders.add("global_window", c::GLOBAL_WINDOW, Vec::new());
    let request_port = coders.windowed(&request, &global);
    let answer_port = coders.windowed(&answer, &global);

    let ws_id = "refract_merge_global".to_string();
    let global_ws = pb::WindowingStrategy {
        window_fn: Some(pb::FunctionSpec {
            urn: window_fn::GLOBAL.to_string(),
            payload: Vec::new(),
        }),
        merge_status: pb::merge_status::Enum::NonMerging as i32,
        window_coder_id: global.clone(),
        trigger: Some(pb::Trigger {
            trigger: Some(pb::trigger::Trigger::Default(pb::trigger::Default {})),
        }),
        accumulation_mode: pb::accumulation_mode::Enum::Discarding as i32,
        output_time: pb::output_time::Enum::EndOfWindow as i32,
        closing_behavior: pb::closing_behavior::Enum::EmitIfNonempty as i32,
        on_time_behavior: pb::on_time_behavior::Enum::FireIfNonempty as i32,
        assigns_to_one_window: true,
        ..Default::default()
    };
    let pcoll = |id: &str, coder: &str| pb::PCollection {
        unique_name: id.to_string(),
        coder_id: coder.to_string(),
        is_bounded: pb::is_bounded::Enum::Bounded as i32,
        windowing_strategy_id: ws_id.clone(),
        ..Default::default()
    };
    let endpoint = pb::ApiServiceDescriptor {
        url: opts.fn_api_url.clone(),
        ..Default::default()
    };
    let port = |coder: &str| {
        fn_api::RemoteGrpcPort {
            api_service_descriptor: Some(endpoint.clone()),
            coder_id: coder.to_string(),
        }
        .encode_to_vec()
    };
    let (source, merge, sink) = ("merge/Source", "merge/MergeWindows", "merge/Sink");
    let one = |k: &str, v: &str| [(k.to_string(), v.to_string())].into_iter().collect();
    let transforms: HashMap<String, pb::PTransform> = [
        (
            source.to_string(),
            pb::PTransform {
                unique_name: source.to_string(),
                spec: Some(pb::FunctionSpec {
                    urn: t::DATA_SOURCE.to_string(),
                    payload: port(&request_port),
                }),
                outputs: one("out", "merge_in"),
                ..Default::default()
            },
        ),
        (
            merge.to_string(),
            pb::PTransform {
                unique_name: format!("{}/MergeWindows", node.name),
                spec: Some(pb::FunctionSpec {
                    urn: t::MERGE_WINDOWS.to_string(),
                    payload: fn_spec.encode_to_vec(),
                }),
                inputs: one("in", "merge_in"),
                outputs: one("out", "merge_out"),
                environment_id: env.clone(),
                ..Default::default()
            },
        ),
        (
            sink.to_string(),
            pb::PTransform {
                unique_name: sink.to_string(),
                spec: Some(pb::FunctionSpec {
                    urn: t::DATA_SINK.to_string(),
                    payload: port(&answer_port),
                }),
                inputs: one("in", "merge_out"),
                ..Default::default()
            },
        ),
    ]
    .into_iter()
    .collect();
    let roots: BTreeSet<String> = [request_port, answer_port, global].into_iter().collect();
    let coders = graph.coders.closure(&roots, &location)?;
    let environments = graph
        .components
        .environments
        .get(&env)
        .map(|e| (env.clone(), e.clone()))
        .into_iter()
        .collect();
    let descriptor = fn_api::ProcessBundleDescriptor {
        id: format!("{}-{stage_idx}-merge", opts.descriptor_id_prefix),
        transforms,
        pcollections: [
            ("merge_in".to_string(), pcoll("merge_in", &request)),
            ("merge_out".to_string(), pcoll("merge_out", &answer)),
        ]
        .into_iter()
        .collect(),
        windowing_strategies: [(ws_id.clone(), global_ws)].into_iter().collect(),
        coders,
        environments,
        state_api_service_descriptor: Some(endpoint.clone()),
        timer_api_service_descriptor: None,
    };
    Ok(Some(WindowMerger {
        descriptor,
        environment_id: env,
        source: source.to_string(),
        sink: sink.to_string(),
    }))
}
