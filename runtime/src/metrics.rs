//! The controller's Prometheus metrics (feature `io`): counters of what this process did
//! (reconciles, errors, actions by kind and outcome), histograms of how long it took, and
//! gauges of the current state of every operation and machine, recomputed from the caches at
//! each scrape, so that they read the same whichever replica answers and however long it ran
//! (issue 50, finding 6: a gauge set once per phase read Running 1 and Completed 1 after one
//! upgrade).
//!
//! Start at `Metrics::encode`; `state_gauges` is the pure part (objects in, rows out).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use render::api::{TalosMachine, TalosOperation};
use std::collections::BTreeMap;

/// An action's kind and what became of it (`done`, `recorded`, `failed`, `refused`,
/// `interrupted`: `exec::Performed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    pub kind: String,
    pub outcome: String,
}

/// Operations by kind and phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct OperationLabel {
    pub kind: String,
    pub phase: String,
}

/// One operation, with its stage (`""` when it has none).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct OperationInfoLabel {
    pub operation: String,
    pub cluster: String,
    pub kind: String,
    pub phase: String,
    pub stage: String,
}

/// An operation's machines by their step's phase and stage (`pulling`, `rebooting`, `kubelets` ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct StepLabel {
    pub operation: String,
    pub kind: String,
    pub phase: String,
    pub stage: String,
}

/// A wait of an operation that runs on a clock (`status.waitingSince`): `DrainBlocked`,
/// `LockHeld`, ...
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct WaitLabel {
    pub operation: String,
    pub wait: String,
}

/// Machines by cluster and Ready condition (status and reason; `Unknown` when none yet).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct MachineLabel {
    pub cluster: String,
    pub ready: String,
    pub reason: String,
}

/// One machine.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct MachineNameLabel {
    pub cluster: String,
    pub machine: String,
}

/// What this build is.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabel {
    pub version: String,
    pub release_set_kubernetes: String,
    pub release_set_talos: String,
}

/// A machine's step in progress, with its stage.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct StepStartLabel {
    pub operation: String,
    pub cluster: String,
    pub machine: String,
    pub stage: String,
}

/// A cluster's component behind the release set this controller acts for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ReleaseLabel {
    pub cluster: String,
    /// `talos` or `kubernetes`.
    pub component: String,
    /// The version the cluster's spec names.
    pub version: String,
    pub release_set: String,
}

/// Each cluster's Talos and Kubernetes that are older than the release set (`ichor upgrade
/// cluster` would move them). Pure.
pub fn release_behind<'a>(
    clusters: impl IntoIterator<Item = &'a render::api::TalosCluster>,
    talos: &str,
    kubernetes: &str,
) -> Vec<ReleaseLabel> {
    let mut out = vec![];
    for c in clusters {
        let name = c.metadata.name.clone().unwrap_or_default();
        for (component, version, set) in
            [("talos", &c.spec.talos_version, talos), ("kubernetes", &c.spec.kubernetes_version, kubernetes)]
        {
            if let (Some(v), Some(s)) = (engine::parse_version(version), engine::parse_version(set))
                && engine::version_cmp(&v, &s).is_lt()
            {
                out.push(ReleaseLabel {
                    cluster: name.clone(),
                    component: component.into(),
                    version: version.clone(),
                    release_set: set.into(),
                });
            }
        }
    }
    out.sort();
    out
}

/// The gauges' rows from the objects: each a label set and its value. Pure.
#[derive(Debug, Default, PartialEq)]
pub struct StateRows {
    pub operations: BTreeMap<OperationLabel, i64>,
    pub operation_info: Vec<OperationInfoLabel>,
    /// Each operation's machines by their step's phase and stage.
    pub steps: BTreeMap<StepLabel, i64>,
    /// Each operation's waits on a clock now.
    pub waits: Vec<WaitLabel>,
    pub machines: BTreeMap<MachineLabel, i64>,
    /// Paths a reboot must apply (`status.rebootPaths`), per machine that has any.
    pub reboot_paths: BTreeMap<MachineNameLabel, i64>,
    /// Paths applied within the current boot that take effect at the next
    /// (`status.appliedAwaitingReboot`), per machine that has any.
    pub awaiting_reboot: BTreeMap<MachineNameLabel, i64>,
    /// When each step in progress started (seconds since 1970).
    pub step_started: BTreeMap<StepStartLabel, i64>,
}

