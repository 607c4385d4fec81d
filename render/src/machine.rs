//! One machine's desired config, checked as Talos would check it, and the context of its
//! Ready condition: what `ichor render`, `ichor config diff --manifests` and the controller's
//! machine reconcile share.
//!
//! Start at `render_checked` (render from the custom resources, then classify the render
//! against its contract: a path the contract lacks or a document Talos refuses is an error
//! naming the patch that set it) and `context` (the facts of the machine's condition). This
//! module sits above both layers it joins: desired state (`render`) and classification.

use crate::api::{CONFIRM_KUBE_PROXY_SWITCH, TalosMachine};
use crate::classify::{Classifier, ClassifyError, ContractError, MachineContext};
use crate::config::Config;
use crate::diff;
use crate::manifests::{Manifests, UnknownMachine};
use crate::path::Path;
use crate::render::{RenderError, Rendered, render, status_kube_proxy};
use crate::vocab::Class;

/// Why a machine has no config to apply.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// No such machine in the manifests.
    #[error(transparent)]
    Unknown(#[from] UnknownMachine),
    /// The cluster's contract is not one the rules know.
    #[error(transparent)]
    Contract(#[from] ContractError),
    /// Every problem of the render, each naming its object and field.
    #[error("machine {machine} does not render")]
    Render {
        /// The machine.
        machine: String,
        /// Every problem.
        problems: Vec<RenderError>,
    },
    /// The render could not be checked against its contract.
    #[error("checking the render")]
    Classify(#[from] ClassifyError),
    /// The render is a config Talos would not accept; each problem names the patch at fault.
    #[error("machine {machine} renders a config Talos would not accept")]
    Refused {
        /// The machine.
        machine: String,
        /// Every refusal, each naming the patch or field at fault.
        problems: Vec<String>,
    },
}

impl MachineError {
    /// The problems to print one per line before the summary, if the error carries several.
    pub fn problems(&self) -> Vec<String> {
        match self {
            MachineError::Render { problems, .. } => problems.iter().map(ToString::to_string).collect(),
            MachineError::Refused { problems, .. } => problems.clone(),
            _ => vec![],
        }
    }
}

/// Renders `machine` at `contract` (default: its cluster's) without the Talos check: for
/// `config diff --manifests`, which reports a refusal as the machine's ConfigRejected
/// condition beside the diff instead of failing.
pub fn render_unchecked(
    m: &Manifests,
    machine: &str,
    contract: Option<&str>,
    c: &Classifier,
) -> Result<Rendered, MachineError> {
    let mch = m.machine(machine)?;
    let cluster = m.cluster_of(mch);
    let contract = c.contract(contract.unwrap_or(&cluster.spec.version_contract))?;
    let (bundle, version) = m.bundle(cluster);
    let inputs = m.inputs(mch, &bundle, version);
    render(&inputs, contract).map_err(|problems| MachineError::Render { machine: machine.to_string(), problems })
}

/// Renders `machine` at `contract` (default: its cluster's) and checks the result against the
/// contract: paths it lacks and documents Talos refuses are errors naming the patch at fault.
pub fn render_checked(
    m: &Manifests,
    machine: &str,
    contract: Option<&str>,
    c: &Classifier,
) -> Result<Rendered, MachineError> {
    let out = render_unchecked(m, machine, contract, c)?;
    let contract = out.contract;
    let cluster = m.cluster_of(m.machine(machine)?);
    let changes = diff::changes(&Config::default(), &out.config);
    let o = c.classify(contract, &changes, Some(&out.config), false)?;
    let blame = |p: &Path| -> String {
        let shown = p.to_string();
        out.set_by
            .iter()
            .filter(|(q, _)| {
                let q = q.to_string();
                shown == q || shown.starts_with(&format!("{q}.")) || shown.starts_with(&format!("{q}["))
            })
            .max_by_key(|(q, _)| q.to_string().len())
            .map(|(_, obj)| obj.clone())
            .unwrap_or_else(|| format!("TalosCluster {}", cluster.metadata.name.clone().unwrap_or_default()))
    };
    let mut problems = vec![];
    for (ch, k) in changes.iter().zip(&o.changes) {
        if k.class == Class::Unsupported {
            problems.push(format!(
                "{}: spec.patch: sets {}, which the Talos {contract} contract does not have (Talos rejects it at this contract); remove it from the patch",
                blame(&ch.path),
                ch.path
            ));
        }
    }
    for r in &o.rejected {
        // Blame a part of the conflict that a patch set, else the first part.
        let parts: Vec<String> = r.at.split(" and ").filter_map(|x| Path::parse(x).ok()).map(|p| blame(&p)).collect();
        let who = parts.iter().find(|w| w.starts_with("TalosConfigPatch")).cloned();
        problems.push(match who {
            Some(who) => format!(
                "{who}: spec.patch: Talos would refuse the rendered config: {} ({}); remove it from the patch or select other machines",
                r.message, r.at
            ),
            // The install target comes from the machine itself.
            None if r.at.starts_with("machine.install") => format!(
                "{}: spec.installDisk: Talos would refuse the rendered config: {} ({}); set the machine's install disk",
                crate::render::object_name("TalosMachine", &m.machine(machine)?.metadata),
                r.message,
                r.at
            ),
            None => format!(
                "{}: Talos would refuse the rendered config: {} ({}); fix the resource or add a patch that does",
                parts.first().cloned().unwrap_or_default(),
                r.message,
                r.at
            ),
        });
    }
    if !problems.is_empty() {
        return Err(MachineError::Refused { machine: machine.to_string(), problems });
    }
    Ok(out)
}

/// The context of a machine's Ready condition: its role, the cluster's kube-proxy spec, status
/// and consent, its drift policy, and whether the render's inputs are those it last converged to.
pub fn context(m: &Manifests, mch: &TalosMachine, rendered: &Rendered) -> MachineContext {
    let cluster = m.cluster_of(mch);
    let recorded = mch.status.as_ref().and_then(|s| s.applied_inputs_hash.as_deref());
    MachineContext {
        role: mch.spec.role,
        consent: cluster.metadata.annotations.as_ref().and_then(|a| a.get(CONFIRM_KUBE_PROXY_SWITCH).cloned()),
        spec_kube_proxy: cluster.spec.cni.kube_proxy,
        status_kube_proxy: status_kube_proxy(cluster),
        inputs_unchanged: recorded == Some(rendered.inputs_hash.as_str()),
        drift_policy: cluster.spec.drift_policy,
        render_failed: None,
        node_unreachable: None,
        operation_in_progress: None,
        applied_awaiting_reboot: vec![],
        policy: cluster.spec.config_policy.clone(),
    }
}

/// The context of a machine whose render failed: nothing but the failure is judged (the rules
/// make it `ConfigRejected`, naming every problem).
pub fn rejected_context(m: &Manifests, mch: &TalosMachine, problem: String) -> MachineContext {
    let cluster = m.cluster_of(mch);
    MachineContext {
        role: mch.spec.role,
        consent: None,
        spec_kube_proxy: cluster.spec.cni.kube_proxy,
        status_kube_proxy: status_kube_proxy(cluster),
        inputs_unchanged: false,
        drift_policy: cluster.spec.drift_policy,
        render_failed: Some(problem),
        node_unreachable: None,
        operation_in_progress: None,
        applied_awaiting_reboot: vec![],
        policy: cluster.spec.config_policy.clone(),
    }
}

/// What rendering the machines of `cluster` refuses because of the object named `object`
/// (`TalosConfigPatch ns/name`, as problems name their object): the webhook's check of a write
/// of that object (issue 50, finding 9: a typo inside a patch's text was admitted and showed
/// only as each machine's ConfigRejected). Every machine of the cluster is rendered and checked
/// against its contract; the problems that name the object are kept, each once, in machine
/// order. Problems of other objects are not this write's to answer for.
pub fn problems_of(m: &Manifests, cluster: &str, object: &str, c: &Classifier) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    let names: Vec<String> = m
        .machines
        .iter()
        .filter(|x| x.spec.cluster_ref.name == cluster)
        .filter_map(|x| x.metadata.name.clone())
        .collect();
    for name in names {
        let found: Vec<String> = match render_checked(m, &name, None, c) {
            Ok(_) => continue,
            Err(MachineError::Render { problems, .. }) => {
                problems.iter().filter(|p| p.object == object).map(|p| p.to_string()).collect()
            }
            Err(MachineError::Refused { problems, .. }) => {
                problems.into_iter().filter(|p| p.starts_with(&format!("{object}:"))).collect()
            }
            Err(_) => continue,
        };
        for p in found {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}
