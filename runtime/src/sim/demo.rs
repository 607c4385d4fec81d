//! A whole simulated installation, for tests and `ichor sim controller` (feature `io`): a
//! simulated Talos fleet whose nodes run the render of a folder of custom resources, the
//! in-memory Kubernetes API holding those resources, and a stand-in for what the nodes'
//! kubelets report. A fixture: nothing here is Talos or Kubernetes.
//!
//! Start at `Demo::start` (from manifest files), then `Demo::kubelets` (call it between
//! reconciles, or `Demo::kubelets_forever`) and `Demo::controller`.

use super::kubeapi;
use super::kubelet::{config_node_labels, mirror_pod, mirror_pod_status, node_status, node_unknown};
use super::talos::{Fleet, NodeSpec, SimError};
use crate::controller::Controller;
use crate::exec::KubePort;
use crate::kube::KubeCluster;
use crate::talos::client::Client as Talos;
use crate::talos::config::TalosConfig;
use crate::talos::observe::observe_node;
use render::api::Role;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the manifests: {0}")]
    Manifests(String),
    #[error("rendering {machine}: {problem}")]
    Render { machine: String, problem: String },
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("the simulated fleet's talosconfig: {0}")]
    Talos(String),
    #[error("seeding the cluster: {0}")]
    Seed(String),
}

pub struct Demo {
    pub fleet: Fleet,
    pub api: kubeapi::Api,
    pub talos: Talos,
    /// The machines: name, Talos address, role.
    pub machines: Vec<(String, String, Role)>,
    /// Per machine, the fleet's revision its Node and pods were last made from, and when: a
    /// pass skips a machine nothing happened to (read again every `KUBELET_RESYNC`).
    seen: std::sync::Mutex<std::collections::HashMap<String, (u64, std::time::Instant)>>,
}

/// How often a stand-in kubelet posts its Node and pods though nothing changed on its node.
const KUBELET_RESYNC: Duration = Duration::from_secs(20);

impl std::fmt::Debug for Demo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demo").field("machines", &self.machines).finish_non_exhaustive()
    }
}

fn group_plural(kind: &str) -> (&'static str, String) {
    match kind {
        "Secret" => ("", "secrets".into()),
        "ConfigMap" => ("", "configmaps".into()),
        k => (render::api::GROUP, crate::kube::plural(k)),
    }
}

/// A simulated fleet whose nodes run the render of manifest files, with an admin client of it.
pub struct FleetOf {
    pub fleet: Fleet,
    pub talos: Talos,
    /// The machines: name, Talos address, role.
    pub machines: Vec<(String, String, Role)>,
}

/// The fleet of `files` (TalosCluster, TalosMachines, patches, the secrets Secret): each
/// machine a node at its address, on its cluster's Talos, running its render (without the
/// inline Cilium entry when `handover_done`: ADR 0024). Also the files as the render read them.
pub async fn start_fleet(
    files: &[(String, String)],
    handover_done: bool,
) -> Result<(Vec<(String, String)>, FleetOf), DemoError> {
    let classifier = render::classify::Classifier::new(&render::classify::RuleSet::embedded())
        .map_err(|e| DemoError::Manifests(e.to_string()))?;
    let contracts: Vec<String> = classifier.known().iter().map(|c| c.to_string()).collect();
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(f, t)| {
            if !handover_done || !t.contains("kind: TalosCluster") {
                return (f.clone(), t.clone());
            }
            (f.clone(), format!("{}\nstatus:\n  conditions:\n  - {{type: CNIHandover, status: \"True\", reason: Synced, message: \"\"}}\n", t.trim_end()))
        })
        .collect();
    let manifests = render::manifests::Manifests::load(&files, &contracts)
        .map_err(|e| DemoError::Manifests(e.iter().map(|x| x.message.clone()).collect::<Vec<_>>().join("; ")))?;
    let mut specs = vec![];
    let mut machines = vec![];
    for m in manifests.machines.iter() {
        let name = m.metadata.name.clone().unwrap_or_default();
        let r = render::machine::render_checked(&manifests, &name, None, &classifier)
            .map_err(|e| DemoError::Render { machine: name.clone(), problem: e.to_string() })?;
        let talos = manifests.cluster_of(m).spec.talos_version.clone();
        specs.push(NodeSpec {
            name: m.spec.address.clone(),
            role: m.spec.role,
            talos,
            config: Some(r.config.to_yaml()),
        });
        machines.push((name, m.spec.address.clone(), m.spec.role));
    }
    let fleet = Fleet::start(specs, "127.0.0.1:0".parse().expect("an address")).await?;
    let text = fleet.talosconfig(&["os:admin"]).map_err(|e| DemoError::Talos(e.to_string()))?;
    let tc = TalosConfig::parse(&text, "talosconfig").map_err(|e| DemoError::Talos(e.to_string()))?;
    let (n, ctx) = tc.context(None, "talosconfig").map_err(|e| DemoError::Talos(e.to_string()))?;
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let creds = ctx.credentials(n, "talosconfig", now).map_err(|e| DemoError::Talos(e.to_string()))?;
    let talos = Talos::new(ctx, &creds, Duration::from_secs(10)).map_err(|e| DemoError::Talos(e.to_string()))?;
    Ok((files, FleetOf { fleet, talos, machines }))
}

