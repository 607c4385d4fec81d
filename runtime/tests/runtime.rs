//! runtime's integration tests: contradictory actions are refused with both proofs.

use runtime::plan::{PlanError, Planner};
use runtime::state::ObservedState;

fn rules_with(extra: &str) -> Vec<(String, String)> {
    let mut rules: Vec<(String, String)> =
        render::bundle::RULES.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    rules.push(("rules/broken.rules".into(), extra.into()));
    rules
}

fn snapshot(name: &str) -> ObservedState {
    let text = std::fs::read_to_string(format!("{}/../examples/states/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    ObservedState::parse(&text).unwrap()
}

/// Rules that set one status field to two values make a plan that is never executed; the
/// error carries the proofs of both actions.
#[test]
fn contradictory_actions_are_an_error_with_both_proofs() {
    let planner = Planner::new(
        &rules_with("/// A deliberately wrong rule.\nact_set_status(\"cni.kubeProxy\", \"enabled\") :- operation(_, \"cni\", _).\n"),
        render::bundle::MESSAGES.1,
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
    let planner = Planner::new(
        &rules_with("act_start(\"cp2\", \"apiservers\") :- operation(_, \"kubernetes\", _).\n"),
        render::bundle::MESSAGES.1,
    )
    .unwrap();
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
        serde_yaml::from_str(render::bundle::MESSAGES.1).unwrap();
    let re = regex_lite_templates();
    for (file, text) in render::bundle::RULES {
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
