//! `ichor rules check|eval|test`: the engine on any program (interfaces.md).
//!
//! `check` loads every `.rules` file under a directory; `eval` evaluates given files over a
//! FACTS.json and prints every `.output` relation (and proofs with `--explain`); `test` runs
//! the YAML cases under `<rules>/tests/`. File reading lives here: the engine does no I/O.

use crate::{Diagnosed, Output, Report, disk};
use anyhow::{Context, Result, anyhow, bail};
use clap::Subcommand;
use engine::explain::{self, Explanation};
use engine::{Database, Engine, EvalOptions};
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum RulesCommand {
    /// Load every .rules file under DIR and run all static checks.
    #[command(after_help = "Example:\n  ichor rules check --rules rules/")]
    Check {
        #[arg(long, default_value = "rules")]
        rules: PathBuf,
    },
    /// Evaluate rule files over facts and print every .output relation.
    #[command(
        after_help = "Examples:\n  ichor rules eval examples/rules/tc.rules --facts examples/rules/tc.facts.json\n  ichor rules eval tc.rules --facts f.json --output json --explain 'path(1, 4)'"
    )]
    Eval {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// FACTS.json: {"relation": [[value, ...], ...]}; strings are symbols, integers numbers.
        #[arg(long)]
        facts: Option<PathBuf>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        /// A tuple to explain, as rel("a", 1); repeatable.
        #[arg(long)]
        explain: Vec<String>,
        /// Print to stderr how long loading, reading the facts, evaluating and writing took.
        #[arg(long)]
        timings: bool,
        /// Stop past this many tuples (all relations together, or one join step's rows).
        #[arg(long, default_value_t = EvalOptions::default().max_tuples)]
        max_tuples: usize,
        /// Stop a recursive stratum past this many rounds.
        #[arg(long, default_value_t = EvalOptions::default().max_rounds)]
        max_rounds: usize,
    },
    /// Run the rule tests under DIR/tests/*.yaml against the rules in DIR.
    #[command(after_help = "Example:\n  ichor rules test --rules rules/")]
    Test {
        #[arg(long, default_value = "rules")]
        rules: PathBuf,
    },
}

pub fn run(cmd: RulesCommand) -> Result<Report> {
    match cmd {
        RulesCommand::Check { rules } => check(&rules),
        RulesCommand::Eval { files, facts, output, explain, timings, max_tuples, max_rounds } => {
            let budget = EvalOptions { max_tuples, max_rounds, ..EvalOptions::default() };
            eval(&files, facts.as_deref(), output, &explain, timings, budget)
        }
        RulesCommand::Test { rules } => test(&rules),
    }
}

/// Loads and compiles, or fails with every diagnostic; on success, the warnings rendered.
fn load(files: &[String], dir: Option<&Path>) -> Result<(Engine, String)> {
    match Engine::load(files, &disk::FsSources::within(dir, files)?) {
        Ok((engine, warnings)) => {
            let text = engine::diag::render(&warnings, &engine.program.sources);
            Ok((engine, text))
        }
        Err(e) => {
            let n = e.diagnostics.iter().filter(|d| d.is_error()).count();
            Err(Diagnosed {
                diagnostics: e.render(),
                summary: format!("the rules do not load: {n} error(s); fix them and run `ichor rules check`"),
            }
            .into())
        }
    }
}

