//! The observed state: what the controller sees at one reconcile, as one plain value.
//!
//! Start at `ObservedState`. It is the input of `ichor plan --state SNAPSHOT.yaml` and what the
//! controller would dump; docs/operations.md documents the format with a full example. Times are RFC
//! 3339 UTC (`2026-11-29T10:00:00Z`). `ObservedState::parse` checks what the rules cannot:
//! the YAML itself, required fields, a machine listed twice, a clock in the future of `now`,
//! versions that do not parse, an operation kind the rules do not know.

use render::api::{CniPreset, Handover, KubeProxyMode, MachinePhase, OperationKind, Phase, Role};
use render::vocab::Class;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObservedState {
    /// The reconcile's clock.
    pub now: String,
    pub cluster: Cluster,
    pub machines: Vec<Machine>,
    #[serde(default)]
    pub workload: Workload,
    /// The operation being reconciled.
    pub operation: Operation,
    /// Other operations of the cluster (for the lock).
    #[serde(default)]
    pub other_operations: Vec<OtherOperation>,
    /// A release's stage operations (those labelled with it), when the operation is a release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stage_operations: Vec<StageOperation>,
    /// The custom resources did not render (or load), with every problem: the snapshot then has
    /// no machines, and the rules pause the operation unless it has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs_rejected: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cluster {
    pub name: String,
    pub kubernetes_version: String,
    /// The release set's Kubernetes (ADR 0113): the only target an upgrade may have.
    pub release_set_kubernetes: String,
    /// The release set's Talos (`ichor upgrade cluster`'s target; absent in older snapshots).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub release_set_talos: String,
    pub cni: Cni,
    /// `status.cni.kubeProxy`, when a switch has set it.
    #[serde(default)]
    pub status_kube_proxy: Option<KubeProxyMode>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The user's layer of Cilium values (spec.cni.cilium.values).
    #[serde(default)]
    pub cilium_values: Option<serde_json::Value>,
    /// spec.cni.cilium.tunnelProtocol.
    #[serde(default)]
    pub cilium_tunnel: Option<String>,
    /// The cluster's maintenance windows at the reconcile's clock (`spec.maintenanceWindows`),
    /// when it has some: the host reads them (`runtime::window`), the rules gate the steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceAt>,
    /// The cluster's health checks at the reconcile (`spec.healthChecks`), each object's result:
    /// the host reads the objects and evaluates the CEL (`runtime::health`), the rules gate the
    /// steps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health: Vec<crate::health::HealthAt>,
    /// `status.cni.adoption`: the operation that adopted a Cilium someone else installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cilium_adoption: Option<render::api::CiliumAdoption>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cni {
    pub preset: CniPreset,
    pub kube_proxy: KubeProxyMode,
    pub handover: Handover,
    /// The CNIHandover condition is True.
    #[serde(default)]
    pub handover_done: bool,
    /// Where Cilium's values live before the hand-over: the TalosConfigPatch carrying the
    /// inline-manifest entry.
    #[serde(default)]
    pub bootstrap_patch: Option<String>,
    /// What the values' home says for kubeProxyReplacement (`true`/`false`): the bootstrap
    /// patch's inline-manifest entry, or the cilium Application's Helm values in Git after the
    /// hand-over. Absent when not read. Once it says the switch's target, `AwaitingCNIChange`
    /// is over and the plan waits for the rollout.
    #[serde(default)]
    pub home_kube_proxy_replacement: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    pub name: String,
    pub role: Role,
    pub talos_version: String,
    pub kubelet_version: String,
    pub ready: bool,
    /// The hold annotation is set.
    #[serde(default)]
    pub hold: bool,
    /// The controller runs on this node (it goes last among kubelets).
    #[serde(default)]
    pub runs_controller: bool,
    /// Paths where the node differs from its render, with their classes.
    #[serde(default)]
    pub pending: Vec<PendingPath>,
    /// Control-plane static pods by component: image and readiness.
    #[serde(default)]
    pub static_pods: BTreeMap<String, StaticPod>,
    /// The config contract the machine's Talos speaks (`v1.14`, ...), when known.
    #[serde(default)]
    pub contract: Option<render::vocab::Contract>,
    /// A control plane's Talos has rendered kube-proxy's manifest (`k8s.Manifest` resources):
    /// the restore goes through such a machine. Absent: not observed, assumed rendered (the
    /// restore reads what Talos has and applies nothing when there is nothing).
    #[serde(default)]
    pub kube_proxy_manifest_rendered: Option<bool>,
    /// The TalosMachine's conditions that are True or False with a reason, by type (for
    /// example `Ready: KubeProxySwitchPending`).
    #[serde(default)]
    pub conditions: BTreeMap<String, String>,
    /// How the Talos API reaches the node (its address, the `node` header): actions that call
    /// Talos carry it. Absent: reached by its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The OS its Node reports (`status.nodeInfo.osImage`, `Talos (v1.14.6)`), when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_image: Option<String>,
    /// The boot the node is on (its Node's `status.nodeInfo.bootID`), when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The boot the node's Talos says it is on (its `BootID` resource, Talos 1.14 and later),
    /// when Talos answered this reconcile: ahead of the Node's, which follows only once the
    /// kubelet posts on the new boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talos_boot_id: Option<String>,
    /// Reboot-class paths applied within the node's current boot, not in effect until the next
    /// (its TalosMachine's `status.appliedAwaitingReboot`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_reboot: Vec<String>,
    /// Talos services not running and healthy (`etcd`, ...), as its Talos reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_services: Vec<String>,
    /// Its Node carries Ichor's cordon mark and is unschedulable: an operation's step cordoned
    /// it, and nobody uncordoned it since.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordoned: bool,
    /// Its Node carries Ichor's `PreferNoSchedule` taint (`ichor.maesh.dev/next`): an operation
    /// put it on as the next machine to drain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tainted: bool,
    /// The PodDisruptionBudgets that would refuse a drain of its Node now (a preview reads
    /// them; a reconcile does not, its step's drain finds them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_refusals: Vec<DrainRefusal>,
}

