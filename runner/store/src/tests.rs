use super::*;

fn parts(items: &[(&str, &[u8])]) -> Vec<(String, Bytes)> {
    items
        .iter()
        .map(|(n, d)| (n.to_string(), Bytes::copy_from_slice(d)))
        .collect()
}

fn exercise(store: &Store) {
    assert_eq!(store.latest_checkpoint("job").unwrap(), None);
    let first = store
        .checkpoint("job", parts(&[("a", b"1"), ("b", b"22"), ("gone", b"x")]))
        .unwrap();
    assert_eq!((first.id, first.parts, first.parts_written), (1, 3, 3));
    // Only what changed is written; a part left out is dropped.
    let second = store
        .checkpoint("job", parts(&[("a", b"1"), ("b", b"33")]))
        .unwrap();
    assert_eq!((second.id, second.parts, second.parts_written), (2, 2, 1));
    assert_eq!(second.total_bytes, 3);
    let latest = store.latest_checkpoint("job").unwrap().unwrap();
    assert_eq!(latest.id, 2);
    assert_eq!(latest.parts, parts(&[("a", b"1"), ("b", b"33")]));
}

#[test]
fn memory_store_keeps_only_the_latest_checkpoint_incrementally() {
    let store = Store::in_memory();
    exercise(&store);
    // Superseded and dropped parts are gone from the backend.
    let keys: Vec<String> = store
        .kv
        .scan(b"p/")
        .unwrap()
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect();
    assert_eq!(
        keys,
        vec![
            "p/job/a/00000000000000000001".to_string(),
            "p/job/b/00000000000000000002".to_string()
        ]
    );
}

#[test]
fn job_records_are_listed_and_removed_with_their_checkpoints() {
    let store = Store::in_memory();
    store.put_job("j1", b"record one").unwrap();
    store.put_job("j2", b"record two").unwrap();
    store.checkpoint("j1", parts(&[("a", b"1")])).unwrap();
    let jobs = store.jobs().unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(
        jobs[0],
        ("j1".to_string(), Bytes::from_static(b"record one"))
    );
    store.remove_job("j1").unwrap();
    assert_eq!(store.jobs().unwrap().len(), 1);
    assert_eq!(store.latest_checkpoint("j1").unwrap(), None);
    assert!(store.kv.scan(b"p/j1/").unwrap().is_empty());
}

#[test]
fn rocksdb_store_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.put_job("job", b"rec").unwrap();
        exercise(&store);
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.jobs().unwrap().len(), 1);
    let latest = store.latest_checkpoint("job").unwrap().unwrap();
    assert_eq!(latest.id, 2);
    // The next checkpoint continues the numbering and stays incremental.
    let third = store
        .checkpoint("job", parts(&[("a", b"1"), ("b", b"33")]))
        .unwrap();
    assert_eq!((third.id, third.parts_written), (3, 0));
}

/// A large write (a checkpoint of a big user state) does not stay in a
/// memtable beside the next one being built; small ones are not flushed
/// one by one.
#[test]
fn a_large_write_is_flushed_from_memory_and_a_small_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let kv = RocksKv::open(dir.path()).unwrap();
    kv.write(
        vec![(b"small".to_vec(), Bytes::from(vec![7u8; 4 << 10]))],
        Vec::new(),
    )
    .unwrap();
    assert!(kv.memtable_bytes() >= 4 << 10, "{}", kv.memtable_bytes());
    let large = Bytes::from(
        (0..(24u32 << 20))
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    kv.write(vec![(b"large".to_vec(), large.clone())], vec![])
        .unwrap();
    assert!(kv.memtable_bytes() < 1 << 20, "{}", kv.memtable_bytes());
    assert_eq!(kv.get(b"large").unwrap(), Some(large));
    assert_eq!(kv.get(b"small").unwrap().map(|v| v.len()), Some(4 << 10));
}

#[test]
fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Store::open(dir.path()).unwrap();
    let error = Store::open(dir.path()).unwrap_err().to_string();
    assert!(error.contains("lock"), "{error}");
}

#[test]
fn corrupt_manifests_are_reported_not_misread() {
    let store = Store::new(MemoryKv::default());
    store
        .kv
        .write(
            vec![(b"m/job".to_vec(), Bytes::from_static(b"RFM1\x01"))],
            vec![],
        )
        .unwrap();
    let error = store.latest_checkpoint("job").unwrap_err().to_string();
    assert!(error.contains("corrupt manifest of job job"), "{error}");
}

/// The keys under `prefix`, as text.
/// The keys of a page of `job`'s state beside its checkpoints.
fn state_keys(store: &Store, job: &str, from: &str, to: &str, max_bytes: usize) -> Vec<String> {
    store
        .scan_state(job, from.as_bytes(), to.as_bytes(), max_bytes)
        .unwrap()
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect()
}

