//! Kubelets as Kubernetes clients (issue 51): what stands for each machine's kubelet, posting
//! through kube-rs to whatever API server the client reaches — kube-apiserver in the real
//! control plane's suite. From what the simulated Talos node runs (read through the Talos API,
//! as the controller reads it): the Node with its Ready condition, `nodeInfo` (kubelet version,
//! `osImage`, boot ID), capacity and the labels its config sets; the control plane's mirror
//! pods; and the pods bound to a node that is up made Running and Ready (a terminating one
//! removed, as a kubelet confirms a deletion). A node Talos does not answer for goes Unknown.
//! The pod of Ichor's Cilium Job runs what Helm would do (`demo::helm_run`) and ends Succeeded
//! or Failed, for the real Job controller to count.
//! Each post renews the node's Lease (`kube-node-lease`), the heartbeat the node lifecycle
//! controller reads: it keeps the Node Ready and lifts the `not-ready` taint admission put on
//! it. A fixture: nothing here is a kubelet.
//!
//! Start at `Kubelets::post`; `Kubelets::run` posts every interval. The words of a Node and a
//! mirror pod are `node_status` and `mirror_pod_status`, which the in-memory installation's
//! stand-in (`demo::Demo::kubelets`) writes too.

use crate::talos::client::Client as Talos;
use crate::talos::observe::{NodeObservation, observe_node};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::time::Duration;

/// The stand-in kubelets of a fleet.
pub struct Kubelets {
    pub client: kube_client::Client,
    pub talos: Talos,
    /// Each machine: its Node's name and its Talos address.
    pub machines: Vec<(String, String)>,
}

/// What a kubelet posts of a node that is up: Ready, its addresses, `nodeInfo` from what Talos
/// runs (`osImage` `Talos (vX.Y.Z)`, the kubelet image's tag, the boot ID), and capacity a
/// scheduler places pods by.
pub fn node_status(name: &str, address: &str, boot_id: &str, o: &NodeObservation) -> Json {
    let version = o.kubelet_image.rsplit(':').next().unwrap_or_default();
    json!({"conditions": [{"type": "Ready", "status": "True"}],
        "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
        "nodeInfo": {"kubeletVersion": version, "architecture": "amd64", "bootID": boot_id, "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux", "osImage": format!("Talos ({})", o.talos_version), "systemUUID": ""}})
}

/// A node's status once its kubelet stopped posting: Ready Unknown, the node controller's word.
pub fn node_unknown() -> Json {
    json!([{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}])
}

/// A pod's status as its kubelet posts it: Running, its containers ready or not (what
/// `kubectl get pods` counts as READY).
pub fn mirror_pod_status(containers: &[&str], ready: bool) -> Json {
    let word = if ready { "True" } else { "False" };
    let statuses: Vec<Json> = containers
        .iter()
        .map(|c| {
            json!({"name": c, "ready": ready, "started": ready, "restartCount": 0,
            "state": {"running": {}}, "image": "", "imageID": ""})
        })
        .collect();
    json!({
        "phase": "Running", // a Pod's phase: Kubernetes' word
        "conditions": [{"type": "Ready", "status": word}, {"type": "ContainersReady", "status": word}],
        "containerStatuses": statuses,
    })
}

/// The status patch a kubelet posts of a pod, its containers ready or not.
fn posted(p: &Pod, ready: bool) -> Json {
    let containers: Vec<&str> =
        p.spec.as_ref().map(|s| s.containers.iter().map(|c| c.name.as_str()).collect()).unwrap_or_default();
    json!({"status": mirror_pod_status(&containers, ready)})
}

/// A control-plane component's mirror pod on `node`, as the kubelet creates it from Talos's
/// static pod.
pub fn mirror_pod(component: &str, image: &str, node: &str) -> Json {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{component}-{node}"), "namespace": "kube-system", "labels": {"k8s-app": component}, "annotations": {"kubernetes.io/config.mirror": "x"}},
        "spec": {"nodeName": node, "containers": [{"name": component, "image": image}]}})
}

/// The node labels a machine config sets: v1.14's `KubeNodeConfig.labels`, else the legacy
/// `machine.nodeLabels`.
pub fn config_node_labels(text: &str) -> BTreeMap<String, String> {
    use serde::Deserialize;
    let mut out = BTreeMap::new();
    for d in serde_yaml::Deserializer::from_str(text) {
        let Ok(v) = serde_yaml::Value::deserialize(d) else { continue };
        let labels = if v.get("kind").and_then(|k| k.as_str()) == Some("KubeNodeConfig") {
            v.get("labels")
        } else if v.get("kind").is_none() {
            v.get("machine").and_then(|m| m.get("nodeLabels"))
        } else {
            None
        };
        if let Some(serde_yaml::Value::Mapping(m)) = labels {
            for (k, val) in m {
                if let (Some(k), Some(val)) = (k.as_str(), render::yaml::scalar_text(val)) {
                    out.insert(k.to_string(), val);
                }
            }
        }
    }
    out
}

