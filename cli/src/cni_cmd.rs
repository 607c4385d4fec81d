//! `ichor cni values validate|render|get|set|edit|diff` and `ichor cni schema derive`: Cilium
//! values (the live commands are `cni_values_cmd`'s).
//!
//! The validation is `render::cilium::validate`, the one function every caller uses.

use crate::cni_values_cmd::{keys, read_values};
use crate::{Diagnosed, KubeProxy, Output, Report, disk};
use anyhow::{Context, Result, anyhow, bail};
use clap::Subcommand;
use render::api::KubeProxyMode;
use render::cilium;
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
        #[arg(value_enum)]
        mode: KubeProxy,
        #[command(flatten)]
        start: crate::op_cmd::StartArgs,
    },
    /// Upgrade Cilium to the chart embedded in this Ichor, as an operation with its preview and
    /// consent: one Cilium Job (`helm upgrade --atomic`, the mode Cilium runs now, the cluster's
    /// layer of values), then the agents roll out. Refused when the running chart is newer, more
    /// than one minor behind, or after the hand-over (Argo CD owns the chart).
    #[command(after_help = "Example:
  ichor cni upgrade --cluster lab --dry-run

Exit: 0 started (or previewed, or nothing to do), 1 not started (refused, declined), 2 error.")]
    Upgrade {
        #[command(flatten)]
        start: crate::op_cmd::StartArgs,
    },
    /// Helm, as the Cilium Job runs it.
    #[command(subcommand)]
    Helm(HelmCommand),
}

