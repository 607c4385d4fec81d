//! End to end: the kube-proxy switch to Cilium's replacement and back (ADR 0066), driven by the
//! rules over a simulated Talos fleet (3 control planes, 2 workers) and, for Kubernetes, a real
//! `kube_client::Client` over the in-memory API: the executor's `KubeCluster` deletes and
//! restores kube-proxy and runs the Cilium Jobs; a small stand-in plays the cluster's own
//! controllers between reconciles (DaemonSets roll out, a Cilium Job changes cilium-config).
//!
//! Start at `switch`.

use k8s_openapi::api::batch::v1::Job;
use kube_client::api::{Api, ListParams};
use render::api::{CniPreset, Handover, KubeProxyMode, OperationKind, Role};
use render::config::Config;
use runtime::exec::{Executor, KubePort};
use runtime::kube::{KubeCluster, read_workload};
use runtime::plan::Planner;
use runtime::sim::kubeapi;
use runtime::sim::talos::{Fleet, NodeSpec};
use runtime::state::*;
use runtime::talos::config::TalosConfig;
use runtime::talos::observe::observe_node;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

fn names() -> Vec<(String, Role)> {
    ["cp1", "cp2", "cp3"]
        .iter()
        .map(|n| (n.to_string(), Role::Controlplane))
        .chain(["w1", "w2"].iter().map(|n| (n.to_string(), Role::Worker)))
        .collect()
}

fn ds(name: &str, image: &str) -> serde_json::Value {
    let labels = json!({"k8s-app": name});
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": name, "image": image}]}}}})
}

/// The cluster's own controllers, between reconciles: a Cilium Job not yet run sets
/// cilium-config for its mode and rolls the agents; every DaemonSet rolls out.
fn settle(api: &kubeapi::Api) {
    runtime::sim::demo::run_cilium_jobs(api);
    runtime::sim::demo::roll_out_daemonsets(api, 5);
}

/// The render with kube-proxy on or off (the v1.14 KubeProxyConfig document, on control planes).
fn desired(start: &str, role: Role, replaced: bool) -> Config {
    let text = if role == Role::Controlplane && replaced {
        start.replacen("kind: KubeProxyConfig\n", "kind: KubeProxyConfig\nenabled: false\n", 1)
    } else {
        start.replace("kind: KubeProxyConfig\nenabled: false\n", "kind: KubeProxyConfig\n")
    };
    Config::parse(&text).unwrap()
}

struct World {
    fleet: Fleet,
    api: kubeapi::Api,
    kube: KubeCluster,
    start: BTreeMap<String, String>,
}

async fn world() -> World {
    let specs = names()
        .into_iter()
        .map(|(name, role)| NodeSpec { name, role, talos: "v1.14.3".into(), config: None })
        .collect();
    let fleet = Fleet::start(specs, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let tc = TalosConfig::parse(&fleet.talosconfig(&["os:admin"]).unwrap(), "tc").unwrap();
    let (n, ctx) = tc.context(None, "tc").unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let talos =
        runtime::talos::client::Client::new(ctx, &ctx.credentials(n, "tc", now).unwrap(), Duration::from_secs(10))
            .unwrap();
    let api = kubeapi::Api::new();
    for (name, _) in names() {
        api.put("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}));
    }
    api.put("", "configmaps", json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cilium-config", "namespace": "kube-system"},
        "data": {"kube-proxy-replacement": "false", "k8s-service-host": "localhost", "k8s-service-port": "7445"}}));
    api.put("apps", "daemonsets", ds("cilium", "quay.io/cilium/cilium:v1.20.0"));
    let mut kube = KubeCluster {
        client: api.client(),
        talos: talos.clone(),
        drain_timeout: Duration::from_secs(2),
        operation: None,
        namespace: "default".into(),
    };
    // The cluster as Talos bootstrapped it: kube-proxy from its rendered manifests.
    kube.sync_manifests("cp1", "talos").await.unwrap();
    settle(&api);
    let mut start = BTreeMap::new();
    for (name, _) in names() {
        start.insert(name.clone(), talos.running_config(&name).await.unwrap());
    }
    World { fleet, api, kube, start }
}

