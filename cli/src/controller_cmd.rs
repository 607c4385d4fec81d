//! `ichor controller` (the controller against a real cluster) and `ichor sim controller` (the
//! same loop against a simulated installation: a simulated Talos fleet running the render of a
//! folder of manifests and an in-memory Kubernetes API, driving a Kubernetes upgrade).
//!
//! Start at `run_real` and `run_demo`; both hand the work to `runtime::serve::run`.

use crate::{Report, disk};
use anyhow::{Context, Result, bail};
use render::api::{TalosOperation, TalosOperationSpec};
use runtime::serve::{Metrics, RunConfig, run};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How the long-running commands log (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event; coloured only when stderr is a terminal (and NO_COLOR is unset).
    #[default]
    Text,
    /// One JSON object per line, for a log collector.
    Json,
}

static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Chosen once, from the command line, before a command starts logging.
pub fn set_log_format(f: LogFormat) {
    let _ = LOG_FORMAT.set(f);
}

fn logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("ICHOR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match LOG_FORMAT.get().copied().unwrap_or_default() {
        LogFormat::Json => b.json().flatten_event(true).try_init(),
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            b.with_ansi(colour).try_init()
        }
    };
}

/// What `ichor controller` is given.
#[derive(clap::Args, Debug)]
pub struct ControllerArgs {
    /// The talosconfig the controller reaches the nodes with (os:admin; default: $TALOSCONFIG,
    /// else ~/.talos/config).
    #[arg(long)]
    pub talosconfig: Option<PathBuf>,
    /// The talosconfig context (default: its current one).
    #[arg(long)]
    pub context: Option<String>,
    /// The kubeconfig of the cluster holding Ichor's resources (default: $KUBECONFIG, else
    /// ~/.kube/config, else the in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of Ichor's custom resources and of the Lease.
    #[arg(long, default_value = "ichor-system")]
    pub namespace: String,
    /// The Kubernetes version of this Ichor's release set (ADR 0113).
    #[arg(long, default_value = render::embedded::RELEASE_SET_KUBERNETES)]
    pub release_set_kubernetes: String,
    /// The Talos version of this Ichor's release set (what `ichor upgrade cluster` moves a
    /// cluster to).
    #[arg(long, default_value = render::embedded::RELEASE_SET_TALOS)]
    pub release_set_talos: String,
    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long = "metrics-addr", visible_alias = "listen", default_value = "0.0.0.0:8080")]
    pub listen: String,
    #[arg(long, default_value = runtime::serve::LEASE_NAME)]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: $POD_NAME, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// The node this replica runs on (it goes last in an upgrade).
    #[arg(long, env = "NODE_NAME")]
    pub node: Option<String>,
    /// Write each reconcile's snapshot here, for `ichor plan --state`.
    #[arg(long)]
    pub dump_snapshots: Option<PathBuf>,
    /// Do not lock Ichor's namespace down with CiliumNetworkPolicies (by default they are
    /// applied once Cilium is ready: the webhook only from the API server, the pods' egress to
    /// the API server, DNS and the Talos API only).
    #[arg(long)]
    pub no_network_policies: bool,
    /// A CIDR the controller's metrics may be scraped from (repeat it); none: only the
    /// kubelet's probes reach the controller once the namespace is locked down.
    #[arg(long, value_name = "CIDR", conflicts_with = "no_network_policies")]
    pub metrics_from: Vec<String>,
    /// Where the kubernetes Service is probed after a switch removed kube-proxy (HOST:PORT;
    /// default: KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT inside a pod, else the
    /// kubeconfig's server).
    #[arg(long, value_name = "HOST:PORT")]
    pub service_address: Option<String>,
    /// How long a drain may wait for its pods to be evicted (a PodDisruptionBudget that lets
    /// none go) before the machine's step fails, the node is uncordoned and the operation
    /// pauses naming the budget and the pod (`ichor sim cluster` runs its controller with 2 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub drain_timeout: u64,
}

