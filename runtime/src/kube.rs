//! The executor's Kubernetes side through kube-rs (feature `io`): `KubeCluster` implements
//! `exec::KubePort` against any `kube_client::Client` (a real cluster, or `kubeapi::Api`).
//!
//! Start at `KubeCluster`. Cordon and uncordon patch `spec.unschedulable`; a drain evicts the
//! node's pods through the Eviction API (PodDisruptionBudgets respected, DaemonSet and mirror
//! pods left), retrying a refused eviction until its deadline, then failing with the pod and
//! the budget; the bootstrap-manifest sync and the kube-proxy restore server-side-apply the
//! objects Talos rendered on the named control plane (read through the Talos client) under
//! Talos's field manager; deletions carry the object's UID as a precondition; the Cilium Job is
//! created once under its values' hash (an existing one is left as it is).

use crate::exec::KubePort;
use crate::plan::ObjectRef;
use crate::talos::client::Client as Talos;
use kube_client::api::{
    Api, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy,
};
use kube_client::core::{ApiResource, GroupVersionKind};
use serde_json::{Value as Json, json};
use std::time::Duration;

/// Talos's bootstrap-manifest inventory (a ConfigMap in kube-system) and the annotation that
/// ties an object to it.
pub const INVENTORY: &str = "talos-bootstrap-manifests-inventory";
pub const OWNING_INVENTORY: &str = "config.k8s.io/owning-inventory";

/// An object's inventory key, as cli-utils writes it: `<namespace>_<name>_<group>_<kind>`.
pub fn inventory_key(o: &Json) -> String {
    let s = |p: &str| o.pointer(p).and_then(|v| v.as_str()).unwrap_or("").to_string();
    let api_version = s("/apiVersion");
    let group = api_version.split_once('/').map(|(g, _)| g.to_string()).unwrap_or_default();
    format!("{}_{}_{}_{}", s("/metadata/namespace"), s("/metadata/name"), group, s("/kind"))
}

/// The namespace and ServiceAccount of the Cilium Job (it holds the rights Helm needs, which
/// the controller does not).
pub const JOB_NAMESPACE: &str = "kube-system";
pub const JOB_SERVICE_ACCOUNT: &str = "ichor-cni";
/// The environment variable that carries the user's layer of Cilium values (JSON) to the Job.
pub const JOB_VALUES_ENV: &str = "ICHOR_CILIUM_VALUES";
/// The image of the Cilium Job (Ichor's own, carrying the embedded chart).
pub const JOB_IMAGE: &str = "ghcr.io/maesh/ichor:v0.1.0";

/// The annotation on the controller's Lease that names the node its holder runs on.
pub const LEASE_NODE_ANNOTATION: &str = "ichor.maesh.dev/node";

/// On the controller's Lease: the release set the acting controller moves clusters to
/// (`talos=vX.Y.Z,kubernetes=vX.Y.Z,cilium=X.Y.Z`), what `ichor upgrade cluster` targets.
pub const RELEASE_SET_ANNOTATION: &str = "ichor.maesh.dev/release-set";

/// The release set the Lease names (`RELEASE_SET_ANNOTATION`), when its holder wrote one.
pub fn lease_release_set(lease: &k8s_openapi::api::coordination::v1::Lease) -> Option<crate::plan::ReleaseSet> {
    let words = lease.metadata.annotations.as_ref()?.get(RELEASE_SET_ANNOTATION)?;
    let mut set = crate::plan::ReleaseSet { talos: String::new(), kubernetes: String::new(), cilium: String::new() };
    for part in words.split(',') {
        match part.split_once('=')? {
            ("talos", v) => set.talos = v.to_string(),
            ("kubernetes", v) => set.kubernetes = v.to_string(),
            ("cilium", v) => set.cilium = v.to_string(),
            _ => return None,
        }
    }
    (!set.talos.is_empty() && !set.kubernetes.is_empty() && !set.cilium.is_empty()).then_some(set)
}

/// The release set of the controller holding the Lease `lease` of `namespace`, when it says.
pub async fn controller_release_set(
    client: &kube_client::Client,
    namespace: &str,
    lease: &str,
) -> Option<crate::plan::ReleaseSet> {
    use k8s_openapi::api::coordination::v1::Lease;
    let l = Api::<Lease>::namespaced(client.clone(), namespace).get_opt(lease).await.ok().flatten()?;
    lease_release_set(&l)
}

/// The node of the replica that acts now, from its Lease: the node the holder wrote
/// (`LEASE_NODE_ANNOTATION`), else the node of the holder's Pod (its identity is its pod name,
/// `pod_node` looks it up). None when nobody holds the Lease (never held, released, or not
/// renewed within its duration at `now`, unix seconds): no node goes last.
pub fn lease_holder_node(
    lease: &k8s_openapi::api::coordination::v1::Lease,
    now: i64,
    pod_node: impl FnOnce(&str) -> Option<String>,
) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    let renewed = spec.renew_time.as_ref()?.0.as_second();
    if now > renewed + i64::from(spec.lease_duration_seconds.unwrap_or(0)) {
        return None;
    }
    let written =
        lease.metadata.annotations.as_ref().and_then(|a| a.get(LEASE_NODE_ANNOTATION)).filter(|n| !n.is_empty());
    written.cloned().or_else(|| pod_node(holder))
}

