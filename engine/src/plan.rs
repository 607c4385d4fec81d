//! The compiled form of a program: each rule as a chain of joins over keyed indexes.
//!
//! Start at `QueryPlan::new`. A rule `h :- a1, a2, ..., an, filters` becomes step 0 (a scan of an
//! index of `a1`, or a unit row when there is no positive atom) followed by one join per further
//! atom. Every index is the relation's rows permuted so that the join key is a prefix
//! (`<relation>_by_<columns>`), with constants and repeated variables filtered and unused
//! columns projected away. Each step carries the non-atom literals (constraints, bindings,
//! negations, aggregates, predicates) that become evaluable once its variables are bound,
//! and the layout of the binding row it produces: the next join's key first. The plan is
//! computed once per program and reused for every evaluation.

use crate::ast::{AggKind, ArithOp, CmpOp, Functor, Pred};
use crate::diag::Diagnostic;
use crate::program::*;
use crate::value::Interner;
use regex::Regex;
use std::collections::HashMap;

/// The most variables a rule may have (the evaluator's scratch environment is an array).
pub const MAX_VARS: usize = 64;
/// The widest row (relation arity or binding row) the evaluator is compiled for.
pub const MAX_WIDTH: usize = 16;

/// A projection of one relation: `cols[i]` is the source column of index column `i`; the first
/// `key_len` columns are the join key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexSpec {
    pub rel: RelId,
    pub cols: Vec<usize>,
    pub key_len: usize,
    /// Source column must equal an interned constant.
    pub consts: Vec<(usize, u32)>,
    /// Source columns that must be equal (a variable repeated in the atom).
    pub eqs: Vec<(usize, usize)>,
}

/// An expression over the rule's environment (variables by id).
#[derive(Clone, Debug)]
pub enum CExpr {
    Var(usize),
    Lit(u32),
    Arith(ArithOp, Box<CExpr>, Box<CExpr>),
    Call(Functor, Vec<CExpr>),
}

#[derive(Clone, Debug)]
pub enum Op {
    Cmp(CExpr, CmpOp, CExpr),
    Bind(usize, CExpr),
    /// Whole-string regex match; `Err` holds the pattern when it must be compiled at run time.
    Match(Result<usize, CExpr>, CExpr),
    Contains(CExpr, CExpr),
    /// No row of the negation index equals these variables' values.
    Neg {
        index: usize,
        vars: Vec<usize>,
    },
    /// Look up aggregate `agg` by the correlated variables (filtering the key's rows by the
    /// residual under `outer`'s values, when it has one); bind (or compare) `result`.
    Agg {
        agg: usize,
        corr: Vec<usize>,
        outer: Vec<usize>,
        result: usize,
        bound: bool,
    },
}

#[derive(Clone, Debug)]
pub enum Source {
    Unit,
    /// Index id, and the variable held in each index column.
    Scan(usize, Vec<usize>),
}

#[derive(Clone, Debug)]
pub struct Step {
    /// For step 0: where rows come from. For later steps: `Scan` of the right-hand index,
    /// joined with the previous step's rows on `key_len` leading columns.
    pub source: Source,
    pub key_len: usize,
    pub ops: Vec<Op>,
    /// Variables of the binding row this step produces (empty for the last step).
    pub out: Vec<usize>,
}

#[derive(Clone, Debug)]
pub struct RulePlan {
    pub rule: usize,
    pub head: RelId,
    pub steps: Vec<Step>,
    pub head_exprs: Vec<CExpr>,
    /// The rule is a dominance self-join, run as one scan of `index` when its relation is done.
    pub dominance: Option<Dominance>,
}

