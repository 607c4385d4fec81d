//! `ichor render` and `ichor crds`: a machine's config from the custom resources, and the
//! CRDs of those resources.
//!
//! A render is checked before it is printed: a path its contract does not have, or a document
//! Talos would refuse, is an error naming the patch that put it there.

use crate::{Report, disk};
use anyhow::Result;
use std::path::{Path as FsPath, PathBuf};

pub fn render_cmd(
    manifests: &FsPath,
    machine: &str,
    contract: Option<&str>,
    rules: Option<&PathBuf>,
) -> Result<Report> {
    let c = disk::classifier(rules.map(PathBuf::as_path))?;
    let m = disk::read_manifests(manifests, &c)?;
    let out = disk::render_machine(&m, machine, contract, &c)?;
    let stderr: String = out.warnings.iter().map(|w| format!("warning: {w}\n")).collect();
    Ok(Report { stdout: out.text, stderr, ..Report::default() })
}

pub fn crds_cmd() -> Result<Report> {
    let mut out = String::new();
    for crd in render::api::crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(Report { stdout: out, ..Report::default() })
}
