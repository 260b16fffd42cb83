//! A Beam worker pool that starts each SDK worker by running a boot
//! program: the other side of EXTERNAL environments, for hosts that have an
//! SDK's boot program but no pool of their own.
//!
//! A runner that wants a worker on a remote host calls `StartWorker` of the
//! host's `BeamFnExternalWorkerPool` service with the worker's id and the
//! runner's Fn API endpoints. Beam's Python container answers that itself
//! (`--worker_pool`); its Java and Go containers have only their boot
//! program, which fetches the job's options and staged files from the
//! runner's provision and artifact services and then runs the harness. This
//! pool runs that program once per `StartWorker` (`BOOT --id=ID
//! --provision_endpoint=... --semi_persist_dir=DIR`), one process group per
//! worker, and kills the group on `StopWorker`, when the pool stops, or when
//! the runner starts a worker under an id already running (a restarted
//! runner reuses its ids).
//!
//! Whoever reaches the pool's port can have it run the boot program against
//! a provision service of their choosing, and so run code: bind it to an
//! address only the runner's network reaches, and give the pool and its
//! servers tokens ([`crate::PoolCallers`]), one of which every call must
//! carry. A caller stops and replaces only the workers it started, named by
//! their ids, which Refract's servers make unguessable. `max_workers`
//! bounds how many processes one pool holds, and a worker whose runner
//! stops answering is stopped ([`runner_watch`]), so that workers of a
//! runner that is gone do not hold the pool's places forever.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use refract_proto::fn_api::beam_fn_external_worker_pool_server::{
    BeamFnExternalWorkerPool, BeamFnExternalWorkerPoolServer,
};
use refract_proto::fn_api::{
    StartWorkerRequest, StartWorkerResponse, StopWorkerRequest, StopWorkerResponse,
};
use refract_proto::pipeline::ApiServiceDescriptor;
use tokio::net::TcpListener;
use tokio::process::Command;
use tonic::{Request, Response, Status};

use crate::environment::child::{scratch_dir, ChildWorker};
use crate::error::HarnessError;
use crate::pool_token::{PoolCaller, PoolCallers};

mod runner_watch;

/// The longest worker id accepted: ids name directories and log fields.
const MAX_WORKER_ID_LEN: usize = 200;

/// What a boot-program pool runs and how many workers it may hold.
#[derive(Debug, Clone)]
pub struct BootPoolConfig {
    /// The SDK's boot program (in Beam's images, `/opt/apache/beam/boot`).
    pub boot: PathBuf,
    /// Workers running at once; `StartWorker` beyond it is refused.
    pub max_workers: usize,
    /// Which users of this host may call the pool: a caller chooses what
    /// the boot program runs.
    pub local_peers: refract_peercred::LocalPeers,
    /// The callers' tokens, one of which every call must carry
    /// (`--token_file`); without them, any caller the port admits is
    /// served, as one caller.
    pub callers: Option<PoolCallers>,
    /// How long a worker's runner may go without answering before the
    /// worker is stopped (`None`: never).
    pub runner_timeout: Option<Duration>,
}

/// One running worker, with a number telling it from a later worker that
/// reuses its id.
struct Running {
    generation: u64,
    worker: ChildWorker,
    /// Who asked for it: only they may stop or replace it.
    caller: PoolCaller,
    /// The runner it works for (its provision endpoint), if the pool can
    /// dial that address to see whether the runner still answers.
    runner: Option<String>,
    /// When it was started: a runner counts as answering then.
    started: Instant,
}

/// The pool's `BeamFnExternalWorkerPool` service.
pub struct BootPool {
    config: BootPoolConfig,
    workers: Arc<Mutex<Workers>>,
}

#[derive(Default)]
struct Workers {
    running: HashMap<String, Running>,
    /// Workers whose boot program is being spawned.
    starting: usize,
    next_generation: u64,
}

/// Worker `id` runs for another caller of the pool, which only that caller
/// may stop or replace.
struct OtherCallersWorker;

