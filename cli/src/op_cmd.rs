//! The front door's operation commands: `ichor upgrade kubernetes`, `ichor cni kube-proxy`,
//! `ichor status [--watch]` and `ichor operation resume|abort`, against the cluster a kubeconfig
//! names (as `kubectl`: KUBECONFIG, `--context`, `--namespace`) and the nodes a talosconfig names.
//!
//! Start at `start`: it previews the operation with the controller's own read and the planner
//! (the rules' confirmation: machines, order, what would block), asks for consent (or `--yes`),
//! then writes the cluster's spec and creates the TalosOperation. `status` reads the operations
//! back and, with `--watch`, follows them with a progress bar each until they end.

use crate::{Output, Report, disk};
use anyhow::{Context, Result, anyhow, bail};
use kube_client::api::{Api, ListParams, Patch, PatchParams, PostParams};
use render::api::{
    CONFIRM_KUBE_PROXY_SWITCH, KubeProxyMode, MachinePhase, OperationKind, Phase, TalosCluster, TalosOperation,
    TalosOperationSpec,
};
use runtime::plan::Action;
use serde_json::json;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

/// Which Kubernetes cluster, as `kubectl` chooses it.
#[derive(clap::Args, Debug, Clone)]
pub struct KubeArgs {
    /// The kubeconfig (default: as kubectl finds it: $KUBECONFIG's files merged, first one
    /// winning; an empty or unset KUBECONFIG means ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The namespace of the custom resources (default: the context's, else ichor-system).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
}

