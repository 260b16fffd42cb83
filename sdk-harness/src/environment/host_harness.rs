//! DOCKER environments without Docker: a Beam SDK's own container image,
//! run as a process on this host.
//!
//! Pipelines name Beam's SDK images by default (`apache/beam_python3.11_sdk:2.77.0`
//! for Python's DOCKER environment, `apache/beam_java17_sdk:2.73.0` as an
//! expansion service's alternative). Such an image only holds the SDK's
//! harness and a boot program that fetches the job's staged files and starts
//! it. When no Docker engine is reachable, Refract does the boot program's
//! work itself and starts the harness with an interpreter of this host:
//!
//! - Python images: `python -m apache_beam.runners.worker.sdk_worker_main` in
//!   an interpreter of the image's Python version with the image's Beam
//!   version installed (found on `PATH` as `pythonX.Y` or `python3`, or named
//!   by `--sdk_python`); staged files (the pickled main session) are linked
//!   into its `staged/` directory, where the harness looks. Nothing is
//!   installed: requirements and extra packages must already be there.
//! - Java images: `java -cp <the staged jars> org.apache.beam.fn.harness.FnHarness`
//!   with a JDK at least as new as the image's (`JAVA_HOME`, `PATH`, or
//!   `--sdk_java`).
//!
//! - Go images: the job's staged pipeline binary itself, in worker mode
//!   (`--worker=true --id=... --control_endpoint=...`), as Go's boot program
//!   runs it: the only staged file, else the one with Go's worker-binary
//!   role, else the one staged as `worker`. It carries its own SDK, so no
//!   interpreter is needed.
//!
//! All get what the images' boot programs hand their harness: the worker
//! id, the control and logging endpoints, the pipeline options as JSON, the
//! runner's capabilities and a private scratch directory, which is removed
//! when the process ends.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

use parking_lot::Mutex;
use prost::Message;
use prost_types::value::Kind;
use refract_proto::pipeline::{ArtifactInformation, ArtifactStagingToRolePayload};
use refract_proto::urns;
use tokio::process::Command;

use super::child::{scratch_dir, ChildWorker};
use crate::config::WorkerConfig;
use crate::error::HarnessError;

/// How long asking an interpreter for its versions may take (Beam's
/// import is slow on a cold disk).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether and with what DOCKER environments naming Beam's SDK images run
/// as local processes when no Docker engine is reachable.
#[derive(Debug, Clone)]
pub struct HostHarnesses {
    /// Map SDK images to processes at all (else: no engine, no worker).
    pub enabled: bool,
    /// The Python interpreter for Python images; default: `pythonX.Y`, then
    /// `python3`, on `PATH`.
    pub python: Option<PathBuf>,
    /// The `java` for Java images; default: `$JAVA_HOME/bin/java`, then
    /// `java` on `PATH`.
    pub java: Option<PathBuf>,
}

impl Default for HostHarnesses {
    fn default() -> Self {
        HostHarnesses {
            enabled: true,
            python: None,
            java: None,
        }
    }
}

/// A Beam SDK image, as far as starting its harness here is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SdkImage {
    /// `beam_pythonX.Y_sdk:BEAM`.
    Python {
        /// The image's Python version, `X.Y`.
        python: String,
        /// The image's Beam version (its tag).
        beam: String,
    },
    /// `beam_javaN_sdk:BEAM`.
    Java {
        /// The image's Java feature release.
        java: u32,
    },
    /// `beam_go_sdk:BEAM`.
    Go,
}

impl SdkImage {
    /// The SDK image `image` names (any registry), if it is one of Beam's.
    pub(crate) fn parse(image: &str) -> Option<SdkImage> {
        let name_and_tag = image.rsplit('/').next()?;
        let (name, tag) = name_and_tag
            .split_once(':')
            .unwrap_or((name_and_tag, "latest"));
        let sdk = name.strip_prefix("beam_")?.strip_suffix("_sdk")?;
        if sdk == "go" {
            return Some(SdkImage::Go);
        }
        if let Some(python) = sdk.strip_prefix("python") {
            let (major, minor) = python.split_once('.')?;
            let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            return (numeric(major) && numeric(minor)).then(|| SdkImage::Python {
                python: python.to_string(),
                beam: tag.to_string(),
            });
        }
        let java = sdk.strip_prefix("java")?.parse().ok()?;
        Some(SdkImage::Java { java })
    }
}

