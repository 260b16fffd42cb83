//! Stops the workers whose runner has stopped answering.
//!
//! A pool's place is held from `StartWorker` until `StopWorker` or the
//! worker's exit. A runner that is gone (its host crashed, or the network
//! between them was cut) sends no `StopWorker`, and its workers need not
//! exit: a boot program waiting on the runner's provision service, or a
//! harness waiting on its control stream, can wait forever on a connection
//! whose other end vanished without a word. A live runner stops the
//! workers that never connect itself (Refract's servers do, after their
//! connect timeout); what only the pool can notice is a runner that no
//! longer answers at all.
//!
//! So the pool asks each runner with running workers, every quarter of the
//! timeout, a gRPC call it need not serve (the standard health check): any
//! gRPC answer, an error status included, shows that the runner's server
//! is alive. Workers whose runner has not answered for the whole timeout
//! are stopped, and their places freed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tonic::transport::Endpoint;

use super::{Running, Workers};

/// The call made to see whether a runner answers: gRPC's standard health
/// check, which a server that does not offer it answers `UNIMPLEMENTED`.
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// The longest a single probe may take, however long the timeout.
const PROBE_LIMIT: Duration = Duration::from_secs(10);

/// The address the pool dials to probe the runner at `endpoint` (a
/// worker's provision endpoint), or `None` when it is not one the pool can
/// dial (such a runner's workers are not watched).
pub(super) fn dialable(endpoint: &str) -> Option<String> {
    let uri = refract_proto::endpoint::endpoint_uri(endpoint);
    match Endpoint::from_shared(uri.clone()) {
        Ok(_) if uri.starts_with("http://") || uri.starts_with("https://") => Some(uri),
        _ => {
            tracing::warn!(%endpoint, "the worker's runner cannot be watched: not an address this pool dials");
            None
        }
    }
}

/// How often runners are probed for a `timeout`: four times within it, at
/// most every 15 s and at least every second.
fn probe_interval(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(15))
}

/// Probes the runners of `workers` until aborted, stopping the workers of
/// runners silent for `timeout`.
pub(super) async fn run(workers: Arc<Mutex<Workers>>, timeout: Duration) {
    let every = probe_interval(timeout);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_answer: HashMap<String, Instant> = HashMap::new();
    loop {
        ticks.tick().await;
        let runners: HashSet<String> = workers
            .lock()
            .running
            .values()
            .filter_map(|running| running.runner.clone())
            .collect();
        last_answer.retain(|runner, _| runners.contains(runner));
        let limit = every.min(PROBE_LIMIT);
        let probes = runners.into_iter().map(|runner| async move {
            let answered = answers(&runner, limit).await;
            (runner, answered)
        });
        for (runner, answered) in futures::future::join_all(probes).await {
            if answered {
                last_answer.insert(runner, Instant::now());
            }
        }
        let silent = take_silent(&workers, &last_answer, timeout, Instant::now());
        for (id, running) in silent {
            tracing::warn!(
                worker_id = %id,
                runner = running.runner.as_deref().unwrap_or_default(),
                ?timeout,
                "the worker's runner has not answered for the runner timeout: stopping the worker"
            );
            tokio::spawn(running.worker.stop());
        }
    }
}

/// Takes out of `workers` those whose runner has not answered (nor the
/// worker started) within `timeout` before `now`.
fn take_silent(
    workers: &Mutex<Workers>,
    last_answer: &HashMap<String, Instant>,
    timeout: Duration,
    now: Instant,
) -> Vec<(String, Running)> {
    let mut workers = workers.lock();
    let silent: Vec<String> = workers
        .running
        .iter()
        .filter(|(_, running)| {
            let Some(runner) = &running.runner else {
                return false;
            };
            let heard = last_answer
                .get(runner)
                .map_or(running.started, |answer| (*answer).max(running.started));
            now.saturating_duration_since(heard) >= timeout
        })
        .map(|(id, _)| id.clone())
        .collect();
    silent
        .into_iter()
        .filter_map(|id| workers.running.remove(&id).map(|running| (id, running)))
        .collect()
}

/// Whether the runner at `uri` gives any gRPC answer within `limit`.
async fn answers(uri: &str, limit: Duration) -> bool {
    tokio::time::timeout(limit, probe(uri, limit))
        .await
        .unwrap_or(false)
}

async fn probe(uri: &str, limit: Duration) -> bool {
    let Ok(endpoint) = Endpoint::from_shared(uri.to_string()) else {
        return false;
    };
    let Ok(channel) = endpoint.connect_timeout(limit).connect().await else {
        return false;
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    if grpc.ready().await.is_err() {
        return false;
    }
    let call = grpc.unary(
        tonic::Request::new(()),
        tonic::codegen::http::uri::PathAndQuery::from_static(HEALTH_CHECK),
        tonic::codec::ProstCodec::<(), ()>::default(),
    );
    match call.await {
        Ok(_) => true,
        // A status the server sent has no source; one made on this side
        // from a broken connection has the transport's error as its source.
        Err(status) => std::error::Error::source(&status).is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runners_are_probed_four_times_per_timeout_within_bounds() {
        assert_eq!(
            probe_interval(Duration::from_secs(60)),
            Duration::from_secs(15)
        );
        assert_eq!(
            probe_interval(Duration::from_secs(8)),
            Duration::from_secs(2)
        );
        assert_eq!(
            probe_interval(Duration::from_millis(100)),
            Duration::from_secs(1)
        );
        assert_eq!(
            probe_interval(Duration::from_secs(3600)),
            Duration::from_secs(15)
        );
    }

    #[test]
    fn only_addresses_the_pool_dials_are_watched() {
        assert_eq!(
            dialable("127.0.0.1:4000").as_deref(),
            Some("http://127.0.0.1:4000")
        );
        assert_eq!(
            dialable("http://runner:4000").as_deref(),
            Some("http://runner:4000")
        );
        assert_eq!(dialable("unix:///tmp/fn.sock"), None);
    }
}
