//! Streams one artifact to disk while hashing it, so that no artifact is
//! ever held in memory whole.
//!
//! Files are written under a counter-based temporary name and renamed to
//! their SHA-256 on completion. Neither name comes from the client, so a
//! staged name such as `../../etc/x` can never influence where bytes land,
//! and identical content staged twice ends up in one file.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::fs::File;
use tokio::io::{AsyncWriteExt, BufWriter};

/// A completed artifact on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StagedFile {
    /// Absolute path of the stored bytes.
    pub path: PathBuf,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
    /// Size in bytes.
    pub len: u64,
}

/// An artifact being received.
pub(crate) struct ArtifactWriter {
    file: BufWriter<File>,
    partial: PathBuf,
    dir: PathBuf,
    hasher: Sha256,
    len: u64,
}

impl ArtifactWriter {
    /// Creates `dir` if needed and opens a fresh temporary file in it, named
    /// after `seq` (unique per store).
    pub(crate) async fn create(dir: &Path, seq: u64) -> std::io::Result<Self> {
        tokio::fs::create_dir_all(dir).await?;
        let partial = dir.join(format!(".partial-{seq}"));
        let file = File::create(&partial).await?;
        Ok(Self {
            file: BufWriter::with_capacity(256 * 1024, file),
            partial,
            dir: dir.to_path_buf(),
            hasher: Sha256::new(),
            len: 0,
        })
    }

    /// Appends one chunk.
    pub(crate) async fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.hasher.update(data);
        self.len += data.len() as u64;
        self.file.write_all(data).await
    }

    /// Flushes and moves the file to its content-addressed name.
    pub(crate) async fn finish(mut self) -> std::io::Result<StagedFile> {
        self.file.flush().await?;
        self.file.get_mut().sync_data().await?;
        let sha256 = hex::encode(self.hasher.finalize());
        let path = self.dir.join(&sha256);
        tokio::fs::rename(&self.partial, &path).await?;
        Ok(StagedFile {
            path,
            sha256,
            len: self.len,
        })
    }

    /// Deletes the partial file after a failed transfer.
    pub(crate) async fn abandon(self) {
        let partial = self.partial.clone();
        drop(self.file);
        if let Err(error) = tokio::fs::remove_file(&partial).await {
            tracing::debug!(path = %partial.display(), %error, "could not remove partial artifact");
        }
    }
}

/// The lower-case hex SHA-256 of a file's bytes, read in chunks.
pub(crate) fn sha256_of_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buffer[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_hashes_and_dedups_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let job_dir = dir.path().join("job");
        let mut w = ArtifactWriter::create(&job_dir, 0).await.unwrap();
        w.write(b"hello ").await.unwrap();
        w.write(b"world").await.unwrap();
        let a = w.finish().await.unwrap();
        assert_eq!(
            a.sha256,
            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        );
        assert_eq!(a.len, 11);
        assert_eq!(std::fs::read(&a.path).unwrap(), b"hello world");

        let mut w = ArtifactWriter::create(&job_dir, 1).await.unwrap();
        w.write(b"hello world").await.unwrap();
        let b = w.finish().await.unwrap();
        assert_eq!(a.path, b.path);

        let mut w = ArtifactWriter::create(&job_dir, 2).await.unwrap();
        w.write(b"partial").await.unwrap();
        w.abandon().await;
        let names: Vec<_> = std::fs::read_dir(&job_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }
}
