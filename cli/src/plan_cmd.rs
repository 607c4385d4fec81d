//! `ichor plan --state SNAPSHOT`: what the controller would do now, and why, for any loop's
//! dumped state (`runtime::reconcile::LoopSnapshot`): an operation's (`operation`), a machine's
//! (`loop: machine`, `machine`) or a cluster's (`loop: cluster`, `cluster`).
//!
//! Exit 0 when the operation runs or completes with nothing to report (a machine: Ready; a
//! cluster: every condition True), 1 when it waits, pauses or warns (findings), 2 on a bad
//! snapshot or contradictory rules.

use crate::{Diagnosed, Output, Report};
use anyhow::{Result, anyhow};
use runtime::plan::{Action, PlanError};
use runtime::reconcile::{LoopSnapshot, cluster, machine};
use runtime::state::ObservedState;
use serde_json::json;
use std::path::Path;

pub fn run(state: &Path, output: Output, explain: bool, rules: Option<&Path>) -> Result<Report> {
    let text = crate::disk::read_text(state, crate::disk::caps::SNAPSHOT, "an observed-state snapshot")?;
    let bad = |lines: Vec<String>| {
        anyhow!(Diagnosed {
            diagnostics: lines.concat(),
            summary: format!("{} is not a valid observed-state snapshot", state.display())
        })
    };
    let at = |field: &dyn std::fmt::Display| format!("{}: error: {field}\n", state.display());
    match LoopSnapshot::parse(&text).map_err(|errs| bad(errs.iter().map(|e| at(e)).collect()))? {
        LoopSnapshot::Operation(s) => operation(&s, output, explain, rules),
        LoopSnapshot::Machine(snap) => {
            let classifier = crate::disk::classifier(rules)?;
            let s = machine::MachineState::from_snapshot(&snap, &classifier)
                .map_err(|errs| bad(errs.iter().map(|e| at(e)).collect()))?;
            let plan = machine::decide(&classifier, None, &s)?;
            machine_report(&s, &plan, output)
        }
        LoopSnapshot::Cluster(s) => {
            let rules = runtime::handover::rules().map_err(|e| anyhow!("{e}"))?;
            let plan = cluster::decide(rules, &s)?;
            cluster_report(&s, &plan, output)
        }
    }
}

/// A machine's plan: its condition, the live apply, and the status the loop writes once it is
/// done.
fn machine_report(s: &machine::MachineState, plan: &machine::MachinePlan, output: Output) -> Result<Report> {
    let applied: Vec<String> = plan
        .actions
        .iter()
        .flat_map(|a| match a {
            Action::Apply { paths, .. } => paths.clone(),
            _ => vec![],
        })
        .collect();
    let status = machine::status(s, plan, &applied);
    let c = &plan.condition;
    let stdout = match output {
        o @ (Output::Json | Output::Yaml) => o.data(&json!({
            "loop": "machine",
            "machine": s.machine,
            "namespace": s.namespace,
            "condition": c,
            "actions": plan.actions.iter().map(Action::to_json).collect::<Vec<_>>(),
            "status": status,
        }))?,
        Output::Text | Output::Wide => {
            let mut out = format!(
                "Machine {} (namespace {}): Ready {} ({}): {}\n",
                s.machine, s.namespace, c.status, c.reason, c.message
            );
            out += &actions_text(&plan.actions);
            if !status.reboot_paths.is_empty() {
                out += &format!("Needs a reboot: {}\n", status.reboot_paths.join(", "));
            }
            if !status.pending_changes.is_empty() {
                out += "Pending changes (rules/machine.rules):\n";
                for p in &status.pending_changes {
                    let effect = p.effect.as_deref().map(|e| format!(", {e}")).unwrap_or_default();
                    out += &format!("  {} ({}{effect})\n", p.path, p.class);
                }
            }
            out
        }
    };
    Ok(Report { stdout, findings: c.status != "True", ..Report::default() })
}

/// A cluster's plan: the lockdown, the values' Job, each condition held, and when to look again.
fn cluster_report(s: &cluster::ClusterState, plan: &cluster::ClusterPlan, output: Output) -> Result<Report> {
    let status = cluster::status(s, &plan.actions);
    let requeue = plan.requeue.map(|d| d.as_secs());
    let stdout = match output {
        o @ (Output::Json | Output::Yaml) => o.data(&json!({
            "loop": "cluster",
            "cluster": s.cluster,
            "namespace": s.namespace,
            "actions": plan.actions.iter().map(Action::to_json).collect::<Vec<_>>(),
            "requeueSeconds": requeue,
            "status": status,
        }))?,
        Output::Text | Output::Wide => {
            let mut out = format!("Cluster {} (namespace {}):\n", s.cluster, s.namespace);
            out += &actions_text(&plan.actions);
            out += &match requeue {
                Some(secs) => format!("Looks again in {secs} s.\n"),
                None => "Looks again at the next change.\n".to_string(),
            };
            out
        }
    };
    let findings = status.conditions.iter().any(|c| c.status != "True");
    Ok(Report { stdout, findings, ..Report::default() })
}

