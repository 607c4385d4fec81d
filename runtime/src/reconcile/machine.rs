//! The machine loop: a TalosMachine's `Ready` condition, pending changes and boot record, and the
//! live applies rules/machine.rules asks for. The five steps of every loop
//! (docs/architecture.md, "One reconcile"):
//!
//! 1. `observe` (I/O, feature `io`): the machine, its cluster's loaded objects, the operation of
//!    its cluster that has not ended, the node's running config and boot;
//! 2. `assemble` (pure): the render, the boot record and the machine's context, as a
//!    `MachineState` (`MachineState::snapshot` is what `--dump-snapshots` writes and `ichor plan
//!    --state` replays);
//! 3. `decide` (rules/machine.rules, through the classifier): a `MachinePlan`, a draft;
//! 4. `complete` and the executor: the live apply, with its precondition (the node's config
//!    unchanged since it was read);
//! 5. `status` (pure): the typed `TalosMachineStatus`, written by `kube::write_status`.
//!
//! Start at `reconcile` (feature `io`), then `assemble` and `decide`.

use crate::assemble::{RenderCache, VerdictCache};
use crate::plan::Action;
use render::api::{BootRecord, Condition, OperationKind, TalosMachine, TalosMachineStatus};
use render::classify::{Classifier, MachineContext, MachineVerdict};
use render::config::Config;
use render::vocab::Contract;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Why the machine loop could not decide.
#[derive(Debug, thiserror::Error)]
pub enum MachineLoopError {
    #[error("rendering machine {machine}")]
    Render {
        machine: String,
        #[source]
        source: render::machine::MachineError,
    },
    #[error("classifying machine {machine}")]
    Classify {
        machine: String,
        #[source]
        source: render::classify::ClassifyError,
    },
    /// A state replayed from a snapshot holds digests where the secrets were: its plan is a
    /// preview, never executed.
    #[error("machine {machine}'s state was replayed from a snapshot: its plan cannot be executed")]
    Replayed { machine: String },
}

/// What the machine loop read, as plain data.
#[derive(Clone, Debug)]
pub struct MachineObservation {
    pub namespace: String,
    pub machine: Arc<TalosMachine>,
    /// The cluster's custom resources, loaded.
    pub manifests: Arc<render::manifests::Manifests>,
    /// The operation of the machine's cluster that has not ended (its name and kind).
    pub in_progress: Option<(String, OperationKind)>,
    /// The node's running config as read, or why it could not be read; none: not read (the
    /// machine's render fails, so nothing of the node is judged).
    pub running: Option<Result<String, String>>,
    /// The node's boot ID (none: a Talos before 1.14, or it could not be read).
    pub boot_id: Option<String>,
}

/// What the machine rules decide on: the machine's context, the node's running config and the
/// render (plain data; `snapshot` is its dump).
#[derive(Clone, Debug)]
pub struct MachineState {
    pub namespace: String,
    pub machine: String,
    /// How the Talos API reaches the node (`spec.address`).
    pub address: String,
    /// The reconcile's clock (RFC 3339): a condition's transition time.
    pub now: String,
    pub contract: Contract,
    pub context: MachineContext,
    /// The node's running config text (none: it could not be read, or the render failed).
    pub running: Option<Arc<str>>,
    /// The render's config (none: the render failed).
    pub desired: Option<Arc<Config>>,
    /// The render's desired-inputs hash.
    pub inputs_hash: Option<String>,
    /// The machine's status as read.
    pub status: TalosMachineStatus,
    /// The node's boot, as recorded or first seen now.
    pub boot: Option<BootRecord>,
    /// Made from a snapshot (secrets replaced by digests): decided, never executed.
    replayed: bool,
}

/// A render's refusal with every problem it names (the patch and field at fault).
fn render_problem(e: &render::machine::MachineError) -> String {
    let problems = e.problems();
    if problems.is_empty() { e.to_string() } else { format!("{e}: {}", problems.join("; ")) }
}

