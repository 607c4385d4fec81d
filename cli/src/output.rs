//! The diff report of `ichor config diff` and `ichor apply`: what changes between two configs,
//! classified, as text (a verdict sentence, the change list, a unified diff) or JSON. Values of
//! sensitive paths are `<redacted>` in every form.
//!
//! Start at `diff_report`.

use crate::{Output, Report};
use anyhow::{Context, Result};
use render::classify::{Classified, Classifier, MachineContext, Outcome};
use render::config::Config;
use render::diff::{self, REDACTED};
use render::path::Path;
use render::vocab::{Class, Contract, Verdict};
use serde_json::{Value as Json, json};

pub(crate) fn rule_json(c: &Classifier, entry: Option<usize>, path: &Path) -> Json {
    match entry {
        None => Json::Null,
        Some(e) => {
            let en = &c.meta.entries[e];
            let pattern = best_pattern(c, e, path);
            json!({"file": c.fieldmeta_file, "line": en.line, "pattern": pattern})
        }
    }
}

/// The entry's most specific pattern that matches the path (for display).
pub(crate) fn best_pattern(c: &Classifier, e: usize, path: &Path) -> String {
    let en = &c.meta.entries[e];
    en.patterns
        .iter()
        .filter(|p| p.matches(path))
        .max_by_key(|p| p.specificity)
        .map(|p| p.text.clone())
        .unwrap_or_default()
}

fn value_json(v: &Option<serde_yaml::Value>, sensitive: bool) -> Json {
    match v {
        None => Json::Null,
        Some(_) if sensitive => json!(REDACTED),
        Some(v) => serde_json::to_value(v).unwrap_or(Json::Null),
    }
}

fn verdict_sentence(c: &Classifier, o: &Outcome) -> String {
    let n = o.changes.len();
    let count = |class: Class| o.changes.iter().filter(|k| k.class == class).count();
    match o.verdict {
        Verdict::NoChanges => "No changes.".into(),
        Verdict::LiveApply if o.changes.iter().all(|k| k.reason == render::classify::Reason::Moved) => format!(
            "Only moves: each of the {n} changed path(s) holds the same value at its v1.14 document or legacy field; nothing changes on the node."
        ),
        Verdict::LiveApply => format!("Applies without a reboot ({n} changed path(s))."),
        Verdict::InstallTimeOnly => format!(
            "Applies without a reboot, but {} of {n} changed path(s) take effect only at the next install or Talos upgrade.",
            count(Class::InstallTimeOnly)
        ),
        Verdict::RebootRequired => {
            let ops = o.changes.iter().filter(|k| c.applied_by(k).is_some()).count();
            let tail = if ops > 0 { format!(" ({ops} of them only through their operation)") } else { String::new() };
            format!(
                "Needs a reboot: {} of {n} changed path(s) cannot be applied live{tail}.",
                count(Class::RebootRequired)
            )
        }
        Verdict::Unsupported if count(Class::Unsupported) == 0 => {
            format!("Talos would refuse this configuration ({} refusal(s) below).", o.rejected.len())
        }
        Verdict::Unsupported => format!(
            "{} of {n} changed path(s) do not exist at contract {}: Talos would refuse this configuration.",
            count(Class::Unsupported),
            o.contract
        ),
    }
}

/// A config and the name it is shown under in the diff.
pub type Named<'a> = (&'a Config, &'a str);

