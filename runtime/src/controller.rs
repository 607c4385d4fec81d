//! The controller (feature `io`): what its three loops share (`reconcile::operation`,
//! `reconcile::machine`, `reconcile::cluster`): the Kubernetes and Talos clients, the planner
//! and classifier, the caches kept between reconciles, and the reads of a cluster's objects
//! (from the watches' caches once `serve::run` started them, else listed).
//!
//! Start at `Controller` (its fields say what is kept and why), then `cluster_loaded` (a
//! cluster's custom resources loaded once per change of them).

pub use crate::assemble::Read;
use crate::assemble::{AssembleError, PendingCache, RenderCache};
use crate::exec::Outcome;
use crate::kube::KubeCluster;
use crate::plan::{Plan, Planner};
use crate::state::ObservedState;
use crate::talos::client::Client as Talos;
use k8s_openapi::api::core::v1::Secret;
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
    /// A loop's own step failed (its assemble or decision: `reconcile::machine`).
    #[error(transparent)]
    Loop(Box<dyn std::error::Error + Send + Sync>),
}

pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube_client::Error) -> ControllerError {
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
pub(crate) async fn listed<K>(api: Api<K>, what: &'static str) -> Result<Vec<Arc<K>>, ControllerError>
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
    pub(crate) async fn cluster_shared(
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
    pub(crate) fn cluster_manifests(
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
}
