//! The custom resources Ichor reconciles (group `ichor.maesh.dev`, version `v1alpha1`).
//!
//! Start at `TalosClusterSpec`. The CRDs are derived from these types (`kube`'s derive with
//! `schemars`), printed by `ichor crds`, and the shipped example manifests are validated
//! against them in a test. Field names follow Kubernetes conventions (camelCase, conditions
//! with type/status/reason/message); where the design documents are silent docs/resources.md says
//! what was chosen and why.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API group of Ichor's custom resources.
pub const GROUP: &str = "ichor.maesh.dev";
/// The consent annotation of ADR 0066: its value names the kube-proxy mode a switch targets.
pub const CONFIRM_KUBE_PROXY_SWITCH: &str = "ichor.maesh.dev/confirm-kube-proxy-switch";
/// A machine that an operation must skip (ADR 0026 hold annotations).
pub const HOLD: &str = "ichor.maesh.dev/hold";
/// On a Node: Ichor cordoned it for an operation's step (and uncordons it), so a step whose
/// record was lost to a crash is still uncordoned; a cordon by someone else carries no such mark.
pub const CORDONED: &str = "ichor.maesh.dev/cordoned";
/// Ichor's taint (effect `PreferNoSchedule`) on the Node an operation drains next: the pods
/// the drains before it evict prefer other nodes (issue 53; omni#846).
pub const NEXT_TAINT: &str = "ichor.maesh.dev/next";
/// The user's intent to end an operation (`ichor operation abort`): the controller's rules
/// move it to `Aborted` at their next reconcile. Any value counts; abort is final.
pub const ABORT: &str = "ichor.maesh.dev/abort";
/// The user's intent to resume a paused operation (`ichor operation resume`): a counter the
/// CLI raises by one; the controller's rules resume the operation when it is above
/// `status.resumed` (the count already acted on) and record the new count.
pub const RESUME: &str = "ichor.maesh.dev/resume";
/// On a TalosOperation a release rollout created for one of its stages: the release's name
/// (`ichor upgrade cluster`; the stage's operation also has the release as its controlling owner).
pub const RELEASE: &str = "ichor.maesh.dev/release";

/// A Talos cluster: its versions, endpoint, CNI and where its secrets are.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(group = "ichor.maesh.dev", version = "v1alpha1", kind = "TalosCluster", namespaced)]
#[kube(crates(kube_core = "::kube_core"))]
#[kube(status = "TalosClusterStatus", shortname = "tc")]
#[kube(printcolumn = r#"{"name":"Kubernetes","type":"string","jsonPath":".spec.kubernetesVersion"}"#)]
#[kube(printcolumn = r#"{"name":"Talos","type":"string","jsonPath":".spec.talosVersion"}"#)]
#[kube(printcolumn = r#"{"name":"Kube-Proxy","type":"string","jsonPath":".spec.cni.kubeProxy"}"#)]
#[kube(printcolumn = r#"{"name":"Hand-Over","type":"string","jsonPath":".spec.cni.handover"}"#)]
#[kube(printcolumn = r#"{"name":"Contract","type":"string","priority":1,"jsonPath":".spec.versionContract"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct TalosClusterSpec {
    /// The Kubernetes API endpoint, an https URL (`https://host:6443`).
    #[schemars(regex(pattern = r"^https://[^\s/]+(:[0-9]+)?/?$"))]
    pub endpoint: String,
    /// Kubernetes version, `vX.Y.Z`.
    #[schemars(regex(pattern = r"^v[0-9]+\.[0-9]+\.[0-9]+$"))]
    pub kubernetes_version: String,
    /// Talos version the machines run, `vX.Y.Z`.
    #[schemars(regex(pattern = r"^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$"))]
    pub talos_version: String,
    /// The machine-config contract the render targets, `vX.Y` (v1.13: the legacy v1alpha1
    /// form; v1.14: the multi-document form).
    #[schemars(regex(pattern = r"^v[0-9]+\.[0-9]+$"))]
    pub version_contract: String,
    /// The Secret (same namespace) holding the Talos secrets bundle under `bundle.yaml`.
    pub secrets_ref: SecretRef,
    #[serde(default)]
    /// The CNI: its preset, kube-proxy mode, hand-over to Argo CD and Cilium's values.
    pub cni: CniSpec,
    /// What the machine controller does when a node differs from its render although no
    /// input changed.
    #[serde(default)]
    pub drift_policy: DriftPolicy,
    /// Cluster network; defaults match `talosctl gen config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ClusterNetwork>,
    /// The installer image's repository, for example `factory.talos.dev/metal-installer/<schematic>`;
    /// its tag follows `talosVersion` (defaults to Talos's factory image for `talosVersion`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_image: Option<String>,
    /// This fleet's own stricter classes for config paths (for example: every
    /// `machine.sysctls.**` change reboots). A policy only raises a path's class above the field
    /// metadata's; one that would make a path looser than Talos allows is refused at admission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_policy: Vec<PathPolicy>,
    /// When operations may start a machine's step: only inside one of these windows (a step
    /// already started finishes). None: at any time. Checked at admission (the schedule, the
    /// time zone, a duration at least one step's clock).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maintenance_windows: Vec<MaintenanceWindow>,
    /// What must hold in the cluster before each machine's step starts and before it counts as
    /// done: CEL expressions over Kubernetes objects. A failing check waits up to its timeout,
    /// then pauses the operation naming the check, the object and the result. Checked at
    /// admission (the expression compiles and can be a boolean, the kind is served, one name or
    /// one selector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks: Vec<HealthCheck>,
}