/// A rule of the dominance shape, `h(K, D) :- a(K, _, D), a(K, _, D2), D2 > D.` (or `<`): the
/// `(K, D)` of `a` with a larger (smaller) `D` in the same `K`. One scan of the index of `a` by
/// `(K, D)` replaces the self-join: in each run of equal `K`, every `D` below the run's largest
/// (above its smallest). The steps are kept: a recursive stratum, and the reference, read them.
#[derive(Clone, Debug)]
pub struct Dominance {
    /// The index of `a` holding the key variables, then `D`.
    pub index: usize,
    /// The variable held in each index column.
    pub vars: Vec<usize>,
    /// `D2 > D`: a `D` is dominated by a larger one (else by a smaller one).
    pub greater: bool,
    /// When the key variables are the relation's leading columns in order, with no constant:
    /// the column of `D`. The relation's own rows, sorted by those columns, are then read
    /// directly (no index to sort).
    pub direct: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct AggPlan {
    pub kind: AggKind,
    pub aux: RelId,
    pub corr_len: usize,
    pub target: Option<CExpr>,
    pub residual: Option<ResidualPlan>,
}

/// A residual's ops over its environment: the aux row's `arity` columns, then the outer values.
#[derive(Clone, Debug)]
pub struct ResidualPlan {
    pub arity: usize,
    pub ops: Vec<Op>,
}

#[derive(Clone, Debug)]
pub struct StratumPlan {
    pub rels: Vec<RelId>,
    pub rules: Vec<usize>,
}

/// The evaluator's plan of a program: the indexes each rule's joins read, per stratum, compiled
/// once at load.
#[derive(Clone, Debug)]
pub struct QueryPlan {
    pub(crate) width: usize,
    pub(crate) indexes: Vec<IndexSpec>,
    pub(crate) neg_indexes: Vec<IndexSpec>,
    pub(crate) aggs: Vec<AggPlan>,
    pub(crate) rules: Vec<RulePlan>,
    pub(crate) strata: Vec<StratumPlan>,
    pub(crate) regexes: Vec<Regex>,
    /// Constants of the program, interned; each evaluation starts from a clone.
    pub base: Interner,
    /// Facts of the program, interned, per relation.
    pub facts: Vec<Vec<Vec<u32>>>,
}

/// Constant columns, equal column pairs, and (variable, first column) in column order.
type Layout = (Vec<(usize, u32)>, Vec<(usize, usize)>, Vec<(usize, usize)>);

struct Builder<'p> {
    program: &'p Program,
    base: Interner,
    indexes: Vec<IndexSpec>,
    index_ids: HashMap<IndexSpec, usize>,
    neg_indexes: Vec<IndexSpec>,
    aggs: Vec<AggPlan>,
    regexes: Vec<Regex>,
    regex_ids: HashMap<String, usize>,
    width: usize,
}

/// Anchors a pattern so that the whole subject must match, as in Soufflé.
pub fn whole(pattern: &str) -> String {
    format!("^(?:{pattern})$")
}

