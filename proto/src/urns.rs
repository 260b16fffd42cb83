//! URN strings of the Beam model that Refract recognises.
//!
//! They are spelled out here (rather than read from the proto enum options at
//! run time) because matching on them is on every translation path, and a
//! typo must be a compile error, not a silently unsupported transform.

/// Transforms the runner executes itself or recognises structurally.
pub mod transform {
    pub const PAR_DO: &str = "beam:transform:pardo:v1";
    pub const FLATTEN: &str = "beam:transform:flatten:v1";
    pub const GROUP_BY_KEY: &str = "beam:transform:group_by_key:v1";
    pub const IMPULSE: &str = "beam:transform:impulse:v1";
    pub const ASSIGN_WINDOWS: &str = "beam:transform:window_into:v1";
    pub const TEST_STREAM: &str = "beam:transform:teststream:v1";
    pub const MAP_WINDOWS: &str = "beam:transform:map_windows:v1";
    pub const MERGE_WINDOWS: &str = "beam:transform:merge_windows:v1";
    pub const TO_STRING: &str = "beam:transform:to_string:v1";
    pub const READ: &str = "beam:transform:read:v1";
    pub const CREATE_VIEW: &str = "beam:transform:create_view:v1";

    pub const COMBINE_PER_KEY: &str = "beam:transform:combine_per_key:v1";
    pub const COMBINE_GLOBALLY: &str = "beam:transform:combine_globally:v1";
    pub const COMBINE_GROUPED_VALUES: &str = "beam:transform:combine_grouped_values:v1";
    pub const COMBINE_PER_KEY_PRECOMBINE: &str = "beam:transform:combine_per_key_precombine:v1";
    pub const COMBINE_PER_KEY_MERGE_ACCUMULATORS: &str =
        "beam:transform:combine_per_key_merge_accumulators:v1";
    pub const COMBINE_PER_KEY_EXTRACT_OUTPUTS: &str =
        "beam:transform:combine_per_key_extract_outputs:v1";
    pub const COMBINE_PER_KEY_CONVERT_TO_ACCUMULATORS: &str =
        "beam:transform:combine_per_key_convert_to_accumulators:v1";

    pub const RESHUFFLE: &str = "beam:transform:reshuffle:v1";
    pub const REDISTRIBUTE_BY_KEY: &str = "beam:transform:redistribute_by_key:v1";
    pub const REDISTRIBUTE_ARBITRARILY: &str = "beam:transform:redistribute_arbitrarily:v1";
    pub const WRITE_FILES: &str = "beam:transform:write_files:v1";
    pub const GROUP_INTO_BATCHES: &str = "beam:transform:group_into_batches:v1";
    pub const GROUP_INTO_BATCHES_WITH_SHARDED_KEY: &str =
        "beam:transform:group_into_batches_with_sharded_key:v1";
    pub const GENERIC_COMPOSITE: &str = "beam:transform:generic_composite:v1";
    pub const PICKLED_PYTHON: &str = "beam:transform:pickled_python:v1";

    pub const SDF_PAIR_WITH_RESTRICTION: &str = "beam:transform:sdf_pair_with_restriction:v1";
    pub const SDF_SPLIT_AND_SIZE_RESTRICTIONS: &str =
        "beam:transform:sdf_split_and_size_restrictions:v1";
    pub const SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS: &str =
        "beam:transform:sdf_process_sized_element_and_restrictions:v1";
    pub const SDF_TRUNCATE_SIZED_RESTRICTIONS: &str =
        "beam:transform:sdf_truncate_sized_restrictions:v1";

    pub const DATA_SOURCE: &str = "beam:runner:source:v1";
    pub const DATA_SINK: &str = "beam:runner:sink:v1";
}

/// Coders. The runner parses the first group; everything else is opaque.
pub mod coder {
    pub const BYTES: &str = "beam:coder:bytes:v1";
    pub const STRING_UTF8: &str = "beam:coder:string_utf8:v1";
    pub const KV: &str = "beam:coder:kv:v1";
    pub const BOOL: &str = "beam:coder:bool:v1";
    pub const VARINT: &str = "beam:coder:varint:v1";
    pub const DOUBLE: &str = "beam:coder:double:v1";
    pub const ITERABLE: &str = "beam:coder:iterable:v1";
    pub const TIMER: &str = "beam:coder:timer:v1";
    pub const INTERVAL_WINDOW: &str = "beam:coder:interval_window:v1";
    pub const LENGTH_PREFIX: &str = "beam:coder:length_prefix:v1";
    pub const GLOBAL_WINDOW: &str = "beam:coder:global_window:v1";
    pub const WINDOWED_VALUE: &str = "beam:coder:windowed_value:v1";
    pub const PARAM_WINDOWED_VALUE: &str = "beam:coder:param_windowed_value:v1";
    pub const STATE_BACKED_ITERABLE: &str = "beam:coder:state_backed_iterable:v1";
    pub const CUSTOM_WINDOW: &str = "beam:coder:custom_window:v1";
    pub const ROW: &str = "beam:coder:row:v1";
    pub const SHARDED_KEY: &str = "beam:coder:sharded_key:v1";
    pub const NULLABLE: &str = "beam:coder:nullable:v1";
    /// The Go SDK's coder for user types. Go writes every value of it with
    /// a length prefix of its own, so its bytes are a length-prefixed blob
    /// whether or not a `length_prefix` coder wraps it.
    pub const GO_CUSTOM: &str = "beam:go:coder:custom:v1";
}

