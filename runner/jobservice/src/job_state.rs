//! Beam's job state machine: which state changes are legal and which states
//! are final.
//!
//! The rules live in one place so that every caller (the runner through
//! [`crate::Job::set_state`], the Cancel RPC, artifact staging failures)
//! agrees on them, and so that a terminal state can never be left.

use refract_proto::job_api::job_state::Enum;

/// A job's lifecycle state, exactly as the Job API reports it
/// (`JobState.Enum`), so no translation is needed at the gRPC boundary.
pub type JobState = Enum;

/// Whether `state` is final. Once a job reaches one of these, its state and
/// message streams end and no further change is accepted.
pub fn is_terminal(state: JobState) -> bool {
    matches!(
        state,
        Enum::Done | Enum::Failed | Enum::Cancelled | Enum::Updated | Enum::Drained
    )
}

/// Whether a job in state `from` may move to `to`.
///
/// The proto documents the graph `STOPPED → STARTING → RUNNING → {DONE,
/// FAILED, CANCELLING → CANCELLED, UPDATING → UPDATED, DRAINING → DRAINED}`
/// and allows skipping optional steps, so every move is forward along it.
/// A job that is cancelling, draining or updating may still finish in any
/// terminal state the runner reports (a cancel can race with completion), but
/// never returns to running.
pub(crate) fn transition_allowed(from: JobState, to: JobState) -> bool {
    if from == to || is_terminal(from) || to == Enum::Unspecified {
        return false;
    }
    match from {
        Enum::Unspecified => true,
        Enum::Stopped => !matches!(to, Enum::Stopped),
        Enum::Starting => !matches!(to, Enum::Stopped),
        Enum::Running => !matches!(to, Enum::Stopped | Enum::Starting),
        Enum::Cancelling => matches!(to, Enum::Cancelled | Enum::Failed | Enum::Done),
        Enum::Draining => matches!(
            to,
            Enum::Drained | Enum::Done | Enum::Failed | Enum::Cancelling | Enum::Cancelled
        ),
        Enum::Updating => matches!(
            to,
            Enum::Updated | Enum::Failed | Enum::Cancelling | Enum::Cancelled
        ),
        // Terminal states were handled above.
        Enum::Done | Enum::Failed | Enum::Cancelled | Enum::Updated | Enum::Drained => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn happy_path_is_legal() {
        assert!(transition_allowed(Enum::Stopped, Enum::Starting));
        assert!(transition_allowed(Enum::Starting, Enum::Running));
        assert!(transition_allowed(Enum::Running, Enum::Done));
        assert!(transition_allowed(Enum::Running, Enum::Failed));
        assert!(transition_allowed(Enum::Running, Enum::Cancelling));
        assert!(transition_allowed(Enum::Cancelling, Enum::Cancelled));
    }

    #[test]
    fn optional_steps_may_be_skipped() {
        assert!(transition_allowed(Enum::Stopped, Enum::Running));
        assert!(transition_allowed(Enum::Stopped, Enum::Cancelled));
        assert!(transition_allowed(Enum::Starting, Enum::Failed));
    }

    #[test]
    fn no_way_back() {
        assert!(!transition_allowed(Enum::Running, Enum::Starting));
        assert!(!transition_allowed(Enum::Running, Enum::Stopped));
        assert!(!transition_allowed(Enum::Cancelling, Enum::Running));
        assert!(!transition_allowed(Enum::Running, Enum::Running));
        assert!(!transition_allowed(Enum::Running, Enum::Unspecified));
    }

    #[test]
    fn terminal_is_final() {
        for terminal in [
            Enum::Done,
            Enum::Failed,
            Enum::Cancelled,
            Enum::Updated,
            Enum::Drained,
        ] {
            assert!(is_terminal(terminal));
            for to in [Enum::Running, Enum::Done, Enum::Failed, Enum::Cancelled] {
                assert!(!transition_allowed(terminal, to), "{terminal:?} -> {to:?}");
            }
        }
        assert!(!is_terminal(Enum::Cancelling));
    }
}
