//! `ichor config diff --manifests DIR --all-machines --node-configs DIR`: the fleet-wide check
//! for CI. Every machine of the manifests rendered and compared with its node's running config,
//! each with its impact (the strongest class of its changes) and the paths that decide it; as
//! text, JSON, and JUnit XML (`--junit FILE`); `--fail-on` sets the exit code by the strongest
//! impact found.
//!
//! Start at `check` (the I/O: reading, rendering, classifying) and `Impact::of` (pure: an
//! outcome's impact and its deciding changes), then `junit` (pure: the XML).

use crate::output::best_pattern;
use crate::{Output, Report, disk};
use anyhow::{Context, Result};
use render::classify::{Classified, Classifier, Outcome};
use render::vocab::{Class, Verdict};
use serde_json::{Value as Json, json};
use std::path::Path as FsPath;

/// What a machine's changes do, from the mildest; `--fail-on` names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Impact {
    /// No change.
    #[value(skip)]
    None,
    /// Every change applies live (perhaps restarting a service).
    Live,
    /// Some change takes effect only at the next install or Talos upgrade.
    Install,
    /// Some change is applied only by an operation (a Kubernetes upgrade, a kube-proxy switch).
    Operation,
    /// Some change needs a reboot.
    Reboot,
    /// Talos would refuse the config: always a failure.
    #[value(skip)]
    Refused,
}

impl Impact {
    /// The word shown and written.
    pub fn name(self) -> &'static str {
        match self {
            Impact::None => "none",
            Impact::Live => "live",
            Impact::Install => "install",
            Impact::Operation => "operation",
            Impact::Reboot => "reboot",
            Impact::Refused => "refused",
        }
    }

    /// One change's impact: its class, and the operation that applies it when one must.
    pub fn of_change(k: &Classified, applied_by: Option<&str>) -> Impact {
        match (k.class, applied_by) {
            (Class::Unsupported, _) => Impact::Refused,
            (_, Some(_)) => Impact::Operation,
            (Class::RebootRequired, None) => Impact::Reboot,
            (Class::InstallTimeOnly, None) => Impact::Install,
            (Class::Safe, None) => Impact::Live,
        }
    }

    /// An outcome's impact (its strongest change's, or refused when Talos would refuse the
    /// config) and the indices of the changes that decide it.
    pub fn of(outcome: &Outcome, applied_by: &dyn Fn(&Classified) -> Option<String>) -> (Impact, Vec<usize>) {
        let each: Vec<Impact> =
            outcome.changes.iter().map(|k| Impact::of_change(k, applied_by(k).as_deref())).collect();
        let strongest = each.iter().copied().max().unwrap_or(Impact::None);
        if outcome.verdict == Verdict::Unsupported || !outcome.rejected.is_empty() {
            let deciding = (0..each.len()).filter(|&i| each[i] == Impact::Refused).collect();
            return (Impact::Refused, deciding);
        }
        (strongest, (0..each.len()).filter(|&i| each[i] == strongest && strongest != Impact::None).collect())
    }
}

/// One machine's result.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineResult {
    pub name: String,
    pub contract: String,
    pub verdict: Verdict,
    pub impact: Impact,
    /// The changes that decide the impact: path, class, why, the rule (file:line, pattern).
    pub deciding: Vec<Json>,
    /// What Talos would refuse, when it would.
    pub refused: Vec<String>,
    /// Every changed path.
    pub changed: usize,
    /// The impact reaches `--fail-on` (or, without it, the machine changes at all).
    pub failed: bool,
}