/// The machine's state from what was read: its render (kept in `renders` while its inputs
/// stay), its context, and its boot record (a boot not recorded yet is recorded with its
/// reboot-class values; in the recorded boot, the reboot-class paths whose value changed since
/// are the context's `applied_awaiting_reboot`). Pure.
pub fn assemble(
    o: &MachineObservation,
    now: &str,
    classifier: &Classifier,
    renders: &RenderCache,
) -> Result<MachineState, MachineLoopError> {
    let name = o.machine.metadata.name.clone().unwrap_or_default();
    let render_err = |source: render::machine::MachineError| MachineLoopError::Render { machine: name.clone(), source };
    let status = o.machine.status.clone().unwrap_or_default();
    let mch = o.manifests.machine(&name).map_err(|e| render_err(e.into()))?;
    let rendered = renders.render(classifier, &o.manifests, &name);
    let (contract, context) = match &rendered {
        Ok(r) => (r.contract, render::machine::context(&o.manifests, &o.machine, r)),
        Err(e) => {
            let cluster = o.manifests.cluster_of(mch);
            let contract = classifier.contract(&cluster.spec.version_contract).map_err(|e| render_err(e.into()))?;
            (contract, render::machine::rejected_context(&o.manifests, &o.machine, render_problem(e)))
        }
    };
    let mut state = MachineState {
        namespace: o.namespace.clone(),
        machine: name.clone(),
        address: o.machine.spec.address.clone(),
        now: now.to_string(),
        contract,
        context,
        running: None,
        desired: None,
        inputs_hash: None,
        boot: status.boot.clone(),
        status,
        replayed: false,
    };
    let Ok(rendered) = rendered else { return Ok(state) };
    state.context.operation_in_progress = o.in_progress.clone();
    state.desired = Some(rendered.config.clone());
    state.inputs_hash = Some(rendered.inputs_hash.clone());
    let text = match &o.running {
        Some(Err(why)) => {
            state.context.node_unreachable = Some(why.clone());
            return Ok(state);
        }
        Some(Ok(text)) => text,
        // Not read: judged on the render and context alone.
        None => return Ok(state),
    };
    // A boot ID Talos does not have (before 1.14) or cannot give now: no boot is tracked,
    // nothing is said to wait. The node still runs the config it booted with (the common case):
    // nothing waits, and its values are not read again.
    if let Some(id) = &o.boot_id {
        let config_hash = crate::plan::config_hash(text);
        let digests = || {
            let running = Config::parse(text).unwrap_or_default();
            render::boot::boot_digests(classifier, rendered.contract, &running, id)
                .map_err(|source| MachineLoopError::Classify { machine: name.clone(), source })
        };
        match &state.boot {
            Some(b) if b.id == *id && b.config_hash == config_hash => {}
            Some(b) if b.id == *id => {
                state.context.applied_awaiting_reboot =
                    render::boot::changed_within_boot(&b.reboot_values, &digests()?);
            }
            _ => state.boot = Some(BootRecord { id: id.clone(), config_hash, reboot_values: digests()? }),
        }
    }
    state.running = Some(Arc::from(text.as_str()));
    Ok(state)
}

/// What the machine loop does: the condition the rules decided and the live apply they ask
/// for. A draft: its apply carries no config until `complete`.
#[derive(Clone, Debug, PartialEq)]
pub struct MachinePlan {
    pub machine: String,
    /// The machine's `Ready` condition (its transition time moves only when its status or
    /// reason does).
    pub condition: Condition,
    /// The rules' verdict: reboot paths, live paths, every pending change.
    pub verdict: MachineVerdict,
    /// The live apply (`apply_live` in rules/machine.rules), when there is one.
    pub actions: Vec<Action>,
}

/// A plan whose applies carry the config to send and the hash of the running config it was
/// planned from: only `complete` makes one, and only it is executed.
#[derive(Clone, Debug)]
pub struct CompleteMachinePlan(MachinePlan);

impl std::ops::Deref for CompleteMachinePlan {
    type Target = MachinePlan;
    fn deref(&self) -> &MachinePlan {
        &self.0
    }
}

