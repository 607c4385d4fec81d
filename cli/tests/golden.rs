//! Golden tests: every case under `tests/golden/<case>/` runs the `ichor` binary.
//!
//! A case is a `*.toml` (arguments, expected exit code) beside its inputs, with the expected
//! output in `*.stdout` / `*.stderr`; the command runs in the case's folder. Rewrite the
//! expected files with `TRYCMD=overwrite cargo test -p cli --test golden` and read the change
//! as a diff.

#[test]
fn golden() {
    trycmd::TestCases::new().case("../tests/golden/*/*.toml");
}

use std::process::Command;

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

/// A config over 10 MiB is refused with the limit named, before it is parsed.
#[test]
fn config_over_ten_mib_is_refused() {
    let dir = std::env::temp_dir().join(format!("ichor-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.yaml");
    let mut text = String::from("version: v1alpha1\nmachine:\n    type: worker\n    nodeLabels:\n");
    while text.len() <= 10 * 1024 * 1024 {
        text.push_str(&format!("        l{}: \"{}\"\n", text.len(), "x".repeat(200)));
    }
    std::fs::write(&big, &text).unwrap();
    let (code, _, err) =
        ichor(&["config", "diff", "--from", "examples/configs/v1.13/worker.yaml", "--to", big.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("over the 10485760-byte (10 MiB) limit for a machine configuration"), "{err}");
}

/// No value of a sensitive path appears in any output of `config diff`, text or JSON.
#[test]
fn redaction_leaks_no_secret() {
    let secrets = [
        "lab001.rotatedmachinetk",
        "lab001.examplemachinetk",
        "Uk9UQVRFRC1TRUNSRVRCT1gtS0VZLTAwMDAwMDAwMDA=",
        "RVhBTVBMRS1TRUNSRVRCT1gtS0VZLTAwMDAwMDAwMDA=",
        "Uk9UQVRFRCBLVUJFUk5FVEVTIENBIEtFWQ==",
        "RVhBTVBMRSBLVUJFUk5FVEVTIENBIEtFWQ==",
        "RVhBTVBMRS1DTFVTVEVSLVNFQ1JFVC0wMDAwMDAwMDA=",
        "ROTATED SERVICE ACCOUNT KEY",
        "EXAMPLE SERVICE ACCOUNT KEY",
        "Uk9UQVRFRC1DTFVTVEVSLVNFQ1JFVC0wMDAwMDAwMDA=",
    ];
    for (from, to) in [
        ("examples/configs/v1.13/controlplane.yaml", "tests/golden/config-diff-v1.13-redaction/desired.yaml"),
        ("examples/configs/v1.14/controlplane.yaml", "tests/golden/config-diff-v1.14-redaction/desired.yaml"),
    ] {
        for output in ["text", "json"] {
            let (code, out, err) = ichor(&["config", "diff", "--from", from, "--to", to, "--output", output]);
            assert_eq!(code, 1, "{err}");
            for s in secrets {
                assert!(!out.contains(s) && !err.contains(s), "{s} leaked in the {output} output of {to}");
            }
            assert!(out.contains("<redacted>"));
        }
    }
}
