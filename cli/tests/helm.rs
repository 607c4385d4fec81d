//! `ichor cni helm apply`, the command the Cilium Job runs, against a stand-in `helm` on PATH
//! that records its arguments and the values file it was given (the real Helm is what the
//! Job's image carries).

use std::path::{Path, PathBuf};
use std::process::Command;

fn stand_in(dir: &Path, exit: i32) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{log}'\nwhile [ $# -gt 0 ]; do if [ \"$1\" = --values ]; then cp \"$2\" '{vals}'; fi; shift; done\n{body}\n",
        log = dir.join("args").display(),
        vals = dir.join("values.yaml").display(),
        body = if exit == 0 {
            "echo 'Release \"cilium\" has been upgraded. Happy Helming!'".to_string()
        } else {
            format!("echo 'Error: UPGRADE FAILED: context deadline exceeded' >&2; exit {exit}")
        }
    );
    let helm = bin.join("helm");
    std::fs::write(&helm, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&helm, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn run(dir: &Path, bin: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        .envs(env.iter().copied())
        .env("PATH", path)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ichor-helm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn valid_values_run_helm_upgrade_install_with_the_pinned_chart_and_the_layers() {
    let dir = temp("ok");
    let bin = stand_in(&dir, 0);
    std::fs::write(dir.join("user.yaml"), "hubble:\n  relay:\n    enabled: true\n").unwrap();
    let (code, out, err) =
        run(&dir, &bin, &["cni", "helm", "apply", "--kube-proxy", "replaced", "--values", "user.yaml"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("Cilium 1.20.0 applied with kube-proxy replaced"), "{out}");
    assert!(out.contains("Happy Helming"), "Helm's own output is reported: {out}");
    let args = std::fs::read_to_string(dir.join("args")).unwrap();
    let args: Vec<&str> = args.lines().collect();
    assert_eq!(
        &args[..8],
        [
            "upgrade",
            "--install",
            "cilium",
            "/charts/cilium-1.20.0.tgz",
            "--version",
            "1.20.0",
            "--namespace",
            "kube-system"
        ]
    );
    assert!(args.contains(&"--atomic"), "Helm rolls back a failed upgrade: {args:?}");
    let values: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("values.yaml")).unwrap()).unwrap();
    assert_eq!(values["kubeProxyReplacement"], serde_json::json!(true), "the mode comes from the flag");
    assert_eq!(values["k8sServiceHost"], serde_json::json!("localhost"));
    assert_eq!(values["hubble"]["relay"]["enabled"], serde_json::json!(true), "the user's layer is in");
    // The Job's form: the layer in an environment variable, the mode from the flag.
    let (code, _, err) = run(
        &dir,
        &bin,
        &[
            "cni",
            "helm",
            "apply",
            "--kube-proxy",
            "enabled",
            "--values-env",
            "ICHOR_CILIUM_VALUES",
            "--chart",
            "/x/cilium.tgz",
        ],
        &[("ICHOR_CILIUM_VALUES", r#"{"hubble":{"enabled":true}}"#)],
    );
    assert_eq!(code, 0, "{err}");
    let values: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("values.yaml")).unwrap()).unwrap();
    assert_eq!(values["kubeProxyReplacement"], serde_json::json!(false));
    assert!(std::fs::read_to_string(dir.join("args")).unwrap().contains("/x/cilium.tgz"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn refused_values_run_no_helm_and_a_helm_failure_is_reported() {
    let dir = temp("refused");
    let bin = stand_in(&dir, 0);
    std::fs::write(
        dir.join("user.yaml"),
        "kubeProxyReplacement: true\ntls:\n  secretsNamespace:\n    name: ichor-system\n",
    )
    .unwrap();
    let (code, out, err) =
        run(&dir, &bin, &["cni", "helm", "apply", "--kube-proxy", "enabled", "--values", "user.yaml"], &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("refused: kubeProxyReplacement: owned by Ichor"), "{out}");
    assert!(out.contains("refused: tls.secretsNamespace.name"), "{out}");
    assert!(err.contains("Helm was not run"), "{err}");
    assert!(!dir.join("args").exists(), "no Helm for refused values");
    let failing = temp("failing");
    let bin = stand_in(&failing, 1);
    std::fs::write(failing.join("user.yaml"), "{}\n").unwrap();
    let (code, _, err) =
        run(&failing, &bin, &["cni", "helm", "apply", "--kube-proxy", "replaced", "--values", "user.yaml"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("helm: Error: UPGRADE FAILED: context deadline exceeded"), "{err}");
    assert!(err.contains("the operation pauses with CiliumJobFailed"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&failing);
}
