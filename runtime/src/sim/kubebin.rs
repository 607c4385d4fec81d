//! The pinned Kubernetes programs the tests run (issue 51): etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kubectl, built from their Go modules by
//! `tests/kube/build.sh` into `target/kube-bin` (or `$ICHOR_KUBE_BIN`). The tests that run
//! `kubectl` or a real control plane ask `bin` for a program; the first ask in a process builds
//! what is missing (once), so `cargo test` alone works on a fresh clone with Go.
//!
//! Start at `bin`.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The programs `tests/kube/build.sh` builds.
pub const PROGRAMS: [&str; 6] =
    ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "monitoring-check"];

/// Why a program is not there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KubeBinError {
    /// Go is not installed: nothing can be built (a test of the real control plane then says so
    /// and skips; kubectl is needed by every operations test, which fails naming this).
    #[error(
        "Go is not installed, so {script} cannot build the pinned Kubernetes programs; install Go (1.26) and run it"
    )]
    GoMissing { script: String },
    /// The build failed: its exit status and its last lines.
    #[error("{script} failed ({status}); its last lines:\n{tail}")]
    BuildFailed { script: String, status: String, tail: String },
    #[error("{program} is not one of the programs tests/kube builds ({})", PROGRAMS.join(", "))]
    Unknown { program: String },
}

/// The repository's root (this crate's parent folder).
pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Where the programs are: `$ICHOR_KUBE_BIN`, else `target/kube-bin`.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("ICHOR_KUBE_BIN").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target/kube-bin"))
}

/// The path of `program`, built first (once per process) when any program is missing or the
/// build's inputs changed (the script decides: it is quick when all is up to date).
pub fn bin(program: &str) -> Result<PathBuf, KubeBinError> {
    if !PROGRAMS.contains(&program) {
        return Err(KubeBinError::Unknown { program: program.into() });
    }
    static BUILT: OnceLock<Result<(), KubeBinError>> = OnceLock::new();
    BUILT.get_or_init(build).clone()?;
    Ok(bin_dir().join(program))
}

/// Runs `tests/kube/build.sh`, its progress lines on this process's stderr.
fn build() -> Result<(), KubeBinError> {
    let script = repo_root().join("tests/kube/build.sh");
    let name = "tests/kube/build.sh".to_string();
    let out = std::process::Command::new("bash")
        .arg(&script)
        .env("ICHOR_KUBE_BIN", bin_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            return Err(KubeBinError::BuildFailed { script: name, status: "not started".into(), tail: e.to_string() });
        }
    };
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
    match out.status.code() {
        Some(0) => Ok(()),
        Some(3) => Err(KubeBinError::GoMissing { script: name }),
        _ => {
            let text = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            Err(KubeBinError::BuildFailed { script: name, status: out.status.to_string(), tail })
        }
    }
}

/// `kubectl`, built from `k8s.io/kubectl` at the pinned version; a test that needs it fails
/// naming why it is not there (never skips).
pub fn kubectl() -> PathBuf {
    match bin("kubectl") {
        Ok(p) => p,
        Err(e) => panic!("kubectl: {e}"),
    }
}