/// Environments.
/// Prefixes of the `beam:version:sdk_base:...` capability by which an
/// environment announces which SDK it runs.
pub mod sdk_base {
    /// Beam's Python SDK (`...:apache/beam_python3.11_sdk:2.77.0`).
    pub const PYTHON: &str = "beam:version:sdk_base:apache/beam_python";
    /// Beam's Go SDK (`...:go:apache/beam_go_sdk:2.77.0`).
    pub const GO: &str = "beam:version:sdk_base:go:";
}

pub mod env {
    pub const EXTERNAL: &str = "beam:env:external:v1";
    pub const DOCKER: &str = "beam:env:docker:v1";
    pub const PROCESS: &str = "beam:env:process:v1";
    pub const EMBEDDED_PYTHON: &str = "beam:env:embedded_python:v1";
    pub const EMBEDDED_PYTHON_GRPC: &str = "beam:env:embedded_python_grpc:v1";
    pub const EMBEDDED_PYTHON_LOOPBACK: &str = "beam:env:embedded_python_loopback:v1";
    pub const DEFAULT: &str = "beam:env:default:v1";
    /// A list of alternatives (see [`crate::any_of`]).
    pub const ANY_OF: &str = "beam:env:anyof:v1";
}

/// Window functions.
pub mod window_fn {
    pub const GLOBAL: &str = "beam:window_fn:global_windows:v1";
    pub const FIXED: &str = "beam:window_fn:fixed_windows:v1";
    pub const SLIDING: &str = "beam:window_fn:sliding_windows:v1";
    pub const SESSIONS: &str = "beam:window_fn:session_windows:v1";
}

/// Side input access patterns.
pub mod side_input {
    pub const ITERABLE: &str = "beam:side_input:iterable:v1";
    pub const MULTIMAP: &str = "beam:side_input:multimap:v1";
}

/// User state protocols (`StateSpec.protocol.urn`).
pub mod user_state {
    pub const BAG: &str = "beam:user_state:bag:v1";
    pub const MULTIMAP: &str = "beam:user_state:multimap:v1";
    pub const ORDERED_LIST: &str = "beam:user_state:ordered_list:v1";
}

/// Pipeline requirements (`Pipeline.requirements`).
pub mod requirement {
    pub const STATEFUL: &str = "beam:requirement:pardo:stateful:v1";
    pub const FINALIZATION: &str = "beam:requirement:pardo:finalization:v1";
    pub const STABLE_INPUT: &str = "beam:requirement:pardo:stable_input:v1";
    pub const TIME_SORTED_INPUT: &str = "beam:requirement:pardo:time_sorted_input:v1";
    pub const SPLITTABLE_DOFN: &str = "beam:requirement:pardo:splittable_dofn:v1";
    pub const ON_WINDOW_EXPIRATION: &str = "beam:requirement:pardo:on_window_expiration:v1";
}

/// Protocols and capabilities exchanged with SDK harnesses.
pub mod protocol {
    pub const MULTIMAP_KEYS_VALUES_SIDE_INPUT: &str =
        "beam:protocol:multimap_keys_values_side_input:v1";
    pub const MONITORING_INFO_SHORT_IDS: &str = "beam:protocol:monitoring_info_short_ids:v1";
    pub const CONTROL_REQUEST_ELEMENTS_EMBEDDING: &str =
        "beam:protocol:control_request_elements_embedding:v1";
    /// The environment's workers run bundles in parallel on several cores
    /// (Java's and Go's declare it; Python's and TypeScript's do not).
    pub const MULTI_CORE_BUNDLE_PROCESSING: &str = "beam:protocol:multi_core_bundle_processing:v1";
}

/// Artifact types and roles.
pub mod artifact {
    pub const FILE: &str = "beam:artifact:type:file:v1";
    pub const URL: &str = "beam:artifact:type:url:v1";
    pub const EMBEDDED: &str = "beam:artifact:type:embedded:v1";
    /// A file only the expansion service that named it can give (its key
    /// is meaningful to that service alone).
    pub const DEFERRED: &str = "beam:artifact:type:deferred:v1";
    pub const STAGING_TO: &str = "beam:artifact:role:staging_to:v1";
    /// The Go SDK marks its pipeline binary, run in worker mode by Go's
    /// SDK image, with this role when it stages more than one file.
    pub const GO_WORKER_BINARY: &str = "beam:artifact:role:go_worker_binary:v1";
}
