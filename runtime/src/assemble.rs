//! The assembly: what one reconcile observed (plain data, `Observation`, read by
//! `controller::Controller::observe`) turned into the observed-state snapshot the rules decide
//! on, without I/O. `ichor plan` on a dumped snapshot decides exactly what the controller decided.
//!
//! Start at `assemble` (the whole step: the render of every machine, each node's running config
//! against it, the cluster, the operation and its neighbours, checked as `ichor plan --state`
//! checks a snapshot), then `pending` (a node's running config against its render, classified:
//! the paths the rules see) and `machine` (one machine's entry, `Unknown` nodes included: not
//! Ready, nothing pending). The caches (`RenderCache`, `PendingCache`) keep a machine's render
//! and classification while their inputs stay the same; the operation and machine controllers
//! share them.

use crate::plan::MachineConfigs;
use crate::state::{
    Cluster, Cni, Intent, Machine, MachineProgress, ObservedState, Operation, OtherOperation, PendingPath,
    StageOperation, StateError, StaticPod, Workload,
};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use render::api::{OperationKind, Role, TalosCluster, TalosConfigPatch, TalosMachine, TalosOperation};
use render::classify::{Classifier, ClassifyError};
use render::config::Config;
use render::machine::MachineError;
use render::manifests::{ManifestError, Manifests};
use render::render::Rendered;
use render::vocab::Contract;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Every path where `running` differs from `desired`, as the snapshot lists it.
pub fn pending(
    c: &Classifier,
    contract: Contract,
    running: &Config,
    desired: &Config,
) -> Result<Vec<PendingPath>, ClassifyError> {
    let changes = render::diff::changes(running, desired);
    // Nothing differs: nothing is pending (no evaluation needed to say so).
    if changes.is_empty() {
        return Ok(vec![]);
    }
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
#[derive(Clone, Debug, Default)]
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
    /// Its Node's boot ID, when the kubelet reported one.
    pub boot_id: Option<String>,
    /// Its Node's `nodeInfo.osImage`, when the kubelet reported one.
    pub os_image: Option<String>,
    /// The boot its Talos says it is on, when Talos answered and has a `BootID` (1.14+).
    pub talos_boot_id: Option<String>,
    /// Its TalosMachine's `status.appliedAwaitingReboot`.
    pub awaiting_reboot: Vec<String>,
    /// Talos services that are not running and healthy, when its Talos was read.
    pub unhealthy_services: Vec<String>,
    /// Its Node carries Ichor's cordon mark (`render::api::CORDONED`).
    pub cordoned: bool,
    /// Its Node carries Ichor's `PreferNoSchedule` taint (`render::api::NEXT_TAINT`).
    pub tainted: bool,
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
        boot_id: m.boot_id.clone(),
        os_image: m.os_image.clone(),
        talos_boot_id: m.talos_boot_id.clone(),
        awaiting_reboot: m.awaiting_reboot.clone(),
        unhealthy_services: m.unhealthy_services.clone(),
        cordoned: m.cordoned,
        tainted: m.tainted,
        drain_refusals: vec![],
    }
}

/// A hash of a text as read (cheap: no parse, no serialization).
pub fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// A hash of objects as the API returned them (everything a render reads of them).
/// A hash of what a render reads of these objects: each whole, less its status and the
/// metadata every write moves (resourceVersion, managedFields). A machine's status write
/// (the machine controller's, each step's) leaves its render's key as it was; the two status
/// values a render reads of a cluster are hashed by `RenderCache::cluster_key`.
fn objects_hash<T: serde::Serialize>(objects: &[&T]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for o in objects {
        let mut v = serde_json::to_value(o).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.remove("status");
        }
        if let Some(m) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            m.remove("resourceVersion");
            m.remove("managedFields");
        }
        serde_json::to_vec(&v).unwrap_or_default().hash(&mut h);
    }
    h.finish()
}

/// One entry per machine: what it was computed from, and the result. A machine's entry is
/// replaced when its inputs change, so the cache holds one entry per machine, never more.
#[derive(Debug)]
struct PerMachine<K, V> {
    map: Mutex<std::collections::HashMap<String, (K, V)>>,
}

impl<K, V> Default for PerMachine<K, V> {
    fn default() -> Self {
        PerMachine { map: Mutex::new(std::collections::HashMap::new()) }
    }
}

