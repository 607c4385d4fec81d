//! The plan of one reconcile: the rules' actions, decoded in order, checked, explained.
//!
//! Start at `Planner::new` (rules and message templates, compiled once) and `Planner::plan`
//! (a snapshot in, the phase, actions, messages and proofs out). The rules decide; this file
//! decodes relations into `Action`s, puts them in the fixed order an executor performs them,
//! fills message templates, and refuses plans whose actions contradict each other (reported
//! with both proofs, never executed).

use crate::facts::Rels;
use crate::state::ObservedState;
use engine::explain::ProofGraph;
use engine::{Database, Engine, EvalOptions, MemSources};
use render::api::{KubeProxyMode, OperationKind, Phase, Role};
use serde::Serialize;
use serde_json::{Value as Json, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

/// A containerd namespace an image is pulled into: `k8s.io` for the CRI's images (the API
/// server, scheduler, controller manager, kube-proxy), `system` for Talos's own services (the
/// kubelet). ADR 0057: pulling into the wrong one leaves the image where nothing looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ContainerdNamespace {
    #[serde(rename = "k8s.io")]
    K8s,
    #[serde(rename = "system")]
    System,
}

impl ContainerdNamespace {
    pub fn name(self) -> &'static str {
        match self {
            ContainerdNamespace::K8s => "k8s.io",
            ContainerdNamespace::System => "system",
        }
    }

    pub fn parse(s: &str) -> Option<ContainerdNamespace> {
        [ContainerdNamespace::K8s, ContainerdNamespace::System].into_iter().find(|n| n.name() == s)
    }
}

impl fmt::Display for ContainerdNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Kubernetes object by API version, kind, namespace (none for a cluster-scoped kind) and
/// name: everything a delete needs, as the rules list it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

/// A machine's whole config to send and what it was planned from, for an apply: the executor
/// sends `config` as it is, and only while the node still runs the config hashed as
/// `running_hash` (a precondition, as kube's UID preconditions: a node changed since it was
/// read is not applied to, and the next reconcile plans again).
#[derive(Clone, PartialEq, Eq)]
pub struct ApplyPayload {
    /// The exact bytes to apply (secrets included: never serialized, never displayed).
    pub config: String,
    /// sha256 of `config`.
    pub config_hash: String,
    /// sha256 of the running config's text the plan was made from.
    pub running_hash: String,
}

impl fmt::Debug for ApplyPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApplyPayload")
            .field("config", &"<redacted>")
            .field("config_hash", &self.config_hash)
            .field("running_hash", &self.running_hash)
            .finish()
    }
}

impl Serialize for ApplyPayload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("ApplyPayload", 2)?;
        st.serialize_field("configHash", &self.config_hash)?;
        st.serialize_field("runningHash", &self.running_hash)?;
        st.end()
    }
}

/// sha256 of a config's text, hex: what an apply's precondition compares.
pub fn config_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// What completes a plan's applies, besides the snapshot: each machine's running config (its
/// text, as read from the node) and its render.
#[derive(Clone, Debug)]
pub struct MachineConfigs {
    pub running: Arc<str>,
    pub desired: Arc<render::config::Config>,
}

/// Talos's bootstrap manifest that holds kube-proxy's objects (`k8s.Manifest` id, FACTS 5).
pub const KUBE_PROXY_MANIFEST: &str = "10-kube-proxy";

/// The field manager of the bootstrap-manifest sync: Talos's own, so that Talos and Ichor
/// never fight over the fields (FACTS 5).
pub const TALOS_FIELD_MANAGER: &str = "talos";