/// A loop's actions, numbered.
fn actions_text(actions: &[Action]) -> String {
    if actions.is_empty() {
        return "Nothing to do now.\n".into();
    }
    let mut out = "Actions, in order:\n".to_string();
    for (i, a) in actions.iter().enumerate() {
        out += &format!("  {}. {a}\n", i + 1);
    }
    out
}

/// An operation's plan, with its proofs when explained.
fn operation(s: &ObservedState, output: Output, explain: bool, rules: Option<&Path>) -> Result<Report> {
    let planner = crate::disk::planner(rules)?;
    let plan = match planner.plan_with(s, explain) {
        Ok(p) => p,
        Err(PlanError::Contradiction { what, proofs }) => {
            return Err(anyhow!(Diagnosed {
                diagnostics: proofs.iter().enumerate().map(|(i, p)| format!("proof {}:\n{p}", i + 1)).collect(),
                summary: format!("the rules contradict themselves: {what}; nothing is executed"),
            }));
        }
        Err(e) => return Err(e.into()),
    };
    let findings = plan.actions.iter().any(|(a, _)| {
        matches!(a, Action::Wait { .. } | Action::Pause { .. } | Action::Fail { .. } | Action::Warn { .. })
    });
    let roots: Vec<usize> = plan
        .actions
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .chain(plan.stage_proofs.iter().flatten().copied())
        .collect();
    let stdout = match output {
        o @ (Output::Json | Output::Yaml) => {
            let actions: Vec<serde_json::Value> = plan
                .actions
                .iter()
                .map(|(a, proofs)| {
                    let mut v = a.to_json();
                    if explain {
                        v["proofs"] = json!(proofs);
                    }
                    v
                })
                .collect();
            let mut v = json!({
                "operation": plan.operation,
                "kind": plan.kind,
                "phase": plan.phase,
                "confirmation": plan.confirmation,
                "actions": actions,
                "ciliumJobMode": plan.cilium_job_mode,
            });
            // A release's stages left, in order (with their proofs when explained).
            if !plan.stages.is_empty() {
                let stages: Vec<serde_json::Value> = plan
                    .stages
                    .iter()
                    .zip(&plan.stage_proofs)
                    .map(|((k, t), p)| {
                        let mut v = json!({"kind": k, "target": t});
                        if explain {
                            v["proofs"] = json!(p);
                        }
                        v
                    })
                    .collect();
                v["stages"] = json!(stages);
            }
            if explain {
                // Every proof step once; actions name their proofs by id.
                v["proofs"] = plan.proofs.to_json(&roots);
            }
            o.data(&v)?
        }
        Output::Text | Output::Wide => {
            let mut out =
                format!("Operation {} ({}) on cluster {}: {}\n", plan.operation, plan.kind, s.cluster.name, plan.phase);
            if let Some(c) = &plan.confirmation {
                out += &format!("Confirmation: {c}\n");
            }
            if plan.actions.is_empty() {
                out += "Nothing to do now.\n";
            } else {
                out += "Actions, in order:\n";
                for (i, (a, proofs)) in plan.actions.iter().enumerate() {
                    out += &format!("  {}. {a}\n", i + 1);
                    if explain && !proofs.is_empty() {
                        let ids: Vec<String> = proofs.iter().map(|p| format!("[{p}]")).collect();
                        out += &format!("       proof: {}\n", ids.join(" "));
                    }
                }
            }
            if !plan.stages.is_empty() {
                out += "Stages left, in order (rules/release.rules):\n";
                for (i, ((kind, target), proofs)) in plan.stages.iter().zip(&plan.stage_proofs).enumerate() {
                    let target = if target.is_empty() { "the changes that need a reboot" } else { target.as_str() };
                    out += &format!("  {}. {kind}: {target}\n", i + 1);
                    if explain && !proofs.is_empty() {
                        let ids: Vec<String> = proofs.iter().map(|p| format!("[{p}]")).collect();
                        out += &format!("       proof: {}\n", ids.join(" "));
                    }
                }
            }
            if explain && !roots.is_empty() {
                out += "Proofs (each step once; `from` names its premises):\n";
                for line in plan.proofs.render(&roots).lines() {
                    out += &format!("  {line}\n");
                }
            }
            if let Some(m) = &plan.cilium_job_mode {
                out += &format!("Cilium Jobs outside a switch render with kube-proxy mode {m}.\n");
            }
            out
        }
    };
    Ok(Report { stdout, findings, ..Report::default() })
}
