//! Observation: per machine, what the snapshot needs from Talos, and a fleet observed at
//! bounded concurrency where one unreachable node is "unknown", never a failed reconcile.
//!
//! Start at `observe_node` (version, running and persisted config, kubelet and control-plane
//! images in force, service health, rendered manifests) and `observe_fleet`.

use super::client::{Client, TalosError};
use super::proto::talos::resource::definitions::k8s::{ComponentConfigSpec, KubeletSpecSpec};
use super::proto::talos::resource::definitions::v1alpha1::ServiceSpec;
use prost::Message;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What one node reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeObservation {
    pub node: String,
    pub talos_version: String,
    /// The config the node runs (MachineConfig `v1alpha1`).
    pub running_config: String,
    /// The config the next boot reads (MachineConfig `persistent`).
    pub persisted_config: String,
    pub kubelet_image: String,
    /// Control-plane component images in force, by component (`kube-apiserver`, ...); empty on
    /// a worker.
    pub components: BTreeMap<String, String>,
    /// Services: (running, healthy).
    pub services: BTreeMap<String, (bool, bool)>,
    /// Bootstrap manifests Talos rendered (ids, e.g. `10-kube-proxy`); empty on a worker.
    pub manifests: Vec<String>,
}

/// A node observed, or why it could not be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    Known(Box<NodeObservation>),
    /// Not reachable or not answering: this node is unknown this reconcile; the rest go on.
    Unknown {
        node: String,
        error: TalosError,
    },
}

impl Observed {
    pub fn node(&self) -> &str {
        match self {
            Observed::Known(o) => &o.node,
            Observed::Unknown { node, .. } => node,
        }
    }
}

const COMPONENT_TYPES: [(&str, &str); 3] = [
    ("APIServerConfigs.kubernetes.talos.dev", "kube-apiserver"),
    ("ControllerManagerConfigs.kubernetes.talos.dev", "kube-controller-manager"),
    ("SchedulerConfigs.kubernetes.talos.dev", "kube-scheduler"),
];

fn spec(r: &super::proto::cosi::resource::Resource) -> &[u8] {
    r.spec.as_ref().map(|s| s.proto_spec.as_slice()).unwrap_or_default()
}

fn id(r: &super::proto::cosi::resource::Resource) -> String {
    r.metadata.as_ref().map(|m| m.id.clone()).unwrap_or_default()
}

/// Reads one node; its calls run together, each under its own deadline.
pub async fn observe_node(c: &Client, node: &str) -> Result<NodeObservation, TalosError> {
    let (version, running, persisted, kubelet, services, manifests) = tokio::join!(
        c.version(node),
        c.machine_config(node, "v1alpha1"),
        c.machine_config(node, "persistent"),
        c.get(node, "k8s", "KubeletSpecs.kubernetes.talos.dev", "kubelet"),
        c.list(node, "runtime", "Services.v1alpha1.talos.dev"),
        c.list(node, "controlplane", "Manifests.kubernetes.talos.dev"),
    );
    let mut o = NodeObservation {
        node: node.to_string(),
        talos_version: version?.tag,
        running_config: running?,
        persisted_config: persisted?,
        kubelet_image: KubeletSpecSpec::decode(spec(&kubelet?)).map(|k| k.image).unwrap_or_default(),
        ..NodeObservation::default()
    };
    for s in services? {
        if let Ok(v) = ServiceSpec::decode(spec(&s)) {
            o.services.insert(id(&s), (v.running, v.healthy));
        }
    }
    o.manifests = manifests?.iter().map(id).collect();
    for (kind, component) in COMPONENT_TYPES {
        match c.get(node, "controlplane", kind, component).await {
            Ok(r) => {
                if let Ok(v) = ComponentConfigSpec::decode(spec(&r)) {
                    o.components.insert(component.to_string(), v.image);
                }
            }
            // A worker has none.
            Err(TalosError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(o)
}

/// Observes every node with at most `concurrency` at once; results in the order of `nodes`.
pub async fn observe_fleet(c: &Client, nodes: &[String], concurrency: usize) -> Vec<Observed> {
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for (i, node) in nodes.iter().enumerate() {
        let (c, node, sem) = (c.clone(), node.clone(), sem.clone());
        set.spawn(async move {
            let _permit = sem.acquire_owned().await;
            let r = match observe_node(&c, &node).await {
                Ok(o) => Observed::Known(Box::new(o)),
                Err(error) => Observed::Unknown { node, error },
            };
            (i, r)
        });
    }
    let mut out: Vec<Option<Observed>> = vec![None; nodes.len()];
    while let Some(joined) = set.join_next().await {
        if let Ok((i, r)) = joined {
            out[i] = Some(r);
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.unwrap_or_else(|| Observed::Unknown {
                node: nodes[i].clone(),
                error: TalosError::TryLater {
                    node: nodes[i].clone(),
                    call: "observe",
                    message: "the observation task failed".into(),
                },
            })
        })
        .collect()
}
