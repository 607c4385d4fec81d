//! Commands that talk to Talos nodes: `ichor config diff --node`, `ichor apply --node`, and
//! `ichor sim talos` (the simulated fleet, a test and demo fixture).
//!
//! Start at `node_diff` and `apply`: both read the talosconfig (`disk`), read the node's
//! running config through COSI (`runtime::talos::client`), and classify the change with the
//! same `output::diff_report` as `ichor config diff`; `apply` then applies with no reboot
//! only when every changed path is live-applicable. Errors name the file and field, or the
//! node and the call; key material is never printed.

use crate::io::{io_runtime, now, shutdown_signal};
use crate::output::diff_report;
use crate::{Output, Report, disk};
use anyhow::{Context, Result, bail};
use render::vocab::{Class, Verdict};
use runtime::talos::client::{ApplyMode, Client};
use runtime::talos::config::TalosConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where nodes are reached, as talosctl reaches them.
#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    /// The nodes (talosctl's `-n`), as the endpoints reach them (each call's `node` header):
    /// several by commas or by repeating; each is reported, one failing does not stop the rest.
    #[arg(short = 'n', long = "nodes", visible_alias = "node", value_delimiter = ',', required = true)]
    pub nodes: Vec<String>,
    /// The endpoints the calls go through (talosctl's `-e`), instead of the context's.
    #[arg(short = 'e', long, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// The talosconfig (default: $TALOSCONFIG, else ~/.talos/config, as talosctl finds it).
    #[arg(long)]
    pub talosconfig: Option<PathBuf>,
    /// The talosconfig context (default: its current one).
    #[arg(long)]
    pub context: Option<String>,
    /// Each call's own deadline, in seconds.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
}

/// The talosconfig file talosctl would read: the flag, else $TALOSCONFIG (when not empty),
/// else ~/.talos/config.
pub fn talosconfig_path(flag: Option<&Path>, env: Option<&std::ffi::OsStr>, home: Option<&Path>) -> Option<PathBuf> {
    flag.map(Path::to_path_buf)
        .or_else(|| env.filter(|v| !v.is_empty()).map(PathBuf::from))
        .or_else(|| home.map(|h| h.join(".talos").join("config")))
}

/// `talosconfig_path` from this process's environment, or an error saying where to put one.
pub fn find_talosconfig(flag: Option<&Path>) -> Result<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let env = std::env::var_os("TALOSCONFIG");
    let path = talosconfig_path(flag, env.as_deref(), home.as_deref())
        .context("no talosconfig: pass --talosconfig FILE, or set TALOSCONFIG, or put one at ~/.talos/config")?;
    let defaulted = flag.is_none() && env.as_deref().is_none_or(|v| v.is_empty());
    if defaulted && !path.exists() {
        bail!(
            "no talosconfig: neither --talosconfig nor TALOSCONFIG is given, and {} does not exist; pass --talosconfig FILE or set TALOSCONFIG",
            path.display()
        );
    }
    Ok(path)
}

/// The client, made inside the I/O runtime (its channels belong to it).
fn client(a: &NodeArgs, rt: &tokio::runtime::Runtime) -> Result<Client> {
    let _inside = rt.enter();
    let path = find_talosconfig(a.talosconfig.as_deref())?;
    let file = path.display().to_string();
    let text = disk::read_text(&path, disk::caps::TEXT, "a talosconfig")?;
    let cfg = TalosConfig::parse(&text, &file)?;
    let (name, ctx) = cfg.context(a.context.as_deref(), &file)?;
    let mut ctx = ctx.clone();
    if !a.endpoints.is_empty() {
        ctx.endpoints = a.endpoints.clone();
    }
    let creds = ctx.credentials(name, &file, now())?;
    Ok(Client::new(&ctx, &creds, Duration::from_secs(a.timeout.max(1)))?)
}

