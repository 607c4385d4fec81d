//! Explanations: a proof for a tuple that holds, a why-not for one that does not.
//!
//! Start at `explain`. A proof is data (`Proof`), rendered by `Display` (indented text) and
//! `Proof::to_json` (the shape interfaces.md gives). Proofs are rebuilt on demand from the
//! evaluation's provenance: each tuple carries the rule that first derived it and the round
//! (height) it appeared in, and a rule instance is accepted only if every positive premise has
//! a strictly lower height. So proofs are finite and follow a derivation of minimal height.
//! A why-not walks each rule whose head matches and names the first body literal that no
//! binding can satisfy (one level deep).

use crate::ast::{AggKind, Pred};
use crate::db::{Database, INPUT};
use crate::program::*;
use crate::value;
use serde_json::{Value as Json, json};

use std::fmt;

/// Where a rule is, for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleRef {
    /// The rules file.
    pub file: String,
    /// The line of the rule's head, 1-based.
    pub line: u32,
    /// The `///` comment above the rule, when it has one.
    pub doc: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
/// How an aggregate of a rule's body got its value.
pub struct AggProof {
    /// `N = count : {...}` with the value.
    pub text: String,
    /// The bindings of the aggregate's body that produced the value.
    pub tuples: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
/// Why a tuple holds, as a tree (each premise its own proof).
pub enum Proof {
    /// The tuple is an input fact.
    Input {
        /// The fact, as `rel("a", 1)`.
        fact: String,
    },
    /// A rule derived the tuple from its premises.
    Rule {
        /// The derived tuple, as `rel("a", 1)`.
        fact: String,
        /// The rule that derived it.
        rule: RuleRef,
        /// The value of each variable of the rule, by name.
        bindings: Vec<(String, Const)>,
        /// The proofs of the body's positive literals.
        premises: Vec<Proof>,
        /// The negated literals, each as "no rel(..) holds".
        negations: Vec<String>,
        /// The comparisons of the body, with their values filled in.
        constraints: Vec<String>,
        /// The body's aggregates and how each got its value.
        aggregates: Vec<AggProof>,
    },
}

/// One proof step, shared: its premises are other nodes of the same `ProofGraph`.
#[derive(Clone, Debug, PartialEq)]
pub struct ProofNode {
    /// The tuple this step proves, as `rel("a", 1)`.
    pub fact: String,
    /// `None` for an input fact.
    pub rule: Option<RuleRef>,
    /// The value of each variable of the rule, by name.
    pub bindings: Vec<(String, Const)>,
    /// The nodes that prove the body's positive literals.
    pub premises: Vec<usize>,
    /// The negated literals, each as "no rel(..) holds".
    pub negations: Vec<String>,
    /// The comparisons of the body, with their values filled in.
    pub constraints: Vec<String>,
    /// The body's aggregates and how each got its value.
    pub aggregates: Vec<AggProof>,
}

impl ProofNode {
    /// A step no rule derived: an input fact (or a note in its place).
    fn input(fact: String) -> ProofNode {
        ProofNode {
            fact,
            rule: None,
            bindings: vec![],
            premises: vec![],
            negations: vec![],
            constraints: vec![],
            aggregates: vec![],
        }
    }
}

/// Proofs of many tuples with every shared step built and kept once: the explanation of a
/// plan whose actions share their premises is linear in the facts used, not in the number of
/// paths through them. Node ids are positions in `nodes`.
#[derive(Clone, Debug, Default)]
pub struct ProofGraph {
    /// Every step, once; a node's premises are indexes into this list.
    pub nodes: Vec<ProofNode>,
    index: std::collections::HashMap<(RelId, usize), usize>,
}

/// Why a tuple does not hold, for one rule whose head could produce it.
#[derive(Clone, Debug, PartialEq)]
pub struct WhyNot {
    /// The rule that could have produced the tuple.
    pub rule: RuleRef,
    /// The first body literal no binding satisfies, as written with known values filled in.
    pub failed: String,
}

#[derive(Clone, Debug, PartialEq)]
/// What `explain` says of one tuple.
pub enum Explanation {
    /// It holds, and this is why.
    Holds(Proof),
    /// It does not hold, and this is why not.
    DoesNotHold {
        /// The tuple, as `rel("a", 1)`.
        fact: String,
        /// The relation is an input (no rule could derive it).
        input: bool,
        /// Each rule that could derive it, with the first literal no binding satisfies.
        rules: Vec<WhyNot>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
/// Why a tuple cannot be explained.
pub enum ExplainError {
    #[error("unknown relation `{0}`")]
    /// No relation of that name is in the program.
    UnknownRelation(String),
    #[error("`{relation}` has {expected} column(s), the tuple to explain has {found}")]
    /// The tuple has another number of columns than the relation.
    Arity {
        /// The relation.
        relation: String,
        /// Its columns.
        expected: usize,
        /// The tuple's.
        found: usize,
    },
    #[error("the evaluation ran without provenance: evaluate again with provenance on")]
    /// The database kept no provenance.
    NoProvenance,
    #[error("{0} does not hold")]
    /// The tuple, written as `rel(..)`, is not derived.
    NotDerived(String),
}

/// A tuple written as `rel("a", 1)` that does not parse: what was expected and found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TupleError {
    /// What was expected and what was found, with the position.
    pub message: String,
}

/// Parses `rel("a", 1)` (the form `--explain` takes) into a relation name and values.
pub fn parse_tuple(text: &str) -> Result<(String, Vec<Const>), TupleError> {
    tuple(text).map_err(|message| TupleError { message })
}

fn tuple(text: &str) -> Result<(String, Vec<Const>), String> {
    let (toks, diags) = crate::lexer::lex(text, 0);
    if let Some(d) = diags.first() {
        return Err(format!("column {}: {}", d.span.col, d.message));
    }
    use crate::lexer::Tok;
    let mut it = toks.into_iter().map(|t| t.tok).peekable();
    let Some(Tok::Ident(name)) = it.next() else {
        return Err("expected a relation name, as in rel(\"a\", 1)".into());
    };
    if it.next() != Some(Tok::LParen) {
        return Err("expected `(` after the relation name".into());
    }
    let mut values = vec![];
    loop {
        match it.next() {
            Some(Tok::RParen) if values.is_empty() => break,
            Some(Tok::Str(s)) => values.push(Const::Sym(s)),
            Some(Tok::Num(n)) => values.push(Const::Num(n)),
            Some(Tok::Minus) => match it.next() {
                Some(Tok::Num(n)) => values.push(Const::Num(-n)),
                _ => return Err("expected a number after `-`".into()),
            },
            other => {
                return Err(format!("expected a constant, found {}", other.map_or("end".into(), |t| t.describe())));
            }
        }
        match it.next() {
            Some(Tok::Comma) => continue,
            Some(Tok::RParen) => break,
            other => {
                return Err(format!("expected `,` or `)`, found {}", other.map_or("end".into(), |t| t.describe())));
            }
        }
    }
    match it.next() {
        Some(Tok::Eof) | None => Ok((name, values)),
        Some(t) => Err(format!("unexpected {} after the tuple", t.describe())),
    }
}

struct Ctx<'a> {
    program: &'a Program,
    db: &'a Database,
    budget: usize,
}

fn rule_ref(program: &Program, rule: &Rule) -> RuleRef {
    RuleRef { file: program.sources.name(rule.span).to_string(), line: rule.span.line, doc: rule.doc.clone() }
}

/// Explains `rel(values)`: its proof, or why no rule derives it.
pub fn explain(program: &Program, db: &Database, rel: &str, values: &[Const]) -> Result<Explanation, ExplainError> {
    let r = program
        .relation(rel)
        .filter(|&r| !program.relations[r].aux)
        .ok_or_else(|| ExplainError::UnknownRelation(rel.to_string()))?;
    let expected = program.relations[r].arity();
    if values.len() != expected {
        return Err(ExplainError::Arity { relation: rel.to_string(), expected, found: values.len() });
    }
    if !db.provenance {
        return Err(ExplainError::NoProvenance);
    }
    let mut ctx = Ctx { program, db, budget: 2_000_000 };
    let fact = Database::format_tuple(program, r, values);
    if let Some(row) = db.encode(values)
        && let Some(i) = db.rels[r].find(&row)
    {
        let mut g = ProofGraph::default();
        let root = ctx.node(&mut g, r, i);
        return Ok(Explanation::Holds(g.tree(root)));
    }
    let input = program.relations[r].input;
    let rules = program.rules_for(r).filter_map(|rule| ctx.why_not(rule, values)).collect();
    Ok(Explanation::DoesNotHold { fact, input, rules })
}

type Env = Vec<Option<Const>>;
/// Called with each complete body instance (bindings, premises); true stops the search.
type Found<'a> = dyn FnMut(&Env, &[(RelId, usize)]) -> bool + 'a;

impl ProofGraph {
    /// Adds the proof of `rel(values)` (it must hold: see `explain` for one that may not) and
    /// returns its node, sharing every step already in the graph.
    pub fn add(&mut self, program: &Program, db: &Database, rel: RelId, row: &[u32]) -> Result<usize, ExplainError> {
        if !db.provenance {
            return Err(ExplainError::NoProvenance);
        }
        let values = db.decode_row(row);
        let i = db.rels[rel]
            .find(row)
            .ok_or_else(|| ExplainError::NotDerived(Database::format_tuple(program, rel, &values)))?;
        Ok(Ctx { program, db, budget: 2_000_000 }.node(self, rel, i))
    }