/// Every operation and machine as the gauges count them.
pub fn state_gauges<'a>(
    operations: impl IntoIterator<Item = &'a TalosOperation>,
    machines: impl IntoIterator<Item = &'a TalosMachine>,
) -> StateRows {
    let mut rows = StateRows::default();
    for o in operations {
        let st = o.status.clone().unwrap_or_default();
        let (kind, phase) = (o.spec.kind.name().to_string(), st.phase().name().to_string());
        // Every phase of a kind the cluster has operations of is a series, 0 when none is in
        // it: after an upgrade `phase="Running"` reads 0, not nothing.
        for p in render::api::Phase::ALL {
            rows.operations.entry(OperationLabel { kind: kind.clone(), phase: p.name().to_string() }).or_default();
        }
        *rows.operations.entry(OperationLabel { kind: kind.clone(), phase: phase.clone() }).or_default() += 1;
        for (machine, p) in &st.machines {
            if p.phase == render::api::MachinePhase::Applying
                && let Some(t) = p.started_at.as_deref().and_then(crate::state::epoch)
            {
                let label = StepStartLabel {
                    operation: o.metadata.name.clone().unwrap_or_default(),
                    cluster: o.spec.cluster_ref.name.clone(),
                    machine: machine.clone(),
                    stage: p.stage.clone().unwrap_or_default(),
                };
                rows.step_started.insert(label, t);
            }
            let label = StepLabel {
                operation: o.metadata.name.clone().unwrap_or_default(),
                kind: kind.clone(),
                phase: p.phase.name().to_string(),
                stage: p.stage.clone().unwrap_or_default(),
            };
            *rows.steps.entry(label).or_default() += 1;
        }
        for wait in st.waiting_since.keys() {
            rows.waits.push(WaitLabel { operation: o.metadata.name.clone().unwrap_or_default(), wait: wait.clone() });
        }
        rows.operation_info.push(OperationInfoLabel {
            operation: o.metadata.name.clone().unwrap_or_default(),
            cluster: o.spec.cluster_ref.name.clone(),
            kind,
            phase,
            stage: st.stage.clone().unwrap_or_default(),
        });
    }
    rows.operation_info.sort();
    for m in machines {
        let cluster = m.spec.cluster_ref.name.clone();
        let st = m.status.clone().unwrap_or_default();
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready");
        let label = MachineLabel {
            cluster: cluster.clone(),
            ready: ready.map(|c| c.status.clone()).unwrap_or_else(|| "Unknown".into()),
            reason: ready.map(|c| c.reason.clone()).unwrap_or_else(|| "NotJudgedYet".into()),
        };
        *rows.machines.entry(label).or_default() += 1;
        let name = MachineNameLabel { cluster, machine: m.metadata.name.clone().unwrap_or_default() };
        if !st.reboot_paths.is_empty() {
            rows.reboot_paths.insert(name.clone(), st.reboot_paths.len() as i64);
        }
        if !st.applied_awaiting_reboot.is_empty() {
            rows.awaiting_reboot.insert(name, st.applied_awaiting_reboot.len() as i64);
        }
    }
    rows
}