impl Workers {
    /// Takes worker `id` out of the running ones if `caller` started it
    /// (`None` if no worker has that id); another caller's stays.
    fn take_own(
        &mut self,
        id: &str,
        caller: PoolCaller,
    ) -> Result<Option<Running>, OtherCallersWorker> {
        match self.running.get(id) {
            Some(running) if running.caller != caller => Err(OtherCallersWorker),
            Some(_) => Ok(self.running.remove(id)),
            None => Ok(None),
        }
    }
}

/// The refusal of a `StartWorker` for an id another caller's worker holds.
fn held_by_another_caller(id: &str) -> String {
    format!("worker {id} is running for another caller of this pool")
}

impl BootPool {
    /// A pool running `config.boot`; fails if that is not an executable
    /// file, so a typo shows at start-up rather than at the first job.
    pub fn new(config: BootPoolConfig) -> Result<Self, HarnessError> {
        check_executable(&config.boot)?;
        Ok(Self {
            config,
            workers: Arc::default(),
        })
    }

    /// Serves the pool on `listener` until `shutdown` resolves, then stops
    /// every worker it started.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), HarnessError> {
        let workers = Arc::clone(&self.workers);
        let watch = self
            .config
            .runner_timeout
            .map(|timeout| tokio::spawn(runner_watch::run(Arc::clone(&workers), timeout)));
        let incoming = refract_peercred::PeerGate::new(self.config.local_peers, "worker pool")
            .admitted(listener);
        let served = tonic::transport::Server::builder()
            .add_service(BeamFnExternalWorkerPoolServer::new(self))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        if let Some(watch) = watch {
            watch.abort();
        }
        let left: Vec<ChildWorker> = workers
            .lock()
            .running
            .drain()
            .map(|(_, r)| r.worker)
            .collect();
        futures::future::join_all(left.into_iter().map(ChildWorker::stop)).await;
        served.map_err(|e| HarnessError::PoolServer(e.to_string()))
    }

    /// Starts one worker for `caller`, replacing a running one with the
    /// same id that the same caller started.
    async fn start(&self, caller: PoolCaller, request: StartWorkerRequest) -> Result<(), String> {
        let id = request.worker_id;
        check_worker_id(&id)?;
        let endpoint = |name: &str, e: Option<ApiServiceDescriptor>| {
            e.map(|d| d.url)
                .filter(|url| !url.is_empty())
                .ok_or_else(|| format!("the request names no {name} endpoint"))
        };
        let provision = endpoint("provision", request.provision_endpoint)?;
        let control = endpoint("control", request.control_endpoint)?;
        // Boot programs ask the provision service for the others; pass
        // what the request has, or the provision service's address.
        let logging =
            endpoint("logging", request.logging_endpoint).unwrap_or_else(|_| provision.clone());
        let artifact =
            endpoint("artifact", request.artifact_endpoint).unwrap_or_else(|_| provision.clone());

        let replaced = self
            .workers
            .lock()
            .take_own(&id, caller)
            .map_err(|_| held_by_another_caller(&id))?;
        if let Some(old) = replaced {
            tracing::info!(worker_id = %id, "a worker with this id is running; stopping it first");
            old.worker.stop().await;
        }
        {
            // Counted before the spawn, so that concurrent requests cannot
            // start more than the maximum between them.
            let mut workers = self.workers.lock();
            if workers.running.len() + workers.starting >= self.config.max_workers {
                return Err(format!(
                    "this pool already runs its maximum of {} workers",
                    self.config.max_workers
                ));
            }
            workers.starting += 1;
        }
        let spawned = self.spawn(&id, &provision, &control, &logging, &artifact);
        let mut workers = self.workers.lock();
        workers.starting -= 1;
        let worker = spawned?;
        // Another request for this id may have started a worker meanwhile:
        // this caller's own is replaced, another caller's stays (and this
        // one goes).
        let raced = match workers.take_own(&id, caller) {
            Ok(raced) => raced,
            Err(OtherCallersWorker) => {
                drop(workers);
                tokio::spawn(worker.stop());
                return Err(held_by_another_caller(&id));
            }
        };
        let mut exit = worker.exit_watch();
        workers.next_generation += 1;
        let generation = workers.next_generation;
        let running = Running {
            generation,
            worker,
            caller,
            runner: runner_watch::dialable(&provision),
            started: Instant::now(),
        };
        workers.running.insert(id.clone(), running);
        drop(workers);
        if let Some(raced) = raced {
            tokio::spawn(raced.worker.stop());
        }
        // Forget the worker once it has ended by itself.
        let workers = Arc::clone(&self.workers);
        tokio::spawn(async move {
            let ended = exit
                .wait_for(|report| report.is_some())
                .await
                .ok()
                .and_then(|r| r.clone());
            let mut workers = workers.lock();
            if workers
                .running
                .get(&id)
                .is_some_and(|r| r.generation == generation)
            {
                workers.running.remove(&id);
                if let Some(report) = ended {
                    tracing::info!(worker_id = %id, status = %report.status, "worker ended");
                }
            }
        });
        Ok(())
    }

    /// Runs the boot program for worker `id`.
    fn spawn(
        &self,
        id: &str,
        provision: &str,
        control: &str,
        logging: &str,
        artifact: &str,
    ) -> Result<ChildWorker, String> {
        let scratch =
            scratch_dir(id).map_err(|e| format!("cannot make a scratch directory: {e}"))?;
        let mut command = Command::new(&self.config.boot);
        command.args([
            format!("--id={id}"),
            format!("--provision_endpoint={provision}"),
            format!("--control_endpoint={control}"),
            format!("--logging_endpoint={logging}"),
            format!("--artifact_endpoint={artifact}"),
            format!("--semi_persist_dir={}", scratch.display()),
        ]);
        tracing::info!(worker_id = %id, boot = %self.config.boot.display(), %provision, "starting worker");
        ChildWorker::spawn_with_scratch(id, command, scratch).map_err(|e| e.to_string())
    }
}

