//! Durability over a real RocksDB store in a temp directory. The jobs come
//! from the real job service on loopback (a `Job` is only ever made
//! there): its runner is this test, which takes each job the service
//! starts, as `RefractRunner` does.

use std::sync::Arc;
use std::time::Duration;

use refract_engine::manager::{CheckpointProgress, NameMapping};
use refract_jobservice::{decode_int_metric, IntMetric, JobRunner, JobServiceConfig, SUM_INT64};
use refract_observability::insights::Insights;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::job_state::Enum as JobState;
use refract_proto::job_api::{PrepareJobRequest, RunJobRequest};
use refract_proto::pipeline::{self as pb, MonitoringInfo};
use refract_proto::prost_types::{value::Kind, Value};
use refract_proto::tonic::transport::Channel;
use refract_proto::urns;
use tokio::sync::oneshot;

use super::*;

/// Longest a test waits for anything.
const WAIT: Duration = Duration::from_secs(20);

/// The runner of [`JobService`]: hands every job it is to start to the test.
struct TakeJobs(mpsc::UnboundedSender<Arc<Job>>);

impl refract_jobservice::JobRunner for TakeJobs {
    fn validate(&self, _: &Pipeline, _: &prost_types::Struct) -> Result<(), String> {
        Ok(())
    }

    fn start(&self, job: Arc<Job>) {
        let _ = self.0.send(job);
    }
}

/// A job service on 127.0.0.1, until dropped.
struct JobService {
    started: mpsc::UnboundedReceiver<Arc<Job>>,
    client: JobServiceClient<Channel>,
    _stop: oneshot::Sender<()>,
    /// Holds the staging root, `staging/` inside it (so that a job id
    /// such as `../x` stays inside too).
    _dir: tempfile::TempDir,
}

impl JobService {
    /// Serves, taking over `recovered` as a server started on a state
    /// directory does (those not failed are started at once).
    async fn start(recovered: Vec<RecoveredJob>) -> JobService {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (tx, started) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let config = JobServiceConfig {
            recovered,
            ..JobServiceConfig::new(dir.path().join("staging"))
        };
        let runner: Arc<dyn JobRunner> = Arc::new(TakeJobs(tx));
        tokio::spawn(refract_jobservice::serve(listener, runner, config, async {
            let _ = stopped.await;
        }));
        let client = JobServiceClient::connect(format!("http://{address}"))
            .await
            .unwrap();
        JobService {
            started,
            client,
            _stop: stop,
            _dir: dir,
        }
    }

    /// The next job the service started.
    async fn next_started(&mut self) -> Arc<Job> {
        tokio::time::timeout(WAIT, self.started.recv())
            .await
            .expect("a job started in time")
            .expect("the service runs")
    }

    /// Prepares and runs a job over the Job API, as an SDK does; the job
    /// the service then started.
    async fn submit(&mut self, name: &str, options: prost_types::Struct) -> Arc<Job> {
        let id = self
            .client
            .prepare(PrepareJobRequest {
                pipeline: Some(pipeline(&format!("Read {name}"))),
                pipeline_options: Some(options),
                job_name: name.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .preparation_id;
        self.client
            .run(RunJobRequest {
                preparation_id: id.clone(),
                retrieval_token: String::new(),
            })
            .await
            .unwrap();
        let job = self.next_started().await;
        assert_eq!(job.id(), id);
        job
    }
}

/// Impulse → a ParDo, with `label` as the Impulse's name.
fn pipeline(label: &str) -> Pipeline {
    let transform = |name: &str, urn: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]| {
        let ports = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        pb::PTransform {
            unique_name: name.into(),
            spec: Some(pb::FunctionSpec {
                urn: urn.into(),
                payload: Vec::new(),
            }),
            inputs: ports(inputs),
            outputs: ports(outputs),
            environment_id: if urn == urns::transform::PAR_DO {
                "python".into()
            } else {
                String::new()
            },
            ..Default::default()
        }
    };
    let components = pb::Components {
        transforms: [
            (
                "impulse".to_string(),
                transform(label, urns::transform::IMPULSE, &[], &[("out", "p0")]),
            ),
            (
                "map".to_string(),
                transform(
                    "Split lines",
                    urns::transform::PAR_DO,
                    &[("in", "p0")],
                    &[("out", "p1")],
                ),
            ),
        ]
        .into(),
        environments: [("python".to_string(), pb::Environment::default())].into(),
        ..Default::default()
    };
    Pipeline {
        components: Some(components),
        root_transform_ids: vec!["impulse".into(), "map".into()],
        ..Default::default()
    }
}

/// Pipeline options with these string values.
fn options(pairs: &[(&str, &str)]) -> prost_types::Struct {
    prost_types::Struct {
        fields: pairs
            .iter()
            .map(|(k, v)| {
                let value = Value {
                    kind: Some(Kind::StringValue(v.to_string())),
                };
                (format!("beam:option:{k}:v1"), value)
            })
            .collect(),
    }
}

/// The state directory under `dir`, opened.
fn open(dir: &tempfile::TempDir) -> Durability {
    Durability::open(&dir.path().join("state"), Duration::from_secs(5)).unwrap()
}

/// `id`'s entry among `jobs`.
fn find<'a>(jobs: &'a [RecoveredJob], id: &str) -> &'a RecoveredJob {
    jobs.iter()
        .find(|j| j.id == id)
        .unwrap_or_else(|| panic!("job {id} did not come back: {jobs:?}"))
}

