//! Everything the `ichor` binary reads from disk, in one place: rule directories, configs,
//! manifests, snapshots. Commands call these and never touch the filesystem themselves.
//!
//! Start at `classifier` and `planner` (the shipped rules, or a `--rules DIR`), `read_config`
//! and `read_manifests`. Each error names the file (and, for parse errors, every
//! `path:line:col`) and is a typed library error or a `Diagnosed` carrying its diagnostics.

use crate::Diagnosed;
use anyhow::{Context, Result, bail};
use engine::Sources;
use render::classify::{Classifier, RuleSet};
use render::config::{Config, MAX_CONFIG_BYTES};
use render::manifests::Manifests;
use runtime::plan::{PlanError, Planner};
use std::path::{Path, PathBuf};

/// The size caps of what Ichor reads, enforced while reading (a file's reported size can lie:
/// `/dev/zero` reports none). Each error names its cap.
pub mod caps {
    /// A machine config, a manifest file, a rules file, a rule-test file, a values file.
    pub const TEXT: usize = 10 << 20;
    /// An observed-state snapshot: a 5,000-machine cluster with pending paths fits in a few MiB.
    pub const SNAPSHOT: usize = 64 << 20;
    /// A FACTS.json for `rules eval`, and a schema for `contract derive` or `cni schema derive`.
    pub const FACTS: usize = 256 << 20;
}

/// Reads rule files from disk for the engine's loader, each at most `caps::TEXT` bytes, and
/// only inside `dir`: an `.include` that leads elsewhere (`/etc/passwd`, `../../x`) is refused
/// before anything is read, so no other file's text reaches a diagnostic.
pub struct FsSources {
    dir: PathBuf,
}

impl FsSources {
    /// Files inside `dir` (a rules directory), or inside the deepest directory that holds
    /// every one of `files` when `dir` is `None`.
    pub fn within(dir: Option<&Path>, files: &[String]) -> Result<FsSources> {
        let dir = match dir {
            Some(d) => absolute(d),
            None => {
                let mut common: Option<PathBuf> = None;
                for f in files {
                    let parent = absolute(Path::new(f)).parent().map(Path::to_path_buf).unwrap_or_default();
                    common = Some(match common {
                        None => parent,
                        Some(c) => {
                            c.ancestors().find(|a| parent.starts_with(a)).unwrap_or(Path::new("/")).to_path_buf()
                        }
                    });
                }
                common.unwrap_or_else(|| PathBuf::from("/"))
            }
        };
        Ok(FsSources { dir })
    }
}

impl Sources for FsSources {
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        // Lexically (the loader folds `..` the same way): a link inside the directory is the
        // directory owner's choice; a path written to leave it is refused.
        let real = absolute(Path::new(path));
        if !real.starts_with(&self.dir) {
            return Err(std::io::Error::other(format!(
                "it is outside {}: an include stays inside the rules' directory",
                self.dir.display()
            )));
        }
        read_bounded(&real, caps::TEXT, "a rules file")
    }
}

/// `p` from the working directory, with `.` and `..` folded without touching the disk.
fn absolute(p: &Path) -> PathBuf {
    let joined = std::env::current_dir().unwrap_or_default().join(p);
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The bytes of `path`, refused past `limit` bytes while reading.
fn read_bounded(path: &Path, limit: usize, what: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    if file.metadata()?.is_dir() {
        return Err(std::io::Error::other("it is a directory, not a file"));
    }
    let mut bytes = vec![];
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        let mib = limit >> 20;
        return Err(std::io::Error::other(format!("over the {limit}-byte ({mib} MiB) limit for {what}")));
    }
    Ok(bytes)
}

