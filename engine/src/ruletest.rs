//! Rule tests: facts in, expectations on derived relations out.
//!
//! A test file (YAML, under `rules/tests/`) holds one case or a list under `cases:`:
//!
//! ```yaml
//! name: control planes go first
//! facts:
//!   machine: [["c1", "controlplane"], ["w1", "worker"]]
//! expect:
//!   next_step:
//!     contains: [["c1"]]      # each listed tuple is derived
//!     excludes: [["w1"]]      # none of these is derived
//!   warning:
//!     equals: []              # exactly these tuples, no more
//! ```
//!
//! Strings are symbols and integers are numbers. `run` is pure: the CLI reads the files.
//! A failing case reports, per relation and check, the expected and the derived tuples.

use crate::db::Database;
use crate::facts::FactSet;
use crate::program::Const;
use crate::{Engine, EvalOptions};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
/// One rule-test case: input facts, and what must (or must not) be derived from them.
pub struct Case {
    /// What the case shows, as a sentence.
    pub name: String,
    #[serde(default)]
    /// The input facts, by relation.
    pub facts: BTreeMap<String, Vec<Vec<Scalar>>>,
    #[serde(default)]
    /// The checks, by derived relation.
    pub expect: BTreeMap<String, Expect>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
/// The checks on one relation.
pub struct Expect {
    #[serde(default)]
    /// Each listed tuple is derived.
    pub contains: Option<Vec<Vec<Scalar>>>,
    #[serde(default)]
    /// No listed tuple is derived.
    pub excludes: Option<Vec<Vec<Scalar>>>,
    #[serde(default)]
    /// Exactly these tuples are derived, no more.
    pub equals: Option<Vec<Vec<Scalar>>>,
}

/// A YAML value in a tuple: a string (symbol) or an integer (number).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Scalar {
    /// An integer: a number.
    Num(i64),
    /// A string: a symbol.
    Sym(String),
}

impl From<&Scalar> for Const {
    fn from(s: &Scalar) -> Const {
        match s {
            Scalar::Num(n) => Const::Num(*n),
            Scalar::Sym(s) => Const::Sym(s.clone()),
        }
    }
}

/// A rule-test file that does not parse: the place (`line:col: ` or `cases[i]: `) and problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    /// The place and the problem.
    pub message: String,
}

/// Parses a test file (YAML anchors and `<<` merge keys allowed, so cases can share facts);
/// the error names the case and the problem.
pub fn parse(text: &str) -> Result<Vec<Case>, ParseError> {
    parse_cases(text).map_err(|message| ParseError { message })
}

fn parse_cases(text: &str) -> Result<Vec<Case>, String> {
    let mut value: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| match e.location() {
        Some(l) => format!("{}:{}: {e}", l.line(), l.column()),
        None => e.to_string(),
    })?;
    value.apply_merge().map_err(|e| e.to_string())?;
    let many = value.get("cases").cloned();
    match many {
        Some(list) => {
            let serde_yaml::Value::Sequence(items) = list else {
                return Err("`cases` must be a list of cases".into());
            };
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| serde_yaml::from_value::<Case>(item).map_err(|e| format!("cases[{i}]: {e}")))
                .collect()
        }
        None => serde_yaml::from_value::<Case>(value).map(|c| vec![c]).map_err(|e| e.to_string()),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
/// One check of a case that did not hold.
pub struct Failure {
    /// The relation checked.
    pub relation: String,
    /// `contains`, `excludes`, `equals`, or `error` when the case could not run.
    pub check: String,
    /// The tuples the check expected.
    pub expected: Vec<String>,
    /// The tuples derived.
    pub derived: Vec<String>,
    /// Why the case could not run, when it could not.
    pub message: Option<String>,
}

#[derive(Clone, Debug)]
/// The result of one case.
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// Its failed checks; empty when it passed.
    pub failures: Vec<Failure>,
}

fn tuples(list: &[Vec<Scalar>]) -> BTreeSet<Vec<Const>> {
    list.iter().map(|t| t.iter().map(Const::from).collect()).collect()
}