    /// Node `id` and every node below it, as one tree (shared steps repeated).
    pub fn tree(&self, id: usize) -> Proof {
        let n = &self.nodes[id];
        match &n.rule {
            None => Proof::Input { fact: n.fact.clone() },
            Some(rule) => Proof::Rule {
                fact: n.fact.clone(),
                rule: rule.clone(),
                bindings: n.bindings.clone(),
                premises: n.premises.iter().map(|&p| self.tree(p)).collect(),
                negations: n.negations.clone(),
                constraints: n.constraints.clone(),
                aggregates: n.aggregates.clone(),
            },
        }
    }

    /// The nodes reachable from `roots`, in the order first met (depth first).
    pub fn reachable(&self, roots: &[usize]) -> Vec<usize> {
        let mut seen = vec![false; self.nodes.len()];
        let mut out = vec![];
        let mut stack: Vec<usize> = roots.iter().rev().copied().collect();
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut seen[n], true) {
                continue;
            }
            out.push(n);
            stack.extend(self.nodes[n].premises.iter().rev());
        }
        out
    }

    /// Keeps only the nodes reachable from `roots`, numbered from 1 in the order they are first
    /// met (so a printed explanation reads top down); returns each old id's new one.
    pub fn renumber(&mut self, roots: &[usize]) -> Vec<Option<usize>> {
        let order = self.reachable(roots);
        let mut map = vec![None; self.nodes.len()];
        for (new, &old) in order.iter().enumerate() {
            map[old] = Some(new + 1);
        }
        let mut nodes = Vec::with_capacity(order.len() + 1);
        // Id 0 is never a proof: ids count from 1, as people number them.
        nodes.push(ProofNode::input(String::new()));
        for &old in &order {
            let mut n = self.nodes[old].clone();
            n.premises = n.premises.iter().filter_map(|&p| map[p]).collect();
            nodes.push(n);
        }
        self.nodes = nodes;
        self.index.clear();
        map
    }

    /// The nodes reachable from `roots` as text, each once: `[id] fact  <- rule at file:line
    /// with bindings`, then its premises by id, its negations, constraints and aggregates.
    pub fn render(&self, roots: &[usize]) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for id in self.reachable(roots) {
            let n = &self.nodes[id];
            let _ = match &n.rule {
                None => writeln!(out, "[{id}] {}  <- fact", n.fact),
                Some(rule) => {
                    let b: Vec<String> = n.bindings.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                    let with = if b.is_empty() { "no variables".into() } else { b.join(", ") };
                    let r = writeln!(out, "[{id}] {}  <- rule at {}:{} with {with}", n.fact, rule.file, rule.line);
                    for line in rule.doc.iter().flat_map(|d| d.lines()) {
                        let _ = writeln!(out, "      /// {line}");
                    }
                    r
                }
            };
            if !n.premises.is_empty() {
                let p: Vec<String> = n.premises.iter().map(|p| format!("[{p}]")).collect();
                let _ = writeln!(out, "      from {}", p.join(" "));
            }
            for x in n.negations.iter().chain(&n.constraints) {
                let _ = writeln!(out, "      {x}");
            }
            for a in &n.aggregates {
                let _ =
                    writeln!(out, "      {} holds, over {} tuple(s): {}", a.text, a.tuples.len(), a.tuples.join(" "));
            }
        }
        out
    }

    /// The nodes reachable from `roots`, as JSON: `[{"id", "fact", "rule", "bindings",
    /// "premises": [ids], ...}]`.
    pub fn to_json(&self, roots: &[usize]) -> Json {
        self.reachable(roots)
            .into_iter()
            .map(|id| {
                let n = &self.nodes[id];
                let b: serde_json::Map<String, Json> = n.bindings.iter().map(|(k, v)| (k.clone(), const_json(v))).collect();
                let rule = match &n.rule {
                    None => json!("input"),
                    Some(r) => json!({"file": r.file, "line": r.line, "doc": r.doc}),
                };
                json!({
                    "id": id,
                    "fact": n.fact,
                    "rule": rule,
                    "bindings": b,
                    "premises": n.premises,
                    "negations": n.negations,
                    "constraints": n.constraints,
                    "aggregates": n.aggregates.iter().map(|a| json!({"aggregate": a.text, "tuples": a.tuples})).collect::<Vec<_>>(),
                })
            })
            .collect()
    }
}

