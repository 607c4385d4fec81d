//! The controller's reconcile, end to end: the example cluster's custom resources in the
//! in-memory API (read through a real `kube_client::Client`), a simulated Talos fleet whose
//! nodes run the render of those resources, and a Kubernetes upgrade driven by reconciling the
//! TalosOperation until its status says Completed; a status write that meets a conflict is
//! re-read and re-planned.
//!
//! Start at `cluster`. Between reconciles, `kubelets` plays what the nodes' kubelets report
//! (Node versions and Ready, mirror pods of the control-plane components) from what the fleet
//! runs.

use kube_client::api::{Api, Patch, PatchParams, PostParams};
use render::api::{TalosOperation, TalosOperationSpec};
use runtime::controller::Controller;
use runtime::exec::KubePort;
use runtime::kubeapi;
use runtime::plan::Planner;
use runtime::talos::config::TalosConfig;
use runtime::talos::observe::observe_node;
use runtime::talos::sim::{Fleet, NodeSpec};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "ichor-system";
const MACHINES: [(&str, &str); 4] =
    [("cp1", "10.0.0.11"), ("cp2", "10.0.0.12"), ("cp3", "10.0.0.13"), ("w1", "10.0.0.21")];

fn example_files() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/clusters/lab-v1.14");
    ["cluster.yaml", "machines.yaml", "patches.yaml", "secrets.yaml"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read_to_string(dir.join(f)).unwrap()))
        .collect()
}

fn group_plural(kind: &str) -> (&'static str, String) {
    match kind {
        "Secret" => ("", "secrets".into()),
        k => ("ichor.maesh.dev", format!("{}s", k.to_lowercase())),
    }
}

struct World {
    fleet: Fleet,
    api: kubeapi::Api,
    controller: Controller,
}

