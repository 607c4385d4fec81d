//! The typed boundary between a host and a program: the relations a host fills and reads,
//! declared once in Rust and bound to a loaded program once, at load.
//!
//! Start at `Binder`. A host (classification, a machine's condition, an operation's plan)
//! writes one struct of `Input<N>` and `Output<N>` handles, made by `Binder::input` and
//! `Binder::output` with each column's name and type; `Binder::finish` then reports every
//! relation the program lacks, declares with another arity or column type, or does not mark
//! `.input`, as diagnostics with `path:line:col`. After a successful bind, pushing a row or
//! reading one through a handle cannot name an undeclared relation or the wrong arity: the
//! arity is in the handle's type, and the rest was checked at load.
//!
//! Invariant: a host never looks a relation up by name after load, so a broken rules set is a
//! load error ("rules fail to load: here is why"), never a panic during evaluation.

use crate::ast::Type;
use crate::db::Database;
use crate::diag::{Diagnostic, SourceMap, Span};
use crate::eval::FactBuilder;
use crate::program::{Program, RelId};
use std::fmt;

/// One column of a host relation: its name (for messages) and type.
pub type Column = (&'static str, Type);

/// A relation the host fills with facts; `N` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Input<const N: usize> {
    rel: RelId,
}

impl<const N: usize> Input<N> {
    /// The relation's id in the bound program.
    pub fn id(self) -> RelId {
        self.rel
    }

    /// Adds one row of interned values (made with `FactBuilder::sym` and `num`).
    pub fn push(self, facts: &mut FactBuilder, row: [u32; N]) {
        facts.push(self.rel, &row);
    }
}

/// A relation the host reads after evaluation; `N` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Output<const N: usize> {
    rel: RelId,
}

impl<const N: usize> Output<N> {
    /// The relation's id in the bound program.
    pub fn id(self) -> RelId {
        self.rel
    }

    /// The relation's rows, sorted, as interned ids (decode with `Database::sym`/`num`).
    pub fn rows(self, db: &Database) -> impl Iterator<Item = [u32; N]> + '_ {
        db.rels[self.rel].iter().map(|r| {
            let mut row = [0; N];
            row.copy_from_slice(&r[..N]);
            row
        })
    }

    /// Whether the relation holds any row.
    pub fn any(self, db: &Database) -> bool {
        !db.rels[self.rel].is_empty()
    }
}

/// Why a program cannot serve a host: every mismatch, each at a position.
#[derive(Clone, Debug, thiserror::Error)]
#[error("the rules do not declare the relations the {host} host needs ({} problem(s))", diagnostics.len())]
pub struct BindError {
    /// The host that bound the program (`operations`, `hand-over`, ...).
    pub host: &'static str,
    /// Every mismatch, each at the declaration (or the program's root) at fault.
    pub diagnostics: Vec<Diagnostic>,
    /// The files the diagnostics refer to.
    pub sources: SourceMap,
}

impl BindError {
    /// Every diagnostic as `path:line:col: error: message`, one per line.
    pub fn render(&self) -> String {
        crate::diag::render(&self.diagnostics, &self.sources)
    }
}

/// Binds a host's relations to a program, collecting every mismatch.
pub struct Binder<'p> {
    program: &'p Program,
    host: &'static str,
    diagnostics: Vec<Diagnostic>,
}

impl fmt::Debug for Binder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Binder").field("host", &self.host).field("diagnostics", &self.diagnostics).finish()
    }
}

fn signature(name: &str, cols: &[Column]) -> String {
    let cols: Vec<String> = cols.iter().map(|(n, t)| format!("{n}: {}", t.name())).collect();
    format!("{name}({})", cols.join(", "))
}

impl<'p> Binder<'p> {
    /// `host` names the host in messages ("classification", "operations").
    pub fn new(program: &'p Program, host: &'static str) -> Binder<'p> {
        Binder { program, host, diagnostics: vec![] }
    }

    /// A relation the host fills: it must be declared `.input` with these columns.
    pub fn input<const N: usize>(&mut self, name: &str, cols: [Column; N]) -> Input<N> {
        Input { rel: self.bind(name, &cols, true) }
    }

    /// A relation the host reads: it must be declared with these columns.
    pub fn output<const N: usize>(&mut self, name: &str, cols: [Column; N]) -> Output<N> {
        Output { rel: self.bind(name, &cols, false) }
    }

    fn bind(&mut self, name: &str, cols: &[Column], input: bool) -> RelId {
        let p = self.program;
        let want = signature(name, cols);
        let (what, mark) = if input { ("fills", ".input ") } else { ("reads", "") };
        let Some(rel) = p.relation(name).filter(|&r| !p.relations[r].aux) else {
            // No declaration to point at: the program's first file, where its includes are.
            self.diagnostics.push(Diagnostic::error(
                Span { file: 0, line: 1, col: 1 },
                format!(
                    "the program declares no relation `{name}`, which the {} host {what}: declare `.decl {want}`{} in a file the program includes",
                    self.host,
                    if input { format!(" and `.input {name}`") } else { String::new() },
                ),
            ));
            return 0;
        };
        let r = &p.relations[rel];
        let expected = || format!("the {} host {what} `{mark}{want}`", self.host);
        if r.arity() != cols.len() {
            let msg = format!("relation `{name}` has {} column(s), but {}", r.arity(), expected());
            self.diagnostics.push(Diagnostic::error(r.span, msg));
        } else {
            for (i, ((col, t), (host_col, host_t))) in r.columns.iter().zip(cols).enumerate() {
                if t != host_t {
                    let msg = format!(
                        "column {} of `{name}` (`{col}`) is a {}, but {} (`{host_col}` is a {})",
                        i + 1,
                        t.name(),
                        expected(),
                        host_t.name(),
                    );
                    self.diagnostics.push(Diagnostic::error(r.span, msg));
                }
            }
        }
        if input && !r.input {
            let msg = format!("relation `{name}` is not declared `.input`, but {}", expected());
            self.diagnostics.push(Diagnostic::error(r.span, msg));
        }
        rel
    }

    /// Every mismatch found, or nothing: the handles made are valid for this program.
    pub fn finish(self) -> Result<(), BindError> {
        if self.diagnostics.is_empty() {
            return Ok(());
        }
        let mut diagnostics = self.diagnostics;
        crate::diag::sort(&mut diagnostics);
        Err(BindError { host: self.host, diagnostics, sources: self.program.sources.clone() })
    }
}