/// A PodDisruptionBudget that allows no disruption now and selects pods on a Node a drain
/// would evict.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrainRefusal {
    /// `namespace/name`.
    pub budget: String,
    /// The pods it selects on the Node (`namespace/name`), sorted.
    pub pods: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingPath {
    pub path: String,
    pub class: Class,
    #[serde(default)]
    pub applied_by: Option<OperationKind>,
    #[serde(default)]
    pub restarts: Vec<String>,
    /// The render's value (an image, for the pre-pull).
    #[serde(default)]
    pub new: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticPod {
    pub image: String,
    pub ready: bool,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// cilium-config's kube-proxy-replacement (`true`/`false`); absent when there is no cilium-config.
    #[serde(default)]
    pub cilium_kube_proxy_replacement: Option<String>,
    /// cilium-config's `k8s-service-host` and `k8s-service-port`, as read with it. When
    /// `ciliumConfigRead` is true, an absent key is a missing key.
    #[serde(default)]
    pub cilium_k8s_service_host: Option<String>,
    #[serde(default)]
    pub cilium_k8s_service_port: Option<String>,
    /// The whole cilium-config was read (its absent keys are absent, not unknown).
    #[serde(default)]
    pub cilium_config_read: bool,
    /// The Cilium chart version of the Helm release running (`1.20.4`).
    #[serde(default)]
    pub cilium_chart_version: Option<String>,
    /// The Argo CD Application `cilium` (after the hand-over): absent when it does not exist.
    #[serde(default)]
    pub argocd_application: Option<ArgoApplication>,
    /// kube-system ServiceAccount kube-proxy exists. Absent: not observed, assumed present while
    /// kube-proxy's DaemonSet or a ConfigMap is (a delete of a missing object is a no-op).
    #[serde(default)]
    pub kube_proxy_service_account: Option<bool>,
    /// ClusterRoleBinding kube-proxy exists; absent as for the ServiceAccount.
    #[serde(default)]
    pub kube_proxy_cluster_role_binding: Option<bool>,
    #[serde(default)]
    pub cilium_daemon_set: Option<DaemonSet>,
    #[serde(default)]
    pub kube_proxy_daemon_set: Option<DaemonSet>,
    /// Names of kube-system ConfigMaps named kube-proxy or kube-proxy-<checksum>.
    #[serde(default)]
    pub kube_proxy_config_maps: Vec<String>,
    /// The kubernetes Service's cluster IP answered from the controller.
    #[serde(default)]
    pub kubernetes_service_answers: bool,
    /// Where the controller probed the kubernetes Service (`10.96.0.1:443, from
    /// KUBERNETES_SERVICE_HOST`): what the switch's wait names.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubernetes_service_probe: String,
    /// APIs requested that the target release removes: `{api, removedIn}`.
    #[serde(default)]
    pub removed_apis_in_use: Vec<RemovedApi>,
    /// Why the API server's removed-API scrape failed, when it did (recorded as Unknown: a
    /// warning, never a gate).
    #[serde(default)]
    pub removed_apis_check_failed: Option<String>,
    /// Cilium Jobs that failed, by the kube-proxy mode they ran for, with why (Helm's error).
    #[serde(default)]
    pub cilium_jobs_failed: BTreeMap<KubeProxyMode, String>,
    /// Ichor's Cilium Jobs still running that are not this operation's (the values reconciler's,
    /// or another operation's): Helm runs one change of the release at a time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cilium_jobs_in_flight: Vec<String>,
    /// This operation's Cilium Jobs that succeeded, by the kube-proxy mode they ran for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cilium_jobs_succeeded: Vec<KubeProxyMode>,
    /// cilium-config's `ipam` (the IPAM mode Cilium runs); absent when the key is (Cilium's
    /// default then, which the rules name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cilium_ipam: Option<String>,
    /// Who manages the cilium DaemonSet besides Ichor, as its labels and annotations say
    /// (`runtime::handover::cilium_owners`): a Helm release, an Argo CD application, Flux.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cilium_owners: Vec<CiliumOwner>,
}

/// A manager of the cilium DaemonSet: `helm` with `namespace/release` (Helm's ownership
/// annotations), `argocd` with its tracking id or instance, `flux` with its object's name.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CiliumOwner {
    pub kind: String,
    pub name: String,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArgoApplication {
    /// health.status: Healthy, Progressing, Degraded, Missing, Unknown.
    pub health: String,
    /// sync.status: Synced, OutOfSync, Unknown.
    pub sync: String,
    /// What its Helm values say of kubeProxyReplacement (`true`/`false`); absent when they do
    /// not say (the values' home after the hand-over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy_replacement: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonSet {
    pub desired: i64,
    pub updated: i64,
    pub ready: i64,
    pub generation: i64,
    pub observed_generation: i64,
    #[serde(default)]
    pub image: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemovedApi {
    pub api: String,
    pub removed_in: String,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Operation {
    pub name: String,
    pub kind: OperationKind,
    #[serde(default)]
    pub target_kubernetes: Option<String>,
    #[serde(default)]
    pub target_kube_proxy: Option<KubeProxyMode>,
    /// The machines a config rollout takes (empty: every machine with a reboot-class change).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_machines: Vec<String>,
    /// The Cilium chart a Cilium upgrade moves the release to (the embedded one when it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_cilium_chart: Option<String>,
    /// The Talos version a Talos upgrade moves the machines to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_talos: Option<String>,
    /// The installer image of the target Talos (render::render::installer_image_at).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talos_installer: Option<String>,
    /// The user consented to a Talos downgrade.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_downgrade: bool,
    /// The user consented to delete, at the drain's deadline, the pods a budget still keeps
    /// (`spec.forceDrain`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_drain: bool,
    /// How long a drain may wait for a PodDisruptionBudget, seconds (the controller's
    /// `--drain-timeout`; unset: the rules' default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline: Option<i64>,
    #[serde(default = "one")]
    pub max_unavailable: i64,
    /// The phase held in status.
    pub phase: Phase,
    /// What the user asked of the operation through its annotations (`ichor operation
    /// abort|resume`); the rules move the phase.
    #[serde(default, skip_serializing_if = "Intent::is_empty")]
    pub intent: Intent,
    /// Why it paused, when it did.
    #[serde(default)]
    pub paused_reason: Option<String>,
    /// Per-machine progress held in status (the resume markers).
    #[serde(default, deserialize_with = "strict_progress")]
    pub machines: BTreeMap<String, MachineProgress>,
    /// Wait clocks held in status, by the name the wait gave (`AwaitingCNIChange`,
    /// `VerifyingNewSide/CiliumRollingOut`, ...): recorded by a wait, cleared by the plan once
    /// no wait runs on it.
    #[serde(default)]
    pub waiting_since: BTreeMap<String, String>,
    /// Steps done once for the whole cluster (manifestsSynced, kubeProxyDeleted, ...).
    #[serde(default)]
    pub done: Vec<String>,
    /// The waits the last plan made (status.waits): what `ichor status` shows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<render::api::WaitStatus>,
    /// The machines the last plan still had work on (status.machinesLeft).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines_left: Vec<String>,
    /// A release's stages held in status (status.stages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<render::api::ReleaseStage>,
    /// The release this operation is a stage of (its `ichor.maesh.dev/release` label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
}

fn one() -> i64 {
    1
}

impl Operation {
    /// An operation of `kind` named `name` as it is created: `Pending`, one machine at a time,
    /// no target, nothing recorded (a fixture's start: set the rest with `..`).
    pub fn new(name: &str, kind: OperationKind) -> Operation {
        Operation {
            name: name.to_string(),
            kind,
            target_kubernetes: None,
            target_kube_proxy: None,
            target_machines: vec![],
            target_cilium_chart: None,
            target_talos: None,
            talos_installer: None,
            allow_downgrade: false,
            force_drain: false,
            drain_deadline: None,
            max_unavailable: 1,
            phase: Phase::Pending,
            intent: Intent::default(),
            paused_reason: None,
            machines: BTreeMap::new(),
            waiting_since: BTreeMap::new(),
            done: vec![],
            waits: vec![],
            machines_left: vec![],
            stages: vec![],
            release: None,
        }
    }
}

/// The user's intent, read from the operation's annotations (`render::api::ABORT`, `RESUME`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Intent {
    /// `ichor operation abort` was asked for.
    #[serde(default)]
    pub abort: bool,
    /// The resume counter of the annotation.
    #[serde(default)]
    pub resume: u64,
    /// The resume requests already acted on (`status.resumed`).
    #[serde(default)]
    pub resumed: u64,
}

impl Intent {
    fn is_empty(&self) -> bool {
        *self == Intent::default()
    }

    /// A resume was asked for that the controller has not acted on yet.
    pub fn resume_pending(&self) -> bool {
        self.resume > self.resumed
    }

    /// The intent held in an operation's annotations and status.
    pub fn of(annotations: Option<&BTreeMap<String, String>>, status_resumed: u64) -> Intent {
        let get = |k: &str| annotations.and_then(|a| a.get(k));
        Intent {
            abort: get(render::api::ABORT).is_some(),
            resume: get(render::api::RESUME).and_then(|v| v.trim().parse().ok()).unwrap_or(0),
            resumed: status_resumed,
        }
    }
}

/// One machine's step, as the TalosOperation's status holds it (one type: `render::api`).
pub use render::api::MachineProgress;

/// A snapshot's `operation.machines`, read strictly (an unknown field is an error, as everywhere
/// in a snapshot) into the status's own type.
fn strict_progress<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, MachineProgress>, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Strict {
        phase: MachinePhase,
        #[serde(default)]
        stage: Option<String>,
        started_at: String,
        #[serde(default)]
        boot_id: Option<String>,
    }
    let read: BTreeMap<String, Strict> = BTreeMap::deserialize(d)?;
    Ok(read
        .into_iter()
        .map(|(k, s)| {
            (k, MachineProgress { phase: s.phase, stage: s.stage, started_at: Some(s.started_at), boot_id: s.boot_id })
        })
        .collect())
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OtherOperation {
    pub name: String,
    pub kind: OperationKind,
    pub phase: Phase,
}

/// The maintenance windows at one time: one is open, or when the next opens; or why they
/// cannot be read (each with its field path).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaintenanceAt {
    #[serde(default)]
    pub open: bool,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_start: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl MaintenanceAt {
    /// The windows of a spec at `now` (seconds since 1970); none when the spec has none.
    pub fn of(windows: &[render::api::MaintenanceWindow], now: i64) -> Option<MaintenanceAt> {
        if windows.is_empty() {
            return None;
        }
        Some(match crate::window::at(windows, now) {
            Ok(w) => MaintenanceAt { open: w.open, next_start: w.next_start.map(rfc3339), problems: vec![] },
            Err(p) => MaintenanceAt { problems: p.iter().map(ToString::to_string).collect(), ..Default::default() },
        })
    }
}

/// An operation a release created for one of its stages.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StageOperation {
    pub name: String,
    pub kind: OperationKind,
    /// Its target (a version, a chart; empty for a config rollout).
    #[serde(default)]
    pub target: String,
    pub phase: Phase,
    /// Why it paused, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_reason: Option<String>,
}

/// A snapshot problem, naming the field.
/// One problem of a snapshot: the field at fault (or `line L, column C` for YAML errors).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct StateError {
    pub field: String,
    pub message: String,
}