impl<K: PartialEq, V: Clone> PerMachine<K, V> {
    fn get_or<E>(&self, machine: &str, key: K, compute: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        if let Some((k, v)) = self.map.lock().ok().as_ref().and_then(|m| m.get(machine).map(|(k, v)| (k == &key, v)))
            && k
        {
            return Ok(v.clone());
        }
        let v = compute()?;
        if let Ok(mut m) = self.map.lock() {
            m.insert(machine.to_string(), (key, v.clone()));
        }
        Ok(v)
    }

    fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// Machine controller verdicts kept by what they were judged from (the render's inputs, the
/// node's running config, the machine's context, as one hash): a resync of a machine nothing
/// happened to does not evaluate the rules again.
#[derive(Debug, Default)]
pub struct VerdictCache {
    entries: PerMachine<u64, render::classify::MachineVerdict>,
}

impl VerdictCache {
    /// The verdict kept for `key`, or `judge`'s (then kept).
    pub fn verdict<E>(
        &self,
        machine: &str,
        key: u64,
        judge: impl FnOnce() -> Result<render::classify::MachineVerdict, E>,
    ) -> Result<render::classify::MachineVerdict, E> {
        self.entries.get_or(machine, key, judge)
    }
}

/// Pending paths kept by what they were computed from (the contract, a hash of the node's
/// running config text, the render's desired-inputs hash): between most reconciles neither
/// changes, and classifying thousands of machines again each time would dominate a reconcile.
#[derive(Debug, Default)]
pub struct PendingCache {
    entries: PerMachine<(Contract, u64, String), Option<Vec<PendingPath>>>,
}

impl PendingCache {
    /// The machine's snapshot entry, classifying only when its running config or its render's
    /// inputs changed since the last time: `running` is the node's config text as read (parsed
    /// only on a miss; `None` when the node was not reached).
    pub fn machine(
        &self,
        c: &Classifier,
        m: &MachineRead,
        running: Option<&str>,
        rendered: &Rendered,
    ) -> Result<Machine, ClassifyError> {
        let contract = rendered.contract;
        let pending = match running {
            None => None,
            Some(text) => {
                let key = (contract, text_hash(text), rendered.inputs_hash.clone());
                self.entries.get_or(&m.name, key, || {
                    // A running config that does not parse has nothing the rules can judge: the
                    // machine is as unreachable.
                    match Config::parse(text) {
                        Ok(cfg) => pending(c, contract, &cfg, &rendered.config).map(Some),
                        Err(_) => Ok(None),
                    }
                })?
            }
        };
        Ok(entry(m, contract, pending))
    }

    /// How many machines' classifications are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Renders kept by everything they read (the cluster, the machine, the cluster's patches, the
/// secrets' version, the contract): shared by the operation and machine controllers, so a
/// machine is rendered once per change of its inputs, not once per reconcile of each.
#[derive(Default)]
pub struct RenderCache {
    entries: PerMachine<(u64, u64), Arc<Rendered>>,
}

impl std::fmt::Debug for RenderCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderCache").field("machines", &self.len()).finish()
    }
}

impl RenderCache {
    /// `render::machine::render_checked` of `machine`, or the render kept for the same inputs.
    pub fn render(&self, c: &Classifier, manifests: &Manifests, machine: &str) -> Result<Arc<Rendered>, MachineError> {
        let mch = manifests.machine(machine)?;
        let shared = Self::cluster_key(manifests, manifests.cluster_of(mch));
        self.render_keyed(c, manifests, mch, shared)
    }

    /// `render` of each of `machines`, on every core, the key's cluster part (the cluster, its
    /// secrets' version, its patches) hashed once per cluster rather than once per machine.
    pub fn render_many(
        &self,
        c: &Classifier,
        manifests: &Manifests,
        machines: &[&TalosMachine],
    ) -> Vec<Result<Arc<Rendered>, MachineError>> {
        let shared: BTreeMap<(Option<String>, Option<String>), (u64, u64)> = manifests
            .clusters
            .iter()
            .map(|c| ((c.metadata.namespace.clone(), c.metadata.name.clone()), Self::cluster_key(manifests, c)))
            .collect();
        par_map(machines, |m| {
            let mch = manifests.machine(m.metadata.name.as_deref().unwrap_or_default())?;
            let cluster = manifests.cluster_of(mch);
            let key = shared[&(cluster.metadata.namespace.clone(), cluster.metadata.name.clone())];
            self.render_keyed(c, manifests, mch, key)
        })
    }

