//! `ichor render` and `ichor crds`: a machine's config from the custom resources, and the
//! CRDs of those resources.
//!
//! A render is checked before it is printed: a path its contract does not have, or a document
//! Talos would refuse, is an error naming the patch that put it there.

use crate::{Diagnosed, Report};
use anyhow::{Context, Result, anyhow};
use render::classify::Classifier;
use render::config::Config;
use render::diff;
use render::manifests::Manifests;
use render::path::Path;
use render::render::{Rendered, render};
use std::path::{Path as FsPath, PathBuf};

/// Every `*.yaml`/`*.yml` file under `dir`, sorted, with its text.
pub fn read_manifests(dir: &FsPath, c: &Classifier) -> Result<Manifests> {
    let files = crate::rules_cmd::files_under(dir, &["yaml", "yml"])?;
    let mut texts = vec![];
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        texts.push((f.to_string_lossy().into_owned(), text));
    }
    let contracts: Vec<String> = c.known().iter().map(ToString::to_string).collect();
    Manifests::load(&texts, &contracts).map_err(|errs| {
        anyhow!(Diagnosed {
            diagnostics: errs.iter().map(|e| format!("{e}\n")).collect(),
            summary: format!("the manifests in {} are not valid; fix them and run again", dir.display()),
        })
    })
}

/// Renders a machine and checks the result against its contract.
pub fn render_machine(m: &Manifests, machine: &str, contract: Option<&str>, c: &Classifier) -> Result<Rendered> {
    let mch = m.machine(machine).map_err(|e| anyhow!("--machine: {e}"))?;
    let cluster = m.cluster_of(mch);
    let contract =
        c.contract(contract.unwrap_or(&cluster.spec.version_contract)).map_err(|e| anyhow!("--contract: {e}"))?;
    let (bundle, version) = m.bundle(cluster);
    let inputs = m.inputs(mch, &bundle, version);
    let out = render(&inputs, contract).map_err(|errs| {
        anyhow!(Diagnosed {
            diagnostics: errs.iter().map(|e| format!("{e}\n")).collect(),
            summary: format!("machine {machine} does not render"),
        })
    })?;
    // Check the render against the contract: paths it lacks, documents Talos refuses.
    let changes = diff::changes(&Config::default(), &out.config);
    let o =
        c.classify(contract, &changes, Some(&out.config), false).map_err(|e| anyhow!("checking the render: {e}"))?;
    let blame = |p: &Path| -> String {
        let shown = p.to_string();
        out.set_by
            .iter()
            .filter(|(q, _)| {
                let q = q.to_string();
                shown == q || shown.starts_with(&format!("{q}.")) || shown.starts_with(&format!("{q}["))
            })
            .max_by_key(|(q, _)| q.to_string().len())
            .map(|(_, obj)| obj.clone())
            .unwrap_or_else(|| format!("TalosCluster {}", cluster.metadata.name.clone().unwrap_or_default()))
    };
    let mut problems = vec![];
    for (ch, k) in changes.iter().zip(&o.changes) {
        if k.class == "unsupported" {
            problems.push(format!(
                "{}: spec.patch: sets {}, which the Talos {contract} contract does not have (Talos rejects it at this contract); remove it from the patch",
                blame(&ch.path),
                ch.path
            ));
        }
    }
    for r in &o.rejected {
        // Blame a part of the conflict that a patch set, else the first part.
        let parts: Vec<String> = r.at.split(" and ").filter_map(|x| Path::parse(x).ok()).map(|p| blame(&p)).collect();
        let who =
            parts.iter().find(|w| w.starts_with("TalosConfigPatch")).or(parts.first()).cloned().unwrap_or_default();
        problems.push(format!("{who}: spec.patch: Talos would refuse the rendered config: {} ({}); remove it from the patch or select other machines", r.message, r.at));
    }
    if !problems.is_empty() {
        return Err(anyhow!(Diagnosed {
            diagnostics: problems.iter().map(|p| format!("{p}\n")).collect(),
            summary: format!("machine {machine} renders a config Talos would not accept"),
        }));
    }
    Ok(out)
}

pub fn render_cmd(
    manifests: &FsPath,
    machine: &str,
    contract: Option<&str>,
    rules: Option<&PathBuf>,
) -> Result<Report> {
    let c = crate::config_cmd::classifier(rules.map(PathBuf::as_path))?;
    let m = read_manifests(manifests, &c)?;
    let out = render_machine(&m, machine, contract, &c)?;
    Ok(Report { stdout: out.text, ..Report::default() })
}

pub fn crds_cmd() -> Result<Report> {
    let mut out = String::new();
    for crd in render::api::crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(Report { stdout: out, ..Report::default() })
}