/// What an executor does; each is complete enough to perform without choosing. Serialized with
/// its kind under `action` (the names `action_order` in rules/backbone.rules ranks).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Action {
    /// The user's abort (`ichor.maesh.dev/abort`) is recorded: the operation ended in `was`.
    Abort {
        was: Phase,
    },
    /// The user's resume (`ichor.maesh.dev/resume`) is recorded: failed machines' markers and
    /// the pause reason go, and the request count is kept in `status.resumed`.
    Resume,
    Pause {
        message: String,
    },
    Fail {
        machine: String,
        message: String,
    },
    /// Record the kube-proxy mode a switch has reached in the cluster's `status.cni.kubeProxy`.
    SetKubeProxyStatus {
        mode: KubeProxyMode,
    },
    /// Record that a machine's step starts, with the boot its node is on (what a rollout
    /// compares to know the node rebooted).
    Start {
        machine: String,
        stage: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        boot_id: Option<String>,
    },
    PullImage {
        machine: String,
        /// How the Talos API reaches it (absent: by its name).
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        namespace: ContainerdNamespace,
        image: String,
    },
    Cordon {
        machine: String,
    },
    /// Put Ichor's `PreferNoSchedule` taint on the Node drained next (`render::api::NEXT_TAINT`).
    Taint {
        machine: String,
    },
    /// Take Ichor's `PreferNoSchedule` taint off the Node.
    Untaint {
        machine: String,
    },
    Drain {
        machine: String,
        /// With the user's consent (`spec.forceDrain`): what a budget still keeps at the
        /// drain's deadline is deleted rather than the step failing.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// Apply `payload.config` with mode NO_REBOOT: the node's running config with `paths` set
    /// from the render. Without a payload (a plan made from a snapshot alone, `ichor plan`)
    /// the executor refuses it.
    #[serde(rename = "applyNoReboot")]
    Apply {
        machine: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        paths: Vec<String>,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        payload: Option<ApplyPayload>,
    },
    /// Stage `payload.config` (mode STAGED: written to disk, taken at the next boot), with the
    /// same precondition as `Apply`: what a Talos older than 1.14 gets before its reboot.
    ApplyStaged {
        machine: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        paths: Vec<String>,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        payload: Option<ApplyPayload>,
    },
    /// Install Talos from `image` on the node: LifecycleService.Upgrade (Talos 1.13 and
    /// later, then a reboot of its own) or, `legacy`, MachineService.Upgrade (which reboots the
    /// node by itself). A Talos refusal or a non-zero exit fails the machine's step.
    UpgradeTalos {
        machine: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        image: String,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        legacy: bool,
    },
    /// Record where a machine's step is (its marker's stage), without restarting it.
    Stage {
        machine: String,
        stage: String,
    },
    /// Reboot the node (MachineService.Reboot); never retried within a reconcile.
    Reboot {
        machine: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
    },
    Done {
        machine: String,
    },
    Uncordon {
        machine: String,
    },
    /// Server-side-apply every bootstrap manifest Talos rendered on `via`.
    SyncManifests {
        via: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        field_manager: &'static str,
    },
    /// Delete an object with the controller's own identity, preconditioned on the UID read.
    Delete {
        #[serde(flatten)]
        object: ObjectRef,
    },
    /// Server-side-apply the objects of the bootstrap manifest `manifest` Talos rendered on `via`.
    RestoreKubeProxy {
        via: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        manifest: String,
        field_manager: &'static str,
    },
    /// The Job is named by the hash of the values it applies, so re-creating it is a no-op.
    CiliumJob {
        #[serde(rename = "kubeProxy")]
        mode: KubeProxyMode,
        name: String,
        /// The layered values (what Helm gets; the name is their hash).
        values: Json,
        /// The user's layer and the tunnel protocol: what the Job's `ichor cni helm apply`
        /// validates and layers again itself, with the mode from its flag.
        #[serde(skip)]
        user: Json,
        #[serde(skip)]
        tunnel: String,
        /// Cilium's objects are in no Helm release yet: the Job takes them over into Ichor's
        /// (`helm --take-ownership`; rules/cilium.rules' `cilium_job_takes_ownership`).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        take_ownership: bool,
    },
    /// Record on the TalosCluster that an adoption took Cilium over into Ichor's release on
    /// this chart (`status.cni.adoption`), with the operation's name.
    RecordCiliumAdoption {
        chart: String,
    },
    StepDone {
        step: String,
    },
    /// Start a release's stage: set the cluster's version the stage moves to (its spec field),
    /// then create the stage's TalosOperation, labelled with the release and owned by it.
    StartStage {
        #[serde(flatten)]
        stage: StageStart,
    },
    /// Requeue and wait on a named clock: `waitingSince.<clock>` (recorded by the executor when
    /// not yet held), or `machines/<name>` (the machine's marker, recorded by its start).
    Wait {
        reason: String,
        message: String,
        clock: String,
        since: String,
        limit_minutes: i64,
    },
    /// Remove `waitingSince.<clock>`: no wait runs on it any more.
    ClearClock {
        clock: String,
    },
    Warn {
        message: String,
    },
    Complete,
    /// Lock Ichor's namespace down with its CiliumNetworkPolicies (`np_lockdown` in
    /// rules/lockdown.rules; the cluster loop's).
    LockDown {
        #[serde(flatten)]
        lockdown: crate::netpol::Lockdown,
    },
    /// Hold a condition on the loop's resource (the cluster loop's `CNIHandover` and
    /// `CNIValuesApplied`): its transition time moves only when its status does.
    SetCondition {
        #[serde(rename = "type")]
        type_: String,
        status: String,
        reason: String,
        message: String,
    },
    /// Take a condition the rules no longer hold off the loop's resource.
    ClearCondition {
        #[serde(rename = "type")]
        type_: String,
    },
    /// Record the hash of the Cilium values applied (`status.cni.appliedValuesHash`).
    RecordValuesHash {
        hash: String,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Abort { was } => {
                write!(f, "record the user's abort (the operation was {was}); it does nothing more")
            }
            Action::Resume => write!(f, "record the user's resume (failed machines' steps start again)"),
            Action::Pause { message } => write!(f, "pause: {message}"),
            Action::Fail { machine, message } => write!(f, "fail {machine}'s step: {message}"),
            Action::SetKubeProxyStatus { mode } => write!(f, "set status.cni.kubeProxy = {mode}"),
            Action::Start { machine, stage, .. } => {
                write!(f, "start {machine} (step {stage}; record it in status with the time)")
            }
            Action::PullImage { machine, namespace, image, .. } => {
                write!(f, "pull {image} into containerd namespace {namespace} on {machine}")
            }
            Action::Cordon { machine } => write!(f, "cordon {machine}"),
            Action::Taint { machine } => {
                write!(f, "taint {machine} PreferNoSchedule ({}): it is drained next", render::api::NEXT_TAINT)
            }
            Action::Untaint { machine } => write!(f, "take {} off {machine}", render::api::NEXT_TAINT),
            Action::Drain { machine, force: false } => write!(f, "drain {machine}"),
            Action::Drain { machine, force: true } => write!(
                f,
                "drain {machine}, deleting at the drain's deadline what a PodDisruptionBudget still keeps (--force-drain)"
            ),
            Action::Apply { machine, paths, .. } => {
                write!(f, "apply the rendered config to {machine} without a reboot, changing {}", paths.join(", "))
            }
            Action::ApplyStaged { machine, paths, .. } => {
                write!(f, "stage the render on {machine} (mode STAGED, taken at its next boot): {}", paths.join(", "))
            }
            Action::UpgradeTalos { machine, image, legacy: false, .. } => {
                write!(f, "install Talos from {image} on {machine} (LifecycleService.Upgrade)")
            }
            Action::UpgradeTalos { machine, image, legacy: true, .. } => {
                write!(f, "upgrade {machine} to {image} (MachineService.Upgrade, which reboots it)")
            }
            Action::Stage { machine, stage } => write!(f, "record {machine}'s step as {stage}"),
            Action::Reboot { machine, .. } => write!(f, "reboot {machine}"),
            Action::Done { machine } => write!(f, "record {machine}'s step as verified and done"),
            Action::Uncordon { machine } => write!(f, "uncordon {machine}"),
            Action::SyncManifests { via, field_manager, .. } => {
                write!(f, "server-side-apply the bootstrap manifests (field manager {field_manager}) through {via}")
            }
            Action::Delete { object: ObjectRef { kind, namespace: None, name, .. } } => {
                write!(f, "delete {kind} {name} (cluster-scoped)")
            }
            Action::Delete { object: ObjectRef { kind, namespace: Some(ns), name, .. } } => {
                write!(f, "delete {kind} {ns}/{name}")
            }
            Action::RestoreKubeProxy { via, .. } => {
                write!(f, "restore the kube-proxy objects from Talos's rendered manifests through {via}")
            }
            Action::CiliumJob { mode, name, take_ownership, .. } => {
                let over =
                    if *take_ownership { " --take-ownership (Cilium's objects are in no Helm release)" } else { "" };
                write!(f, "run the Cilium Helm Job {name} with --kube-proxy={mode}{over}")
            }
            Action::RecordCiliumAdoption { chart } => {
                write!(f, "record the adoption on the TalosCluster (status.cni.adoption, chart {chart})")
            }
            Action::StepDone { step } => write!(f, "record step {step} as done"),
            Action::StartStage { stage } => match &stage.spec_field {
                Some((field, version)) => write!(
                    f,
                    "set TalosCluster {}'s spec.{field} to {version}, then create TalosOperation {} (kind {}) for the release's stage",
                    stage.cluster, stage.name, stage.kind
                ),
                None => write!(f, "create TalosOperation {} (kind {}) for the release's stage", stage.name, stage.kind),
            },
            Action::Wait { message, clock, .. } => {
                write!(f, "wait: {message} [clock {clock}]")
            }
            Action::ClearClock { clock } => write!(f, "clear clock {clock} (its wait is over)"),
            Action::Warn { message } => write!(f, "warn: {message}"),
            Action::Complete => write!(f, "complete the operation"),
            Action::LockDown { lockdown } => write!(
                f,
                "lock namespace {} down with its CiliumNetworkPolicies (metrics from {})",
                lockdown.namespace,
                if lockdown.metrics_from.is_empty() { "nowhere".to_string() } else { lockdown.metrics_from.join(", ") }
            ),
            Action::SetCondition { type_, status, reason, message } => {
                write!(f, "hold condition {type_} {status} ({reason}): {message}")
            }
            Action::ClearCondition { type_ } => write!(f, "take condition {type_} off"),
            Action::RecordValuesHash { hash } => write!(f, "record status.cni.appliedValuesHash = {hash}"),
        }
    }
}