    /// The part of a render's key its cluster gives: the cluster (and the two status values a
    /// render reads of it, render::render::inputs_hash's part), its secrets' version, its patches.
    fn cluster_key(manifests: &Manifests, cluster: &TalosCluster) -> (u64, u64) {
        let secrets_version = manifests.secrets_version(cluster);
        let patches = manifests.patches_of(cluster);
        let status = format!(
            "{}/{:?}",
            render::render::handover_done(cluster),
            render::render::status_kube_proxy(cluster).map(|m| m.name())
        );
        let cluster_key = objects_hash(&[cluster]) ^ text_hash(&status).rotate_left(3);
        (cluster_key ^ text_hash(secrets_version).rotate_left(1), objects_hash(&patches))
    }

    fn render_keyed(
        &self,
        c: &Classifier,
        manifests: &Manifests,
        mch: &TalosMachine,
        shared: (u64, u64),
    ) -> Result<Arc<Rendered>, MachineError> {
        let machine = mch.metadata.name.as_deref().unwrap_or_default();
        let key = (shared.0, shared.1 ^ objects_hash(&[mch]).rotate_left(7));
        self.entries.get_or(machine, key, || render::machine::render_checked(manifests, machine, None, c).map(Arc::new))
    }

    /// How many machines' renders are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What Talos said of one machine this reconcile.
#[derive(Clone, Debug)]
pub struct TalosRead {
    pub talos_version: String,
    /// The config the node runs, as read.
    pub running_config: Arc<str>,
    /// The bootstrap manifests Talos rendered there (ids, e.g. `10-kube-proxy`).
    pub manifests: Vec<String>,
    /// Talos services that are not running and healthy (`etcd` on a control plane, ...).
    pub unhealthy_services: Vec<String>,
    /// The boot Talos says it is on (Talos 1.14 and later).
    pub boot_id: Option<String>,
}

/// What one reconcile read from Kubernetes and Talos, as plain data: the objects as the API
/// returned them and what each node's Talos said. `assemble` turns it into the snapshot.
#[derive(Clone, Debug)]
pub struct Observation {
    pub operation: TalosOperation,
    pub cluster: TalosCluster,
    /// The namespace's TalosOperations (this one may be among them: `assemble` keeps the
    /// cluster's others).
    pub operations: Vec<TalosOperation>,
    /// The cluster's TalosMachines and TalosConfigPatches (shared with the caches they were
    /// read from: a reconcile copies no object).
    pub machines: Vec<Arc<TalosMachine>>,
    pub patches: Vec<Arc<TalosConfigPatch>>,
    /// The Secret holding the cluster's Talos secrets bundle.
    pub secret: Secret,
    /// The cluster, machines, patches and secret loaded and checked (`Manifests::from_objects`),
    /// when the reader kept them loaded for these very objects; otherwise loaded here.
    pub loaded: Option<Arc<Manifests>>,
    pub nodes: Vec<Arc<Node>>,
    /// kube-system's pods: the static control plane's mirror pods are among them.
    pub kube_system_pods: Vec<Arc<Pod>>,
    /// What each machine's Talos said, by machine name; a machine absent here was not reached.
    pub talos: BTreeMap<String, TalosRead>,
    pub workload: Workload,
    /// The cluster's health checks over the objects read (`runtime::health::evaluate`): read
    /// only for an operation that has not ended.
    pub health: Vec<crate::health::HealthAt>,
}

/// What a reconcile assembled: the snapshot, and what completes the plan's applies.
#[derive(Debug)]
pub struct Read {
    pub snapshot: ObservedState,
    /// Each machine's running config (as read) and render: what completes the plan's applies.
    pub configs: BTreeMap<String, MachineConfigs>,
    /// The operation's resourceVersion, for the status write.
    pub resource_version: Option<String>,
    /// The operation's and the cluster's statuses as read: what the status writes patch from.
    pub statuses: (render::api::TalosOperationStatus, render::api::TalosClusterStatus),
}

/// What the assembly needs besides the observation: the controller's own settings and caches.
#[derive(Clone, Copy)]
pub struct Settings<'a> {
    pub classifier: &'a Classifier,
    pub renders: &'a RenderCache,
    pub pending: &'a PendingCache,
    /// The release set's Kubernetes this Ichor ships (ADR 0113).
    pub release_set_kubernetes: &'a str,
    /// The release set's Talos this Ichor ships.
    pub release_set_talos: &'a str,
    /// The node the controller runs on (it goes last).
    pub controller_node: Option<&'a str>,
    /// How long a drain may wait for a PodDisruptionBudget (`ichor controller --drain-timeout`).
    pub drain_deadline_secs: Option<u64>,
}