/// The machine rules' decision on `s` (rules/machine.rules, through the classifier), kept in
/// `verdicts` while the same render, running config and context judge the same.
pub fn decide(
    classifier: &Classifier,
    verdicts: Option<&VerdictCache>,
    s: &MachineState,
) -> Result<MachinePlan, MachineLoopError> {
    let judge = || {
        let changes = match (&s.running, &s.desired) {
            (Some(t), Some(d)) => render::diff::changes(&Config::parse(t).unwrap_or_default(), d),
            _ => vec![],
        };
        classifier
            .classify_machine(s.contract, &changes, s.desired.as_deref(), Some(&s.context), false)
            .map(|o| o.machine.unwrap_or_default())
            .map_err(|source| MachineLoopError::Classify { machine: s.machine.clone(), source })
    };
    let verdict = match verdicts {
        None => judge()?,
        Some(cache) => {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            let running = s.running.as_deref().map(crate::assemble::text_hash);
            (s.contract.to_string(), &s.inputs_hash, running, s.desired.is_some(), &s.context).hash(&mut h);
            cache.verdict(&s.machine, h.finish(), judge)?
        }
    };
    let mut condition = Condition {
        type_: "Ready".into(),
        status: verdict.status.clone(),
        reason: verdict.reason.clone(),
        message: verdict.message.clone(),
        last_transition_time: Some(s.now.clone()),
    };
    let previous = s.status.conditions.iter().find(|c| c.type_ == "Ready");
    if let Some(p) = previous.filter(|p| p.status == condition.status && p.reason == condition.reason) {
        condition.last_transition_time = p.last_transition_time.clone();
    }
    // Only the rules' paths, the running config's other paths as they are.
    let live = s.running.is_some() && s.desired.is_some() && !verdict.apply_paths.is_empty();
    let actions = if live {
        vec![Action::Apply {
            machine: s.machine.clone(),
            node: Some(s.address.clone()),
            paths: verdict.apply_paths.clone(),
            payload: None,
        }]
    } else {
        vec![]
    };
    Ok(MachinePlan { machine: s.machine.clone(), condition, verdict, actions })
}

/// The draft completed from the state's configs: each apply carries the node's running config
/// with the rules' paths set from the render, and the hash of the config it was planned from.
pub fn complete(plan: MachinePlan, s: &MachineState) -> Result<CompleteMachinePlan, MachineLoopError> {
    if s.replayed {
        return Err(MachineLoopError::Replayed { machine: s.machine.clone() });
    }
    let mut plan = plan;
    for a in &mut plan.actions {
        if let (Action::Apply { paths, payload, .. }, Some(running), Some(desired)) = (a, &s.running, &s.desired) {
            *payload = crate::plan::apply_payload(running, desired, paths);
        }
    }
    Ok(CompleteMachinePlan(plan))
}

/// The machine's status after the plan, `applied` the paths the executor applied live (no
/// longer pending). The hash of the inputs it converged to is recorded only when it has.
pub fn status(s: &MachineState, plan: &MachinePlan, applied: &[String]) -> TalosMachineStatus {
    let converged = plan.condition.status == "True";
    TalosMachineStatus {
        conditions: vec![plan.condition.clone()],
        reboot_paths: plan.verdict.reboot_paths.clone(),
        applied_inputs_hash: if converged { s.inputs_hash.clone() } else { s.status.applied_inputs_hash.clone() },
        desired_inputs_hash: s.inputs_hash.clone(),
        boot: s.boot.clone(),
        applied_awaiting_reboot: s.context.applied_awaiting_reboot.clone(),
        pending_changes: plan.verdict.pending.iter().filter(|p| !applied.contains(&p.path)).cloned().collect(),
        ..s.status.clone()
    }
}

/// A machine's state as `--dump-snapshots` writes it and `ichor plan --state` reads it back
/// (`loop: machine`): the configs as YAML with every sensitive value replaced by a digest keyed
/// for this snapshot alone (two configs of one snapshot differ where their secrets do; the
/// secrets cannot be had back).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineSnapshot {
    /// Always `machine`: which loop's state this is.
    #[serde(rename = "loop")]
    pub loop_: String,
    pub namespace: String,
    pub machine: String,
    #[serde(default)]
    pub address: String,
    pub now: String,
    pub contract: String,
    #[serde(default)]
    pub context: MachineContext,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs_hash: Option<String>,
    #[serde(default)]
    pub status: TalosMachineStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootRecord>,
}

impl MachineState {
    /// The state as a snapshot: the configs with their secrets hidden (`render::diff::hidden_yaml`).
    pub fn snapshot(&self, classifier: &Classifier) -> MachineSnapshot {
        use std::hash::BuildHasher;
        // Random keys, never written: the digests tell two values apart and nothing else.
        let keys = std::collections::hash_map::RandomState::new();
        let digest = |text: &str| keys.hash_one(text);
        let hide = |v: &serde_yaml::Value| render::diff::digested(v, &digest);
        let sensitive = |p: &render::path::Path| classifier.sensitive(self.contract, p);
        let hidden = |c: &Config| render::diff::hidden_yaml(c, &sensitive, &hide);
        MachineSnapshot {
            loop_: "machine".into(),
            namespace: self.namespace.clone(),
            machine: self.machine.clone(),
            address: self.address.clone(),
            now: self.now.clone(),
            contract: self.contract.to_string(),
            context: self.context.clone(),
            running: self.running.as_deref().map(|t| hidden(&Config::parse(t).unwrap_or_default())),
            desired: self.desired.as_deref().map(hidden),
            inputs_hash: self.inputs_hash.clone(),
            status: self.status.clone(),
            boot: self.boot.clone(),
        }
    }

