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
pub mod crashpoint;
#[cfg(feature = "io")]
pub mod exec;
pub mod facts;
pub mod handover;
#[cfg(feature = "io")]
pub mod install;
#[cfg(feature = "io")]
pub mod kube;
pub mod messages;
pub mod netpol;
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
pub mod stores;
#[cfg(feature = "io")]
pub mod talos;
#[cfg(feature = "io")]
pub mod webhook;

/// An error and its sources as one line (`a: b: c`): how logs, Events and status messages print
/// an error, since each error's own text names only its layer (the chain is printed once, here
/// and by the CLI's `main`).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        // A layer that repeats its source's text adds nothing.
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// The shipped program rooted at `root` (one of `render::embedded`'s program roots), loaded
/// from the rule files this build embeds, its warnings dropped (`ichor rules check` shows them).
pub fn embedded_program(root: &str) -> Result<engine::Engine, engine::LoadError> {
    let files = render::embedded::RULE_FILES.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    engine::Engine::load(&[root.to_string()], &engine::MemSources(files)).map(|(e, _)| e)
}
