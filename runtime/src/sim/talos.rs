//! A simulated Talos fleet, for tests and demos only: it serves Ichor's subset of Talos's gRPC
//! API over mTLS on loopback and behaves, per node, as Talos's source says its version does.
//! It is not Talos and never claims to be: nothing boots, nothing runs.
//!
//! Start at `Fleet::start` (nodes, a generated CA, one apid-style endpoint that routes by the
//! `node` header), `Fleet::talosconfig` (a talosconfig for it), `Fleet::arm_fault` (a fault that
//! starts mid-step, on the next apply or reboot) and `Fleet::set_fault` (latency,
//! Unavailable, a call that never answers, a node that goes away). MachineService.Reboot (and
//! 1.13's REBOOT apply) takes a node away for `Fleet::set_reboot_time` (or for good); it comes
//! back on a new boot ID running its persisted config, and on the Talos an upgrade installed
//! (LifecycleService.Upgrade of a pulled installer, or the legacy MachineService.Upgrade, which
//! reboots by itself), unless `Fleet::set_upgrade_fails` makes it boot its previous system
//! (Talos's A/B fallback). Each node keeps COSI
//! resources (MachineConfig `v1alpha1` and `persistent`, KubeletSpec, the control-plane
//! `*Configs`, Services, Manifests, ManifestStatuses) that an apply updates as Talos does, and
//! records its image pulls per containerd namespace.
//!
//! Per version (FACTS 1 and 4): Talos 1.13 refuses a NO_REBOOT or TRY apply that changes a
//! v1alpha1 field outside its allow-list ("can't be applied in immediate mode", with the
//! diff), runs that check before a dry run, and turns AUTO into a reboot when it fails; Talos
//! 1.14 checks YAML, the v1alpha1 document, then rejects REBOOT as Unimplemented, then
//! validates, and turns AUTO into NO_REBOOT. Both refuse what Talos's validation refuses
//! (InvalidArgument). ImageService exists from 1.13.

use super::pki::{ClientCert, ClientSpec, Pki, PkiError, client_roles};
use crate::talos::proto::common::{ContainerdNamespace as PbNs, Data};
use crate::talos::proto::cosi::resource::state_server::{State, StateServer};
use crate::talos::proto::cosi::resource::{
    Event, EventType, GetRequest, GetResponse, ListRequest, ListResponse, Metadata, Resource, Spec, WatchRequest,
    WatchResponse,
};
use crate::talos::proto::machine::apply_configuration_request::Mode;
use crate::talos::proto::machine::image_service_server::{ImageService, ImageServiceServer};
use crate::talos::proto::machine::lifecycle_service_server::{LifecycleService, LifecycleServiceServer};
use crate::talos::proto::machine::machine_service_server::{MachineService, MachineServiceServer};
use crate::talos::proto::machine::{
    ApplyConfiguration, ApplyConfigurationRequest, ApplyConfigurationResponse, FeaturesInfo, ImagePull,
    ImagePullRequest, ImagePullResponse, ImageServicePullProgress, ImageServicePullRequest, ImageServicePullResponse,
    LifecycleServiceInstallProgress, LifecycleServiceUpgradeRequest, LifecycleServiceUpgradeResponse, PlatformInfo,
    Reboot, RebootRequest, RebootResponse, Upgrade, UpgradeRequest, UpgradeResponse, Version, VersionInfo,
    VersionResponse, image_service_pull_response, lifecycle_service_install_progress,
};
use crate::talos::proto::resource::config::MachineConfigSpec;
use crate::talos::proto::talos::resource::definitions::k8s::{
    ComponentConfigSpec, KubeletSpecSpec, ManifestSpec, ManifestStatusSpec, SingleManifest,
};
use crate::talos::proto::talos::resource::definitions::v1alpha1::ServiceSpec;
use futures::Stream;
use prost::Message;
use render::api::Role;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// A node of the fleet.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub role: Role,
    /// The Talos version it runs, `v1.13.9` or `v1.14.3`.
    pub talos: String,
    /// The config it starts with (default: the shipped example of its version and role).
    pub config: Option<String>,
}

/// Faults a test injects into one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every call answers after this long.
    Latency(Duration),
    /// Every call answers Unavailable.
    Unavailable,
    /// Calls never answer.
    Hang,
    /// The node went away: the endpoint cannot reach it (Unavailable, as apid reports).
    Gone,
}

/// What starts an armed fault (`Fleet::arm_fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The node's next config apply (after it took the config).
    Apply,
    /// The node's next reboot (after it went down).
    Reboot,
}

/// A fault that starts mid-step: on the node's next apply or reboot, for a while or for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArmedFault {
    pub fault: Fault,
    pub on: Trigger,
    /// How long it lasts once started; `None`: until cleared.
    pub lasting: Option<Duration>,
}

/// The fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("listening on {addr}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("the TLS configuration: {0}")]
    Tls(String),
    #[error("node {node}: {problem}")]
    Node { node: String, problem: String },
}

type Key = (String, String, String);

#[derive(Clone, Debug)]
struct Res {
    version: u64,
    proto: Vec<u8>,
    yaml: String,
    annotations: BTreeMap<String, String>,
}

#[derive(Debug)]
struct NodeState {
    spec: NodeSpec,
    minor: u32,
    resources: BTreeMap<Key, Res>,
    pulls: Vec<(String, String)>,
    reboots: u32,
    fault: Option<Fault>,
    /// When `fault` ends by itself (an armed fault's `lasting`).
    fault_until: Option<std::time::Instant>,
    /// A fault waiting for its trigger.
    armed: Option<ArmedFault>,
    /// How long a reboot keeps the node away; `None`: it never comes back (a fault).
    reboot_time: Option<Duration>,
    /// Away on a reboot, until then (`Some(None)`: for good).
    away: Option<Option<std::time::Instant>>,
    /// Boots so far (the boot ID is made from it).
    boot: u32,
    /// Moves on every change of the node's resources and on each reboot's start: what lets a
    /// stand-in skip a node nothing happened to.
    revision: u64,
    /// The Talos an upgrade installed, booted at the next reboot.
    installed: Option<String>,
    /// A fault: the installed Talos fails to boot, and the node boots its previous system
    /// (Talos's A/B fallback).
    upgrade_fails: bool,
}

