//! The controller at a fleet's size: the real `ichor controller` binary, as its own process,
//! against `ichor sim cluster --no-controller --workers N` (the in-memory API and the simulated
//! Talos fleet over gRPC and mTLS on loopback), at 30, 300 and 1,000 machines.
//!
//! Per size it prints: the upgrade preview's wall time right after the controller starts and
//! once it is quiet; the controller's first pass after start (CPU seconds, per machine); its
//! idle use over 125 s, one whole look of the machine controller at every machine (share of one core, and the custom resources written meanwhile); a Kubernetes
//! upgrade with `--max-unavailable 10` to Completed (wall time, CPU, CPU per machine), then,
//! once the controller has settled (the first upgrade's end judges every machine again, which
//! is that upgrade's cost, as the first pass is the start's), a Talos upgrade the same way and
//! its CPU per machine against the Kubernetes upgrade's (the
//! goal: at most 1.5; each Talos step reboots its node, a Kubernetes step does not). Then
//! the ratio of CPU per machine between the sizes (the goal: at most 1.5 from 30 to 1,000).
//! CPU is the controller process's own (utime + stime from /proc), not the simulator's.
//!
//! `cargo bench -p cli --bench scale` runs the three sizes (about ten minutes on 2 cores);
//! without `--bench` (what `cargo test --all-targets` runs) one small size, as a smoke test
//! that the whole path works. `ICHOR_SCALE_SIZES=30,100` chooses the sizes;
//! `ICHOR_SCALE_UPGRADE_SECONDS=N` stops following the upgrade after N seconds (a 5,000-machine
//! fleet's whole upgrade is set by the simulator's stand-in kubelets), its reconciles so far
//! still counted. Each size also prints the operation reconciles during the upgrade and their
//! mean deciding time (`ichor_reconcile_decide_seconds`: reads from the caches and the API,
//! assembly and plan, no execution): the steady-state reconcile at that size.

#[path = "../tests/common/mod.rs"]
mod common;

use render::api::Phase;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ICHOR: &str = env!("CARGO_BIN_EXE_ichor");
/// Machines the example cluster already has (3 control planes, 1 worker).
const EXAMPLE_MACHINES: usize = 4;

use common::root;

/// CPU seconds a process used so far (utime + stime; the clock ticks are 100 a second).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

