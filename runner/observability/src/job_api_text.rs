//! The Job API's enums as people read them, in one place for every
//! surface that prints them: the command-line clients, the web UI, the
//! OTLP export and the durable job log.

use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::job_state;

/// A job state's name as the Job API spells it (`RUNNING`, `DONE`, ...).
pub fn state_name(state: i32) -> String {
    job_state::Enum::try_from(state)
        .map(|s| s.as_str_name().to_string())
        .unwrap_or_else(|_| state.to_string())
}

/// A job message's importance as people read it (`ERROR`, `WARNING`,
/// `BASIC`, ...).
pub fn message_level(importance: i32) -> String {
    MessageImportance::try_from(importance)
        .map(|i| {
            i.as_str_name()
                .trim_start_matches("JOB_MESSAGE_")
                .to_string()
        })
        .unwrap_or_default()
}