#[tonic::async_trait]
impl BeamFnExternalWorkerPool for BootPool {
    async fn start_worker(
        &self,
        request: Request<StartWorkerRequest>,
    ) -> Result<Response<StartWorkerResponse>, Status> {
        let caller = self.caller(&request)?;
        let request = request.into_inner();
        let id = request.worker_id.clone();
        let error = match self.start(caller, request).await {
            Ok(()) => String::new(),
            Err(error) => {
                tracing::warn!(worker_id = %id, %error, "cannot start worker");
                error
            }
        };
        Ok(Response::new(StartWorkerResponse { error }))
    }

    async fn stop_worker(
        &self,
        request: Request<StopWorkerRequest>,
    ) -> Result<Response<StopWorkerResponse>, Status> {
        let caller = self.caller(&request)?;
        let id = request.into_inner().worker_id;
        let running = match self.workers.lock().take_own(&id, caller) {
            Ok(running) => running,
            Err(OtherCallersWorker) => {
                // Answered as for an id that is not running: another
                // caller's workers are not this caller's business.
                tracing::warn!(worker_id = %id, "StopWorker for another caller's worker: ignored");
                None
            }
        };
        if let Some(running) = running {
            tracing::info!(worker_id = %id, "stopping worker");
            running.worker.stop().await;
        }
        Ok(Response::new(StopWorkerResponse {
            error: String::new(),
        }))
    }
}

impl BootPool {
    /// Which caller made `request`: the one whose token it carries, or
    /// [`PoolCaller::ANYONE`] for a pool without tokens.
    #[allow(clippy::result_large_err)]
    fn caller<T>(&self, request: &Request<T>) -> Result<PoolCaller, Status> {
        match &self.config.callers {
            Some(callers) => callers.identify(request.metadata()),
            None => Ok(PoolCaller::ANYONE),
        }
    }
}

/// Worker ids become directory names and log fields: printable ASCII of a
/// bounded length, as every runner makes them.
fn check_worker_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("the request names no worker id".to_string());
    }
    if id.len() > MAX_WORKER_ID_LEN {
        return Err(format!(
            "worker ids are at most {MAX_WORKER_ID_LEN} characters"
        ));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
    {
        return Err(format!(
            "worker id {id:?} has characters other than letters, digits and -_.:"
        ));
    }
    Ok(())
}

fn check_executable(path: &std::path::Path) -> Result<(), HarnessError> {
    let refuse = |reason: String| HarnessError::BootProgram {
        path: path.display().to_string(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_file() {
        return Err(refuse("not a file".to_string()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(refuse("not executable".to_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
