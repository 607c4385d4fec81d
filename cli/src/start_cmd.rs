//! `ichor upgrade kubernetes|talos|cluster`, `ichor config apply`, `ichor cni kube-proxy|upgrade`
//! and `ichor adopt`: start an operation. Each is the same steps, one function each: read the
//! cluster and check the gates it carries (`read_cluster`), say what starts (`to_start`: the
//! operation's name and spec, the cluster as it will be, the spec write), refuse when another
//! operation is in the way (`in_the_way`), preview it with the controller's own read and the
//! rules' plan (`preview`, `preview_text`), stop when there is nothing to do (`nothing_to_do`),
//! then ask and write (`write`).
//!
//! Start at `start`.

use crate::op_cmd::{
    Adoption, StartArgs, connect, gate_problems, git_tracked, regex_version, talos_client, write_with_retry,
};
use crate::{Output, Report, disk};
use anyhow::{Context, Result, anyhow, bail};
use kube_client::api::{Api, PostParams};
use render::api::{
    CONFIRM_KUBE_PROXY_SWITCH, KubeProxyMode, OperationKind, TalosCluster, TalosOperation, TalosOperationSpec,
};
use runtime::plan::Action;
use serde_json::json;
use std::io::{BufRead, IsTerminal, Write};

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

/// `ichor upgrade kubernetes` and the other starts: preview, consent, then the spec write and
/// the TalosOperation.
pub fn start(what: Start, a: &StartArgs) -> Result<Report> {
    let rt = crate::io::io_runtime()?;
    rt.block_on(start_async(what, a))
}

async fn start_async(what: Start, a: &StartArgs) -> Result<Report> {
    let (client, ns) = connect(&a.kube).await?;
    let cluster = read_cluster(&client, &ns, a).await?;
    let ToStart { op_name, spec, target, spec_patch, release_note, adoption } =
        to_start(&what, a, &client, &ns, &cluster).await?;
    let planner = runtime::plan::Planner::embedded()?;
    let ops: Api<TalosOperation> = Api::namespaced(client.clone(), &ns);
    let existing = ops.list(&Default::default()).await.with_context(|| format!("listing TalosOperations in {ns}"))?;
    if let Some(refused) = in_the_way(&planner, &existing.items, a, &ns, &op_name)? {
        return Ok(refused);
    }
    let op_name = fresh_name(&existing.items, &op_name);
    let mut op = TalosOperation::new(&op_name, spec);
    op.metadata.namespace = Some(ns.to_string());
    let mut p = preview(&what, a, &client, &ns, (&cluster, &target), &op, planner).await?;
    if let Some(note) = release_note {
        p.riding.push(note);
    }
    let (confirmation, text) = preview_text(&p, &op, &op_name, &ns, a, adoption.as_ref());
    if let Some(stdout) = nothing_to_do(&what, &cluster, &p, &ns, a) {
        return Ok(Report { stdout, ..Report::default() });
    }
    let json_out = |created: bool| preview_json(&p, &op, &confirmation, adoption.as_ref(), created);
    let w = Written { what: &what, a, client: &client, ns: &ns, cluster: &cluster, op: &op, spec_patch: &spec_patch };
    write(&w, &p, &text, adoption.as_ref(), &json_out).await
}

/// The cluster `--cluster` names, with the gates the operator wrote checked as admission checks
/// them: an operation never starts (nor previews) on windows or health checks it could not
/// honour.
async fn read_cluster(client: &kube_client::Client, ns: &str, a: &StartArgs) -> Result<TalosCluster> {
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), ns);
    let cluster = match clusters.get(&a.cluster).await {
        Ok(c) => c,
        Err(kube_client::Error::Api(e)) if e.code == 404 => {
            bail!("TalosCluster {ns}/{} not found: `kubectl get talosclusters -n {ns}` lists the clusters", a.cluster)
        }
        Err(e) => return Err(anyhow!(e).context(format!("--cluster: reading TalosCluster {ns}/{}", a.cluster))),
    };
    // The gates the operator wrote, checked as admission checks them: an operation never starts
    // (nor previews) on windows or health checks it could not honour.
    let problems = gate_problems(client, &cluster).await?;
    if !problems.is_empty() {
        bail!(
            "TalosCluster {ns}/{}: {}; nothing was written: fix the spec (kubectl edit taloscluster {} -n {ns}) and run the command again",
            a.cluster,
            problems.join("; "),
            a.cluster
        );
    }
    Ok(cluster)
}