/// State beside a job's checkpoints reads in pages and ranges under the
/// keys it was given, is deleted by range, is not another job's, and goes
/// with its job.
fn state_beside_checkpoints(store: &Store) {
    let entries = |keys: &[&str]| -> Vec<(Vec<u8>, Bytes)> {
        keys.iter()
            .map(|k| (k.as_bytes().to_vec(), Bytes::from_static(b"xyz")))
            .collect()
    };
    store
        .put_state("j1", entries(&["a1", "a2", "a3", "a4", "b1"]))
        .unwrap();
    store.put_state("j2", entries(&["a1"])).unwrap();
    store.put_state("j", entries(&["1/x"])).unwrap();
    // Past 4 bytes after the second value; the whole job's state to "".
    assert_eq!(state_keys(store, "j1", "a", "", 4), ["a1", "a2"]);
    assert_eq!(
        state_keys(store, "j1", "", "", usize::MAX),
        ["a1", "a2", "a3", "a4", "b1"]
    );
    assert_eq!(
        state_keys(store, "j1", "a2", "a4", usize::MAX),
        ["a2", "a3"]
    );
    let page = store.scan_state("j1", b"a3", b"a4", 0).unwrap();
    assert_eq!(page, vec![(b"a3".to_vec(), Bytes::from_static(b"xyz"))]);
    store.delete_state("j1", b"a2", b"a4").unwrap();
    assert_eq!(
        state_keys(store, "j1", "", "", usize::MAX),
        ["a1", "a4", "b1"]
    );
    store.delete_state("j1", b"a4", b"").unwrap();
    assert_eq!(state_keys(store, "j1", "", "", usize::MAX), ["a1"]);
    assert_eq!(state_keys(store, "j2", "", "", usize::MAX), ["a1"]);
    store.checkpoint("j1", parts(&[("p", b"1")])).unwrap();
    store.remove_job("j1").unwrap();
    assert!(state_keys(store, "j1", "", "", usize::MAX).is_empty());
    assert!(keys(store, "s/j1/").is_empty());
    assert_eq!(state_keys(store, "j2", "", "", usize::MAX), ["a1"]);
    assert_eq!(state_keys(store, "j", "", "", usize::MAX), ["1/x"]);
}

#[test]
fn state_beside_checkpoints_in_memory() {
    state_beside_checkpoints(&Store::in_memory());
}

#[test]
fn state_beside_checkpoints_in_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    state_beside_checkpoints(&Store::open(dir.path()).unwrap());
}

/// State written ahead is there after the store is opened again, with the
/// checkpoint whose write made it durable.
#[test]
fn state_beside_checkpoints_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store
            .put_state("job", vec![(b"k".to_vec(), Bytes::from_static(b"v"))])
            .unwrap();
        store.checkpoint("job", parts(&[("p", b"1")])).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(
        store.scan_state("job", b"", b"", usize::MAX).unwrap(),
        vec![(b"k".to_vec(), Bytes::from_static(b"v"))]
    );
}

fn keys(store: &Store, prefix: &str) -> Vec<String> {
    store
        .kv
        .scan(prefix.as_bytes())
        .unwrap()
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect()
}

/// `len` bytes that differ from one position to the next.
fn numbered_bytes(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i % 251) as u8 ^ seed)
            .collect::<Vec<u8>>(),
    )
}

/// A part larger than a chunk goes in chunks, reads back whole, and its
/// chunks go when it is replaced (by a small part or another chunked one)
/// or its job is removed.
fn chunked_parts_round_trip(store: &Store) {
    let big = numbered_bytes(35, 1);
    store
        .checkpoint("job", vec![("big".into(), big.clone())])
        .unwrap();
    assert_eq!(
        keys(store, "p/job/"),
        (0..4)
            .map(|n| format!("p/job/big/00000000000000000001/{n:08}"))
            .collect::<Vec<_>>()
    );
    let latest = store.latest_checkpoint("job").unwrap().unwrap();
    assert_eq!(latest.parts, vec![("big".to_string(), big)]);

    let small = numbered_bytes(7, 2);
    store
        .checkpoint("job", vec![("big".into(), small.clone())])
        .unwrap();
    assert_eq!(keys(store, "p/job/"), ["p/job/big/00000000000000000002"]);
    assert_eq!(
        store.latest_checkpoint("job").unwrap().unwrap().parts,
        vec![("big".to_string(), small)]
    );

    let bigger = numbered_bytes(21, 3);
    store
        .checkpoint("job", vec![("big".into(), bigger.clone())])
        .unwrap();
    assert_eq!(keys(store, "p/job/").len(), 3);
    assert_eq!(
        store.latest_checkpoint("job").unwrap().unwrap().parts,
        vec![("big".to_string(), bigger)]
    );
    store.remove_job("job").unwrap();
    assert!(keys(store, "p/job/").is_empty());
    assert_eq!(store.latest_checkpoint("job").unwrap(), None);
}

