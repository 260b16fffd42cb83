//! What the gRPC exchange costs per byte and per frame, without an engine
//! or an SDK in the way: two exchange servers (two processes' worth, here
//! in one), one shard each, and shard 0 sending shard 1 deliveries of one
//! size over real TCP on the loopback interface, with credit flowing back
//! as shard 1 takes them. Each benchmark is one size of delivery; its
//! throughput is in bytes, and frames per second is bytes per second over
//! the size.
//!
//!   cargo bench -p refract-exchange --bench exchange
//!
//! See docs/scaling.md.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns
#![allow(missing_docs)] // criterion_group! makes an undocumented pub fn

use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use refract_engine::plan::PCollectionIdx;
use refract_engine::shards::exchange::Delivery;
use refract_engine::shards::{ShardId, ShardLayout, ShardLink};
use refract_exchange::connection::channel_to;
use refract_exchange::session::SessionKey;
use refract_exchange::wire::Routes;
use refract_exchange::{join_session, ExchangeServer, Joining, DEFAULT_WINDOW_BYTES};

/// Bytes sent per iteration, whatever the size of a delivery.
const BYTES_PER_ITERATION: usize = 64 << 20;

/// Two servers, one shard each, every stream over TCP: the sender's link,
/// the receiver's, and the servers (kept alive).
async fn two_hosts() -> (ShardLink, ShardLink, [ExchangeServer; 2]) {
    let layout = ShardLayout::new(2).unwrap();
    let ids: Vec<ShardId> = layout.ids().collect();
    let first = ExchangeServer::bind("127.0.0.1:0").await.unwrap();
    let second = ExchangeServer::bind("127.0.0.1:0").await.unwrap();
    let routes = Routes {
        shards: vec![
            channel_to(first.addr()).unwrap(),
            channel_to(second.addr()).unwrap(),
        ],
        detector: channel_to(first.addr()).unwrap(),
    };
    let key = SessionKey::random().unwrap();
    let join = |server: &ExchangeServer, local: &[ShardId], detector| {
        join_session(
            server.host(),
            Joining {
                key: &key,
                layout,
                local,
                routes: &routes,
                window: DEFAULT_WINDOW_BYTES,
                detector,
            },
        )
        .remove(0)
    };
    let sender = join(&first, &ids[..1], true);
    let receiver = join(&second, &ids[1..], false);
    (sender, receiver, [first, second])
}

/// Sends `count` deliveries of `payload` from `sender` to shard 1, as
/// fast as credit lets it, and takes them all at `receiver`.
async fn send_and_take(sender: &ShardLink, receiver: &ShardLink, payload: &Bytes, count: usize) {
    let to = ShardId::of(sender.layout(), 1).unwrap();
    let feeding = async {
        let mut wake = sender.subscribe();
        for _ in 0..count {
            // Hold back while the exchange is full, as the engine does.
            while sender.take(0).exchange_full {
                wake.changed().await.unwrap();
            }
            let delivery = Delivery::new(PCollectionIdx::new(1), false, payload.clone());
            sender.send([(to, delivery)]);
        }
    };
    let taking = async {
        let mut wake = receiver.subscribe();
        let mut taken = 0;
        while taken < count {
            let received = receiver.take(0);
            assert!(received.lost.is_none(), "{:?}", received.lost);
            taken += received.deliveries.len();
            if taken < count {
                wake.changed().await.unwrap();
            }
        }
    };
    tokio::join!(feeding, taking);
}

fn exchange(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (sender, receiver, _servers) = runtime.block_on(two_hosts());
    let mut group = c.benchmark_group("exchange");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for size in [4 << 10, 64 << 10, 1 << 20] {
        let payload = Bytes::from(vec![7u8; size]);
        let count = BYTES_PER_ITERATION / size;
        group.throughput(Throughput::Bytes((count * size) as u64));
        group.bench_with_input(BenchmarkId::new("delivery_bytes", size), &size, |b, _| {
            b.iter(|| runtime.block_on(send_and_take(&sender, &receiver, &payload, count)))
        });
    }
    group.finish();
}

criterion_group!(benches, exchange);
criterion_main!(benches);