impl Demo {
    /// A fleet whose nodes run the render of `files` (TalosCluster, TalosMachines, patches,
    /// the secrets Secret), those resources in the in-memory API, the Nodes, cilium-config,
    /// and kube-proxy as Talos's bootstrap applies it. `handover_done` sets CNIHandover True.
    pub async fn start(files: &[(String, String)], handover_done: bool) -> Result<Demo, DemoError> {
        let (files, FleetOf { fleet, talos, machines }) = start_fleet(files, handover_done).await?;
        let files = &files[..];
        let api = kubeapi::Api::new();
        for (file, text) in files {
            use serde::Deserialize;
            for d in serde_yaml::Deserializer::from_str(text) {
                let v = serde_json::Value::deserialize(d).map_err(|e| DemoError::Seed(format!("{file}: {e}")))?;
                let Some(kind) = v.get("kind").and_then(|k| k.as_str()) else { continue };
                let (g, plural) = group_plural(kind);
                api.put(g, &plural, v);
            }
        }
        if handover_done {
            for (key, mut c) in api.objects() {
                if key.1 == "talosclusters" {
                    c["status"] = json!({"conditions": [{"type": "CNIHandover", "status": "True", "reason": "Synced", "message": ""}]});
                    api.put(&key.0, "talosclusters", c);
                }
            }
        }
        if handover_done {
            // Argo CD owns Cilium: its Application, in sync with what runs (kube-proxy on).
            api.put("apiextensions.k8s.io", "customresourcedefinitions", super::discovery::argo_cd_application_crd());
            api.put("argoproj.io", "applications", argo_cd_application(false));
        }
        for (name, _, _) in &machines {
            api.put("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}));
        }
        // Cilium, as its bootstrap manifest installed it (the embedded chart), with its CRDs.
        let [config, agents] = bootstrap_cilium();
        api.put("", "configmaps", config);
        api.put("apiextensions.k8s.io", "customresourcedefinitions", super::discovery::cilium_network_policy_crd());
        api.put("apps", "daemonsets", agents);
        let demo = Demo { fleet, api, talos, machines, seen: Default::default() };
        // Talos's bootstrap applied kube-proxy from the first control plane's rendering.
        if let Some((_, address, _)) = demo.machines.iter().find(|m| m.2 == Role::Controlplane) {
            let mut k = KubeCluster {
                client: demo.api.client(),
                talos: demo.talos.clone(),
                drain_timeout: Duration::from_secs(2),
                operation: None,
                namespace: "default".into(),
            };
            k.sync_manifests(address, "talos").await.map_err(|e| DemoError::Seed(e.to_string()))?;
        }
        demo.kubelets().await;
        ensure_namespaces(&demo.api);
        Ok(demo)
    }

    /// A controller for this installation.
    pub fn controller(
        &self,
        release_set_kubernetes: &str,
        controller_node: Option<String>,
    ) -> Result<Controller, DemoError> {
        Ok(Controller::new(
            self.api.client(),
            self.talos.clone(),
            crate::plan::Planner::embedded().map_err(|e| DemoError::Manifests(e.to_string()))?,
            render::classify::Classifier::new(&render::classify::RuleSet::embedded())
                .map_err(|e| DemoError::Manifests(e.to_string()))?,
        )
        .with_release_set(release_set_kubernetes)
        .with_controller_node(controller_node)
        .with_drain_timeout(Duration::from_secs(2))
        // As the installed controller: the namespace locked down once Cilium is ready.
        .with_lockdown(vec![]))
    }

    /// What the kubelets report, from what the fleet runs: Node Ready and kubelet version, the
    /// control-plane mirror pods with their images, every DaemonSet rolled out.
    pub async fn kubelets(&self) {
        for (name, address, _) in &self.machines {
            let revision = self.fleet.revision(address);
            let now = std::time::Instant::now();
            let unchanged = self
                .seen
                .lock()
                .ok()
                .and_then(|s| s.get(name).copied())
                .is_some_and(|(r, at)| Some(r) == revision && now.saturating_duration_since(at) < KUBELET_RESYNC);
            if unchanged {
                continue;
            }
            // A node away on a reboot: its Node goes Unknown (the node controller's word when a
            // kubelet stops posting) and its mirror pods not Ready; the rest stays as it was.
            let Some(boot_id) = self.fleet.boot_id(address) else {
                if let Some(mut node) = self.api.get("", "nodes", "", name) {
                    let ready = node_unknown();
                    if node.pointer("/status/conditions") != Some(&ready) {
                        node["status"]["conditions"] = ready;
                        self.api.put("", "nodes", node);
                    }
                }
                for component in ["kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
                    let Some(mut pod) = self.api.get("", "pods", "kube-system", &format!("{component}-{name}")) else {
                        continue;
                    };
                    let not_ready = mirror_pod_status(&[component], false);
                    if pod.get("status") != Some(&not_ready) {
                        pod["status"] = not_ready;
                        self.api.put("", "pods", pod);
                    }
                }
                continue;
            };
            let Ok(o) = observe_node(&self.talos, address).await else { continue };
            if let (Ok(mut s), Some(r)) = (self.seen.lock(), revision) {
                s.insert(name.clone(), (r, now));
            }
            // The node labels the running config sets (Talos's node-labels controller puts them
            // on the Node live).
            let labels = match self.talos.running_config(address).await {
                Ok(text) => config_node_labels(&text),
                Err(_) => BTreeMap::new(),
            };
            if let Some(mut node) = self.api.get("", "nodes", "", name) {
                let mut relabelled = false;
                for (k, v) in &labels {
                    if node.pointer(&format!("/metadata/labels/{}", k.replace('~', "~0").replace('/', "~1")))
                        != Some(&json!(v))
                    {
                        node["metadata"]["labels"][k] = json!(v);
                        relabelled = true;
                    }
                }
                if relabelled {
                    self.api.put("", "nodes", node.clone());
                }
                let status = node_status(name, address, &boot_id, &o);
                if node.get("status") != Some(&status) {
                    node["status"] = status;
                    self.api.put("", "nodes", node);
                }
            }
            for (component, image) in &o.components {
                let mut pod = mirror_pod(component, image, name);
                pod["status"] = mirror_pod_status(&[component], true);
                let current = self.api.get("", "pods", "kube-system", &format!("{component}-{name}"));
                let same = current
                    .as_ref()
                    .is_some_and(|c| c.get("spec") == pod.get("spec") && c.get("status") == pod.get("status"));
                if !same {
                    self.api.put("", "pods", pod);
                }
            }
        }
        roll_out_daemonsets(&self.api, self.machines.len());
    }

    /// `kubelets` every `every`, until the task is dropped.
    pub async fn kubelets_forever(self: Arc<Self>, every: Duration) {
        loop {
            self.kubelets().await;
            tokio::time::sleep(every).await;
        }
    }
}

/// Cilium as its bootstrap manifest installed it (the embedded chart, kube-proxy kept): the
/// `cilium-config` ConfigMap and the agents' DaemonSet, as the in-memory installation holds
/// them and the real control plane's suite applies them.
pub fn bootstrap_cilium() -> [serde_json::Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cilium-config", "namespace": "kube-system"}, "data": {"kube-proxy-replacement": "false", "ipam": "kubernetes"}}),
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "cilium", "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"k8s-app": "cilium"}}, "template": {"metadata": {"labels": {"k8s-app": "cilium"}},
                "spec": {"containers": [{"name": "cilium-agent", "image": format!("quay.io/cilium/cilium:v{}", render::embedded::CILIUM_CHART_VERSION)}]}}}}),
    ]
}

