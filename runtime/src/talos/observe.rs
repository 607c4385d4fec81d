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
    /// The config the node runs (MachineConfig `v1alpha1`); shared, as a kept observation is
    /// handed to every reconcile.
    pub running_config: Arc<str>,
    /// The config the next boot reads (MachineConfig `persistent`).
    pub persisted_config: Arc<str>,
    pub kubelet_image: String,
    /// Control-plane component images in force, by component (`kube-apiserver`, ...); empty on
    /// a worker.
    pub components: BTreeMap<String, String>,
    /// Services: (running, healthy).
    pub services: BTreeMap<String, (bool, bool)>,
    /// Bootstrap manifests Talos rendered (ids, e.g. `10-kube-proxy`); empty on a worker.
    pub manifests: Vec<String>,
    /// The boot Talos says it is on (its `BootID` resource, Talos 1.14 and later): the kernel's
    /// boot ID, the one the kubelet reports on the Node, known as soon as Talos answers on a new
    /// boot (the Node's follows only once the kubelet posts again).
    pub boot_id: Option<String>,
}

/// A node observed, or why it could not be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    Known(Arc<NodeObservation>),
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
    let (version, running, persisted, kubelet, services, manifests, boot_id) = tokio::join!(
        c.version(node),
        c.machine_config(node, "v1alpha1"),
        c.machine_config(node, "persistent"),
        c.get(node, "k8s", "KubeletSpecs.kubernetes.talos.dev", "kubelet"),
        c.list(node, "runtime", "Services.v1alpha1.talos.dev"),
        c.list(node, "controlplane", "Manifests.kubernetes.talos.dev"),
        c.boot_id(node),
    );
    let mut o = NodeObservation {
        node: node.to_string(),
        talos_version: version?.tag,
        running_config: running?.into(),
        persisted_config: persisted?.into(),
        kubelet_image: KubeletSpecSpec::decode(spec(&kubelet?)).map(|k| k.image).unwrap_or_default(),
        boot_id: boot_id?,
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
                Ok(o) => Observed::Known(Arc::new(o)),
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

/// Observations kept between reconciles, so an operation's reconcile reads Talos for the nodes
/// that may have changed, not for the whole fleet each time. A kept observation is used when
/// it is settled (the node answered, every service runs healthy, the running config is the
/// persisted one: nothing waits for a boot), younger than `RESYNC`, and taken at least `HOT`
/// after the node's last write (`Client::touch`: our applies and reboots mark it). Anything
/// else is observed again: a node being worked on, one that did not answer, one not settled.
#[derive(Debug, Default)]
pub struct ObservationCache {
    entries: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, Arc<NodeObservation>)>>,
}

/// How long a settled observation is used before the node is read again.
pub const RESYNC: std::time::Duration = std::time::Duration::from_secs(30);
/// How long after a write a node is always read afresh (a reboot answers before the node goes).
pub const HOT: std::time::Duration = std::time::Duration::from_secs(10);

/// The node answered, runs every service healthy and has no config waiting for a boot.
pub fn settled(o: &NodeObservation) -> bool {
    o.running_config == o.persisted_config && o.services.values().all(|(running, healthy)| *running && *healthy)
}

impl ObservationCache {
    /// The kept observation of `node`, when it may stand for a fresh one now.
    fn kept(&self, c: &Client, node: &str, now: std::time::Instant) -> Option<Arc<NodeObservation>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (at, o) = entries.get(node)?;
        let fresh = now.saturating_duration_since(*at) < RESYNC;
        let after_write = c.last_write(node).is_none_or(|w| at.saturating_duration_since(w) >= HOT);
        (fresh && after_write).then(|| o.clone())
    }

    /// `observe_fleet`, reading only the nodes without a kept observation that stands.
    pub async fn observe_fleet(&self, c: &Client, nodes: &[String], concurrency: usize) -> Vec<Observed> {
        let now = std::time::Instant::now();
        let kept: Vec<Option<Arc<NodeObservation>>> = nodes.iter().map(|n| self.kept(c, n, now)).collect();
        let stale: Vec<String> = nodes.iter().zip(&kept).filter(|(_, k)| k.is_none()).map(|(n, _)| n.clone()).collect();
        let mut read = observe_fleet(c, &stale, concurrency).await.into_iter();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        kept.into_iter()
            .map(|k| match k {
                Some(o) => Observed::Known(o),
                None => {
                    let o = read.next().expect("one observation per stale node");
                    match &o {
                        Observed::Known(n) if settled(n) => {
                            entries.insert(n.node.clone(), (now, n.clone()));
                        }
                        other => {
                            entries.remove(other.node());
                        }
                    }
                    o
                }
            })
            .collect()
    }
}
