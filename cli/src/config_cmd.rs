//! `ichor config explain|diff`: field metadata on Talos configs (interfaces.md); `ichor config
//! migrate` is in migrate_cmd; `ichor config apply` starts a config rollout (the operation commands' `op_cmd::start`).
//!
//! Both classify with the rules this binary embeds, or with `--rules DIR` from disk. Values of
//! sensitive paths are shown as `<redacted>` in every output: the change list, the unified
//! diff, explanations and errors.

use crate::output::{best_pattern, rule_json};
use crate::{Output, Report, disk};
use anyhow::{Context, Result};
use clap::Subcommand;
use render::classify::{Classifier, Reason};
use render::diff;
use render::path::Path;
use serde_json::json;
use std::path::{Path as FsPath, PathBuf};

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// The class of one config path at one contract, and the rule that decides it.
    #[command(
        after_help = "Examples:\n  ichor config explain cluster.etcd.image --contract v1.13\n  ichor config explain 'LinkConfig[eth0].mtu' --contract v1.14 --output json\n  ichor config explain KubeProxyConfig.mode --contract v1.14 --config controlplane.yaml"
    )]
    Explain {
        /// A path: `machine.install.disk`, `KubeProxyConfig.enabled`, `LinkConfig[eth0].mtu`.
        path: String,
        #[arg(long)]
        contract: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        /// Read fieldmeta.yaml, *.rules and contracts/ from DIR instead of the embedded rules.
        #[arg(long)]
        rules: Option<PathBuf>,
        /// A folder of manifests: classify under its TalosCluster's path policies
        /// (`spec.configPolicy`), which may make the path stricter.
        #[arg(long)]
        manifests: Option<PathBuf>,
        /// A Talos config the path is changed in: what depends on its other values (a field
        /// that has no effect there, such as KubeProxyConfig's while `enabled: false`) too.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Compare two Talos configs: every changed path with its class and reason, the verdict,
    /// and a redacted unified diff.
    #[command(
        after_help = "Examples:\n  ichor config diff --from running.yaml --to desired.yaml\n  ichor config diff --from running.yaml --to desired.yaml --contract v1.14 --output json\n  ichor config diff --node w1 --talosconfig talosconfig --to desired.yaml\n  ichor config diff --manifests clusters/lab --all-machines --node-configs running/ --fail-on reboot --junit report.xml\n\nExit: 0 no changes (or none reaching --fail-on), 1 changes (or Talos would refuse the config), 2 error."
    )]
    Diff {
        #[arg(
            long,
            required_unless_present_any = ["manifests", "nodes", "all_machines"],
            conflicts_with_all = ["manifests", "nodes"]
        )]
        from: Option<PathBuf>,
        #[arg(long, required_unless_present_any = ["manifests", "all_machines"], conflicts_with = "manifests")]
        to: Option<PathBuf>,
        /// Compare with the live nodes' running configs (read through Talos's API) instead of
        /// `--from` (talosctl's `-n`; several by commas, each reported).
        #[arg(
            short = 'n',
            long = "nodes",
            visible_alias = "node",
            value_delimiter = ',',
            conflicts_with = "manifests"
        )]
        nodes: Vec<String>,
        /// The endpoints the calls go through (talosctl's `-e`), instead of the context's.
        #[arg(short = 'e', long, value_delimiter = ',', requires = "nodes")]
        endpoints: Vec<String>,
        /// The talosconfig (default: $TALOSCONFIG, else ~/.talos/config).
        #[arg(long, requires = "nodes")]
        talosconfig: Option<PathBuf>,
        /// The talosconfig context (default: its current one).
        #[arg(long, requires = "nodes")]
        context: Option<String>,
        /// Each Talos call's own deadline, in seconds.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
        /// A folder of manifests: render `--machine` from them and compare with `--node-config`
        /// (or every machine with `--all-machines --node-configs DIR`).
        #[arg(long)]
        manifests: Option<PathBuf>,
        #[arg(long, requires_all = ["manifests", "node_config"], conflicts_with = "all_machines")]
        machine: Option<String>,
        /// The node's running config (`talosctl get machineconfig -o yaml` contents).
        #[arg(long, requires = "machine")]
        node_config: Option<PathBuf>,
        /// The fleet check for CI: every machine of `--manifests`, each against its running
        /// config in `--node-configs DIR/<machine>.yaml`; per machine the impact and the paths
        /// that decide it.
        #[arg(long, requires_all = ["manifests", "node_configs"])]
        all_machines: bool,
        /// The folder of the machines' running configs, one `<machine>.yaml` each.
        #[arg(long, requires = "all_machines")]
        node_configs: Option<PathBuf>,
        /// With `--all-machines`: exit 1 only when a machine's impact reaches this (live <
        /// install < operation < reboot); a config Talos would refuse always fails. Without it,
        /// any change fails.
        #[arg(long, value_enum, requires = "all_machines")]
        fail_on: Option<crate::fleet::Impact>,
        /// With `--all-machines`: also write the result as JUnit XML to FILE (`-` for stdout,
        /// instead of the text or JSON).
        #[arg(long, value_name = "FILE", requires = "all_machines")]
        junit: Option<PathBuf>,
        /// The contract; inferred from the documents when absent (and printed).
        #[arg(long)]
        contract: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        #[arg(long)]
        rules: Option<PathBuf>,
    },
    /// Move a config from the legacy v1alpha1 fields to the v1.14 documents: every move, the
    /// fields kept (no home in the documents) and why, the behaviour changes that need a
    /// decision; written only when nothing conflicts and Talos would accept the result.
    #[command(after_help = "Examples:
  ichor config migrate controlplane.yaml --out controlplane.v1.14.yaml
  ichor config diff --from controlplane.yaml --to controlplane.v1.14.yaml      (every path: moved)
  ichor config migrate --manifests clusters/lab --dry-run