/// The namespaces the objects are in, and Kubernetes' own, exist as Namespaces (Active), as on
/// a cluster: `kubectl get namespaces` lists them.
pub fn ensure_namespaces(api: &kubeapi::Api) {
    let objects = api.objects();
    let mut names: std::collections::BTreeSet<String> =
        ["default", "kube-system", "kube-public", "kube-node-lease"].iter().map(|n| n.to_string()).collect();
    names.extend(objects.keys().map(|k| k.2.clone()).filter(|n| !n.is_empty()));
    for n in names {
        if !objects.contains_key(&(String::new(), "namespaces".into(), String::new(), n.clone())) {
            api.put(
                "",
                "namespaces",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
            );
        }
    }
}

/// Every DaemonSet rolled out on `nodes` nodes at its current generation (what the
/// DaemonSet controller reports once its pods are updated and ready).
/// A DaemonSet annotated `sim/unready: N` (`ichor sim cluster --cilium-unready N`) keeps N
/// pods not ready.
pub fn roll_out_daemonsets(api: &kubeapi::Api, nodes: usize) {
    for (key, mut d) in api.objects() {
        if key.1 == "daemonsets" {
            let generation = d.pointer("/metadata/generation").cloned().unwrap_or(json!(1));
            let unready = d
                .pointer("/metadata/annotations/sim~1unready")
                .and_then(|n| n.as_str())
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            let ready = nodes.saturating_sub(unready);
            let mut want = json!({"desiredNumberScheduled": nodes, "updatedNumberScheduled": nodes, "numberReady": ready, "numberAvailable": ready, "currentNumberScheduled": nodes, "numberMisscheduled": 0, "observedGeneration": generation});
            if ready < nodes {
                want["numberUnavailable"] = json!(nodes - ready);
            }
            if d.get("status") != Some(&want) {
                d["status"] = want;
                api.put(&key.0, "daemonsets", d);
            }
        }
    }
}

