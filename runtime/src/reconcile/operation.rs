//! The operation loop: one reconcile of a TalosOperation. `observe` (I/O, plain data out: the
//! operation's neighbours, the cluster's machines, patches and secrets, the Nodes, kube-system's
//! pods, every node's Talos, the workload, the health checks) → `assemble::assemble` (pure: the
//! snapshot `ichor plan --state` decides on) → `plan::Planner::plan_complete` (the rules) → the
//! executor → `status::record`, written by `write_status` (typed: `status::operation_status`
//! and `status::cluster_cni`). Each reconcile re-derives everything from what it reads, so a
//! crash anywhere resumes.
//!
//! Start at `Controller::reconcile`; `Controller::read` is observe and assemble. Status writes
//! carry the resourceVersion read; a conflict re-reads and re-plans.

use crate::assemble::{Observation, Read, Settings, TalosRead};
use crate::controller::{Controller, ControllerError, Reconciled, STATUS_ATTEMPTS, kube_err, listed};
use crate::exec::Executor;
use crate::kube::read_workload;
use crate::state::ObservedState;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube_client::api::Api;
use render::api::{TalosCluster, TalosOperation};

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
        let mut read = self.read_operation(namespace, &op, &cluster, now).await?;
        // What would refuse a drain now: the rules hold a machine's step before its cordon
        // while a budget refuses (`drain_blocked`; which operations drain is theirs to say).
        let ended = op.status.as_ref().is_some_and(|s| s.phase().is_terminal());
        if !ended {
            let mut by_node = crate::kube::read_drain_refusals(&self.kube).await?;
            for m in &mut read.snapshot.machines {
                m.drain_refusals = by_node.remove(&m.name).unwrap_or_default();
            }
        }
        Ok(read)
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
        let observation = self.observe(namespace, op, cluster).await?;
        Ok(crate::assemble::assemble(&observation, now, &self.settings())?)
    }

    /// What the assembly needs of this controller.
    pub fn settings(&self) -> Settings<'_> {
        Settings {
            classifier: &self.classifier,
            renders: &self.renders,
            pending: &self.cache,
            release_set_kubernetes: &self.release_set_kubernetes,
            release_set_talos: &self.release_set_talos,
            controller_node: self.controller_node.as_deref(),
            drain_deadline_secs: Some(self.drain_timeout.as_secs()),
        }
    }

    /// The I/O of one reconcile, as plain data: the operation's neighbours, the cluster's
    /// machines, patches and secrets, the Nodes (listed once), kube-system's pods, every node's
    /// Talos at once (bounded, each under its own deadline: an unreachable one is absent and
    /// the others are observed), and the workload.
    pub async fn observe(
        &self,
        namespace: &str,
        op: &TalosOperation,
        cluster: &TalosCluster,
    ) -> Result<Observation, ControllerError> {
        let cluster_name = op.spec.cluster_ref.name.clone();
        let stores = self.stores.get();
        let operations = self.operations(namespace).await?;
        let (machines, patches) = self.cluster_shared(namespace, &cluster_name).await?;
        let secret = self.secret(namespace, cluster).await?;
        // Loaded once per change of these objects (shared with the machine controller); objects
        // that do not load are the assembly's to report (`inputsRejected`).
        let loaded = self.cluster_manifests(cluster, machines.clone(), patches.clone(), secret.clone()).ok();
        let nodes = match stores {
            Some(s) => crate::stores::shared(&s.nodes, |_| true),
            None => listed(Api::<Node>::all(self.kube.clone()), "listing Nodes").await?,
        };
        let kube_system_pods = match stores {
            Some(s) => crate::stores::shared(&s.kube_system_pods, |_| true),
            None => {
                listed(Api::<Pod>::namespaced(self.kube.clone(), "kube-system"), "listing kube-system pods").await?
            }
        };
        let addresses: Vec<String> = machines.iter().map(|m| m.spec.address.clone()).collect();
        let observed = self.observations.observe_fleet(&self.talos, &addresses, 16).await;
        let talos = machines
            .iter()
            .zip(observed)
            .filter_map(|(m, o)| match o {
                crate::talos::observe::Observed::Known(o) => Some((
                    m.metadata.name.clone().unwrap_or_default(),
                    TalosRead {
                        talos_version: o.talos_version.clone(),
                        running_config: o.running_config.clone(),
                        manifests: o.manifests.clone(),
                        boot_id: o.boot_id.clone(),
                        unhealthy_services: o
                            .services
                            .iter()
                            .filter(|(_, (running, healthy))| !(*running && *healthy))
                            .map(|(s, _)| s.clone())
                            .collect(),
                    },
                )),
                crate::talos::observe::Observed::Unknown { .. } => None,
            })
            .collect();
        let operation = op.metadata.name.clone().unwrap_or_default();
        let workload = read_workload(&self.kube, (self.service_answers)().await, &operation).await?;
        // The checks gate steps: read only while the operation may still take one.
        let ended = op.status.as_ref().is_some_and(|s| s.phase().is_terminal());
        let health =
            if ended { vec![] } else { crate::kube::read_health(&self.kube, &cluster.spec.health_checks).await };
        Ok(Observation {
            operation: op.clone(),
            cluster: cluster.clone(),
            operations,
            machines,
            patches,
            secret,
            loaded,
            nodes,
            kube_system_pods,
            talos,
            workload,
            health,
        })
    }

    /// One reconcile: read, plan, execute, write status (re-read and re-planned on a conflict).
    pub async fn reconcile(&self, namespace: &str, operation: &str, now: &str) -> Result<Reconciled, ControllerError> {
        {
            // A render that fails is a fact of the snapshot (`inputsRejected`): the rules pause
            // the operation, unless it has ended, and nothing else is done.
            let started = std::time::Instant::now();
            let read = self.read(namespace, operation, now).await?;
            // The plan is complete: each apply carries the config to send and the hash of the
            // running config it was planned from; the executor gets nothing else.
            let plan = self.planner.plan_complete(&read.snapshot, &read.configs)?;
            let decided_in = started.elapsed();
            let mut kube = self.kube_port(namespace, Some(operation));
            let mut exec = Executor { talos: &self.talos, kube: &mut kube };
            let outcome = exec.run(&plan).await;
            // A precondition that no longer held: the plan was stale. Nothing of it is recorded
            // (as after a crash before the status write); the next reconcile plans again.
            if outcome.refused() {
                return Ok(Reconciled {
                    snapshot: read.snapshot.clone(),
                    plan,
                    outcome,
                    status: read.snapshot,
                    decided_in,
                });
            }
            let after = crate::status::record(
                &read.snapshot,
                &plan,
                outcome.actions.len(),
                &outcome.failed(),
                outcome.forbidden(),
            );
            self.write_status_until_written(namespace, operation, &read, &after).await?;
            Ok(Reconciled { snapshot: read.snapshot, plan, outcome, status: after, decided_in })
        }
    }

    /// The record of what this reconcile performed, written before anything else is done (issue
    /// 50, finding 10: a status write that met a 409 or a 500 lost the steps already performed,
    /// and the next plan, finding the nodes done, never recorded them). On a conflict (the
    /// object moved, as a user's abort or resume annotation moves it) the same record is written
    /// on the object's new resourceVersion; on a transient answer, after a pause. Nothing is
    /// planned or performed again in between; only another kind of error, or
    /// `STATUS_ATTEMPTS` failures in a row, ends the reconcile (its error is retried).
    async fn write_status_until_written(
        &self,
        namespace: &str,
        operation: &str,
        read: &crate::assemble::Read,
        after: &ObservedState,
    ) -> Result<(), ControllerError> {
        let ops: Api<TalosOperation> = Api::namespaced(self.kube.clone(), namespace);
        let mut resource_version = read.resource_version.clone();
        let mut delay = std::time::Duration::from_millis(50);
        let mut attempt = 1;
        loop {
            match self.write_status(namespace, operation, read, resource_version.as_deref(), after).await {
                Err(ControllerError::Kube { source, .. })
                    if attempt < STATUS_ATTEMPTS && crate::kube::transient(&source) =>
                {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(1));
                    attempt += 1;
                    if matches!(&source, kube_client::Error::Api(s) if s.code == 409)
                        && let Ok(o) = ops.get(operation).await
                    {
                        resource_version = o.metadata.resource_version;
                    }
                }
                r => return r,
            }
        }
    }

    /// The operation's status, and its two fields of the cluster's, as `after` holds them
    /// (typed: `status::operation_status` and `status::cluster_cni`, each a merge patch from the
    /// status read; nothing is sent for a status that does not change).
    async fn write_status(
        &self,
        namespace: &str,
        operation: &str,
        read: &crate::assemble::Read,
        resource_version: Option<&str>,
        after: &ObservedState,
    ) -> Result<(), ControllerError> {
        use crate::kube::{managers, write_status};
        let (op_read, cluster_read) = &read.statuses;
        let ops: Api<TalosOperation> = Api::namespaced(self.kube.clone(), namespace);
        let next = crate::status::operation_status(&after.operation, op_read);
        write_status(&ops, operation, op_read, &next, resource_version, managers::OPERATIONS)
            .await
            .map_err(kube_err(format!("writing the status of TalosOperation {namespace}/{operation}")))?;
        let clusters: Api<TalosCluster> = Api::namespaced(self.kube.clone(), namespace);
        let next = crate::status::cluster_cni(&after.cluster, cluster_read);
        write_status(&clusters, &after.cluster.name, cluster_read, &next, None, managers::OPERATIONS)
            .await
            .map_err(kube_err(format!("writing the status of TalosCluster {namespace}/{}", after.cluster.name)))?;
        Ok(())
    }
}