/// What starting an operation needs besides the cluster: the nodes, for the preview.
#[derive(clap::Args, Debug, Clone)]
pub struct StartArgs {
    #[arg(long)]
    pub cluster: String,
    /// The talosconfig the preview reads the nodes with (the controller's own read; default:
    /// $TALOSCONFIG, else ~/.talos/config).
    #[arg(long)]
    pub talosconfig: Option<PathBuf>,
    /// Answer yes to the confirmation (for scripts).
    #[arg(long)]
    pub yes: bool,
    /// Print the TalosOperation and the plan; create and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// A kube client and the namespace, from the kubeconfig as `kubectl` reads it.
pub async fn connect(a: &KubeArgs) -> Result<(kube_client::Client, String)> {
    use kube_client::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions { context: a.context.clone(), ..Default::default() };
    let kubeconfig = match &a.kubeconfig {
        Some(p) => Kubeconfig::read_from(p).with_context(|| format!("--kubeconfig {}", p.display()))?,
        None => {
            let home = std::env::var_os("HOME").map(PathBuf::from);
            let files = kubeconfig_files(std::env::var_os("KUBECONFIG").as_deref(), home.as_deref());
            let mut merged: Option<Kubeconfig> = None;
            for f in files.iter().filter(|f| f.exists()) {
                let k = Kubeconfig::read_from(f).with_context(|| format!("the kubeconfig {}", f.display()))?;
                merged = Some(match merged {
                    None => k,
                    Some(m) => m.merge(k).with_context(|| format!("merging the kubeconfig {}", f.display()))?,
                });
            }
            let shown: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            merged.with_context(|| {
                format!(
                    "no kubeconfig: none of {} exists; set KUBECONFIG to your cluster's kubeconfig or pass --kubeconfig",
                    shown.join(", ")
                )
            })?
        }
    };
    let context_ns = kubeconfig
        .contexts
        .iter()
        .find(|c| Some(&c.name) == a.context.as_ref().or(kubeconfig.current_context.as_ref()))
        .and_then(|c| c.context.as_ref()?.namespace.clone());
    let config = kube_client::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .context("--context: the kubeconfig has no such context")?;
    let namespace = a.namespace.clone().or(context_ns).unwrap_or_else(|| "ichor-system".into());
    let client = kube_client::Client::try_from(config).context("building the Kubernetes client")?;
    Ok((client, namespace))
}

/// The kubeconfig files kubectl reads, in order (the first one's current context and
/// entries win): KUBECONFIG's list with empty entries skipped, or ~/.kube/config when it names
/// none (unset or empty). Files that do not exist are skipped by the reader, as kubectl does.
fn kubeconfig_files(env: Option<&std::ffi::OsStr>, home: Option<&std::path::Path>) -> Vec<PathBuf> {
    let listed: Vec<PathBuf> =
        env.map(|v| std::env::split_paths(v).filter(|p| !p.as_os_str().is_empty()).collect()).unwrap_or_default();
    if !listed.is_empty() {
        return listed;
    }
    home.map(|h| vec![h.join(".kube").join("config")]).unwrap_or_default()
}

fn talos_client(path: &std::path::Path) -> Result<runtime::talos::client::Client> {
    let file = path.display().to_string();
    let text = disk::read_text(path, disk::caps::TEXT, "a talosconfig")?;
    let cfg = runtime::talos::config::TalosConfig::parse(&text, &file)?;
    let (name, ctx) = cfg.context(None, &file)?;
    let creds = ctx.credentials(name, &file, crate::io::now())?;
    Ok(runtime::talos::client::Client::new(ctx, &creds, Duration::from_secs(15))?)
}

/// What the user starts.
pub enum Start {
    Upgrade {
        to: String,
        max_unavailable: i32,
        force_drain: bool,
    },
    KubeProxy {
        mode: KubeProxyMode,
    },
    /// `ichor upgrade talos`: Talos itself, to a version.
    Talos {
        to: String,
        max_unavailable: i32,
        allow_downgrade: bool,
        force_drain: bool,
    },
    /// `ichor config apply`: the machines named (none: every one with reboot paths).
    Rollout {
        machines: Vec<String>,
        max_unavailable: i32,
        force_drain: bool,
    },
    /// `ichor cni upgrade`: the Cilium release to the embedded chart.
    CiliumUpgrade,
    /// `ichor upgrade cluster`: the release set this Ichor ships, in stages.
    Release {
        max_unavailable: i32,
        force_drain: bool,
    },
    /// `ichor adopt`: a Cilium someone else installed, taken over into Ichor's release.
    Adopt,
}

/// `ichor upgrade kubernetes` and `ichor cni kube-proxy`: preview, consent, then the spec
/// write and the TalosOperation.
pub fn start(what: Start, a: &StartArgs) -> Result<Report> {
    let rt = crate::io::io_runtime()?;
    rt.block_on(start_async(what, a))
}

/// The problems of a cluster's maintenance windows and health checks (the kinds looked up
/// through discovery), each with its field path: what admission refuses.
async fn gate_problems(client: &kube_client::Client, cluster: &TalosCluster) -> Result<Vec<String>> {
    let mut served = vec![];
    for c in &cluster.spec.health_checks {
        let (_, s) = runtime::kube::served_kind(client, &c.object)
            .await
            .with_context(|| format!("looking up kind {} {} (discovery)", c.object.api_version, c.object.kind))?;
        served.push(((c.object.api_version.clone(), c.object.kind.clone()), s));
    }
    let lookup = |o: &render::api::HealthObject| runtime::health::served_in(&served, o);
    let windows = runtime::window::problems(&cluster.spec.maintenance_windows, crate::io::now());
    let health = runtime::health::problems(&cluster.spec.health_checks, &lookup);
    Ok(windows.iter().chain(&health).map(ToString::to_string).collect())
}

async fn start_async(what: Start, a: &StartArgs) -> Result<Report> {
    let (client, ns) = connect(&a.kube).await?;
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = match clusters.get(&a.cluster).await {
        Ok(c) => c,
        Err(kube_client::Error::Api(e)) if e.code == 404 => {
            bail!("TalosCluster {ns}/{} not found: `kubectl get talosclusters -n {ns}` lists the clusters", a.cluster)
        }
        Err(e) => return Err(anyhow!(e).context(format!("--cluster: reading TalosCluster {ns}/{}", a.cluster))),
    };
    // The gates the operator wrote, checked as admission checks them: an operation never starts
    // (nor previews) on windows or health checks it could not honour.
    let problems = gate_problems(&client, &cluster).await?;
    if !problems.is_empty() {
        bail!(
            "TalosCluster {ns}/{}: {}; nothing was written: fix the spec (kubectl edit taloscluster {} -n {ns}) and run the command again",
            a.cluster,
            problems.join("; "),
            a.cluster
        );
    }
    // The cluster as it will be, and the operation to create.
    let mut target = cluster.clone();
    let mut spec = TalosOperationSpec { max_unavailable: 1, ..Default::default() };
    spec.cluster_ref.name = a.cluster.clone();
    let mut release_note = None;
    let (op_name, spec_patch) = match &what {
        Start::Upgrade { to, max_unavailable, .. } => {
            if !regex_version(to) {
                bail!("--to {to:?}: a Kubernetes version is vX.Y.Z (for example v1.37.0)");
            }
            target.spec.kubernetes_version = to.clone();
            spec.kind = OperationKind::Kubernetes;
            spec.target.kubernetes_version = Some(to.clone());
            spec.max_unavailable = *max_unavailable;
            (
                format!("upgrade-kubernetes-{}", to.trim_start_matches('v').replace('.', "-")),
                json!({"spec": {"kubernetesVersion": to}}),
            )
        }
        Start::Talos { to, max_unavailable, allow_downgrade, .. } => {
            if !regex_version(to) {
                bail!("--to {to:?}: a Talos version is vX.Y.Z (for example v1.14.6)");
            }
            if *max_unavailable < 1 {
                bail!("--max-unavailable {max_unavailable}: at least 1 worker must be able to upgrade at a time");
            }
            target.spec.talos_version = to.clone();
            spec.kind = OperationKind::Talos;
            spec.target.talos_version = Some(to.clone());
            spec.target.allow_downgrade = *allow_downgrade;
            spec.max_unavailable = *max_unavailable;
            (
                format!("upgrade-talos-{}", to.trim_start_matches('v').replace('.', "-")),
                json!({"spec": {"talosVersion": to}}),
            )
        }
        Start::KubeProxy { mode } => {
            target.spec.cni.kube_proxy = *mode;
            spec.kind = OperationKind::Cni;
            spec.target.kube_proxy = Some(*mode);
            (format!("kube-proxy-{}", mode.name()), json!({"spec": {"cni": {"kubeProxy": mode.name()}}}))
        }
        Start::Rollout { machines, max_unavailable, .. } => {
            if *max_unavailable < 1 {
                bail!("--max-unavailable {max_unavailable}: at least 1 worker must be able to reboot at a time");
            }
            spec.kind = OperationKind::Config;
            spec.target.machines = machines.clone();
            spec.max_unavailable = *max_unavailable;
            ("config-rollout".to_string(), json!({}))
        }
        Start::CiliumUpgrade => {
            let chart = render::embedded::CILIUM_CHART_VERSION;
            spec.kind = OperationKind::CniUpgrade;
            spec.target.cilium_chart = Some(chart.to_string());
            (format!("cilium-upgrade-{}", chart.replace('.', "-")), json!({}))
        }
        Start::Release { max_unavailable, .. } => {
            if *max_unavailable < 1 {
                bail!("--max-unavailable {max_unavailable}: at least 1 worker must be able to change at a time");
            }
            // The acting controller's release set (its Lease says it), else this binary's.
            let set = match runtime::kube::controller_release_set(&client, &ns, runtime::serve::LEASE_NAME).await {
                Some(set) => set,
                None => {
                    release_note = Some("no controller's Lease names its release set: the target is this ichor's (ichor version); a controller of another release set refuses it".to_string());
                    runtime::plan::Planner::embedded()?.release_set()?
                }
            };
            spec.kind = OperationKind::Release;
            spec.target.talos_version = Some(set.talos.clone());
            spec.target.kubernetes_version = Some(set.kubernetes.clone());
            spec.target.cilium_chart = Some(set.cilium.clone());
            spec.max_unavailable = *max_unavailable;
            let dashed = |v: &str| v.trim_start_matches('v').replace('.', "-");
            (format!("release-{}-{}", dashed(&set.talos), dashed(&set.kubernetes)), json!({}))
        }
        Start::Adopt => {
            spec.kind = OperationKind::CniAdopt;
            spec.target.cilium_chart = Some(render::embedded::CILIUM_CHART_VERSION.to_string());
            ("cilium-adopt".to_string(), json!({}))
        }
    };
    // The consent to go past budgets, for the operations that drain.
    spec.force_drain = match &what {
        Start::Upgrade { force_drain, .. }
        | Start::Talos { force_drain, .. }
        | Start::Rollout { force_drain, .. }
        | Start::Release { force_drain, .. } => *force_drain,
        _ => false,
    };
    // An adoption keeps what the running Cilium says (cilium-config read back into the chart's
    // values, render::adopt) under the cluster's layer: the cluster as it will be has them.
    let adoption = match &what {
        Start::Adopt => {
            let live = runtime::kube::read_cilium(&client).await.context("reading the running Cilium")?;
            let kept = Adoption::of(&cluster, &live.config)?;
            kept.apply(&mut target);
            Some(kept)
        }
        _ => None,
    };
    let spec_patch = match &adoption {
        Some(k) => k.spec_patch(),
        None => spec_patch,
    };
    // Another operation of the cluster that has not ended is in the way (it holds the lock, or
    // is Paused with work left): nothing is written, and the three ways forward are named.
    let planner = runtime::plan::Planner::embedded()?;
    let (terminal, _) = planner.phase_sets()?;
    let ops: Api<TalosOperation> = Api::namespaced(client.clone(), &ns);
    let existing = ops.list(&Default::default()).await.with_context(|| format!("listing TalosOperations in {ns}"))?;
    let ended = |o: &TalosOperation| terminal.contains(&o.status.as_ref().map(|s| s.phase()).unwrap_or_default());
    if let Some(o) = existing.items.iter().find(|o| o.spec.cluster_ref.name == a.cluster && !ended(o)) {
        let name = o.metadata.name.clone().unwrap_or_default();
        let phase = o.status.as_ref().map(|s| s.phase()).unwrap_or_default();
        let same = name == op_name;
        let stderr = if same {
            format!(
                "TalosOperation {ns}/{name} already runs this ({phase}): follow it with `ichor status --cluster {} --watch`; nothing was written.\n",
                a.cluster
            )
        } else {
            format!(
                "TalosOperation {ns}/{name} ({phase}) has not ended on cluster {}: only one operation runs on a cluster at a time, and nothing was written. Either wait for it (`ichor status --cluster {} --watch`), resume it if it is Paused (`ichor operation resume {name}`), or abort it (`ichor operation abort {name}`); then start this one again.\n",
                a.cluster, a.cluster
            )
        };
        // With --output json the refusal is also data on stdout: what is in the way, and why.
        let stdout = match a.output {
            o @ (Output::Json | Output::Yaml) => {
                let v =
                    json!({"created": false, "inTheWay": {"name": name, "phase": phase}, "message": stderr.trim_end()});
                o.data(&v)?
            }
            Output::Text | Output::Wide => String::new(),
        };
        return Ok(Report { stdout, stderr, findings: true, ..Report::default() });
    }
    // The same target started again after an abort or a failure: a fresh name (`-2`, `-3` ...).
    let op_name = {
        let taken = |n: &str| existing.items.iter().any(|o| o.metadata.name.as_deref() == Some(n));
        let mut name = op_name;
        let base = name.clone();
        let mut i = 2;
        while taken(&name) {
            name = format!("{base}-{i}");
            i += 1;
        }
        name
    };
    let mut op = TalosOperation::new(&op_name, spec);
    op.metadata.namespace = Some(ns.clone());
    // The preview: the controller's own read and the rules' plan for the operation's first
    // reconcile.
    let controller = runtime::controller::Controller::new(
        client.clone(),
        talos_client(&crate::talos_cmd::find_talosconfig(a.talosconfig.as_deref())?)?,
        planner,
        disk::classifier(None)?,
    )
    // The acting controller's node goes last, as it will (the Lease names it).
    .with_controller_node(
        runtime::kube::controller_node(&client, &ns, runtime::serve::LEASE_NAME, crate::io::now()).await,
    );
    let mut read = controller
        .read_operation(&ns, &op, &target, &runtime::plan::rfc3339(crate::io::now()))
        .await
        .context("reading what the operation's rules need (the preview)")?;
    // The drains the steps will run, checked now: the budgets that would refuse them (the rules
    // name those of the machines the operation drains). Unreadable, it is said, not guessed.
    let mut unchecked = None;
    match runtime::kube::read_drain_refusals(&client).await {
        Ok(mut by_node) => {
            for m in &mut read.snapshot.machines {
                m.drain_refusals = by_node.remove(&m.name).unwrap_or_default();
            }
        }
        Err(e) => unchecked = Some(runtime::error_chain(&e)),
    }
    // A machine named that the cluster does not have: an error naming it, nothing written.
    if let Start::Rollout { machines, .. } = &what {
        let known: Vec<&str> = read.snapshot.machines.iter().map(|m| m.name.as_str()).collect();
        let unknown: Vec<&str> = machines.iter().map(String::as_str).filter(|m| !known.contains(m)).collect();
        if !unknown.is_empty() {
            bail!(
                "--machines: cluster {ns}/{} has no TalosMachine {}: `kubectl get talosmachines -n {ns}` lists them ({}); nothing was written",
                a.cluster,
                unknown.join(", "),
                known.join(", ")
            );
        }
    }
    let plan = controller.planner.plan_with(&read.snapshot, false)?;
    // What the first reconcile would do, sorted by what it means for the start.
    let (mut blocking, mut waits, mut riding) = (vec![], vec![], vec![]);
    for (act, _) in &plan.actions {
        match act {
            Action::Pause { .. } | Action::Fail { .. } => blocking.push(act.to_string()),
            Action::Wait { .. } => waits.push(act.to_string()),
            Action::Warn { .. } => riding.push(act.to_string()),
            _ => {}
        }
    }
    // A release's stages, each previewed as its own operation would be if it started now: what
    // it does per machine, in what order; what blocks the first (the later ones are checked
    // when their turn comes, on the cluster the stages before them leave).
    let mut stage_previews: Vec<(String, Vec<String>)> = vec![];
    for (i, (kind, target)) in plan.stages.iter().enumerate() {
        let start = runtime::plan::StageStart::of(&read.snapshot, *kind, target);
        let mut stage_op = start.operation();
        stage_op.metadata.namespace = Some(ns.clone());
        let mut stage_cluster = cluster.clone();
        stage_cluster.spec.set_stage(*kind, target);
        let stage_read = controller
            .read_operation(&ns, &stage_op, &stage_cluster, &runtime::plan::rfc3339(crate::io::now()))
            .await
            .with_context(|| format!("reading what stage {} ({kind} {target}) needs (the preview)", i + 1))?;
        // The versions the stages before it leave the machines on.
        let mut stage_read = stage_read;
        for (done_kind, done_target) in &plan.stages[..i] {
            for m in &mut stage_read.snapshot.machines {
                match done_kind {
                    OperationKind::Talos => m.talos_version = done_target.clone(),
                    OperationKind::Kubernetes => m.kubelet_version = done_target.clone(),
                    _ => {}
                }
            }
        }
        let stage_plan = controller.planner.plan_with(&stage_read.snapshot, false)?;
        let blocks = if i == 0 {
            stage_plan
                .actions
                .iter()
                .filter(|(a, _)| matches!(a, Action::Pause { .. } | Action::Fail { .. }))
                .map(|(a, _)| a.to_string())
                .collect()
        } else {
            vec![]
        };
        stage_previews.push((stage_plan.confirmation.clone().unwrap_or_default(), blocks));
    }
    let confirmation =
        plan.confirmation.clone().unwrap_or_else(|| format!("Start {op_name} on cluster {ns}/{}.", a.cluster));
    let op_yaml = serde_yaml::to_string(&op)?;
    let mut text = format!("{confirmation}\n");
    // A rollout's preview names, per machine it takes, the changes the reboot is for.
    for (machine, paths) in &plan.reboot_paths {
        text += &format!("  {machine}: {}\n", paths.join(", "));
    }
    // A release's preview lists its stages, each with its target (rules/release.rules).
    if !plan.stages.is_empty() {
        text += "Stages, in order (each an operation of its own kind, created when its turn comes):\n";
        for (i, (kind, target)) in plan.stages.iter().enumerate() {
            let target = if target.is_empty() { "the changes that need a reboot".to_string() } else { target.clone() };
            text += &format!("  {}. {kind}: {target}\n", i + 1);
            if let Some((what, blocks)) = stage_previews.get(i) {
                if !what.is_empty() {
                    text += &format!("     {what}\n");
                }
                for b in blocks {
                    text += &format!("     It would not start now: {b}\n");
                }
            }
        }
        if plan.stages.len() > 1 {
            text += "  (Each stage after the first is previewed on the cluster as it is now with the versions the stages before it leave; it is checked again when its turn comes.)\n";
        }
    }
    if !plan.checks.is_empty() {
        text += "Checks passed:\n";
        for c in &plan.checks {
            text += &format!("  - {c}\n");
        }
    }
    if let Some(k) = &adoption {
        text += &k.describe();
    }
    if !plan.drain_refusals.is_empty() {
        text += "Its drains, checked now:\n";
        for d in &plan.drain_refusals {
            text += &format!("  - {d}\n");
        }
    }
    if op.spec.force_drain {
        text += "With --force-drain: a pod a PodDisruptionBudget still keeps at a drain's deadline (ichor controller --drain-timeout) is deleted, not waited for; the budget is not respected past it.\n";
    }
    if blocking.is_empty() && plan.drain_refusals.is_empty() {
        text += "Nothing blocks it now.\n";
    } else if blocking.is_empty() {
        text += "Nothing blocks its start now.\n";
    } else {
        text += "It would not start now:\n";
        for b in &blocking {
            text += &format!("  - {b}\n");
        }
    }
    if !waits.is_empty() {
        text += "First it waits:\n";
        for w in &waits {
            text += &format!("  - {w}\n");
        }
    }
    if let Some(note) = release_note {
        riding.push(note);
    }
    if let Some(why) = unchecked {
        riding.push(format!(
            "the drains were not checked against PodDisruptionBudgets ({why}): a budget that allows no disruption pauses the operation at that machine's drain"
        ));
    }
    for r in &riding {
        text += &format!("Note: {r}\n");
    }
    let json_out = |created: bool| {
        let mut v = json!({
            "operation": op,
            "confirmation": confirmation,
            "blocking": blocking,
            "waits": waits,
            "notes": riding,
            "rebootPaths": plan.reboot_paths,
            "drainsRefusedNow": plan.drain_refusals,
            "created": created,
        });
        // A release's preview also lists its stages.
        if !plan.stages.is_empty() {
            v["stages"] = json!(
                plan.stages
                    .iter()
                    .zip(&stage_previews)
                    .map(
                        |((k, t), (what, blocks))| json!({"kind": k, "target": t, "preview": what, "blocking": blocks})
                    )
                    .collect::<Vec<_>>()
            );
        }
        // An adoption's preview also says its checks and what it keeps.
        if let Some(k) = &adoption {
            v["checks"] = json!(plan.checks);
            v["kept"] = json!({"values": k.taken, "tunnelProtocol": k.tunnel, "notKept": k.unread});
        }
        v
    };
    // Nothing to do: the cluster already runs the target (the spec says it, and every machine
    // runs it, or the status records the mode): nothing is written.
    let runs_target = match &what {
        Start::Upgrade { to, .. } => {
            &cluster.spec.kubernetes_version == to
                && !read.snapshot.machines.is_empty()
                && read.snapshot.machines.iter().all(|m| &m.kubelet_version == to)
        }
        Start::KubeProxy { mode } => {
            cluster.spec.cni.kube_proxy == *mode && render::render::status_kube_proxy(&cluster) == Some(*mode)
        }
        Start::Rollout { .. } => plan.work_left.is_empty() && blocking.is_empty(),
        Start::CiliumUpgrade => {
            read.snapshot.workload.cilium_chart_version.as_deref() == Some(render::embedded::CILIUM_CHART_VERSION)
        }
        // Ichor's already, or every machine on the target: the rules say so (`nothing_to_do`),
        // with their reason.
        Start::Adopt | Start::Talos { .. } | Start::Release { .. } => plan.nothing_to_do.is_some(),
    };
    if runs_target {
        let stdout = match &what {
            Start::Upgrade { to, .. } => {
                format!(
                    "Nothing to do: cluster {ns}/{} already runs Kubernetes {to}; nothing was written.\n",
                    a.cluster
                )
            }
            Start::KubeProxy { mode } => format!(
                "Nothing to do: cluster {ns}/{} already runs kube-proxy {}; nothing was written.\n",
                a.cluster,
                mode.name()
            ),
            Start::Rollout { .. } => format!(
                "Nothing to do: no machine of cluster {ns}/{} has a change that needs a reboot (status.rebootPaths); nothing was written.\n",
                a.cluster
            ),
            Start::Adopt | Start::Talos { .. } | Start::Release { .. } => {
                format!("Nothing to do: {}; nothing was written.\n", plan.nothing_to_do.as_deref().unwrap_or_default())
            }
            Start::CiliumUpgrade => format!(
                "Nothing to do: cluster {ns}/{} already runs Cilium {}, the chart this Ichor embeds; nothing was written.\n",
                a.cluster,
                render::embedded::CILIUM_CHART_VERSION
            ),
        };
        return Ok(Report { stdout, ..Report::default() });
    }
    if a.dry_run {
        let stdout = match a.output {
            o @ (Output::Json | Output::Yaml) => o.data(&json_out(false))?,
            Output::Text | Output::Wide => format!("{text}\nThe TalosOperation (not created, --dry-run):\n{op_yaml}"),
        };
        return Ok(Report {
            stdout,
            findings: !blocking.is_empty() || !plan.drain_refusals.is_empty(),
            ..Report::default()
        });
    }
    // A blocked start writes nothing (ADR 0113: other targets are refused before anything is
    // written), with or without --yes.
    if !blocking.is_empty() {
        let stdout = match a.output {
            o @ (Output::Json | Output::Yaml) => o.data(&json_out(false))?,
            Output::Text | Output::Wide => String::new(),
        };
        return Ok(Report {
            stdout,
            stderr: format!(
                "{text}Not started: nothing was written. Clear what blocks it, then run the command again.\n"
            ),
            findings: true,
            ..Report::default()
        });
    }
    // A Git-tracked cluster: the spec change belongs in Git, with the consent annotation.
    let tracked = git_tracked(&cluster);
    // A release writes the cluster's versions at each stage, which a sync from Git would undo:
    // its stages go through Git one at a time instead.
    if tracked && matches!(what, Start::Release { .. }) {
        return Ok(Report {
            stdout: format!(
                "{text}\nTalosCluster {ns}/{} is tracked by Argo CD: a release rollout sets spec.talosVersion and spec.kubernetesVersion at each stage, which a sync from Git would undo; nothing was written. Take the stages above one at a time: commit each version to Git, then start its operation (ichor upgrade talos, ichor config apply, ichor upgrade kubernetes, ichor cni upgrade).\n",
                a.cluster
            ),
            findings: true,
            ..Report::default()
        });
    }
    let spec_done = match &what {
        Start::Upgrade { to, .. } => &cluster.spec.kubernetes_version == to,
        Start::Talos { to, .. } => &cluster.spec.talos_version == to,
        Start::KubeProxy { mode } => cluster.spec.cni.kube_proxy == *mode,
        // A rollout changes no spec: it applies what the spec already says; a Cilium upgrade
        // moves the release to the chart this Ichor embeds, which no spec field names.
        Start::Rollout { .. } | Start::CiliumUpgrade => true,
        // A release sets the versions itself, stage by stage (refused above when Git owns them).
        Start::Release { .. } => true,
        Start::Adopt => adoption.as_ref().is_none_or(|k| k.taken.is_empty() && k.tunnel.is_none()),
    };
    if tracked && !spec_done {
        let mut out = format!(
            "{text}\nTalosCluster {ns}/{} is tracked by Argo CD: commit this change to Git, then run the same command again (it finds the spec changed and starts the operation):\n",
            a.cluster
        );
        out += &match &what {
            Start::Upgrade { to, .. } => format!("spec:\n  kubernetesVersion: {to}\n"),
            Start::Talos { to, .. } => format!("spec:\n  talosVersion: {to}\n"),
            Start::KubeProxy { mode } => format!(
                "metadata:\n  annotations:\n    {CONFIRM_KUBE_PROXY_SWITCH}: {}\nspec:\n  cni:\n    kubeProxy: {}\n",
                mode.name(),
                mode.name()
            ),
            Start::Rollout { .. } | Start::CiliumUpgrade | Start::Release { .. } => String::new(),
            Start::Adopt => serde_yaml::to_string(&spec_patch)?,
        };
        return Ok(Report { stdout: out, findings: true, ..Report::default() });
    }
    if !a.yes {
        if !std::io::stdin().is_terminal() && std::env::var_os("ICHOR_CONFIRM_FROM_STDIN").is_none() {
            bail!("{text}no terminal to ask for consent: run again with --yes to start it, or --dry-run to only look");
        }
        eprint!("{text}Start it? [y/N] ");
        std::io::stderr().flush().ok();
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer).ok();
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            return Ok(Report {
                stdout: "Not started: nothing was written.\n".into(),
                findings: true,
                ..Report::default()
            });
        }
    }
    // The spec write (with the consent annotation naming the target mode for a switch),
    // retried on a conflict with a fresh read; then the operation; then the annotation goes.
    if !spec_done {
        let mut body = spec_patch.clone();
        if let Start::KubeProxy { mode } = &what {
            body["metadata"] = json!({"annotations": {CONFIRM_KUBE_PROXY_SWITCH: mode.name()}});
        }
        write_with_retry(&clusters, &a.cluster, body).await?;
    }
    match ops.create(&PostParams::default(), &op).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(e)) if e.code == 409 => {
            bail!(
                "TalosOperation {ns}/{op_name} already exists: follow it with `ichor status --cluster {} --watch`, or abort it first",
                a.cluster
            )
        }
        Err(e) => return Err(anyhow!(e).context(format!("creating TalosOperation {ns}/{op_name}"))),
    }
    if matches!(what, Start::KubeProxy { .. }) {
        write_with_retry(
            &clusters,
            &a.cluster,
            json!({"metadata": {"annotations": {CONFIRM_KUBE_PROXY_SWITCH: null}}}),
        )
        .await?;
    }
    let stdout = match a.output {
        o @ (Output::Json | Output::Yaml) => o.data(&json_out(true))?,
        Output::Text | Output::Wide => format!(
            "{text}Created TalosOperation {ns}/{op_name}. Follow it with: ichor status --cluster {} --watch\n",
            a.cluster
        ),
    };
    Ok(Report { stdout, ..Report::default() })
}