/// Starts `image`'s harness for the worker `cfg` describes, connecting to
/// the runner at `url`.
pub(crate) async fn start(
    image: &SdkImage,
    hosts: &HostHarnesses,
    cfg: &WorkerConfig,
    url: &str,
) -> Result<ChildWorker, HarnessError> {
    let unavailable = |reason: String| HarnessError::NoHostHarness {
        image: describe(image),
        reason,
    };
    let scratch = scratch_dir(&cfg.worker_id)
        .map_err(|e| unavailable(format!("cannot make a scratch directory: {e}")))?;
    let started = async {
        let staged = stage_files(cfg, &scratch.join("staged")).map_err(&unavailable)?;
        let options = cfg
            .provision
            .pipeline_options
            .as_ref()
            .map_or(serde_json::Value::Object(Default::default()), struct_json);
        let mut command = match image {
            SdkImage::Python { python, beam } => {
                let interpreter = find_python(hosts, python, beam)
                    .await
                    .map_err(&unavailable)?;
                let mut command = Command::new(interpreter);
                command.args(["-m", "apache_beam.runners.worker.sdk_worker_main"]);
                command.env("WORKER_ID", &cfg.worker_id);
                command
            }
            SdkImage::Java { java } => {
                let jdk = find_java(hosts, *java).await.map_err(&unavailable)?;
                let jars: Vec<&PathBuf> = staged
                    .iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "jar"))
                    .collect();
                if jars.is_empty() {
                    return Err(unavailable(
                        "the job staged no jars for the Java harness".to_string(),
                    ));
                }
                let classpath = std::env::join_paths(jars)
                    .map_err(|e| unavailable(format!("cannot build a classpath: {e}")))?;
                let mut command = Command::new(jdk);
                command
                    .arg("-cp")
                    .arg(classpath)
                    .arg("org.apache.beam.fn.harness.FnHarness");
                command.env("HARNESS_ID", &cfg.worker_id);
                command
            }
            SdkImage::Go => {
                let binary = go_worker_binary(cfg, &staged, &scratch).map_err(&unavailable)?;
                let options_file = scratch.join("pipeline_options.json");
                std::fs::write(&options_file, options.to_string()).map_err(|e| {
                    unavailable(format!("cannot write {}: {e}", options_file.display()))
                })?;
                let mut command = Command::new(binary);
                command
                    .arg("--worker=true")
                    .arg(format!("--id={}", cfg.worker_id))
                    .arg(format!("--logging_endpoint={url}"))
                    .arg(format!("--control_endpoint={url}"))
                    .arg(format!("--semi_persist_dir={}", scratch.display()))
                    .env("PIPELINE_OPTIONS_FILE", &options_file);
                command
            }
        };
        let descriptor = format!("url: \"{url}\"");
        command
            .env("CONTROL_API_SERVICE_DESCRIPTOR", &descriptor)
            .env("LOGGING_API_SERVICE_DESCRIPTOR", &descriptor)
            .env("PIPELINE_OPTIONS", options.to_string())
            .env("SEMI_PERSISTENT_DIRECTORY", &scratch)
            .env(
                "RUNNER_CAPABILITIES",
                cfg.provision.runner_capabilities.join(" "),
            );
        for (key, variable) in [("job_id", "JOB_ID"), ("job_name", "JOB_NAME")] {
            if let Some(value) = cfg.provision.metadata.get(key) {
                command.env(variable, value);
            }
        }
        tracing::info!(
            worker_id = %cfg.worker_id,
            image = %describe(image),
            program = ?command.as_std().get_program(),
            "no Docker engine: starting the SDK image's harness as a process"
        );
        ChildWorker::spawn_with_scratch(&cfg.worker_id, command, scratch.clone())
    }
    .await;
    if started.is_err() {
        if let Err(e) = std::fs::remove_dir_all(&scratch) {
            tracing::debug!(dir = %scratch.display(), error = %e, "could not remove a scratch directory");
        }
    }
    started
}

fn describe(image: &SdkImage) -> String {
    match image {
        SdkImage::Python { python, beam } => format!("Beam {beam}'s Python {python} SDK image"),
        SdkImage::Java { java } => format!("Beam's Java {java} SDK image"),
        SdkImage::Go => "Beam's Go SDK image".to_string(),
    }
}

