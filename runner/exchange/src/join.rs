//! Joining a session: the shards of a job run that live in this process
//! become hosted ends of it, sending along the session's routes. A
//! process hosting every shard (the loopback exchange) and processes each
//! hosting some (shards on several hosts) join the same way.

use std::sync::Arc;

use refract_engine::shards::{ShardId, ShardLayout, ShardLink};

use crate::server::ExchangeHost;
use crate::session::{CreditRoutes, HostedSession, LocalShard, SessionKey};
use crate::wire::{local_end, Routes};

/// What a process brings to a session.
#[derive(Debug)]
pub struct Joining<'a> {
    /// The session's secret.
    pub key: &'a SessionKey,
    /// The job run's shards.
    pub layout: ShardLayout,
    /// The shards that live in this process.
    pub local: &'a [ShardId],
    /// Where each shard, and the quiet detector, is reached.
    pub routes: &'a Routes,
    /// Credit per outbound stream, in bytes.
    pub window: usize,
    /// Whether this process runs the session's quiet detector.
    pub detector: bool,
}

/// Hosts `joining`'s local shards on `host` and opens their streams:
/// their links, in the order of `joining.local`. In a Tokio runtime. The
/// session stays hosted until [`ExchangeHost::remove`] of its key.
pub fn join_session(host: &ExchangeHost, joining: Joining<'_>) -> Vec<ShardLink> {
    let Joining {
        key,
        layout,
        local,
        routes,
        window,
        detector,
    } = joining;
    let mut ends = Vec::new();
    let mut hosted = Vec::new();
    let mut unopened = Vec::new();
    for &id in local {
        let credit = Arc::new(CreditRoutes::new(layout.shards() as usize));
        let (end, streams) = local_end(id, layout, key, routes, window, credit.clone());
        unopened.push(streams);
        hosted.push((
            id,
            LocalShard {
                end: Arc::downgrade(&end),
                credit,
            },
        ));
        ends.push(end);
    }
    // Hosted before any stream opens, so that a peer's stream to a shard
    // here finds it (a peer's streams that come earlier are tried again).
    host.insert(
        key.clone(),
        Arc::new(HostedSession::new(layout, hosted, detector)),
    );
    for streams in unopened {
        streams.open();
    }
    ends.iter().map(|end| end.link(layout)).collect()
}
