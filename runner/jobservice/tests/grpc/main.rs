//! End-to-end tests of the job service over real gRPC, with the generated
//! tonic clients playing the SDK.

mod harness;
mod lifecycle;
mod python;
mod staging;
