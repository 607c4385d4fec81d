//! The checked program: what the evaluators (fast and reference) and the explainer consume.
//!
//! Produced by `check::check`. Invariants: every relation is declared once and every atom has
//! the declared arity and column types; every rule is safe (each variable used in the head, a
//! negation, a constraint or a functor is bound by a positive atom, an `=` binding or an
//! aggregate); `strata` lists relations in an order where negation and aggregation only read
//! lower strata. Aggregates are desugared into auxiliary relations (`aux: true`) computed in a
//! lower stratum, so an evaluator sees them as a lookup by the correlated variables.

use crate::ast::{AggKind, ArithOp, CmpOp, Functor, Pred, Type};
use crate::diag::{SourceMap, Span};
use std::collections::HashMap;
use std::fmt;

/// A relation, as its index in `Program::relations`.
pub type RelId = usize;
pub type VarId = usize;

/// A constant as written in a rules file or a facts file.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Const {
    /// A number.
    Num(i64),
    /// A symbol.
    Sym(String),
}

impl fmt::Display for Const {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Const::Num(n) => write!(f, "{n}"),
            Const::Sym(s) => write!(f, "{s:?}"),
        }
    }
}

impl Const {
    /// The constant's type.
    pub fn ty(&self) -> Type {
        match self {
            Const::Num(_) => Type::Number,
            Const::Sym(_) => Type::Symbol,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Relation {
    pub name: String,
    pub columns: Vec<(String, Type)>,
    pub input: bool,
    pub output: bool,
    /// Auxiliary relation made for one aggregate; never shown to users by name.
    pub aux: bool,
    pub doc: Option<String>,
    pub span: Span,
}

impl Relation {
    pub fn arity(&self) -> usize {
        self.columns.len()
    }
}

/// An expression over a rule's variables.
#[derive(Clone, Debug)]
pub enum Expr {
    Var(VarId),
    Const(Const),
    Arith(ArithOp, Box<Expr>, Box<Expr>),
    Call(Functor, Vec<Expr>),
}

impl Expr {
    pub fn vars(&self, out: &mut Vec<VarId>) {
        match self {
            Expr::Var(v) => out.push(*v),
            Expr::Const(_) => {}
            Expr::Arith(_, a, b) => {
                a.vars(out);
                b.vars(out);
            }
            Expr::Call(_, args) => args.iter().for_each(|a| a.vars(out)),
        }
    }
}

/// One argument of a body atom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    Var(VarId),
    Const(Const),
    Wild,
}

#[derive(Clone, Debug)]
pub struct Aggregate {
    pub kind: AggKind,
    /// The auxiliary relation holding every distinct binding of the aggregate's body;
    /// its first columns are the correlated variables, in `corr` order.
    pub aux: RelId,
    /// Variables of the enclosing rule bound from outside, matched to the aux's first columns.
    pub corr: Vec<VarId>,
    /// The aggregated expression over the aux relation's columns (`Expr::Var(i)` = column i),
    /// or over the residual's environment when there is one (the aux columns come first there).
    pub target: Option<Expr>,
    /// The variable the aggregate's value is bound to (or compared with, if bound before).
    pub result: VarId,
    /// The body's literals that read variables bound only outside the aggregate, checked per
    /// lookup against the aux rows of the key.
    pub residual: Option<Residual>,
}

impl Aggregate {
    /// The enclosing rule's variables that must be bound before the aggregate is looked up:
    /// the key, then the residual's outer values.
    pub fn inputs(&self) -> impl Iterator<Item = VarId> + '_ {
        self.corr.iter().chain(self.residual.iter().flat_map(|r| r.outer.iter())).copied()
    }
}

/// The part of an aggregate's body that uses a variable of the enclosing rule that no atom of
/// the body binds (`X < C`, `C` from outside), for example `sum X : { m(X, S), X < C }`. The
/// aux relation holds the bindings of the rest of the body, keyed by the atom-bound correlated
/// variables (`S`); each lookup keeps the rows of its key that pass these literals under the
/// enclosing rule's values (`C`). The aux relation so reads only what the aggregate ranges over,
/// and a recursive rule may use such an aggregate on lower strata.
#[derive(Clone, Debug)]
pub struct Residual {
    /// Variables of the enclosing rule, placed after the aux columns in the environment.
    pub outer: Vec<VarId>,
    /// The environment's variable names: the aux columns, then `outer`, then what `lits` bind.
    pub names: Vec<String>,
    /// Constraints, `=` bindings and predicates over that environment, in binding order.
    pub lits: Vec<Lit>,
}

#[derive(Clone, Debug)]
pub enum Lit {
    Atom {
        rel: RelId,
        args: Vec<Arg>,
        negated: bool,
        span: Span,
    },
    Cmp {
        lhs: Expr,
        op: CmpOp,
        rhs: Expr,
        span: Span,
    },
    Pred {
        pred: Pred,
        pattern: Expr,
        subject: Expr,
        span: Span,
    },
    /// `Var = Expr` where the variable is not bound before this literal.
    Bind {
        var: VarId,
        expr: Expr,
        span: Span,
    },
    Agg {
        agg: Aggregate,
        span: Span,
    },
}

impl Lit {
    /// The relation this literal reads, and whether through negation or an aggregate (which
    /// must then be complete before the rule runs): the edges of the dependency graph.
    /// An aggregate reads its aux relation and, through its residual, what the residual negates.
    pub fn reads(&self) -> Vec<(RelId, bool)> {
        match self {
            Lit::Atom { rel, negated, .. } => vec![(*rel, *negated)],
            Lit::Agg { agg, .. } => {
                let mut out = vec![(agg.aux, true)];
                for l in agg.residual.iter().flat_map(|r| &r.lits) {
                    out.extend(l.reads().into_iter().map(|(r, _)| (r, true)));
                }
                out
            }
            Lit::Cmp { .. } | Lit::Pred { .. } | Lit::Bind { .. } => vec![],
        }
    }