/// The node the acting controller runs on, read from its Lease `namespace/lease` (and its Pod):
/// what a preview needs to state the order the controller will take. None when it cannot be
/// read (nobody holds the Lease, or it is not readable).
pub async fn controller_node(client: &kube_client::Client, namespace: &str, lease: &str, now: i64) -> Option<String> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;
    let l = Api::<Lease>::namespaced(client.clone(), namespace).get_opt(lease).await.ok().flatten()?;
    let holder = l.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
    // The holder's Pod, read only when the Lease names no node.
    let pod = match l.metadata.annotations.as_ref().and_then(|a| a.get(LEASE_NODE_ANNOTATION)) {
        Some(_) => None,
        None if holder.is_empty() => None,
        None => Api::<Pod>::namespaced(client.clone(), namespace).get_opt(&holder).await.ok().flatten(),
    };
    lease_holder_node(&l, now, |_| pod.and_then(|p| p.spec?.node_name))
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("{what}")]
    Api {
        what: String,
        #[source]
        source: kube_client::Error,
    },
    #[error(
        "draining {node}: pod {pod} could not be evicted within {secs} s{}: {why}; nothing is applied to the node, Ichor uncordons it, and the operation pauses. Relax the budget or move the pod, then resume it; or, to delete what a budget keeps, abort it and start it again with --force-drain",
        if budgets.is_empty() { String::new() } else { format!(" (PodDisruptionBudget {} allows no disruption)", budgets.join(", ")) }
    )]
    DrainTimedOut { node: String, pod: String, secs: u64, why: String, budgets: Vec<String> },
    #[error(transparent)]
    Talos(#[from] crate::talos::client::TalosError),
    /// A Manifest resource Talos returned does not decode.
    #[error("{via}: a Manifest resource does not decode")]
    ManifestDecode {
        via: String,
        #[source]
        source: prost::DecodeError,
    },
    /// An object of a rendered manifest lacks what names it.
    #[error("a rendered object without apiVersion, kind or name: {object}")]
    Unnamed { object: String },
    /// The Cilium Job's object does not build (a bug of this build).
    #[error("the Cilium Job {name} does not build")]
    Job {
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube_client::Error) -> KubeError {
    let what = what.into();
    move |source| KubeError::Api { what, source }
}

fn is_status(e: &kube_client::Error, code: u16) -> bool {
    matches!(e, kube_client::Error::Api(s) if s.code == code)
}

#[derive(Clone)]
pub struct KubeCluster {
    pub client: kube_client::Client,
    pub talos: Talos,
    /// How long a drain keeps retrying an eviction a budget refuses.
    pub drain_timeout: Duration,
    /// The operation these writes are made for: its Cilium Jobs carry it (label
    /// `handover::OPERATION_LABEL`), so a Job a switch ran is told from the values reconciler's.
    pub operation: Option<String>,
    /// The namespace of the operation (where a release creates its stages' operations).
    pub namespace: String,
}

/// A kind's resource name, as the API server pluralizes it (`ConfigMap` -> `configmaps`,
/// `TalosConfigPatch` -> `talosconfigpatches`, `NetworkPolicy` -> `networkpolicies`).
pub fn plural(kind: &str) -> String {
    let k = kind.to_lowercase();
    if k == "endpoints" {
        return k;
    }
    if k.ends_with('s') || k.ends_with("ch") || k.ends_with("sh") || k.ends_with('x') {
        return format!("{k}es");
    }
    if let Some(stem) = k.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        return format!("{stem}ies");
    }
    format!("{k}s")
}

/// The API resource of a kind.
pub fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    ApiResource::from_gvk_with_plural(&gvk, &plural(kind))
}