impl Ctx<'_> {
    /// The node of the tuple at row `i` of `rel`, built once per graph.
    fn node(&mut self, g: &mut ProofGraph, rel: RelId, i: usize) -> usize {
        if let Some(&id) = g.index.get(&(rel, i)) {
            return id;
        }
        let id = self.prove(g, rel, i);
        g.index.insert((rel, i), id);
        id
    }

    fn leaf(g: &mut ProofGraph, fact: String) -> usize {
        g.nodes.push(ProofNode::input(fact));
        g.nodes.len() - 1
    }

    fn prove(&mut self, g: &mut ProofGraph, rel: RelId, i: usize) -> usize {
        let data = &self.db.rels[rel];
        let values = self.db.decode_row(data.row(i));
        let fact = Database::format_tuple(self.program, rel, &values);
        let (rule_id, height) = (data.rule[i], data.height[i]);
        if rule_id == INPUT {
            return Self::leaf(g, fact);
        }
        // The recorded rule first; any rule whose instance has lower premises will do.
        let mut order: Vec<usize> = vec![rule_id as usize];
        order.extend(self.program.rules_for(rel).map(|r| r.id).filter(|&r| r != rule_id as usize));
        for rid in order {
            let rule = &self.program.rules[rid];
            let mut env: Env = vec![None; rule.vars.len()];
            if !head_unify(rule, &values, &mut env) {
                continue;
            }
            let mut found: Option<(Env, Vec<(RelId, usize)>)> = None;
            let mut premises = vec![];
            self.search(rule, 0, &mut env, height, &mut premises, &values, &mut |env, prem| {
                found = Some((env.to_vec(), prem.to_vec()));
                true
            });
            if let Some((env, prem)) = found {
                return self.build(g, rule, fact, &env, &prem);
            }
        }
        // Unreachable when provenance is consistent; say so rather than loop.
        Self::leaf(g, format!("{fact} (no derivation found below height {height})"))
    }

    fn build(&mut self, g: &mut ProofGraph, rule: &Rule, fact: String, env: &Env, prem: &[(RelId, usize)]) -> usize {
        let premises = prem.iter().map(|&(r, i)| self.node(g, r, i)).collect();
        let mut negations = vec![];
        let mut constraints = vec![];
        let mut aggregates = vec![];
        for lit in &rule.body {
            match lit {
                Lit::Atom { negated: true, .. } => {
                    negations.push(format!("no {} holds", fmt_lit(self.program, rule, lit, env)))
                }
                Lit::Cmp { .. } | Lit::Pred { .. } | Lit::Bind { .. } => {
                    constraints.push(format!("{} holds", fmt_lit(self.program, rule, lit, env)))
                }
                Lit::Agg { agg, .. } => {
                    let aux = &self.program.relations[agg.aux];
                    let mut tuples = vec![];
                    for j in agg_rows(self.db, agg, env) {
                        let vals = self.db.decode_row(self.db.rels[agg.aux].row(j));
                        if agg_env(self.program, self.db, rule, agg, vals.clone(), env).is_some() {
                            let parts: Vec<String> = aux
                                .columns
                                .iter()
                                .zip(&vals)
                                .filter(|((n, _), _)| !n.starts_with('_'))
                                .map(|((n, _), v)| format!("{n} = {v}"))
                                .collect();
                            tuples.push(format!("{{{}}}", parts.join(", ")));
                        }
                    }
                    tuples.sort();
                    aggregates.push(AggProof { text: fmt_lit(self.program, rule, lit, env), tuples });
                }
                Lit::Atom { .. } => {}
            }
        }
        let bindings = rule
            .vars
            .iter()
            .zip(env)
            .filter(|((n, _), v)| !n.starts_with('_') && v.is_some())
            .map(|((n, _), v)| (n.clone(), v.clone().unwrap()))
            .collect();
        let r = &self.program.rules[rule.aux_of.unwrap_or(rule.id)];
        let rule = Some(rule_ref(self.program, r));
        g.nodes.push(ProofNode { fact, rule, bindings, premises, negations, constraints, aggregates });
        g.nodes.len() - 1
    }

    /// Backtracking search for a body instance with premises below `height`; calls `k` with
    /// each complete one until it returns true.
    #[allow(clippy::too_many_arguments)]
    fn search(
        &mut self,
        rule: &Rule,
        i: usize,
        env: &mut Env,
        height: u32,
        prem: &mut Vec<(RelId, usize)>,
        head: &[Const],
        k: &mut Found<'_>,
    ) -> bool {
        if self.budget == 0 {
            return false;
        }
        self.budget -= 1;
        let Some(lit) = rule.body.get(i) else {
            // Heads with expressions are checked once everything is bound.
            for (e, v) in rule.head_args.iter().zip(head) {
                match eval(e, env) {
                    Ok(x) if x == *v => {}
                    _ => return false,
                }
            }
            return k(env, prem);
        };
        match lit {
            Lit::Atom { rel, args, negated: false, .. } => {
                let data = &self.db.rels[*rel];
                for j in candidates(self.db, *rel, args, env) {
                    if data.height[j] >= height {
                        continue;
                    }
                    let saved = env.clone();
                    if unify_row(self.db, args, data.row(j), env) {
                        prem.push((*rel, j));
                        if self.search(rule, i + 1, env, height, prem, head, k) {
                            return true;
                        }
                        prem.pop();
                    }
                    *env = saved;
                }
                false
            }
            _ => match check_lit(self.program, self.db, rule, lit, env) {
                Some(true) => self.search(rule, i + 1, env, height, prem, head, k),
                _ => false,
            },
        }
    }

    fn why_not(&mut self, rule: &Rule, values: &[Const]) -> Option<WhyNot> {
        let mut env: Env = vec![None; rule.vars.len()];
        if !head_unify(rule, values, &mut env) {
            return None;
        }
        // The deepest literal any partial binding reaches is the one that fails first.
        let mut best: (usize, Env) = (0, env.clone());
        self.deepest(rule, 0, &mut env, &mut best);
        let failed = match rule.body.get(best.0) {
            Some(lit) => fmt_lit(self.program, rule, lit, &best.1),
            None => "the head's computed values differ".to_string(),
        };
        let r = &self.program.rules[rule.aux_of.unwrap_or(rule.id)];
        Some(WhyNot { rule: rule_ref(self.program, r), failed })
    }

    fn deepest(&mut self, rule: &Rule, i: usize, env: &mut Env, best: &mut (usize, Env)) {
        if self.budget == 0 {
            return;
        }
        self.budget -= 1;
        if i > best.0 {
            *best = (i, env.clone());
        }
        let Some(lit) = rule.body.get(i) else { return };
        match lit {
            Lit::Atom { rel, args, negated: false, .. } => {
                let data = &self.db.rels[*rel];
                for j in candidates(self.db, *rel, args, env) {
                    let saved = env.clone();
                    if unify_row(self.db, args, data.row(j), env) {
                        self.deepest(rule, i + 1, env, best);
                    }
                    *env = saved;
                }
            }
            _ => {
                if check_lit(self.program, self.db, rule, lit, env) == Some(true) {
                    self.deepest(rule, i + 1, env, best);
                }
            }
        }
    }
}