/// A health check the operator writes (issue 53; tuppr's CEL checks, omni#3352).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// Unique among the cluster's checks: status and pauses name it.
    pub name: String,
    /// The objects it reads: one by name, or every one a label selector matches (at least one
    /// must exist).
    pub object: HealthObject,
    /// A CEL expression over `object` (the object as the API returns it) that is `true` when
    /// healthy, for example `object.status.ceph.health == "HEALTH_OK"`. Kubernetes's CEL
    /// libraries are there (strings, lists, quantities, ...).
    pub expression: String,
    /// How long the check may fail before the operation pauses, seconds (default 600).
    #[serde(default = "ten_minutes")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: u32,
}

fn ten_minutes() -> u32 {
    600
}

/// The Kubernetes objects a health check reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HealthObject {
    /// `v1`, `apps/v1`, `ceph.rook.io/v1`, ...
    pub api_version: String,
    /// `ConfigMap`, `CephCluster`, ...
    pub kind: String,
    /// The namespace, for a namespaced kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// One object by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Or every object this label selector matches (`app=rook-ceph-mon`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

/// A maintenance window: it opens at each time its cron schedule names, in its time zone, for
/// its duration.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// A five-field cron schedule (minute hour day-of-month month day-of-week), for example
    /// `0 2 * * SAT` for Saturdays at 02:00.
    pub schedule: String,
    /// How long the window stays open, in minutes.
    #[schemars(range(min = 1))]
    pub duration_minutes: u32,
    /// The IANA time zone the schedule is read in (`Europe/Berlin`); default UTC.
    #[serde(default = "utc")]
    pub time_zone: String,
}

