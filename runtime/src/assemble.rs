//! The observed-state snapshot assembled from what was read: one pure function per part, so
//! that `ichor plan` on a dumped snapshot decides exactly what the controller decided.
//!
//! Start at `pending` (a node's running config against its render, classified: the paths the
//! rules see, with class, owner, restarts and new value) and `machine` (one machine's entry,
//! `Unknown` nodes included: not Ready, nothing pending).

use crate::state::{Machine, PendingPath, StaticPod};
use render::api::{OperationKind, Role};
use render::classify::{Classifier, ClassifyError};
use render::config::Config;
use render::vocab::Contract;
use std::collections::BTreeMap;

/// Every path where `running` differs from `desired`, as the snapshot lists it.
pub fn pending(
    c: &Classifier,
    contract: Contract,
    running: &Config,
    desired: &Config,
) -> Result<Vec<PendingPath>, ClassifyError> {
    let changes = render::diff::changes(running, desired);
    let outcome = c.classify_machine(contract, &changes, Some(desired), None, false)?;
    Ok(changes
        .iter()
        .zip(&outcome.changes)
        .map(|(ch, k)| PendingPath {
            path: ch.path.to_string(),
            class: k.class,
            applied_by: c.applied_by(k).and_then(OperationKind::parse),
            restarts: c.restarts(k).to_vec(),
            // Only a scalar's text (an image); a sensitive value never enters the snapshot.
            new: if k.sensitive { None } else { ch.new.as_ref().and_then(|v| v.as_str()).map(str::to_string) },
        })
        .collect())
}

/// What was read of one machine: from Kubernetes (its Node, its static pods) and from Talos
/// (`running` is `None` when the node could not be reached this reconcile).
#[derive(Clone, Debug)]
pub struct MachineRead {
    pub name: String,
    pub role: Role,
    pub talos_version: String,
    pub kubelet_version: String,
    pub node_ready: bool,
    pub hold: bool,
    pub runs_controller: bool,
    pub running: Option<Config>,
    pub static_pods: BTreeMap<String, StaticPod>,
    /// Talos has rendered kube-proxy's manifest there (a control plane's `Manifests`), when read.
    pub kube_proxy_manifest: Option<bool>,
}

/// The machine's snapshot entry. An unreachable node is not Ready and has nothing pending:
/// the rules pause at its turn and name it, and touch nothing on it.
pub fn machine(
    c: &Classifier,
    contract: Contract,
    m: &MachineRead,
    desired: &Config,
) -> Result<Machine, ClassifyError> {
    let (ready, pending) = match &m.running {
        Some(running) => (m.node_ready, pending(c, contract, running, desired)?),
        None => (false, vec![]),
    };
    Ok(Machine {
        name: m.name.clone(),
        role: m.role,
        talos_version: m.talos_version.clone(),
        kubelet_version: m.kubelet_version.clone(),
        ready,
        hold: m.hold,
        runs_controller: m.runs_controller,
        pending,
        static_pods: m.static_pods.clone(),
        contract: Some(contract),
        kube_proxy_manifest_rendered: m.kube_proxy_manifest,
        conditions: BTreeMap::new(),
    })
}