Exit: 0 migrated (or nothing to migrate), 1 not written (a conflict, or Talos would refuse the result), 2 error.")]
    Migrate(crate::migrate_cmd::MigrateArgs),
    /// Start a config rollout: the changes the machine controller does not apply because they
    /// need a reboot (each TalosMachine's `status.rebootPaths`), one node at a time: cordon,
    /// drain, apply, reboot, back Ready, uncordon; control planes first, the controller's node
    /// last.
    #[command(after_help = "Examples:
  ichor config apply --cluster lab --talosconfig talosconfig --dry-run
  ichor config apply --cluster lab --machines w1,w2 --max-unavailable 2 --yes

Exit: 0 started, previewed or nothing to do, 1 not started (blocked or declined), 2 error (an unknown machine).")]
    Apply {
        /// Only these TalosMachines (comma-separated); default: every machine with a change
        /// that needs a reboot.
        #[arg(long, value_delimiter = ',')]
        machines: Vec<String>,
        /// Workers rebooted at once.
        #[arg(long, default_value_t = 1)]
        max_unavailable: i32,
        /// Consent to disrupt past PodDisruptionBudgets: a pod a budget still keeps at the
        /// drain's deadline (ichor controller --drain-timeout) is deleted instead of the step
        /// failing (spec.forceDrain).
        #[arg(long)]
        force_drain: bool,
        #[command(flatten)]
        start: crate::op_cmd::StartArgs,
    },
}

pub fn run(cmd: ConfigCommand) -> Result<Report> {
    match cmd {
        ConfigCommand::Explain { path, contract, output, rules, manifests, config } => {
            explain(&path, &contract, output, rules.as_deref(), manifests.as_deref(), config.as_deref())
        }
        ConfigCommand::Migrate(args) => crate::migrate_cmd::run(args),
        ConfigCommand::Apply { machines, max_unavailable, force_drain, start } => {
            crate::start_cmd::start(crate::start_cmd::Start::Rollout { machines, max_unavailable, force_drain }, &start)
        }
        ConfigCommand::Diff {
            from,
            to,
            nodes,
            endpoints,
            talosconfig,
            context,
            timeout,
            manifests,
            machine,
            node_config,
            all_machines,
            node_configs,
            fail_on,
            junit,
            contract,
            output,
            rules,
        } => {
            if let (false, Some(to)) = (nodes.is_empty(), to.as_ref()) {
                let args = crate::talos_cmd::NodeArgs { nodes, endpoints, talosconfig, context, timeout };
                return crate::talos_cmd::node_diff(&args, to, contract.as_deref(), output, rules.as_deref());
            }
            let c = disk::classifier(rules.as_deref())?;
            if let (true, Some(dir), Some(configs)) = (all_machines, &manifests, &node_configs) {
                return crate::fleet::check(&c, dir, configs, fail_on, output, junit.as_deref());
            }
            if manifests.is_some() && machine.is_none() {
                anyhow::bail!(
                    "--manifests: name the machine (--machine NAME --node-config FILE), or check every machine (--all-machines --node-configs DIR)"
                );
            }
            if let (Some(dir), Some(machine), Some(node)) = (manifests, machine, node_config) {
                return machine_diff(&c, &dir, &machine, &node, contract.as_deref(), output);
            }
            let (from, to) = (from.expect("clap requires --from"), to.expect("clap requires --to"));
            let old = disk::read_config(&from)?;
            let new = disk::read_config(&to)?;
            let (from_name, to_name) = (from.to_string_lossy(), to.to_string_lossy());
            crate::output::diff_report(&c, (&old, &from_name), (&new, &to_name), contract.as_deref(), output, None)
        }
    }
}

/// Renders the machine, compares its node's config with the render, and decides its condition.
fn machine_diff(
    c: &Classifier,
    dir: &FsPath,
    machine: &str,
    node: &FsPath,
    contract: Option<&str>,
    output: Output,
) -> Result<Report> {
    let m = disk::read_manifests(dir, c)?;
    let rendered = disk::render_machine_unchecked(&m, machine, contract, c)?;
    let mch = m.machine(machine).context("--machine")?;
    let running = disk::read_config(node)?;
    let ctx = render::machine::context(&m, mch, &rendered);
    let contract = Some(rendered.contract.to_string());
    let desired_name = format!("render of {machine}");
    let node_name = node.to_string_lossy();
    crate::output::diff_report(
        c,
        (&running, &node_name),
        (&rendered.config, &desired_name),
        contract.as_deref(),
        output,
        Some((machine, &ctx, &rendered.inputs_hash)),
    )
}

