//! URN strings of the Beam model that Refract recognises.
//!
//! They are spelled out here (rather than read from the proto enum options at
//! run time) because matching on them is on every translation path, and a
//! typo must be a compile error, not a silently unsupported transform.

/// Transforms the runner executes itself or recognises structurally.
pub mod transform {
    /// ParDo: a user DoFn, run in an SDK harness.
    pub const PAR_DO: &str = "beam:transform:pardo:v1";
    /// Flatten: the union of several PCollections into one.
    pub const FLATTEN: &str = "beam:transform:flatten:v1";
    /// GroupByKey: gathers the values of each key and window; the runner does it itself.
    pub const GROUP_BY_KEY: &str = "beam:transform:group_by_key:v1";
    /// Impulse: the root that emits one empty byte string in the global window.
    pub const IMPULSE: &str = "beam:transform:impulse:v1";
    /// Window.into: gives each element its windows via the WindowFn, run in an SDK harness.
    pub const ASSIGN_WINDOWS: &str = "beam:transform:window_into:v1";
    /// TestStream: a scripted sequence of elements, watermark and clock moves for tests.
    pub const TEST_STREAM: &str = "beam:transform:teststream:v1";
    /// Maps main input windows to side input windows; the SDK runs it for the runner.
    pub const MAP_WINDOWS: &str = "beam:transform:map_windows:v1";
    /// Merges a set of windows (e.g. sessions) by the WindowFn; the SDK runs it for the runner.
    pub const MERGE_WINDOWS: &str = "beam:transform:merge_windows:v1";
    /// Renders each element as human-readable text; run in an SDK harness.
    pub const TO_STRING: &str = "beam:transform:to_string:v1";
    /// Read: the legacy primitive that reads a bounded or unbounded source.
    pub const READ: &str = "beam:transform:read:v1";
    /// The legacy primitive that turned a PCollection into a side input view.
    pub const CREATE_VIEW: &str = "beam:transform:create_view:v1";

    /// Combine.perKey: a composite of GroupByKey then combining each key's values.
    pub const COMBINE_PER_KEY: &str = "beam:transform:combine_per_key:v1";
    /// Combine.globally: combines a whole PCollection to one value per window.
    pub const COMBINE_GLOBALLY: &str = "beam:transform:combine_globally:v1";
    /// Combines the grouped values of each key after a GroupByKey.
    pub const COMBINE_GROUPED_VALUES: &str = "beam:transform:combine_grouped_values:v1";
    /// Lifted combine, step 1: partial combining of each key's inputs before the shuffle.
    pub const COMBINE_PER_KEY_PRECOMBINE: &str = "beam:transform:combine_per_key_precombine:v1";
    /// Lifted combine, step 2: merges a key's grouped accumulators into one.
    pub const COMBINE_PER_KEY_MERGE_ACCUMULATORS: &str =
        "beam:transform:combine_per_key_merge_accumulators:v1";
    /// Lifted combine, step 3: turns each key's merged accumulator into the output.
    pub const COMBINE_PER_KEY_EXTRACT_OUTPUTS: &str =
        "beam:transform:combine_per_key_extract_outputs:v1";
    /// Lifted combine: turns each input into an accumulator on its own, without merging.
    pub const COMBINE_PER_KEY_CONVERT_TO_ACCUMULATORS: &str =
        "beam:transform:combine_per_key_convert_to_accumulators:v1";

    /// Reshuffle: a hint to redistribute elements and checkpoint; Refract passes them through.
    pub const RESHUFFLE: &str = "beam:transform:reshuffle:v1";
    /// Redistribute by key: a reshuffle of keyed data; Refract passes elements through.
    pub const REDISTRIBUTE_BY_KEY: &str = "beam:transform:redistribute_by_key:v1";
    /// Redistribute arbitrarily: a reshuffle with no key; Refract passes elements through.
    pub const REDISTRIBUTE_ARBITRARILY: &str = "beam:transform:redistribute_arbitrarily:v1";
    /// WriteFiles: the composite that writes a PCollection out as sharded files.
    pub const WRITE_FILES: &str = "beam:transform:write_files:v1";
    /// GroupIntoBatches: batches each key's values into groups of bounded size.
    pub const GROUP_INTO_BATCHES: &str = "beam:transform:group_into_batches:v1";
    /// GroupIntoBatches whose output keys are sharded, so one key can spread over workers.
    pub const GROUP_INTO_BATCHES_WITH_SHARDED_KEY: &str =
        "beam:transform:group_into_batches_with_sharded_key:v1";
    /// A composite with no standard meaning; only its subtransforms matter.
    pub const GENERIC_COMPOSITE: &str = "beam:transform:generic_composite:v1";
    /// A Python SDK composite whose payload is pickled; opaque outside Python.
    pub const PICKLED_PYTHON: &str = "beam:transform:pickled_python:v1";