pub fn diff_report(
    c: &Classifier,
    (old, from_name): Named,
    (new, to_name): Named,
    contract: Option<&str>,
    output: Output,
    machine: Option<(&str, &MachineContext, &str)>,
) -> Result<Report> {
    let (contract, inferred) = match contract {
        Some(name) => (c.contract(name).context("--contract")?, None),
        None => {
            let (ct, why) = c.infer_contract(&[old, new]);
            (ct, Some(why))
        }
    };
    let changes = diff::changes(old, new);
    let outcome =
        c.classify_machine(contract, &changes, Some(new), machine.map(|m| m.1), false).context("classifying")?;
    let sensitive = |p: &Path| c.sensitive(contract, p);
    let old_text = diff::redacted_yaml(old, &sensitive);
    let new_text = diff::redacted_yaml(new, &sensitive);
    let unified = diff::unified(&old_text, &new_text, from_name, to_name);
    let findings = outcome.verdict != Verdict::NoChanges || !outcome.rejected.is_empty();
    let verdict_json = |name: &str, hash: &str| {
        outcome.machine.as_ref().map(|v| {
            json!({"name": name, "ready": {"status": v.status, "reason": v.reason, "message": v.message}, "rebootPaths": v.reboot_paths, "desiredInputsHash": hash})
        })
    };
    let pairs: Vec<Classed> = changes
        .iter()
        .zip(&outcome.changes)
        .zip(outcome.no_effect.iter().zip(&outcome.moved_to))
        .map(|((ch, k), (dead, other))| (ch, k, dead.as_deref(), other.as_deref()))
        .collect();
    let policy = machine.map(|m| &m.1.policy[..]).unwrap_or(&[]);
    let stdout = match output {
        o @ (Output::Json | Output::Yaml) => {
            let list: Vec<Json> = pairs.iter().map(|&x| change_json(c, contract, x, policy)).collect();
            let v = json!({
                "contract": contract.to_string(),
                "contractInferred": inferred.is_some(),
                "verdict": outcome.verdict,
                "changes": list,
                "rejected": outcome.rejected.iter().map(|r| json!({"message": r.message, "at": r.at})).collect::<Vec<_>>(),
                "machine": machine.and_then(|(name, _, hash)| verdict_json(name, hash)),
            });
            o.data(&v)?
        }
        Output::Text | Output::Wide => {
            let mut s = String::from("Dry run summary:\n");
            match &inferred {
                Some(why) => s += &format!("Contract: {contract} (inferred: {why}; pass --contract to choose)\n"),
                None => s += &format!("Contract: {contract}\n"),
            }
            s += &format!("Verdict: {}: {}\n", outcome.verdict, verdict_sentence(c, &outcome));
            if let (Some((name, _, hash)), Some(v)) = (machine, &outcome.machine) {
                s += &format!("Machine {name}: Ready={} ({}): {}\n", v.status, v.reason, v.message);
                if !v.reboot_paths.is_empty() {
                    s += &format!("  rebootPaths: {}\n", v.reboot_paths.join(", "));
                }
                s += &format!("  desiredInputsHash: {hash}\n");
            }
            if !outcome.rejected.is_empty() {
                s += "\nTalos would refuse this configuration:\n";
                for r in &outcome.rejected {
                    s += &format!("  - {} (at {})\n", r.message, r.at);
                }
            }
            if !pairs.is_empty() {
                s += "\nChanges:\n";
                let width = changes.iter().map(|k| k.path.to_string().len()).max().unwrap_or(0).min(60);
                for &x in &pairs {
                    s += &change_text(c, contract, x, width, policy);
                }
            }
            if !unified.is_empty() {
                s += "\nConfig diff:\n\n";
                s += &unified;
            } else if !pairs.is_empty() {
                s += "\nConfig diff: only redacted values differ.\n";
            }
            s
        }
    };
    Ok(Report { stdout, findings, ..Report::default() })
}

/// One change, its class, why it has no effect when the rules say so, and the other end of
/// its move when it only moves.
type Classed<'a> = (&'a diff::Change, &'a Classified, Option<&'a str>, Option<&'a str>);

fn change_json(
    c: &Classifier,
    contract: Contract,
    (ch, k, dead, other): Classed,
    policy: &[render::api::PathPolicy],
) -> Json {
    let p = ch.path.to_string();
    let mut v = json!({
        "path": p,
        "op": ch.op.to_string(),
        "class": k.class,
        "restarts": c.restarts(k),
        "appliedBy": c.applied_by(k),
        "effect": k.effect,
        "effectText": c.effect_label(k),
        "noEffectBecause": dead,
        "movedWith": other,
        "rule": rule_json(c, k.entry(), &ch.path),
        "why": c.why_with(contract, k, policy),
        "old": value_json(&ch.old, k.sensitive),
        "new": value_json(&ch.new, k.sensitive),
    });
    // A path this fleet's policy decides names it (absent otherwise, as before policies).
    if let Some(field) = k.policy_field() {
        v["policy"] = json!(field);
    }
    v
}

fn change_text(
    c: &Classifier,
    contract: Contract,
    (ch, k, dead, other): Classed,
    width: usize,
    policy: &[render::api::PathPolicy],
) -> String {
    let p = ch.path.to_string();
    let sign = match ch.op {
        diff::Op::Added => '+',
        diff::Op::Removed => '-',
        diff::Op::Changed => '~',
    };
    // What Talos itself does with it (issue 29): `live, restarts kubelet`, `applied, takes
    // effect after a reboot`, `operation: applied by the kubernetes operation`.
    let effect = c.effect_label(k).map(|e| format!("  [{e}]")).unwrap_or_default();
    let mut s = format!("  {sign} {p:width$}  {}{effect}\n", k.class);
    let show = |v: &Option<serde_yaml::Value>| match v {
        None => "(absent)".to_string(),
        Some(_) if k.sensitive => REDACTED.to_string(),
        Some(v) => diff::short(v),
    };
    s += &format!("      {} -> {}\n", show(&ch.old), show(&ch.new));
    if let Some(because) = dead {
        s += &format!("      no effect: {because}\n");
    }
    if let Some(other) = other {
        let dir = if ch.op == diff::Op::Removed { "to" } else { "from" };
        s += &format!("      moved {dir} {other}\n");
    }
    s += &format!("      {}\n", c.why_with(contract, k, policy));
    if let Some(e) = k.entry() {
        s += &format!(
            "      rule: {}:{} ({})\n",
            c.fieldmeta_file,
            c.meta.entries[e].line,
            best_pattern(c, e, &ch.path)
        );
    }
    s
}
