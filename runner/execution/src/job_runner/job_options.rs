//! What a job's pipeline options ask of Refract, read once into a typed
//! [`JobOptions`]: at submission to refuse what cannot run, and when the
//! job starts, for everything that runs it (every attempt of the job uses
//! the same reading, strict mode's seed included). The parsers of single
//! options (`strict.rs`, `workers.rs`) are called from here only; besides
//! them, only `update.rs`, finding the job an `--update` replaces by its
//! `--job_name`, reads an option by name.

use refract_engine::manager::{NameMapping, Strictness};
use refract_engine::shards::ShardLayout;
use refract_proto::prost_types;
use refract_translate::{EnvironmentPreference, Fusion, TranslateOptions};

use super::strict::strictness;
use super::workers::job_worker_parallelism;
use super::{
    BUNDLE_ATTEMPTS_EXPERIMENT, DRAIN_ON_START, SAVEPOINT_EXPERIMENT, SHARDS_EXPERIMENT,
    SHARD_EXCHANGE_EXPERIMENT, STATE_STORE_EXPERIMENT,
};
use crate::options::{experiment_value, has_experiment, option_bool, option_name_map};

/// A job's options, as Refract reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobOptions {
    /// `--streaming`: streaming semantics even for a bounded pipeline.
    pub(crate) streaming: bool,
    /// `--sdk_worker_parallelism`, if set (0: the runner chooses).
    pub(crate) worker_parallelism: Option<usize>,
    /// `--experiments=refract_bundle_attempts=N`, if set.
    pub(crate) bundle_attempts: Option<u32>,
    /// Strict mode, if on (`--experiments=refract_strict...`), with its
    /// seed (a fresh one unless the options fix it).
    pub(crate) strict: Option<Strictness>,
    /// Where the job asks to keep its state.
    pub(crate) state_store: StateStoreChoice,
    /// `--experiments=refract_savepoint=FILE`: the savepoint to start from.
    pub(crate) savepoint: Option<String>,
    /// `--transform_name_mapping`: how the transforms of the savepoint or
    /// the updated job are named in this pipeline (old unique name → new,
    /// `""`: removed).
    pub(crate) transform_name_mapping: NameMapping,
    /// `--update`: the job replaces the running job of its `--job_name`.
    pub(crate) update: bool,
    /// `--experiments=drain_on_start`: the job drains from its start.
    pub(crate) drain_on_start: bool,
    /// `--experiments=refract_shards=N` with N above 1: the shards the job
    /// runs on.
    pub(crate) shards: Option<ShardLayout>,
    /// Whether the number of shards was chosen (by the experiment, even
    /// as 1, or by a rescale), rather than left to the server: on shard
    /// hosts an unchosen number is one shard per host.
    pub(crate) shards_chosen: bool,
    /// `--experiments=refract_shard_exchange=...`: how the shards
    /// exchange.
    pub(crate) shard_exchange: ShardExchange,
}

/// How a job's shards exchange (see [`SHARD_EXCHANGE_EXPERIMENT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShardExchange {
    /// One lock in memory (`=board`, the default).
    Board,
    /// The frame protocol over gRPC on the loopback interface (`=grpc`).
    Grpc,
}

/// Where a job asks to keep its state (`--experiments=refract_state_store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateStoreChoice {
    /// Not asked: the server's choice.
    ServerDefault,
    /// `=memory`: in memory, nothing checkpointed.
    Memory,
    /// `=rocksdb`: the durable spill space, which the server must have.
    RocksDb,
}