    /// Splittable DoFn: pairs each element with its initial restriction.
    pub const SDF_PAIR_WITH_RESTRICTION: &str = "beam:transform:sdf_pair_with_restriction:v1";
    /// Splittable DoFn: splits each restriction and attaches its size.
    pub const SDF_SPLIT_AND_SIZE_RESTRICTIONS: &str =
        "beam:transform:sdf_split_and_size_restrictions:v1";
    /// Splittable DoFn: processes each element over its sized restriction; can be split.
    pub const SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS: &str =
        "beam:transform:sdf_process_sized_element_and_restrictions:v1";
    /// Splittable DoFn: shortens restrictions so the work can finish when draining.
    pub const SDF_TRUNCATE_SIZED_RESTRICTIONS: &str =
        "beam:transform:sdf_truncate_sized_restrictions:v1";

    /// The runner's side of a data channel: elements arrive from the runner over the Fn API.
    pub const DATA_SOURCE: &str = "beam:runner:source:v1";
    /// The way back over a data channel: an SDK sends elements to the runner over the Fn API.
    pub const DATA_SINK: &str = "beam:runner:sink:v1";
}

/// Coders. The runner parses the first group; everything else is opaque.
pub mod coder {
    /// Raw bytes; nested, they carry a varint length prefix.
    pub const BYTES: &str = "beam:coder:bytes:v1";
    /// UTF-8 text; nested, it carries a varint length prefix.
    pub const STRING_UTF8: &str = "beam:coder:string_utf8:v1";
    /// A key-value pair: the key's encoding followed by the value's.
    pub const KV: &str = "beam:coder:kv:v1";
    /// A boolean as one byte, 0 or 1.
    pub const BOOL: &str = "beam:coder:bool:v1";
    /// A 64-bit integer as a variable-length integer.
    pub const VARINT: &str = "beam:coder:varint:v1";
    /// A 64-bit float as eight big-endian bytes.
    pub const DOUBLE: &str = "beam:coder:double:v1";
    /// A sequence of elements, with a count up front or in length-counted blocks.
    pub const ITERABLE: &str = "beam:coder:iterable:v1";
    /// A timer: its key, tag, windows, fire and hold timestamps and pane.
    pub const TIMER: &str = "beam:coder:timer:v1";
    /// An interval window: its end timestamp and its span.
    pub const INTERVAL_WINDOW: &str = "beam:coder:interval_window:v1";
    /// Length-prefixed bytes: how the runner wraps values whose coder it does not know.
    pub const LENGTH_PREFIX: &str = "beam:coder:length_prefix:v1";
    /// The single global window, which encodes to no bytes.
    pub const GLOBAL_WINDOW: &str = "beam:coder:global_window:v1";
    /// A value with its timestamp, windows and pane: how elements travel on the data channel.
    pub const WINDOWED_VALUE: &str = "beam:coder:windowed_value:v1";
    /// A windowed value whose timestamp, windows and pane are fixed in the payload.
    pub const PARAM_WINDOWED_VALUE: &str = "beam:coder:param_windowed_value:v1";
    /// An iterable whose tail may be left behind a token, to be fetched over the State API.
    pub const STATE_BACKED_ITERABLE: &str = "beam:coder:state_backed_iterable:v1";
    /// A user window type: its max timestamp, then the window under its own coder.
    pub const CUSTOM_WINDOW: &str = "beam:coder:custom_window:v1";
    /// A schema row: a field count and null bitmap, then the non-null fields in order.
    pub const ROW: &str = "beam:coder:row:v1";
    /// A key paired with a shard id, so one key can be spread over several workers.
    pub const SHARDED_KEY: &str = "beam:coder:sharded_key:v1";
    /// An optional value: a presence byte, then the value if present.
    pub const NULLABLE: &str = "beam:coder:nullable:v1";
    /// The Go SDK's coder for user types. Go writes every value of it with
    /// a length prefix of its own, so its bytes are a length-prefixed blob
    /// whether or not a `length_prefix` coder wraps it.
    pub const GO_CUSTOM: &str = "beam:go:coder:custom:v1";
}

/// Prefixes of the `beam:version:sdk_base:...` capability by which an
/// environment announces which SDK it runs.
pub mod sdk_base {
    /// Beam's Python SDK (`...:apache/beam_python3.11_sdk:2.77.0`).
    pub const PYTHON: &str = "beam:version:sdk_base:apache/beam_python";
    /// Beam's Go SDK (`...:go:apache/beam_go_sdk:2.77.0`).
    pub const GO: &str = "beam:version:sdk_base:go:";
}

/// Environments (`Environment.urn`): how the SDK harness for user code is started.
pub mod env {
    /// A harness someone else already runs; the runner asks it at an endpoint for workers.
    pub const EXTERNAL: &str = "beam:env:external:v1";
    /// A harness run in a Docker container from the SDK's image.
    pub const DOCKER: &str = "beam:env:docker:v1";
    /// A harness run as a local process from a given command.
    pub const PROCESS: &str = "beam:env:process:v1";
    /// Python's in-process harness, only usable inside a Python runner; Refract refuses it.
    pub const EMBEDDED_PYTHON: &str = "beam:env:embedded_python:v1";
    /// Python's in-process harness over gRPC; only a Python runner can use it. Refract refuses it.
    pub const EMBEDDED_PYTHON_GRPC: &str = "beam:env:embedded_python_grpc:v1";
    /// Python's loopback marker, meant to become an external worker pool before submission.
    pub const EMBEDDED_PYTHON_LOOPBACK: &str = "beam:env:embedded_python_loopback:v1";
    /// A placeholder for the runner's default environment, left by an SDK with no context.
    pub const DEFAULT: &str = "beam:env:default:v1";
    /// A list of alternatives (see [`crate::any_of`]).
    pub const ANY_OF: &str = "beam:env:anyof:v1";
}