fn head_unify(rule: &Rule, values: &[Const], env: &mut Env) -> bool {
    for (e, v) in rule.head_args.iter().zip(values) {
        match e {
            Expr::Var(x) => match &env[*x] {
                Some(b) if b != v => return false,
                Some(_) => {}
                None => env[*x] = Some(v.clone()),
            },
            Expr::Const(c) if c != v => return false,
            _ => {}
        }
    }
    true
}

/// The rows of `rel` that can match `args` under `env`: a prefix range when the leading
/// arguments are known, else every row; empty when a known value was never interned.
fn candidates<'a>(db: &'a Database, rel: RelId, args: &[Arg], env: &Env) -> Box<dyn Iterator<Item = usize> + 'a> {
    let data = &db.rels[rel];
    let mut prefix = vec![];
    for a in args {
        let known = match a {
            Arg::Const(c) => Some(c),
            Arg::Var(v) => env[*v].as_ref(),
            Arg::Wild => None,
        };
        match known {
            Some(c) => match db.interner.get(c) {
                Some(id) => prefix.push(id),
                None => return Box::new(std::iter::empty()),
            },
            None => break,
        }
    }
    if prefix.is_empty() { Box::new(0..data.len()) } else { Box::new(data.with_prefix(prefix)) }
}

/// The rows of an aggregate's auxiliary relation that belong to the correlated values in `env`.
fn agg_rows<'a>(db: &'a Database, agg: &Aggregate, env: &Env) -> Box<dyn Iterator<Item = usize> + 'a> {
    let args: Vec<Arg> = agg.corr.iter().map(|&v| Arg::Var(v)).collect();
    candidates(db, agg.aux, &args, env)
}