/// The cilium agents run Cilium `version` (their image's tag), as a release of that chart
/// would: `ichor sim cluster --cilium-version`, and what the Helm stand-in does with the
/// embedded chart.
pub fn run_cilium(api: &kubeapi::Api, version: &str) {
    if let Some(mut cilium) = api.get("apps", "daemonsets", "kube-system", "cilium") {
        cilium["spec"]["template"]["spec"]["containers"][0]["image"] =
            json!(format!("quay.io/cilium/cilium:v{version}"));
        api.put("apps", "daemonsets", cilium);
    }
}

/// The ConfigMap that makes the Helm stand-in fail: while `kube-system/ichor-sim-helm-fault`
/// exists, every Cilium Job it runs fails with the ConfigMap's `message` as Helm's words (on the
/// Job's pod, as `terminationMessagePolicy: FallbackToLogsOnError` puts a failed container's
/// last log lines there) and changes nothing. Create it with kubectl to rehearse a failed Job.
pub const HELM_FAULT_CONFIGMAP: &str = "ichor-sim-helm-fault";

/// What Helm does when Ichor's Cilium Job runs (once per Job): cilium-config says the Job's
/// kube-proxy mode, with the API server address, the agents get a new spec to roll out, and
/// the Job completes (its `Complete` condition, as the Job controller writes it). With the
/// fault ConfigMap (`HELM_FAULT_CONFIGMAP`) the Job fails instead: its pod ends with Helm's
/// words and the Job reads `Failed` (BackoffLimitExceeded), and nothing else changes.
pub fn run_cilium_jobs(api: &kubeapi::Api) {
    for (key, mut job) in api.objects() {
        if key.1 != "jobs" || job.pointer("/metadata/annotations/sim~1ran").is_some() {
            continue;
        }
        let name = job.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or_default().to_string();
        let namespace = key.2.clone();
        job["metadata"]["annotations"] = json!({"sim/ran": "true"});
        let ran = helm_run(
            &job,
            api.get("apps", "daemonsets", "kube-system", "cilium").as_ref(),
            api.get("", "configmaps", "kube-system", "cilium-config").as_ref(),
            helm_fault(api.get("", "configmaps", "kube-system", HELM_FAULT_CONFIGMAP).as_ref()),
        );
        match ran {
            HelmRun::Failed(message) => fail_job(api, &mut job, &name, &namespace, &message),
            HelmRun::Installed { config, daemonset } => {
                if let Some(cm) = config {
                    api.put("", "configmaps", cm);
                }
                if let Some(ds) = daemonset {
                    api.put("apps", "daemonsets", ds);
                }
                job["status"] = json!({"succeeded": 1, "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True"},
                    {"type": "Complete", "status": "True"}]});
                api.put("batch", "jobs", job);
            }
        }
    }
}

