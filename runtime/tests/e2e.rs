//! End to end: the rules drive a Kubernetes upgrade of a simulated Talos fleet (3 control
//! planes, 2 workers, 1.36.4 to 1.37.0) over real gRPC and mTLS: observe, assemble the
//! snapshot, plan, execute, record status, until the operation completes. Then the same with
//! the controller "crashing" at random points (a plan half executed and its status never
//! written; the machines' markers written and nothing executed), which must end in the same state.
//!
//! Start at `upgrade`. The Kubernetes side is `Twin`, a small stand-in that answers from what
//! the Talos fleet runs (static pods follow the control-plane configs, kubelets the kubelet
//! spec); the controller's kube-rs side is issue 14's next step.

use render::api::{CniPreset, Handover, KubeProxyMode, OperationKind, Role};
use render::config::Config;
use runtime::exec::{Executor, KubePort};
use runtime::plan::{ObjectRef, Planner};
use runtime::sim::talos::{Fleet, NodeSpec};
use runtime::state::*;
use runtime::talos::client::Client;
use runtime::talos::config::TalosConfig;
use runtime::talos::observe::{NodeObservation, observe_node};
use std::collections::BTreeMap;
use std::time::Duration;

const FROM: &str = "v1.36.4";
const TARGET: &str = "v1.37.0";

/// The Kubernetes side, answering from the fleet.
struct Twin {
    cordoned: BTreeMap<String, bool>,
    drained: Vec<String>,
    kube_proxy_image: String,
    talos: Client,
}

#[derive(Debug)]
struct TwinError(String);
impl std::fmt::Display for TwinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for TwinError {}

impl KubePort for Twin {
    type Error = TwinError;
    async fn cordon(&mut self, node: &str) -> Result<(), TwinError> {
        self.cordoned.insert(node.into(), true);
        Ok(())
    }
    async fn drain(&mut self, node: &str, _force: bool) -> Result<(), TwinError> {
        if !self.cordoned.get(node).copied().unwrap_or(false) {
            return Err(TwinError(format!("drain of {node} before its cordon")));
        }
        self.drained.push(node.into());
        Ok(())
    }
    async fn uncordon(&mut self, node: &str) -> Result<(), TwinError> {
        self.cordoned.insert(node.into(), false);
        Ok(())
    }
    async fn taint(&mut self, _: &str, _: bool) -> Result<(), TwinError> {
        Ok(())
    }
    async fn sync_manifests(&mut self, via: &str, field_manager: &str) -> Result<(), TwinError> {
        assert_eq!(field_manager, "talos");
        // Talos renders kube-proxy at the control plane's Kubernetes version.
        let o = observe_node(&self.talos, via).await.map_err(|e| TwinError(e.to_string()))?;
        let api = o.components.get("kube-apiserver").cloned().unwrap_or_default();
        let tag = api.rsplit(':').next().unwrap_or_default();
        self.kube_proxy_image = format!("registry.k8s.io/kube-proxy:{tag}");
        Ok(())
    }
    async fn delete(&mut self, o: &ObjectRef) -> Result<(), TwinError> {
        Err(TwinError(format!("an upgrade deletes nothing, yet {} {} was to be deleted", o.kind, o.name)))
    }
    async fn restore_manifest(&mut self, _: &str, _: &str, _: &str) -> Result<(), TwinError> {
        Err(TwinError("an upgrade restores nothing".into()))
    }
    async fn start_stage(&mut self, s: &runtime::plan::StageStart) -> Result<(), TwinError> {
        Err(TwinError(format!("an upgrade starts no release stage, yet {} was to start", s.name)))
    }
    async fn lock_down(&mut self, l: &runtime::netpol::Lockdown) -> Result<(), TwinError> {
        Err(TwinError(format!("an upgrade locks no namespace down, yet {} was to be", l.namespace)))
    }
    async fn cilium_job(
        &mut self,
        name: &str,
        _: KubeProxyMode,
        _: &serde_json::Value,
        _: &str,
        _: bool,
    ) -> Result<(), TwinError> {
        Err(TwinError(format!("an upgrade runs no Cilium Job, yet {name} was to run")))
    }
}

fn names() -> Vec<(String, Role)> {
    vec![
        ("cp1".into(), Role::Controlplane),
        ("cp2".into(), Role::Controlplane),
        ("cp3".into(), Role::Controlplane),
        ("w1".into(), Role::Worker),
        ("w2".into(), Role::Worker),
    ]
}