async fn cluster() -> World {
    let classifier = render::classify::Classifier::new(&render::classify::RuleSet::embedded()).unwrap();
    let contracts: Vec<String> = classifier.known().iter().map(|c| c.to_string()).collect();
    let files = example_files();
    let manifests = render::manifests::Manifests::load(&files, &contracts).unwrap();
    // Each node runs the render of its machine.
    let mut specs = vec![];
    for (name, address) in MACHINES {
        let r = render::machine::render_checked(&manifests, name, None, &classifier).unwrap();
        let role = if name.starts_with("cp") { render::api::Role::Controlplane } else { render::api::Role::Worker };
        specs.push(NodeSpec { name: address.into(), role, talos: "v1.14.3".into(), config: Some(r.config.to_yaml()) });
    }
    let fleet = Fleet::start(specs, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let tc = TalosConfig::parse(&fleet.talosconfig(&["os:admin"]).unwrap(), "tc").unwrap();
    let (n, ctx) = tc.context(None, "tc").unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let talos =
        runtime::talos::client::Client::new(ctx, &ctx.credentials(n, "tc", now).unwrap(), Duration::from_secs(10))
            .unwrap();
    let api = kubeapi::Api::new();
    for (_, text) in &files {
        use serde::Deserialize;
        for d in serde_yaml::Deserializer::from_str(text) {
            let v: serde_json::Value = serde_json::Value::deserialize(d).unwrap();
            if v.is_null() {
                continue;
            }
            let (g, plural) = group_plural(v["kind"].as_str().unwrap());
            api.put(g, &plural, v);
        }
    }
    // The hand-over is done (ADR 0024), so the upgrade's sync cannot roll Cilium back.
    let mut c = api.get("ichor.maesh.dev", "talosclusters", NS, "lab").unwrap();
    c["status"] = json!({"conditions": [{"type": "CNIHandover", "status": "True", "reason": "Synced", "message": ""}]});
    api.put("ichor.maesh.dev", "talosclusters", c);
    for (name, _) in MACHINES {
        api.put("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}));
    }
    api.put("", "configmaps", json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cilium-config", "namespace": "kube-system"}, "data": {"kube-proxy-replacement": "false"}}));
    let controller = Controller {
        kube: api.client(),
        talos: talos.clone(),
        planner: Planner::embedded().unwrap(),
        classifier,
        release_set_kubernetes: "v1.37.0".into(),
        controller_node: Some("w1".into()),
        service_answers: Arc::new(|| true),
        drain_timeout: Duration::from_secs(2),
    };
    // Talos's bootstrap put kube-proxy in.
    let mut k = runtime::kube::KubeCluster {
        client: api.client(),
        talos,
        drain_timeout: Duration::from_secs(2),
        nodes: Default::default(),
    };
    k.sync_manifests("10.0.0.11", "talos").await.unwrap();
    let w = World { fleet, api, controller };
    kubelets(&w).await;
    w
}

/// What the kubelets report, from what the fleet runs: Node Ready and kubelet version, the
/// control-plane mirror pods with their images, DaemonSets rolled out.
async fn kubelets(w: &World) {
    for (name, address) in MACHINES {
        let o = observe_node(&w.controller.talos, address).await.unwrap();
        let version = o.kubelet_image.rsplit(':').next().unwrap().to_string();
        let mut node = w.api.get("", "nodes", "", name).unwrap();
        node["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": version, "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux", "osImage": "Talos", "systemUUID": ""}});
        w.api.put("", "nodes", node);
        for (component, image) in &o.components {
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{component}-{name}"), "namespace": "kube-system", "labels": {"k8s-app": component}, "annotations": {"kubernetes.io/config.mirror": "x"}},
                "spec": {"nodeName": name, "containers": [{"name": component, "image": image}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
            if w.api.get("", "pods", "kube-system", &format!("{component}-{name}")).as_ref() != Some(&pod) {
                w.api.put("", "pods", pod);
            }
        }
    }
    for (key, mut d) in w.api.objects() {
        if key.1 == "daemonsets" {
            let generation = d.pointer("/metadata/generation").cloned().unwrap_or(json!(1));
            d["status"] = json!({"desiredNumberScheduled": 4, "updatedNumberScheduled": 4, "numberReady": 4, "currentNumberScheduled": 4, "numberMisscheduled": 0, "observedGeneration": generation});
            w.api.put(&key.0, "daemonsets", d);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_upgrades_the_example_cluster_from_its_custom_resources() {
    let w = cluster().await;
    let client = w.api.client();
    // The user moves the cluster to the release set's Kubernetes and asks for the upgrade.
    let clusters: Api<render::api::TalosCluster> = Api::namespaced(client.clone(), NS);
    clusters
        .patch("lab", &PatchParams::default(), &Patch::Merge(json!({"spec": {"kubernetesVersion": "v1.37.0"}})))
        .await
        .unwrap();
    let ops: Api<TalosOperation> = Api::namespaced(client.clone(), NS);
    let mut spec = TalosOperationSpec { max_unavailable: 1, ..Default::default() };
    spec.cluster_ref.name = "lab".into();
    spec.kind = render::api::OperationKind::Kubernetes;
    spec.target.kubernetes_version = Some("v1.37.0".into());
    ops.create(&PostParams::default(), &TalosOperation::new("upgrade-1-37", spec)).await.unwrap();

    let t0 = runtime::state::epoch("2026-11-30T10:00:00Z").unwrap();
    let mut phases = vec![];
    for i in 0..200 {
        let now = runtime::plan::rfc3339(t0 + 60 * i);
        let r = w.controller.reconcile(NS, "upgrade-1-37", &now).await.unwrap();
        let shown: Vec<String> = r.plan.actions.iter().map(|(a, _)| a.to_string()).collect();
        assert!(r.plan.phase != "Paused", "paused at reconcile {i}: {shown:#?}");
        assert!(r.outcome.failed.is_empty() && r.outcome.interrupted.is_none(), "{:?}", r.outcome);
        // What the controller decided is what `ichor plan` decides on its dumped snapshot.
        let dumped = runtime::state::ObservedState::parse(&serde_yaml::to_string(&r.snapshot).unwrap()).unwrap();
        let again = w.controller.planner.plan(&dumped).unwrap();
        assert_eq!(
            again.actions.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>(),
            r.plan.actions.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>()
        );
        phases.push(r.plan.phase.clone());
        if r.plan.phase == "Completed" {
            break;
        }
        kubelets(&w).await;
    }
    assert_eq!(phases.last().map(String::as_str), Some("Completed"), "{phases:?}");
    let op = ops.get("upgrade-1-37").await.unwrap();
    let st = op.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Completed"));
    assert!(st.done.contains(&"manifestsSynced".to_string()));
    assert_eq!(st.machines.len(), 4);
    for (name, address) in MACHINES {
        let o = observe_node(&w.controller.talos, address).await.unwrap();
        assert!(o.kubelet_image.ends_with(":v1.37.0"), "{name}: {}", o.kubelet_image);
        for image in o.components.values() {
            assert!(image.ends_with(":v1.37.0"), "{name}: {image}");
        }
        assert_eq!(w.fleet.reboots(address), 0);
    }
    let kp = w.api.get("apps", "daemonsets", "kube-system", "kube-proxy").unwrap();
    assert_eq!(kp["spec"]["template"]["spec"]["containers"][0]["image"], "registry.k8s.io/kube-proxy:v1.37.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_that_meets_a_conflict_is_re_read_and_re_planned() {
    let w = cluster().await;
    let client = w.api.client();
    let ops: Api<TalosOperation> = Api::namespaced(client.clone(), NS);
    let mut spec = TalosOperationSpec { max_unavailable: 1, ..Default::default() };
    spec.cluster_ref.name = "lab".into();
    spec.kind = render::api::OperationKind::Kubernetes;
    spec.target.kubernetes_version = Some("v1.37.0".into());
    ops.create(&PostParams::default(), &TalosOperation::new("upgrade", spec)).await.unwrap();
    let clusters: Api<render::api::TalosCluster> = Api::namespaced(client.clone(), NS);
    clusters
        .patch("lab", &PatchParams::default(), &Patch::Merge(json!({"spec": {"kubernetesVersion": "v1.37.0"}})))
        .await
        .unwrap();
    // Someone else writes the operation between the controller's read and its write: the
    // in-memory API sees a stale resourceVersion, and the controller reads again.
    let read = w.controller.read(NS, "upgrade", "2026-11-30T10:00:00Z").await.unwrap();
    let mut op = w.api.get("ichor.maesh.dev", "talosoperations", NS, "upgrade").unwrap();
    op["metadata"]["annotations"] = json!({"touched": "yes"});
    w.api.put("ichor.maesh.dev", "talosoperations", op);
    let stale = json!({"metadata": {"resourceVersion": read.resource_version}, "status": {"phase": "Running"}});
    let err = ops.patch_status("upgrade", &PatchParams::default(), &Patch::Merge(&stale)).await.unwrap_err();
    assert!(matches!(&err, kube_client::Error::Api(s) if s.code == 409), "{err}");
    let r = w.controller.reconcile(NS, "upgrade", "2026-11-30T10:00:00Z").await.unwrap();
    assert_eq!(r.status.operation.phase, "Running");
    let _ = BTreeMap::<String, String>::new();
}