impl JobOptions {
    /// Reads `options`; an error names the option that cannot be read.
    pub(crate) fn read(options: &prost_types::Struct) -> Result<Self, String> {
        Ok(JobOptions {
            streaming: option_bool(options, "streaming"),
            worker_parallelism: job_worker_parallelism(options)?,
            bundle_attempts: bundle_attempts(options)?,
            strict: strictness(options)?,
            state_store: state_store(options)?,
            savepoint: experiment_value(options, SAVEPOINT_EXPERIMENT),
            transform_name_mapping: transform_name_mapping(options)?,
            update: option_bool(options, "update"),
            drain_on_start: has_experiment(options, DRAIN_ON_START),
            shards: shards(options)?,
            shards_chosen: experiment_value(options, SHARDS_EXPERIMENT).is_some(),
            shard_exchange: shard_exchange(options)?,
        })
    }

    /// The shards a run on shard hosts asks for: the chosen number (one
    /// engine as one shard), or `None` for one per host.
    pub(crate) fn shards_on_hosts(&self) -> Option<ShardLayout> {
        match (self.shards, self.shards_chosen) {
            (Some(layout), _) => Some(layout),
            (None, true) => Some(ShardLayout::ONE),
            (None, false) => None,
        }
    }

    /// How a job with these options is translated: for its run (workers
    /// reach `fn_api_url`, descriptors are prefixed `descriptor_id_prefix`)
    /// and, with placeholders for those two, to plan it for an update check,
    /// which must fuse it as its run does.
    pub(crate) fn translation(
        &self,
        fn_api_url: String,
        descriptor_id_prefix: String,
        environment_preference: EnvironmentPreference,
    ) -> TranslateOptions {
        TranslateOptions {
            fn_api_url,
            descriptor_id_prefix,
            streaming: self.streaming,
            drain: self.drain_on_start,
            environment_preference,
            fusion: if self.strict.is_some_and(|s| s.coders) {
                Fusion::WithinRootTransforms
            } else {
                Fusion::Greedy
            },
        }
    }
}

/// `--transform_name_mapping`, which renames the transforms of the
/// savepoint a job starts from, or of the job it updates; without either
/// it would do nothing, so it is refused rather than ignored.
fn transform_name_mapping(options: &prost_types::Struct) -> Result<NameMapping, String> {
    let mapping = option_name_map(options, "transform_name_mapping")?;
    let starts_from_state =
        experiment_value(options, SAVEPOINT_EXPERIMENT).is_some() || option_bool(options, "update");
    if !mapping.is_empty() && !starts_from_state {
        return Err(format!(
            "--transform_name_mapping renames the transforms of a savepoint or of the job an \
             --update replaces, and the job has neither (--experiments={SAVEPOINT_EXPERIMENT}=FILE \
             or --update)"
        ));
    }
    Ok(mapping)
}

/// The shards a job's options ask for (see [`SHARDS_EXPERIMENT`]); one
/// shard is a single engine.
fn shards(options: &prost_types::Struct) -> Result<Option<ShardLayout>, String> {
    let Some(n) = experiment_value(options, SHARDS_EXPERIMENT) else {
        return Ok(None);
    };
    let layout = n
        .parse::<u32>()
        .map_err(|_| format!("--experiments={SHARDS_EXPERIMENT}={n}: expected a number"))
        .and_then(|count| {
            ShardLayout::new(count)
                .map_err(|e| format!("--experiments={SHARDS_EXPERIMENT}={n}: {e}"))
        })?;
    Ok((layout.shards() > 1).then_some(layout))
}

/// How a job's shards exchange (see [`SHARD_EXCHANGE_EXPERIMENT`]); a
/// choice for a job without shards is refused, since it would do nothing.
fn shard_exchange(options: &prost_types::Struct) -> Result<ShardExchange, String> {
    let Some(asked) = experiment_value(options, SHARD_EXCHANGE_EXPERIMENT) else {
        return Ok(ShardExchange::Board);
    };
    let exchange = match asked.as_str() {
        "board" => ShardExchange::Board,
        "grpc" => ShardExchange::Grpc,
        _ => {
            return Err(format!(
                "--experiments={SHARD_EXCHANGE_EXPERIMENT}={asked}: expected board or grpc"
            ))
        }
    };
    if shards(options)?.is_none() {
        return Err(format!(
            "--experiments={SHARD_EXCHANGE_EXPERIMENT}={asked} chooses how a job's shards \
             exchange, and the job runs on one engine (add --experiments={SHARDS_EXPERIMENT}=N, \
             N above 1)"
        ));
    }
    Ok(exchange)
}

