//! The front door end to end: `ichor sim cluster` (the in-memory Kubernetes API over HTTP, the
//! simulated Talos fleet, the controller) in a child process, and the operation commands run
//! against it as a user types them: `upgrade kubernetes`, `status --watch`, `cni kube-proxy`,
//! `operation abort|resume`. Outputs are goldens under `tests/golden/operations/` (timestamps
//! and the API's port redacted), rewritten with `TRYCMD=overwrite`.

mod common;

use render::api::{MachinePhase, Phase};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

struct Sim {
    child: Child,
    dir: PathBuf,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

use common::root;

impl Sim {
    fn start(name: &str) -> Sim {
        Sim::start_with(name, "done")
    }

    fn start_with(name: &str, handover: &str) -> Sim {
        Sim::start_args(name, handover, &[])
    }

    fn start_args(name: &str, handover: &str, extra: &[&str]) -> Sim {
        Sim::start_manifests(name, "examples/clusters/lab-v1.14", handover, extra)
    }

    /// The simulated cluster of a folder of manifests (a path from the repository's root, or absolute).
    fn start_manifests(name: &str, manifests: &str, handover: &str, extra: &[&str]) -> Sim {
        let dir = std::env::temp_dir().join(format!("ichor-ops-{name}-{}", std::process::id()));
        let mut args = vec!["--manifests", manifests, "--handover", handover];
        args.extend(extra);
        let child = common::spawn_sim(&dir, &args);
        Sim { child, dir }
    }

    /// A raw GET against the simulated API (what the kubeconfig's server answers).
    fn get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let server = self.server();
        let mut s = std::net::TcpStream::connect(&server).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    }

    /// The API's `host:port` (what the kubeconfig's server names).
    fn server(&self) -> String {
        let kc = std::fs::read_to_string(self.dir.join("kubeconfig")).unwrap();
        kc.lines().find_map(|l| l.trim().strip_prefix("server: http://")).unwrap().to_string()
    }