#[test]
fn large_parts_go_in_chunks_in_memory() {
    chunked_parts_round_trip(&Store::in_memory().with_chunk_bytes(10));
}

#[test]
fn large_parts_go_in_chunks_in_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    chunked_parts_round_trip(&Store::open(dir.path()).unwrap().with_chunk_bytes(10));
}

/// Memory whose next synced write fails (once), after its ahead writes
/// went through: a checkpoint that failed half-way.
#[derive(Default)]
struct FailingFinalWrite {
    inner: MemoryKv,
    fail_next: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Kv for FailingFinalWrite {
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

    fn write(&self, puts: Vec<(Vec<u8>, Bytes)>, deletes: Vec<Deletion>) -> Result<(), StoreError> {
        if self
            .fail_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(StoreError::Backend("disk full".into()));
        }
        self.inner.write(puts, deletes)
    }

    fn write_ahead(
        &self,
        puts: Vec<(Vec<u8>, Bytes)>,
        deletes: Vec<Deletion>,
    ) -> Result<(), StoreError> {
        self.inner.write(puts, deletes)
    }
}

/// A checkpoint whose final write failed left five chunks under the
/// version the retry writes again with two: the retry reads back its own
/// two, not seven or five.
#[test]
fn chunks_a_failed_checkpoint_left_do_not_join_the_retry() {
    let kv = FailingFinalWrite::default();
    kv.fail_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let store = Store::new(kv).with_chunk_bytes(10);
    let error = store
        .checkpoint("job", vec![("big".into(), numbered_bytes(45, 1))])
        .unwrap_err();
    assert!(error.to_string().contains("disk full"), "{error}");
    assert_eq!(store.latest_checkpoint("job").unwrap(), None);
    assert_eq!(
        keys(&store, "p/job/").len(),
        5,
        "the failed attempt's chunks"
    );

    let retried = numbered_bytes(15, 2);
    let stats = store
        .checkpoint("job", vec![("big".into(), retried.clone())])
        .unwrap();
    assert_eq!(stats.id, 1);
    assert_eq!(
        store.latest_checkpoint("job").unwrap().unwrap().parts,
        vec![("big".to_string(), retried)]
    );
    assert_eq!(keys(&store, "p/job/").len(), 2);
}

/// Chunks an attempt cut short left under the version the next
/// checkpoint writes, for parts that checkpoint does not rewrite in chunks
/// (written whole, or unchanged), go with it: after a failed write in
/// this process, and in a new process (a crash).
#[test]
fn chunks_left_by_an_attempt_cut_short_go_with_the_next_checkpoint() {
    let kv = FailingFinalWrite::default();
    let fail_next = kv.fail_next.clone();
    let store = Store::new(kv).with_chunk_bytes(10);
    let small = |seed| numbered_bytes(5, seed);
    store
        .checkpoint("job", vec![("a".into(), small(1)), ("b".into(), small(1))])
        .unwrap();
    // A failed attempt at checkpoint 2 wrote `a` in chunks.
    fail_next.store(true, std::sync::atomic::Ordering::SeqCst);
    store
        .checkpoint(
            "job",
            vec![("a".into(), numbered_bytes(45, 2)), ("b".into(), small(1))],
        )
        .unwrap_err();
    // The retry writes `a` whole.
    store
        .checkpoint("job", vec![("a".into(), small(3)), ("b".into(), small(1))])
        .unwrap();
    assert_eq!(
        keys(&store, "p/job/"),
        [
            "p/job/a/00000000000000000002",
            "p/job/b/00000000000000000001"
        ]
    );
    // A crash cut checkpoint 3 short after chunks of `a` and `b` went;
    // the new process's checkpoint 3 leaves `b` as it was and writes `a`
    // whole, and `c` in chunks of its own.
    store
        .write_chunks_ahead("job", "a", 3, numbered_bytes(25, 4))
        .unwrap();
    store
        .write_chunks_ahead("job", "b", 3, numbered_bytes(25, 4))
        .unwrap();
    store.manifests.lock().clear();
    store.swept.lock().clear();
    let c = numbered_bytes(25, 5);
    store
        .checkpoint(
            "job",
            vec![
                ("a".into(), small(6)),
                ("b".into(), small(1)),
                ("c".into(), c.clone()),
            ],
        )
        .unwrap();
    assert_eq!(
        keys(&store, "p/job/"),
        [
            "p/job/a/00000000000000000003",
            "p/job/b/00000000000000000001",
            "p/job/c/00000000000000000003/00000000",
            "p/job/c/00000000000000000003/00000001",
            "p/job/c/00000000000000000003/00000002",
        ]
    );
    assert_eq!(
        store.latest_checkpoint("job").unwrap().unwrap().parts,
        vec![
            ("a".to_string(), small(6)),
            ("b".to_string(), small(1)),
            ("c".to_string(), c)
        ]
    );
}