/// What an adoption keeps of the running Cilium (render::adopt): the values merged under the
/// cluster's layer, the tunnel protocol, and what does not read.
struct Adoption {
    /// The cluster's layer with the kept values under it.
    merged: serde_json::Value,
    /// The kept values the layer did not set already.
    taken: Vec<render::adopt::Kept>,
    /// cilium-config's tunnel-protocol where the spec says another: what runs wins (changing
    /// it is a datapath change, no adoption's business).
    tunnel: Option<String>,
    unread: Vec<render::adopt::Unread>,
}

impl Adoption {
    fn of(cluster: &TalosCluster, config: &std::collections::BTreeMap<String, String>) -> Result<Adoption> {
        let table = render::adopt::Table::embedded()?;
        let (kept, unread) = table.kept(config);
        let cilium = cluster.spec.cni.cilium.clone().unwrap_or_default();
        let user = cilium.values.clone().unwrap_or(serde_json::Value::Null);
        let (merged, taken) = render::adopt::merge(&user, &kept);
        let tunnel = config
            .get("tunnel-protocol")
            .filter(|t| matches!(t.as_str(), "vxlan" | "geneve") && **t != effective_tunnel(&cilium.tunnel_protocol))
            .cloned();
        Ok(Adoption { merged, taken, tunnel, unread })
    }

