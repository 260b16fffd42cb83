//! Starting a job's SDK workers: a set per environment its stages use,
//! each with a way to start replacements for workers that die.

use std::collections::HashMap;
use std::sync::Arc;

use refract_jobservice::Job;
use refract_observability::insights::JobView;
use refract_pools::{pool_need, pooled_environment, PoolDirectory, PoolNeed, WorkerPools};
use refract_proto::fn_api::ProvisionInfo;
use refract_proto::pipeline::Environment;
use refract_proto::prost_types;
use refract_sdk_harness::{FnApiServer, HarnessError, WorkerConfig};

use super::logs::{JobArtifacts, JobLogs, TransformOrigins};
use crate::options::option_count;
use crate::worker_set::{BundlesPerWorker, Target, WorkerFactory, WorkerSet};

/// How long starting a pooled worker waits for a live pool.
const POOL_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The most SDK workers per environment a job may ask for: each is a
/// process (a Python worker holds ~100 MB), so a client asking for
/// thousands would take the machine down. Refused at submission.
pub(super) const MAX_WORKERS_PER_ENVIRONMENT: usize = 128;

/// The job's `sdk_worker_parallelism`, if it set one: a whole number
/// from 0 (let the runner choose) to [`MAX_WORKERS_PER_ENVIRONMENT`],
/// else an error naming the option.
pub(super) fn job_worker_parallelism(
    options: &prost_types::Struct,
) -> Result<Option<usize>, String> {
    match option_count(options, "sdk_worker_parallelism")? {
        Some(n) if n > MAX_WORKERS_PER_ENVIRONMENT => Err(format!(
            "--sdk_worker_parallelism={n}: at most {MAX_WORKERS_PER_ENVIRONMENT} SDK workers \
             per environment (0 lets the runner choose)"
        )),
        asked => Ok(asked),
    }
}

/// How many SDK workers a job's environments get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WorkerCounts {
    /// Per environment started on this host.
    pub(super) local: usize,
    /// Per environment started on remote pools, if the job or the operator
    /// chose a count; else as many as the pools' capacity.
    pub(super) pooled: Option<usize>,
}

impl WorkerCounts {
    /// The counts for a job whose `sdk_worker_parallelism` option is
    /// `job`, on a server whose own count is `server_default` (its flag,
    /// or one per core) and that the operator set to `server_asked`, if
    /// they did.
    ///
    /// More than one is the job's choice and holds everywhere; 0 lets the
    /// server choose. Python sends 1 unless told otherwise, so a job's 1
    /// cannot be told from no choice at all: it stands unless the operator
    /// chose a count for the server, which then holds for local and
    /// pooled environments alike.
    pub(super) fn choose(
        job: Option<usize>,
        server_default: usize,
        server_asked: Option<usize>,
    ) -> Self {
        match job {
            Some(n) if n > 1 => WorkerCounts {
                local: n,
                pooled: Some(n),
            },
            Some(1) => WorkerCounts {
                local: server_asked.unwrap_or(1),
                pooled: server_asked,
            },
            _ => WorkerCounts {
                local: server_default.max(1),
                pooled: server_asked,
            },
        }
    }
}

/// How many workers an environment started on this host gets: `chosen`
/// (the job's or the server's count) unless nobody `asked` for one and its
/// SDK runs bundles in parallel (Java, Go), which one worker then serves
/// on every core: each more would only start another harness (in a
/// LOOPBACK job, another in the client's own JVM) for the same work.
fn local_count(chosen: usize, asked: Option<usize>, per_worker: BundlesPerWorker) -> usize {
    match (asked, per_worker) {
        (None, BundlesPerWorker::Many) => 1,
        _ => chosen,
    }
}