#[derive(Clone, Debug)]
struct Change {
    node: String,
    key: Key,
    res: Resource,
    kind: EventType,
}

struct Shared {
    nodes: Mutex<BTreeMap<String, NodeState>>,
    /// The node that answers when a call names none (the endpoint itself).
    endpoint_node: String,
    classifier: render::classify::Classifier,
    events: tokio::sync::broadcast::Sender<Change>,
}

/// A running simulated fleet.
pub struct Fleet {
    shared: Arc<Shared>,
    pub addr: SocketAddr,
    pub pki: Pki,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub const MACHINE_CONFIG: &str = "MachineConfigs.config.talos.dev";
const KUBELET_SPEC: &str = "KubeletSpecs.kubernetes.talos.dev";
const SERVICES: &str = "Services.v1alpha1.talos.dev";
const MANIFESTS: &str = "Manifests.kubernetes.talos.dev";
const MANIFEST_STATUSES: &str = "ManifestStatuses.kubernetes.talos.dev";
/// The control-plane component configs: COSI type, id, the v1alpha1 path and the document.
const COMPONENTS: [(&str, &str, &str, &str); 3] = [
    ("APIServerConfigs.kubernetes.talos.dev", "kube-apiserver", "apiServer", "KubeAPIServerConfig"),
    (
        "ControllerManagerConfigs.kubernetes.talos.dev",
        "kube-controller-manager",
        "controllerManager",
        "KubeControllerManagerConfig",
    ),
    ("SchedulerConfigs.kubernetes.talos.dev", "kube-scheduler", "scheduler", "KubeSchedulerConfig"),
];
/// How long a reboot keeps a simulated node away unless a test says otherwise.
pub const DEFAULT_REBOOT_TIME: Duration = Duration::from_millis(500);
/// The Kubernetes version the fleet's configs start on (when a config names no image).
pub const SIM_KUBERNETES: &str = "v1.36.4";

/// The example config a node of this version and role starts with.
fn initial_config(minor: u32, role: Role) -> &'static str {
    match (minor >= 14, role) {
        (true, Role::Controlplane) => include_str!("../../../examples/configs/v1.14/controlplane.yaml"),
        (true, Role::Worker) => include_str!("../../../examples/configs/v1.14/worker.yaml"),
        (false, Role::Controlplane) => include_str!("../../../examples/configs/v1.13/controlplane.yaml"),
        (false, Role::Worker) => include_str!("../../../examples/configs/v1.13/worker.yaml"),
    }
}

fn talos_minor(v: &str) -> Option<u32> {
    let p = engine::parse_version(v)?;
    (p.major == 1).then_some(p.minor as u32)
}

/// The image a config sets for a component: its document's `image`, else the v1alpha1 path.
fn image_in(docs: &[serde_yaml::Value], document: &str, v1alpha1: &[&str]) -> Option<String> {
    for d in docs {
        if d.get("kind").and_then(|k| k.as_str()) == Some(document)
            && let Some(i) = d.get("image").and_then(|i| i.as_str())
        {
            return Some(i.to_string());
        }
    }
    let v1 = docs.iter().find(|d| d.get("kind").is_none())?;
    let mut cur = v1;
    for k in v1alpha1 {
        cur = cur.get(*k)?;
    }
    cur.as_str().map(str::to_string)
}

fn yaml_docs(text: &str) -> Vec<serde_yaml::Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .filter_map(|d| serde_yaml::Value::deserialize(d).ok())
        .filter(|v| !v.is_null())
        .collect()
}

impl NodeState {
    fn new(spec: NodeSpec) -> Result<NodeState, SimError> {
        let minor = talos_minor(&spec.talos).ok_or_else(|| SimError::Node {
            node: spec.name.clone(),
            problem: format!("{:?} is not a Talos version v1.X.Y", spec.talos),
        })?;
        let config = spec.config.clone().unwrap_or_else(|| initial_config(minor, spec.role).to_string());
        let mut n = NodeState {
            spec,
            minor,
            resources: BTreeMap::new(),
            pulls: vec![],
            reboots: 0,
            fault: None,
            fault_until: None,
            armed: None,
            reboot_time: Some(DEFAULT_REBOOT_TIME),
            away: None,
            boot: 1,
            revision: 0,
            installed: None,
            upgrade_fails: false,
        };
        n.set_config(&config, true);
        n.publish_boot_id();
        for svc in ["apid", "machined", "kubelet", "containerd"] {
            n.put(
                "runtime",
                SERVICES,
                svc,
                ServiceSpec { running: true, healthy: true, unknown: false }.encode_to_vec(),
                "running: true\nhealthy: true\nunknown: false\n".into(),
            );
        }
        if n.spec.role == Role::Controlplane {
            n.put(
                "runtime",
                SERVICES,
                "etcd",
                ServiceSpec { running: true, healthy: true, unknown: false }.encode_to_vec(),
                "running: true\nhealthy: true\nunknown: false\n".into(),
            );
        }
        Ok(n)
    }

    /// The kernel's boot ID for this boot (what the kubelet reports as the Node's bootID).
    fn boot_id(&self) -> String {
        format!("sim-{}-boot-{}", self.spec.name, self.boot)
    }

    /// Talos 1.14 and later publish the boot ID as a COSI resource (`BootIDSpec{boot_id 1}`).
    fn publish_boot_id(&mut self) -> Option<(Key, Res)> {
        if self.minor < 14 {
            return None;
        }
        let id = self.boot_id();
        let mut proto = vec![0x0a, id.len() as u8];
        proto.extend(id.as_bytes());
        self.put("runtime", crate::talos::client::BOOT_IDS_TYPE, "boot-id", proto, format!("bootID: {id}\n"))
    }

    /// Starts a reboot: the node goes away now.
    fn go_down(&mut self) {
        self.reboots += 1;
        self.revision += 1;
        self.away = Some(self.reboot_time.map(|d| std::time::Instant::now() + d));
    }