/// What a start creates: the operation's name and spec, the cluster as it will be, and the spec
/// write that makes it so.
struct ToStart {
    op_name: String,
    spec: TalosOperationSpec,
    target: TalosCluster,
    spec_patch: serde_json::Value,
    /// Said under the preview (a release whose set no controller's Lease names).
    release_note: Option<String>,
    adoption: Option<Adoption>,
}

/// What `what` starts on `cluster`.
async fn to_start(
    what: &Start,
    a: &StartArgs,
    client: &kube_client::Client,
    ns: &str,
    cluster: &TalosCluster,
) -> Result<ToStart> {
    // The cluster as it will be, and the operation to create.
    let mut target = cluster.clone();
    let mut spec = TalosOperationSpec { max_unavailable: 1, ..Default::default() };
    spec.cluster_ref.name = a.cluster.clone();
    let mut release_note = None;
    let (op_name, spec_patch) = match what {
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
            let set = match runtime::kube::controller_release_set(client, ns, runtime::serve::LEASE_NAME).await {
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
    spec.force_drain = match what {
        Start::Upgrade { force_drain, .. }
        | Start::Talos { force_drain, .. }
        | Start::Rollout { force_drain, .. }
        | Start::Release { force_drain, .. } => *force_drain,
        _ => false,
    };
    // An adoption keeps what the running Cilium says (cilium-config read back into the chart's
    // values, render::adopt) under the cluster's layer: the cluster as it will be has them.
    let adoption = match what {
        Start::Adopt => {
            let live = runtime::kube::read_cilium(client).await.context("reading the running Cilium")?;
            let kept = Adoption::of(cluster, &live.config)?;
            kept.apply(&mut target);
            Some(kept)
        }
        _ => None,
    };
    let spec_patch = match &adoption {
        Some(k) => k.spec_patch(),
        None => spec_patch,
    };
    Ok(ToStart { op_name, spec, target, spec_patch, release_note, adoption })
}

/// Another operation of the cluster that has not ended is in the way (it holds the lock, or is
/// Paused with work left): the refusal, with the three ways forward; nothing is written.
fn in_the_way(
    planner: &runtime::plan::Planner,
    existing: &[TalosOperation],
    a: &StartArgs,
    ns: &str,
    op_name: &str,
) -> Result<Option<Report>> {
    let (terminal, _) = planner.phase_sets()?;
    let ended = |o: &TalosOperation| terminal.contains(&o.status.as_ref().map(|s| s.phase()).unwrap_or_default());
    if let Some(o) = existing.iter().find(|o| o.spec.cluster_ref.name == a.cluster && !ended(o)) {
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
        return Ok(Some(Report { stdout, stderr, findings: true, ..Report::default() }));
    }
    Ok(None)
}

/// The operation's name, or with `-2`, `-3` ... when the same target was started before (after
/// an abort or a failure).
fn fresh_name(existing: &[TalosOperation], op_name: &str) -> String {
    // The same target started again after an abort or a failure: a fresh name (`-2`, `-3` ...).
    let taken = |n: &str| existing.iter().any(|o| o.metadata.name.as_deref() == Some(n));
    let mut name = op_name.to_string();
    let base = name.clone();
    let mut i = 2;
    while taken(&name) {
        name = format!("{base}-{i}");
        i += 1;
    }
    name
}

/// The preview: the controller's own read and the rules' plan for the operation's first
/// reconcile, each release stage's own, and what the plan means for the start.
struct Preview {
    read: runtime::controller::Read,
    plan: runtime::plan::Plan,
    /// Why the drains could not be checked against the budgets, when they could not.
    unchecked: Option<String>,
    /// Each release stage's confirmation and, for the first, what blocks it.
    stage_previews: Vec<(String, Vec<String>)>,
    blocking: Vec<String>,
    waits: Vec<String>,
    riding: Vec<String>,
}

/// The preview of `op` on the cluster as it will be (`clusters.1`; `.0` as it is).
async fn preview(
    what: &Start,
    a: &StartArgs,
    client: &kube_client::Client,
    ns: &str,
    clusters: (&TalosCluster, &TalosCluster),
    op: &TalosOperation,
    planner: runtime::plan::Planner,
) -> Result<Preview> {
    let (cluster, target) = clusters;
    let now = runtime::plan::rfc3339(crate::io::now());
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
        runtime::kube::controller_node(client, ns, runtime::serve::LEASE_NAME, crate::io::now()).await,
    );
    let mut read = controller
        .read_operation(ns, op, target, &now)
        .await
        .context("reading what the operation's rules need (the preview)")?;
    // The drains the steps will run, checked now: the budgets that would refuse them (the rules
    // name those of the machines the operation drains). Unreadable, it is said, not guessed.
    let mut unchecked = None;
    match runtime::kube::read_drain_refusals(client).await {
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
        stage_op.metadata.namespace = Some(ns.to_string());
        let mut stage_cluster = cluster.clone();
        stage_cluster.spec.set_stage(*kind, target);
        let stage_read = controller
            .read_operation(ns, &stage_op, &stage_cluster, &now)
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
    Ok(Preview { read, plan, unchecked, stage_previews, blocking, waits, riding })
}

/// The preview's confirmation and its text: per machine what a rollout's reboot is for, a
/// release's stages, the checks passed, what an adoption keeps, the drains, what blocks it, its
/// first waits and notes.
fn preview_text(
    p: &Preview,
    op: &TalosOperation,
    op_name: &str,
    ns: &str,
    a: &StartArgs,
    adoption: Option<&Adoption>,
) -> (String, String) {
    let Preview { plan, stage_previews, blocking, waits, riding, unchecked, .. } = p;
    let mut riding = riding.clone();
    let confirmation =
        plan.confirmation.clone().unwrap_or_else(|| format!("Start {op_name} on cluster {ns}/{}.", a.cluster));
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
        for b in blocking {
            text += &format!("  - {b}\n");
        }
    }
    if !waits.is_empty() {
        text += "First it waits:\n";
        for w in waits {
            text += &format!("  - {w}\n");
        }
    }
    if let Some(why) = unchecked {
        riding.push(format!(
            "the drains were not checked against PodDisruptionBudgets ({why}): a budget that allows no disruption pauses the operation at that machine's drain"
        ));
    }
    for r in &riding {
        text += &format!("Note: {r}\n");
    }
    (confirmation, text)
}

/// The preview as data (`--output json`).
fn preview_json(
    p: &Preview,
    op: &TalosOperation,
    confirmation: &str,
    adoption: Option<&Adoption>,
    created: bool,
) -> serde_json::Value {
    let Preview { plan, stage_previews, blocking, waits, riding, .. } = p;
    {
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
                    .zip(stage_previews)
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
    }
}

/// Nothing to do: the cluster already runs the target (the spec says it, and every machine runs
/// it, or the status records the mode): what to say; nothing is written.
fn nothing_to_do(what: &Start, cluster: &TalosCluster, p: &Preview, ns: &str, a: &StartArgs) -> Option<String> {
    let Preview { plan, read, blocking, .. } = p;
    // Nothing to do: the cluster already runs the target (the spec says it, and every machine
    // runs it, or the status records the mode): nothing is written.
    let runs_target = match &what {
        Start::Upgrade { to, .. } => {
            &cluster.spec.kubernetes_version == to
                && !read.snapshot.machines.is_empty()
                && read.snapshot.machines.iter().all(|m| &m.kubelet_version == to)
        }
        Start::KubeProxy { mode } => {
            cluster.spec.cni.kube_proxy == *mode && render::render::status_kube_proxy(cluster) == Some(*mode)
        }
        Start::Rollout { .. } => plan.work_left.is_empty() && blocking.is_empty(),
        Start::CiliumUpgrade => {
            read.snapshot.workload.cilium_chart_version.as_deref() == Some(render::embedded::CILIUM_CHART_VERSION)
        }
        // Ichor's already, or every machine on the target: the rules say so (`nothing_to_do`),
        // with their reason.
        Start::Adopt | Start::Talos { .. } | Start::Release { .. } => plan.nothing_to_do.is_some(),
    };
    if !runs_target {
        return None;
    }
    {
        let stdout = match what {
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
        Some(stdout)
    }
}

/// What `write` writes with.
struct Written<'a> {
    what: &'a Start,
    a: &'a StartArgs,
    client: &'a kube_client::Client,
    ns: &'a str,
    cluster: &'a TalosCluster,
    op: &'a TalosOperation,
    spec_patch: &'a serde_json::Value,
}

/// The preview printed (`--dry-run`), refused (what blocks it, a Git-tracked cluster), declined,
/// or the spec written and the operation created.
async fn write(
    w: &Written<'_>,
    p: &Preview,
    text: &str,
    adoption: Option<&Adoption>,
    json_out: &dyn Fn(bool) -> serde_json::Value,
) -> Result<Report> {
    let Written { what, a, client, ns, cluster, op, spec_patch } = *w;
    let Preview { plan, blocking, .. } = p;
    let op_name = op.metadata.name.clone().unwrap_or_default();
    let op_yaml = serde_yaml::to_string(op)?;
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), ns);
    let ops: Api<TalosOperation> = Api::namespaced(client.clone(), ns);
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
    let tracked = git_tracked(cluster);
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
    match ops.create(&PostParams::default(), op).await {
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