impl Action {
    /// The action's kind, as serialized under `action` and ranked by `action_order`.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Abort { .. } => "abort",
            Action::Resume => "resume",
            Action::Pause { .. } => "pause",
            Action::Fail { .. } => "fail",
            Action::SetKubeProxyStatus { .. } => "setKubeProxyStatus",
            Action::Start { .. } => "start",
            Action::PullImage { .. } => "pullImage",
            Action::Cordon { .. } => "cordon",
            Action::Taint { .. } => "taint",
            Action::Untaint { .. } => "untaint",
            Action::Drain { .. } => "drain",
            Action::Apply { .. } => "applyNoReboot",
            Action::ApplyStaged { .. } => "applyStaged",
            Action::UpgradeTalos { .. } => "upgradeTalos",
            Action::Stage { .. } => "stage",
            Action::Reboot { .. } => "reboot",
            Action::Done { .. } => "done",
            Action::Uncordon { .. } => "uncordon",
            Action::SyncManifests { .. } => "syncManifests",
            Action::Delete { .. } => "delete",
            Action::RestoreKubeProxy { .. } => "restoreKubeProxy",
            Action::CiliumJob { .. } => "ciliumJob",
            Action::RecordCiliumAdoption { .. } => "recordCiliumAdoption",
            Action::StepDone { .. } => "stepDone",
            Action::StartStage { .. } => "startStage",
            Action::Wait { .. } => "wait",
            Action::ClearClock { .. } => "clearClock",
            Action::Warn { .. } => "warn",
            Action::Complete => "complete",
            Action::LockDown { .. } => "lockDown",
            Action::SetCondition { .. } => "setCondition",
            Action::ClearCondition { .. } => "clearCondition",
            Action::RecordValuesHash { .. } => "recordValuesHash",
        }
    }

    /// The machine the action touches, for the actions of one machine's step.
    pub fn machine(&self) -> Option<&str> {
        match self {
            Action::Fail { machine, .. }
            | Action::Start { machine, .. }
            | Action::PullImage { machine, .. }
            | Action::Cordon { machine }
            | Action::Taint { machine }
            | Action::Untaint { machine }
            | Action::Drain { machine, .. }
            | Action::Apply { machine, .. }
            | Action::ApplyStaged { machine, .. }
            | Action::Reboot { machine, .. }
            | Action::UpgradeTalos { machine, .. }
            | Action::Stage { machine, .. }
            | Action::Done { machine }
            | Action::Uncordon { machine } => Some(machine),
            _ => None,
        }
    }

    pub fn to_json(&self) -> Json {
        serde_json::to_value(self).unwrap_or(Json::Null)
    }
}

/// The plan of one reconcile.
#[derive(Clone, Debug)]
pub struct Plan {
    pub operation: String,
    pub kind: OperationKind,
    pub phase: Phase,
    pub confirmation: Option<String>,
    /// Each action with the ids of its proofs in `proofs` (none unless explained).
    pub actions: Vec<(Action, Vec<usize>)>,
    /// Every proof step of the plan's actions, each kept once however many actions share it.
    pub proofs: ProofGraph,
    /// The mode every Cilium Job outside a switch uses (`cilium_job_mode` in rules/switch.rules).
    pub cilium_job_mode: Option<KubeProxyMode>,
    /// The machines the operation still has work on (`work_left` in rules/backbone.rules),
    /// sorted: with those it started, the machines its progress counts.
    pub work_left: Vec<String>,
    /// A config rollout's changes that need the reboot, per machine (`roll_path` in
    /// rules/rollout.rules), sorted: what its preview lists.
    pub reboot_paths: BTreeMap<String, Vec<String>>,
    /// The checks that passed, as the preview lists them (`plan_check` in
    /// rules/backbone.rules; the ones that fail are pauses), sorted.
    pub checks: Vec<String>,
    /// The drains a preview finds refused now (`drain_refused_now` in rules/backbone.rules),
    /// each a sentence naming the machine, the budget and its pods, sorted.
    pub drain_refusals: Vec<String>,
    /// What the operation asks for holds already (`nothing_to_do` in rules/backbone.rules), in
    /// the rules' words: a start writes nothing and exits 0.
    pub nothing_to_do: Option<String>,
    /// A release's stages left, in order (`release_stage` in rules/release.rules): kind and
    /// target (empty for a config rollout).
    pub stages: Vec<(OperationKind, String)>,
    /// Each stage's proofs in `proofs` (none unless explained): the rules that chose it.
    pub stage_proofs: Vec<Vec<usize>>,
}

/// A release's stages as its confirmation names them: `Talos v1.14.6, then Kubernetes v1.36.4 ...`.
pub fn stage_words(stages: &[(OperationKind, String)]) -> String {
    let words: Vec<String> = stages
        .iter()
        .map(|(k, t)| match k {
            OperationKind::Talos => format!("Talos {t}"),
            OperationKind::Kubernetes => format!("Kubernetes {t}"),
            OperationKind::Config => "a configuration rollout (the changes that need a reboot)".to_string(),
            OperationKind::CniUpgrade => format!("the Cilium chart {t}"),
            k => format!("{k} {t}"),
        })
        .collect();
    words.join(", then ")
}

/// What starting a release's stage takes: the release, the stage's operation (its name, kind
/// and target), the cluster and the spec field the stage moves, and what the stage inherits of
/// the release's spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageStart {
    pub release: String,
    pub name: String,
    pub kind: OperationKind,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub target: String,
    pub cluster: String,
    /// `talosVersion` or `kubernetesVersion` and the version the stage moves it to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec_field: Option<(String, String)>,
    pub max_unavailable: i64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub force_drain: bool,
}

