//! Two processes' worth of a session (two exchange servers, each hosting
//! one shard, the first also the quiet detector), every connection between
//! them through a TCP relay the test controls. Frames cross while the
//! relay forwards; once it stops forwarding without closing anything, as a
//! cut link or a vanished host does, both shards' runs are failed by the
//! pings of `connection`, not left waiting on a quiet peer.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use refract_engine::plan::PCollectionIdx;
use refract_engine::shards::exchange::Delivery;
use refract_engine::shards::{ShardId, ShardLayout, ShardLink};
use refract_exchange::connection::{channel_to, DETECTION_BOUND};
use refract_exchange::session::SessionKey;
use refract_exchange::wire::Routes;
use refract_exchange::{join_session, ExchangeServer, Joining};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP relay to one address that can stop forwarding: bytes then go
/// nowhere, and no connection is closed.
struct Relay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
}

impl Relay {
    async fn to(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let cut_flag = cut.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let outbound = TcpStream::connect(target).await.unwrap();
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                tokio::spawn(forward(in_read, out_write, cut_flag.clone()));
                tokio::spawn(forward(out_read, in_write, cut_flag.clone()));
            }
        });
        Relay { addr, cut }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until the link is cut; then reads on, dropping
/// what it reads, and keeps both sockets open.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !cut.load(Ordering::SeqCst) && to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // The peer closed: a cut link would not say so either.
    std::future::pending::<()>().await;
}

fn shard(layout: ShardLayout, n: u32) -> ShardId {
    ShardId::of(layout, n).unwrap()
}

/// Waits on `link` until its run is lost, up to `within`; why it was.
async fn lost_within(link: &ShardLink, within: Duration) -> Option<String> {
    let mut wake = link.subscribe();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(why) = link.take(1).lost {
            return Some(why);
        }
        if tokio::time::timeout_at(deadline, wake.changed())
            .await
            .is_err()
        {
            return None;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_fails_both_shards_runs_within_the_detection_bound() {
    let layout = ShardLayout::new(2).unwrap();
    let (zero, one) = (shard(layout, 0), shard(layout, 1));
    let first = ExchangeServer::bind("127.0.0.1:0").await.unwrap();
    let second = ExchangeServer::bind("127.0.0.1:0").await.unwrap();
    // Each side reaches the other only through a relay.
    let to_second = Relay::to(second.addr()).await;
    let to_first = Relay::to(first.addr()).await;
    let key = SessionKey::random().unwrap();
    let first_routes = Routes {
        shards: vec![
            channel_to(first.addr()).unwrap(),
            channel_to(to_second.addr).unwrap(),
        ],
        detector: channel_to(first.addr()).unwrap(),
    };
    let second_routes = Routes {
        shards: vec![
            channel_to(to_first.addr).unwrap(),
            channel_to(second.addr()).unwrap(),
        ],
        detector: channel_to(to_first.addr).unwrap(),
    };
    let (on_first, on_second) = ([zero], [one]);
    let joining = |local, routes, detector| Joining {
        key: &key,
        layout,
        local,
        routes,
        window: 64 << 10,
        detector,
    };
    let link0 = join_session(first.host(), joining(&on_first, &first_routes, true)).remove(0);
    let link1 = join_session(second.host(), joining(&on_second, &second_routes, false)).remove(0);

    // Across the relays, both ways.
    let delivery = |byte| Delivery::new(PCollectionIdx::new(1), false, Bytes::from(vec![byte]));
    link0.send([(one, delivery(1))]);
    link1.send([(zero, delivery(2))]);
    for (link, want) in [(&link1, 1u8), (&link0, 2u8)] {
        let mut wake = link.subscribe();
        let arrived = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let taken = link.take(1);
                assert!(taken.lost.is_none(), "{:?}", taken.lost);
                if let Some(handed) = taken.deliveries.first() {
                    return handed.delivery.parts().2.clone();
                }
                wake.changed().await.unwrap();
            }
        })
        .await
        .expect("a delivery crosses the relay");
        assert_eq!(arrived.as_ref(), [want]);
    }

    to_second.cut();
    to_first.cut();
    // Pings every few seconds: a bound of its own, plus room for a loaded
    // machine, and within the 15 s a lost shard must be noticed in.
    let within = DETECTION_BOUND + Duration::from_secs(5);
    let why0 = lost_within(&link0, within).await;
    let why1 = lost_within(&link1, within).await;
    assert!(why0.is_some(), "shard 0 was not told its peer is gone");
    assert!(why1.is_some(), "shard 1 was not told its peer is gone");
}