    /// An armed fault waiting for `t` starts now.
    fn trigger(&mut self, t: Trigger) {
        if let Some(a) = self.armed.filter(|a| a.on == t) {
            self.armed = None;
            self.fault = Some(a.fault);
            self.fault_until = a.lasting.map(|d| std::time::Instant::now() + d);
            self.revision += 1;
        }
    }

    /// The fault in force now (one whose time is over is cleared).
    fn current_fault(&mut self) -> Option<Fault> {
        if self.fault_until.is_some_and(|t| std::time::Instant::now() >= t) {
            self.fault = None;
            self.fault_until = None;
            self.revision += 1;
        }
        self.fault
    }

    /// A node whose reboot is over comes back on a new boot, running its persisted config.
    /// Returns what changed.
    fn settle(&mut self) -> Vec<(Key, Res)> {
        let Some(Some(until)) = self.away else { return vec![] };
        if std::time::Instant::now() < until {
            return vec![];
        }
        self.away = None;
        self.boot += 1;
        // An upgrade boots into the Talos it installed, unless that fails to boot (the A/B
        // fallback boots the previous one).
        if let Some(v) = self.installed.take()
            && !self.upgrade_fails
            && let Some(minor) = talos_minor(&v)
        {
            self.spec.talos = v;
            self.minor = minor;
        }
        let mut changed: Vec<(Key, Res)> = self.publish_boot_id().into_iter().collect();
        let key = ("config".to_string(), MACHINE_CONFIG.to_string(), "persistent".to_string());
        let text = self
            .resources
            .get(&key)
            .and_then(|r| MachineConfigSpec::decode(r.proto.as_slice()).ok())
            .map(|m| String::from_utf8_lossy(&m.yaml_marshalled).into_owned())
            .unwrap_or_default();
        changed.extend(self.set_config(&text, true));
        changed
    }

    fn put(&mut self, ns: &str, kind: &str, id: &str, proto: Vec<u8>, yaml: String) -> Option<(Key, Res)> {
        let key = (ns.to_string(), kind.to_string(), id.to_string());
        let version = match self.resources.get(&key) {
            Some(r) if r.proto == proto => return None,
            Some(r) => r.version + 1,
            None => 1,
        };
        let mut annotations = BTreeMap::new();
        if kind == MACHINE_CONFIG {
            annotations.insert("talos.dev/yaml-spec".to_string(), "1".to_string());
        }
        let res = Res { version, proto, yaml, annotations };
        self.revision += 1;
        self.resources.insert(key.clone(), res.clone());
        Some((key, res))
    }

    /// Writes the config (the active one when `active`, always the persisted one) and the
    /// resources Talos derives from it; returns what changed.
    fn set_config(&mut self, text: &str, active: bool) -> Vec<(Key, Res)> {
        let spec = MachineConfigSpec { yaml_marshalled: text.as_bytes().to_vec() }.encode_to_vec();
        let yaml = serde_yaml::to_string(&serde_yaml::Value::String(text.to_string())).unwrap_or_default();
        let mut changed = vec![];
        changed.extend(self.put("config", MACHINE_CONFIG, "persistent", spec.clone(), yaml.clone()));
        if !active {
            return changed;
        }
        changed.extend(self.put("config", MACHINE_CONFIG, "v1alpha1", spec, yaml));
        let docs = yaml_docs(text);
        let kubelet = image_in(&docs, "KubeletConfig", &["machine", "kubelet", "image"])
            .unwrap_or_else(|| format!("ghcr.io/siderolabs/kubelet:{SIM_KUBERNETES}"));
        changed.extend(self.put(
            "k8s",
            KUBELET_SPEC,
            "kubelet",
            KubeletSpecSpec { image: kubelet.clone() }.encode_to_vec(),
            format!("image: {kubelet}\n"),
        ));
        if self.spec.role == Role::Controlplane {
            for (kind, id, path, doc) in COMPONENTS {
                let image = image_in(&docs, doc, &["cluster", path, "image"])
                    .unwrap_or_else(|| format!("registry.k8s.io/{id}:{SIM_KUBERNETES}"));
                changed.extend(self.put(
                    "controlplane",
                    kind,
                    id,
                    ComponentConfigSpec { image: image.clone() }.encode_to_vec(),
                    format!("image: {image}\n"),
                ));
            }
            changed.extend(self.render_manifests(&docs));
        }
        changed
    }

    /// Talos renders kube-proxy's bootstrap manifest on control planes from the active config
    /// (its image from KubeProxyConfig or `cluster.proxy`); a config that disables kube-proxy
    /// renders none. Returns what changed.
    fn render_manifests(&mut self, docs: &[serde_yaml::Value]) -> Vec<(Key, Res)> {
        let key = ("controlplane".to_string(), MANIFESTS.to_string(), "10-kube-proxy".to_string());
        let doc = docs.iter().find(|d| d.get("kind").and_then(|k| k.as_str()) == Some("KubeProxyConfig"));
        let v1 = docs.iter().find(|d| d.get("kind").is_none());
        let disabled = doc.and_then(|d| d.get("enabled")).and_then(|e| e.as_bool()) == Some(false)
            || v1.and_then(|v| v.get("cluster")?.get("proxy")?.get("disabled")?.as_bool()) == Some(true);
        if disabled {
            return match self.resources.remove(&key) {
                Some(r) => {
                    self.revision += 1;
                    vec![(key, Res { version: 0, ..r })]
                }
                None => vec![],
            };
        }
        let image = image_in(docs, "KubeProxyConfig", &["cluster", "proxy", "image"])
            .unwrap_or_else(|| format!("registry.k8s.io/kube-proxy:{SIM_KUBERNETES}"));
        let labels = serde_json::json!({"k8s-app": "kube-proxy"});
        let items: Vec<SingleManifest> = [
            serde_json::json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": labels},
                "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                    "spec": {"serviceAccountName": "kube-proxy", "hostNetwork": true, "containers": [{"name": "kube-proxy", "image": image}]}}}}),
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-proxy", "namespace": "kube-system"}}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kube-proxy"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
                "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system"}]}),
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-proxy", "namespace": "kube-system"}, "data": {"config.yaml": "mode: nftables\n"}}),
        ]
        .into_iter()
        .map(|v| SingleManifest { object: json_struct(&v) })
        .collect();
        let mut changed = vec![];
        changed.extend(self.put(
            "controlplane",
            MANIFESTS,
            "10-kube-proxy",
            ManifestSpec { items }.encode_to_vec(),
            format!("items: [DaemonSet kube-proxy ({image}), ServiceAccount kube-proxy, ClusterRoleBinding kube-proxy, ConfigMap kube-proxy]\n"),
        ));
        changed.extend(self.put(
            "controlplane",
            MANIFEST_STATUSES,
            "manifests",
            ManifestStatusSpec { manifests_applied: vec!["10-kube-proxy".into()] }.encode_to_vec(),
            "manifestsApplied: [10-kube-proxy]\n".into(),
        ));
        changed
    }

    fn resource(&self, key: &Key) -> Option<Resource> {
        self.resources.get(key).map(|r| to_resource(key, r))
    }
}

