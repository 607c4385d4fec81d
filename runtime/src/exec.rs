//! The executor (feature `io`): performs a plan's actions in the plan's order, each exactly
//! as the rules gave it, choosing nothing. It takes the plan and the clients, nothing else: no
//! observed state, no render. Talos's side goes through the Talos client; the Kubernetes side
//! through `KubePort` (the controller's kube-rs implementation, or a test's).
//!
//! Start at `Executor::run`. An apply sends the config its action carries, in mode NO_REBOOT
//! (or STAGED, before a reboot on Talos older than 1.14), and only while the node still runs the config the plan was made from (its hash, a
//! precondition: otherwise nothing is applied, the run stops, and the next reconcile plans
//! again). A Talos refusal fails that machine's step (the operation pauses next reconcile,
//! naming it); a transient error stops the run. Each action gets a typed `Performed`; status
//! changes are `status::record`'s, written by the caller.

use crate::plan::{Action, ObjectRef, Plan, config_hash};
use crate::talos::client::{ApplyMode, Client, TalosError};

/// What the executor needs of Kubernetes.
#[allow(async_fn_in_trait)]
pub trait KubePort {
    type Error: std::error::Error + 'static;
    /// Whether an error fails the machine's step (the operation pauses, naming it) rather than
    /// interrupting the run until the next reconcile: a drain past its deadline does.
    fn fails_step(_e: &Self::Error) -> bool {
        false
    }
    /// Whether the API server refused the controller itself (RBAC's 403): retrying cannot help,
    /// so the operation pauses naming the request and what to do, instead of retrying unseen.
    fn forbidden(_e: &Self::Error) -> bool {
        false
    }
    async fn cordon(&mut self, node: &str) -> Result<(), Self::Error>;
    /// Evicts the node's pods (PodDisruptionBudgets respected; DaemonSet and mirror pods left).
    /// With `force` (the user's consent, `spec.forceDrain`), a pod a budget still keeps at the
    /// drain's deadline is deleted instead of the drain failing.
    async fn drain(&mut self, node: &str, force: bool) -> Result<(), Self::Error>;
    async fn uncordon(&mut self, node: &str) -> Result<(), Self::Error>;
    /// Puts Ichor's `PreferNoSchedule` taint on the Node (`on`), or takes it off; other taints
    /// stay as they are.
    async fn taint(&mut self, node: &str, on: bool) -> Result<(), Self::Error>;
    /// The bootstrap-manifest sync: every manifest Talos rendered on the control plane the Talos
    /// API reaches as `node`, server-side-applied under `field_manager`.
    async fn sync_manifests(&mut self, node: &str, field_manager: &str) -> Result<(), Self::Error>;
    async fn delete(&mut self, object: &ObjectRef) -> Result<(), Self::Error>;
    /// The objects of the bootstrap manifest `manifest` Talos rendered on `node`, server-side-
    /// applied under `field_manager` (nothing when Talos has not rendered it yet).
    async fn restore_manifest(&mut self, node: &str, manifest: &str, field_manager: &str) -> Result<(), Self::Error>;
    /// The Cilium Job `name`: `ichor cni helm apply` with the mode, the user's layer and the
    /// tunnel protocol (it validates and layers them itself); with `take_ownership`, Helm takes
    /// Cilium's objects over into the release (`--take-ownership`).
    async fn cilium_job(
        &mut self,
        name: &str,
        mode: render::api::KubeProxyMode,
        user: &serde_json::Value,
        tunnel: &str,
        take_ownership: bool,
    ) -> Result<(), Self::Error>;
    /// A release's stage: the cluster's spec field set to the stage's version (when the stage
    /// has one), then the stage's TalosOperation created, owned by the release. An operation of
    /// that name already there is the stage already started: nothing to do.
    async fn start_stage(&mut self, stage: &crate::plan::StageStart) -> Result<(), Self::Error>;
    /// Ichor's namespace locked down: its CiliumNetworkPolicies server-side-applied (the ones
    /// already as wanted are not written again).
    async fn lock_down(&mut self, lockdown: &crate::netpol::Lockdown) -> Result<(), Self::Error>;
}

/// What became of one action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Performed {
    /// Done on Talos or Kubernetes.
    Done,
    /// A status change (a marker, a clock, a pause, the phase): `status::record` writes it.
    Recorded,
    /// The machine's step failed (a Talos refusal, a drain past its deadline): the operation
    /// pauses naming it.
    Failed { machine: String, message: String },
    /// The API server refused the controller itself (RBAC's 403): the run stops and the
    /// operation pauses with the API server's words and what to do; no machine's step failed.
    Forbidden { message: String },
    /// A precondition no longer holds (the node's config changed since it was read, or the
    /// apply carries no config): nothing was done; the next reconcile plans again.
    Refused { why: String },
    /// A transient error: the run stopped here; the next reconcile re-derives and goes on.
    Interrupted { why: String },
}

/// How a run ended: each action performed (in order) with what became of it. Actions after a
/// stop are not listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub actions: Vec<(Action, Performed)>,
}

