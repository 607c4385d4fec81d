//! The executor (feature `io`): performs a plan's actions in the plan's order, each exactly
//! as the rules gave it, choosing nothing. Talos's side goes through the Talos client; the
//! Kubernetes side through `KubePort` (the controller's kube-rs implementation, or a test's).
//!
//! Start at `Executor::run`. A machine's apply changes only the paths the action names (the
//! node's running config with those paths set from the render, `Config::with_paths`), in mode
//! NO_REBOOT. A Talos refusal fails that machine's step (the operation pauses next reconcile,
//! naming it); a transient error stops the run (the next reconcile re-derives and goes on);
//! status changes are `status::record`'s, written by the caller.

use crate::plan::{Action, ObjectRef, Plan};
use crate::talos::client::{ApplyMode, Client, TalosError};
use render::config::Config;
use std::collections::BTreeMap;

/// What the executor needs of Kubernetes.
#[allow(async_fn_in_trait)]
pub trait KubePort {
    type Error: std::fmt::Display;
    /// Whether an error fails the machine's step (the operation pauses, naming it) rather than
    /// interrupting the run until the next reconcile: a drain past its deadline does.
    fn fails_step(_e: &Self::Error) -> bool {
        false
    }
    async fn cordon(&mut self, node: &str) -> Result<(), Self::Error>;
    /// Evicts the node's pods (PodDisruptionBudgets respected; DaemonSet and mirror pods left).
    async fn drain(&mut self, node: &str) -> Result<(), Self::Error>;
    async fn uncordon(&mut self, node: &str) -> Result<(), Self::Error>;
    /// The bootstrap-manifest sync through `via`'s admin kubeconfig, under field manager `talos`.
    async fn sync_manifests(&mut self, via: &str, field_manager: &str) -> Result<(), Self::Error>;
    async fn delete(&mut self, via: &str, object: &ObjectRef) -> Result<(), Self::Error>;
    async fn restore_kube_proxy(&mut self, via: &str) -> Result<(), Self::Error>;
    /// The Cilium Job `name`: `ichor cni helm apply` with the mode, the user's layer and the
    /// tunnel protocol (it validates and layers them itself).
    async fn cilium_job(
        &mut self,
        name: &str,
        mode: render::api::KubeProxyMode,
        user: &serde_json::Value,
        tunnel: &str,
    ) -> Result<(), Self::Error>;
}

/// How a run ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Actions performed, in order (their `Display`).
    pub done: Vec<String>,
    /// Machines whose step Talos refused: machine, message.
    pub failed: Vec<(String, String)>,
    /// Why the run stopped early (a transient error): try again next reconcile.
    pub interrupted: Option<String>,
}

pub struct Executor<'a, K: KubePort> {
    pub talos: &'a Client,
    pub kube: &'a mut K,
    /// Each machine's render (the whole desired config).
    pub desired: &'a BTreeMap<String, Config>,
    /// How the Talos API reaches each machine (its address, the `node` header); a machine not
    /// listed is reached by its name.
    pub nodes: &'a BTreeMap<String, String>,
}

impl<K: KubePort> Executor<'_, K> {
    fn node<'m>(&'m self, machine: &'m str) -> &'m str {
        self.nodes.get(machine).map(String::as_str).unwrap_or(machine)
    }

    /// Performs the plan's actions in order; stops at the first transient error.
    pub async fn run(&mut self, plan: &Plan) -> Outcome {
        let mut out = Outcome::default();
        for (a, _) in &plan.actions {
            let r: Result<(), String> = match a {
                Action::PullImage { machine, namespace, image } => self
                    .talos
                    .pull_image(self.node(machine), *namespace, image)
                    .await
                    .map_err(|e| self.talos_failed(machine, e, &mut out)),
                Action::Apply { machine, paths } => self.apply(machine, paths, &mut out).await,
                Action::Cordon { machine } => self.kube.cordon(machine).await.map_err(|e| e.to_string()),
                Action::Drain { machine } => match self.kube.drain(machine).await {
                    Ok(()) => Ok(()),
                    Err(e) if K::fails_step(&e) => {
                        out.failed.push((machine.clone(), e.to_string()));
                        // Nothing more on this machine: its apply must not run undrained.
                        out.interrupted = None;
                        return out;
                    }
                    Err(e) => Err(e.to_string()),
                },
                Action::Uncordon { machine } => self.kube.uncordon(machine).await.map_err(|e| e.to_string()),
                Action::SyncManifests { via, field_manager } => {
                    self.kube.sync_manifests(via, field_manager).await.map_err(|e| e.to_string())
                }
                Action::Delete { via, object } => self.kube.delete(via, object).await.map_err(|e| e.to_string()),
                Action::RestoreKubeProxy { via } => self.kube.restore_kube_proxy(via).await.map_err(|e| e.to_string()),
                Action::CiliumJob { name, mode, user, tunnel, .. } => {
                    self.kube.cilium_job(name, *mode, user, tunnel).await.map_err(|e| e.to_string())
                }
                // Status, waits, warnings and the end: recorded by `status::record`.
                _ => Ok(()),
            };
            match r {
                Ok(()) => out.done.push(a.to_string()),
                Err(why) if why.is_empty() => {}
                Err(why) => {
                    out.interrupted = Some(why);
                    return out;
                }
            }
        }
        out
    }

    /// A Talos error: a refusal fails the machine's step (returns "" to go on with the rest);
    /// anything else interrupts the run.
    fn talos_failed(&self, machine: &str, e: TalosError, out: &mut Outcome) -> String {
        match e {
            TalosError::Refused { message, .. } => {
                let head = message.split("\ndiff:").next().unwrap_or(&message).to_string();
                out.failed.push((machine.to_string(), format!("Talos refused the change on {machine}: {head}")));
                String::new()
            }
            e => e.to_string(),
        }
    }

    async fn apply(&mut self, machine: &str, paths: &[String], out: &mut Outcome) -> Result<(), String> {
        let Some(desired) = self.desired.get(machine) else {
            out.failed.push((machine.to_string(), format!("no render of {machine} to apply")));
            return Err(String::new());
        };
        let node = self.node(machine).to_string();
        let text = self.talos.running_config(&node).await.map_err(|e| self.talos_failed(machine, e, out))?;
        let running = Config::parse(&text)
            .map_err(|e| format!("{machine}: the running config does not parse: {}", e[0].message))?;
        let paths: Vec<render::path::Path> = paths.iter().filter_map(|p| render::path::Path::parse(p).ok()).collect();
        let next = running.with_paths(desired, &paths).to_yaml();
        self.talos
            .apply(&node, next.as_bytes(), ApplyMode::NoReboot, false)
            .await
            .map(|_| ())
            .map_err(|e| self.talos_failed(machine, e, out))
    }
}