/// Window functions.
pub mod window_fn {
    /// Every element in the one global window.
    pub const GLOBAL: &str = "beam:window_fn:global_windows:v1";
    /// Fixed windows: tumbling, non-overlapping windows of one size.
    pub const FIXED: &str = "beam:window_fn:fixed_windows:v1";
    /// Sliding windows: windows of one size that start every period, so they overlap.
    pub const SLIDING: &str = "beam:window_fn:sliding_windows:v1";
    /// Session windows: per-key windows merged across gaps shorter than a timeout.
    pub const SESSIONS: &str = "beam:window_fn:session_windows:v1";
}

/// Side input access patterns.
pub mod side_input {
    /// The side input is read as one iterable of all its values in a window.
    pub const ITERABLE: &str = "beam:side_input:iterable:v1";
    /// The side input is read by key, as the values of one key in a window.
    pub const MULTIMAP: &str = "beam:side_input:multimap:v1";
}

/// User state protocols (`StateSpec.protocol.urn`).
pub mod user_state {
    /// Bag state: an unordered collection that can be appended to, read and cleared.
    pub const BAG: &str = "beam:user_state:bag:v1";
    /// Multimap state: many values per map key, read and updated key by key.
    pub const MULTIMAP: &str = "beam:user_state:multimap:v1";
    /// Ordered list state: values kept sorted by timestamp and read by time range.
    pub const ORDERED_LIST: &str = "beam:user_state:ordered_list:v1";
}

/// Pipeline requirements (`Pipeline.requirements`).
pub mod requirement {
    /// A ParDo uses per-key user state or timers.
    pub const STATEFUL: &str = "beam:requirement:pardo:stateful:v1";
    /// A DoFn asks for a callback once its bundle's output is durably committed.
    pub const FINALIZATION: &str = "beam:requirement:pardo:finalization:v1";
    /// A DoFn needs the same input again if its bundle is retried.
    pub const STABLE_INPUT: &str = "beam:requirement:pardo:stable_input:v1";
    /// A DoFn needs each key's input delivered in timestamp order.
    pub const TIME_SORTED_INPUT: &str = "beam:requirement:pardo:time_sorted_input:v1";
    /// The pipeline has a splittable DoFn, whose work the runner may split and checkpoint.
    pub const SPLITTABLE_DOFN: &str = "beam:requirement:pardo:splittable_dofn:v1";
    /// A DoFn has a callback to run when a window expires, before its state goes.
    pub const ON_WINDOW_EXPIRATION: &str = "beam:requirement:pardo:on_window_expiration:v1";
}

/// Protocols and capabilities exchanged with SDK harnesses.
pub mod protocol {
    /// The runner can serve a multimap side input's keys and values in one read.
    pub const MULTIMAP_KEYS_VALUES_SIDE_INPUT: &str =
        "beam:protocol:multimap_keys_values_side_input:v1";
    /// Monitoring infos may be reported by short id, with metadata fetched once.
    pub const MONITORING_INFO_SHORT_IDS: &str = "beam:protocol:monitoring_info_short_ids:v1";
    /// The SDK accepts bundle input carried inside the ProcessBundleRequest itself.
    pub const CONTROL_REQUEST_ELEMENTS_EMBEDDING: &str =
        "beam:protocol:control_request_elements_embedding:v1";
    /// The environment's workers run bundles in parallel on several cores
    /// (Java's and Go's declare it; Python's and TypeScript's do not).
    pub const MULTI_CORE_BUNDLE_PROCESSING: &str = "beam:protocol:multi_core_bundle_processing:v1";
}

/// Artifact types and roles.
pub mod artifact {
    /// An artifact that is a file at a path readable where it is resolved.
    pub const FILE: &str = "beam:artifact:type:file:v1";
    /// An artifact to be downloaded from a URL.
    pub const URL: &str = "beam:artifact:type:url:v1";
    /// An artifact whose bytes are carried inline in its payload.
    pub const EMBEDDED: &str = "beam:artifact:type:embedded:v1";
    /// A file only the expansion service that named it can give (its key
    /// is meaningful to that service alone).
    pub const DEFERRED: &str = "beam:artifact:type:deferred:v1";
    /// The role naming the path an artifact is staged to for the harness.
    pub const STAGING_TO: &str = "beam:artifact:role:staging_to:v1";
    /// The Go SDK marks its pipeline binary, run in worker mode by Go's
    /// SDK image, with this role when it stages more than one file.
    pub const GO_WORKER_BINARY: &str = "beam:artifact:role:go_worker_binary:v1";
}
