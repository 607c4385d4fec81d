//! Reconcile benchmark: one reconcile of a 5,000-machine cluster's upgrade as the controller
//! does it with what its caches hold (each node's running config text and render, read before;
//! no I/O wait counted): hash each running config's text, take its classification from the cache
//! (or classify it, the first time), assemble the snapshot, plan. Target: under 100 ms once
//! the cache is warm. Prints the memory the cached machines take (resident set growth).
//! `cargo bench -p runtime --bench reconcile`; under `cargo test` it runs once on 50 machines.

use render::config::Config;
use runtime::assemble::{MachineRead, PendingCache};
use runtime::plan::Planner;
use runtime::state::*;
use std::collections::BTreeMap;
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<f64>().ok()))
        .map_or(0.0, |pages| pages * 4096.0 / 1048576.0)
}

const WORKER: &str = include_str!("../../examples/configs/v1.14/worker.yaml");

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let n = if smoke { 50 } else { 5000 };
    let classifier = render::classify::Classifier::new(&render::classify::RuleSet::embedded()).unwrap();
    let planner = Planner::embedded().unwrap();
    let contract = render::vocab::Contract { major: 1, minor: 14 };
    let before = rss_mb();
    // What the caches hold: each node's running config (text and parsed) and its render.
    let mut machines = vec![];
    for i in 0..n {
        let running_text = WORKER.replacen("auto: stable", &format!("hostname: w{i:05}"), 1);
        let desired_text = running_text.replace("kubelet:v1.36.4", "kubelet:v1.36.5");
        let running = Config::parse(&running_text).unwrap();
        assert!(!running.docs.is_empty());
        let desired = Config::parse(&desired_text).unwrap();
        drop(running);
        let rendered = render::render::Rendered {
            contract,
            text: String::new(),
            config: std::sync::Arc::new(desired),
            inputs_hash: format!("inputs-{i}"),
            patches: vec![],
            set_by: BTreeMap::new(),
            warnings: vec![],
        };
        machines.push((format!("w{i:05}"), running_text, rendered));
    }
    let cache = PendingCache::default();
    let reconcile = |cache: &PendingCache| {
        let mut snap = vec![];
        for (name, text, rendered) in &machines {
            let read = MachineRead {
                name: name.clone(),
                role: render::api::Role::Worker,
                talos_version: "v1.14.3".into(),
                kubelet_version: "v1.36.4".into(),
                node_ready: true,
                ..Default::default()
            };
            snap.push(cache.machine(&classifier, &read, Some(text), rendered).unwrap());
        }
        let s = ObservedState {
            now: "2026-11-30T10:00:00Z".into(),
            cluster: Cluster {
                name: "big".into(),
                kubernetes_version: "v1.36.5".into(),
                release_set_kubernetes: "v1.36.5".into(),
                release_set_talos: "v1.14.6".into(),
                cni: Cni {
                    preset: render::api::CniPreset::Cilium,
                    kube_proxy: render::api::KubeProxyMode::Replaced,
                    handover: render::api::Handover::Disabled,
                    handover_done: false,
                    bootstrap_patch: None,
                    home_kube_proxy_replacement: None,
                },
                status_kube_proxy: Some(render::api::KubeProxyMode::Replaced),
                annotations: BTreeMap::new(),
                cilium_values: None,
                cilium_tunnel: None,
                cilium_adoption: None,
                maintenance: None,
                health: vec![],
            },
            machines: snap,
            workload: Workload::default(),
            operation: Operation {
                target_kubernetes: Some("v1.36.5".into()),
                max_unavailable: 10,
                phase: render::api::Phase::Running,
                done: vec!["manifestsSynced".into()],
                ..Operation::new("upgrade", render::api::OperationKind::Kubernetes)
            },
            other_operations: vec![],
            stage_operations: vec![],
            inputs_rejected: None,
        };
        planner.plan(&s).unwrap()
    };
    let t = Instant::now();
    let plan = reconcile(&cache);
    let cold = t.elapsed();
    assert_eq!(cache.len(), n, "every machine classified once");
    let starts = plan.actions.iter().filter(|(a, _)| matches!(a, runtime::plan::Action::Start { .. })).count();
    assert!(starts > 0, "the plan starts workers: {:?}", plan.actions.first());
    let mut warm = vec![];
    for _ in 0..if smoke { 1 } else { 7 } {
        let t = Instant::now();
        std::hint::black_box(reconcile(&cache));
        warm.push(t.elapsed());
    }
    warm.sort();
    let warm = warm[warm.len() / 2];
    println!(
        "reconcile of a {n}-machine upgrade from the caches: {:.1} ms warm (target < 100 ms), {:.0} ms cold (every machine classified); caches: {:.0} MB resident for {n} machines ({:.1} KB each)",
        warm.as_secs_f64() * 1e3,
        cold.as_secs_f64() * 1e3,
        rss_mb() - before,
        (rss_mb() - before) * 1024.0 / n as f64
    );
}