/// Every file under `dir` (recursively, following links but never into a directory twice, so
/// that a loop of links ends) whose extension is one of `exts`, sorted.
pub fn files_under(dir: &Path, exts: &[&str]) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let real = std::fs::canonicalize(&d).with_context(|| format!("reading directory {}", d.display()))?;
        if !seen.insert(real) {
            continue;
        }
        let entries = std::fs::read_dir(&d).with_context(|| format!("reading directory {}", d.display()))?;
        for e in entries {
            let p = e?.path();
            // A link that leads nowhere (or to itself) is skipped, as `find -L` reports and goes on.
            let Ok(meta) = std::fs::metadata(&p) else { continue };
            if meta.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `p` as the loader names it (without a leading `./`).
fn loader_name(p: &Path) -> String {
    p.strip_prefix(".").unwrap_or(p).to_string_lossy().into_owned()
}

/// Every `.rules` file under `dir`, sorted, as paths the loader can read.
pub(crate) fn rule_files(dir: &Path) -> Result<Vec<String>> {
    let out: Vec<String> = files_under(dir, &["rules"])?.iter().map(|p| loader_name(p)).collect();
    if out.is_empty() {
        bail!("no .rules file under {}: point --rules at the rules directory", dir.display());
    }
    Ok(out)
}

/// Every `.rules` file under `dir` with its text.
fn rule_texts(dir: &Path) -> Result<Vec<(String, String)>> {
    rule_files(dir)?
        .into_iter()
        .map(|f| {
            let text = read_text(Path::new(&f), caps::TEXT, "a rules file")?;
            Ok((f, text))
        })
        .collect()
}

/// The root of a host's program under a rules directory (`programs/<host>.rules`).
pub fn program_root(dir: &Path, host: &str) -> String {
    loader_name(&dir.join("programs").join(format!("{host}.rules")))
}

/// The classifier's rule set from `dir`, or the embedded one.
pub fn ruleset(dir: Option<&Path>) -> Result<RuleSet> {
    let Some(dir) = dir else {
        return Ok(RuleSet::embedded());
    };
    let read = |p: PathBuf| -> Result<(String, String)> {
        let text = read_text(&p, caps::TEXT, "a rules directory's file")?;
        Ok((p.to_string_lossy().into_owned(), text))
    };
    let fieldmeta = read(dir.join("fieldmeta.yaml"))?;
    let rules = rule_texts(dir)?;
    let mut contracts = vec![];
    for p in files_under(&dir.join("contracts"), &["paths"])? {
        let name = p.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        contracts.push((name, read(p)?.1));
    }
    Ok(RuleSet { fieldmeta, rules, root: program_root(dir, "config"), contracts })
}

/// The classifier from `dir`, or the embedded one; every load problem is printed.
pub fn classifier(dir: Option<&Path>) -> Result<Classifier> {
    let set = ruleset(dir)?;
    Classifier::new(&set).map_err(|e| {
        let summary = e.to_string();
        Diagnosed { diagnostics: e.problems.iter().map(|p| format!("{p}\n")).collect(), summary }.into()
    })
}

/// The operations planner from `dir`, or the embedded one; every load problem is printed.
pub fn planner(dir: Option<&Path>) -> Result<Planner> {
    let planner = match dir {
        None => Planner::embedded(),
        Some(dir) => {
            let messages = dir.join("messages.yaml");
            let text = read_text(&messages, caps::TEXT, "message templates")?;
            Planner::new(&rule_texts(dir)?, &program_root(dir, "operations"), (&loader_name(&messages), &text))
        }
    };
    planner.map_err(|e| match e {
        PlanError::Load(load) => {
            Diagnosed { diagnostics: load.render(), summary: PlanError::Load(load).to_string() }.into()
        }
        other => anyhow::Error::new(other),
    })
}

/// Reads a file of at most `limit` bytes as UTF-8 text; `what` names the kind of file.
pub(crate) fn read_text(path: &Path, limit: usize, what: &str) -> Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.len() as usize > limit {
        let mib = limit >> 20;
        bail!(
            "{}: the file is {} bytes, over the {limit}-byte ({mib} MiB) limit for {what}",
            path.display(),
            meta.len()
        );
    }
    let bytes = read_bounded(path, limit, what).with_context(|| format!("reading {}", path.display()))?;
    String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text (byte {})", path.display(), e.utf8_error().valid_up_to()))
}

/// Reads and parses a config file; errors are `file:line:col: error: ...`, all of them.
pub fn read_config(path: &Path) -> Result<Config> {
    let text = read_text(path, MAX_CONFIG_BYTES, "a machine configuration")?;
    Config::parse(&text).map_err(|errs| {
        Diagnosed {
            diagnostics: errs
                .iter()
                .map(|e| format!("{}:{}:{}: error: {}\n", path.display(), e.line, e.col, e.message))
                .collect(),
            summary: format!("{} is not a Talos machine configuration Ichor can read", path.display()),
        }
        .into()
    })
}

