//! The Python interpreter with `apache_beam` that tests driving the real
//! Python SDK use; shared by the test suites of several crates (included
//! with `#[path]`), so all of them find it, and skip, the same way.

use std::process::{Command, Stdio};

/// `$BEAM_PYTHON`, else `python3`, if it imports `apache_beam`. Without
/// one the test says so and passes, unless `REFRACT_REQUIRE_PYTHON=1` (CI
/// sets it), where that is a failure.
pub fn beam_python() -> Option<String> {
    let python = std::env::var("BEAM_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let found = Command::new(&python)
        .args(["-c", "import apache_beam"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(python);
    }
    assert!(
        std::env::var("REFRACT_REQUIRE_PYTHON").as_deref() != Ok("1"),
        "REFRACT_REQUIRE_PYTHON=1, but `{python} -c 'import apache_beam'` fails"
    );
    println!("skipped: `{python} -c 'import apache_beam'` fails here (set BEAM_PYTHON)");
    None
}
