use std::sync::Arc;

use object_store::memory::InMemory;

use super::*;
use crate::kv::MemoryKv;
use crate::Store;

/// A small generator of write sequences, the same every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }

    fn key(&mut self) -> Vec<u8> {
        format!(
            "{}/{}",
            ["a", "b", "ab", "c"][self.next(4) as usize],
            self.next(12)
        )
        .into_bytes()
    }
}

/// A random write: a few puts (some empty values) and deletions of each
/// kind.
fn random_write(rng: &mut Lcg, n: u64) -> (Vec<(Vec<u8>, Bytes)>, Vec<Deletion>) {
    let puts = (0..rng.next(4))
        .map(|i| {
            let len = rng.next(3) * 5;
            (rng.key(), Bytes::from(vec![(n + i) as u8; len as usize]))
        })
        .collect();
    let deletes = match rng.next(6) {
        0 => vec![Deletion::Key(rng.key())],
        1 => vec![Deletion::Prefix(b"a".to_vec())],
        2 => vec![Deletion::Range(b"b/".to_vec(), b"b/5".to_vec())],
        _ => Vec::new(),
    };
    (puts, deletes)
}

/// Every read of `kv` gives what `oracle`'s does.
fn same_reads(kv: &ObjectKv, oracle: &MemoryKv, when: &str) {
    assert_eq!(kv.scan(b"").unwrap(), oracle.scan(b"").unwrap(), "{when}");
    for prefix in [&b"a"[..], b"ab", b"b/1", b"zz"] {
        assert_eq!(
            kv.scan(prefix).unwrap(),
            oracle.scan(prefix).unwrap(),
            "{when}: {prefix:?}"
        );
    }
    assert_eq!(
        kv.scan_range(b"a/3", b"c/", 7).unwrap(),
        oracle.scan_range(b"a/3", b"c/", 7).unwrap(),
        "{when}"
    );
    assert_eq!(
        kv.get(b"c/1").unwrap(),
        oracle.get(b"c/1").unwrap(),
        "{when}"
    );
}

fn objects(store: &Arc<InMemory>, dir: &str) -> usize {
    futures::executor::block_on(async {
        let listed: Vec<_> = store
            .list(Some(&Path::from(format!("kv/{dir}").as_str())))
            .try_collect()
            .await
            .unwrap();
        listed.len()
    })
}

#[test]
fn reads_and_reopens_give_what_a_map_in_memory_gives() {
    let store = Arc::new(InMemory::new());
    let oracle = MemoryKv::default();
    let mut kv = ObjectKv::open(store.clone(), "kv").unwrap();
    let mut rng = Lcg(7);
    for n in 0..150u64 {
        let (puts, deletes) = random_write(&mut rng, n);
        oracle.write(puts.clone(), deletes.clone()).unwrap();
        kv.write(puts, deletes).unwrap();
        same_reads(&kv, &oracle, &format!("after write {n}"));
        if n % 37 == 36 {
            drop(kv);
            kv = ObjectKv::open(store.clone(), "kv").unwrap();
            same_reads(&kv, &oracle, &format!("reopened after write {n}"));
        }
    }
    // Snapshots keep the heads few, and no values object outlives its
    // keys (a write of empty values alone writes none).
    assert!(objects(&store, "heads") <= SNAPSHOT_EVERY as usize + 1);
    let holding: std::collections::HashSet<u64> = kv
        .index
        .lock()
        .keys
        .values()
        .filter(|v| v.len > 0)
        .map(|v| v.object)
        .collect();
    assert_eq!(objects(&store, "values"), holding.len());
}

#[test]
fn a_write_cut_short_before_its_head_never_happened() {
    let store = Arc::new(InMemory::new());
    let kv = ObjectKv::open(store.clone(), "kv").unwrap();
    kv.write(
        vec![(b"k".to_vec(), Bytes::from_static(b"one"))],
        Vec::new(),
    )
    .unwrap();
    // As a server dying between a write's two objects leaves it.
    let orphan = kv.values_path(kv.index.lock().next);
    futures::executor::block_on(store.put(&orphan, Bytes::from_static(b"two").into())).unwrap();
    drop(kv);
    let kv = ObjectKv::open(store.clone(), "kv").unwrap();
    assert_eq!(kv.get(b"k").unwrap(), Some(Bytes::from_static(b"one")));
    assert_eq!(objects(&store, "values"), 1, "the orphan is deleted");
    kv.write(
        vec![(b"k".to_vec(), Bytes::from_static(b"three"))],
        Vec::new(),
    )
    .unwrap();
    assert_eq!(kv.get(b"k").unwrap(), Some(Bytes::from_static(b"three")));
}

#[test]
fn a_foreign_or_truncated_head_fails_the_open_naming_it() {
    let store = Arc::new(InMemory::new());
    let kv = ObjectKv::open(store.clone(), "kv").unwrap();
    kv.write(vec![(b"k".to_vec(), Bytes::from_static(b"v"))], Vec::new())
        .unwrap();
    let head = kv.head_path(0);
    drop(kv);
    let bytes = futures::executor::block_on(async {
        store.get(&head).await.unwrap().bytes().await.unwrap()
    });
    for bad in [
        bytes.slice(..bytes.len() - 3),
        Bytes::from_static(b"nope, not a head"),
    ] {
        futures::executor::block_on(store.put(&head, bad.into())).unwrap();
        let error = ObjectKv::open(store.clone(), "kv").expect_err("a bad head");
        assert!(error.to_string().contains("object store head"), "{error}");
    }
}

#[test]
fn a_store_keeps_its_checkpoints_in_the_object_store() {
    let objects_store = Arc::new(InMemory::new());
    let store = Store::new(ObjectKv::open(objects_store.clone(), "refract").unwrap());
    store.put_job("job-1", b"record").unwrap();
    let part = |name: &str, bytes: &'static [u8]| (name.to_string(), Bytes::from_static(bytes));
    store
        .checkpoint(
            "job-1",
            vec![part("engine", b"e1"), part("stage/0", b"big")],
        )
        .unwrap();
    let second = store
        .checkpoint(
            "job-1",
            vec![part("engine", b"e2"), part("stage/0", b"big")],
        )
        .unwrap();
    assert_eq!(
        second.parts_written, 1,
        "the unchanged part is not written again"
    );
    drop(store);
    let store = Store::new(ObjectKv::open(objects_store, "refract").unwrap());
    assert_eq!(
        store.job("job-1").unwrap(),
        Some(Bytes::from_static(b"record"))
    );
    let latest = store
        .latest_checkpoint("job-1")
        .unwrap()
        .expect("a checkpoint");
    assert_eq!(latest.id, 2);
    let mut parts = latest.parts;
    parts.sort();
    assert_eq!(parts, vec![part("engine", b"e2"), part("stage/0", b"big")]);
}