/// Runs `each` for every node of `-n`: one node's report as it is; several, each under its
/// name (text), or as `{"nodes": [...]}` with a node's error in its own entry (JSON, YAML).
/// A node that fails is reported and the rest still run; the exit is then 2.
fn per_node(a: &NodeArgs, output: Output, mut each: impl FnMut(&str) -> Result<Report>) -> Result<Report> {
    if let [node] = a.nodes.as_slice() {
        return each(node);
    }
    let mut all = Report::default();
    let mut data = Vec::new();
    for node in &a.nodes {
        match each(node) {
            Ok(r) => {
                all.findings |= r.findings;
                all.failed |= r.failed;
                all.stderr += &r.stderr;
                if output.is_data() {
                    let mut v = output.parse_data(&r.stdout)?;
                    v["node"] = serde_json::json!(node);
                    data.push(v);
                } else {
                    all.stdout += &format!("=== node {node}\n{}\n", r.stdout.trim_end());
                }
            }
            Err(e) => {
                all.failed = true;
                // The error names its node already (every Talos error does).
                all.stderr += &format!("ichor: error: {e:#}\n");
                if output.is_data() {
                    data.push(serde_json::json!({"node": node, "error": format!("{e:#}")}));
                } else {
                    all.stdout += &format!("=== node {node}\nerror: {e:#}\n");
                }
            }
        }
    }
    if output.is_data() {
        all.stdout = output.data(&serde_json::json!({ "nodes": data }))?;
    }
    Ok(all)
}

fn running(rt: &tokio::runtime::Runtime, c: &Client, node: &str) -> Result<render::config::Config> {
    let text = rt.block_on(c.running_config(node))?;
    render::config::Config::parse(&text).map_err(|errs| {
        anyhow::anyhow!(
            "{node}: the running config read through COSI does not parse: line {}: {}",
            errs[0].line,
            errs[0].message
        )
    })
}

/// `ichor config diff --node`: what applying DESIRED would do to each live node.
pub fn node_diff(
    a: &NodeArgs,
    to: &Path,
    contract: Option<&str>,
    output: Output,
    rules: Option<&Path>,
) -> Result<Report> {
    let c = disk::classifier(rules)?;
    let desired = disk::read_config(to)?;
    let rt = io_runtime()?;
    let client = client(a, &rt)?;
    per_node(a, output, |node| {
        let old = running(&rt, &client, node)?;
        let from = format!("{node} (running)");
        diff_report(&c, (&old, &from), (&desired, &to.to_string_lossy()), contract, output, None)
    })
}

/// `ichor apply --node`: applies DESIRED to each node with no reboot when every changed path is
/// live-applicable; otherwise refuses with the reasons and applies nothing.
pub fn apply(
    a: &NodeArgs,
    desired_path: &Path,
    dry_run: bool,
    contract: Option<&str>,
    rules: Option<&Path>,
    output: Output,
) -> Result<Report> {
    let c = disk::classifier(rules)?;
    let desired = disk::read_config(desired_path)?;
    let desired_text = disk::read_text(desired_path, render::config::MAX_CONFIG_BYTES, "a machine configuration")?;
    let rt = io_runtime()?;
    let client = client(a, &rt)?;
    per_node(a, output, |node| {
        let old = running(&rt, &client, node)?;
        let from = format!("{} (running)", node);
        let mut report =
            diff_report(&c, (&old, &from), (&desired, &desired_path.to_string_lossy()), contract, output, None)?;
        // What was done, after the diff: text lines, or fields of the diff's JSON.
        let finish = |mut report: Report, applied: bool, lines: String| -> Result<Report> {
            if output.is_data() {
                let mut v = output.parse_data(&report.stdout)?;
                v["node"] = serde_json::json!(node);
                v["dryRun"] = serde_json::json!(dry_run);
                v["applied"] = serde_json::json!(applied);
                v["result"] = serde_json::json!(lines.trim());
                report.stdout = output.data(&v)?;
            } else {
                report.stdout += &lines;
            }
            Ok(report)
        };
        let contract = match contract {
            Some(n) => c.contract(n)?,
            None => c.infer_contract(&[&old, &desired]).0,
        };
        let changes = render::diff::changes(&old, &desired);
        let outcome = c.classify_machine(contract, &changes, Some(&desired), None, false)?;
        if outcome.verdict == Verdict::NoChanges && outcome.rejected.is_empty() {
            report.findings = false;
            return finish(report, false, format!("\nNothing to apply: {} already runs this configuration.\n", node));
        }
        let blocking: Vec<String> = changes
            .iter()
            .zip(&outcome.changes)
            .filter(|(_, k)| k.class != Class::Safe)
            .map(|(ch, k)| format!("{} ({})", ch.path, k.class))
            .collect();
        if !blocking.is_empty() || !outcome.rejected.is_empty() {
            let mut lines = "\nRefused: nothing was applied.\n".to_string();
            if !blocking.is_empty() {
                lines += &format!(
                    "  Not live-applicable: {}. Apply them with a reboot (or the operation that owns them), not with `ichor apply`.\n",
                    blocking.join(", ")
                );
            }
            if !outcome.rejected.is_empty() {
                lines += "  Talos would refuse the configuration (above); fix it first.\n";
            }
            report.findings = true;
            return finish(report, false, lines);
        }
        let applied = rt.block_on(client.apply(node, desired_text.as_bytes(), ApplyMode::NoReboot, dry_run))?;
        if applied.mode != "NO_REBOOT" {
            bail!("{}: Talos answered mode {} to a NO_REBOOT apply: {}", node, applied.mode, applied.details);
        }
        let mut lines = format!(
            "\n{} {}: {}\n",
            if dry_run { "Dry run on" } else { "Applied to" },
            node,
            applied.details.replace('\n', " ")
        );
        for w in &applied.warnings {
            lines += &format!("  warning: {w}\n");
        }
        report.findings = false;
        finish(report, !dry_run, lines)
    })
}