/// Every `*.yaml`/`*.yml` file under `dir`, sorted, with its text, loaded as manifests.
/// Every `*.yaml`/`*.yml` file under `dir`, sorted, with its text.
/// The example installation `--manifests` defaults to (`ichor sim cluster`, `sim controller`,
/// `plan`): embedded, so the default works from any directory (issue 50: it worked only from
/// the repository's root). A folder of that name on disk is read instead.
pub const EXAMPLE_DIR: &str = "examples/clusters/lab-v1.14";
const EXAMPLE: [(&str, &str); 4] = [
    ("cluster.yaml", include_str!("../../examples/clusters/lab-v1.14/cluster.yaml")),
    ("machines.yaml", include_str!("../../examples/clusters/lab-v1.14/machines.yaml")),
    ("patches.yaml", include_str!("../../examples/clusters/lab-v1.14/patches.yaml")),
    ("secrets.yaml", include_str!("../../examples/clusters/lab-v1.14/secrets.yaml")),
];

pub fn manifest_files(dir: &Path) -> Result<Vec<(String, String)>> {
    if dir == Path::new(EXAMPLE_DIR) && !dir.exists() {
        return Ok(EXAMPLE.iter().map(|(f, text)| (format!("{EXAMPLE_DIR}/{f}"), text.to_string())).collect());
    }
    let mut texts = vec![];
    for f in files_under(dir, &["yaml", "yml"])? {
        let text = read_text(&f, caps::TEXT, "a manifest file")?;
        texts.push((f.to_string_lossy().into_owned(), text));
    }
    Ok(texts)
}

pub fn read_manifests(dir: &Path, c: &Classifier) -> Result<Manifests> {
    let texts = manifest_files(dir)?;
    let contracts: Vec<String> = c.known().iter().map(ToString::to_string).collect();
    Manifests::load(&texts, &contracts).map_err(|errs| {
        Diagnosed {
            diagnostics: errs.iter().map(|e| format!("{e}\n")).collect(),
            summary: format!("the manifests in {} are not valid; fix them and run again", dir.display()),
        }
        .into()
    })
}

/// A machine's render, checked against its contract; the problems are printed one per line.
pub fn render_machine(
    m: &Manifests,
    machine: &str,
    contract: Option<&str>,
    c: &Classifier,
) -> Result<render::render::Rendered> {
    render_result(render::machine::render_checked(m, machine, contract, c))
}

/// A machine's render without the Talos check (`config diff --manifests` reports refusals as
/// the machine's condition).
pub fn render_machine_unchecked(
    m: &Manifests,
    machine: &str,
    contract: Option<&str>,
    c: &Classifier,
) -> Result<render::render::Rendered> {
    render_result(render::machine::render_unchecked(m, machine, contract, c))
}

fn render_result(
    r: Result<render::render::Rendered, render::machine::MachineError>,
) -> Result<render::render::Rendered> {
    use render::machine::MachineError;
    r.map_err(|e| match e {
        // The library names the problem; the command line names the flag that caused it.
        MachineError::Unknown(_) => anyhow::Error::new(e).context("--machine"),
        MachineError::Contract(_) => anyhow::Error::new(e).context("--contract"),
        _ if e.problems().is_empty() => anyhow::Error::new(e),
        _ => {
            let diagnostics = e.problems().iter().map(|p| format!("{p}\n")).collect();
            Diagnosed { diagnostics, summary: e.to_string() }.into()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded example is the folder as it is: a file added there is embedded too.
    #[test]
    fn the_embedded_example_is_the_examples_folder() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let on_disk = manifest_files(&root.join(EXAMPLE_DIR)).unwrap();
        let names: Vec<String> =
            on_disk.iter().map(|(p, _)| Path::new(p).file_name().unwrap().to_string_lossy().into_owned()).collect();
        let embedded: Vec<&str> = EXAMPLE.iter().map(|(f, _)| *f).collect();
        assert_eq!(names, embedded, "list the example's files in disk::EXAMPLE");
        for ((_, text), (_, e)) in on_disk.iter().zip(EXAMPLE) {
            assert_eq!(text, e);
        }
    }
}
