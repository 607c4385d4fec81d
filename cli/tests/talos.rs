//! `ichor config diff --node`, `ichor apply --node` and `ichor sim talos`, end to end: the
//! binary serves a simulated fleet and the binary talks to it over mTLS on loopback.
//!
//! Start at `Sim::start` (spawns `ichor sim talos` on a free port, waits for its talosconfig).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

struct Sim {
    child: Child,
    dir: PathBuf,
    talosconfig: PathBuf,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ichor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ichor"))
}

impl Sim {
    fn start(name: &str) -> Sim {
        let dir = std::env::temp_dir().join(format!("ichor-sim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let talosconfig = dir.join("talosconfig");
        let child = ichor()
            .args(["sim", "talos", "--nodes", "3", "--controlplanes", "1", "--talos", "v1.14.3", "--talos", "v1.13.9"])
            .args(["--listen", "127.0.0.1:0", "--talosconfig"])
            .arg(&talosconfig)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let sim = Sim { child, dir, talosconfig };
        let started = Instant::now();
        while !sim.talosconfig.exists() {
            assert!(started.elapsed() < Duration::from_secs(30), "the simulated fleet did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        sim
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output { status, stdout, stderr } = cmd.output().unwrap();
    (status.code().unwrap_or(-1), String::from_utf8_lossy(&stdout).into(), String::from_utf8_lossy(&stderr).into())
}

fn example(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap()
}

/// The node label change a v1.14 node applies live (in KubeNodeConfig: beside it, the legacy
/// `machine.nodeLabels` is a conflict Talos refuses).
fn with_label(config: &str) -> String {
    config.replacen(
        "kind: KubeNodeConfig\nnodeIP: {}\nlabels:\n",
        "kind: KubeNodeConfig\nnodeIP: {}\nlabels:\n    rack: r1\n",
        1,
    )
}

#[test]
fn diff_then_apply_a_live_change_to_a_simulated_v1_14_node() {
    let sim = Sim::start("apply");
    let tc = sim.talosconfig.to_str().unwrap().to_string();
    // cp1 runs v1.14.3 and the shipped v1.14 control-plane example.
    let same = sim.file("same.yaml", &example("examples/configs/v1.14/controlplane.yaml"));
    let (code, out, err) =
        run(ichor().args(["config", "diff", "--node", "cp1", "--talosconfig", &tc, "--to"]).arg(&same));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Verdict: NoChanges"), "{out}");
    let desired = sim.file("desired.yaml", &with_label(&example("examples/configs/v1.14/controlplane.yaml")));
    let diff = || run(ichor().args(["config", "diff", "--node", "cp1", "--talosconfig", &tc, "--to"]).arg(&desired));
    let (code, out, _) = diff();
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Verdict: LiveApply") && out.contains("KubeNodeConfig.labels.rack"), "{out}");
    // Talos's dry run applies nothing.
    let (code, out, err) =
        run(ichor().args(["apply", "--node", "cp1", "--talosconfig", &tc, "--dry-run"]).arg(&desired));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Dry run on cp1: Dry run summary:"), "{out}");
    assert_eq!(diff().0, 1, "a dry run changed the node");
    let (code, out, err) = run(ichor().args(["apply", "--node", "cp1", "--talosconfig", &tc]).arg(&desired));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Applied to cp1: Applied configuration without a reboot"), "{out}");
    let (code, out, _) = diff();
    assert_eq!(code, 0, "the node runs the applied config: {out}");
    // Applying again: nothing to apply.
    let (code, out, _) = run(ichor().args(["apply", "--node", "cp1", "--talosconfig", &tc]).arg(&desired));
    assert_eq!(code, 0);
    assert!(out.contains("Nothing to apply"), "{out}");
}

/// talosctl's habits: `-n` with several nodes (each reported, one unreachable failing alone,
/// exit 2), `-e` overriding the context's endpoints, and the talosconfig found through
/// TALOSCONFIG or ~/.talos/config.
#[test]
fn several_nodes_are_each_reported_and_the_talosconfig_is_found_as_talosctl_finds_it() {
    let sim = Sim::start("nodes");
    let same = sim.file("same.yaml", &example("examples/configs/v1.14/controlplane.yaml"));
    let home = sim.dir.join("home");
    std::fs::create_dir_all(home.join(".talos")).unwrap();
    std::fs::copy(&sim.talosconfig, home.join(".talos/config")).unwrap();
    let diff = |nodes: &str, extra: &[&str]| {
        run(ichor()
            .env_remove("TALOSCONFIG")
            .env("HOME", &home)
            .args(["config", "diff", "-n", nodes, "--timeout", "3"])
            .args(extra)
            .arg("--to")
            .arg(&same))
    };
    // ~/.talos/config, one node: as before.
    let (code, out, err) = diff("cp1", &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Verdict: NoChanges") && !out.contains("=== node"), "{out}");
    // Two nodes, one the fleet does not have: both reported, exit 2.
    let (code, out, err) = diff("cp1,nowhere", &[]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("=== node cp1\nDry run summary:") && out.contains("Verdict: NoChanges"), "{out}");
    assert!(out.contains("=== node nowhere\nerror: nowhere: "), "{out}");
    assert!(err.contains("ichor: error: nowhere: ") && !err.contains("cp1"), "{err}");
    let (code, out, _) = diff("cp1,nowhere", &["-o", "json"]);
    assert_eq!(code, 2);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nodes"][0]["node"], "cp1");
    assert_eq!(v["nodes"][0]["verdict"], "NoChanges");
    assert_eq!(v["nodes"][1]["node"], "nowhere");
    assert!(v["nodes"][1]["error"].as_str().unwrap().starts_with("nowhere: "), "{v}");
    // -e: the calls go through the given endpoint, not the context's.
    let (code, _, err) = diff("cp1", &["-e", "127.0.0.1:1"]);
    assert_eq!(code, 2);
    assert!(err.contains("127.0.0.1:1"), "{err}");
    // TALOSCONFIG wins over ~/.talos/config; an empty one is unset.
    std::fs::write(home.join(".talos/config"), "not: a talosconfig\n").unwrap();
    let (code, out, err) = run(ichor()
        .env("TALOSCONFIG", &sim.talosconfig)
        .env("HOME", &home)
        .args(["config", "diff", "--node", "cp1", "--to"])
        .arg(&same));
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = run(ichor()
        .env("TALOSCONFIG", "")
        .env("HOME", &home)
        .args(["config", "diff", "--node", "cp1", "--to"])
        .arg(&same));
    assert_eq!(code, 2);
    assert!(err.contains(".talos/config"), "{err}");
    let (code, _, err) = run(ichor()
        .env_remove("TALOSCONFIG")
        .env("HOME", sim.dir.join("nobody"))
        .args(["config", "diff", "--node", "cp1", "--to"])
        .arg(&same));
    assert_eq!(code, 2);
    assert!(err.contains("no talosconfig:") && err.contains("--talosconfig"), "{err}");
}

#[test]
fn apply_refuses_what_is_not_live_applicable_and_applies_nothing() {
    let sim = Sim::start("refuse");
    let tc = sim.talosconfig.to_str().unwrap().to_string();
    // The kubelet image is the Kubernetes upgrade's to apply.
    let kubelet = example("examples/configs/v1.14/controlplane.yaml").replace("kubelet:v1.36.4", "kubelet:v1.36.5");
    let desired = sim.file("kubelet.yaml", &kubelet);
    let (code, out, _) = run(ichor().args(["apply", "--node", "cp1", "--talosconfig", &tc]).arg(&desired));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("Refused: nothing was applied") && out.contains("KubeletConfig.image (reboot-required)"),
        "{out}"
    );
    let (code, _, _) =
        run(ichor().args(["config", "diff", "--node", "cp1", "--talosconfig", &tc, "--to"]).arg(&desired));
    assert_eq!(code, 1, "still differs: nothing was applied");
    // w1 runs Talos 1.13: machine.env needs a reboot there.
    let env = example("examples/configs/v1.13/worker.yaml").replacen(
        "machine:\n",
        "machine:\n    env:\n        FOO: bar\n",
        1,
    );
    let desired = sim.file("env.yaml", &env);
    let (code, out, _) = run(ichor().args(["apply", "--node", "w1", "--talosconfig", &tc]).arg(&desired));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("machine.env.FOO (reboot-required)"), "{out}");
}

#[test]
fn bad_talosconfigs_and_endpoints_exit_2_naming_the_file_field_or_endpoint_and_no_key() {
    let sim = Sim::start("bad");
    let good = std::fs::read_to_string(&sim.talosconfig).unwrap();
    let key = good
        .lines()
        .find(|l| l.trim_start().starts_with("key:"))
        .unwrap()
        .trim()
        .trim_start_matches("key: ")
        .to_string();
    let desired = sim.file("d.yaml", &example("examples/configs/v1.14/controlplane.yaml"));
    let addr = good.lines().find(|l| l.contains("127.0.0.1:")).unwrap().trim().trim_start_matches("- ").to_string();
    let cases = [
        ("missing", None, "missing: No such file"),
        ("malformed.yaml", Some("contexts: [\n".to_string()), "malformed.yaml: line"),
        (
            "nocontext.yaml",
            Some(good.replace("context: sim\n", "context: gone\n")),
            "nocontext.yaml: context: no context \"gone\"",
        ),
        ("badkey.yaml", Some(good.replace(&key, "abc$def")), "badkey.yaml: contexts.sim.key: not base64"),
        ("unreachable.yaml", Some(good.replace(&addr, "127.0.0.1:1")), "through endpoint 127.0.0.1:1"),
    ];
    for (name, text, expect) in cases {
        let path = match text {
            Some(t) => sim.file(name, &t),
            None => sim.dir.join(name),
        };
        let (code, out, err) = run(ichor()
            .args(["config", "diff", "--node", "cp1", "--timeout", "2", "--talosconfig"])
            .arg(&path)
            .arg("--to")
            .arg(&desired));
        assert_eq!(code, 2, "{name}: {out}{err}");
        assert!(err.contains(expect), "{name}: {err}");
        assert!(!err.contains(&key[..24]) && !out.contains(&key[..24]), "{name}: key material printed");
    }
    // An expired certificate, from the same CA's kind of talosconfig.
    let pki = runtime::sim::pki::Pki::generate().unwrap();
    let spec = runtime::sim::pki::ClientSpec { valid_for: -60, ..runtime::sim::pki::ClientSpec::talos(&["os:admin"]) };
    let expired = pki.talosconfig("sim", std::slice::from_ref(&addr), &[], &pki.client(&spec).unwrap());
    let path = sim.file("expired.yaml", &expired);
    let (code, _, err) =
        run(ichor().args(["config", "diff", "--node", "cp1", "--talosconfig"]).arg(&path).arg("--to").arg(&desired));
    assert_eq!(code, 2);
    assert!(err.contains("expired.yaml: contexts.sim.crt: the client certificate expired"), "{err}");
    // A certificate of another CA: the endpoint refuses the handshake.
    let other = pki.talosconfig(
        "sim",
        &[addr],
        &[],
        &pki.client(&runtime::sim::pki::ClientSpec::talos(&["os:admin"])).unwrap(),
    );
    let path = sim.file("otherca.yaml", &other);
    let (code, _, err) = run(ichor()
        .args(["config", "diff", "--node", "cp1", "--timeout", "2", "--talosconfig"])
        .arg(&path)
        .arg("--to")
        .arg(&desired));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cp1: MachineConfig"), "{err}");
}

/// `ichor sim controller`: the controller's loop upgrades the example installation, stage by
/// stage, without a reboot, and exits 0 when the operation completes.
#[test]
fn the_simulated_installation_is_upgraded_by_the_controller_loop() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (code, out, err) = run(ichor().current_dir(&root).args(["sim", "controller", "--to", "v1.37.0"]));
    assert_eq!(code, 0, "{out}{err}");
    let pos = |s: &str| out.find(s).unwrap_or_else(|| panic!("{s:?} not in {out}"));
    assert!(pos("cp1 apiservers Applying") < pos("cp1 controlplane Applying"), "{out}");
    assert!(pos("[manifestsSynced]") < pos("kubelets Applying"), "the sync before any kubelet: {out}");
    assert!(out.contains("  Completed [manifestsSynced]"), "{out}");
    for m in ["cp1", "cp2", "cp3", "w1"] {
        assert!(out.contains(&format!("  {m}: kubelet ghcr.io/siderolabs/kubelet:v1.37.0, reboots 0")), "{out}");
    }
}
