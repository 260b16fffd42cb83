//! The exchange between a job's engine shards over gRPC.
//!
//! The engine's shards speak the frame protocol
//! (`refract_engine::shards::peer`): each shard sends every other one an
//! ordered stream of frames (elements, watermarks, checkpoint cuts), and
//! reports to a quiet detector when it parks. This crate carries that
//! protocol between processes:
//!
//! * [`codec`]: frames, reports and notes as protobuf messages
//!   (`proto/refract/exchange/v1/exchange.proto`), large deliveries cut
//!   into chunks;
//! * [`wire`]: the sending side, one stream per pair of shards, with
//!   credit-based flow control (a receiver gives credit back as its engine
//!   takes what it was sent; a sender past its window holds back its
//!   producers);
//! * [`server`]: the receiving side, a gRPC service that admits a stream
//!   only for a session it hosts, named by a random secret;
//! * [`session`]: what a process hosts of one job run's session;
//! * [`join`]: a process's shards joining a session;
//! * [`listener`]: the server a process's shards are reached at;
//! * [`connection`]: how connections are made: pings, so that a peer
//!   whose host went away or whose link was cut is noticed within
//!   seconds, and HTTP/2 windows above the exchange's credit;
//! * [`loopback`]: a whole session in one process over the loopback
//!   interface.
//!
//! The order of frames on one stream is what keeps watermarks honest
//! across processes, so each pair of shards has exactly one stream, and a
//! second one is refused.

pub mod codec;
pub mod connection;
pub mod error;
pub mod join;
pub mod listener;
pub mod loopback;
pub mod server;
pub mod session;
pub mod wire;

pub use error::ExchangeError;
pub use join::{join_session, Joining};
pub use listener::ExchangeServer;
pub use loopback::LoopbackExchange;
pub use wire::DEFAULT_WINDOW_BYTES;