/// An aggregate's environment for one row of its aux relation: the row, then (with a residual)
/// the outside values and what the residual binds; `None` when the residual rejects the row.
fn agg_env(program: &Program, db: &Database, rule: &Rule, agg: &Aggregate, vals: Vec<Const>, env: &Env) -> Option<Env> {
    let mut cols: Env = vals.into_iter().map(Some).collect();
    if let Some(r) = &agg.residual {
        cols.extend(r.outer.iter().map(|v| env[*v].clone()));
        cols.resize(r.names.len(), None);
        for l in &r.lits {
            if check_lit(program, db, rule, l, &mut cols) != Some(true) {
                return None;
            }
        }
    }
    Some(cols)
}

/// `unify` on an interned row, decoding only what it binds.
fn unify_row(db: &Database, args: &[Arg], row: &[u32], env: &mut Env) -> bool {
    for (a, &id) in args.iter().zip(row) {
        match a {
            Arg::Wild => {}
            Arg::Const(c) => {
                if db.interner.get(c) != Some(id) {
                    return false;
                }
            }
            Arg::Var(x) => match &env[*x] {
                Some(b) => {
                    if db.interner.get(b) != Some(id) {
                        return false;
                    }
                }
                None => env[*x] = Some(db.value(id).clone()),
            },
        }
    }
    true
}

