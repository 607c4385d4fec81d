//! The `ichor` binary: argument parsing and output over the library crates.
//!
//! Start at `main`. Each subcommand module turns validated arguments into a `Report` (text to
//! print and an exit code); this file owns the exit-code contract of interfaces.md (0 nothing
//! to report, 1 findings, 2 error), prints errors once as `ichor: error: a: b: c`, and exits
//! quietly on a broken pipe.

mod cni_cmd;
mod cni_values_cmd;
mod config_cmd;
mod contract_cmd;
mod controller_cmd;
mod disk;
mod fleet;
mod install_cmd;
mod io;
mod migrate_cmd;
mod op_cmd;
mod output;
mod plan_cmd;
mod render_cmd;
mod rules_cmd;
mod start_cmd;
mod talos_cmd;

use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "ichor",
    version,
    about = "Ichor's rules core: decide and explain Talos config changes and operations"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How `controller`, `webhook` and `sim cluster` log: text (no colour off a terminal) or
    /// JSON lines. The level comes from ICHOR_LOG (default info).
    #[arg(long, global = true, value_enum, default_value_t, env = "ICHOR_LOG_FORMAT")]
    log_format: controller_cmd::LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Load, check, evaluate and test rule programs.
    #[command(subcommand)]
    Rules(rules_cmd::RulesCommand),
    /// Render one machine's Talos config from the custom resources in a folder of manifests.
    #[command(after_help = "Example:\n  ichor render --manifests examples/clusters/lab-v1.14 --machine cp1")]
    Render {
        /// A folder of manifests (TalosCluster, TalosMachine, TalosConfigPatch, Secret).
        #[arg(long)]
        manifests: std::path::PathBuf,
        #[arg(long)]
        machine: String,
        /// Render at this contract instead of the cluster's spec.versionContract.
        #[arg(long)]
        contract: Option<String>,
        #[arg(long)]
        rules: Option<std::path::PathBuf>,
    },
    /// Plan one reconcile of an operation from an observed-state snapshot.
    #[command(
        after_help = "Examples:\n  ichor plan --state examples/states/upgrade-running.yaml\n  ichor plan --state snapshot.yaml --output json --explain"
    )]
    Plan {
        /// The observed-state snapshot (YAML; its format is in the README).
        #[arg(long)]
        state: std::path::PathBuf,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        /// Show each action's proof.
        #[arg(long)]
        explain: bool,
        /// Plan with the rules under DIR (its programs/operations.rules and messages.yaml)
        /// instead of the shipped ones.
        #[arg(long)]
        rules: Option<std::path::PathBuf>,
    },
    /// Print the CustomResourceDefinitions of Ichor's resources.
    #[command(after_help = "Example:\n  ichor crds | kubectl apply --server-side -f -")]
    Crds,
    /// Cilium: values validation and layering.
    #[command(subcommand)]
    Cni(cni_cmd::CniCommand),
    /// Talos configs: classify changed paths, explain a path's class.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// Talos config contracts: derive a contract's path inventory from its schema.
    #[command(subcommand)]
    Contract(contract_cmd::ContractCommand),
    /// Apply a config to a live node with no reboot, only when every changed path is
    /// live-applicable (otherwise refuse, with the reasons).
    #[command(
        after_help = "Example:\n  ichor apply --node w1 --talosconfig sim/talosconfig desired.yaml --dry-run\n\nExit: 0 applied (or nothing to apply), 1 refused (nothing applied), 2 error."
    )]
    Apply {
        #[command(flatten)]
        node: talos_cmd::NodeArgs,
        /// The whole config to apply (multi-document YAML).
        desired: std::path::PathBuf,
        /// Ask Talos's own dry run: nothing is applied.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        contract: Option<String>,
        #[arg(long)]
        rules: Option<std::path::PathBuf>,
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Simulated systems for tests and demos.
    #[command(subcommand)]
    Sim(SimCommand),
    /// Print the manifests that install Ichor: the controller (its ServiceAccount, its ClusterRole,
    /// least privilege, each rule with why; a Deployment), the Cilium Job's own ServiceAccount,
    /// the validating webhook with its TLS (generated here, or cert-manager's), hardened.
    #[command(
        after_help = "Examples:\n  ichor crds | kubectl apply --server-side -f -\n  ichor install --talosconfig ~/.talos/config | kubectl apply -f -\n  ichor install --cert-manager | kubectl apply -f -\n  ichor install --rotate-certs | kubectl apply -f -"
    )]
    Install(install_cmd::InstallArgs),
    /// Print what `ichor install` created, for `kubectl delete -f -`; the CRDs last and only
    /// with `--crds`.
    #[command(after_help = "Example:\n  ichor uninstall | kubectl delete --ignore-not-found -f -")]
    Uninstall(install_cmd::UninstallArgs),
    /// Start a Kubernetes upgrade: preview (machines, order, what would block), consent, then
    /// the cluster's spec and a TalosOperation.
    #[command(subcommand)]
    Upgrade(UpgradeCommand),
    /// Take over a Cilium someone else installed, as an operation with its preview and consent:
    /// checks (its minor version, IPAM mode kubernetes only, its health, no other owner), the
    /// values read from the running Cilium kept in the cluster's layer, then one Cilium Job
    /// that takes its objects into Ichor's Helm release (cilium in kube-system).
    #[command(after_help = "Examples:
  ichor adopt --cluster lab --dry-run
  ichor adopt --cluster lab --yes