fn to_resource(key: &Key, r: &Res) -> Resource {
    Resource {
        metadata: Some(Metadata {
            namespace: key.0.clone(),
            r#type: key.1.clone(),
            id: key.2.clone(),
            version: r.version.to_string(),
            owner: String::new(),
            phase: "running".into(),
            created: None,
            updated: None,
            finalizers: vec![],
            labels: Default::default(),
            annotations: r.annotations.clone().into_iter().collect(),
        }),
        spec: Some(Spec { proto_spec: r.proto.clone(), yaml_spec: r.yaml.clone() }),
    }
}

fn json_struct(v: &serde_json::Value) -> Option<prost_types::Struct> {
    let serde_json::Value::Object(m) = v else { return None };
    Some(prost_types::Struct { fields: m.iter().map(|(k, v)| (k.clone(), json_value(v))).collect() })
}

fn json_value(v: &serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => {
            Kind::ListValue(prost_types::ListValue { values: a.iter().map(json_value).collect() })
        }
        serde_json::Value::Object(_) => Kind::StructValue(json_struct(v).unwrap_or_default()),
    };
    prost_types::Value { kind: Some(kind) }
}

/// Talos 1.13's `CanApplyImmediate`: the v1alpha1 documents compared with every allow-listed
/// field of the new one set back to the current value; any other difference needs a reboot.
pub fn can_apply_immediate(current: &serde_yaml::Value, new: &serde_yaml::Value) -> Result<(), String> {
    use serde_yaml::Value;
    let mut n = new.clone();
    let copy = |to: &mut Value, from: &Value, key: &str| {
        let Value::Mapping(t) = to else { return };
        match from.get(key) {
            Some(v) => {
                t.insert(Value::String(key.into()), v.clone());
            }
            None => {
                t.remove(key);
            }
        }
    };
    for key in ["debug", "cluster"] {
        copy(&mut n, current, key);
    }
    if let (Some(cm), Some(nm)) = (current.get("machine"), n.get_mut("machine")) {
        for key in [
            "ca",
            "acceptedCAs",
            "time",
            "certSANs",
            "install",
            "network",
            "sysfs",
            "sysctls",
            "logging",
            "controlPlane",
            "kubelet",
            "kernel",
            "registries",
            "pods",
            "seccompProfiles",
            "nodeLabels",
            "nodeTaints",
            "nodeAnnotations",
        ] {
            copy(nm, cm, key);
        }
        if let (Some(cf), Some(nf)) = (cm.get("features"), nm.get_mut("features"))
            && !cf.is_null()
            && !nf.is_null()
        {
            for key in ["kubernetesTalosAPIAccess", "kubePrism", "hostDNS", "imageCache", "nodeAddressSortAlgorithm"] {
                copy(nf, cf, key);
            }
        }
    }
    if &n == current {
        return Ok(());
    }
    let a = serde_yaml::to_string(current).unwrap_or_default();
    let b = serde_yaml::to_string(new).unwrap_or_default();
    let diff = similar::TextDiff::from_lines(&a, &b).unified_diff().context_radius(3).to_string();
    Err(format!("this config change can't be applied in immediate mode\ndiff:\n{diff}"))
}

/// The roles apid accepted for this call (put there by the certificate check).
#[derive(Clone, Debug)]
struct Roles(Vec<String>);

/// apid's check of the client certificate: exactly `clientAuth`, roles in the Organization.
#[allow(clippy::result_large_err)]
fn check_client(mut req: Request<()>) -> Result<Request<()>, Status> {
    let certs = req.peer_certs().ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let der = certs.first().ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let roles = client_roles(der.as_ref()).map_err(|e| Status::unauthenticated(e.to_string()))?;
    req.extensions_mut().insert(Roles(roles));
    Ok(req)
}

fn allowed<T>(req: &Request<T>, any_of: &[&str]) -> Result<(), Status> {
    let roles = req.extensions().get::<Roles>().map(|r| r.0.clone()).unwrap_or_default();
    if roles.iter().any(|r| r == "os:admin" || any_of.contains(&r.as_str())) {
        Ok(())
    } else {
        Err(Status::permission_denied("not authorized"))
    }
}

#[derive(Clone)]
struct Svc(Arc<Shared>);

