//! The Beam SDK versions Refract's suites run against, as `refract
//! --version` states them.
//!
//! Users pick a runner for the SDK version they have; tools that start
//! Refract for them (the `refract_beam` Python package) read this line to
//! refuse an SDK version older than the supported range, naming it, and to
//! warn of one newer than any tested. For Python it is a range: its lowest
//! is the oldest release `integration/beam_versions.sh` runs its smoke suite
//! on, its newest the release the CI suites pin
//! (`integration/requirements.txt`); for the other SDKs, the versions the
//! Maven projects, `go_suite.sh` and `ts_suite.sh` pin. A test below keeps
//! the line and those pins together.

/// `refract --version`: the crate's version, then the tested SDK versions
/// (major.minor), one list (Python: a range) per SDK.
pub const VERSION_TEXT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ntested with Apache Beam: Python 2.70-2.78, Java 2.65 and 2.73, Go 2.78, TypeScript 2.49"
);

#[cfg(test)]
mod tests {
    use super::VERSION_TEXT;

    /// The major.minor of every `NAME==X.Y.Z` / `<beam.version>X.Y.Z` /
    /// `vX.Y.Z` default pinned in `file` (relative to the repository).
    fn pinned(file: &str, marker: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(file);
        let text = std::fs::read_to_string(&path).expect("the suite's pin file");
        let at = text.find(marker).expect("the pin") + marker.len();
        let version: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut parts = version.split('.');
        format!(
            "{}.{}",
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default()
        )
    }

    #[test]
    fn the_version_line_names_the_versions_the_suites_pin() {
        let line = VERSION_TEXT.lines().nth(1).expect("a second line");
        let tested = line
            .strip_prefix("tested with Apache Beam: ")
            .expect("the line's prefix, which refract_beam reads");
        let listed = |sdk: &str| {
            tested
                .split(", ")
                .find(|part| part.starts_with(sdk))
                .unwrap_or_default()
                .to_string()
        };
        // Python: from the oldest release of the version sweep to the one
        // CI's suites pin.
        let python_range = format!(
            "Python {}-{}",
            pinned("integration/beam_versions.sh", "REFRACT_BEAM_VERSIONS:-"),
            pinned("integration/requirements.txt", "apache-beam==")
        );
        assert_eq!(
            listed("Python"),
            python_range,
            "`refract --version` says: {line}"
        );
        for (sdk, file, marker) in [
            ("Java", "integration/java/pom.xml", "<beam.version>"),
            ("Java", "integration/xlang/pom.xml", "<beam.version>"),
            (
                "Go",
                "integration/go_suite.sh",
                "REFRACT_GO_BEAM_VERSION:-v",
            ),
            (
                "TypeScript",
                "integration/ts_suite.sh",
                "REFRACT_TS_BEAM_VERSION:-",
            ),
        ] {
            let version = pinned(file, marker);
            assert!(
                listed(sdk).contains(&version),
                "{file} pins {sdk} {version}; `refract --version` says: {line}"
            );
        }
    }
}
