//! One side of a two-shard exchange session, for measuring the exchange
//! between two hosts (`integration/bench/exchange_link.py` runs one in
//! each of two network namespaces joined by a virtual link).
//!
//!   exchange_peer send    --listen A --sender A --receiver B --key HEX --size S --bytes N
//!   exchange_peer receive --listen B --sender A --receiver B --key HEX --size S --bytes N
//!
//! The sender hosts shard 0 and the quiet detector and sends shard 1 N
//! bytes in deliveries of S bytes, as fast as the exchange's credit lets
//! it; then it waits to be ended. The receiver hosts shard 1, takes them,
//! and prints one line of JSON: the bytes, the seconds from the first
//! delivery to the last, and its own CPU seconds in that time.

#![allow(clippy::unwrap_used, clippy::expect_used)] // what only a broken build could fail

use std::net::SocketAddr;
use std::process::exit;
use std::time::Instant;

use bytes::Bytes;
use refract_engine::plan::PCollectionIdx;
use refract_engine::shards::exchange::Delivery;
use refract_engine::shards::{ShardId, ShardLayout, ShardLink};
use refract_exchange::connection::channel_to;
use refract_exchange::session::SessionKey;
use refract_exchange::wire::Routes;
use refract_exchange::{join_session, ExchangeServer, Joining, DEFAULT_WINDOW_BYTES};

const USAGE: &str = "usage: exchange_peer send|receive --listen ADDR --sender ADDR \
                     --receiver ADDR --key HEX --size BYTES --bytes BYTES";

/// What the command line says.
struct Args {
    send: bool,
    listen: String,
    sender: SocketAddr,
    receiver: SocketAddr,
    key: String,
    size: usize,
    bytes: usize,
}

fn refuse(why: &str) -> ! {
    eprintln!("exchange_peer: {why}\n{USAGE}");
    exit(2)
}

fn parse() -> Args {
    let mut argv = std::env::args().skip(1);
    let send = match argv.next().as_deref() {
        Some("send") => true,
        Some("receive") => false,
        _ => refuse("the first argument is send or receive"),
    };
    let mut flags = std::collections::HashMap::new();
    while let Some(flag) = argv.next() {
        let value = argv
            .next()
            .unwrap_or_else(|| refuse(&format!("{flag} needs a value")));
        flags.insert(flag, value);
    }
    let mut take = |name: &str| {
        flags
            .remove(name)
            .unwrap_or_else(|| refuse(&format!("{name} is missing")))
    };
    let addr = |text: String| {
        text.parse::<SocketAddr>()
            .unwrap_or_else(|_| refuse(&format!("not an address: {text}")))
    };
    let number = |text: String| {
        text.parse::<usize>()
            .unwrap_or_else(|_| refuse(&format!("not a number: {text}")))
    };
    let args = Args {
        send,
        listen: take("--listen"),
        sender: addr(take("--sender")),
        receiver: addr(take("--receiver")),
        key: take("--key"),
        size: number(take("--size")).max(1),
        bytes: number(take("--bytes")),
    };
    if let Some(flag) = flags.keys().next() {
        refuse(&format!("unknown flag {flag}"));
    }
    args
}

/// This process's CPU seconds so far (utime + stime, in USER_HZ ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

async fn send(link: &ShardLink, to: ShardId, size: usize, bytes: usize) {
    let payload = Bytes::from(vec![7u8; size]);
    let mut wake = link.subscribe();
    for _ in 0..bytes / size {
        while link.take(0).exchange_full {
            wake.changed().await.unwrap();
        }
        link.send([(
            to,
            Delivery::new(PCollectionIdx::new(1), false, payload.clone()),
        )]);
    }
}

async fn receive(link: &ShardLink, bytes: usize) -> (f64, f64) {
    let mut wake = link.subscribe();
    let mut taken = 0;
    let mut started: Option<(Instant, f64)> = None;
    while taken < bytes {
        let received = link.take(0);
        if let Some(why) = received.lost {
            eprintln!("exchange_peer: the exchange was lost: {why}");
            exit(1);
        }
        if !received.deliveries.is_empty() && started.is_none() {
            started = Some((Instant::now(), cpu_seconds()));
        }
        taken += received
            .deliveries
            .iter()
            .map(|h| h.delivery.parts().2.len())
            .sum::<usize>();
        if taken < bytes {
            wake.changed().await.unwrap();
        }
    }
    let (at, cpu) = started.unwrap();
    (at.elapsed().as_secs_f64(), cpu_seconds() - cpu)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse();
    let layout = ShardLayout::new(2).unwrap();
    let ids: Vec<ShardId> = layout.ids().collect();
    let failed = |error: refract_exchange::ExchangeError| -> ! {
        eprintln!("exchange_peer: {error}");
        exit(1)
    };
    let server = ExchangeServer::bind(&args.listen)
        .await
        .unwrap_or_else(|e| failed(e));
    let channel = |addr| channel_to(addr).unwrap_or_else(|e| failed(e));
    let routes = Routes {
        shards: vec![channel(args.sender), channel(args.receiver)],
        detector: channel(args.sender),
    };
    let key = SessionKey::from_header(&args.key);
    let local = if args.send { &ids[..1] } else { &ids[1..] };
    let link = join_session(
        server.host(),
        Joining {
            key: &key,
            layout,
            local,
            routes: &routes,
            window: DEFAULT_WINDOW_BYTES,
            detector: args.send,
        },
    )
    .remove(0);
    if args.send {
        send(&link, ids[1], args.size, args.bytes).await;
        std::future::pending::<()>().await;
    } else {
        let (seconds, cpu) = receive(&link, args.size * (args.bytes / args.size)).await;
        println!(
            "{{\"bytes\": {}, \"seconds\": {seconds:.4}, \"cpu_seconds\": {cpu:.3}}}",
            args.bytes
        );
    }
}