impl KubeCluster {
    fn dynamic(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = resource(api_version, kind);
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    /// The objects Talos rendered on `node` (its `Manifests` resources; only the one with id
    /// `only` when given), as JSON.
    async fn rendered(&self, node: &str, only: Option<&str>) -> Result<Vec<Json>, KubeError> {
        use prost::Message;
        let mut out = vec![];
        let via = node;
        for r in self.talos.list(node, "controlplane", "Manifests.kubernetes.talos.dev").await? {
            if only.is_some_and(|id| r.metadata.as_ref().is_none_or(|m| m.id != id)) {
                continue;
            }
            let spec = r.spec.map(|s| s.proto_spec).unwrap_or_default();
            let m = crate::talos::proto::talos::resource::definitions::k8s::ManifestSpec::decode(spec.as_slice())
                .map_err(|source| KubeError::ManifestDecode { via: via.to_string(), source })?;
            out.extend(m.items.into_iter().filter_map(|i| i.object.map(|o| struct_json(&o))));
        }
        Ok(out)
    }

    /// Server-side-applies objects under Talos's field manager.
    async fn apply_all(&self, objects: &[Json], manager: &str) -> Result<(), KubeError> {
        for o in objects {
            let (Some(av), Some(kind), Some(name)) = (
                o.get("apiVersion").and_then(|v| v.as_str()),
                o.get("kind").and_then(|v| v.as_str()),
                o.pointer("/metadata/name").and_then(|v| v.as_str()),
            ) else {
                return Err(KubeError::Unnamed { object: o.to_string() });
            };
            let ns = o.pointer("/metadata/namespace").and_then(|v| v.as_str());
            let api = self.dynamic(av, kind, ns);
            let params = PatchParams::apply(manager).force();
            let patch = Patch::Apply(o);
            retrying(|| api.patch(name, &params, &patch)).await.map_err(api_err(format!("applying {kind} {name}")))?;
        }
        Ok(())
    }
}

/// How often an idempotent write (a server-side apply) is tried while the API server answers
/// with a transient status: client-go retries a 429 the same way. Without it a bootstrap-manifest
/// sync of twenty-odd objects under a 20 % rate of 409, 429 and 500 answers almost never
/// completed whole (0.8^20: about 1 % a try), and the upgrade's plan repeated the sync every
/// reconcile for minutes (issue 25: the upgrade that stalled under API faults).
const APPLY_ATTEMPTS: u32 = 6;

/// A status worth trying an idempotent write again on: a conflict, too many requests, or the
/// server's own failure.
pub(crate) fn transient(e: &kube_client::Error) -> bool {
    matches!(e, kube_client::Error::Api(s) if matches!(s.code, 409 | 429 | 500 | 502 | 503 | 504))
}

/// Runs an idempotent request, again after 50 ms, 100 ms, ... while it meets a transient status
/// (`APPLY_ATTEMPTS` tries in all, about 1.5 s at most); any other answer is returned at once.
async fn retrying<T, F, Fut>(mut request: F) -> Result<T, kube_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube_client::Error>>,
{
    let mut delay = Duration::from_millis(50);
    let mut attempt = 1;
    loop {
        match request().await {
            Err(e) if attempt < APPLY_ATTEMPTS && transient(&e) => {
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            r => return r,
        }
    }
}

fn struct_json(s: &prost_types::Struct) -> Json {
    Json::Object(s.fields.iter().map(|(k, v)| (k.clone(), value_json(v))).collect())
}

fn value_json(v: &prost_types::Value) -> Json {
    use prost_types::value::Kind;
    match &v.kind {
        Some(Kind::NullValue(_)) | None => Json::Null,
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9e15 => json!(*n as i64),
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value_json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}

impl KubeCluster {
    /// The PodDisruptionBudgets of the pod's namespace that select it (`ns/name`): what a
    /// blocked eviction names, whatever words the API server used. Empty when they cannot be
    /// listed.
    async fn budgets_of(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &ns);
        let Ok(list) = api.list(&ListParams::default()).await else { return vec![] };
        list.items
            .iter()
            .filter(|b| budget_selects(b, &labels))
            .map(|b| format!("{ns}/{}", b.metadata.name.clone().unwrap_or_default()))
            .collect()
    }
}

/// A PodDisruptionBudget selects a pod of its namespace with these labels (policy/v1: a null
/// selector selects nothing, an empty one every pod).
pub fn budget_selects(
    b: &k8s_openapi::api::policy::v1::PodDisruptionBudget,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let Some(sel) = b.spec.as_ref().and_then(|s| s.selector.as_ref()) else { return false };
    let by_label = sel.match_labels.as_ref().is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let by_expr = sel.match_expressions.as_ref().is_none_or(|es| {
        es.iter().all(|e| {
            let have = labels.get(&e.key);
            let values = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => have.is_some_and(|v| values.contains(v)),
                "NotIn" => have.is_none_or(|v| !values.contains(v)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
    });
    by_label && by_expr
}

/// A pod a drain evicts: not a mirror pod, not a DaemonSet's (what `drain` leaves).
pub fn drain_evicts(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    let meta = &p.metadata;
    let mirror = meta.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let daemon = meta.owner_references.as_ref().is_some_and(|o| o.iter().any(|r| r.kind == "DaemonSet"));
    !mirror && !daemon
}

/// A budget the Eviction API refuses to spend now: `status.disruptionsAllowed` is 0, or the
/// disruption controller has not observed it at its generation (kube-apiserver refuses those
/// too).
fn budget_refuses_now(b: &k8s_openapi::api::policy::v1::PodDisruptionBudget) -> bool {
    let status = b.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation).is_some_and(|g| g >= b.metadata.generation.unwrap_or(0));
    !observed || status.is_some_and(|s| s.disruptions_allowed.unwrap_or(0) < 1)
}

/// What would refuse a drain of each Node now, as the Eviction API decides: a budget selecting
/// a pod the drain evicts (one not finished) whose `status.disruptionsAllowed` is 0, or that the
/// disruption controller has not observed at its generation (kube-apiserver refuses those too).
/// By node name; each node's refusals sorted, each with its pods on that node.
pub fn drain_refusals(
    pods: &[k8s_openapi::api::core::v1::Pod],
    budgets: &[k8s_openapi::api::policy::v1::PodDisruptionBudget],
) -> std::collections::BTreeMap<String, Vec<crate::state::DrainRefusal>> {
    use std::collections::BTreeMap;
    let refusing: Vec<_> = budgets.iter().filter(|b| budget_refuses_now(b)).collect();
    let mut by_node: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for p in pods {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        let finished = matches!(phase, Some("Succeeded" | "Failed")); // a Pod's phase: Kubernetes' word
        if node.is_empty() || finished || !drain_evicts(p) {
            continue;
        }
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let labels = p.metadata.labels.clone().unwrap_or_default();
        for b in refusing.iter().filter(|b| b.metadata.namespace.as_deref() == Some(ns.as_str())) {
            if budget_selects(b, &labels) {
                let budget = format!("{ns}/{}", b.metadata.name.clone().unwrap_or_default());
                let pod = format!("{ns}/{}", p.metadata.name.clone().unwrap_or_default());
                by_node.entry(node.clone()).or_default().entry(budget).or_default().push(pod);
            }
        }
    }
    by_node
        .into_iter()
        .map(|(node, budgets)| {
            let refusals = budgets
                .into_iter()
                .map(|(budget, mut pods)| {
                    pods.sort();
                    crate::state::DrainRefusal { budget, pods }
                })
                .collect();
            (node, refusals)
        })
        .collect()
}

/// The drain refusals of a cluster now: every PodDisruptionBudget read, then the pods of the
/// namespaces where one refuses now (none read when none does: the common case is one small
/// list, and a reconcile never lists every pod of the cluster), then `drain_refusals`.
pub async fn read_drain_refusals(
    client: &kube_client::Client,
) -> Result<std::collections::BTreeMap<String, Vec<crate::state::DrainRefusal>>, KubeError> {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let budgets = Api::<PodDisruptionBudget>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err("listing every PodDisruptionBudget"))?;
    let namespaces: std::collections::BTreeSet<String> =
        budgets.items.iter().filter(|b| budget_refuses_now(b)).filter_map(|b| b.metadata.namespace.clone()).collect();
    let mut pods = vec![];
    for ns in namespaces {
        let listed = Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map_err(api_err(format!("listing the pods of namespace {ns}")))?;
        pods.extend(listed.items);
    }
    Ok(drain_refusals(&pods, &budgets.items))
}

impl KubePort for KubeCluster {
    type Error = KubeError;

    fn fails_step(e: &KubeError) -> bool {
        matches!(e, KubeError::DrainTimedOut { .. })
    }

    fn forbidden(e: &KubeError) -> bool {
        matches!(e, KubeError::Api { source, .. } if is_status(source, 403))
    }

    async fn cordon(&mut self, node: &str) -> Result<(), KubeError> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {render::api::CORDONED: "true"}}, "spec": {"unschedulable": true}})),
            )
            .await
            .map(|_| ())
            .map_err(api_err(format!("cordoning {node}")))
    }

    async fn uncordon(&mut self, node: &str) -> Result<(), KubeError> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {render::api::CORDONED: null}}, "spec": {"unschedulable": null}})),
            )
            .await
            .map(|_| ())
            .map_err(api_err(format!("uncordoning {node}")))
    }

    async fn taint(&mut self, node: &str, on: bool) -> Result<(), KubeError> {
        use k8s_openapi::api::core::v1::{Node, Taint};
        let nodes: Api<Node> = Api::all(self.client.clone());
        let what = if on { "tainting" } else { "untainting" };
        let n = nodes.get(node).await.map_err(api_err(format!("{what} {node}: reading its taints")))?;
        let mut taints: Vec<Taint> = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let had = taints.iter().any(|t| t.key == render::api::NEXT_TAINT);
        if had == on {
            return Ok(());
        }
        taints.retain(|t| t.key != render::api::NEXT_TAINT);
        if on {
            taints.push(Taint {
                key: render::api::NEXT_TAINT.into(),
                effect: "PreferNoSchedule".into(),
                ..Default::default()
            });
        }
        // The list as read, on the version read: a taint another writer added meanwhile is a
        // conflict (retried by the next reconcile), never lost.
        let body = json!({"metadata": {"resourceVersion": n.metadata.resource_version}, "spec": {"taints": taints}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(body))
            .await
            .map(|_| ())
            .map_err(api_err(format!("{what} {node} ({} PreferNoSchedule)", render::api::NEXT_TAINT)))
    }

    async fn drain(&mut self, node: &str, force: bool) -> Result<(), KubeError> {
        use k8s_openapi::api::core::v1::Pod;
        let all: Api<Pod> = Api::all(self.client.clone());
        let pods = all
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(api_err(format!("listing the pods of {node}")))?;
        let deadline = tokio::time::Instant::now() + self.drain_timeout;
        for p in pods.items {
            if !drain_evicts(&p) {
                continue;
            }
            let meta = &p.metadata;
            let (ns, name) = (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default());
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            loop {
                match api.evict(&name, &EvictParams::default()).await {
                    Ok(_) => break,
                    Err(e) if is_status(&e, 404) => break,
                    Err(e) if is_status(&e, 429) => {
                        if tokio::time::Instant::now() >= deadline && force {
                            // The user's consent (spec.forceDrain): past the budget, as
                            // `kubectl drain --disable-eviction` deletes.
                            let budgets = self.budgets_of(&p).await;
                            tracing::warn!(
                                node,
                                pod = %format!("{ns}/{name}"),
                                budgets = %budgets.join(", "),
                                "drain past its deadline: deleting the pod a PodDisruptionBudget keeps (--force-drain)"
                            );
                            match api.delete(&name, &DeleteParams::default()).await {
                                Ok(_) => break,
                                Err(e) if is_status(&e, 404) => break,
                                Err(e) => return Err(api_err(format!("deleting {ns}/{name} (--force-drain)"))(e)),
                            }
                        }
                        if tokio::time::Instant::now() >= deadline {
                            return Err(KubeError::DrainTimedOut {
                                node: node.into(),
                                pod: format!("{ns}/{name}"),
                                secs: self.drain_timeout.as_secs(),
                                why: crate::error_chain(&e),
                                budgets: self.budgets_of(&p).await,
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(api_err(format!("evicting {ns}/{name}"))(e)),
                }
            }
        }
        Ok(())
    }

    async fn sync_manifests(&mut self, node: &str, field_manager: &str) -> Result<(), KubeError> {
        let mut objects = self.rendered(node, None).await?;
        // As Talos does (FACTS 5 and 6): each object carries the inventory it belongs to, and
        // the inventory ConfigMap lists it (`<namespace>_<name>_<group>_<kind>`). Nothing is
        // pruned: an object Talos no longer renders is the operation's to delete (ADR 0066).
        for o in &mut objects {
            if let Some(meta) = o.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                let ann = meta.entry("annotations").or_insert_with(|| json!({}));
                if let Some(a) = ann.as_object_mut() {
                    a.insert(OWNING_INVENTORY.into(), json!(INVENTORY));
                }
            }
        }
        self.apply_all(&objects, field_manager).await?;
        let entries: serde_json::Map<String, Json> = objects.iter().map(|o| (inventory_key(o), json!(""))).collect();
        let inventory = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": INVENTORY, "namespace": "kube-system"}, "data": entries});
        self.apply_all(&[inventory], field_manager).await
    }

    async fn delete(&mut self, o: &ObjectRef) -> Result<(), KubeError> {
        let api = self.dynamic(&o.api_version, &o.kind, o.namespace.as_deref());
        let current = match api.get(&o.name).await {
            Ok(x) => x,
            Err(e) if is_status(&e, 404) => return Ok(()),
            Err(e) => return Err(api_err(format!("reading {} {}", o.kind, o.name))(e)),
        };
        // The UID read is the one deleted: a same-named object created since is left alone.
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions { uid: current.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match api.delete(&o.name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(api_err(format!("deleting {} {}", o.kind, o.name))(e)),
        }
    }

    async fn restore_manifest(&mut self, node: &str, manifest: &str, field_manager: &str) -> Result<(), KubeError> {
        let objects = self.rendered(node, Some(manifest)).await?;
        // Talos has not rendered it yet: nothing is applied and the wait continues.
        self.apply_all(&objects, field_manager).await
    }

    async fn cilium_job(
        &mut self,
        name: &str,
        mode: render::api::KubeProxyMode,
        user: &Json,
        tunnel: &str,
        take_ownership: bool,
    ) -> Result<(), KubeError> {
        let run = CiliumJobRun { name, mode, user, tunnel, take_ownership, operation: self.operation.as_deref() };
        create_cilium_job(&self.client, &run).await
    }

    async fn lock_down(&mut self, lockdown: &crate::netpol::Lockdown) -> Result<(), KubeError> {
        let written = ensure_network_policies(&self.client, &crate::netpol::policies(lockdown)).await?;
        if !written.is_empty() {
            tracing::info!(namespace = %lockdown.namespace, policies = %written.join(", "), "locked Ichor's namespace down (CiliumNetworkPolicies)");
        }
        Ok(())
    }

    async fn start_stage(&mut self, stage: &crate::plan::StageStart) -> Result<(), KubeError> {
        use render::api::{TalosCluster, TalosOperation};
        let ns = &self.namespace;
        let ops: Api<TalosOperation> = Api::namespaced(self.client.clone(), ns);
        // Its owner: the release (its uid, read now), so the stage goes with it.
        let release = ops
            .get(&stage.release)
            .await
            .map_err(api_err(format!("reading TalosOperation {ns}/{} (the release)", stage.release)))?;
        if let Some((field, version)) = &stage.spec_field {
            let clusters: Api<TalosCluster> = Api::namespaced(self.client.clone(), ns);
            clusters
                .patch(&stage.cluster, &PatchParams::default(), &Patch::Merge(json!({"spec": {field: version}})))
                .await
                .map_err(api_err(format!("setting spec.{field} of TalosCluster {ns}/{}", stage.cluster)))?;
        }
        let mut op = stage.operation();
        op.metadata.namespace = Some(ns.clone());
        op.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: format!("{}/v1alpha1", render::api::GROUP),
            kind: "TalosOperation".into(),
            name: stage.release.clone(),
            uid: release.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        match ops.create(&PostParams::default(), &op).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => Err(api_err(format!("creating TalosOperation {ns}/{}", stage.name))(e)),
        }
    }
}

/// One run of the Cilium Job, as an operation's plan or the values reconciler decided it.
#[derive(Clone, Copy, Debug)]
pub struct CiliumJobRun<'a> {
    pub name: &'a str,
    pub mode: render::api::KubeProxyMode,
    /// The user's layer (the Job validates and layers it itself).
    pub user: &'a Json,
    pub tunnel: &'a str,
    /// Helm takes Cilium's objects over into the release (`--take-ownership`): they are in no
    /// release yet (rules/cilium.rules).
    pub take_ownership: bool,
    /// The operation that runs it (its label), none for the values reconciler's.
    pub operation: Option<&'a str>,
}

/// Creates the Cilium Job `name`: `ichor cni helm apply` with the mode, the user's layer and the
/// tunnel protocol, labelled with the hash of the layered values (`handover::VALUES_HASH_LABEL`:
/// the values reconciler adopts a Job of the hash it wants, the switch's too). A Job of that
/// name already there is the same Job: nothing to do.
pub async fn create_cilium_job(client: &kube_client::Client, run: &CiliumJobRun<'_>) -> Result<(), KubeError> {
    use k8s_openapi::api::batch::v1::Job;
    let CiliumJobRun { name, mode, user, tunnel, take_ownership, operation } = *run;
    let jobs: Api<Job> = Api::namespaced(client.clone(), JOB_NAMESPACE);
    let hash = render::cilium::values_hash(&render::cilium::layered(
        user,
        mode == render::api::KubeProxyMode::Replaced,
        tunnel,
    ));
    let mut labels = json!({"app.kubernetes.io/managed-by": "ichor", crate::cni_objects::VALUES_HASH_LABEL: hash});
    if let Some(op) = operation {
        labels[crate::cni_objects::OPERATION_LABEL] = json!(op);
    }
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": JOB_NAMESPACE, "labels": labels},
        "spec": {
            "backoffLimit": 2,
            "template": {"spec": {
                "serviceAccountName": JOB_SERVICE_ACCOUNT,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "cilium",
                    "image": JOB_IMAGE,
                    // `ichor cni helm apply` validates the user's layer with the one
                    // validator, layers it with the mode and runs Helm (docs/resources.md: the Cilium Job).
                    "args": job_args(mode, tunnel, take_ownership),
                    "env": [{"name": JOB_VALUES_ENV, "value": user.to_string()}],
                    // A failed run's last log lines (Helm's error) become the container's
                    // termination message: the values reconciler shows them.
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }],
            }},
        },
    }))
    .map_err(|source| KubeError::Job { name: name.to_string(), source })?;
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => Ok(()),
        // Named by its values' hash: the same Job again is already there.
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(e) => Err(api_err(format!("creating Job {name}"))(e)),
    }
}