/// Helm's words while the fault ConfigMap (`HELM_FAULT_CONFIGMAP`) exists: its `message`.
pub fn helm_fault(configmap: Option<&serde_json::Value>) -> Option<String> {
    configmap
        .map(|c| c.pointer("/data/message").and_then(|m| m.as_str()).unwrap_or("Error: UPGRADE FAILED").to_string())
}

/// What one run of Ichor's Cilium Job did (`helm_run`).
#[derive(Clone, Debug, PartialEq)]
pub enum HelmRun {
    /// Helm stopped with these words; nothing changed.
    Failed(String),
    /// Helm installed the release: the new cilium-config and cilium DaemonSet to write (each
    /// when it exists).
    Installed { config: Option<serde_json::Value>, daemonset: Option<serde_json::Value> },
}

/// What Helm does when Ichor's Cilium Job `job` runs, on plain data: with `fault` (Helm's
/// words) it fails; without `--take-ownership`, a cilium DaemonSet in no release (or
/// another's) stops it with Helm's words; else cilium-config says the Job's kube-proxy mode and
/// the API server address, and the agents get the values' hash in their template, Helm's
/// ownership marks and the embedded chart's image. The in-memory API's stand-in
/// (`run_cilium_jobs`) and the kubelets' on a real one (`kubelet::Kubelets`) both write this.
pub fn helm_run(
    job: &serde_json::Value,
    daemonset: Option<&serde_json::Value>,
    config: Option<&serde_json::Value>,
    fault: Option<String>,
) -> HelmRun {
    if let Some(message) = fault {
        return HelmRun::Failed(message);
    }
    let args = job.pointer("/spec/template/spec/containers/0/args").cloned().unwrap_or_default();
    let replaced = args.as_array().is_some_and(|a| a.iter().any(|x| x == "--kube-proxy=replaced"));
    let take_ownership = args.as_array().is_some_and(|a| a.iter().any(|x| x == "--take-ownership"));
    // Helm installs over objects of its release only: without --take-ownership an object in no
    // release (or another's) stops the Job with Helm's words, and nothing changes.
    let annotation = |k: &str| {
        daemonset
            .and_then(|d| d.pointer(&format!("/metadata/annotations/{}", k.replace('/', "~1"))))
            .and_then(|v| v.as_str())
            .map(String::from)
    };
    let in_release = annotation("meta.helm.sh/release-name").as_deref() == Some("cilium")
        && annotation("meta.helm.sh/release-namespace").as_deref() == Some("kube-system");
    if daemonset.is_some() && !in_release && !take_ownership {
        return HelmRun::Failed("Error: UPGRADE FAILED: Unable to continue with update: DaemonSet \"cilium\" in namespace \"kube-system\" exists and cannot be imported into the current release: invalid ownership metadata; label validation error: missing key \"app.kubernetes.io/managed-by\": must be set to \"Helm\"; annotation validation error: missing key \"meta.helm.sh/release-name\": must be set to \"cilium\"; annotation validation error: missing key \"meta.helm.sh/release-namespace\": must be set to \"kube-system\"".into());
    }
    let config = config.cloned().map(|mut cm| {
        let mut data = cm.get("data").cloned().filter(|d| d.is_object()).unwrap_or_else(|| json!({}));
        for (k, v) in [
            ("kube-proxy-replacement", replaced.to_string()),
            ("k8s-service-host", "localhost".into()),
            ("k8s-service-port", "7445".into()),
            ("ipam", "kubernetes".into()),
        ] {
            data[k] = json!(v);
        }
        cm["data"] = data;
        cm
    });
    let daemonset = daemonset.cloned().map(|mut cilium| {
        // The values' hash in the pod template, as a changed value changes the agents' spec.
        let hash = job.pointer("/metadata/labels/ichor.maesh.dev~1values-hash").cloned().unwrap_or_default();
        cilium["spec"]["template"]["metadata"]["annotations"] = json!({"kpr": replaced.to_string(), "values": hash});
        // Helm's ownership: the release's annotations and label on what it installed.
        cilium["metadata"]["annotations"]["meta.helm.sh/release-name"] = json!("cilium");
        cilium["metadata"]["annotations"]["meta.helm.sh/release-namespace"] = json!("kube-system");
        cilium["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("Helm");
        // Every Job installs the embedded chart: the agents run its version from now on.
        cilium["spec"]["template"]["spec"]["containers"][0]["image"] =
            json!(format!("quay.io/cilium/cilium:v{}", render::embedded::CILIUM_CHART_VERSION));
        cilium
    });
    HelmRun::Installed { config, daemonset }
}

/// A Job of the Helm stand-in fails: its pod ends with Helm's words (`message`) and the Job
/// reads `Failed` (BackoffLimitExceeded).
fn fail_job(api: &kubeapi::Api, job: &mut serde_json::Value, name: &str, namespace: &str, message: &str) {
    api.put("", "pods", json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{name}-sim"), "namespace": namespace, "labels": {"job-name": name, "batch.kubernetes.io/job-name": name}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "cilium", "image": "ichor"}]},
        "status": {"phase": "Failed", /* Kubernetes' word: a Pod's phase */ "containerStatuses": [{"name": "cilium", "ready": false, "restartCount": 0, "image": "ichor", "imageID": "", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}}]}}));
    job["status"] = json!({"failed": 3, "conditions": [
        {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"},
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", /* Kubernetes' word: a Job's condition */ "message": "Job has reached the specified backoff limit"}]});
    api.put("batch", "jobs", job.clone());
}

/// Who installed the simulated cluster's Cilium (`ichor sim cluster --cilium-installed-by`),
/// when not Ichor's bootstrap patch: the cilium DaemonSet carries that owner's marks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CiliumInstaller {
    /// `kubectl apply` of rendered manifests: no owner's marks.
    Manifests,
    /// A Helm release `namespace/name` (`cilium install` makes `kube-system/cilium`).
    Helm(String, String),
    /// An Argo CD application (annotation tracking).
    ArgoCd(String),
    /// A Flux HelmRelease `namespace/name`.
    Flux(String, String),
}

impl CiliumInstaller {
    /// `manifests`, `helm` (kube-system/cilium), `helm:NS/NAME`, `argocd:APP`, `flux:NS/NAME`.
    pub fn parse(s: &str) -> Option<CiliumInstaller> {
        let split = |r: &str| {
            r.split_once('/')
                .filter(|(a, b)| !a.is_empty() && !b.is_empty())
                .map(|(a, b)| (a.to_string(), b.to_string()))
        };
        Some(match s.split_once(':') {
            None if s == "manifests" => CiliumInstaller::Manifests,
            None if s == "helm" => CiliumInstaller::Helm("kube-system".into(), "cilium".into()),
            Some(("helm", r)) => {
                let (a, b) = split(r)?;
                CiliumInstaller::Helm(a, b)
            }
            Some(("argocd", app)) if !app.is_empty() => CiliumInstaller::ArgoCd(app.to_string()),
            Some(("flux", r)) => {
                let (a, b) = split(r)?;
                CiliumInstaller::Flux(a, b)
            }
            _ => return None,
        })
    }

    /// The marks on the cilium DaemonSet.
    pub fn mark(&self, api: &kubeapi::Api) {
        let Some(mut ds) = api.get("apps", "daemonsets", "kube-system", "cilium") else { return };
        let (labels, annotations) = match self {
            CiliumInstaller::Manifests => (json!({}), json!({})),
            CiliumInstaller::Helm(ns, name) => (
                json!({"app.kubernetes.io/managed-by": "Helm"}),
                json!({"meta.helm.sh/release-name": name, "meta.helm.sh/release-namespace": ns}),
            ),
            CiliumInstaller::ArgoCd(app) => (
                json!({}),
                json!({"argocd.argoproj.io/tracking-id": format!("{app}:apps/DaemonSet:kube-system/cilium")}),
            ),
            CiliumInstaller::Flux(ns, name) => (
                json!({"helm.toolkit.fluxcd.io/name": name, "helm.toolkit.fluxcd.io/namespace": ns, "app.kubernetes.io/managed-by": "Helm"}),
                json!({"meta.helm.sh/release-name": format!("{ns}-{name}"), "meta.helm.sh/release-namespace": "kube-system"}),
            ),
        };
        ds["metadata"]["labels"] = labels;
        ds["metadata"]["annotations"] = annotations;
        api.put("apps", "daemonsets", ds);
    }
}

/// Files with every TalosConfigPatch that carries Cilium's inline manifest left out: a cluster
/// whose Cilium someone else installed (`--cilium-installed-by`).
pub fn without_bootstrap_patch(files: &[(String, String)]) -> Vec<(String, String)> {
    use serde::Deserialize;
    files
        .iter()
        .map(|(f, text)| {
            let mut kept = vec![];
            for d in serde_yaml::Deserializer::from_str(text) {
                let Ok(v) = serde_yaml::Value::deserialize(d) else { continue };
                let bootstrap = serde_yaml::from_value::<render::api::TalosConfigPatch>(v.clone())
                    .ok()
                    .filter(|_| v.get("kind").and_then(|k| k.as_str()) == Some("TalosConfigPatch"))
                    .is_some_and(|p| render::render::cni_home(&[&p]).is_some());
                if !bootstrap {
                    kept.push(serde_yaml::to_string(&v).unwrap_or_default());
                }
            }
            (f.clone(), kept.join("---\n"))
        })
        .collect()
}

/// Argo CD's Application `argocd/cilium` as the stand-in seeds it: the Cilium chart, its Helm
/// values (`valuesObject`, what a user edits as they would edit Git), synced and healthy.
pub fn argo_cd_application(kube_proxy_replacement: bool) -> serde_json::Value {
    json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "cilium", "namespace": "argocd"},
        "spec": {"project": "default",
            "source": {"repoURL": "https://helm.cilium.io", "chart": "cilium", "targetRevision": render::embedded::CILIUM_CHART_VERSION,
                "helm": {"releaseName": "cilium", "valuesObject": {"kubeProxyReplacement": kube_proxy_replacement}}},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "kube-system"}},
        "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}})
}