Exit: 0 started (or previewed), 1 not started (refused, declined, or a Git change to commit), 2 error.")]
    Adopt {
        #[command(flatten)]
        start: op_cmd::StartArgs,
    },
    /// Operations and their machines: phase, stage, what each waits for (its words, clock and
    /// deadline); NAME shows one operation with its recent Events. `--watch` follows the
    /// operations not ended when it starts (or NAME) with a progress bar each: exit 0 when they
    /// complete, 1 when one of them pauses or is aborted.
    #[command(after_help = "Examples:\n  ichor status --cluster lab --watch\n  ichor status kube-proxy-replaced")]
    Status {
        /// One operation: its status and its recent Events.
        name: Option<String>,
        #[arg(long)]
        cluster: Option<String>,
        #[arg(long)]
        watch: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        kube: op_cmd::KubeArgs,
    },
    /// Operations: list them, resume a paused one, abort one, delete an ended one.
    #[command(subcommand)]
    Operation(OperationCommand),
    /// Serve the validating webhook (HTTPS, AdmissionReview v1 at /validate): kube-proxy
    /// switches need their consent annotation, Cilium values are validated and admin-only, a
    /// second operation on a locked cluster is refused.
    #[command(after_help = "Example:\n  ichor webhook --tls-secret ichor-webhook-tls --namespace ichor-system")]
    Webhook(controller_cmd::WebhookArgs),
    /// Run the controller: reconcile TalosOperations against the cluster in KUBECONFIG (or
    /// in-cluster) and the nodes in the talosconfig, while holding the Lease.
    #[command(after_help = "Example:\n  ichor controller --talosconfig talosconfig --namespace ichor-system")]
    Controller(controller_cmd::ControllerArgs),
    /// Print this Ichor's version and the release set it ships (rules/versions.rules): the Talos,
    /// Kubernetes and Cilium chart `ichor upgrade cluster` moves a cluster to.
    #[command(after_help = "Examples:\n  ichor version\n  ichor version -o json")]
    Version {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  source <(ichor completion bash)\n  ichor completion zsh > \"${fpath[1]}/_ichor\"\n  ichor completion fish > ~/.config/fish/completions/ichor.fish"
    )]
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page: ichor(1), or with `--dir DIR` write one page per command there.
    #[command(after_help = "Examples:\n  ichor man | man -l -\n  ichor man --dir /usr/local/share/man/man1")]
    Man {
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

/// `ichor completion SHELL`: clap_complete's script for the whole command tree.
/// `ichor version`: the binary's version and its release set, read from the rules it embeds.
fn version(output: Output) -> anyhow::Result<Report> {
    let set = runtime::plan::Planner::embedded()?.release_set()?;
    let stdout = match output {
        o @ (Output::Json | Output::Yaml) => {
            o.data(&serde_json::json!({"version": env!("CARGO_PKG_VERSION"), "releaseSet": set}))?
        }
        Output::Text | Output::Wide => format!(
            "ichor {}\nrelease set (rules/versions.rules):\n  talos       {}\n  kubernetes  {}\n  cilium      {} (chart)\n",
            env!("CARGO_PKG_VERSION"),
            set.talos,
            set.kubernetes,
            set.cilium
        ),
    };
    Ok(Report { stdout, ..Report::default() })
}

fn completion(shell: clap_complete::Shell) -> anyhow::Result<Report> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "ichor", &mut out);
    Ok(Report { stdout: String::from_utf8(out)?, ..Report::default() })
}

