//! The cluster loop: a TalosCluster's CNI hand-over to Argo CD (ADR 0024, rules/handover.rules),
//! its Cilium values (rules/cni-values.rules) and the lockdown of Ichor's namespace
//! (rules/lockdown.rules). The five steps of every loop (docs/architecture.md, "One reconcile"):
//!
//! 1. `observe` (I/O, feature `io`): Argo CD's Application, the workload's Cilium, Ichor's Jobs,
//!    the bootstrap patch, whether CiliumNetworkPolicies are served;
//! 2. `assemble` (pure): a `ClusterState`, which is also what `--dump-snapshots` writes and `ichor
//!    plan --state` replays (`loop: cluster`);
//! 3. `decide` (the rules): a `ClusterPlan` of actions: the lockdown, the values' Cilium Job,
//!    each condition held or taken off, the values' hash recorded;
//! 4. the executor performs them;
//! 5. `status` (pure): the typed `TalosClusterStatus` from the recorded actions, written by
//!    `kube::write_status` under the cluster loop's field manager (the operation loop owns the
//!    other two fields, `status::cluster_cni`).
//!
//! Start at `reconcile` (feature `io`), then `decide`.

use crate::cni_objects::{Application, CiliumJob};
use crate::handover::{HandoverError, Rules, ValuesFacts};
use crate::netpol::Lockdown;
use crate::plan::Action;
use render::api::{Condition, Handover, KubeProxyMode, TalosCluster, TalosClusterStatus, TalosOperation};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The condition the hand-over holds.
pub const HANDOVER_CONDITION: &str = "CNIHandover";
/// The condition the Cilium values hold.
pub const VALUES_CONDITION: &str = "CNIValuesApplied";

/// What the cluster loop read, as plain data.
#[derive(Clone, Debug)]
pub struct ClusterObservation {
    pub cluster: TalosCluster,
    /// The namespace's operations, read fresh (not from a cache that may lag behind one just
    /// created: the values wait for any operation of the cluster that has not ended).
    pub operations: Vec<TalosOperation>,
    /// The namespace's lockdown, when the controller locks it down.
    pub lockdown: Option<Lockdown>,
    /// Argo CD's Application for Cilium (read while an automatic hand-over is not done).
    pub application: Option<Application>,
    /// What Cilium runs (read for a cilium cluster, or with the lockdown on).
    pub cilium: Option<crate::cni_objects::LiveCilium>,
    /// The API serves cilium.io/v2 CiliumNetworkPolicy (read with the lockdown on).
    pub policy_kind_served: bool,
    /// The TalosConfigPatch that carries Cilium's inline manifest (read for a cilium cluster).
    pub bootstrap_patch: Option<String>,
    /// Ichor's Cilium Jobs (read for a cilium cluster).
    pub jobs: Vec<CiliumJob>,
}

/// What the cluster rules decide on: the hand-over's facts, the values' facts and the lockdown,
/// with the status as read (a snapshot of it is this, as YAML).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterState {
    /// Always `cluster`: which loop's state this is.
    #[serde(rename = "loop")]
    pub loop_: String,
    pub namespace: String,
    pub cluster: String,
    /// The reconcile's clock (RFC 3339): a condition's transition time.
    pub now: String,
    /// `spec.cni.handover`.
    pub handover: Handover,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application: Option<Application>,
    pub values: ValuesFacts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockdown: Option<Lockdown>,
    #[serde(default)]
    pub status: TalosClusterStatus,
}

