//! The exchange over real gRPC on the loopback interface: what a shard
//! sends arrives in order, whole and once; credit holds a sender back and
//! lets it go; the quiet detector answers through the server; and the
//! server refuses streams that are not its sessions', without harm to
//! the session.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::time::Duration;

use bytes::Bytes;
use refract_engine::plan::PCollectionIdx;
use refract_engine::shards::exchange::{Delivery, Parked, Received};
use refract_engine::shards::{Epoch, ShardId, ShardLayout, ShardLink};
use refract_exchange::LoopbackExchange;
use refract_proto::exchange as pb;
use refract_proto::exchange::shard_exchange_client::ShardExchangeClient;

fn layout(n: u32) -> ShardLayout {
    ShardLayout::new(n).expect("a layout")
}

fn shard(n: u32) -> ShardId {
    ShardId::of(layout(4), n).expect("a shard")
}

fn owned(bytes: Vec<u8>) -> Delivery {
    Delivery::new(PCollectionIdx::new(1), false, Bytes::from(bytes))
}

/// Takes from `link` until `done` says what arrived is enough, waiting on
/// its version between takes (up to 10 s).
async fn take_until(
    link: &ShardLink,
    stages: usize,
    mut done: impl FnMut(&Received) -> bool,
) -> Vec<Received> {
    let mut wake = link.subscribe();
    let mut taken = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let received = link.take(stages);
        let finished = done(&received);
        taken.push(received);
        if finished {
            return taken;
        }
        tokio::time::timeout_at(deadline, wake.changed())
            .await
            .expect("what was sent arrives within 10 s")
            .expect("the link is alive");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_arrive_in_order_whole_and_once_with_the_watermarks_after_them() {
    let (_exchange, links) = LoopbackExchange::start(layout(3), 64 << 10)
        .await
        .expect("an exchange");
    // 200 deliveries from shard 0 to shard 2, one of them over two
    // chunks, each followed by a watermark that held it.
    let big = vec![7u8; (1 << 20) + 5];
    for i in 0..200u32 {
        let bytes = if i == 100 {
            big.clone()
        } else {
            i.to_be_bytes().to_vec()
        };
        links[0].send([(shard(2), owned(bytes))]);
        links[0].publish([(i64::from(i), false)].into_iter());
        if i == 150 {
            links[0].cut(Epoch::from_number(1));
        }
    }
    let mut seen = Vec::new();
    let taken = take_until(&links[2], 1, |r| {
        for handed in &r.deliveries {
            let (_, _, elements) = handed.delivery.parts();
            seen.push((handed.epoch.number(), elements.clone()));
        }
        // Each take's watermark from shard 0 never passes what arrived.
        // (Shard 1 published nothing: the least is its −∞ until it does.)
        seen.len() == 200
    })
    .await;
    for (i, (epoch, elements)) in seen.iter().enumerate() {
        let want = if i == 100 {
            big.clone()
        } else {
            (i as u32).to_be_bytes().to_vec()
        };
        assert_eq!(elements.as_ref(), want.as_slice(), "delivery {i}");
        assert_eq!(*epoch, u64::from(i > 150), "delivery {i}'s epoch");
    }
    // Shard 1 publishes +∞: shard 2 now reads shard 0's watermark, which
    // is the last one sent, since every delivery before it is here.
    links[1].publish([(i64::MAX, false)].into_iter());
    let last = take_until(&links[2], 1, |r| r.watermarks.iter().next() == Some(&199)).await;
    assert!(
        last.iter().all(|r| r.deliveries.is_empty()),
        "each delivery once"
    );
    assert!(taken.iter().all(|r| r.lost.is_none()));
    assert_eq!(
        links[2].take(1).others_cut,
        Epoch::NONE,
        "shard 1 cut nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_holds_a_sender_back_until_the_receiver_takes() {
    let window = 16 << 10;
    let (_exchange, links) = LoopbackExchange::start(layout(2), window)
        .await
        .expect("an exchange");
    // Four windows' worth: the stream sends one window and queues the rest.
    for _ in 0..64 {
        links[0].send([(shard(1), owned(vec![1u8; 1024]))]);
    }
    assert!(
        links[0].take(0).exchange_full,
        "the queue is past the window"
    );
    // The receiver takes what arrived; credit flows back, more is sent.
    let mut bytes = 0;
    take_until(&links[1], 0, |r| {
        bytes += r
            .deliveries
            .iter()
            .map(|h| h.delivery.parts().2.len())
            .sum::<usize>();
        bytes == 64 * 1024
    })
    .await;
    take_until(&links[0], 0, |r| !r.exchange_full).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quiet_detector_answers_through_the_server() {
    let (_exchange, links) = LoopbackExchange::start(layout(2), 64 << 10)
        .await
        .expect("an exchange");
    links[0].send([(shard(1), owned(vec![1]))]);
    // Shard 0 parks with a TestStream event left; shard 1 parks only once
    // it has taken shard 0's delivery: then shard 0 gets its turn.
    let seen = links[0].take(0).version;
    assert_eq!(links[0].park(seen, true, false), Parked::Waiting);
    let took = take_until(&links[1], 0, |r| !r.deliveries.is_empty()).await;
    let seen1 = took.last().map(|r| r.version).unwrap_or_default();
    assert_eq!(links[1].park(seen1, false, false), Parked::Waiting);
    take_until(&links[0], 0, |r| r.turn).await;
    // Both park with nothing left: stuck, told to both.
    let seen = links[0].take(0).version;
    assert_eq!(links[0].park(seen, false, false), Parked::Waiting);
    take_until(&links[1], 0, |r| r.stuck).await;
    take_until(&links[0], 0, |r| r.stuck).await;
}

/// A raw client of the exchange's server.
async fn client(exchange: &LoopbackExchange) -> ShardExchangeClient<tonic::transport::Channel> {
    ShardExchangeClient::connect(format!("http://{}", exchange.addr()))
        .await
        .expect("the server listens")
}

fn header(session: &str, from: u32, to: u32) -> pb::FrameMessage {
    pb::FrameMessage {
        body: Some(pb::frame_message::Body::Header(pb::StreamHeader {
            session: session.into(),
            from,
            to,
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_no_session_here_are_refused_and_harm_nothing() {
    let (exchange, links) = LoopbackExchange::start(layout(2), 64 << 10)
        .await
        .expect("an exchange");
    let mut raw = client(&exchange).await;
    // No header, a wrong session, a body first: each refused.
    let refused = raw
        .frames(futures::stream::empty())
        .await
        .expect_err("no header");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    let wrong = futures::stream::iter([header("not-the-secret", 0, 1)]);
    let refused = raw.frames(wrong).await.expect_err("a wrong session");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");
    let body_first = futures::stream::iter([pb::FrameMessage {
        body: Some(pb::frame_message::Body::Cut(1)),
    }]);
    let refused = raw.frames(body_first).await.expect_err("no header first");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    let reports = futures::stream::iter([pb::ReportMessage {
        body: Some(pb::report_message::Body::Header(pb::StreamHeader {
            session: "not-the-secret".into(),
            from: 0,
            to: 0,
        })),
    }]);
    let refused = raw.reports(reports).await.expect_err("a wrong session");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");
    // The session goes on.
    links[0].send([(shard(1), owned(vec![9]))]);
    let took = take_until(&links[1], 0, |r| !r.deliveries.is_empty()).await;
    assert!(took.iter().all(|r| r.lost.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_exchange_lets_go_of_its_port() {
    let (exchange, links) = LoopbackExchange::start(layout(3), 64 << 10)
        .await
        .expect("an exchange");
    let addr = exchange.addr();
    for link in &links {
        link.publish([(1, false)].into_iter());
    }
    links[0].send([(shard(1), owned(vec![1; 100]))]);
    take_until(&links[1], 1, |r| !r.deliveries.is_empty()).await;
    // Every stream ends with its shard, so the server, which waits for
    // its calls to complete, stops; and nothing listens there any more.
    drop(links);
    tokio::time::timeout(Duration::from_secs(10), exchange.stop())
        .await
        .expect("the server stops once its shards are gone");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the exchange still listens on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