/// What starting a job's workers needs.
pub(super) struct WorkerStart<'a> {
    pub(super) job: &'a Arc<Job>,
    pub(super) fn_server: &'a Arc<FnApiServer>,
    /// The pipeline's environments by id.
    pub(super) environments: &'a HashMap<String, Environment>,
    /// Transform id → (stage name, unique name), for workers' log lines.
    pub(super) origins: &'a Arc<TransformOrigins>,
    pub(super) workers_per_env: usize,
    /// Workers per environment the job or the server asked for, if any;
    /// else pooled environments get as many as their pools' capacity.
    pub(super) asked_workers: Option<usize>,
    /// Remote worker pools, if the server has any.
    pub(super) pools: Option<&'a Arc<WorkerPools>>,
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
            let pooled = self
                .pools
                .and_then(|p| pool_need(environment, p.directory()).map(|need| (p, need)));
            let per_worker = BundlesPerWorker::of_capabilities(&environment.capabilities);
            let count = match pooled {
                Some((pools, need)) => self
                    .asked_workers
                    .unwrap_or_else(|| pools.directory().capacity(need).max(1)),
                None => local_count(self.workers_per_env, self.asked_workers, per_worker),
            };
            let factory = match pooled {
                Some((pools, need)) => self.pooled_factory(n, env_id, environment, pools, need),
                None => self.factory(n, env_id, environment),
            };
            // Start the environment's workers together; keep the ones that
            // came up so they are stopped even if another one failed.
            let starts = (0..count).map(|w| factory(w));
            let mut env_workers = Vec::with_capacity(count);
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
                Arc::new(move |r: usize| factory(count + r))
            };
            let mut set = WorkerSet::new(env_workers, Some(replacement_factory), per_worker);
            if let Some((pools, need)) = pooled {
                // A count asked for is kept; else the pools' capacity now,
                // which grows when a pool is added.
                let target: Target = match self.asked_workers {
                    Some(n) => Arc::new(move || n),
                    None => {
                        let directory = pools.directory().clone();
                        Arc::new(move || directory.capacity(need))
                    }
                };
                set = set.keep(target);
            }
            let set = Arc::new(set);
            if let Some((pools, _)) = pooled {
                tokio::spawn(follow_pools(
                    pools.directory().clone(),
                    Arc::downgrade(&set),
                ));
            }
            started.push(set.clone());
            self.view.add_workers(set.clone());
            if let Some(e) = failure {
                return Err(e);
            }
            workers.insert(env_id.clone(), set);
        }
        Ok(workers)
    }

    /// Starts workers of environment `env_id` (the `n`th of the job's) on
    /// the pools serving `need`: each on the least loaded live pool, and
    /// on the next one when a pool fails to start it (that pool is
    /// quarantined).
    fn pooled_factory(
        &self,
        n: usize,
        env_id: &str,
        environment: &Environment,
        pools: &Arc<WorkerPools>,
        need: PoolNeed,
    ) -> WorkerFactory {
        let start_on = self.starter(n, env_id, environment);
        let directory = pools.directory().clone();
        let environment = environment.clone();
        Arc::new(move |w: usize| {
            let (start_on, directory, environment) =
                (start_on.clone(), directory.clone(), environment.clone());
            Box::pin(async move {
                let tries = directory.pool_count(need).max(1);
                let mut last_error = None;
                for attempt in 0..tries {
                    let placement = match directory.acquire(need, POOL_WAIT).await {
                        Ok(p) => p,
                        Err(e) => {
                            return Err(last_error.unwrap_or(HarnessError::WorkerStart {
                                worker_id: format!("w{w}"),
                                reason: e.to_string(),
                            }))
                        }
                    };
                    let pooled = pooled_environment(&environment, placement.address());
                    match start_on.start(w, attempt, pooled).await {
                        Ok(worker) => {
                            placement.started(&worker);
                            return Ok(worker);
                        }
                        Err(e) => {
                            placement.failed(&e.to_string());
                            last_error = Some(e);
                        }
                    }
                }
                Err(last_error.unwrap_or(HarnessError::WorkerStart {
                    worker_id: format!("w{w}"),
                    reason: "no worker pool could start it".to_string(),
                }))
            })
        })
    }

    /// One way to start a worker of environment `env_id` (the `n`th of
    /// the job's), for the first ones and for replacements of dead ones.
    fn factory(&self, n: usize, env_id: &str, environment: &Environment) -> WorkerFactory {
        let start = self.starter(n, env_id, environment);
        Arc::new(move |w: usize| {
            let start = start.clone();
            Box::pin(async move { start.start(w, 0, start.environment.clone()).await })
        })
    }

    /// What starting any worker of environment `env_id` (the `n`th of
    /// the job's) takes.
    fn starter(&self, n: usize, env_id: &str, environment: &Environment) -> Arc<Starter> {
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
        Arc::new(Starter {
            fn_server,
            environment,
            provision,
            job,
            origins,
            prefix,
        })
    }
}

/// Tops `set` up whenever the pools change (a pool added raises the
/// target), until the set is closed or gone.
async fn follow_pools(directory: Arc<PoolDirectory>, set: std::sync::Weak<WorkerSet>) {
    loop {
        tokio::select! {
            _ = directory.changed() => {}
            // Notice a finished job's set even if the pools never change.
            _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
        }
        match set.upgrade() {
            Some(set) if set.top_up_if_short() => {}
            _ => return,
        }
    }
}