    /// The state a snapshot holds, to decide on (never to execute): every field that does not
    /// read back, at once.
    pub fn from_snapshot(
        s: &MachineSnapshot,
        classifier: &Classifier,
    ) -> Result<MachineState, Vec<crate::state::StateError>> {
        let mut problems = vec![];
        let mut problem =
            |field: &str, message: String| problems.push(crate::state::StateError { field: field.into(), message });
        if s.loop_ != "machine" {
            problem("loop", format!("{:?} is not `machine`", s.loop_));
        }
        let contract = classifier.contract(&s.contract).map_err(|e| problem("contract", e.to_string())).ok();
        let mut config = |field: &str, text: &Option<String>| {
            text.as_deref().and_then(|t| {
                Config::parse(t)
                    .map_err(|errs| {
                        for e in errs {
                            problem(field, format!("does not parse as a machine config: {e}"));
                        }
                    })
                    .ok()
            })
        };
        let running = config("running", &s.running);
        let desired = config("desired", &s.desired);
        if crate::state::epoch(&s.now).is_none() {
            problem("now", format!("{:?} is not an RFC 3339 UTC time (YYYY-MM-DDTHH:MM:SSZ)", s.now));
        }
        let Some(contract) = contract.filter(|_| problems.is_empty()) else { return Err(problems) };
        Ok(MachineState {
            namespace: s.namespace.clone(),
            machine: s.machine.clone(),
            address: s.address.clone(),
            now: s.now.clone(),
            contract,
            context: s.context.clone(),
            running: running.map(|c| Arc::from(c.to_yaml().as_str())),
            desired: desired.map(Arc::new),
            inputs_hash: s.inputs_hash.clone(),
            status: s.status.clone(),
            boot: s.boot.clone(),
            replayed: true,
        })
    }
}

#[cfg(feature = "io")]
mod io {
    use super::*;
    use crate::controller::{Controller, ControllerError};
    use crate::exec::{Executor, Performed};
    use kube_client::api::Api;

    /// What one machine reconcile found and did.
    #[derive(Clone, Debug)]
    pub struct MachineReconciled {
        /// The machine's Ready condition (the rules').
        pub condition: Condition,
        /// The paths applied live this time (none when nothing was, or the apply did not happen).
        pub applied: Vec<String>,
        /// The operation of its cluster that has not ended, which the machine is left to.
        pub left_to: Option<String>,
        /// What the rules decided on (for `--dump-snapshots`).
        pub state: MachineState,
    }

    impl Controller {
        /// The machine loop's reconcile of one TalosMachine (`reconcile`).
        pub async fn reconcile_machine(
            &self,
            namespace: &str,
            machine: &str,
            now: &str,
        ) -> Result<MachineReconciled, ControllerError> {
            reconcile(self, namespace, machine, now).await
        }
    }

    /// One reconcile of a TalosMachine: observe, assemble, decide, complete and execute, write
    /// its status (only when it changes: each write is a watch event that would start this
    /// reconcile again). An unreachable node is `Unknown`; the reconcile after a live apply
    /// shows whether the node runs it.
    pub async fn reconcile(
        c: &Controller,
        namespace: &str,
        machine: &str,
        now: &str,
    ) -> Result<MachineReconciled, ControllerError> {
        let o = observe(c, namespace, machine).await?;
        let own = |e: MachineLoopError| ControllerError::Loop(Box::new(e));
        let state = assemble(&o, now, &c.classifier, &c.renders).map_err(own)?;
        let plan = complete(decide(&c.classifier, Some(c.verdicts()), &state).map_err(own)?, &state).map_err(own)?;
        let mut applied = vec![];
        let mut kube = c.kube_port(namespace, None);
        for a in &plan.actions {
            match (Executor { talos: &c.talos, kube: &mut kube }).perform(a).await {
                Performed::Done => {
                    if let Action::Apply { paths, .. } = a {
                        applied.extend(paths.iter().cloned());
                    }
                }
                // The node changed under the read, or Talos refused: looked at again after.
                other => tracing::warn!(machine, outcome = ?other, "the live apply did not happen"),
            }
        }
        let next = status(&state, &plan, &applied);
        let api: Api<TalosMachine> = Api::namespaced(c.kube.clone(), namespace);
        crate::kube::write_status(&api, machine, &state.status, &next, None, crate::kube::managers::MACHINES)
            .await
            .map_err(|source| ControllerError::Kube {
                what: format!("writing the status of TalosMachine {namespace}/{machine}"),
                source,
            })?;
        let left_to = state.context.operation_in_progress.as_ref().map(|(n, _)| n.clone());
        Ok(MachineReconciled { condition: plan.condition.clone(), applied, left_to, state })
    }

