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

// ---- tidy: the house as drawn (rust-analyzer's xtask tidy, in miniature) ----------------

/// The workspace root.
fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, recursively, as a path relative to the root.
fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let (p, ft) = (e.path(), e.file_type().unwrap());
        if ft.is_dir() {
            rust_files(&p, out);
        } else if ft.is_file() && p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

const CRATES: [&str; 4] = ["engine", "render", "runtime", "cli"];

/// Every Rust file opens with a `//!` comment saying what it is and where to start.
#[test]
fn tidy_every_rust_file_opens_with_a_module_doc() {
    let mut files = vec![];
    for c in CRATES {
        rust_files(&root().join(c), &mut files);
    }
    let missing: Vec<String> = files
        .iter()
        .filter(|f| !std::fs::read_to_string(f).unwrap().starts_with("//!"))
        .map(|f| f.strip_prefix(root()).unwrap_or(f).display().to_string())
        .collect();
    assert!(missing.is_empty(), "these files do not open with `//!`: {missing:?}");
}

/// `src/lib.rs` (or `main.rs`) declares every module file of its crate, and the README's code
/// map names every module as `crate::module`, so that a newcomer finds each one from it.
#[test]
fn tidy_every_module_is_declared_and_in_the_code_map() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut problems = vec![];
    for c in CRATES {
        let src = root().join(c).join("src");
        let top = if src.join("lib.rs").exists() { "lib.rs" } else { "main.rs" };
        let top_text = std::fs::read_to_string(src.join(top)).unwrap();
        let mut files = vec![];
        rust_files(&src, &mut files);
        for f in files {
            let rel = f.strip_prefix(&src).unwrap();
            if rel == std::path::Path::new(top) || rel.components().count() > 1 {
                continue;
            }
            let name = rel.file_stem().unwrap().to_string_lossy();
            if name == "tests" {
                continue;
            }
            if !top_text.contains(&format!("mod {name};")) {
                problems.push(format!("{c}/src/{top} does not declare `mod {name};`"));
            }
            if !readme.contains(&format!("`{c}::{name}`")) {
                problems.push(format!("README.md's code map does not name `{c}::{name}`"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The pure crates never name an async runtime, RPC stack or Kubernetes client in their
/// sources (engine/tests checks their dependency graph through `cargo metadata`).
#[test]
fn tidy_pure_crates_import_no_io_stack() {
    let forbidden = ["tokio", "tonic", "hyper", "kube::Client", "kube::Api", "kube_runtime", "reqwest", "std::net"];
    let mut problems = vec![];
    for c in ["engine", "render"] {
        let mut files = vec![];
        rust_files(&root().join(c).join("src"), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for word in forbidden {
                if text.lines().any(|l| !l.trim_start().starts_with("//") && l.contains(word)) {
                    problems.push(format!("{} names {word}", f.strip_prefix(root()).unwrap().display()));
                }
            }
        }
    }
    assert!(problems.is_empty(), "the pure crates must do no I/O: {}", problems.join("; "));
}

/// Every contract inventory under rules/contracts/ is embedded (build.rs lists them) and
/// named in the README.
#[test]
fn tidy_every_contract_inventory_is_embedded_and_listed() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut on_disk: Vec<String> = std::fs::read_dir(root().join("rules/contracts"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "paths"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let embedded: Vec<String> = render::embedded::CONTRACTS.iter().map(|(c, _)| c.to_string()).collect();
    assert_eq!(embedded, on_disk, "build.rs embeds every rules/contracts/*.paths");
    for c in &on_disk {
        assert!(readme.contains(&format!("rules/contracts/{c}.paths")), "README.md does not list {c}");
    }
}