impl Svc {
    /// The node a call is for: its single `node` header, else the endpoint's own; then its fault.
    async fn route<T>(&self, req: &Request<T>) -> Result<String, Status> {
        let values: Vec<_> = req.metadata().get_all("node").iter().collect();
        let node = match values.as_slice() {
            [] => self.0.endpoint_node.clone(),
            [one] => one.to_str().map_err(|_| Status::invalid_argument("node metadata is not text"))?.to_string(),
            _ => return Err(Status::invalid_argument("node metadata can only have one value")),
        };
        let (fault, away, changed) = {
            let mut nodes = self.0.nodes.lock().map_err(|_| Status::internal("simulated fleet state poisoned"))?;
            match nodes.get_mut(&node) {
                Some(n) => {
                    let changed = n.settle();
                    (n.current_fault(), n.away.is_some(), changed)
                }
                None => return Err(Status::unavailable(format!("connection error: no route to {node}"))),
            }
        };
        self.publish(&node, changed);
        if away {
            return Err(Status::unavailable(format!("connection error: {node} is rebooting")));
        }
        match fault {
            None => {}
            Some(Fault::Latency(d)) => tokio::time::sleep(d).await,
            Some(Fault::Unavailable) => return Err(Status::unavailable(format!("{node}: service unavailable"))),
            Some(Fault::Gone) => return Err(Status::unavailable(format!("connection error: {node} is unreachable"))),
            Some(Fault::Hang) => futures::future::pending::<()>().await,
        }
        Ok(node)
    }

    fn with_node<R>(&self, node: &str, f: impl FnOnce(&mut NodeState) -> R) -> Result<R, Status> {
        let mut nodes = self.0.nodes.lock().map_err(|_| Status::internal("simulated fleet state poisoned"))?;
        let n = nodes.get_mut(node).ok_or_else(|| Status::unavailable(format!("no route to {node}")))?;
        Ok(f(n))
    }

    fn publish(&self, node: &str, changed: Vec<(Key, Res)>) {
        for (key, res) in changed {
            let kind = match res.version {
                0 => EventType::Destroyed,
                1 => EventType::Created,
                _ => EventType::Updated,
            };
            let _ = self.0.events.send(Change { node: node.into(), res: to_resource(&key, &res), key, kind });
        }
    }

    /// Talos's validation, as Ichor's rules know it (what `config diff` reports as refused).
    fn validate(&self, minor: u32, current: &str, text: &str) -> Result<(), Status> {
        use render::config::Config;
        let new = Config::parse(text).map_err(|e| {
            Status::invalid_argument(format!(
                "failed to parse config: {}",
                e.first().map(|x| x.message.clone()).unwrap_or_default()
            ))
        })?;
        let old = Config::parse(current).unwrap_or_default();
        let contract = render::vocab::Contract { major: 1, minor };
        let contract = if self.0.classifier.known().contains(&contract) {
            contract
        } else {
            self.0.classifier.infer_contract(&[&new]).0
        };
        let changes = render::diff::changes(&old, &new);
        let outcome = self
            .0
            .classifier
            .classify_machine(contract, &changes, Some(&new), None, false)
            .map_err(|e| Status::internal(e.to_string()))?;
        if outcome.rejected.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = outcome.rejected.iter().map(|r| format!("\t* {}", r.message)).collect();
        Err(Status::invalid_argument(format!("{} error(s) occurred:\n{}", list.len(), list.join("\n"))))
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl MachineService for Svc {
    async fn apply_configuration(
        &self,
        req: Request<ApplyConfigurationRequest>,
    ) -> Result<Response<ApplyConfigurationResponse>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &[])?;
        let r = req.into_inner();
        let (minor, current) = self.with_node(&node, |n| {
            let key = ("config".to_string(), MACHINE_CONFIG.to_string(), "v1alpha1".to_string());
            let text = n
                .resources
                .get(&key)
                .map(|r| MachineConfigSpec::decode(r.proto.as_slice()).map(|m| m.yaml_marshalled).unwrap_or_default())
                .unwrap_or_default();
            (n.minor, String::from_utf8_lossy(&text).into_owned())
        })?;
        let text =
            String::from_utf8(r.data).map_err(|_| Status::invalid_argument("failed to parse config: not UTF-8"))?;
        let docs = {
            use serde::Deserialize;
            let mut docs = vec![];
            for d in serde_yaml::Deserializer::from_str(&text) {
                let v = serde_yaml::Value::deserialize(d)
                    .map_err(|e| Status::invalid_argument(format!("failed to parse config: {e}")))?;
                if !v.is_null() {
                    docs.push(v);
                }
            }
            docs
        };
        let Some(v1) = docs.iter().find(|d| d.get("kind").is_none()).cloned() else {
            return Err(Status::invalid_argument(
                "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?",
            ));
        };
        let mode = Mode::try_from(r.mode).map_err(|_| {
            Status::invalid_argument(format!("incorrect mode '{}' specified for the apply config call", r.mode))
        })?;
        if minor >= 14 && mode == Mode::Reboot {
            return Err(Status::unimplemented(
                "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead",
            ));
        }
        self.validate(minor, &current, &text)?;
        let current_v1 = yaml_docs(&current).into_iter().find(|d| d.get("kind").is_none()).unwrap_or_default();
        let (mode, details) = if minor >= 14 {
            match mode {
                Mode::Staged => (Mode::Staged, "Staged configuration to be applied after the next reboot".to_string()),
                Mode::Try => (Mode::Try, "Applied configuration without a reboot (try mode)".to_string()),
                _ => (Mode::NoReboot, "Applied configuration without a reboot".to_string()),
            }
        } else {
            let immediate = can_apply_immediate(&current_v1, &v1);
            match (mode, immediate) {
                (Mode::NoReboot | Mode::Try, Err(e)) => return Err(Status::invalid_argument(e)),
                (Mode::Auto, Err(e)) | (Mode::Reboot, Err(e)) => {
                    (Mode::Reboot, format!("Applied configuration with a reboot: {e}"))
                }
                (Mode::Reboot, Ok(())) => (Mode::Reboot, "Applied configuration with a reboot".to_string()),
                (Mode::Staged, _) => {
                    (Mode::Staged, "Staged configuration to be applied after the next reboot".to_string())
                }
                (Mode::Try, Ok(())) => (Mode::Try, "Applied configuration without a reboot (try mode)".to_string()),
                (Mode::Auto | Mode::NoReboot, Ok(())) => {
                    (Mode::NoReboot, "Applied configuration without a reboot".to_string())
                }
            }
        };
        let details =
            if r.dry_run { format!("Dry run summary:\n{details} (dry run: nothing was applied)") } else { details };
        if !r.dry_run {
            // REBOOT (1.13) persists the config and reboots: the node comes back running it.
            let changed = self.with_node(&node, |n| {
                let changed = n.set_config(&text, mode != Mode::Staged && mode != Mode::Reboot);
                if mode == Mode::Reboot {
                    n.go_down();
                }
                n.trigger(Trigger::Apply);
                changed
            })?;
            self.publish(&node, changed);
        }
        Ok(Response::new(ApplyConfigurationResponse {
            messages: vec![ApplyConfiguration {
                metadata: None,
                warnings: vec![],
                mode: mode as i32,
                mode_details: details,
            }],
        }))
    }

