//! A cluster's path policies (`spec.configPolicy`, issue 29) judged before they are admitted:
//! a policy only makes paths stricter than Talos needs, never looser.
//!
//! Start at `check`: every policy pattern parsed, matched against the contract's inventory,
//! and each matched path's own class (the field metadata's) compared with the policy's. The
//! classification itself, with a policy, is `Classifier::classify_with_policy` and the rules'
//! `decided_by_policy` (rules/classify.rules). Pure.

use crate::api::PathPolicy;
use crate::classify::Classifier;
use crate::diff::{Change, Op};
use crate::path::{PatSeg, Path, Pattern};
use crate::vocab::{Class, Contract};

/// What a policy check finds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A pattern that does not parse (refused).
    Invalid {
        /// `spec.configPolicy[i].paths[j]`.
        at: String,
        /// What the parser says.
        problem: String,
    },
    /// A policy that would make a path looser than Talos allows (refused), naming the field
    /// metadata's entry (the fact that forbids it).
    Looser {
        /// `spec.configPolicy[i]`.
        at: String,
        /// The pattern.
        pattern: String,
        /// One path it matches (as the inventory writes it).
        path: String,
        /// The policy's class.
        policy: Class,
        /// The path's own class.
        own: Class,
        /// The entry that gives it (`rules/fieldmeta.yaml:300`), with its source.
        rule: String,
    },
    /// A pattern that matches no path of the contract (a warning).
    Unmatched {
        /// `spec.configPolicy[i].paths[j]`.
        at: String,
        /// The pattern.
        pattern: String,
    },
}

impl Finding {
    /// A refusal (the others are warnings).
    pub fn refuses(&self) -> bool {
        !matches!(self, Finding::Unmatched { .. })
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Invalid { at, problem } => write!(f, "{at}: not a path pattern: {problem}"),
            Finding::Looser { at, pattern, path, policy, own, rule } => write!(
                f,
                "{at}: {pattern} would make {path} {policy}, looser than Talos allows: it is {own} by {rule}; a policy only makes paths stricter"
            ),
            Finding::Unmatched { at, pattern } => {
                write!(f, "{at}: {pattern} matches no path of the contract: it has no effect")
            }
        }
    }
}

/// Whether a policy pattern and an inventory pattern (`*` any key, `[*]` any bracket) can match
/// one path.
fn overlaps(policy: &[PatSeg], inventory: &[PatSeg]) -> bool {
    match (policy.split_first(), inventory.split_first()) {
        (None, None) => true,
        (Some((PatSeg::AnyDepth, rest)), _) => (0..=inventory.len()).any(|k| overlaps(rest, &inventory[k..])),
        (None, Some(_)) | (Some(_), None) => false,
        (Some((p, pr)), Some((i, ir))) => {
            let one = match (p, i) {
                (PatSeg::Member(a), PatSeg::Member(b)) => a == b,
                (PatSeg::Member(_) | PatSeg::AnyMember, PatSeg::AnyMember) | (PatSeg::AnyMember, PatSeg::Member(_)) => {
                    true
                }
                (PatSeg::Bracket(a), PatSeg::Bracket(b)) => a == b,
                (PatSeg::Bracket(_) | PatSeg::AnyBracket, PatSeg::AnyBracket)
                | (PatSeg::AnyBracket, PatSeg::Bracket(_)) => true,
                _ => false,
            };
            one && overlaps(pr, ir)
        }
    }
}

/// An inventory pattern made a path (a key for `*`, a name for `[*]`), to classify.
fn concrete(inventory: &str) -> Option<Path> {
    let mut text = String::new();
    for (i, part) in inventory.split('.').enumerate() {
        if i > 0 {
            text.push('.');
        }
        text.push_str(&part.replace("[*]", "[x]"));
        if part == "*" {
            text.pop();
            text.push('x');
        }
    }
    Path::parse(&text).ok()
}

