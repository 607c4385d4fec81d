//! Plan benchmark: one reconcile of a Kubernetes upgrade on a 5,000-machine cluster and on a
//! 4-machine cluster, fact building, evaluation (with provenance) and decoding included.
//! Targets (issue 5): under 50 ms and under 2 ms. `cargo bench -p runtime`; under `cargo test`
//! it runs once on a small cluster as a check.

use runtime::plan::Planner;
use runtime::state::ObservedState;
use std::time::Duration;

/// The allocator the `ichor` binary ships with (cli/src/main.rs), so that what is measured is
/// what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../../tests/shared/timer.rs"]
mod timer;

/// `timer::time`, at most 50 runs.
fn time<R>(budget: Duration, f: impl FnMut() -> R) -> Duration {
    timer::time(budget, 50, f)
}

/// A cluster of 3 control planes and `workers` workers mid-operation: each control plane's
/// line from `cp(i)`, each worker's from `worker(i)`, then the operation's text.
fn snapshot(
    workers: usize,
    cp: impl Fn(usize) -> String,
    worker: impl Fn(usize) -> String,
    operation: &str,
) -> ObservedState {
    let mut text = String::from(
        "now: \"2026-11-29T10:00:00Z\"\ncluster:\n  name: big\n  kubernetesVersion: v1.36.5\n  releaseSetKubernetes: v1.36.5\n  cni: {preset: cilium, kubeProxy: replaced, handover: disabled}\n  statusKubeProxy: replaced\nmachines:\n",
    );
    for i in 1..=3 {
        text += &format!("  - {}\n", cp(i));
    }
    for i in 0..workers {
        text += &format!("  - {}\n", worker(i));
    }
    text += operation;
    ObservedState::parse(&text).expect("bench snapshot parses")
}

/// An upgrade in its kubelet stage: 3 control planes done, `workers` workers pending.
fn cluster(workers: usize) -> ObservedState {
    snapshot(
        workers,
        |i| format!("{{name: cp{i}, role: controlplane, talosVersion: v1.14.3, kubeletVersion: v1.36.5, ready: true}}"),
        |i| {
            format!(
                "{{name: w{i:05}, role: worker, talosVersion: v1.14.3, kubeletVersion: v1.36.4, ready: true, pending: [{{path: KubeletConfig.image, class: reboot-required, appliedBy: kubernetes, new: \"ghcr.io/siderolabs/kubelet:v1.36.5\"}}]}}"
            )
        },
        "operation:\n  name: upgrade\n  kind: kubernetes\n  targetKubernetes: v1.36.5\n  maxUnavailable: 10\n  phase: Running\n  done: [manifestsSynced]\n",
    )
}

/// The same cluster in a Talos upgrade's walk: control planes done, `workers` workers to go
/// to v1.14.6 (their installer image pending, the Talos upgrade's).
fn talos_cluster(workers: usize) -> ObservedState {
    let installer = "factory.talos.dev/metal-installer/abc:v1.14.6";
    snapshot(
        workers,
        |i| {
            format!(
                "{{name: cp{i}, role: controlplane, talosVersion: v1.14.6, osImage: \"Talos (v1.14.6)\", bootId: b-cp{i}, kubeletVersion: v1.36.5, ready: true}}"
            )
        },
        |i| {
            format!(
                "{{name: w{i:05}, role: worker, talosVersion: v1.14.3, osImage: \"Talos (v1.14.3)\", bootId: b-{i}, kubeletVersion: v1.36.5, ready: true, pending: [{{path: UnattendedInstallConfig.installer.image, class: install-time-only, appliedBy: talos, new: \"{installer}\"}}]}}"
            )
        },
        &format!(
            "operation:\n  name: upgrade\n  kind: talos\n  targetTalos: v1.14.6\n  talosInstaller: \"{installer}\"\n  maxUnavailable: 10\n  phase: Running\n  machines: {{cp1: {{phase: Done, stage: verified, startedAt: \"2026-11-29T09:00:00Z\"}}, cp2: {{phase: Done, stage: verified, startedAt: \"2026-11-29T09:00:00Z\"}}, cp3: {{phase: Done, stage: verified, startedAt: \"2026-11-29T09:00:00Z\"}}}}\n"
        ),
    )
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let budget = Duration::from_millis(if smoke { 1 } else { 2000 });
    let planner = Planner::embedded().expect("rules load");
    for (workers, target) in [(if smoke { 97 } else { 4997 }, "50 ms"), (1, "2 ms")] {
        let s = cluster(workers);
        let plan = planner.plan(&s).unwrap();
        let starts = plan.actions.iter().filter(|(a, _)| matches!(a, runtime::plan::Action::Start { .. })).count();
        assert_eq!(starts, 10.min(workers), "maxUnavailable workers start together");
        let t = time(budget, || planner.plan(&s).unwrap());
        println!("plan an upgrade step, {} machines: {:.2} ms (target < {target})", workers + 3, t.as_secs_f64() * 1e3);
        // The Talos upgrade's step on the same fleet, against the Kubernetes upgrade's.
        let s = talos_cluster(workers);
        let plan = planner.plan(&s).unwrap();
        let starts = plan.actions.iter().filter(|(a, _)| matches!(a, runtime::plan::Action::Start { .. })).count();
        assert_eq!(starts, 10.min(workers), "maxUnavailable workers start together: {:?}", plan.actions);
        let talos = time(budget, || planner.plan(&s).unwrap());
        println!(
            "plan a Talos upgrade step, {} machines: {:.2} ms (x{:.2} the Kubernetes upgrade's)",
            workers + 3,
            talos.as_secs_f64() * 1e3,
            talos.as_secs_f64() / t.as_secs_f64()
        );
    }

    // Issue 11: `plan --explain` with 10^5 pending paths riding along one apply. Every proof
    // step is built and printed once, so time and text grow with the facts used.
    let paths = if smoke { 2_000 } else { 100_000 };
    let base = include_str!("../../examples/states/upgrade-start.yaml");
    let extra: String = (0..paths)
        .map(|i| format!("      - {{path: \"machine.nodeLabels.l{i}\", class: safe, new: \"v{i}\"}}\n"))
        .collect();
    let s = ObservedState::parse(&base.replacen("    pending:\n", &format!("    pending:\n{extra}"), 1)).unwrap();
    let explained = |s: &ObservedState| {
        let plan = planner.plan_with(s, true).unwrap();
        let roots: Vec<usize> = plan.actions.iter().flat_map(|(_, p)| p.iter().copied()).collect();
        plan.proofs.render(&roots).len()
    };
    let bytes = explained(&s);
    let t = time(budget, || explained(&s));
    println!(
        "plan --explain, {paths} pending paths: {:.0} ms, {:.1} MB of proofs ({} bytes a path; target < 5 s, linear)",
        t.as_secs_f64() * 1e3,
        bytes as f64 / 1e6,
        bytes / paths
    );
}