    async fn version(&self, req: Request<()>) -> Result<Response<VersionResponse>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &["os:operator", "os:reader"])?;
        let tag = self.with_node(&node, |n| n.spec.talos.clone())?;
        Ok(Response::new(VersionResponse {
            messages: vec![Version {
                metadata: None,
                version: Some(VersionInfo {
                    tag,
                    sha: "simulated".into(),
                    built: String::new(),
                    go_version: String::new(),
                    os: "linux".into(),
                    arch: "amd64".into(),
                }),
                platform: Some(PlatformInfo { name: "simulated".into(), mode: "metal".into() }),
                features: Some(FeaturesInfo { rbac: true }),
            }],
        }))
    }

    async fn reboot(&self, req: Request<RebootRequest>) -> Result<Response<RebootResponse>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &["os:operator"])?;
        let actor = self.with_node(&node, |n| {
            n.go_down();
            n.trigger(Trigger::Reboot);
            format!("reboot-{}-{}", n.spec.name, n.reboots)
        })?;
        Ok(Response::new(RebootResponse { messages: vec![Reboot { metadata: None, actor_id: actor }] }))
    }

    type KubeconfigStream = BoxStream<Data>;

    async fn kubeconfig(&self, req: Request<()>) -> Result<Response<Self::KubeconfigStream>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &[])?;
        let role = self.with_node(&node, |n| n.spec.role)?;
        if role != Role::Controlplane {
            return Err(Status::failed_precondition("kubeconfig is only available on control plane nodes"));
        }
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: https://{node}:6443\ncontexts:\n- name: admin@sim\n  context: {{cluster: sim, user: admin@sim}}\ncurrent-context: admin@sim\nusers:\n- name: admin@sim\n  user: {{}}\n"
        );
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o600);
        header.set_cksum();
        let mut tarball = tar::Builder::new(flate2::write::GzEncoder::new(vec![], flate2::Compression::default()));
        tarball.append_data(&mut header, "kubeconfig", text.as_bytes()).map_err(|e| Status::internal(e.to_string()))?;
        let gz = tarball.into_inner().and_then(|g| g.finish()).map_err(|e| Status::internal(e.to_string()))?;
        let stream = futures::stream::iter(vec![Ok(Data { metadata: None, bytes: gz })]);
        Ok(Response::new(Box::pin(stream)))
    }

    /// The legacy upgrade (before LifecycleService): installs the image's Talos and reboots
    /// the node into it (`stage` is not simulated).
    async fn upgrade(&self, req: Request<UpgradeRequest>) -> Result<Response<UpgradeResponse>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &[])?;
        let image = req.into_inner().image;
        let v = installed_version(&image)
            .ok_or_else(|| Status::invalid_argument(format!("{image}: the installer's tag is not a Talos version")))?;
        let actor = self.with_node(&node, |n| {
            n.pulls.push(("system".into(), image.clone()));
            n.installed = Some(v);
            n.go_down();
            n.trigger(Trigger::Reboot);
            format!("upgrade-{}-{}", n.spec.name, n.reboots)
        })?;
        Ok(Response::new(UpgradeResponse {
            messages: vec![Upgrade { metadata: None, ack: "Upgrade request received".into(), actor_id: actor }],
        }))
    }

    async fn image_pull(&self, req: Request<ImagePullRequest>) -> Result<Response<ImagePullResponse>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &["os:operator"])?;
        let r = req.into_inner();
        let ns = namespace(r.namespace)?;
        self.with_node(&node, |n| n.pulls.push((ns.to_string(), r.reference.clone())))?;
        Ok(Response::new(ImagePullResponse { messages: vec![ImagePull { metadata: None }] }))
    }
}

fn namespace(n: i32) -> Result<&'static str, Status> {
    match PbNs::try_from(n) {
        Ok(PbNs::NsSystem) => Ok("system"),
        Ok(PbNs::NsCri) => Ok("k8s.io"),
        _ => Err(Status::invalid_argument("unknown containerd namespace")),
    }
}

#[tonic::async_trait]
impl ImageService for Svc {
    type PullStream = BoxStream<ImageServicePullResponse>;

    async fn pull(&self, req: Request<ImageServicePullRequest>) -> Result<Response<Self::PullStream>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &["os:operator"])?;
        let minor = self.with_node(&node, |n| n.minor)?;
        if minor < 13 {
            return Err(Status::unimplemented("unknown service machine.ImageService"));
        }
        let r = req.into_inner();
        let ns = namespace(r.containerd.map(|c| c.namespace).unwrap_or_default())?;
        self.with_node(&node, |n| n.pulls.push((ns.to_string(), r.image_ref.clone())))?;
        use image_service_pull_response::Response as R;
        let stream = futures::stream::iter(vec![
            Ok(ImageServicePullResponse { response: Some(R::PullProgress(ImageServicePullProgress {})) }),
            Ok(ImageServicePullResponse { response: Some(R::Name(r.image_ref)) }),
        ]);
        Ok(Response::new(Box::pin(stream)))
    }
}

#[tonic::async_trait]
impl LifecycleService for Svc {
    type UpgradeStream = BoxStream<LifecycleServiceUpgradeResponse>;