fn explain(
    path: &str,
    contract: &str,
    output: Output,
    rules: Option<&FsPath>,
    manifests: Option<&FsPath>,
    config: Option<&FsPath>,
) -> Result<Report> {
    let c = disk::classifier(rules)?;
    let desired = config.map(disk::read_config).transpose()?;
    let contract = c.contract(contract).context("--contract")?;
    let parsed = Path::parse(path).with_context(|| format!("path {path:?} does not parse"))?;
    let change = diff::Change { path: parsed, op: diff::Op::Changed, old: None, new: None };
    let policy = match manifests {
        None => vec![],
        Some(dir) => {
            let m = disk::read_manifests(dir, &c)?;
            let cluster =
                m.clusters.first().with_context(|| format!("--manifests {}: no TalosCluster", dir.display()))?;
            cluster.spec.config_policy.clone()
        }
    };
    let outcome = c
        .classify_with_policy(contract, std::slice::from_ref(&change), desired.as_ref(), &policy, true)
        .context("classifying")?;
    let k = &outcome.changes[0];
    let shown = change.path.to_string();
    let decided = c.proof(&outcome, &change.path, k).and_then(|p| match p {
        engine::explain::Proof::Rule { rule, .. } => Some(rule),
        engine::explain::Proof::Input { .. } => None,
    });
    let why = c.why_with(contract, k, &policy);
    let policy_at = k.policy_field();
    let effect = c.effect_label(k);
    let no_effect = outcome.no_effect[0].as_deref();
    let effect_rule = c.effect_rule(&outcome, &change.path, k);
    let stdout = match output {
        o @ (Output::Json | Output::Yaml) => {
            let mut v = json!({
                "path": shown,
                "contract": contract.to_string(),
                "class": k.class,
                "restarts": c.restarts(k),
                "appliedBy": c.applied_by(k),
                "effect": k.effect,
                "effectText": effect,
                "noEffectBecause": no_effect,
                "effectDecidedBy": effect_rule.as_ref().map(|r| json!({"file": r.file, "line": r.line, "doc": r.doc})),
                "rule": rule_json(&c, k.entry(), &change.path),
                "why": why,
                "sensitive": k.sensitive,
                "decidedBy": decided.map(|r| json!({"file": r.file, "line": r.line, "doc": r.doc})),
            });
            if let Some(p) = &policy_at {
                v["policy"] = json!(p);
            }
            o.data(&v)?
        }
        Output::Text | Output::Wide => {
            let mut s = format!("{shown} at {contract}: {}\n", k.class);
            if let Some(e) = &effect {
                s += &format!("  effect:     {e}\n");
            }
            if let Some(b) = no_effect {
                s += &format!("  no effect:  {b}\n");
            }
            s += &format!("  why:        {why}\n");
            match (k.entry(), k.reason) {
                (Some(e), _) => {
                    let en = &c.meta.entries[e];
                    s += &format!(
                        "  rule:       {}:{} (pattern {})\n",
                        c.fieldmeta_file,
                        en.line,
                        best_pattern(&c, e, &change.path)
                    );
                    s += &format!("  source:     {}\n", en.source);
                }
                (None, Reason::Policy(i)) => {
                    let p = &policy[i];
                    s += &format!(
                        "  rule:       the cluster's spec.configPolicy[{i}] (patterns {})\n",
                        p.paths.join(", ")
                    );
                }
                (None, Reason::Unsupported) => s += "  rule:       none: the contract's inventory has no such path\n",
                (None, Reason::Ambiguous) => {
                    s += "  rule:       none: equally specific entries disagree, so Ichor fails closed\n"
                }
                (None, _) => s += "  rule:       none: no entry decides, so the default (reboot-required) applies\n",
            }
            if !c.restarts(k).is_empty() {
                s += &format!("  restarts:   {}\n", c.restarts(k).join(", "));
            }
            if let Some(op) = c.applied_by(k) {
                s += &format!("  applied by: the {op} operation\n");
            }
            if k.sensitive {
                s += "  sensitive:  values are always shown as <redacted>\n";
            }
            if let Some(r) = decided {
                let doc = r.doc.map(|d| format!(" ({})", d.replace('\n', " "))).unwrap_or_default();
                s += &format!("  decided by: {}:{}{doc}\n", r.file, r.line);
            }
            if let Some(r) = &effect_rule {
                let doc = r.doc.as_ref().map(|d| format!(" ({})", d.replace('\n', " "))).unwrap_or_default();
                s += &format!("  effect by:  {}:{}{doc}\n", r.file, r.line);
            }
            s
        }
    };
    Ok(Report { stdout, ..Report::default() })
}