fn check(dir: &Path) -> Result<Report> {
    let files = disk::rule_files(dir)?;
    let (engine, warnings) = load(&files, Some(dir))?;
    // Each host's program, from its root under programs/, with the relations the host binds.
    if std::path::Path::new(&disk::program_root(dir, "operations")).is_file() {
        disk::planner(Some(dir))?;
    }
    let p = &engine.program;
    let user_rels = p.relations.iter().filter(|r| !r.aux).count();
    let user_rules = p.rules.iter().filter(|r| r.aux_of.is_none()).count();
    let mut stdout = format!(
        "ok: {} file(s), {user_rels} relation(s), {user_rules} rule(s), {} stratum(s)\n",
        files.len(),
        p.strata.len()
    );
    let mut findings = false;
    if dir.join("fieldmeta.yaml").exists() {
        // Field metadata: loads, is unambiguous, and covers each contract's inventory.
        let c = disk::classifier(Some(dir))?;
        let inventories = c.contracts.iter().map(|(k, d)| (*k, d.inventory.clone())).collect();
        let (_, coverage) = c.meta.check_inventories(&inventories);
        stdout += &format!("ok: {} field-metadata entries\n", c.meta.entries.len());
        stdout += "coverage (inventory paths decided by an explicit entry):\n";
        for (contract, cov) in coverage {
            let decided = cov.total - cov.defaulted.len();
            let pct = if cov.total == 0 { 100.0 } else { 100.0 * decided as f64 / cov.total as f64 };
            stdout += &format!("  {contract}: {decided} of {} ({pct:.1} %)\n", cov.total);
            for p in &cov.defaulted {
                findings = true;
                stdout += &format!("    falls to the default (reboot-required): {p}\n");
            }
        }
    }
    Ok(Report { stdout, stderr: warnings, findings, ..Report::default() })
}

fn eval(
    files: &[PathBuf],
    facts: Option<&Path>,
    output: Output,
    explain_args: &[String],
    timings: bool,
    budget: EvalOptions,
) -> Result<Report> {
    let start = std::time::Instant::now();
    let files: Vec<String> = files.iter().map(|f| f.to_string_lossy().into_owned()).collect();
    let (engine, warnings) = load(&files, None)?;
    let loaded = start.elapsed();
    // Facts stream from the text into interned rows: no tree of JSON values.
    let built = match facts {
        Some(path) => {
            let text = disk::read_text(path, disk::caps::FACTS, "a facts file")?;
            engine::facts::read_json(&text, &engine).map_err(|errs| fact_errors(path, &errs))?
        }
        None => engine.fact_builder(),
    };
    let read = start.elapsed();
    let mut targets = vec![];
    for e in explain_args {
        let (rel, values) = explain::parse_tuple(e).with_context(|| format!("--explain {e:?}"))?;
        targets.push((rel, values));
    }
    let opts = EvalOptions { provenance: !targets.is_empty(), ..budget };
    let db = engine.evaluate_built(built, opts).context("evaluation failed")?;
    let evaluated = start.elapsed();
    let mut explanations = vec![];
    for (rel, values) in &targets {
        explanations.push(explain::explain(&engine.program, &db, rel, values).context("--explain")?);
    }
    let stdout = match output {
        Output::Json => json_output(&engine, &db, &explanations),
        Output::Yaml => {
            Output::Yaml.data(&serde_json::from_str::<serde_json::Value>(&json_output(&engine, &db, &explanations))?)?
        }
        Output::Text | Output::Wide => text_output(&engine, &db, &explanations),
    };
    let mut stderr = warnings;
    if timings {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let written = start.elapsed();
        stderr += &format!(
            "timings: load {:.1} ms, facts {:.1} ms, evaluation {:.1} ms, output {:.1} ms, total {:.1} ms\n",
            ms(loaded),
            ms(read - loaded),
            ms(evaluated - read),
            ms(written - evaluated),
            ms(written)
        );
    }
    Ok(Report { stdout, stderr, ..Report::default() })
}

fn fact_errors(path: &Path, errs: &[engine::facts::FactError]) -> anyhow::Error {
    let lines: Vec<String> = errs.iter().map(|e| format!("{}: error: {e}", path.display())).collect();
    anyhow!(Diagnosed {
        diagnostics: lines.join("\n") + "\n",
        summary: format!("the facts in {} are not valid for this program", path.display())
    })
}

fn outputs_sorted(engine: &Engine) -> Vec<engine::RelId> {
    let mut outs: Vec<_> = engine.program.outputs().collect();
    outs.sort_by(|a, b| engine.program.relations[*a].name.cmp(&engine.program.relations[*b].name));
    outs
}

/// A value as JSON: a number, or a string with JSON's escapes.
fn push_json(out: &mut String, c: &engine::Const) {
    match c {
        engine::Const::Num(n) => out.push_str(&n.to_string()),
        engine::Const::Sym(s) => out.push_str(&serde_json::Value::from(s.as_str()).to_string()),
    }
}

