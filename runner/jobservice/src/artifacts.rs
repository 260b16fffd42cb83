//! The artifacts staged for one job, and how environments' dependency lists
//! map onto them.

mod writer;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use refract_proto::pipeline::{
    ArtifactFilePayload, ArtifactInformation, ArtifactUrlPayload, Environment,
};
use refract_proto::prost::Message;
use refract_proto::urns;

pub(crate) use writer::{ArtifactWriter, StagedFile};

/// Artifacts are identified the way the SDK declared them: by type and type
/// payload. Roles do not matter for the bytes, so one artifact listed by two
/// environments (or with two roles) is fetched once.
/// A staged file and the artifact (type URN and payload) it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedArtifact {
    /// The artifact's type URN as declared.
    pub type_urn: String,
    /// The artifact's type payload as declared.
    pub type_payload: Vec<u8>,
    /// Where its bytes are.
    pub path: PathBuf,
    /// Their SHA-256, lower-case hex.
    pub sha256: String,
    /// Their size.
    pub len: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ArtifactKey {
    type_urn: String,
    type_payload: Vec<u8>,
}

impl ArtifactKey {
    fn of(artifact: &ArtifactInformation) -> Self {
        Self {
            type_urn: artifact.type_urn.clone(),
            type_payload: artifact.type_payload.clone(),
        }
    }
}

/// The files staged for one job, in a directory of their own under the
/// service's staging root. Shared by the staging service (which fills it)
/// and the runner (which serves the files to SDK harnesses).
#[derive(Debug)]
pub struct ArtifactStore {
    dir: PathBuf,
    declared: BTreeMap<String, Vec<ArtifactInformation>>,
    staged: Mutex<HashMap<ArtifactKey, StagedFile>>,
    next_partial: AtomicU64,
}

impl ArtifactStore {
    /// A store in `dir` (created on first write) for the dependencies the
    /// pipeline's environments declare. An AnyOf environment declares its
    /// own and every alternative's: which alternative runs is decided when
    /// the job is planned, and its worker is provisioned under the AnyOf
    /// environment's id. (An unreadable list declares only its own; the
    /// job is refused at planning.)
    pub(crate) fn new(dir: PathBuf, environments: &HashMap<String, Environment>) -> Self {
        let declared = environments
            .iter()
            .map(|(id, env)| {
                let mut dependencies = env.dependencies.clone();
                if env.urn == refract_proto::urns::env::ANY_OF {
                    for alternative in refract_proto::any_of::alternatives(env).unwrap_or_default()
                    {
                        dependencies.extend(alternative.dependencies);
                    }
                }
                (id.clone(), dependencies)
            })
            .collect();
        Self {
            dir,
            declared,
            staged: Mutex::new(HashMap::new()),
            next_partial: AtomicU64::new(0),
        }
    }

    /// The directory holding this job's files, so the runner can tell where
    /// they live (e.g. for logs); it may not exist when nothing was staged.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Finds the staged bytes for an artifact of an environment's dependency
    /// list, by (type_urn, type_payload) as the SDK declared it, so the
    /// runner's artifact retrieval service can serve it. `None` if it was not
    /// staged (yet).
    ///
    /// Artifacts in the form [`ArtifactStore::resolved_dependencies`] hands
    /// out (a file artifact naming a stored file) resolve too, since that is
    /// what a harness asks for after provisioning. No other path is served.
    pub fn path_for(&self, artifact: &ArtifactInformation) -> Option<PathBuf> {
        let staged = self.staged.lock();
        if let Some(f) = staged.get(&ArtifactKey::of(artifact)) {
            return Some(f.path.clone());
        }
        if artifact.type_urn != urns::artifact::FILE {
            return None;
        }
        let payload = ArtifactFilePayload::decode(artifact.type_payload.as_slice()).ok()?;
        staged
            .values()
            .find(|f| f.path.to_string_lossy() == payload.path)
            .map(|f| f.path.clone())
    }

    /// The environment's dependencies after staging, each rewritten to
    /// `beam:artifact:type:file:v1` pointing at the stored file (with its
    /// SHA-256) and its role kept, for `ProvisionInfo.dependencies`.
    /// Dependencies that were not staged are returned as declared, so a
    /// harness can still try to fetch them itself. Unknown environments have
    /// none.
    pub fn resolved_dependencies(&self, environment_id: &str) -> Vec<ArtifactInformation> {
        let Some(declared) = self.declared.get(environment_id) else {
            return Vec::new();
        };
        let staged = self.staged.lock();
        declared
            .iter()
            .map(|dep| match staged.get(&ArtifactKey::of(dep)) {
                Some(file) => ArtifactInformation {
                    type_urn: urns::artifact::FILE.to_string(),
                    type_payload: ArtifactFilePayload {
                        path: file.path.to_string_lossy().into_owned(),
                        sha256: file.sha256.clone(),
                    }
                    .encode_to_vec(),
                    role_urn: dep.role_urn.clone(),
                    role_payload: dep.role_payload.clone(),
                },
                None => dep.clone(),
            })
            .collect()
    }