/// Starts workers of one environment of one job.
struct Starter {
    fn_server: Arc<FnApiServer>,
    environment: Environment,
    provision: ProvisionInfo,
    job: Arc<Job>,
    origins: Arc<TransformOrigins>,
    /// Worker ids are `{prefix}-w{n}` and a secret suffix.
    prefix: String,
}

impl Starter {
    /// Starts worker `w` (its `attempt`th try, on another pool after the
    /// first) in `environment`.
    async fn start(
        &self,
        w: usize,
        attempt: usize,
        environment: Environment,
    ) -> Result<Arc<refract_sdk_harness::Worker>, HarnessError> {
        // A pool that failed may still start the worker late: a new try
        // takes a new id, so that worker finds nobody waiting for it.
        let name = match attempt {
            0 => format!("{}-w{w}", self.prefix),
            a => format!("{}-w{w}-t{a}", self.prefix),
        };
        let worker_id = refract_sdk_harness::unguessable_worker_id(&name)?;
        let config = WorkerConfig {
            worker_id,
            environment,
            provision: self.provision.clone(),
            artifacts: Arc::new(JobArtifacts(self.job.clone())),
            logs: Arc::new(JobLogs {
                job: self.job.clone(),
                origins: self.origins.clone(),
            }),
        };
        self.fn_server.start_worker(config).await
    }
}

#[cfg(test)]
mod tests {
    use super::{job_worker_parallelism, local_count, WorkerCounts, MAX_WORKERS_PER_ENVIRONMENT};
    use crate::worker_set::BundlesPerWorker;
    use refract_proto::prost_types::{value::Kind, Struct, Value};

    fn asking(workers: &str) -> Struct {
        Struct {
            fields: [(
                "beam:option:sdk_worker_parallelism:v1".to_string(),
                Value {
                    kind: Some(Kind::StringValue(workers.to_string())),
                },
            )]
            .into(),
        }
    }

    #[test]
    fn a_job_may_ask_for_up_to_the_limit_and_is_refused_past_it() {
        assert_eq!(job_worker_parallelism(&Struct::default()), Ok(None));
        assert_eq!(job_worker_parallelism(&asking("0")), Ok(Some(0)));
        let limit = MAX_WORKERS_PER_ENVIRONMENT.to_string();
        assert_eq!(
            job_worker_parallelism(&asking(&limit)),
            Ok(Some(MAX_WORKERS_PER_ENVIRONMENT))
        );
        let e = job_worker_parallelism(&asking("100000")).expect_err("past the limit");
        assert!(
            e.starts_with("--sdk_worker_parallelism=100000: at most 128"),
            "{e}"
        );
        let e = job_worker_parallelism(&asking("lots")).expect_err("not a number");
        assert!(e.starts_with("--sdk_worker_parallelism=lots"), "{e}");
    }

    fn counts(local: usize, pooled: Option<usize>) -> WorkerCounts {
        WorkerCounts { local, pooled }
    }

    #[test]
    fn a_jobs_count_a_servers_flag_and_the_defaults_combine() {
        // The job chose more than one: it holds everywhere.
        assert_eq!(WorkerCounts::choose(Some(3), 2, None), counts(3, Some(3)));
        assert_eq!(
            WorkerCounts::choose(Some(3), 2, Some(2)),
            counts(3, Some(3))
        );
        // Python's default 1, on a server with no flag: one local worker,
        // the pools' capacity on pools.
        assert_eq!(WorkerCounts::choose(Some(1), 2, None), counts(1, None));
        // ... and on a server the operator gave a count: that count.
        assert_eq!(
            WorkerCounts::choose(Some(1), 4, Some(4)),
            counts(4, Some(4))
        );
        // 0 or no option: the server's choice.
        assert_eq!(WorkerCounts::choose(Some(0), 2, None), counts(2, None));
        assert_eq!(WorkerCounts::choose(None, 2, Some(2)), counts(2, Some(2)));
        assert_eq!(WorkerCounts::choose(None, 0, None), counts(1, None));
    }

    #[test]
    fn an_sdk_running_bundles_in_parallel_gets_one_local_worker_unless_asked() {
        // Java and Go: one harness serves every core.
        assert_eq!(local_count(2, None, BundlesPerWorker::Many), 1);
        // Python and TypeScript: one worker per core.
        assert_eq!(local_count(2, None, BundlesPerWorker::One), 2);
        // A count the job or the operator asked for holds for both.
        assert_eq!(local_count(3, Some(3), BundlesPerWorker::Many), 3);
        assert_eq!(local_count(3, Some(3), BundlesPerWorker::One), 3);
    }
}