fn eval(e: &Expr, env: &Env) -> Result<Const, String> {
    Ok(match e {
        Expr::Var(v) => env[*v].clone().ok_or("unbound")?,
        Expr::Const(c) => c.clone(),
        Expr::Arith(op, a, b) => match (eval(a, env)?, eval(b, env)?) {
            (Const::Num(x), Const::Num(y)) => Const::Num(value::arith(*op, x, y).map_err(|e| e.to_string())?),
            _ => return Err("arithmetic on a symbol".into()),
        },
        Expr::Call(f, args) => {
            let vals: Result<Vec<Const>, String> = args.iter().map(|a| eval(a, env)).collect();
            value::call(*f, &vals?).map_err(|e| e.to_string())?
        }
    })
}

/// Evaluates a non-positive-atom literal under `env` (binding what it binds); `None` when
/// its inputs are not bound or it errs.
fn check_lit(program: &Program, db: &Database, rule: &Rule, lit: &Lit, env: &mut Env) -> Option<bool> {
    Some(match lit {
        Lit::Atom { rel, args, negated: true, .. } => {
            let data = &db.rels[*rel];
            !candidates(db, *rel, args, env).any(|j| {
                let mut probe = env.clone();
                unify_row(db, args, data.row(j), &mut probe)
            })
        }
        Lit::Cmp { lhs, op, rhs, .. } => {
            let (a, b) = (eval(lhs, env).ok()?, eval(rhs, env).ok()?);
            op.holds(&a, &b)
        }
        Lit::Pred { pred, pattern, subject, .. } => {
            let (Const::Sym(p), Const::Sym(s)) = (eval(pattern, env).ok()?, eval(subject, env).ok()?) else {
                return None;
            };
            match pred {
                Pred::Contains => s.contains(&p),
                Pred::Match => regex::Regex::new(&crate::plan::whole(&p)).ok()?.is_match(&s),
            }
        }
        Lit::Bind { var, expr, .. } => {
            let v = eval(expr, env).ok()?;
            match &env[*var] {
                Some(b) => *b == v,
                None => {
                    env[*var] = Some(v);
                    true
                }
            }
        }
        Lit::Agg { agg, .. } => {
            if agg.inputs().any(|v| env[v].is_none()) {
                return None;
            }
            let mut xs = vec![];
            for j in agg_rows(db, agg, env) {
                let vals = db.decode_row(db.rels[agg.aux].row(j));
                if let Some(cols) = agg_env(program, db, rule, agg, vals, env) {
                    xs.push(match &agg.target {
                        None => 1,
                        Some(e) => match eval(e, &cols).ok()? {
                            Const::Num(n) => n,
                            Const::Sym(_) => return None,
                        },
                    });
                }
            }
            let v = Const::Num(match agg.kind {
                AggKind::Count => xs.len() as i64,
                AggKind::Sum => xs.iter().sum(),
                AggKind::Min => *xs.iter().min()?,
                AggKind::Max => *xs.iter().max()?,
            });
            match &env[agg.result] {
                Some(b) => *b == v,
                None => {
                    env[agg.result] = Some(v);
                    true
                }
            }
        }
        Lit::Atom { .. } => return None,
    })
}