/// The Go pipeline binary among the worker's staged files (`staged`, in
/// the provisioned order), copied into `scratch` as an executable: staged
/// files may sit on a volume that cannot execute, and the copy keeps the
/// artifact store's file as it was.
fn go_worker_binary(
    cfg: &WorkerConfig,
    staged: &[PathBuf],
    scratch: &Path,
) -> Result<PathBuf, String> {
    let dependencies = &cfg.provision.dependencies;
    let chosen = if staged.len() == 1 {
        staged.first()
    } else {
        dependencies
            .iter()
            .position(|a| a.role_urn == urns::artifact::GO_WORKER_BINARY)
            .or_else(|| {
                staged
                    .iter()
                    .position(|p| p.file_name().is_some_and(|n| n == "worker"))
            })
            .and_then(|n| staged.get(n))
    };
    let source = chosen.ok_or_else(|| {
        format!(
            "the job staged {} files and none is the Go worker binary \
             (role {} or named 'worker')",
            staged.len(),
            urns::artifact::GO_WORKER_BINARY
        )
    })?;
    let target = scratch.join("worker");
    std::fs::copy(source, &target).map_err(|e| {
        format!(
            "cannot copy {} to {}: {e}",
            source.display(),
            target.display()
        )
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make {} executable: {e}", target.display()))?;
    }
    Ok(target)
}

/// Links (or copies) every staged dependency of the worker into `dir`
/// under its staged name, in the order provisioned; their paths.
fn stage_files(cfg: &WorkerConfig, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut placed = Vec::new();
    for (n, artifact) in cfg.provision.dependencies.iter().enumerate() {
        let source = cfg
            .artifacts
            .open(artifact)
            .ok_or_else(|| format!("dependency {n} ({}) was not staged", artifact.type_urn))?;
        let target = dir.join(staged_name(artifact, n));
        if std::fs::hard_link(&source, &target).is_err() {
            std::fs::copy(&source, &target).map_err(|e| {
                format!(
                    "cannot place {} in {}: {e}",
                    source.display(),
                    dir.display()
                )
            })?;
        }
        placed.push(target);
    }
    Ok(placed)
}

/// The file name a dependency is staged under: its staged name's last
/// component when it has one, else a name from its position.
fn staged_name(artifact: &ArtifactInformation, n: usize) -> String {
    let named = (artifact.role_urn == urns::artifact::STAGING_TO)
        .then(|| ArtifactStagingToRolePayload::decode(artifact.role_payload.as_slice()).ok())
        .flatten()
        .map(|p| p.staged_name);
    named
        .as_deref()
        .and_then(|name| Path::new(name).file_name())
        .and_then(|name| name.to_str())
        .filter(|name| !name.is_empty() && *name != "." && *name != "..")
        .map_or_else(|| format!("dependency-{n}"), str::to_string)
}

/// Interpreters (as named: a path, or a name looked up on `PATH`) already
/// found to have a Python and Beam version (`"X.Y BEAM"`). Asking costs a
/// Python start and `import apache_beam`, about a second, which every
/// worker of every job would otherwise pay before starting; an interpreter
/// whose Beam changes while the server runs fails its workers with the
/// SDK's own version error instead.
static FOUND_PYTHONS: LazyLock<Mutex<HashSet<(PathBuf, String)>>> = LazyLock::new(Mutex::default);

/// An interpreter with Python `python` and Beam `beam`: the configured one,
/// else `pythonX.Y` or `python3` on `PATH`.
async fn find_python(hosts: &HostHarnesses, python: &str, beam: &str) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match &hosts.python {
        Some(path) => vec![path.clone()],
        None => vec![
            PathBuf::from(format!("python{python}")),
            PathBuf::from("python3"),
        ],
    };
    let wanted = format!("{python} {beam}");
    let mut found = Vec::new();
    for candidate in candidates {
        if FOUND_PYTHONS
            .lock()
            .contains(&(candidate.clone(), wanted.clone()))
        {
            return Ok(candidate);
        }
        let probe = Command::new(&candidate)
            .args([
                "-c",
                "import sys, apache_beam; \
                 print('%d.%d %s' % (sys.version_info[0], sys.version_info[1], apache_beam.__version__))",
            ])
            .kill_on_drop(true)
            .output();
        let report = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(out)) if out.status.success() => {
                String::from_utf8_lossy(&out.stdout).trim().to_string()
            }
            Ok(Ok(out)) => last_line(&out.stderr),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        if report == wanted {
            FOUND_PYTHONS.lock().insert((candidate.clone(), wanted));
            return Ok(candidate);
        }
        found.push(format!("{}: {report}", candidate.display()));
    }
    Err(format!(
        "no Python {python} interpreter with apache-beam {beam} found ({}); \
         name one with --sdk_python, or start a Docker engine",
        found.join("; ")
    ))
}

/// A `java` of release `java` or newer: the configured one, else
/// `$JAVA_HOME/bin/java` or `java` on `PATH`.
async fn find_java(hosts: &HostHarnesses, java: u32) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match &hosts.java {
        Some(path) => vec![path.clone()],
        None => std::env::var_os("JAVA_HOME")
            .map(|home| PathBuf::from(home).join("bin").join("java"))
            .into_iter()
            .chain([PathBuf::from("java")])
            .collect(),
    };
    let mut found = Vec::new();
    for candidate in candidates {
        let probe = Command::new(&candidate)
            .arg("-version")
            .kill_on_drop(true)
            .output();
        let report = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            // `java -version` writes to stderr.
            Ok(Ok(out)) => String::from_utf8_lossy(&out.stderr).to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        match java_release(&report) {
            Some(release) if release >= java => return Ok(candidate),
            Some(release) => found.push(format!("{}: Java {release}", candidate.display())),
            None => found.push(format!(
                "{}: {}",
                candidate.display(),
                last_line(report.as_bytes())
            )),
        }
    }
    Err(format!(
        "no Java {java} or newer found ({}); name one with --sdk_java, or start a Docker engine",
        found.join("; ")
    ))
}