/// `ichor man [--dir DIR]`: roff from clap_mangen, ichor(1) on stdout or every page in DIR
/// (`ichor-config-diff.1` and so on).
fn man(dir: Option<&std::path::Path>) -> anyhow::Result<Report> {
    use anyhow::Context;
    use clap::CommandFactory;
    let cmd = Cli::command();
    match dir {
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            Ok(Report { stdout: String::from_utf8(out)?, ..Report::default() })
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("writing the man pages to {}", dir.display()))?;
            let n = std::fs::read_dir(dir)?
                .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "1")))
                .count();
            Ok(Report { stdout: format!("Wrote {n} man pages to {}.\n", dir.display()), ..Report::default() })
        }
    }
}

#[derive(Subcommand, Debug)]
enum UpgradeCommand {
    /// Upgrade Kubernetes to a version (control planes one at a time, then workers).
    #[command(
        after_help = "Example:\n  ichor upgrade kubernetes --cluster lab --to v1.37.0 --talosconfig talosconfig\n\nExit: 0 started (or previewed), 1 not started (blocked, declined, or a Git change to commit), 2 error."
    )]
    Kubernetes {
        #[arg(long)]
        to: String,
        /// Workers changed at once.
        #[arg(long, default_value_t = 1)]
        max_unavailable: i32,
        /// Consent to disrupt past PodDisruptionBudgets: a pod a budget still keeps at the
        /// drain's deadline (ichor controller --drain-timeout) is deleted instead of the step
        /// failing (spec.forceDrain).
        #[arg(long)]
        force_drain: bool,
        #[command(flatten)]
        start: op_cmd::StartArgs,
    },
    /// Upgrade Talos itself to a version: each node in turn pulls the installer, is cordoned
    /// and drained, installs it, reboots into it and is verified (control planes one at a time,
    /// then workers).
    #[command(
        after_help = "Example:\n  ichor upgrade talos --cluster lab --to v1.14.6 --talosconfig talosconfig\n\nThe versions it may go to, and the Kubernetes each runs, are rules/versions.rules'.\n\nExit: 0 started (or previewed, or nothing to do), 1 not started (refused, declined, or a Git change to commit), 2 error."
    )]
    Talos {
        /// The Talos version, vX.Y.Z (a release rules/versions.rules lists).
        #[arg(long)]
        to: String,
        /// Workers upgraded at once.
        #[arg(long, default_value_t = 1)]
        max_unavailable: i32,
        /// Allow a target older than what the machines run (within what the target allows).
        #[arg(long)]
        allow_downgrade: bool,
        /// Consent to disrupt past PodDisruptionBudgets: a pod a budget still keeps at the
        /// drain's deadline (ichor controller --drain-timeout) is deleted instead of the step
        /// failing (spec.forceDrain).
        #[arg(long)]
        force_drain: bool,
        #[command(flatten)]
        start: op_cmd::StartArgs,
    },
    /// Move the cluster to the release set this Ichor ships (`ichor version`): Talos, then a
    /// configuration rollout for pending changes that need a reboot, then Kubernetes one minor at
    /// a time, then the Cilium chart; the fewest steps Talos and Kubernetes support together
    /// (rules/release.rules). One TalosOperation of kind release, which creates each stage's
    /// operation in turn; a stage already at its target is skipped.
    #[command(
        after_help = "Example:\n  ichor upgrade cluster --cluster lab --talosconfig talosconfig --dry-run\n\nThe path and each step's rule: ichor plan --state SNAPSHOT --explain on a snapshot of the release (ichor controller --dump-snapshots).\n\nExit: 0 started (or previewed, or nothing to do), 1 not started (refused, declined, or a Git-tracked cluster), 2 error."
    )]
    Cluster {
        /// Workers each stage changes at once.
        #[arg(long, default_value_t = 1)]
        max_unavailable: i32,
        /// Consent to disrupt past PodDisruptionBudgets in every stage that drains
        /// (spec.forceDrain of each stage's operation).
        #[arg(long)]
        force_drain: bool,
        #[command(flatten)]
        start: op_cmd::StartArgs,
    },
}