/// A Kubernetes client from `--kubeconfig`, else as kube-rs finds one ($KUBECONFIG,
/// ~/.kube/config, the in-cluster service account), saying who it is in its User-Agent
/// (`ichor-controller/VERSION`: what the API server's audit log and field managers show, and
/// what `ichor sim cluster --api-fault for=...` picks).
async fn kube_client(kubeconfig: Option<&Path>, agent: &str) -> Result<(kube_client::Client, http::Uri)> {
    let mut config = match kubeconfig {
        None => kube_client::Config::infer()
            .await
            .context("connecting to Kubernetes (KUBECONFIG, or the in-cluster service account)")?,
        Some(path) => {
            let kc = kube_client::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube_client::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {}: no usable current context", path.display()))?
        }
    };
    // No retry layer under the controller's own retries: kube-rs 5 retries every 429 up to 15
    // times with a backoff that grows to minutes, and a 429 is also an answer (an eviction a
    // PodDisruptionBudget refuses: issue 50 saw a drain wait minutes on one call instead of
    // failing at its deadline). The reconcile's error policy and `kube::retrying` retry what is
    // transient, on their own clocks.
    config.default_retry = false;
    let ua = format!("{agent}/{}", env!("CARGO_PKG_VERSION"));
    if let Ok(v) = ua.parse() {
        config.headers.push((http::header::USER_AGENT, v));
    }
    let server = config.cluster_url.clone();
    Ok((kube_client::Client::try_from(config).context("connecting to Kubernetes")?, server))
}

