//! The controller's loops, each of one shape (docs/architecture.md, "One reconcile"): `observe`
//! (I/O, plain data out) → `assemble` (pure: the state `--dump-snapshots` writes and `ichor plan
//! --state` replays) → the loop's rules decide a plan (a draft) → completed, the executor
//! performs it with preconditions → the resource's typed status, written by
//! `kube::write_status` (one writer per field: `kube::managers`).
//!
//! `operation` (TalosOperation; its assemble is `assemble`, its plan `plan`, its status
//! `status`), `machine` (TalosMachine) and `cluster` (TalosCluster); `controller::Controller`
//! holds what they share (the clients, the caches, the reads of the cluster's objects). Start
//! at `machine`, the smallest; `LoopSnapshot` is what `ichor plan --state` reads.

pub mod cluster;
pub mod machine;
#[cfg(feature = "io")]
pub mod operation;

/// A dumped state of any loop, as `ichor plan --state` reads it: a snapshot with `loop:
/// machine` or `loop: cluster` is that loop's, any other an operation's (`ObservedState`).
#[derive(Clone, Debug)]
pub enum LoopSnapshot {
    Operation(Box<crate::state::ObservedState>),
    Machine(Box<machine::MachineSnapshot>),
    Cluster(Box<cluster::ClusterState>),
}

impl LoopSnapshot {
    /// The snapshot in `text`, or every problem with its field.
    pub fn parse(text: &str) -> Result<LoopSnapshot, Vec<crate::state::StateError>> {
        use crate::state::StateError;
        let at = |e: serde_yaml::Error| vec![StateError::of_serde(&e)];
        // The one bounded reader first: aliases cannot expand a small file past the cap.
        let value = render::yaml::parse(text, crate::state::SNAPSHOT_EXPANDED_BYTES)
            .map_err(|e| vec![StateError::of_yaml(e)])?;
        match value.get("loop").and_then(|l| l.as_str()) {
            Some("machine") => Ok(LoopSnapshot::Machine(Box::new(serde_yaml::from_str(text).map_err(at)?))),
            Some("cluster") => Ok(LoopSnapshot::Cluster(Box::new(serde_yaml::from_str(text).map_err(at)?))),
            Some(other) => Err(vec![StateError {
                field: "loop".into(),
                message: format!("{other:?} is no loop: write `machine`, `cluster`, or leave it out for an operation"),
            }]),
            None => Ok(LoopSnapshot::Operation(Box::new(crate::state::ObservedState::decode(text)?))),
        }
    }
}