    /// The machine loop's reads: the machine, its cluster (loaded once per change of its
    /// objects), the operation of the cluster that has not ended, the node's running config and
    /// boot.
    pub async fn observe(
        c: &Controller,
        namespace: &str,
        machine: &str,
    ) -> Result<MachineObservation, ControllerError> {
        let machine = c.machine(namespace, machine).await?;
        let cluster_name = machine.spec.cluster_ref.name.clone();
        let cluster = c.cluster(namespace, &cluster_name).await?;
        let secret = c.secret(namespace, &cluster).await?;
        // The rules' terminal set, which `Phase::is_terminal` is pinned to by a test: no
        // evaluation per reconcile.
        let in_progress = c
            .operations(namespace)
            .await?
            .into_iter()
            .find(|o| {
                o.spec.cluster_ref.name == cluster_name
                    && !o.status.as_ref().map(|s| s.phase()).unwrap_or_default().is_terminal()
            })
            .and_then(|o| Some((o.metadata.name.clone()?, o.spec.kind)));
        let manifests = c.cluster_loaded(namespace, &cluster, secret).await?;
        let address = machine.spec.address.clone();
        // A machine whose render fails is judged on that alone: its node is not read (the render
        // is kept, so the assembly's is the same one).
        let name = machine.metadata.name.clone().unwrap_or_default();
        let renders = c.renders.render(&c.classifier, &manifests, &name).is_ok();
        let running = match renders {
            true => Some(c.talos.running_config(&address).await.map_err(|e| e.to_string())),
            false => None,
        };
        let boot_id = match &running {
            Some(Ok(_)) => c.talos.boot_id(&address).await.ok().flatten(),
            _ => None,
        };
        Ok(MachineObservation {
            namespace: namespace.to_string(),
            machine: Arc::new(machine),
            manifests,
            in_progress,
            running,
            boot_id,
        })
    }
}

#[cfg(feature = "io")]
pub use io::{MachineReconciled, observe, reconcile};

#[cfg(test)]
mod tests {
    use super::*;

    /// Two configs of one snapshot keep their differences where their secrets differ, and the
    /// secrets are not in it.
    #[test]
    fn a_snapshot_hides_secrets_and_keeps_where_they_differ() {
        let classifier = Classifier::new(&render::classify::RuleSet::embedded()).unwrap();
        let contract = classifier.contract("v1.12").unwrap();
        let running = "version: v1alpha1\nmachine:\n  type: worker\n  token: abc.0123456789abcdef\n  ca:\n    crt: AAAA\n    key: BBBB\n";
        let desired = "version: v1alpha1\nmachine:\n  type: worker\n  token: xyz.0123456789abcdef\n  ca:\n    crt: AAAA\n    key: BBBB\n";
        let state = MachineState {
            namespace: "ns".into(),
            machine: "w1".into(),
            address: "10.0.0.2".into(),
            now: "2026-12-08T00:00:00Z".into(),
            contract,
            context: MachineContext::default(),
            running: Some(Arc::from(running)),
            desired: Some(Arc::new(Config::parse(desired).unwrap())),
            inputs_hash: Some("h".into()),
            status: TalosMachineStatus::default(),
            boot: None,
            replayed: false,
        };
        let snap = state.snapshot(&classifier);
        let text = serde_yaml::to_string(&snap).unwrap();
        for secret in ["abc.0123456789abcdef", "xyz.0123456789abcdef", "BBBB"] {
            assert!(!text.contains(secret), "{secret} is in the snapshot:\n{text}");
        }
        let back = MachineState::from_snapshot(&serde_yaml::from_str(&text).unwrap(), &classifier).unwrap();
        let changes = |s: &MachineState| {
            let running = Config::parse(s.running.as_deref().unwrap()).unwrap();
            render::diff::changes(&running, s.desired.as_deref().unwrap())
                .iter()
                .map(|c| c.path.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(changes(&back), changes(&state));
        assert_eq!(changes(&state), ["machine.token"]);
        assert!(matches!(
            complete(decide(&classifier, None, &back).unwrap(), &back),
            Err(MachineLoopError::Replayed { .. })
        ));
    }
}
