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

/// What was read of one machine from Kubernetes (its Node, its static pods) and Talos (its
/// version, whether it rendered kube-proxy); its running config is passed beside it.
#[derive(Clone, Debug)]
pub struct MachineRead {
    pub name: String,
    pub role: Role,
    pub talos_version: String,
    pub kubelet_version: String,
    pub node_ready: bool,
    pub hold: bool,
    pub runs_controller: bool,
    pub static_pods: BTreeMap<String, StaticPod>,
    /// Talos has rendered kube-proxy's manifest there (a control plane's `Manifests`), when read.
    pub kube_proxy_manifest: Option<bool>,
    /// How the Talos API reaches it (the TalosMachine's `spec.address`).
    pub address: Option<String>,
}

/// The machine's snapshot entry; `running` is its running config, `None` when the node could
/// not be reached this reconcile: then it is not Ready and has nothing pending, so the rules
/// pause at its turn and name it, and touch nothing on it.
pub fn machine(
    c: &Classifier,
    contract: Contract,
    m: &MachineRead,
    running: Option<&Config>,
    desired: &Config,
) -> Result<Machine, ClassifyError> {
    let pending = running.map(|r| pending(c, contract, r, desired)).transpose()?;
    Ok(entry(m, contract, pending))
}

/// The entry from what was read and the pending paths (`None`: the node was not reached).
fn entry(m: &MachineRead, contract: Contract, pending: Option<Vec<PendingPath>>) -> Machine {
    Machine {
        name: m.name.clone(),
        role: m.role,
        talos_version: m.talos_version.clone(),
        kubelet_version: m.kubelet_version.clone(),
        ready: m.node_ready && pending.is_some(),
        hold: m.hold,
        runs_controller: m.runs_controller,
        pending: pending.unwrap_or_default(),
        static_pods: m.static_pods.clone(),
        contract: Some(contract),
        kube_proxy_manifest_rendered: m.kube_proxy_manifest,
        conditions: BTreeMap::new(),
        address: m.address.clone(),
    }
}

/// Pending paths kept by what they were computed from (the contract, a hash of the node's
/// running config text, the render's desired-inputs hash): between most reconciles neither
/// changes, and classifying thousands of machines again each time would dominate a reconcile.
#[derive(Debug, Default)]
pub struct PendingCache {
    map: std::sync::Mutex<std::collections::HashMap<(Contract, u64, String), Vec<PendingPath>>>,
}

/// A hash of a config's text as read (cheap: no parse, no serialization).
pub fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl PendingCache {
    /// The machine's snapshot entry, classifying only when its running config or its render's
    /// inputs changed since the last time: `running` is the node's config text as read (parsed
    /// only on a miss; `None` when the node was not reached), `inputs_hash` the render's.
    pub fn machine(
        &self,
        c: &Classifier,
        contract: Contract,
        m: &MachineRead,
        running: Option<&str>,
        desired: &Config,
        inputs_hash: &str,
    ) -> Result<Machine, ClassifyError> {
        let pending = match running {
            None => None,
            Some(text) => {
                let key = (contract, text_hash(text), inputs_hash.to_string());
                let cached = self.map.lock().ok().and_then(|map| map.get(&key).cloned());
                match cached {
                    Some(p) => Some(p),
                    None => {
                        // A running config that does not parse has nothing the rules can judge:
                        // the machine is as unreachable.
                        match Config::parse(text) {
                            Ok(cfg) => {
                                let p = pending(c, contract, &cfg, desired)?;
                                if let Ok(mut map) = self.map.lock() {
                                    map.insert(key, p.clone());
                                }
                                Some(p)
                            }
                            Err(_) => None,
                        }
                    }
                }
            }
        };
        Ok(entry(m, contract, pending))
    }

    /// How many classifications are kept.
    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