    /// Installs the pulled installer's Talos (its image's tag), booted at the next reboot; no
    /// reboot here (talosctl reboots after it).
    async fn upgrade(
        &self,
        req: Request<LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &[])?;
        let minor = self.with_node(&node, |n| n.minor)?;
        if minor < 13 {
            return Err(Status::unimplemented("unknown service machine.LifecycleService"));
        }
        let image = req.into_inner().source.map(|s| s.image_name).unwrap_or_default();
        if image.is_empty() {
            return Err(Status::invalid_argument("upgrade image name is required"));
        }
        let pulled = self.with_node(&node, |n| n.pulls.iter().any(|(ns, r)| ns == "system" && r == &image))?;
        if !pulled {
            return Err(Status::failed_precondition(format!(
                "image {image} is not in containerd namespace system: pull it first (ImageService.Pull)"
            )));
        }
        use lifecycle_service_install_progress::Response as P;
        let progress = |p: P| {
            Ok(LifecycleServiceUpgradeResponse {
                progress: Some(LifecycleServiceInstallProgress { response: Some(p) }),
            })
        };
        let stream = match installed_version(&image) {
            Some(v) => {
                self.with_node(&node, |n| {
                    n.installed = Some(v.clone());
                    n.revision += 1;
                })?;
                vec![
                    progress(P::Message(format!("installing Talos {v} from {image}"))),
                    progress(P::Message("installation complete".into())),
                    progress(P::ExitCode(0)),
                ]
            }
            None => vec![
                progress(P::Message(format!("{image}: the installer's tag is not a Talos version"))),
                progress(P::ExitCode(1)),
            ],
        };
        Ok(Response::new(Box::pin(futures::stream::iter(stream))))
    }
}

/// The Talos version an installer image installs: its tag.
fn installed_version(image: &str) -> Option<String> {
    let tag = image.rsplit_once(':').map(|(_, t)| t)?;
    talos_minor(tag).map(|_| tag.to_string())
}

#[tonic::async_trait]
impl State for Svc {
    async fn get(&self, req: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &["os:operator", "os:reader"])?;
        let r = req.get_ref().clone();
        if r.r#type == MACHINE_CONFIG {
            // Sensitive: admin only (internal/app/resources/access.go).
            allowed(&req, &[])?;
        }
        let key = (r.namespace.clone(), r.r#type.clone(), r.id.clone());
        match self.with_node(&node, |n| n.resource(&key))? {
            Some(res) => Ok(Response::new(GetResponse { resource: Some(res) })),
            None => Err(Status::not_found(format!(
                "resource {}({}/{}@undefined) doesn't exist",
                r.r#type, r.namespace, r.id
            ))),
        }
    }

    type ListStream = BoxStream<ListResponse>;

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<Self::ListStream>, Status> {
        let node = self.route(&req).await?;
        allowed(&req, &["os:operator", "os:reader"])?;
        let r = req.get_ref().clone();
        if r.r#type == MACHINE_CONFIG {
            allowed(&req, &[])?;
        }
        let items = self.with_node(&node, |n| {
            n.resources
                .iter()
                .filter(|(k, _)| k.0 == r.namespace && k.1 == r.r#type)
                .map(|(k, v)| Ok(ListResponse { resource: Some(to_resource(k, v)) }))
                .collect::<Vec<_>>()
        })?;
        Ok(Response::new(Box::pin(futures::stream::iter(items))))
    }

    type WatchStream = BoxStream<WatchResponse>;

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        use futures::StreamExt;
        let node = self.route(&req).await?;
        allowed(&req, &["os:operator", "os:reader"])?;
        let r = req.get_ref().clone();
        if r.r#type == MACHINE_CONFIG {
            allowed(&req, &[])?;
        }
        let rx = self.0.events.subscribe();
        let matches = {
            let r = r.clone();
            move |k: &Key| k.0 == r.namespace && k.1 == r.r#type && r.id.as_ref().is_none_or(|id| &k.2 == id)
        };
        let bootstrap = r.options.as_ref().is_some_and(|o| o.bootstrap_contents);
        let mut first = vec![];
        if bootstrap {
            let current = self.with_node(&node, |n| {
                n.resources.iter().filter(|(k, _)| matches(k)).map(|(k, v)| to_resource(k, v)).collect::<Vec<_>>()
            })?;
            for res in current {
                first.push(Ok(WatchResponse {
                    event: vec![Event {
                        resource: Some(res),
                        event_type: EventType::Created as i32,
                        old: None,
                        error: None,
                        bookmark: None,
                    }],
                }));
            }
            first.push(Ok(WatchResponse {
                event: vec![Event {
                    resource: None,
                    event_type: EventType::Bootstrapped as i32,
                    old: None,
                    error: None,
                    bookmark: None,
                }],
            }));
        }
        let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |c| {
            let keep = match c {
                Ok(c) if c.node == node && matches(&c.key) => Some(Ok(WatchResponse {
                    event: vec![Event {
                        resource: Some(c.res),
                        event_type: c.kind as i32,
                        old: None,
                        error: None,
                        bookmark: None,
                    }],
                })),
                Ok(_) => None,
                Err(_) => Some(Err(Status::data_loss("the watch fell behind; watch again"))),
            };
            futures::future::ready(keep)
        });
        Ok(Response::new(Box::pin(futures::stream::iter(first).chain(live))))
    }
}