/// A write a stand-in kubelet could not make.
#[derive(Debug, thiserror::Error)]
#[error("the stand-in kubelet of {node}: {what}")]
pub struct KubeletError {
    node: String,
    what: String,
    #[source]
    source: kube_client::Error,
}

impl Kubelets {
    /// One post of every machine's kubelet, then of the pods bound to the nodes.
    pub async fn post(&self) -> Result<(), KubeletError> {
        let mut up = vec![];
        for (name, address) in &self.machines {
            let observed = observe_node(&self.talos, address).await.ok();
            self.post_node(name, address, observed.as_ref()).await?;
            if observed.is_some() {
                up.push(name.clone());
            }
        }
        self.run_pods(&up).await
    }

    /// Posts every `every` until the task is dropped; a failed post is retried at the next.
    pub async fn run(self, every: Duration) {
        loop {
            if let Err(e) = self.post().await {
                tracing::debug!(error = %crate::error_chain(&e), "stand-in kubelet post");
            }
            tokio::time::sleep(every).await;
        }
    }

    async fn post_node(&self, name: &str, address: &str, o: Option<&NodeObservation>) -> Result<(), KubeletError> {
        let err = |what: &str| {
            let (node, what) = (name.to_string(), what.to_string());
            move |source| KubeletError { node, what, source }
        };
        let nodes: Api<Node> = Api::all(self.client.clone());
        if nodes.get_opt(name).await.map_err(err("reading its Node"))?.is_none() {
            let node = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}}});
            let node: Node = serde_json::from_value(node).expect("a Node");
            nodes.create(&PostParams::default(), &node).await.map_err(err("registering its Node"))?;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "kube-system");
        let Some(o) = o else {
            nodes
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"conditions": node_unknown()}})),
                )
                .await
                .map_err(err("posting its Node Unknown"))?;
            for p in pods
                .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
                .await
                .map_err(err("listing its pods"))?
            {
                let pod_name = p.metadata.name.clone().unwrap_or_default();
                pods.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(posted(&p, false)))
                    .await
                    .map_err(err("posting a mirror pod not Ready"))?;
            }
            return Ok(());
        };
        let labels = match self.talos.running_config(address).await {
            Ok(text) => config_node_labels(&text),
            Err(_) => BTreeMap::new(),
        };
        let boot_id = o.boot_id.clone().unwrap_or_default();
        let mut status = json!({"status": node_status(name, address, &boot_id, o)});
        status["status"]["capacity"] = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
        status["status"]["allocatable"] = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
        if !labels.is_empty() {
            nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": labels}})))
                .await
                .map_err(err("labelling its Node"))?;
        }
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .map_err(err("posting its Node"))?;
        self.renew_lease(name).await.map_err(err("renewing its node Lease"))?;
        for (component, image) in &o.components {
            let want = mirror_pod(component, image, name);
            let pod_name = format!("{component}-{name}");
            let have = pods.get_opt(&pod_name).await.map_err(err("reading a mirror pod"))?;
            let same_spec = have.as_ref().is_some_and(|p| {
                p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.as_deref()) == Some(image)
            });
            if have.is_some() && !same_spec {
                // A static pod's new image: the kubelet replaces its mirror pod.
                pods.delete(&pod_name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
                    .await
                    .map_err(err("replacing a mirror pod"))?;
            }
            if !same_spec {
                let pod: Pod = serde_json::from_value(want).expect("a Pod");
                pods.create(&PostParams::default(), &pod).await.map_err(err("creating a mirror pod"))?;
            }
            let status = json!({"status": mirror_pod_status(&[component], true)});
            pods.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .map_err(err("posting a mirror pod"))?;
        }
        Ok(())
    }

    /// The Job `p` runs for, when it is Ichor's Cilium Job (label
    /// `app.kubernetes.io/managed-by=ichor`).
    async fn ichors_job(&self, p: &Pod) -> Result<Option<Json>, kube_client::Error> {
        use k8s_openapi::api::batch::v1::Job;
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let Some(name) = labels.get("batch.kubernetes.io/job-name").or(labels.get("job-name")) else {
            return Ok(None);
        };
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), p.metadata.namespace.as_deref().unwrap_or_default());
        let job = jobs.get_opt(name).await?.map(|j| serde_json::to_value(j).unwrap_or_default());
        Ok(job.filter(|j| j.pointer("/metadata/labels/app.kubernetes.io~1managed-by") == Some(&json!("ichor"))))
    }

    /// Runs Ichor's Cilium Job's pod `p` as Helm would (`demo::helm_run`): cilium-config and the
    /// cilium DaemonSet written, the pod ended Succeeded; or, when Helm fails, the pod ended
    /// Failed with Helm's words as its termination message and nothing else written. The Job
    /// controller reads the pod's end (and retries a failed one up to the Job's backoff limit).
    async fn run_helm(&self, p: &Pod, job: &Json) -> Result<(), kube_client::Error> {
        use k8s_openapi::api::apps::v1::DaemonSet;
        use k8s_openapi::api::core::v1::ConfigMap;
        let (ds_api, cm_api): (Api<DaemonSet>, Api<ConfigMap>) =
            (Api::namespaced(self.client.clone(), "kube-system"), Api::namespaced(self.client.clone(), "kube-system"));
        fn as_json<T: serde::Serialize>(v: Option<T>) -> Option<Json> {
            v.map(|x| serde_json::to_value(x).unwrap_or_default())
        }
        let ds = as_json(ds_api.get_opt("cilium").await?);
        let cm = as_json(cm_api.get_opt("cilium-config").await?);
        let fault = as_json(cm_api.get_opt(super::demo::HELM_FAULT_CONFIGMAP).await?);
        let ended = match super::demo::helm_run(job, ds.as_ref(), cm.as_ref(), super::demo::helm_fault(fault.as_ref()))
        {
            super::demo::HelmRun::Failed(message) => {
                // A pod's phase, a container's end: Kubernetes' words.
                json!({"phase": "Failed", /* Kubernetes' word */ "containerStatuses": [{"name": "cilium", "ready": false, "restartCount": 0, "image": "ichor", "imageID": "",
                    "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}}]})
            }
            super::demo::HelmRun::Installed { config, daemonset } => {
                if let Some(cm) = config {
                    let cm: ConfigMap = serde_json::from_value(cm).expect("a ConfigMap");
                    cm_api.replace("cilium-config", &PostParams::default(), &cm).await?;
                }
                if let Some(ds) = daemonset {
                    let ds: DaemonSet = serde_json::from_value(ds).expect("a DaemonSet");
                    ds_api.replace("cilium", &PostParams::default(), &ds).await?;
                }
                json!({"phase": "Succeeded", "containerStatuses": [{"name": "cilium", "ready": false, "restartCount": 0, "image": "ichor", "imageID": "",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed" /* Kubernetes' word */}}}]})
            }
        };
        let (ns, name) =
            (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": ended}))).await?;
        Ok(())
    }

    /// The node's heartbeat, as a kubelet renews it: the Lease `kube-node-lease/<node>`, whose
    /// renewals the node lifecycle controller reads to keep the Node Ready (and untainted).
    async fn renew_lease(&self, node: &str) -> Result<(), kube_client::Error> {
        use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let spec = LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        };
        // One server-side apply creates the Lease or renews it.
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"}, "spec": spec});
        leases.patch(node, &PatchParams::apply("kubelet").force(), &Patch::Apply(lease)).await?;
        Ok(())
    }

    /// The pods bound to a node that is up: a terminating one is removed (the kubelet's
    /// confirmation), one not Running is made Running and Ready.
    async fn run_pods(&self, up: &[String]) -> Result<(), KubeletError> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let err = |what: &'static str| move |source| KubeletError { node: "*".into(), what: what.into(), source };
        for p in all.list(&ListParams::default()).await.map_err(err("listing pods"))? {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            if !up.contains(&node) {
                continue;
            }
            let (ns, name) =
                (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            if p.metadata.deletion_timestamp.is_some() {
                let gone = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
                match api.delete(&name, &gone).await {
                    Ok(_) => {}
                    Err(kube_client::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(err("removing a terminating pod")(e)),
                }
                continue;
            }
            let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            // A pod that ended stays ended.
            let ended = matches!(phase.as_str(), "Succeeded" | "Failed"); // a Pod's phases: Kubernetes' words
            if ended {
                continue;
            }
            if let Some(job) = self.ichors_job(&p).await.map_err(err("reading a pod's Job"))? {
                self.run_helm(&p, &job).await.map_err(err("running Ichor's Cilium Job"))?;
                continue;
            }
            let running = phase == "Running"; // a Pod's phase: Kubernetes' word
            if !running {
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(posted(&p, true)))
                    .await
                    .map_err(err("posting a pod Running"))?;
            }
        }
        Ok(())
    }
}