/// The cluster's state from what was read. Pure.
pub fn assemble(o: &ClusterObservation, now: &str) -> ClusterState {
    let c = &o.cluster;
    let mut values = ValuesFacts::of_cluster(c);
    if let Some(live) = &o.cilium {
        values.cilium_kpr = live.kpr();
        values.chart_running = live
            .daemon_set
            .as_ref()
            .and_then(|d| d.image.as_deref())
            .and_then(crate::cni_objects::cilium_version_of_image);
        (values.cilium_ds, values.owners) = (live.daemon_set.clone(), live.owners.clone());
    }
    values.lockdown_enabled = o.lockdown.is_some();
    values.policy_kind_served = o.policy_kind_served;
    values.bootstrap_patch = o.bootstrap_patch.clone();
    values.jobs = o.jobs.clone();
    values.operations = o
        .operations
        .iter()
        .filter(|op| op.spec.cluster_ref.name == values.cluster && op.metadata.namespace == c.metadata.namespace)
        .map(|op| {
            let phase = op.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
            (op.metadata.name.clone().unwrap_or_default(), phase)
        })
        .collect();
    ClusterState {
        loop_: "cluster".into(),
        namespace: c.metadata.namespace.clone().unwrap_or_default(),
        cluster: values.cluster.clone(),
        now: now.to_string(),
        handover: c.spec.cni.handover,
        application: o.application.clone(),
        values,
        lockdown: o.lockdown.clone(),
        status: c.status.clone().unwrap_or_default(),
    }
}

/// What the cluster loop does now, in order, and when to look again.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterPlan {
    pub cluster: String,
    pub actions: Vec<Action>,
    /// When to look again (none: at the next change).
    pub requeue: Option<Duration>,
    /// Why the namespace's CiliumNetworkPolicies wait (`np_waiting`), for the log.
    pub lockdown_waits: Vec<String>,
}

/// The rules' decision on `s`: the hand-over first (rules/handover.rules), then the values and
/// the lockdown (rules/cni-values.rules, rules/lockdown.rules) as this reconcile's hand-over
/// leaves them (once Argo CD owns Cilium, no Job; what only a cilium cluster before its
/// hand-over reads is not a fact after it).
pub fn decide(rules: &Rules, s: &ClusterState) -> Result<ClusterPlan, HandoverError> {
    let d = rules.decide(s.handover, s.application.as_ref(), s.values.handover_done)?;
    let mut f = s.values.clone();
    f.handover_done |= d.status == "True";
    let ours = f.preset_cilium && !f.handover_done;
    if !ours && s.lockdown.is_none() {
        (f.cilium_kpr, f.chart_running, f.cilium_ds, f.owners) = (None, None, None, vec![]);
    }
    if !ours {
        (f.bootstrap_patch, f.jobs, f.operations) = (None, vec![], vec![]);
    }
    let values = rules.decide_values(&f)?;
    let mut actions = vec![];
    if let Some(l) = s.lockdown.as_ref().filter(|_| values.lockdown) {
        actions.push(Action::LockDown { lockdown: l.clone() });
    }
    if let Some(job) = &values.run_job {
        let replaced = job.mode == KubeProxyMode::Replaced;
        actions.push(Action::CiliumJob {
            mode: job.mode,
            name: format!("ichor-cni-{}", job.hash),
            values: render::cilium::layered(&f.user, replaced, &f.tunnel),
            user: f.user.clone(),
            tunnel: f.tunnel.clone(),
            take_ownership: job.take_ownership,
        });
    }
    let condition = |type_: &str, w: &crate::handover::Decision| Action::SetCondition {
        type_: type_.into(),
        status: w.status.clone(),
        reason: w.reason.clone(),
        message: w.message.clone(),
    };
    actions.push(condition(HANDOVER_CONDITION, &d));
    match &values.condition {
        Some(w) => actions.push(condition(VALUES_CONDITION, w)),
        None if s.status.conditions.iter().any(|c| c.type_ == VALUES_CONDITION) => {
            actions.push(Action::ClearCondition { type_: VALUES_CONDITION.into() })
        }
        None => {}
    }
    let applied = s.status.cni.as_ref().and_then(|c| c.applied_values_hash.as_ref());
    if let Some(hash) = values.record.filter(|h| Some(h) != applied) {
        actions.push(Action::RecordValuesHash { hash });
    }
    let requeue = match (d.requeue, values.requeue) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(ClusterPlan { cluster: s.cluster.clone(), actions, requeue, lockdown_waits: values.lockdown_waits })
}