impl Outcome {
    /// Machines whose step failed: machine, message.
    pub fn failed(&self) -> Vec<(String, String)> {
        self.actions
            .iter()
            .filter_map(|(_, p)| match p {
                Performed::Failed { machine, message } => Some((machine.clone(), message.clone())),
                _ => None,
            })
            .collect()
    }

    /// The API server's refusal of the controller that stopped the run, if one did.
    pub fn forbidden(&self) -> Option<&str> {
        self.actions.iter().find_map(|(_, p)| match p {
            Performed::Forbidden { message } => Some(message.as_str()),
            _ => None,
        })
    }

    /// Why the run stopped early (a transient error or a precondition), if it did.
    pub fn stopped(&self) -> Option<&str> {
        self.actions.iter().find_map(|(_, p)| match p {
            Performed::Interrupted { why } | Performed::Refused { why } => Some(why.as_str()),
            _ => None,
        })
    }

    /// Whether a precondition stopped the run (the plan is stale: nothing of it should be
    /// recorded as done).
    pub fn refused(&self) -> bool {
        self.actions.iter().any(|(_, p)| matches!(p, Performed::Refused { .. }))
    }

    /// The actions done on Talos or Kubernetes (their `Display`).
    pub fn done(&self) -> Vec<String> {
        self.actions.iter().filter(|(_, p)| *p == Performed::Done).map(|(a, _)| a.to_string()).collect()
    }
}

pub struct Executor<'a, K: KubePort> {
    pub talos: &'a Client,
    pub kube: &'a mut K,
}

/// How the Talos API reaches a machine: the address its action carries, else its name.
fn reach<'m>(machine: &'m str, node: &'m Option<String>) -> &'m str {
    node.as_deref().unwrap_or(machine)
}

impl<K: KubePort> Executor<'_, K> {
    /// Performs the plan's actions in order; stops at the first transient error or failed
    /// precondition, and after a drain that fails its machine's step.
    pub async fn run(&mut self, plan: &Plan) -> Outcome {
        self.run_all(plan.actions.iter().map(|(a, _)| a)).await
    }

    /// `run` of a loop's actions (the machine and cluster loops').
    pub async fn run_actions(&mut self, actions: &[Action]) -> Outcome {
        self.run_all(actions.iter()).await
    }

    async fn run_all(&mut self, actions: impl Iterator<Item = &Action>) -> Outcome {
        let mut out = Outcome::default();
        for a in actions {
            let p = self.perform(a).await;
            let stop = matches!(p, Performed::Interrupted { .. } | Performed::Refused { .. })
                || matches!((a, &p), (Action::Drain { .. }, Performed::Failed { .. }))
                || matches!(p, Performed::Forbidden { .. });
            out.actions.push((a.clone(), p));
            if stop {
                break;
            }
        }
        out
    }

    /// Performs one action (the machine controller's live apply uses it alone); a write that
    /// succeeded passes its crash point (`crashpoint::after`).
    pub async fn perform(&mut self, a: &Action) -> Performed {
        let p = self.perform_one(a).await;
        if matches!(p, Performed::Done)
            && let Some(w) = write_kind(a)
        {
            crate::crashpoint::after(w);
        }
        p
    }

    async fn perform_one(&mut self, a: &Action) -> Performed {
        let kube = |r: Result<(), K::Error>| match r {
            Ok(()) => Performed::Done,
            Err(e) if K::forbidden(&e) => forbidden(&e),
            Err(e) => Performed::Interrupted { why: crate::error_chain(&e) },
        };
        match a {
            Action::PullImage { machine, node, namespace, image } => {
                match self.talos.pull_image(reach(machine, node), *namespace, image).await {
                    Ok(()) => Performed::Done,
                    Err(e) => talos_failed(machine, e),
                }
            }
            Action::Apply { machine, node, payload, .. } => {
                self.apply(machine, node, payload, ApplyMode::NoReboot).await
            }
            Action::ApplyStaged { machine, node, payload, .. } => {
                self.apply(machine, node, payload, ApplyMode::Staged).await
            }
            Action::UpgradeTalos { machine, node, image, legacy } => {
                match self.talos.upgrade(reach(machine, node), image, *legacy).await {
                    Ok(()) => Performed::Done,
                    Err(e) => talos_failed(machine, e),
                }
            }
            Action::Reboot { machine, node } => match self.talos.reboot(reach(machine, node)).await {
                Ok(()) => Performed::Done,
                Err(e) => talos_failed(machine, e),
            },
            Action::Cordon { machine } => kube(self.kube.cordon(machine).await),
            Action::Drain { machine, force } => match self.kube.drain(machine, *force).await {
                Ok(()) => Performed::Done,
                // Nothing more on this machine: its apply must not run undrained.
                Err(e) if K::fails_step(&e) => {
                    Performed::Failed { machine: machine.clone(), message: crate::error_chain(&e) }
                }
                Err(e) if K::forbidden(&e) => forbidden(&e),
                Err(e) => Performed::Interrupted { why: crate::error_chain(&e) },
            },
            Action::Uncordon { machine } => kube(self.kube.uncordon(machine).await),
            Action::Taint { machine } => kube(self.kube.taint(machine, true).await),
            Action::Untaint { machine } => kube(self.kube.taint(machine, false).await),
            Action::SyncManifests { via, node, field_manager } => {
                kube(self.kube.sync_manifests(reach(via, node), field_manager).await)
            }
            Action::Delete { object } => kube(self.kube.delete(object).await),
            Action::RestoreKubeProxy { via, node, manifest, field_manager } => {
                kube(self.kube.restore_manifest(reach(via, node), manifest, field_manager).await)
            }
            Action::CiliumJob { name, mode, user, tunnel, take_ownership, .. } => {
                kube(self.kube.cilium_job(name, *mode, user, tunnel, *take_ownership).await)
            }
            Action::StartStage { stage } => kube(self.kube.start_stage(stage).await),
            Action::LockDown { lockdown } => kube(self.kube.lock_down(lockdown).await),
            // Status, waits, warnings and the end: recorded by `status::record`.
            Action::Abort { .. }
            | Action::Resume
            | Action::Pause { .. }
            | Action::Fail { .. }
            | Action::SetKubeProxyStatus { .. }
            | Action::RecordCiliumAdoption { .. }
            | Action::Start { .. }
            | Action::Stage { .. }
            | Action::Done { .. }
            | Action::StepDone { .. }
            | Action::Wait { .. }
            | Action::ClearClock { .. }
            | Action::Warn { .. }
            | Action::Complete
            | Action::SetCondition { .. }
            | Action::ClearCondition { .. }
            | Action::RecordValuesHash { .. } => Performed::Recorded,
        }
    }
}

