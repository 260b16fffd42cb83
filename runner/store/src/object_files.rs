//! The files staged for durable jobs, kept in object storage beside the
//! jobs' records, so that a server on another host (its own `--state_dir`)
//! resumes a job with the jars, wheels and pickles its workers need.
//!
//! A job's file goes under `PREFIX/staged/{job}/{sha256}`: one copy per
//! job, named by its content, uploaded once (a file already there with
//! its size is not uploaded again) and deleted with the job. A file is
//! uploaded in parts, so its size does not bound memory; a download is
//! written beside its destination, checked against its SHA-256, and only
//! then renamed into place.

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::object_runtime::{backend, ObjectRuntime};
use crate::{ObjectUrl, StoreError};

/// Bytes read from a file and sent at once, and the size of an upload's
/// parts.
const PART_BYTES: usize = 8 << 20;

/// Staged files in object storage (see the module docs).
#[derive(Debug)]
pub struct ObjectFiles {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    runtime: ObjectRuntime,
}

impl ObjectFiles {
    /// The staged files under the object storage `url` names
    /// (`s3://BUCKET/PREFIX`, see [`ObjectUrl::connect`]).
    pub fn open_url(url: &str) -> Result<Self, StoreError> {
        let url: ObjectUrl = url.parse()?;
        ObjectFiles::new(url.connect()?, &url.prefix)
    }

    /// The staged files under `prefix` of `store`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Self, StoreError> {
        Ok(ObjectFiles {
            store,
            prefix: Path::from(prefix),
            runtime: ObjectRuntime::new()?,
        })
    }

    fn job_dir(&self, job: &str) -> Path {
        self.prefix.clone().join("staged").join(job)
    }

    fn path(&self, job: &str, sha256: &str) -> Path {
        self.job_dir(job).join(sha256)
    }

    /// Uploads `file`, whose SHA-256 is `sha256` and size `len`, as one of
    /// `job`'s staged files, unless it is there already.
    pub fn upload(
        &self,
        job: &str,
        sha256: &str,
        len: u64,
        file: PathBuf,
    ) -> Result<(), StoreError> {
        let store = self.store.clone();
        let path = self.path(job, sha256);
        self.runtime.run(async move {
            if store.head(&path).await.is_ok_and(|meta| meta.size == len) {
                return Ok(());
            }
            let what = format!("uploading {} to {path}", file.display());
            let mut source = tokio::fs::File::open(&file)
                .await
                .map_err(|e| backend(&what, e))?;
            let upload = store
                .put_multipart(&path)
                .await
                .map_err(|e| backend(&what, e))?;
            let mut parts = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let mut buffer = vec![0u8; PART_BYTES];
            loop {
                let read = match source.read(&mut buffer).await {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(e) => {
                        let _ = parts.abort().await;
                        return Err(backend(&what, e));
                    }
                };
                parts
                    .wait_for_capacity(2)
                    .await
                    .map_err(|e| backend(&what, e))?;
                parts.write(&buffer[..read]);
            }
            parts.finish().await.map_err(|e| backend(&what, e))?;
            Ok(())
        })
    }

    /// Downloads `job`'s staged file of SHA-256 `sha256` to `to` (its
    /// directory must exist), checking it has that SHA-256.
    pub fn download(&self, job: &str, sha256: &str, to: PathBuf) -> Result<(), StoreError> {
        let store = self.store.clone();
        let path = self.path(job, sha256);
        let want = sha256.to_string();
        self.runtime.run(async move {
            let what = format!("downloading {path} to {}", to.display());
            let partial = to.with_extension("partial");
            let mut sink = tokio::fs::File::create(&partial)
                .await
                .map_err(|e| backend(&what, e))?;
            let mut body = store
                .get(&path)
                .await
                .map_err(|e| backend(&what, e))?
                .into_stream();
            let mut digest = Sha256::new();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| backend(&what, e))?;
                digest.update(&chunk);
                sink.write_all(&chunk)
                    .await
                    .map_err(|e| backend(&what, e))?;
            }
            sink.sync_all().await.map_err(|e| backend(&what, e))?;
            let got = hex::encode(digest.finalize());
            if got != want {
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(backend(&what, format!("its SHA-256 is {got}, not {want}")));
            }
            tokio::fs::rename(&partial, &to)
                .await
                .map_err(|e| backend(&what, e))
        })
    }

    /// Deletes every staged file of `job`, as far as it can (what is left
    /// stays under the job's name, which no later job takes).
    pub fn delete_job(&self, job: &str) {
        let store = self.store.clone();
        let dir = self.job_dir(job);
        let deleted = self.runtime.run(async move {
            let mut found = store.list(Some(&dir));
            while let Some(meta) = found.next().await {
                let meta = meta.map_err(|e| backend("listing staged files", e))?;
                if let Err(error) = store.delete(&meta.location).await {
                    tracing::warn!(path = %meta.location, %error, "cannot delete a staged file");
                }
            }
            Ok(())
        });
        if let Err(error) = deleted {
            tracing::warn!(job, %error, "cannot delete the job's staged files");
        }
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;

    use super::*;

    fn sha256_hex(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    #[test]
    fn a_staged_file_goes_up_once_comes_back_checked_and_goes_with_its_job() {
        let dir = tempfile::tempdir().expect("a directory");
        let bytes: Vec<u8> = (0..(PART_BYTES * 2 + 17))
            .map(|i| (i % 251) as u8)
            .collect();
        let source = dir.path().join("big.jar");
        std::fs::write(&source, &bytes).expect("written");
        let sha = sha256_hex(&bytes);
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let files = ObjectFiles::new(store.clone(), "jobs").expect("files");
        files
            .upload("job-1", &sha, bytes.len() as u64, source.clone())
            .expect("uploaded");
        // Again: already there, nothing read (the source may be gone).
        std::fs::remove_file(&source).expect("removed");
        files
            .upload("job-1", &sha, bytes.len() as u64, source.clone())
            .expect("not uploaded twice");
        let back = dir.path().join("back.jar");
        files
            .download("job-1", &sha, back.clone())
            .expect("downloaded");
        assert_eq!(std::fs::read(&back).expect("read"), bytes);
        // A file whose content is not what its name says is refused, and
        // leaves nothing at the destination; so is one that is not there.
        let liar = dir.path().join("liar.jar");
        std::fs::write(&liar, b"not other").expect("written");
        let other = sha256_hex(b"other");
        files.upload("job-1", &other, 9, liar).expect("uploaded");
        let wrong = dir.path().join("wrong.jar");
        let error = files
            .download("job-1", &other, wrong.clone())
            .expect_err("a wrong checksum");
        assert!(error.to_string().contains("its SHA-256 is"), "{error}");
        assert!(!wrong.exists() && !wrong.with_extension("partial").exists());
        assert!(
            files.download("job-2", &sha, wrong).is_err(),
            "no such file"
        );
        files.delete_job("job-1");
        assert!(files.download("job-1", &sha, back).is_err(), "deleted");
    }
}