impl Fleet {
    /// Starts a fleet on `bind` (port 0 picks one). The first control plane is the endpoint's
    /// own node (it answers calls that name none).
    pub async fn start(nodes: Vec<NodeSpec>, bind: SocketAddr) -> Result<Fleet, SimError> {
        let pki = Pki::generate()?;
        let endpoint_node =
            nodes.iter().find(|n| n.role == Role::Controlplane).or(nodes.first()).map(|n| n.name.clone()).ok_or_else(
                || SimError::Node { node: String::new(), problem: "a fleet needs at least one node".into() },
            )?;
        let mut map = BTreeMap::new();
        for n in nodes {
            if map.contains_key(&n.name) {
                return Err(SimError::Node { node: n.name, problem: "listed twice".into() });
            }
            map.insert(n.name.clone(), NodeState::new(n)?);
        }
        let classifier = render::classify::Classifier::new(&render::classify::RuleSet::embedded())
            .map_err(|e| SimError::Node { node: String::new(), problem: format!("the embedded rules: {e}") })?;
        let (events, _) = tokio::sync::broadcast::channel(4096);
        let shared = Arc::new(Shared { nodes: Mutex::new(map), endpoint_node, classifier, events });
        // TCP_NODELAY, as apid serves: without it every small answer waits for a delayed ACK.
        let incoming = tonic::transport::server::TcpIncoming::bind(bind)
            .map_err(|source| SimError::Listen { addr: bind, source })?
            .with_nodelay(Some(true));
        let addr = incoming.local_addr().map_err(|source| SimError::Listen { addr: bind, source })?;
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(&pki.server_crt_pem, &pki.server_key_pem))
            .client_ca_root(Certificate::from_pem(&pki.ca_pem));
        let svc = Svc(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = Server::builder()
            .tls_config(tls)
            .map_err(|e| SimError::Tls(e.to_string()))?
            .add_service(tonic::service::interceptor::InterceptedService::new(
                MachineServiceServer::new(svc.clone()).max_decoding_message_size(32 << 20),
                check_client,
            ))
            .add_service(ImageServiceServer::with_interceptor(svc.clone(), check_client))
            .add_service(LifecycleServiceServer::with_interceptor(svc.clone(), check_client))
            .add_service(StateServer::with_interceptor(svc, check_client));
        tokio::spawn(async move {
            let _ = server
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Fleet { shared, addr, pki, stop: Some(stop) })
    }

    /// The nodes, in name order.
    pub fn nodes(&self) -> Vec<String> {
        self.shared.nodes.lock().map(|n| n.keys().cloned().collect()).unwrap_or_default()
    }

    /// A client certificate of this fleet's CA.
    pub fn client_cert(&self, spec: &ClientSpec) -> Result<ClientCert, PkiError> {
        self.pki.client(spec)
    }

    /// A talosconfig (context `sim`) whose certificate carries `roles`.
    pub fn talosconfig(&self, roles: &[&str]) -> Result<String, PkiError> {
        let client = self.pki.client(&ClientSpec::talos(roles))?;
        Ok(self.pki.talosconfig("sim", &[self.addr.to_string()], &self.nodes(), &client))
    }

    /// Injects (or, with `None`, clears) a fault on one node.
    pub fn set_fault(&self, node: &str, fault: Option<Fault>) {
        if let Ok(mut nodes) = self.shared.nodes.lock()
            && let Some(n) = nodes.get_mut(node)
        {
            n.fault = fault;
            n.fault_until = None;
            n.revision += 1;
        }
    }

    /// Arms a fault that starts on the node's next apply or reboot (replacing one armed before).
    pub fn arm_fault(&self, node: &str, armed: ArmedFault) {
        if let Ok(mut nodes) = self.shared.nodes.lock()
            && let Some(n) = nodes.get_mut(node)
        {
            n.armed = Some(armed);
        }
    }

    /// The images pulled on a node: (containerd namespace, reference), in order.
    pub fn pulls(&self, node: &str) -> Vec<(String, String)> {
        self.shared.nodes.lock().ok().and_then(|n| n.get(node).map(|n| n.pulls.clone())).unwrap_or_default()
    }

    /// How many times the node rebooted (MachineService.Reboot, or Talos 1.13's AUTO or REBOOT apply).
    pub fn reboots(&self, node: &str) -> u32 {
        self.shared.nodes.lock().ok().and_then(|n| n.get(node).map(|n| n.reboots)).unwrap_or_default()
    }

    /// How long a reboot keeps the node away (default `DEFAULT_REBOOT_TIME`); `None`: a fault,
    /// the node never comes back.
    pub fn set_reboot_time(&self, node: &str, time: Option<Duration>) {
        if let Ok(mut nodes) = self.shared.nodes.lock()
            && let Some(n) = nodes.get_mut(node)
        {
            n.reboot_time = time;
        }
    }

    /// Makes the node's next installed Talos fail to boot (it boots its previous system, as
    /// Talos's A/B fallback does), or, with `false`, boot.
    pub fn set_upgrade_fails(&self, node: &str, fails: bool) {
        if let Ok(mut nodes) = self.shared.nodes.lock()
            && let Some(n) = nodes.get_mut(node)
        {
            n.upgrade_fails = fails;
        }
    }

    /// The Talos version the node runs now.
    pub fn talos_version(&self, node: &str) -> Option<String> {
        self.shared.nodes.lock().ok().and_then(|n| n.get(node).map(|n| n.spec.talos.clone()))
    }

    /// The node's revision (see `NodeState::revision`), after settling a reboot that is over.
    pub fn revision(&self, node: &str) -> Option<u64> {
        let mut nodes = self.shared.nodes.lock().ok()?;
        let n = nodes.get_mut(node)?;
        let changed = n.settle();
        let r = n.revision;
        drop(nodes);
        Svc(self.shared.clone()).publish(node, changed);
        Some(r)
    }

    /// The node's boot ID, `None` while it is away rebooting. A node whose reboot is over comes
    /// back here as on a call.
    pub fn boot_id(&self, node: &str) -> Option<String> {
        let mut nodes = self.shared.nodes.lock().ok()?;
        let n = nodes.get_mut(node)?;
        let changed = n.settle();
        let id = n.away.is_none().then(|| n.boot_id());
        drop(nodes);
        Svc(self.shared.clone()).publish(node, changed);
        id
    }
}

/// A fleet of `count` nodes: `controlplanes` named cp1.., the rest w1..; versions assigned in
/// turn from `talos`.
pub fn fleet_spec(count: usize, controlplanes: usize, talos: &[String]) -> Vec<NodeSpec> {
    (0..count)
        .map(|i| {
            let (name, role) = if i < controlplanes {
                (format!("cp{}", i + 1), Role::Controlplane)
            } else {
                (format!("w{}", i + 1 - controlplanes), Role::Worker)
            };
            NodeSpec {
                name,
                role,
                talos: talos.get(i % talos.len().max(1)).cloned().unwrap_or_else(|| "v1.14.3".into()),
                config: None,
            }
        })
        .collect()
}