    /// The cluster as it will be.
    fn apply(&self, target: &mut TalosCluster) {
        let c = target.spec.cni.cilium.get_or_insert_with(Default::default);
        if !self.taken.is_empty() {
            c.values = Some(self.merged.clone());
        }
        if let Some(t) = &self.tunnel {
            c.tunnel_protocol = t.clone();
        }
    }

    /// The spec write.
    fn spec_patch(&self) -> serde_json::Value {
        let mut cilium = json!({});
        if !self.taken.is_empty() {
            cilium["values"] = self.merged.clone();
        }
        if let Some(t) = &self.tunnel {
            cilium["tunnelProtocol"] = json!(t);
        }
        json!({"spec": {"cni": {"cilium": cilium}}})
    }

    /// The preview's lines.
    fn describe(&self) -> String {
        let mut out = String::new();
        if self.taken.is_empty() && self.tunnel.is_none() {
            out += "Values kept from the running Cilium: none (cilium-config sets nothing the table of rules/cilium/adopt.yaml reads that the cluster's layer does not set already).\n";
        } else {
            out += "Values kept from the running Cilium (written to spec.cni.cilium first; the cluster's layer wins where it sets a key):\n";
            for k in &self.taken {
                out += &format!("  {}: {}    (cilium-config {})\n", k.value_key, k.value, k.config);
            }
            if let Some(t) = &self.tunnel {
                out += &format!("  spec.cni.cilium.tunnelProtocol: {t}    (cilium-config tunnel-protocol)\n");
            }
        }
        for u in &self.unread {
            out += &format!(
                "Not kept: cilium-config {} is {:?}, not {}: set it with ichor cni values set if you need it.\n",
                u.config, u.text, u.wanted
            );
        }
        out
    }
}