/// Asserts that `recovered` is `job` as submitted.
fn assert_is(recovered: &RecoveredJob, job: &Job) {
    assert_eq!(recovered.id, job.id());
    assert_eq!(recovered.name, job.name());
    assert_eq!(&recovered.pipeline, job.pipeline());
    assert_eq!(&recovered.options, job.options());
    assert_eq!(recovered.staged, job.artifacts().staged());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_job_comes_back_after_the_store_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    // A job taken over from an earlier server, with its staged files: the
    // record its resumed run writes again must keep them, for the next
    // restart.
    let staged = StagedArtifact {
        type_urn: urns::artifact::FILE.into(),
        type_payload: pb::ArtifactFilePayload {
            path: "/home/me/dist/wordcount-1.0.tar.gz".into(),
            sha256: "ab".repeat(32),
        }
        .encode_to_vec(),
        path: "/var/refract/staging/taken-over-1/0".into(),
        sha256: "ab".repeat(32),
        len: 1234,
    };
    let mut service = JobService::start(vec![RecoveredJob {
        id: "taken-over-1".into(),
        name: "taken over".into(),
        pipeline: pipeline("Read old lines"),
        options: options(&[("streaming", "true")]),
        staged: vec![staged.clone()],
        failed: None,
    }])
    .await;
    let taken_over = service.next_started().await;
    assert_eq!(taken_over.artifacts().staged(), [staged]);
    let submitted = service
        .submit(
            "word count",
            options(&[("temp_location", "/tmp/wc"), ("runner", "PortableRunner")]),
        )
        .await;

    let durability = open(&dir);
    durability.remember(&submitted, 1).unwrap();
    durability.remember(&taken_over, 1).unwrap();
    drop(durability);

    let durability = open(&dir);
    let jobs = durability.recovered_jobs().unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for job in [&submitted, &taken_over] {
        let recovered = find(&jobs, job.id());
        assert_is(recovered, job);
        assert_eq!(recovered.failed, None);
        assert!(durability.can_resume(job.id()));
    }
    assert!(!durability.can_resume("never-remembered"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_keeps_its_record_and_checkpoint_and_a_forgotten_one_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = JobService::start(Vec::new()).await;
    let failing = service.submit("failing", options(&[])).await;
    let finished = service.submit("finished", options(&[])).await;
    let parts = vec![("stage-0".to_string(), Bytes::from_static(b"engine state"))];
    let error = "the worker pool at 127.0.0.1:1 reported: no space left on device";

    let durability = open(&dir);
    for job in [&failing, &finished] {
        durability.remember(job, 1).unwrap();
        durability
            .store
            .checkpoint(job.id(), parts.clone())
            .unwrap();
    }
    durability.mark_failed(failing.id(), error).unwrap();
    durability.forget(finished.id()).unwrap();
    // A job with no record has nothing to mark.
    durability.mark_failed("never-remembered", error).unwrap();
    drop(durability);

    let durability = open(&dir);
    let jobs = durability.recovered_jobs().unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let recovered = find(&jobs, failing.id());
    assert_is(recovered, &failing);
    assert_eq!(recovered.failed.as_deref(), Some(error));
    // What a resume needs is still there.
    assert!(durability.can_resume(failing.id()));
    assert_eq!(
        durability.latest_checkpoint(failing.id()).unwrap(),
        Some(Checkpoint {
            id: 1,
            parts: parts.clone()
        })
    );
    assert!(!durability.can_resume(finished.id()));
    assert_eq!(durability.latest_checkpoint(finished.id()).unwrap(), None);

    // A resumed job's record loses its failure.
    durability.remember(&failing, 1).unwrap();
    let jobs = durability.recovered_jobs().unwrap();
    assert_eq!(find(&jobs, failing.id()).failed, None);
}

/// Memory whose writes fail while `full` is set: those that delete
/// anything always, those that only put when `full` is `Everything`. A
/// full RocksDB disk fails both; the mark of an ended job is a put of a
/// few bytes, which may still fit where a removal's batch does not.
#[derive(Default)]
struct FullDisk {
    inner: refract_store::MemoryKv,
    full: Arc<parking_lot::Mutex<Fullness>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Fullness {
    #[default]
    Room,
    RemovalsFail,
    Everything,
}

impl refract_store::Kv for FullDisk {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        self.inner.get(key)
    }
    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        self.inner.scan(prefix)
    }
    fn scan_range(
        &self,
        from: &[u8],
        to: &[u8],
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        self.inner.scan_range(from, to, max_bytes)
    }
    fn write(
        &self,
        puts: Vec<(Vec<u8>, Bytes)>,
        deletes: Vec<refract_store::Deletion>,
    ) -> Result<(), StoreError> {
        match *self.full.lock() {
            Fullness::Everything => return Err(StoreError::Backend("no space left".into())),
            Fullness::RemovalsFail if !deletes.is_empty() => {
                return Err(StoreError::Backend("no space left".into()))
            }
            _ => {}
        }
        self.inner.write(puts, deletes)
    }
    fn write_ahead(
        &self,
        puts: Vec<(Vec<u8>, Bytes)>,
        deletes: Vec<refract_store::Deletion>,
    ) -> Result<(), StoreError> {
        self.write(puts, deletes)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_job_whose_removal_fails_is_never_resumed_and_removed_later() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = JobService::start(Vec::new()).await;
    let done = service.submit("done", options(&[])).await;
    let unmarked = service.submit("unmarked", options(&[])).await;
    let kv = FullDisk::default();
    let full = kv.full.clone();
    let durability = Durability {
        store: Arc::new(refract_store::Store::new(kv)),
        interval: Duration::from_secs(5),
        tolerable_failures: 0,
        history_dir: dir.path().join("history"),
        files: None,
    };
    for job in [&done, &unmarked] {
        durability.remember(job, 1).unwrap();
    }

    // The removal fails; the mark goes through: forgotten all the same.
    *full.lock() = Fullness::RemovalsFail;
    durability.forget(done.id()).unwrap();
    // Nothing goes through: the caller must try again.
    *full.lock() = Fullness::Everything;
    assert!(durability.forget(unmarked.id()).is_err());

    // A restart (the disk still full) resumes the unmarked job only.
    *full.lock() = Fullness::RemovalsFail;
    let jobs = durability.recovered_jobs().unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_is(find(&jobs, unmarked.id()), &unmarked);
    assert!(durability.store.job(done.id()).unwrap().is_some(), "kept");

    // With room again, the next start removes what the ended job kept.
    *full.lock() = Fullness::Room;
    let jobs = durability.recovered_jobs().unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(durability.store.job(done.id()).unwrap(), None);
    assert!(durability.store.ended_jobs().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_is_listed_failed_with_the_reason_and_the_others_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = JobService::start(Vec::new()).await;
    let good = service.submit("good", options(&[("project", "p")])).await;

    let durability = open(&dir);
    durability.remember(&good, 1).unwrap();
    // Not a record at all, and a record whose pipeline is not one (a
    // disk error, a bug, another version's encoding).
    durability
        .store
        .put_job("garbage-1", b"\xff\xff not a record")
        .unwrap();
    let half = JobRecord {
        name: "half".into(),
        pipeline: b"\xff\xff\xff".to_vec(),
        ..Default::default()
    };
    durability
        .store
        .put_job("bad-pipeline-1", &half.encode_to_vec())
        .unwrap();
    drop(durability);

    let durability = open(&dir);
    let jobs = durability.recovered_jobs().unwrap();
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    assert_is(find(&jobs, good.id()), &good);
    assert_eq!(find(&jobs, good.id()).failed, None);
    for id in ["garbage-1", "bad-pipeline-1"] {
        let broken = find(&jobs, id);
        let reason = broken.failed.as_deref().unwrap_or_default();
        assert!(
            reason.contains(&format!(
                "the record of job '{id}' in the state store cannot be read"
            )),
            "{reason}"
        );
        assert!(
            reason.contains(&format!("delete it with `refract delete {id}`")),
            "{reason}"
        );
        assert_eq!(broken.name, "(unreadable record)");
        assert!(broken.staged.is_empty());
        assert!(!durability.can_resume(id));
    }
    let marked = durability.mark_failed("garbage-1", "again");
    assert!(
        matches!(&marked, Err(DurabilityError::Record { job, .. }) if job == "garbage-1"),
        "{marked:?}"
    );

    durability.forget("garbage-1").unwrap();
    let left: Vec<String> = durability
        .recovered_jobs()
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(!left.contains(&"garbage-1".to_string()), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_jobs_history_holds_its_state_error_and_messages_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = JobService::start(Vec::new()).await;
    let job = service.submit("history", options(&[])).await;
    job.set_state(JobState::Running);
    job.message(MessageImportance::JobMessageBasic, "read 3 files");
    job.message(
        MessageImportance::JobMessageWarning,
        "connecting with --db_password=hunter2",
    );
    job.fail("ValueError: boom [while running 'Split lines']");

    let durability = open(&dir);
    let path = durability.write_history(&job).unwrap();
    assert_eq!(
        path,
        dir.path()
            .join("state/history")
            .join(format!("{}.json", job.id()))
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("hunter2"), "{text}");
    let history: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(history["id"], job.id());
    assert_eq!(history["name"], "history");
    assert_eq!(history["state"], "FAILED");
    assert_eq!(
        history["error"],
        "ValueError: boom [while running 'Split lines']"
    );
    assert!(history["created_ms"].as_u64().unwrap() > 0);
    assert!(history["ended_ms"].as_u64().unwrap() >= history["created_ms"].as_u64().unwrap());
    let messages: Vec<(String, String)> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let field = |f: &str| m[f].as_str().unwrap_or_default().to_string();
            (field("level"), field("text"))
        })
        .collect();
    let pairs: Vec<(&str, &str)> = messages
        .iter()
        .map(|(level, text)| (level.as_str(), text.as_str()))
        .filter(|(_, text)| !text.contains("db_password"))
        .collect();
    assert_eq!(
        pairs,
        [
            ("STATE", "STOPPED"),
            ("STATE", "STARTING"),
            ("STATE", "RUNNING"),
            ("BASIC", "read 3 files"),
            ("ERROR", "ValueError: boom [while running 'Split lines']"),
            ("STATE", "FAILED"),
        ],
        "{messages:?}"
    );
    assert!(
        messages.contains(&(
            "WARNING".into(),
            format!(
                "connecting with --db_password={}",
                refract_jobservice::redact::REDACTED
            )
        )),
        "{messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_refuses_a_job_id_that_is_not_a_file_name() {
    let dir = tempfile::tempdir().unwrap();
    // An odd record's id, taken over as it is.
    let mut service = JobService::start(vec![RecoveredJob {
        id: "../escaped".into(),
        name: "odd".into(),
        pipeline: pipeline("Read"),
        options: options(&[]),
        staged: Vec::new(),
        failed: None,
    }])
    .await;
    let odd = service.next_started().await;
    assert_eq!(odd.id(), "../escaped");
    let durability = open(&dir);
    let refused = durability.write_history(&odd).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    assert!(
        refused.to_string().contains("is not a file name"),
        "{refused}"
    );
    assert!(!dir.path().join("state/escaped.json").exists());
    let written = std::fs::read_dir(dir.path().join("state/history")).unwrap();
    assert_eq!(written.count(), 0);
}

/// A user counter of `step` with this total.
fn counter(step: &str, name: &str, total: u64) -> MonitoringInfo {
    let mut payload = Vec::new();
    refract_engine::coder::encode_varint_u64(total, &mut payload);
    MonitoringInfo {
        urn: "beam:metric:user:sum_int64:v1".into(),
        r#type: SUM_INT64.into(),
        payload,
        labels: [
            ("PTRANSFORM".to_string(), step.to_string()),
            ("NAMESPACE".to_string(), "wordcount".to_string()),
            ("NAME".to_string(), name.to_string()),
        ]
        .into(),
        start_time: None,
    }
}

/// `job`'s committed total of counter `name`.
fn total(job: &Job, name: &str) -> Option<IntMetric> {
    job.metrics()
        .committed_infos()
        .iter()
        .find(|m| m.labels.get("NAME").map(String::as_str) == Some(name))
        .and_then(|m| decode_int_metric(&m.r#type, &m.payload))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointed_metrics_come_back_and_go_on_counting() {
    let mut service = JobService::start(Vec::new()).await;
    let before = service.submit("before", options(&[])).await;
    let after = service.submit("after", options(&[])).await;
    before.metrics().commit(&[counter("map", "words", 5)]);
    before
        .metrics()
        .commit(&[counter("map", "words", 3), counter("map", "lines", 2)]);
    let engine_part = ("stage-0".to_string(), Bytes::from_static(b"engine state"));
    let checkpoint = vec![
        engine_part.clone(),
        (METRICS_PART.to_string(), metrics_part(&before)),
    ];

    // Totals from before the restore are replaced, not added to.
    after.metrics().commit(&[counter("map", "stale", 1)]);
    restore_metrics(&after, &checkpoint, &NameMapping::new()).unwrap();
    assert_eq!(
        after.metrics().committed_infos(),
        before.metrics().committed_infos()
    );
    assert_eq!(total(&after, "stale"), None);
    after.metrics().commit(&[counter("map", "words", 2)]);
    assert_eq!(total(&after, "words"), Some(IntMetric::Counter(10)));

    // A checkpoint without metrics (an older runner's savepoint), and one
    // whose metrics are not readable, leave them as they are.
    let kept = after.metrics().committed_infos();
    restore_metrics(
        &after,
        std::slice::from_ref(&engine_part),
        &NameMapping::new(),
    )
    .unwrap();
    assert_eq!(after.metrics().committed_infos(), kept);
    let unreadable = [(METRICS_PART.to_string(), Bytes::from_static(b"\xff\xff"))];
    let refused = restore_metrics(&after, &unreadable, &NameMapping::new()).unwrap_err();
    assert!(
        refused.to_string().contains("its checkpointed metrics"),
        "{refused}"
    );
    assert_eq!(after.metrics().committed_infos(), kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_writer_writes_each_checkpoint_durably_and_reports_progress() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = JobService::start(Vec::new()).await;
    let job = service.submit("checkpointed", options(&[])).await;
    let (view, _stats) = Insights::default().register(job.clone());
    view.enable_checkpoints();
    let durability = open(&dir);
    let CheckpointWriter {
        tx,
        mut progress,
        task,
    } = durability.checkpoint_writer(job.clone(), view.clone());

    let mut parts = Vec::new();
    for n in 1..=2u64 {
        parts = vec![
            ("stage-0".to_string(), Bytes::from(format!("state {n}"))),
            ("stage-1".to_string(), Bytes::from_static(b"unchanged")),
        ];
        tx.send(parts.clone()).await.unwrap();
        tokio::time::timeout(WAIT, progress.wait_for(|p| p.durable >= n))
            .await
            .expect("the checkpoint is written in time")
            .unwrap();
        assert_eq!(*progress.borrow(), CheckpointProgress::all_durable(n));
        assert_eq!(
            durability.latest_checkpoint(job.id()).unwrap(),
            Some(Checkpoint {
                id: n,
                parts: parts.clone()
            })
        );
    }
    let seen = view.checkpoints();
    assert_eq!((seen.taken, seen.failed), (2, 0), "{seen:?}");
    let last = seen.last.unwrap();
    assert_eq!((last.id, last.parts, last.parts_written), (2, 2, 1));

    // Once the engine lets go of the channel, the writer ends.
    drop(tx);
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the writer ends")
        .unwrap();
    drop(durability);
    assert_eq!(
        open(&dir).latest_checkpoint(job.id()).unwrap(),
        Some(Checkpoint { id: 2, parts })
    );
}

// What a server wrote persists past its binary: `tests/data/state_dir/v1`
// is a state directory (its RocksDB files) that this build wrote, holding
// one job's record and one checkpoint, and `tests/data/savepoints/v1.rfsp`
// a savepoint file. Both hold the engine's kept checkpoint of format 5
// (`runner/engine/tests/data/checkpoints/v5`), which the engine's fixture
// tests restore and finish exactly. Every later build must read them: a
// change to the record, the store's layout or the savepoint file that
// breaks this needs a new version beside these and a reader for them.
// Write them with `cargo test -p refract-execution kept_format -- --ignored`.

/// Where the kept state directories and savepoints are.
fn kept() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The engine's kept checkpoint of format 5.
fn engine_checkpoint_v5() -> Vec<(String, Bytes)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/data/checkpoints/v5");
    let listing = std::fs::read_to_string(dir.join("parts")).unwrap();
    listing
        .lines()
        .map(|line| {
            let (name, file) = line.split_once(' ').unwrap();
            let bytes = std::fs::read(dir.join(file)).unwrap();
            (name.to_string(), Bytes::from(bytes))
        })
        .collect()
}

const KEPT_JOB_NAME: &str = "kept state dir";

fn kept_options() -> prost_types::Struct {
    options(&[("streaming", "true"), ("job_name", "kept")])
}

/// Copies the files of directory `from` into `to` (made), not following
/// anything but plain files.
fn copy_files(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_dir_of_the_kept_format_gives_back_its_job_and_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    // Opening writes into the directory: a copy, never the kept files.
    copy_files(
        &kept().join("state_dir/v1/db"),
        &dir.path().join("state/db"),
    );
    let durability = open(&dir);
    let jobs = durability.recovered_jobs().unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = &jobs[0];
    assert_eq!(job.name, KEPT_JOB_NAME);
    assert_eq!(job.pipeline, pipeline("Read kept"));
    assert_eq!(job.options, kept_options());
    assert_eq!(job.failed, None);
    assert!(durability.can_resume(&job.id));
    let checkpoint = durability.latest_checkpoint(&job.id).unwrap().unwrap();
    assert_eq!(checkpoint.id, 1);
    assert_eq!(checkpoint.parts, engine_checkpoint_v5());
}

#[test]
fn a_savepoint_of_the_kept_format_reads_back_and_is_written_the_same() {
    let kept_file = kept().join("savepoints/v1.rfsp");
    let parts = engine_checkpoint_v5();
    let read = refract_store::savepoint::read_savepoint(&kept_file, 1 << 30).unwrap();
    assert_eq!(read, parts);
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("now.rfsp");
    refract_store::savepoint::write_savepoint(&written, &parts).unwrap();
    assert!(
        std::fs::read(&written).unwrap() == std::fs::read(&kept_file).unwrap(),
        "the savepoint file format changed: give it a new version (its magic) and keep \
         reading this one"
    );
}

/// Writes the kept state directory and savepoint (see above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes tests/data/state_dir/v1 and savepoints/v1.rfsp; run once per new version"]
async fn write_the_kept_format_state_dir_and_savepoint() {
    let state_dir = kept().join("state_dir/v1");
    let savepoint = kept().join("savepoints/v1.rfsp");
    assert!(
        !state_dir.exists() && !savepoint.exists(),
        "a version's files are never rewritten"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut service = JobService::start(Vec::new()).await;
    let id = service
        .client
        .prepare(PrepareJobRequest {
            pipeline: Some(pipeline("Read kept")),
            pipeline_options: Some(kept_options()),
            job_name: KEPT_JOB_NAME.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .preparation_id;
    service
        .client
        .run(RunJobRequest {
            preparation_id: id,
            retrieval_token: String::new(),
        })
        .await
        .unwrap();
    let job = service.next_started().await;
    let (view, _stats) = Insights::default().register(job.clone());
    let durability = open(&dir);
    durability.remember(&job, 1).unwrap();
    let writer = durability.checkpoint_writer(job.clone(), view);
    writer.tx.send(engine_checkpoint_v5()).await.unwrap();
    drop(writer.tx);
    writer.task.await.unwrap();
    drop(durability);
    // The database's own files; its info log and lock are made on open.
    let db = dir.path().join("state/db");
    std::fs::create_dir_all(state_dir.join("db")).unwrap();
    for entry in std::fs::read_dir(&db).unwrap() {
        let name = entry.unwrap().file_name();
        let name = name.to_string_lossy();
        if name.starts_with("LOG") || name == "LOCK" {
            continue;
        }
        std::fs::copy(db.join(&*name), state_dir.join("db").join(&*name)).unwrap();
    }
    std::fs::create_dir_all(savepoint.parent().unwrap()).unwrap();
    refract_store::savepoint::write_savepoint(&savepoint, &engine_checkpoint_v5()).unwrap();
}

/// A job taken over from an earlier server whose staged file is at
/// `path`, holding `bytes`.
fn taken_over_with_file(id: &str, path: &std::path::Path, bytes: &[u8]) -> RecoveredJob {
    use sha2::Digest;
    let sha256 = hex::encode(sha2::Sha256::digest(bytes));
    RecoveredJob {
        id: id.into(),
        name: "staged".into(),
        pipeline: pipeline("Read lines"),
        options: options(&[("streaming", "true")]),
        staged: vec![StagedArtifact {
            type_urn: urns::artifact::FILE.into(),
            type_payload: Vec::new(),
            path: path.to_path_buf(),
            sha256,
            len: bytes.len() as u64,
        }],
        failed: None,
    }
}

/// A durability over `bucket` (records and staged files), its state
/// directory `state`.
fn over_bucket(bucket: &Arc<dyn object_store::ObjectStore>, state: &std::path::Path) -> Durability {
    let store = Store::new(refract_store::ObjectKv::open(bucket.clone(), "jobs").unwrap());
    let files = ObjectFiles::new(bucket.clone(), "jobs").unwrap();
    Durability::open_with(state, store, Some(files), Duration::from_secs(5)).unwrap()
}

/// A bucket in memory holding job `id`, remembered by a server on host A
/// with a staged file holding `bytes`; and host A's state directory,
/// which still has the file.
async fn remembered_on_host_a(
    dir: &tempfile::TempDir,
    id: &str,
    bytes: &[u8],
) -> (Arc<dyn object_store::ObjectStore>, std::path::PathBuf) {
    let bucket: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::memory::InMemory::new());
    let host_a = dir.path().join("host-a");
    std::fs::create_dir_all(&host_a).unwrap();
    let file = host_a.join("pipeline.whl");
    std::fs::write(&file, bytes).unwrap();
    let mut service = JobService::start(vec![taken_over_with_file(id, &file, bytes)]).await;
    let job = service.next_started().await;
    let a = over_bucket(&bucket, &host_a);
    tokio::task::block_in_place(|| a.remember(&job, 1)).unwrap();
    (bucket, host_a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_files_follow_a_job_to_another_host_through_object_storage() {
    let dir = tempfile::tempdir().unwrap();
    let (bucket, host_a) = remembered_on_host_a(&dir, "staged-1", b"the pipeline's wheel").await;
    // Host A is gone, and its disk with it.
    std::fs::remove_dir_all(&host_a).unwrap();
    let host_b = dir.path().join("host-b");
    let b = over_bucket(&bucket, &host_b);
    let jobs = tokio::task::block_in_place(|| b.recovered_jobs()).unwrap();
    let recovered = find(&jobs, "staged-1");
    assert_eq!(recovered.failed, None);
    let fetched = &recovered.staged[0].path;
    assert!(
        fetched.starts_with(host_b.join("staged").join("staged-1")),
        "{fetched:?}"
    );
    assert_eq!(std::fs::read(fetched).unwrap(), b"the pipeline's wheel");
    // Forgotten, the job's files go from the bucket and from here: a
    // third host finds the job gone.
    tokio::task::block_in_place(|| b.forget("staged-1")).unwrap();
    assert!(!host_b.join("staged").join("staged-1").exists());
    let c = over_bucket(&bucket, &dir.path().join("host-c"));
    assert!(tokio::task::block_in_place(|| c.recovered_jobs())
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_file_neither_here_nor_in_the_bucket_fails_the_job_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let (bucket, host_a) = remembered_on_host_a(&dir, "lost-1", b"wheel").await;
    // Someone emptied the job's staged files from the bucket.
    ObjectFiles::new(bucket.clone(), "jobs")
        .unwrap()
        .delete_job("lost-1");
    std::fs::remove_dir_all(&host_a).unwrap();
    let b = over_bucket(&bucket, &dir.path().join("host-b"));
    let jobs = tokio::task::block_in_place(|| b.recovered_jobs()).unwrap();
    let failed = find(&jobs, "lost-1").failed.clone().unwrap_or_default();
    assert!(
        failed.contains("is neither here nor fetched from the checkpoint store"),
        "{failed}"
    );
}

#[test]
fn fetched_staged_files_stay_under_their_directory() {
    let root = std::path::Path::new("/state/staged");
    assert_eq!(fetched_dir(root, "job-1"), Some(root.join("job-1")));
    for id in ["", ".", "..", "../x", "a/b", "a\\b", "a\0b"] {
        assert_eq!(fetched_dir(root, id), None, "{id:?}");
    }
}