/// What Argo CD does with the Application `argocd/cilium` (the stand-in of `--handover done`):
/// its Helm values (`valuesObject`, or the `values` YAML) synced to Cilium's objects:
/// cilium-config says `kubeProxyReplacement`, `k8sServiceHost` and `k8sServicePort`, and the
/// agents get a new spec to roll out; the Application reads Synced and Healthy.
pub fn sync_argo_cd(api: &kubeapi::Api) {
    let Some(mut app) = api.get("argoproj.io", "applications", "argocd", "cilium") else { return };
    let helm = app.pointer("/spec/source/helm").cloned().unwrap_or_default();
    let values = match (helm.get("valuesObject"), helm.get("values").and_then(|v| v.as_str())) {
        (Some(v), _) => v.clone(),
        (None, Some(text)) => serde_yaml::from_str(text).unwrap_or_default(),
        _ => json!({}),
    };
    let text = |k: &str| match values.get(k) {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    };
    let Some(mut cm) = api.get("", "configmaps", "kube-system", "cilium-config") else { return };
    let mut data = cm.get("data").cloned().unwrap_or_else(|| json!({}));
    let want = [
        ("kube-proxy-replacement", text("kubeProxyReplacement").unwrap_or_else(|| "false".into())),
        ("k8s-service-host", text("k8sServiceHost").unwrap_or_default()),
        ("k8s-service-port", text("k8sServicePort").unwrap_or_default()),
    ];
    let mut changed = false;
    for (k, v) in want {
        let have = data.get(k).and_then(|x| x.as_str()).unwrap_or_default().to_string();
        if have != v && !(v.is_empty() && data.get(k).is_none()) {
            data[k] = json!(v);
            changed = true;
        }
    }
    if changed {
        cm["data"] = data.clone();
        api.put("", "configmaps", cm);
        if let Some(mut cilium) = api.get("apps", "daemonsets", "kube-system", "cilium") {
            cilium["spec"]["template"]["metadata"]["annotations"] =
                json!({"kpr": data["kube-proxy-replacement"].clone()});
            api.put("apps", "daemonsets", cilium);
        }
    }
    let synced = json!({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}});
    if app.get("status") != Some(&synced) {
        app["status"] = synced;
        api.put("argoproj.io", "applications", app);
    }
}
