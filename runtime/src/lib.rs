//! Ichor's runtime: the observed state, the facts the operation rules see, and the plan they
//! derive, as typed actions an executor performs without choosing anything.
//!
//! Start at `state::ObservedState` (the snapshot), `facts::facts` (the one function from state
//! to facts) and `plan::Planner` (evaluate, decode, check, explain). The executor that talks to
//! Talos and Kubernetes is a later issue; `plan::Action` is its vocabulary.

pub mod admission;
pub mod assemble;
#[cfg(feature = "io")]
pub mod controller;
#[cfg(feature = "io")]
pub mod demo;
#[cfg(feature = "io")]
pub mod exec;
pub mod facts;
pub mod handover;
#[cfg(feature = "io")]
pub mod kube;
#[cfg(feature = "io")]
pub mod kubeapi;
pub mod plan;
pub mod rbac;
#[cfg(feature = "io")]
pub mod serve;
pub mod state;
pub mod status;
#[cfg(feature = "io")]
pub mod talos;
#[cfg(feature = "io")]
pub mod webhook;