fn fmt_expr(rule: &Rule, e: &Expr, env: &Env) -> String {
    match e {
        Expr::Var(v) => match &env[*v] {
            Some(c) => c.to_string(),
            None => rule.vars[*v].0.clone(),
        },
        Expr::Const(c) => c.to_string(),
        Expr::Arith(op, a, b) => {
            format!("({} {} {})", fmt_expr(rule, a, env), op.symbol(), fmt_expr(rule, b, env))
        }
        Expr::Call(f, args) => {
            let a: Vec<String> = args.iter().map(|x| fmt_expr(rule, x, env)).collect();
            format!("{}({})", f.name(), a.join(", "))
        }
    }
}

/// A literal as written, with bound variables replaced by their values.
pub fn fmt_lit(program: &Program, rule: &Rule, lit: &Lit, env: &Env) -> String {
    let var = |v: &VarId| -> String {
        let name = &rule.vars[*v].0;
        match &env[*v] {
            Some(c) => c.to_string(),
            None if name.starts_with('_') => "_".into(),
            None => name.clone(),
        }
    };
    match lit {
        Lit::Atom { rel, args, .. } => {
            let a: Vec<String> = args
                .iter()
                .map(|a| match a {
                    Arg::Var(v) => var(v),
                    Arg::Const(c) => c.to_string(),
                    Arg::Wild => "_".into(),
                })
                .collect();
            format!("{}({})", program.relations[*rel].name, a.join(", "))
        }
        Lit::Cmp { lhs, op, rhs, .. } => {
            format!("{} {} {}", fmt_expr(rule, lhs, env), op.symbol(), fmt_expr(rule, rhs, env))
        }
        Lit::Bind { var: v, expr, .. } => {
            format!("{} = {}", var(v), fmt_expr(rule, expr, env))
        }
        Lit::Pred { pred, pattern, subject, .. } => {
            let name = match pred {
                Pred::Match => "match",
                Pred::Contains => "contains",
            };
            format!("{name}({}, {})", fmt_expr(rule, pattern, env), fmt_expr(rule, subject, env))
        }
        Lit::Agg { agg, .. } => format!("{} = {}", var(&agg.result), fmt_aggregate(program, agg)),
    }
}

/// An aggregate as written: `min R2 : { pending(_, R2) }`, from its auxiliary rule.
fn fmt_aggregate(program: &Program, agg: &Aggregate) -> String {
    let Some(aux_rule) = program.rules.iter().find(|r| r.head == agg.aux) else {
        return agg.kind.name().to_string();
    };
    let none: Env = vec![None; aux_rule.vars.len()];
    let body: Vec<String> = aux_rule
        .body
        .iter()
        .map(|l| {
            let text = fmt_lit(program, aux_rule, l, &none);
            if matches!(l, Lit::Atom { negated: true, .. }) { format!("!{text}") } else { text }
        })
        .collect();
    // The target and the residual are written over the aux relation's columns (then, for a
    // residual, the outside values and what it binds).
    let vars = match &agg.residual {
        Some(r) => r.names.iter().map(|n| (n.clone(), crate::ast::Type::Number)).collect(),
        None => program.relations[agg.aux].columns.clone(),
    };
    let cols: Env = vec![None; vars.len()];
    let names = Rule { vars, ..aux_rule.clone() };
    let mut body = body;
    for l in agg.residual.iter().flat_map(|r| &r.lits) {
        let text = fmt_lit(program, &names, l, &cols);
        body.push(if matches!(l, Lit::Atom { negated: true, .. }) { format!("!{text}") } else { text });
    }
    let target = match &agg.target {
        None => String::new(),
        Some(t) => format!(" {}", fmt_expr(&names, t, &cols)),
    };
    format!("{}{target} : {{ {} }}", agg.kind.name(), body.join(", "))
}