/// The Cilium Job's command line (after the `ichor` entry point).
fn job_args(mode: render::api::KubeProxyMode, tunnel: &str, take_ownership: bool) -> Vec<String> {
    let mut args: Vec<String> = ["cni", "helm", "apply"].map(String::from).into();
    args.extend([
        format!("--kube-proxy={mode}"),
        format!("--tunnel={tunnel}"),
        format!("--values-env={JOB_VALUES_ENV}"),
    ]);
    if take_ownership {
        args.push("--take-ownership".into());
    }
    args
}

/// Ichor's Cilium Jobs (label app.kubernetes.io/managed-by=ichor in kube-system): each one's
/// values' hash, mode and state.
pub async fn cilium_jobs(client: &kube_client::Client) -> Result<Vec<crate::cni_objects::CiliumJob>, KubeError> {
    use k8s_openapi::api::core::v1::Pod;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), JOB_NAMESPACE);
    let mut out: Vec<crate::cni_objects::CiliumJob> = jobs
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=ichor"))
        .await
        .map_err(api_err("listing Ichor's Jobs"))?
        .items
        .iter()
        .map(|j| crate::cni_objects::CiliumJob::from_json(&serde_json::to_value(j).unwrap_or_default()))
        .collect();
    // A failed Job's condition says only that it gave up: Helm's words are its pod's
    // termination message (the last log lines). Read only for the failed ones.
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOB_NAMESPACE);
    for j in out.iter_mut().filter(|j| j.state == crate::cni_objects::JobState::Failed) {
        let listed = pods
            .list(&ListParams::default().labels(&format!("job-name={}", j.name)))
            .await
            .map_err(api_err(format!("listing the pods of Job {JOB_NAMESPACE}/{}", j.name)))?;
        if let Some(words) = listed
            .items
            .iter()
            .rev()
            .find_map(|p| crate::cni_objects::termination_message(&serde_json::to_value(p).unwrap_or_default()))
        {
            j.why = words;
        }
    }
    Ok(out)
}