/// The cluster's status after the `done` actions (the conditions held or taken off, the values'
/// hash recorded); everything else as read. A condition's transition time moves only when its
/// status does.
pub fn status(s: &ClusterState, done: &[Action]) -> TalosClusterStatus {
    let mut next = s.status.clone();
    for a in done {
        match a {
            Action::SetCondition { type_, status, reason, message } => {
                match next.conditions.iter_mut().find(|c| c.type_ == *type_) {
                    Some(c) => {
                        if c.status != *status {
                            c.last_transition_time = Some(s.now.clone());
                        }
                        (c.status, c.reason, c.message) = (status.clone(), reason.clone(), message.clone());
                    }
                    None => next.conditions.push(Condition {
                        type_: type_.clone(),
                        status: status.clone(),
                        reason: reason.clone(),
                        message: message.clone(),
                        last_transition_time: Some(s.now.clone()),
                    }),
                }
            }
            Action::ClearCondition { type_ } => next.conditions.retain(|c| c.type_ != *type_),
            Action::RecordValuesHash { hash } => {
                next.cni.get_or_insert_with(Default::default).applied_values_hash = Some(hash.clone())
            }
            _ => {}
        }
    }
    next
}

#[cfg(feature = "io")]
mod io {
    use super::*;
    use crate::exec::{Executor, Performed};
    use kube_client::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

    /// What one cluster reconcile decided on and when to look again.
    #[derive(Clone, Debug)]
    pub struct ClusterReconciled {
        pub requeue: Option<Duration>,
        pub state: ClusterState,
    }

    /// One reconcile of a cluster: observe, assemble, decide, execute (the run stops at the first
    /// action that does not happen, and nothing of it is recorded: the reconcile's error is
    /// retried), write the status (only when it changes).
    pub async fn reconcile(
        kube: &mut crate::kube::KubeCluster,
        operations: &[TalosOperation],
        lockdown: Option<&Lockdown>,
        cluster: &TalosCluster,
        now: &str,
    ) -> Result<ClusterReconciled, HandoverError> {
        let client = kube.client.clone();
        let o = observe(&client, operations, lockdown, cluster).await?;
        let state = assemble(&o, now);
        let rules = crate::handover::rules().map_err(|e| HandoverError::Unavailable { why: e.to_string() })?;
        let plan = decide(rules, &state)?;
        if state.lockdown.is_some() && !plan.lockdown_waits.is_empty() {
            tracing::debug!(cluster = %state.cluster, waits = %plan.lockdown_waits.join(", "), "the namespace's CiliumNetworkPolicies wait");
        }
        let talos = kube.talos.clone();
        let outcome = Executor { talos: &talos, kube }.run_actions(&plan.actions).await;
        for (a, p) in &outcome.actions {
            match p {
                Performed::Done | Performed::Recorded => {
                    if let Action::CiliumJob { name, mode, .. } = a {
                        tracing::info!(cluster = %state.cluster, job = %name, mode = %mode, "started the Cilium Job for the values");
                    }
                }
                Performed::Failed { message: why, .. }
                | Performed::Forbidden { message: why }
                | Performed::Refused { why }
                | Performed::Interrupted { why } => {
                    return Err(HandoverError::NotPerformed { action: a.to_string(), why: why.clone() });
                }
            }
        }
        let next = status(&state, &plan.actions);
        let api: Api<TalosCluster> = Api::namespaced(client.clone(), &state.namespace);
        crate::kube::write_status(&api, &state.cluster, &state.status, &next, None, crate::kube::managers::CLUSTERS)
            .await
            .map_err(|source| HandoverError::Kube { what: "the CNI hand-over".into(), source })?;
        Ok(ClusterReconciled { requeue: plan.requeue, state })
    }