fn utc() -> String {
    "UTC".into()
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
/// One path policy: patterns in the field metadata's syntax, the class they take, and why.
pub struct PathPolicy {
    /// Path patterns (`machine.sysctls.**`, `LinkConfig[*].mtu`).
    pub paths: Vec<String>,
    /// The class the matched paths take in this fleet, when it is stricter than their own.
    pub class: PolicyClass,
    /// Why, shown wherever the policy decides a path.
    #[serde(default)]
    pub why: String,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
/// A class a policy may give.
pub enum PolicyClass {
    /// Applied live (only ever equal to, never stricter than, a path's own class).
    Safe,
    /// Takes effect only at the next install or Talos upgrade.
    InstallTimeOnly,
    /// Needs a reboot.
    #[default]
    RebootRequired,
}

impl PolicyClass {
    /// The class the rules and outputs name.
    pub fn class(self) -> crate::vocab::Class {
        match self {
            PolicyClass::Safe => crate::vocab::Class::Safe,
            PolicyClass::InstallTimeOnly => crate::vocab::Class::InstallTimeOnly,
            PolicyClass::RebootRequired => crate::vocab::Class::RebootRequired,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// A reference to an object of the same namespace, by name.
pub struct SecretRef {
    /// The object's name.
    pub name: String,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// The cluster's network, as Talos's `cluster.network`.
pub struct ClusterNetwork {
    #[serde(default = "default_dns_domain")]
    /// The cluster's DNS domain (`cluster.local`).
    pub dns_domain: String,
    #[serde(default = "default_pod_subnets")]
    /// The pods' CIDRs (`10.244.0.0/16`).
    pub pod_subnets: Vec<String>,
    #[serde(default = "default_service_subnets")]
    /// The services' CIDRs (`10.96.0.0/12`).
    pub service_subnets: Vec<String>,
}

fn default_dns_domain() -> String {
    "cluster.local".into()
}
fn default_pod_subnets() -> Vec<String> {
    vec!["10.244.0.0/16".into()]
}
fn default_service_subnets() -> Vec<String> {
    vec!["10.96.0.0/12".into()]
}

impl Default for ClusterNetwork {
    fn default() -> Self {
        ClusterNetwork {
            dns_domain: default_dns_domain(),
            pod_subnets: default_pod_subnets(),
            service_subnets: default_service_subnets(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
/// What the machine controller does with a node that drifted from its render.
pub enum DriftPolicy {
    /// Report a drifted node (Ready=False/NodeDrifted) and change nothing.
    #[default]
    WarnOnly,
    /// Apply the render to a drifted node like any other change.
    Converge,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// The cluster's CNI.
pub struct CniSpec {
    #[serde(default)]
    /// Which CNI the render installs (`cilium`, `flannel` or `custom`).
    pub preset: CniPreset,
    #[serde(default)]
    /// Whether Talos's kube-proxy runs (`enabled`) or Cilium replaces it (`replaced`); a change is a switch, an operation that needs the consent annotation.
    pub kube_proxy: KubeProxyMode,
    #[serde(default)]
    /// Whether Argo CD takes Cilium over from the render (`automatic`, `manual`, `disabled`).
    pub handover: Handover,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Cilium's settings, with the `cilium` preset.
    pub cilium: Option<CiliumSpec>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
/// The CNI a cluster runs.
pub enum CniPreset {
    /// Cilium, installed from Ichor's embedded chart and handed over to a Helm release.
    #[default]
    Cilium,
    /// Talos's default Flannel.
    Flannel,
    /// Whatever the cluster's patches install; Ichor cannot read its live state.
    Custom,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "camelCase")]
/// Who serves Kubernetes Services on the nodes.
pub enum KubeProxyMode {
    #[default]
    /// Talos's kube-proxy runs.
    Enabled,
    /// Cilium replaces kube-proxy (kube-proxy-replacement).
    Replaced,
}

/// `name()` and `parse()`: the symbol serde writes and the rules read, for a unit-only enum.
macro_rules! symbols {
    ($t:ident { $($v:ident => $n:literal),* $(,)? }) => {
        impl $t {
            /// Every value, in declaration order.
            pub const ALL: &'static [$t] = &[$($t::$v),*];

            /// The symbol serde writes and the rules read.
            pub fn name(self) -> &'static str {
                match self { $($t::$v => $n),* }
            }

            /// The value whose symbol is `s`.
            pub fn parse(s: &str) -> Option<$t> {
                Self::ALL.iter().copied().find(|x| x.name() == s)
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

symbols!(KubeProxyMode { Enabled => "enabled", Replaced => "replaced" });
symbols!(DriftPolicy { WarnOnly => "warnOnly", Converge => "converge" });
symbols!(CniPreset { Cilium => "cilium", Flannel => "flannel", Custom => "custom" });
symbols!(Handover { Automatic => "automatic", Manual => "manual", Disabled => "disabled" });

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
/// Whether Argo CD takes the CNI over from the render (ADR 0024).
pub enum Handover {
    #[default]
    /// The hand-over happens once Argo CD's Application owns the release, synced and healthy.
    Automatic,
    /// The user hands over when they choose; Ichor only reports.
    Manual,
    /// No hand-over: Cilium stays Ichor's (inline manifest and Job).
    Disabled,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// Cilium's settings.
pub struct CiliumSpec {
    /// The tunnel protocol chosen at install (`vxlan` or `geneve`); Ichor owns the key.
    #[serde(default = "vxlan")]
    #[schemars(regex(pattern = "^(vxlan|geneve)$"))]
    pub tunnel_protocol: String,
    /// The user's layer of Cilium chart values (validated; admin-only to write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub values: Option<serde_json::Value>,
}

fn vxlan() -> String {
    "vxlan".into()
}

/// A free-form object that keeps unknown fields (Cilium values), as a structural schema allows.
fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// What the controller observed of a cluster.
pub struct TalosClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The CNI's state the controller records (the kube-proxy mode a switch set).
    pub cni: Option<CniStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// The cluster's conditions (`CNIHandover`, ...).
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// The CNI's recorded state.
pub struct CniStatus {
    /// The kube-proxy mode a switch set (written only by the cni operation, ADR 0066).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy: Option<KubeProxyMode>,
    /// The hash of the layered Cilium values the last successful Cilium Job applied (its Jobs
    /// are named and labelled by it); written only by the values reconciler
    /// (rules/cni-values.rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_values_hash: Option<String>,
    /// The adoption of a Cilium someone else installed (`ichor adopt`): written once, by the
    /// cni-adopt operation that took it over (rules/cni-adopt.rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<CiliumAdoption>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
/// How Cilium became Ichor's: the operation that adopted it and the chart it installed.
pub struct CiliumAdoption {
    /// The TalosOperation (kind `cni-adopt`) that took the release over.
    pub operation: String,
    /// The chart the adoption's Job installed (the one embedded in the Ichor that ran it).
    pub chart: String,
}

/// A condition, as every Kubernetes object reports them.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    /// The condition's type (`Ready`, `CNIHandover`).
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(regex(pattern = "^(True|False|Unknown)$"))]
    pub status: String,
    #[serde(default)]
    /// Why, in one CamelCase word.
    pub reason: String,
    #[serde(default)]
    /// Why, as a sentence that says what to do.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// When the status last changed (RFC 3339).
    pub last_transition_time: Option<String>,
}

/// One machine of a cluster.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(group = "ichor.maesh.dev", version = "v1alpha1", kind = "TalosMachine", namespaced)]
#[kube(crates(kube_core = "::kube_core"))]
#[kube(status = "TalosMachineStatus", shortname = "tm")]
#[kube(printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#)]
#[kube(printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role"}"#)]
#[kube(
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#
)]
#[kube(
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#
)]
#[kube(printcolumn = r#"{"name":"Address","type":"string","priority":1,"jsonPath":".spec.address"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineSpec {
    /// The cluster the machine belongs to.
    pub cluster_ref: ClusterRef,
    /// The machine's role.
    pub role: Role,
    /// The node's address for the Talos API.
    pub address: String,
    /// The install disk (`talosctl gen config` uses /dev/sda). Without one, the render has no
    /// install target, like Talos's generator given no disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_disk: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// A reference to the TalosCluster of the same namespace.
pub struct ClusterRef {
    /// The TalosCluster's name.
    pub name: String,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "camelCase")]
/// A machine's role in the cluster.
pub enum Role {
    #[default]
    /// A control plane (etcd, the API server).
    Controlplane,
    /// A worker.
    Worker,
}

symbols!(Role { Controlplane => "controlplane", Worker => "worker" });

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// What the machine controller observed of a machine.
pub struct TalosMachineStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// The machine's conditions (`Ready`: converged to its render, or why not).
    pub conditions: Vec<Condition>,
    /// Paths that need a reboot to converge (what `ichor config apply` and rollouts select on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reboot_paths: Vec<String>,
    /// Hash of the config last applied to the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// The desired-inputs hash recorded when the node last converged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_inputs_hash: Option<String>,
    /// The hash of what the render reads now (ADR 0024: it folds in the two status values the
    /// render reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_inputs_hash: Option<String>,
    /// The node's boot as the machine controller first saw it: what its reboot-class paths held
    /// then (`render::boot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootRecord>,
    /// Reboot-class paths whose running value changed within this boot (applied live, by Ichor
    /// or by hand): applied, they take effect after the next reboot. A config rollout takes
    /// the machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_awaiting_reboot: Vec<String>,
    /// Every path where the node's running config differs from the render, with Ichor's class
    /// and what Talos itself does with it (issue 29): what `ichor config diff` says of this
    /// machine now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_changes: Vec<PendingChange>,
}

/// A path where the running config differs from the render.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PendingChange {
    /// The config path.
    pub path: String,
    /// What applying it takes, by Ichor's rules (`safe`, `reboot-required`, ...).
    pub class: String,
    /// What Talos itself does with it (`live`, `live-restarts`, `after-reboot`, `reboot`,
    /// `install-time-only`, `operation`, `no-effect`), when the rules know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}

/// A node's boot, recorded when the machine controller first sees it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootRecord {
    /// The kernel's boot ID (Talos's `BootIDs` resource).
    pub id: String,
    /// A hash of the running config seen on that boot.
    pub config_hash: String,
    /// A salted digest of each reboot-class value of that config, by path.
    #[serde(default)]
    pub reboot_values: BTreeMap<String, String>,
}

/// A strategic-merge patch (Talos's format) applied to the machines it selects.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(group = "ichor.maesh.dev", version = "v1alpha1", kind = "TalosConfigPatch", namespaced)]
#[kube(crates(kube_core = "::kube_core"))]
#[kube(shortname = "tcp")]
#[kube(printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#)]
#[kube(printcolumn = r#"{"name":"Order","type":"integer","jsonPath":".spec.order"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct TalosConfigPatchSpec {
    /// The cluster whose machines the patch selects from.
    pub cluster_ref: ClusterRef,
    /// Which machines get the patch; empty selects all.
    #[serde(default)]
    pub selector: PatchSelector,
    /// Patches apply in ascending order, then by name.
    #[serde(default)]
    pub order: i32,
    /// The patch: one or more Talos config documents (YAML), `$patch: delete` allowed.
    pub patch: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// Which machines a patch applies to.
pub struct PatchSelector {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// The roles selected; empty selects every role.
    pub roles: Vec<Role>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// The machines selected by name; empty selects every machine.
    pub machines: Vec<String>,
}

/// An operation on a cluster: a Kubernetes upgrade, a CNI change, ...
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(group = "ichor.maesh.dev", version = "v1alpha1", kind = "TalosOperation", namespaced)]
#[kube(crates(kube_core = "::kube_core"))]
#[kube(status = "TalosOperationStatus", shortname = "top")]
#[kube(printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.kind"}"#)]
#[kube(printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#)]
#[kube(printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#)]
#[kube(printcolumn = r#"{"name":"Stage","type":"string","jsonPath":".status.stage"}"#)]
#[kube(printcolumn = r#"{"name":"Paused","type":"string","priority":1,"jsonPath":".status.pausedReason"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct TalosOperationSpec {
    /// The cluster the operation acts on.
    pub cluster_ref: ClusterRef,
    /// What the operation does.
    pub kind: OperationKind,
    #[serde(default)]
    /// What it brings the cluster to.
    pub target: OperationTarget,
    /// Workers changed at once (control planes always go one at a time).
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub max_unavailable: i32,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    /// The consent to disrupt past PodDisruptionBudgets (`--force-drain`): a pod whose
    /// eviction a budget still refuses at the drain's deadline (`ichor controller
    /// --drain-timeout`) is deleted, as `kubectl drain --disable-eviction` does, instead of the
    /// step failing. Without it a drain never goes past a budget.
    pub force_drain: bool,
}

fn one() -> i32 {
    1
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
/// What an operation does.
pub enum OperationKind {
    #[default]
    /// A Kubernetes upgrade (ADR 0057).
    Kubernetes,
    /// A CNI change: the kube-proxy switch (ADR 0066).
    Cni,
    /// A Talos upgrade.
    Talos,
    /// A config rollout (`ichor config apply`).
    Config,
    /// The Cilium release moved to the chart embedded in this Ichor (`ichor cni upgrade`; the
    /// CNI page: "only when you start a cni operation").
    #[serde(rename = "cni-upgrade")]
    CniUpgrade,
    /// A Cilium someone else installed taken over into Ichor's Helm release (`ichor adopt`;
    /// the CNI page: "after checks on its minor version, its IPAM mode and its health").
    #[serde(rename = "cni-adopt")]
    CniAdopt,
    /// The release set this Ichor ships, in stages (`ichor upgrade cluster`; ADR 0113): each
    /// stage an operation of its own kind that the release creates, one at a time.
    Release,
}

symbols!(OperationKind {
    Kubernetes => "kubernetes",
    Cni => "cni",
    Talos => "talos",
    Config => "config",
    CniUpgrade => "cni-upgrade",
    CniAdopt => "cni-adopt",
    Release => "release",
});

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// What an operation brings the cluster to.
pub struct OperationTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^v[0-9]+\.[0-9]+\.[0-9]+$"))]
    /// The Kubernetes version, for a Kubernetes upgrade.
    pub kubernetes_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The kube-proxy mode, for a CNI change.
    pub kube_proxy: Option<KubeProxyMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^v[0-9]+\.[0-9]+\.[0-9]+$"))]
    /// The Talos version, for a Talos upgrade.
    pub talos_version: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    /// A Talos upgrade may go to an older version (`ichor upgrade talos --allow-downgrade`),
    /// within what the target allows.
    pub allow_downgrade: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// The TalosMachines a config rollout takes (`ichor config apply --machines`); empty: every
    /// machine with a change that needs a reboot.
    pub machines: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+\.[0-9]+\.[0-9]+$"))]
    /// The Cilium chart version, for a Cilium upgrade: the chart embedded in the Ichor that
    /// started it (a controller embedding another refuses it).
    pub cilium_chart: Option<String>,
}

impl OperationTarget {
    /// The target of a release's stage of `kind`: a version for a Talos or Kubernetes stage,
    /// the chart for Cilium's, nothing for the config rollout (`target` is then empty).
    pub fn of_stage(kind: OperationKind, target: &str) -> OperationTarget {
        let mut t = OperationTarget::default();
        match kind {
            OperationKind::Talos => t.talos_version = Some(target.to_string()),
            OperationKind::Kubernetes => t.kubernetes_version = Some(target.to_string()),
            OperationKind::CniUpgrade => t.cilium_chart = Some(target.to_string()),
            _ => {}
        }
        t
    }

    /// A stage operation's target as its release's status records it (`of_stage` read back).
    pub fn stage_value(&self) -> String {
        self.talos_version.clone().or(self.kubernetes_version.clone()).or(self.cilium_chart.clone()).unwrap_or_default()
    }
}

impl TalosClusterSpec {
    /// The spec as a release's stage of `kind` leaves it: the stage's version set.
    pub fn set_stage(&mut self, kind: OperationKind, target: &str) {
        match kind {
            OperationKind::Talos => self.talos_version = target.to_string(),
            OperationKind::Kubernetes => self.kubernetes_version = target.to_string(),
            _ => {}
        }
    }
}

/// The phase of a TalosOperation (ADR 0026's status-held state machine). The rules move it
/// (`phase` in rules/backbone.rules); which phases end an operation and which hold the
/// cluster's lock are the rules' `terminal` and `holds_lock`, which `is_terminal` and
/// `holds_lock` repeat for Rust's readers (a test pins them to the rules).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Created, not yet started: the preview's confirmation is shown in this phase.
    #[default]
    Pending,
    /// Acting: it holds the cluster's lock.
    Running,
    /// Waiting for another operation to release the lock.
    Waiting,
    /// Stopped with a reason until the user resumes or aborts it.
    Paused,
    /// Done; nothing moves it again.
    Completed,
    /// Ended by the user; nothing moves it again.
    Aborted,
}

symbols!(Phase {
    Pending => "Pending",
    Running => "Running",
    Waiting => "Waiting",
    Paused => "Paused",
    Completed => "Completed",
    Aborted => "Aborted",
});

impl Phase {
    /// No reconcile moves an operation out of this phase (rules/backbone.rules `terminal`).
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Completed | Phase::Aborted)
    }

    /// An operation in this phase holds its cluster's lock (rules/backbone.rules `holds_lock`).
    pub fn holds_lock(self) -> bool {
        matches!(self, Phase::Running)
    }
}

/// The phase of one machine's step within an operation.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MachinePhase {
    /// Started (the marker and the verification clock's start), not yet verified.
    #[default]
    Applying,
    /// Verified and done.
    Done,
    /// Failed: the operation pauses and never retries it on its own.
    Failed,
}

symbols!(MachinePhase { Applying => "Applying", Done => "Done", Failed => "Failed" });

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// What the controller recorded of an operation.
pub struct TalosOperationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Where the operation is (`Pending` before the controller first writes one).
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The stage it is in (an upgrade's `apiservers`, `kubelets`, ...).
    pub stage: Option<String>,
    /// Why it paused, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_reason: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    /// Each machine's step, by machine name.
    pub machines: BTreeMap<String, MachineProgress>,
    /// Wait clocks by the name the wait gave (RFC 3339 starts).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub waiting_since: BTreeMap<String, String>,
    /// Cluster-wide steps done (`manifestsSynced`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub done: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// The operation's conditions.
    pub conditions: Vec<Condition>,
    /// How many resume requests (the `ichor.maesh.dev/resume` counter) the controller has acted on.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumed: u64,
    /// What the operation waits for now: each wait's reason, words, clock, start and limit (what
    /// `ichor status` shows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<WaitStatus>,
    /// The machines the operation still has work on: with `machines`, the ones its progress
    /// counts (a machine no step touches is in neither).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines_left: Vec<String>,
    /// A release's stages, in order: the ones done, then the ones the rules plan from what the
    /// cluster runs now (`kind: release` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<ReleaseStage>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
/// One stage of a release rollout.
pub struct ReleaseStage {
    /// The kind of the stage's operation (talos, config, kubernetes, cni-upgrade).
    pub kind: OperationKind,
    /// What it moves the cluster to (a version, a chart; empty for a config rollout).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// The TalosOperation the release created for it, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// Its operation's phase (`Pending` before it is created).
    #[serde(default)]
    pub phase: Phase,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
/// One wait of an operation, as the rules planned it.
pub struct WaitStatus {
    /// The wait's reason (`AwaitingCNIChange`).
    pub reason: String,
    /// What it waits for, in the rules' words (what to change and where).
    pub message: String,
    /// The clock it runs on.
    pub clock: String,
    /// When the clock started (RFC 3339).
    pub since: String,
    /// Minutes the clock allows before the operation pauses (a clock of seconds rounded up).
    pub limit_minutes: i64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TalosOperationStatus {
    /// The phase, `Pending` before the controller first wrote one.
    pub fn phase(&self) -> Phase {
        self.phase.unwrap_or_default()
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
/// One machine's step within an operation.
pub struct MachineProgress {
    /// Where the step is.
    pub phase: MachinePhase,
    /// The stage the step belongs to (upgrade) or `switch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// When the step started (RFC 3339): the verification clock's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// The boot the node was on when the step started (its Node's `status.nodeInfo.bootID`):
    /// a config rollout knows the node rebooted when it reports another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// The CRDs of every kind, in a fixed order, with their CEL rules (`CEL_RULES`).
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    use kube_core::CustomResourceExt;
    let mut out = vec![TalosCluster::crd(), TalosMachine::crd(), TalosConfigPatch::crd(), TalosOperation::crd()];
    for crd in &mut out {
        let kind = crd.spec.names.kind.clone();
        for v in &mut crd.spec.versions {
            let Some(schema) = v.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) else { continue };
            let mut json = serde_json::to_value(&*schema).unwrap_or_default();
            for r in CEL_RULES.iter().filter(|r| r.kind == kind) {
                let mut node = &mut json;
                for p in r.path.split('.').filter(|p| !p.is_empty()) {
                    node = &mut node["properties"][p];
                }
                let list = &mut node["x-kubernetes-validations"];
                if !list.is_array() {
                    *list = serde_json::json!([]);
                }
                if let Some(a) = list.as_array_mut() {
                    a.push(serde_json::json!({"rule": r.rule, "message": r.message}));
                }
            }
            if let Ok(s) = serde_json::from_value(json) {
                *schema = s;
            }
        }
    }
    out
}

/// One CEL rule of a CRD (`x-kubernetes-validations`): what is structural, checked by the API
/// server itself. What needs more than the object (the consent annotation, who may write Cilium
/// values, the cluster lock) is the webhook's (`runtime::admission`).
pub struct CelRule {
    /// The kind whose CRD carries the rule.
    pub kind: &'static str,
    /// The schema node, as a dotted path of properties from the root (`spec.cni`).
    pub path: &'static str,
    /// The CEL expression.
    pub rule: &'static str,
    /// The message the API server returns when the rule fails.
    pub message: &'static str,
}

/// Every CEL rule of the CRDs.
pub const CEL_RULES: &[CelRule] = &[
    CelRule {
        kind: "TalosCluster",
        path: "spec.kubernetesVersion",
        rule: "self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+$')",
        message: "kubernetesVersion is vX.Y.Z, for example v1.37.0 (images add their own v)",
    },
    CelRule {
        kind: "TalosCluster",
        path: "spec.talosVersion",
        rule: "self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+(-[0-9A-Za-z.-]+)?$')",
        message: "talosVersion is vX.Y.Z, for example v1.14.3",
    },
    CelRule {
        kind: "TalosCluster",
        path: "spec.versionContract",
        rule: "self.matches('^v[0-9]+\\\\.[0-9]+$')",
        message: "versionContract is vX.Y, for example v1.14",
    },
    CelRule {
        kind: "TalosCluster",
        path: "spec.endpoint",
        rule: "self.startsWith('https://')",
        message: "the endpoint is an https:// URL, for example https://lab.example.internal:6443",
    },
    CelRule {
        kind: "TalosCluster",
        path: "spec.secretsRef",
        rule: "self == oldSelf",
        message: "secretsRef is immutable: the cluster's identity and keys come from it",
    },
    CelRule {
        kind: "TalosCluster",
        path: "spec.cni.preset",
        rule: "self == oldSelf",
        message: "the CNI preset is chosen when the cluster is created",
    },
    CelRule {
        kind: "TalosMachine",
        path: "spec.clusterRef",
        rule: "self == oldSelf",
        message: "clusterRef is immutable: a machine belongs to one cluster; delete it and create another",
    },
    CelRule {
        kind: "TalosMachine",
        path: "spec.role",
        rule: "self == oldSelf",
        message: "role is immutable: a machine changes role only through a reinstall; delete it and create another",
    },
    CelRule {
        kind: "TalosConfigPatch",
        path: "spec.clusterRef",
        rule: "self == oldSelf",
        message: "clusterRef is immutable; delete the patch and create another",
    },
    CelRule {
        kind: "TalosOperation",
        path: "spec",
        rule: "self == oldSelf",
        message: "a TalosOperation's spec is immutable; abort it (ichor operation abort NAME) and create another",
    },
    CelRule {
        kind: "TalosOperation",
        path: "spec",
        rule: "self.kind != 'kubernetes' || (has(self.target) && has(self.target.kubernetesVersion))",
        message: "a kubernetes operation names target.kubernetesVersion",
    },
    CelRule {
        kind: "TalosOperation",
        path: "spec",
        rule: "self.kind != 'cni' || (has(self.target) && has(self.target.kubeProxy))",
        message: "a cni operation names target.kubeProxy (replaced or enabled)",
    },
];