/// Why an observation does not assemble into a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error("classifying the pending changes of machine {machine}")]
    Classify {
        machine: String,
        #[source]
        source: ClassifyError,
    },
    /// The snapshot fails the checks `ichor plan --state` makes (a bug of the assembly).
    #[error("the assembled snapshot does not hold: {}", problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
    Snapshot { problems: Vec<StateError> },
}

/// The custom resources' problems, when they do not load or a machine does not render: what the
/// rules see as `inputs_rejected` (nothing is done; the operation pauses naming every problem).
fn rejection(e: RenderProblem) -> String {
    match e {
        RenderProblem::Load(problems) => format!(
            "the custom resources do not load: {}",
            problems.iter().map(|p| p.message.clone()).collect::<Vec<_>>().join("; ")
        ),
        RenderProblem::Machine(machine, e) => {
            let problems = e.problems();
            let problem = if problems.is_empty() { e.to_string() } else { format!("{e}: {}", problems.join("; ")) };
            format!("rendering machine {machine}: {problem}")
        }
    }
}

enum RenderProblem {
    Load(Vec<ManifestError>),
    Machine(String, MachineError),
}

/// The render's inputs, from the objects as read.
pub fn manifests(o: &Observation, c: &Classifier) -> Result<Arc<Manifests>, Vec<ManifestError>> {
    if let Some(m) = &o.loaded {
        return Ok(m.clone());
    }
    let contracts: Vec<String> = c.known().iter().map(|c| c.to_string()).collect();
    Manifests::from_objects(
        vec![o.cluster.clone()],
        o.machines.iter().map(|m| (**m).clone()).collect(),
        o.patches.iter().map(|p| (**p).clone()).collect(),
        std::slice::from_ref(&o.secret),
        &contracts,
    )
    .map(Arc::new)
}

/// Every machine's render, in the observation's order, or the first problem.
fn render_all(o: &Observation, s: &Settings) -> Result<Vec<Arc<Rendered>>, RenderProblem> {
    let m = manifests(o, s.classifier).map_err(RenderProblem::Load)?;
    let machines: Vec<&TalosMachine> = o.machines.iter().map(|m| &**m).collect();
    s.renders
        .render_many(s.classifier, &m, &machines)
        .into_iter()
        .zip(&o.machines)
        .map(|(r, mch)| r.map_err(|e| RenderProblem::Machine(mch.metadata.name.clone().unwrap_or_default(), e)))
        .collect()
}

/// `items.iter().map(f)`, spread over the machine's cores (each machine's render and
/// judgement is its own); results in the order of `items`.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len() / 8).max(1);
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let parts: Vec<_> =
            items.chunks(chunk).map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<R>>())).collect();
        parts.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// Whether a Node or a pod reports the condition `Ready` as True.
fn ready(conditions: Option<&Vec<impl HasCondition>>) -> bool {
    conditions.is_some_and(|cs| cs.iter().any(|c| c.is_ready()))
}

trait HasCondition {
    fn is_ready(&self) -> bool;
}
impl HasCondition for k8s_openapi::api::core::v1::NodeCondition {
    fn is_ready(&self) -> bool {
        self.type_ == "Ready" && self.status == "True"
    }
}
impl HasCondition for k8s_openapi::api::core::v1::PodCondition {
    fn is_ready(&self) -> bool {
        self.type_ == "Ready" && self.status == "True"
    }
}

/// What the decisions read of a Node; the watch's cache wakes the operations only when this
/// changes (`stores::node_digest`), so a heartbeat wakes nothing.
#[derive(Debug, Default, Hash, PartialEq, Eq)]
pub struct NodeRead<'a> {
    pub ready: bool,
    /// Empty when the kubelet has not reported one.
    pub kubelet_version: &'a str,
    pub boot_id: Option<&'a str>,
    /// What the kubelet reports as the OS (`Talos (v1.14.6)`); what a Talos upgrade verifies.
    pub os_image: Option<&'a str>,
    /// Unschedulable with Ichor's cordon mark (`render::api::CORDONED`).
    pub cordoned: bool,
    /// It carries Ichor's `PreferNoSchedule` taint (`render::api::NEXT_TAINT`).
    pub tainted: bool,
}

pub fn node_read(n: &Node) -> NodeRead<'_> {
    let status = n.status.as_ref();
    let info = status.and_then(|s| s.node_info.as_ref());
    NodeRead {
        ready: ready(status.and_then(|s| s.conditions.as_ref())),
        kubelet_version: info.map_or("", |i| i.kubelet_version.as_str()),
        boot_id: info.map(|i| i.boot_id.as_str()).filter(|b| !b.is_empty()),
        os_image: info.map(|i| i.os_image.as_str()).filter(|b| !b.is_empty()),
        cordoned: n.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(render::api::CORDONED))
            && n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
        tainted: n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == render::api::NEXT_TAINT)),
    }
}

