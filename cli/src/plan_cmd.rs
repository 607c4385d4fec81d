//! `ichor plan --state SNAPSHOT`: what the controller would do now for an operation, and why.
//!
//! Exit 0 when the operation runs or completes with nothing to report, 1 when it waits, pauses
//! or warns (findings), 2 on a bad snapshot or contradictory rules.

use crate::{Diagnosed, Output, Report};
use anyhow::{Result, anyhow};
use runtime::plan::{Action, PlanError};
use runtime::state::ObservedState;
use serde_json::json;
use std::path::Path;

pub fn run(state: &Path, output: Output, explain: bool, rules: Option<&Path>) -> Result<Report> {
    let text = crate::disk::read_text(state, crate::disk::caps::SNAPSHOT, "an observed-state snapshot")?;
    let s = ObservedState::parse(&text).map_err(|errs| {
        anyhow!(Diagnosed {
            diagnostics: errs.iter().map(|e| format!("{}: error: {e}\n", state.display())).collect(),
            summary: format!("{} is not a valid observed-state snapshot", state.display()),
        })
    })?;
    let planner = crate::disk::planner(rules)?;
    let plan = match planner.plan_with(&s, explain) {
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
