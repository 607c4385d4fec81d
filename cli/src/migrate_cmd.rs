//! `ichor config migrate`: a Talos config, or a folder's TalosConfigPatches, from the legacy
//! v1alpha1 fields to the v1.14 documents (issue 29).
//!
//! Start at `run`. The rules decide what moves (rules/migrate.rules, via
//! `Classifier::migrate`); this file reads the input, prints the report, and writes the result
//! only when nothing conflicts and Talos would accept it. `rewrite_patch` (pure, tested) puts a
//! migrated patch back into its manifest file in place, leaving the rest of the file as it was.

use crate::{Output, Report, disk};
use anyhow::{Context, Result, bail};
use render::classify::Classifier;
use render::config::Config;
use render::migrate::Migration;
use render::vocab::Contract;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The arguments of `ichor config migrate`.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// A Talos config in v1alpha1 form (a machine config file).
    #[arg(conflicts_with = "manifests")]
    pub file: Option<PathBuf>,
    /// A folder of manifests: rewrite each TalosConfigPatch's patch into document form, in
    /// place, after rendering every machine with the rewritten patches.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// The contract migrated to (the documents exist from v1.14); with `--manifests`, the
    /// cluster's `spec.versionContract`.
    #[arg(long)]
    pub contract: Option<String>,
    /// Write the migrated config to FILE instead of standard output.
    #[arg(long, value_name = "FILE", conflicts_with = "manifests")]
    pub out: Option<PathBuf>,
    /// Write even when a legacy value conflicts with its document's (the document's value is kept).
    #[arg(long)]
    pub force: bool,
    /// With `--manifests`: report, write nothing.
    #[arg(long, requires = "manifests")]
    pub dry_run: bool,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
    #[arg(long)]
    pub rules: Option<PathBuf>,
}

const FIRST_DOCUMENT_CONTRACT: Contract = Contract { major: 1, minor: 14 };

/// The contract migrated to; `from` says where the name came from (`--contract`, the cluster).
fn target(c: &Classifier, name: Option<&str>, from: &str) -> Result<Contract> {
    let contract = c.contract(name.unwrap_or("v1.14")).with_context(|| from.to_string())?;
    if contract < FIRST_DOCUMENT_CONTRACT {
        bail!(
            "{from} is {contract}: the documents the migration writes exist from Talos v1.14; pass --contract v1.14 (and raise the cluster's spec.versionContract when its nodes run Talos v1.14)"
        );
    }
    Ok(contract)
}

pub fn run(a: MigrateArgs) -> Result<Report> {
    let c = disk::classifier(a.rules.as_deref())?;
    match (&a.file, &a.manifests) {
        (Some(file), _) => migrate_file(&c, file, &a),
        (None, Some(dir)) => migrate_manifests(&c, dir, &a),
        (None, None) => bail!(
            "nothing to migrate named: give a Talos config file (`ichor config migrate controlplane.yaml`) or a folder of manifests (`--manifests DIR`)"
        ),
    }
}

/// The report of one migration, as text lines (`moved`, `kept`, findings, conflicts, refusals).
fn report_text(m: &Migration, indent: &str) -> String {
    let mut s = String::new();
    for mv in &m.moved {
        s += &match mv.how {
            "added" => format!("{indent}added   {} (the legacy form implied it)\n", mv.to),
            "implied" => format!("{indent}dropped {} (said by the {} document's presence)\n", mv.from, mv.to),
            "negated" => format!("{indent}moved   {} -> {} (negated)\n", mv.from, mv.to),
            _ => format!("{indent}moved   {} -> {}\n", mv.from, mv.to),
        };
    }
    for k in &m.kept {
        s += &format!("{indent}kept    {} ({} stays in the v1alpha1 document): {}\n", k.leaf, k.group, k.why);
    }
    for f in &m.findings {
        s += &format!("{indent}finding {} at {}: {}\n", f.code, f.at, f.message);
    }
    for x in &m.conflicts {
        s += &format!(
            "{indent}conflict {} = {} but {} = {}: Talos refuses both; remove one, or pass --force to keep the document's value\n",
            x.legacy, x.legacy_value, x.document, x.document_value
        );
    }
    for r in &m.rejected {
        s += &format!("{indent}refused {} (at {}): Talos would refuse the migrated config\n", r.message, r.at);
    }
    s
}

fn report_json(m: &Migration) -> serde_json::Value {
    json!({
        "nothingToMigrate": m.nothing,
        "moved": m.moved.iter().map(|x| json!({"from": x.from, "to": x.to, "how": x.how})).collect::<Vec<_>>(),
        "kept": m.kept.iter().map(|k| json!({"group": k.group, "path": k.leaf, "why": k.why})).collect::<Vec<_>>(),
        "findings": m.findings.iter().map(|f| json!({"code": f.code, "at": f.at, "message": f.message})).collect::<Vec<_>>(),
        "conflicts": m.conflicts.iter().map(|x| json!({"legacy": x.legacy, "legacyValue": x.legacy_value, "document": x.document, "documentValue": x.document_value})).collect::<Vec<_>>(),
        "rejected": m.rejected.iter().map(|r| json!({"message": r.message, "at": r.at})).collect::<Vec<_>>(),
    })
}