#[derive(Subcommand, Debug)]
enum OperationCommand {
    /// Resume a paused operation (its failed machines start their step again).
    Resume {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        kube: op_cmd::KubeArgs,
    },
    /// Abort an operation: it does nothing more and releases the cluster lock.
    Abort {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        kube: op_cmd::KubeArgs,
    },
    /// The operations: name, cluster, kind, target, phase, age.
    List {
        #[arg(long)]
        cluster: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        kube: op_cmd::KubeArgs,
    },
    /// Delete an ended operation (its record goes; what it changed stays). One that has not
    /// ended is refused unless `--force`, which says what it leaves behind.
    Delete {
        name: String,
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        kube: op_cmd::KubeArgs,
    },
}

// Parsed once per process from the command line: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum SimCommand {
    /// Serve a simulated installation until interrupted: the in-memory Kubernetes API over
    /// HTTP on loopback (a kubeconfig is written), a simulated Talos fleet running the render of
    /// MANIFESTS (a talosconfig is written), the controller and stand-ins for the kubelets,
    /// DaemonSet rollouts and the Cilium Job. A fixture for trying the front door, not a cluster.
    #[command(
        after_help = "Example:\n  ichor sim cluster --manifests examples/clusters/lab-v1.14 --kubeconfig sim.kubeconfig --talosconfig sim.talosconfig"
    )]
    Cluster {
        #[arg(long, default_value = crate::disk::EXAMPLE_DIR)]
        manifests: std::path::PathBuf,
        #[arg(long)]
        kubeconfig: std::path::PathBuf,
        #[arg(long)]
        talosconfig: std::path::PathBuf,
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// The CNI hand-over: `done` (Argo CD owns Cilium; a kube-proxy switch waits for the
        /// values in Git) or `disabled` (Ichor's Cilium Job applies them; what a cluster without
        /// Argo CD runs, and what lets the sim switch kube-proxy on its own).
        #[arg(long, value_parser = ["done", "disabled"], default_value = "done")]
        handover: String,
        /// Serve the API, the fleet and the stand-ins without the controller: run `ichor
        /// controller --kubeconfig ... --talosconfig ...` against them as its own process (it
        /// can be stopped, killed and started again; two replicas share the Lease).
        #[arg(long)]
        no_controller: bool,
        /// Inject a fault on a machine's Talos API (repeatable):
        /// MACHINE=hang|unavailable|gone|latency:MS from the start (`cp1=unavailable`); with
        /// `,on=apply` or `,on=reboot` it starts mid-step, on the machine's next config apply or
        /// reboot, and with `,for=5s` it ends after that long (`w1=unavailable,on=apply,for=5s`);
        /// MACHINE=reboot-never: it never comes back from its next reboot; MACHINE=upgrade-fails:
        /// the Talos an upgrade installs fails to boot and it comes back on its previous one.
        #[arg(long)]
        node_fault: Vec<String>,
        /// Inject a fault on the Kubernetes API (repeatable): a fraction of writes answered
        /// 409, 500 or 429 with Retry-After (`429=0.2`), every watch cut after a while
        /// (`drop-watch=30s`), or latency on every request (`latency=200ms`); with
        /// `for=ichor-controller`, only on requests whose User-Agent starts so (the controller's,
        /// not kubectl's or the CLI's).
        #[arg(long)]
        api_fault: Vec<String>,
        /// Slow every step down by this many milliseconds (the controller's requeue and the
        /// stand-ins' pace), to watch an operation progress.
        #[arg(long, default_value_t = 0)]
        step_latency_ms: u64,
        /// The Kubernetes version of the release set the simulated Ichor ships (what an
        /// upgrade may target); raise it to rehearse a second upgrade.
        #[arg(long, default_value = render::embedded::RELEASE_SET_KUBERNETES)]
        release_set_kubernetes: String,
        /// The Talos version of the release set the simulated Ichor ships (what `ichor upgrade
        /// cluster` moves the cluster to).
        #[arg(long, default_value = render::embedded::RELEASE_SET_TALOS)]
        release_set_talos: String,
        /// The Cilium the cluster runs at start (X.Y.Z, the cilium agents' image tag; default:
        /// the embedded chart's), to rehearse `ichor cni upgrade` and its refusals.
        #[arg(long, value_name = "X.Y.Z")]
        cilium_version: Option<String>,
        /// Who installed the cluster's Cilium, when not Ichor's bootstrap patch (which is then
        /// left out), to rehearse `ichor adopt`: `manifests` (kubectl apply, no owner), `helm`
        /// (the release cilium in kube-system), `helm:NS/NAME` (another release),
        /// `argocd:APP`, `flux:NS/NAME`.
        #[arg(long, value_name = "WHO")]
        cilium_installed_by: Option<String>,
        /// cilium-config's `ipam` at start (default kubernetes; `cluster-pool` to rehearse the
        /// adoption's refusal).
        #[arg(long, value_name = "MODE")]
        cilium_ipam: Option<String>,
        /// Keep this many cilium agents not ready (an unhealthy Cilium).
        #[arg(long, default_value_t = 0)]
        cilium_unready: usize,
        /// Add this many worker machines to MANIFESTS' cluster (`sim-w0001`, ... at 10.1.x.y,
        /// each with its Node and its simulated Talos node), to try the controller at a fleet's
        /// size (the scale benchmark runs 30, 300 and 1,000 machines).
        #[arg(long, default_value_t = 0)]
        workers: usize,
    },
    /// Serve a simulated Talos fleet (Talos's gRPC API over mTLS on loopback, each node
    /// behaving as its Talos version does) until interrupted. A fixture, not Talos.
    #[command(
        after_help = "Example:\n  ichor sim talos --nodes 4 --controlplanes 1 --talos v1.14.3 --talos v1.13.9 --talosconfig sim-talosconfig"
    )]
    Talos {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, default_value_t = 1)]
        controlplanes: usize,
        /// Talos versions, given to the nodes in turn (default v1.14.3).
        #[arg(long)]
        talos: Vec<String>,
        #[arg(long, default_value = "127.0.0.1:50000")]
        listen: String,
        /// Where to write a talosconfig (admin) for the fleet.
        #[arg(long = "talosconfig-out", visible_alias = "talosconfig")]
        talosconfig: std::path::PathBuf,
        /// Inject a fault (repeatable): NODE=hang|unavailable|gone|latency:MS, from the start or
        /// with `,on=apply|reboot[,for=5s]` from the node's next apply or reboot; NODE=reboot-never;
        /// NODE=upgrade-fails.
        #[arg(long)]
        fault: Vec<String>,
    },
    /// Run the controller against a simulated installation (a simulated Talos fleet running the
    /// render of MANIFESTS, an in-memory Kubernetes API) through a Kubernetes upgrade, printing
    /// its progress. A demo, not a cluster.
    #[command(after_help = "Example:\n  ichor sim controller --manifests examples/clusters/lab-v1.14 --to v1.37.0")]
    Controller {
        #[arg(long, default_value = crate::disk::EXAMPLE_DIR)]
        manifests: std::path::PathBuf,
        /// The Kubernetes version to upgrade to.
        #[arg(long, default_value = "v1.37.0")]
        to: String,
        /// Write each reconcile's snapshot here, for `ichor plan --state`.
        #[arg(long)]
        dump_snapshots: Option<std::path::PathBuf>,
    },
}