/// A node fault as `--fault` (and `ichor sim cluster --node-fault`) names it:
/// `NODE=hang|unavailable|gone|latency:MS|reboot-never|upgrade-fails[,on=apply|reboot][,for=SECONDSs]`.
/// With `on=`, the fault starts on the node's next apply or reboot (mid-step) and lasts `for`
/// (for good without it); `reboot-never`: the node never comes back from its next reboot;
/// `upgrade-fails`: the Talos an upgrade installs fails to boot, and the node boots its previous
/// one (Talos's A/B fallback).
pub fn node_fault(flag: &str, f: &str) -> Result<(String, NodeFault)> {
    use runtime::sim::talos::{ArmedFault, Fault, Trigger};
    let expected = || {
        format!(
            "{flag} {f:?}: expected NODE=hang|unavailable|gone|latency:MS|reboot-never|upgrade-fails[,on=apply|reboot][,for=SECONDSs]"
        )
    };
    let (node, what) = f.split_once('=').with_context(expected)?;
    let mut parts = what.split(',');
    let kind = parts.next().unwrap_or_default();
    let (mut on, mut lasting) = (None, None);
    for part in parts {
        match part.split_once('=') {
            Some(("on", "apply")) => on = Some(Trigger::Apply),
            Some(("on", "reboot")) => on = Some(Trigger::Reboot),
            Some(("for", d)) => match d.strip_suffix('s').and_then(|n| n.parse::<u64>().ok()) {
                Some(n) => lasting = Some(Duration::from_secs(n)),
                None => bail!("{}: for={d:?} is not a number of seconds such as 5s", expected()),
            },
            _ => bail!("{}: {part:?} is neither on=apply|reboot nor for=SECONDSs", expected()),
        }
    }
    let fault = match kind {
        "reboot-never" if on.is_none() && lasting.is_none() => return Ok((node.to_string(), NodeFault::RebootNever)),
        "reboot-never" => bail!("{}: reboot-never takes neither on= nor for=", expected()),
        "upgrade-fails" if on.is_none() && lasting.is_none() => {
            return Ok((node.to_string(), NodeFault::UpgradeFails));
        }
        "upgrade-fails" => bail!("{}: upgrade-fails takes neither on= nor for=", expected()),
        "hang" => Fault::Hang,
        "unavailable" => Fault::Unavailable,
        "gone" => Fault::Gone,
        l => match l.strip_prefix("latency:").and_then(|ms| ms.parse().ok()) {
            Some(ms) => Fault::Latency(Duration::from_millis(ms)),
            None => bail!("{}", expected()),
        },
    };
    Ok((
        node.to_string(),
        match on {
            Some(on) => NodeFault::Armed(ArmedFault { fault, on, lasting }),
            None if lasting.is_some() => bail!("{}: for= needs on=apply|reboot", expected()),
            None => NodeFault::Now(fault),
        },
    ))
}

