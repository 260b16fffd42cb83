//! Writes every test pipeline's bundle descriptors to `$REFRACT_EXPORT_DIR`
//! (as serialized ProcessBundleDescriptor protos), so they can be loaded by
//! the Python SDK harness's `BundleProcessor` for a cross-check:
//!
//!     REFRACT_EXPORT_DIR=/tmp/pbds cargo test -p refract-translate \
//!         --test export_descriptors -- --ignored
//!     python3 runner/translate/tests/data/check_descriptors.py /tmp/pbds

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use refract_proto::prost::Message;

#[test]
#[ignore = "writes files; run by hand with REFRACT_EXPORT_DIR set"]
fn export_descriptors() {
    let Ok(dir) = std::env::var("REFRACT_EXPORT_DIR") else {
        return;
    };
    std::fs::create_dir_all(&dir).expect("export dir");
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut names: Vec<String> = std::fs::read_dir(&data)
        .expect("tests/data")
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".pb").map(str::to_string))
        .collect();
    names.sort();
    for name in names {
        let Ok(t) = refract_translate::translate(&common::load(&name), &common::opts()) else {
            continue;
        };
        for (i, d) in &t.sdk_stages {
            let path = format!("{dir}/{name}-{i}.pb");
            std::fs::write(&path, d.descriptor.encode_to_vec()).expect("write");
        }
    }
}
