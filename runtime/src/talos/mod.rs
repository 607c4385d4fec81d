//! Ichor's hands on Talos (feature `io`): the gRPC API subset, the talosconfig, the client,
//! observation of a fleet, and a simulated fleet that serves the same API for tests and demos.
//!
//! Start at `config::TalosConfig` (reading a talosconfig), then `client::Client` (one channel
//! per endpoint, a deadline per call, errors as the planner needs them), `observe` (a fleet at
//! bounded concurrency), and `sim::Fleet` (the fixture). `proto` is generated.

pub mod client;
pub mod config;
pub mod observe;
pub mod proto;
pub mod sim;
pub mod tls;
