//! `ichor cni values get|set|edit|diff --cluster NAME`: the user's layer of Cilium values on a
//! live cluster (the CNI page: "You edit your layer ... with ichor cni values get|set|edit|diff").
//!
//! Start at `run`. The decisions are `render::cilium`'s pure functions (`set_key`, `validate`,
//! `layered`, `leaf_lines`); this file reads the TalosCluster, asks the one validator, and writes
//! `spec.cni.cilium.values` whole with a replace that carries the resourceVersion it read, so a
//! concurrent change is a conflict that writes nothing, never a lost edit. The webhook still
//! decides who may write the layer (`talosclusters/cilium-values`); its refusal is shown as is.

use crate::op_cmd::KubeArgs;
use crate::{Output, Report};
use anyhow::{Context, Result, anyhow, bail};
use kube_client::Api;
use kube_client::api::PostParams;
use render::api::{CniPreset, KubeProxyMode, TalosCluster};
use render::cilium;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Which cluster's layer, and the Kubernetes cluster it lives in.
#[derive(clap::Args, Debug, Clone)]
pub struct LiveArgs {
    #[arg(long)]
    pub cluster: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// What `run` does.
pub enum Live {
    /// Print the layer.
    Get { output: Output },
    /// Apply `KEY=VALUE` / `KEY-` assignments, validate, write (or only show, `dry_run`).
    Set { assignments: Vec<String>, dry_run: bool },
    /// Open the layer in `$EDITOR`, validate, write; the file is kept on a refusal.
    Edit { from: Option<PathBuf> },
    /// What the Cilium Job would run after the change against what the layer gives now.
    Diff { assignments: Vec<String>, file: Option<PathBuf> },
}

/// One assignment of `set`: `hubble.relay.enabled=true` (the value read as YAML, so `2` is a
/// number and `"2"` a string) or `hubble.relay-` (removed).
pub fn parse_assignment(a: &str) -> Result<(String, Option<Value>)> {
    if let Some((k, v)) = a.split_once('=') {
        // A value alone over the layer's cap can never be written: said as such, without
        // echoing it.
        if v.len() > cilium::MAX_VALUES_BYTES {
            bail!(
                "{k}=: the value is {} bytes, over the {}-byte limit of the values layer; nothing was written: keep only the keys you change",
                v.len(),
                cilium::MAX_VALUES_BYTES
            );
        }
        let parsed = render::yaml::parse(v, cilium::MAX_VALUES_BYTES)
            .map_err(|e| anyhow!("{a}: the value is not YAML: {}", e.message))
            .and_then(|y| {
                serde_json::to_value(y).with_context(|| format!("{a}: the value does not convert to JSON"))
            })?;
        // An empty value (`key=`) is the empty string, as Helm's --set reads it.
        let parsed = if v.is_empty() { Value::String(String::new()) } else { parsed };
        return Ok((k.to_string(), Some(parsed)));
    }
    match a.strip_suffix('-') {
        Some(k) if !k.is_empty() => Ok((k.to_string(), None)),
        _ => bail!("{a}: write KEY=VALUE to set a key, or KEY- to remove it (hubble.relay.enabled=true, hubble.ui-)"),
    }
}

/// The layer after `assignments`, in order.
pub fn assign(layer: &Value, assignments: &[String]) -> Result<Value> {
    let mut out = layer.clone();
    for a in assignments {
        let (k, v) = parse_assignment(a)?;
        out = cilium::set_key(&out, &k, v)?;
    }
    Ok(out)
}

pub fn run(what: Live, a: &LiveArgs) -> Result<Report> {
    let rt = crate::io::io_runtime()?;
    rt.block_on(run_async(what, a))
}

async fn run_async(what: Live, a: &LiveArgs) -> Result<Report> {
    let (client, ns) = crate::op_cmd::connect(&a.kube).await?;
    let api: Api<TalosCluster> = Api::namespaced(client, &ns);
    let tc =
        api.get_opt(&a.cluster).await.with_context(|| format!("reading TalosCluster {ns}/{}", a.cluster))?.ok_or_else(
            || {
                anyhow!(
                    "TalosCluster {ns}/{} not found: check --cluster and the namespace (-n, default ichor-system)",
                    a.cluster
                )
            },
        )?;
    let name = format!("TalosCluster {ns}/{}", a.cluster);
    let current = tc.spec.cni.cilium.as_ref().and_then(|c| c.values.clone()).unwrap_or(Value::Null);
    let current = if current.is_null() { serde_json::json!({}) } else { current };
    match what {
        Live::Get { output } => Ok(Report {
            stdout: match output {
                Output::Json => output.data(&current)?,
                _ if current.as_object().is_some_and(|m| m.is_empty()) => "{}\n".into(),
                _ => serde_yaml::to_string(&current)?,
            },
            ..Report::default()
        }),
        Live::Diff { assignments, file } => {
            let next = match &file {
                Some(f) => read_layer(f)?,
                None => assign(&current, &assignments)?,
            };
            let refused = cilium::validate(&next, &keys()?, mode_now(&tc) == KubeProxyMode::Replaced);
            let mut report = diff_report(&tc, &current, &next);
            if !refused.is_empty() {
                report.stderr = refusal_text(&name, &refused);
                report.findings = true;
            }
            Ok(report)
        }
        Live::Set { assignments, dry_run } => {
            writable(&tc, &name)?;
            if assignments.is_empty() {
                bail!("nothing to set: name KEY=VALUE or KEY- (for example hubble.relay.enabled=true)");
            }
            let next = assign(&current, &assignments)?;
            write(&api, tc, &name, &current, next, dry_run).await
        }
        Live::Edit { from } => {
            writable(&tc, &name)?;
            // A file given (an edit kept after a refusal) is edited in place and left there;
            // otherwise the layer goes to a new temporary file, removed once written.
            let file = match &from {
                Some(f) => f.clone(),
                None => {
                    let file = std::env::temp_dir().join(format!(
                        "ichor-cilium-values-{}-{}.yaml",
                        a.cluster,
                        std::process::id()
                    ));
                    let header = format!(
                        "# The user's layer of Cilium values of {name}: Ichor's keys are set after it (see\n# `ichor cni values diff`). Save and quit to validate and write; an empty file clears the layer.\n"
                    );
                    let body = if current.as_object().is_some_and(|m| m.is_empty()) {
                        String::new()
                    } else {
                        serde_yaml::to_string(&current)?
                    };
                    std::fs::write(&file, format!("{header}{body}"))
                        .with_context(|| format!("writing {}", file.display()))?;
                    file
                }
            };
            run_editor(&file)?;
            let next = match read_layer(&file) {
                Ok(v) => v,
                Err(e) => {
                    return Err(e.context(format!("nothing was written; your edit is kept in {}", file.display())));
                }
            };
            let kept = format!(
                "your edit is kept in {}: edit it again with `ichor cni values edit --cluster {} --file {}`",
                file.display(),
                a.cluster,
                file.display()
            );
            match write(&api, tc, &name, &current, next, false).await {
                // A refusal (or a change to commit to Git) keeps what was typed.
                Ok(mut r) if r.findings || r.failed => {
                    r.stderr += &format!("ichor: {kept}\n");
                    Ok(r)
                }
                Ok(r) => {
                    if from.is_none() {
                        let _ = std::fs::remove_file(&file);
                    }
                    Ok(r)
                }
                Err(e) => Err(e.context(kept)),
            }
        }
    }
}

/// The mode Cilium runs now (ADR 0066's currentKubeProxyMode): the status's, else the spec's.
fn mode_now(tc: &TalosCluster) -> KubeProxyMode {
    render::render::kube_proxy_in_force(tc)
}

/// Whether Ichor writes this cluster's layer: the cilium preset, before the hand-over.
fn writable(tc: &TalosCluster, name: &str) -> Result<()> {
    if tc.spec.cni.preset != CniPreset::Cilium {
        bail!("{name}: spec.cni.preset is {:?}; Cilium values apply only with the cilium preset", tc.spec.cni.preset);
    }
    if render::render::handover_done(tc) {
        bail!(
            "{name}: Argo CD owns Cilium since the hand-over (CNIHandover=True): change the values in the Application's source; Ichor runs no Cilium Job now"
        );
    }
    Ok(())
}

fn read_layer(file: &Path) -> Result<Value> {
    let text = crate::disk::read_text(file, crate::disk::caps::TEXT, "a Cilium values file")?;
    let body: String = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
    if body.trim().is_empty() {
        return Ok(serde_json::json!({}));
    }
    read_values(&text, &file.display().to_string())
}

pub(crate) fn refusal_text(name: &str, refused: &[cilium::Refusal]) -> String {
    refused.iter().map(|r| format!("{name}: spec.cni.cilium.values.{r}\n")).collect()
}

/// The layered values now and after, one line per leaf, as a unified diff.
fn diff_report(tc: &TalosCluster, current: &Value, next: &Value) -> Report {
    let mode = mode_now(tc);
    let tunnel = tc.spec.cni.cilium.as_ref().map(|c| c.tunnel_protocol.as_str()).filter(|t| !t.is_empty());
    let layered = |v: &Value| cilium::layered(v, mode == KubeProxyMode::Replaced, tunnel.unwrap_or("vxlan"));
    let (before, after) = (cilium::leaf_lines(&layered(current)), cilium::leaf_lines(&layered(next)));
    let head = format!(
        "# The values the Cilium Job runs with (kube-proxy {mode}, the mode Cilium runs now), from the layer in the spec and after the change; keys Ichor owns are marked.\n"
    );
    let stdout = if before == after {
        format!("{head}no change: the Cilium Job would run with the same values\n")
    } else {
        format!("{head}{}", render::diff::unified(&before, &after, "now", "after"))
    };
    Report { stdout, ..Report::default() }
}

/// Validates `next` with the one validator and writes it (or prints the YAML to commit on a
/// Git-tracked cluster). A refusal is bad input (issue 28): it writes nothing and exits 2 with
/// the validator's words.
async fn write(
    api: &Api<TalosCluster>,
    mut tc: TalosCluster,
    name: &str,
    current: &Value,
    next: Value,
    dry_run: bool,
) -> Result<Report> {
    let refused = cilium::validate(&next, &keys()?, mode_now(&tc) == KubeProxyMode::Replaced);
    if !refused.is_empty() {
        return Ok(Report {
            stderr: format!(
                "{}ichor: the Cilium values are refused; nothing was written\n",
                refusal_text(name, &refused)
            ),
            failed: true,
            ..Report::default()
        });
    }
    let mut report = diff_report(&tc, current, &next);
    if next == *current {
        report.stdout += "Nothing to write: the layer is already so.\n";
        return Ok(report);
    }
    if crate::op_cmd::git_tracked(&tc) {
        let yaml = serde_yaml::to_string(&serde_json::json!({"spec": {"cni": {"cilium": {"values": next}}}}))?;
        report.stdout +=
            &format!("\n{name} is tracked by Argo CD: commit this change to Git (nothing was written here):\n{yaml}");
        report.findings = true;
        return Ok(report);
    }
    if dry_run {
        report.stdout += "Not written (--dry-run).\n";
        return Ok(report);
    }
    let cluster = tc.metadata.name.clone().unwrap_or_default();
    // What keeps any values from running on this cluster, whatever they are (the values
    // reconciler's condition): said with the write, not after it (issue 50, finding 11).
    let stuck = tc
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "CNIValuesApplied"))
        .filter(|c| matches!(c.reason.as_str(), "NotAdopted" | "ChartOlder" | "OwnedElsewhere"))
        .map(|c| c.message.clone());
    let spec = tc
        .spec
        .cni
        .cilium
        .get_or_insert_with(|| render::api::CiliumSpec { tunnel_protocol: "vxlan".into(), values: None });
    spec.values = if next.as_object().is_some_and(|m| m.is_empty()) { None } else { Some(next) };
    match api.replace(&cluster, &PostParams::default(), &tc).await {
        Ok(_) => {
            report.stdout += &format!("Written: {name} spec.cni.cilium.values.\n");
            if let Some(why) = stuck {
                report.stdout += &format!("They do not run now: {why}.\n");
                report.findings = true;
            }
            Ok(report)
        }
        Err(kube_client::Error::Api(e)) if e.code == 409 => {
            bail!("{name} changed since it was read ({}); nothing was written: run the command again", e.message)
        }
        Err(kube_client::Error::Api(e)) => {
            bail!("the API refused the write of {name} ({} {}): {}; nothing was written", e.code, e.reason, e.message)
        }
        Err(e) => Err(anyhow!(e).context(format!("writing {name}; nothing was written"))),
    }
}