/// The fleet's check: every machine of `dir`, each against `node_configs/<machine>.yaml`.
pub fn check(
    c: &Classifier,
    dir: &FsPath,
    node_configs: &FsPath,
    fail_on: Option<Impact>,
    output: Output,
    junit_to: Option<&FsPath>,
) -> Result<Report> {
    let m = disk::read_manifests(dir, c)?;
    let names: Vec<String> = m.machines.iter().filter_map(|x| x.metadata.name.clone()).collect();
    // Every machine without its node's config, at once.
    let missing: Vec<String> = names
        .iter()
        .map(|n| node_configs.join(format!("{n}.yaml")))
        .filter(|p| !p.is_file())
        .map(|p| {
            format!(
                "{0}: missing: save the machine's running config there (talosctl -n NODE read /system/state/config.yaml > {0})\n",
                p.display()
            )
        })
        .collect();
    if !missing.is_empty() {
        return Err(crate::Diagnosed {
            diagnostics: missing.concat(),
            summary: format!(
                "--node-configs {}: every machine of {} needs its running config as <machine>.yaml",
                node_configs.display(),
                dir.display()
            ),
        }
        .into());
    }
    let mut results = vec![];
    for name in &names {
        let rendered = disk::render_machine_unchecked(&m, name, None, c)?;
        let running = disk::read_config(&node_configs.join(format!("{name}.yaml")))?;
        let mch = m.machine(name).context("--all-machines")?;
        let ctx = render::machine::context(&m, mch, &rendered);
        let changes = render::diff::changes(&running, &rendered.config);
        let contract = rendered.contract;
        let outcome = c
            .classify_machine(contract, &changes, Some(&rendered.config), Some(&ctx), false)
            .with_context(|| format!("classifying machine {name}"))?;
        let applied_by = |k: &Classified| c.applied_by(k).map(String::from);
        let (impact, deciding) = Impact::of(&outcome, &applied_by);
        let failed = match fail_on {
            Some(threshold) => impact >= threshold,
            None => impact != Impact::None,
        };
        let deciding = deciding
            .iter()
            .map(|&i| {
                let (ch, k) = (&changes[i], &outcome.changes[i]);
                let rule = k.entry().map(|e| {
                    format!("{}:{} ({})", c.fieldmeta_file, c.meta.entries[e].line, best_pattern(c, e, &ch.path))
                });
                json!({"path": ch.path.to_string(), "class": k.class, "appliedBy": c.applied_by(k), "effect": k.effect, "effectText": c.effect_label(k), "why": c.why_with(contract, k, &ctx.policy), "rule": rule.or_else(|| k.policy_field().map(|f| format!("the cluster's {f}")))})
            })
            .collect();
        results.push(MachineResult {
            name: name.clone(),
            contract: contract.to_string(),
            verdict: outcome.verdict,
            impact,
            deciding,
            refused: outcome.rejected.iter().map(|r| format!("{} (at {})", r.message, r.at)).collect(),
            changed: changes.len(),
            failed: failed || impact == Impact::Refused,
        });
    }
    let strongest = results.iter().map(|r| r.impact).max().unwrap_or(Impact::None);
    if let Some(path) = junit_to {
        let xml = junit(&dir.display().to_string(), fail_on, &results);
        if path == FsPath::new("-") {
            return Ok(Report { stdout: xml, findings: results.iter().any(|r| r.failed), ..Report::default() });
        }
        std::fs::write(path, xml).with_context(|| format!("--junit {}: writing the report", path.display()))?;
    }
    let stdout = match output {
        o @ (Output::Json | Output::Yaml) => o.data(&json!({
            "manifests": dir.display().to_string(),
            "failOn": fail_on.map(Impact::name),
            "strongest": strongest,
            "failed": results.iter().filter(|r| r.failed).map(|r| r.name.clone()).collect::<Vec<_>>(),
            "machines": results,
        }))?,
        Output::Text | Output::Wide => text(&dir.display().to_string(), fail_on, strongest, &results),
    };
    Ok(Report { stdout, findings: results.iter().any(|r| r.failed), ..Report::default() })
}

fn text(dir: &str, fail_on: Option<Impact>, strongest: Impact, results: &[MachineResult]) -> String {
    let threshold = fail_on.map(|f| format!("--fail-on {}", f.name())).unwrap_or_else(|| "any change fails".into());
    let mut s = format!(
        "Fleet check of {dir}: {} machine(s), strongest impact {} ({threshold})\n",
        results.len(),
        strongest.name()
    );
    let width = results.iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in results {
        let mark = if r.failed { "FAIL" } else { "ok" };
        s += &format!(
            "{mark:4}  {:width$}  {:9}  {} ({} changed path(s), contract {})\n",
            r.name,
            r.impact.name(),
            r.verdict,
            r.changed,
            r.contract
        );
        for d in &r.deciding {
            let effect = d["effectText"].as_str().map(|e| format!("  [{e}]")).unwrap_or_default();
            s += &format!(
                "        {}{effect}\n          {}\n",
                d["path"].as_str().unwrap_or_default(),
                d["why"].as_str().unwrap_or_default()
            );
            if let Some(rule) = d["rule"].as_str() {
                s += &format!("          rule: {rule}\n");
            }
        }
        for x in &r.refused {
            s += &format!("        Talos would refuse: {x}\n");
        }
    }
    s
}