impl StageStart {
    /// The stage `kind` to `target` of the snapshot's release, named `<release>-<kind>[-<target>]`
    /// (dots as dashes), with `-2`, `-3` ... when an earlier operation of that name ended (an
    /// aborted stage started again).
    pub fn of(s: &ObservedState, kind: OperationKind, target: &str) -> StageStart {
        let op = &s.operation;
        let base = match target {
            "" => format!("{}-{}", op.name, kind.name()),
            t => format!("{}-{}-{}", op.name, kind.name(), t.replace('.', "-")),
        };
        let taken = |n: &str| s.stage_operations.iter().any(|o| o.name == n);
        let mut name = base.clone();
        let mut i = 2;
        while taken(&name) {
            name = format!("{base}-{i}");
            i += 1;
        }
        let spec_field = match kind {
            OperationKind::Talos => Some(("talosVersion".to_string(), target.to_string())),
            OperationKind::Kubernetes => Some(("kubernetesVersion".to_string(), target.to_string())),
            _ => None,
        };
        StageStart {
            release: op.name.clone(),
            name,
            kind,
            target: target.to_string(),
            cluster: s.cluster.name.clone(),
            spec_field,
            max_unavailable: op.max_unavailable,
            force_drain: op.force_drain,
        }
    }

    /// The stage's TalosOperation as the release creates it (its owner reference is the
    /// executor's: it needs the release's uid).
    pub fn operation(&self) -> render::api::TalosOperation {
        use render::api::{TalosOperation, TalosOperationSpec};
        let mut spec = TalosOperationSpec {
            kind: self.kind,
            max_unavailable: i32::try_from(self.max_unavailable).unwrap_or(1),
            force_drain: self.force_drain,
            ..Default::default()
        };
        spec.cluster_ref.name = self.cluster.clone();
        spec.target = render::api::OperationTarget::of_stage(self.kind, &self.target);
        let mut op = TalosOperation::new(&self.name, spec);
        op.metadata.labels = Some([(render::api::RELEASE.to_string(), self.release.clone())].into());
        op
    }
}

impl Plan {
    /// Each apply given its payload: the running config with the action's paths set from the
    /// render, and the hashes of both. A machine without configs keeps no payload (the
    /// executor refuses such an apply). Pure: the same inputs give the same bytes.
    pub fn complete(&mut self, configs: &BTreeMap<String, MachineConfigs>) {
        for (a, _) in &mut self.actions {
            let (Action::Apply { machine, paths, payload, .. } | Action::ApplyStaged { machine, paths, payload, .. }) =
                a
            else {
                continue;
            };
            let Some(c) = configs.get(machine.as_str()) else { continue };
            *payload = apply_payload(&c.running, &c.desired, paths);
        }
    }
}

/// What an apply of `paths` sends: the running config with those paths set from the render,
/// and the hashes of both. None when the running config does not parse. Pure.
pub fn apply_payload(running: &str, desired: &render::config::Config, paths: &[String]) -> Option<ApplyPayload> {
    let parsed_running = render::config::Config::parse(running).ok()?;
    let parsed: Vec<render::path::Path> = paths.iter().filter_map(|p| render::path::Path::parse(p).ok()).collect();
    let config = parsed_running.with_paths(desired, &parsed).to_yaml();
    Some(ApplyPayload { config_hash: config_hash(&config), config, running_hash: config_hash(running) })
}

/// The oldest of some versions (by semantic-version order; unparseable ones by text).
fn oldest(versions: impl Iterator<Item = String>) -> Option<String> {
    versions.min_by(|a, b| match (engine::parse_version(a), engine::parse_version(b)) {
        (Some(x), Some(y)) => engine::version_cmp(&x, &y),
        _ => a.cmp(b),
    })
}