/// Every finding of `policies` at `contract`: patterns that do not parse, policies looser than
/// a path's own class (one path named per pattern), patterns that match nothing.
pub fn check(c: &Classifier, contract: Contract, policies: &[PathPolicy]) -> Vec<Finding> {
    let mut out = vec![];
    let Some(data) = c.contracts.get(&contract) else { return out };
    let inventory: Vec<(String, Vec<PatSeg>)> =
        data.inventory.patterns().into_iter().filter_map(|p| Pattern::new(&p).ok().map(|x| (p, x.segs))).collect();
    for (i, policy) in policies.iter().enumerate() {
        for (j, text) in policy.paths.iter().enumerate() {
            let at = format!("spec.configPolicy[{i}].paths[{j}]");
            let pattern = match Pattern::new(text) {
                Ok(p) => p,
                Err(e) => {
                    out.push(Finding::Invalid { at, problem: e.to_string() });
                    continue;
                }
            };
            let matched: Vec<(&String, Path)> = inventory
                .iter()
                .filter(|(_, segs)| overlaps(&pattern.segs, segs))
                .filter_map(|(p, _)| concrete(p).map(|path| (p, path)))
                .collect();
            if matched.is_empty() {
                out.push(Finding::Unmatched { at, pattern: text.clone() });
                continue;
            }
            let changes: Vec<Change> = matched
                .iter()
                .map(|(_, path)| Change { path: path.clone(), op: Op::Changed, old: None, new: None })
                .collect();
            let Ok(outcome) = c.classify(contract, &changes, None, false) else { continue };
            let want = policy.class.class();
            let looser =
                matched.iter().zip(&outcome.changes).find(|(_, k)| k.class != Class::Unsupported && want < k.class);
            if let Some(((path, _), k)) = looser {
                let rule = match k.entry() {
                    Some(e) => {
                        let en = &c.meta.entries[e];
                        format!("{}:{} (source: {})", c.fieldmeta_file, en.line, en.source)
                    }
                    None => format!("the fail-closed default ({})", c.why(contract, k)),
                };
                out.push(Finding::Looser {
                    at: format!("spec.configPolicy[{i}]"),
                    pattern: text.clone(),
                    path: (*path).clone(),
                    policy: want,
                    own: k.class,
                    rule,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PolicyClass;

    fn classifier() -> Classifier {
        Classifier::new(&crate::classify::RuleSet::embedded()).unwrap()
    }

    fn policy(paths: &[&str], class: PolicyClass) -> PathPolicy {
        PathPolicy { paths: paths.iter().map(|p| p.to_string()).collect(), class, why: "ours".into() }
    }

    #[test]
    fn a_stricter_policy_passes_and_raises_the_class_through_the_rules() {
        let c = classifier();
        let v14 = c.contract("v1.14").unwrap();
        let p = [policy(&["ResolverConfig.**"], PolicyClass::RebootRequired)];
        assert_eq!(check(&c, v14, &p), []);
        let change = Change {
            path: Path::parse("ResolverConfig.nameservers[0].address").unwrap(),
            op: Op::Changed,
            old: None,
            new: None,
        };
        let plain = c.classify(v14, std::slice::from_ref(&change), None, false).unwrap();
        assert_eq!(plain.changes[0].class, Class::Safe);
        let raised = c.classify_with_policy(v14, std::slice::from_ref(&change), None, &p, false).unwrap();
        assert_eq!(raised.changes[0].class, Class::RebootRequired);
        assert_eq!(raised.changes[0].reason, crate::classify::Reason::Policy(0));
        assert!(c.why_with(v14, &raised.changes[0], &p).contains("spec.configPolicy[0]"));
        // What applying it restarts, and what Talos does, stay the field metadata's.
        let kubelet =
            Change { path: Path::parse("KubeletConfig.extraArgs.v").unwrap(), op: Op::Changed, old: None, new: None };
        let p = [policy(&["KubeletConfig.**"], PolicyClass::RebootRequired)];
        let raised = c.classify_with_policy(v14, std::slice::from_ref(&kubelet), None, &p, false).unwrap();
        assert_eq!(raised.changes[0].reason, crate::classify::Reason::Policy(0));
        assert_eq!(c.restarts(&raised.changes[0]), ["kubelet".to_string()]);
        assert_eq!(c.effect_label(&raised.changes[0]).as_deref(), Some("live, restarts kubelet"));
    }

    #[test]
    fn a_looser_policy_is_refused_naming_the_entry_that_forbids_it() {
        let c = classifier();
        let v14 = c.contract("v1.14").unwrap();
        let f = check(&c, v14, &[policy(&["KernelModuleConfig.**"], PolicyClass::Safe)]);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].refuses());
        let text = f[0].to_string();
        assert!(text.contains("looser than Talos allows") && text.contains("rules/fieldmeta.yaml:"), "{text}");
        // A looser policy never loosens a path, even unadmitted: the rules only raise.
        let change = Change {
            path: Path::parse("KernelModuleConfig[br_netfilter]").unwrap(),
            op: Op::Added,
            old: None,
            new: None,
        };
        let o = c
            .classify_with_policy(v14, &[change], None, &[policy(&["KernelModuleConfig.**"], PolicyClass::Safe)], false)
            .unwrap();
        assert_eq!(o.changes[0].class, Class::RebootRequired);
    }

    #[test]
    fn a_pattern_that_matches_nothing_warns_and_one_that_does_not_parse_is_refused() {
        let c = classifier();
        let v14 = c.contract("v1.14").unwrap();
        let f = check(&c, v14, &[policy(&["NoSuchConfig.**", "machine..x"], PolicyClass::RebootRequired)]);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(!f[0].refuses() && f[0].to_string().contains("NoSuchConfig.** matches no path"), "{}", f[0]);
        assert!(
            f[1].refuses() && f[1].to_string().starts_with("spec.configPolicy[0].paths[1]: not a path pattern"),
            "{}",
            f[1]
        );
    }
}