/// The tunnel protocol a spec means (`vxlan` when it names none).
fn effective_tunnel(spec: &str) -> &str {
    if spec.is_empty() { "vxlan" } else { spec }
}

/// An API error as a sentence naming the object (`TalosOperation ichor-system/x not found`),
/// never the client's debug dump.
fn kube_error(e: kube_client::Error, object: &str) -> anyhow::Error {
    match e {
        kube_client::Error::Api(s) if s.code == 404 => {
            anyhow!("{object} not found: `ichor status` lists the operations, `kubectl get talosclusters` the clusters")
        }
        kube_client::Error::Api(s) => anyhow!("{object}: {}", runtime::api_status_text(&s)),
        other => anyhow!(other).context(object.to_string()),
    }
}

fn regex_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else { return false };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether Argo CD tracks the cluster (its tracking annotation): a spec change belongs in Git.
pub(crate) fn git_tracked(cluster: &TalosCluster) -> bool {
    cluster.metadata.annotations.as_ref().is_some_and(|m| m.contains_key("argocd.argoproj.io/tracking-id"))
}

/// A merge patch, retried on a conflict (the API's 409) a few times.
async fn write_with_retry(api: &Api<TalosCluster>, name: &str, body: serde_json::Value) -> Result<()> {
    let mut last = None;
    for _ in 0..5 {
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&body)).await {
            Ok(_) => return Ok(()),
            Err(kube_client::Error::Api(e)) if e.code == 409 => last = Some(e.to_string()),
            Err(e) => return Err(anyhow!(e).context(format!("writing TalosCluster {name}"))),
        }
    }
    bail!("writing TalosCluster {name}: conflicts kept coming: {}", last.unwrap_or_default())
}