    pub fn span(&self) -> Span {
        match self {
            Lit::Atom { span, .. }
            | Lit::Cmp { span, .. }
            | Lit::Pred { span, .. }
            | Lit::Bind { span, .. }
            | Lit::Agg { span, .. } => *span,
        }
    }
}

/// A checked rule. Body literals are in an order where each literal's inputs are bound by
/// the literals before it (positive atoms keep their written order).
#[derive(Clone, Debug)]
pub struct Rule {
    pub id: usize,
    pub head: RelId,
    pub head_args: Vec<Expr>,
    pub body: Vec<Lit>,
    /// Names and types of the rule's variables, indexed by `VarId`.
    pub vars: Vec<(String, Type)>,
    pub span: Span,
    pub doc: Option<String>,
    /// For an aggregate's auxiliary rule: the rule and literal it was made from.
    pub aux_of: Option<usize>,
}

#[derive(Clone, Debug)]
/// A checked program: every relation and rule of the files loaded, and the strata they evaluate in.
pub struct Program {
    /// The files the program was loaded from (for positions).
    pub sources: SourceMap,
    /// Every relation, by `RelId`.
    pub relations: Vec<Relation>,
    /// Each relation's id, by name.
    pub by_name: HashMap<String, RelId>,
    /// Every rule, with the auxiliary rules the checker made (negations, aggregates).
    pub rules: Vec<Rule>,
    /// Facts written in the rules files.
    pub facts: Vec<(RelId, Vec<Const>, Span)>,
    /// Each stratum is a set of mutually recursive relations; lower strata come first.
    pub strata: Vec<Vec<RelId>>,
    /// `stratum_of[rel]`.
    pub stratum_of: Vec<usize>,
}

impl Program {
    /// The relation of this name.
    pub fn relation(&self, name: &str) -> Option<RelId> {
        self.by_name.get(name).copied()
    }

    /// Rules whose head is `rel`.
    pub fn rules_for(&self, rel: RelId) -> impl Iterator<Item = &Rule> {
        self.rules.iter().filter(move |r| r.head == rel)
    }

    /// Which relations `wanted` depend on (themselves included): every relation read, positively,
    /// negated or through an aggregate, by a rule of a relation in the set, transitively.
    pub fn upstream(&self, wanted: &[RelId]) -> Vec<bool> {
        let mut needed = vec![false; self.relations.len()];
        let mut todo: Vec<RelId> = wanted.to_vec();
        while let Some(rel) = todo.pop() {
            if std::mem::replace(&mut needed[rel], true) {
                continue;
            }
            for rule in self.rules_for(rel) {
                todo.extend(rule.body.iter().flat_map(|l| l.reads()).map(|(r, _)| r));
            }
        }
        needed
    }

    /// The relations marked `.output`.
    pub fn outputs(&self) -> impl Iterator<Item = RelId> + '_ {
        (0..self.relations.len()).filter(|&r| self.relations[r].output)
    }
}