/// A parsed `--fault`/`--node-fault`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeFault {
    /// In force from the start.
    Now(runtime::sim::talos::Fault),
    /// Starts on the node's next apply or reboot.
    Armed(runtime::sim::talos::ArmedFault),
    /// The node does not come back from its next reboot.
    RebootNever,
    /// The Talos an upgrade installs does not boot: the node comes back on its previous one.
    UpgradeFails,
}

impl NodeFault {
    /// Puts it on `node` of `fleet`.
    pub fn inject(self, fleet: &runtime::sim::talos::Fleet, node: &str) {
        match self {
            NodeFault::Now(f) => fleet.set_fault(node, Some(f)),
            NodeFault::Armed(a) => fleet.arm_fault(node, a),
            NodeFault::RebootNever => fleet.set_reboot_time(node, None),
            NodeFault::UpgradeFails => fleet.set_upgrade_fails(node, true),
        }
    }
}

/// `ichor sim talos`: serves a simulated fleet until interrupted.
pub fn sim(
    nodes: usize,
    controlplanes: usize,
    talos: &[String],
    listen: &str,
    talosconfig: &Path,
    faults: &[String],
) -> Result<Report> {
    use runtime::sim::talos::{Fleet, fleet_spec};
    if nodes == 0 {
        bail!("--nodes: a fleet needs at least one node");
    }
    let addr: std::net::SocketAddr =
        listen.parse().with_context(|| format!("--listen {listen:?}: not an address (host:port)"))?;
    let versions: Vec<String> = if talos.is_empty() { vec!["v1.14.3".into()] } else { talos.to_vec() };
    let parsed = faults.iter().map(|f| node_fault("--fault", f)).collect::<Result<Vec<_>>>()?;
    let rt = io_runtime()?;
    rt.block_on(async {
        let fleet = Fleet::start(fleet_spec(nodes, controlplanes.min(nodes), &versions), addr).await?;
        for (node, fault) in &parsed {
            if !fleet.nodes().contains(node) {
                bail!("--fault: no node {node:?} in the fleet ({})", fleet.nodes().join(", "));
            }
            fault.inject(&fleet, node);
        }
        let text = fleet.talosconfig(&["os:admin"])?;
        write_private(talosconfig, &text)?;
        eprintln!(
            "ichor sim talos: a simulated Talos fleet (a test and demo fixture, not Talos) on {}\n  nodes: {}\n  talosconfig: {}\n  stop with Ctrl-C",
            fleet.addr,
            fleet.nodes().join(", "),
            talosconfig.display()
        );
        shutdown_signal().await;
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(Report::default())
}

/// Writes a file only its owner can read (it holds a private key).
fn write_private(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.mode(0o600);
        }
        let mut f = o.open(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(text.as_bytes()).with_context(|| format!("writing {}", tmp.display()))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_talosconfig_is_found_as_talosctl_finds_it() {
        let (home, flag, env) = (Path::new("/home/u"), Path::new("/f"), std::ffi::OsStr::new("/e"));
        assert_eq!(talosconfig_path(Some(flag), Some(env), Some(home)), Some(PathBuf::from("/f")));
        assert_eq!(talosconfig_path(None, Some(env), Some(home)), Some(PathBuf::from("/e")));
        let default = Some(PathBuf::from("/home/u/.talos/config"));
        assert_eq!(talosconfig_path(None, Some("".as_ref()), Some(home)), default);
        assert_eq!(talosconfig_path(None, None, Some(home)), default);
        assert_eq!(talosconfig_path(None, None, None), None);
    }
}
