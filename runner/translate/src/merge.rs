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

/// The id of the merge descriptor's data source.
const SOURCE: &str = "merge/Source";
/// The id of the merge descriptor's `merge_windows` transform.
const MERGE: &str = "merge/MergeWindows";
/// The id of the merge descriptor's data sink.
const SINK: &str = "merge/Sink";
/// The id of the merge descriptor's (global) windowing strategy.
const GLOBAL_WS: &str = "refract_merge_global";

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
    let merge_coders = MergeCoders::add(graph, &window);
    let endpoint = pb::ApiServiceDescriptor {
        url: opts.fn_api_url.clone(),
        ..Default::default()
    };
    let transforms = merge_transforms(&node.name, &fn_spec, &env, &endpoint, &merge_coders);
    let MergeCoders {
        request,
        answer,
        request_port,
        answer_port,
        global,
    } = merge_coders;
    let global_ws = global_windowing(&global);
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
            (
                "merge_in".to_string(),
                merge_pcollection("merge_in", &request),
            ),
            (
                "merge_out".to_string(),
                merge_pcollection("merge_out", &answer),
            ),
        ]
        .into_iter()
        .collect(),
        windowing_strategies: [(GLOBAL_WS.to_string(), global_ws)].into_iter().collect(),
        coders,
        environments,
        state_api_service_descriptor: Some(endpoint.clone()),
        timer_api_service_descriptor: None,
    };
    Ok(Some(WindowMerger {
        descriptor,
        environment_id: env,
        source: SOURCE.to_string(),
        sink: SINK.to_string(),
    }))
}

/// The coders of a merge descriptor, whose windows travel in the
/// GroupByKey input's runner-safe window coder.
struct MergeCoders {
    /// `KV<bytes, iterable<window>>`: a key's windows to merge.
    request: String,
    /// `KV<bytes, KV<iterable<window>, iterable<KV<window,
    /// iterable<window>>>>>`: the unmerged windows and each merge result.
    answer: String,
    /// The data source's coder: `request` in the global window.
    request_port: String,
    /// The data sink's coder: `answer` in the global window.
    answer_port: String,
    /// The global window coder.
    global: String,
}

impl MergeCoders {
    /// Adds the merge coders over (runner-safe) window coder `window` to
    /// the graph's coders.
    fn add(graph: &mut Graph, window: &str) -> MergeCoders {
        let coders = &mut graph.coders;
        let bytes = coders.add("bytes", c::BYTES, Vec::new());
        let windows = coders.add(
            &format!("{window}_iterable"),
            c::ITERABLE,
            vec![window.to_string()],
        );
        let request = coders.add("merge_request", c::KV, vec![bytes.clone(), windows.clone()]);
        let merged = coders.add(
            "merge_result",
            c::KV,
            vec![window.to_string(), windows.clone()],
        );
        let all_merged = coders.add("merge_results", c::ITERABLE, vec![merged]);
        let answer_value = coders.add("merge_answer_value", c::KV, vec![windows, all_merged]);
        let answer = coders.add("merge_answer", c::KV, vec![bytes, answer_value]);
        let global = coders.add("global_window", c::GLOBAL_WINDOW, Vec::new());
        let request_port = coders.windowed(&request, &global);
        let answer_port = coders.windowed(&answer, &global);
        MergeCoders {
            request,
            answer,
            request_port,
            answer_port,
            global,
        }
    }
}

/// The merge descriptor's windowing strategy: the global window (coder
/// `global`), which its PCollections are in.
fn global_windowing(global: &str) -> pb::WindowingStrategy {
    pb::WindowingStrategy {
        window_fn: Some(pb::FunctionSpec {
            urn: window_fn::GLOBAL.to_string(),
            payload: Vec::new(),
        }),
        merge_status: pb::merge_status::Enum::NonMerging as i32,
        window_coder_id: global.to_string(),
        trigger: Some(pb::Trigger {
            trigger: Some(pb::trigger::Trigger::Default(pb::trigger::Default {})),
        }),
        accumulation_mode: pb::accumulation_mode::Enum::Discarding as i32,
        output_time: pb::output_time::Enum::EndOfWindow as i32,
        closing_behavior: pb::closing_behavior::Enum::EmitIfNonempty as i32,
        on_time_behavior: pb::on_time_behavior::Enum::FireIfNonempty as i32,
        assigns_to_one_window: true,
        ..Default::default()
    }
}

/// A bounded PCollection `id` of the merge descriptor, of coder `coder`.
fn merge_pcollection(id: &str, coder: &str) -> pb::PCollection {
    pb::PCollection {
        unique_name: id.to_string(),
        coder_id: coder.to_string(),
        is_bounded: pb::is_bounded::Enum::Bounded as i32,
        windowing_strategy_id: GLOBAL_WS.to_string(),
        ..Default::default()
    }
}

/// The merge descriptor's transforms: data source → `merge_windows` (with
/// window function `fn_spec`, in environment `env`, named after
/// GroupByKey `name`) → data sink, the ports at `endpoint`.
fn merge_transforms(
    name: &str,
    fn_spec: &pb::FunctionSpec,
    env: &str,
    endpoint: &pb::ApiServiceDescriptor,
    coders: &MergeCoders,
) -> HashMap<String, pb::PTransform> {
    let port = |coder: &str| {
        fn_api::RemoteGrpcPort {
            api_service_descriptor: Some(endpoint.clone()),
            coder_id: coder.to_string(),
        }
        .encode_to_vec()
    };
    let one = |k: &str, v: &str| [(k.to_string(), v.to_string())].into_iter().collect();
    [
        (
            SOURCE.to_string(),
            pb::PTransform {
                unique_name: SOURCE.to_string(),
                spec: Some(pb::FunctionSpec {
                    urn: t::DATA_SOURCE.to_string(),
                    payload: port(&coders.request_port),
                }),
                outputs: one("out", "merge_in"),
                ..Default::default()
            },
        ),
        (
            MERGE.to_string(),
            pb::PTransform {
                unique_name: format!("{name}/MergeWindows"),
                spec: Some(pb::FunctionSpec {
                    urn: t::MERGE_WINDOWS.to_string(),
                    payload: fn_spec.encode_to_vec(),
                }),
                inputs: one("in", "merge_in"),
                outputs: one("out", "merge_out"),
                environment_id: env.to_string(),
                ..Default::default()
            },
        ),
        (
            SINK.to_string(),
            pb::PTransform {
                unique_name: SINK.to_string(),
                spec: Some(pb::FunctionSpec {
                    urn: t::DATA_SINK.to_string(),
                    payload: port(&coders.answer_port),
                }),
                inputs: one("in", "merge_out"),
                ..Default::default()
            },
        ),
    ]
    .into_iter()
    .collect()
}
