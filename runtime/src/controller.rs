//! The controller's reconcile of one TalosOperation (feature `io`): read what it needs from
//! Kubernetes and Talos, assemble the snapshot, plan with the rules, execute, write status.
//! Each reconcile re-derives everything from what it reads, so a crash anywhere resumes.
//!
//! Start at `Controller::reconcile`. `Controller::read` is the observation alone: the snapshot
//! it returns is what `ichor plan --state` decides on (dump it to reproduce a decision). Status
//! writes carry the resourceVersion read; a conflict re-reads and re-plans.

use crate::exec::{Executor, Outcome};
use crate::kube::{KubeCluster, read_workload};
use crate::plan::{Plan, Planner};
use crate::state::{Cluster, Cni, MachineProgress, ObservedState, Operation, OtherOperation, StaticPod};
use crate::talos::client::Client as Talos;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube_client::api::{Api, ListParams, Patch, PatchParams};
use render::api::{TalosCluster, TalosConfigPatch, TalosMachine, TalosOperation};
use render::classify::Classifier;
use render::config::Config;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("{what}: {source}")]
    Kube { what: String, source: kube_client::Error },
    #[error("rendering machine {machine}: {problem}")]
    Render { machine: String, problem: String },
    #[error("the custom resources do not load: {0}")]
    Manifests(String),
    #[error("the snapshot: {0}")]
    Snapshot(String),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Workload(#[from] crate::kube::KubeError),
    #[error(transparent)]
    Handover(#[from] crate::handover::HandoverError),
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube_client::Error) -> ControllerError {
    let what = what.into();
    move |source| ControllerError::Kube { what, source }
}

/// The controller's probe of the kubernetes Service: async, bounded by its own timeout, so a
/// reconcile never blocks a runtime thread on a TCP connect.
pub type ServiceProbe = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// What one reconcile saw, decided and did.
#[derive(Debug)]
pub struct Reconciled {
    pub snapshot: ObservedState,
    pub plan: Plan,
    pub outcome: Outcome,
    /// The status written.
    pub status: ObservedState,
}

/// What a reconcile reads besides the snapshot: each machine's render and Talos address.
#[derive(Debug)]
pub struct Read {
    pub snapshot: ObservedState,
    /// Each machine's running config (as read) and render: what completes the plan's applies.
    pub configs: BTreeMap<String, crate::plan::MachineConfigs>,
    /// The operation's resourceVersion, for the status write.
    pub resource_version: Option<String>,
}

pub struct Controller {
    pub kube: kube_client::Client,
    pub talos: Talos,
    pub planner: Planner,
    pub classifier: Classifier,
    /// The release set's Kubernetes this Ichor ships (ADR 0113).
    pub release_set_kubernetes: String,
    /// The node the controller runs on (it goes last).
    pub controller_node: Option<String>,
    /// The controller's probe of the kubernetes Service.
    pub service_answers: Arc<dyn Fn() -> ServiceProbe + Send + Sync>,
    pub drain_timeout: Duration,
    /// Classifications kept between reconciles (a machine is classified again only when its
    /// running config or its render's inputs change).
    pub cache: crate::assemble::PendingCache,
}

/// A render's refusal with every problem it names (the patch and field at fault).
fn render_problem(e: &render::machine::MachineError) -> String {
    let problems = e.problems();
    if problems.is_empty() { e.to_string() } else { format!("{e}: {}", problems.join("; ")) }
}

fn yaml<T: serde::Serialize>(what: &str, v: &T) -> (String, String) {
    (what.to_string(), serde_yaml::to_string(v).unwrap_or_default())
}

impl Controller {
    /// Reads everything the operation's rules need, and each machine's render.
    pub async fn read(&self, namespace: &str, operation: &str, now: &str) -> Result<Read, ControllerError> {
        let ops: Api<TalosOperation> = Api::namespaced(self.kube.clone(), namespace);
        let op =
            ops.get(operation).await.map_err(kube_err(format!("reading TalosOperation {namespace}/{operation}")))?;
        let cluster_name = op.spec.cluster_ref.name.clone();
        let clusters: Api<TalosCluster> = Api::namespaced(self.kube.clone(), namespace);
        let cluster = clusters
            .get(&cluster_name)
            .await
            .map_err(kube_err(format!("reading TalosCluster {namespace}/{cluster_name}")))?;
        self.read_operation(namespace, &op, &cluster, now).await
    }

    /// `read` for an operation and a cluster given as objects: the CLI previews an operation it
    /// has not created yet, against the cluster as it will be once its spec is changed.
    pub async fn read_operation(
        &self,
        namespace: &str,
        op: &TalosOperation,
        cluster: &TalosCluster,
        now: &str,
    ) -> Result<Read, ControllerError> {
        let operation = op.metadata.name.as_deref().unwrap_or_default();
        let cluster_name = op.spec.cluster_ref.name.clone();
        let ops: Api<TalosOperation> = Api::namespaced(self.kube.clone(), namespace);
        let (machines, patches) = self.cluster_objects(namespace, &cluster_name).await?;
        let others: Vec<OtherOperation> = ops
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing TalosOperations"))?
            .items
            .into_iter()
            .filter(|o| o.spec.cluster_ref.name == cluster_name && o.metadata.name.as_deref() != Some(operation))
            .map(|o| OtherOperation {
                name: o.metadata.name.clone().unwrap_or_default(),
                kind: o.spec.kind,
                phase: o.status.map(|s| s.phase()).unwrap_or_default(),
            })
            .collect();
        // What the user wrote may not render: then nothing is observed or done, and the rules
        // pause the operation naming every problem (unless it has ended).
        let mut rejected = None;
        let mut rendered_all = vec![];
        match self.manifests(namespace, cluster, &machines, &patches).await {
            Ok(manifests) => {
                for m in &machines {
                    let name = m.metadata.name.clone().unwrap_or_default();
                    match render::machine::render_checked(&manifests, &name, None, &self.classifier) {
                        Ok(r) => rendered_all.push(r),
                        Err(e) => {
                            let e = ControllerError::Render { machine: name, problem: render_problem(&e) };
                            rejected = Some(e.to_string());
                            break;
                        }
                    }
                }
            }
            Err(e @ ControllerError::Manifests(_)) => rejected = Some(e.to_string()),
            Err(e) => return Err(e),
        }
        let machines: Vec<TalosMachine> = if rejected.is_some() { vec![] } else { machines };
        // The Nodes, listed once (not one GET per machine).
        let nodes: BTreeMap<String, Node> = if machines.is_empty() {
            BTreeMap::new()
        } else {
            Api::<Node>::all(self.kube.clone())
                .list(&ListParams::default())
                .await
                .map_err(kube_err("listing Nodes"))?
                .items
                .into_iter()
                .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
                .collect()
        };
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), "kube-system");
        let mirror = pods.list(&ListParams::default()).await.map_err(kube_err("listing kube-system pods"))?.items;
        // Every node at once (bounded), each call under its own deadline; an unreachable one is
        // Unknown and the others are observed.
        let addresses: Vec<String> = machines.iter().map(|m| m.spec.address.clone()).collect();
        let observations = crate::talos::observe::observe_fleet(&self.talos, &addresses, 16).await;
        let mut configs = BTreeMap::new();
        let mut snap_machines = vec![];
        for ((m, observed), rendered) in machines.iter().zip(&observations).zip(rendered_all) {
            let name = m.metadata.name.clone().unwrap_or_default();
            let status = nodes.get(&name).and_then(|n| n.status.clone()).unwrap_or_default();
            let ready = status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
            let kubelet = status.node_info.map(|i| i.kubelet_version).unwrap_or_default();
            let static_pods: BTreeMap<String, StaticPod> = mirror
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
                .filter(|p| {
                    p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
                })
                .filter_map(|p| {
                    let component = p.metadata.labels.as_ref()?.get("k8s-app")?.clone();
                    let image = p.spec.as_ref()?.containers.first()?.image.clone()?;
                    let ready = p
                        .status
                        .as_ref()?
                        .conditions
                        .as_ref()?
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    Some((component, StaticPod { image, ready }))
                })
                .collect();
            let (talos_version, running, manifest) = match observed {
                crate::talos::observe::Observed::Known(o) => (
                    o.talos_version.clone(),
                    Some(o.running_config.clone()),
                    (m.spec.role == render::api::Role::Controlplane)
                        .then(|| o.manifests.iter().any(|x| x == "10-kube-proxy")),
                ),
                crate::talos::observe::Observed::Unknown { .. } => (cluster.spec.talos_version.clone(), None, None),
            };
            let mr = crate::assemble::MachineRead {
                name: name.clone(),
                role: m.spec.role,
                talos_version,
                kubelet_version: if kubelet.is_empty() { cluster.spec.kubernetes_version.clone() } else { kubelet },
                node_ready: ready,
                hold: m.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(render::api::HOLD)),
                runs_controller: self.controller_node.as_deref() == Some(name.as_str()),
                static_pods,
                kube_proxy_manifest: manifest,
                address: Some(m.spec.address.clone()),
            };
            snap_machines.push(
                self.cache
                    .machine(
                        &self.classifier,
                        rendered.contract,
                        &mr,
                        running.as_deref(),
                        &rendered.config,
                        &rendered.inputs_hash,
                    )
                    .map_err(|e| ControllerError::Render { machine: name.clone(), problem: e.to_string() })?,
            );
            if let Some(running) = running {
                configs.insert(name, crate::plan::MachineConfigs { running, desired: rendered.config });
            }
        }
        let workload = if rejected.is_some() {
            crate::state::Workload::default()
        } else {
            read_workload(&self.kube, (self.service_answers)().await).await?
        };
        let st = op.status.clone().unwrap_or_default();
        let handover_done = cluster
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "CNIHandover" && c.status == "True"));
        let snapshot = ObservedState {
            now: now.to_string(),
            cluster: Cluster {
                name: cluster_name.clone(),
                kubernetes_version: cluster.spec.kubernetes_version.clone(),
                release_set_kubernetes: self.release_set_kubernetes.clone(),
                cni: Cni {
                    preset: cluster.spec.cni.preset,
                    kube_proxy: cluster.spec.cni.kube_proxy,
                    handover: cluster.spec.cni.handover,
                    handover_done,
                    bootstrap_patch: None,
                    home_kube_proxy_replacement: None,
                },
                status_kube_proxy: cluster.status.as_ref().and_then(|s| s.cni.as_ref()).and_then(|c| c.kube_proxy),
                annotations: cluster.metadata.annotations.clone().unwrap_or_default(),
                cilium_values: cluster.spec.cni.cilium.as_ref().and_then(|c| c.values.clone()),
                cilium_tunnel: None,
            },
            machines: snap_machines,
            workload,
            operation: Operation {
                name: operation.to_string(),
                kind: op.spec.kind,
                target_kubernetes: op.spec.target.kubernetes_version.clone(),
                target_kube_proxy: op.spec.target.kube_proxy,
                max_unavailable: op.spec.max_unavailable.into(),
                phase: st.phase(),
                intent: crate::state::Intent::of(op.metadata.annotations.as_ref(), st.resumed),
                paused_reason: st.paused_reason.clone(),
                machines: st
                    .machines
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            MachineProgress {
                                phase: v.phase,
                                stage: v.stage.clone(),
                                started_at: v.started_at.clone().unwrap_or_else(|| now.to_string()),
                            },
                        )
                    })
                    .collect(),
                waiting_since: st.waiting_since.clone(),
                done: st.done.clone(),
            },
            other_operations: others,
            inputs_rejected: rejected,
        };
        // The snapshot is checked as `ichor plan --state` checks it (typed, no YAML between).
        snapshot
            .check()
            .map_err(|e| ControllerError::Snapshot(e.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("; ")))?;
        Ok(Read { snapshot, configs, resource_version: op.metadata.resource_version.clone() })
    }

    /// A cluster's TalosMachines and TalosConfigPatches.
    async fn cluster_objects(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<(Vec<TalosMachine>, Vec<TalosConfigPatch>), ControllerError> {
        let machines = Api::<TalosMachine>::namespaced(self.kube.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing TalosMachines"))?
            .items
            .into_iter()
            .filter(|m| m.spec.cluster_ref.name == cluster)
            .collect();
        let patches = Api::<TalosConfigPatch>::namespaced(self.kube.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing TalosConfigPatches"))?
            .items
            .into_iter()
            .filter(|p| p.spec.cluster_ref.name == cluster)
            .collect();
        Ok((machines, patches))
    }

    /// The render's inputs, from the same resources `ichor render` reads from files.
    async fn manifests(
        &self,
        namespace: &str,
        cluster: &TalosCluster,
        machines: &[TalosMachine],
        patches: &[TalosConfigPatch],
    ) -> Result<render::manifests::Manifests, ControllerError> {
        let secret_name = cluster.spec.secrets_ref.name.clone();
        let secret = Api::<Secret>::namespaced(self.kube.clone(), namespace)
            .get(&secret_name)
            .await
            .map_err(kube_err(format!("reading Secret {namespace}/{secret_name}")))?;
        // Each object under its own name: errors name it, and no two read as one file.
        let named = |kind: &str, m: &kube_client::core::ObjectMeta| {
            format!("{kind} {}/{}", m.namespace.as_deref().unwrap_or(namespace), m.name.as_deref().unwrap_or(""))
        };
        let mut files = vec![
            yaml(&named("TalosCluster", &cluster.metadata), cluster),
            yaml(&named("Secret", &secret.metadata), &secret),
        ];
        files.extend(machines.iter().map(|m| yaml(&named("TalosMachine", &m.metadata), m)));
        files.extend(patches.iter().map(|p| yaml(&named("TalosConfigPatch", &p.metadata), p)));
        let contracts: Vec<String> = self.classifier.known().iter().map(|c| c.to_string()).collect();
        render::manifests::Manifests::load(&files, &contracts)
            .map_err(|e| ControllerError::Manifests(e.iter().map(|x| x.message.clone()).collect::<Vec<_>>().join("; ")))
    }

    /// The Machine controller's reconcile: the machine's `Ready` condition and hashes, from the
    /// same code as `ichor config diff --manifests` (its render against the node's running
    /// config, classified with the machine's context). An unreachable node is `Unknown`.
    pub async fn reconcile_machine(
        &self,
        namespace: &str,
        machine: &str,
        now: &str,
    ) -> Result<render::api::Condition, ControllerError> {
        let machines_api: Api<TalosMachine> = Api::namespaced(self.kube.clone(), namespace);
        let mch =
            machines_api.get(machine).await.map_err(kube_err(format!("reading TalosMachine {namespace}/{machine}")))?;
        let cluster_name = mch.spec.cluster_ref.name.clone();
        let cluster = Api::<TalosCluster>::namespaced(self.kube.clone(), namespace)
            .get(&cluster_name)
            .await
            .map_err(kube_err(format!("reading TalosCluster {namespace}/{cluster_name}")))?;
        let (machines, patches) = self.cluster_objects(namespace, &cluster_name).await?;
        let manifests = self.manifests(namespace, &cluster, &machines, &patches).await?;
        // What the rules judge: the render against the node's running config, or, when either
        // cannot be had, the failure itself. The reason and message are the rules' alone
        // (rules/machine.rules), as for `ichor config diff --manifests`.
        let mch_in = manifests
            .machine(machine)
            .map_err(|e| ControllerError::Render { machine: machine.into(), problem: e.to_string() })?;
        let classify =
            |contract, changes: &[render::diff::Change], desired, mctx: &render::classify::MachineContext| {
                self.classifier
                    .classify_machine(contract, changes, desired, Some(mctx), false)
                    .map_err(|e| ControllerError::Render { machine: machine.into(), problem: e.to_string() })
            };
        let (outcome, hash) = match render::machine::render_checked(&manifests, machine, None, &self.classifier) {
            Err(e) => {
                let contract = self
                    .classifier
                    .contract(&manifests.cluster_of(mch_in).spec.version_contract)
                    .map_err(|e| ControllerError::Render { machine: machine.into(), problem: e.to_string() })?;
                let mctx = render::machine::rejected_context(&manifests, mch_in, render_problem(&e));
                (classify(contract, &[], None, &mctx)?, None)
            }
            Ok(rendered) => {
                let mut mctx = render::machine::context(&manifests, mch_in, &rendered);
                let changes = match self.talos.running_config(&mch.spec.address).await {
                    Err(e) => {
                        mctx.node_unreachable = Some(e.to_string());
                        vec![]
                    }
                    Ok(text) => render::diff::changes(&Config::parse(&text).unwrap_or_default(), &rendered.config),
                };
                (
                    classify(rendered.contract, &changes, Some(&rendered.config), &mctx)?,
                    Some(rendered.inputs_hash.clone()),
                )
            }
        };
        let v = outcome.machine.unwrap_or_default();
        let condition = render::api::Condition {
            type_: "Ready".into(),
            status: v.status,
            reason: v.reason,
            message: v.message,
            last_transition_time: Some(now.into()),
        };
        let reboot_paths = v.reboot_paths;
        // The transition time moves only when the status does.
        let previous = mch.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
        let mut condition = condition;
        if let Some(p) = previous.filter(|p| p.status == condition.status && p.reason == condition.reason) {
            condition.last_transition_time = p.last_transition_time;
        }
        let converged = condition.status == "True";
        let applied =
            if converged { hash.clone() } else { mch.status.as_ref().and_then(|s| s.applied_inputs_hash.clone()) };
        let status = json!({"status": {
            "conditions": [condition],
            "rebootPaths": reboot_paths,
            "desiredInputsHash": hash,
            "appliedInputsHash": applied,
        }});
        // An unchanged status is not written again: each write is a watch event, which would
        // start this reconcile again.
        // Compared as typed statuses: `rebootPaths: []` and no `rebootPaths` are the same status
        // (the API keeps the empty list it was sent; the type does not serialize it), so a
        // converged machine is not written again on every reconcile.
        let current = mch.status.clone().unwrap_or_default();
        let mut next = serde_json::to_value(&current).unwrap_or_default();
        crate::kube::merge_patch(&mut next, &status["status"]);
        if serde_json::from_value::<render::api::TalosMachineStatus>(next).ok().as_ref() == Some(&current) {
            return Ok(condition);
        }
        machines_api
            .patch_status(machine, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(kube_err(format!("writing the status of TalosMachine {namespace}/{machine}")))?;
        Ok(condition)
    }

    /// One reconcile: read, plan, execute, write status (re-read and re-planned on a conflict).
    pub async fn reconcile(&self, namespace: &str, operation: &str, now: &str) -> Result<Reconciled, ControllerError> {
        let mut attempt = 0;
        loop {
            // A render that fails is a fact of the snapshot (`inputsRejected`): the rules pause
            // the operation, unless it has ended, and nothing else is done.
            let read = self.read(namespace, operation, now).await?;
            // The plan is complete: each apply carries the config to send and the hash of the
            // running config it was planned from; the executor gets nothing else.
            let plan = self.planner.plan_complete(&read.snapshot, &read.configs)?;
            let mut kube =
                KubeCluster { client: self.kube.clone(), talos: self.talos.clone(), drain_timeout: self.drain_timeout };
            let mut exec = Executor { talos: &self.talos, kube: &mut kube };
            let outcome = exec.run(&plan).await;
            // A precondition that no longer held: the plan was stale. Nothing of it is recorded
            // (as after a crash before the status write); the next reconcile plans again.
            if outcome.refused() {
                return Ok(Reconciled { snapshot: read.snapshot.clone(), plan, outcome, status: read.snapshot });
            }
            let after = crate::status::record(&read.snapshot, &plan, &outcome.failed());
            match self.write_status(namespace, operation, &read, &after).await {
                Ok(()) => return Ok(Reconciled { snapshot: read.snapshot, plan, outcome, status: after }),
                Err(ControllerError::Kube { source: kube_client::Error::Api(s), .. })
                    if s.code == 409 && attempt < 3 =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn write_status(
        &self,
        namespace: &str,
        operation: &str,
        read: &Read,
        after: &ObservedState,
    ) -> Result<(), ControllerError> {
        let op = &after.operation;
        // A status that does not change is not written: each write is a watch event that would
        // start this reconcile again.
        if *op == read.snapshot.operation && after.cluster.status_kube_proxy == read.snapshot.cluster.status_kube_proxy
        {
            return Ok(());
        }
        let machines: serde_json::Map<String, serde_json::Value> = op
            .machines
            .iter()
            .map(|(k, v)| (k.clone(), json!({"phase": v.phase, "stage": v.stage, "startedAt": v.started_at})))
            .collect();
        // A merge patch only removes a key sent as null: a cleared clock is sent so.
        let mut clocks: serde_json::Map<String, serde_json::Value> =
            read.snapshot.operation.waiting_since.keys().map(|k| (k.clone(), serde_json::Value::Null)).collect();
        for (k, v) in &op.waiting_since {
            clocks.insert(k.clone(), json!(v));
        }
        let status = json!({
            "metadata": {"resourceVersion": read.resource_version},
            "status": {
                "phase": op.phase,
                "pausedReason": op.paused_reason,
                "machines": machines,
                "waitingSince": clocks,
                "done": op.done,
                "resumed": (op.intent.resumed > 0).then_some(op.intent.resumed),
            }
        });
        let ops: Api<TalosOperation> = Api::namespaced(self.kube.clone(), namespace);
        ops.patch_status(operation, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(kube_err(format!("writing the status of TalosOperation {namespace}/{operation}")))?;
        if after.cluster.status_kube_proxy != read.snapshot.cluster.status_kube_proxy {
            let clusters: Api<TalosCluster> = Api::namespaced(self.kube.clone(), namespace);
            let mode = after.cluster.status_kube_proxy.map(|m| m.name());
            clusters
                .patch_status(
                    &after.cluster.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"cni": {"kubeProxy": mode}}})),
                )
                .await
                .map_err(kube_err(format!("writing the status of TalosCluster {namespace}/{}", after.cluster.name)))?;
        }
        Ok(())
    }
}