/// Runs one case on a compiled program.
pub fn run(engine: &Engine, case: &Case) -> CaseResult {
    let error = |relation: &str, message: String| CaseResult {
        name: case.name.clone(),
        failures: vec![Failure {
            relation: relation.into(),
            check: "error".into(),
            expected: vec![],
            derived: vec![],
            message: Some(message),
        }],
    };
    let mut set = FactSet::default();
    for (rel, ts) in &case.facts {
        for t in ts {
            set.add(rel, t.iter().map(Const::from).collect());
        }
        set.relations.entry(rel.clone()).or_default();
    }
    let facts = match set.resolve(&engine.program) {
        Ok(f) => f,
        Err(errs) => {
            let msg: Vec<String> = errs.iter().map(ToString::to_string).collect();
            return error("", format!("bad facts: {}", msg.join("; ")));
        }
    };
    let db = match engine.evaluate(&facts, EvalOptions::default()) {
        Ok(db) => db,
        Err(e) => return error("", format!("evaluation failed: {e}")),
    };
    let mut failures = vec![];
    for (rel, expect) in &case.expect {
        let Some(r) = engine.program.relation(rel).filter(|&r| !engine.program.relations[r].aux) else {
            failures.push(Failure {
                relation: rel.clone(),
                check: "error".into(),
                expected: vec![],
                derived: vec![],
                message: Some(format!("the program has no relation `{rel}`")),
            });
            continue;
        };
        let derived: BTreeSet<Vec<Const>> = db.decoded(r).into_iter().collect();
        let show = |ts: &BTreeSet<Vec<Const>>| -> Vec<String> {
            ts.iter().map(|t| Database::format_tuple(&engine.program, r, t)).collect()
        };
        if let Some(list) = &expect.contains {
            let want = tuples(list);
            let missing: BTreeSet<_> = want.difference(&derived).cloned().collect();
            if !missing.is_empty() {
                failures.push(Failure {
                    relation: rel.clone(),
                    check: "contains".into(),
                    expected: show(&missing),
                    derived: show(&derived),
                    message: None,
                });
            }
        }
        if let Some(list) = &expect.excludes {
            let unwanted = tuples(list);
            let present: BTreeSet<_> = unwanted.intersection(&derived).cloned().collect();
            if !present.is_empty() {
                failures.push(Failure {
                    relation: rel.clone(),
                    check: "excludes".into(),
                    expected: vec![],
                    derived: show(&present),
                    message: None,
                });
            }
        }
        if let Some(list) = &expect.equals {
            let want = tuples(list);
            if want != derived {
                failures.push(Failure {
                    relation: rel.clone(),
                    check: "equals".into(),
                    expected: show(&want),
                    derived: show(&derived),
                    message: None,
                });
            }
        }
    }
    CaseResult { name: case.name.clone(), failures }
}

/// Expected and derived tuples side by side, one row per distinct tuple.
pub fn render_failure(f: &Failure) -> String {
    let mut out = String::new();
    if let Some(m) = &f.message {
        out.push_str(&format!(
            "  {}{}\n",
            if f.relation.is_empty() { String::new() } else { format!("{}: ", f.relation) },
            m
        ));
        return out;
    }
    let title = match f.check.as_str() {
        "contains" => "expected to contain",
        "excludes" => "expected not to contain, but derived",
        _ => "expected exactly",
    };
    out.push_str(&format!("  {} ({title}):\n", f.relation));
    let all: BTreeSet<&String> = f.expected.iter().chain(&f.derived).collect();
    let width = f.expected.iter().map(String::len).max().unwrap_or(0).max("expected".len());
    out.push_str(&format!("    {:width$} | derived\n", "expected"));
    for t in all {
        let e = if f.expected.contains(t) { t.as_str() } else { "-" };
        let d = if f.derived.contains(t) { t.as_str() } else { "-" };
        if f.check == "excludes" {
            out.push_str(&format!("    {:width$} | {d}\n", "(absent)"));
        } else {
            out.push_str(&format!("    {e:width$} | {d}\n"));
        }
    }
    out
}
