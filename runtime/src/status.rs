//! A plan's status changes, recorded as the executor records them in the TalosOperation's
//! status (and the cluster's `status.cni.kubeProxy`): the resume markers with their time,
//! machines done or failed, cluster-wide steps done, clocks recorded under the names the waits
//! give and cleared when the plan clears them, the phase, and why it paused.
//!
//! Start at `record`. Pure: the controller writes its result; tests replay plans with it.

use crate::plan::{Action, Plan};
use crate::state::{MachineProgress, ObservedState};
use render::api::{MachinePhase, Phase};

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
                    started_at: s.now.clone(),
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
            started_at: s.now.clone(),
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