    /// The cluster loop's reads: Argo CD's Application while an automatic hand-over is not done;
    /// the workload's Cilium for a cilium cluster or with the lockdown on; whether the API
    /// serves CiliumNetworkPolicies with the lockdown on; the bootstrap patch and Ichor's Jobs
    /// for a cilium cluster before its hand-over.
    pub async fn observe(
        client: &kube_client::Client,
        operations: &[TalosOperation],
        lockdown: Option<&Lockdown>,
        cluster: &TalosCluster,
    ) -> Result<ClusterObservation, HandoverError> {
        let kube = |source| HandoverError::Kube { what: "the CNI hand-over".into(), source };
        let done = render::render::handover_done(cluster);
        let cilium = cluster.spec.cni.preset == render::api::CniPreset::Cilium;
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
            "applications",
        );
        let apps: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), crate::cni_objects::APPLICATION_NAMESPACE, &ar);
        let application = if done || cluster.spec.cni.handover != Handover::Automatic {
            None
        } else {
            match apps.get_opt(crate::cni_objects::APPLICATION_NAME).await {
                Ok(a) => a.map(|o| Application::from_json(&serde_json::to_value(&o).unwrap_or_default())),
                // Argo CD's CRDs not installed: the same as no Application.
                Err(kube_client::Error::Api(e)) if e.code == 404 => None,
                Err(e) => return Err(kube(e)),
            }
        };
        let ours = cilium && !done;
        let live = if ours || lockdown.is_some() { Some(crate::kube::read_cilium(client).await?) } else { None };
        let policy_kind_served = lockdown.is_some() && crate::kube::serves_cilium_network_policies(client).await?;
        let (bootstrap_patch, jobs) = if ours {
            (crate::kube::bootstrap_patch(client, cluster).await?, crate::kube::cilium_jobs(client).await?)
        } else {
            (None, vec![])
        };
        Ok(ClusterObservation {
            cluster: cluster.clone(),
            operations: operations.to_vec(),
            lockdown: lockdown.cloned(),
            application,
            cilium: live,
            policy_kind_served,
            bootstrap_patch,
            jobs,
        })
    }
}

#[cfg(feature = "io")]
pub use io::{ClusterReconciled, observe, reconcile};

#[cfg(test)]
mod tests {
    use super::*;
    use render::api::CniPreset;

    fn state(handover: Handover, app: Option<Application>) -> ClusterState {
        let mut c: TalosCluster =
            serde_yaml::from_str(include_str!("../../../examples/clusters/lab-v1.14/cluster.yaml")).unwrap();
        c.spec.cni.preset = CniPreset::Cilium;
        c.spec.cni.handover = handover;
        let o = ClusterObservation {
            cluster: c,
            operations: vec![],
            lockdown: None,
            application: app,
            cilium: None,
            policy_kind_served: false,
            bootstrap_patch: None,
            jobs: vec![],
        };
        assemble(&o, "2026-12-08T00:00:00Z")
    }

    /// The hand-over's condition is an action of the plan, and the status it records keeps the
    /// transition time while the status stays.
    #[test]
    fn the_plan_holds_the_conditions_and_the_status_records_them() {
        let rules = crate::handover::rules().unwrap();
        let synced =
            Application { sync: "Synced".into(), health: "Healthy".into(), owns_release: true, ..Default::default() };
        let s = state(Handover::Automatic, Some(synced));
        let plan = decide(rules, &s).unwrap();
        let held: Vec<&Action> = plan
            .actions
            .iter()
            .filter(|a| matches!(a, Action::SetCondition { type_, .. } if type_ == HANDOVER_CONDITION))
            .collect();
        assert!(matches!(held[..], [Action::SetCondition { status, .. }] if status == "True"), "{plan:?}");
        // Handed over: no Cilium Job, whatever the values say.
        assert!(!plan.actions.iter().any(|a| matches!(a, Action::CiliumJob { .. })), "{plan:?}");
        let next = status(&s, &plan.actions);
        let c = next.conditions.iter().find(|c| c.type_ == HANDOVER_CONDITION).unwrap();
        assert_eq!(c.last_transition_time.as_deref(), Some("2026-12-08T00:00:00Z"));
        let mut later = s.clone();
        later.status = next.clone();
        later.now = "2026-12-08T01:00:00Z".into();
        assert_eq!(status(&later, &decide(rules, &later).unwrap().actions), next);
        // The state reads back as the snapshot it is.
        let text = serde_yaml::to_string(&s).unwrap();
        assert_eq!(serde_yaml::from_str::<ClusterState>(&text).unwrap(), s);
    }
}