impl<K: KubePort> Executor<'_, K> {
    /// An apply (NO_REBOOT) or a stage (STAGED) of the config the action carries, only while
    /// the node still runs the config the plan was made from.
    async fn apply(
        &mut self,
        machine: &str,
        node: &Option<String>,
        payload: &Option<crate::plan::ApplyPayload>,
        mode: ApplyMode,
    ) -> Performed {
        let Some(payload) = payload else {
            return Performed::Refused {
                why: format!("the apply to {machine} carries no config (a plan made without the renders)"),
            };
        };
        let node = reach(machine, node);
        let running = match self.talos.running_config(node).await {
            Ok(t) => t,
            Err(e) => return talos_failed(machine, e),
        };
        if config_hash(&running) != payload.running_hash {
            // What was observed of the node no longer holds: read it afresh next time.
            self.talos.touch(node);
            return Performed::Refused {
                why: format!(
                    "{machine}'s running config changed since this plan was made: nothing applied; the next reconcile plans again"
                ),
            };
        }
        match self.talos.apply(node, payload.config.as_bytes(), mode, false).await {
            Ok(_) => Performed::Done,
            Err(e) => talos_failed(machine, e),
        }
    }
}

/// The kind of write an action makes, if it writes.
fn write_kind(a: &Action) -> Option<crate::crashpoint::Write> {
    use crate::crashpoint::Write;
    Some(match a {
        Action::Apply { .. } | Action::ApplyStaged { .. } => Write::TalosApply,
        Action::Reboot { .. } => Write::TalosReboot,
        Action::UpgradeTalos { .. } => Write::TalosUpgrade,
        Action::Cordon { .. } | Action::Uncordon { .. } | Action::Taint { .. } | Action::Untaint { .. } => {
            Write::Cordon
        }
        Action::Drain { .. } => Write::Drain,
        Action::SyncManifests { .. } | Action::RestoreKubeProxy { .. } => Write::ServerSideApply,
        Action::Delete { .. } => Write::Delete,
        Action::CiliumJob { .. } => Write::JobCreate,
        Action::StartStage { .. } => Write::StageCreate,
        _ => return None,
    })
}

/// A Talos error: a refusal fails the machine's step (the run goes on with the rest); anything
/// else interrupts the run. The client already withheld Talos's diff (it can hold secrets).
/// A request RBAC refused the controller: the operation pauses with the API server's words
/// (verb, resource, namespace) and what to do; no machine's step failed.
/// An admission webhook's denial is also a 403: the webhook's words say what to do, not RBAC.
fn forbidden(e: &(dyn std::error::Error + 'static)) -> Performed {
    let words = crate::error_chain(e);
    let message = if words.contains("admission webhook") {
        format!("{words}; do what it says, then resume the operation")
    } else {
        format!(
            "{words}; the controller's ClusterRole does not allow it: apply this version's `ichor install` (its role grants what Ichor asks for), then resume the operation"
        )
    };
    Performed::Forbidden { message }
}

fn talos_failed(machine: &str, e: TalosError) -> Performed {
    match e {
        TalosError::Refused { message, .. } => Performed::Failed {
            machine: machine.to_string(),
            message: format!("Talos refused the change on {machine}: {message}"),
        },
        e => Performed::Interrupted { why: crate::error_chain(&e) },
    }
}