struct Sim {
    sim: Child,
    controller: Option<Child>,
    dir: PathBuf,
    /// Where the controller serves `/metrics`.
    metrics: String,
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(c) = &mut self.controller {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.sim.kill();
        let _ = self.sim.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Sim {
    fn start(machines: usize) -> Sim {
        let dir = std::env::temp_dir().join(format!("ichor-scale-{machines}-{}", std::process::id()));
        let workers = machines.saturating_sub(EXAMPLE_MACHINES).to_string();
        let sim = common::spawn_sim(&dir, &["--no-controller", "--handover", "disabled", "--workers", &workers]);
        Sim { sim, controller: None, dir, metrics: String::new() }
    }

    fn start_controller(&mut self) -> u32 {
        let kc = std::fs::read_to_string(self.dir.join("kubeconfig")).unwrap();
        let server = kc.lines().find_map(|l| l.trim().strip_prefix("server: http://")).unwrap().to_string();
        let (host, port) = server.rsplit_once(':').unwrap();
        // A port free now, for the controller's `/metrics`.
        self.metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let child = Command::new(ICHOR)
            .env("KUBERNETES_SERVICE_HOST", host)
            .env("KUBERNETES_SERVICE_PORT", port)
            .args(["controller", "--metrics-addr", &self.metrics, "--identity", "bench", "--kubeconfig"])
            .arg(self.dir.join("kubeconfig"))
            .arg("--talosconfig")
            .arg(self.dir.join("talosconfig"))
            .current_dir(root())
            .env("ICHOR_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        self.controller = Some(child);
        pid
    }

    fn run(&self, program: &str, args: &[&str]) -> (bool, String) {
        // kubectl is the one built from k8s.io/kubectl (tests/kube), never one from PATH.
        let path = if program == "kubectl" { runtime::sim::kubebin::kubectl() } else { program.into() };
        let out = Command::new(path)
            .args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("TALOSCONFIG", self.dir.join("talosconfig"))
            .current_dir(root())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"));
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The operation reconciles' deciding time so far (`ichor_reconcile_decide_seconds`): its
    /// sum in seconds and its count.
    fn decided(&self) -> (f64, f64) {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(&self.metrics) else { return (0.0, 0.0) };
        let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.metrics);
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let value =
            |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).unwrap_or(0.0);
        (value("ichor_reconcile_decide_seconds_sum "), value("ichor_reconcile_decide_seconds_count "))
    }

    /// The wall time of the upgrade's preview (it reads and judges every machine).
    fn preview(&self) -> Duration {
        let t = Instant::now();
        let (ok, out) = self.run(ICHOR, &["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--dry-run"]);
        assert!(ok, "the preview failed: {out}");
        t.elapsed()
    }

    /// Every custom resource's resourceVersion, as kubectl reads them: what a write moves.
    fn versions(&self) -> String {
        self.run(
            "kubectl",
            &[
                "get",
                "talosmachines,talosclusters,talosoperations,talosconfigpatches",
                "-A",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}",
            ],
        )
        .1
    }

    /// How many TalosMachines have a Ready condition.
    fn judged(&self) -> usize {
        let (_, out) = self.run(
            "kubectl",
            &[
                "get",
                "talosmachines",
                "-A",
                "-o",
                "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ],
        );
        out.lines().filter(|l| !l.trim().is_empty()).count()
    }

    /// One operation's phase, by name.
    fn phase(&self, name: &str) -> Phase {
        let (_, out) = self
            .run("kubectl", &["get", "talosoperation", name, "-n", "ichor-system", "-o", "jsonpath={.status.phase}"]);
        Phase::parse(out.trim()).unwrap_or_default()
    }
}

/// What one size measured.
struct Figures {
    machines: usize,
    preview_at_start: Duration,
    preview_quiet: Duration,
    first_pass_cpu: f64,
    first_pass_wall: Duration,
    idle_core_share: f64,
    idle_writes: usize,
    upgrade_wall: Duration,
    upgrade_cpu: f64,
    /// Whether the upgrade reached Completed within the cap (`ICHOR_SCALE_UPGRADE_SECONDS`).
    upgrade_completed: bool,
    /// The operation reconciles during the upgrade: how many, and their mean deciding time
    /// (reads from the caches and the API, assembly, plan; no execution).
    reconciles: f64,
    decide_mean: Duration,
    /// A Talos upgrade after it, the same way (`ichor upgrade talos --max-unavailable 10`).
    talos: Followed,
}

/// An operation followed to its end (or the cap): its wall time, the controller's CPU, whether
/// it completed, and its reconciles with their mean deciding time.
struct Followed {
    wall: Duration,
    cpu: f64,
    completed: bool,
    reconciles: f64,
    decide_mean: Duration,
}

/// Starts an operation with `args` (named `name`) and follows it to Completed, a pause or the
/// cap (`ICHOR_SCALE_UPGRADE_SECONDS`; past it the operation is left running and its reconciles
/// so far are still measured).
fn follow(sim: &Sim, pid: u32, machines: usize, args: &[&str], name: &str) -> Followed {
    let cpu0 = cpu_seconds(pid);
    let decided0 = sim.decided();
    let t = Instant::now();
    let (ok, out) = sim.run(ICHOR, args);
    assert!(ok, "{name} was not started: {out}");
    let cap = std::env::var("ICHOR_SCALE_UPGRADE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3600);
    let deadline = Instant::now() + Duration::from_secs(cap);
    let mut completed = true;
    loop {
        let p = sim.phase(name);
        if p == Phase::Completed {
            break;
        }
        if Instant::now() > deadline {
            completed = false;
            break;
        }
        if p == Phase::Paused || p.is_terminal() {
            // Said with the reason, and what was measured until then still printed.
            let path = "jsonpath={.status}";
            let (_, why) = sim.run("kubectl", &["get", "talosoperation", name, "-n", "ichor-system", "-o", path]);
            eprintln!("{name} of {machines} machines stopped {p:?}: {why}");
            completed = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let cpu = cpu_seconds(pid) - cpu0;
    let wall = t.elapsed();
    let decided1 = sim.decided();
    let reconciles = decided1.1 - decided0.1;
    let decide_mean =
        Duration::from_secs_f64(if reconciles > 0.0 { (decided1.0 - decided0.0) / reconciles } else { 0.0 });
    Followed { wall, cpu, completed, reconciles, decide_mean }
}

/// Waits until `ready` holds and the controller's CPU stops moving (under 0.05 s in a
/// second), at most `limit`.
fn settle(pid: u32, limit: Duration, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    let mut last = cpu_seconds(pid);
    loop {
        std::thread::sleep(Duration::from_millis(1000));
        let now = cpu_seconds(pid);
        if (ready() && now - last < 0.05) || Instant::now() > deadline {
            return;
        }
        last = now;
    }
}

fn measure(machines: usize, idle_for: Duration) -> Figures {
    let mut sim = Sim::start(machines);
    let started = Instant::now();
    let pid = sim.start_controller();
    let preview_at_start = sim.preview();
    // The first pass: until every machine is judged and the controller's CPU stops moving.
    settle(pid, Duration::from_secs(600), || sim.judged() >= machines);
    let first_pass_cpu = cpu_seconds(pid);
    let first_pass_wall = started.elapsed();
    // Idle: nothing changes; what the controller uses and writes meanwhile.
    let before = sim.versions();
    let cpu0 = cpu_seconds(pid);
    std::thread::sleep(idle_for);
    let idle_core_share = (cpu_seconds(pid) - cpu0) / idle_for.as_secs_f64();
    let after = sim.versions();
    let b: std::collections::BTreeSet<&str> = before.split_whitespace().collect();
    let idle_writes = after.split_whitespace().filter(|v| !b.contains(v)).count();
    let preview_quiet = sim.preview();
    // The upgrade, then Talos's.
    let k8s = follow(
        &sim,
        pid,
        machines,
        &["upgrade", "kubernetes", "--cluster", "lab", "--to", "v1.37.0", "--yes", "--max-unavailable", "10"],
        "upgrade-kubernetes-1-37-0",
    );
    // What the Kubernetes upgrade's end wakes (every machine judged again once its operation
    // ends) is its own, not the Talos upgrade's: the controller settles first.
    settle(pid, Duration::from_secs(120), || true);
    let talos = follow(
        &sim,
        pid,
        machines,
        &["upgrade", "talos", "--cluster", "lab", "--to", "v1.14.6", "--yes", "--max-unavailable", "10"],
        "upgrade-talos-1-14-6",
    );
    Figures {
        machines,
        preview_at_start,
        preview_quiet,
        first_pass_cpu,
        first_pass_wall,
        idle_core_share,
        idle_writes,
        upgrade_wall: k8s.wall,
        upgrade_cpu: k8s.cpu,
        upgrade_completed: k8s.completed,
        reconciles: k8s.reconciles,
        decide_mean: k8s.decide_mean,
        talos,
    }
}

fn main() {
    // kubectl from tests/kube, built now if it is missing (its progress on stderr).
    let _ = runtime::sim::kubebin::kubectl();
    let full = std::env::args().any(|a| a == "--bench");
    let sizes: Vec<usize> = match std::env::var("ICHOR_SCALE_SIZES") {
        Ok(s) => s.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) if full => vec![30, 300, 1000],
        Err(_) => vec![12],
    };
    // A full look of the machine controller at every converged machine (120 s) and a little more.
    let idle_for = Duration::from_secs(if full { 125 } else { 5 });
    println!(
        "{:>8} {:>12} {:>12} {:>14} {:>12} {:>10} {:>7} {:>11} {:>11} {:>14} {:>10} {:>9}",
        "machines",
        "preview@0 s",
        "preview s",
        "1st pass cpu s",
        "per mach ms",
        "idle core",
        "writes",
        "upgrade s",
        "upg cpu s",
        "upg cpu/mach ms",
        "reconciles",
        "decide ms"
    );
    let mut all = vec![];
    for n in sizes {
        let f = measure(n, idle_for);
        println!(
            "{:>8} {:>12.2} {:>12.2} {:>14.2} {:>12.1} {:>9.1}% {:>7} {:>11.1} {:>11.2} {:>14.1} {:>10} {:>9.1}   (first pass {:.1} s wall){}",
            f.machines,
            f.preview_at_start.as_secs_f64(),
            f.preview_quiet.as_secs_f64(),
            f.first_pass_cpu,
            f.first_pass_cpu * 1000.0 / f.machines as f64,
            f.idle_core_share * 100.0,
            f.idle_writes,
            f.upgrade_wall.as_secs_f64(),
            f.upgrade_cpu,
            f.upgrade_cpu * 1000.0 / f.machines as f64,
            f.reconciles,
            f.decide_mean.as_secs_f64() * 1000.0,
            f.first_pass_wall.as_secs_f64(),
            if f.upgrade_completed { "" } else { " (upgrade not Completed: stopped at the cap or paused, above)" },
        );
        let t = &f.talos;
        println!(
            "{:>8} Talos upgrade: {:.1} s, {:.2} CPU s, {:.1} ms CPU per machine ({} reconciles, {:.1} ms deciding each): x{:.2} the Kubernetes upgrade's CPU per machine (goal: at most x1.5){}",
            f.machines,
            t.wall.as_secs_f64(),
            t.cpu,
            t.cpu * 1000.0 / f.machines as f64,
            t.reconciles,
            t.decide_mean.as_secs_f64() * 1000.0,
            t.cpu / f.upgrade_cpu.max(f64::EPSILON),
            if t.completed { "" } else { " (not Completed: stopped at the cap or paused, above)" },
        );
        all.push(f);
    }
    if let (Some(small), Some(large)) = (all.first(), all.last())
        && all.len() > 1
    {
        let per = |f: &Figures, cpu: f64| cpu / f.machines as f64;
        println!(
            "CPU per machine, {} -> {} machines: upgrade x{:.2}, first pass x{:.2} (goal: at most x1.5)",
            small.machines,
            large.machines,
            per(large, large.upgrade_cpu) / per(small, small.upgrade_cpu),
            per(large, large.first_pass_cpu) / per(small, small.first_pass_cpu),
        );
    }
}