/// Runs one switch to `target` until it completes; returns the cluster's status afterwards.
async fn switch(w: &mut World, target: KubeProxyMode, status_before: Option<KubeProxyMode>) -> Option<KubeProxyMode> {
    let classifier = render::classify::Classifier::new(&render::classify::RuleSet::embedded()).unwrap();
    let contract = render::vocab::Contract { major: 1, minor: 14 };
    let replaced = target == KubeProxyMode::Replaced;
    let renders: BTreeMap<String, Config> =
        names().into_iter().map(|(n, r)| (n.clone(), desired(&w.start[&n], r, replaced))).collect();
    let planner = Planner::embedded().unwrap();
    let mut cluster_status = status_before;
    let mut op = Operation {
        target_kube_proxy: Some(target),
        ..Operation::new(&format!("switch-{}", target.name()), OperationKind::Cni)
    };
    let t0 = runtime::state::epoch("2026-11-30T12:00:00Z").unwrap();
    for i in 0..200 {
        settle(&w.api);
        let mut machines = vec![];
        let mut configs = BTreeMap::new();
        for (name, role) in names() {
            let o = observe_node(&w.kube.talos, &name).await.unwrap();
            let running = runtime::plan::MachineConfigs {
                running: o.running_config.clone(),
                desired: renders[&name].clone().into(),
            };
            configs.insert(name.clone(), running);
            let read = runtime::assemble::MachineRead {
                name: name.clone(),
                role,
                talos_version: o.talos_version.clone(),
                kubelet_version: "v1.36.4".into(),
                node_ready: true,
                runs_controller: name == "w2",
                kube_proxy_manifest: (role == Role::Controlplane)
                    .then(|| o.manifests.iter().any(|m| m == "10-kube-proxy")),
                ..Default::default()
            };
            machines.push(
                runtime::assemble::machine(
                    &classifier,
                    contract,
                    &read,
                    Some(&Config::parse(&o.running_config).unwrap()),
                    &renders[&name],
                )
                .unwrap(),
            );
        }
        let workload = read_workload(
            &w.kube.client,
            runtime::controller::ProbeResult { answers: true, target: "the test".into() },
            &op.name,
        )
        .await
        .unwrap();
        let s = ObservedState {
            now: runtime::plan::rfc3339(t0 + 60 * i as i64),
            cluster: Cluster {
                name: "lab".into(),
                kubernetes_version: "v1.36.4".into(),
                release_set_kubernetes: "v1.36.4".into(),
                release_set_talos: "v1.14.6".into(),
                cni: Cni {
                    preset: CniPreset::Cilium,
                    kube_proxy: target,
                    handover: Handover::Disabled,
                    handover_done: false,
                    // Ichor installed this Cilium from the bootstrap patch (its Jobs may take it over).
                    bootstrap_patch: Some("ichor-system/cilium-bootstrap".into()),
                    home_kube_proxy_replacement: None,
                },
                status_kube_proxy: cluster_status,
                annotations: [(render::api::CONFIRM_KUBE_PROXY_SWITCH.to_string(), target.name().to_string())].into(),
                cilium_values: None,
                cilium_tunnel: None,
                cilium_adoption: None,
                maintenance: None,
                health: vec![],
            },
            machines,
            workload,
            operation: op.clone(),
            other_operations: vec![],
            stage_operations: vec![],
            inputs_rejected: None,
        };
        let plan = planner.plan_complete(&s, &configs).unwrap();
        let shown: Vec<String> = plan.actions.iter().map(|(a, _)| a.to_string()).collect();
        assert!(plan.phase != render::api::Phase::Paused, "the switch to {target} paused at reconcile {i}: {shown:#?}");
        if plan.phase == render::api::Phase::Completed {
            return cluster_status;
        }
        let mut exec = Executor { talos: &w.kube.talos.clone(), kube: &mut w.kube };
        let outcome = exec.run(&plan).await;
        assert!(outcome.failed().is_empty() && outcome.stopped().is_none(), "{outcome:?}\n{shown:#?}");
        let after = runtime::status::record(&s, &plan, outcome.actions.len(), &outcome.failed(), outcome.forbidden());
        op = after.operation;
        cluster_status = after.cluster.status_kube_proxy;
    }
    panic!("the switch to {target} did not complete in 200 reconciles");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_proxy_replaced_by_cilium_and_back_without_a_reboot() {
    let mut w = world().await;
    let status = switch(&mut w, KubeProxyMode::Replaced, None).await;
    assert_eq!(status, Some(KubeProxyMode::Replaced));
    // kube-proxy's objects are gone, through a control plane, with their UIDs.
    for (g, plural, ns) in [
        ("apps", "daemonsets", "kube-system"),
        ("", "serviceaccounts", "kube-system"),
        ("rbac.authorization.k8s.io", "clusterrolebindings", ""),
        ("", "configmaps", "kube-system"),
    ] {
        assert!(w.api.get(g, plural, ns, "kube-proxy").is_none(), "{plural}/kube-proxy still there");
    }
    let cm = w.api.get("", "configmaps", "kube-system", "cilium-config").unwrap();
    assert_eq!(cm["data"]["kube-proxy-replacement"], "true");
    for (name, role) in names() {
        let o = observe_node(&w.kube.talos, &name).await.unwrap();
        assert_eq!(o.running_config.contains("enabled: false"), role == Role::Controlplane, "{name}");
        assert_eq!(w.fleet.reboots(&name), 0);
    }
    // Everything the executor and the observation asked of Kubernetes, the ClusterRole allows.
    let denied: Vec<String> = w
        .api
        .log()
        .into_iter()
        .filter(|l| runtime::rbac::request(l).is_none_or(|(v, g, r)| !runtime::rbac::allowed(&v, &g, &r)))
        .collect();
    assert!(denied.is_empty(), "requests the ClusterRole does not allow: {denied:#?}");
    let jobs: Api<Job> = Api::namespaced(w.kube.client.clone(), "kube-system");
    assert_eq!(jobs.list(&ListParams::default()).await.unwrap().items.len(), 1, "one Cilium Job");

    // And back: kube-proxy restored from Talos's own rendering before Cilium steps aside.
    let status = switch(&mut w, KubeProxyMode::Enabled, status).await;
    assert_eq!(status, Some(KubeProxyMode::Enabled));
    let restored = w.api.get("apps", "daemonsets", "kube-system", "kube-proxy").expect("kube-proxy restored");
    assert_eq!(restored["spec"]["template"]["spec"]["containers"][0]["image"], "registry.k8s.io/kube-proxy:v1.36.4");
    let cm = w.api.get("", "configmaps", "kube-system", "cilium-config").unwrap();
    assert_eq!(cm["data"]["kube-proxy-replacement"], "false");
    assert_eq!(jobs.list(&ListParams::default()).await.unwrap().items.len(), 2, "a second Cilium Job, for enabled");
    let order: Vec<String> = w
        .api
        .log()
        .into_iter()
        .filter(|l| l.starts_with("DELETE") || l.contains("fieldManager=talos") || l.starts_with("POST /apis/batch"))
        .collect();
    let first_job = order.iter().position(|l| l.starts_with("POST /apis/batch")).unwrap();
    let first_delete = order.iter().position(|l| l.starts_with("DELETE")).unwrap();
    assert!(first_job < first_delete, "Cilium first, then kube-proxy deleted: {order:#?}");
}
