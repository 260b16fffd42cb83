//! Pipeline update, as Dataflow users know it: a submission with
//! `--update` and the `--job_name` of a running job replaces that job.
//!
//! At Prepare ([`replaced_job`]) the running job of that name is found and
//! both pipelines are planned; the update is refused, naming each
//! transform and why, unless everything the old job could hold has a
//! place in the new one (`refract_engine::manager::check_update`) and the
//! new one reads it in the same key, state and value coders and windowing
//! (`refract_translate::state_compatibility`), with
//! `--transform_name_mapping` applied. The old job runs on meanwhile.
//!
//! When the new job starts ([`take_over`]) it claims the old one, which
//! stops right after a savepoint taken in memory and ends `UPDATED`; the
//! new job starts from that cut as from a savepoint file, so nothing the
//! old job had done is lost or done twice.

use std::sync::Arc;

use bytes::Bytes;
use refract_engine::manager::check_update;
use refract_engine::plan::Plan;
use refract_jobservice::Job;
use refract_observability::insights::Insights;
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::job_state::Enum as JobState;
use refract_proto::pipeline::Pipeline;
use refract_proto::prost_types;
use refract_translate::{state_compatibility, translate, EnvironmentPreference};

use super::job_options::JobOptions;
use crate::options::option_string;

/// What the new job takes over: the old job's cut, as checkpoint parts.
pub(super) type HandedOver = Arc<Vec<(String, Bytes)>>;

/// The job a submission with `options` replaces, out of the jobs that have
/// not ended (`live`), once `pipeline` is found able to take over what it
/// holds; `None` without `--update`. The error names what is wrong, and
/// the running job runs on.
pub(super) fn replaced_job(
    live: &[Arc<Job>],
    pipeline: &Pipeline,
    options: &prost_types::Struct,
    preference: &EnvironmentPreference,
) -> Result<Option<Arc<Job>>, String> {
    let asked = JobOptions::read(options)?;
    if !asked.update {
        return Ok(None);
    }
    let Some(name) = option_string(options, "job_name") else {
        return Err(
            "--update replaces the running job of the same --job_name, and the \
                    submission names none"
                .into(),
        );
    };
    if asked.savepoint.is_some() {
        return Err(
            "--update starts from the running job's state; it cannot start from a \
                    savepoint (refract_savepoint) too"
                .into(),
        );
    }
    // Running (or starting) jobs only: one prepared and never run has
    // nothing to hand over.
    let mut named = live.iter().filter(|j| {
        matches!(j.state(), JobState::Running | JobState::Starting)
            && option_string(j.options(), "job_name").as_deref() == Some(name.as_str())
    });
    let old = match (named.next(), named.next()) {
        (Some(old), None) => old,
        (None, _) => {
            return Err(format!(
                "--update: no running job has --job_name={name}; submit without --update to \
                 start one"
            ))
        }
        (Some(a), Some(b)) => {
            return Err(format!(
                "--update: jobs {} and {} both run with --job_name={name}; cancel one first",
                a.id(),
                b.id()
            ))
        }
    };
    let running = JobOptions::read(old.options())?;
    check_shards(old, &running, &asked)?;
    let old_plan = plan(old.pipeline(), &running, preference)?;
    let new_plan = plan(pipeline, &asked, preference)?;
    let moves_shards = running.shards.map(|l| l.shards()) != asked.shards.map(|l| l.shards());
    let stage_names = |plan: &Plan| {
        plan.stages
            .iter()
            .map(|s| s.name.clone())
            .collect::<Vec<_>>()
    };
    if moves_shards && stage_names(&old_plan) != stage_names(&new_plan) {
        return Err(format!(
            "--update of job {} is refused: its state moves to another number of shards only \
             into the same pipeline, fused the same way; change the pipeline and the number \
             of shards one after the other",
            old.id()
        ));
    }
    let mut refusals = check_update(&old_plan, &new_plan, &asked.transform_name_mapping)
        .err()
        .unwrap_or_default();
    refusals.extend(state_compatibility(
        old.pipeline(),
        pipeline,
        &asked.transform_name_mapping,
    ));
    if !refusals.is_empty() {
        return Err(format!(
            "--update of job {} is refused, and it runs on: {}",
            old.id(),
            refusals.join("; ")
        ));
    }
    Ok(Some(old.clone()))
}

/// The plan `pipeline` runs as with `options`: fused as its job fuses it.
fn plan(
    pipeline: &Pipeline,
    options: &JobOptions,
    preference: &EnvironmentPreference,
) -> Result<Plan, String> {
    let translation = options.translation(String::new(), "update".into(), preference.clone());
    translate(pipeline, &translation)
        .map(|t| t.plan)
        .map_err(|e| e.to_string())
}

/// Whether the job on `old` (run with `running`) can hand its state to a
/// job run with `asked`: a job on shards hands over an epoch, which needs
/// its checkpoints on; its state moves onto another number of shards (one
/// engine among them), but not with transforms renamed at the same time.
fn check_shards(old: &Job, running: &JobOptions, asked: &JobOptions) -> Result<(), String> {
    let refused = |why: &str| Err(format!("--update of job {} is refused: {why}", old.id()));
    let count = |o: &JobOptions| o.shards.map_or(1, |l| l.shards());
    if running.shards.is_some() && !old.is_durable() {
        return refused(
            "it runs on several shards (refract_shards) and is not checkpointed; a job on \
             shards is updated only on a server with --state_dir",
        );
    }
    if count(running) != count(asked) && !asked.transform_name_mapping.is_empty() {
        return refused(
            "it would move to another number of shards and rename transforms at once; \
             do one, then the other",
        );
    }
    Ok(())
}

/// Takes over from `old` for `job`: claims it, stops it right after a
/// savepoint taken in memory (it ends `UPDATED`), and returns the cut.
pub(super) async fn take_over(
    insights: &Insights,
    job: &Arc<Job>,
    old: &Arc<Job>,
) -> Result<HandedOver, String> {
    if !old.claim_replacement(job.id()) {
        return Err(format!(
            "job {} is being replaced by job {} already",
            old.id(),
            old.replaced_by().unwrap_or_default()
        ));
    }
    let cut = match insights.job(old.id()) {
        Some(view) => view.savepoint(true).await,
        None => Err(format!("job {} is not running", old.id())),
    };
    let parts = cut.map_err(|e| {
        // Not taken over: the old job ends as it would have.
        old.release_replacement(job.id());
        format!("cannot take over from job {}: {e}", old.id())
    })?;
    old.message(
        MessageImportance::JobMessageBasic,
        format!("updated: job {} goes on from here", job.id()),
    );
    job.message(
        MessageImportance::JobMessageBasic,
        format!("takes over from job {}, which it updates", old.id()),
    );
    Ok(Arc::new(parts))
}
