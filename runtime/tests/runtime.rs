//! runtime's integration tests: contradictory actions are refused with both proofs; a rules
//! set that does not declare what the operations host needs is a load error, never a panic.

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
        "/// A deliberately wrong rule.\nact_set_status(\"cni.kubeProxy\", \"enabled\") :- operation(_, \"cni\", _).\n",
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
        Action::Pause { message: m() },
        Action::Fail { machine: m(), message: m() },
        Action::SetStatus { field: m(), value: m() },
        Action::Start { machine: m(), stage: m() },
        Action::PullImage { machine: m(), namespace: ContainerdNamespace::K8s, image: m() },
        Action::Cordon { machine: m() },
        Action::Drain { machine: m() },
        Action::Apply { machine: m(), paths: vec![] },
        Action::Done { machine: m() },
        Action::Uncordon { machine: m() },
        Action::SyncManifests { via: m(), field_manager: TALOS_FIELD_MANAGER },
        Action::Delete { via: m(), object: ObjectRef { kind: m(), namespace: None, name: m() } },
        Action::RestoreKubeProxy { via: m() },
        Action::CiliumJob { mode: render::api::KubeProxyMode::Replaced, name: m(), values: serde_json::Value::Null },
        Action::StepDone { step: m() },
        Action::Wait { reason: m(), message: m(), since: None, limit_minutes: 0 },
        Action::Warn { message: m() },
        Action::Complete,
    ];
    let backbone = render::embedded::RULE_FILES.iter().find(|(f, _)| *f == "rules/backbone.rules").unwrap().1;
    for a in &all {
        assert_eq!(a.to_json()["action"], a.kind(), "{a:?}");
        assert!(backbone.contains(&format!("action_order(\"{}\", ", a.kind())), "action_order lacks {}", a.kind());
    }
}