/// Whether the API serves cilium.io/v2 CiliumNetworkPolicy (Cilium's CRDs installed), by
/// discovery.
pub async fn serves_cilium_network_policies(client: &kube_client::Client) -> Result<bool, KubeError> {
    match client.list_api_group_resources("cilium.io/v2").await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "ciliumnetworkpolicies")),
        Err(e) if is_status(&e, 404) => Ok(false),
        Err(e) => Err(api_err("discovering cilium.io/v2")(e)),
    }
}

/// Writes each CiliumNetworkPolicy of `policies` (runtime::netpol) that is absent or whose spec
/// or labels differ, by server-side apply under `netpol::FIELD_MANAGER`; one that already says
/// the same is not written (idle is idle). Returns the names written.
pub async fn ensure_network_policies(
    client: &kube_client::Client,
    policies: &[Json],
) -> Result<Vec<String>, KubeError> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cilium.io", "v2", "CiliumNetworkPolicy"),
        "ciliumnetworkpolicies",
    );
    let mut written = vec![];
    for p in policies {
        let name = p.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or_default();
        let ns = p.pointer("/metadata/namespace").and_then(|n| n.as_str()).unwrap_or_default();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        let what = format!("CiliumNetworkPolicy {ns}/{name}");
        let current = opt(api.get(name).await, &what)?.map(|o| serde_json::to_value(&o).unwrap_or_default());
        let same = current.is_some_and(|c| {
            c.get("spec") == p.get("spec")
                && p.pointer("/metadata/labels").and_then(|l| l.as_object()).is_some_and(|want| {
                    want.iter().all(|(k, v)| c.pointer("/metadata/labels").and_then(|l| l.get(k)) == Some(v))
                })
        });
        if same {
            continue;
        }
        let params = PatchParams::apply(crate::netpol::FIELD_MANAGER).force();
        let patch = Patch::Apply(p);
        retrying(|| api.patch(name, &params, &patch)).await.map_err(api_err(format!("writing {what}")))?;
        crate::crashpoint::after(crate::crashpoint::Write::ServerSideApply);
        written.push(name.to_string());
    }
    Ok(written)
}

