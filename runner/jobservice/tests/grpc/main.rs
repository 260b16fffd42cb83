//! End-to-end tests of the job service over real gRPC, with the generated
//! tonic clients playing the SDK.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

#[path = "../../../../sdk-harness/tests/beam_python/mod.rs"]
mod beam_python;
mod harness;
mod lifecycle;
mod python;
mod staging;
