//! `ichor cni values validate|render` and `ichor cni schema derive`: Cilium values.
//!
//! The validation is `render::cilium::validate`, the one function every caller uses.

use crate::{Diagnosed, Output, Report, disk};
use anyhow::{Context, Result, anyhow, bail};
use clap::Subcommand;
use render::api::KubeProxyMode;
use render::cilium;
use render::inventory::Inventory;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum CniCommand {
    /// Cilium values: validate a user layer, or render a cluster's layered values.
    #[command(subcommand)]
    Values(ValuesCommand),
    /// The chart's value keys, derived from its values.schema.json.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Switch kube-proxy: `replaced` (Cilium's replacement, Cilium first) or `enabled`
    /// (Talos's kube-proxy back, kube-proxy first), as an operation with its consent.
    #[command(
        after_help = "Example:\n  ichor cni kube-proxy replaced --cluster lab --talosconfig talosconfig\n\nExit: 0 started (or previewed), 1 not started (blocked, declined, or a Git change to commit), 2 error."
    )]
    KubeProxy {
        #[arg(value_parser = ["enabled", "replaced"])]
        mode: String,
        #[command(flatten)]
        start: crate::op_cmd::StartArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum ValuesCommand {
    /// Validate a user layer of Cilium values (YAML); exit 1 with every refusal.
    #[command(after_help = "Example:\n  ichor cni values validate my-values.yaml --kube-proxy replaced")]
    Validate {
        file: PathBuf,
        /// The kube-proxy mode the values will run with.
        #[arg(long, value_parser = ["enabled", "replaced"], default_value = "enabled")]
        kube_proxy: String,
    },
    /// Print the values a cluster's Cilium runs with: Ichor's defaults, the user's layer,
    /// then the keys Ichor owns.
    #[command(after_help = "Example:\n  ichor cni values render --manifests examples/clusters/lab-v1.14")]
    Render {
        #[arg(long)]
        manifests: PathBuf,
        /// The cluster, when the folder has several.
        #[arg(long)]
        cluster: Option<String>,
        /// The mode to render for (only the kube-proxy switch passes one); without it, the
        /// mode Cilium runs now: status.cni.kubeProxy, else the spec (the live cilium-config is
        /// not read offline).
        #[arg(long, value_parser = ["enabled", "replaced"])]
        kube_proxy: Option<String>,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[derive(Subcommand, Debug)]
pub enum SchemaCommand {
    /// Derive `key type` lines from the chart's values.schema.json.
    Derive {
        #[arg(long)]
        schema: PathBuf,
        #[arg(long)]
        chart: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn keys() -> Result<Inventory> {
    Inventory::parse(render::embedded::CILIUM_KEYS.1).context(render::embedded::CILIUM_KEYS.0)
}

fn refusals(rs: &[cilium::Refusal]) -> String {
    rs.iter().map(|r| format!("refused: {r}\n")).collect()
}

pub fn run(cmd: CniCommand) -> Result<Report> {
    match cmd {
        CniCommand::KubeProxy { mode, start } => {
            let mode = if mode == "replaced" { KubeProxyMode::Replaced } else { KubeProxyMode::Enabled };
            crate::op_cmd::start(crate::op_cmd::Start::KubeProxy { mode }, &start)
        }
        CniCommand::Schema(SchemaCommand::Derive { schema, chart, out }) => {
            let text = disk::read_text(&schema, disk::caps::FACTS, "a chart's values schema")?;
            let keys = cilium::derive_keys(&text, &chart).with_context(|| schema.display().to_string())?;
            match out {
                Some(p) => {
                    std::fs::write(&p, &keys).with_context(|| format!("writing {}", p.display()))?;
                    Ok(Report {
                        stdout: format!(
                            "wrote {} ({} keys)\n",
                            p.display(),
                            keys.lines().filter(|l| !l.starts_with('#')).count()
                        ),
                        ..Report::default()
                    })
                }
                None => Ok(Report { stdout: keys, ..Report::default() }),
            }
        }
        CniCommand::Values(ValuesCommand::Validate { file, kube_proxy }) => {
            let text = disk::read_text(&file, disk::caps::TEXT, "a Cilium values file")?;
            let user: serde_json::Value =
                serde_yaml::from_str(&text).with_context(|| format!("{}: not valid YAML", file.display()))?;
            let rs = cilium::validate(&user, &keys()?, kube_proxy == "replaced");
            if rs.is_empty() {
                Ok(Report {
                    stdout: format!("ok: {} is valid for kube-proxy {kube_proxy}\n", file.display()),
                    ..Report::default()
                })
            } else {
                Ok(Report { stdout: refusals(&rs), findings: true, ..Report::default() })
            }
        }
        CniCommand::Values(ValuesCommand::Render { manifests, cluster, kube_proxy, output }) => {
            let c = disk::classifier(None)?;
            let m = disk::read_manifests(&manifests, &c)?;
            let tc = match &cluster {
                Some(n) => m
                    .clusters
                    .iter()
                    .find(|x| x.metadata.name.as_deref() == Some(n))
                    .ok_or_else(|| anyhow!("--cluster: no TalosCluster {n:?}"))?,
                None if m.clusters.len() == 1 => &m.clusters[0],
                None => bail!("--cluster: the manifests hold {} clusters; name one", m.clusters.len()),
            };
            let (mode, source) = match kube_proxy.as_deref() {
                Some(k) => (k.to_string(), "--kube-proxy"),
                None => match render::render::status_kube_proxy(tc) {
                    Some(k) => (k.name().to_string(), "status.cni.kubeProxy"),
                    None => {
                        (tc.spec.cni.kube_proxy.name().to_string(), "spec.cni.kubeProxy (no switch has set the status)")
                    }
                },
            };
            let replaced = mode == KubeProxyMode::Replaced.name();
            let spec = tc.spec.cni.cilium.clone().unwrap_or_default();
            let user = spec.values.clone().unwrap_or(serde_json::Value::Null);
            let rs = cilium::validate(&user, &keys()?, replaced);
            if !rs.is_empty() {
                let name = render::render::object_name("TalosCluster", &tc.metadata);
                return Err(anyhow!(Diagnosed {
                    diagnostics: rs.iter().map(|r| format!("{name}: spec.cni.cilium.values.{r}\n")).collect(),
                    summary: "the Cilium values are refused (CNIValuesApplied=False); no Job would run".into(),
                }));
            }
            let tunnel = if spec.tunnel_protocol.is_empty() { "vxlan" } else { spec.tunnel_protocol.as_str() };
            let v = cilium::layered(&user, replaced, tunnel);
            let stdout = match output {
                Output::Json => serde_json::to_string_pretty(&v)? + "\n",
                Output::Text => format!("# kube-proxy mode: {mode} (from {source})\n{}", serde_yaml::to_string(&v)?),
            };
            Ok(Report { stdout, ..Report::default() })
        }
    }
}