pub fn run_real(a: &ControllerArgs) -> Result<Report> {
    logging();
    if let Some(p) = runtime::crashpoint::arm()? {
        let kinds: Vec<&str> = p.kinds.iter().map(|w| w.name()).collect();
        eprintln!("ichor: crash point armed: the process ends right after write {} of {}", p.after, kinds.join(", "));
    }
    let listen = a.listen.parse().with_context(|| format!("--metrics-addr {:?}: not host:port", a.listen))?;
    let metrics_from = a.metrics_from.iter().map(|c| runtime::netpol::cidr(c)).collect::<Result<Vec<_>, _>>()?;
    let rt = crate::io::io_runtime()?;
    rt.block_on(async {
        let path = crate::talos_cmd::find_talosconfig(a.talosconfig.as_deref())?;
        let file = path.display().to_string();
        let text = disk::read_text(&path, disk::caps::TEXT, "a talosconfig")?;
        let cfg = runtime::talos::config::TalosConfig::parse(&text, &file)?;
        let (name, ctx) = cfg.context(a.context.as_deref(), &file)?;
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        let creds = ctx.credentials(name, &file, now)?;
        let talos = runtime::talos::client::Client::new(ctx, &creds, Duration::from_secs(15))?;
        let (kube, server) = kube_client(a.kubeconfig.as_deref(), "ichor-controller").await?;
        let probe = probe_target(a.service_address.as_deref(), env_service_address(), &server)?;
        let controller = runtime::controller::Controller::new(
            kube,
            talos,
            runtime::plan::Planner::embedded()?,
            disk::classifier(None)?,
        )
        .with_release_set(&a.release_set_kubernetes)
        .with_release_set_talos(&a.release_set_talos)
        .with_controller_node(a.node.clone())
        .with_drain_timeout(Duration::from_secs(a.drain_timeout))
        .with_service_probe(Arc::new(move || kubernetes_service_answers(probe.clone())));
        let controller = if a.no_network_policies { controller } else { controller.with_lockdown(metrics_from) };
        let identity =
            a.identity.clone().unwrap_or_else(|| std::env::var("HOSTNAME").unwrap_or_else(|_| "ichor".into()));
        let config = RunConfig {
            namespace: a.namespace.clone(),
            lease_name: a.lease_name.clone(),
            identity,
            listen: Some(listen),
            requeue: Duration::from_secs(10),
            dump_snapshots: a.dump_snapshots.clone(),
        };
        run(Arc::new(controller), config, Arc::new(Metrics::new()), crate::io::shutdown_signal())
            .await
            .context("the Lease")?;
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(Report::default())
}

/// Where the kubernetes Service is probed: an address and how it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    pub address: String,
    pub from: &'static str,
}

/// KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT, set in every pod (an IPv6 host bracketed).
fn env_service_address() -> Option<String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok().filter(|h| !h.is_empty())?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").ok().filter(|p| !p.is_empty())?;
    Some(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
}

/// The probe's address (issue 50, finding 5: outside a pod the variables are unset and the
/// switch waited 30 minutes on nothing): `--service-address`, else the pod's variables, else
/// the kubeconfig's server (the API server itself, which is what the Service fronts).
pub fn probe_target(flag: Option<&str>, env: Option<String>, server: &http::Uri) -> Result<ProbeTarget> {
    if let Some(a) = flag {
        let ok = a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !ok {
            anyhow::bail!("--service-address {a:?}: not HOST:PORT (for example 10.96.0.1:443)");
        }
        return Ok(ProbeTarget { address: a.to_string(), from: "--service-address" });
    }
    if let Some(a) = env {
        return Ok(ProbeTarget { address: a, from: "KUBERNETES_SERVICE_HOST" });
    }
    let host = server.host().unwrap_or("localhost");
    let port = server.port_u16().unwrap_or(if server.scheme_str() == Some("http") { 80 } else { 443 });
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
    Ok(ProbeTarget { address: format!("{host}:{port}"), from: "the kubeconfig's server" })
}

/// The controller's probe of the kubernetes Service (ADR 0066's amendment): a TCP connect to
/// the target within 2 s, without blocking the runtime.
fn kubernetes_service_answers(t: ProbeTarget) -> runtime::controller::ServiceProbe {
    Box::pin(async move {
        let connect = tokio::net::TcpStream::connect(t.address.clone());
        let answers = matches!(tokio::time::timeout(Duration::from_secs(2), connect).await, Ok(Ok(_)));
        runtime::controller::ProbeResult { answers, target: format!("{}, from {}", t.address, t.from) }
    })
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    #[test]
    fn the_probe_address_is_the_flag_then_the_pods_variables_then_the_kubeconfigs_server() {
        let server: http::Uri = "https://127.0.0.1:6443".parse().unwrap();
        let t = |flag, env: Option<&str>| probe_target(flag, env.map(str::to_string), &server).unwrap();
        assert_eq!(t(Some("10.0.0.9:443"), Some("10.96.0.1:443")).from, "--service-address");
        assert_eq!(t(None, Some("10.96.0.1:443")).address, "10.96.0.1:443");
        let outside = t(None, None);
        assert_eq!((outside.address.as_str(), outside.from), ("127.0.0.1:6443", "the kubeconfig's server"));
        let e = probe_target(Some("10.96.0.1"), None, &server).unwrap_err().to_string();
        assert!(e.contains("not HOST:PORT"), "{e}");
    }
}

/// `ichor sim cluster`: a simulated installation served until interrupted. Writes a kubeconfig
/// (the in-memory API over HTTP on loopback) and a talosconfig (the simulated fleet), prints
/// `ready` once both answer, and runs the controller with stand-ins for the kubelets, the
/// DaemonSet rollouts and the Cilium Job.
/// What `ichor sim cluster` runs besides the API and the fleet.
pub struct SimCluster {
    /// Argo CD owns Cilium (`--handover done`).
    pub handover_done: bool,
    /// The controller runs inside (no `--no-controller`).
    pub controller: bool,
    /// `--node-fault MACHINE=...`.
    pub node_faults: Vec<String>,
    /// `--api-fault ...`.
    pub api_faults: Vec<String>,
    /// `--step-latency-ms`.
    pub step_latency: Duration,
    /// `--release-set-kubernetes`.
    pub release_set_kubernetes: String,
    /// `--release-set-talos`.
    pub release_set_talos: String,
    /// `--workers`: worker machines added to the manifests' cluster.
    pub workers: usize,
    /// `--cilium-version`: the Cilium the cluster runs at start.
    pub cilium_version: Option<String>,
    /// `--cilium-installed-by`: who installed Cilium, when not Ichor.
    pub cilium_installed_by: Option<String>,
    /// `--cilium-ipam`: cilium-config's `ipam`.
    pub cilium_ipam: Option<String>,
    /// `--cilium-unready`: agents kept not ready.
    pub cilium_unready: usize,
}

/// `n` worker TalosMachines added to the cluster of `files` (the first TalosCluster's name and
/// namespace), as one more manifest file: `sim-w0001` at 10.1.0.1, and on.
pub fn extra_workers(files: &[(String, String)], n: usize) -> Result<Option<(String, String)>> {
    if n == 0 {
        return Ok(None);
    }
    if n > 60_000 {
        bail!("--workers {n}: at most 60000 (the addresses are 10.1.0.0/16)");
    }
    let cluster = files.iter().find_map(|(_, text)| {
        let docs = render::yaml::parse_documents(text, disk::caps::TEXT).ok()?;
        docs.into_iter().find_map(|v| {
            (v.get("kind")?.as_str()? == "TalosCluster").then(|| {
                let s = |k: &str| v["metadata"][k].as_str().unwrap_or_default().to_string();
                (s("name"), s("namespace"))
            })
        })
    });
    let Some((name, namespace)) = cluster else {
        bail!("--workers: the manifests hold no TalosCluster to add workers to")
    };
    let mut text = String::new();
    for i in 1..=n {
        text.push_str(&format!(
            "---\napiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata:\n  name: sim-w{i:04}\n  namespace: {namespace}\n  generation: 1\nspec:\n  clusterRef:\n    name: {name}\n  role: worker\n  address: 10.1.{}.{}\n  installDisk: /dev/sda\n",
            i / 250,
            i % 250 + 1
        ));
    }
    Ok(Some(("--workers".into(), text)))
}

pub fn sim_cluster(
    manifests: &Path,
    kubeconfig: &Path,
    talosconfig: &Path,
    listen: &str,
    sim: SimCluster,
) -> Result<Report> {
    let handover_done = sim.handover_done;
    logging();
    let mut files = disk::manifest_files(manifests)?;
    files.extend(extra_workers(&files, sim.workers)?);
    let mut api_faults = runtime::sim::kubeapi::Faults::default();
    for f in &sim.api_faults {
        api_faults.add(f).map_err(|e| anyhow::anyhow!("--api-fault {e}"))?;
    }
    let node_faults =
        sim.node_faults.iter().map(|f| crate::talos_cmd::node_fault("--node-fault", f)).collect::<Result<Vec<_>>>()?;
    let step = sim.step_latency;
    if let Some(v) = &sim.cilium_version
        && runtime::handover::cilium_version_of_image(&format!("cilium:{v}")).is_none()
    {
        bail!("--cilium-version {v:?}: a Cilium version is X.Y.Z (for example 1.19.6)");
    }
    let installer = match &sim.cilium_installed_by {
        None => None,
        Some(w) => Some(runtime::sim::demo::CiliumInstaller::parse(w).with_context(|| {
            format!("--cilium-installed-by {w:?}: one of manifests, helm, helm:NS/NAME, argocd:APP, flux:NS/NAME")
        })?),
    };
    if installer.is_some() {
        files = runtime::sim::demo::without_bootstrap_patch(&files);
    }
    let rt = crate::io::io_runtime()?;
    rt.block_on(async {
        let demo = Arc::new(runtime::sim::demo::Demo::start(&files, handover_done).await?);
        if let Some(v) = &sim.cilium_version {
            runtime::sim::demo::run_cilium(&demo.api, v.trim_start_matches('v'));
        }
        if let Some(i) = &installer {
            i.mark(&demo.api);
        }
        if let Some(mut cm) = demo.api.get("", "configmaps", "kube-system", "cilium-config")
            && let Some(mode) = &sim.cilium_ipam
        {
            cm["data"]["ipam"] = serde_json::json!(mode);
            demo.api.put("", "configmaps", cm);
        }
        if sim.cilium_unready > 0
            && let Some(mut ds) = demo.api.get("apps", "daemonsets", "kube-system", "cilium")
        {
            ds["metadata"]["annotations"]["sim/unready"] = serde_json::json!(sim.cilium_unready.to_string());
            demo.api.put("apps", "daemonsets", ds);
        }
        if !handover_done {
            // The cluster runs without Argo CD: Ichor's Job owns Cilium.
            for (key, mut c) in demo.api.objects() {
                if key.1 == "talosclusters" {
                    c["spec"]["cni"]["handover"] = serde_json::json!("disabled");
                    demo.api.put(&key.0, &key.1, c);
                }
            }
        }
        for (machine, fault) in &node_faults {
            let Some((_, address, _)) = demo.machines.iter().find(|m| m.0 == *machine || m.1 == *machine) else {
                let names: Vec<&str> = demo.machines.iter().map(|m| m.0.as_str()).collect();
                anyhow::bail!("--node-fault: no machine {machine:?} in {} ({})", manifests.display(), names.join(", "));
            };
            fault.inject(&demo.fleet, address);
        }
        demo.api.set_faults(api_faults);
        // The webhook `ichor install` configures, called on the same writes as kube-apiserver
        // calls it (issue 50: a typo inside a TalosConfigPatch showed only on the machines).
        let keys = render::inventory::Inventory::parse(render::embedded::CILIUM_KEYS.1)
            .context(render::embedded::CILIUM_KEYS.0)?;
        let hook = Arc::new(runtime::webhook::Webhook { kube: demo.api.client(), keys });
        demo.api.set_admission(runtime::sim::kubeapi::Admission {
            name: runtime::install::WEBHOOK_NAME.into(),
            group: render::api::GROUP.into(),
            plurals: runtime::install::WEBHOOK_RESOURCES.iter().map(|r| r.to_string()).collect(),
            review: Box::new(move |review| {
                let hook = hook.clone();
                Box::pin(async move { hook.handle(review.to_string().as_bytes()).await.1 })
            }),
        });
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("--listen {listen}"))?;
        let addr = listener.local_addr()?;
        let namespace = demo
            .api
            .objects()
            .keys()
            .find(|k| k.1 == "talosclusters")
            .map(|k| k.2.clone())
            .unwrap_or_else(|| "ichor-system".into());
        std::fs::write(kubeconfig, runtime::sim::kubeapi::Api::kubeconfig(&format!("http://{addr}"), &namespace))
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        std::fs::write(talosconfig, demo.fleet.talosconfig(&["os:admin"])?)
            .with_context(|| format!("writing {}", talosconfig.display()))?;
        let served = tokio::spawn(demo.api.clone().serve_http(listener));
        let controller =
            demo.controller(&sim.release_set_kubernetes, None)?.with_release_set_talos(&sim.release_set_talos);
        let config = RunConfig {
            namespace: namespace.clone(),
            lease_name: runtime::serve::LEASE_NAME.into(),
            identity: "ichor-sim".into(),
            listen: None,
            requeue: Duration::from_millis(300) + step,
            dump_snapshots: None,
        };
        let shutdown = crate::io::shutdown_signal();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = sim.controller.then(|| {
            tokio::spawn(run(Arc::new(controller), config, Arc::new(Metrics::new()), async move {
                let _ = stopped.await;
            }))
        });
        let kubelets = tokio::spawn(demo.clone().kubelets_forever(Duration::from_millis(100) + step));
        let api = demo.api.clone();
        let nodes = demo.machines.len();
        let workload = tokio::spawn(async move {
            loop {
                runtime::sim::demo::run_cilium_jobs(&api);
                runtime::sim::demo::sync_argo_cd(&api);
                runtime::sim::demo::roll_out_daemonsets(&api, nodes);
                api.observe_disruption_budgets();
                runtime::sim::demo::ensure_namespaces(&api);
                tokio::time::sleep(Duration::from_millis(200) + step).await;
            }
        });
        println!(
            "ready: {} machines; kubeconfig {} (namespace {namespace}), talosconfig {}",
            demo.machines.len(),
            kubeconfig.display(),
            talosconfig.display()
        );
        use std::io::Write as _;
        std::io::stdout().flush().ok();
        shutdown.await;
        workload.abort();
        kubelets.abort();
        served.abort();
        let _ = stop.send(());
        if let Some(task) = task {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(Report::default())
}

/// `ichor sim controller`: the example installation upgraded by the controller's loop.
pub fn run_demo(manifests: &Path, to: &str, dump: Option<PathBuf>) -> Result<Report> {
    let files = disk::manifest_files(manifests)?;
    let rt = crate::io::io_runtime()?;
    let out = rt.block_on(async {
        let demo = Arc::new(runtime::sim::demo::Demo::start(&files, true).await?);
        let client = demo.api.client();
        let clusters: kube_client::Api<render::api::TalosCluster> = kube_client::Api::all(client.clone());
        let list = clusters.list(&Default::default()).await?;
        let Some(cluster) = list.items.first() else { bail!("{}: no TalosCluster", manifests.display()) };
        let (ns, name) = (cluster.metadata.namespace.clone().unwrap_or_default(), cluster.metadata.name.clone().unwrap_or_default());
        let from = cluster.spec.kubernetes_version.clone();
        let clusters: kube_client::Api<render::api::TalosCluster> = kube_client::Api::namespaced(client.clone(), &ns);
        clusters
            .patch(&name, &kube_client::api::PatchParams::default(), &kube_client::api::Patch::Merge(serde_json::json!({"spec": {"kubernetesVersion": to}})))
            .await?;
        let mut spec = TalosOperationSpec { max_unavailable: 1, ..Default::default() };
        spec.cluster_ref.name = name.clone();
        spec.kind = render::api::OperationKind::Kubernetes;
        spec.target.kubernetes_version = Some(to.to_string());
        let op_name = format!("upgrade-{}", to.trim_start_matches('v').replace('.', "-"));
        let ops: kube_client::Api<TalosOperation> = kube_client::Api::namespaced(client.clone(), &ns);
        ops.create(&Default::default(), &TalosOperation::new(&op_name, spec)).await?;
        let mut s = format!(
            "A simulated installation (a demo fixture: neither Talos nor Kubernetes): {} machines running the render of {}, Kubernetes {from}.\nTalosOperation {ns}/{op_name}: upgrade to {to}.\n",
            demo.machines.len(),
            manifests.display()
        );
        let controller = demo.controller(to, None)?;
        let config = RunConfig {
            namespace: ns.clone(),
            lease_name: runtime::serve::LEASE_NAME.into(),
            identity: "ichor-sim".into(),
            listen: None,
            requeue: Duration::from_millis(300),
            dump_snapshots: dump,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(Arc::new(controller), config, Arc::new(Metrics::new()), async move {
            let _ = stopped.await;
        }));
        let kubelets = tokio::spawn(demo.clone().kubelets_forever(Duration::from_millis(100)));
        // Every status the controller writes, in order: a watch, not a poll that could miss one.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        let mut last = String::new();
        let mut current = ops.get(&op_name).await?;
        let phase = 'follow: loop {
            let rv = current.metadata.resource_version.clone().unwrap_or_else(|| "0".into());
            let params = kube_client::api::WatchParams::default().fields(&format!("metadata.name={op_name}")).timeout(60);
            let mut events = Box::pin(ops.watch(&params, &rv).await?);
            loop {
                let st = current.status.clone().unwrap_or_default();
                let phase = st.phase();
                let machines: Vec<String> = st
                    .machines
                    .iter()
                    .map(|(m, p)| format!("{m} {} {}", p.stage.as_deref().unwrap_or(""), p.phase))
                    .collect();
                let steps = if st.done.is_empty() { String::new() } else { format!(" [{}]", st.done.join(", ")) };
                let line = format!("  {phase}{steps}: {}\n", if machines.is_empty() { "no machine started".into() } else { machines.join(", ") });
                if line != last {
                    eprint!("{line}");
                    s += &line;
                    last = line;
                }
                if phase == render::api::Phase::Completed || phase == render::api::Phase::Paused {
                    if let Some(r) = st.paused_reason {
                        s += &format!("  paused: {r}\n");
                    }
                    break 'follow phase;
                }
                let next = tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut events)).await;
                match next {
                    Err(_) => bail!("the simulated upgrade did not finish within 5 minutes"),
                    // The watch ended (its timeout): start another from the last version seen.
                    Ok(None) => continue 'follow,
                    Ok(Some(event)) => match event? {
                        kube_client::api::WatchEvent::Added(o) | kube_client::api::WatchEvent::Modified(o) => current = o,
                        kube_client::api::WatchEvent::Deleted(_) => bail!("TalosOperation {ns}/{op_name} was deleted"),
                        kube_client::api::WatchEvent::Bookmark(_) => {}
                        kube_client::api::WatchEvent::Error(e) => bail!("watching TalosOperation {ns}/{op_name}: {}", e.message),
                    },
                }
            }
        };
        kubelets.abort();
        let _ = stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        let mut images = vec![];
        for (machine, address, _) in &demo.machines {
            let o = runtime::talos::observe::observe_node(&demo.talos, address).await?;
            images.push(format!("  {machine}: kubelet {}, reboots {}\n", o.kubelet_image, demo.fleet.reboots(address)));
        }
        s += &images.concat();
        Ok::<_, anyhow::Error>((s, phase))
    })?;
    Ok(Report { stdout: out.0, findings: out.1 != render::api::Phase::Completed, ..Report::default() })
}