/// An object read by GET: absent (404) is `None`.
fn opt<T>(r: Result<T, kube_client::Error>, what: &str) -> Result<Option<T>, KubeError> {
    match r {
        Ok(x) => Ok(Some(x)),
        Err(e) if is_status(&e, 404) => Ok(None),
        Err(e) => Err(api_err(format!("reading {what}"))(e)),
    }
}

/// A DaemonSet's rollout, as the rules read it.
fn ds(d: k8s_openapi::api::apps::v1::DaemonSet) -> crate::state::DaemonSet {
    let st = d.status.unwrap_or_default();
    crate::state::DaemonSet {
        desired: st.desired_number_scheduled.into(),
        updated: st.updated_number_scheduled.unwrap_or(0).into(),
        ready: st.number_ready.into(),
        generation: d.metadata.generation.unwrap_or(0),
        observed_generation: st.observed_generation.unwrap_or(0),
        image: d.spec.template.spec.and_then(|p| p.containers.first().and_then(|c| c.image.clone())),
    }
}

/// What Cilium runs now (`cni_objects::LiveCilium`).
pub use crate::cni_objects::LiveCilium;

/// The TalosConfigPatch of `cluster` that carries Cilium's inline manifest (`render::render::
/// cni_home`): Ichor installed that Cilium. None when no patch does.
pub async fn bootstrap_patch(
    client: &kube_client::Client,
    cluster: &render::api::TalosCluster,
) -> Result<Option<String>, KubeError> {
    let ns = cluster.metadata.namespace.clone().unwrap_or_default();
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let patches: Api<render::api::TalosConfigPatch> = Api::namespaced(client.clone(), &ns);
    let listed =
        patches.list(&ListParams::default()).await.map_err(api_err(format!("listing TalosConfigPatches in {ns}")))?;
    let ours: Vec<&render::api::TalosConfigPatch> =
        listed.items.iter().filter(|p| p.spec.cluster_ref.name == name).collect();
    Ok(render::render::cni_home(&ours).map(|h| h.patch))
}

/// Reads cilium-config and the cilium DaemonSet.
pub async fn read_cilium(client: &kube_client::Client) -> Result<LiveCilium, KubeError> {
    use k8s_openapi::api::apps::v1::DaemonSet as Ds;
    use k8s_openapi::api::core::v1::ConfigMap;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let dss: Api<Ds> = Api::namespaced(client.clone(), "kube-system");
    let config = opt(cms.get("cilium-config").await, "ConfigMap kube-system/cilium-config")?;
    let daemon_set = opt(dss.get("cilium").await, "DaemonSet kube-system/cilium")?;
    let owners = daemon_set
        .as_ref()
        .map(|d| crate::cni_objects::cilium_owners(&serde_json::to_value(&d.metadata).unwrap_or_default()))
        .unwrap_or_default();
    Ok(LiveCilium {
        config_read: config.is_some(),
        config: config.and_then(|c| c.data).unwrap_or_default(),
        daemon_set: daemon_set.map(ds),
        owners,
    })
}

