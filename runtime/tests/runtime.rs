//! runtime's integration tests: contradictory actions are refused with both proofs; a rules
//! set that does not declare what the operations host needs is a load error, never a panic.

use render::api::{MachinePhase, Phase};
use runtime::plan::{PlanError, Planner};
use runtime::state::ObservedState;

/// The shipped files plus `rules/broken.rules`, under a root that includes both.
fn rules_with(extra: &str) -> Vec<(String, String)> {
    let mut rules: Vec<(String, String)> =
        render::embedded::RULE_FILES.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    rules.push(("rules/broken.rules".into(), extra.into()));
    rules.push((ROOT.into(), ".include \"programs/operations.rules\"\n.include \"broken.rules\"\n".into()));
    rules
}

const ROOT: &str = "rules/root.rules";

fn planner_with(extra: &str) -> Result<Planner, PlanError> {
    Planner::new(&rules_with(extra), ROOT, render::embedded::MESSAGES)
}

/// The shipped files with one text replaced.
fn shipped_with(file: &str, from: &str, to: &str) -> Vec<(String, String)> {
    render::embedded::RULE_FILES
        .iter()
        .map(|(a, b)| (a.to_string(), if *a == file { b.replacen(from, to, 1) } else { b.to_string() }))
        .collect()
}

fn load_error(files: &[(String, String)]) -> String {
    match Planner::new(files, render::embedded::OPERATIONS_PROGRAM, render::embedded::MESSAGES) {
        Err(PlanError::Load(e)) => e.render(),
        Err(other) => panic!("expected a load error, got {other}"),
        Ok(_) => panic!("expected a load error, the planner loaded"),
    }
}

/// A program that lacks a relation the host reads names it, at the program's root.
#[test]
fn a_missing_host_relation_is_a_located_load_error() {
    let block = ".decl cilium_job_mode(mode: symbol)\n.output cilium_job_mode\ncilium_job_mode(M) :- current_kube_proxy_mode(M), !switching(_).\n";
    assert!(
        render::embedded::RULE_FILES.iter().any(|(_, t)| t.contains(block)),
        "the test's premise: switch.rules has the block"
    );
    let text = load_error(&shipped_with("rules/switch.rules", block, ""));
    assert_eq!(
        text,
        "rules/programs/operations.rules:1:1: error: the program declares no relation `cilium_job_mode`, which the operations host reads: declare `.decl cilium_job_mode(mode: symbol)` in a file the program includes\n"
    );
}

/// Another arity than the host's is reported at the declaration, naming the relation.
#[test]
fn a_host_relation_with_another_arity_is_a_located_load_error() {
    let decl = ".decl act_complete()";
    let files = shipped_with("rules/backbone.rules", decl, ".decl act_complete(why: symbol)");
    let text = load_error(&files);
    assert!(text.contains("rules/backbone.rules:"), "{text}");
    assert!(text.contains("`act_complete`"), "{text}");
}

