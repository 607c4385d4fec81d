//! Ichor's hands on Talos (feature `io`): the gRPC API subset, the talosconfig, the client,
//! and observation of a fleet. The simulated fleet that serves the same API is `sim::talos`.
//!
//! Start at `config::TalosConfig` (reading a talosconfig), then `client::Client` (one channel
//! per endpoint, a deadline per call, errors as the planner needs them), and `observe` (a fleet at
//! bounded concurrency). `proto` is generated.

pub mod client;
pub mod config;
pub mod observe;
pub mod proto;