/// One JSON object: each output relation's tuples (one tuple per line, for readable diffs),
/// then `"explanations"` when asked for. Written row by row from the interned results.
fn json_output(engine: &Engine, db: &Database, explanations: &[Explanation]) -> String {
    let mut out = String::from("{\n");
    let outs = outputs_sorted(engine);
    let ranks = db.value_ranks();
    if outs.is_empty() && explanations.is_empty() {
        out.push('\n');
    }
    for (k, &r) in outs.iter().enumerate() {
        out.push_str("  ");
        out.push_str(&serde_json::Value::String(engine.program.relations[r].name.clone()).to_string());
        out.push_str(": [");
        for (i, row) in db.rows_in_value_order(r, &ranks).into_iter().enumerate() {
            out.push_str(if i == 0 { "\n    [" } else { ",\n    [" });
            for (c, &id) in row.iter().enumerate() {
                if c > 0 {
                    out.push(',');
                }
                push_json(&mut out, db.value(id));
            }
            out.push(']');
        }
        out.push_str(if db.rels[r].is_empty() { "]" } else { "\n  ]" });
        if k + 1 < outs.len() || !explanations.is_empty() {
            out.push(',');
        }
        out.push('\n');
    }
    if !explanations.is_empty() {
        let list: serde_json::Value = explanations.iter().map(Explanation::to_json).collect();
        let pretty = serde_json::to_string_pretty(&list).unwrap_or_default().replace('\n', "\n  ");
        out.push_str(&format!("  \"explanations\": {pretty}\n"));
    }
    out.push_str("}\n");
    out
}

fn text_output(engine: &Engine, db: &Database, explanations: &[Explanation]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let ranks = db.value_ranks();
    for r in outputs_sorted(engine) {
        let name = &engine.program.relations[r].name;
        let _ = writeln!(out, "{name}: {} tuple(s)", db.rels[r].len());
        for row in db.rows_in_value_order(r, &ranks) {
            let _ = write!(out, "  {name}(");
            for (c, &id) in row.iter().enumerate() {
                let _ = write!(out, "{}{}", if c > 0 { ", " } else { "" }, db.value(id));
            }
            out.push_str(")\n");
        }
    }
    for e in explanations {
        out.push_str("\nexplanation:\n");
        out.push_str(&e.to_string());
    }
    out
}

fn test(dir: &Path) -> Result<Report> {
    let files = disk::rule_files(dir)?;
    let (engine, warnings) = load(&files, Some(dir))?;
    let tests_dir = dir.join("tests");
    let mut cases_files = vec![];
    if tests_dir.is_dir() {
        for e in std::fs::read_dir(&tests_dir).with_context(|| format!("reading {}", tests_dir.display()))? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                cases_files.push(p);
            }
        }
    }
    cases_files.sort();
    if cases_files.is_empty() {
        bail!("no rule tests under {}: add YAML cases there (see `ichor rules test --help`)", tests_dir.display());
    }
    let mut out = String::new();
    let (mut passed, mut failed) = (0, 0);
    for path in &cases_files {
        let text = disk::read_text(path, disk::caps::TEXT, "a rule-test file")?;
        // The one bounded reader first: a rule-test file's aliases cannot expand it past the cap.
        if let Err(e) = render::yaml::parse_documents(&text, disk::caps::TEXT) {
            let at = e.line.map(|l| format!(":{l}:{}", e.col.unwrap_or(1))).unwrap_or_default();
            anyhow::bail!("{}{at}: {}", path.display(), e.message);
        }
        let cases = engine::ruletest::parse(&text).with_context(|| path.display().to_string())?;
        for case in &cases {
            let result = engine::ruletest::run(&engine, case);
            if result.failures.is_empty() {
                passed += 1;
                out.push_str(&format!("ok   {}: {}\n", path.display(), case.name));
            } else {
                failed += 1;
                out.push_str(&format!("FAIL {}: {}\n", path.display(), case.name));
                for f in &result.failures {
                    out.push_str(&engine::ruletest::render_failure(f));
                }
            }
        }
    }
    out.push_str(&format!("{passed} passed, {failed} failed\n"));
    Ok(Report { stdout: out, stderr: warnings, findings: failed > 0, ..Report::default() })
}