/// The results as JUnit XML: one test case per machine, failed when its impact reaches
/// `--fail-on` (its deciding paths in the failure), for CI systems that read test reports.
pub fn junit(dir: &str, fail_on: Option<Impact>, results: &[MachineResult]) -> String {
    let failures = results.iter().filter(|r| r.failed).count();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    s += &format!("<testsuites name=\"ichor config diff\" tests=\"{}\" failures=\"{failures}\">\n", results.len());
    let threshold = fail_on.map(Impact::name).unwrap_or("any change");
    s += &format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\">\n",
        escape(&format!("{dir} (fail on {threshold})")),
        results.len()
    );
    for r in results {
        s += &format!(
            "    <testcase classname=\"{}\" name=\"{}\">\n",
            escape(&format!("config diff {}", r.contract)),
            escape(&r.name)
        );
        let mut body = String::new();
        for d in &r.deciding {
            let rule = d["rule"].as_str().map(|x| format!(" (rule {x})")).unwrap_or_default();
            body += &format!(
                "{}: {}{rule}\n",
                d["path"].as_str().unwrap_or_default(),
                d["why"].as_str().unwrap_or_default()
            );
        }
        for x in &r.refused {
            body += &format!("Talos would refuse: {x}\n");
        }
        let message = format!("{}: {} ({} changed path(s))", r.impact.name(), r.verdict, r.changed);
        if r.failed {
            s += &format!(
                "      <failure type=\"{}\" message=\"{}\">{}</failure>\n",
                r.impact.name(),
                escape(&message),
                escape(&body)
            );
        } else if !body.is_empty() {
            s += &format!("      <system-out>{}</system-out>\n", escape(&format!("{message}\n{body}")));
        }
        s += "    </testcase>\n";
    }
    s += "  </testsuite>\n</testsuites>\n";
    s
}

/// XML's five escapes (values of sensitive paths never reach here: only paths and reasons).
fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &str, impact: Impact, failed: bool) -> MachineResult {
        MachineResult {
            name: name.into(),
            contract: "v1.14".into(),
            verdict: Verdict::RebootRequired,
            impact,
            deciding: vec![
                json!({"path": "machine.sysctls[\"a<b\"]", "why": "kernel & co", "rule": "f.yaml:3 (machine.sysctls.*)"}),
            ],
            refused: vec![],
            changed: 2,
            failed,
        }
    }

    #[test]
    fn impacts_order_from_none_to_refused_as_fail_on_compares_them() {
        use Impact::*;
        let all = [None, Live, Install, Operation, Reboot, Refused];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(all.map(Impact::name), ["none", "live", "install", "operation", "reboot", "refused"]);
    }

    #[test]
    fn junit_has_a_case_per_machine_and_a_failure_only_for_those_that_reach_the_threshold() {
        let xml = junit(
            "m & co",
            Some(Impact::Reboot),
            &[result("cp1", Impact::Reboot, true), result("w1", Impact::Live, false)],
        );
        assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"ichor config diff\" tests=\"2\" failures=\"1\">"), "{xml}");
        assert!(xml.contains("<testsuite name=\"m &amp; co (fail on reboot)\""), "{xml}");
        assert_eq!(xml.matches("<testcase ").count(), 2);
        assert_eq!(xml.matches("<failure ").count(), 1);
        assert!(xml.contains("machine.sysctls[&quot;a&lt;b&quot;]: kernel &amp; co"), "{xml}");
        assert!(xml.contains("<system-out>live: "), "{xml}");
    }
}
