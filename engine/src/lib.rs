//! Ichor's Datalog engine: the rule dialect of `rules-language.md`, evaluated on datafrog.
//!
//! Start here: `load` (files to a checked `Program`, with every diagnostic), `Engine::new`
//! (compile once), `Engine::evaluate` (run many times on new facts), `explain` (a proof of
//! any tuple, or why it does not hold), `ruletest` (facts in, expectations out).
//!
//! Architecture invariant: this crate knows no word of Talos, Kubernetes or Ichor and does no
//! I/O. Files come through the `Sources` trait; time, if a program needs it, is a fact.
//!
//! Pipeline: `lexer` -> `parser` (`ast`) -> `loader` (includes) -> `check` (`program`) ->
//! `plan` (join chains) -> `eval` (datafrog) -> `db` (results) -> `explain`. The `reference`
//! module is a slow, obviously correct evaluator kept to check `eval` on random programs.

#![warn(missing_docs)]

pub(crate) mod ast;
pub(crate) mod check;
pub(crate) mod db;
pub mod diag;
pub(crate) mod eval;
pub mod explain;
pub mod facts;
pub(crate) mod host;
pub(crate) mod lexer;
pub(crate) mod loader;
pub(crate) mod parser;
pub(crate) mod plan;
pub(crate) mod program;
pub mod reference;
pub mod ruletest;
pub(crate) mod sort;
pub(crate) mod value;

pub use ast::Type;
pub use db::Database;
pub use diag::{Diagnostic, Location, Severity, SourceMap, Span};
pub use eval::{Demand, EvalError, EvalOptions, FactBuilder, Facts};
pub use host::{BindError, Binder, Input, Output};
pub use loader::{Loaded, MemSources, Sources, load, load_str};
pub use plan::QueryPlan;
pub use program::{Const, Program, RelId};
pub use value::{FxHashMap, parse_version, version_cmp};

/// A checked program compiled for evaluation; build once, evaluate many times.
#[derive(Debug)]
pub struct Engine {
    /// The checked program: relations, rules, strata, sources.
    pub program: Program,
    /// The compiled joins of every rule, made once at load.
    pub plan: QueryPlan,
}

/// Why a program cannot be used: every diagnostic of loading, checking and compiling, with
/// the file names they point into. Render with `LoadError::render`.
#[derive(Clone, Debug, thiserror::Error)]
#[error("the rules do not load ({} error(s))", diagnostics.iter().filter(|d| d.is_error()).count())]
pub struct LoadError {
    /// Every problem, each at its position.
    pub diagnostics: Vec<Diagnostic>,
    /// The files the diagnostics refer to.
    pub sources: SourceMap,
}

impl LoadError {
    /// Every diagnostic as `path:line:col: level: message`, one per line.
    pub fn render(&self) -> String {
        diag::render(&self.diagnostics, &self.sources)
    }
}

impl From<BindError> for LoadError {
    fn from(e: BindError) -> LoadError {
        LoadError { diagnostics: e.diagnostics, sources: e.sources }
    }
}

impl Engine {
    /// Compiles a checked program (fails only on the evaluator's limits, each at its rule).
    pub fn new(program: Program) -> Result<Engine, LoadError> {
        match QueryPlan::new(&program) {
            Ok(plan) => Ok(Engine { program, plan }),
            Err(diagnostics) => Err(LoadError { diagnostics, sources: program.sources.clone() }),
        }
    }

    /// Loads the program rooted at `roots` (their `.include`s with them), checks and compiles
    /// it. On success, also returns the warnings.
    pub fn load(roots: &[String], sources: &dyn Sources) -> Result<(Engine, Vec<Diagnostic>), LoadError> {
        let loaded = load(roots, sources);
        let Some(program) = loaded.program else {
            return Err(LoadError { diagnostics: loaded.diagnostics, sources: loaded.sources });
        };
        let warnings = loaded.diagnostics;
        Ok((Engine::new(program)?, warnings))
    }

    /// Evaluates on `facts`, indexed by relation id (see `facts::FactSet` to build them by name).
    pub fn evaluate(&self, facts: &Facts, opts: EvalOptions) -> Result<Database, EvalError> {
        eval::evaluate(&self.program, &self.plan, facts, opts)
    }

    /// A builder of interned facts: the fast path for hosts that know their relations' types.
    pub fn fact_builder(&self) -> FactBuilder {
        FactBuilder::new(&self.program, &self.plan)
    }

    /// Evaluates on facts made with `fact_builder`.
    pub fn evaluate_built(&self, facts: FactBuilder, opts: EvalOptions) -> Result<Database, EvalError> {
        eval::evaluate_built(&self.program, &self.plan, facts, opts)
    }

    /// What to evaluate for a host that reads only the relations `wanted`; make it once.
    pub fn demand(&self, wanted: &[RelId]) -> Demand {
        Demand::new(&self.program, wanted)
    }

    /// `evaluate_built` restricted to `demand`; the other relations stay empty. A host that
    /// reads a few relations of a larger program skips the rest.
    pub fn evaluate_built_for(
        &self,
        facts: FactBuilder,
        opts: EvalOptions,
        demand: &Demand,
    ) -> Result<Database, EvalError> {
        eval::evaluate_built_for(&self.program, &self.plan, facts, opts, Some(demand))
    }

    /// An empty fact set shaped for this program.
    pub fn empty_facts(&self) -> Facts {
        vec![vec![]; self.program.relations.len()]
    }
}