/// The Talos version a Node's `osImage` names (`Talos (v1.14.6)`, as Talos's kubelet reports it).
pub fn os_image_version(os_image: &str) -> Option<String> {
    let inner = os_image.strip_prefix("Talos (")?.strip_suffix(')')?;
    engine::parse_version(inner).map(|_| inner.to_string())
}

/// A static control-plane component's mirror pod as the decisions read it: its node, its
/// component (`k8s-app`), its image and readiness. None for any other pod (`stores::pod_digest`
/// wakes nothing for those).
pub fn mirror_pod(p: &Pod) -> Option<(&str, &str, &str, bool)> {
    if !p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")) {
        return None;
    }
    let spec = p.spec.as_ref()?;
    Some((
        spec.node_name.as_deref()?,
        p.metadata.labels.as_ref().and_then(|l| l.get("k8s-app"))?.as_str(),
        spec.containers.first().and_then(|c| c.image.as_deref())?,
        ready(p.status.as_ref().and_then(|s| s.conditions.as_ref())),
    ))
}

/// The static control plane's mirror pods, by node and then component (`k8s-app`).
fn static_pods(pods: &[Arc<Pod>]) -> BTreeMap<String, BTreeMap<String, StaticPod>> {
    let mut out: BTreeMap<String, BTreeMap<String, StaticPod>> = BTreeMap::new();
    for (node, component, image, ready) in pods.iter().filter_map(|p| mirror_pod(p)) {
        out.entry(node.to_string())
            .or_default()
            .insert(component.to_string(), StaticPod { image: image.into(), ready });
    }
    out
}

/// The snapshot from what one reconcile observed, at `now`. A render that fails is a fact of the
/// snapshot (`inputsRejected`), with no machine in it: the rules pause the operation, unless it
/// has ended, and nothing else is done.
/// The snapshot's cluster: its spec and status as the rules read them, the maintenance windows
/// at `now`, the health checks' results; `patches` are the cluster's (the CNI's home).
fn cluster_of(o: &Observation, now: &str, s: &Settings, patches: &[&TalosConfigPatch]) -> Cluster {
    let cluster = &o.cluster;
    let bootstrap = render::render::cni_home(patches);
    Cluster {
        name: o.operation.spec.cluster_ref.name.clone(),
        kubernetes_version: cluster.spec.kubernetes_version.clone(),
        release_set_kubernetes: s.release_set_kubernetes.to_string(),
        release_set_talos: s.release_set_talos.to_string(),
        cni: Cni {
            preset: cluster.spec.cni.preset,
            kube_proxy: cluster.spec.cni.kube_proxy,
            handover: cluster.spec.cni.handover,
            handover_done: render::render::handover_done(cluster),
            bootstrap_patch: bootstrap.as_ref().map(|h| h.patch.clone()),
            // The values' home: Git (the Application's Helm values) once handed over, else
            // the bootstrap patch's manifest; None when it does not say.
            home_kube_proxy_replacement: if render::render::handover_done(cluster) {
                o.workload.argocd_application.as_ref().and_then(|a| a.kube_proxy_replacement.clone())
            } else {
                bootstrap.and_then(|h| h.kube_proxy_replacement)
            },
        },
        status_kube_proxy: render::render::status_kube_proxy(cluster),
        annotations: cluster.metadata.annotations.clone().unwrap_or_default(),
        cilium_values: cluster.spec.cni.cilium.as_ref().and_then(|c| c.values.clone()),
        // The tunnel chosen at install: a switch's Job renders with it, as the values
        // reconciler's does (the same layered values, the same hash).
        cilium_tunnel: cluster.spec.cni.cilium.as_ref().map(|c| c.tunnel_protocol.clone()).filter(|t| !t.is_empty()),
        cilium_adoption: cluster.status.as_ref().and_then(|s| s.cni.as_ref()).and_then(|c| c.adoption.clone()),
        maintenance: crate::state::MaintenanceAt::of(
            &cluster.spec.maintenance_windows,
            crate::state::epoch(now).unwrap_or_default(),
        ),
        health: o.health.clone(),
    }
}