/// A kube-proxy mode on the command line (`render::api::KubeProxyMode`'s closed set, as clap
/// lists and checks it; a test pins the two together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KubeProxy {
    /// Talos's kube-proxy runs.
    Enabled,
    /// Cilium replaces kube-proxy.
    Replaced,
}

impl From<KubeProxy> for render::api::KubeProxyMode {
    fn from(k: KubeProxy) -> Self {
        match k {
            KubeProxy::Enabled => render::api::KubeProxyMode::Enabled,
            KubeProxy::Replaced => render::api::KubeProxyMode::Replaced,
        }
    }
}

/// `-o/--output`, as kubectl spells it: `text` and `wide` are for people (`wide` adds columns
/// where there is a table), `json` and `yaml` are the same data for programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    #[default]
    Text,
    Json,
    Yaml,
    Wide,
}

impl Output {
    /// Whether this form is data (JSON or YAML) rather than text for people.
    pub fn is_data(self) -> bool {
        matches!(self, Output::Json | Output::Yaml)
    }

    /// The data in this form: pretty JSON, or YAML (the same tree); text forms print JSON.
    pub fn data(self, v: &impl serde::Serialize) -> Result<String, OutputError> {
        Ok(match self {
            Output::Yaml => serde_yaml::to_string(v)?,
            _ => serde_json::to_string_pretty(v)? + "\n",
        })
    }