impl Builder<'_> {
    fn lit(&mut self, c: &Const) -> u32 {
        self.base.intern(c.clone())
    }

    fn expr(&mut self, e: &Expr) -> CExpr {
        match e {
            Expr::Var(v) => CExpr::Var(*v),
            Expr::Const(c) => CExpr::Lit(self.lit(c)),
            Expr::Arith(op, a, b) => {
                let (a, b) = (self.expr(a), self.expr(b));
                // Constant operands (`-1` is `0 - 1`) are computed once, here; an error (division
                // by zero, overflow) is left to evaluation, which reports it with the rule.
                if let (CExpr::Lit(x), CExpr::Lit(y)) = (&a, &b)
                    && let (Const::Num(x), Const::Num(y)) = (self.base.value(*x).clone(), self.base.value(*y).clone())
                    && let Ok(n) = crate::value::arith(*op, x, y)
                {
                    return CExpr::Lit(self.base.intern_num(n));
                }
                CExpr::Arith(*op, Box::new(a), Box::new(b))
            }
            Expr::Call(f, args) => CExpr::Call(*f, args.iter().map(|a| self.expr(a)).collect()),
        }
    }

    fn index(&mut self, spec: IndexSpec) -> usize {
        self.width = self.width.max(spec.cols.len());
        if let Some(&id) = self.index_ids.get(&spec) {
            return id;
        }
        let id = self.indexes.len();
        self.index_ids.insert(spec.clone(), id);
        self.indexes.push(spec);
        id
    }

    /// An atom's argument layout: constant columns (interned), equalities between columns of
    /// a repeated variable, and each distinct variable with its first column, in column order.
    fn layout(&mut self, args: &[Arg]) -> Layout {
        let mut consts = vec![];
        let mut eqs = vec![];
        let mut firsts: Vec<(usize, usize)> = vec![];
        for (i, a) in args.iter().enumerate() {
            match a {
                Arg::Const(c) => consts.push((i, self.lit(c))),
                Arg::Var(v) => match firsts.iter().find(|(x, _)| x == v) {
                    Some(&(_, j)) => eqs.push((j, i)),
                    None => firsts.push((*v, i)),
                },
                Arg::Wild => {}
            }
        }
        (consts, eqs, firsts)
    }

    /// The index of an atom with `key` variables first, then `rest`; returns its id and the
    /// variable held in each of its columns.
    fn atom_index(&mut self, rel: RelId, args: &[Arg], key: &[usize], rest: &[usize]) -> (usize, Vec<usize>) {
        let (consts, eqs, firsts) = self.layout(args);
        let col_of =
            |v: &usize| firsts.iter().find(|(x, _)| x == v).map(|&(_, c)| c).expect("the variable is in the atom");
        let vars: Vec<usize> = key.iter().chain(rest).copied().collect();
        let cols = vars.iter().map(col_of).collect();
        let id = self.index(IndexSpec { rel, cols, key_len: key.len(), consts, eqs });
        (id, vars)
    }

    fn regex(&mut self, pattern: &str) -> Result<usize, String> {
        if let Some(&id) = self.regex_ids.get(pattern) {
            return Ok(id);
        }
        let re = Regex::new(&whole(pattern)).map_err(|e| e.to_string())?;
        let id = self.regexes.len();
        self.regexes.push(re);
        self.regex_ids.insert(pattern.to_string(), id);
        Ok(id)
    }

    fn op(&mut self, lit: &Lit, bound: &[bool]) -> Result<Op, String> {
        Ok(match lit {
            Lit::Cmp { lhs, op, rhs, .. } => Op::Cmp(self.expr(lhs), *op, self.expr(rhs)),
            Lit::Bind { var, expr, .. } => Op::Bind(*var, self.expr(expr)),
            Lit::Pred { pred: Pred::Match, pattern, subject, .. } => {
                let p = match pattern {
                    Expr::Const(Const::Sym(s)) => Ok(self.regex(s)?),
                    other => Err(self.expr(other)),
                };
                Op::Match(p, self.expr(subject))
            }
            Lit::Pred { pred: Pred::Contains, pattern, subject, .. } => {
                Op::Contains(self.expr(pattern), self.expr(subject))
            }
            Lit::Atom { rel, args, negated: true, .. } => {
                let (consts, eqs, firsts) = self.layout(args);
                let cols: Vec<usize> = firsts.iter().map(|&(_, c)| c).collect();
                let vars: Vec<usize> = firsts.iter().map(|&(v, _)| v).collect();
                let key_len = cols.len();
                self.width = self.width.max(key_len);
                let index = self.neg_indexes.len();
                self.neg_indexes.push(IndexSpec { rel: *rel, cols, key_len, consts, eqs });
                Op::Neg { index, vars }
            }
            Lit::Agg { agg, .. } => {
                let id = self.aggs.len();
                let target = agg.target.as_ref().map(|t| self.expr(t));
                let residual = match &agg.residual {
                    None => None,
                    Some(r) => {
                        if r.names.len() > MAX_VARS {
                            return Err(format!(
                                "an aggregate's body has {} variables; the evaluator supports at most {MAX_VARS}",
                                r.names.len()
                            ));
                        }
                        let ops = r.lits.iter().map(|l| self.op(l, &[])).collect::<Result<_, _>>()?;
                        Some(ResidualPlan { arity: self.program.relations[agg.aux].arity(), ops })
                    }
                };
                self.aggs.push(AggPlan { kind: agg.kind, aux: agg.aux, corr_len: agg.corr.len(), target, residual });
                let outer = agg.residual.as_ref().map(|r| r.outer.clone()).unwrap_or_default();
                Op::Agg { agg: id, corr: agg.corr.clone(), outer, result: agg.result, bound: bound[agg.result] }
            }
            Lit::Atom { negated: false, .. } => unreachable!("positive atoms are steps"),
        })
    }

    #[allow(clippy::needless_range_loop)] // steps index several parallel vectors
    /// Which step of a rule evaluates each of its non-atom literals (`others`): the first after
    /// which its inputs are bound. Returns each step's ops, the variables bound after each step,
    /// and which literals were placed.
    #[allow(clippy::type_complexity)]
    fn schedule(
        &mut self,
        atoms: &[(RelId, &Vec<Arg>)],
        others: &[&Lit],
        nvars: usize,
    ) -> Result<(Vec<Vec<Op>>, Vec<Vec<bool>>, Vec<bool>), String> {
        let nsteps = atoms.len().max(1);
        let mut bound = vec![false; nvars];
        let mut step_ops: Vec<Vec<Op>> = vec![vec![]; nsteps];
        let mut bound_after: Vec<Vec<bool>> = vec![];
        let mut done = vec![false; others.len()];
        // An aggregate whose value an atom or an earlier literal binds (the checker orders them)
        // compares with that value: it must wait for it, wherever the atoms put it.
        let mut set_before = vec![false; nvars];
        for (_, args) in atoms {
            atom_vars(args).into_iter().for_each(|v| set_before[v] = true);
        }
        let compares: Vec<bool> = others
            .iter()
            .map(|lit| match lit {
                Lit::Bind { var, .. } => {
                    set_before[*var] = true;
                    false
                }
                Lit::Agg { agg, .. } => std::mem::replace(&mut set_before[agg.result], true),
                _ => false,
            })
            .collect();
        for s in 0..nsteps {
            if let Some((_, args)) = atoms.get(s) {
                for v in atom_vars(args) {
                    bound[v] = true;
                }
            }
            // Literals are in dependency order (from the checker), so one pass suffices.
            for (i, lit) in others.iter().enumerate() {
                if done[i] {
                    continue;
                }
                let mut needs = vec![];
                crate::check::lit_vars(lit, &mut needs);
                let (inputs, outputs): (Vec<usize>, Vec<usize>) = match lit {
                    Lit::Bind { var, expr, .. } => {
                        let mut e = vec![];
                        expr.vars(&mut e);
                        (e, vec![*var])
                    }
                    Lit::Agg { agg, .. } if compares[i] => (agg.inputs().chain([agg.result]).collect(), vec![]),
                    Lit::Agg { agg, .. } => (agg.inputs().collect(), vec![agg.result]),
                    _ => (needs, vec![]),
                };
                if inputs.iter().all(|&v| bound[v]) {
                    let op = self.op(lit, &bound)?;
                    step_ops[s].push(op);
                    for v in outputs {
                        bound[v] = true;
                    }
                    done[i] = true;
                }
            }
            bound_after.push(bound.clone());
        }
        Ok((step_ops, bound_after, done))
    }

    fn rule(&mut self, rule: &Rule) -> Result<RulePlan, String> {
        let nvars = rule.vars.len();
        if nvars > MAX_VARS {
            return Err(format!("the rule has {nvars} variables; the evaluator supports at most {MAX_VARS}"));
        }
        let atoms: Vec<(RelId, &Vec<Arg>)> = rule
            .body
            .iter()
            .filter_map(|l| match l {
                Lit::Atom { rel, args, negated: false, .. } => Some((*rel, args)),
                _ => None,
            })
            .collect();
        let others: Vec<&Lit> = rule.body.iter().filter(|l| !matches!(l, Lit::Atom { negated: false, .. })).collect();
        let nsteps = atoms.len().max(1);
        let (mut step_ops, bound_after, done) = self.schedule(&atoms, &others, nvars)?;
        // Variables used at or after each step: later atoms, later ops, the head.
        let mut head_vars = vec![];
        rule.head_args.iter().for_each(|e| e.vars(&mut head_vars));
        let op_vars = |ops: &[Op]| -> Vec<usize> {
            let mut vs = vec![];
            for op in ops {
                op_inputs(op, &mut vs);
            }
            vs
        };
        let mut steps = vec![];
        for s in 0..nsteps {
            let last = s + 1 == nsteps;
            // Live after this step: what later steps and the head read.
            let mut live: Vec<usize> = head_vars.clone();
            for t in s + 1..nsteps {
                live.extend(atom_vars(atoms[t].1));
                live.extend(op_vars(&step_ops[t]));
            }
            let out = if last {
                vec![]
            } else {
                let next_key: Vec<usize> =
                    atom_vars(atoms[s + 1].1).into_iter().filter(|&v| bound_after[s][v]).collect();
                let mut out = next_key.clone();
                for (v, &is_bound) in bound_after[s].iter().enumerate() {
                    if is_bound && live.contains(&v) && !out.contains(&v) {
                        out.push(v);
                    }
                }
                out
            };
            self.width = self.width.max(out.len());
            // What this step's index must hold: the key shared with the previous rows, then the
            // atom's other variables that this step's ops or later steps read.
            let source = match atoms.get(s) {
                None => Source::Unit,
                Some((rel, args)) => {
                    let vars = atom_vars(args);
                    // Step 0's index is laid out like its output rows, so that with no
                    // filters it feeds the first join directly.
                    let key: Vec<usize> = if s == 0 {
                        out.iter().copied().filter(|v| vars.contains(v)).collect()
                    } else {
                        // Same order as the previous step's output key.
                        steps
                            .last()
                            .map(|p: &Step| p.out.clone())
                            .unwrap_or_default()
                            .into_iter()
                            .filter(|v| vars.contains(v))
                            .collect()
                    };
                    let mut needed = live.clone();
                    needed.extend(op_vars(&step_ops[s]));
                    needed.extend(&out);
                    let rest: Vec<usize> =
                        vars.iter().copied().filter(|v| !key.contains(v) && needed.contains(v)).collect();
                    let (id, held) = self.atom_index(*rel, args, &key, &rest);
                    Source::Scan(id, held)
                }
            };
            let key_len = match (&source, s) {
                (Source::Scan(id, _), s) if s > 0 => self.indexes[*id].key_len,
                _ => 0,
            };
            steps.push(Step { source, key_len, ops: std::mem::take(&mut step_ops[s]), out });
        }
        if done.iter().any(|d| !d) {
            return Err("a literal's variables are never bound (the checker should have refused this rule)".into());
        }
        let head_exprs = rule.head_args.iter().map(|e| self.expr(e)).collect();
        self.width = self.width.max(self.program.relations[rule.head].arity());
        let dominance = self.dominance(rule);
        Ok(RulePlan { rule: rule.id, head: rule.head, steps, head_exprs, dominance })
    }

    /// Recognizes the dominance shape (see `Dominance`): two positive atoms of one relation that
    /// agree column by column (the same key variables, the same constants, `_` or a variable
    /// used nowhere else) but for one number column holding `D` and `D2`, and `D2 > D` (`D < D2`,
    /// or `<` for the other direction) as the only other literal; the head reads only the key
    /// variables and `D`.
    fn dominance(&mut self, rule: &Rule) -> Option<Dominance> {
        let [
            Lit::Atom { rel: r1, args: a1, negated: false, .. },
            Lit::Atom { rel: r2, args: a2, negated: false, .. },
            Lit::Cmp { lhs: Expr::Var(l), op, rhs: Expr::Var(r), .. },
        ] = &rule.body[..]
        else {
            return None;
        };
        if r1 != r2 || a1.len() != a2.len() {
            return None;
        }
        let mut uses = vec![0usize; rule.vars.len()];
        for a in a1.iter().chain(a2) {
            if let Arg::Var(v) = a {
                uses[*v] += 1;
            }
        }
        let mut head_vars = vec![];
        rule.head_args.iter().for_each(|e| e.vars(&mut head_vars));
        head_vars.iter().for_each(|&v| uses[v] += 1);
        uses[*l] += 1;
        uses[*r] += 1;
        let unused = |a: &Arg| match a {
            Arg::Wild => true,
            Arg::Var(v) => uses[*v] == 1,
            Arg::Const(_) => false,
        };
        let (mut key, mut dom) = (vec![], None);
        for (i, (x, y)) in a1.iter().zip(a2).enumerate() {
            match (x, y) {
                (Arg::Const(c), Arg::Const(d)) if c == d => {}
                (Arg::Var(k), Arg::Var(k2)) if k == k2 => key.push(*k),
                (Arg::Var(d), Arg::Var(d2)) if dom.is_none() && !unused(x) && !unused(y) => dom = Some((i, *d, *d2)),
                _ if unused(x) && unused(y) => {}
                _ => return None,
            }
        }
        let (col, d, d2) = dom?;
        let greater = match op {
            CmpOp::Gt if (*l, *r) == (d2, d) => true,
            CmpOp::Lt if (*l, *r) == (d, d2) => true,
            CmpOp::Lt if (*l, *r) == (d2, d) => false,
            CmpOp::Gt if (*l, *r) == (d, d2) => false,
            _ => return None,
        };
        // Each variable once per atom (no equal-column filter), `D2` only in the atom and the
        // comparison, the head over the key and `D`, `D` a number.
        let once = |args: &[Arg]| {
            let vs: Vec<usize> =
                args.iter().filter_map(|a| if let Arg::Var(v) = a { Some(*v) } else { None }).collect();
            vs.iter().enumerate().all(|(i, v)| !vs[..i].contains(v))
        };
        if !once(a1)
            || !once(a2)
            || head_vars.contains(&d2)
            || !head_vars.iter().all(|v| *v == d || key.contains(v))
            || self.program.relations[*r1].columns[col].1 != crate::Type::Number
        {
            return None;
        }
        let (index, vars) = self.atom_index(*r1, a1, &key, &[d]);
        let leading = a1.iter().take(key.len()).map(|a| if let Arg::Var(v) = a { Some(*v) } else { None });
        let direct =
            (leading.eq(key.iter().map(|&k| Some(k))) && !a1.iter().any(|a| matches!(a, Arg::Const(_)))).then_some(col);
        Some(Dominance { index, vars, greater, direct })
    }
}