#[derive(Subcommand, Debug)]
pub enum HelmCommand {
    /// What the `ichor-cni` Job runs: validate the user's layer of values with the one
    /// validator, layer it (Ichor's defaults, the layer, the keys Ichor owns for the mode), then
    /// `helm upgrade --install cilium` with the pinned chart. Refused values run no Helm.
    #[command(
        after_help = "Example:\n  ichor cni helm apply --kube-proxy replaced --values my-values.yaml --chart /charts/cilium-1.20.0.tgz\n\nExit: 0 Helm succeeded, 1 values refused (Helm not run), 2 Helm failed or an error."
    )]
    Apply {
        /// The mode to apply (only the switch passes the target; every other Job the mode
        /// Cilium runs now). Read from this flag, never from the cluster's spec.
        #[arg(long, value_enum)]
        kube_proxy: KubeProxy,
        /// The user's layer (YAML or JSON).
        #[arg(long, conflicts_with = "values_env", required_unless_present = "values_env")]
        values: Option<PathBuf>,
        /// An environment variable holding the user's layer as JSON (how the Job receives it).
        #[arg(long)]
        values_env: Option<String>,
        #[arg(long, default_value = "vxlan")]
        tunnel: String,
        /// The chart (the Job's image carries the embedded chart here).
        #[arg(long, env = "ICHOR_CILIUM_CHART", default_value = render::embedded::CILIUM_CHART_PATH)]
        chart: String,
        #[arg(long, default_value = "kube-system")]
        namespace: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum ValuesCommand {
    /// Validate a user layer of Cilium values (YAML); exit 1 with every refusal.
    #[command(after_help = "Example:\n  ichor cni values validate my-values.yaml --kube-proxy replaced")]
    Validate {
        file: PathBuf,
        /// The kube-proxy mode the values will run with.
        #[arg(long, value_enum, default_value_t = KubeProxy::Enabled)]
        kube_proxy: KubeProxy,
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
        #[arg(long, value_enum)]
        kube_proxy: Option<KubeProxy>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Print a cluster's user layer of Cilium values (YAML; -o json), as the spec holds it.
    #[command(after_help = "Example:\n  ichor cni values get --cluster lab")]
    Get {
        #[command(flatten)]
        live: crate::cni_values_cmd::LiveArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Set or remove keys of a cluster's layer (`KEY=VALUE`, the value read as YAML; `KEY-`
    /// removes it), validated by the one validator before anything is written; prints what
    /// the Cilium Job would run differently. On a Git-tracked cluster, prints the YAML to commit.
    #[command(
        after_help = "Example:\n  ichor cni values set --cluster lab hubble.relay.enabled=true 'operator.nodeSelector[\"kubernetes.io/os\"]=linux'\n  ichor cni values set --cluster lab hubble.ui-\n\nExit: 0 written (or nothing to write), 1 refused or a Git change to commit (nothing written), 2 an error."
    )]
    Set {
        #[command(flatten)]
        live: crate::cni_values_cmd::LiveArgs,
        /// `KEY=VALUE` or `KEY-`, applied in order.
        #[arg(required = true)]
        assignments: Vec<String>,
        /// Validate and show the change; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Edit a cluster's layer in $VISUAL or $EDITOR; validated before it is written, and the
    /// file kept on a refusal so nothing typed is lost.
    #[command(after_help = "Example:\n  EDITOR=nano ichor cni values edit --cluster lab")]
    Edit {
        #[command(flatten)]
        live: crate::cni_values_cmd::LiveArgs,
        /// Edit this file in place (an edit kept after a refusal) instead of the cluster's layer.
        #[arg(long, short = 'f')]
        file: Option<PathBuf>,
    },
    /// What the Cilium Job would run after a change (`KEY=VALUE`/`KEY-`, or a whole layer from
    /// --file) against what the layer in the spec gives now, one line per key, Ichor's keys marked.
    #[command(
        after_help = "Example:\n  ichor cni values diff --cluster lab hubble.relay.enabled=true\n\nExit: 0 shown, 1 the change would be refused (shown, with why)."
    )]
    Diff {
        #[command(flatten)]
        live: crate::cni_values_cmd::LiveArgs,
        assignments: Vec<String>,
        /// A whole new layer (YAML or JSON) instead of assignments.
        #[arg(long, short = 'f', conflicts_with = "assignments")]
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum SchemaCommand {
    /// Derive `key type` lines from the chart's values.schema.json (and its values.yaml, whose
    /// label-keyed maps are free-form), with rules/cilium/open-fields.yaml.
    Derive {
        #[arg(long)]
        schema: PathBuf,
        /// The chart's values.yaml: its maps keyed by labels are free-form too.
        #[arg(long)]
        values: Option<PathBuf>,
        #[arg(long)]
        chart: String,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the leaves of the chart's default values with their types (needs --values).
        #[arg(long, requires = "values")]
        defaults_out: Option<PathBuf>,
    },
}

fn refusals(rs: &[cilium::Refusal]) -> String {
    rs.iter().map(|r| format!("refused: {r}\n")).collect()
}

pub fn run(cmd: CniCommand) -> Result<Report> {
    match cmd {
        CniCommand::Helm(HelmCommand::Apply { kube_proxy, values, values_env, tunnel, chart, namespace }) => {
            helm_apply(kube_proxy.into(), values.as_deref(), values_env.as_deref(), &tunnel, &chart, &namespace)
        }
        CniCommand::KubeProxy { mode, start } => {
            crate::start_cmd::start(crate::start_cmd::Start::KubeProxy { mode: mode.into() }, &start)
        }
        CniCommand::Upgrade { start } => crate::start_cmd::start(crate::start_cmd::Start::CiliumUpgrade, &start),
        CniCommand::Schema(SchemaCommand::Derive { schema, values, chart, out, defaults_out }) => {
            let text = disk::read_text(&schema, disk::caps::FACTS, "a chart's values schema")?;
            let values_text = match &values {
                Some(v) => Some(disk::read_text(v, disk::caps::FACTS, "a chart's values.yaml")?),
                None => None,
            };
            let open = cilium::parse_open_fields(render::embedded::CILIUM_OPEN_FIELDS.1)
                .context(render::embedded::CILIUM_OPEN_FIELDS.0)?;
            let keys = cilium::derive_keys(&text, values_text.as_deref(), &open, &chart)
                .with_context(|| schema.display().to_string())?;
            let count = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
            let mut stdout = String::new();
            match out {
                Some(p) => {
                    std::fs::write(&p, &keys).with_context(|| format!("writing {}", p.display()))?;
                    stdout.push_str(&format!("wrote {} ({} keys)\n", p.display(), count(&keys)));
                }
                None => stdout.push_str(&keys),
            }
            if let (Some(p), Some(v), Some(vp)) = (defaults_out, values_text.as_deref(), values.as_ref()) {
                let leaves = cilium::derive_default_leaves(v, &chart).with_context(|| vp.display().to_string())?;
                std::fs::write(&p, &leaves).with_context(|| format!("writing {}", p.display()))?;
                stdout.push_str(&format!("wrote {} ({} default leaves)\n", p.display(), count(&leaves)));
            }
            Ok(Report { stdout, ..Report::default() })
        }
        CniCommand::Values(ValuesCommand::Get { live, output }) => {
            crate::cni_values_cmd::run(crate::cni_values_cmd::Live::Get { output }, &live)
        }
        CniCommand::Values(ValuesCommand::Set { live, assignments, dry_run }) => {
            crate::cni_values_cmd::run(crate::cni_values_cmd::Live::Set { assignments, dry_run }, &live)
        }
        CniCommand::Values(ValuesCommand::Edit { live, file }) => {
            crate::cni_values_cmd::run(crate::cni_values_cmd::Live::Edit { from: file }, &live)
        }
        CniCommand::Values(ValuesCommand::Diff { live, assignments, file }) => {
            crate::cni_values_cmd::run(crate::cni_values_cmd::Live::Diff { assignments, file }, &live)
        }
        CniCommand::Values(ValuesCommand::Validate { file, kube_proxy }) => {
            let text = disk::read_text(&file, disk::caps::TEXT, "a Cilium values file")?;
            let user = read_values(&text, &file.display().to_string())?;
            let kube_proxy = KubeProxyMode::from(kube_proxy);
            let rs = cilium::validate(&user, &keys()?, kube_proxy == KubeProxyMode::Replaced);
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
            let in_force = render::render::kube_proxy_in_force(tc);
            let (mode, source) = match kube_proxy {
                Some(k) => (KubeProxyMode::from(k), "--kube-proxy"),
                None if render::render::status_kube_proxy(tc).is_some() => (in_force, "status.cni.kubeProxy"),
                None => (in_force, "spec.cni.kubeProxy (no switch has set the status)"),
            };
            let replaced = mode == KubeProxyMode::Replaced;
            let spec = tc.spec.cni.cilium.clone().unwrap_or_default();
            let user = spec.values.clone().unwrap_or(serde_json::Value::Null);
            let rs = cilium::validate(&user, &keys()?, replaced);
            if !rs.is_empty() {
                let name = render::render::object_name("TalosCluster", &tc.metadata);
                return Err(anyhow!(Diagnosed {
                    diagnostics: crate::cni_values_cmd::refusal_text(&name, &rs),
                    summary: "the Cilium values are refused (CNIValuesApplied=False); no Job would run".into(),
                }));
            }
            let tunnel = if spec.tunnel_protocol.is_empty() { "vxlan" } else { spec.tunnel_protocol.as_str() };
            let v = cilium::layered(&user, replaced, tunnel);
            let stdout = match output {
                o @ (Output::Json | Output::Yaml) => o.data(&v)?,
                Output::Text | Output::Wide => {
                    format!("# kube-proxy mode: {mode} (from {source})\n{}", serde_yaml::to_string(&v)?)
                }
            };
            Ok(Report { stdout, ..Report::default() })
        }
    }
}

/// `ichor cni helm apply`: the one validation, the layers, then Helm with the pinned chart.
fn helm_apply(
    mode: KubeProxyMode,
    file: Option<&std::path::Path>,
    env: Option<&str>,
    tunnel: &str,
    chart: &str,
    namespace: &str,
) -> Result<Report> {
    let (text, source) = match (file, env) {
        (Some(f), _) => (disk::read_text(f, disk::caps::TEXT, "a Cilium values file")?, f.display().to_string()),
        (None, Some(var)) => (
            std::env::var(var).with_context(|| format!("--values-env {var}: the variable is not set"))?,
            format!("${var}"),
        ),
        (None, None) => bail!("--values FILE or --values-env VAR is required"),
    };
    let user: serde_json::Value =
        if text.trim().is_empty() { serde_json::Value::Null } else { read_values(&text, &source)? };
    let replaced = mode == KubeProxyMode::Replaced;
    let rs = cilium::validate(&user, &keys()?, replaced);
    if !rs.is_empty() {
        // A refusal starts no Helm (CNIValuesApplied=False).
        return Ok(Report {
            stdout: refusals(&rs),
            stderr: format!("{source}: refused; Helm was not run\n"),
            findings: true,
            ..Report::default()
        });
    }
    let layered = cilium::layered(&user, replaced, tunnel);
    let path = std::env::temp_dir().join(format!("ichor-cilium-values-{}.yaml", std::process::id()));
    std::fs::write(&path, serde_yaml::to_string(&layered)?).with_context(|| format!("writing {}", path.display()))?;
    let version = render::embedded::CILIUM_CHART_VERSION;
    let args: Vec<String> =
        ["upgrade", "--install", "cilium", chart, "--version", version, "--namespace", namespace, "--values"]
            .iter()
            .map(|s| s.to_string())
            .chain([path.display().to_string(), "--atomic".into(), "--wait".into(), "--timeout".into(), "10m".into()])
            .collect();
    let out = std::process::Command::new("helm").args(&args).output();
    let _ = std::fs::remove_file(&path);
    let out = out.context("running helm (the Job's image carries it; on a workstation, install Helm 3)")?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(anyhow!(crate::Diagnosed {
            diagnostics: stderr.lines().chain(stdout.lines()).map(|l| format!("helm: {l}\n")).collect(),
            summary: format!(
                "helm upgrade --install cilium (chart {version}, kube-proxy {mode}) failed with {}; Helm rolled the release back (--atomic); the operation pauses with CiliumJobFailed",
                out.status
            ),
        }));
    }
    Ok(Report {
        stdout: format!(
            "Cilium {version} applied with kube-proxy {mode} (helm upgrade --install cilium, namespace {namespace}).\n{stdout}"
        ),
        ..Report::default()
    })
}