/// The render at the target: the node's starting config with the target's images.
fn desired(start: &str) -> Config {
    let mut text = start.to_string();
    for image in ["kubelet", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"] {
        text = text.replace(&format!("/{image}:{FROM}"), &format!("/{image}:{TARGET}"));
    }
    Config::parse(&text).unwrap()
}

/// What the controller reads of a machine: the Talos observation, and its Node (Ready here).
fn machine_read(o: &NodeObservation, name: &str, role: Role, runs_controller: bool) -> runtime::assemble::MachineRead {
    runtime::assemble::MachineRead {
        name: name.to_string(),
        role,
        talos_version: o.talos_version.clone(),
        kubelet_version: tag(&o.kubelet_image),
        node_ready: true,
        runs_controller,
        static_pods: o
            .components
            .iter()
            .map(|(k, v)| (k.clone(), StaticPod { image: v.clone(), ready: true }))
            .collect(),
        kube_proxy_manifest: (role == Role::Controlplane).then(|| o.manifests.iter().any(|m| m == "10-kube-proxy")),
        ..Default::default()
    }
}

fn tag(image: &str) -> String {
    image.rsplit(':').next().unwrap_or_default().to_string()
}

/// Plays the upgrade to its end. `crash(i)` says what goes wrong at reconcile `i`.
async fn upgrade(crash: impl Fn(usize) -> Crash) -> (BTreeMap<String, (String, Vec<String>)>, String, Vec<String>) {
    let specs: Vec<NodeSpec> = names()
        .into_iter()
        .map(|(name, role)| NodeSpec { name, role, talos: "v1.14.3".into(), config: None })
        .collect();
    let fleet = Fleet::start(specs, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let tc = TalosConfig::parse(&fleet.talosconfig(&["os:admin"]).unwrap(), "tc").unwrap();
    let (n, ctx) = tc.context(None, "tc").unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let creds = ctx.credentials(n, "tc", now).unwrap();
    let client = Client::new(ctx, &creds, Duration::from_secs(10)).unwrap();
    let classifier = render::classify::Classifier::new(&render::classify::RuleSet::embedded()).unwrap();
    let contract = render::vocab::Contract { major: 1, minor: 14 };
    let mut renders = BTreeMap::new();
    for (name, _) in names() {
        renders.insert(name.clone(), desired(&client.running_config(&name).await.unwrap()));
    }
    let mut twin = Twin {
        cordoned: BTreeMap::new(),
        drained: vec![],
        kube_proxy_image: format!("registry.k8s.io/kube-proxy:{FROM}"),
        talos: client.clone(),
    };
    let planner = Planner::embedded().unwrap();
    let mut status = Operation {
        target_kubernetes: Some(TARGET.into()),
        ..Operation::new("upgrade-1-37", OperationKind::Kubernetes)
    };
    let t0 = runtime::state::epoch("2026-11-30T10:00:00Z").unwrap();
    for i in 0..300 {
        // Observe.
        let mut machines = vec![];
        let mut configs = BTreeMap::new();
        for (name, role) in names() {
            let o = observe_node(&client, &name).await.unwrap();
            let running = runtime::plan::MachineConfigs {
                running: o.running_config.clone(),
                desired: renders[&name].clone().into(),
            };
            configs.insert(name.clone(), running);
            let read = machine_read(&o, &name, role, name == "w2");
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
        let s = ObservedState {
            now: runtime::plan::rfc3339(t0 + 60 * i as i64),
            cluster: Cluster {
                name: "lab".into(),
                kubernetes_version: TARGET.into(),
                release_set_kubernetes: TARGET.into(),
                release_set_talos: "v1.14.6".into(),
                cni: Cni {
                    preset: CniPreset::Cilium,
                    kube_proxy: KubeProxyMode::Enabled,
                    handover: Handover::Disabled,
                    handover_done: false,
                    bootstrap_patch: None,
                    home_kube_proxy_replacement: None,
                },
                status_kube_proxy: None,
                annotations: BTreeMap::new(),
                cilium_values: None,
                cilium_tunnel: None,
                cilium_adoption: None,
                maintenance: None,
                health: vec![],
            },
            machines,
            workload: Workload {
                cilium_kube_proxy_replacement: Some("false".into()),
                kube_proxy_daemon_set: Some(DaemonSet {
                    desired: 5,
                    updated: 5,
                    ready: 5,
                    generation: 1,
                    observed_generation: 1,
                    image: Some(twin.kube_proxy_image.clone()),
                }),
                ..Workload::default()
            },
            operation: status.clone(),
            other_operations: vec![],
            stage_operations: vec![],
            inputs_rejected: None,
        };
        // The snapshot the controller would dump parses back to itself.
        let dumped = serde_yaml::to_string(&s).unwrap();
        assert_eq!(ObservedState::parse(&dumped).unwrap(), s);
        let plan = planner.plan_complete(&s, &configs).unwrap();
        assert!(plan.phase != render::api::Phase::Paused, "the upgrade paused at reconcile {i}: {:#?}", plan.actions);
        if plan.phase == render::api::Phase::Completed {
            let mut end = BTreeMap::new();
            for (name, _) in names() {
                let o = observe_node(&client, &name).await.unwrap();
                let mut images: Vec<String> = o.components.values().cloned().collect();
                images.push(o.kubelet_image.clone());
                assert_eq!(fleet.reboots(&name), 0, "{name} rebooted");
                end.insert(name.clone(), (o.running_config.to_string(), images));
            }
            let pulls: Vec<String> = names()
                .iter()
                .flat_map(|(n, _)| fleet.pulls(n).into_iter().map(move |(ns, img)| format!("{n} {ns} {img}")))
                .collect();
            return (end, twin.kube_proxy_image.clone(), pulls);
        }
        let c = crash(i);
        let mut plan = plan;
        if c == Crash::BeforeExecuting {
            // The machines' markers written (Applying, with their clock), then the controller
            // died before acting on them: ADR 0057's resume case (a marker is not truth).
            let mut starts = plan.clone();
            starts.actions.retain(|(a, _)| matches!(a, runtime::plan::Action::Start { .. }));
            status = runtime::status::record(&s, &starts, starts.actions.len(), &[], None).operation;
            continue;
        }
        if let Crash::MidPlan(k) = c {
            plan.actions.truncate(k % (plan.actions.len() + 1));
        }
        let mut exec = Executor { talos: &client, kube: &mut twin };
        let outcome = exec.run(&plan).await;
        assert!(outcome.failed().is_empty() && outcome.stopped().is_none(), "{outcome:?}");
        if matches!(c, Crash::MidPlan(_)) {
            // Died before writing status: the next reconcile re-derives from what it sees.
            continue;
        }
        status =
            runtime::status::record(&s, &plan, outcome.actions.len(), &outcome.failed(), outcome.forbidden()).operation;
    }
    panic!("the upgrade did not complete in 300 reconciles");
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crash {
    None,
    /// The first `k % (len + 1)` actions executed; status not written.
    MidPlan(usize),
    /// The machines' markers written; nothing executed.
    BeforeExecuting,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_of_a_simulated_fleet_completes_stage_by_stage_without_a_reboot() {
    let (end, kube_proxy, pulls) = upgrade(|_| Crash::None).await;
    for (name, (_, images)) in &end {
        for image in images {
            assert!(image.ends_with(&format!(":{TARGET}")), "{name} runs {image}");
        }
    }
    assert_eq!(kube_proxy, format!("registry.k8s.io/kube-proxy:{TARGET}"));
    // Pre-pulls: control-plane images into k8s.io, the kubelet into system.
    assert!(pulls.contains(&format!("cp1 k8s.io registry.k8s.io/kube-apiserver:{TARGET}")), "{pulls:?}");
    assert!(pulls.contains(&format!("w2 system ghcr.io/siderolabs/kubelet:{TARGET}")), "{pulls:?}");
}

/// A reproducible stream (splitmix64).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_at_random_points_end_in_the_same_state_as_an_uninterrupted_run() {
    let clean = upgrade(|_| Crash::None).await;
    let runs = if std::env::var_os("ICHOR_LONG_TESTS").is_some() { 20 } else { 2 };
    for seed in 0..runs {
        let crashed = upgrade(move |i| match mix(seed * 1000 + i as u64) % 5 {
            0 => Crash::MidPlan(mix(i as u64 + seed) as usize),
            1 => Crash::BeforeExecuting,
            _ => Crash::None,
        })
        .await;
        assert_eq!(crashed.0, clean.0, "seed {seed}: the nodes' end state differs");
        assert_eq!(crashed.1, clean.1, "seed {seed}: kube-proxy differs");
    }
}
