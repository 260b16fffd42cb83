//! Checkpoints written by earlier builds restore in this one.
//!
//! A job's checkpoints outlive the binary that wrote them: a server started
//! on a `--state_dir` after an upgrade resumes the jobs in it, and a
//! savepoint is started from by whatever binary runs then. So the format is
//! versioned ([`SNAPSHOT_VERSION`]), and `tests/data/checkpoints/vN/` keeps
//! a checkpoint that the build of version N wrote, of one run of the
//! oracle's batch pipeline (60 elements, fixed windows, bundles in flight
//! at the cut). Every kept version down to [`OLDEST_SNAPSHOT_VERSION`] must
//! restore here and finish that run with exactly the panes of a run never
//! interrupted; and this build must write the current version's checkpoint
//! byte for byte, so a change to the format cannot go in without a new
//! version (and a reader for the old one).
//!
//! After bumping the version, write its checkpoint with
//! `cargo test -p refract-engine --test checkpoint_fixtures -- --ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns
#![allow(dead_code)] // the oracle's modules serve its own tests too

#[path = "common/mod.rs"]
mod common;
#[path = "oracle/model.rs"]
mod model;
#[path = "oracle/pipeline.rs"]
mod pipeline;
#[path = "oracle/wire.rs"]
mod wire;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use refract_engine::manager::{describe_checkpoint, OLDEST_SNAPSHOT_VERSION, SNAPSHOT_VERSION};
use refract_engine::plan::WindowingStrategy;

use model::Input;
use pipeline::{
    batch_checkpoint, finish_batch, run_batch, sixty_inputs_in_fixed_windows,
    small_bundles_out_of_order, Shape,
};

/// The run the kept checkpoints are of.
fn the_run() -> (Vec<Input>, WindowingStrategy, Shape) {
    let (inputs, strategy) = sixty_inputs_in_fixed_windows();
    (inputs, strategy, small_bundles_out_of_order())
}

/// The checkpoint the run is stopped at: past its first bundles, with
/// bundles in flight, before any pane reached the sink.
const CUT_AT: usize = 5;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/checkpoints")
}

fn version_dir(version: u32) -> PathBuf {
    fixtures().join(format!("v{version}"))
}

/// A kept checkpoint: `parts` lists `NAME FILE` a line each, in order.
fn read_checkpoint(dir: &Path) -> Vec<(String, Bytes)> {
    let listing = std::fs::read_to_string(dir.join("parts")).expect("a list of parts");
    listing
        .lines()
        .map(|line| {
            let (name, file) = line.split_once(' ').expect("NAME FILE");
            let bytes = std::fs::read(dir.join(file)).expect("the part's file");
            (name.to_string(), Bytes::from(bytes))
        })
        .collect()
}

fn write_checkpoint(dir: &Path, parts: &[(String, Bytes)]) {
    std::fs::create_dir_all(dir).expect("the version's directory");
    let mut listing = String::new();
    for (i, (name, bytes)) in parts.iter().enumerate() {
        let file = format!("part-{i:03}.bin");
        std::fs::write(dir.join(&file), bytes).expect("a part written");
        listing.push_str(&format!("{name} {file}\n"));
    }
    std::fs::write(dir.join("parts"), listing).expect("the list written");
}

/// The run cut at [`CUT_AT`] by this build.
fn this_builds_checkpoint() -> Vec<(String, Bytes)> {
    let (inputs, strategy, shape) = the_run();
    let (parts, committed) =
        batch_checkpoint(&inputs, &strategy, &shape, CUT_AT).expect("the run reaches the cut");
    assert!(
        committed.is_empty(),
        "the cut must come before any pane is committed, or the kept checkpoint would need \
         them too: {committed:?}"
    );
    let info = describe_checkpoint(&parts).expect("readable");
    assert!(
        !info.rerun_bundles.is_empty(),
        "the cut should catch bundles in flight"
    );
    parts
}

#[test]
fn every_kept_version_restores_and_finishes_the_run_exactly() {
    let (inputs, strategy, shape) = the_run();
    let want = run_batch(&inputs, &strategy, &shape).expect("an uninterrupted run");
    assert!(!want.panes.is_empty());
    assert!(
        version_dir(SNAPSHOT_VERSION).join("parts").is_file(),
        "no checkpoint is kept for version {SNAPSHOT_VERSION}: write it (see the module docs)"
    );
    let mut restored = 0;
    for version in OLDEST_SNAPSHOT_VERSION..=SNAPSHOT_VERSION {
        let dir = version_dir(version);
        if !dir.is_dir() {
            continue;
        }
        let parts = read_checkpoint(&dir);
        let info = describe_checkpoint(&parts).expect("the engine part reads");
        assert_eq!(info.version, version, "{}", dir.display());
        let got = finish_batch(&parts, &inputs, &strategy, &shape)
            .unwrap_or_else(|e| panic!("version {version} does not restore: {e}"));
        assert_eq!(got, want.panes, "version {version}");
        restored += 1;
    }
    assert!(restored >= 1);
}

#[test]
fn this_build_writes_the_current_version_byte_for_byte() {
    let kept = read_checkpoint(&version_dir(SNAPSHOT_VERSION));
    let written = this_builds_checkpoint();
    let names =
        |parts: &[(String, Bytes)]| parts.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&written),
        names(&kept),
        "the checkpoint's parts changed"
    );
    for ((name, now), (_, then)) in written.iter().zip(&kept) {
        assert!(
            now == then,
            "part '{name}' is not what version {SNAPSHOT_VERSION} wrote: the checkpoint format \
             changed. Bump SNAPSHOT_VERSION, keep reading the old version, and write the new \
             version's checkpoint (see the module docs)"
        );
    }
}

/// Writes this build's checkpoint as the current version's.
#[test]
#[ignore = "writes tests/data/checkpoints/vN; run after bumping the version"]
fn write_the_current_versions_checkpoint() {
    let dir = version_dir(SNAPSHOT_VERSION);
    assert!(
        !dir.exists(),
        "{} exists: a version's checkpoint is never rewritten",
        dir.display()
    );
    write_checkpoint(&dir, &this_builds_checkpoint());
}
