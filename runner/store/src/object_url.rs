//! Which object store a `--checkpoint_store` URL names, and opening it.

use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;

use crate::StoreError;

/// A bucket and a prefix in it, read from `s3://BUCKET[/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectUrl {
    /// The bucket.
    pub bucket: String,
    /// Where under it the store's objects go (no leading or trailing `/`).
    pub prefix: String,
}

impl std::str::FromStr for ObjectUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<Self, StoreError> {
        let bad = |why: &str| {
            StoreError::Backend(format!(
                "checkpoint store {url:?}: {why} (write s3://BUCKET or s3://BUCKET/PREFIX)"
            ))
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("only s3:// URLs are read"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("it names no bucket"));
        }
        Ok(ObjectUrl {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
        })
    }
}

impl ObjectUrl {
    /// The bucket, reached as the `AWS_*` environment variables say
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    /// `AWS_ENDPOINT_URL` for an S3-compatible server; an `http://`
    /// endpoint is allowed as named).
    pub fn connect(&self) -> Result<Arc<dyn ObjectStore>, StoreError> {
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(&self.bucket);
        let plain_http = ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .filter_map(|name| std::env::var(name).ok())
            .any(|endpoint| endpoint.starts_with("http://"));
        if plain_http {
            builder = builder.with_allow_http(true);
        }
        let store = builder.build().map_err(|e| {
            StoreError::Backend(format!("checkpoint store s3://{}: {e}", self.bucket))
        })?;
        Ok(Arc::new(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_prefixes_are_read_and_other_urls_refused() {
        let url: ObjectUrl = "s3://bucket/a/b/".parse().expect("an s3 URL");
        assert_eq!(
            url,
            ObjectUrl {
                bucket: "bucket".into(),
                prefix: "a/b".into()
            }
        );
        let bare: ObjectUrl = "s3://bucket".parse().expect("a bucket alone");
        assert_eq!(bare.prefix, "");
        for bad in ["gs://bucket/x", "s3:///x", "/tmp/dir"] {
            let error = bad.parse::<ObjectUrl>().expect_err(bad).to_string();
            assert!(error.contains("s3://BUCKET"), "{error}");
        }
    }
}