/// An operation's line and its machines, as `status` prints them.
fn describe(op: &TalosOperation) -> String {
    let st = op.status.clone().unwrap_or_default();
    let name = op.metadata.name.clone().unwrap_or_default();
    let phase = st.phase();
    let target = target_of(op);
    let mut s = format!("{name} ({} {target}) on {}: {phase}", op.spec.kind.name(), op.spec.cluster_ref.name);
    if let Some(stage) = &st.stage {
        s += &format!(", stage {stage}");
    }
    if let Some(r) = &st.paused_reason {
        s += &format!("\n  {}: {r}", if phase == Phase::Paused { "paused" } else { "reason" });
    }
    // A release's stages, in order, each with its operation and phase.
    for (i, stage) in st.stages.iter().enumerate() {
        let target = if stage.target.is_empty() { "the changes that need a reboot" } else { &stage.target };
        let by = stage.operation.as_deref().map(|o| format!(" ({o})")).unwrap_or_default();
        s += &format!("\n  stage {}: {} {target}: {}{by}", i + 1, stage.kind, stage.phase);
    }
    for (m, p) in &st.machines {
        s += &format!(
            "\n  {m}: {}{}{}",
            p.phase,
            p.stage.as_deref().map(|x| format!(" ({x})")).unwrap_or_default(),
            p.started_at.as_deref().map(|x| format!(", started {x}")).unwrap_or_default()
        );
    }
    // Each wait with its words, its clock and when that runs out; a clock no wait names now
    // (a machine's step) by its start.
    for w in &st.waits {
        let until = runtime::state::epoch(&w.since)
            .map(|t| format!(", until {}", runtime::plan::rfc3339(t + w.limit_minutes * 60)))
            .unwrap_or_default();
        s += &format!("\n  waiting on {} since {}{until}: {}", w.clock, w.since, w.message);
    }
    for (clock, since) in st.waiting_since.iter().filter(|(c, _)| !st.waits.iter().any(|w| &w.clock == *c)) {
        s += &format!("\n  waiting on {clock} since {since}");
    }
    if !st.machines_left.is_empty() {
        s += &format!("\n  work left on: {}", st.machines_left.join(", "));
    }
    if !st.done.is_empty() {
        s += &format!("\n  done: {}", st.done.join(", "));
    }
    s + "\n"
}

/// The phases `status --watch` stops following in: ended, or paused until a user acts.
fn settled(phase: Phase) -> bool {
    phase.is_terminal() || phase == Phase::Paused
}

