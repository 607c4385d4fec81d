//! A plan's status changes, recorded as the executor records them in the TalosOperation's
//! status (and the cluster's `status.cni.kubeProxy`): the resume markers with their time,
//! machines done or failed, cluster-wide steps done, clocks recorded under the names the waits
//! give and cleared when the plan clears them, the phase, and why it paused.
//!
//! Start at `record`. Pure: the controller writes its result; tests replay plans with it.
//!
//! Every loop writes its resource's status the same way: the CRD's status type, serialized, as
//! the merge patch from the status read to the one wanted (`merge_patch_between`; a key gone is
//! sent as null, nothing is sent when they are equal). `operation_status` and `cluster_cni` are
//! the operation loop's two (its TalosOperation's, and the two fields of its TalosCluster's
//! `status.cni` it owns); `reconcile::machine` and `reconcile::cluster` have theirs.

use crate::plan::{Action, Plan};
use crate::state::{MachineProgress, ObservedState};
use render::api::{MachinePhase, Phase, TalosClusterStatus, TalosOperationStatus};
use serde_json::Value;

/// `s` with the status changes of `plan` recorded (nodes and the workload cluster as they were).
/// `reached`: how many of the plan's actions the executor went through (all of them, unless a
/// transient error or a failed drain stopped it). A run that stopped early is recorded as a
/// crash at that point would leave it: no status change after it (a reboot's step is never
/// recorded done when the reboot did not answer), and an end it did not reach is not taken
/// (the phase stays). `failed` adds steps the executor failed (a Talos refusal): machine and
/// message. `forbidden`: the API server's refusal of the controller that stopped the run.
/// Either pauses the operation with its words, unless the plan ended it.
pub fn record(
    s: &ObservedState,
    plan: &Plan,
    reached: usize,
    failed: &[(String, String)],
    forbidden: Option<&str>,
) -> ObservedState {
    let cut;
    let plan = if reached < plan.actions.len() {
        let mut p = plan.clone();
        p.actions.truncate(reached);
        if p.phase.is_terminal() {
            p.phase = s.operation.phase;
        }
        cut = p;
        &cut
    } else {
        plan
    };
    let mut after = s.clone();
    let op = &mut after.operation;
    // The waits are this plan's, each with its words and clock; none once none runs.
    op.waits = plan
        .actions
        .iter()
        .filter_map(|(a, _)| match a {
            Action::Wait { reason, message, clock, since, limit_minutes } => Some(render::api::WaitStatus {
                reason: reason.clone(),
                message: message.clone(),
                clock: clock.clone(),
                since: since.clone(),
                limit_minutes: *limit_minutes,
            }),
            _ => None,
        })
        .collect();
    // What is left is this plan's: an ended operation (completed, aborted) has none.
    op.machines_left = if plan.phase.is_terminal() { vec![] } else { plan.work_left.clone() };
    for (a, _) in &plan.actions {
        match a {
            Action::Abort { was } => {
                op.paused_reason = Some(format!("aborted by the user (was {was})"));
            }
            Action::Resume => {
                op.machines.retain(|_, p| p.phase != MachinePhase::Failed);
                op.paused_reason = None;
                op.intent.resumed = op.intent.resume;
            }
            Action::Start { machine, stage, boot_id } => {
                let p = MachineProgress {
                    phase: MachinePhase::Applying,
                    stage: Some(stage.clone()),
                    started_at: Some(s.now.clone()),
                    boot_id: boot_id.clone(),
                };
                op.machines.insert(machine.clone(), p);
            }
            Action::Stage { machine, stage } => {
                if let Some(p) = op.machines.get_mut(machine) {
                    p.stage = Some(stage.clone());
                }
            }
            Action::Done { machine } => {
                if let Some(p) = op.machines.get_mut(machine) {
                    p.phase = MachinePhase::Done;
                }
            }
            Action::Fail { machine, message } => {
                if let Some(p) = op.machines.get_mut(machine) {
                    p.phase = MachinePhase::Failed;
                }
                op.paused_reason = Some(message.clone());
            }
            // A paused operation keeps the reason it paused for.
            Action::Pause { message } if op.paused_reason.is_none() || s.operation.phase != Phase::Paused => {
                op.paused_reason = Some(message.clone());
            }
            Action::StepDone { step } if !op.done.contains(step) => op.done.push(step.clone()),
            Action::SetKubeProxyStatus { mode } => after.cluster.status_kube_proxy = Some(*mode),
            Action::RecordCiliumAdoption { chart } => {
                after.cluster.cilium_adoption =
                    Some(render::api::CiliumAdoption { operation: s.operation.name.clone(), chart: chart.clone() })
            }
            Action::Wait { clock, since, .. } if !clock.starts_with("machines/") => {
                op.waiting_since.entry(clock.clone()).or_insert_with(|| since.clone());
            }
            Action::ClearClock { clock } => {
                op.waiting_since.remove(clock);
            }
            _ => {}
        }
    }
    for (machine, message) in failed {
        let p = op.machines.entry(machine.clone()).or_insert_with(|| MachineProgress {
            phase: MachinePhase::Failed,
            stage: None,
            started_at: Some(s.now.clone()),
            boot_id: None,
        });
        p.phase = MachinePhase::Failed;
        op.paused_reason = Some(message.clone());
    }
    if let Some(message) = forbidden {
        op.paused_reason = Some(message.to_string());
    }
    if s.operation.kind == render::api::OperationKind::Release {
        op.stages = release_stages(s, plan);
    }
    // A step the executor failed, or a refusal of the controller, pauses the operation, unless
    // the plan ended it.
    let stopped = !failed.is_empty() || forbidden.is_some();
    op.phase = if !stopped || plan.phase.is_terminal() { plan.phase } else { Phase::Paused };
    after
}

