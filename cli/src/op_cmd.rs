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
    /// The kubeconfig (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
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
    /// The talosconfig the preview reads the nodes with (the controller's own read).
    #[arg(long, env = "TALOSCONFIG")]
    pub talosconfig: PathBuf,
    /// Answer yes to the confirmation (for scripts).
    #[arg(long)]
    pub yes: bool,
    /// Print the TalosOperation and the plan; create and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, value_enum, default_value_t)]
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
        None => Kubeconfig::read().context("reading the kubeconfig ($KUBECONFIG, else ~/.kube/config)")?,
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
    Upgrade { to: String, max_unavailable: i32 },
    KubeProxy { mode: KubeProxyMode },
}

/// `ichor upgrade kubernetes` and `ichor cni kube-proxy`: preview, consent, then the spec
/// write and the TalosOperation.
pub fn start(what: Start, a: &StartArgs) -> Result<Report> {
    let rt = crate::io::io_runtime()?;
    rt.block_on(start_async(what, a))
}

async fn start_async(what: Start, a: &StartArgs) -> Result<Report> {
    let (client, ns) = connect(&a.kube).await?;
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    let cluster = clusters
        .get(&a.cluster)
        .await
        .with_context(|| format!("--cluster: reading TalosCluster {ns}/{}", a.cluster))?;
    // The cluster as it will be, and the operation to create.
    let mut target = cluster.clone();
    let mut spec = TalosOperationSpec { max_unavailable: 1, ..Default::default() };
    spec.cluster_ref.name = a.cluster.clone();
    let (op_name, spec_patch) = match &what {
        Start::Upgrade { to, max_unavailable } => {
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
        Start::KubeProxy { mode } => {
            target.spec.cni.kube_proxy = *mode;
            spec.kind = OperationKind::Cni;
            spec.target.kube_proxy = Some(*mode);
            (format!("kube-proxy-{}", mode.name()), json!({"spec": {"cni": {"kubeProxy": mode.name()}}}))
        }
    };
    let mut op = TalosOperation::new(&op_name, spec);
    op.metadata.namespace = Some(ns.clone());
    // The preview: the controller's own read and the rules' plan for the operation's first
    // reconcile.
    let controller = runtime::controller::Controller::new(
        client.clone(),
        talos_client(&a.talosconfig)?,
        runtime::plan::Planner::embedded()?,
        disk::classifier(None)?,
    );
    let read = controller
        .read_operation(&ns, &op, &target, &runtime::plan::rfc3339(crate::io::now()))
        .await
        .context("reading what the operation's rules need (the preview)")?;
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
    let confirmation =
        plan.confirmation.clone().unwrap_or_else(|| format!("Start {op_name} on cluster {ns}/{}.", a.cluster));
    let op_yaml = serde_yaml::to_string(&op)?;
    let mut text = format!("{confirmation}\n");
    if blocking.is_empty() {
        text += "Nothing blocks it now.\n";
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
    for r in &riding {
        text += &format!("Note: {r}\n");
    }
    let json_out = |created: bool| {
        json!({
            "operation": op,
            "confirmation": confirmation,
            "blocking": blocking,
            "waits": waits,
            "notes": riding,
            "created": created,
        })
    };
    if a.dry_run {
        let stdout = match a.output {
            Output::Json => serde_json::to_string_pretty(&json_out(false))? + "\n",
            Output::Text => format!("{text}\nThe TalosOperation (not created, --dry-run):\n{op_yaml}"),
        };
        return Ok(Report { stdout, findings: !blocking.is_empty(), ..Report::default() });
    }
    // A Git-tracked cluster: the spec change belongs in Git, with the consent annotation.
    let tracked =
        cluster.metadata.annotations.as_ref().is_some_and(|m| m.contains_key("argocd.argoproj.io/tracking-id"));
    let spec_done = match &what {
        Start::Upgrade { to, .. } => &cluster.spec.kubernetes_version == to,
        Start::KubeProxy { mode } => cluster.spec.cni.kube_proxy == *mode,
    };
    if tracked && !spec_done {
        let mut out = format!(
            "{text}\nTalosCluster {ns}/{} is tracked by Argo CD: commit this change to Git, then run the same command again (it finds the spec changed and starts the operation):\n",
            a.cluster
        );
        out += &match &what {
            Start::Upgrade { to, .. } => format!("spec:\n  kubernetesVersion: {to}\n"),
            Start::KubeProxy { mode } => format!(
                "metadata:\n  annotations:\n    {CONFIRM_KUBE_PROXY_SWITCH}: {}\nspec:\n  cni:\n    kubeProxy: {}\n",
                mode.name(),
                mode.name()
            ),
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
    let ops: Api<TalosOperation> = Api::namespaced(client.clone(), &ns);
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
        Output::Json => serde_json::to_string_pretty(&json_out(true))? + "\n",
        Output::Text => format!(
            "{text}Created TalosOperation {ns}/{op_name}. Follow it with: ichor status --cluster {} --watch\n",
            a.cluster
        ),
    };
    Ok(Report { stdout, ..Report::default() })
}

fn regex_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else { return false };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
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
    let target = match op.spec.kind {
        OperationKind::Kubernetes => op.spec.target.kubernetes_version.clone().unwrap_or_default(),
        OperationKind::Cni => op.spec.target.kube_proxy.map(|m| format!("kube-proxy {}", m.name())).unwrap_or_default(),
        _ => String::new(),
    };
    let mut s = format!("{name} ({} {target}) on {}: {phase}", op.spec.kind.name(), op.spec.cluster_ref.name);
    if let Some(stage) = &st.stage {
        s += &format!(", stage {stage}");
    }
    if let Some(r) = &st.paused_reason {
        s += &format!("\n  {}: {r}", if phase == Phase::Paused { "paused" } else { "reason" });
    }
    for (m, p) in &st.machines {
        s += &format!(
            "\n  {m}: {}{}{}",
            p.phase,
            p.stage.as_deref().map(|x| format!(" ({x})")).unwrap_or_default(),
            p.started_at.as_deref().map(|x| format!(", started {x}")).unwrap_or_default()
        );
    }
    for (clock, since) in &st.waiting_since {
        s += &format!("\n  waiting on {clock} since {since}");
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
pub fn status(cluster: Option<&str>, watch: bool, output: Output, kube: &KubeArgs) -> Result<Report> {
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
                .collect();
            items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            Ok::<_, anyhow::Error>(items)
        };
        let phase = |o: &TalosOperation| o.status.as_ref().map(|s| s.phase()).unwrap_or_default();
        let mut items = list(ops.clone()).await?;
        if watch {
            // Only the operations not ended yet are followed.
            let names: Vec<String> =
                items.iter().filter(|o| !settled(phase(o))).filter_map(|o| o.metadata.name.clone()).collect();
            let bars = indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr());
            let style = indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
            let mut progress = std::collections::BTreeMap::new();
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
                    let machines = machine_count(&client, &ns, &o.spec.cluster_ref.name).await.max(st.machines.len());
                    bar.set_length(machines as u64);
                    bar.set_position(st.machines.values().filter(|p| p.phase == MachinePhase::Done).count() as u64);
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
        let ended_badly = items.iter().any(|o| matches!(phase(o), Phase::Paused | Phase::Aborted));
        let stdout = match output {
            Output::Json => {
                let v: Vec<serde_json::Value> = items
                    .iter()
                    .map(|o| json!({"name": o.metadata.name, "cluster": o.spec.cluster_ref.name, "kind": o.spec.kind, "target": o.spec.target, "status": o.status}))
                    .collect();
                serde_json::to_string_pretty(&json!({"namespace": ns, "operations": v}))? + "\n"
            }
            Output::Text if items.is_empty() => format!("No TalosOperations in {ns}.\n"),
            Output::Text => items.iter().map(describe).collect(),
        };
        Ok(Report { stdout, findings: watch && ended_badly, ..Report::default() })
    })
}

async fn machine_count(client: &kube_client::Client, ns: &str, cluster: &str) -> usize {
    let api: Api<render::api::TalosMachine> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .map(|l| l.items.iter().filter(|m| m.spec.cluster_ref.name == cluster).count())
        .unwrap_or(0)
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
        let mut attempts = 0;
        let (op, wanted) = loop {
            let op = ops.get(name).await.with_context(|| format!("reading TalosOperation {ns}/{name}"))?;
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
            let o = ops.get(name).await.with_context(|| format!("reading TalosOperation {ns}/{name}"))?;
            let s = o.status.unwrap_or_default();
            let acted = if resume { s.resumed.to_string() == wanted } else { s.phase() == Phase::Aborted };
            if acted {
                now = Some(s.phase());
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let stdout = if output == Output::Json {
            serde_json::to_string_pretty(&json!({"namespace": ns, "operation": name, "was": was, "now": now.unwrap_or(was), "acted": now.is_some(), "pausedReason": st.paused_reason}))? + "\n"
        } else if now.is_none() {
            format!(
                "Asked TalosOperation {ns}/{name} to {}; no controller acted on it within 10 s: is ichor controller running? It acts at its next reconcile.\n",
                if resume { "resume" } else { "abort" }
            )
        } else if resume {
            format!("Resumed TalosOperation {ns}/{name} (it was paused: {}).\n", st.paused_reason.unwrap_or_default())
        } else {
            format!("Aborted TalosOperation {ns}/{name} (it was {was}); it does nothing more and holds no lock. Machines already changed stay as they are.\n")
        };
        Ok(Report { stdout, ..Report::default() })
    })
}
