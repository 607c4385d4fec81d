//! Helpers the cli's test files and benchmarks share: the workspace root, the Rust files under a
//! folder, and `ichor sim cluster` started in a folder of its own.
//!
//! Start at `root`.
#![allow(dead_code)] // each test file and benchmark uses what it needs

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The workspace root.
pub fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, recursively.
pub fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let (p, ft) = (e.path(), e.file_type().unwrap());
        if ft.is_dir() {
            rust_files(&p, out);
        } else if ft.is_file() && p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `ichor sim cluster ARGS` in `dir` (its kubeconfig and talosconfig written there), from the
/// workspace root, once it printed `ready:`.
pub fn spawn_sim(dir: &std::path::Path, args: &[&str]) -> Child {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(["sim", "cluster"])
        .args(args)
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .arg("--talosconfig")
        .arg(dir.join("talosconfig"))
        .current_dir(root())
        .env("ICHOR_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("ready:"), "the simulated cluster did not start: {line:?}");
    child
}