/// The variables an op reads.
pub fn op_inputs(op: &Op, out: &mut Vec<usize>) {
    fn e(x: &CExpr, out: &mut Vec<usize>) {
        match x {
            CExpr::Var(v) => out.push(*v),
            CExpr::Lit(_) => {}
            CExpr::Arith(_, a, b) => {
                e(a, out);
                e(b, out);
            }
            CExpr::Call(_, args) => args.iter().for_each(|a| e(a, out)),
        }
    }
    match op {
        Op::Cmp(a, _, b) | Op::Contains(a, b) => {
            e(a, out);
            e(b, out);
        }
        Op::Bind(_, x) => e(x, out),
        Op::Match(p, s) => {
            if let Err(p) = p {
                e(p, out);
            }
            e(s, out);
        }
        Op::Neg { vars, .. } => out.extend(vars),
        Op::Agg { corr, outer, result, bound, .. } => {
            out.extend(corr);
            out.extend(outer);
            if *bound {
                out.push(*result);
            }
        }
    }
}

impl QueryPlan {
    /// Compiles a checked program. Fails only on the evaluator's limits (too many variables in
    /// a rule, rows wider than `MAX_WIDTH`) or a constant regex that does not compile.
    pub fn new(program: &Program) -> Result<QueryPlan, Vec<Diagnostic>> {
        let mut b = Builder {
            program,
            base: Interner::default(),
            indexes: vec![],
            index_ids: HashMap::new(),
            neg_indexes: vec![],
            aggs: vec![],
            regexes: vec![],
            regex_ids: HashMap::new(),
            width: 1,
        };
        let mut errors = vec![];
        let mut rules = vec![];
        for rule in &program.rules {
            match b.rule(rule) {
                Ok(p) => rules.push(p),
                Err(message) => errors.push(Diagnostic::error(rule.span, message)),
            }
        }
        for rel in &program.relations {
            b.width = b.width.max(rel.arity());
        }
        let mut facts = vec![vec![]; program.relations.len()];
        for (rel, values, _) in &program.facts {
            let row = values.iter().map(|c| b.base.intern(c.clone())).collect();
            facts[*rel].push(row);
        }
        let width = [2, 4, 8, 16].into_iter().find(|&w| w >= b.width);
        let Some(width) = width else {
            let at = program.relations.iter().find(|r| r.arity() == b.width).map(|r| r.span).unwrap_or_default();
            errors.push(Diagnostic::error(
                at,
                format!("a row of {} columns is wider than the evaluator's limit of {MAX_WIDTH}", b.width),
            ));
            return Err(errors);
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        let strata = program
            .strata
            .iter()
            .map(|rels| StratumPlan {
                rels: rels.clone(),
                rules: rules.iter().enumerate().filter(|(_, r)| rels.contains(&r.head)).map(|(i, _)| i).collect(),
            })
            .collect();
        Ok(QueryPlan {
            width,
            indexes: b.indexes,
            neg_indexes: b.neg_indexes,
            aggs: b.aggs,
            rules,
            strata,
            regexes: b.regexes,
            base: b.base,
            facts,
        })
    }
}

/// An atom's variables, each once, in the order they appear.
fn atom_vars(args: &[Arg]) -> Vec<usize> {
    let mut vs = vec![];
    for a in args {
        if let Arg::Var(v) = a
            && !vs.contains(v)
        {
            vs.push(*v);
        }
    }
    vs
}