    /// Every distinct declared dependency not staged yet, in a stable order
    /// (by environment id, then declaration order).
    pub(crate) fn pending(&self) -> Vec<ArtifactInformation> {
        let staged = self.staged.lock();
        let mut seen = std::collections::HashSet::new();
        self.declared
            .values()
            .flatten()
            .filter(|dep| {
                let key = ArtifactKey::of(dep);
                !staged.contains_key(&key) && seen.insert(key)
            })
            .cloned()
            .collect()
    }

    /// Opens a writer for the next incoming artifact.
    pub(crate) async fn writer(&self) -> std::io::Result<ArtifactWriter> {
        let seq = self.next_partial.fetch_add(1, Ordering::Relaxed);
        ArtifactWriter::create(&self.dir, seq).await
    }

    /// Records where a declared artifact's bytes were stored.
    /// Every staged file with the artifact it stands for, so that a job
    /// can be recovered by a later server ([`crate::RecoveredJob`]).
    pub fn staged(&self) -> Vec<StagedArtifact> {
        let mut staged: Vec<StagedArtifact> = self
            .staged
            .lock()
            .iter()
            .map(|(key, file)| StagedArtifact {
                type_urn: key.type_urn.clone(),
                type_payload: key.type_payload.clone(),
                path: file.path.clone(),
                sha256: file.sha256.clone(),
                len: file.len,
            })
            .collect();
        staged.sort_by(|a, b| a.path.cmp(&b.path));
        staged
    }

    /// Takes back files staged by an earlier server.
    pub(crate) fn adopt(&self, staged: &[StagedArtifact]) {
        let mut files = self.staged.lock();
        for a in staged {
            files.insert(
                ArtifactKey {
                    type_urn: a.type_urn.clone(),
                    type_payload: a.type_payload.clone(),
                },
                StagedFile {
                    path: a.path.clone(),
                    sha256: a.sha256.clone(),
                    len: a.len,
                },
            );
        }
    }

    pub(crate) fn record(&self, artifact: &ArtifactInformation, file: StagedFile) {
        self.staged.lock().insert(ArtifactKey::of(artifact), file);
    }

    /// The service-wide directory of content-addressed files, beside the
    /// job directories, from which later jobs reuse what earlier ones
    /// staged (Java stages its whole classpath with every job).
    fn shared_dir(&self) -> Option<PathBuf> {
        self.dir.parent().map(|root| root.join(SHARED_DIR))
    }

    /// Stages an artifact without transferring it when its declared SHA-256
    /// names a file an earlier job stored: the file is hard-linked into
    /// this job's directory (so removing either job's files keeps the
    /// other's), then hashed again — a stored file that changed since (the
    /// staging directory may be shared, or given by the user) is dropped
    /// from the shared store and fetched anew. `None` when the artifact
    /// must be fetched.
    pub(crate) async fn reuse(&self, artifact: &ArtifactInformation) -> Option<StagedFile> {
        let sha256 = declared_sha256(artifact)?;
        // Only a plain digest may become a file name.
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let shared = self.shared_dir()?.join(&sha256);
        let len = tokio::fs::metadata(&shared).await.ok()?.len();
        tokio::fs::create_dir_all(&self.dir).await.ok()?;
        let path = self.dir.join(&sha256);
        match tokio::fs::hard_link(&shared, &path).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                tracing::debug!(path = %shared.display(), %error, "cannot reuse a stored artifact");
                return None;
            }
        }
        let linked = path.clone();
        let actual = tokio::task::spawn_blocking(move || writer::sha256_of_file(&linked))
            .await
            .ok()
            .and_then(Result::ok);
        if actual.as_deref() != Some(sha256.as_str()) {
            tracing::warn!(
                path = %shared.display(),
                expected = %sha256,
                actual = ?actual,
                "a stored artifact no longer matches its digest; fetching it again"
            );
            for stale in [&path, &shared] {
                if let Err(error) = tokio::fs::remove_file(stale).await {
                    tracing::debug!(path = %stale.display(), %error, "cannot remove a stale artifact");
                }
            }
            return None;
        }
        Some(StagedFile { path, sha256, len })
    }

    /// Offers a file this job staged (already verified against its digest)
    /// to later jobs. Failures only cost a later transfer.
    pub(crate) async fn share(&self, file: &StagedFile) {
        let Some(dir) = self.shared_dir() else {
            return;
        };
        let target = dir.join(&file.sha256);
        let linked = match tokio::fs::create_dir_all(&dir).await {
            Ok(()) => tokio::fs::hard_link(&file.path, &target).await,
            Err(e) => Err(e),
        };
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                tracing::debug!(path = %target.display(), %error, "could not share a staged artifact")
            }
        }
    }

    /// Deletes this job's directory and forgets what was staged.
    pub(crate) fn remove_files(&self) {
        self.staged.lock().clear();
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => tracing::debug!(dir = %self.dir.display(), "removed staged artifacts"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "could not remove staged artifacts")
            }
        }
    }
}