/// The manifest says how many chunks a part has: one gone is reported,
/// not read as a shorter part.
#[test]
fn a_lost_chunk_is_reported_not_misread() {
    let store = Store::in_memory().with_chunk_bytes(10);
    store
        .checkpoint("job", vec![("big".into(), numbered_bytes(25, 1))])
        .unwrap();
    store
        .kv
        .write(
            Vec::new(),
            vec![Deletion::Key(
                b"p/job/big/00000000000000000001/00000002".to_vec(),
            )],
        )
        .unwrap();
    let error = store.latest_checkpoint("job").unwrap_err().to_string();
    assert!(
        error.contains("part 'big' (version 1) has 2 chunks, not 3"),
        "{error}"
    );
}

/// Environment variable that turns [`checkpoint_writer_child`] on.
const CHILD_DIR: &str = "REFRACT_STORE_CHILD_DIR";

/// The chunk size the child writes with: most of its parts go in chunks.
const CHILD_CHUNK_BYTES: usize = 64 * 1024;

/// The content of part `name` at checkpoint `id` as the child process
/// `writer` writes it: `{name}:{id}:` then one fill byte (the writer's) up
/// to a size that varies with `id` and the writer (32 KiB, written whole,
/// to 288 KiB, in 5 chunks). Large enough that a checkpoint takes a while,
/// so kills land inside writes too; a checkpoint may have fewer chunks than
/// the attempt a kill cut at the same version, and a chunk left from that
/// attempt would show as another writer's fill.
fn part_bytes(name: &str, id: u64, writer: u32) -> Bytes {
    let mut data = format!("{name}:{id}:").into_bytes();
    let size = 32 * 1024 * (1 + (id as usize + writer as usize) % 9);
    data.resize(size, (writer % 251) as u8);
    Bytes::from(data)
}

/// Whether `data` is part `name` of checkpoint `id` as one writer wrote it.
fn is_whole_part(data: &[u8], name: &str, id: u64) -> bool {
    let header = format!("{name}:{id}:");
    let Some(fill) = data.strip_prefix(header.as_bytes()) else {
        return false;
    };
    data.len().is_multiple_of(32 * 1024) && fill.iter().all(|b| Some(b) == fill.first())
}

/// Not a test on its own: run by [`torn_writes_fall_back_to_the_previous_checkpoint`]
/// as a child process that checkpoints until it is killed.
#[test]
#[ignore = "run as a child process by torn_writes_fall_back_to_the_previous_checkpoint"]
fn checkpoint_writer_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let store = Store::open(std::path::Path::new(&dir))
        .unwrap()
        .with_chunk_bytes(CHILD_CHUNK_BYTES);
    let start = store.latest_checkpoint("job").unwrap().map_or(0, |c| c.id);
    for id in start + 1.. {
        // `slow` changes every third checkpoint only (an unchanged part).
        let slow_id = id - id % 3;
        let writer = std::process::id();
        store
            .checkpoint(
                "job",
                vec![
                    ("a".to_string(), part_bytes("a", id, writer)),
                    ("b".to_string(), part_bytes("b", id, writer)),
                    ("slow".to_string(), part_bytes("slow", slow_id, writer)),
                ],
            )
            .unwrap();
    }
}

#[test]
fn torn_writes_fall_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut last_id = 0;
    for round in 0..6u64 {
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "tests::checkpoint_writer_child",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_DIR, dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Kill at varied moments, mid-write more often than not.
        std::thread::sleep(Duration::from_millis(150 + round * 97 % 200));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let Some(latest) = store.latest_checkpoint("job").unwrap() else {
            continue;
        };
        // Whole and from one checkpoint: every part as that checkpoint wrote it.
        let id = latest.id;
        assert!(id >= last_id, "checkpoint went back from {last_id} to {id}");
        last_id = id;
        let names: Vec<&str> = latest.parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "slow"]);
        for (name, data) in &latest.parts {
            let part_id = if name == "slow" { id - id % 3 } else { id };
            assert!(
                is_whole_part(data, name, part_id),
                "checkpoint {id}: part {name} is not whole ({} bytes)",
                data.len()
            );
        }
    }
    assert!(last_id > 0, "the child never completed a checkpoint");
}
