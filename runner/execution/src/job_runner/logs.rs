//! Where a job's SDK workers find its staged files, and where their log
//! lines go.

use std::collections::HashMap;
use std::sync::Arc;

use refract_jobservice::Job;
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::pipeline::ArtifactInformation;
use refract_sdk_harness::{ArtifactSource, LogSink};

/// A job's staged files, served to its workers.
pub(super) struct JobArtifacts(pub(super) Arc<Job>);

impl ArtifactSource for JobArtifacts {
    fn open(&self, a: &ArtifactInformation) -> Option<std::path::PathBuf> {
        self.0.artifacts().path_for(a)
    }
}

/// Where a worker's log lines go: the runner's log (with the worker, stage
/// and transform each came from) and the job's message stream. Both redact
/// secret-looking values as they take a line in (the binary's log, the job's
/// event log), so the SDK's log of its options shows none.
pub(super) struct JobLogs {
    pub(super) job: Arc<Job>,
    pub(super) origins: Arc<TransformOrigins>,
}

/// Transform id → (its stage's name, its unique name in the pipeline). A
/// stage's name joins the names of all its transforms, so its transforms
/// share one copy of it: a copy each would grow with the square of the
/// stage's size.
pub(super) type TransformOrigins = HashMap<String, (Arc<str>, String)>;

/// Whether a worker's log line is the job's own message, as the Go SDK's
/// job client logs each one it reads: `(time=T)(id=N)text`. A Go LOOPBACK
/// worker shares the submitting process, and with it the logger, so those
/// lines reach the runner as the worker's.
fn is_job_message_echo(message: &str) -> bool {
    message
        .strip_prefix("(time=")
        .and_then(|rest| rest.split_once(')'))
        .is_some_and(|(_, rest)| rest.starts_with("(id="))
}

impl LogSink for JobLogs {
    fn log(&self, worker_id: &str, entry: refract_proto::fn_api::LogEntry) {
        use refract_proto::fn_api::log_entry::severity::Enum as Severity;
        let severity = Severity::try_from(entry.severity).unwrap_or(Severity::Info);
        if is_job_message_echo(&entry.message) {
            // Sent back to where it came from, it would come back again,
            // one level deeper, for as long as the job runs.
            tracing::debug!(worker = worker_id, "{}", entry.message);
            return;
        }
        let text = if entry.trace.is_empty() {
            entry.message.clone()
        } else {
            format!("{}\n{}", entry.message, entry.trace)
        };
        let (stage, transform) = match self.origins.get(&entry.transform_id) {
            Some((stage, name)) => (&**stage, name.as_str()),
            None => ("", entry.transform_id.as_str()),
        };
        use crate::SDK_WORKER_TARGET as WORKER;
        match severity {
            Severity::Error | Severity::Critical => {
                tracing::error!(target: WORKER, worker = worker_id, stage, transform, "{text}")
            }
            Severity::Warn => {
                tracing::warn!(target: WORKER, worker = worker_id, stage, transform, "{text}")
            }
            Severity::Notice | Severity::Info => {
                tracing::info!(target: WORKER, worker = worker_id, stage, transform, "{text}")
            }
            _ => tracing::debug!(target: WORKER, worker = worker_id, stage, transform, "{text}"),
        }
        let importance = match severity {
            Severity::Error | Severity::Critical | Severity::Warn => {
                Some(MessageImportance::JobMessageWarning)
            }
            Severity::Notice | Severity::Info => Some(MessageImportance::JobMessageBasic),
            _ => None,
        };
        // Which worker and transform it came from, so a reader can filter
        // the job's messages by step.
        if let Some(importance) = importance {
            let origin = if transform.is_empty() {
                worker_id.to_string()
            } else {
                format!("{worker_id} {transform}")
            };
            self.job.message(importance, format!("[{origin}] {text}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_go_clients_echo_of_a_job_message_is_recognised() {
        assert!(is_job_message_echo(
            "(time=2026-12-04T13:10:52.569481947Z)(id=1)[w0] Draining at: done 0"
        ));
        assert!(!is_job_message_echo("Draining at: done 0"));
        assert!(!is_job_message_echo("(time=soon) a user's own line"));
        assert!(!is_job_message_echo("(time=unclosed"));
    }
}