/// The snapshot's operation: its spec, and its status as recorded (a step's missing start is
/// `now`).
fn operation_of(op: &TalosOperation, cluster: &TalosCluster, now: &str, s: &Settings) -> Operation {
    let st = op.status.clone().unwrap_or_default();
    Operation {
        name: op.metadata.name.clone().unwrap_or_default(),
        kind: op.spec.kind,
        target_kubernetes: op.spec.target.kubernetes_version.clone(),
        target_kube_proxy: op.spec.target.kube_proxy,
        target_machines: op.spec.target.machines.clone(),
        target_cilium_chart: op.spec.target.cilium_chart.clone(),
        target_talos: op.spec.target.talos_version.clone(),
        talos_installer: op
            .spec
            .target
            .talos_version
            .as_ref()
            .map(|v| render::render::installer_image_at(&cluster.spec, v)),
        allow_downgrade: op.spec.target.allow_downgrade,
        force_drain: op.spec.force_drain,
        drain_deadline: s.drain_deadline_secs.map(|d| d as i64),
        max_unavailable: op.spec.max_unavailable.into(),
        phase: st.phase(),
        intent: Intent::of(op.metadata.annotations.as_ref(), st.resumed),
        paused_reason: st.paused_reason.clone(),
        machines: st
            .machines
            .iter()
            .map(|(k, v)| {
                let started_at = Some(v.started_at.clone().unwrap_or_else(|| now.to_string()));
                let p =
                    MachineProgress { phase: v.phase, stage: v.stage.clone(), started_at, boot_id: v.boot_id.clone() };
                (k.clone(), p)
            })
            .collect(),
        waiting_since: st.waiting_since.clone(),
        done: st.done.clone(),
        waits: st.waits.clone(),
        machines_left: st.machines_left.clone(),
        stages: st.stages.clone(),
        release: op.metadata.labels.as_ref().and_then(|l| l.get(render::api::RELEASE)).cloned(),
    }
}

pub fn assemble(o: &Observation, now: &str, s: &Settings) -> Result<Read, AssembleError> {
    let op = &o.operation;
    let cluster = &o.cluster;
    let operation = op.metadata.name.as_deref().unwrap_or_default();
    let cluster_name = op.spec.cluster_ref.name.clone();
    let others: Vec<OtherOperation> = o
        .operations
        .iter()
        .filter(|x| x.spec.cluster_ref.name == cluster_name && x.metadata.name.as_deref() != Some(operation))
        .map(|x| OtherOperation {
            name: x.metadata.name.clone().unwrap_or_default(),
            kind: x.spec.kind,
            phase: x.status.as_ref().map(|s| s.phase()).unwrap_or_default(),
        })
        .collect();
    // A release's stage operations (labelled with it), oldest first.
    let label = |x: &TalosOperation| x.metadata.labels.as_ref().and_then(|l| l.get(render::api::RELEASE)).cloned();
    let mut stages: Vec<&TalosOperation> =
        o.operations.iter().filter(|x| label(x).as_deref() == Some(operation)).collect();
    stages.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name).cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    });
    let stage_operations = stages
        .into_iter()
        .map(|x| StageOperation {
            name: x.metadata.name.clone().unwrap_or_default(),
            kind: x.spec.kind,
            target: x.spec.target.stage_value(),
            phase: x.status.as_ref().map(|s| s.phase()).unwrap_or_default(),
            paused_reason: x.status.as_ref().and_then(|s| s.paused_reason.clone()),
        })
        .collect();
    let (rendered, rejected) = match render_all(o, s) {
        Ok(r) => (r, None),
        Err(e) => (vec![], Some(rejection(e))),
    };
    let nodes: BTreeMap<&str, &Node> =
        o.nodes.iter().map(|n| (n.metadata.name.as_deref().unwrap_or_default(), &**n)).collect();
    let mut mirror = static_pods(&o.kube_system_pods);
    let mut configs = BTreeMap::new();
    let mut machines = vec![];
    let mut reads = vec![];
    // No render, no machine: nothing observed of the fleet enters the snapshot.
    for (m, rendered) in o.machines.iter().zip(&rendered) {
        let name = m.metadata.name.clone().unwrap_or_default();
        let node = nodes.get(name.as_str()).map(|n| node_read(n)).unwrap_or_default();
        let talos = o.talos.get(&name);
        let read = MachineRead {
            name: name.clone(),
            role: m.spec.role,
            // Talos's word; unread, what its Node's kubelet reports; else the spec's (which a
            // Talos upgrade has already moved to its target: never taken for a node's own).
            talos_version: match talos {
                Some(t) => t.talos_version.clone(),
                None => node.os_image.and_then(os_image_version).unwrap_or_else(|| cluster.spec.talos_version.clone()),
            },
            kubelet_version: if node.kubelet_version.is_empty() {
                cluster.spec.kubernetes_version.clone()
            } else {
                node.kubelet_version.to_string()
            },
            node_ready: node.ready,
            hold: m.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(render::api::HOLD)),
            runs_controller: s.controller_node == Some(name.as_str()),
            static_pods: mirror.remove(&name).unwrap_or_default(),
            kube_proxy_manifest: talos
                .filter(|_| m.spec.role == Role::Controlplane)
                .map(|t| t.manifests.iter().any(|x| x == crate::plan::KUBE_PROXY_MANIFEST)),
            address: Some(m.spec.address.clone()),
            boot_id: node.boot_id.map(str::to_string),
            os_image: node.os_image.map(str::to_string),
            talos_boot_id: talos.and_then(|t| t.boot_id.clone()),
            awaiting_reboot: m.status.as_ref().map(|s| s.applied_awaiting_reboot.clone()).unwrap_or_default(),
            unhealthy_services: talos.map(|t| t.unhealthy_services.clone()).unwrap_or_default(),
            cordoned: node.cordoned,
            tainted: node.tainted,
        };
        if let Some(t) = talos {
            configs
                .insert(name, MachineConfigs { running: t.running_config.clone(), desired: rendered.config.clone() });
        }
        let running = talos.map(|t| &*t.running_config);
        reads.push((read, running, rendered));
    }
    // Each machine's pending paths are its own: judged on every core at once.
    for m in par_map(&reads, |(read, running, rendered)| {
        s.pending
            .machine(s.classifier, read, *running, rendered)
            .map_err(|source| AssembleError::Classify { machine: read.name.clone(), source })
    }) {
        machines.push(m?);
    }
    let patches: Vec<&TalosConfigPatch> = o
        .patches
        .iter()
        .filter(|p| p.metadata.namespace == cluster.metadata.namespace && p.spec.cluster_ref.name == cluster_name)
        .map(|p| &**p)
        .collect();
    let snapshot = ObservedState {
        now: now.to_string(),
        cluster: cluster_of(o, now, s, &patches),
        machines,
        workload: if rejected.is_some() { Workload::default() } else { o.workload.clone() },
        operation: operation_of(op, cluster, now, s),
        other_operations: others,
        stage_operations,
        inputs_rejected: rejected,
    };
    // Checked as `ichor plan --state` checks a snapshot (typed, no YAML between).
    snapshot.check().map_err(|problems| AssembleError::Snapshot { problems })?;
    let statuses = (op.status.clone().unwrap_or_default(), o.cluster.status.clone().unwrap_or_default());
    Ok(Read { snapshot, configs, resource_version: op.metadata.resource_version.clone(), statuses })
}