fn snapshot(name: &str) -> ObservedState {
    let text = std::fs::read_to_string(format!("{}/../examples/states/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    ObservedState::parse(&text).unwrap()
}

/// Rules that set one status field to two values make a plan that is never executed; the
/// error carries the proofs of both actions.
#[test]
fn contradictory_actions_are_an_error_with_both_proofs() {
    let planner = planner_with(
        "/// A deliberately wrong rule.\nact_set_kube_proxy_status(\"enabled\") :- operation(_, \"cni\", _).\n",
    )
    .unwrap();
    let mut s = snapshot("switch-replacing-start.yaml");
    s.workload.cilium_kube_proxy_replacement = Some("true".into());
    match planner.plan(&s) {
        Err(PlanError::Contradiction { what, proofs }) => {
            assert_eq!(what, "two values for status.cni.kubeProxy");
            assert_eq!(proofs.len(), 2);
            assert!(proofs.iter().any(|p| p.contains("rules/broken.rules")), "{proofs:?}");
            assert!(proofs.iter().any(|p| p.contains("rules/switch.rules")), "{proofs:?}");
        }
        other => panic!("expected a contradiction, got {other:?}"),
    }
}

/// Two control planes started in one plan is refused, whatever the rules say.
#[test]
fn two_control_planes_never_start_together() {
    let planner = planner_with("act_start(\"cp2\", \"apiservers\") :- operation(_, \"kubernetes\", _).\n").unwrap();
    match planner.plan(&snapshot("upgrade-start.yaml")) {
        Err(PlanError::Contradiction { what, proofs }) => {
            assert!(what.starts_with("two control planes start in one plan"), "{what}");
            assert_eq!(proofs.len(), 2);
        }
        other => panic!("expected a contradiction, got {other:?}"),
    }
}

/// The shipped rules and templates load, and every template a rule names exists.
#[test]
fn every_message_template_a_rule_names_exists() {
    let templates: std::collections::BTreeMap<String, String> =
        serde_yaml::from_str(render::embedded::MESSAGES.1).unwrap();
    let re = regex_lite_templates();
    for (file, text) in render::embedded::RULE_FILES {
        for name in re.iter().flat_map(|pat| extract(text, pat)) {
            assert!(templates.contains_key(&name), "{file} names template {name:?}, which rules/messages.yaml lacks");
        }
    }
    Planner::embedded().unwrap();
}

fn regex_lite_templates() -> Vec<&'static str> {
    vec![
        "act_wait(\"",
        "act_pause(\"",
        "act_fail(M, \"",
        "act_warn(\"",
        "refusal(\"",
        "upgrade_warning(\"",
        "sw_refusal(\"",
        "ad_refusal(0, \"",
        "ad_refusal(1, \"",
        "ad_refusal(2, \"",
        "ad_refusal(3, \"",
        "ad_refusal(4, \"",
        "ad_refusal(5, \"",
    ]
}

fn extract(text: &str, prefix: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        if let Some(end) = rest.find('"') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

/// `Action::kind` names each action as serde serializes it, and the rules' `action_order`
/// ranks every kind (an unranked kind would sort last silently).
#[test]
fn every_action_kind_is_its_serialized_tag_and_ranked_by_the_rules() {
    use runtime::plan::{Action, ContainerdNamespace, ObjectRef, TALOS_FIELD_MANAGER};
    let m = || "cp1".to_string();
    let all = vec![
        Action::Abort { was: Phase::Running },
        Action::Resume,
        Action::Pause { message: m() },
        Action::Fail { machine: m(), message: m() },
        Action::SetKubeProxyStatus { mode: render::api::KubeProxyMode::Replaced },
        Action::Start { machine: m(), stage: m(), boot_id: None },
        Action::PullImage { machine: m(), node: None, namespace: ContainerdNamespace::K8s, image: m() },
        Action::Cordon { machine: m() },
        Action::Drain { machine: m(), force: false },
        Action::Apply { machine: m(), node: None, paths: vec![], payload: None },
        Action::ApplyStaged { machine: m(), node: None, paths: vec![], payload: None },
        Action::Reboot { machine: m(), node: None },
        Action::Done { machine: m() },
        Action::Uncordon { machine: m() },
        Action::SyncManifests { via: m(), node: None, field_manager: TALOS_FIELD_MANAGER },
        Action::Delete { object: ObjectRef { api_version: m(), kind: m(), namespace: None, name: m() } },
        Action::RestoreKubeProxy { via: m(), node: None, manifest: m(), field_manager: TALOS_FIELD_MANAGER },
        Action::CiliumJob {
            mode: render::api::KubeProxyMode::Replaced,
            name: m(),
            values: serde_json::Value::Null,
            user: serde_json::Value::Null,
            tunnel: "vxlan".into(),
            take_ownership: true,
        },
        Action::RecordCiliumAdoption { chart: m() },
        Action::StepDone { step: m() },
        Action::Wait { reason: m(), message: m(), clock: m(), since: m(), limit_minutes: 0 },
        Action::ClearClock { clock: m() },
        Action::Warn { message: m() },
        Action::Complete,
    ];
    let backbone = render::embedded::RULE_FILES.iter().find(|(f, _)| *f == "rules/backbone.rules").unwrap().1;
    for a in &all {
        assert_eq!(a.to_json()["action"], a.kind(), "{a:?}");
        assert!(backbone.contains(&format!("action_order(\"{}\", ", a.kind())), "action_order lacks {}", a.kind());
    }
}

/// The Rust enum's `is_terminal` and `holds_lock` say what the rules' `terminal` and
/// `holds_lock` say (rules/backbone.rules), and every phase the rules name is a `Phase`.
#[test]
fn the_phase_enum_is_pinned_to_the_rules() {
    let planner = Planner::embedded().unwrap();
    let (terminal, lock) = planner.phase_sets().unwrap();
    let want = |f: fn(Phase) -> bool| Phase::ALL.iter().copied().filter(|p| f(*p)).collect::<Vec<_>>();
    assert_eq!(terminal, want(Phase::is_terminal));
    assert_eq!(lock, want(Phase::holds_lock));
    // Every quoted phase-like symbol in the backbone's phase rules names a Phase.
    let backbone = render::embedded::RULE_FILES.iter().find(|(f, _)| *f == "rules/backbone.rules").unwrap().1;
    for line in backbone.lines().filter(|l| l.starts_with("phase(") || l.starts_with("from_phase(")) {
        for sym in extract(line, "\"").iter().filter(|s| s.chars().next().is_some_and(char::is_uppercase)) {
            assert!(Phase::parse(sym).is_some(), "{sym} in `{line}` is not a render::api::Phase");
        }
    }
}

/// The kube-proxy mode in force is one decision: without a live cilium-config, the rules'
/// `current_kube_proxy_mode` (read back as the mode of Cilium Jobs outside a switch) is what
/// `render::render::kube_proxy_in_force` says for every status and spec.
#[test]
fn the_kube_proxy_mode_in_force_is_pinned_to_the_rules() {
    use render::api::KubeProxyMode;
    let planner = Planner::embedded().unwrap();
    let base = snapshot("upgrade-start.yaml");
    for status in [None, Some(KubeProxyMode::Enabled), Some(KubeProxyMode::Replaced)] {
        for spec in KubeProxyMode::ALL.iter().copied() {
            let mut s = base.clone();
            s.workload.cilium_kube_proxy_replacement = None;
            s.cluster.status_kube_proxy = status;
            s.cluster.cni.kube_proxy = spec;
            let mut tc = render::api::TalosCluster::new("lab", Default::default());
            tc.spec.cni.kube_proxy = spec;
            tc.status = Some(render::api::TalosClusterStatus {
                cni: Some(render::api::CniStatus { kube_proxy: status, ..Default::default() }),
                ..Default::default()
            });
            let plan = planner.plan(&s).unwrap();
            assert_eq!(
                plan.cilium_job_mode,
                Some(render::render::kube_proxy_in_force(&tc)),
                "status {status:?}, spec {spec:?}"
            );
        }
    }
}

// ---- issue 12: properties of every plan, over random upgrade snapshots -------------------

#[path = "../../tests/shared/seeded.rs"]
mod seeded;
use seeded::Seeded as Rng;

const COMPONENTS: [(&str, &str, &str); 3] = [
    ("kube-apiserver", "KubeAPIServerConfig.image", "registry.k8s.io/kube-apiserver"),
    ("kube-controller-manager", "KubeControllerManagerConfig.image", "registry.k8s.io/kube-controller-manager"),
    ("kube-scheduler", "KubeSchedulerConfig.image", "registry.k8s.io/kube-scheduler"),
];

/// A well-formed upgrade snapshot from v1.36.4 to v1.36.5 at a random point: each component
/// either done (the node's config on the target, its pod on the target) or not (still pending,
/// the pod on the old image), markers of progress that may or may not match the node, holds,
/// readiness, clocks around their 20-minute limit, the sync done or not.
fn random_upgrade(r: &mut Rng) -> String {
    let cps = 1 + r.below(3);
    let workers = r.below(4);
    let controller = r.below(cps + workers);
    let mut text = String::from(
        "now: \"2026-11-29T10:00:00Z\"\ncluster:\n  name: lab\n  kubernetesVersion: v1.36.5\n  releaseSetKubernetes: v1.36.5\n  cni: {preset: cilium, kubeProxy: enabled, handover: disabled}\nmachines:\n",
    );
    let mut progress = String::new();
    for i in 0..cps + workers {
        let cp = i < cps;
        let name = if cp { format!("cp{i}") } else { format!("w{i}") };
        let kubelet_done = r.chance(30);
        let mut pending = vec![];
        let mut pods = vec![];
        if cp {
            for (pod, path, image) in COMPONENTS {
                let done = kubelet_done || r.chance(50);
                let tag = if done { "v1.36.5" } else { "v1.36.4" };
                if !done {
                    pending.push(format!(
                        "{{path: {path}, class: reboot-required, appliedBy: kubernetes, new: \"{image}:v1.36.5\"}}"
                    ));
                }
                pods.push(format!("{pod}: {{image: \"{image}:{tag}\", ready: {}}}", r.chance(90)));
            }
        }
        if !kubelet_done {
            pending.push("{path: KubeletConfig.image, class: reboot-required, appliedBy: kubernetes, new: \"ghcr.io/siderolabs/kubelet:v1.36.5\"}".into());
        }
        let kubelet = if kubelet_done { "v1.36.5" } else { "v1.36.4" };
        text += &format!(
            "  - name: {name}\n    role: {}\n    talosVersion: v1.14.3\n    kubeletVersion: {kubelet}\n    ready: {}\n    hold: {}\n    runsController: {}\n    pending: [{}]\n    staticPods: {{{}}}\n",
            if cp { "controlplane" } else { "worker" },
            r.chance(85),
            r.chance(10),
            i == controller,
            pending.join(", "),
            pods.join(", "),
        );
        if r.chance(30) {
            let stage = ["apiservers", "controlplane", "kube-proxy", "kubelets"][r.below(4) as usize];
            let phase = if r.chance(70) { MachinePhase::Applying } else { MachinePhase::Done };
            // Clocks from 40 minutes ago to now, around the 20-minute limit.
            let ago = r.below(40);
            progress += &format!(
                "    {name}: {{phase: {phase}, stage: {stage}, startedAt: \"2026-11-29T09:{:02}:00Z\"}}\n",
                59 - ago.min(59)
            );
        }
    }
    let kp = if r.chance(50) { "v1.36.5" } else { "v1.36.4" };
    text += &format!(
        "workload:\n  ciliumKubeProxyReplacement: \"false\"\n  kubeProxyDaemonSet: {{desired: 4, updated: 4, ready: 4, generation: 2, observedGeneration: 2, image: \"registry.k8s.io/kube-proxy:{kp}\"}}\n"
    );
    if r.chance(20) {
        text += "  removedApisCheckFailed: \"the metrics endpoint answered 503\"\n";
    }
    let phase = if progress.is_empty() && r.chance(50) { Phase::Pending } else { Phase::Running };
    text += &format!(
        "operation:\n  name: upgrade\n  kind: kubernetes\n  targetKubernetes: v1.36.5\n  maxUnavailable: {}\n  phase: {phase}\n  done: [{}]\n",
        1 + r.below(3),
        if r.chance(40) { "manifestsSynced" } else { "" }
    );
    if r.chance(40) {
        let clock = ["ApiServersReady", "KubeProxyRollingOut", "LockHeld", "SomethingFinished"][r.below(4) as usize];
        text += &format!("  waitingSince: {{{clock}: \"2026-11-29T09:{:02}:00Z\"}}\n", 59 - r.below(40));
    }
    if !progress.is_empty() {
        text += &format!("  machines:\n{progress}");
    }
    if r.chance(10) {
        text += "otherOperations: [{name: other, kind: cni, phase: Running}]\n";
    }
    text
}

/// Plans `cases` random snapshots from `generate` (500, or 100,000 with `ICHOR_LONG_TESTS=1`)
/// and checks on each what holds for every operation: a Running plan acts, waits, pauses or
/// completes; planning twice gives the same plan; then `check`, the kind's own properties,
/// with a context printer for its messages.
fn check_plans(
    seed: u64,
    generate: fn(&mut Rng) -> String,
    check: impl Fn(&ObservedState, &runtime::plan::Plan, &dyn Fn() -> String),
) {
    let cases = if std::env::var_os("ICHOR_LONG_TESTS").is_some() { 100_000 } else { 500 };
    let planner = Planner::embedded().unwrap();
    let mut r = Rng(seed);
    for _ in 0..cases {
        let text = generate(&mut r);
        let s = ObservedState::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let plan = planner.plan(&s).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let ctx =
            || format!("\n{text}\nplan: {:#?}", plan.actions.iter().map(|(a, _)| a.to_string()).collect::<Vec<_>>());
        assert!(
            plan.phase != render::api::Phase::Running || !plan.actions.is_empty(),
            "a Running plan that does nothing{}",
            ctx()
        );
        clocks_hold(&s, &plan, &ctx);
        check(&s, &plan, &ctx);
        // The plan's own status changes recorded, as the executor records them: planning again
        // never repeats a finished cluster-wide step or a status already set.
        let after = runtime::status::record(&s, &plan, plan.actions.len(), &[], None);
        // A request RBAC refused: the operation pauses naming it, and no machine is recorded
        // for it.
        let refused = runtime::status::record(&s, &plan, 0, &[], Some("refused"));
        if !plan.phase.is_terminal() {
            assert_eq!(refused.operation.phase, render::api::Phase::Paused, "{}", ctx());
            assert_eq!(refused.operation.paused_reason.as_deref(), Some("refused"), "{}", ctx());
        }
        assert!(!refused.operation.machines.contains_key(""), "{}", ctx());
        let next = planner.plan(&after).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for (a, _) in &next.actions {
            match a {
                runtime::plan::Action::StepDone { step } => {
                    assert!(!after.operation.done.contains(step), "step {step} repeated{}", ctx())
                }
                runtime::plan::Action::SyncManifests { .. } => assert!(
                    !after.operation.done.iter().any(|d| d == "manifestsSynced"),
                    "the manifest sync repeated{}",
                    ctx()
                ),
                runtime::plan::Action::SetKubeProxyStatus { mode } => assert!(
                    after.cluster.status_kube_proxy != Some(*mode),
                    "status.cni.kubeProxy set again to {mode}{}",
                    ctx()
                ),
                _ => {}
            }
        }
        // A wait that goes on runs on the clock recorded for it, not a fresh one.
        for (a, _) in &next.actions {
            if let runtime::plan::Action::Wait { clock, since, .. } = a
                && let Some(t) = after.operation.waiting_since.get(clock)
            {
                assert_eq!(since, t, "the wait on {clock} restarted its clock{}", ctx());
            }
        }
        let again = planner.plan(&s).unwrap();
        assert_eq!(
            again.actions.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>(),
            plan.actions.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>(),
            "planning twice differs{}",
            ctx()
        );
    }
}

/// Every wait names its clock and a limit; a clock the snapshot holds runs on from its start
/// or is cleared; a wait past its limit is never planned (the plan pauses instead).
fn clocks_hold(s: &ObservedState, plan: &runtime::plan::Plan, ctx: &dyn Fn() -> String) {
    use runtime::plan::Action;
    let now = runtime::state::epoch(&s.now).unwrap();
    for (a, _) in &plan.actions {
        if let Action::Wait { clock, since, limit_minutes, .. } = a {
            assert!(!clock.is_empty() && *limit_minutes > 0, "a wait without a named clock and limit: {a}{}", ctx());
            let t = runtime::state::epoch(since).unwrap();
            assert!(now - t <= limit_minutes * 60, "a wait past its limit: {a}{}", ctx());
            if let Some(held) = s.operation.waiting_since.get(clock) {
                assert_eq!(since, held, "the wait on {clock} ignores the clock held in status{}", ctx());
            }
        }
    }
    for clock in s.operation.waiting_since.keys() {
        let runs = plan.actions.iter().any(|(a, _)| matches!(a, Action::Wait { clock: c, .. } if c == clock));
        let cleared = plan.actions.iter().any(|(a, _)| matches!(a, Action::ClearClock { clock: c } if c == clock));
        assert!(runs != cleared, "clock {clock} neither runs on nor is cleared (or both){}", ctx());
    }
}

/// The properties issue 12 names, on every plan of random upgrade snapshots (with those of
/// `check_plans`): a held machine is never touched; a pausing plan changes nothing else; no
/// kubelet starts while any API server is behind.
#[test]
fn every_upgrade_plan_keeps_the_operation_properties() {
    use runtime::plan::Action;
    check_plans(0x12, random_upgrade, |s, plan, ctx| {
        let touches = |a: &Action| -> Option<String> {
            match a {
                Action::Start { machine, .. }
                | Action::PullImage { machine, .. }
                | Action::Cordon { machine }
                | Action::Drain { machine, .. }
                | Action::Apply { machine, .. } => Some(machine.clone()),
                _ => None,
            }
        };
        for (a, _) in &plan.actions {
            if let Some(m) = touches(a) {
                assert!(!s.machines.iter().any(|x| x.name == m && x.hold), "held {m} touched{}", ctx());
            }
        }
        let stops = plan.actions.iter().any(|(a, _)| matches!(a, Action::Pause { .. } | Action::Fail { .. }));
        if stops {
            for (a, _) in &plan.actions {
                let changes = touches(a).is_some()
                    || matches!(
                        a,
                        Action::SyncManifests { .. }
                            | Action::Delete { .. }
                            | Action::CiliumJob { .. }
                            | Action::Complete
                    );
                assert!(!changes, "a pausing plan also does {a}{}", ctx());
            }
        }
        let behind = s
            .machines
            .iter()
            .any(|m| m.static_pods.get("kube-apiserver").is_some_and(|p| !p.ready || !p.image.ends_with(":v1.36.5")));
        for (a, _) in &plan.actions {
            if let Action::Start { stage, .. } = a {
                assert!(!(behind && stage == "kubelets"), "a kubelet starts while an API server is behind{}", ctx());
            }
        }
    });
}

/// A well-formed kube-proxy switch snapshot in either direction at a random point: the status
/// set or not, cilium-config's live value, the Cilium and kube-proxy DaemonSets present,
/// rolled out or not, machines pending their KubeProxyConfig or switched, holds, clocks.
fn random_switch(r: &mut Rng) -> String {
    let target = if r.chance(50) { "replaced" } else { "enabled" };
    let other = if target == "replaced" { "enabled" } else { "replaced" };
    let handover = ["automatic", "manual", "disabled"][r.below(3) as usize];
    let mut text = format!(
        "now: \"2026-11-29T10:00:00Z\"\ncluster:\n  name: lab\n  kubernetesVersion: v1.36.4\n  releaseSetKubernetes: v1.36.4\n  cni: {{preset: cilium, kubeProxy: {target}, handover: {handover}, handoverDone: {}{}{}}}\n",
        r.chance(50),
        if r.chance(50) { ", bootstrapPatch: ichor-system/cilium-bootstrap" } else { "" },
        if r.chance(40) { format!(", homeKubeProxyReplacement: \"{}\"", r.chance(50)) } else { String::new() }
    );
    if r.chance(50) {
        text += &format!("  statusKubeProxy: {}\n", if r.chance(50) { target } else { other });
    }

    text += &format!("  annotations: {{ichor.maesh.dev/confirm-kube-proxy-switch: {target}}}\nmachines:\n");
    let cps = 1 + r.below(3);
    let workers = r.below(3);
    let mut progress = String::new();
    for i in 0..cps + workers {
        let cp = i < cps;
        let name = if cp { format!("cp{i}") } else { format!("w{i}") };
        let pending = if r.chance(50) {
            "[{path: KubeProxyConfig.enabled, class: reboot-required, appliedBy: cni}]"
        } else {
            "[]"
        };
        text += &format!(
            "  - {{name: {name}, role: {}, talosVersion: v1.14.3, kubeletVersion: v1.36.4, ready: {}, hold: {}, runsController: {}, pending: {pending}, kubeProxyManifestRendered: {}}}\n",
            if cp { "controlplane" } else { "worker" },
            r.chance(90),
            r.chance(10),
            i == cps + workers - 1,
            r.chance(80),
        );
        if r.chance(25) {
            let phase = if r.chance(70) { MachinePhase::Applying } else { MachinePhase::Done };
            progress += &format!(
                "    {name}: {{phase: {phase}, stage: switch, startedAt: \"2026-11-29T09:{:02}:00Z\"}}\n",
                20 + r.below(40)
            );
        }
    }
    text += "workload:\n";
    if r.chance(80) {
        text += &format!("  ciliumKubeProxyReplacement: \"{}\"\n", r.chance(50));
    }
    let (d, u) = (4, if r.chance(70) { 4 } else { 2 });
    text += &format!(
        "  ciliumDaemonSet: {{desired: {d}, updated: {u}, ready: {u}, generation: 5, observedGeneration: {}}}\n",
        if r.chance(80) { 5 } else { 4 }
    );
    if r.chance(60) {
        text += "  kubeProxyDaemonSet: {desired: 4, updated: 4, ready: 4, generation: 2, observedGeneration: 2, image: \"registry.k8s.io/kube-proxy:v1.36.4\"}\n  kubeProxyConfigMaps: [kube-proxy]\n";
    }
    if r.chance(50) {
        text +=
            &format!("  kubeProxyServiceAccount: {}\n  kubeProxyClusterRoleBinding: {}\n", r.chance(50), r.chance(50));
    }
    if r.chance(30) {
        text += "  ciliumConfigRead: true\n";
        if r.chance(70) {
            text += "  ciliumK8sServiceHost: localhost\n  ciliumK8sServicePort: \"7445\"\n";
        }
    }
    if r.chance(20) {
        text += &format!("  ciliumChartVersion: \"{}\"\n", ["1.19.3", "1.20.0", "1.21.0"][r.below(3) as usize]);
    }
    if r.chance(30) {
        let (h, sy) =
            [("Healthy", "Synced"), ("Progressing", "OutOfSync"), ("Degraded", "Synced")][r.below(3) as usize];
        text += &format!("  argocdApplication: {{health: {h}, sync: {sy}}}\n");
    }
    text += &format!("  kubernetesServiceAnswers: {}\n", r.chance(70));
    let phase = if progress.is_empty() && r.chance(50) { Phase::Pending } else { Phase::Running };
    text += &format!("operation:\n  name: switch\n  kind: cni\n  targetKubeProxy: {target}\n  phase: {phase}\n");
    if r.chance(40) {
        let clock = [
            "AwaitingCNIChange",
            "VerifyingNewSide/CiliumRollingOut",
            "VerifyingNewSide/ServiceAnswering",
            "VerifyingNewSide/KubeProxyRestored",
            "VerifyingNewSide/CiliumSteppingAside",
            "VerifyingNewSide",
        ][r.below(6) as usize];
        let at = ["2026-11-28T09:00:00Z", "2026-11-29T09:00:00Z", "2026-11-29T09:31:00Z", "2026-11-29T09:50:00Z"];
        text += &format!("  waitingSince: {{{clock}: \"{}\"}}\n", at[r.below(4) as usize]);
    }
    if !progress.is_empty() {
        text += &format!("  machines:\n{progress}");
    }
    text
}

/// Issue 12's properties over random switches (with those of `check_plans`): a held machine
/// is never touched; a pausing plan changes nothing else; every Cilium Job carries the
/// switch's target; deletions and restores go through a control plane that is not held.
#[test]
fn every_switch_plan_keeps_the_operation_properties() {
    use runtime::plan::Action;
    check_plans(0x66, random_switch, |s, plan, ctx| {
        let target = s.operation.target_kube_proxy.unwrap();
        let held_cp =
            |m: &str| s.machines.iter().any(|x| x.name == m && (x.hold || x.role != render::api::Role::Controlplane));
        let stops = plan.actions.iter().any(|(a, _)| matches!(a, Action::Pause { .. } | Action::Fail { .. }));
        for (a, _) in &plan.actions {
            match a {
                Action::Start { machine, .. } | Action::Apply { machine, .. } => {
                    assert!(
                        !s.machines.iter().any(|x| &x.name == machine && x.hold),
                        "held {machine} touched{}",
                        ctx()
                    );
                }
                Action::CiliumJob { mode, .. } => assert_eq!(*mode, target, "a Job for the other mode{}", ctx()),
                Action::RestoreKubeProxy { via, .. } => {
                    assert!(!held_cp(via), "through {via}, not a control plane that is not held{}", ctx())
                }
                _ => {}
            }
            let changes = matches!(
                a,
                Action::Start { .. }
                    | Action::Apply { .. }
                    | Action::Delete { .. }
                    | Action::RestoreKubeProxy { .. }
                    | Action::CiliumJob { .. }
                    | Action::Complete
            );
            assert!(!(stops && changes), "a pausing plan also does {a}{}", ctx());
        }
    });
}

/// The snapshot example of docs/operations.md names every field there is, and parses and plans
/// as written.
#[test]
fn the_docs_snapshot_example_is_a_valid_snapshot_with_every_field() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md")).unwrap();
    let start = readme.find("```yaml\nnow:").expect("docs/operations.md's snapshot example") + 8;
    let text = &readme[start..start + readme[start..].find("```").unwrap()];
    let s = ObservedState::parse(text).unwrap_or_else(|e| panic!("{e:?}"));
    Planner::embedded().unwrap().plan(&s).unwrap();
    // Every field of the format is shown: serialized back, no key is missing from the text.
    let json = serde_json::to_value(&s).unwrap();
    let mut missing = vec![];
    fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => m.iter().for_each(|(k, v)| {
                out.push(k.clone());
                keys(v, out)
            }),
            serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }
    let mut all = vec![];
    keys(&json, &mut all);
    for k in all {
        if !text.contains(&format!("{k}:")) {
            missing.push(k);
        }
    }
    assert!(missing.is_empty(), "fields docs/operations.md's example does not show: {missing:?}");
}

/// The controller's role allows what a drain and the operations need and no more (the install
/// manifests themselves are tested in tests/install.rs), and a request line reads as its verb.
#[test]
fn the_controllers_role_allows_evictions_never_pod_deletes() {
    assert!(runtime::rbac::allowed("create", "", "pods/eviction"));
    assert!(!runtime::rbac::allowed("delete", "", "pods"), "a drain evicts, never deletes");
    assert!(
        !runtime::rbac::allowed("create", "apps", "daemonsets")
            || runtime::rbac::allowed("patch", "apps", "daemonsets")
    );
    assert_eq!(
        runtime::rbac::request("PATCH /apis/ichor.maesh.dev/v1alpha1/namespaces/x/talosoperations/op/status?"),
        Some(("patch".into(), "ichor.maesh.dev".into(), "talosoperations/status".into()))
    );
    assert_eq!(
        runtime::rbac::request("GET /api/v1/pods?fieldSelector=x&watch=true"),
        Some(("watch".into(), "".into(), "pods".into()))
    );
}