/// A release's stages as its status holds them: the ones passed (recorded before, no longer
/// planned; kept when an operation ran them, with its phase now), then the plan's, each with the
/// operation that runs it (the one this reconcile starts, or the newest of that stage).
pub fn release_stages(s: &ObservedState, plan: &Plan) -> Vec<render::api::ReleaseStage> {
    use render::api::ReleaseStage;
    let planned = |st: &ReleaseStage| plan.stages.iter().any(|(k, t)| *k == st.kind && *t == st.target);
    let of = |name: &str| s.stage_operations.iter().find(|o| o.name == name);
    let mut out: Vec<ReleaseStage> = s
        .operation
        .stages
        .iter()
        .filter(|st| !planned(st))
        .filter_map(|st| {
            let o = of(st.operation.as_deref()?)?;
            Some(ReleaseStage { phase: o.phase, ..st.clone() })
        })
        .collect();
    for (kind, target) in &plan.stages {
        let started = plan.actions.iter().find_map(|(a, _)| match a {
            Action::StartStage { stage } if stage.kind == *kind && stage.target == *target => Some(stage.name.clone()),
            _ => None,
        });
        let newest = s.stage_operations.iter().rfind(|o| o.kind == *kind && o.target == *target);
        let (operation, phase) = match (started, newest) {
            (Some(name), _) => (Some(name), Phase::Pending),
            (None, Some(o)) => (Some(o.name.clone()), o.phase),
            (None, None) => (None, Phase::Pending),
        };
        out.push(ReleaseStage { kind: *kind, target: target.clone(), operation, phase });
    }
    out
}

/// RFC 7386 JSON merge patch: `patch` applied to `target`.
pub fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match patch {
        serde_json::Value::Object(p) => {
            if !target.is_object() {
                *target = serde_json::Value::Object(serde_json::Map::new());
            }
            let t = target.as_object_mut().expect("made an object above");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        v => *target = v.clone(),
    }
}