/// Runs `$VISUAL`, else `$EDITOR`, else `vi`, on `file`, through the shell as kubectl does
/// (an editor with arguments works).
fn run_editor(file: &Path) -> Result<()> {
    let editor = std::env::var("VISUAL")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .or_else(|| std::env::var("EDITOR").ok().filter(|e| !e.trim().is_empty()))
        .unwrap_or_else(|| "vi".into());
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("ichor-edit")
        .arg(file)
        .status()
        .with_context(|| format!("running the editor {editor:?} (set EDITOR)"))?;
    if !status.success() {
        bail!(
            "the editor {editor:?} exited with {status}; nothing was written; your edit is kept in {}",
            file.display()
        );
    }
    Ok(())
}

/// The Cilium chart's keys this Ichor embeds (`rules/cilium/`), what the values are checked against.
pub(crate) fn keys() -> Result<render::inventory::Inventory> {
    render::inventory::Inventory::parse(render::embedded::CILIUM_KEYS.1).context(render::embedded::CILIUM_KEYS.0)
}

/// Cilium values as the one bounded reader reads them (aliases cannot expand them past
/// `render::config::MAX_CONFIG_BYTES`; a value never reaches the error), as JSON.
pub(crate) fn read_values(text: &str, source: &str) -> Result<serde_json::Value> {
    let v = render::yaml::parse(text, render::config::MAX_CONFIG_BYTES).map_err(|e| {
        let at = e.line.map(|l| format!(":{l}:{}", e.col.unwrap_or(1))).unwrap_or_default();
        anyhow::anyhow!("{source}{at}: not valid YAML or JSON: {}", e.message)
    })?;
    serde_json::to_value(v).with_context(|| format!("{source}: the values do not convert to JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_assignment_reads_its_value_as_yaml_and_a_trailing_dash_removes() {
        assert_eq!(parse_assignment("operator.replicas=2").unwrap(), ("operator.replicas".into(), Some(json!(2))));
        assert_eq!(parse_assignment("a=\"2\"").unwrap().1, Some(json!("2")));
        assert_eq!(parse_assignment("a=").unwrap().1, Some(json!("")), "empty is the empty string, as Helm's --set");
        assert_eq!(parse_assignment("a={b: [1]}").unwrap().1, Some(json!({"b": [1]})));
        assert_eq!(parse_assignment("hubble.ui-").unwrap(), ("hubble.ui".into(), None));
        assert!(parse_assignment("hubble").unwrap_err().to_string().contains("write KEY=VALUE"));
        let v = assign(&json!({}), &["a.b=1".into(), "a.c=x".into(), "a.b-".into()]).unwrap();
        assert_eq!(v, json!({"a": {"c": "x"}}), "in order");
    }
}