/// The workload cluster as the operation rules read it: cilium-config, the cilium and
/// kube-proxy DaemonSets, kube-proxy's ConfigMaps, ServiceAccount and ClusterRoleBinding.
/// `service_probe` is the controller's own probe of the kubernetes Service.
pub async fn read_workload(
    client: &kube_client::Client,
    service_probe: crate::state::ProbeResult,
    operation: &str,
) -> Result<crate::state::Workload, KubeError> {
    use crate::state::Workload;
    use k8s_openapi::api::apps::v1::DaemonSet as Ds;
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let dss: Api<Ds> = Api::namespaced(client.clone(), "kube-system");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "kube-system");
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    let cilium = read_cilium(client).await?;
    let data = &cilium.config;
    let kube_proxy_config_maps = cms
        .list(&ListParams::default())
        .await
        .map_err(api_err("listing kube-system ConfigMaps"))?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n == "kube-proxy" || n.starts_with("kube-proxy-"))
        .collect();
    // This operation's Cilium Jobs that failed, by the mode they ran for, with Helm's words (a
    // failed Job of the values reconciler, or of an earlier operation, is not this one's).
    let mut cilium_jobs_failed = std::collections::BTreeMap::new();
    let mut cilium_jobs_in_flight = vec![];
    let mut cilium_jobs_succeeded = vec![];
    for j in cilium_jobs(client).await? {
        if j.operation.as_deref() != Some(operation) {
            if j.state == crate::cni_objects::JobState::Running {
                cilium_jobs_in_flight.push(j.name);
            }
            continue;
        }
        match (j.state, j.mode) {
            (crate::cni_objects::JobState::Failed, Some(mode)) => {
                cilium_jobs_failed.insert(mode, format!("Job {JOB_NAMESPACE}/{}: {}", j.name, j.why));
            }
            (crate::cni_objects::JobState::Complete, Some(mode)) if !cilium_jobs_succeeded.contains(&mode) => {
                cilium_jobs_succeeded.push(mode)
            }
            _ => {}
        }
    }
    // Argo CD's Application for Cilium: its health and sync, and what its values say (the
    // values' home after the hand-over). No Argo CD (its CRD absent) is no Application.
    let ar = kube_client::api::ApiResource::from_gvk_with_plural(
        &kube_client::api::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    );
    let apps: Api<kube_client::api::DynamicObject> =
        Api::namespaced_with(client.clone(), crate::cni_objects::APPLICATION_NAMESPACE, &ar);
    let what = format!(
        "Argo CD's Application {}/{}",
        crate::cni_objects::APPLICATION_NAMESPACE,
        crate::cni_objects::APPLICATION_NAME
    );
    let argocd_application = opt(apps.get(crate::cni_objects::APPLICATION_NAME).await, &what)?.map(|o| {
        let a = crate::cni_objects::Application::from_json(&serde_json::to_value(&o).unwrap_or_default());
        crate::state::ArgoApplication {
            health: a.health,
            sync: a.sync,
            kube_proxy_replacement: a.kube_proxy_replacement,
        }
    });
    let cilium_daemon_set = cilium.daemon_set.clone();
    Ok(Workload {
        argocd_application,
        // The running release's chart version: the agents' image tag (chart and agents are
        // released together), so a release newer than the embedded chart is never stepped back.
        cilium_chart_version: cilium_daemon_set
            .as_ref()
            .and_then(|d| d.image.as_deref())
            .and_then(crate::cni_objects::cilium_version_of_image),
        cilium_jobs_failed,
        cilium_jobs_in_flight,
        cilium_kube_proxy_replacement: data.get("kube-proxy-replacement").cloned(),
        cilium_k8s_service_host: data.get("k8s-service-host").cloned(),
        cilium_k8s_service_port: data.get("k8s-service-port").cloned(),
        cilium_config_read: cilium.config_read,
        cilium_ipam: cilium.ipam(),
        cilium_owners: cilium.owners.clone(),
        cilium_jobs_succeeded,
        cilium_daemon_set,
        kube_proxy_daemon_set: opt(dss.get("kube-proxy").await, "DaemonSet kube-system/kube-proxy")?.map(ds),
        kube_proxy_config_maps,
        kube_proxy_service_account: Some(
            opt(sas.get("kube-proxy").await, "ServiceAccount kube-system/kube-proxy")?.is_some(),
        ),
        kube_proxy_cluster_role_binding: Some(
            opt(crbs.get("kube-proxy").await, "ClusterRoleBinding kube-proxy")?.is_some(),
        ),
        kubernetes_service_answers: service_probe.answers,
        kubernetes_service_probe: service_probe.target,
        ..Workload::default()
    })
}

/// Who writes each status (the `fieldManager` of every status write): each loop owns its
/// resource's status, and of a TalosCluster's the operation loop owns `status.cni.kubeProxy` and
/// `status.cni.adoption`, the cluster loop the rest (docs/architecture.md, "One writer").
pub mod managers {
    /// The operation loop: TalosOperation status, and its two fields of TalosCluster status.
    pub const OPERATIONS: &str = "ichor-operations";
    /// The machine loop: TalosMachine status.
    pub const MACHINES: &str = "ichor-machines";
    /// The cluster loop: TalosCluster conditions and `status.cni.appliedValuesHash`.
    pub const CLUSTERS: &str = "ichor-clusters";
}