/// Why the planner cannot be built or cannot plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The rules do not load, or do not declare what this host needs.
    #[error("the operation rules do not load; fix them and run `ichor rules check`")]
    Load(#[from] engine::LoadError),
    /// The message templates do not load.
    #[error(transparent)]
    Messages(#[from] crate::messages::MessageError),
    /// The Cilium chart's value keys do not load.
    #[error("{file} does not load")]
    CiliumKeys {
        file: String,
        #[source]
        source: render::inventory::InventoryError,
    },
    #[error("evaluating the operation rules")]
    Eval(#[from] engine::EvalError),
    /// The rules derived a value this host cannot decode (a column the binding cannot type).
    #[error("the rules derived {relation}({value:?}), which is not a {expected}")]
    Decode { relation: &'static str, value: String, expected: &'static str },
    /// The release set names a version no compatibility fact covers: each problem names the
    /// fact (file:line:col) and why.
    #[error("the release set does not load:\n  {}", problems.join("\n  "))]
    ReleaseSet { problems: Vec<String> },
    /// Two actions contradict each other; the plan is not executed.
    #[error("the rules contradict themselves: {what}; nothing is executed")]
    Contradiction { what: String, proofs: Vec<String> },
}

/// The release set this Ichor ships (ADR 0113): one Talos, one Kubernetes, one Cilium chart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReleaseSet {
    pub talos: String,
    pub kubernetes: String,
    pub cilium: String,
}

pub struct Planner {
    pub engine: Engine,
    rels: Rels,
    messages: crate::messages::Messages,
    /// The pinned Cilium chart's value keys, parsed once: every Job's values are validated.
    cilium_keys: render::inventory::Inventory,
}

/// RFC 3339 of seconds since 1970 (`state::rfc3339`: the snapshot's times and the plan's are
/// one format).
pub use crate::state::rfc3339;

fn mode(db: &Database, relation: &'static str, id: u32) -> Result<KubeProxyMode, PlanError> {
    KubeProxyMode::parse(db.sym(id)).ok_or_else(|| PlanError::Decode {
        relation,
        value: db.sym(id).to_string(),
        expected: "kube-proxy mode (enabled or replaced)",
    })
}

fn op_kind(db: &Database, relation: &'static str, id: u32) -> Result<OperationKind, PlanError> {
    OperationKind::parse(db.sym(id)).ok_or_else(|| PlanError::Decode {
        relation,
        value: db.sym(id).to_string(),
        expected: "an operation kind",
    })
}

fn phase(db: &Database, relation: &'static str, id: u32) -> Result<Phase, PlanError> {
    Phase::parse(db.sym(id)).ok_or_else(|| PlanError::Decode {
        relation,
        value: db.sym(id).to_string(),
        expected: "operation phase (render::api::Phase)",
    })
}

impl Planner {
    /// Compiles the program rooted at `root` (one of `files`, which includes the others) and
    /// the message templates; binds every relation the host uses.
    pub fn new(files: &[(String, String)], root: &str, messages: (&str, &str)) -> Result<Planner, PlanError> {
        let sources = MemSources(files.iter().cloned().collect::<HashMap<_, _>>());
        let (engine, _) = Engine::load(&[root.to_string()], &sources)?;
        let rels = Rels::bind(&engine.program).map_err(engine::LoadError::from)?;
        let messages = crate::messages::Messages::load(messages)?;
        let (file, keys) = render::embedded::CILIUM_KEYS;
        let cilium_keys = render::inventory::Inventory::parse(keys)
            .map_err(|source| PlanError::CiliumKeys { file: file.to_string(), source })?;
        let planner = Planner { engine, rels, messages, cilium_keys };
        // A release set no compatibility fact covers is a load error, never a plan.
        planner.release_set()?;
        Ok(planner)
    }

    /// The release set this Ichor ships (`release_set` in rules/versions.rules): Talos,
    /// Kubernetes and the Cilium chart. A version no fact covers is an error naming the fact's
    /// file and line and why (`release_set_problem`), all of them at once.
    pub fn release_set(&self) -> Result<ReleaseSet, PlanError> {
        let r = &self.rels;
        let db = self.engine.evaluate_built(self.engine.fact_builder(), EvalOptions::default())?;
        let p = &self.engine.program;
        let at = |component: &str, version: &str| -> String {
            let rel = p.relation("release_set");
            let fact = p.facts.iter().find(|(r, args, _)| {
                Some(*r) == rel
                    && args.first() == Some(&engine::Const::Sym(component.into()))
                    && (version.is_empty() || args.get(1) == Some(&engine::Const::Sym(version.into())))
            });
            match fact {
                Some((_, _, span)) => format!("{}:{}:{}", p.sources.name(*span), span.line, span.col),
                None => "rules/versions.rules".to_string(),
            }
        };
        let mut problems: Vec<String> = r
            .release_set_problem
            .rows(&db)
            .map(|[c, v, why]| {
                let (c, v) = (db.sym(c), db.sym(v));
                format!("{}: release_set({c:?}, {v:?}): {}", at(c, v), db.sym(why))
            })
            .collect();
        problems.sort();
        problems.dedup();
        if !problems.is_empty() {
            return Err(PlanError::ReleaseSet { problems });
        }
        let get = |c: &str| {
            r.release_set
                .rows(&db)
                .find(|[k, _]| db.sym(*k) == c)
                .map(|[_, v]| db.sym(v).to_string())
                .unwrap_or_default()
        };
        Ok(ReleaseSet { talos: get("talos"), kubernetes: get("kubernetes"), cilium: get("cilium") })
    }

    /// The shipped rules and templates.
    pub fn embedded() -> Result<Planner, PlanError> {
        let files: Vec<(String, String)> =
            render::embedded::RULE_FILES.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Planner::new(&files, render::embedded::OPERATIONS_PROGRAM, render::embedded::MESSAGES)
    }

    /// The rules' `terminal` and `holds_lock` phases (facts of rules/backbone.rules, read with
    /// no input): what `Phase::is_terminal` and `Phase::holds_lock` must agree with.
    pub fn phase_sets(&self) -> Result<(Vec<Phase>, Vec<Phase>), PlanError> {
        let r = &self.rels;
        let db = self.engine.evaluate_built(self.engine.fact_builder(), EvalOptions::default())?;
        let read = |rel: engine::Output<1>| -> Result<Vec<Phase>, PlanError> {
            let mut v = rel.rows(&db).map(|[p]| phase(&db, "terminal", p)).collect::<Result<Vec<_>, _>>()?;
            v.sort();
            Ok(v)
        };
        Ok((read(r.terminal)?, read(r.holds_lock)?))
    }

    fn message(&self, template: &str, data: &Json) -> String {
        self.messages.render(template, data).unwrap_or_else(|e| format!("{template} ({e})"))
    }

    /// Plans one reconcile of the snapshot's operation; with `explain`, every action carries
    /// its proof (proofs of contradicting actions are always built).
    pub fn plan(&self, s: &ObservedState) -> Result<Plan, PlanError> {
        self.plan_with(s, false)
    }

    /// What every message of the plan may name: the cluster, the operation, its target and where
    /// it moves from, the fleet's counts, the CNI's modes and charts.
    fn message_base(&self, db: &Database, s: &ObservedState) -> Json {
        let r = &self.rels;
        let text = |id: u32| db.sym(id).to_string();
        let cps = s.machines.iter().filter(|m| m.role == Role::Controlplane).count();
        let embedded = render::embedded::CILIUM_CHART_VERSION;
        let running = s.workload.cilium_chart_version.clone().unwrap_or_else(|| "unknown".into());
        let current_mode = r.current_kube_proxy_mode.rows(db).next().map(|[m]| text(m)).unwrap_or_default();
        let target = s
            .operation
            .target_kubernetes
            .clone()
            .or(s.operation.target_talos.clone())
            .or(s.operation.target_kube_proxy.map(|m| m.name().to_string()))
            .or(s.operation.target_cilium_chart.clone())
            .unwrap_or_default();
        let from = match s.operation.kind {
            // The mode in force, as the rules decide it.
            OperationKind::Cni => current_mode.clone(),
            // The chart the release runs.
            OperationKind::CniUpgrade | OperationKind::CniAdopt => running.clone(),
            // The oldest Talos the machines run.
            OperationKind::Talos => oldest(s.machines.iter().map(|m| m.talos_version.clone())).unwrap_or_default(),
            // The oldest kubelet the machines run.
            _ => oldest(s.machines.iter().map(|m| m.kubelet_version.clone()))
                .unwrap_or_else(|| s.cluster.kubernetes_version.clone()),
        };
        json!({
            "cluster": s.cluster.name,
            "operation": s.operation.name,
            "kind": s.operation.kind.name(),
            "target": target,
            "from": from,
            "machines": s.machines.len(),
            "controlplanes": cps,
            "workers": s.machines.len() - cps,
            "maxUnavailable": s.operation.max_unavailable,
            "live": s.workload.cilium_kube_proxy_replacement.clone().unwrap_or_else(|| "unknown".into()),
            "wantReplacement": if target == "replaced" { "true" } else { "false" },
            "homeReplacement": s.cluster.cni.home_kube_proxy_replacement.clone().unwrap_or_else(|| "unknown".into()),
            "kubeProxy": s.cluster.cni.kube_proxy.name(),
            "mode": current_mode,
            "embedded": embedded,
            "running": running,
            "takeOwnership": r.cilium_job_takes_ownership.any(db),
        })
    }

    /// The machines' steps the rules derived (abort, resume, pause and fail too), as actions, in
    /// the order decoded.
    fn machine_actions(
        &self,
        db: &Database,
        s: &ObservedState,
        proof: &dyn Fn(engine::RelId, &[u32]) -> Option<usize>,
        data: &dyn Fn(Json) -> Json,
    ) -> Result<Vec<(Action, Vec<usize>)>, PlanError> {
        let r = &self.rels;
        let text = |id: u32| db.sym(id).to_string();
        // How the Talos API reaches a machine: actions that call Talos carry it.
        let addresses: HashMap<&str, &str> =
            s.machines.iter().filter_map(|x| Some((x.name.as_str(), x.address.as_deref()?))).collect();
        let node_of = |m: &str| addresses.get(m).map(|a| a.to_string());
        // The boot a step starts on: Talos's word when it has one (ahead of the Node's).
        let boots: HashMap<&str, &str> = s
            .machines
            .iter()
            .filter_map(|x| Some((x.name.as_str(), x.talos_boot_id.as_deref().or(x.boot_id.as_deref())?)))
            .collect();
        let mut actions: Vec<(Action, Vec<usize>)> = vec![];
        let mut push = |a: Action, p: Option<usize>| actions.push((a, p.into_iter().collect()));
        for row @ [was] in r.act_abort.rows(db) {
            let was = phase(db, "act_abort", was)?;
            push(Action::Abort { was }, proof(r.act_abort.id(), &row));
        }
        if r.act_resume.any(db) {
            push(Action::Resume, proof(r.act_resume.id(), &[]));
        }
        for row @ [t, m, d] in r.act_pause.rows(db) {
            let msg = self.message(&text(t), &data(json!({"machine": text(m), "detail": text(d)})));
            push(Action::Pause { message: msg }, proof(r.act_pause.id(), &row));
        }
        for row @ [m, t, d] in r.act_fail.rows(db) {
            let msg = self.message(&text(t), &data(json!({"machine": text(m), "detail": text(d)})));
            push(Action::Fail { machine: text(m), message: msg }, proof(r.act_fail.id(), &row));
        }
        for row @ [m] in r.act_set_kube_proxy_status.rows(db) {
            let mode = mode(db, "act_set_kube_proxy_status", m)?;
            push(Action::SetKubeProxyStatus { mode }, proof(r.act_set_kube_proxy_status.id(), &row));
        }
        for row @ [m, st] in r.act_start.rows(db) {
            let boot_id = boots.get(db.sym(m)).map(|b| b.to_string());
            push(Action::Start { machine: text(m), stage: text(st), boot_id }, proof(r.act_start.id(), &row));
        }
        for row @ [m, ns, img] in r.act_pull_image.rows(db) {
            let namespace = ContainerdNamespace::parse(db.sym(ns)).ok_or_else(|| PlanError::Decode {
                relation: "act_pull_image",
                value: text(ns),
                expected: "containerd namespace (k8s.io or system)",
            })?;
            push(
                Action::PullImage { machine: text(m), node: node_of(db.sym(m)), namespace, image: text(img) },
                proof(r.act_pull_image.id(), &row),
            );
        }
        for row @ [m] in r.act_cordon.rows(db) {
            push(Action::Cordon { machine: text(m) }, proof(r.act_cordon.id(), &row));
        }
        let forced: BTreeSet<String> = r.act_drain_forced.rows(db).map(|[m]| text(m)).collect();
        for row @ [m] in r.act_drain.rows(db) {
            let machine = text(m);
            let force = forced.contains(&machine);
            push(Action::Drain { machine, force }, proof(r.act_drain.id(), &row));
        }
        // Each machine's applied paths, one action per machine and mode, paths sorted.
        let by_machine = |rel: &engine::Output<2>| {
            let mut out: BTreeMap<String, (Vec<String>, Vec<usize>)> = BTreeMap::new();
            for row @ [m, path] in rel.rows(db) {
                let e = out.entry(text(m)).or_default();
                e.0.push(text(path));
                e.1.extend(proof(rel.id(), &row));
            }
            out.values_mut().for_each(|(paths, _)| paths.sort());
            out
        };
        for (m, (paths, proofs)) in by_machine(&r.act_apply) {
            actions.push((Action::Apply { node: node_of(&m), machine: m, paths, payload: None }, proofs));
        }
        for (m, (paths, proofs)) in by_machine(&r.act_apply_staged) {
            actions.push((Action::ApplyStaged { node: node_of(&m), machine: m, paths, payload: None }, proofs));
        }
        let mut push = |a: Action, p: Option<usize>| actions.push((a, p.into_iter().collect()));
        for row @ [m, img, api] in r.act_upgrade_talos.rows(db) {
            let legacy = match db.sym(api) {
                "lifecycle" => false,
                "legacy" => true,
                _ => {
                    return Err(PlanError::Decode {
                        relation: "act_upgrade_talos",
                        value: text(api),
                        expected: "upgrade API (lifecycle or legacy)",
                    });
                }
            };
            push(
                Action::UpgradeTalos { machine: text(m), node: node_of(db.sym(m)), image: text(img), legacy },
                proof(r.act_upgrade_talos.id(), &row),
            );
        }
        for row @ [m, st] in r.act_stage.rows(db) {
            push(Action::Stage { machine: text(m), stage: text(st) }, proof(r.act_stage.id(), &row));
        }
        for row @ [m] in r.act_reboot.rows(db) {
            push(Action::Reboot { machine: text(m), node: node_of(db.sym(m)) }, proof(r.act_reboot.id(), &row));
        }
        for row @ [m] in r.act_done.rows(db) {
            push(Action::Done { machine: text(m) }, proof(r.act_done.id(), &row));
        }
        for row @ [m] in r.act_uncordon.rows(db) {
            push(Action::Uncordon { machine: text(m) }, proof(r.act_uncordon.id(), &row));
        }
        Ok(actions)
    }

    /// The cluster-wide actions the rules derived (the manifests, deletions, Cilium's Job, stages,
    /// waits, clocks, warnings, the end), as actions, in the order decoded.
    fn cluster_actions(
        &self,
        db: &Database,
        s: &ObservedState,
        proof: &dyn Fn(engine::RelId, &[u32]) -> Option<usize>,
        data: &dyn Fn(Json) -> Json,
    ) -> Result<Vec<(Action, Vec<usize>)>, PlanError> {
        let r = &self.rels;
        let text = |id: u32| db.sym(id).to_string();
        let num = |id: u32| db.num(id);
        // How the Talos API reaches a machine: actions that call Talos carry it.
        let addresses: HashMap<&str, &str> =
            s.machines.iter().filter_map(|x| Some((x.name.as_str(), x.address.as_deref()?))).collect();
        let node_of = |m: &str| addresses.get(m).map(|a| a.to_string());
        let mut actions: Vec<(Action, Vec<usize>)> = vec![];
        let mut push = |a: Action, p: Option<usize>| actions.push((a, p.into_iter().collect()));
        for row @ [v] in r.act_sync_manifests.rows(db) {
            push(
                Action::SyncManifests { via: text(v), node: node_of(db.sym(v)), field_manager: TALOS_FIELD_MANAGER },
                proof(r.act_sync_manifests.id(), &row),
            );
        }
        // In the order the rules give (their first column), then by name.
        let mut deletes: Vec<[u32; 5]> = r.act_delete.rows(db).collect();
        deletes.sort_by_key(|&[order, _, _, _, name]| (num(order), text(name)));
        for row @ [_, api_version, kind, ns, name] in deletes {
            let namespace = Some(text(ns)).filter(|n| !n.is_empty());
            let object = ObjectRef { api_version: text(api_version), kind: text(kind), namespace, name: text(name) };
            push(Action::Delete { object }, proof(r.act_delete.id(), &row));
        }
        for row @ [v, manifest] in r.act_restore_kube_proxy.rows(db) {
            push(
                Action::RestoreKubeProxy {
                    via: text(v),
                    node: node_of(db.sym(v)),
                    manifest: text(manifest),
                    field_manager: TALOS_FIELD_MANAGER,
                },
                proof(r.act_restore_kube_proxy.id(), &row),
            );
        }
        for row @ [m] in r.act_cilium_job.rows(db) {
            let mode = mode(db, "act_cilium_job", m)?;
            let user = s.cluster.cilium_values.clone().unwrap_or(Json::Null);
            let tunnel = s.cluster.cilium_tunnel.clone().unwrap_or_else(|| "vxlan".into());
            let values = render::cilium::layered(&user, mode == KubeProxyMode::Replaced, &tunnel);
            // Named by its values and its operation: the same Job again within an operation is
            // the one already there (a failed one is not run again blindly), and the next round
            // trip of a switch runs its own (issue 23: a completed Job of the same values
            // would otherwise stand for it, and cilium-config would never change).
            let name = format!(
                "ichor-cni-{}",
                render::cilium::values_hash(&serde_json::json!({"values": values, "operation": s.operation.name}))
            );
            let take_ownership = r.cilium_job_takes_ownership.any(db);
            push(
                Action::CiliumJob { mode, name, values, user, tunnel, take_ownership },
                proof(r.act_cilium_job.id(), &row),
            );
        }
        for row @ [chart] in r.act_record_adoption.rows(db) {
            push(Action::RecordCiliumAdoption { chart: text(chart) }, proof(r.act_record_adoption.id(), &row));
        }
        for row @ [m] in r.act_taint.rows(db) {
            push(Action::Taint { machine: text(m) }, proof(r.act_taint.id(), &row));
        }
        for row @ [m] in r.act_untaint.rows(db) {
            push(Action::Untaint { machine: text(m) }, proof(r.act_untaint.id(), &row));
        }
        for row @ [st] in r.act_step_done.rows(db) {
            push(Action::StepDone { step: text(st) }, proof(r.act_step_done.id(), &row));
        }
        for row @ [k, t] in r.act_start_stage.rows(db) {
            let kind = op_kind(db, "act_start_stage", k)?;
            push(Action::StartStage { stage: StageStart::of(s, kind, &text(t)) }, proof(r.act_start_stage.id(), &row));
        }
        for row @ [t, d, clock, since, limit] in r.act_wait.rows(db) {
            let (t, since, limit) = (text(t), rfc3339(num(since)), num(limit));
            let msg = self.message(
                &t,
                &data(json!({"machine": text(d), "detail": text(d), "since": since, "limit": limit / 60, "limitSeconds": limit})),
            );
            push(
                Action::Wait { reason: t, message: msg, clock: text(clock), since, limit_minutes: (limit + 59) / 60 },
                proof(r.act_wait.id(), &row),
            );
        }
        for row @ [c] in r.act_clear_clock.rows(db) {
            push(Action::ClearClock { clock: text(c) }, proof(r.act_clear_clock.id(), &row));
        }
        for row @ [t, a, b] in r.act_warn.rows(db) {
            let msg = self.message(&text(t), &data(json!({"a": text(a), "b": text(b)})));
            push(Action::Warn { message: msg }, proof(r.act_warn.id(), &row));
        }
        if r.act_complete.any(db) {
            push(Action::Complete, proof(r.act_complete.id(), &[]));
        }
        Ok(actions)
    }

    pub fn plan_with(&self, s: &ObservedState, explain: bool) -> Result<Plan, PlanError> {
        let r = &self.rels;
        let facts = crate::facts::facts(&self.engine, r, s, &self.cilium_keys);
        let db = self.engine.evaluate_built(facts, EvalOptions { provenance: true, ..EvalOptions::default() })?;
        let p = &self.engine.program;
        let text = |id: u32| db.sym(id).to_string();
        let num = |id: u32| db.num(id);
        let graph = std::cell::RefCell::new(ProofGraph::default());
        let proof = |rel: engine::RelId, row: &[u32]| -> Option<usize> {
            if !explain {
                return None;
            }
            graph.borrow_mut().add(p, &db, rel, row).ok()
        };
        let base = self.message_base(&db, s);
        let data = |extra: Json| -> Json {
            let mut d = base.clone();
            if let (Json::Object(m), Json::Object(x)) = (&mut d, extra) {
                m.extend(x);
            }
            d
        };
        let mut actions = self.machine_actions(&db, s, &proof, &data)?;
        actions.extend(self.cluster_actions(&db, s, &proof, &data)?);
        // The order of action kinds is the rules' (`action_order`); within a kind, as decoded.
        let rank: HashMap<&str, i64> = r.action_order.rows(&db).map(|[a, n]| (db.sym(a), num(n))).collect();
        actions.sort_by_key(|(a, _)| rank.get(a.kind()).copied().unwrap_or(i64::MAX));
        // A release's stages, in order, each with its proof (the path's rules) when explained.
        let mut stages: Vec<(i64, OperationKind, String, Vec<usize>)> = vec![];
        for row @ [o, k, t] in r.release_stage.rows(&db) {
            let kind = op_kind(&db, "release_stage", k)?;
            stages.push((num(o), kind, text(t), proof(r.release_stage.id(), &row).into_iter().collect()));
        }
        stages.sort_unstable_by_key(|a| a.0);
        let mut proofs = graph.into_inner();
        if explain {
            let roots: Vec<usize> = actions
                .iter()
                .flat_map(|(_, p)| p.iter().copied())
                .chain(stages.iter().flat_map(|st| st.3.iter().copied()))
                .collect();
            let map = proofs.renumber(&roots);
            for (_, ids) in &mut actions {
                ids.iter_mut().for_each(|id| *id = map[*id].unwrap_or(0));
            }
            for st in &mut stages {
                st.3.iter_mut().for_each(|id| *id = map[*id].unwrap_or(0));
            }
        }
        let stage_proofs: Vec<Vec<usize>> = stages.iter().map(|st| st.3.clone()).collect();
        let stages: Vec<(OperationKind, String)> = stages.into_iter().map(|(_, k, t, _)| (k, t)).collect();
        if let Err(e) = self.contradictions(&actions, &proofs, s) {
            // Contradicting actions are always reported with their proofs.
            return if explain { Err(e) } else { self.plan_with(s, true) };
        }
        let phase = match r.phase.rows(&db).next() {
            Some([ph]) => phase(&db, "phase", ph)?,
            None => s.operation.phase,
        };
        let confirmation = (s.operation.phase == Phase::Pending).then(|| {
            let t = match s.operation.kind {
                OperationKind::Cni => "ConfirmSwitch",
                OperationKind::Config => "ConfirmRollout",
                OperationKind::CniUpgrade => "ConfirmCiliumUpgrade",
                OperationKind::CniAdopt => "ConfirmCiliumAdopt",
                OperationKind::Talos => "ConfirmTalosUpgrade",
                OperationKind::Release => "ConfirmRelease",
                _ => "ConfirmUpgrade",
            };
            // The order is the rules' (`operation_order`): ranked there, listed here.
            let mut order: Vec<(i64, i64, &str)> =
                r.operation_order.rows(&db).map(|[m, rank, i]| (num(rank), num(i), db.sym(m))).collect();
            order.sort_unstable();
            let names: Vec<&str> = order.iter().map(|o| o.2).collect();
            // The counts are of the machines that get a step (issue 50: a switch on a v1.14
            // cluster counted a worker it never touches).
            let cps = order.iter().filter(|o| o.0 == 0).count();
            self.message(
                t,
                &data(json!({
                    "stages": stage_words(&stages),
                    "stageCount": stages.len(),
                    "order": names.join(", "),
                    "count": names.len(),
                    "machines": names.len(),
                    "controlplanes": cps,
                    "workers": names.len() - cps,
                })),
            )
        });
        let cilium_job_mode = match r.cilium_job_mode.rows(&db).next() {
            Some([m]) => Some(mode(&db, "cilium_job_mode", m)?),
            None => None,
        };
        let mut work_left: Vec<String> = r.work_left.rows(&db).map(|[m]| db.sym(m).to_string()).collect();
        work_left.sort_unstable();
        let mut reboot_paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for [m, path] in r.roll_path.rows(&db) {
            reboot_paths.entry(text(m)).or_default().push(text(path));
        }
        reboot_paths.values_mut().for_each(|v| v.sort_unstable());
        let mut checks: Vec<String> =
            r.plan_check.rows(&db).map(|[t, d]| self.message(&text(t), &data(json!({"detail": text(d)})))).collect();
        checks.sort_unstable();
        let drains = |rel: &engine::Output<3>, template: &str| -> Vec<String> {
            rel.rows(&db)
                .map(|[m, b, p]| self.message(template, &data(json!({"machine": text(m), "a": text(b), "b": text(p)}))))
                .collect()
        };
        let mut drain_refusals = drains(&r.drain_refused_now, "DrainRefusedNow");
        drain_refusals.extend(drains(&r.drain_forced_now, "DrainForcedNow"));
        drain_refusals.sort_unstable();
        let nothing_to_do =
            r.nothing_to_do.rows(&db).map(|[t, d]| self.message(&text(t), &data(json!({"detail": text(d)})))).min();
        Ok(Plan {
            operation: s.operation.name.clone(),
            kind: s.operation.kind,
            phase,
            confirmation,
            actions,
            proofs,
            cilium_job_mode,
            work_left,
            reboot_paths,
            checks,
            drain_refusals,
            nothing_to_do,
            stages,
            stage_proofs,
        })
    }

    /// Plans one reconcile and completes its applies from `configs` (the controller's use):
    /// every action then carries what executing it needs.
    pub fn plan_complete(
        &self,
        s: &ObservedState,
        configs: &BTreeMap<String, MachineConfigs>,
    ) -> Result<Plan, PlanError> {
        let mut plan = self.plan(s)?;
        plan.complete(configs);
        Ok(plan)
    }

    /// Actions that cannot all be performed: reported with both proofs, never executed.
    fn contradictions(
        &self,
        actions: &[(Action, Vec<usize>)],
        proofs: &ProofGraph,
        s: &ObservedState,
    ) -> Result<(), PlanError> {
        let show = |i: usize| proofs.render(&actions[i].1);
        let find = |pred: &dyn Fn(&Action) -> bool| -> Vec<usize> {
            (0..actions.len()).filter(|&i| pred(&actions[i].0)).collect()
        };
        let err = |what: String, idx: &[usize]| PlanError::Contradiction {
            what,
            proofs: idx.iter().map(|&i| show(i)).collect(),
        };
        let jobs = find(&|a| matches!(a, Action::CiliumJob { .. }));
        if jobs.len() > 1 {
            return Err(err("two Cilium Jobs with different kube-proxy modes".into(), &jobs));
        }
        let adoptions = find(&|a| matches!(a, Action::RecordCiliumAdoption { .. }));
        if adoptions.len() > 1 {
            return Err(err("two charts for status.cni.adoption".into(), &adoptions));
        }
        let statuses = find(&|a| matches!(a, Action::SetKubeProxyStatus { .. }));
        if statuses.len() > 1 {
            return Err(err("two values for status.cni.kubeProxy".into(), &statuses));
        }
        let complete = find(&|a| matches!(a, Action::Complete));
        let stops = find(&|a| matches!(a, Action::Pause { .. } | Action::Fail { .. }));
        if !complete.is_empty() && !stops.is_empty() {
            return Err(err("the operation both completes and pauses".into(), &[complete[0], stops[0]]));
        }
        let cps: Vec<usize> = (0..actions.len())
            .filter(|&i| match &actions[i].0 {
                Action::Start { machine, .. } => {
                    s.machines.iter().any(|m| &m.name == machine && m.role == Role::Controlplane)
                }
                _ => false,
            })
            .collect();
        if cps.len() > 1 {
            return Err(err("two control planes start in one plan (control planes go one at a time)".into(), &cps));
        }
        let starts = find(&|a| matches!(a, Action::Start { .. }));
        for &i in &starts {
            if let Action::Start { machine, .. } = &actions[i].0 {
                let failed = find(&|a| matches!(a, Action::Fail { machine: m, .. } if m == machine));
                if let Some(&f) = failed.first() {
                    return Err(err(format!("{machine} both starts and fails"), &[i, f]));
                }
            }
        }
        Ok(())
    }
}