    /// Reads back what `data` printed (a command that adds fields to another's report).
    pub fn parse_data(self, text: &str) -> Result<serde_json::Value, OutputError> {
        Ok(match self {
            Output::Yaml => serde_yaml::from_str(text)?,
            _ => serde_json::from_str(text)?,
        })
    }
}

/// Printing a report as data failed (a value that has no JSON or YAML form).
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("printing the output as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("printing the output as YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// What a command has to say: stdout, stderr, and whether it found something.
#[derive(Debug, Default)]
pub struct Report {
    pub stdout: String,
    pub stderr: String,
    /// Exit 1 (success with findings) instead of 0.
    pub findings: bool,
    /// Exit 2 after printing: part of the work failed (one node of several), the rest is
    /// reported.
    pub failed: bool,
}

/// An error that already printed its own diagnostics; main adds one summary line.
#[derive(Debug)]
pub struct Diagnosed {
    pub diagnostics: String,
    pub summary: String,
}

impl std::fmt::Display for Diagnosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary)
    }
}

impl std::error::Error for Diagnosed {}

/// How writing a command's output ended.
enum Written {
    Done,
    /// The reader went away (`ichor ... | head`): exit quietly, as every Unix tool does.
    BrokenPipe,
    /// Any other failure (a full disk, a closed descriptor): an error, exit 2.
    Failed(std::io::Error),
}

fn write_all(mut w: impl Write, text: &str) -> Written {
    match w.write_all(text.as_bytes()).and_then(|_| w.flush()) {
        Ok(()) => Written::Done,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Written::BrokenPipe,
        Err(e) => Written::Failed(e),
    }
}