/// Name of the directory of content-addressed files shared by all jobs,
/// under the staging root (job ids never start with a dot).
const SHARED_DIR: &str = ".by-sha256";

/// The SHA-256 the SDK declared for an artifact, if any, so staging can
/// verify what it received.
pub(crate) fn declared_sha256(artifact: &ArtifactInformation) -> Option<String> {
    let sha = match artifact.type_urn.as_str() {
        urns::artifact::FILE => {
            ArtifactFilePayload::decode(artifact.type_payload.as_slice())
                .ok()?
                .sha256
        }
        urns::artifact::URL => {
            ArtifactUrlPayload::decode(artifact.type_payload.as_slice())
                .ok()?
                .sha256
        }
        _ => return None,
    };
    (!sha.is_empty()).then(|| sha.to_ascii_lowercase())
}

/// A short human description of an artifact for logs and errors (its path or
/// URL when the type is known), never used as a file name.
pub(crate) fn describe(artifact: &ArtifactInformation) -> String {
    let location = match artifact.type_urn.as_str() {
        urns::artifact::FILE => ArtifactFilePayload::decode(artifact.type_payload.as_slice())
            .ok()
            .map(|p| p.path),
        urns::artifact::URL => ArtifactUrlPayload::decode(artifact.type_payload.as_slice())
            .ok()
            .map(|p| p.url),
        _ => None,
    };
    match location {
        Some(location) => format!("{} {location:?}", artifact.type_urn),
        None => artifact.type_urn.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_artifact(path: &str, role: &str) -> ArtifactInformation {
        ArtifactInformation {
            type_urn: urns::artifact::FILE.into(),
            type_payload: ArtifactFilePayload {
                path: path.into(),
                sha256: String::new(),
            }
            .encode_to_vec(),
            role_urn: role.into(),
            role_payload: vec![1, 2],
        }
    }

    fn env(deps: Vec<ArtifactInformation>) -> Environment {
        Environment {
            dependencies: deps,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn pending_dedups_and_resolution_rewrites_staged_only() {
        let dir = tempfile::tempdir().unwrap();
        let a = file_artifact("/tmp/a", "r1");
        let a_other_role = file_artifact("/tmp/a", "r2");
        let b = file_artifact("/tmp/b", "r1");
        let envs: HashMap<String, Environment> = [
            ("e1".to_string(), env(vec![a.clone(), b.clone()])),
            ("e2".to_string(), env(vec![a_other_role.clone()])),
        ]
        .into();
        let store = ArtifactStore::new(dir.path().join("job"), &envs);
        assert_eq!(store.pending(), vec![a.clone(), b.clone()]);

        let mut w = store.writer().await.unwrap();
        w.write(b"A").await.unwrap();
        let file = w.finish().await.unwrap();
        store.record(&a, file.clone());
        assert_eq!(store.pending(), vec![b.clone()]);
        assert_eq!(store.path_for(&a_other_role), Some(file.path.clone()));
        assert_eq!(store.path_for(&b), None);

        let resolved = store.resolved_dependencies("e1");
        assert_eq!(resolved.len(), 2);
        assert_eq!(resolved[0].type_urn, urns::artifact::FILE);
        let payload = ArtifactFilePayload::decode(resolved[0].type_payload.as_slice()).unwrap();
        assert_eq!(PathBuf::from(payload.path), file.path);
        assert_eq!(payload.sha256, file.sha256);
        assert_eq!(resolved[0].role_urn, "r1");
        assert_eq!(resolved[0].role_payload, vec![1, 2]);
        assert_eq!(resolved[1], b);
        // What provisioning hands out resolves back to the stored file.
        assert_eq!(store.path_for(&resolved[0]), Some(file.path.clone()));
        assert_eq!(store.path_for(&file_artifact("/etc/passwd", "r1")), None);
        assert_eq!(store.resolved_dependencies("e2")[0].role_urn, "r2");
        assert!(store.resolved_dependencies("nope").is_empty());

        store.remove_files();
        assert!(!store.dir().exists());
        assert_eq!(store.path_for(&a), None);
    }

    #[test]
    fn declared_sha_is_read_from_file_and_url_payloads() {
        let mut a = file_artifact("/x", "r");
        assert_eq!(declared_sha256(&a), None);
        a.type_payload = ArtifactFilePayload {
            path: "/x".into(),
            sha256: "ABC".into(),
        }
        .encode_to_vec();
        assert_eq!(declared_sha256(&a).as_deref(), Some("abc"));
        assert_eq!(describe(&a), format!("{} \"/x\"", urns::artifact::FILE));
    }
}