#[cfg(test)]
mod tests {
    use super::*;
    use render::api::{OperationKind, TalosOperationSpec};

    const FILES: [(&str, &str); 4] = [
        ("cluster.yaml", include_str!("../../examples/clusters/lab-v1.14/cluster.yaml")),
        ("machines.yaml", include_str!("../../examples/clusters/lab-v1.14/machines.yaml")),
        ("patches.yaml", include_str!("../../examples/clusters/lab-v1.14/patches.yaml")),
        ("secrets.yaml", include_str!("../../examples/clusters/lab-v1.14/secrets.yaml")),
    ];

    fn classifier() -> Classifier {
        Classifier::new(&render::classify::RuleSet::embedded()).unwrap()
    }

    #[test]
    fn a_nodes_os_image_names_its_talos_version() {
        assert_eq!(os_image_version("Talos (v1.14.6)").as_deref(), Some("v1.14.6"));
        assert_eq!(os_image_version("Talos (v1.15.0-beta.1)").as_deref(), Some("v1.15.0-beta.1"));
        assert_eq!(os_image_version("Talos"), None);
        assert_eq!(os_image_version("Ubuntu 24.04 LTS"), None);
        assert_eq!(os_image_version("Talos (latest)"), None);
    }

    /// The example cluster as the API would return it, with every node's Talos running its
    /// render except `down`, which was not reached, and an upgrade asked for.
    fn observation(c: &Classifier, down: &str) -> Observation {
        let files: Vec<(String, String)> = FILES.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        let contracts: Vec<String> = c.known().iter().map(|c| c.to_string()).collect();
        let m = Manifests::load(&files, &contracts).unwrap();
        let secret_text = FILES[3].1;
        let secret: Secret = serde_yaml::from_str(secret_text).unwrap();
        let talos = m
            .machines
            .iter()
            .filter_map(|mch| {
                let name = mch.metadata.name.clone().unwrap();
                let r = render::machine::render_checked(&m, &name, None, c).unwrap();
                (name != down).then(|| {
                    (
                        name,
                        TalosRead {
                            talos_version: "v1.14.3".into(),
                            running_config: r.text.into(),
                            manifests: vec![],
                            unhealthy_services: vec![],
                            boot_id: None,
                        },
                    )
                })
            })
            .collect();
        let mut spec = TalosOperationSpec { max_unavailable: 1, ..Default::default() };
        spec.cluster_ref.name = "lab".into();
        spec.kind = OperationKind::Kubernetes;
        spec.target.kubernetes_version = Some("v1.37.0".into());
        let mut operation = TalosOperation::new("up", spec);
        operation.metadata.namespace = Some("ichor-system".into());
        Observation {
            operation,
            cluster: m.clusters[0].clone(),
            operations: vec![],
            machines: m.machines.iter().cloned().map(Arc::new).collect(),
            patches: m.patches.iter().cloned().map(Arc::new).collect(),
            secret,
            loaded: None,
            nodes: vec![],
            kube_system_pods: vec![],
            talos,
            workload: Workload::default(),
            health: vec![],
        }
    }

