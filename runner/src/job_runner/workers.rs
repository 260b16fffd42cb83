//! Starting a job's SDK workers: a set per environment its stages use,
//! each with a way to start replacements for workers that die.

use std::collections::HashMap;
use std::sync::Arc;

use refract_jobservice::Job;
use refract_proto::fn_api::ProvisionInfo;
use refract_proto::pipeline::Environment;
use refract_sdk_harness::{FnApiServer, HarnessError, WorkerConfig};

use super::logs::{JobArtifacts, JobLogs};
use crate::insights::JobView;
use crate::worker_set::{BundlesPerWorker, WorkerFactory, WorkerSet};

/// What starting a job's workers needs.
pub(super) struct WorkerStart<'a> {
    pub(super) job: &'a Arc<Job>,
    pub(super) fn_server: &'a Arc<FnApiServer>,
    /// The pipeline's environments by id.
    pub(super) environments: &'a HashMap<String, Environment>,
    /// Transform id → (stage name, unique name), for workers' log lines.
    pub(super) origins: &'a Arc<HashMap<String, (String, String)>>,
    pub(super) workers_per_env: usize,
    pub(super) view: &'a JobView,
    /// Which attempt of the job starts them (0 for the first).
    pub(super) attempt: u32,
}

impl WorkerStart<'_> {
    /// Starts the workers of each environment in `env_ids` (the nth gets
    /// worker ids `JOB-e<n>-w<k>`, `JOB-a<attempt>-e<n>-w<k>` after the
    /// first attempt). Every set that came up is pushed to
    /// `started`, even when another failed, so that the caller stops it.
    pub(super) async fn start(
        &self,
        env_ids: &[String],
        started: &mut Vec<Arc<WorkerSet>>,
    ) -> Result<HashMap<String, Arc<WorkerSet>>, HarnessError> {
        let mut workers = HashMap::new();
        for (n, env_id) in env_ids.iter().enumerate() {
            let Some(environment) = self.environments.get(env_id) else {
                continue;
            };
            let factory = self.factory(n, env_id, environment);
            // Start the environment's workers together; keep the ones that
            // came up so they are stopped even if another one failed.
            let starts = (0..self.workers_per_env).map(|w| factory(w));
            let mut env_workers = Vec::with_capacity(self.workers_per_env);
            let mut failure = None;
            for outcome in futures::future::join_all(starts).await {
                match outcome {
                    Ok(worker) => env_workers.push(worker),
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            // Replacements are numbered after the first workers.
            let replacement_factory: WorkerFactory = {
                let factory = factory.clone();
                let first = self.workers_per_env;
                Arc::new(move |r: usize| factory(first + r))
            };
            let per_worker = BundlesPerWorker::of_capabilities(&environment.capabilities);
            let set = Arc::new(WorkerSet::new(
                env_workers,
                Some(replacement_factory),
                per_worker,
            ));
            started.push(set.clone());
            self.view.add_workers(set.clone());
            if let Some(e) = failure {
                return Err(e);
            }
            workers.insert(env_id.clone(), set);
        }
        Ok(workers)
    }

    /// One way to start a worker of environment `env_id` (the `n`th of
    /// the job's), for the first ones and for replacements of dead ones.
    fn factory(&self, n: usize, env_id: &str, environment: &Environment) -> WorkerFactory {
        let job = self.job.clone();
        let provision = ProvisionInfo {
            pipeline_options: Some(job.options().clone()),
            retrieval_token: job.id().to_string(),
            dependencies: job.artifacts().resolved_dependencies(env_id),
            metadata: [
                ("job_id".to_string(), job.id().to_string()),
                ("job_name".to_string(), job.name().to_string()),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let fn_server = self.fn_server.clone();
        let environment = environment.clone();
        let origins = self.origins.clone();
        // Worker ids are never reused, not even by a later attempt of the
        // job: the Go SDK's worker pool refuses an id it has seen.
        let prefix = match self.attempt {
            0 => format!("{}-e{n}", job.id()),
            a => format!("{}-a{a}-e{n}", job.id()),
        };
        Arc::new(move |w: usize| {
            let fn_server = fn_server.clone();
            let config = WorkerConfig {
                worker_id: format!("{prefix}-w{w}"),
                environment: environment.clone(),
                provision: provision.clone(),
                artifacts: Arc::new(JobArtifacts(job.clone())),
                logs: Arc::new(JobLogs {
                    job: job.clone(),
                    origins: origins.clone(),
                }),
            };
            Box::pin(async move { fn_server.start_worker(config).await })
        })
    }
}