/// Whether the migration may be written: no refusal, and no conflict unless forced.
fn writable(m: &Migration, force: bool) -> bool {
    !m.nothing && m.rejected.is_empty() && (m.conflicts.is_empty() || force)
}

fn migrate_file(c: &Classifier, file: &Path, a: &MigrateArgs) -> Result<Report> {
    let contract = target(c, a.contract.as_deref(), "--contract")?;
    let cfg = disk::read_config(file)?;
    let m = c.migrate(contract, &cfg).context("migrating")?;
    let ok = writable(&m, a.force);
    let yaml = m.config.to_yaml();
    if ok && let Some(out) = &a.out {
        std::fs::write(out, &yaml).with_context(|| format!("--out {}: writing the migrated config", out.display()))?;
    }
    let summary = summary(&m, ok, a.force);
    match a.output {
        o @ (Output::Json | Output::Yaml) => {
            let mut v = report_json(&m);
            v["contract"] = json!(contract.to_string());
            v["written"] = json!(ok);
            v["summary"] = json!(summary);
            if ok && a.out.is_none() {
                v["config"] = json!(yaml);
            }
            Ok(Report { stdout: o.data(&v)?, findings: !ok && !m.nothing, ..Report::default() })
        }
        Output::Text | Output::Wide => {
            let mut stderr = format!("Migration of {} to the {contract} documents:\n", file.display());
            stderr += &report_text(&m, "  ");
            stderr += &format!("{summary}\n");
            let stdout = if ok && a.out.is_none() { yaml } else { String::new() };
            Ok(Report { stdout, stderr, findings: !ok && !m.nothing, ..Report::default() })
        }
    }
}

fn summary(m: &Migration, ok: bool, force: bool) -> String {
    if m.nothing {
        return if m.kept.is_empty() {
            "Nothing to migrate: the config is in document form already.".into()
        } else {
            "Nothing to migrate: every legacy group left stays in the v1alpha1 document (see kept).".into()
        };
    }
    let n = m.moved.len();
    let decide = if m.findings.is_empty() {
        String::new()
    } else {
        format!(" {} finding(s) need a decision.", m.findings.len())
    };
    if !m.rejected.is_empty() {
        format!("Not written: Talos would refuse the migrated config ({} refusal(s)).", m.rejected.len())
    } else if !m.conflicts.is_empty() && !force {
        format!(
            "Not written: {} legacy value(s) conflict with their documents; resolve them or pass --force.",
            m.conflicts.len()
        )
    } else if ok {
        format!(
            "{n} move(s); prove them with `ichor config diff --from OLD --to MIGRATED` (every path: moved).{decide}"
        )
    } else {
        "Not written.".into()
    }
}

fn migrate_manifests(c: &Classifier, dir: &Path, a: &MigrateArgs) -> Result<Report> {
    let mut m = disk::read_manifests(dir, c)?;
    let cluster = m.clusters.first().with_context(|| format!("--manifests {}: no TalosCluster", dir.display()))?;
    let from = match &a.contract {
        Some(_) => "--contract".to_string(),
        None => format!("TalosCluster {}'s spec.versionContract", cluster.metadata.name.clone().unwrap_or_default()),
    };
    let contract_name = a.contract.clone().unwrap_or_else(|| cluster.spec.version_contract.clone());
    let contract = target(c, Some(&contract_name), &from)?;
    let mut stderr = format!("Migration of the TalosConfigPatches in {} to the {contract} documents:\n", dir.display());
    let mut json_patches = vec![];
    let mut rewritten: Vec<(String, String)> = vec![];
    let mut blocked = false;
    for p in &mut m.patches {
        let name = p.metadata.name.clone().unwrap_or_default();
        let Ok(cfg) = Config::parse(&p.spec.patch) else {
            stderr +=
                &format!("TalosConfigPatch {name}: not a strategic-merge patch Ichor can migrate; left as it is\n");
            continue;
        };
        let mig = c.migrate(contract, &cfg).context("migrating")?;
        if mig.nothing && mig.kept.is_empty() {
            continue;
        }
        stderr += &format!("TalosConfigPatch {name}:\n");
        stderr += &report_text(&mig, "  ");
        // A patch's refusals are judged on the renders below (a patch alone is not a config).
        let ok = !mig.nothing && (mig.conflicts.is_empty() || a.force);
        blocked |= !mig.conflicts.is_empty() && !a.force;
        let mut v = report_json(&mig);
        v["patch"] = json!(name);
        v["rejected"] = json!([]);
        json_patches.push(v);
        if ok {
            let text = mig.config.to_yaml();
            p.spec.patch = text.clone();
            rewritten.push((name, text));
        }
    }
    // Every machine rendered with the rewritten patches, checked as Talos checks it.
    let mut refused = vec![];
    for mach in &m.machines {
        let name = mach.metadata.name.clone().unwrap_or_default();
        if let Err(e) = disk::render_machine(&m, &name, Some(&contract.to_string()), c) {
            refused.push(format!("TalosMachine {name}: {e:#}"));
        }
    }
    for r in &refused {
        stderr += &format!("refused {r}\n");
    }
    let write = !rewritten.is_empty() && refused.is_empty() && !blocked && !a.dry_run;
    if write {
        for (file, text) in disk::manifest_files(dir)? {
            let mut out = text.clone();
            for (name, patch) in &rewritten {
                if let Some(next) = rewrite_patch(&out, name, patch) {
                    out = next;
                }
            }
            if out != text {
                std::fs::write(&file, out).with_context(|| format!("writing {file}"))?;
            }
        }
    }
    let summary = if rewritten.is_empty() && !blocked {
        "Nothing to migrate: every patch is in document form already.".to_string()
    } else if !refused.is_empty() {
        format!("Not written: Talos would refuse {} machine(s) rendered with the rewritten patches.", refused.len())
    } else if blocked {
        "Not written: legacy values conflict with their documents; resolve them or pass --force.".into()
    } else if a.dry_run {
        format!("{} patch(es) would be rewritten (--dry-run: nothing written).", rewritten.len())
    } else {
        format!("{} patch(es) rewritten in place; every machine renders and Talos would accept it.", rewritten.len())
    };
    let failed = !refused.is_empty() || blocked;
    match a.output {
        o @ (Output::Json | Output::Yaml) => {
            let v = json!({"contract": contract.to_string(), "patches": json_patches, "refused": refused, "written": write, "summary": summary});
            Ok(Report { stdout: o.data(&v)?, findings: failed, ..Report::default() })
        }
        Output::Text | Output::Wide => {
            stderr += &format!("{summary}\n");
            Ok(Report { stderr, findings: failed, ..Report::default() })
        }
    }
}