/// `ichor status [--cluster NAME] [--watch]`.
pub fn status(
    name: Option<&str>,
    cluster: Option<&str>,
    watch: bool,
    output: Output,
    kube: &KubeArgs,
) -> Result<Report> {
    let rt = crate::io::io_runtime()?;
    rt.block_on(async {
        let (client, ns) = connect(kube).await?;
        let ops: Api<TalosOperation> = Api::namespaced(client.clone(), &ns);
        let list = |ops: Api<TalosOperation>| async move {
            let mut items: Vec<TalosOperation> = ops
                .list(&ListParams::default())
                .await
                .context("listing TalosOperations")?
                .items
                .into_iter()
                .filter(|o| cluster.is_none_or(|c| o.spec.cluster_ref.name == c))
                .filter(|o| name.is_none_or(|n| o.metadata.name.as_deref() == Some(n)))
                .collect();
            items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            Ok::<_, anyhow::Error>(items)
        };
        let phase = |o: &TalosOperation| o.status.as_ref().map(|s| s.phase()).unwrap_or_default();
        let mut items = list(ops.clone()).await?;
        if let Some(n) = name
            && items.is_empty()
        {
            bail!("TalosOperation {ns}/{n} not found: `ichor status` lists the operations");
        }
        // A cluster that does not exist is an error, not "no operations" (issue 50, finding 11).
        if let Some(c) = cluster {
            let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
            if clusters.get_opt(c).await.map_err(|e| kube_error(e, &format!("TalosCluster {ns}/{c}")))?.is_none() {
                bail!("TalosCluster {ns}/{c} not found: `kubectl get talosclusters -n {ns}` lists the clusters");
            }
        }
        // Only the operations not ended yet are followed, and only they decide the exit code: an
        // operation aborted or paused before the watch began does not fail it.
        let names: Vec<String> = if watch {
            items.iter().filter(|o| !settled(phase(o))).filter_map(|o| o.metadata.name.clone()).collect()
        } else {
            vec![]
        };
        if watch {
            let bars = indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr());
            let style = indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
            let mut progress = std::collections::BTreeMap::new();
            // The wait messages last printed, per operation: a line each time they change.
            let mut said: std::collections::BTreeMap<String, Vec<String>> = Default::default();
            loop {
                items = list(ops.clone()).await?;
                let mut open = 0;
                for o in items.iter().filter(|o| o.metadata.name.as_ref().is_some_and(|n| names.contains(n))) {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    let bar = progress.entry(name.clone()).or_insert_with(|| {
                        let b = bars.add(indicatif::ProgressBar::new(0));
                        b.set_style(style.clone());
                        b.set_prefix(name.clone());
                        b
                    });
                    let st = o.status.clone().unwrap_or_default();
                    let (counted, done) = counted_machines(&st);
                    bar.set_length(counted as u64);
                    bar.set_position(done as u64);
                    let waits: Vec<String> = st
                        .waits
                        .iter()
                        .map(|w| format!("{name}: waiting on {}: {}", w.clock, w.message))
                        .collect();
                    if said.get(&name) != Some(&waits) {
                        for line in waits.iter().filter(|w| !said.get(&name).is_some_and(|s| s.contains(w))) {
                            // Hidden bars (not a terminal) print nothing: the line goes to stderr.
                            if bars.is_hidden() {
                                eprintln!("{line}");
                            } else {
                                let _ = bars.println(line);
                            }
                        }
                        said.insert(name.clone(), waits);
                    }
                    bar.set_message(format!("{}{}", phase(o), st.stage.map(|s| format!(" ({s})")).unwrap_or_default()));
                    if !settled(phase(o)) {
                        open += 1;
                    }
                }
                if open == 0 {
                    for b in progress.values() {
                        b.finish();
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        let ended_badly = items
            .iter()
            .filter(|o| o.metadata.name.as_ref().is_some_and(|n| names.contains(n)))
            .any(|o| matches!(phase(o), Phase::Paused | Phase::Aborted));
        let stdout = match output {
            o @ (Output::Json | Output::Yaml) => {
                let v: Vec<serde_json::Value> = items
                    .iter()
                    .map(|o| json!({"name": o.metadata.name, "cluster": o.spec.cluster_ref.name, "kind": o.spec.kind, "target": o.spec.target, "status": o.status}))
                    .collect();
                o.data(&json!({"namespace": ns, "operations": v}))?
            }
            Output::Text | Output::Wide if items.is_empty() => format!("No TalosOperations in {ns}.\n"),
            Output::Text | Output::Wide => {
                let mut text: String = items.iter().map(describe).collect();
                if let Some(n) = name {
                    text += &events_of(&client, &ns, n).await?;
                }
                text
            }
        };
        Ok(Report { stdout, findings: watch && ended_badly, ..Report::default() })
    })
}

/// An operation's recent Events, as `kubectl describe` lists them (core/v1, oldest first).
async fn events_of(client: &kube_client::Client, ns: &str, name: &str) -> Result<String> {
    use k8s_openapi::api::core::v1::Event;
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let selector = format!("involvedObject.kind=TalosOperation,involvedObject.name={name}");
    let mut list = events
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(|e| kube_error(e, &format!("the Events of TalosOperation {ns}/{name}")))?
        .items;
    let when = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
            .unwrap_or_default()
    };
    list.sort_by_key(when);
    if list.is_empty() {
        return Ok("Events: <none>\n".into());
    }
    let mut out = String::from("Events:\n");
    for e in list.iter().rev().take(20).rev() {
        let count = e.count.filter(|c| *c > 1).map(|c| format!(" (x{c})")).unwrap_or_default();
        out += &format!(
            "  {} {}{count}: {}\n",
            e.type_.as_deref().unwrap_or("Normal"),
            e.reason.as_deref().unwrap_or(""),
            e.message.as_deref().unwrap_or("")
        );
    }
    Ok(out)
}

/// The machines an operation's progress counts (those it started and those it still has work
/// on, `status.machinesLeft`), and how many of them are done: a machine no step touches is not
/// counted, and one done in a stage with work left in another is not done.
fn counted_machines(st: &render::api::TalosOperationStatus) -> (usize, usize) {
    let left = |m: &String| st.machines_left.contains(m);
    let counted = st.machines.keys().filter(|m| !left(m)).count() + st.machines_left.len();
    let done = st.machines.iter().filter(|(m, p)| p.phase == MachinePhase::Done && !left(m)).count();
    (counted, done)
}

/// `ichor operation resume|abort NAME`: writes the user's intent as an annotation on the
/// operation (`ichor.maesh.dev/resume`, a counter, or `ichor.maesh.dev/abort`), with the
/// resourceVersion read; the controller's rules move the phase (the status has one writer). It
/// then waits a few seconds for the controller to act and says what it saw.
pub fn resume_or_abort(name: &str, resume: bool, output: Output, kube: &KubeArgs) -> Result<Report> {
    use render::api::{ABORT, RESUME};
    let rt = crate::io::io_runtime()?;
    rt.block_on(async {
        let (client, ns) = connect(kube).await?;
        let ops: Api<TalosOperation> = Api::namespaced(client, &ns);
        // A release's intent goes to the stage operation it follows first (a resumed release
        // whose stage is still paused would pause again): the stage resumes or aborts with it.
        let first = ops.get(name).await.map_err(|e| kube_error(e, &format!("TalosOperation {ns}/{name}")))?;
        let mut stages_told = vec![];
        if first.spec.kind == OperationKind::Release {
            let listed = ops
                .list(&ListParams::default().labels(&format!("{}={name}", render::api::RELEASE)))
                .await
                .with_context(|| format!("listing the stage operations of TalosOperation {ns}/{name}"))?;
            for stage in listed.items {
                let st = stage.status.clone().unwrap_or_default();
                let due = if resume { st.phase() == Phase::Paused } else { !st.phase().is_terminal() };
                if !due {
                    continue;
                }
                let stage_name = stage.metadata.name.clone().unwrap_or_default();
                let intent = runtime::state::Intent::of(stage.metadata.annotations.as_ref(), st.resumed);
                let (key, value) =
                    if resume { (RESUME, (intent.resume.max(intent.resumed) + 1).to_string()) } else { (ABORT, "true".into()) };
                let body = json!({"metadata": {"annotations": {key: value}}});
                ops.patch(&stage_name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .with_context(|| format!("writing the intent on TalosOperation {ns}/{stage_name} (the release's stage)"))?;
                stages_told.push(stage_name);
            }
        }
        let mut attempts = 0;
        let (op, wanted) = loop {
            let op = ops.get(name).await.map_err(|e| kube_error(e, &format!("TalosOperation {ns}/{name}")))?;
            let st = op.status.clone().unwrap_or_default();
            let phase = st.phase();
            let annotations = op.metadata.annotations.clone().unwrap_or_default();
            let intent = runtime::state::Intent::of(Some(&annotations), st.resumed);
            let (key, value) = if resume {
                if phase != Phase::Paused {
                    bail!(
                        "TalosOperation {ns}/{name} is {phase}, not Paused: only a paused operation is resumed{}",
                        match phase {
                            Phase::Completed | Phase::Aborted => "; it has ended: start the operation again to run it once more",
                            _ => "; follow it with ichor status --watch, or end it with ichor operation abort",
                        }
                    );
                }
                if intent.abort {
                    bail!("TalosOperation {ns}/{name} was asked to abort: an aborted operation is not resumed");
                }
                (RESUME, (intent.resume.max(intent.resumed) + 1).to_string())
            } else {
                if phase.is_terminal() {
                    bail!("TalosOperation {ns}/{name} is already {phase}: there is nothing to abort");
                }
                (ABORT, "true".to_string())
            };
            let body = json!({"metadata": {
                "resourceVersion": op.metadata.resource_version,
                "annotations": {key: value},
            }});
            match ops.patch(name, &PatchParams::default(), &Patch::Merge(&body)).await {
                Ok(_) => break (op, value),
                Err(kube_client::Error::Api(e)) if e.code == 409 && attempts < 5 => attempts += 1,
                Err(e) => return Err(anyhow!(e).context(format!("writing the intent on TalosOperation {ns}/{name}"))),
            }
        };
        let st = op.status.clone().unwrap_or_default();
        let was = st.phase();
        // The controller moves the phase; wait a little for it to be seen.
        let mut now = None;
        for _ in 0..50 {
            let o = ops.get(name).await.map_err(|e| kube_error(e, &format!("TalosOperation {ns}/{name}")))?;
            let s = o.status.unwrap_or_default();
            let acted = if resume { s.resumed.to_string() == wanted } else { s.phase() == Phase::Aborted };
            if acted {
                now = Some(s.phase());
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let stdout = if output.is_data() {
            output.data(&json!({"namespace": ns, "operation": name, "was": was, "now": now.unwrap_or(was), "acted": now.is_some(), "pausedReason": st.paused_reason}))?
        } else if now.is_none() {
            format!(
                "Asked TalosOperation {ns}/{name} to {}; no controller acted on it within 10 s: it acts at its next reconcile (one inside a step, such as a drain that waits for a PodDisruptionBudget up to ichor controller --drain-timeout, ends that step first); if none runs, start ichor controller.\n",
                if resume { "resume" } else { "abort" }
            )
        } else if resume {
            format!("Resumed TalosOperation {ns}/{name} (it was paused: {}).\n", st.paused_reason.unwrap_or_default())
        } else {
            // A Cilium Job already created is Helm's to finish: an abort stops the operation,
            // not Helm (which rolls a failed upgrade back).
            let job_note = match op.spec.kind {
                OperationKind::Cni | OperationKind::CniUpgrade | OperationKind::CniAdopt => {
                    " A Cilium Job it already started runs to its end (Helm rolls a failed upgrade back); CNIValuesApplied on the cluster says what Cilium runs then."
                }
                _ => "",
            };
            format!("Aborted TalosOperation {ns}/{name} (it was {was}); it does nothing more and holds no lock. Machines already changed stay as they are.{job_note}\n")
        };
        let stdout = match stages_told.as_slice() {
            [] => stdout,
            _ if output.is_data() => stdout,
            told => format!(
                "{stdout}Its stage operation {} was {} with it.\n",
                told.join(", "),
                if resume { "resumed" } else { "aborted" }
            ),
        };
        Ok(Report { stdout, ..Report::default() })
    })
}

/// An operation's target, as `status` and `operation list` name it.
fn target_of(op: &TalosOperation) -> String {
    match op.spec.kind {
        OperationKind::Kubernetes => op.spec.target.kubernetes_version.clone().unwrap_or_default(),
        OperationKind::Cni => op.spec.target.kube_proxy.map(|m| format!("kube-proxy {}", m.name())).unwrap_or_default(),
        OperationKind::Config if op.spec.target.machines.is_empty() => "rollout".to_string(),
        OperationKind::Config => format!("rollout of {}", op.spec.target.machines.join(", ")),
        OperationKind::CniUpgrade => {
            op.spec.target.cilium_chart.as_ref().map(|c| format!("cilium chart {c}")).unwrap_or_default()
        }
        OperationKind::CniAdopt => {
            op.spec.target.cilium_chart.as_ref().map(|c| format!("adopt cilium on chart {c}")).unwrap_or_default()
        }
        OperationKind::Talos => op.spec.target.talos_version.clone().unwrap_or_default(),
        OperationKind::Release => format!(
            "Talos {}, Kubernetes {}, cilium chart {}",
            op.spec.target.talos_version.as_deref().unwrap_or("?"),
            op.spec.target.kubernetes_version.as_deref().unwrap_or("?"),
            op.spec.target.cilium_chart.as_deref().unwrap_or("?")
        ),
    }
}

/// `ichor operation list [--cluster NAME]`: one line per operation, oldest first.
pub fn list(cluster: Option<&str>, output: Output, kube: &KubeArgs) -> Result<Report> {
    let rt = crate::io::io_runtime()?;
    rt.block_on(async {
        let (client, ns) = connect(kube).await?;
        let ops: Api<TalosOperation> = Api::namespaced(client, &ns);
        let mut items: Vec<TalosOperation> = ops
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error(e, &format!("the TalosOperations of {ns}")))?
            .items
            .into_iter()
            .filter(|o| cluster.is_none_or(|c| o.spec.cluster_ref.name == c))
            .collect();
        let created = |o: &TalosOperation| o.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
        items.sort_by_key(|o| (created(o), o.metadata.name.clone()));
        let now = crate::io::now();
        let rows: Vec<[String; 9]> = items
            .iter()
            .map(|o| {
                let age = o
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| age(now - t.0.as_second()))
                    .unwrap_or_default();
                let st = o.status.clone().unwrap_or_default();
                let (counted, done) = counted_machines(&st);
                [
                    o.metadata.name.clone().unwrap_or_default(),
                    o.spec.cluster_ref.name.clone(),
                    o.spec.kind.name().to_string(),
                    target_of(o),
                    st.phase().to_string(),
                    age,
                    st.stage.clone().unwrap_or_default(),
                    format!("{done}/{counted}"),
                    st.paused_reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        let stdout = match output {
            o @ (Output::Json | Output::Yaml) => {
                let v: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|r| json!({"name": r[0], "cluster": r[1], "kind": r[2], "target": r[3], "phase": r[4], "age": r[5], "stage": r[6], "machinesDone": r[7], "pausedReason": r[8]}))
                    .collect();
                o.data(&json!({"namespace": ns, "operations": v}))?
            }
            Output::Text | Output::Wide if rows.is_empty() => format!("No TalosOperations in {ns}.\n"),
            o @ (Output::Text | Output::Wide) => {
                // `wide` adds the stage, the machines done of those counted, and why it paused.
                let n = if o == Output::Wide { 9 } else { 6 };
                let header =
                    ["NAME", "CLUSTER", "KIND", "TARGET", "PHASE", "AGE", "STAGE", "MACHINES", "PAUSED"].map(str::to_string);
                let all: Vec<&[String; 9]> = std::iter::once(&header).chain(rows.iter()).collect();
                let widths: Vec<usize> = (0..n).map(|i| all.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
                all.iter()
                    .map(|r| {
                        let cells: Vec<String> = (0..n).map(|i| format!("{:w$}", r[i], w = widths[i])).collect();
                        cells.join("   ").trim_end().to_string() + "\n"
                    })
                    .collect()
            }
        };
        Ok(Report { stdout, ..Report::default() })
    })
}

/// An age as kubectl prints it (`45s`, `12m`, `3h`, `2d`).
fn age(secs: i64) -> String {
    match secs.max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `ichor operation delete NAME [--force]`.
pub fn delete(name: &str, force: bool, kube: &KubeArgs) -> Result<Report> {
    let rt = crate::io::io_runtime()?;
    rt.block_on(async {
        let (client, ns) = connect(kube).await?;
        let ops: Api<TalosOperation> = Api::namespaced(client, &ns);
        let op = ops.get(name).await.map_err(|e| kube_error(e, &format!("TalosOperation {ns}/{name}")))?;
        let st = op.status.clone().unwrap_or_default();
        let phase = st.phase();
        // What it changed so far: machines whose step started, cluster-wide steps done.
        let touched: Vec<String> = st.machines.iter().map(|(m, p)| format!("{m} ({})", p.phase)).collect();
        let changed = if touched.is_empty() && st.done.is_empty() {
            "nothing on the machines yet".to_string()
        } else {
            let mut parts = vec![];
            if !touched.is_empty() {
                parts.push(format!("machines {}", touched.join(", ")));
            }
            if !st.done.is_empty() {
                parts.push(format!("cluster steps {}", st.done.join(", ")));
            }
            parts.join("; ")
        };
        if !phase.is_terminal() && !force {
            return Ok(Report {
                stderr: format!(
                    "TalosOperation {ns}/{name} is {phase} and has not ended: it has changed {changed}. Abort it first (`ichor operation abort {name}`), then delete it; or delete it anyway with --force (what it changed stays as it is, and the cluster's spec keeps its target).\n"
                ),
                findings: true,
                ..Report::default()
            });
        }
        ops.delete(name, &Default::default()).await.map_err(|e| kube_error(e, &format!("TalosOperation {ns}/{name}")))?;
        let left = if phase.is_terminal() {
            String::new()
        } else {
            format!(" It had not ended ({phase}): it had changed {changed}, which stays as it is; the cluster's spec keeps its target, so the next operation of the same target finds its machines where this one left them.")
        };
        Ok(Report { stdout: format!("Deleted TalosOperation {ns}/{name}.{left}\n"), ..Report::default() })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use render::api::{MachineProgress, TalosOperationStatus};

    #[test]
    fn kubeconfig_files_follow_kubectl() {
        let home = std::path::Path::new("/home/u");
        let default = vec![PathBuf::from("/home/u/.kube/config")];
        assert_eq!(kubeconfig_files(None, Some(home)), default);
        assert_eq!(kubeconfig_files(Some("".as_ref()), Some(home)), default);
        assert_eq!(kubeconfig_files(Some(":".as_ref()), Some(home)), default);
        assert_eq!(
            kubeconfig_files(Some("/a:/b".as_ref()), Some(home)),
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert_eq!(kubeconfig_files(Some("/a::".as_ref()), None), vec![PathBuf::from("/a")]);
        assert!(kubeconfig_files(None, None).is_empty());
    }

    fn progress(phase: MachinePhase) -> MachineProgress {
        MachineProgress { phase, ..MachineProgress::default() }
    }

    #[test]
    fn the_progress_counts_machines_with_a_step_and_done_only_without_work_left() {
        // A switch on three control planes of a four-machine cluster: cp1 done, cp2 applying,
        // cp3 still to go; the worker has no step and is not counted.
        let mut st = TalosOperationStatus::default();
        st.machines.insert("cp1".into(), progress(MachinePhase::Done));
        st.machines.insert("cp2".into(), progress(MachinePhase::Applying));
        st.machines_left = vec!["cp2".into(), "cp3".into()];
        assert_eq!(counted_machines(&st), (3, 1));
        // An upgrade's control plane done with its apiserver, its kubelet still to go: not done.
        st.machines.insert("cp3".into(), progress(MachinePhase::Done));
        assert_eq!(counted_machines(&st), (3, 1));
        // Completed: nothing left, every started machine done.
        st.machines_left.clear();
        st.machines.insert("cp2".into(), progress(MachinePhase::Done));
        assert_eq!(counted_machines(&st), (3, 3));
    }
}