/// mimalloc keeps freed memory for the next evaluation; glibc's allocator hands the tens of
/// megabytes an evaluation of 10^5 paths frees back to the system, and the next one faults
/// them in again (measured: about a quarter of a classification's time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    controller_cmd::set_log_format(cli.log_format);
    let result = match cli.command {
        Command::Rules(cmd) => rules_cmd::run(cmd),
        Command::Contract(cmd) => contract_cmd::run(cmd),
        Command::Config(cmd) => config_cmd::run(cmd),
        Command::Render { manifests, machine, contract, rules } => {
            render_cmd::render_cmd(&manifests, &machine, contract.as_deref(), rules.as_ref())
        }
        Command::Crds => render_cmd::crds_cmd(),
        Command::Plan { state, output, explain, rules } => plan_cmd::run(&state, output, explain, rules.as_deref()),
        Command::Cni(cmd) => cni_cmd::run(cmd),
        Command::Apply { node, desired, dry_run, contract, rules, output } => {
            talos_cmd::apply(&node, &desired, dry_run, contract.as_deref(), rules.as_deref(), output)
        }
        Command::Sim(SimCommand::Talos { nodes, controlplanes, talos, listen, talosconfig, fault }) => {
            talos_cmd::sim(nodes, controlplanes, &talos, &listen, &talosconfig, &fault)
        }
        Command::Sim(SimCommand::Controller { manifests, to, dump_snapshots }) => {
            controller_cmd::run_demo(&manifests, &to, dump_snapshots)
        }
        Command::Controller(args) => controller_cmd::run_real(&args),
        Command::Webhook(args) => controller_cmd::run_webhook(&args),
        Command::Adopt { start } => start_cmd::start(start_cmd::Start::Adopt, &start),
        Command::Upgrade(UpgradeCommand::Kubernetes { to, max_unavailable, force_drain, start }) => {
            start_cmd::start(start_cmd::Start::Upgrade { to, max_unavailable, force_drain }, &start)
        }
        Command::Upgrade(UpgradeCommand::Talos { to, max_unavailable, allow_downgrade, force_drain, start }) => {
            start_cmd::start(start_cmd::Start::Talos { to, max_unavailable, allow_downgrade, force_drain }, &start)
        }
        Command::Upgrade(UpgradeCommand::Cluster { max_unavailable, force_drain, start }) => {
            start_cmd::start(start_cmd::Start::Release { max_unavailable, force_drain }, &start)
        }
        Command::Status { name, cluster, watch, output, kube } => {
            op_cmd::status(name.as_deref(), cluster.as_deref(), watch, output, &kube)
        }
        Command::Operation(OperationCommand::Resume { name, output, kube }) => {
            op_cmd::resume_or_abort(&name, true, output, &kube)
        }
        Command::Operation(OperationCommand::List { cluster, output, kube }) => {
            op_cmd::list(cluster.as_deref(), output, &kube)
        }
        Command::Operation(OperationCommand::Delete { name, force, kube }) => op_cmd::delete(&name, force, &kube),
        Command::Operation(OperationCommand::Abort { name, output, kube }) => {
            op_cmd::resume_or_abort(&name, false, output, &kube)
        }
        Command::Sim(SimCommand::Cluster {
            manifests,
            kubeconfig,
            talosconfig,
            listen,
            handover,
            no_controller,
            node_fault,
            api_fault,
            step_latency_ms,
            release_set_kubernetes,
            release_set_talos,
            cilium_version,
            cilium_installed_by,
            cilium_ipam,
            cilium_unready,
            workers,
        }) => {
            let sim = controller_cmd::SimCluster {
                cilium_version,
                cilium_installed_by,
                cilium_ipam,
                cilium_unready,
                handover_done: handover == "done",
                controller: !no_controller,
                node_faults: node_fault,
                api_faults: api_fault,
                step_latency: std::time::Duration::from_millis(step_latency_ms),
                release_set_kubernetes,
                release_set_talos,
                workers,
            };
            controller_cmd::sim_cluster(&manifests, &kubeconfig, &talosconfig, &listen, sim)
        }
        Command::Install(a) => install_cmd::install(&a),
        Command::Uninstall(a) => install_cmd::uninstall(&a),
        Command::Version { output } => version(output),
        Command::Completion { shell } => completion(shell),
        Command::Man { dir } => man(dir.as_deref()),
    };
    match result {
        Ok(report) => match write_all(std::io::stdout().lock(), &report.stdout) {
            Written::BrokenPipe => ExitCode::SUCCESS,
            Written::Failed(e) => {
                let _ = write_all(std::io::stderr().lock(), &format!("ichor: error: writing the output: {e}\n"));
                ExitCode::from(2)
            }
            Written::Done => {
                let _ = write_all(std::io::stderr().lock(), &report.stderr);
                if report.failed {
                    ExitCode::from(2)
                } else if report.findings {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
        },
        Err(err) => {
            let mut text = String::new();
            if let Some(d) = err.downcast_ref::<Diagnosed>() {
                text.push_str(&d.diagnostics);
            }
            // Each layer once, an API answer as a sentence (runtime::error_chain).
            text.push_str(&format!("ichor: error: {}\n", runtime::error_chain(err.as_ref())));
            let _ = write_all(std::io::stderr().lock(), &text);
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kube_proxy_flag_is_the_modes_closed_set() {
        let names: Vec<String> =
            KubeProxy::value_variants().iter().map(|k| k.to_possible_value().unwrap().get_name().to_string()).collect();
        let modes: Vec<&str> = render::api::KubeProxyMode::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names, modes);
        for k in KubeProxy::value_variants() {
            let m: render::api::KubeProxyMode = (*k).into();
            assert_eq!(m.name(), k.to_possible_value().unwrap().get_name());
        }
    }
}