fn const_json(c: &Const) -> Json {
    match c {
        Const::Num(n) => json!(n),
        Const::Sym(s) => json!(s),
    }
}

impl Proof {
    /// The proved tuple, as `rel("a", 1)`.
    pub fn fact(&self) -> &str {
        match self {
            Proof::Input { fact } | Proof::Rule { fact, .. } => fact,
        }
    }

    /// `{"fact", "rule": {"file", "line", "doc"} | "input", "bindings", "premises", "negations", ...}`
    pub fn to_json(&self) -> Json {
        match self {
            Proof::Input { fact } => {
                json!({"fact": fact, "rule": "input", "bindings": {}, "premises": [], "negations": []})
            }
            Proof::Rule { fact, rule, bindings, premises, negations, constraints, aggregates } => {
                let b: serde_json::Map<String, Json> =
                    bindings.iter().map(|(n, v)| (n.clone(), const_json(v))).collect();
                json!({
                    "fact": fact,
                    "rule": {"file": rule.file, "line": rule.line, "doc": rule.doc},
                    "bindings": b,
                    "premises": premises.iter().map(Proof::to_json).collect::<Vec<_>>(),
                    "negations": negations,
                    "constraints": constraints,
                    "aggregates": aggregates.iter().map(|a| json!({"aggregate": a.text, "tuples": a.tuples})).collect::<Vec<_>>(),
                })
            }
        }
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, depth: usize) -> fmt::Result {
        let pad = "  ".repeat(depth);
        match self {
            Proof::Input { fact } => writeln!(f, "{pad}{fact}  <- fact"),
            Proof::Rule { fact, rule, bindings, premises, negations, constraints, aggregates } => {
                let b: Vec<String> = bindings.iter().map(|(n, v)| format!("{n} = {v}")).collect();
                writeln!(
                    f,
                    "{pad}{fact}  <- rule at {}:{} with {}",
                    rule.file,
                    rule.line,
                    if b.is_empty() { "no variables".into() } else { b.join(", ") }
                )?;
                if let Some(doc) = &rule.doc {
                    for line in doc.lines() {
                        writeln!(f, "{pad}   /// {line}")?;
                    }
                }
                for p in premises {
                    p.write(f, depth + 1)?;
                }
                for n in negations.iter().chain(constraints) {
                    writeln!(f, "{pad}  {n}")?;
                }
                for a in aggregates {
                    writeln!(f, "{pad}  {} holds, over {} tuple(s): {}", a.text, a.tuples.len(), a.tuples.join(" "))?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Proof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, 0)
    }
}

impl Explanation {
    /// The proof as JSON (`fact`, `rule`, `bindings`, `premises`, ...), as interfaces.md has it.
    pub fn to_json(&self) -> Json {
        match self {
            Explanation::Holds(p) => p.to_json(),
            Explanation::DoesNotHold { fact, input, rules } => json!({
                "fact": fact,
                "holds": false,
                "input": input,
                "whyNot": rules.iter().map(|w| json!({"rule": {"file": w.rule.file, "line": w.rule.line, "doc": w.rule.doc}, "failed": w.failed})).collect::<Vec<_>>(),
            }),
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Explanation::Holds(p) => write!(f, "{p}"),
            Explanation::DoesNotHold { fact, input, rules } => {
                writeln!(f, "{fact} does not hold")?;
                if rules.is_empty() {
                    if *input {
                        writeln!(f, "  it is an input relation and no such fact was given; no rule derives it")?;
                    } else {
                        writeln!(f, "  no rule's head can produce it")?;
                    }
                }
                for w in rules {
                    writeln!(f, "  rule at {}:{}: no binding satisfies {}", w.rule.file, w.rule.line, w.failed)?;
                }
                Ok(())
            }
        }
    }
}