    fn settings<'a>(c: &'a Classifier, renders: &'a RenderCache, pending: &'a PendingCache) -> Settings<'a> {
        Settings {
            classifier: c,
            renders,
            pending,
            release_set_kubernetes: "v1.37.0",
            release_set_talos: "v1.14.6",
            controller_node: Some("w1"),
            drain_deadline_secs: None,
        }
    }

    #[test]
    fn an_observation_assembles_into_the_snapshot_without_io() {
        let c = classifier();
        let (renders, pending) = (RenderCache::default(), PendingCache::default());
        let o = observation(&c, "cp2");
        let read = assemble(&o, "2026-12-01T10:00:00Z", &settings(&c, &renders, &pending)).unwrap();
        let s = &read.snapshot;
        assert_eq!(s.machines.len(), 4);
        assert!(s.inputs_rejected.is_none());
        let by = |n: &str| s.machines.iter().find(|m| m.name == n).unwrap();
        // Reached and running its render: nothing pending; not reached: not Ready, nothing known.
        assert!(by("cp1").pending.is_empty() && by("cp1").talos_version == "v1.14.3");
        assert!(!by("cp2").ready && by("cp2").pending.is_empty());
        assert!(by("w1").runs_controller);
        // The applies are completed from what was read of the reached nodes only.
        assert!(read.configs.contains_key("cp1") && !read.configs.contains_key("cp2"));
        // No Node reported: nobody is Ready, and the kubelet's version is the cluster's.
        assert!(s.machines.iter().all(|m| !m.ready && m.kubelet_version == "v1.36.4"));
    }

    #[test]
    fn renders_are_kept_while_their_inputs_stay_and_redone_when_they_change() {
        let c = classifier();
        let (renders, pending) = (RenderCache::default(), PendingCache::default());
        let mut o = observation(&c, "");
        let m = manifests(&o, &c).unwrap();
        let first = renders.render(&c, &m, "cp1").unwrap();
        assert!(Arc::ptr_eq(&first, &renders.render(&c, &m, "cp1").unwrap()));
        assemble(&o, "2026-12-01T10:00:00Z", &settings(&c, &renders, &pending)).unwrap();
        assert_eq!((renders.len(), pending.len()), (4, 4), "one entry per machine");
        // A change of the cluster's spec renders again.
        o.cluster.spec.kubernetes_version = "v1.36.5".into();
        let m = manifests(&o, &c).unwrap();
        let again = renders.render(&c, &m, "cp1").unwrap();
        assert!(!Arc::ptr_eq(&first, &again));
        assert_eq!(renders.len(), 4, "replaced, not added");
    }

    #[test]
    fn inputs_that_do_not_render_are_a_fact_with_no_machine() {
        let c = classifier();
        let (renders, pending) = (RenderCache::default(), PendingCache::default());
        let mut o = observation(&c, "");
        o.cluster.spec.version_contract = "v0.1".into();
        let read = assemble(&o, "2026-12-01T10:00:00Z", &settings(&c, &renders, &pending)).unwrap();
        let why = read.snapshot.inputs_rejected.unwrap();
        assert!(why.starts_with("the custom resources do not load: ") && why.contains("v0.1"), "{why}");
        assert!(read.snapshot.machines.is_empty() && read.configs.is_empty());
    }
}