/// The feature release `java -version` reports (`"17.0.9"` is 17,
/// `"1.8.0_392"` is 8).
fn java_release(version_output: &str) -> Option<u32> {
    let quoted = version_output.split('"').nth(1)?;
    let mut parts = quoted.split(['.', '_', '-', '+']);
    let first: u32 = parts.next()?.parse().ok()?;
    if first == 1 {
        parts.next()?.parse().ok()
    } else {
        Some(first)
    }
}

fn last_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// A protobuf number as JSON the way protobuf's JSON mapping writes it:
/// whole numbers without a fraction (`-1`, not `-1.0`), which readers into
/// integer fields (the Go SDK's) require.
fn number(n: f64) -> serde_json::Value {
    // Whole numbers up to 2^53 are exact in an f64 and in an i64.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if n.fract() == 0.0 && n.abs() <= EXACT {
        return serde_json::Value::from(n as i64);
    }
    serde_json::Number::from_f64(n).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// A protobuf `Struct` as the JSON object the SDKs' boot programs pass in
/// `PIPELINE_OPTIONS`. (Nesting is bounded by protobuf's decoding limit.)
fn struct_json(options: &prost_types::Struct) -> serde_json::Value {
    fn value(v: &prost_types::Value) -> serde_json::Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
            Some(Kind::NumberValue(n)) => number(*n),
            Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
            Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
            Some(Kind::StructValue(s)) => struct_json(s),
            Some(Kind::ListValue(l)) => {
                serde_json::Value::Array(l.values.iter().map(value).collect())
            }
        }
    }
    serde_json::Value::Object(
        options
            .fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beam_sdk_images_are_recognised_from_any_registry() {
        assert_eq!(
            SdkImage::parse("apache/beam_python3.11_sdk:2.77.0"),
            Some(SdkImage::Python {
                python: "3.11".into(),
                beam: "2.77.0".into()
            })
        );
        assert_eq!(
            SdkImage::parse("gcr.io/x/beam_java17_sdk:2.73.0"),
            Some(SdkImage::Java { java: 17 })
        );
        assert_eq!(
            SdkImage::parse("apache/beam_go_sdk:2.77.0"),
            Some(SdkImage::Go)
        );
        for other in [
            "apache/flink:1.18",
            "beam_pythonX.Y_sdk:1",
            "apache/beam_python3_sdk:2.77.0",
            "",
        ] {
            assert_eq!(SdkImage::parse(other), None, "{other}");
        }
    }

    #[test]
    fn java_versions_read_both_schemes() {
        assert_eq!(
            java_release("openjdk version \"17.0.9\" 2023-10-17"),
            Some(17)
        );
        assert_eq!(java_release("java version \"1.8.0_392\""), Some(8));
        assert_eq!(java_release("openjdk version \"21\" 2023-09-19"), Some(21));
        assert_eq!(java_release("command not found"), None);
    }

    #[test]
    fn staged_names_never_leave_the_directory() {
        let named = |name: &str| ArtifactInformation {
            role_urn: urns::artifact::STAGING_TO.to_string(),
            role_payload: ArtifactStagingToRolePayload {
                staged_name: name.to_string(),
            }
            .encode_to_vec(),
            ..Default::default()
        };
        assert_eq!(
            staged_name(&named("pickled_main_session"), 0),
            "pickled_main_session"
        );
        assert_eq!(staged_name(&named("../../etc/passwd"), 1), "passwd");
        assert_eq!(staged_name(&named(".."), 2), "dependency-2");
        assert_eq!(
            staged_name(&ArtifactInformation::default(), 3),
            "dependency-3"
        );
    }

    #[test]
    fn options_become_the_json_object_the_harnesses_read() {
        let options = prost_types::Struct {
            fields: [(
                "beam:option:job_name:v1".to_string(),
                prost_types::Value {
                    kind: Some(Kind::StringValue("j".into())),
                },
            )]
            .into_iter()
            .collect(),
        };
        assert_eq!(
            struct_json(&options).to_string(),
            r#"{"beam:option:job_name:v1":"j"}"#
        );
        // Whole numbers as integers (Go reads them into ints), others as
        // they are.
        assert_eq!(number(-1.0).to_string(), "-1");
        assert_eq!(number(0.5).to_string(), "0.5");
        assert_eq!(number(f64::NAN), serde_json::Value::Null);
    }
}
