//! The front door's operation commands once an operation exists: `ichor status [--watch]`,
//! `ichor operation list|resume|abort|delete`, against the cluster a kubeconfig names (as
//! `kubectl`: KUBECONFIG, `--context`, `--namespace`); and what the starts share (`connect`, the
//! talosconfig, the gates' problems, an adoption's kept values). The starts themselves are
//! `cli::start_cmd`.
//!
//! Start at `status`: it reads the operations back and, with `--watch`, follows them with a
//! progress bar each until they end.

use crate::{Output, Report, disk};
use anyhow::{Context, Result, anyhow, bail};
use kube_client::api::{Api, ListParams, Patch, PatchParams};
use render::api::{MachinePhase, OperationKind, Phase, TalosCluster, TalosOperation};
use serde_json::json;
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

pub(crate) fn talos_client(path: &std::path::Path) -> Result<runtime::talos::client::Client> {
    let file = path.display().to_string();
    let text = disk::read_text(path, disk::caps::TEXT, "a talosconfig")?;
    let cfg = runtime::talos::config::TalosConfig::parse(&text, &file)?;
    let (name, ctx) = cfg.context(None, &file)?;
    let creds = ctx.credentials(name, &file, crate::io::now())?;
    Ok(runtime::talos::client::Client::new(ctx, &creds, Duration::from_secs(15))?)
}

/// The problems of a cluster's maintenance windows and health checks (the kinds looked up
/// through discovery), each with its field path: what admission refuses.
pub(crate) async fn gate_problems(client: &kube_client::Client, cluster: &TalosCluster) -> Result<Vec<String>> {
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

/// What an adoption keeps of the running Cilium (render::adopt): the values merged under the
/// cluster's layer, the tunnel protocol, and what does not read.
pub(crate) struct Adoption {
    /// The cluster's layer with the kept values under it.
    pub(crate) merged: serde_json::Value,
    /// The kept values the layer did not set already.
    pub(crate) taken: Vec<render::adopt::Kept>,
    /// cilium-config's tunnel-protocol where the spec says another: what runs wins (changing
    /// it is a datapath change, no adoption's business).
    pub(crate) tunnel: Option<String>,
    pub(crate) unread: Vec<render::adopt::Unread>,
}

impl Adoption {
    pub(crate) fn of(cluster: &TalosCluster, config: &std::collections::BTreeMap<String, String>) -> Result<Adoption> {
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
    pub(crate) fn apply(&self, target: &mut TalosCluster) {
        let c = target.spec.cni.cilium.get_or_insert_with(Default::default);
        if !self.taken.is_empty() {
            c.values = Some(self.merged.clone());
        }
        if let Some(t) = &self.tunnel {
            c.tunnel_protocol = t.clone();
        }
    }

    /// The spec write.
    pub(crate) fn spec_patch(&self) -> serde_json::Value {
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
    pub(crate) fn describe(&self) -> String {
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

pub(crate) fn regex_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else { return false };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether Argo CD tracks the cluster (its tracking annotation): a spec change belongs in Git.
pub(crate) fn git_tracked(cluster: &TalosCluster) -> bool {
    cluster.metadata.annotations.as_ref().is_some_and(|m| m.contains_key("argocd.argoproj.io/tracking-id"))
}

/// A merge patch, retried on a conflict (the API's 409) a few times.
pub(crate) async fn write_with_retry(api: &Api<TalosCluster>, name: &str, body: serde_json::Value) -> Result<()> {
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
        let intent_rules = runtime::intent::Rules::embedded()?;
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
                let stage_name = stage.metadata.name.clone().unwrap_or_default();
                let intent = runtime::state::Intent::of(stage.metadata.annotations.as_ref(), st.resumed);
                // A stage the intent may be asked of now (rules/intent.rules), as of the release.
                let asked = runtime::intent::Operation {
                    namespace: &ns,
                    name: &stage_name,
                    kind: stage.spec.kind,
                    phase: st.phase(),
                    abort_requested: intent.abort,
                };
                let which = if resume { runtime::intent::Intent::Resume } else { runtime::intent::Intent::Abort };
                if intent_rules.refusal(&asked, which)?.is_some() {
                    continue;
                }
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
            // Whether it may be asked now is the rules' (rules/intent.rules), as the controller
            // acts on it.
            let asked = runtime::intent::Operation {
                namespace: &ns,
                name,
                kind: op.spec.kind,
                phase,
                abort_requested: intent.abort,
            };
            let which = if resume { runtime::intent::Intent::Resume } else { runtime::intent::Intent::Abort };
            if let Some(why) = intent_rules.refusal(&asked, which)? {
                bail!("{why}");
            }
            let (key, value) = if resume {
                (RESUME, (intent.resume.max(intent.resumed) + 1).to_string())
            } else {
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
