//! The controller's reconcile of one TalosOperation (feature `io`): observe what it needs from
//! Kubernetes and Talos, assemble the snapshot, plan with the rules, execute, write status.
//! Each reconcile re-derives everything from what it reads, so a crash anywhere resumes.
//!
//! Start at `Controller::reconcile`. `Controller::observe` is the I/O alone (plain data out);
//! `assemble::assemble` the pure step from it to the snapshot `ichor plan --state` decides on
//! (dump it to reproduce a decision); `Controller::read` is the two. Status writes carry the
//! resourceVersion read; a conflict re-reads and re-plans.

pub use crate::assemble::Read;
use crate::assemble::{AssembleError, Observation, PendingCache, RenderCache, Settings, TalosRead};
use crate::exec::{Executor, Outcome};
use crate::kube::{KubeCluster, read_workload};
use crate::plan::{Plan, Planner};
use crate::state::ObservedState;
use crate::talos::client::Client as Talos;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube_client::api::{Api, ListParams};
use render::api::{TalosCluster, TalosConfigPatch, TalosMachine, TalosOperation};
use render::classify::Classifier;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube_client::Error,
    },
    #[error("the custom resources do not load: {}", problems.iter().map(|p| p.message.clone()).collect::<Vec<_>>().join("; "))]
    Manifests { problems: Vec<render::manifests::ManifestError> },
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Workload(#[from] crate::kube::KubeError),
    #[error(transparent)]
    Handover(#[from] crate::handover::HandoverError),
    #[error(transparent)]
    Machine(#[from] crate::reconcile::machine::MachineLoopError),
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube_client::Error) -> ControllerError {
    let what = what.into();
    move |source| ControllerError::Kube { what, source }
}

/// How many times a reconcile tries to write the record of what it performed: ten tries with
/// pauses of 50 ms doubling to 1 s (about 6 s) outlast a fault rate of 30 % per request
/// (0.3^10: one in 170,000) and a user's annotation written at the same moment.
pub const STATUS_ATTEMPTS: u32 = 10;

/// The controller's probe of the kubernetes Service: async, bounded by its own timeout, so a
/// reconcile never blocks a runtime thread on a TCP connect.
/// It says whether the Service answered and where it was probed (`10.96.0.1:443, from
/// KUBERNETES_SERVICE_HOST`), which the wait's message names.
pub type ServiceProbe = std::pin::Pin<Box<dyn std::future::Future<Output = ProbeResult> + Send>>;

/// What one probe of the kubernetes Service found (`state::ProbeResult`).
pub use crate::state::ProbeResult;

/// What one reconcile saw, decided and did.
#[derive(Debug)]
pub struct Reconciled {
    pub snapshot: ObservedState,
    pub plan: Plan,
    pub outcome: Outcome,
    /// The status written.
    pub status: ObservedState,
    /// How long reading (from the caches, the three GETs, Talos where nothing is kept),
    /// assembling and planning took: the deciding part, without executing or writing.
    pub decided_in: std::time::Duration,
}

/// Every object `api` lists, shared like the caches' (the reads when there are no caches).
async fn listed<K>(api: Api<K>, what: &'static str) -> Result<Vec<Arc<K>>, ControllerError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api.list(&ListParams::default()).await.map_err(kube_err(what))?.items.into_iter().map(Arc::new).collect())
}

/// A cluster's loaded objects as `Controller::cluster_loaded` keeps them.
struct LoadedAt {
    epoch: u64,
    /// The cluster's and the secret's (uid, resourceVersion).
    versions: [(String, String); 2],
    loaded: Arc<render::manifests::Manifests>,
}

pub struct Controller {
    pub kube: kube_client::Client,
    pub talos: Talos,
    pub planner: Planner,
    pub classifier: Classifier,
    /// The release set's Kubernetes this Ichor ships (ADR 0113).
    pub release_set_kubernetes: String,
    /// The release set's Talos this Ichor ships (`ichor upgrade cluster` moves a cluster to it).
    pub release_set_talos: String,
    /// The node the controller runs on (it goes last).
    pub controller_node: Option<String>,
    /// The controller's probe of the kubernetes Service.
    pub service_answers: Arc<dyn Fn() -> ServiceProbe + Send + Sync>,
    pub drain_timeout: Duration,
    /// Classifications kept between reconciles (a machine is classified again only when its
    /// running config or its render's inputs change).
    pub cache: PendingCache,
    /// Renders kept between reconciles, shared by the operation and machine controllers.
    pub renders: RenderCache,
    /// The watches' caches the lists are read from, once `serve::run` started them; without
    /// them (the CLI's preview) each read is a LIST.
    pub stores: std::sync::OnceLock<crate::stores::Stores>,
    /// Each cluster's loaded custom resources, kept while their specs are unchanged: a machine
    /// reconcile loads its cluster once per change, not once per machine.
    manifests: std::sync::Mutex<std::collections::HashMap<String, (u64, Arc<render::manifests::Manifests>)>>,
    /// The same by the caches' epoch (`Stores::epoch`) and the cluster's and secret's versions:
    /// while no machine or patch changed, a machine reconcile neither reads nor hashes them all.
    loaded_at: std::sync::Mutex<std::collections::HashMap<String, LoadedAt>>,
    /// Talos observations kept between reconciles (see `talos::observe::ObservationCache`).
    pub observations: crate::talos::observe::ObservationCache,
    /// The machine controller's verdicts kept between resyncs.
    verdicts: crate::assemble::VerdictCache,
    /// Lock the namespace down with CiliumNetworkPolicies once Cilium is ready (runtime::netpol),
    /// with the CIDRs metrics may be scraped from; `None`: off (`--no-network-policies`).
    pub lockdown: Option<Vec<String>>,
}

/// What one machine reconcile found and did (`reconcile::machine`).
pub use crate::reconcile::machine::MachineReconciled;

impl Controller {
    /// A controller of these clients, planner and classifier, with the defaults of a real
    /// installation: this Ichor's release set, not told which node it runs on, the kubernetes
    /// Service taken as answering (give a probe with `with_service_probe`), a 300 s drain, and
    /// empty caches.
    pub fn new(kube: kube_client::Client, talos: Talos, planner: Planner, classifier: Classifier) -> Controller {
        Controller {
            kube,
            talos,
            planner,
            classifier,
            release_set_kubernetes: render::embedded::RELEASE_SET_KUBERNETES.to_string(),
            release_set_talos: render::embedded::RELEASE_SET_TALOS.to_string(),
            controller_node: None,
            service_answers: Arc::new(|| {
                Box::pin(async {
                    ProbeResult { answers: true, target: "nowhere (a controller without a probe)".into() }
                })
            }),
            drain_timeout: Duration::from_secs(300),
            cache: PendingCache::default(),
            renders: RenderCache::default(),
            stores: std::sync::OnceLock::new(),
            manifests: Default::default(),
            loaded_at: Default::default(),
            observations: Default::default(),
            verdicts: Default::default(),
            lockdown: None,
        }
    }

    /// Locks the namespace down once Cilium is ready, metrics open to `metrics_from` (CIDRs
    /// checked by `netpol::cidr`).
    pub fn with_lockdown(mut self, metrics_from: Vec<String>) -> Controller {
        self.lockdown = Some(metrics_from);
        self
    }

    /// What the namespace's lockdown is made from now (its TalosMachines' addresses among
    /// them), when it is on.
    pub(crate) async fn lockdown_of(
        &self,
        namespace: &str,
    ) -> Result<Option<crate::netpol::Lockdown>, ControllerError> {
        let Some(metrics_from) = &self.lockdown else { return Ok(None) };
        let machines = match self.stores.get() {
            Some(s) => crate::stores::items(&s.machines, |m| m.metadata.namespace.as_deref() == Some(namespace)),
            None => {
                Api::<TalosMachine>::namespaced(self.kube.clone(), namespace)
                    .list(&ListParams::default())
                    .await
                    .map_err(kube_err(format!("listing TalosMachines in {namespace}")))?
                    .items
            }
        };
        Ok(Some(crate::netpol::Lockdown {
            namespace: namespace.to_string(),
            metrics_from: metrics_from.clone(),
            talos_nodes: crate::netpol::talos_nodes(machines.iter().map(|m| m.spec.address.as_str())),
        }))
    }

    /// The release set's Kubernetes (ADR 0113), when not this Ichor's.
    pub fn with_release_set(mut self, kubernetes: &str) -> Controller {
        self.release_set_kubernetes = kubernetes.to_string();
        self
    }

    /// The release set's Talos, when not this Ichor's.
    pub fn with_release_set_talos(mut self, talos: &str) -> Controller {
        self.release_set_talos = talos.to_string();
        self
    }

    /// The release set this controller moves clusters to, as its Lease states it
    /// (`kube::RELEASE_SET_ANNOTATION`).
    pub fn release_set_words(&self) -> String {
        format!(
            "talos={},kubernetes={},cilium={}",
            self.release_set_talos,
            self.release_set_kubernetes,
            render::embedded::CILIUM_CHART_VERSION
        )
    }

    /// The node the controller runs on (it goes last).
    pub fn with_controller_node(mut self, node: Option<String>) -> Controller {
        self.controller_node = node;
        self
    }

    /// The probe of the kubernetes Service.
    pub fn with_service_probe(mut self, probe: Arc<dyn Fn() -> ServiceProbe + Send + Sync>) -> Controller {
        self.service_answers = probe;
        self
    }

    /// How long a drain waits for each eviction.
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Controller {
        self.drain_timeout = timeout;
        self
    }

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

    /// The namespace's TalosOperations.
    pub(crate) async fn operations(&self, namespace: &str) -> Result<Vec<TalosOperation>, ControllerError> {
        if let Some(s) = self.stores.get() {
            return Ok(crate::stores::items(&s.operations, |o| o.metadata.namespace.as_deref() == Some(namespace)));
        }
        self.operations_fresh(namespace).await
    }

    /// The namespace's TalosOperations, listed from the API server (not the watch's cache).
    pub(crate) async fn operations_fresh(&self, namespace: &str) -> Result<Vec<TalosOperation>, ControllerError> {
        Ok(Api::<TalosOperation>::namespaced(self.kube.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube_err(format!("listing TalosOperations in {namespace}")))?
            .items)
    }

    /// The cluster's TalosMachines and TalosConfigPatches, shared: from the stores without a
    /// copy (listed when there are no stores).
    async fn cluster_shared(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<(Vec<Arc<TalosMachine>>, Vec<Arc<TalosConfigPatch>>), ControllerError> {
        let ours = |ns: &Option<String>| ns.as_deref() == Some(namespace);
        if let Some(s) = self.stores.get() {
            return Ok((
                crate::stores::shared(&s.machines, |m| {
                    ours(&m.metadata.namespace) && m.spec.cluster_ref.name == cluster
                }),
                crate::stores::shared(&s.patches, |p| {
                    ours(&p.metadata.namespace) && p.spec.cluster_ref.name == cluster
                }),
            ));
        }
        let machines = Api::<TalosMachine>::namespaced(self.kube.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing TalosMachines"))?
            .items
            .into_iter()
            .filter(|m| m.spec.cluster_ref.name == cluster)
            .map(Arc::new)
            .collect();
        let patches = Api::<TalosConfigPatch>::namespaced(self.kube.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing TalosConfigPatches"))?
            .items
            .into_iter()
            .filter(|p| p.spec.cluster_ref.name == cluster)
            .map(Arc::new)
            .collect();
        Ok((machines, patches))
    }

    /// The cluster's custom resources loaded, or those kept from a reconcile that read the same
    /// cluster (resourceVersion), patches (resourceVersions), machines (generations, labels,
    /// annotations) and secret (resourceVersion). A machine's status is not part of the load: the caller
    /// judges with the machine it read.
    fn cluster_manifests(
        &self,
        cluster: &TalosCluster,
        machines: Vec<Arc<TalosMachine>>,
        patches: Vec<Arc<TalosConfigPatch>>,
        secret: Secret,
    ) -> Result<Arc<render::manifests::Manifests>, ControllerError> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let rv = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            (m.name.clone(), m.uid.clone(), m.resource_version.clone())
        };
        (rv(&cluster.metadata), rv(&secret.metadata)).hash(&mut h);
        for p in &patches {
            rv(&p.metadata).hash(&mut h);
        }
        // A machine's spec moves its generation; its labels and annotations (what patches
        // select by, the hold) do not, so they are part of the key too.
        for m in &machines {
            let md = &m.metadata;
            (&md.name, &md.uid, md.generation, &md.labels, &md.annotations).hash(&mut h);
        }
        let key = h.finish();
        let name = format!(
            "{}/{}",
            cluster.metadata.namespace.as_deref().unwrap_or_default(),
            cluster.metadata.name.as_deref().unwrap_or_default()
        );
        if let Some((k, m)) = self.manifests.lock().unwrap_or_else(|e| e.into_inner()).get(&name)
            && *k == key
        {
            return Ok(m.clone());
        }
        let contracts: Vec<String> = self.classifier.known().iter().map(|c| c.to_string()).collect();
        let loaded = Arc::new(
            render::manifests::Manifests::from_objects(
                vec![cluster.clone()],
                machines.iter().map(|m| (**m).clone()).collect(),
                patches.iter().map(|p| (**p).clone()).collect(),
                std::slice::from_ref(&secret),
                &contracts,
            )
            .map_err(|problems| ControllerError::Manifests { problems })?,
        );
        self.manifests.lock().unwrap_or_else(|e| e.into_inner()).insert(name, (key, loaded.clone()));
        Ok(loaded)
    }

    /// `cluster_manifests` of the cluster's objects as the caches hold them, taken as kept while
    /// the caches heard of no machine or patch change since (their epoch) and the cluster and
    /// secret are the same versions: an idle machine reconcile costs the same at any fleet size.
    pub(crate) async fn cluster_loaded(
        &self,
        namespace: &str,
        cluster: &TalosCluster,
        secret: Secret,
    ) -> Result<Arc<render::manifests::Manifests>, ControllerError> {
        let name = format!("{namespace}/{}", cluster.metadata.name.as_deref().unwrap_or_default());
        let version = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            (m.uid.clone().unwrap_or_default(), m.resource_version.clone().unwrap_or_default())
        };
        let versions = [version(&cluster.metadata), version(&secret.metadata)];
        // Read before the objects: a change heard meanwhile makes the next reconcile load again.
        let epoch = self.stores.get().map(|s| s.epoch());
        if let Some(epoch) = epoch
            && let Some(kept) = self.loaded_at.lock().unwrap_or_else(|e| e.into_inner()).get(&name)
            && kept.epoch == epoch
            && kept.versions == versions
        {
            return Ok(kept.loaded.clone());
        }
        let (machines, patches) =
            self.cluster_shared(namespace, cluster.metadata.name.as_deref().unwrap_or_default()).await?;
        let loaded = self.cluster_manifests(cluster, machines, patches, secret)?;
        if let Some(epoch) = epoch {
            let kept = LoadedAt { epoch, versions, loaded: loaded.clone() };
            self.loaded_at.lock().unwrap_or_else(|e| e.into_inner()).insert(name, kept);
        }
        Ok(loaded)
    }

    /// The Secret with the cluster's Talos secrets bundle.
    pub(crate) async fn secret(&self, namespace: &str, cluster: &TalosCluster) -> Result<Secret, ControllerError> {
        let name = &cluster.spec.secrets_ref.name;
        Api::<Secret>::namespaced(self.kube.clone(), namespace)
            .get(name)
            .await
            .map_err(kube_err(format!("reading Secret {namespace}/{name}")))
    }

    /// The machine loop's reconcile of one TalosMachine (`reconcile::machine::reconcile`): its
    /// `Ready` condition and hashes, from the same code as `ichor config diff --manifests`, and
    /// the live applies the rules give (`apply_live`, rules/machine.rules).
    pub async fn reconcile_machine(
        &self,
        namespace: &str,
        machine: &str,
        now: &str,
    ) -> Result<MachineReconciled, ControllerError> {
        crate::reconcile::machine::reconcile(self, namespace, machine, now).await
    }

    /// The machine controller's verdicts kept between resyncs.
    pub(crate) fn verdicts(&self) -> &crate::assemble::VerdictCache {
        &self.verdicts
    }

    /// The executor's Kubernetes side, in `namespace`, for `operation` (none: a loop of no
    /// operation).
    pub(crate) fn kube_port(&self, namespace: &str, operation: Option<&str>) -> KubeCluster {
        KubeCluster {
            client: self.kube.clone(),
            talos: self.talos.clone(),
            drain_timeout: self.drain_timeout,
            operation: operation.map(str::to_string),
            namespace: namespace.to_string(),
        }
    }

    /// The TalosMachine `namespace/name`.
    pub(crate) async fn machine(&self, namespace: &str, name: &str) -> Result<TalosMachine, ControllerError> {
        Api::<TalosMachine>::namespaced(self.kube.clone(), namespace)
            .get(name)
            .await
            .map_err(kube_err(format!("reading TalosMachine {namespace}/{name}")))
    }

    /// The TalosCluster `namespace/name`.
    pub(crate) async fn cluster(&self, namespace: &str, name: &str) -> Result<TalosCluster, ControllerError> {
        Api::<TalosCluster>::namespaced(self.kube.clone(), namespace)
            .get(name)
            .await
            .map_err(kube_err(format!("reading TalosCluster {namespace}/{name}")))
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