    /// The first operation's phase, as `ichor status --output json` shows it.
    fn phase(&self) -> Phase {
        let (_, out, _) = self.ichor(&["status", "--cluster", "lab", "--output", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v.pointer("/operations/0/status/phase").and_then(|p| p.as_str()).and_then(Phase::parse).unwrap_or_default()
    }

    /// Waits (90 s at most) until the first operation's phase is one `done` accepts.
    fn wait_phase(&self, done: &dyn Fn(Phase) -> bool) -> Phase {
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(90) {
            let p = self.phase();
            if done(p) {
                return p;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        self.phase()
    }

    /// `ichor controller`, the product binary, as its own process against the sim; the sim's
    /// API stands for the kubernetes Service the controller probes after a kube-proxy removal.
    fn controller(&self) -> Child {
        self.replica("ichor-test")
    }

    /// One replica of `ichor controller` with its own identity in the Lease.
    fn replica(&self, identity: &str) -> Child {
        self.replica_with(identity, &[], Stdio::null())
    }

    /// A replica with more environment (`ICHOR_CRASH_AFTER`) and its stderr sent to `stderr`.
    fn replica_with(&self, identity: &str, env: &[(&str, &str)], stderr: Stdio) -> Child {
        self.replica_serving(identity, env, stderr, "127.0.0.1:0")
    }

    /// A replica serving /metrics at `metrics` (HOST:PORT).
    fn replica_serving(&self, identity: &str, env: &[(&str, &str)], stderr: Stdio, metrics: &str) -> Child {
        self.replica_command(identity, env, stderr, metrics).spawn().unwrap()
    }

    /// A replica writing each reconcile's state to `dir` (`--dump-snapshots`).
    fn replica_dumping(&self, identity: &str, dir: &std::path::Path) -> Child {
        let mut c = self.replica_command(identity, &[], Stdio::null(), "127.0.0.1:0");
        c.arg("--dump-snapshots").arg(dir).spawn().unwrap()
    }

    /// The command of one replica of `ichor controller` against the sim.
    fn replica_command(&self, identity: &str, env: &[(&str, &str)], stderr: Stdio, metrics: &str) -> Command {
        let server = self.server();
        let (host, port) = server.rsplit_once(':').unwrap();
        let mut c = Command::new(env!("CARGO_BIN_EXE_ichor"));
        c.env("KUBERNETES_SERVICE_HOST", host)
            .env("KUBERNETES_SERVICE_PORT", port)
            .args(["controller", "--namespace", "ichor-system", "--metrics-addr", metrics, "--kubeconfig"])
            .arg(self.dir.join("kubeconfig"))
            .arg("--talosconfig")
            .arg(self.dir.join("talosconfig"))
            .args(["--identity", identity])
            // A budget a test adds fails the drain in seconds, as in `ichor sim cluster`.
            .args(["--drain-timeout", "3"])
            .current_dir(root())
            .env("ICHOR_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr);
        c
    }

    /// The first replica, once it holds the Lease (30 s at most).
    fn replica_holding_the_lease(&self, identity: &str) -> Child {
        self.replica_holding_the_lease_on(identity, &[])
    }

    /// The first replica, run with `env` (`NODE_NAME`: the node it says it runs on), once it
    /// holds the Lease.
    fn replica_holding_the_lease_on(&self, identity: &str, env: &[(&str, &str)]) -> Child {
        let replica = self.replica_with(identity, env, Stdio::null());
        let start = std::time::Instant::now();
        while self.lease_holder() != identity && start.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert_eq!(self.lease_holder(), identity, "the first replica never took the Lease");
        replica
    }

    /// Who holds the controller's Lease, as `kubectl` reads it ("" when nobody).
    fn lease_holder(&self) -> String {
        self.kubectl(&[
            "get",
            "lease",
            "ichor-controller",
            "-n",
            "ichor-system",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .map(|(_, out, _)| out.trim().to_string())
        .unwrap_or_default()
    }

    fn ichor(&self, args: &[&str]) -> (i32, String, String) {
        self.ichor_env(args, &[])
    }

    /// `ichor` with more environment (`EDITOR`).
    fn ichor_env(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let kc = self.dir.join("kubeconfig");
        let tc = self.dir.join("talosconfig");
        let out = Command::new(env!("CARGO_BIN_EXE_ichor"))
            .args(args)
            .envs(env.iter().copied())
            .env("KUBECONFIG", &kc)
            .env("TALOSCONFIG", &tc)
            .current_dir(root())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr): (String, String) =
            (String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into());
        // Issue 50, finding 8: no output of any command in this suite is a Rust debug structure
        // (an API error printed as `Status { status: Some(Failure), ... }`).
        for text in [&stdout, &stderr] {
            assert!(
                !text.contains("Some(") && !text.contains("Status {"),
                "ichor {args:?} printed a Rust debug structure:\n{text}"
            );
        }
        (out.status.code().unwrap_or(-1), stdout, stderr)
    }
}

impl Sim {
    /// Waits until no Node, TalosMachine or TalosOperation changed for 3 s (at most 60 s).
    fn wait_quiet(&self) {
        let versions = || {
            self.kubectl(&[
                "get",
                "nodes,talosmachines,talosoperations",
                "-A",
                "-o",
                "jsonpath={.items[*].metadata.resourceVersion}",
            ])
            .map(|(_, out, _)| out)
        };
        let (mut last, mut same) = (versions(), 0);
        for _ in 0..60 {
            std::thread::sleep(std::time::Duration::from_secs(1));
            let now = versions();
            same = if now == last { same + 1 } else { 0 };
            if same >= 3 {
                return;
            }
            last = now;
        }
        panic!("the simulated cluster kept changing for 60 s");
    }

    /// Every TalosMachine's Ready reason, as kubectl reads it, in name order.
    fn machine_reasons(&self) -> String {
        let jsonpath = "jsonpath={.items[*].status.conditions[0].reason}";
        self.kubectl(&["get", "talosmachines", "-n", "ichor-system", "-o", jsonpath])
            .expect("kubectl (tests/kube) runs")
            .1
    }

    /// The reason of the TalosCluster's CNIValuesApplied condition, as kubectl reads it.
    fn values_reason(&self) -> String {
        let c = r#"jsonpath={.status.conditions[?(@.type=="CNIValuesApplied")].reason}"#;
        self.kubectl(&["get", "tc", "lab", "-n", "ichor-system", "-o", c]).unwrap().1
    }

    /// Waits (30 s at most) for CNIValuesApplied's reason to be `want`; returns the last read.
    fn wait_values_reason(&self, want: &str) -> String {
        let start = std::time::Instant::now();
        while self.values_reason() != want && start.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        self.values_reason()
    }

    /// The real `kubectl` (built from k8s.io/kubectl by tests/kube, never one from PATH)
    /// against the simulated API; `None` only when it could not be started.
    fn kubectl(&self, args: &[&str]) -> Option<(i32, String, String)> {
        let out = Command::new(runtime::sim::kubebin::kubectl())
            .args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .current_dir(root())
            .stdin(Stdio::null())
            .output()
            .ok()?;
        Some((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        ))
    }
}

/// Times are the run's own: redacted before comparing.
fn redact(text: &str) -> String {
    let re = regex::Regex::new(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z").unwrap();
    re.replace_all(text, "<time>").into_owned()
}

fn golden(name: &str, actual: &str) {
    let path = root().join("tests/golden/operations").join(name);
    // Times, and an Event's count (how often the controller saw it depends on the machine's
    // speed, once or more): left out.
    let actual = regex::Regex::new(r" \(x\d+\):").unwrap().replace_all(&redact(actual), ":").into_owned();
    if std::env::var("TRYCMD").as_deref() == Ok("overwrite") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} is missing: run with TRYCMD=overwrite", path.display()));
    if expected != actual {
        let diff = similar::TextDiff::from_lines(&expected, &actual);
        panic!("{} differs (TRYCMD=overwrite rewrites it):\n{}", path.display(), diff.unified_diff());
    }
}

#[test]
fn upgrade_kubernetes_then_status_watch_completes_the_upgrade() {
    let sim = Sim::start("upgrade");
    let (code, out, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    golden("upgrade-dry-run.stdout", &out);
    let (code, out, _) =
        sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--dry-run", "--output", "json"]);
    assert_eq!(code, 0);
    golden("upgrade-dry-run.json", &out);
    // Nothing was created by the dry runs.
    let (_, out, _) = sim.ichor(&["status", "--cluster", "lab"]);
    assert_eq!(out, "No TalosOperations in ichor-system.\n");
    // Without a terminal and without --yes, consent cannot be asked: nothing is written.
    let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0"]);
    assert_eq!(code, 2);
    assert!(err.contains("run again with --yes"), "{err}");
    let (code, out, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"]);
    assert_eq!(code, 0, "{err}");
    golden("upgrade-yes.stdout", &out);
    let (code, out, err) = sim.ichor(&["status", "--cluster", "lab", "--watch"]);
    assert_eq!(code, 0, "{out}{err}");
    golden("upgrade-status-after-watch.stdout", &out);
    let (code, out, _) = sim.ichor(&["status", "--cluster", "lab", "--output", "json"]);
    assert_eq!(code, 0);
    golden("upgrade-status.json", &out);
    // -o yaml is the same data as -o json.
    let (code, yaml, _) = sim.ichor(&["status", "--cluster", "lab", "-o", "yaml"]);
    assert_eq!(code, 0);
    golden("upgrade-status.yaml", &yaml);
    let from_yaml: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(from_yaml, serde_json::from_str::<serde_json::Value>(&out).unwrap());
    // Starting it again: the cluster already runs it, nothing to do, nothing written.
    let (code, out, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "Nothing to do: cluster ichor-system/lab already runs Kubernetes v1.37.0; nothing was written.\n");
    // A target the release set does not ship: the preview's refusal, and with --yes nothing is
    // written (ADR 0113).
    let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.1", "--yes"]);
    assert_eq!(code, 1, "{err}");
    golden("upgrade-not-shipped-refused.stderr", &err);
    let (code, out, _) =
        sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.1", "--yes", "--output", "json"]);
    assert_eq!(code, 1);
    golden("upgrade-not-shipped-refused.json", &out);
    let cluster = sim.get("/apis/ichor.maesh.dev/v1alpha1/namespaces/ichor-system/talosclusters/lab");
    assert!(cluster.contains(r#""kubernetesVersion":"v1.37.0""#), "{cluster}");
}

#[test]
fn kube_proxy_switch_is_created_with_its_consent_then_aborted() {
    let sim = Sim::start("switch");
    let (code, out, err) = sim.ichor(&["cni", "kube-proxy", "replaced", "--cluster", "lab", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    golden("switch-dry-run.stdout", &out);
    let (code, out, err) =
        sim.ichor(&["cni", "kube-proxy", "replaced", "--cluster", "lab", "--yes", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    golden("switch-yes.json", &out);
    // The spec names the target; the consent annotation was removed once the operation existed.
    let cluster = sim.get("/apis/ichor.maesh.dev/v1alpha1/namespaces/ichor-system/talosclusters/lab");
    assert!(cluster.contains(r#""kubeProxy":"replaced""#), "{cluster}");
    assert!(!cluster.contains("confirm-kube-proxy-switch"), "{cluster}");
    // The controller picks it up and waits for the CNI change, on its clock.
    let mut out = String::new();
    for _ in 0..100 {
        out = sim.ichor(&["status", "--cluster", "lab"]).1;
        if out.contains("waiting on AwaitingCNIChange") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    golden("switch-status-waiting.stdout", &out);
    let (code, out, err) = sim.ichor(&["operation", "resume", "kube-proxy-replaced"]);
    assert_eq!(code, 2, "{out}");
    golden("switch-resume-not-paused.stderr", &err);
    let (code, out, err) = sim.ichor(&["operation", "abort", "kube-proxy-replaced", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    golden("switch-abort.json", &out);
    // Aborting it again says it already is.
    let (code, _, err) = sim.ichor(&["operation", "abort", "kube-proxy-replaced"]);
    assert_eq!(code, 2);
    golden("switch-abort-again.stderr", &err);
    // Aborted is final: a resume is refused, naming the phase and the way forward (issue 21).
    let (code, _, err) = sim.ichor(&["operation", "resume", "kube-proxy-replaced"]);
    assert_eq!(code, 2);
    golden("switch-resume-aborted.stderr", &err);
    // The controller reconciles it once more: it stays aborted, and its clock is cleared.
    for _ in 0..100 {
        if !sim.ichor(&["status", "--cluster", "lab"]).1.contains("waiting on") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // It was aborted before the watch began: the watch follows nothing and exits 0 (an earlier
    // abort never fails a script's `... && ichor status --watch`).
    let (code, out, _) = sim.ichor(&["status", "--cluster", "lab", "--watch"]);
    assert_eq!(code, 0, "{out}");
    golden("switch-status-aborted.stdout", &out);
    // The same target again, after the abort: a fresh operation under a fresh name.
    let (code, out, err) = sim.ichor(&["cni", "kube-proxy", "replaced", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Created TalosOperation ichor-system/kube-proxy-replaced-2."), "{out}");
    // Once the controller has taken it up (its phase, in the refusal below, is then Running
    // whatever the machine's speed):
    for _ in 0..300 {
        let (_, out, _) = sim.ichor(&["status", "--cluster", "lab", "--output", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let running =
            v["operations"].as_array().into_iter().flatten().any(|o| {
                o["metadata"]["name"] == "kube-proxy-replaced-2" && o["status"]["phase"] == Phase::Running.name()
            });
        if running {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // A second operation while the first has not ended: refused, naming it and the ways
    // forward; nothing is written.
    let before = sim.get("/apis/ichor.maesh.dev/v1alpha1/namespaces/ichor-system/talosclusters/lab");
    let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"]);
    assert_eq!(code, 1, "{err}");
    golden("second-operation-refused.stderr", &err);
    let (code, out, _) =
        sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes", "--output", "json"]);
    assert_eq!(code, 1);
    golden("second-operation-refused.json", &out);
    let after = sim.get("/apis/ichor.maesh.dev/v1alpha1/namespaces/ichor-system/talosclusters/lab");
    let version = |t: &str| t.contains(r#""kubernetesVersion":"v1.36.4""#);
    assert!(version(&before) && version(&after), "the spec is unchanged");
    // The operations, listed (ages redacted); one that has not ended is not deleted without
    // --force, naming what it changed; an ended one is.
    let (code, out, err) = sim.ichor(&["operation", "list"]);
    assert_eq!(code, 0, "{err}");
    let ages = regex::Regex::new(r"(?m)\b\d+[smhd]$").unwrap();
    golden("operation-list.stdout", &ages.replace_all(&out, "<age>"));
    let (code, out, err) = sim.ichor(&["operation", "list", "-o", "wide"]);
    assert_eq!(code, 0, "{err}");
    // The AGE column is padded to its widest age: an age and its padding are one token.
    let ages = regex::Regex::new(r"\b\d+[smhd] +").unwrap();
    golden("operation-list-wide.stdout", &ages.replace_all(&out, "<age>   "));
    let (code, out, _) = sim.ichor(&["status", "kube-proxy-replaced-2"]);
    assert_eq!(code, 0);
    assert!(out.contains("waiting on AwaitingCNIChange since") && out.contains(", until "), "{out}");
    assert!(out.contains("set kubeProxyReplacement: true") && out.contains("Events:"), "{out}");
    let (code, _, err) = sim.ichor(&["operation", "delete", "kube-proxy-replaced-2"]);
    assert_eq!(code, 1, "{err}");
    golden("operation-delete-not-ended.stderr", &err);
    let (code, out, err) = sim.ichor(&["operation", "delete", "kube-proxy-replaced"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "Deleted TalosOperation ichor-system/kube-proxy-replaced.\n");
    let (code, _, err) = sim.ichor(&["status", "kube-proxy-replaced"]);
    assert_eq!(code, 2);
    assert!(err.contains("TalosOperation ichor-system/kube-proxy-replaced not found"), "{err}");
    // A cluster that does not exist: a sentence, no debug dump.
    let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "nowhere", "--to", "v1.37.0", "--yes"]);
    assert_eq!(code, 2);
    golden("cluster-not-found.stderr", &err);
    assert!(!err.contains("Status {"), "{err}");
}

/// An operator's day on a cluster without Argo CD (issue 23), through the real controller: a
/// switch; an upgrade started while the switch waits (refused, nothing written); a blocked
/// `--yes`; an upgrade aborted and the same target started again; `status --watch` after the
/// abort; the switch there and back twice. Each start is followed with `status --watch` to its
/// end. Every operation the user did not abort ends Completed, and the spec is changed only by
/// operations that started.
#[test]
fn walk_through_an_operators_day_ends_with_every_operation_completed() {
    let sim = Sim::start_with("walk", "disabled");
    let spec = || {
        let path = "jsonpath={.spec.kubernetesVersion} {.spec.cni.kubeProxy}";
        sim.kubectl(&["get", "tc", "lab", "-n", "ichor-system", "-o", path]).unwrap().1
    };
    let watch = |what: &str| {
        let (code, out, err) = sim.ichor(&["status", "--cluster", "lab", "--watch"]);
        assert_eq!(code, 0, "{what}: {out}{err}");
    };
    let start = |args: &[&str]| {
        let (code, out, err) = sim.ichor(args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        out
    };
    let upgrade = ["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"];
    start(&["cni", "kube-proxy", "replaced", "--cluster", "lab", "--yes"]);
    // An upgrade while the switch waits: refused, naming the switch; the spec is unchanged.
    let before = spec();
    let (code, _, err) = sim.ichor(&upgrade);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("kube-proxy-replaced") && err.contains("ichor operation abort"), "{err}");
    assert_eq!(spec(), before, "a refused start writes nothing");
    watch("the switch");
    // A target the release set does not ship: the preview refuses, and --yes writes nothing.
    let before = spec();
    let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.1", "--yes"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(spec(), before, "a blocked --yes writes nothing");
    // The upgrade, aborted at once, then the same target again under a fresh name.
    assert!(start(&upgrade).contains("TalosOperation ichor-system/upgrade-kubernetes-1-37-0."));
    start(&["operation", "abort", "upgrade-kubernetes-1-37-0"]);
    let phase_of = |name: &str| {
        let path = "jsonpath={.status.phase}";
        sim.kubectl(&["get", "talosoperation", name, "-n", "ichor-system", "-o", path]).unwrap().1
    };
    for _ in 0..300 {
        if phase_of("upgrade-kubernetes-1-37-0") == Phase::Aborted.name() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(phase_of("upgrade-kubernetes-1-37-0"), Phase::Aborted.name());
    assert!(start(&upgrade).contains("TalosOperation ichor-system/upgrade-kubernetes-1-37-0-2."));
    // The watch after an earlier abort follows only the new one, and exits 0 when it completes.
    watch("the upgrade after an abort");
    // There and back twice: each switch gets a fresh name.
    for mode in ["enabled", "replaced", "enabled"] {
        start(&["cni", "kube-proxy", mode, "--cluster", "lab", "--yes"]);
        watch(mode);
    }
    let path = r#"jsonpath={range .items[*]}{.metadata.name}={.status.phase}{"\n"}{end}"#;
    let (_, out, _) = sim.kubectl(&["get", "talosoperations", "-n", "ichor-system", "-o", path]).unwrap();
    let phases: Vec<&str> = out.lines().collect();
    assert_eq!(
        phases,
        [
            "kube-proxy-enabled=Completed",
            "kube-proxy-enabled-2=Completed",
            "kube-proxy-replaced=Completed",
            "kube-proxy-replaced-2=Completed",
            "upgrade-kubernetes-1-37-0=Aborted",
            "upgrade-kubernetes-1-37-0-2=Completed",
        ],
        "{out}"
    );
    assert_eq!(spec(), "v1.37.0 enabled");
    let (_, out, _) = sim.ichor(&["status", "--cluster", "lab"]);
    // The abort races the controller's first reconcile of the upgrade (found in a clean-clone
    // run on a busy machine): aborted Pending, or Running with its first control plane's step
    // recorded. Either is right; the golden keeps what does not depend on it.
    let mut aborted = false;
    let out: String = out
        .lines()
        .filter(|l| {
            if !l.starts_with(' ') {
                aborted = l.starts_with("upgrade-kubernetes-1-37-0 ");
            }
            !(aborted && l.starts_with("  ") && !l.starts_with("  reason:"))
        })
        .map(|l| l.replace("(was Pending)", "(was <phase>)").replace("(was Running)", "(was <phase>)") + "\n")
        .collect();
    golden("walk-through-status.stdout", &out);
    // One operation, kubectl-describe style, with its Events.
    let (code, out, _) = sim.ichor(&["status", "kube-proxy-replaced-2"]);
    assert_eq!(code, 0);
    golden("status-name.stdout", &out);
    // kube-proxy is back, restored from Talos's own rendering.
    let ds = sim.get("/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy");
    assert!(ds.starts_with("HTTP/1.1 200"), "{ds}");
}

/// `kubectl patch` of the example cluster's Kubernetes version (a merge patch).
fn patch_version(sim: &Sim, version: &str, extra: &[&str]) -> (i32, String, String) {
    let body = format!(r#"{{"spec":{{"kubernetesVersion":"{version}"}}}}"#);
    let mut args = vec!["patch", "tc", "lab", "-n", "ichor-system", "--type", "merge", "-p", &body];
    args.extend(extra);
    sim.kubectl(&args).unwrap()
}

/// A client nobody here wrote: the real `kubectl` discovers what the simulated cluster serves,
/// lists, describes and explains Ichor's kinds, watches them; a patch that changes nothing
/// changes nothing, a server-side dry run writes nothing, and a server-side apply conflict
/// names the manager that owns the field.
#[test]
fn kubectl_discovers_lists_and_describes_the_simulated_cluster() {
    let sim = Sim::start("kubectl");
    let (code, out, err) = sim.kubectl(&["api-resources"]).expect("kubectl (tests/kube) runs");
    assert_eq!(code, 0, "kubectl api-resources: {err}");
    let line = out.lines().find(|l| l.starts_with("talosclusters ")).unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols, ["talosclusters", "tc", "ichor.maesh.dev/v1alpha1", "true", "TalosCluster"], "{out}");
    assert!(out.lines().any(|l| l.starts_with("nodes ") && l.contains("false")), "{out}");

    let (code, out, err) = sim.kubectl(&["get", "talosclusters,talosmachines,talosoperations", "-A"]).unwrap();
    assert_eq!(code, 0, "kubectl get: {err}");
    assert!(out.contains("taloscluster.ichor.maesh.dev/lab"), "{out}");
    for m in ["cp1", "cp2", "cp3", "w1"] {
        assert!(out.contains(&format!("talosmachine.ichor.maesh.dev/{m}")), "{m}: {out}");
    }

    let (code, out, err) = sim.kubectl(&["describe", "talosmachine", "cp1", "-n", "ichor-system"]).unwrap();
    assert_eq!(code, 0, "kubectl describe: {err}");
    assert!(out.contains("Name:         cp1") && out.contains("Role:") && out.contains("controlplane"), "{out}");

    let rv = |sim: &Sim| {
        sim.kubectl(&["get", "tc", "lab", "-n", "ichor-system", "-o", "jsonpath={.metadata.resourceVersion}"])
            .unwrap()
            .1
    };
    // The controller may write the cluster's status meanwhile (a real change): look again then.
    let kept = (0..5).any(|_| {
        let before = rv(&sim);
        let (code, out, err) = patch_version(&sim, "v1.36.4", &[]);
        assert_eq!(code, 0, "kubectl patch: {err}");
        out.contains("patched (no change)") && rv(&sim) == before
    });
    assert!(kept, "a no-op patch keeps the resourceVersion and kubectl says `(no change)`");

    // The schemas kubectl reads: `explain` shows the CRD's descriptions.
    let (code, out, err) = sim.kubectl(&["explain", "talosmachine.spec"]).unwrap();
    assert_eq!(code, 0, "kubectl explain: {err}");
    assert!(out.contains("KIND:       TalosMachine") && out.contains("The node's address for the Talos API."), "{out}");

    // A server-side dry run changes nothing.
    let (code, out, err) = patch_version(&sim, "v1.36.9", &["--dry-run=server"]);
    assert_eq!(code, 0, "kubectl patch --dry-run=server: {err}{out}");
    let version =
        sim.kubectl(&["get", "tc", "lab", "-n", "ichor-system", "-o", "jsonpath={.spec.kubernetesVersion}"]).unwrap().1;
    assert_eq!(version, "v1.36.4", "a dry run writes nothing");
    // (The example's Secret carries the resourceVersion its render hashes: a stale one, which
    // kube-apiserver refuses on apply as the sim does; the custom resources are applied.)
    let (code, out, err) = sim
        .kubectl(&[
            "apply",
            "--dry-run=server",
            "-f",
            "examples/clusters/lab-v1.14/cluster.yaml",
            "-f",
            "examples/clusters/lab-v1.14/machines.yaml",
            "-f",
            "examples/clusters/lab-v1.14/patches.yaml",
        ])
        .unwrap();
    assert_eq!(code, 0, "kubectl apply --dry-run=server: {err}");
    assert!(out.contains("taloscluster.ichor.maesh.dev/lab configured (server dry run)"), "{out}");

    // Server-side apply: a second manager's change of a field the first owns is a conflict
    // naming the first.
    let cluster = std::fs::read_to_string(root().join("examples/clusters/lab-v1.14/cluster.yaml")).unwrap();
    let file = sim.dir.join("cluster.yaml");
    std::fs::write(&file, &cluster).unwrap();
    let file = file.to_string_lossy().to_string();
    let (code, _, err) = sim.kubectl(&["apply", "--server-side", "--field-manager=first", "-f", &file]).unwrap();
    assert_eq!(code, 0, "kubectl apply --server-side: {err}");
    std::fs::write(&file, cluster.replace("v1.36.4", "v1.36.7")).unwrap();
    let (code, _, err) = sim.kubectl(&["apply", "--server-side", "--field-manager=second", "-f", &file]).unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("Apply failed with 1 conflict: conflict with \"first\": .spec.kubernetesVersion"), "{err}");

    // A watch prints what is there, then what changes.
    let (_, out, _) =
        sim.kubectl(&["get", "talosmachines", "-n", "ichor-system", "-w", "--request-timeout=3s"]).unwrap();
    assert!(out.lines().any(|l| l.starts_with("cp1 ")), "{out}");
}

/// `ichor sim cluster --no-controller` serves the API, the fleet and the stand-ins; the product
/// controller runs as its own process, is killed mid-upgrade and started again, and the upgrade
/// completes from what the status holds.
#[test]
fn an_upgrade_completes_with_the_controller_as_its_own_process_killed_and_restarted() {
    let sim = Sim::start_args("own-process", "done", &["--no-controller"]);
    let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"]);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(sim.phase(), Phase::Pending, "no controller runs inside the sim");
    let mut first = sim.controller();
    let p = sim.wait_phase(&|p| p != Phase::Pending);
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(matches!(p, Phase::Running | Phase::Completed), "{p}");
    let mut second = sim.controller();
    let p = sim.wait_phase(&|p| matches!(p, Phase::Completed | Phase::Paused));
    // Idle once it completed (issue 23): the controller's CPU over 10 s, from /proc (Linux).
    let ticks = |pid: u32| -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
    };
    // The nodes settle after the operation completes (the last kubelets report their version,
    // and the controller reconciles each change once): idle is when nothing changed for 3 s.
    sim.wait_quiet();
    if let Some(before) = ticks(second.id()) {
        std::thread::sleep(std::time::Duration::from_secs(10));
        let used = ticks(second.id()).unwrap_or(before) - before;
        // Clock ticks are 1/100 s: N ticks in 10 s are N / 10 % of a core.
        let percent = used as f64 / 10.0;
        // Printed with --nocapture (0.0-0.2 % measured on 2 cores, in docs/testing.md's budgets);
        // held only against a loop that never rests (issue 23 saw a whole core), not as a timing.
        eprintln!("the idle controller used {percent:.1} % of a core over 10 s");
        assert!(percent < 10.0, "the idle controller used {percent:.1} % of a core over 10 s");
    }
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(p, Phase::Completed);
}

/// Two replicas: the Lease holder is SIGKILLed mid-upgrade, the other takes the Lease within
/// its duration (15 s, 5 s grace) and completes the upgrade; every kubelet ends on the target.
#[test]
fn the_other_replica_takes_the_lease_and_completes_an_upgrade_when_the_holder_is_killed() {
    let sim = Sim::start_args("replicas", "done", &["--no-controller"]);
    let mut a = sim.replica_holding_the_lease("replica-a");
    let mut b = sim.replica("replica-b");
    let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let p = sim.wait_phase(&|p| p != Phase::Pending);
    assert_eq!(p, Phase::Running, "the holder did not start the upgrade");
    assert_eq!(sim.lease_holder(), "replica-a", "the standby took the Lease while the holder lived");
    a.kill().unwrap();
    a.wait().unwrap();
    let killed = std::time::Instant::now();
    while sim.lease_holder() != "replica-b" && killed.elapsed() < std::time::Duration::from_secs(40) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let took = killed.elapsed();
    assert_eq!(sim.lease_holder(), "replica-b", "the standby did not take the Lease in {took:?}");
    // The Lease's duration and grace, and a poll's slack.
    assert!(took < std::time::Duration::from_secs(25), "the standby took the Lease after {took:?}");
    let p = sim.wait_phase(&|p| matches!(p, Phase::Completed | Phase::Paused));
    sim.wait_quiet();
    let (_, versions, _) =
        sim.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.kubeletVersion}"]).unwrap();
    b.kill().unwrap();
    b.wait().unwrap();
    assert_eq!(p, Phase::Completed);
    let versions: Vec<&str> = versions.split_whitespace().collect();
    assert_eq!(versions.len(), 4, "{versions:?}");
    assert!(versions.iter().all(|v| *v == "v1.37.0"), "{versions:?}");
    eprintln!("the standby took the Lease {took:?} after the holder's SIGKILL");
}

/// A kube-proxy switch (a cluster without Argo CD: Ichor's Cilium Job applies the values)
/// completes with the product controller as its own process, run as docs/operations.md's
/// `--no-controller` walk-through runs it: outside a pod, without KUBERNETES_SERVICE_HOST/PORT,
/// so the kubernetes Service is probed at the kubeconfig's server (issue 50, finding 5: it
/// waited 30 minutes with kube-proxy already deleted).
#[test]
fn a_kube_proxy_switch_completes_with_the_controller_as_its_own_process() {
    let sim = Sim::start_args("own-process-switch", "disabled", &["--no-controller"]);
    let outside_a_pod = [("KUBERNETES_SERVICE_HOST", ""), ("KUBERNETES_SERVICE_PORT", "")];
    let mut controller = sim.replica_with("ichor-test", &outside_a_pod, Stdio::null());
    let (code, _, err) = sim.ichor(&["cni", "kube-proxy", "replaced", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let p = sim.wait_phase(&|p| matches!(p, Phase::Completed | Phase::Paused));
    controller.kill().unwrap();
    controller.wait().unwrap();
    assert_eq!(p, Phase::Completed);
    let (_, out, _) = sim.ichor(&["status", "--cluster", "lab"]);
    assert!(out.contains("kube-proxy-replaced (cni kube-proxy replaced) on lab: Completed"), "{out}");
}

impl Sim {
    /// `kubectl args...` in the background for `secs` seconds while `meanwhile` runs; what it
    /// printed.
    fn kubectl_during(&self, args: &[&str], secs: u64, meanwhile: &dyn Fn()) -> String {
        let mut child = Command::new(runtime::sim::kubebin::kubectl())
            .args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .current_dir(root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        meanwhile();
        std::thread::sleep(std::time::Duration::from_secs(secs));
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }
}

/// What an operator types next, with the real `kubectl`: a watch of the operations sees one
/// start and move; `describe` shows a machine's events; `events`, `wait --for=jsonpath`,
/// `label`, `annotate`, `patch --type json|strategic`, `create`, `delete`, `get -o wide`, `-l`
/// and `-o json` behave as on kube-apiserver; an unknown field is refused under kubectl's
/// default strict validation, naming the field.
#[test]
fn kubectl_watches_edits_waits_and_reads_events_on_the_simulated_cluster() {
    let sim = Sim::start("kubectl-day");
    // A watch of the operations: the upgrade appears, with its columns, and its phase moves.
    let out = sim.kubectl_during(&["get", "talosoperations", "-n", "ichor-system", "-w"], 6, &|| {
        let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"]);
        assert_eq!(code, 0, "{err}");
    });
    let header = out.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAME") && header.contains("KIND") && header.contains("PHASE"), "{out}");
    assert!(out.lines().filter(|l| l.contains(" kubernetes ")).count() >= 2, "the operation appears and moves:\n{out}");

    // The machine's events, as describe lists them, and as `kubectl events` does.
    let described = (0..30).find_map(|_| {
        let (code, out, err) = sim.kubectl(&["describe", "talosmachine", "cp1", "-n", "ichor-system"]).unwrap();
        assert_eq!(code, 0, "{err}");
        let events = out.split("Events:").nth(1).unwrap_or_default().to_string();
        if events.contains("ichor") {
            return Some(events);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        None
    });
    let events = described.expect("describe talosmachine cp1 shows the controller's events");
    assert!(events.contains("Type") && events.contains("Reason") && events.contains("From"), "{events}");
    let (code, out, err) = sim.kubectl(&["events", "-n", "ichor-system", "--for", "talosmachine/cp1"]).unwrap();
    assert_eq!(code, 0, "kubectl events: {err}");
    assert!(out.contains("TalosMachine/cp1"), "{out}");

    // Waits on a field, as an operator scripts it.
    let (code, out, err) = sim
        .kubectl(&[
            "wait",
            "--for=jsonpath={.status.phase}=Completed",
            "talosoperations",
            "--all",
            "-n",
            "ichor-system",
            "--timeout=120s",
        ])
        .unwrap();
    assert_eq!(code, 0, "kubectl wait: {err}{out}");
    assert!(out.contains("condition met"), "{out}");

    // Labels, annotations, JSON and strategic merge patches.
    let ns = ["-n", "ichor-system"];
    let (code, _, err) = sim.kubectl(&[&["label", "talosmachine", "cp1", "rack=r1"][..], &ns].concat()).unwrap();
    assert_eq!(code, 0, "kubectl label: {err}");
    let (code, out, err) =
        sim.kubectl(&[&["get", "talosmachines", "-l", "rack in (r1,r2)", "-o", "name"][..], &ns].concat()).unwrap();
    assert_eq!((code, out.trim()), (0, "talosmachine.ichor.maesh.dev/cp1"), "{err}");
    let (code, _, err) =
        sim.kubectl(&[&["annotate", "talosmachine", "cp1", "example.dev/note=checked"][..], &ns].concat()).unwrap();
    assert_eq!(code, 0, "kubectl annotate: {err}");
    let json_patch = r#"[{"op":"remove","path":"/metadata/labels/rack"}]"#;
    let (code, _, err) = sim
        .kubectl(&[&["patch", "talosmachine", "cp1", "--type", "json", "-p", json_patch][..], &ns].concat())
        .unwrap();
    assert_eq!(code, 0, "kubectl patch --type json: {err}");
    let (_, out, _) = sim.kubectl(&[&["get", "talosmachines", "-l", "rack", "-o", "name"][..], &ns].concat()).unwrap();
    assert_eq!(out.trim(), "", "the label is gone");
    // (kubectl's typed generators, `kubectl create configmap`, write protobuf, which the sim
    // refuses with 415, naming what to do instead.)
    let (code, _, err) = sim.kubectl(&["create", "configmap", "notes", "-n", "default", "--from-literal=a=1"]).unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("kubectl create -f"), "{err}");
    let file = sim.dir.join("notes.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n  namespace: default\ndata:\n  a: \"1\"\n",
    )
    .unwrap();
    let (code, _, err) = sim.kubectl(&["create", "-f", &file.to_string_lossy()]).unwrap();
    assert_eq!(code, 0, "kubectl create -f: {err}");
    let (code, _, err) = sim
        .kubectl(&[
            "patch",
            "configmap",
            "notes",
            "-n",
            "default",
            "--type",
            "strategic",
            "-p",
            r#"{"data":{"b":"2"}}"#,
        ])
        .unwrap();
    assert_eq!(code, 0, "kubectl patch --type strategic: {err}");
    let (_, out, _) =
        sim.kubectl(&["get", "configmap", "notes", "-n", "default", "-o", "json", "--show-managed-fields"]).unwrap();
    let cm: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cm["data"], serde_json::json!({"a": "1", "b": "2"}));
    assert!(cm["metadata"]["managedFields"].as_array().is_some_and(|m| !m.is_empty()), "{cm}");
    let (code, _, err) = sim.kubectl(&["delete", "configmap", "notes", "-n", "default"]).unwrap();
    assert_eq!(code, 0, "kubectl delete: {err}");
    let (code, _, err) = sim.kubectl(&["get", "configmap", "notes", "-n", "default"]).unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("configmaps \"notes\" not found"), "{err}");

    // Wide output, and the nodes as kubectl prints them.
    let (code, out, err) = sim.kubectl(&[&["get", "talosmachines", "-o", "wide"][..], &ns].concat()).unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().next().is_some_and(|h| h.contains("CLUSTER") && h.contains("ROLE")), "{out}");
    let (code, out, err) = sim.kubectl(&["get", "nodes"]).unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().next().is_some_and(|h| h.contains("STATUS") && h.contains("ROLES")), "{out}");

    // docs/operations.md's "On a real cluster" lines: the CRDs applied server-side, the install dry-run
    // on the server.
    for (what, args) in [
        ("crds", &["apply", "--server-side", "-f", "-"][..]),
        ("install", &["apply", "--dry-run=server", "-f", "-"][..]),
    ] {
        let (_, yaml, _) = sim.ichor(&[what]);
        let out = kubectl_with_input(&sim, args, &yaml);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ichor {what} | kubectl {args:?}: {err}");
    }
    let (_, out, _) = sim.kubectl(&["get", "crd", "talosclusters.ichor.maesh.dev"]).unwrap();
    assert!(out.contains("talosclusters.ichor.maesh.dev"), "{out}");
    installed_as_shipped(&sim);

    // kubectl validates strictly by default: an unknown field is refused, named.
    let cluster = std::fs::read_to_string(root().join("examples/clusters/lab-v1.14/cluster.yaml")).unwrap();
    let file = sim.dir.join("typo.yaml");
    std::fs::write(&file, cluster.replace("kubernetesVersion:", "kubernetesVersoin:")).unwrap();
    let (code, _, err) = sim.kubectl(&["apply", "-f", &file.to_string_lossy()]).unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("strict decoding error: unknown field \"spec.kubernetesVersoin\""), "{err}");
}

/// The issue's first line as written: `ichor install | kubectl apply -f -`, then the example
/// cluster applied, leaves a controller Deployment, a webhook whose certificate verifies
/// against its `caBundle` for the Service's name, and no reference to a Secret that does not
/// exist; the printer columns are what `kubectl get` shows.
/// `kubectl ARGS` with `yaml` on its stdin, against the simulated cluster.
fn kubectl_with_input(sim: &Sim, args: &[&str], yaml: &str) -> std::process::Output {
    Command::new(runtime::sim::kubebin::kubectl())
        .args(args)
        .env("KUBECONFIG", sim.dir.join("kubeconfig"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(yaml.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap()
}

fn installed_as_shipped(sim: &Sim) {
    use base64::Engine as _;
    let (_, yaml, _) = sim.ichor(&["install"]);
    let (_, crds, _) = sim.ichor(&["crds"]);
    // A server-side dry run first: every document accepted, nothing kept.
    for (what, text) in [("ichor install", &yaml), ("ichor crds", &crds)] {
        let out = kubectl_with_input(sim, &["apply", "--server-side", "--dry-run=server", "-f", "-"], text);
        assert!(
            out.status.success(),
            "{what} | kubectl apply --server-side --dry-run=server: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (code, _, _) = sim.kubectl(&["get", "deployment", "ichor-controller", "-n", "ichor-system"]).unwrap();
    assert_ne!(code, 0, "a server-side dry run kept the Deployment");
    let out = kubectl_with_input(sim, &["apply", "-f", "-"], &yaml);
    assert!(out.status.success(), "ichor install | kubectl apply -f -: {}", String::from_utf8_lossy(&out.stderr));
    let examples = root().join("examples/clusters/lab-v1.14");
    let (code, _, err) = sim.kubectl(&["apply", "-f", &examples.to_string_lossy()]).unwrap();
    assert_eq!(code, 0, "kubectl apply -f examples/clusters/lab-v1.14/: {err}");
    let get = |args: &[&str]| -> serde_json::Value {
        let (code, out, err) = sim.kubectl(&[args, &["-o", "json"][..]].concat()).unwrap();
        assert_eq!(code, 0, "kubectl get {args:?}: {err}");
        serde_json::from_str(&out).unwrap()
    };
    let deployments = get(&["get", "deployments", "-n", "ichor-system"]);
    let deployments = deployments["items"].as_array().unwrap();
    assert!(deployments.iter().any(|d| d["metadata"]["name"] == "ichor-controller"), "{deployments:?}");
    // Every Secret a pod mounts without `optional`, or the webhook reads, exists.
    let mut referenced = vec![];
    for d in deployments {
        let pod = &d["spec"]["template"]["spec"];
        for v in pod["volumes"].as_array().into_iter().flatten() {
            if v["secret"].is_object() && v["secret"]["optional"] != true {
                referenced.push(v["secret"]["secretName"].as_str().unwrap().to_string());
            }
        }
        for c in pod["containers"].as_array().unwrap() {
            let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
            if let Some(i) = args.iter().position(|a| *a == "--tls-secret") {
                referenced.push(args[i + 1].to_string());
            }
        }
    }
    assert!(referenced.contains(&"ichor-webhook-tls".to_string()), "{referenced:?}");
    for name in &referenced {
        let (code, _, err) = sim.kubectl(&["get", "secret", name, "-n", "ichor-system"]).unwrap();
        assert_eq!(code, 0, "Secret {name} is referenced and does not exist: {err}");
    }
    let hook = get(&["get", "validatingwebhookconfiguration", "ichor"]);
    assert!(hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_null(), "no cert-manager reference");
    let b64 = |v: &serde_json::Value| {
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap()).unwrap()
    };
    let bundle = b64(&hook["webhooks"][0]["clientConfig"]["caBundle"]);
    let secret = get(&["get", "secret", "ichor-webhook-tls", "-n", "ichor-system"]);
    let (crt, key) = (b64(&secret["data"]["tls.crt"]), b64(&secret["data"]["tls.key"]));
    runtime::install::verify(&bundle, &crt, &key, "ichor-webhook.ichor-system.svc").unwrap();
    // The printer columns, as kubectl prints them.
    for (resource, header) in [
        ("talosmachines", ["CLUSTER", "ROLE", "READY", "REASON", "AGE"]),
        ("talosclusters", ["KUBERNETES", "TALOS", "KUBE-PROXY", "HAND-OVER", "AGE"]),
        ("talosconfigpatches", ["CLUSTER", "ORDER", "AGE", "AGE", "AGE"]),
    ] {
        let (code, out, err) = sim.kubectl(&["get", resource, "-n", "ichor-system"]).unwrap();
        assert_eq!(code, 0, "{err}");
        let first = out.lines().next().unwrap_or_default();
        assert!(header.iter().all(|h| first.contains(h)), "kubectl get {resource}: {out}");
    }
    let (_, out, _) = sim.kubectl(&["get", "talosmachines", "-n", "ichor-system"]).unwrap();
    assert!(out.lines().skip(1).any(|l| l.contains("True") || l.contains("False")), "READY is filled: {out}");
}

/// With `--handover done`, Argo CD's stand-in owns Cilium: a kube-proxy switch waits for the
/// change in Git, the user edits the Application's Helm values (here with kubectl, as they
/// would commit to Git), the stand-in syncs them to Cilium, and the switch completes.
#[test]
fn a_kube_proxy_switch_completes_once_the_argo_cd_values_say_so() {
    let sim = Sim::start_with("argo-switch", "done");
    let (code, out, err) = sim.kubectl(&["get", "applications", "-n", "argocd"]).unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cilium") && out.contains("Synced") && out.contains("Healthy"), "{out}");
    let (code, _, err) = sim.ichor(&["cni", "kube-proxy", "replaced", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let waiting = (0..60).any(|_| {
        let (_, out, _) = sim.ichor(&["status", "--cluster", "lab"]);
        std::thread::sleep(std::time::Duration::from_millis(250));
        out.contains("AwaitingCNIChange") || out.contains("Git")
    });
    assert!(waiting, "the switch waits for the values in Git");
    let values = r#"{"spec":{"source":{"helm":{"valuesObject":{"kubeProxyReplacement":true,"k8sServiceHost":"localhost","k8sServicePort":7445}}}}}"#;
    let (code, _, err) =
        sim.kubectl(&["patch", "application", "cilium", "-n", "argocd", "--type", "merge", "-p", values]).unwrap();
    assert_eq!(code, 0, "{err}");
    let p = sim.wait_phase(&|p| matches!(p, Phase::Completed | Phase::Paused));
    let (_, out, _) = sim.ichor(&["status", "--cluster", "lab"]);
    assert_eq!(p, Phase::Completed, "{out}");
}

/// `ichor config apply`, as an operator uses it: nothing to do on a converged cluster, an
/// unknown machine named, a reboot-class patch previewed and rolled out node by node until the
/// cluster converges, then a kube-proxy change pending a consented switch refused.
#[test]
fn config_apply_previews_refuses_and_rolls_out_a_reboot_class_patch() {
    let sim = Sim::start("config-apply");
    let (code, out, err) = sim.ichor(&["config", "apply", "--cluster", "lab"]);
    assert_eq!(code, 0, "{err}");
    golden("config-apply-nothing-to-do.stdout", &out);
    let (code, _, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--machines", "cp1,nope", "--yes"]);
    assert_eq!(code, 2);
    golden("config-apply-unknown-machine.stderr", &err);
    // A kernel module on every machine: the machine controller leaves it (RebootRequired).
    apply_module_patch(&sim);
    let (code, out, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    golden("config-apply-dry-run.stdout", &out);
    let (code, out, _) = sim.ichor(&["config", "apply", "--cluster", "lab", "--dry-run", "--output", "json"]);
    assert_eq!(code, 0);
    golden("config-apply-dry-run.json", &out);
    let (code, out, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Created TalosOperation ichor-system/config-rollout"), "{out}");
    let (code, out, err) = sim.ichor(&["status", "--cluster", "lab", "--watch"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("config-rollout (config rollout) on lab: Completed"), "{out}");
    sim.wait_quiet();
    let (_, out, _) = sim
        .kubectl(&[
            "get",
            "talosmachines",
            "-n",
            "ichor-system",
            "-o",
            "jsonpath={.items[*].status.conditions[0].reason}",
        ])
        .unwrap();
    assert_eq!(out, "Converged Converged Converged Converged");
    let (_, out, _) = sim.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].spec.unschedulable}"]).unwrap();
    assert_eq!(out.trim(), "", "a node left cordoned");
    let (code, out, _) = sim.ichor(&["config", "apply", "--cluster", "lab"]);
    assert_eq!(code, 0);
    golden("config-apply-nothing-to-do.stdout", &out);
    // The user consents to kube-proxy replaced without starting the switch: a rollout of cp1
    // is refused with the command to run first, and nothing is written.
    let (code, _, err) = sim
        .kubectl(&[
            "annotate",
            "taloscluster",
            "lab",
            "-n",
            "ichor-system",
            "ichor.maesh.dev/confirm-kube-proxy-switch=replaced",
        ])
        .unwrap();
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = sim.patch_cluster(r#"{"cni":{"kubeProxy":"replaced"}}"#);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--machines", "cp1", "--yes"]);
    assert_eq!(code, 1, "{err}");
    golden("config-apply-kube-proxy-pending-refused.stderr", &err);
    let (_, out, _) = sim.ichor(&["operation", "list", "--cluster", "lab"]);
    assert_eq!(out.lines().filter(|l| l.contains("config-rollout")).count(), 1, "{out}");
}

/// The machine controller through `ichor sim cluster`'s serve loop: a node label (safe and live
/// on Talos 1.14) is applied on every machine and each is Converged within seconds of the
/// patch, woken by the patch (not by its 30 s look); the Node carries the label.
#[test]
fn a_safe_patch_is_applied_live_on_every_machine_within_seconds() {
    let sim = Sim::start("live-patch");
    sim.wait_quiet();
    let start = std::time::Instant::now();
    apply_label_patch(&sim);
    let reasons = || sim.machine_reasons();
    let labels = || sim.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.labels.team}"]).unwrap().1;
    let mut seen = (String::new(), String::new());
    while start.elapsed() < std::time::Duration::from_secs(20) {
        seen = (reasons(), labels());
        if seen == ("Converged Converged Converged Converged".into(), "storage storage storage storage".into()) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(seen.0, "Converged Converged Converged Converged", "after {:?}", start.elapsed());
    assert_eq!(seen.1, "storage storage storage storage", "after {:?}", start.elapsed());
    // Nothing rebooted, no operation was needed.
    let (_, out, _) = sim.ichor(&["status", "--cluster", "lab"]);
    assert_eq!(out, "No TalosOperations in ichor-system.\n");
    eprintln!("converged {:?} after the patch", start.elapsed());
}

/// Issue 54: the machine and cluster loops' states, dumped by the controller, replay through
/// `ichor plan --state` to the loop's own plan: a machine's live apply of a safe patch is in the
/// plan of a state dumped before it, and the last state of each machine and of the cluster
/// replays to the status the loop wrote (no secret is in any dumped state).
#[test]
fn the_machine_and_cluster_loops_states_replay_through_ichor_plan_to_what_the_loops_did() {
    let sim = Sim::start_args("loop-replay", "done", &["--no-controller"]);
    let dumps = sim.dir.join("dumps");
    let mut replica = sim.replica_dumping("ichor-test", &dumps);
    sim.wait_quiet();
    apply_label_patch(&sim);
    let start = std::time::Instant::now();
    while sim.machine_reasons() != "Converged Converged Converged Converged"
        && start.elapsed() < std::time::Duration::from_secs(30)
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    sim.wait_quiet();
    let _ = replica.kill();
    let _ = replica.wait();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dumps).unwrap().map(|e| e.unwrap().path()).collect();
    eprintln!("{} states dumped", files.len());
    files.sort_by_key(|f| f.file_name().unwrap().to_string_lossy().rsplit('-').next().unwrap().to_string());
    let replay = |f: &PathBuf| {
        let (code, out, err) = sim.ichor(&["plan", "--state", f.to_str().unwrap(), "--output", "json"]);
        assert!(code == 0 || code == 1, "ichor plan --state {}: {code}\n{err}", f.display());
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    // The example's secrets bundle (examples/clusters/lab-v1.14/secrets.yaml): its tokens are
    // in every running config and render.
    let secrets = ["lab001.examplemachinetk", "lab002.exampleclustertk"];
    let mut applied_live = vec![];
    for machine in ["cp1", "cp2", "cp3", "w1"] {
        let prefix = format!("machine-{machine}-");
        let mine: Vec<&PathBuf> =
            files.iter().filter(|f| f.file_name().unwrap().to_string_lossy().starts_with(&prefix)).collect();
        assert!(!mine.is_empty(), "no state of {machine} was dumped: {files:?}");
        for f in &mine {
            let text = std::fs::read_to_string(f).unwrap();
            for secret in secrets {
                assert!(!text.contains(secret), "{} holds a secret", f.display());
            }
        }
        // The newest state whose plan applies the patch live: the reconcile that applied it.
        for f in mine.iter().rev() {
            let plan = replay(f);
            let applies = plan["actions"].as_array().unwrap().iter().any(|a| {
                a["action"] == "applyNoReboot" && a["paths"].to_string().contains("KubeNodeConfig.labels.team")
            });
            if applies {
                applied_live.push(machine);
                break;
            }
        }
        let last = replay(mine.last().unwrap());
        let (_, written, _) =
            sim.kubectl(&["get", "talosmachine", machine, "-n", "ichor-system", "-o", "json"]).unwrap();
        let written: serde_json::Value = serde_json::from_str(&written).unwrap();
        assert_eq!(last["status"], written["status"], "{machine}: the replayed status is not the written one");
    }
    assert_eq!(
        applied_live,
        ["cp1", "cp2", "cp3", "w1"],
        "the live apply of the patch is in each machine's replayed plan"
    );
    let clusters: Vec<&PathBuf> =
        files.iter().filter(|f| f.file_name().unwrap().to_string_lossy().starts_with("cluster-lab-")).collect();
    let last = replay(clusters.last().expect("the cluster's state was dumped"));
    let (_, written, _) = sim.kubectl(&["get", "taloscluster", "lab", "-n", "ichor-system", "-o", "json"]).unwrap();
    let written: serde_json::Value = serde_json::from_str(&written).unwrap();
    assert_eq!(last["status"]["conditions"], written["status"]["conditions"]);
    assert!(
        last["actions"].as_array().unwrap().iter().any(|a| a["action"] == "setCondition" && a["type"] == "CNIHandover"),
        "{last}"
    );
}

/// A config rollout with `ichor controller` as its own process, SIGKILLed at pseudo-random
/// points (mid-drain, right after a Talos apply or a Reboot, before a status write) and started
/// again: it completes, and every node rebooted exactly once (its Node's boot ID is its second
/// boot), uncordoned and Converged. `ICHOR_LONG_TESTS=1` kills it more often.
#[test]
fn a_config_rollout_completes_with_its_controller_killed_at_random_points() {
    let sim = Sim::start_args("rollout-kills", "done", &["--no-controller"]);
    apply_module_patch(&sim);
    let (code, _, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let (controller, kills) = sim.kill_at_random_points(0x5eed, &|| sim.phase());
    let p = sim.wait_phase(&|p| matches!(p, Phase::Completed | Phase::Paused));
    assert_eq!(p, Phase::Completed, "after {kills} kill(s)");
    sim.wait_quiet();
    sim.check_then_stop(controller, || sim.assert_rolled_out_once(&format!("after {kills} kill(s)")));
    eprintln!("the rollout completed after {kills} SIGKILL(s) of its controller");
}

/// `kubectl apply` of a patch that labels every node `team: storage`: safe, applied live.
fn apply_label_patch(sim: &Sim) {
    let patch = sim.dir.join("label.yaml");
    std::fs::write(
        &patch,
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosConfigPatch\nmetadata:\n  name: team-label\n  namespace: ichor-system\nspec:\n  clusterRef:\n    name: lab\n  order: 50\n  patch: |\n    apiVersion: v1alpha1\n    kind: KubeNodeConfig\n    labels:\n      team: storage\n",
    )
    .unwrap();
    let (code, _, err) = sim.kubectl(&["apply", "-f", patch.to_str().unwrap()]).expect("kubectl (tests/kube) runs");
    assert_eq!(code, 0, "{err}");
}

/// `kubectl apply` of a patch that loads a kernel module on every machine: reboot-class on
/// Talos 1.14, so the machine controller leaves it to a config rollout.
fn apply_module_patch(sim: &Sim) {
    let patch = sim.dir.join("module.yaml");
    std::fs::write(
        &patch,
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosConfigPatch\nmetadata:\n  name: br-netfilter\n  namespace: ichor-system\nspec:\n  clusterRef:\n    name: lab\n  order: 60\n  patch: |\n    machine:\n      kernel:\n        modules:\n          - name: br_netfilter\n",
    )
    .unwrap();
    let (code, _, err) = sim.kubectl(&["apply", "-f", patch.to_str().unwrap()]).expect("kubectl (tests/kube) runs");
    assert_eq!(code, 0, "{err}");
}

impl Sim {
    /// Runs `ichor controller` and SIGKILLs it at random points (every 1-3 s, six times at most;
    /// every 0.1-0.8 s without a cap with ICHOR_LONG_TESTS) until `phase` is terminal or 150 s
    /// passed, starting it again after each kill; returns the running replica and the kills.
    fn kill_at_random_points(&self, seed: u64, phase: &dyn Fn() -> Phase) -> (Child, u32) {
        let long = std::env::var_os("ICHOR_LONG_TESTS").is_some();
        let mut z = seed;
        let (mut kills, start) = (0, std::time::Instant::now());
        let mut controller = self.controller();
        while start.elapsed() < std::time::Duration::from_secs(150) {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let ms = if long { 100 + (z >> 33) % 700 } else { 1000 + (z >> 33) % 2000 };
            std::thread::sleep(std::time::Duration::from_millis(ms));
            if matches!(phase(), Phase::Completed | Phase::Paused) || (!long && kills == 6) {
                break;
            }
            controller.kill().unwrap();
            controller.wait().unwrap();
            kills += 1;
            controller = self.controller();
        }
        (controller, kills)
    }

    fn stop(&self, mut controller: Child) {
        controller.kill().unwrap();
        controller.wait().unwrap();
    }

    /// Runs `check` while `controller` still runs (the machine controller corrects a status
    /// soon after a read that failed, so a check that waits needs it), then stops it, also
    /// when the check fails.
    fn check_then_stop<T>(&self, controller: Child, check: impl FnOnce() -> T) -> T {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
        self.stop(controller);
        r.unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// One operation's phase, by name, as `kubectl` reads it.
    fn phase_of(&self, name: &str) -> Phase {
        let path = "jsonpath={.status.phase}";
        let out = self.kubectl(&["get", "talosoperation", name, "-n", "ichor-system", "-o", path]);
        out.and_then(|(_, o, _)| Phase::parse(o.trim())).unwrap_or_default()
    }
}

/// A kube-proxy switch both ways, then an upgrade to v1.37.0, as typed, with the names of the
/// TalosOperations they create.
const SWITCHES_AND_UPGRADE: [(&[&str], &str); 3] = [
    (&["cni", "kube-proxy", "replaced", "--cluster", "lab", "--yes"], "kube-proxy-replaced"),
    (&["cni", "kube-proxy", "enabled", "--cluster", "lab", "--yes"], "kube-proxy-enabled"),
    (&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"], "upgrade-kubernetes-1-37-0"),
];

/// A kube-proxy switch both ways, then an upgrade, each with its controller SIGKILLed at random
/// points: each completes, one Cilium Job per mode ran, every kubelet ends on the target.
#[test]
fn switches_both_ways_and_an_upgrade_complete_with_their_controller_killed_at_random_points() {
    let sim = Sim::start_args("switch-kills", "disabled", &["--no-controller"]);
    let boots_before = sim.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.bootID}"]).unwrap().1;
    let mut total = 0;
    for (seed, (args, name)) in (0x51..).zip(SWITCHES_AND_UPGRADE) {
        let (code, _, err) = sim.ichor(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let (controller, kills) = sim.kill_at_random_points(seed, &|| sim.phase_of(name));
        let start = std::time::Instant::now();
        while !matches!(sim.phase_of(name), Phase::Completed | Phase::Paused) && start.elapsed().as_secs() < 90 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        sim.stop(controller);
        assert_eq!(sim.phase_of(name), Phase::Completed, "{name} after {kills} kill(s)");
        total += kills;
    }
    sim.wait_quiet();
    sim.assert_switched_twice_and_upgraded(Some(&boots_before));
    eprintln!("two switches and an upgrade completed after {total} SIGKILL(s) of their controller");
}

impl Sim {
    /// Runs `ichor controller` armed (`ICHOR_CRASH_AFTER`) to end itself, as a SIGKILL would,
    /// right after a write, and starts it again after each crash, until `phase` is terminal
    /// (150 s at most, 600 s with ICHOR_LONG_TESTS). Every other run ends right after its first
    /// write of one of `rare` (writes made once per step or per mode, such as a Job create,
    /// which a count over every kind could step over); the others after their Nth write of one
    /// of `kinds`, N 1-3 from `seed` (1-2 with ICHOR_LONG_TESTS). N is never always 1: a step a
    /// crash interrupted redoes its idempotent writes first (a manifest sync), so crashing
    /// after each first write would end every run at that same write. Returns the crashes per
    /// kind of write; the caller finishes with an unarmed controller.
    fn crash_after_writes(
        &self,
        seed: u64,
        rare: &str,
        kinds: &str,
        phase: &dyn Fn() -> Phase,
    ) -> BTreeMap<String, u32> {
        let long = std::env::var_os("ICHOR_LONG_TESTS").is_some();
        let (mut z, mut crashes, start) = (seed, BTreeMap::new(), std::time::Instant::now());
        let log = self.dir.join("crash.log");
        let cap = std::time::Duration::from_secs(if long { 600 } else { 150 });
        while start.elapsed() < cap && !matches!(phase(), Phase::Completed | Phase::Paused) {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let n = 1 + (z >> 33) % if long { 2 } else { 3 };
            let runs: u32 = crashes.values().sum();
            let point = if runs.is_multiple_of(2) { format!("{rare}:1") } else { format!("{kinds}:{n}") };
            let file = std::fs::File::create(&log).unwrap();
            let mut c = self.replica_with("ichor-test", &[("ICHOR_CRASH_AFTER", &point)], Stdio::from(file));
            let ended = loop {
                if let Some(status) = c.try_wait().unwrap() {
                    break Some(status);
                }
                if matches!(phase(), Phase::Completed | Phase::Paused) {
                    break None;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            };
            let Some(status) = ended else {
                self.stop(c);
                break;
            };
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let kind = text.lines().find_map(|l| l.split("crash point: ending the process right after ").nth(1));
            let kind = kind
                .and_then(|k| k.split_whitespace().next())
                .unwrap_or_else(|| panic!("the controller ended ({status}) without its crash point:\n{text}"));
            *crashes.entry(kind.to_string()).or_insert(0) += 1;
        }
        crashes
    }
}

/// A config rollout whose controller ends itself right after a Talos apply, a reboot, a cordon
/// or uncordon, a drain or a status write (ICHOR_CRASH_AFTER), again and again: it completes,
/// and every node rebooted exactly once (a reboot-class change is never applied twice),
/// uncordoned and Converged. `ICHOR_LONG_TESTS=1` runs it five times, each with its own seed.
#[test]
fn a_config_rollout_ends_the_same_with_its_controller_crashed_right_after_each_kind_of_write() {
    let mut total = 0;
    for seed in 0xc4a5..0xc4a5 + rounds() {
        total += rollout_with_crash_points(seed);
    }
    eprintln!("{} rollout(s) completed after {total} crashes right after writes", rounds());
}

/// One run of the crash-point scenarios: five with ICHOR_LONG_TESTS.
fn rounds() -> u64 {
    if std::env::var_os("ICHOR_LONG_TESTS").is_some() { 5 } else { 1 }
}

/// The rollout with crash points; the crashes it took.
fn rollout_with_crash_points(seed: u64) -> u32 {
    let sim = Sim::start_args(&format!("rollout-crash-points-{seed}"), "done", &["--no-controller"]);
    apply_module_patch(&sim);
    let (code, _, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let all = "talos-apply,talos-reboot,cordon,drain,status";
    let crashes = sim.crash_after_writes(seed, "talos-apply,talos-reboot,cordon", all, &|| sim.phase());
    let controller = sim.controller();
    let p = sim.wait_phase(&|p| matches!(p, Phase::Completed | Phase::Paused));
    assert_eq!(p, Phase::Completed, "after crashes {crashes:?}");
    sim.wait_quiet();
    sim.check_then_stop(controller, || sim.assert_rolled_out_once(&format!("after crashes {crashes:?}")));
    for kind in ["talos-apply", "talos-reboot", "cordon", "status"] {
        assert!(crashes.contains_key(kind), "no crash right after a {kind}: {crashes:?}");
    }
    eprintln!("the rollout completed after crashes right after writes: {crashes:?}");
    crashes.values().sum()
}

/// A kube-proxy switch both ways and an upgrade whose controller ends itself right after a
/// server-side apply, a delete, a Job create, a Talos apply or a status write, again and again:
/// each completes, one Cilium Job ran per mode, no node rebooted, every kubelet on the target.
/// `ICHOR_LONG_TESTS=1` runs it five times, each with its own seeds.
#[test]
fn switches_and_an_upgrade_end_the_same_with_their_controller_crashed_right_after_each_kind_of_write() {
    let mut total = 0;
    for round in 0..rounds() {
        total += switches_with_crash_points(0x61 + 0x10 * round);
    }
    eprintln!(
        "{} round(s) of two switches and an upgrade completed after {total} crashes right after writes",
        rounds()
    );
}

/// The two switches and the upgrade with crash points, from `seed`; the crashes they took.
fn switches_with_crash_points(seed: u64) -> u32 {
    let sim = Sim::start_args(&format!("switch-crash-points-{seed}"), "disabled", &["--no-controller"]);
    let boots_before = sim.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.bootID}"]).unwrap().1;
    let mut all: BTreeMap<String, u32> = BTreeMap::new();
    for (seed, (args, name)) in (seed..).zip(SWITCHES_AND_UPGRADE) {
        let (code, _, err) = sim.ichor(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let kinds = "server-side-apply,delete,job-create,talos-apply,status";
        let rare = "job-create,delete,server-side-apply,talos-apply";
        let crashes = sim.crash_after_writes(seed, rare, kinds, &|| sim.phase_of(name));
        let controller = sim.controller();
        let start = std::time::Instant::now();
        while !matches!(sim.phase_of(name), Phase::Completed | Phase::Paused) && start.elapsed().as_secs() < 90 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        sim.stop(controller);
        assert_eq!(sim.phase_of(name), Phase::Completed, "{name} after crashes {crashes:?}");
        for (k, n) in crashes {
            *all.entry(k).or_insert(0) += n;
        }
    }
    sim.wait_quiet();
    for kind in ["server-side-apply", "delete", "job-create", "talos-apply", "status"] {
        assert!(all.contains_key(kind), "no crash right after a {kind}: {all:?}");
    }
    sim.assert_switched_twice_and_upgraded(Some(&boots_before));
    eprintln!("two switches and an upgrade completed after crashes right after writes: {all:?}");
    all.values().sum()
}

/// The controller's own requests meet API faults (the sim's `--api-fault for=ichor-controller`:
/// a fifth of its writes answered 409, 500 or 429, every watch cut after 4 s, 30 ms on every
/// request; the test's kubectl and CLI calls are spared): a kube-proxy switch both ways and a
/// config rollout each complete, one Cilium Job per mode, each node rebooted once.
#[test]
fn switches_and_a_rollout_complete_when_the_controllers_requests_meet_api_faults() {
    under_api_faults("api-faults", false);
}

/// The same with the upgrade to v1.37.0 between the switches and the rollout. On CI (3 runs,
/// before transient answers to server-side applies were retried: `runtime::kube::retrying`) it
/// stalled Running after the control planes' kube-proxy stage, every reconcile planning the
/// same 2 actions: what the bootstrap-manifest sync and its step are, whose applies met a 409,
/// 429 or 500 a fifth of the time each. Since the retry it completed in every run here (the
/// whole operations suite, twice, once beside a release build); a failure prints the
/// controller's last lines (an action that did not happen names its reason).
#[test]
fn an_upgrade_completes_when_the_controllers_requests_meet_api_faults() {
    under_api_faults("api-faults-upgrade", true);
}

fn under_api_faults(name: &str, with_upgrade: bool) {
    let faults = [
        "--api-fault",
        "for=ichor-controller",
        // Issue 50's rates: a status write that meets them must still record every step.
        "--api-fault",
        "409=0.15",
        "--api-fault",
        "500=0.15",
        "--api-fault",
        "429=0.05",
        "--api-fault",
        "drop-watch=4s",
        "--api-fault",
        "latency=30ms",
    ];
    let started = std::time::Instant::now();
    // The same operations on a twin without faults: what the record must be.
    let clean = run_ops(&format!("{name}-clean"), &[], with_upgrade, &[]);
    let faulty = run_ops(name, &faults, with_upgrade, &clean);
    for ((op, want), (_, got)) in clean.iter().zip(&faulty) {
        let diff = similar::TextDiff::from_lines(want, got);
        assert_eq!(
            want,
            got,
            "{op} under API faults records what a fault-free run does not (issue 50, finding 10):\n{}",
            diff.unified_diff().header("fault-free", "under API faults")
        );
    }
    for (_, r) in &clean {
        eprint!("{r}");
    }
    eprintln!(
        "the switches, {}and a rollout recorded the same under API faults as without ({:?} for both runs)",
        if with_upgrade { "an upgrade " } else { "" },
        started.elapsed()
    );
}

/// The two Cilium operation kinds under the same API faults record what they record without
/// them (issue 50: every operation kind): an upgrade of Ichor's own Cilium from the previous
/// minor, and the adoption of someone else's.
#[test]
fn cilium_operations_record_the_same_under_api_faults() {
    let embedded = render::embedded::CILIUM_CHART_VERSION;
    let faults = [
        "--api-fault",
        "for=ichor-controller",
        "--api-fault",
        "409=0.15",
        "--api-fault",
        "500=0.15",
        "--api-fault",
        "429=0.05",
    ];
    let run = |name: &str, sim_args: &[&str], faults: &[&str], command: &[&str], op: &str| -> String {
        let mut args = vec!["--no-controller"];
        args.extend(sim_args);
        args.extend(faults);
        let sim = Sim::start_args(name, "disabled", &args);
        let controller = sim.controller();
        let (code, out, err) = sim.ichor(command);
        assert_eq!(code, 0, "{command:?}: {out}{err}");
        let start = std::time::Instant::now();
        while !matches!(sim.phase_of(op), Phase::Completed | Phase::Paused) && start.elapsed().as_secs() < 240 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        sim.wait_quiet();
        let record = record_of(&sim, op);
        let image = sim
            .kubectl(&[
                "get",
                "ds",
                "cilium",
                "-n",
                "kube-system",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image}",
            ])
            .unwrap()
            .1;
        sim.check_then_stop(controller, || assert_eq!(sim.phase_of(op), Phase::Completed, "{name}: {record}"));
        format!("{record}  cilium image {image}\n")
    };
    let upgrade = (&["--cilium-version", "1.19.6"][..], &["cni", "upgrade", "--cluster", "lab", "--yes"][..]);
    let upgrade_op = format!("cilium-upgrade-{}", embedded.replace('.', "-"));
    let adopt = (
        &["--cilium-installed-by", "manifests", "--cilium-version", "1.19.6"][..],
        &["adopt", "--cluster", "lab", "--yes"][..],
    );
    for (name, (sim_args, command), op) in
        [("cilium-upgrade-faults", upgrade, upgrade_op.as_str()), ("cilium-adopt-faults", adopt, "cilium-adopt")]
    {
        let clean = run(&format!("{name}-clean"), sim_args, &[], command, op);
        let faulty = run(name, sim_args, &faults, command, op);
        assert!(clean.contains(&format!("cilium image quay.io/cilium/cilium:v{embedded}")), "{clean}");
        assert_eq!(clean, faulty, "{op} under API faults records what a fault-free run does not");
    }
}

/// What an ended operation recorded, as text to compare between runs: its phase, each
/// machine's phase, stage and the boot its step started on, its done list, and each
/// TalosMachine's boot record (boot and config hash) and paths awaiting a reboot. The sim's
/// boot IDs count a node's boots, so two runs that rebooted alike record alike.
fn record_of(sim: &Sim, op: &str) -> String {
    // Under API faults a machine's status write may sit in its backoff when the cluster first
    // looks quiet: the record is taken once every TalosMachine has its boot recorded (60 s at
    // most; a machine whose Talos has no boot ID never gets one, and is recorded as it is).
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(60) {
        let (_, list, _) = sim.kubectl(&["get", "talosmachines", "-n", "ichor-system", "-o", "json"]).unwrap();
        let list: serde_json::Value = serde_json::from_str(&list).unwrap_or_default();
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if items.iter().all(|m| m.pointer("/status/boot/id").and_then(|i| i.as_str()).is_some_and(|i| !i.is_empty())) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let get = |what: &[&str]| -> serde_json::Value {
        let mut args = vec!["get"];
        args.extend(what);
        args.extend(["-n", "ichor-system", "-o", "json"]);
        serde_json::from_str(&sim.kubectl(&args).unwrap().1).unwrap_or_default()
    };
    let v = get(&["talosoperation", op]);
    let s = |v: &serde_json::Value, p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or("-").to_string();
    let mut out = format!("{op}: {}\n", s(&v, "/status/phase"));
    for (m, _) in v.pointer("/status/machines").and_then(|m| m.as_object()).into_iter().flatten() {
        let at = |f: &str| s(&v, &format!("/status/machines/{m}/{f}"));
        out += &format!("  machine {m}: {}/{} on boot {}\n", at("phase"), at("stage"), at("bootId"));
    }
    let mut done: Vec<String> = v
        .pointer("/status/done")
        .and_then(|d| d.as_array())
        .into_iter()
        .flatten()
        .filter_map(|d| d.as_str().map(str::to_string))
        .collect();
    done.sort();
    out += &format!("  done: {}\n", done.join(", "));
    let machines = get(&["talosmachines"]);
    for tm in machines["items"].as_array().into_iter().flatten() {
        let awaiting: Vec<&str> = tm
            .pointer("/status/appliedAwaitingReboot")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str())
            .collect();
        out += &format!(
            "  talosmachine {}: boot {} config {} reboot values {}, awaiting [{}]\n",
            s(tm, "/metadata/name"),
            s(tm, "/status/boot/id"),
            s(tm, "/status/boot/configHash"),
            tm.pointer("/status/boot/rebootValues").map(|r| r.to_string()).unwrap_or_default(),
            awaiting.join(", ")
        );
    }
    out
}

/// The switches (and the upgrade) then a config rollout, each to its end, on a sim of its own
/// with `faults` on the controller's requests: what each recorded (`record_of`). A run that
/// does not complete, or records a machine other than at its kind's last stage, fails naming
/// the controller's last lines.
/// With `expect` (a fault-free run's records), each record is read again for up to 60 s until
/// it says the same: a status write that met a fault is retried with backoff (up to 15 s) or at
/// the machine's next look, after the 3 quiet seconds `wait_quiet` waits for.
fn run_ops(name: &str, faults: &[&str], with_upgrade: bool, expect: &[(String, String)]) -> Vec<(String, String)> {
    let mut extra = vec!["--no-controller"];
    extra.extend(faults);
    let sim = Sim::start_args(name, "disabled", &extra);
    // The controller's log, to show with a failure (what it met, what it retried).
    let log_path = sim.dir.join("controller.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let controller = sim.replica_with("ichor-test", &[("ICHOR_LOG", "info")], Stdio::from(log));
    let rollout = (&["config", "apply", "--cluster", "lab", "--yes"][..], "config-rollout");
    let ops = SWITCHES_AND_UPGRADE.into_iter().filter(|(_, n)| with_upgrade || !n.starts_with("upgrade"));
    let mut records = vec![];
    for (args, name) in ops.chain([rollout]) {
        if name == "config-rollout" {
            apply_module_patch(&sim);
        }
        let (code, _, err) = sim.ichor(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let start = std::time::Instant::now();
        // A reconcile that meets a 500 or a 429 is retried after 0.5 s, doubling to 15 s while it
        // keeps failing (the error policy's backoff): 240 s each, on 2 busy cores.
        while !matches!(sim.phase_of(name), Phase::Completed | Phase::Paused) && start.elapsed().as_secs() < 240 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        // The machine controller's records settle after the operation ends.
        sim.wait_quiet();
        let mut record = record_of(&sim, name);
        if let Some((_, want)) = expect.iter().find(|(n, _)| n == name) {
            let start = std::time::Instant::now();
            while record != *want && start.elapsed().as_secs() < 60 {
                std::thread::sleep(std::time::Duration::from_millis(500));
                record = record_of(&sim, name);
            }
        }
        // Which machines get a step, as a fault-free run records them (the walk-through's
        // goldens): a switch changes the control planes' kube-proxy documents only.
        let (last_stage, stepped): (&str, &[&str]) = match name {
            "config-rollout" => ("reboot", &["cp1", "cp2", "cp3", "w1"]),
            n if n.starts_with("upgrade") => ("kubelets", &["cp1", "cp2", "cp3", "w1"]),
            _ => ("switch", &["cp1", "cp2", "cp3"]),
        };
        let want: Vec<String> = stepped
            .iter()
            .map(|m| format!("  machine {m}: {}/{last_stage} on boot ", MachinePhase::Done.name()))
            .collect();
        let recorded: Vec<&str> = record.lines().filter(|l| l.starts_with("  machine ")).collect();
        let complete = sim.phase_of(name) == Phase::Completed
            && recorded.len() == want.len()
            && recorded.iter().zip(&want).all(|(r, w)| r.starts_with(w.as_str()))
            // A rollout's step records the boot it started on.
            && (name != "config-rollout" || recorded.iter().all(|r| !r.ends_with(" -")));
        if !complete {
            let (_, status, _) = sim.ichor(&["status", "--cluster", "lab"]);
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
            // The controller is not left running after the test fails (it was, as an orphan).
            let _ = Command::new("kill").arg(controller.id().to_string()).status();
            panic!(
                "{name} with faults {faults:?}: recorded\n{record}a fault-free run records every machine of {stepped:?} Done at {last_stage}, on a boot\n{status}\nthe controller's last lines:\n{}",
                tail.join("\n")
            );
        }
        records.push((name.to_string(), record));
    }
    sim.wait_quiet();
    sim.check_then_stop(controller, || sim.assert_rolled_out_once("under API faults"));
    // The rollout rebooted each node once; the switches and the upgrade none.
    if with_upgrade {
        sim.assert_switched_twice_and_upgraded(None);
    } else {
        sim.assert_one_cilium_job_per_switch_and_per_hash();
    }
    records
}

/// Talos faults that start mid-step (the sim's `--node-fault MACHINE=FAULT,on=apply|reboot,for=`):
/// cp2 unavailable right after its apply, cp3 gone right after its apply, w1 hanging right after
/// its reboot, each for a few seconds. The rollout completes as without them: each node
/// rebooted once, uncordoned and Converged.
#[test]
fn a_config_rollout_completes_through_talos_faults_that_start_mid_step() {
    let sim = Sim::start_args(
        "talos-faults",
        "done",
        &[
            "--no-controller",
            "--node-fault",
            "cp2=unavailable,on=apply,for=4s",
            "--node-fault",
            "cp3=gone,on=apply,for=4s",
            "--node-fault",
            "w1=hang,on=reboot,for=6s",
        ],
    );
    let controller = sim.controller();
    apply_module_patch(&sim);
    let (code, _, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let start = std::time::Instant::now();
    while !matches!(sim.phase(), Phase::Completed | Phase::Paused) && start.elapsed().as_secs() < 150 {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let p = sim.phase();
    let (_, status, _) = sim.ichor(&["status", "--cluster", "lab"]);
    assert_eq!(p, Phase::Completed, "{status}");
    sim.wait_quiet();
    sim.check_then_stop(controller, || sim.assert_rolled_out_once("through Talos faults"));
    eprintln!("the rollout completed through Talos faults in {:?}", start.elapsed());
}

/// A node that never comes back from its reboot (`--node-fault w1=reboot-never`): the rollout
/// waits for it on its clock, and the status names the node and the limit; nothing else is
/// rebooted while it waits (past 20 minutes the step fails and the rollout pauses naming it: a
/// rules test, `rules/tests/rollout.yaml`).
#[test]
fn a_node_that_never_comes_back_from_its_reboot_is_named_in_the_wait() {
    let sim = Sim::start_args("reboot-never", "done", &["--no-controller", "--node-fault", "cp2=reboot-never"]);
    let controller = sim.controller();
    apply_module_patch(&sim);
    let (code, _, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let start = std::time::Instant::now();
    let waits = |s: &str| s.contains("waiting on machines/cp2") && s.contains("waiting for it to come back");
    while start.elapsed().as_secs() < 60 && !waits(&sim.ichor(&["status", "--cluster", "lab"]).1) {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // A few more reconciles: still waiting, nothing else started.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let status = sim.ichor(&["status", "--cluster", "lab"]).1;
    sim.stop(controller);
    assert!(waits(&status) && status.contains("limit 20 minutes"), "{status}");
    assert_eq!(sim.phase(), Phase::Running, "{status}");
    assert!(status.contains("cp1: Done") && status.contains("work left on: cp3, w1"), "{status}");
    let boots = sim.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.bootID}"]).unwrap().1;
    let boots: Vec<&str> = boots.split_whitespace().collect();
    // cp1 back on its second boot; cp2 away (its Node still reports its first); no other reboot.
    assert_eq!(boots.iter().filter(|b| b.ends_with("-boot-2")).count(), 1, "{boots:?}");
}

impl Sim {
    /// The end of a config rollout of `apply_module_patch`, as kubectl reads it: every node
    /// rebooted exactly once (its Node reports its second boot: a reboot-class change is never
    /// applied twice), none left cordoned, every TalosMachine Converged.
    fn assert_rolled_out_once(&self, context: &str) {
        // The machine controller looks again soon after a read that failed (a node that hung
        // answers a call only at its 15 s deadline): its statuses are read once settled.
        let path = "jsonpath={.items[*].status.conditions[0].reason}";
        let converged = "Converged Converged Converged Converged";
        let reasons = || self.kubectl(&["get", "talosmachines", "-n", "ichor-system", "-o", path]).unwrap().1;
        let start = std::time::Instant::now();
        while reasons() != converged && start.elapsed() < std::time::Duration::from_secs(45) {
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        if reasons() != converged {
            let each = "jsonpath={range .items[*]}{.metadata.name}: {.status.conditions[0].reason} \
                        {.status.rebootPaths} boot {.status.boot.id}{\"\\n\"}{end}";
            let machines = self.kubectl(&["get", "talosmachines", "-n", "ichor-system", "-o", each]).unwrap().1;
            let cols = "custom-columns=NODE:.metadata.name,BOOT:.status.nodeInfo.bootID,CORDONED:.spec.unschedulable";
            let nodes = self.kubectl(&["get", "nodes", "-o", cols]).unwrap().1;
            panic!("{context}: not every machine Converged:\n{machines}\n{nodes}");
        }
        let boots = self.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.bootID}"]).unwrap().1;
        let boots: Vec<&str> = boots.split_whitespace().collect();
        assert!(boots.len() == 4 && boots.iter().all(|b| b.ends_with("-boot-2")), "{context}: {boots:?}");
        let (_, out, _) = self.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].spec.unschedulable}"]).unwrap();
        assert_eq!(out.trim(), "", "{context}: a node left cordoned");
    }

    /// No Cilium Job ran twice for one purpose, however often a step was retried or the
    /// controller restarted: each switch ran at most one (its Jobs are labelled with it; a
    /// switch whose mode a values Job already brought runs none), the values reconciler at most
    /// one per hash of the layered values, one Job per mode and values in all; and Cilium ends
    /// in the last switch's mode (kube-proxy enabled: cilium-config's replacement false).
    fn assert_one_cilium_job_per_switch_and_per_hash(&self) {
        let path = r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.ichor\.maesh\.dev/values-hash} {.metadata.labels.ichor\.maesh\.dev/operation}{"\n"}{end}"#;
        let out = self.kubectl(&["get", "jobs", "-n", "kube-system", "-o", path]).unwrap().1;
        let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
        let mut switches: Vec<&str> = rows.iter().filter(|r| r.len() == 3).map(|r| r[2]).collect();
        let all = switches.len();
        switches.sort_unstable();
        switches.dedup();
        assert_eq!(switches.len(), all, "one Cilium Job per switch at most: {out}");
        let mut hashes: Vec<&str> = rows.iter().filter(|r| r.len() == 2).map(|r| r[1]).collect();
        let all = hashes.len();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), all, "one values Job per hash at most: {out}");
        assert!((2..=3).contains(&rows.len()), "a Job for each mode, and the values' at most once more: {out}");
        let path = "jsonpath={.data.kube-proxy-replacement}";
        let kpr = self.kubectl(&["get", "cm", "cilium-config", "-n", "kube-system", "-o", path]).unwrap().1;
        assert_eq!(kpr, "false", "Cilium ends in the last switch's mode: {out}");
    }

    /// The end of a kube-proxy switch both ways and an upgrade to v1.37.0: one Cilium Job per
    /// mode (named by their values' hash, however often the step was retried), every kubelet on
    /// the target, and, given the boot IDs before, no node rebooted.
    fn assert_switched_twice_and_upgraded(&self, boots_before: Option<&str>) {
        self.assert_one_cilium_job_per_switch_and_per_hash();
        if let Some(before) = boots_before {
            let path = "jsonpath={.items[*].status.nodeInfo.bootID}";
            let boots = self.kubectl(&["get", "nodes", "-o", path]).unwrap().1;
            assert_eq!(boots, before, "a node rebooted");
        }
        let path = "jsonpath={.items[*].status.nodeInfo.kubeletVersion}";
        let versions = self.kubectl(&["get", "nodes", "-o", path]).unwrap().1;
        let versions: Vec<&str> = versions.split_whitespace().collect();
        assert!(versions.len() == 4 && versions.iter().all(|v| *v == "v1.37.0"), "{versions:?}");
    }
}

/// `ichor cni values get|set|edit|diff` as typed against the simulated cluster, read back with
/// kubectl: a set writes only what the one validator accepts (a typo writes nothing, exit 2), a
/// removal removes, `diff` shows the Job's values with Ichor's keys marked, `edit` keeps a
/// refused edit in a file that `edit --file` takes up again, and a Git-tracked cluster gets the
/// YAML to commit with nothing written.
#[test]
fn cilium_values_get_set_edit_diff_as_typed() {
    let sim = Sim::start_args("values", "disabled", &["--no-controller"]);
    let values = || {
        let path = "jsonpath={.spec.cni.cilium.values}";
        sim.kubectl(&["get", "taloscluster", "lab", "-n", "ichor-system", "-o", path]).unwrap().1
    };
    let (code, out, err) = sim.ichor(&["cni", "values", "get", "--cluster", "lab"]);
    assert_eq!((code, out.as_str()), (0, "hubble:\n  relay:\n    enabled: true\n"), "the example's layer: {err}");
    golden("cni-values-get.stdout", &out);

    let label = r#"operator.nodeSelector["node-role.kubernetes.io/control-plane"]="#;
    let (code, out, err) = sim.ichor(&[
        "cni",
        "values",
        "set",
        "--cluster",
        "lab",
        "hubble.relay.enabled=true",
        label,
        "operator.replicas=1",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("+operator.replicas: 1\n") && out.contains("Written: TalosCluster ichor-system/lab"), "{out}");
    assert!(out.contains("kubeProxyReplacement: false  # owned by Ichor"), "Ichor's keys are marked: {out}");
    let want = r#"{"hubble":{"relay":{"enabled":true}},"operator":{"nodeSelector":{"node-role.kubernetes.io/control-plane":""},"replicas":1}}"#;
    assert_eq!(values(), want);
    let (_, json, _) = sim.ichor(&["cni", "values", "get", "--cluster", "lab", "-o", "json"]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&json).unwrap(),
        serde_json::from_str::<serde_json::Value>(want).unwrap()
    );

    // Typos and Ichor's keys: every refusal named, exit 1, nothing written.
    let (code, out, err) =
        sim.ichor(&["cni", "values", "set", "--cluster", "lab", "operator.replicsa=2", "kubeProxyReplacement=true"]);
    assert_eq!(code, 2, "a refusal is bad input (issue 28): {out}{err}");
    assert!(err.contains("spec.cni.cilium.values.operator.replicsa: not a key"), "{err}");
    assert!(err.contains("spec.cni.cilium.values.kubeProxyReplacement: owned by Ichor"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(values(), want, "a refusal writes nothing");
    golden("cni-values-set-refused.stderr", &err);
    // A pinned key, even at Ichor's own value, and a layer over the size cap.
    let (code, _, err) =
        sim.ichor(&["cni", "values", "set", "--cluster", "lab", "tls.secretsNamespace.name=cilium-secrets"]);
    assert_eq!(code, 2, "{err}");
    golden("cni-values-set-pinned.stderr", &err);
    let big = format!("extraConfig.big={}", "x".repeat(70_000));
    let (code, _, err) = sim.ichor(&["cni", "values", "set", "--cluster", "lab", &big]);
    assert_eq!(code, 2, "{err}");
    assert!(err.len() < 400, "the value is not echoed back");
    assert!(err.contains("over the 65536-byte limit") && err.contains("nothing was written"), "{err}");
    assert_eq!(values(), want, "a refusal writes nothing");
    let (code, _, err) = sim.ichor(&["cni", "values", "set", "--cluster", "lab", "hubble.relay.enabled.x=1"]);
    assert_eq!(code, 2);
    assert!(err.contains("hubble.relay.enabled is boolean, not a mapping"), "{err}");

    // diff changes nothing; a removal removes the mapping it empties.
    let (code, out, _) = sim.ichor(&["cni", "values", "diff", "--cluster", "lab", "operator-"]);
    assert_eq!(code, 0);
    assert!(out.contains("-operator.replicas: 1\n") && !out.contains("Written"), "{out}");
    golden("cni-values-diff.stdout", &out);
    assert_eq!(values(), want);
    let (code, _, err) = sim.ichor(&["cni", "values", "set", "--cluster", "lab", "operator-"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(values(), r#"{"hubble":{"relay":{"enabled":true}}}"#);

    // edit: a refused edit is kept; edit --file takes it up again.
    let scripts = sim.dir.join("editors");
    std::fs::create_dir_all(&scripts).unwrap();
    let typo = scripts.join("typo.sh");
    std::fs::write(&typo, "#!/bin/sh\nprintf 'hubble:\\n  ui:\\n    enabeld: true\\n' > \"$1\"\n").unwrap();
    let broken = scripts.join("broken.sh");
    std::fs::write(&broken, "#!/bin/sh\nprintf 'hubble: [\\n' > \"$1\"\n").unwrap();
    let fix = scripts.join("fix.sh");
    std::fs::write(&fix, "#!/bin/sh\nsed -i 's/enabeld/enabled/' \"$1\"\n").unwrap();
    for f in [&typo, &broken, &fix] {
        std::process::Command::new("chmod").arg("+x").arg(f).status().unwrap();
    }
    // An edit that does not parse: kept, its path named, exit 2, nothing written.
    let (code, _, err) = sim.ichor_env(
        &["cni", "values", "edit", "--cluster", "lab"],
        &[("EDITOR", broken.to_str().unwrap()), ("VISUAL", "")],
    );
    assert_eq!(code, 2, "{err}");
    let kept = err.split("your edit is kept in ").nth(1).and_then(|s| s.split([':', ' ']).next()).unwrap();
    assert!(std::fs::read_to_string(kept).unwrap().contains("hubble: ["), "the edit is kept: {err}");
    assert_eq!(values(), r#"{"hubble":{"relay":{"enabled":true}}}"#);
    let (code, _, err) = sim.ichor_env(
        &["cni", "values", "edit", "--cluster", "lab"],
        &[("EDITOR", typo.to_str().unwrap()), ("VISUAL", "")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("hubble.ui.enabeld: not a key"), "{err}");
    let kept = err.split("your edit is kept in ").nth(1).and_then(|s| s.split(':').next()).unwrap().to_string();
    assert!(std::fs::read_to_string(&kept).unwrap().contains("enabeld"), "the typed edit is kept in {kept}");
    assert_eq!(values(), r#"{"hubble":{"relay":{"enabled":true}}}"#);
    let (code, _, err) = sim.ichor_env(
        &["cni", "values", "edit", "--cluster", "lab", "--file", &kept],
        &[("EDITOR", fix.to_str().unwrap()), ("VISUAL", "")],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(values(), r#"{"hubble":{"ui":{"enabled":true}}}"#, "the edit is the whole layer");
    assert!(std::fs::read_to_string(&kept).unwrap().contains("enabled: true"), "a file given is edited in place");

    // A Git-tracked cluster: the YAML to commit, nothing written.
    sim.kubectl(&[
        "annotate",
        "tc",
        "lab",
        "-n",
        "ichor-system",
        "argocd.argoproj.io/tracking-id=lab:ichor.maesh.dev/TalosCluster:ichor-system/lab",
    ])
    .unwrap();
    let (code, out, _) = sim.ichor(&["cni", "values", "set", "--cluster", "lab", "hubble.relay.enabled=true"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("tracked by Argo CD: commit this change to Git")
            && out.contains("      values:\n        hubble:\n"),
        "{out}"
    );
    assert_eq!(values(), r#"{"hubble":{"ui":{"enabled":true}}}"#);
}

/// Issue 28, item 2 (the CNI page: "A refusal starts no Job and shows as
/// CNIValuesApplied=False"; ADR 0066 amendment 4), as kubectl reads it from the simulated
/// cluster with its controller: the layer is applied by one Job named by the hash of the
/// layered values, recorded as appliedValuesHash, CNIValuesApplied True once the agents rolled
/// out; a changed layer is one more Job; a refused layer starts none and the condition carries
/// the validator's words; a failing Job gives Helm's words and is not run again until it is
/// deleted (or the values change).
#[test]
fn cilium_values_are_applied_by_one_job_per_hash_and_a_refusal_or_a_failed_job_says_why() {
    let sim = Sim::start_with("values-applied", "disabled");
    let get = |path: &str| {
        sim.kubectl(&["get", "taloscluster", "lab", "-n", "ichor-system", "-o", &format!("jsonpath={path}")]).unwrap().1
    };
    let condition = || {
        let c = r#"{.status.conditions[?(@.type=="CNIValuesApplied")]"#;
        get(&format!("{c}.status}}/{c}.reason}}: {c}.message}}"))
    };
    let applied = || get("{.status.cni.appliedValuesHash}");
    let jobs = || {
        let path = "jsonpath={.items[*].metadata.name}";
        let out = sim.kubectl(&["get", "jobs", "-n", "kube-system", "-o", path]).unwrap().1;
        let mut names: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        names.sort();
        names
    };
    let wait = |what: &str, done: &dyn Fn(&str) -> bool| {
        let start = std::time::Instant::now();
        loop {
            let c = condition();
            if done(&c) {
                return c;
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(60), "{what}: CNIValuesApplied is {c:?}");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let set_values = |values: &str| {
        let patch = format!(r#"[{{"op":"replace","path":"/spec/cni/cilium/values","value":{values}}}]"#);
        let (code, _, err) =
            sim.kubectl(&["patch", "tc", "lab", "-n", "ichor-system", "--type", "json", "-p", &patch]).unwrap();
        assert_eq!(code, 0, "{err}");
    };

    // The example's layer: one Job, named by the hash it records.
    let c = wait("the example's layer", &|c| c.starts_with("True/"));
    let first = applied();
    assert!(c.starts_with(&format!("True/Applied: the layered values {first} run (kube-proxy enabled)")), "{c}");
    assert_eq!(jobs(), vec![format!("ichor-cni-{first}")]);

    // A changed layer, as an operator sets it: one more Job, of the new hash.
    let (code, out, err) = sim.ichor(&["cni", "values", "set", "--cluster", "lab", "hubble.ui.enabled=true"]);
    assert_eq!(code, 0, "{out}{err}");
    wait("the changed layer", &|c| c.starts_with("True/") && applied() != first);
    let second = applied();
    let mut want = vec![format!("ichor-cni-{first}"), format!("ichor-cni-{second}")];
    want.sort();
    assert_eq!(jobs(), want, "one Job per hash");

    // A refused layer written past the CLI: the webhook refuses it at admission, as on a real
    // cluster (every refusal named); nothing is written, no Job.
    let patch = r#"[{"op":"replace","path":"/spec/cni/cilium/values","value":{"hubbel":{"enabled":true},"tls":{"secretsNamespace":{"name":"ichor-system"}}}}]"#;
    let (code, _, err) =
        sim.kubectl(&["patch", "tc", "lab", "-n", "ichor-system", "--type", "json", "-p", patch]).unwrap();
    assert_ne!(code, 0, "a refused layer was admitted");
    assert!(
        err.contains("admission webhook \"validate.ichor.maesh.dev\" denied the request")
            && err.contains("hubbel")
            && err.contains("not a key")
            && err.contains("tls.secretsNamespace.name"),
        "every refusal: {err}"
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(jobs(), want, "a refusal starts no Job");
    assert_eq!(applied(), second, "nothing new is recorded");

    // A Job that fails: Helm's words, and it is not run again.
    let helm = "Error: UPGRADE FAILED: resource DaemonSet/cilium: context deadline exceeded";
    let fault = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ichor-sim-helm-fault\n  namespace: kube-system\ndata:\n  message: \"{helm}\"\n"
    );
    let out = kubectl_with_input(&sim, &["apply", "-f", "-"], &fault);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    set_values(r#"{"hubble":{"relay":{"enabled":false}}}"#);
    let c = wait("a failing Job", &|c| c.starts_with("False/JobFailed"));
    assert!(c.contains(helm), "Helm's words: {c}");
    let failed = jobs().into_iter().find(|j| !want.contains(j)).expect("the failed Job");
    assert!(c.contains(&format!("kube-system/{failed}")), "the Job named: {c}");
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(jobs().len(), 3, "a failed Job is not run again: {:?}", jobs());
    assert!(condition().starts_with("False/JobFailed"), "{}", condition());
    assert_eq!(applied(), second);

    // The cause fixed and the Job deleted, as the message says: it runs again and applies.
    sim.kubectl(&["delete", "configmap", "ichor-sim-helm-fault", "-n", "kube-system"]).unwrap();
    let (code, _, err) = sim.kubectl(&["delete", "job", &failed, "-n", "kube-system"]).unwrap();
    assert_eq!(code, 0, "{err}");
    wait("the Job run again", &|c| c.starts_with("True/"));
    assert_eq!(format!("ichor-cni-{}", applied()), failed);
}

/// Issue 28, item 3 (the CNI page: "Cilium moves only to the chart embedded in the running
/// Ichor, and only when you start a cni operation ... a recorded patch newer than the embedded
/// chart is never stepped back"): `ichor cni upgrade` as typed, against simulated clusters that
/// run another Cilium (`--cilium-version`), read back with kubectl. Refusals write nothing and
/// exit 1 naming both versions; the embedded chart already running is nothing to do; from the
/// previous minor one Job (in the mode Cilium runs now) moves the agents to the embedded chart,
/// the operation completes, and the values reconciler adopts that Job rather than run another.
#[test]
fn cni_upgrade_moves_cilium_to_the_embedded_chart_once_and_refuses_what_it_must_not() {
    let embedded = render::embedded::CILIUM_CHART_VERSION;
    let operations =
        |sim: &Sim| sim.kubectl(&["get", "talosoperations", "-n", "ichor-system", "-o", "name"]).unwrap().1;
    for (name, handover, version, golden_name, words) in [
        ("cni-upgrade-newer", "disabled", "1.20.3", "cni-upgrade-chart-newer.stderr", "1.20.3"),
        ("cni-upgrade-old", "disabled", "1.18.4", "cni-upgrade-too-old.stderr", "one minor at a time"),
        ("cni-upgrade-argo", "done", "1.19.6", "cni-upgrade-argo-cd-owns.stderr", "Argo CD owns Cilium"),
    ] {
        let sim = Sim::start_args(name, handover, &["--cilium-version", version]);
        let (code, out, err) = sim.ichor(&["cni", "upgrade", "--cluster", "lab", "--yes"]);
        assert_eq!(code, 1, "{name}: {out}{err}");
        assert!(err.contains(words) && err.contains(embedded) && err.contains("nothing was written"), "{name}: {err}");
        golden(golden_name, &err);
        assert_eq!(operations(&sim), "", "{name}: a refusal creates no TalosOperation");
    }

    // The embedded chart runs already: nothing to do.
    let sim = Sim::start_args("cni-upgrade-same", "disabled", &["--no-controller"]);
    let (code, out, _) = sim.ichor(&["cni", "upgrade", "--cluster", "lab", "--yes"]);
    assert_eq!((code, out.contains("Nothing to do") && out.contains(embedded)), (0, true), "{out}");
    drop(sim);

    // From the previous minor: the preview, then the operation.
    let sim = Sim::start_args("cni-upgrade", "disabled", &["--cilium-version", "1.19.6"]);
    let image = || {
        let path = "jsonpath={.spec.template.spec.containers[0].image}";
        sim.kubectl(&["get", "ds", "cilium", "-n", "kube-system", "-o", path]).unwrap().1
    };
    let (code, out, err) = sim.ichor(&["cni", "upgrade", "--cluster", "lab", "--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("from chart 1.19.6 to {embedded}")), "{out}");
    golden("cni-upgrade-dry-run.stdout", &out);
    assert_eq!(operations(&sim), "", "--dry-run creates nothing");
    let (code, out, err) = sim.ichor(&["cni", "upgrade", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{out}{err}");
    let phase = sim.wait_phase(&|p| p.is_terminal() || p == Phase::Paused);
    assert_eq!(phase, Phase::Completed, "{}", sim.ichor(&["status", "--cluster", "lab"]).1);
    assert_eq!(image(), format!("quay.io/cilium/cilium:v{embedded}"));
    let path = r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.ichor\.maesh\.dev/operation} {.spec.template.spec.containers[0].args[3]}{"\n"}{end}"#;
    let jobs = sim.kubectl(&["get", "jobs", "-n", "kube-system", "-o", path]).unwrap().1;
    let rows: Vec<&str> = jobs.lines().collect();
    assert_eq!(rows.len(), 1, "one Job: {jobs}");
    assert!(
        rows[0].ends_with(&format!("cilium-upgrade-{} --kube-proxy=enabled", embedded.replace('.', "-"))),
        "{jobs}"
    );
    // The values reconciler records the operation's Job (same values) and runs none of its own.
    assert_eq!(sim.wait_values_reason("Applied"), "Applied");
    assert_eq!(sim.kubectl(&["get", "jobs", "-n", "kube-system", "-o", "name"]).unwrap().1.lines().count(), 1);
    // Again: nothing to do.
    let (code, out, _) = sim.ichor(&["cni", "upgrade", "--cluster", "lab", "--yes"]);
    assert_eq!((code, out.contains("Nothing to do")), (0, true), "{out}");
}

/// Issue 28, item 4 (the CNI page: "A Cilium that someone else installed can be taken over by
/// ichor adopt, after checks on its minor version, its IPAM mode (kubernetes only) and its
/// health"): `ichor adopt` as typed against simulated clusters whose Cilium someone else
/// installed (`--cilium-installed-by`), read back with kubectl. Each refusal writes nothing and
/// exits 1 naming what it found; the success keeps what cilium-config says in the cluster's
/// layer, runs one Job that takes the objects into Ichor's release (Helm's ownership marks on
/// the DaemonSet), records the adoption on the TalosCluster, and the values reconciler then
/// takes the Job as its own.
#[test]
fn adopt_takes_over_someone_elses_cilium_after_its_checks_and_refuses_what_it_must_not() {
    let operations =
        |sim: &Sim| sim.kubectl(&["get", "talosoperations", "-n", "ichor-system", "-o", "name"]).unwrap().1;
    for (name, extra, golden_name, words) in [
        (
            "adopt-cluster-pool",
            &["--cilium-ipam", "cluster-pool"][..],
            "adopt-ipam-cluster-pool.stderr",
            "IPAM mode is cluster-pool",
        ),
        (
            "adopt-argocd",
            &["--cilium-installed-by", "argocd:networking"][..],
            "adopt-owned-elsewhere.stderr",
            "argocd networking",
        ),
        (
            "adopt-other-release",
            &["--cilium-installed-by", "helm:kube-system/my-cilium"][..],
            "",
            "helm kube-system/my-cilium",
        ),
        ("adopt-unhealthy", &["--cilium-unready", "1"][..], "adopt-unhealthy.stderr", "3 of 4 ready"),
        (
            "adopt-old",
            &["--cilium-version", "1.18.4"][..],
            "adopt-too-old.stderr",
            "1.18.4 is more than one minor behind",
        ),
        ("adopt-newer", &["--cilium-version", "1.20.3"][..], "", "never does"),
        ("adopt-ichors", &[][..], "adopt-already-ichors.stdout", "Cilium is Ichor's already"),
    ] {
        // Someone else's Cilium (kubectl apply) unless the case says who, or is Ichor's own.
        let mut args: Vec<&str> = vec!["--no-controller"];
        if name != "adopt-ichors" && !extra.contains(&"--cilium-installed-by") {
            args.extend(["--cilium-installed-by", "manifests"]);
        }
        args.extend(extra);
        let sim = Sim::start_args(name, "disabled", &args);
        let values = "jsonpath={.spec.cni.cilium}";
        let before = sim.kubectl(&["get", "tc", "lab", "-n", "ichor-system", "-o", values]).unwrap().1;
        let (code, out, err) = sim.ichor(&["adopt", "--cluster", "lab", "--yes"]);
        // Ichor's own Cilium is nothing to do (exit 0, on stdout), not a refusal to clear
        // (issue 50, finding 11); the others are refusals (exit 1).
        let (want, said) = if name == "adopt-ichors" { (0, &out) } else { (1, &err) };
        assert_eq!(code, want, "{name}: {out}{err}");
        assert!(said.contains(words) && said.contains("nothing was written"), "{name}: {said}");
        assert!(name != "adopt-ichors" || !said.contains("Clear what blocks it"), "{name}: {said}");
        if !golden_name.is_empty() {
            golden(golden_name, said);
        }
        assert_eq!(operations(&sim), "", "{name}: a refusal creates no TalosOperation");
        assert_eq!(sim.kubectl(&["get", "tc", "lab", "-n", "ichor-system", "-o", values]).unwrap().1, before, "{name}");
    }

    // Someone's kubectl-applied Cilium of the previous minor, routing natively.
    let sim =
        Sim::start_args("adopt", "disabled", &["--cilium-installed-by", "manifests", "--cilium-version", "1.19.6"]);
    let (code, _, err) = sim.kubectl(&["patch", "configmap", "cilium-config", "-n", "kube-system", "--type", "merge", "-p",
        r#"{"data":{"routing-mode":"native","ipv4-native-routing-cidr":"10.244.0.0/16","enable-hubble":"true","tunnel-protocol":"geneve","mtu":"jumbo"}}"#]).unwrap();
    assert_eq!(code, 0, "{err}");
    // Before the adoption the values reconciler runs no Job on it, and says why.
    assert_eq!(sim.wait_values_reason("NotAdopted"), "NotAdopted");
    assert_eq!(sim.kubectl(&["get", "jobs", "-n", "kube-system", "-o", "name"]).unwrap().1, "");
    let (code, out, err) = sim.ichor(&["adopt", "--cluster", "lab", "--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("routingMode: \"native\"")
            && out.contains("tunnelProtocol: geneve")
            && out.contains("IPAM mode kubernetes"),
        "{out}"
    );
    assert!(out.contains("Not kept: cilium-config mtu is \"jumbo\""), "{out}");
    golden("adopt-dry-run.stdout", &out);
    assert_eq!(operations(&sim), "", "--dry-run creates nothing");
    let (code, out, err) = sim.ichor(&["adopt", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{out}{err}");
    let phase = sim.wait_phase(&|p| p.is_terminal() || p == Phase::Paused);
    assert_eq!(phase, Phase::Completed, "{}", sim.ichor(&["status", "--cluster", "lab"]).1);
    // The kept values are the cluster's layer; the adoption is recorded.
    let get = |path: &str| {
        sim.kubectl(&["get", "tc", "lab", "-n", "ichor-system", "-o", &format!("jsonpath={{{path}}}")]).unwrap().1
    };
    assert_eq!(get(".spec.cni.cilium.values.routingMode"), "native");
    assert_eq!(get(".spec.cni.cilium.tunnelProtocol"), "geneve");
    assert_eq!(get(".status.cni.adoption.operation"), "cilium-adopt");
    // One Job, which took the objects over; the DaemonSet is in Ichor's release on the embedded chart.
    let path = r#"jsonpath={range .items[*]}{.metadata.name} {.spec.template.spec.containers[0].args}{"\n"}{end}"#;
    let jobs = sim.kubectl(&["get", "jobs", "-n", "kube-system", "-o", path]).unwrap().1;
    assert_eq!(jobs.lines().count(), 1, "{jobs}");
    assert!(jobs.contains("--take-ownership") && jobs.contains("--tunnel=geneve"), "{jobs}");
    let ds = |path: &str| {
        sim.kubectl(&["get", "ds", "cilium", "-n", "kube-system", "-o", &format!("jsonpath={{{path}}}")]).unwrap().1
    };
    assert_eq!(ds(r#".metadata.annotations.meta\.helm\.sh/release-name"#), "cilium");
    assert_eq!(
        ds(".spec.template.spec.containers[0].image"),
        format!("quay.io/cilium/cilium:v{}", render::embedded::CILIUM_CHART_VERSION)
    );
    // The values reconciler takes that Job as its own: Applied, and no second Job.
    assert_eq!(sim.wait_values_reason("Applied"), "Applied");
    assert_eq!(sim.kubectl(&["get", "jobs", "-n", "kube-system", "-o", "name"]).unwrap().1.lines().count(), 1);
    // Again: Ichor's already, nothing to do.
    let (code, out, err) = sim.ichor(&["adopt", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Nothing to do") && out.contains("TalosOperation cilium-adopt"), "{out}");
}

/// Issue 28, item 5 (the CNI page: "Ichor's own namespace is locked down with
/// CiliumNetworkPolicies once Cilium is ready"), as kubectl reads them from the simulated
/// cluster: the three policies, the webhook reached only by the API server, written once.
#[test]
fn ichors_namespace_is_locked_down_with_cilium_network_policies_once_cilium_is_ready() {
    let sim = Sim::start_with("lockdown", "disabled");
    let list = || {
        let path = "jsonpath={range .items[*]}{.metadata.name} {.metadata.resourceVersion}{\"\\n\"}{end}";
        sim.kubectl(&["get", "cnp", "-n", "ichor-system", "-o", path]).unwrap().1
    };
    let start = std::time::Instant::now();
    while list().lines().count() < 3 && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let first = list();
    let names: Vec<&str> = first.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(names, ["ichor-controller-ingress", "ichor-egress", "ichor-webhook-ingress"], "{first}");
    let path = "jsonpath={.spec.ingress[0].fromEntities}";
    let (_, from, _) = sim.kubectl(&["get", "cnp", "ichor-webhook-ingress", "-n", "ichor-system", "-o", path]).unwrap();
    assert_eq!(from, r#"["kube-apiserver","host"]"#);
    // A change elsewhere in the cluster wakes the reconcile again: the policies are not rewritten.
    let (code, _, err) =
        sim.kubectl(&["annotate", "tc", "lab", "-n", "ichor-system", "example.com/touched=yes"]).unwrap();
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(list(), first, "written once");
}

/// Issue 29: a cluster on Talos v1.14 still configured by legacy v1alpha1 patches (the v1.13
/// example's: the Cilium inline manifest, NTP servers) is migrated with `ichor config migrate
/// --manifests`; before the patches are applied, every node's diff against its new render
/// (read over Talos's API) holds only moves; applied with kubectl, every machine is Converged
/// again without a reboot or an operation, and no node differs from its render.
#[test]
fn migrated_patches_converge_every_machine_with_only_moves() {
    let manifests = std::env::temp_dir().join(format!("ichor-migrate-manifests-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&manifests);
    std::fs::create_dir_all(&manifests).unwrap();
    for f in ["cluster.yaml", "machines.yaml", "secrets.yaml"] {
        std::fs::copy(root().join("examples/clusters/lab-v1.14").join(f), manifests.join(f)).unwrap();
    }
    std::fs::copy(root().join("examples/clusters/lab-v1.13/patches.yaml"), manifests.join("patches.yaml")).unwrap();
    let sim = Sim::start_manifests("migrate", manifests.to_str().unwrap(), "disabled", &[]);
    let reasons = || sim.machine_reasons();
    // The first pass comes only once the sim's controller holds its Lease (a reconcile before
    // that looks again 5 s later), which can be after the first quiet 3 s: wait for a reason on
    // every machine first.
    let start = std::time::Instant::now();
    while reasons().split_whitespace().count() < 4 && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    sim.wait_quiet();
    assert_eq!(reasons(), "Converged Converged Converged Converged");
    let boots = || sim.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.bootID}"]).unwrap().1;
    let boots_before = boots();
    let legacy = std::fs::read_to_string(manifests.join("patches.yaml")).unwrap();

    let dir = manifests.to_str().unwrap();
    let (code, _, err) = sim.ichor(&["config", "migrate", "--manifests", dir]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("moved   machine.time.servers -> TimeSyncConfig.ntp.servers"), "{err}");
    let migrated = std::fs::read_to_string(manifests.join("patches.yaml")).unwrap();
    assert!(
        migrated.contains("kind: TimeSyncConfig") && migrated.contains("kind: KubeInlineManifestConfig"),
        "{migrated}"
    );
    assert!(migrated.starts_with(legacy.lines().next().unwrap()), "the file's comment is kept");
    let (code, _, err) = sim.ichor(&["config", "migrate", "--manifests", dir]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("Nothing to migrate"), "a second run has nothing to do: {err}");

    // Before applying: each node's running config against its new render, over Talos's API.
    let addresses = sim
        .kubectl(&[
            "get",
            "talosmachines",
            "-n",
            "ichor-system",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.spec.address} {end}",
        ])
        .unwrap()
        .1;
    let machines: Vec<(&str, &str)> = addresses.split_whitespace().filter_map(|p| p.split_once('=')).collect();
    let tc = sim.dir.join("talosconfig");
    // A node's running config, read over Talos's API, against the machine's migrated render.
    let node_diff = |machine: &str, address: &str| {
        let file = sim.dir.join(format!("{machine}.yaml"));
        let to = ["--talosconfig", tc.to_str().unwrap(), "--to", file.to_str().unwrap(), "-o", "json"];
        sim.ichor(&[&["config", "diff", "-n", address][..], &to[..]].concat())
    };
    for &(machine, _) in &machines {
        let (code, desired, err) = sim.ichor(&["render", "--manifests", dir, "--machine", machine]);
        assert_eq!(code, 0, "{err}");
        std::fs::write(sim.dir.join(format!("{machine}.yaml")), desired).unwrap();
    }
    for &(machine, address) in &machines {
        let (_, out, err) = node_diff(machine, address);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{machine}: {e}: {out}{err}"));
        let changes = v["changes"].as_array().unwrap();
        assert!(!changes.is_empty(), "{machine}: the migration changes its render");
        for ch in changes {
            assert_eq!(ch["effect"], "moved", "{machine}: {ch}");
            assert_eq!(ch["class"], "safe", "{machine}: {ch}");
        }
        assert_eq!(v["verdict"], "LiveApply", "{machine}");
    }

    let (code, _, err) = sim.kubectl(&["apply", "-f", manifests.join("patches.yaml").to_str().unwrap()]).unwrap();
    assert_eq!(code, 0, "{err}");
    sim.wait_quiet();
    assert_eq!(reasons(), "Converged Converged Converged Converged");
    assert_eq!(boots(), boots_before, "no node rebooted");
    let (_, out, _) = sim.ichor(&["status", "--cluster", "lab"]);
    assert_eq!(out, "No TalosOperations in ichor-system.\n");
    assert_eq!(machines.len(), 4);
    for &(machine, address) in &machines {
        let (code, out, err) = node_diff(machine, address);
        assert_eq!(code, 0, "{machine}: the node holds its migrated render: {out}{err}");
    }
    let _ = std::fs::remove_dir_all(&manifests);
}

/// Issue 50, finding 1: a rollout whose drain of w1 meets a PodDisruptionBudget that lets no
/// pod go pauses, leaves w1 uncordoned and on its boot (issue 52: its step held before the
/// cordon, on the drain deadline's clock); once the budget is gone, `ichor operation resume`
/// drains and reboots w1 and the rollout completes, every machine Converged.
#[test]
fn a_rollout_blocked_by_a_budget_resumes_drains_reboots_and_completes_once_the_budget_is_gone() {
    let sim = Sim::start_args("pdb-resume", "done", &["--no-controller"]);
    let controller = sim.controller();
    sim.check_then_stop(controller, || {
        sim.budget_keeping_web_on_w1();
        apply_module_patch(&sim);
        let boot = |n: &str| {
            sim.kubectl(&["get", "node", n, "-o", "jsonpath={.status.nodeInfo.bootID}"]).unwrap().1.trim().to_string()
        };
        // The preview checks the drain as the step will (issue 50, finding 7): it names the
        // budget and its pod, and a dry run with a refused drain exits 1.
        let (code, out, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--machines", "w1", "--dry-run"]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(
            out.contains("draining w1 would be refused now: PodDisruptionBudget default/web allows no disruption and selects default/web on it"),
            "{out}"
        );
        assert!(!out.contains("Nothing blocks it now"), "{out}");
        // The rollout of w1 alone (the control planes' reboots are other tests').
        let (code, _, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--machines", "w1", "--yes"]);
        assert_eq!(code, 0, "{err}");
        let w1_before = boot("w1");
        let p = sim.wait_phase(&|p| matches!(p, Phase::Paused | Phase::Completed));
        let (_, reason, _) = sim.ichor(&["status", "--cluster", "lab"]);
        assert_eq!(p, Phase::Paused, "the drain of w1 meets the budget: {reason}");
        assert!(reason.contains("w1"), "the pause names w1: {reason}");
        let start = std::time::Instant::now();
        let unschedulable = || {
            sim.kubectl(&["get", "node", "w1", "-o", "jsonpath={.spec.unschedulable}"]).unwrap().1.trim().to_string()
        };
        while unschedulable() == "true" && start.elapsed() < std::time::Duration::from_secs(15) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        assert_eq!(unschedulable(), "", "w1 is left cordoned while the rollout is paused");
        assert_eq!(boot("w1"), w1_before, "w1 was rebooted after its drain failed");
        // No Event claims an action that did not happen (issue 50, finding 4): the drain's
        // failure is recorded, no apply and no reboot of w1.
        let events = sim.kubectl(&["get", "events.events.k8s.io", "-n", "ichor-system", "-o", "json"]).unwrap().1;
        let events: serde_json::Value = serde_json::from_str(&events).unwrap();
        let of_w1: Vec<(String, String)> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e.pointer("/regarding/name").and_then(|n| n.as_str()) == Some("config-rollout"))
            .map(|e| {
                let f = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                (f("reason"), format!("{} {}", f("action"), f("note")))
            })
            .filter(|(_, text)| text.contains("w1"))
            .collect();
        // Issue 52: the budget is checked before the cordon, so w1's step never started:
        // nothing was cordoned, drained, applied or rebooted, and the pause names the budget.
        assert!(
            !of_w1.iter().any(|(reason, _)| reason.starts_with("Apply")
                || ["Reboot", "Cordon", "Drain", "Start"].contains(&reason.as_str())),
            "an Event claims a step of w1 while the budget refused its drain: {of_w1:?}"
        );
        assert!(
            reason.contains("default/web") && reason.contains("nothing was cordoned"),
            "the pause names the budget and says nothing was done: {reason}"
        );
        let (p, status) = sim.without_the_budget_resume("config-rollout");
        assert_eq!(p, Phase::Completed, "{status}");
        assert_ne!(boot("w1"), w1_before, "w1 was not rebooted after the resume: {status}");
        sim.wait_quiet();
        let reasons = sim.machine_reasons();
        assert_eq!(reasons.split_whitespace().last(), Some("Converged"), "w1 after its rollout: {reasons}");
    });
}

/// Issue 50, finding 2: SIGTERM to the Lease holder hands over to the standby within 5 s and
/// the process exits 0; finding 3: while the Kubernetes upgrade runs, no machine reads
/// RebootRequired for the component images it applies (each names the operation).
#[test]
fn sigterm_to_the_lease_holder_hands_over_at_once_and_no_machine_reads_reboot_required_during_an_upgrade() {
    let sim = Sim::start_args("sigterm", "done", &["--no-controller"]);
    let mut a = sim.replica_holding_the_lease_on("replica-a", &[("NODE_NAME", "cp1")]);
    let mut b = sim.replica("replica-b");
    sim.wait_quiet();
    // The preview states the order the acting replica will take: its own node last (issue 50,
    // finding 7), read from the node it wrote on the Lease.
    let (_, node, _) = sim
        .kubectl(&[
            "get",
            "lease",
            "ichor-controller",
            "-n",
            "ichor-system",
            "-o",
            "jsonpath={.metadata.annotations.ichor\\.maesh\\.dev/node}",
        ])
        .unwrap();
    assert_eq!(node.trim(), "cp1");
    let (code, out, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("in this order: cp2, cp3, cp1, w1."), "{out}");
    let (code, _, err) = sim.ichor(&["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(sim.wait_phase(&|p| p != Phase::Pending), Phase::Running);
    // The machines are judged again once the cluster's version moved: none says RebootRequired.
    let mut seen = std::collections::BTreeSet::new();
    let judged = std::time::Instant::now();
    while judged.elapsed() < std::time::Duration::from_secs(4) {
        for r in sim.machine_reasons().split_whitespace() {
            seen.insert(r.to_string());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(!seen.contains("RebootRequired"), "a machine read RebootRequired during the upgrade: {seen:?}");
    let term = std::process::Command::new("kill").args(["-TERM", &a.id().to_string()]).status().unwrap();
    assert!(term.success());
    let sent = std::time::Instant::now();
    while sim.lease_holder() != "replica-b" && sent.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let took = sent.elapsed();
    assert_eq!(sim.lease_holder(), "replica-b", "the standby did not take the Lease in {took:?}");
    // The holder lets its reconcile end (at most 20 s; a reconcile takes well under a second
    // here), then releases the Lease; the standby looks at it every second and takes it once
    // it is free: within 5 s of the SIGTERM, as issue 50 asks.
    let exited = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break s;
        }
        assert!(sent.elapsed() < std::time::Duration::from_secs(30), "the holder did not exit 30 s after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(exited.success(), "the holder exited with {exited} after SIGTERM");
    assert!(took < std::time::Duration::from_secs(5), "the standby took the Lease {took:?} after SIGTERM");
    let p = sim.wait_phase(&|p| matches!(p, Phase::Completed | Phase::Paused));
    let (_, status, _) = sim.ichor(&["status", "--cluster", "lab"]);
    b.kill().unwrap();
    b.wait().unwrap();
    assert_eq!(p, Phase::Completed, "{status}");
    // Each of cp1's four stages is its own Event (issue 50, finding 4: the series merged them
    // under the first stage's message).
    let events = sim.kubectl(&["get", "events.events.k8s.io", "-n", "ichor-system", "-o", "json"]).unwrap().1;
    let events: serde_json::Value = serde_json::from_str(&events).unwrap();
    let applies: std::collections::BTreeSet<String> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"].as_str().is_some_and(|r| r.starts_with("Apply")))
        .filter_map(|e| e["action"].as_str().map(str::to_string))
        .filter(|a| a.contains(" cp1 "))
        .collect();
    assert!(applies.len() >= 4, "cp1's stages are not four distinguishable Events: {applies:?}");
    eprintln!("the standby took the Lease {took:?} after the holder's SIGTERM");
}

/// Issue 50, finding 9: `ichor sim cluster` calls Ichor's webhook on the writes kube-apiserver
/// calls it on (the install's ValidatingWebhookConfiguration), so a rehearsal shows what a real
/// cluster refuses: a typo inside a patch's text, naming the patch, the field and the contract
/// (a server-side dry run too); a kube-proxy switch without its consent. The same patch
/// spelled right is admitted.
#[test]
fn the_simulated_cluster_admits_writes_through_ichors_webhook() {
    let sim = Sim::start_args("admission", "done", &["--no-controller"]);
    let patch = |field: &str| {
        format!(
            "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosConfigPatch\nmetadata:\n  name: team-label\n  namespace: ichor-system\nspec:\n  clusterRef:\n    name: lab\n  order: 50\n  patch: |\n    apiVersion: v1alpha1\n    kind: KubeNodeConfig\n    {field}:\n      team: storage\n"
        )
    };
    for args in [&["apply", "-f", "-"][..], &["apply", "--dry-run=server", "-f", "-"]] {
        let out = kubectl_with_input(&sim, args, &patch("labelz"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: a patch with an unknown field was admitted");
        assert!(
            err.contains("admission webhook \"validate.ichor.maesh.dev\" denied the request")
                && err.contains("TalosConfigPatch ichor-system/team-label")
                && err.contains("KubeNodeConfig.labelz")
                && err.contains("v1.14"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(sim.kubectl(&["get", "talosconfigpatch", "team-label", "-n", "ichor-system"]).unwrap().0, 1, "stored");
    let out = kubectl_with_input(&sim, &["apply", "-f", "-"], &patch("labels"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, _, err) = sim
        .kubectl(&[
            "patch",
            "taloscluster",
            "lab",
            "-n",
            "ichor-system",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"cni":{"kubeProxy":"replaced"}}}"#,
        ])
        .unwrap();
    assert_ne!(code, 0, "a switch without consent was admitted");
    assert!(err.contains("ichor.maesh.dev/confirm-kube-proxy-switch"), "{err}");
}

impl Sim {
    /// The Events regarding operation `op`, oldest first: (reason, action, note).
    fn events_of(&self, op: &str) -> Vec<(String, String, String)> {
        self.all_events().into_iter().filter(|e| e.0 == op).map(|(_, r, a, n)| (r, a, n)).collect()
    }

    /// A pod `default/web` on w1 and a PodDisruptionBudget that lets none of it go.
    fn budget_keeping_web_on_w1(&self) {
        let web = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\n  labels:\n    app: web\nspec:\n  nodeName: w1\n  containers:\n    - name: web\n      image: nginx\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: default\nspec:\n  maxUnavailable: 0\n  selector:\n    matchLabels:\n      app: web\n";
        let out = kubectl_with_input(self, &["apply", "-f", "-"], web);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// The budget of `budget_keeping_web_on_w1` deleted and the paused `operation` resumed:
    /// the phase it ends in (Paused or Completed) and `ichor status` then.
    fn without_the_budget_resume(&self, operation: &str) -> (Phase, String) {
        let (code, _, err) = self.kubectl(&["delete", "pdb", "web", "-n", "default"]).unwrap();
        assert_eq!(code, 0, "{err}");
        let (code, _, err) = self.ichor(&["operation", "resume", operation]);
        assert_eq!(code, 0, "{err}");
        let start = std::time::Instant::now();
        while self.phase() == Phase::Paused && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let p = self.wait_phase(&|p| matches!(p, Phase::Paused | Phase::Completed));
        (p, self.ichor(&["status", "--cluster", "lab"]).1)
    }

    /// Each Node's name, `osImage`, boot ID and whether it is cordoned, as kubectl reads them.
    fn nodes_os(&self) -> String {
        let cols = "custom-columns=NODE:.metadata.name,OS:.status.nodeInfo.osImage,BOOT:.status.nodeInfo.bootID,CORDONED:.spec.unschedulable";
        self.kubectl(&["get", "nodes", "-o", cols]).unwrap().1
    }

    /// Nothing was written by a refused start: no TalosOperation, the spec's Talos as it was.
    fn assert_nothing_written(&self, context: &str) {
        let (_, ops, _) = self.kubectl(&["get", "talosoperations", "-n", "ichor-system", "-o", "name"]).unwrap();
        assert_eq!(ops.trim(), "", "{context}: a TalosOperation was written");
        let path = "jsonpath={.spec.talosVersion}";
        let (_, v, _) = self.kubectl(&["get", "taloscluster", "lab", "-n", "ichor-system", "-o", path]).unwrap();
        assert_eq!(v.trim(), "v1.14.3", "{context}: spec.talosVersion changed");
    }
}

/// Issue 52: `ichor upgrade talos` through the controller as its own process (its replica says it
/// runs on cp1): the preview names the order, control planes one at a time before the worker and
/// the controller's node last; it completes with every node on the target, rebooted exactly once,
/// cordoned before its upgrade and uncordoned after, every TalosMachine Converged; the same
/// command again is nothing to do.
#[test]
fn a_talos_upgrade_completes_one_node_at_a_time_with_the_controllers_node_last() {
    let sim = Sim::start_args("talos-upgrade", "done", &["--no-controller"]);
    let controller = sim.replica_holding_the_lease_on("ichor-test", &[("NODE_NAME", "cp1")]);
    sim.check_then_stop(controller, || {
        let (code, out, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--dry-run"]);
        assert_eq!(code, 0, "{err}");
        golden("upgrade-talos-dry-run.stdout", &out);
        assert!(out.contains("in this order: cp2, cp3, cp1, w1."), "{out}");
        let (code, out, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("Created TalosOperation ichor-system/upgrade-talos-1-14-6"), "{out}");
        let (code, out, err) = sim.ichor(&["status", "--cluster", "lab", "--watch"]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.starts_with("upgrade-talos-1-14-6 (talos v1.14.6) on lab: Completed"), "{out}");
        sim.wait_quiet();
        let nodes = sim.nodes_os();
        for n in ["cp1", "cp2", "cp3", "w1"] {
            let line = nodes.lines().find(|l| l.starts_with(n)).unwrap_or_default();
            assert!(
                line.contains("Talos (v1.14.6)") && line.contains("-boot-2") && line.trim_end().ends_with("<none>"),
                "{n} is not on v1.14.6 after exactly one reboot, uncordoned:\n{nodes}"
            );
        }
        let reasons = sim.machine_reasons();
        assert_eq!(reasons, "Converged Converged Converged Converged", "the new Talos is no drift");
        // The order, from the operation's Events: each machine started, cordoned, installed and
        // rebooted, then done and uncordoned, before the next one starts.
        let events = sim.events_of("upgrade-talos-1-14-6");
        let at = |pred: &dyn Fn(&str, &str) -> bool| events.iter().position(|(r, _, note)| pred(r, note));
        let mut last_done = None;
        for m in ["cp2", "cp3", "cp1", "w1"] {
            let mine = |word: &'static str| {
                let m = m.to_string();
                // The Event's reason is the action's kind, capitalized.
                move |r: &str, note: &str| {
                    r.eq_ignore_ascii_case(word) && note.split(|c: char| !c.is_alphanumeric()).any(|w| w == m)
                }
            };
            let steps: Vec<Option<usize>> = ["start", "cordon", "drain", "upgradeTalos", "reboot", "done", "uncordon"]
                .iter()
                .map(|w| at(&mine(w)))
                .collect();
            assert!(steps.iter().all(Option::is_some), "{m}: an action has no Event: {steps:?}\n{events:#?}");
            let steps: Vec<usize> = steps.into_iter().flatten().collect();
            assert!(steps.windows(2).all(|w| w[0] < w[1]), "{m}: out of order {steps:?}\n{events:#?}");
            if let Some(d) = last_done {
                assert!(steps[0] > d, "{m} started before the machine before it was done\n{events:#?}");
            }
            last_done = Some(steps[5]);
        }
        let (code, out, _) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6"]);
        assert_eq!(code, 0);
        golden("upgrade-talos-nothing-to-do.stdout", &out);
        let (_, v, _) = sim
            .kubectl(&["get", "taloscluster", "lab", "-n", "ichor-system", "-o", "jsonpath={.spec.talosVersion}"])
            .unwrap();
        assert_eq!(v.trim(), "v1.14.6");
    });
}

/// Issue 52's bad input: each refusal exits 1 (a version, or the cluster, that cannot be read:
/// 2) naming the rule and the way forward, and writes nothing.
#[test]
fn a_talos_upgrade_is_refused_before_anything_is_written() {
    let sim = Sim::start_args("talos-refusals", "done", &["--no-controller"]);
    let up = |extra: &[&str]| {
        let mut args = vec!["upgrade", "talos", "--cluster", "lab", "--yes"];
        args.extend_from_slice(extra);
        sim.ichor(&args)
    };
    let (code, _, err) = up(&["--to", "1.14"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--to \"1.14\": a Talos version is vX.Y.Z"), "{err}");
    let (code, _, err) = sim.ichor(&["upgrade", "talos", "--cluster", "nope", "--to", "v1.14.6", "--yes"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("TalosCluster ichor-system/nope not found"), "{err}");
    for (name, extra) in [
        ("unknown-patch", &["--to", "v1.14.99"][..]),
        ("downgrade", &["--to", "v1.14.2"][..]),
        ("downgrade-too-far-and-kubernetes-too-new", &["--to", "v1.12.11", "--allow-downgrade"][..]),
    ] {
        let (code, out, err) = up(extra);
        assert_eq!(code, 1, "{name}: {out}{err}");
        golden(&format!("upgrade-talos-refused-{name}.stderr"), &err);
        sim.assert_nothing_written(name);
    }
    drop(sim);
    // A node whose Talos does not answer is not Ready: refused, naming it, with its version as
    // its Node reports it (not the target the spec would say).
    let sim = Sim::start_args("talos-not-ready", "done", &["--no-controller", "--node-fault", "w1=unavailable"]);
    let (code, out, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes"]);
    assert_eq!(code, 1, "{out}{err}");
    golden("upgrade-talos-refused-node-not-ready.stderr", &err);
    sim.assert_nothing_written("node-not-ready");
}

/// Issue 52: a node whose new Talos fails to boot comes back on its old one (Talos's A/B
/// fallback, `--node-fault cp2=upgrade-fails`): the upgrade pauses naming it, nothing after it
/// starts, Ichor uncordons it; an abort ends it.
#[test]
fn a_node_that_boots_its_old_talos_pauses_the_upgrade_naming_it() {
    let sim = Sim::start_args("talos-fallback", "done", &["--no-controller", "--node-fault", "cp2=upgrade-fails"]);
    let controller = sim.controller();
    sim.check_then_stop(controller, || {
        let (code, _, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes"]);
        assert_eq!(code, 0, "{err}");
        let p = sim.wait_phase(&|p| matches!(p, Phase::Paused | Phase::Completed));
        let (_, status, _) = sim.ichor(&["status", "--cluster", "lab"]);
        assert_eq!(p, Phase::Paused, "{status}");
        assert!(
            status.contains("machine cp2 came back on a new boot reporting Talos (v1.14.3), not Talos v1.14.6")
                && status.contains("ichor operation resume upgrade-talos-1-14-6"),
            "{status}"
        );
        let start = std::time::Instant::now();
        let cordoned = || sim.nodes_os().lines().any(|l| l.starts_with("cp2") && l.contains("true"));
        while cordoned() && start.elapsed() < std::time::Duration::from_secs(15) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let nodes = sim.nodes_os();
        assert!(!cordoned(), "cp2 is left cordoned:\n{nodes}");
        for (n, want) in [("cp1", "Talos (v1.14.6)"), ("cp2", "Talos (v1.14.3)"), ("cp3", "-boot-1"), ("w1", "-boot-1")]
        {
            assert!(nodes.lines().any(|l| l.starts_with(n) && l.contains(want)), "{n}: not {want}:\n{nodes}");
        }
        let (code, _, err) = sim.ichor(&["operation", "abort", "upgrade-talos-1-14-6"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(sim.wait_phase(&|p| p == Phase::Aborted), Phase::Aborted);
    });
}

/// Issue 52: a node that never comes back from its upgrade's reboot is waited for on its
/// clock, named; nothing else is upgraded meanwhile (past 20 minutes the step fails: a rules
/// test, rules/tests/talos-upgrade.yaml).
#[test]
fn a_node_that_never_comes_back_from_its_talos_upgrade_is_named_in_the_wait() {
    let sim = Sim::start_args("talos-never", "done", &["--no-controller", "--node-fault", "cp2=reboot-never"]);
    let controller = sim.controller();
    let (code, _, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let start = std::time::Instant::now();
    let waits = |s: &str| s.contains("waiting on machines/cp2") && s.contains("machine cp2 was upgraded and rebooted");
    while start.elapsed().as_secs() < 60 && !waits(&sim.ichor(&["status", "--cluster", "lab"]).1) {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    std::thread::sleep(std::time::Duration::from_secs(3));
    let status = sim.ichor(&["status", "--cluster", "lab"]).1;
    sim.stop(controller);
    assert!(waits(&status) && status.contains("limit 20 minutes"), "{status}");
    assert_eq!(sim.phase(), Phase::Running, "{status}");
    let nodes = sim.nodes_os();
    for (n, want) in [("cp1", "Talos (v1.14.6)"), ("cp3", "-boot-1"), ("w1", "-boot-1")] {
        assert!(nodes.lines().any(|l| l.starts_with(n) && l.contains(want)), "{n}: not {want}:\n{nodes}");
    }
}

/// Issue 52: a controller that ends itself right after an upgrade call or right after a reboot
/// (ICHOR_CRASH_AFTER), again and again: the upgrade completes, and no node is rebooted twice
/// (each is on its second boot, on the target).
#[test]
fn a_talos_upgrade_ends_the_same_with_its_controller_crashed_right_after_each_upgrade_and_reboot() {
    let sim = Sim::start_args("talos-crash", "done", &["--no-controller"]);
    let (code, _, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let crashes =
        sim.crash_after_writes(0x7a1, "talos-upgrade", "talos-reboot", &|| sim.phase_of("upgrade-talos-1-14-6"));
    let c = sim.controller();
    let p = sim.wait_phase(&|p| matches!(p, Phase::Completed | Phase::Paused));
    let (_, status, _) = sim.ichor(&["status", "--cluster", "lab"]);
    sim.stop(c);
    assert_eq!(p, Phase::Completed, "{status}\ncrashes: {crashes:?}");
    assert!(crashes.get("talos-upgrade").is_some_and(|n| *n >= 2), "crashes: {crashes:?}");
    assert!(crashes.get("talos-reboot").is_some_and(|n| *n >= 1), "crashes: {crashes:?}");
    let nodes = sim.nodes_os();
    let on_target = nodes.lines().skip(1).filter(|l| l.contains("Talos (v1.14.6)") && l.contains("-boot-2")).count();
    assert_eq!(on_target, 4, "every node on v1.14.6 after one reboot:\n{nodes}\ncrashes: {crashes:?}");
}

/// `--force-drain` is the consent to go past a budget: the preview says what the drain will
/// delete, the drain deletes the pod the budget keeps once its deadline passes, and the upgrade
/// completes; the budget itself is left as it was. An operation that drains nothing has no such
/// flag, and writes nothing.
#[test]
fn a_talos_upgrade_with_force_drain_deletes_what_a_budget_keeps_at_the_deadline_and_completes() {
    let sim = Sim::start_args("talos-force", "done", &["--no-controller"]);
    let controller = sim.controller();
    sim.check_then_stop(controller, || {
        let (code, _, err) =
            sim.ichor(&["cni", "kube-proxy", "replaced", "--cluster", "lab", "--force-drain", "--yes"]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("unexpected argument '--force-drain'"), "a switch drains no node: {err}");
        let (_, ops, _) = sim.kubectl(&["get", "talosoperations", "-A", "-o", "name"]).unwrap();
        assert_eq!(ops.trim(), "", "nothing was written");
        sim.budget_keeping_web_on_w1();
        let up = ["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--force-drain"];
        let (_, out, _) = sim.ichor(&[&up[..], &["--dry-run"]].concat());
        assert!(out.contains("as you consented (--force-drain), deletes what the budget still keeps"), "{out}");
        assert!(out.contains("force-drain"), "{out}");
        let (code, _, err) = sim.ichor(&[&up[..], &["--yes"]].concat());
        assert_eq!(code, 0, "{err}");
        let p = sim.wait_phase(&|p| matches!(p, Phase::Paused | Phase::Completed));
        let (_, status, _) = sim.ichor(&["status", "--cluster", "lab"]);
        assert_eq!(p, Phase::Completed, "{status}");
        assert!(sim.nodes_os().lines().skip(1).all(|l| l.contains("Talos (v1.14.6)")), "{}", sim.nodes_os());
        let (code, _, err) = sim.kubectl(&["get", "pod", "web", "-n", "default"]).unwrap();
        assert!(code != 0 && err.contains("NotFound"), "the pod the budget kept is deleted: {err}");
        let (code, _, err) = sim.kubectl(&["get", "pdb", "web", "-n", "default"]).unwrap();
        assert_eq!(code, 0, "the budget is left as it was: {err}");
        let events = sim.events_of("upgrade-talos-1-14-6");
        assert!(
            events.iter().any(|(r, _, note)| r == "Drain" && note.contains("w1") && note.contains("--force-drain")),
            "the drain's Event says it was forced: {events:#?}"
        );
    });
}

/// Issue 52, a drain that never strands a node: a budget that lets no pod of w1 go is named by
/// the preview (a dry run exits 1); the Talos upgrade's step on w1 fails at its drain, before
/// anything is installed: the operation pauses naming w1, w1 is uncordoned, still on its old
/// Talos and its first boot; once the budget is gone a resume completes it.
#[test]
fn a_talos_upgrade_blocked_by_a_budget_names_it_uncordons_and_installs_nothing() {
    let sim = Sim::start_args("talos-pdb", "done", &["--no-controller"]);
    let controller = sim.controller();
    sim.check_then_stop(controller, || {
        sim.budget_keeping_web_on_w1();
        let up = ["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6"];
        let (code, out, err) = sim.ichor(&[&up[..], &["--dry-run"]].concat());
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.contains("draining w1 would be refused now: PodDisruptionBudget default/web"), "{out}");
        let (code, _, err) = sim.ichor(&[&up[..], &["--yes"]].concat());
        assert_eq!(code, 0, "{err}");
        let p = sim.wait_phase(&|p| matches!(p, Phase::Paused | Phase::Completed));
        let (_, status, _) = sim.ichor(&["status", "--cluster", "lab"]);
        assert_eq!(p, Phase::Paused, "{status}");
        assert!(status.contains("w1") && status.contains("default/web"), "the pause names w1 and the budget: {status}");
        let start = std::time::Instant::now();
        let w1 = || sim.nodes_os().lines().find(|l| l.starts_with("w1")).unwrap_or_default().to_string();
        while w1().contains("true") && start.elapsed() < std::time::Duration::from_secs(15) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let line = w1();
        assert!(
            line.contains("Talos (v1.14.3)") && line.contains("-boot-1") && !line.contains("true"),
            "w1 after its failed drain: {line}"
        );
        let events = sim.events_of("upgrade-talos-1-14-6");
        let on_w1 = |reason: &str| {
            events
                .iter()
                .any(|(r, _, note)| r == reason && note.split(|c: char| !c.is_alphanumeric()).any(|w| w == "w1"))
        };
        assert!(
            !on_w1("UpgradeTalos") && !on_w1("Reboot") && !on_w1("Cordon"),
            "w1 cordoned, installed or rebooted while a budget refused its drain: {events:#?}"
        );
        let (p, status) = sim.without_the_budget_resume("upgrade-talos-1-14-6");
        assert_eq!(p, Phase::Completed, "{status}");
        assert!(w1().contains("Talos (v1.14.6)"), "{}", sim.nodes_os());
    });
}

impl Sim {
    /// Waits (`secs` at most) until `op`'s phase is one `done` accepts.
    fn wait_phase_of(&self, op: &str, secs: u64, done: &dyn Fn(Phase) -> bool) -> Phase {
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(secs) && !done(self.phase_of(op)) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        self.phase_of(op)
    }

    /// `kubectl patch` of TalosCluster lab's spec with a merge patch of `spec` (JSON).
    fn patch_cluster(&self, spec: &str) -> (i32, String, String) {
        let body = format!("{{\"spec\":{spec}}}");
        self.kubectl(&["patch", "taloscluster", "lab", "-n", "ichor-system", "--type", "merge", "-p", &body]).unwrap()
    }

    /// Every Event of ichor-system in the order they happened: (what it regards, reason, action,
    /// note).
    fn all_events(&self) -> Vec<(String, String, String, String)> {
        let events = self.kubectl(&["get", "events.events.k8s.io", "-n", "ichor-system", "-o", "json"]).unwrap().1;
        let events: serde_json::Value = serde_json::from_str(&events).unwrap();
        let mut out: Vec<(String, String, String, String, String)> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let f = |k: &str| e.pointer(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                (f("/eventTime"), f("/regarding/name"), f("/reason"), f("/action"), f("/note"))
            })
            .collect();
        out.sort();
        out.into_iter().map(|(_, o, r, a, n)| (o, r, a, n)).collect()
    }
}

/// Issue 53: `ichor upgrade cluster` through the controller as its own process, from a cluster
/// one Talos minor and two Kubernetes minors behind the release set (lab-v1.13 at Kubernetes
/// v1.35.9): the preview lists the path, Talos v1.14.6 then Kubernetes v1.36.4 then v1.37.0; the
/// controller ends itself right after it creates the second stage's operation (as a SIGKILL
/// would) and a new one resumes at that stage, creating no stage twice; every stage completes
/// in order, no kubelet moves before every node runs the Talos the next Kubernetes needs, and
/// the same command again is nothing to do.
#[test]
fn a_release_rollout_takes_talos_then_kubernetes_a_minor_at_a_time_and_resumes_after_a_kill() {
    let manifests = std::env::temp_dir().join(format!("ichor-release-manifests-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&manifests);
    std::fs::create_dir_all(&manifests).unwrap();
    for e in std::fs::read_dir(root().join("examples/clusters/lab-v1.13")).unwrap() {
        let p = e.unwrap().path();
        let text =
            std::fs::read_to_string(&p).unwrap().replace("kubernetesVersion: v1.36.4", "kubernetesVersion: v1.35.9");
        std::fs::write(manifests.join(p.file_name().unwrap()), text).unwrap();
    }
    let sim = Sim::start_manifests("release", manifests.to_str().unwrap(), "done", &["--no-controller"]);
    let release = "release-1-14-6-1-37-0";
    let stage = |s: &str| format!("{release}-{s}");
    // Armed to end itself right after its second stage create: the release stops between stages.
    let log = sim.dir.join("crash.log");
    let mut first = sim.replica_with(
        "ichor-test",
        &[("ICHOR_CRASH_AFTER", "stage-create:2")],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let start = std::time::Instant::now();
    while sim.lease_holder() != "ichor-test" && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (code, out, err) = sim.ichor(&["upgrade", "cluster", "--cluster", "lab", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    // The path, each stage with what it does per machine (from the versions the stages before
    // it leave), in order.
    let lines = [
        "  1. talos: v1.14.6\n     Upgrade Talos on cluster lab from v1.13.9 to v1.14.6: 4 machine(s)",
        "  2. kubernetes: v1.36.4\n     Upgrade Kubernetes on cluster lab from v1.35.9 to v1.36.4.",
        "  3. kubernetes: v1.37.0\n     Upgrade Kubernetes on cluster lab from v1.36.4 to v1.37.0.",
    ];
    let at: Vec<Option<usize>> = lines.iter().map(|l| out.find(l)).collect();
    assert!(at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]), "the path in the preview:\n{out}");
    assert!(out.contains("in this order: cp1, cp2, cp3, w1."), "{out}");
    let (code, out, err) = sim.ichor(&["upgrade", "cluster", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("Created TalosOperation ichor-system/{release}")), "{out}");
    // The first controller ends itself once the Kubernetes v1.36.4 stage exists.
    let start = std::time::Instant::now();
    let ended = loop {
        if let Some(status) = first.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(120), "the armed controller never ended");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("crash point: ending the process right after stage-create"), "{ended}:\n{text}");
    let (_, created, _) =
        sim.kubectl(&["get", "talosoperation", &stage("kubernetes-v1-36-4"), "-n", "ichor-system"]).unwrap();
    assert!(created.contains("kubernetes-v1-36-4"), "the second stage was created before the crash");
    // A new controller resumes: the stage already created is followed, not created again.
    let second = sim.replica("ichor-test-2");
    sim.check_then_stop(second, || {
        let phase = sim.wait_phase_of(release, 150, &|p| matches!(p, Phase::Completed | Phase::Paused));
        let (_, status, _) = sim.ichor(&["status", release]);
        assert_eq!(phase, Phase::Completed, "{status}");
        for (i, (s, target)) in [
            ("talos-v1-14-6", "talos v1.14.6"),
            ("kubernetes-v1-36-4", "kubernetes v1.36.4"),
            ("kubernetes-v1-37-0", "kubernetes v1.37.0"),
        ]
        .iter()
        .enumerate()
        {
            let line = format!("stage {}: {target}: Completed ({})", i + 1, stage(s));
            assert!(status.contains(&line), "{line} not in:\n{status}");
            assert_eq!(sim.phase_of(&stage(s)), Phase::Completed);
        }
        let (_, ops, _) = sim.kubectl(&["get", "talosoperations", "-n", "ichor-system", "-o", "name"]).unwrap();
        assert_eq!(ops.lines().count(), 4, "one release and three stages, none twice:\n{ops}");
        // In order: each stage's first step after the last step of the one before; no kubelet
        // step before every node's Talos step was verified.
        let events = sim.all_events();
        let first_of = |op: &str| events.iter().position(|(o, r, _, _)| o == op && r.eq_ignore_ascii_case("start"));
        let last_of = |op: &str| events.iter().rposition(|(o, r, _, _)| o == op && r.eq_ignore_ascii_case("done"));
        let (t_done, k1_start, k1_done, k2_start) = (
            last_of(&stage("talos-v1-14-6")),
            first_of(&stage("kubernetes-v1-36-4")),
            last_of(&stage("kubernetes-v1-36-4")),
            first_of(&stage("kubernetes-v1-37-0")),
        );
        assert!(
            t_done < k1_start && k1_done < k2_start && t_done.is_some() && k2_start.is_some(),
            "stages out of order ({t_done:?} {k1_start:?} {k1_done:?} {k2_start:?}):\n{events:#?}"
        );
        for n in ["cp1", "cp2", "cp3", "w1"] {
            let line = sim.nodes_os().lines().find(|l| l.starts_with(n)).unwrap_or_default().to_string();
            assert!(line.contains("Talos (v1.14.6)") && line.trim_end().ends_with("<none>"), "{n}: {line}");
        }
        let (_, v, _) = sim
            .kubectl(&[
                "get",
                "taloscluster",
                "lab",
                "-n",
                "ichor-system",
                "-o",
                "jsonpath={.spec.kubernetesVersion} {.spec.talosVersion}",
            ])
            .unwrap();
        assert_eq!(v.trim(), "v1.37.0 v1.14.6");
        let (code, out, _) = sim.ichor(&["upgrade", "cluster", "--cluster", "lab"]);
        assert_eq!(code, 0);
        assert!(out.starts_with("Nothing to do: cluster lab runs this Ichor's release set already"), "{out}");
    });
    let _ = std::fs::remove_dir_all(&manifests);
}

/// Issue 53: while a machine's step runs, the next machine to drain carries Ichor's
/// `PreferNoSchedule` taint (so the pods the drain evicts prefer other nodes); a machine loses
/// it when its own step starts, and once the operation completes no Node has it.
#[test]
fn the_next_machine_to_drain_carries_the_prefer_no_schedule_taint_a_step_ahead() {
    let sim = Sim::start_args("next-taint", "done", &["--step-latency-ms", "800"]);
    let (code, out, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes"]);
    assert_eq!(code, 0, "{out}{err}");
    let order = ["cp1", "cp2", "cp3", "w1"];
    let cols = "custom-columns=NODE:.metadata.name,TAINTS:.spec.taints[*].key,UNSCHEDULABLE:.spec.unschedulable";
    // (cordoned, tainted) as seen while it runs.
    let mut seen: Vec<(Vec<String>, Vec<String>)> = vec![];
    let start = std::time::Instant::now();
    while sim.phase_of("upgrade-talos-1-14-6") != Phase::Completed
        && start.elapsed() < std::time::Duration::from_secs(120)
    {
        let (_, table, _) = sim.kubectl(&["get", "nodes", "-o", cols]).unwrap();
        let (mut cordoned, mut tainted) = (vec![], vec![]);
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(2) == Some(&"true") {
                cordoned.push(f[0].to_string());
            }
            if f.get(1).is_some_and(|t| t.split(',').any(|k| k == render::api::NEXT_TAINT)) {
                tainted.push(f[0].to_string());
            }
        }
        seen.push((cordoned, tainted));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(sim.phase_of("upgrade-talos-1-14-6"), Phase::Completed);
    // While each of the first three machines was cordoned for its step, the next one was tainted.
    for w in order.windows(2) {
        assert!(
            seen.iter().any(|(c, t)| c == &[w[0].to_string()] && t == &[w[1].to_string()]),
            "never saw {} in its step with {} tainted: {seen:?}",
            w[0],
            w[1]
        );
    }
    // A machine in its step is never the tainted one.
    assert!(seen.iter().all(|(c, t)| c.iter().all(|m| !t.contains(m))), "{seen:?}");
    let start = std::time::Instant::now();
    let mut left = String::new();
    while start.elapsed() < std::time::Duration::from_secs(10) {
        left = sim.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].spec.taints[*].key}"]).unwrap().1;
        if !left.contains(render::api::NEXT_TAINT) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!left.contains(render::api::NEXT_TAINT), "a taint left after the operation: {left}");
}

/// Issue 53: outside every maintenance window nothing starts and `ichor status` says when the
/// next opens; a window admission refuses is refused with its field path; once a window is open
/// the operation runs to Completed.
#[test]
fn outside_every_maintenance_window_nothing_starts_and_status_says_when_the_next_opens() {
    let sim = Sim::start_args("windows", "done", &[]);
    let patch = |windows: &str| sim.patch_cluster(&format!("{{\"maintenanceWindows\":{windows}}}"));
    // Refused at admission, every problem with its field path.
    let (code, _, err) = patch(r#"[{"schedule":"0 25 * * *","durationMinutes":5,"timeZone":"Mars/Olympus"}]"#);
    assert_ne!(code, 0, "a window that does not read was admitted");
    for want in [
        "spec.maintenanceWindows[0].durationMinutes: 5 minutes is shorter",
        "spec.maintenanceWindows[0].schedule: \"0 25 * * *\" is not a cron schedule",
        "spec.maintenanceWindows[0].timeZone: \"Mars/Olympus\" is not an IANA time zone",
    ] {
        assert!(err.contains(want), "{want} not in: {err}");
    }
    // A daily hour-long window twelve hours from now: closed now.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let hour = (now / 3600 + 12) % 24;
    let day = now - now % 86_400;
    let next = if day + hour * 3600 > now { day + hour * 3600 } else { day + 86_400 + hour * 3600 };
    let (code, _, err) = patch(&format!(r#"[{{"schedule":"0 {hour} * * *","durationMinutes":60}}]"#));
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes"]);
    assert_eq!(code, 0, "{out}{err}");
    let op = "upgrade-talos-1-14-6";
    let at = runtime::plan::rfc3339(next);
    let start = std::time::Instant::now();
    let mut status = String::new();
    while start.elapsed() < std::time::Duration::from_secs(30) {
        status = sim.ichor(&["status", op]).1;
        if status.contains("waiting on MaintenanceWindow") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(status.contains(&format!("no machine's step starts before the next window opens at {at}")), "{status}");
    // Nothing started meanwhile: no machine has a step, no Node is cordoned.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (_, machines, _) =
        sim.kubectl(&["get", "talosoperation", op, "-n", "ichor-system", "-o", "jsonpath={.status.machines}"]).unwrap();
    assert!(matches!(machines.trim(), "" | "{}"), "a step started outside every window: {machines}");
    assert!(!sim.nodes_os().contains("true"), "a node was cordoned outside every window:\n{}", sim.nodes_os());
    // A window open now (every minute opens one for an hour): the upgrade runs and completes.
    let (code, _, err) = patch(r#"[{"schedule":"* * * * *","durationMinutes":60,"timeZone":"Europe/Berlin"}]"#);
    assert_eq!(code, 0, "{err}");
    let phase = sim.wait_phase_of(op, 120, &|p| matches!(p, Phase::Completed | Phase::Paused));
    assert_eq!(phase, Phase::Completed, "{}", sim.ichor(&["status", op]).1);
}

/// Issue 53's health checks: refused at admission when they cannot be evaluated; a failing one
/// holds the next machine's step and a verified step's done, then pauses naming the check, the
/// object and the expression's result; fixed and resumed, the upgrade completes.
#[test]
fn a_failing_health_check_holds_the_steps_then_pauses_naming_the_check_the_object_and_the_result() {
    let sim = Sim::start_args("health", "done", &["--step-latency-ms", "700"]);
    let checks = |checks: &str| sim.patch_cluster(&format!("{{\"healthChecks\":{checks}}}"));
    let gate = |healthy: &str| {
        let (code, _, err) = sim
            .kubectl(&[
                "patch",
                "configmap",
                "gate",
                "-n",
                "ichor-system",
                "-p",
                &format!(r#"{{"data":{{"healthy":"{healthy}"}}}}"#),
            ])
            .unwrap();
        assert_eq!(code, 0, "{err}");
    };
    let cm =
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gate, namespace: ichor-system}\ndata: {healthy: \"true\"}\n";
    let out = kubectl_with_input(&sim, &["apply", "-f", "-"], cm);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Refused at admission, every problem with its field path.
    let (code, _, err) = checks(
        r#"[{"name":"a","object":{"apiVersion":"v1","kind":"ConfigMap","namespace":"ichor-system"},"expression":"object.data.healthy =="},
            {"name":"b","object":{"apiVersion":"ceph.rook.io/v1","kind":"CephCluster","namespace":"rook-ceph","name":"c"},"expression":"1 + 1"}]"#,
    );
    assert_ne!(code, 0, "health checks that cannot be evaluated were admitted");
    for want in [
        "spec.healthChecks[0].expression: \"object.data.healthy ==\" does not compile: at 1:",
        "spec.healthChecks[0].object: name one object (`name`) or select some (`selector`)",
        "spec.healthChecks[1].expression: \"1 + 1\" is a number, not a boolean",
        "spec.healthChecks[1].object.kind: the API server serves no kind CephCluster in ceph.rook.io/v1",
    ] {
        assert!(err.contains(want), "{want} not in: {err}");
    }
    let storage = r#"[{"name":"storage","object":{"apiVersion":"v1","kind":"ConfigMap","namespace":"ichor-system","name":"gate"},"expression":"object.data.healthy == \"true\"","timeoutSeconds":5}]"#;
    let (code, _, err) = checks(storage);
    assert_eq!(code, 0, "{err}");
    // The preview lists the check as passing.
    let (code, out, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("health check storage: ConfigMap ichor-system/gate passes"), "{out}");
    let (code, out, err) = sim.ichor(&["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes"]);
    assert_eq!(code, 0, "{out}{err}");
    let op = "upgrade-talos-1-14-6";
    // The first machine's step runs: the check now fails.
    let machines = || {
        let (_, m, _) = sim
            .kubectl(&["get", "talosoperation", op, "-n", "ichor-system", "-o", "jsonpath={.status.machines}"])
            .unwrap();
        serde_json::from_str::<serde_json::Value>(m.trim()).unwrap_or_default()
    };
    let start = std::time::Instant::now();
    let first = loop {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "no step started: {}",
            sim.ichor(&["status", op]).1
        );
        if let Some((name, _)) =
            machines().as_object().and_then(|m| m.iter().next().map(|(k, v)| (k.clone(), v.clone())))
        {
            break name;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    gate("false");
    let phase = sim.wait_phase_of(op, 120, &|p| matches!(p, Phase::Completed | Phase::Paused));
    let (_, status, _) = sim.ichor(&["status", op]);
    assert_eq!(phase, Phase::Paused, "{status}");
    let (_, reason, _) = sim
        .kubectl(&["get", "talosoperation", op, "-n", "ichor-system", "-o", "jsonpath={.status.pausedReason}"])
        .unwrap();
    assert!(
        reason.contains(
            "health check storage of cluster lab kept failing past its timeout: ConfigMap ichor-system/gate is false"
        ),
        "{reason}"
    );
    // Only the first machine has a step, and it did not count as done; no other was touched.
    let m = machines();
    assert_eq!(m.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()), Some(vec![first.clone()]), "{m}");
    assert!(!m[&first]["phase"].as_str().unwrap_or_default().eq_ignore_ascii_case(Phase::Completed.name()), "{m}");
    // Fixed and resumed: the upgrade completes.
    gate("true");
    let (code, out, err) = sim.ichor(&["operation", "resume", op]);
    assert_eq!(code, 0, "{out}{err}");
    let phase = sim.wait_phase_of(op, 180, &|p| matches!(p, Phase::Completed | Phase::Paused));
    assert_eq!(phase, Phase::Completed, "{}", sim.ichor(&["status", op]).1);
}

/// Every metric name a PromQL expression reads (its vector and matrix selectors).
fn promql_metrics(e: &promql_parser::parser::Expr, out: &mut Vec<String>) {
    use promql_parser::parser::Expr;
    match e {
        Expr::VectorSelector(v) => out.extend(v.name.clone()),
        Expr::MatrixSelector(m) => out.extend(m.vs.name.clone()),
        Expr::Aggregate(a) => {
            promql_metrics(&a.expr, out);
            if let Some(p) = &a.param {
                promql_metrics(p, out);
            }
        }
        Expr::Unary(u) => promql_metrics(&u.expr, out),
        Expr::Binary(b) => {
            promql_metrics(&b.lhs, out);
            promql_metrics(&b.rhs, out);
        }
        Expr::Paren(p) => promql_metrics(&p.expr, out),
        Expr::Subquery(s) => promql_metrics(&s.expr, out),
        Expr::Call(c) => c.args.args.iter().for_each(|a| promql_metrics(a, out)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// The names a Prometheus text exposition serves: every sample's, and each family's (`# TYPE`)
/// with the suffixes its type adds (a counter's `_total`, a histogram's `_bucket`, `_sum`,
/// `_count`).
fn exposition_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else { continue };
            names.insert(name.to_string());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if line.starts_with("ichor_") {
            names.insert(line.split(['{', ' ']).next().unwrap_or_default().to_string());
        }
    }
    names
}

/// Issue 53's signals: `ichor install --monitoring` adds a metrics Service, a ServiceMonitor, a
/// PrometheusRule and a Grafana dashboard; each is its type's shape, every alert's and panel's
/// expression parses as PromQL, and every metric they read is one a running controller serves
/// (scraped through an upgrade a health check holds at first: a gauge has series only while
/// something is in its state).
#[test]
fn the_monitoring_manifests_read_only_metrics_a_running_controller_exports() {
    let out = Command::new(env!("CARGO_BIN_EXE_ichor")).args(["install", "--monitoring"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_json::Value| !v.is_null())
        .collect();
    let named = |name: &str| docs.iter().find(|d| d["metadata"]["name"] == name).cloned().unwrap_or_default();
    // The Service selects the controller's pods on the port the Deployment names.
    let service = named("ichor-controller-metrics");
    let typed: k8s_openapi::api::core::v1::Service = serde_json::from_value(service.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), service, "the Service drops a field");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");
    assert!(text.contains("- name: http\n              containerPort: 8080"), "the controller's port is named http");
    let monitor = docs.iter().find(|d| d["kind"] == "ServiceMonitor").cloned().expect("a ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(monitor["spec"]["selector"]["matchLabels"], service["spec"]["selector"]);
    let rule = docs.iter().find(|d| d["kind"] == "PrometheusRule").cloned().expect("a PrometheusRule");
    // The ServiceMonitor and the PrometheusRule decoded strictly into the Prometheus Operator's
    // own API types (tests/kube/cmd/monitoring-check): no unknown field, no value of a wrong type.
    let check = runtime::sim::kubebin::bin("monitoring-check").unwrap_or_else(|e| panic!("monitoring-check: {e}"));
    let mut child =
        Command::new(check).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let checked = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    assert!(
        said.contains("ServiceMonitor ichor-controller: valid") && said.contains("PrometheusRule ichor: valid"),
        "{said}"
    );
    // Each `for` as the operator's CRD pattern reads a duration.
    let duration = regex::Regex::new(
        "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
    )
    .unwrap();
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        assert!(duration.is_match(r["for"].as_str().unwrap()), "{}: for {}", r["alert"], r["for"]);
    }
    let dashboard = named("ichor-dashboard");
    let typed: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(dashboard.clone()).unwrap();
    let board: serde_json::Value = serde_json::from_str(&typed.data.unwrap()["ichor.json"]).unwrap();
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    // Every expression, the alerts' and the panels', and the metrics they read.
    let mut exprs: Vec<(String, String)> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["alert"].as_str().unwrap().to_string(), r["expr"].as_str().unwrap().to_string()))
        .collect();
    assert!(exprs.len() >= 9, "{exprs:?}");
    for p in board["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push((p["title"].as_str().unwrap().to_string(), t["expr"].as_str().unwrap().to_string()));
        }
    }
    let reads = |what: &str, expr: &str| {
        let parsed =
            promql_parser::parser::parse(expr).unwrap_or_else(|e| panic!("{what}: {expr:?} is not PromQL: {e}"));
        let mut used = vec![];
        promql_metrics(&parsed, &mut used);
        assert!(!used.is_empty(), "{what}: {expr} reads no metric");
        used
    };
    let wanted: std::collections::BTreeSet<String> = exprs.iter().flat_map(|(w, e)| reads(w, e)).collect();
    // A running controller, through a config rollout a health check holds at first. Before it,
    // a kernel module patch waits for a reboot on every machine, and cp1 was given it without one
    // (as `talosctl apply-config --mode no-reboot` would): applied, in effect at its next boot.
    let sim = Sim::start_args("monitoring", "done", &["--no-controller", "--step-latency-ms", "300"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut controller = sim.replica_serving("ichor-test", &[], Stdio::null(), &addr);
    // (Once the controller recorded cp1's boot: what changes within it waits for the next.)
    let start = std::time::Instant::now();
    while sim
        .kubectl(&["get", "talosmachine", "cp1", "-n", "ichor-system", "-o", "jsonpath={.status.boot.id}"])
        .unwrap()
        .1
        .is_empty()
    {
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "cp1's boot was never recorded");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    apply_module_patch(&sim);
    sim.apply_module_without_reboot("cp1");
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gate, namespace: ichor-system}\ndata: {healthy: \"false\"}\n";
    let applied = kubectl_with_input(&sim, &["apply", "-f", "-"], cm);
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
    let (code, _, err) = sim.patch_cluster(
        r#"{"healthChecks":[{"name":"storage","object":{"apiVersion":"v1","kind":"ConfigMap","namespace":"ichor-system","name":"gate"},"expression":"object.data.healthy == \"true\""}]}"#,
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = sim.ichor(&["config", "apply", "--cluster", "lab", "--yes"]);
    assert_eq!(code, 0, "{out}{err}");
    let scrape = || -> String {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(&addr) else { return String::new() };
        let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body
    };
    let (mut names, mut last, mut opened) = (std::collections::BTreeSet::new(), String::new(), false);
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(120) && !wanted.is_subset(&names) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let metrics = scrape();
        names.extend(exposition_names(&metrics));
        // The check's wait was served: the gate opens and the upgrade goes on.
        if !opened && metrics.contains("ichor_operation_waits{") {
            let gate = kubectl_with_input(&sim, &["apply", "-f", "-"], &cm.replace("\"false\"", "\"true\""));
            assert!(gate.status.success(), "{}", String::from_utf8_lossy(&gate.stderr));
            opened = true;
        }
        last = metrics;
    }
    controller.kill().unwrap();
    controller.wait().unwrap();
    let missing: Vec<&String> = wanted.difference(&names).collect();
    assert!(missing.is_empty(), "never served: {missing:?}; the last scrape:\n{last}");
    for (what, expr) in &exprs {
        for m in reads(what, expr) {
            assert!(
                names.contains(&m),
                "{what}: {expr} reads {m}, which the controller never served; the last scrape:\n{last}"
            );
        }
    }
}

impl Sim {
    /// Gives `machine` the module patch's change straight through its Talos API, in mode
    /// no-reboot (Talos 1.14 takes it into the running config at once; it is in effect only at
    /// the next boot).
    fn apply_module_without_reboot(&self, machine: &str) {
        let (_, address, _) = self
            .kubectl(&["get", "talosmachine", machine, "-n", "ichor-system", "-o", "jsonpath={.spec.address}"])
            .unwrap();
        let file = self.dir.join("talosconfig");
        let text = std::fs::read_to_string(&file).unwrap();
        let cfg = runtime::talos::config::TalosConfig::parse(&text, "talosconfig").unwrap();
        let (name, ctx) = cfg.context(None, "talosconfig").unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let creds = ctx.credentials(name, "talosconfig", now).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let client = runtime::talos::client::Client::new(ctx, &creds, std::time::Duration::from_secs(15)).unwrap();
            let running = client.running_config(&address).await.unwrap();
            let mut docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&running)
                .map(|d| serde::Deserialize::deserialize(d).unwrap())
                .collect();
            let main = docs.iter_mut().find(|d| d.get("machine").is_some()).expect("the v1alpha1 document");
            main["machine"]["kernel"] = serde_yaml::from_str("modules: [{name: br_netfilter}]").unwrap();
            let config: Vec<String> = docs.iter().map(|d| serde_yaml::to_string(d).unwrap()).collect();
            client
                .apply(&address, config.join("---\n").as_bytes(), runtime::talos::client::ApplyMode::NoReboot, false)
                .await
                .unwrap();
        });
    }
}