/// The attempts a job's options ask for (see [`BUNDLE_ATTEMPTS_EXPERIMENT`]),
/// or why the value is not a count.
fn bundle_attempts(options: &prost_types::Struct) -> Result<Option<u32>, String> {
    experiment_value(options, BUNDLE_ATTEMPTS_EXPERIMENT)
        .map(|n| {
            n.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                format!("--experiments={BUNDLE_ATTEMPTS_EXPERIMENT}={n}: expected a number above 0")
            })
        })
        .transpose()
}

/// The state store a job's options ask for (see [`STATE_STORE_EXPERIMENT`]).
fn state_store(options: &prost_types::Struct) -> Result<StateStoreChoice, String> {
    match experiment_value(options, STATE_STORE_EXPERIMENT).as_deref() {
        None => Ok(StateStoreChoice::ServerDefault),
        Some("memory") => Ok(StateStoreChoice::Memory),
        Some("rocksdb") => Ok(StateStoreChoice::RocksDb),
        Some(other) => Err(format!(
            "unknown state store '{other}' in --experiments={STATE_STORE_EXPERIMENT}={other}; \
             use 'memory' or 'rocksdb'"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::value::Kind;
    use prost_types::{ListValue, Struct, Value};

    fn options(fields: &[(&str, Kind)]) -> Struct {
        Struct {
            fields: fields
                .iter()
                .map(|(name, kind)| {
                    let value = Value {
                        kind: Some(kind.clone()),
                    };
                    (format!("beam:option:{name}:v1"), value)
                })
                .collect(),
        }
    }

    fn experiments(list: &[&str]) -> (&'static str, Kind) {
        let values = list
            .iter()
            .map(|e| Value {
                kind: Some(Kind::StringValue(e.to_string())),
            })
            .collect();
        ("experiments", Kind::ListValue(ListValue { values }))
    }

    #[test]
    fn no_options_ask_for_nothing() {
        let read = JobOptions::read(&Struct::default()).expect("readable");
        assert_eq!(
            read,
            JobOptions {
                streaming: false,
                worker_parallelism: None,
                bundle_attempts: None,
                strict: None,
                state_store: StateStoreChoice::ServerDefault,
                savepoint: None,
                transform_name_mapping: NameMapping::new(),
                update: false,
                drain_on_start: false,
                shards: None,
                shards_chosen: false,
                shard_exchange: ShardExchange::Board,
            }
        );
    }

    #[test]
    fn a_name_mapping_goes_with_a_savepoint_start_only() {
        let mapping = (
            "transform_name_mapping",
            Kind::StringValue(r#"{"a": "b"}"#.into()),
        );
        let read = JobOptions::read(&options(&[
            mapping.clone(),
            experiments(&["refract_savepoint=/tmp/sp"]),
        ]))
        .expect("readable");
        assert_eq!(
            read.transform_name_mapping.get("a").map(String::as_str),
            Some("b")
        );
        let alone = JobOptions::read(&options(&[mapping])).expect_err("nothing to rename");
        assert!(alone.contains("refract_savepoint=FILE"), "{alone}");
    }

    #[test]
    fn every_option_is_read_into_its_field() {
        let read = JobOptions::read(&options(&[
            ("streaming", Kind::BoolValue(true)),
            ("sdk_worker_parallelism", Kind::StringValue("3".into())),
            experiments(&[
                "refract_bundle_attempts=2",
                "refract_strict",
                "refract_strict_seed=9",
                "refract_state_store=rocksdb",
                "refract_savepoint=/tmp/sp",
                "drain_on_start",
                "refract_shards=3",
                "refract_shard_exchange=grpc",
            ]),
        ]))
        .expect("readable");
        assert!(read.streaming && read.drain_on_start);
        assert_eq!(read.worker_parallelism, Some(3));
        assert_eq!(read.bundle_attempts, Some(2));
        assert_eq!(read.strict.map(|s| s.seed), Some(9));
        assert_eq!(read.state_store, StateStoreChoice::RocksDb);
        assert_eq!(read.savepoint.as_deref(), Some("/tmp/sp"));
        assert_eq!(read.shards.map(|l| l.shards()), Some(3));
        assert_eq!(read.shard_exchange, ShardExchange::Grpc);
    }

    #[test]
    fn a_shard_exchange_is_board_or_grpc_and_needs_shards() {
        let asking = |asked: &[&str]| options(&[experiments(asked)]);
        assert_eq!(shard_exchange(&asking(&[])), Ok(ShardExchange::Board));
        assert_eq!(
            shard_exchange(&asking(&[
                "refract_shards=2",
                "refract_shard_exchange=board"
            ])),
            Ok(ShardExchange::Board)
        );
        let e = shard_exchange(&asking(&["refract_shards=2", "refract_shard_exchange=udp"]))
            .expect_err("no such exchange");
        assert!(
            e.contains("refract_shard_exchange=udp: expected board or grpc"),
            "{e}"
        );
        let e = shard_exchange(&asking(&["refract_shard_exchange=grpc"])).expect_err("one engine");
        assert!(e.contains("refract_shards=N"), "{e}");
    }

    #[test]
    fn shards_are_one_to_128_and_one_is_a_single_engine() {
        let asking = |n: &str| options(&[experiments(&[&format!("refract_shards={n}")])]);
        assert_eq!(shards(&asking("1")), Ok(None));
        // On shard hosts, a job that asked for one shard gets one, and
        // one that asked for none gets one per host.
        let one = JobOptions::read(&asking("1")).expect("readable");
        assert_eq!(one.shards_on_hosts(), Some(ShardLayout::ONE));
        let unasked = JobOptions::read(&Struct::default()).expect("readable");
        assert_eq!(unasked.shards_on_hosts(), None);
        assert_eq!(
            shards(&asking("128")).map(|l| l.map(|l| l.shards())),
            Ok(Some(128))
        );
        for bad in ["0", "129", "two", ""] {
            let e = shards(&asking(bad)).expect_err(bad);
            assert!(e.contains(&format!("refract_shards={bad}")), "{e}");
        }
    }

    #[test]
    fn bundle_attempts_are_a_positive_count_or_refused() {
        assert_eq!(bundle_attempts(&Struct::default()), Ok(None));
        let asking = |n: &str| options(&[experiments(&[&format!("refract_bundle_attempts={n}")])]);
        assert_eq!(bundle_attempts(&asking("3")), Ok(Some(3)));
        for bad in ["0", "-1", "many", ""] {
            let e = bundle_attempts(&asking(bad)).expect_err(bad);
            assert!(e.contains("expected a number above 0"), "{e}");
        }
    }

    #[test]
    fn an_unreadable_option_is_named() {
        for (asked, named) in [
            (
                experiments(&["refract_bundle_attempts=0"]),
                "refract_bundle_attempts=0",
            ),
            (
                experiments(&["refract_state_store=disk"]),
                "refract_state_store=disk",
            ),
            (
                experiments(&["refract_strict=maybe"]),
                "refract_strict=maybe",
            ),
            (
                ("sdk_worker_parallelism", Kind::StringValue("lots".into())),
                "--sdk_worker_parallelism=lots",
            ),
        ] {
            let error = JobOptions::read(&options(&[asked])).expect_err("refused");
            assert!(error.contains(named), "{error}");
        }
    }
}