/// The controller's metrics.
pub struct Metrics {
    pub registry: Registry,
    pub(crate) reconciles: Counter,
    pub(crate) errors: Counter,
    pub(crate) plan_seconds: Histogram,
    pub(crate) decide_seconds: Histogram,
    pub(crate) actions: Family<ActionLabel, Counter>,
    operations: Family<OperationLabel, Gauge>,
    operation_info: Family<OperationInfoLabel, Gauge>,
    steps: Family<StepLabel, Gauge>,
    waits: Family<WaitLabel, Gauge>,
    machines: Family<MachineLabel, Gauge>,
    reboot_paths: Family<MachineNameLabel, Gauge>,
    awaiting_reboot: Family<MachineNameLabel, Gauge>,
    step_started: Family<StepStartLabel, Gauge>,
    release_behind: Family<ReleaseLabel, Gauge>,
    leader: Gauge,
    build: Family<BuildLabel, Gauge>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ichor");
        let m = Metrics {
            reconciles: Counter::default(),
            errors: Counter::default(),
            plan_seconds: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
            decide_seconds: Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]),
            actions: Family::default(),
            operations: Family::default(),
            operation_info: Family::default(),
            steps: Family::default(),
            waits: Family::default(),
            machines: Family::default(),
            reboot_paths: Family::default(),
            awaiting_reboot: Family::default(),
            step_started: Family::default(),
            release_behind: Family::default(),
            leader: Gauge::default(),
            build: Family::default(),
            registry: Registry::default(),
        };
        registry.register("reconciles", "Reconciles of TalosOperations", m.reconciles.clone());
        registry.register("reconcile_errors", "Reconciles that ended in an error", m.errors.clone());
        registry.register(
            "reconcile_seconds",
            "Time of one reconcile (read, plan, execute, write)",
            m.plan_seconds.clone(),
        );
        registry.register(
            "reconcile_decide_seconds",
            "Time of one reconcile's reading, assembling and planning (what grows with the fleet), without executing or writing",
            m.decide_seconds.clone(),
        );
        registry.register(
            "actions",
            "Actions of operations' plans this process performed, by kind and outcome (done, recorded, failed, refused, interrupted); a drain a PodDisruptionBudget blocked past its deadline is kind drain, outcome failed",
            m.actions.clone(),
        );
        registry.register(
            "operations",
            "TalosOperations now, by kind and phase (from the controller's cache)",
            m.operations.clone(),
        );
        registry.register(
            "operation_info",
            "One series per TalosOperation now, with its cluster, kind, phase and stage",
            m.operation_info.clone(),
        );
        registry.register(
            "operation_machines",
            "Each TalosOperation's machines now, by their step's phase (Applying, Done, Failed) and stage (a Talos upgrade's pulling, rebooting, verifying, verified; a Kubernetes upgrade's apiservers ... kubelets)",
            m.steps.clone(),
        );
        registry.register(
            "operation_waits",
            "Each TalosOperation's waits on a clock now (status.waitingSince), 1 each: wait DrainBlocked is a machine whose turn has come while a PodDisruptionBudget refuses its drain (held before its cordon), LockHeld another operation holding the cluster's lock",
            m.waits.clone(),
        );
        registry.register(
            "machines",
            "TalosMachines now, by cluster and Ready condition (status and reason)",
            m.machines.clone(),
        );
        registry.register(
            "machine_reboot_paths",
            "Changed paths a reboot must apply (status.rebootPaths), per machine that has any",
            m.reboot_paths.clone(),
        );
        registry.register(
            "machine_applied_awaiting_reboot_paths",
            "Paths applied within the current boot that take effect at the next (status.appliedAwaitingReboot), per machine that has any",
            m.awaiting_reboot.clone(),
        );
        registry.register(
            "operation_step_started_timestamp_seconds",
            "When each machine's step in progress started (status.machines.<name>.startedAt), by operation, cluster, machine and stage: a step's clock is 20 minutes (a reboot's), so time() minus it past that is a step stuck past its clock",
            m.step_started.clone(),
        );
        registry.register(
            "cluster_release_behind",
            "1 for each TalosCluster's Talos or Kubernetes (spec) older than the release set this controller acts for (ichor upgrade cluster moves it)",
            m.release_behind.clone(),
        );
        registry.register("leader", "1 when this replica holds the Lease and acts, 0 on a standby", m.leader.clone());
        registry.register("build_info", "This Ichor's version and release set (always 1)", m.build.clone());
        let m = Metrics { registry, ..m };
        m.set_release_set(render::embedded::RELEASE_SET_KUBERNETES, render::embedded::RELEASE_SET_TALOS);
        m
    }

    /// Says which release set this process acts for (the controller's `--release-set-*`).
    pub fn set_release_set(&self, kubernetes: &str, talos: &str) {
        self.build.clear();
        self.build
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION").into(),
                release_set_kubernetes: kubernetes.into(),
                release_set_talos: talos.into(),
            })
            .set(1);
    }

    /// Counts one performed action.
    pub fn action(&self, kind: &str, outcome: &str) {
        self.actions.get_or_create(&ActionLabel { kind: kind.into(), outcome: outcome.into() }).inc();
    }

    /// Sets the state gauges to `rows`: what the caches hold now, and nothing older.
    pub fn set_state(&self, rows: &StateRows) {
        set_family(&self.operations, rows.operations.iter().map(|(l, n)| (l, *n)));
        set_family(&self.operation_info, rows.operation_info.iter().map(|l| (l, 1)));
        set_family(&self.steps, rows.steps.iter().map(|(l, n)| (l, *n)));
        set_family(&self.waits, rows.waits.iter().map(|l| (l, 1)));
        set_family(&self.machines, rows.machines.iter().map(|(l, n)| (l, *n)));
        set_family(&self.reboot_paths, rows.reboot_paths.iter().map(|(l, n)| (l, *n)));
        set_family(&self.awaiting_reboot, rows.awaiting_reboot.iter().map(|(l, n)| (l, *n)));
        set_family(&self.step_started, rows.step_started.iter().map(|(l, n)| (l, *n)));
    }

    /// Sets whether this replica acts.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Sets which clusters are behind the release set.
    pub fn set_release_behind(&self, behind: &[ReleaseLabel]) {
        set_family(&self.release_behind, behind.iter().map(|l| (l, 1)));
    }

    /// The text exposition, with the state gauges recomputed from `stores` first (when the
    /// caches run).
    pub fn encode_with(&self, stores: Option<&crate::stores::Stores>) -> String {
        if let Some(s) = stores {
            let ops = s.operations.state();
            let machines = s.machines.state();
            self.set_state(&state_gauges(ops.iter().map(|o| o.as_ref()), machines.iter().map(|m| m.as_ref())));
        }
        self.encode()
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

/// A gauge family holding exactly these series (the others are dropped).
fn set_family<'a, L>(family: &Family<L, Gauge>, rows: impl Iterator<Item = (&'a L, i64)>)
where
    L: Clone + std::hash::Hash + Eq + prometheus_client::encoding::EncodeLabelSet + std::fmt::Debug + 'a,
{
    family.clear();
    for (l, n) in rows {
        family.get_or_create(l).set(n);
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use render::api::Phase;

    fn op(name: &str, kind: &str, phase: Option<Phase>) -> TalosOperation {
        let status = phase
            .map(|p| {
                format!(
                    "status: {{phase: {}, stage: kubelets, waitingSince: {{DrainBlocked: '2026-12-07T10:00:00Z'}}, machines: {{cp1: {{phase: Done, stage: verified}}, w1: {{phase: Applying, stage: rebooting}}}}}}",
                    p.name()
                )
            })
            .unwrap_or_default();
        serde_yaml::from_str(&format!(
            "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosOperation\nmetadata: {{name: {name}}}\nspec: {{clusterRef: {{name: lab}}, kind: {kind}}}\n{status}"
        ))
        .unwrap()
    }

    fn machine(name: &str, reason: &str, reboot: &[&str]) -> TalosMachine {
        serde_yaml::from_str(&format!(
            "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata: {{name: {name}}}\nspec: {{clusterRef: {{name: lab}}, address: 10.0.0.1, role: worker}}\nstatus: {{conditions: [{{type: Ready, status: 'False', reason: {reason}, message: m}}], rebootPaths: {reboot:?}}}"
        ))
        .unwrap()
    }

    #[test]
    fn the_gauges_are_the_state_now_one_finished_upgrade_reads_completed_1_and_running_0() {
        let ops = [op("up", "kubernetes", Some(Phase::Completed)), op("roll", "config", Some(Phase::Running))];
        let ms = [machine("w1", "RebootRequired", &["machine.kernel.modules"]), machine("w2", "RebootRequired", &[])];
        let rows = state_gauges(&ops, &ms);
        let phase = |k: &str, p: Phase| {
            rows.operations.get(&OperationLabel { kind: k.into(), phase: p.name().into() }).copied()
        };
        assert_eq!(phase("kubernetes", Phase::Completed), Some(1));
        assert_eq!(phase("kubernetes", Phase::Running), Some(0), "a phase nobody is in reads 0");
        assert_eq!(phase("config", Phase::Running), Some(1));
        let step = |o: &str, p: &str, st: &str| {
            let l = StepLabel { operation: o.into(), kind: "config".into(), phase: p.into(), stage: st.into() };
            rows.steps.get(&l).copied()
        };
        let (applying, done) = (render::api::MachinePhase::Applying.name(), render::api::MachinePhase::Done.name());
        assert_eq!(step("roll", applying, "rebooting"), Some(1), "machines by stage: {:?}", rows.steps);
        assert_eq!(step("roll", done, "verified"), Some(1));
        let label = MachineLabel { cluster: "lab".into(), ready: "False".into(), reason: "RebootRequired".into() };
        assert_eq!(rows.machines.get(&label), Some(&2));
        assert_eq!(rows.reboot_paths.len(), 1, "only a machine with reboot paths has the series");
        assert!(
            rows.waits.contains(&WaitLabel { operation: "roll".into(), wait: "DrainBlocked".into() }),
            "a drain a budget blocks is a wait: {:?}",
            rows.waits
        );
        let m = Metrics::new();
        m.set_state(&rows);
        // The next scrape after the operation is gone forgets it.
        m.set_state(&state_gauges(&ops[1..], &ms));
        let text = m.encode();
        assert!(!text.contains("kind=\"kubernetes\""), "{text}");
        assert!(text.contains("ichor_build_info{version="), "{text}");
    }

    #[test]
    fn a_cluster_is_behind_per_component_older_than_the_release_set() {
        let cluster: render::api::TalosCluster = serde_yaml::from_str(
            "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosCluster\nmetadata: {name: lab}\nspec: {talosVersion: v1.14.3, kubernetesVersion: v1.37.0, endpoint: 'https://lab:6443', versionContract: v1.14, secretsRef: {name: s}}",
        )
        .unwrap();
        let behind = release_behind([&cluster], "v1.14.6", "v1.37.0");
        let label = ReleaseLabel {
            cluster: "lab".into(),
            component: "talos".into(),
            version: "v1.14.3".into(),
            release_set: "v1.14.6".into(),
        };
        assert_eq!(behind, vec![label], "Kubernetes on the set is not behind");
        assert!(release_behind([&cluster], "v1.14.3", "v1.36.4").is_empty(), "newer than the set is not behind");
    }
}