/// What `ichor webhook` is given.
#[derive(clap::Args, Debug)]
pub struct WebhookArgs {
    /// Where to serve HTTPS.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub listen: String,
    /// The kubernetes.io/tls Secret holding the certificate (in --namespace).
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"], required_unless_present = "tls_cert")]
    pub tls_secret: Option<String>,
    /// The certificate and key as PEM files instead (for running it outside the cluster).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[arg(long, default_value = "ichor-system")]
    pub namespace: String,
}

/// `ichor webhook`: the validating webhook until interrupted.
pub fn run_webhook(a: &WebhookArgs) -> Result<Report> {
    logging();
    let rt = crate::io::io_runtime()?;
    rt.block_on(async {
        let (kube, _) = kube_client(None, "ichor-webhook").await?;
        let (cert, key) = match (&a.tls_secret, &a.tls_cert, &a.tls_key) {
            (Some(name), _, _) => runtime::webhook::tls_from_secret(&kube, &a.namespace, name).await?,
            (None, Some(c), Some(k)) => (
                disk::read_text(c, disk::caps::TEXT, "a PEM certificate")?,
                disk::read_text(k, disk::caps::TEXT, "a PEM key")?,
            ),
            _ => bail!("--tls-secret NAME, or --tls-cert FILE with --tls-key FILE"),
        };
        let served = runtime::webhook::ReloadableCert::new(&cert, &key)?;
        let config = served.server_config()?;
        // A renewed Secret is served without a restart (rotation, cert-manager's renewal).
        if let Some(name) = &a.tls_secret {
            tokio::spawn(runtime::webhook::follow_tls_secret(
                kube.clone(),
                a.namespace.clone(),
                name.clone(),
                served.clone(),
                (cert, key),
                Duration::from_secs(30),
            ));
        }
        let keys = render::inventory::Inventory::parse(render::embedded::CILIUM_KEYS.1)
            .context(render::embedded::CILIUM_KEYS.0)?;
        let hook = Arc::new(runtime::webhook::Webhook { kube, keys });
        let listener =
            tokio::net::TcpListener::bind(&a.listen).await.with_context(|| format!("--listen {}", a.listen))?;
        eprintln!("serving the validating webhook at https://{}/validate", a.listen);
        runtime::webhook::serve_tls(hook, listener, config, crate::io::shutdown_signal()).await?;
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(Report::default())
}