/// `text` (a manifest file) with the `spec.patch` of the TalosConfigPatch named `name` replaced
/// by `patch`, written as a literal block; every other line as it was. `None` when the file
/// has no such object, or its patch is not a block or one-line value this can find.
pub fn rewrite_patch(text: &str, name: &str, patch: &str) -> Option<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    // The documents' line ranges.
    let mut starts = vec![0];
    for (i, l) in lines.iter().enumerate() {
        if l.trim_end() == "---" {
            starts.push(i + 1);
        }
    }
    starts.push(lines.len());
    for w in starts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let doc = &lines[a..b];
        let is_patch = doc.iter().any(|l| l.trim_end() == "kind: TalosConfigPatch");
        let named = doc.iter().any(|l| {
            let t = l.trim();
            t == format!("name: {name}") || t == format!("name: \"{name}\"") || t == format!("name: '{name}'")
        });
        if !is_patch || !named {
            continue;
        }
        let at = doc.iter().position(|l| l.trim_start().starts_with("patch:"))?;
        let indent = doc[at].len() - doc[at].trim_start().len();
        let rest = doc[at].trim_start()["patch:".len()..].trim();
        // The block's lines: more indented than the key, or blank.
        let mut end = at + 1;
        if rest.starts_with('|') || rest.starts_with('>') {
            while end < doc.len() {
                let l = doc[end];
                let blank = l.trim().is_empty();
                let deeper = l.len() - l.trim_start().len() > indent;
                if !(blank || deeper) {
                    break;
                }
                end += 1;
            }
            // Trailing blank lines belong to what follows.
            while end > at + 1 && doc[end - 1].trim().is_empty() {
                end -= 1;
            }
        }
        let pad = " ".repeat(indent);
        let mut block = format!("{pad}patch: |\n");
        for l in patch.lines() {
            if l.is_empty() {
                block += "\n";
            } else {
                block += &format!("{pad}  {l}\n");
            }
        }
        let mut out: String = lines[..a + at].concat();
        out += &block;
        out += &lines[a + end..].concat();
        return Some(out);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# two patches\napiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosConfigPatch\nmetadata:\n  name: time\nspec:\n  order: 20\n  patch: |\n    machine:\n      time:\n        servers:\n          - a.example\n---\napiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosConfigPatch\nmetadata:\n  name: other\nspec:\n  patch: |\n    machine: {}\n";

    #[test]
    fn a_patch_is_replaced_in_place_and_the_rest_kept() {
        let out = rewrite_patch(FILE, "time", "apiVersion: v1alpha1\nkind: TimeSyncConfig\n").unwrap();
        assert!(out.starts_with("# two patches\n"), "{out}");
        assert!(out.contains("  patch: |\n    apiVersion: v1alpha1\n    kind: TimeSyncConfig\n---\n"), "{out}");
        assert!(out.contains("name: other\nspec:\n  patch: |\n    machine: {}\n"), "{out}");
        assert!(!out.contains("a.example"));
    }

    #[test]
    fn an_unknown_patch_is_none() {
        assert_eq!(rewrite_patch(FILE, "nope", "x: 1\n"), None);
    }
}
