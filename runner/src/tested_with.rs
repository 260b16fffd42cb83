//! The Beam SDK versions Refract's suites run against, as `refract
//! --version` states them.
//!
//! Users pick a runner for the SDK version they have; tools that start
//! Refract for them (the `refract_beam` Python package) read this line to
//! refuse an SDK version nobody tested, with a message saying which ones
//! were. The versions are those the integration suites pin
//! (`integration/requirements.txt`, the Maven projects, `go_suite.sh`,
//! `ts_suite.sh`); a test below keeps the line and those pins together.

/// `refract --version`: the crate's version, then the tested SDK versions
/// (major.minor), one list per SDK.
pub const VERSION_TEXT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ntested with Apache Beam: Python 2.77, Java 2.65 and 2.73, Go 2.77, TypeScript 2.49"
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
        for (sdk, file, marker) in [
            ("Python", "integration/requirements.txt", "apache-beam=="),
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
            let listed = tested
                .split(", ")
                .find(|part| part.starts_with(sdk))
                .unwrap_or_default();
            assert!(
                listed.contains(&version),
                "{file} pins {sdk} {version}; `refract --version` says: {line}"
            );
        }
    }
}
