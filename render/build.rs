//! Lists the files under `rules/` that the build embeds: every `.rules` file (the programs
//! and what they include) and every contract inventory `rules/contracts/vX.Y.paths`, so that
//! adding a rules file or a contract needs no Rust edit. Writes `$OUT_DIR/embedded_files.rs`,
//! included by `src/embedded.rs`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        // Directories only, never a link: a loop of links must not hang the build.
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(&p, ext, out);
        } else if ft.is_file() && p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("render sits in the workspace").to_path_buf();
    let rules = root.join("rules");
    println!("cargo:rerun-if-changed={}", rules.display());
    let mut files = vec![];
    walk(&rules, "rules", &mut files);
    let mut contracts = vec![];
    walk(&rules.join("contracts"), "paths", &mut contracts);
    files.sort();
    contracts.sort();
    let mut src = String::new();
    src.push_str("/// Every `.rules` file under `rules/`: `(name as shown in proofs, contents)`.\n");
    src.push_str("pub const RULE_FILES: &[(&str, &str)] = &[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f.strip_prefix(&root).expect("under the workspace").to_string_lossy().replace('\\', "/");
        writeln!(src, "    ({rel:?}, include_str!({:?})),", f.display().to_string()).expect("a String takes writes");
    }
    src.push_str("];\n\n/// Every contract inventory: `(contract, inventory text)`.\n");
    src.push_str("pub const CONTRACTS: &[(&str, &str)] = &[\n");
    for f in &contracts {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f.file_stem().expect("a file name").to_string_lossy();
        writeln!(src, "    ({name:?}, include_str!({:?})),", f.display().to_string()).expect("a String takes writes");
    }
    src.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("embedded_files.rs");
    std::fs::write(out, src).expect("OUT_DIR is writable");
    // Directories: a new file in a subdirectory must re-run the listing.
    for d in [rules.join("programs"), rules.join("contracts")] {
        println!("cargo:rerun-if-changed={}", d.display());
    }
}