/// The RFC 7386 merge patch that turns `current` into `next`: a key `next` lacks is sent as null,
/// objects are compared key by key, anything else is sent whole when it differs. `None` when
/// they are equal (a status that does not change is not written: each write is a watch event).
pub fn merge_patch_between(current: &Value, next: &Value) -> Option<Value> {
    match (current, next) {
        (Value::Object(a), Value::Object(b)) => {
            let mut patch = serde_json::Map::new();
            for k in a.keys().filter(|k| !b.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            for (k, v) in b {
                let d = match a.get(k) {
                    Some(old) => merge_patch_between(old, v),
                    None => Some(v.clone()),
                };
                if let Some(d) = d {
                    patch.insert(k.clone(), d);
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        (a, b) if a == b => None,
        // A null in a merge patch removes; an object replacing a scalar is sent whole.
        (_, b) => Some(b.clone()),
    }
}

/// The TalosOperation's status that records `op` (the snapshot's operation after the plan), on
/// the status read (`read`: what the snapshot does not hold, its conditions and stage, is kept).
/// The one conversion from `state::Operation` to the CRD's type.
pub fn operation_status(op: &crate::state::Operation, read: &TalosOperationStatus) -> TalosOperationStatus {
    TalosOperationStatus {
        phase: Some(op.phase),
        paused_reason: op.paused_reason.clone(),
        machines: op.machines.clone(),
        waiting_since: op.waiting_since.clone(),
        done: op.done.clone(),
        resumed: op.intent.resumed,
        waits: op.waits.clone(),
        machines_left: op.machines_left.clone(),
        stages: op.stages.clone(),
        ..read.clone()
    }
}

/// The TalosCluster's status with the two `status.cni` fields the operation loop owns set as the
/// snapshot after the plan holds them (the kube-proxy mode a switch reached, the adoption);
/// everything else as read. The cluster loop owns the rest (`reconcile::cluster::status`): the
/// two write disjoint fields under their own field managers (docs/architecture.md).
pub fn cluster_cni(after: &crate::state::Cluster, read: &TalosClusterStatus) -> TalosClusterStatus {
    cni_fields(after.status_kube_proxy, after.cilium_adoption.as_ref(), read)
}

fn cni_fields(
    kube_proxy: Option<render::api::KubeProxyMode>,
    adoption: Option<&render::api::CiliumAdoption>,
    read: &TalosClusterStatus,
) -> TalosClusterStatus {
    let mut next = read.clone();
    let cni = next.cni.get_or_insert_with(Default::default);
    cni.kube_proxy = kube_proxy;
    cni.adoption = adoption.cloned();
    if *cni == render::api::CniStatus::default() {
        next.cni = None;
    }
    next
}

#[cfg(test)]
mod patch_tests {
    use super::*;
    use serde_json::json;

    /// A merge patch applied to what it was computed from gives the target (RFC 7386), and two
    /// equal statuses give none.
    #[test]
    fn the_merge_patch_between_two_statuses_turns_one_into_the_other() {
        let cases = [
            (json!({"a": 1, "b": {"c": 2, "d": 3}}), json!({"a": 1, "b": {"c": 2}})),
            (json!({"waitingSince": {"x": "t"}}), json!({})),
            (json!({"machines": {"w1": {"stage": "a"}}}), json!({"machines": {"w1": {"stage": "b"}}})),
            (json!({"done": ["a"]}), json!({"done": ["a", "b"]})),
            (json!({}), json!({"pausedReason": "r", "cni": {"kubeProxy": "enabled"}})),
            (json!({"v": 1}), json!({"v": {"w": 2}})),
        ];
        for (from, to) in cases {
            let patch = merge_patch_between(&from, &to).expect("they differ");
            let mut got = from.clone();
            merge_patch(&mut got, &patch);
            assert_eq!(got, to, "{from} patched with {patch}");
            assert_eq!(merge_patch_between(&to, &to), None);
        }
    }

    /// The operation loop's TalosCluster fields and the cluster loop's are disjoint: what one
    /// writes, the other's patch never names (the two field managers cannot collide).
    #[test]
    fn the_operation_loop_writes_only_its_two_cni_fields_of_the_cluster_status() {
        let read: TalosClusterStatus = serde_json::from_value(json!({
            "conditions": [{"type": "CNIHandover", "status": "True", "reason": "Synced", "message": "m"}],
            "cni": {"appliedValuesHash": "abc", "kubeProxy": "enabled"}
        }))
        .unwrap();
        let adoption = render::api::CiliumAdoption { operation: "adopt".into(), chart: "1.19.1".into() };
        let next = cni_fields(Some(render::api::KubeProxyMode::Replaced), Some(&adoption), &read);
        let patch =
            merge_patch_between(&serde_json::to_value(&read).unwrap(), &serde_json::to_value(&next).unwrap()).unwrap();
        assert_eq!(
            patch,
            json!({"cni": {"kubeProxy": "replaced", "adoption": {"operation": "adopt", "chart": "1.19.1"}}})
        );
    }
}