/// Writes `next` as the status of `name`: the CRD's status type serialized, sent as the merge
/// patch from `current` (the status read; `status::merge_patch_between`) under `manager`, on
/// `resource_version` when given. Nothing is sent when the two are equal. The one way any loop
/// writes a status (a tidy test holds it). Returns whether it wrote.
pub async fn write_status<K, S>(
    api: &Api<K>,
    name: &str,
    current: &S,
    next: &S,
    resource_version: Option<&str>,
    manager: &str,
) -> Result<bool, kube_client::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: serde::Serialize,
{
    let value = |s: &S| serde_json::to_value(s).unwrap_or(Json::Null);
    let Some(status) = crate::status::merge_patch_between(&value(current), &value(next)) else { return Ok(false) };
    let mut patch = json!({ "status": status });
    if let Some(rv) = resource_version {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    let params = PatchParams { field_manager: Some(manager.to_string()), ..PatchParams::default() };
    api.patch_status(name, &params, &Patch::Merge(&patch)).await?;
    crate::crashpoint::after(crate::crashpoint::Write::Status);
    Ok(true)
}

/// RFC 7386 JSON merge patch (`status::merge_patch`).
pub use crate::status::merge_patch;

/// How long reading one health check's objects may take (discovery and the read): past it the
/// check fails this reconcile, naming the deadline.
pub const HEALTH_READ_DEADLINE: Duration = Duration::from_secs(10);

/// Whether the API server serves a health check's kind (discovery), and where.
pub async fn served_kind(
    client: &kube_client::Client,
    o: &render::api::HealthObject,
) -> Result<(ApiResource, crate::health::Served), kube_client::Error> {
    let (group, version) = o.api_version.split_once('/').unwrap_or(("", &o.api_version));
    let gvk = GroupVersionKind::gvk(group, version, &o.kind);
    match kube_client::discovery::pinned_kind(client, &gvk).await {
        Ok((ar, caps)) => {
            let scope = if caps.scope == kube_client::discovery::Scope::Namespaced {
                crate::health::Served::Namespaced
            } else {
                crate::health::Served::ClusterScoped
            };
            Ok((ar, scope))
        }
        // Discovery answers a group or kind it does not serve with 404 or an unknown kind.
        Err(kube_client::Error::Api(s)) if s.code == 404 => Ok((
            ApiResource::from_gvk(&gvk),
            crate::health::Served::No(format!("the API server serves no group version {}", o.api_version)),
        )),
        Err(kube_client::Error::Discovery(e)) => {
            Ok((ApiResource::from_gvk(&gvk), crate::health::Served::No(e.to_string())))
        }
        Err(e) => Err(e),
    }
}

/// The objects a health check names (one GET, or one LIST with its selector), each as the API
/// returns it; or why they could not be read.
async fn health_objects(client: &kube_client::Client, o: &render::api::HealthObject) -> Result<Vec<Json>, String> {
    let (ar, served) =
        served_kind(client, o).await.map_err(|e| format!("discovery of {} {}: {e}", o.api_version, o.kind))?;
    let api: Api<DynamicObject> = match (&served, &o.namespace) {
        (crate::health::Served::No(why), _) => return Err(format!("not served: {why}")),
        (crate::health::Served::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    let to_json = |d: DynamicObject| serde_json::to_value(d).map_err(|e| e.to_string());
    match (&o.name, &o.selector) {
        (Some(name), _) => match api.get_opt(name).await {
            Ok(Some(d)) => Ok(vec![to_json(d)?]),
            Ok(None) => Err("not found".into()),
            Err(e) => Err(forbidden_or(e, "get", &ar, "reading it")),
        },
        (None, selector) => {
            let lp = ListParams { label_selector: selector.clone(), ..ListParams::default() };
            let list = api.list(&lp).await.map_err(|e| forbidden_or(e, "list", &ar, "listing them"))?;
            list.items.into_iter().map(to_json).collect()
        }
    }
}

/// A read refused by RBAC says which right the controller lacks and how to grant it.
fn forbidden_or(e: kube_client::Error, verb: &str, ar: &ApiResource, doing: &str) -> String {
    match e {
        kube_client::Error::Api(s) if s.code == 403 => format!(
            "the controller may not {verb} {}{}: grant it with a ClusterRole labelled {}: \"true\"",
            ar.plural,
            if ar.group.is_empty() { String::new() } else { format!(".{}", ar.group) },
            crate::rbac::HEALTH_CHECKS_AGGREGATE
        ),
        e => format!("{doing}: {e}"),
    }
}

/// Every health check of a cluster, its objects read (each check under `HEALTH_READ_DEADLINE`)
/// and its CEL evaluated.
pub async fn read_health(
    client: &kube_client::Client,
    checks: &[render::api::HealthCheck],
) -> Vec<crate::health::HealthAt> {
    let mut out = vec![];
    for c in checks {
        let read = match tokio::time::timeout(HEALTH_READ_DEADLINE, health_objects(client, &c.object)).await {
            Ok(r) => r,
            Err(_) => Err(format!("reading it took longer than {} s", HEALTH_READ_DEADLINE.as_secs())),
        };
        out.push(crate::health::evaluate(c, read));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed: i64, node: Option<&str>) -> Lease {
        let mut l = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::from_second(renewed).unwrap())),
                lease_duration_seconds: Some(15),
                ..Default::default()
            }),
            ..Default::default()
        };
        if let Some(n) = node {
            l.metadata.annotations = Some([(LEASE_NODE_ANNOTATION.to_string(), n.to_string())].into());
        }
        l
    }

    #[test]
    fn the_holders_node_is_the_one_it_wrote_else_its_pods() {
        let pod = |p: &str| (p == "ichor-controller-abc").then(|| "w2".to_string());
        assert_eq!(lease_holder_node(&lease("ichor-controller-abc", 100, Some("w1")), 110, pod), Some("w1".into()));
        assert_eq!(lease_holder_node(&lease("ichor-controller-abc", 100, None), 110, pod), Some("w2".into()));
        assert_eq!(lease_holder_node(&lease("elsewhere", 100, None), 110, pod), None);
    }

    #[test]
    fn a_lease_nobody_holds_names_no_node() {
        let pod = |_: &str| Some("w2".to_string());
        // Expired: not renewed within its 15 s.
        assert_eq!(lease_holder_node(&lease("a", 100, Some("w1")), 116, pod), None);
        // Released: no holder.
        assert_eq!(lease_holder_node(&lease("", 100, Some("w1")), 101, pod), None);
        assert_eq!(lease_holder_node(&Lease::default(), 101, pod), None);
    }
}
