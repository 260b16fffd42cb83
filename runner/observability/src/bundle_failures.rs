//! Failed bundle attempts, grouped by the transform that failed, for the
//! UI's "what went wrong" view: how often each transform failed, when it
//! last did, and its latest error with the SDK's stack trace.
//!
//! The Fn API reports a bundle's failure as one text for the whole fused
//! stage; which transform inside it threw is only in that text. Python
//! names it (`[while running 'Parse/Decode']`); other SDKs' texts are
//! searched for one of the stage's transform names in quotes; failing
//! both, the group is the stage itself.

use std::collections::BTreeMap;

use refract_engine::plan::fused_transform_names;
use refract_jobservice::redact::redact_text;

/// The longest error text kept per group: a worker's error can carry a
/// huge message, and every group keeps its latest one.
pub const MAX_ERROR_BYTES: usize = 64 * 1024;

/// The most groups a job keeps: the transform comes from a worker's
/// text, so a worker naming a new one in every error must not grow the
/// job's memory without end. Past it, new names count under their stage.
pub const MAX_GROUPS: usize = 256;

/// One transform's failed attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureGroup {
    /// The transform's unique name as the user gave it (or the stage's
    /// name when the error does not say).
    pub transform: String,
    /// The fused stage it ran in.
    pub stage: String,
    /// Failed attempts so far.
    pub count: u64,
    /// When the latest one failed, in ms since the epoch.
    pub last_at_ms: i64,
    /// The latest error, as the SDK sent it with secrets redacted, as in
    /// the job's messages (cut at [`MAX_ERROR_BYTES`]).
    pub last_error: String,
}

/// A job's failed bundle attempts, grouped (see the module docs).
#[derive(Debug, Default)]
pub struct BundleFailures {
    groups: BTreeMap<(String, String), FailureGroup>,
}

impl BundleFailures {
    /// Notes a failed attempt of a bundle of `stage` (transform names
    /// joined by `+`) that failed with `error` at `at_ms`.
    pub fn observe(&mut self, stage: &str, error: &str, at_ms: i64) {
        let mut transform = failing_transform(error, stage);
        if self.groups.len() >= MAX_GROUPS
            && !self
                .groups
                .contains_key(&(transform.clone(), stage.to_string()))
        {
            transform = stage.to_string();
        }
        let group = self
            .groups
            .entry((transform.clone(), stage.to_string()))
            .or_insert_with(|| FailureGroup {
                transform,
                stage: stage.to_string(),
                count: 0,
                last_at_ms: at_ms,
                last_error: String::new(),
            });
        group.count += 1;
        group.last_at_ms = at_ms;
        group.last_error = truncated(&redact_text(error), MAX_ERROR_BYTES);
    }

    /// The groups, most failures first.
    pub fn groups(&self) -> Vec<FailureGroup> {
        let mut groups: Vec<FailureGroup> = self.groups.values().cloned().collect();
        groups.sort_by(|a, b| b.count.cmp(&a.count).then(b.last_at_ms.cmp(&a.last_at_ms)));
        groups
    }
}

/// The transform an SDK's error text blames, among those of `stage`.
pub fn failing_transform(error: &str, stage: &str) -> String {
    const PYTHON: &str = "while running '";
    if let Some(at) = error.rfind(PYTHON) {
        let rest = &error[at + PYTHON.len()..];
        if let Some(end) = rest.find('\'') {
            if end > 0 {
                return rest[..end].to_string();
            }
        }
    }
    // The innermost transform the text quotes: later transforms of a
    // fused stage run inside the earlier ones' calls.
    fused_transform_names(stage)
        .rev()
        .find(|name| !name.is_empty() && error.contains(&format!("'{name}'")))
        .unwrap_or(stage)
        .to_string()
}

/// `text` cut to at most `max` bytes at a character boundary, saying so.
fn truncated(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[... {} more bytes]", &text[..end], text.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_names_the_transform() {
        let error = "Traceback (most recent call last):\n  File \"x.py\", line 3\n\
                     RuntimeError: boom [while running 'Outer/Fail']";
        assert_eq!(
            failing_transform(error, "Read+Outer/Fail+Write"),
            "Outer/Fail"
        );
    }

    #[test]
    fn other_sdks_are_searched_for_a_quoted_stage_transform() {
        let error = "error in 'Parse': bad record near 'Read'";
        assert_eq!(failing_transform(error, "Read+Parse+Count"), "Parse");
        assert_eq!(
            failing_transform("no names here", "Read+Parse"),
            "Read+Parse"
        );
    }

    #[test]
    fn groups_count_attempts_and_keep_the_latest_error() {
        let mut failures = BundleFailures::default();
        failures.observe("A+B", "x [while running 'B']", 1);
        failures.observe("A+B", "y [while running 'B']", 2);
        failures.observe("C", "z", 3);
        let groups = failures.groups();
        assert_eq!(groups.len(), 2);
        assert_eq!(
            groups[0],
            FailureGroup {
                transform: "B".into(),
                stage: "A+B".into(),
                count: 2,
                last_at_ms: 2,
                last_error: "y [while running 'B']".into(),
            }
        );
        assert_eq!((groups[1].transform.as_str(), groups[1].count), ("C", 1));
    }

    #[test]
    fn names_past_the_cap_count_under_their_stage() {
        let mut failures = BundleFailures::default();
        for i in 0..MAX_GROUPS + 10 {
            failures.observe("S", &format!("[while running 'T{i}']"), 0);
        }
        let groups = failures.groups();
        assert!(groups.len() <= MAX_GROUPS + 1, "{}", groups.len());
        assert_eq!((groups[0].transform.as_str(), groups[0].count), ("S", 10));
    }

    #[test]
    fn secrets_in_errors_are_redacted() {
        let mut failures = BundleFailures::default();
        failures.observe("S", "connect(password=hunter2) refused", 0);
        assert_eq!(
            failures.groups()[0].last_error,
            "connect(password=***) refused"
        );
    }

    #[test]
    fn huge_errors_are_cut_at_a_character_boundary() {
        let mut failures = BundleFailures::default();
        let error = "é".repeat(MAX_ERROR_BYTES);
        failures.observe("S", &error, 0);
        let kept = &failures.groups()[0].last_error;
        assert!(kept.len() < MAX_ERROR_BYTES + 100);
        assert!(kept.ends_with("more bytes]"));
    }
}