impl StateError {
    /// What the bounded YAML reader refused, at its line and column.
    pub fn of_yaml(e: render::yaml::YamlError) -> StateError {
        let field = match (e.line, e.col) {
            (Some(l), Some(c)) => format!("line {l}, column {c}"),
            _ => "the snapshot".to_string(),
        };
        StateError { field, message: e.message }
    }

    /// What the typed decode refused, at its line and column, with no value quoted
    /// (`render::yaml::scrub`: a tagged secret is never shown).
    pub fn of_serde(e: &serde_yaml::Error) -> StateError {
        let field = e.location().map(|l| format!("line {}, column {}", l.line(), l.column())).unwrap_or_default();
        let msg = render::yaml::scrub(&e.to_string());
        // serde_yaml appends "at line X column Y": the field says it.
        StateError { field, message: msg.split(" at line ").next().unwrap_or(&msg).to_string() }
    }
}

/// What one probe of the kubernetes Service found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeResult {
    pub answers: bool,
    /// Where it was probed and how that address was chosen.
    pub target: String,
}

/// RFC 3339 UTC from seconds since 1970.
pub fn rfc3339(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// Seconds since 1970 of an RFC 3339 UTC time (`YYYY-MM-DDTHH:MM:SSZ`).
pub fn epoch(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' || b[19] != b'Z'
    {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s[r].parse::<i64>().ok();
    let (y, mo, d, h, mi, se) = (n(0..4)?, n(5..7)?, n(8..10)?, n(11..13)?, n(14..16)?, n(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + se)
}

/// The operation kinds the shipped rules plan (the others are the controller's, not yet rules).
pub const KINDS: [OperationKind; 7] = [
    OperationKind::Kubernetes,
    OperationKind::Talos,
    OperationKind::Cni,
    OperationKind::Config,
    OperationKind::CniUpgrade,
    OperationKind::CniAdopt,
    OperationKind::Release,
];

/// The most a snapshot may hold once its aliases are expanded (a 5,000-machine snapshot is a
/// few MiB).
pub const SNAPSHOT_EXPANDED_BYTES: usize = 64 << 20;

fn version_ok(v: &str) -> bool {
    engine::parse_version(v).is_some()
}

impl ObservedState {
    /// Parses and checks a snapshot; every problem names its field.
    pub fn parse(text: &str) -> Result<ObservedState, Vec<StateError>> {
        // The one bounded reader first: aliases cannot expand a small file past the cap.
        // (Its value is dropped: the typed decode below keeps serde's positions for its errors.)
        render::yaml::parse(text, SNAPSHOT_EXPANDED_BYTES).map_err(|e| vec![StateError::of_yaml(e)])?;
        ObservedState::decode(text)
    }

    /// `parse` of a text the bounded reader has read already: the typed decode and the check.
    pub(crate) fn decode(text: &str) -> Result<ObservedState, Vec<StateError>> {
        let s: ObservedState = serde_yaml::from_str(text).map_err(|e| vec![StateError::of_serde(&e)])?;
        s.check()?;
        Ok(s)
    }

    /// Checks what the rules cannot (the snapshot as typed, with no YAML in between: the
    /// controller checks what it assembled with this); every problem names its field.
    pub fn check(&self) -> Result<(), Vec<StateError>> {
        let s = self;
        let mut errors = vec![];
        let mut err = |field: String, message: String| errors.push(StateError { field, message });
        let now = epoch(&s.now);
        if now.is_none() {
            err("now".into(), format!("{:?} is not an RFC 3339 UTC time (YYYY-MM-DDTHH:MM:SSZ)", s.now));
        }
        let mut clock = |field: String, t: &str| match (epoch(t), now) {
            (None, _) => err(field, format!("{t:?} is not an RFC 3339 UTC time (YYYY-MM-DDTHH:MM:SSZ)")),
            (Some(x), Some(n)) if x > n => err(
                field,
                format!("{t} is in the future of now ({}): a clock cannot start later than the reconcile", s.now),
            ),
            _ => {}
        };
        for (m, p) in &s.operation.machines {
            clock(format!("operation.machines.{m}.startedAt"), p.started_at.as_deref().unwrap_or_default());
        }
        for (r, t) in &s.operation.waiting_since {
            clock(format!("operation.waitingSince.{r}"), t);
        }
        let mut err = |field: String, message: String| errors.push(StateError { field, message });
        if !KINDS.contains(&s.operation.kind) {
            let known: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
            err(
                "operation.kind".into(),
                format!("{:?} is not an operation kind the rules know ({})", s.operation.kind.name(), known.join(", ")),
            );
        }
        for (field, v) in [
            ("cluster.kubernetesVersion", &s.cluster.kubernetes_version),
            ("cluster.releaseSetKubernetes", &s.cluster.release_set_kubernetes),
        ] {
            if !version_ok(v) {
                err(field.into(), format!("{v:?} is not a version (vX.Y.Z)"));
            }
        }
        if let Some(t) = &s.operation.target_kubernetes
            && !version_ok(t)
        {
            err("operation.targetKubernetes".into(), format!("{t:?} is not a version (vX.Y.Z)"));
        }
        if let Some(t) = &s.operation.target_talos
            && !version_ok(t)
        {
            err("operation.targetTalos".into(), format!("{t:?} is not a version (vX.Y.Z)"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, m) in s.machines.iter().enumerate() {
            if !seen.insert(m.name.clone()) {
                err(format!("machines[{i}].name"), format!("machine {:?} is listed twice", m.name));
            }
            for (f, v) in [("talosVersion", &m.talos_version), ("kubeletVersion", &m.kubelet_version)] {
                if !version_ok(v) {
                    err(format!("machines[{i}].{f}"), format!("{v:?} is not a version (vX.Y.Z)"));
                }
            }
        }
        let w = &s.workload;
        for (field, v) in [
            ("workload.ciliumKubeProxyReplacement", &w.cilium_kube_proxy_replacement),
            ("cluster.cni.homeKubeProxyReplacement", &s.cluster.cni.home_kube_proxy_replacement),
        ] {
            if let Some(v) = v
                && v != "true"
                && v != "false"
            {
                err(field.into(), format!("{v:?} is not true or false"));
            }
        }
        if let Some(v) = &w.cilium_chart_version
            && !version_ok(v)
        {
            err("workload.ciliumChartVersion".into(), format!("{v:?} is not a version (X.Y.Z)"));
        }
        // Without a render there are no machines to list (the progress is kept as it was).
        for m in s.operation.machines.keys().filter(|_| s.inputs_rejected.is_none()) {
            if !s.machines.iter().any(|x| &x.name == m) {
                err(format!("operation.machines.{m}"), "progress for a machine the snapshot does not list".into());
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }
}
