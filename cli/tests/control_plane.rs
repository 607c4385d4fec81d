//! Ichor against a real Kubernetes control plane (issue 51): etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler built from their Go modules (tests/kube), started
//! on loopback by `runtime::sim::control_plane`. What the in-memory API cannot judge is judged
//! here: the CRDs' schemas by kube-apiserver's own structural-schema checks, the install's
//! manifests by admission (Pod Security `restricted` on Ichor's namespace), RBAC by the API
//! server's authorizer.
//!
//! Start at `the_crds_and_the_install_are_accepted_by_kube_apiserver`. Without Go the suite says
//! so and skips (the control plane cannot be built); a component that fails to build or start
//! fails the test naming it, with its last log lines, and leaves no process behind.

use runtime::sim::control_plane::{ControlPlane, ControlPlaneError};
use runtime::sim::kubebin::KubeBinError;
use std::process::Command;

/// The control plane, or `None` (said on stderr) when Go is not installed.
fn control_plane(name: &str) -> Option<ControlPlane> {
    match ControlPlane::start(name) {
        Ok(cp) => Some(cp),
        Err(ControlPlaneError::Programs(e @ KubeBinError::GoMissing { .. })) => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("the control plane did not start: {}", runtime::error_chain(&e)),
    }
}

/// `ichor ARGS`: exit code, stdout, stderr.
fn ichor(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// `ichor crds` and `ichor install`, applied as the install's header says (server-side), are
/// accepted: the CRDs are structural and established, the namespace enforces Pod Security
/// `restricted` and the controller's and webhook's pods pass it (the ReplicaSets create them;
/// with no kubelet they stay Pending), the ClusterRole and its bindings exist.
#[test]
fn the_crds_and_the_install_are_accepted_by_kube_apiserver() {
    let Some(cp) = control_plane("install") else { return };
    let (code, crds, err) = ichor(&["crds"]);
    assert_eq!(code, 0, "ichor crds: {err}");
    let (code, out, err) = cp.kubectl_as(
        &cp.admin_kubeconfig,
        &["apply", "--server-side", "--field-manager=ichor", "-f", "-"],
        Some(&crds),
    );
    assert_eq!(code, 0, "kubectl apply of ichor crds: {err}\n{out}");
    let (code, _, err) = cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/talosclusters.ichor.maesh.dev",
        "crd/talosmachines.ichor.maesh.dev",
        "crd/talosconfigpatches.ichor.maesh.dev",
        "crd/talosoperations.ichor.maesh.dev",
    ]);
    assert_eq!(code, 0, "the CRDs are established: {err}");
    let (code, install, err) = ichor(&["install"]);
    assert_eq!(code, 0, "ichor install: {err}");
    let (code, out, err) = cp.kubectl_as(
        &cp.admin_kubeconfig,
        &["apply", "--server-side", "--field-manager=ichor", "-f", "-"],
        Some(&install),
    );
    assert_eq!(code, 0, "kubectl apply of ichor install: {err}\n{out}");
    assert!(!err.contains("would violate PodSecurity"), "the install violates Pod Security: {err}");
    let (_, label, _) = cp.kubectl(&[
        "get",
        "namespace",
        "ichor-system",
        "-o",
        "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
    ]);
    assert_eq!(label.trim(), "restricted", "Ichor's namespace enforces Pod Security restricted");
    // The ReplicaSet controller creates the pods only if admission (PodSecurity restricted)
    // accepts them; a refusal shows as the ReplicaSet's ReplicaFailure condition instead.
    let start = std::time::Instant::now();
    let pods = loop {
        let (_, out, _) =
            cp.kubectl(&["get", "pods", "-n", "ichor-system", "-o", "jsonpath={.items[*].metadata.name}"]);
        let names: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        let ctl = names.iter().any(|n| n.starts_with("ichor-controller-"));
        let hook = names.iter().any(|n| n.starts_with("ichor-webhook-"));
        if (ctl && hook) || start.elapsed() > std::time::Duration::from_secs(60) {
            break names;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let (_, failures, _) = cp.kubectl(&[
        "get",
        "replicasets",
        "-n",
        "ichor-system",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}: {.status.conditions[?(@.type==\"ReplicaFailure\")].message}{\"\\n\"}{end}",
    ]);
    assert!(
        pods.iter().any(|n| n.starts_with("ichor-controller-")) && pods.iter().any(|n| n.starts_with("ichor-webhook-")),
        "the controller's and the webhook's pods were created (admitted); pods: {pods:?}; ReplicaSets: {failures}"
    );
    let (code, _, err) = cp.kubectl(&["get", "clusterrole", "ichor-controller"]);
    assert_eq!(code, 0, "the controller's ClusterRole: {err}");
    // The controller's ServiceAccount can be given a token (what its pod would mount).
    cp.service_account_kubeconfig("ichor-system", "ichor-controller").expect("a token for the controller's account");
}
