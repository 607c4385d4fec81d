//! Ichor's runtime: the observed state, the facts the operation rules see, and the plan they
//! derive, as typed actions an executor performs without choosing anything.
//!
//! Start at `state::ObservedState` (the snapshot), `facts::facts` (the one function from state
//! to facts) and `plan::Planner` (evaluate, decode, check, explain); then, with feature `io`,
//! `controller::Controller` (observe, assemble, plan, execute, write status) and `exec` (the
//! executor, which performs a plan's actions and chooses nothing). The simulators live in
//! `sim` (feature `sim`), apart from the product.

pub mod admission;
pub mod assemble;
#[cfg(feature = "io")]
pub mod controller;
#[cfg(feature = "io")]
pub mod exec;
pub mod facts;
pub mod handover;
pub mod messages;
#[cfg(feature = "io")]
pub mod kube;
pub mod plan;
pub mod rbac;
#[cfg(feature = "io")]
pub mod serve;
/// The test substrate (feature `sim`): the simulated Talos fleet and its PKI, the in-memory
/// Kubernetes API and the demo stand-ins. No product module names it (a tidy test).
#[cfg(feature = "sim")]
pub mod sim;
pub mod state;
pub mod status;
#[cfg(feature = "io")]
pub mod talos;
#[cfg(feature = "io")]
pub mod webhook;
