//! The fast evaluator: a `QueryPlan` run on datafrog 2.0.1, stratum by stratum.
//!
//! Start at `evaluate`. Rows are `[u32; W]` for the program's width `W` (2, 4, 8 or 16, chosen
//! at load) beside a provenance field `M` that equality and order ignore: `()` when
//! provenance is off, `Prov { rule, height }` when on, so deduplication keeps one derivation
//! and costs nothing when unused. Each stratum is one datafrog `Iteration`: a `Variable` per
//! relation, one per keyed index of those relations (`<relation>_by_<columns>`) and one per
//! intermediate binding row of a multi-atom rule. Joins merge the key prefixes of two sorted
//! inputs (datafrog's semi-naive recent x stable scheme) and apply the step's filters in the
//! same pass. Negation looks rows up in a finished relation by binary search: datafrog's
//! `Relation::from_antijoin` is not used (in 2.0.1 it always returns an empty relation).

use crate::ast::{AggKind, CmpOp};
use crate::db::{Database, INPUT, RelData};
use crate::plan::{AggPlan, CExpr, MAX_VARS, Op, QueryPlan, ResidualPlan, Source, Step};
use crate::program::{Const, Program, RelId};
use crate::value::{self, Interner, ValueError};
use datafrog::{Iteration, Relation, Variable};
use regex::Regex;
use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::rc::Rc;

/// Patterns compiled for `match` with a pattern from the facts, kept for the process: the same
/// few patterns (the field metadata's, the stages') come back in every evaluation, and compiling
/// one costs far more than matching it. Shared, so the regex's search caches are too. Bounded:
/// past `KEPT_PATTERNS` distinct patterns the set starts over.
fn compiled(pattern: &str) -> Result<std::sync::Arc<Regex>, String> {
    use std::sync::{Arc, Mutex, OnceLock};
    type Kept = HashMap<String, Result<Arc<Regex>, String>>;
    static KEPT: OnceLock<Mutex<Kept>> = OnceLock::new();
    const KEPT_PATTERNS: usize = 4096;
    let kept = KEPT.get_or_init(Default::default);
    if let Some(r) = kept.lock().unwrap_or_else(|e| e.into_inner()).get(pattern) {
        return r.clone();
    }
    let r = Regex::new(&crate::plan::whole(pattern)).map(Arc::new).map_err(|e| e.to_string());
    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() >= KEPT_PATTERNS {
        kept.clear();
    }
    kept.insert(pattern.to_string(), r.clone());
    r
}

/// Provenance carried beside a row.
pub trait Meta: Copy + Default + std::fmt::Debug + 'static {
    fn new(rule: u32, height: u32) -> Self;
    fn rule(self) -> u32;
    fn height(self) -> u32;
}

impl Meta for () {
    fn new(_: u32, _: u32) -> Self {}
    fn rule(self) -> u32 {
        INPUT
    }
    fn height(self) -> u32 {
        0
    }
}

/// The rule that derived a row and the round it appeared in.
#[derive(Clone, Copy, Debug, Default)]
pub struct Prov {
    pub rule: u32,
    pub height: u32,
}

impl Meta for Prov {
    fn new(rule: u32, height: u32) -> Self {
        Prov { rule, height }
    }
    fn rule(self) -> u32 {
        self.rule
    }
    fn height(self) -> u32 {
        self.height
    }
}

/// A row and its provenance; order and equality look at the row only.
#[derive(Clone, Copy, Debug)]
pub struct Tup<const W: usize, M> {
    pub row: [u32; W],
    pub meta: M,
}

impl<const W: usize, M> PartialEq for Tup<W, M> {
    fn eq(&self, other: &Self) -> bool {
        self.row == other.row
    }
}
impl<const W: usize, M> Eq for Tup<W, M> {}
impl<const W: usize, M> PartialOrd for Tup<W, M> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<const W: usize, M> Ord for Tup<W, M> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.row.cmp(&other.row)
    }
}

/// Options of one evaluation.
#[derive(Clone, Copy, Debug)]
pub struct EvalOptions {
    /// Record which rule derived each tuple and when; needed for `explain`.
    pub provenance: bool,
    /// Stop with an error once the relations hold more tuples than this in total.
    pub max_tuples: usize,
    /// Rounds of one recursive stratum at most: each round of `b(X + 1) :- b(X).` makes one
    /// tuple, so the tuple budget alone would take hours to stop it.
    pub max_rounds: usize,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions { provenance: false, max_tuples: 10_000_000, max_rounds: 100_000 }
    }
}

/// A failure during evaluation, naming the rule and the value at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// A rule met a value it cannot compute with (an unparseable version, a regex from a fact
    /// that does not compile, an arithmetic overflow).
    #[error("{at}: in the rule for `{relation}`: {message}")]
    Rule {
        /// The rule's position.
        at: crate::diag::Location,
        /// The relation the rule derives.
        relation: String,
        /// What could not be computed.
        message: String,
    },
    /// The evaluation made more tuples than its budget (`EvalOptions::max_tuples`).
    #[error(
        "evaluation: stopped after {tuples} tuples (limit {limit}): does a rule make new values without bound, such as `p(N + 1) :- p(N).`?"
    )]
    TupleBudget {
        /// The tuples made when it stopped.
        tuples: usize,
        /// The budget.
        limit: usize,
    },
    /// A recursive stratum ran more rounds than its budget (`EvalOptions::max_rounds`).
    #[error(
        "evaluation: stopped after {limit} rounds of recursion through `{relation}`: does a rule make new values without bound, such as `p(N + 1) :- p(N).`?"
    )]
    RoundBudget {
        /// A relation of the stratum.
        relation: String,
        /// The budget.
        limit: usize,
    },
}

/// Input facts, already interned against the evaluation's interner.
pub type Facts = Vec<Vec<Vec<Const>>>;

/// Facts already interned, built by a host that knows its relations' types (see
/// `Engine::fact_builder`). Each value is interned once, however many facts use it.
#[derive(Clone, Debug)]
pub struct FactBuilder {
    interner: Interner,
    /// Per relation: its facts' values, flat.
    rows: Vec<Vec<u32>>,
    /// Per relation: how many facts (nullary relations have no values to count).
    counts: Vec<usize>,
    arity: Vec<usize>,
}

impl FactBuilder {
    pub(crate) fn new(program: &Program, plan: &QueryPlan) -> FactBuilder {
        FactBuilder {
            interner: plan.base.clone(),
            rows: vec![vec![]; program.relations.len()],
            counts: vec![0; program.relations.len()],
            arity: program.relations.iter().map(|r| r.arity()).collect(),
        }
    }

    /// The id of a symbol, interned on first use.
    pub fn sym(&mut self, s: &str) -> u32 {
        self.interner.intern_sym(s)
    }

    /// `sym` for a string the host owns: moved into the table, never copied.
    pub fn sym_owned(&mut self, s: String) -> u32 {
        self.interner.intern_sym_owned(s)
    }

    /// Room for `n` more facts of `rel`.
    pub fn reserve(&mut self, rel: RelId, n: usize) {
        self.rows[rel].reserve(n * self.arity[rel]);
    }

    /// Room for `n` more symbols.
    pub fn reserve_syms(&mut self, n: usize) {
        self.interner.reserve_syms(n);
    }

    /// The id of a number.
    pub fn num(&mut self, n: i64) -> u32 {
        self.interner.intern_num(n)
    }

    /// The id of a constant of either type.
    pub fn value(&mut self, c: &Const) -> u32 {
        self.interner.intern_ref(c)
    }

    /// Adds one fact. The host guarantees the column types (this is the trusted fast path;
    /// untrusted input goes through `facts::FactSet`, which checks them).
    pub fn push(&mut self, rel: RelId, row: &[u32]) {
        assert_eq!(row.len(), self.arity[rel], "fact of the wrong arity for relation {rel}");
        self.rows[rel].extend_from_slice(row);
        self.counts[rel] += 1;
    }
}

/// Evaluates the program on `facts` (indexed by relation id, values typed as declared).
pub fn evaluate(program: &Program, plan: &QueryPlan, facts: &Facts, opts: EvalOptions) -> Result<Database, EvalError> {
    let mut b = FactBuilder::new(program, plan);
    let mut row = vec![];
    for (rel, tuples) in facts.iter().enumerate() {
        for t in tuples {
            row.clear();
            row.extend(t.iter().map(|c| b.interner.intern_ref(c)));
            b.push(rel, &row);
        }
    }
    evaluate_built(program, plan, b, opts)
}

/// Evaluates the program on interned facts.
pub fn evaluate_built(
    program: &Program,
    plan: &QueryPlan,
    facts: FactBuilder,
    opts: EvalOptions,
) -> Result<Database, EvalError> {
    evaluate_built_for(program, plan, facts, opts, None)
}

/// The relations an evaluation computes for a host that reads only some of them: those the
/// read ones depend on (`Program::upstream`). Made once, when the rules load.
#[derive(Clone, Debug)]
pub struct Demand {
    needed: Vec<bool>,
}

impl Demand {
    /// What must be evaluated to answer `wanted`: those relations and every relation they read, transitively.
    pub fn new(program: &Program, wanted: &[RelId]) -> Demand {
        Demand { needed: program.upstream(wanted) }
    }
}

/// Evaluates only what `demand` needs (everything with `None`); every other relation stays
/// empty in the result.
pub fn evaluate_built_for(
    program: &Program,
    plan: &QueryPlan,
    facts: FactBuilder,
    opts: EvalOptions,
    demand: Option<&Demand>,
) -> Result<Database, EvalError> {
    let needed = demand.map(|d| &d.needed[..]);
    match (plan.width, opts.provenance) {
        (2, false) => Eval::<2, ()>::run(program, plan, facts, opts, needed),
        (2, true) => Eval::<2, Prov>::run(program, plan, facts, opts, needed),
        (4, false) => Eval::<4, ()>::run(program, plan, facts, opts, needed),
        (4, true) => Eval::<4, Prov>::run(program, plan, facts, opts, needed),
        (8, false) => Eval::<8, ()>::run(program, plan, facts, opts, needed),
        (8, true) => Eval::<8, Prov>::run(program, plan, facts, opts, needed),
        (_, false) => Eval::<16, ()>::run(program, plan, facts, opts, needed),
        (_, true) => Eval::<16, Prov>::run(program, plan, facts, opts, needed),
    }
}

/// Compares the first `k` values of two rows.
#[inline(always)]
fn key_cmp<const W: usize>(a: &[u32; W], b: &[u32; W], k: usize) -> Ordering {
    match k {
        0 => Ordering::Equal,
        1 => a[0].cmp(&b[0]),
        2 => (a[0], a[1]).cmp(&(b[0], b[1])),
        _ => a[..k].cmp(&b[..k]),
    }
}

/// Skips past every element for which `less` holds (exponential then binary search).
#[inline]
fn gallop<T>(mut slice: &[T], mut less: impl FnMut(&T) -> bool) -> &[T] {
    if !slice.is_empty() && less(&slice[0]) {
        let mut step = 1;
        while step < slice.len() && less(&slice[step]) {
            slice = &slice[step..];
            step <<= 1;
        }
        step >>= 1;
        while step > 0 {
            if step < slice.len() && less(&slice[step]) {
                slice = &slice[step..];
            }
            step >>= 1;
        }
        slice = &slice[1..];
    }
    slice
}

/// Merge join of two sorted slices on their first `k` values.
/// `f` returns whether to go on: the join stops at once when it says no (a tuple budget).
fn join_slices<const W: usize, M>(
    mut a: &[Tup<W, M>],
    mut b: &[Tup<W, M>],
    k: usize,
    f: &mut impl FnMut(&Tup<W, M>, &Tup<W, M>) -> bool,
) -> bool {
    while !a.is_empty() && !b.is_empty() {
        match key_cmp(&a[0].row, &b[0].row, k) {
            Ordering::Less => {
                let key = b[0].row;
                a = gallop(a, |x| key_cmp(&x.row, &key, k) == Ordering::Less);
            }
            Ordering::Greater => {
                let key = a[0].row;
                b = gallop(b, |x| key_cmp(&x.row, &key, k) == Ordering::Less);
            }
            Ordering::Equal => {
                let na = a.iter().take_while(|x| key_cmp(&x.row, &a[0].row, k) == Ordering::Equal).count();
                let nb = b.iter().take_while(|x| key_cmp(&x.row, &b[0].row, k) == Ordering::Equal).count();
                for x in &a[..na] {
                    for y in &b[..nb] {
                        if !f(x, y) {
                            return false;
                        }
                    }
                }
                a = &a[na..];
                b = &b[nb..];
            }
        }
    }
    true
}

/// Where a step reads its rows from: a finished sorted vector or a datafrog variable.
enum Input<const W: usize, M: Meta> {
    Static(Rc<Vec<Tup<W, M>>>),
    Dynamic(Variable<Tup<W, M>>),
}

impl<const W: usize, M: Meta> Input<W, M> {
    fn is_dynamic(&self) -> bool {
        matches!(self, Input::Dynamic(_))
    }

    /// How many rows, recent and stable.
    fn len(&self) -> usize {
        match self {
            Input::Static(v) => v.len(),
            Input::Dynamic(var) => {
                var.recent.borrow().len() + var.stable.borrow().iter().map(|r| r.len()).sum::<usize>()
            }
        }
    }

    /// Calls `f(recent, stable batches)`; a static input is all stable.
    fn with<R>(&self, f: impl FnOnce(&[Tup<W, M>], &[&[Tup<W, M>]]) -> R) -> R {
        match self {
            Input::Static(v) => f(&[], &[&v[..]]),
            Input::Dynamic(var) => {
                let recent = var.recent.borrow();
                let stable = var.stable.borrow();
                let batches: Vec<&[Tup<W, M>]> = stable.iter().map(|r| &r.elements[..]).collect();
                f(&recent.elements[..], &batches)
            }
        }
    }
}

/// Values by key, for lookups from inside a join (negations, aggregates): the pairs sorted by
/// key, and, since ids are dense from 0, a bitmap of the first column's ids with a rank per
/// word that leads straight to the run of pairs sharing it (a few memory reads, where a binary
/// search over all pairs takes `log2 n` unpredictable steps). Sparse ids keep binary search.
#[derive(Clone, Debug)]
struct Keyed<const W: usize> {
    pairs: Vec<([u32; W], u32)>,
    /// Empty when the keys are searched instead.
    bits: Vec<u64>,
    /// Set bits before each word of `bits`.
    rank: Vec<u32>,
    /// Per distinct first column, in order: where its run starts; then `pairs.len()`.
    starts: Vec<u32>,
}

impl<const W: usize> Keyed<W> {
    /// From pairs sorted by key, keys unique, of `key_len` columns.
    fn new(pairs: Vec<([u32; W], u32)>, key_len: usize) -> Keyed<W> {
        let mut k = Keyed { pairs, bits: vec![], rank: vec![], starts: vec![] };
        let words = k.pairs.last().map_or(0, |(key, _)| key[0] as usize / 64 + 1);
        if key_len == 0 || words > 4 * k.pairs.len() + 1024 {
            return k;
        }
        k.bits = vec![0u64; words];
        for (i, (key, _)) in k.pairs.iter().enumerate() {
            let id = key[0] as usize;
            if i == 0 || k.pairs[i - 1].0[0] != key[0] {
                k.bits[id / 64] |= 1 << (id % 64);
                k.starts.push(i as u32);
            }
        }
        k.starts.push(k.pairs.len() as u32);
        let mut seen = 0u32;
        k.rank = k
            .bits
            .iter()
            .map(|w| {
                let before = seen;
                seen += w.count_ones();
                before
            })
            .collect();
        k
    }

    #[inline]
    fn get(&self, key: &[u32; W]) -> Option<u32> {
        let run = if self.bits.is_empty() {
            &self.pairs[..]
        } else {
            let id = key[0] as usize;
            let word = *self.bits.get(id / 64)?;
            let bit = 1u64 << (id % 64);
            if word & bit == 0 {
                return None;
            }
            let nth = (self.rank[id / 64] + (word & (bit - 1)).count_ones()) as usize;
            &self.pairs[self.starts[nth] as usize..self.starts[nth + 1] as usize]
        };
        match run {
            [(k, v)] => (k == key).then_some(*v),
            _ => run.binary_search_by(|(k, _)| k.cmp(key)).ok().map(|i| run[i].1),
        }
    }
}

/// The keys a negation must not find: one-column keys as a bitmap of their ids (one pass
/// over the relation, no sort), wider keys sorted and found through `Keyed`.
#[derive(Clone, Debug)]
enum NegKeys<const W: usize> {
    Ids(Vec<u64>),
    Rows(Keyed<W>),
}

/// Sets the bit of each id.
fn bitmap(ids: impl Iterator<Item = u32>) -> Vec<u64> {
    let mut bits: Vec<u64> = vec![];
    for id in ids {
        let id = id as usize;
        if bits.len() <= id / 64 {
            bits.resize(id / 64 + 1, 0);
        }
        bits[id / 64] |= 1 << (id % 64);
    }
    bits
}

/// The ids whose bit is set, in order.
fn ids(bits: &[u64]) -> impl Iterator<Item = u32> + '_ {
    bits.iter().enumerate().flat_map(|(w, &word)| {
        let mut rest = word;
        std::iter::from_fn(move || {
            (rest != 0).then(|| {
                let b = rest.trailing_zeros();
                rest &= rest - 1;
                (w * 64) as u32 + b
            })
        })
    })
}

impl<const W: usize> NegKeys<W> {
    fn new<M: Copy>(spec: &crate::plan::IndexSpec, rows: &[Tup<W, M>]) -> NegKeys<W> {
        let keys = rows.iter().filter_map(|t| project_row(spec, t)).map(|t| t.row);
        if spec.cols.len() == 1 {
            return NegKeys::Ids(bitmap(keys.map(|k| k[0])));
        }
        let mut keys: Vec<[u32; W]> = keys.collect();
        crate::sort::sort_rows(&mut keys, |k| k);
        keys.dedup();
        NegKeys::Rows(Keyed::new(keys.into_iter().map(|k| (k, 0)).collect(), spec.cols.len()))
    }

    #[inline]
    fn contains(&self, key: &[u32; W]) -> bool {
        match self {
            NegKeys::Ids(bits) => {
                let id = key[0] as usize;
                bits.get(id / 64).is_some_and(|w| w & (1 << (id % 64)) != 0)
            }
            NegKeys::Rows(k) => k.get(key).is_some(),
        }
    }
}

/// An aggregate's values: folded once per key, or, for an aggregate with a residual, its aux
/// rows (sorted, so a key's rows are one run), folded per lookup under the outside values.
#[derive(Clone, Debug)]
enum AggTable<const W: usize> {
    Folded(Keyed<W>),
    Rows(Vec<[u32; W]>),
}

struct Ctx<'a, const W: usize> {
    program: &'a Program,
    plan: &'a QueryPlan,
    interner: RefCell<Interner>,
    neg: Vec<Option<Rc<NegKeys<W>>>>,
    /// Per aggregate: its value by correlated key (built from the sorted aux relation).
    aggs: Vec<Option<AggTable<W>>>,
    dyn_regex: RefCell<HashMap<u32, Result<std::sync::Arc<Regex>, String>>>,
    error: RefCell<Option<EvalError>>,
    zero: u32,
}

impl<const W: usize> Ctx<'_, W> {
    /// Records that one step made more rows than the tuple budget.
    fn over_budget(&self, tuples: usize, limit: usize) {
        let mut e = self.error.borrow_mut();
        if e.is_none() {
            *e = Some(EvalError::TupleBudget { tuples, limit });
        }
    }

    fn fail(&self, rule: usize, message: String) {
        let mut e = self.error.borrow_mut();
        if e.is_none() {
            let r = &self.program.rules[rule];
            let rule = r.aux_of.unwrap_or(rule);
            *e = Some(EvalError::Rule {
                at: self.program.sources.location(self.program.rules[rule].span),
                relation: self.program.relations[self.program.rules[rule].head].name.clone(),
                message,
            });
        }
    }

    fn num(&self, e: &CExpr, env: &[u32; MAX_VARS]) -> Result<i64, ValueError> {
        match e {
            CExpr::Var(v) => Ok(self.interner.borrow().num(env[*v])),
            CExpr::Lit(id) => Ok(self.interner.borrow().num(*id)),
            CExpr::Arith(op, a, b) => value::arith(*op, self.num(a, env)?, self.num(b, env)?),
            CExpr::Call(..) => {
                let id = self.value(e, env)?;
                Ok(self.interner.borrow().num(id))
            }
        }
    }

    /// The value of an expression; variables and constants inline, the rest out of line.
    #[inline(always)]
    fn value(&self, e: &CExpr, env: &[u32; MAX_VARS]) -> Result<u32, ValueError> {
        match e {
            CExpr::Var(v) => Ok(env[*v]),
            CExpr::Lit(id) => Ok(*id),
            _ => self.computed(e, env),
        }
    }

    #[inline(never)]
    fn computed(&self, e: &CExpr, env: &[u32; MAX_VARS]) -> Result<u32, ValueError> {
        match e {
            CExpr::Var(v) => Ok(env[*v]),
            CExpr::Lit(id) => Ok(*id),
            CExpr::Arith(..) => {
                let n = self.num(e, env)?;
                Ok(self.interner.borrow_mut().intern_num(n))
            }
            CExpr::Call(f, args) => {
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    let id = self.value(a, env)?;
                    vals.push(self.interner.borrow().value(id).clone());
                }
                let c = value::call(*f, &vals)?;
                Ok(self.interner.borrow_mut().intern(c))
            }
        }
    }

    /// Folds an aggregate over rows of one key, keeping those that pass the residual under the
    /// outside values; `None` when no row counts. Min and max keep the row's own value id.
    #[inline(never)]
    fn fold<'r>(
        &self,
        a: &AggPlan,
        rows: impl Iterator<Item = &'r [u32; W]>,
        residual: Option<(&ResidualPlan, &[u32])>,
    ) -> Result<Option<u32>, ValueError> {
        let mut env = [0u32; MAX_VARS];
        let mut acc: Option<(i64, Option<u32>)> = None;
        'rows: for row in rows {
            if let Some((r, values)) = residual {
                env[..W].copy_from_slice(row);
                env[r.arity..r.arity + values.len()].copy_from_slice(values);
                for op in &r.ops {
                    if !self.op(op, &mut env)? {
                        continue 'rows;
                    }
                }
            }
            let (x, id) = match &a.target {
                None => (1, None),
                Some(CExpr::Var(c)) => {
                    let id = if residual.is_some() { env[*c] } else { row[*c] };
                    (self.interner.borrow().num(id), Some(id))
                }
                Some(t) => {
                    if residual.is_none() {
                        env[..W].copy_from_slice(row);
                    }
                    (self.num(t, &env)?, None)
                }
            };
            acc = Some(match (a.kind, acc) {
                (AggKind::Count | AggKind::Sum, None) => (x, None),
                (_, None) => (x, id),
                (AggKind::Count | AggKind::Sum, Some((s, _))) => match s.checked_add(x) {
                    Some(v) => (v, None),
                    None => return Err(ValueError::SumOverflow { lhs: s, rhs: x }),
                },
                (AggKind::Min, Some(m)) if x < m.0 => (x, id),
                (AggKind::Max, Some(m)) if x > m.0 => (x, id),
                (_, Some(m)) => m,
            });
        }
        Ok(acc.map(|(n, id)| id.unwrap_or_else(|| self.interner.borrow_mut().intern_num(n))))
    }

    /// A head tuple from the rule's head expressions under `env`; `None` (the error recorded)
    /// when one fails.
    #[inline]
    fn head_row(&self, exprs: &[CExpr], env: &[u32; MAX_VARS], rule: usize) -> Option<[u32; W]> {
        let mut row = [0u32; W];
        for (k, e) in exprs.iter().enumerate() {
            match self.value(e, env) {
                Ok(v) => row[k] = v,
                Err(err) => {
                    self.fail(rule, err.to_string());
                    return None;
                }
            }
        }
        Some(row)
    }

    /// Runs a step's ops on the environment; false when a filter rejects it or on error.
    fn run_ops(&self, ops: &[Op], env: &mut [u32; MAX_VARS], rule: usize) -> bool {
        for op in ops {
            let ok = match self.op(op, env) {
                Ok(ok) => ok,
                Err(e) => {
                    self.fail(rule, e.to_string());
                    false
                }
            };
            if !ok {
                return false;
            }
        }
        true
    }

    #[inline(always)]
    fn op(&self, op: &Op, env: &mut [u32; MAX_VARS]) -> Result<bool, ValueError> {
        Ok(match op {
            Op::Cmp(a, cmp, b) => {
                let (x, y) = (self.value(a, env)?, self.value(b, env)?);
                match cmp {
                    CmpOp::Eq => x == y,
                    CmpOp::Ne => x != y,
                    _ => {
                        let i = self.interner.borrow();
                        let ord = i.value(x).cmp(i.value(y));
                        match cmp {
                            CmpOp::Lt => ord == Ordering::Less,
                            CmpOp::Le => ord != Ordering::Greater,
                            CmpOp::Gt => ord == Ordering::Greater,
                            _ => ord != Ordering::Less,
                        }
                    }
                }
            }
            Op::Bind(v, e) => {
                env[*v] = self.value(e, env)?;
                true
            }
            Op::Match(pattern, subject) => {
                let s = self.value(subject, env)?;
                let i = self.interner.borrow();
                match pattern {
                    Ok(re) => self.plan.regexes[*re].is_match(i.sym(s)),
                    Err(p) => {
                        drop(i);
                        let pid = self.value(p, env)?;
                        let i = self.interner.borrow();
                        let mut cache = self.dyn_regex.borrow_mut();
                        let re = cache.entry(pid).or_insert_with(|| compiled(i.sym(pid)));
                        match re {
                            Ok(re) => re.is_match(i.sym(s)),
                            Err(e) => {
                                return Err(ValueError::BadRegex(i.sym(pid).to_string(), e.clone()));
                            }
                        }
                    }
                }
            }
            Op::Contains(sub, s) => {
                let (a, b) = (self.value(sub, env)?, self.value(s, env)?);
                let i = self.interner.borrow();
                i.sym(b).contains(i.sym(a))
            }
            Op::Neg { index, vars } => {
                let mut key = [0u32; W];
                for (i, v) in vars.iter().enumerate() {
                    key[i] = env[*v];
                }
                let keys = self.neg[*index].as_ref().expect("negation index built before its stratum");
                !keys.contains(&key)
            }
            Op::Agg { agg, corr, outer, result, bound } => {
                let mut key = [0u32; W];
                for (i, v) in corr.iter().enumerate() {
                    key[i] = env[*v];
                }
                let a = &self.plan.aggs[*agg];
                let found = match self.aggs[*agg].as_ref().expect("aggregate computed before its stratum") {
                    AggTable::Folded(table) => table.get(&key),
                    AggTable::Rows(rows) => {
                        let n = a.corr_len;
                        let lo = rows.partition_point(|r| key_cmp(r, &key, n) == Ordering::Less);
                        let hi = lo + rows[lo..].partition_point(|r| key_cmp(r, &key, n) == Ordering::Equal);
                        let mut values = [0u32; MAX_VARS];
                        for (i, v) in outer.iter().enumerate() {
                            values[i] = env[*v];
                        }
                        let residual = a.residual.as_ref().map(|r| (r, &values[..outer.len()]));
                        self.fold(a, rows[lo..hi].iter(), residual)?
                    }
                };
                let value = match found {
                    Some(v) => v,
                    None => match a.kind {
                        AggKind::Count | AggKind::Sum => self.zero,
                        AggKind::Min | AggKind::Max => return Ok(false),
                    },
                };
                if *bound {
                    env[*result] == value
                } else {
                    env[*result] = value;
                    true
                }
            }
        })
    }
}

struct Eval<'a, const W: usize, M: Meta> {
    ctx: Ctx<'a, W>,
    done: Vec<Option<Rc<Vec<Tup<W, M>>>>>,
    static_index: HashMap<usize, Rc<Vec<Tup<W, M>>>>,
    height: u32,
    opts: EvalOptions,
}

/// A rule's runtime in a recursive stratum: the input of each step (its index) and the
/// holder of each step's output.
struct RuleRt<const W: usize, M: Meta> {
    plan: usize,
    inputs: Vec<Input<W, M>>,
    outs: Vec<Option<Input<W, M>>>,
    dynamic: Vec<bool>,
}

impl<'a, const W: usize, M: Meta> Eval<'a, W, M> {
    fn run(
        program: &'a Program,
        plan: &'a QueryPlan,
        facts: FactBuilder,
        opts: EvalOptions,
        needed: Option<&[bool]>,
    ) -> Result<Database, EvalError> {
        let FactBuilder { mut interner, rows: fact_rows, counts, arity } = facts;
        let zero = interner.intern_num(0);
        let nrels = program.relations.len();
        let mut initial: Vec<Vec<Tup<W, M>>> = vec![vec![]; nrels];
        for (rel, rows) in plan.facts.iter().enumerate() {
            for r in rows {
                initial[rel].push(Self::tup(r, M::new(INPUT, 0)));
            }
        }
        for (rel, flat) in fact_rows.iter().enumerate() {
            initial[rel].reserve(counts[rel]);
            match arity[rel] {
                0 if counts[rel] > 0 => initial[rel].push(Self::tup(&[], M::new(INPUT, 0))),
                0 => {}
                a => initial[rel].extend(flat.chunks_exact(a).map(|r| Self::tup(r, M::new(INPUT, 0)))),
            }
        }
        let mut ev = Eval {
            ctx: Ctx {
                program,
                plan,
                interner: RefCell::new(interner),
                neg: vec![None; plan.neg_indexes.len()],
                aggs: vec![None; plan.aggs.len()],
                dyn_regex: RefCell::new(HashMap::new()),
                error: RefCell::new(None),
                zero,
            },
            done: vec![None; nrels],
            static_index: HashMap::new(),
            height: 0,
            opts,
        };
        let mut total = 0usize;
        for s in 0..plan.strata.len() {
            if needed.is_some_and(|n| plan.strata[s].rels.iter().all(|&r| !n[r])) {
                continue;
            }
            ev.stratum(s, &mut initial, &mut total)?;
        }
        let rounds = ev.height;
        let interner = ev.ctx.interner.into_inner();
        let rels = ev
            .done
            .into_iter()
            .enumerate()
            .map(|(r, rows)| {
                let arity = program.relations[r].arity();
                let rows = rows.unwrap_or_default();
                let mut data = RelData { arity, count: rows.len(), ..Default::default() };
                data.rows.reserve(rows.len() * arity);
                for t in rows.iter() {
                    data.rows.extend_from_slice(&t.row[..arity]);
                }
                if opts.provenance {
                    data.rule = rows.iter().map(|t| t.meta.rule()).collect();
                    data.height = rows.iter().map(|t| t.meta.height()).collect();
                }
                data
            })
            .collect();
        Ok(Database { interner, rels, provenance: opts.provenance, rounds })
    }

    fn tup(values: &[u32], meta: M) -> Tup<W, M> {
        let mut row = [0u32; W];
        row[..values.len()].copy_from_slice(values);
        Tup { row, meta }
    }

    fn check_error(&self) -> Result<(), EvalError> {
        match self.ctx.error.borrow().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Projects a finished relation into an index (filters, permutation, sort, dedup). Rows
    /// projected to a prefix of their columns stay sorted: only duplicates, adjacent, go.
    fn project(&self, spec: &crate::plan::IndexSpec, rows: &[Tup<W, M>]) -> Vec<Tup<W, M>> {
        if spec.cols.is_empty() {
            // No column kept: one empty row if any row passes the filters.
            return rows.iter().find_map(|t| project_row(spec, t)).into_iter().collect();
        }
        if spec.cols.len() == 1 {
            // One column: the ids seen, as a bitmap read back in order, are sorted and unique.
            // (An index row's provenance is never read: only derived tuples carry theirs.)
            let bits = bitmap(rows.iter().filter_map(|t| project_row(spec, t)).map(|t| t.row[0]));
            return ids(&bits).map(|id| Self::tup(&[id], M::default())).collect();
        }
        let mut out = Vec::with_capacity(rows.len());
        out.extend(rows.iter().filter_map(|t| project_row(spec, t)));
        if spec.cols.iter().enumerate().all(|(i, &c)| i == c) {
            out.dedup();
            out
        } else {
            sorted(out).elements
        }
    }

    fn static_index(&mut self, idx: usize) -> Rc<Vec<Tup<W, M>>> {
        if let Some(v) = self.static_index.get(&idx) {
            return v.clone();
        }
        let plan = self.ctx.plan;
        let spec = &plan.indexes[idx];
        // The same rows under another key length are the same index.
        let same = |o: &crate::plan::IndexSpec| {
            o.rel == spec.rel && o.cols == spec.cols && o.consts == spec.consts && o.eqs == spec.eqs
        };
        if let Some(v) = self.static_index.iter().find(|(i, _)| same(&plan.indexes[**i])).map(|(_, v)| v.clone()) {
            self.static_index.insert(idx, v.clone());
            return v;
        }
        let rows = self.done[spec.rel].clone().unwrap_or_default();
        let identity = spec.consts.is_empty()
            && spec.eqs.is_empty()
            && spec.cols.iter().copied().eq(0..self.ctx.program.relations[spec.rel].arity());
        // The relation itself is its own index: shared, not copied.
        let v = if identity { rows } else { Rc::new(self.project(spec, &rows)) };
        self.static_index.insert(idx, v.clone());
        v
    }

    /// Builds the negation indexes and aggregate tables the stratum's rules read.
    fn prepare(&mut self, rules: &[usize]) -> Result<(), EvalError> {
        let plan = self.ctx.plan;
        for &r in rules {
            for step in &plan.rules[r].steps {
                // An aggregate's residual may negate too: its ops are prepared with the step's.
                let residual = step.ops.iter().flat_map(|op| match op {
                    Op::Agg { agg, .. } => plan.aggs[*agg].residual.as_ref().map_or(&[][..], |r| &r.ops[..]),
                    _ => &[],
                });
                for op in step.ops.iter().chain(residual) {
                    match op {
                        Op::Neg { index, .. } if self.ctx.neg[*index].is_none() => {
                            let spec = &plan.neg_indexes[*index];
                            let rows = self.done[spec.rel].clone().unwrap_or_default();
                            self.ctx.neg[*index] = Some(Rc::new(NegKeys::new(spec, &rows)));
                        }
                        Op::Agg { agg, .. } if self.ctx.aggs[*agg].is_none() => {
                            let table = self.aggregate(*agg, plan.rules[r].rule)?;
                            self.ctx.aggs[*agg] = Some(table);
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }

    fn aggregate(&self, agg: usize, rule: usize) -> Result<AggTable<W>, EvalError> {
        let a = &self.ctx.plan.aggs[agg];
        let rows = self.done[a.aux].clone().unwrap_or_default();
        if a.residual.is_some() {
            return Ok(AggTable::Rows(rows.iter().map(|t| t.row).collect()));
        }
        let mut out = vec![];
        let mut i = 0;
        while i < rows.len() {
            let key_row = rows[i].row;
            let j = i + rows[i..].partition_point(|t| key_cmp(&t.row, &key_row, a.corr_len) == Ordering::Equal);
            let v = match self.ctx.fold(a, rows[i..j].iter().map(|t| &t.row), None) {
                Ok(v) => v.expect("a group has a row"),
                Err(e) => {
                    self.ctx.fail(rule, e.to_string());
                    return Err(self.ctx.error.borrow().clone().expect("just failed"));
                }
            };
            let mut key = [0u32; W];
            key[..a.corr_len].copy_from_slice(&key_row[..a.corr_len]);
            out.push((key, v));
            i = j;
        }
        Ok(AggTable::Folded(Keyed::new(out, a.corr_len)))
    }

    /// Each rule's runtime in a recursive stratum: a step reads its index (`dyn_index` for this
    /// stratum's relations, a static one otherwise), and a step fed by a dynamic one is dynamic.
    fn rule_runtimes(
        &mut self,
        rules: &[usize],
        dyn_index: &HashMap<usize, Variable<Tup<W, M>>>,
        it: &mut Iteration,
    ) -> Vec<RuleRt<W, M>> {
        let plan = self.ctx.plan;
        let mut rts: Vec<RuleRt<W, M>> = vec![];
        for &r in rules {
            let rp = &plan.rules[r];
            let mut inputs = vec![];
            let mut dynamic = vec![];
            for (i, step) in rp.steps.iter().enumerate() {
                let input = match &step.source {
                    Source::Unit => Input::Static(Rc::new(vec![Tup { row: [0; W], meta: M::default() }])),
                    Source::Scan(idx, _) => match dyn_index.get(idx) {
                        Some(v) => Input::Dynamic(v.clone()),
                        None => Input::Static(self.static_index(*idx)),
                    },
                };
                let d = input.is_dynamic() || (i > 0 && dynamic[i - 1]);
                dynamic.push(d);
                inputs.push(input);
            }
            let mut outs = vec![];
            for (i, step) in rp.steps.iter().enumerate() {
                let last = i + 1 == rp.steps.len();
                // Step 0 with no filter is its own index: no copy.
                let direct = i == 0
                    && step.ops.is_empty()
                    && matches!(step.source, Source::Scan(..))
                    && plan.indexes[match step.source {
                        Source::Scan(idx, _) => idx,
                        _ => 0,
                    }]
                    .cols
                    .len()
                        == step.out.len();
                if last || direct {
                    outs.push(None);
                } else if dynamic[i] {
                    outs.push(Some(Input::Dynamic(
                        it.variable(&format!("{}_step{i}", self.ctx.program.relations[rp.head].name)),
                    )));
                } else {
                    outs.push(Some(Input::Static(Rc::new(vec![]))));
                }
            }
            rts.push(RuleRt { plan: r, inputs, outs, dynamic });
        }
        rts
    }

    fn stratum(&mut self, s: usize, initial: &mut [Vec<Tup<W, M>>], total: &mut usize) -> Result<(), EvalError> {
        let plan = self.ctx.plan;
        let sp = &plan.strata[s];
        self.height += 1;
        if sp.rules.is_empty() {
            for &rel in &sp.rels {
                let rows = std::mem::take(&mut initial[rel]);
                let rel_rows = sorted(rows).elements;
                *total += rel_rows.len();
                self.done[rel] = Some(Rc::new(rel_rows));
            }
            return Ok(());
        }
        self.prepare(&sp.rules)?;
        let in_stratum = |rel: RelId| sp.rels.contains(&rel);
        let recursive = sp.rules.iter().any(|&r| {
            plan.rules[r]
                .steps
                .iter()
                .any(|st| matches!(st.source, Source::Scan(idx, _) if in_stratum(plan.indexes[idx].rel)))
        });
        if !recursive {
            return self.non_recursive(s, initial, total);
        }
        let mut it = Iteration::new();
        let mut vars: HashMap<RelId, Variable<Tup<W, M>>> = HashMap::new();
        for &rel in &sp.rels {
            let v = it.variable::<Tup<W, M>>(&self.ctx.program.relations[rel].name);
            v.insert(sorted(std::mem::take(&mut initial[rel])));
            vars.insert(rel, v);
        }
        // Keyed copies of this stratum's relations, fed from their relation each round.
        let mut dyn_index: HashMap<usize, Variable<Tup<W, M>>> = HashMap::new();
        for &r in &sp.rules {
            for step in &plan.rules[r].steps {
                if let Source::Scan(idx, _) = &step.source {
                    let spec = &plan.indexes[*idx];
                    if in_stratum(spec.rel) && !dyn_index.contains_key(idx) {
                        let name = index_name(self.ctx.program, spec);
                        dyn_index.insert(*idx, it.variable(&name));
                    }
                }
            }
        }
        let mut rts = self.rule_runtimes(&sp.rules, &dyn_index, &mut it);
        // Static parts: computed once, before the loop.
        let h = self.height;
        for rt in &mut rts {
            let rp = &plan.rules[rt.plan];
            for i in 0..rp.steps.len() {
                if rt.dynamic[i] {
                    break;
                }
                let rows = self.run_step(rp, i, &rt.inputs, &rt.outs, h, true);
                let last = i + 1 == rp.steps.len();
                if last {
                    vars[&rp.head].insert(sorted(rows));
                } else if let Some(Input::Static(slot)) = &mut rt.outs[i] {
                    *slot = Rc::new(sorted(rows).elements);
                }
            }
        }
        self.check_error()?;
        let names: Vec<(usize, RelId)> = dyn_index.keys().map(|&i| (i, plan.indexes[i].rel)).collect();
        let mut rounds = 0;
        while it.changed() {
            rounds += 1;
            if rounds > self.opts.max_rounds {
                let relation = self.ctx.program.relations[self.ctx.program.strata[s][0]].name.clone();
                return Err(EvalError::RoundBudget { relation, limit: self.opts.max_rounds });
            }
            self.height += 1;
            let h = self.height;
            for &(idx, rel) in &names {
                let spec = &plan.indexes[idx];
                let src = vars[&rel].recent.borrow();
                let rows: Vec<Tup<W, M>> = src.iter().filter_map(|t| project_row(spec, t)).collect();
                drop(src);
                dyn_index[&idx].insert(sorted(rows));
            }
            for rt in &rts {
                let rp = &plan.rules[rt.plan];
                for i in 0..rp.steps.len() {
                    if !rt.dynamic[i] {
                        continue;
                    }
                    let rows = self.run_step(rp, i, &rt.inputs, &rt.outs, h, false);
                    let last = i + 1 == rp.steps.len();
                    if last {
                        vars[&rp.head].insert(sorted(rows));
                    } else if let Some(Input::Dynamic(v)) = &rt.outs[i] {
                        v.insert(sorted(rows));
                    }
                }
            }
            self.check_error()?;
            let mut size = *total;
            for v in vars.values() {
                size += v.recent.borrow().len() + v.stable.borrow().iter().map(|b| b.len()).sum::<usize>();
            }
            if size > self.opts.max_tuples {
                return Err(EvalError::TupleBudget { tuples: size, limit: self.opts.max_tuples });
            }
        }
        drop(rts);
        drop(dyn_index);
        for (rel, v) in vars {
            let rows = v.complete().elements;
            *total += rows.len();
            self.done[rel] = Some(Rc::new(rows));
        }
        Ok(())
    }

    /// A stratum whose rules read only lower strata: each rule's chain runs once over finished
    /// inputs, with no datafrog iteration (it would find nothing new after the first round).
    fn non_recursive(&mut self, s: usize, initial: &mut [Vec<Tup<W, M>>], total: &mut usize) -> Result<(), EvalError> {
        let plan = self.ctx.plan;
        let sp = &plan.strata[s];
        let h = self.height;
        let mut rows: HashMap<RelId, Vec<Tup<W, M>>> = HashMap::new();
        for &rel in &sp.rels {
            rows.insert(rel, std::mem::take(&mut initial[rel]));
        }
        for &r in &sp.rules {
            let rp = &plan.rules[r];
            // A dominance self-join over a finished relation: one scan of its index.
            if let Some(dm) = &rp.dominance {
                let (rows_in, dcol) = match dm.direct {
                    Some(c) => (self.done[plan.indexes[dm.index].rel].clone().unwrap_or_default(), c),
                    None => (self.static_index(dm.index), dm.vars.len() - 1),
                };
                let produced = self.dominated(rp, dm, &rows_in, dcol, h);
                rows.get_mut(&rp.head).expect("head in its stratum").extend(produced);
                self.check_error()?;
                continue;
            }
            // A rule that copies an index as it is (one scan, no filter, the head its columns in
            // order, as an aggregate's body often is) takes the index's rows directly. With
            // provenance each row must name this rule, so it runs like any other.
            if let [Step { source: Source::Scan(idx, held), ops, .. }] = &rp.steps[..]
                && ops.is_empty()
                && !self.opts.provenance
                && rp
                    .head_exprs
                    .iter()
                    .map(|e| match e {
                        CExpr::Var(v) => Some(*v),
                        _ => None,
                    })
                    .eq(held.iter().map(|&v| Some(v)))
            {
                let index = self.static_index(*idx);
                rows.get_mut(&rp.head).expect("head in its stratum").extend_from_slice(&index);
                continue;
            }
            let mut inputs = vec![];
            for step in &rp.steps {
                inputs.push(match &step.source {
                    Source::Unit => Input::Static(Rc::new(vec![Tup { row: [0; W], meta: M::default() }])),
                    Source::Scan(idx, _) => Input::Static(self.static_index(*idx)),
                });
            }
            let mut outs: Vec<Option<Input<W, M>>> = vec![];
            for i in 0..rp.steps.len() {
                let produced = self.run_step(rp, i, &inputs, &outs, h, true);
                if i + 1 == rp.steps.len() {
                    rows.get_mut(&rp.head).expect("head in its stratum").extend(produced);
                } else {
                    outs.push(Some(Input::Static(Rc::new(sorted(produced).elements))));
                }
            }
            self.check_error()?;
        }
        for (rel, r) in rows {
            let rows = sorted(r).elements;
            *total += rows.len();
            self.done[rel] = Some(Rc::new(rows));
        }
        Ok(())
    }

    /// The head tuples of a dominance rule (see `plan::Dominance`) from `rows`, sorted by the
    /// key columns (the first `vars.len() - 1`), `D` in column `dcol`: in each run of one key,
    /// every `D` that is not the run's largest (smallest). The tuples the self-join makes, each
    /// once, in order when the head is the key then `D`, and no pair built.
    fn dominated(
        &self,
        rp: &crate::plan::RulePlan,
        dm: &crate::plan::Dominance,
        rows: &[Tup<W, M>],
        dcol: usize,
        height: u32,
    ) -> Vec<Tup<W, M>> {
        let k = dm.vars.len() - 1;
        let mut kept: Vec<(usize, u32)> = vec![];
        {
            let interner = self.ctx.interner.borrow();
            let mut i = 0;
            let mut run: Vec<u32> = vec![];
            while i < rows.len() {
                let mut j = i + 1;
                while j < rows.len() && rows[j].row[..k] == rows[i].row[..k] {
                    j += 1;
                }
                let vals = rows[i..j].iter().map(|t| interner.num(t.row[dcol]));
                let extreme = if dm.greater { vals.max() } else { vals.min() }.expect("a run holds a row");
                run.clear();
                run.extend(rows[i..j].iter().map(|t| t.row[dcol]).filter(|&d| interner.num(d) != extreme));
                run.sort_unstable();
                run.dedup();
                kept.extend(run.iter().map(|&d| (i, d)));
                i = j;
            }
        }
        let meta = M::new(rp.rule as u32, height);
        let mut env = [0u32; MAX_VARS];
        let mut out = Vec::with_capacity(kept.len());
        for (x, d) in kept {
            for (c, v) in dm.vars[..k].iter().enumerate() {
                env[*v] = rows[x].row[c];
            }
            env[dm.vars[k]] = d;
            if let Some(row) = self.ctx.head_row(&rp.head_exprs, &env, rp.rule) {
                out.push(Tup { row, meta });
            }
        }
        out
    }

    /// Runs step `i` of a rule: its source joined with the previous step's rows (semi-naive
    /// unless `full`), then its ops; returns the produced rows (binding rows or head tuples).
    fn run_step(
        &self,
        rp: &crate::plan::RulePlan,
        i: usize,
        inputs: &[Input<W, M>],
        outs: &[Option<Input<W, M>>],
        height: u32,
        full: bool,
    ) -> Vec<Tup<W, M>> {
        let step = &rp.steps[i];
        let last = i + 1 == rp.steps.len();
        let rule = rp.rule;
        let meta = M::new(rule as u32, height);
        // Most steps produce about as many rows as their left input: room for that up front.
        let left_len = if i == 0 { inputs[0].len() } else { outs[i - 1].as_ref().unwrap_or(&inputs[i - 1]).len() };
        let mut results: Vec<Tup<W, M>> = Vec::with_capacity(left_len);
        let held: &[usize] = match &step.source {
            Source::Scan(_, held) => held,
            Source::Unit => &[],
        };
        let ctx = &self.ctx;
        let mut env = [0u32; MAX_VARS];
        let emit = |env: &mut [u32; MAX_VARS], results: &mut Vec<Tup<W, M>>| {
            if !ctx.run_ops(&step.ops, env, rule) {
                return;
            }
            let mut row = [0u32; W];
            if last {
                match ctx.head_row(&rp.head_exprs, env, rule) {
                    Some(r) => row = r,
                    None => return,
                }
            } else {
                for (k, v) in step.out.iter().enumerate() {
                    row[k] = env[*v];
                }
            }
            results.push(Tup { row, meta });
        };
        if i == 0 {
            let mut each = |rows: &[Tup<W, M>]| {
                for t in rows {
                    for (k, v) in held.iter().enumerate() {
                        env[*v] = t.row[k];
                    }
                    emit(&mut env, &mut results);
                }
            };
            inputs[0].with(|recent, stable| {
                if full {
                    stable.iter().for_each(|b| each(b));
                }
                each(recent);
            });
            return results;
        }
        // The left input: the previous step's rows, or its index directly.
        let left = outs[i - 1].as_ref().unwrap_or(&inputs[i - 1]);
        let prev_out: &[usize] = &rp.steps[i - 1].out;
        let cap = self.opts.max_tuples;
        let k = step.key_len;
        let mut on_pair = |l: &Tup<W, M>, r: &Tup<W, M>| {
            for (j, v) in prev_out.iter().enumerate() {
                env[*v] = l.row[j];
            }
            for (j, v) in held.iter().enumerate().skip(k) {
                env[*v] = r.row[j];
            }
            emit(&mut env, &mut results);
            // One step's rows past the tuple budget: stop now, before memory runs out.
            results.len() <= cap
        };
        left.with(|l_recent, l_stable| {
            inputs[i].with(|r_recent, r_stable| {
                if full {
                    'all: for a in l_stable.iter().chain(std::iter::once(&l_recent)) {
                        for b in r_stable.iter().chain(std::iter::once(&r_recent)) {
                            if !join_slices(a, b, k, &mut on_pair) {
                                break 'all;
                            }
                        }
                    }
                } else {
                    let _ = r_stable.iter().all(|b| join_slices(l_recent, b, k, &mut on_pair))
                        && l_stable.iter().all(|a| join_slices(a, r_recent, k, &mut on_pair))
                        && join_slices(l_recent, r_recent, k, &mut on_pair);
                }
            })
        });
        if results.len() > cap {
            self.ctx.over_budget(results.len(), cap);
        }
        results
    }
}

/// Sorts and deduplicates rows (unstable sort: duplicates in one batch come from the same
/// round, so whichever is kept is a valid derivation).
fn sorted<const W: usize, M: Copy>(mut rows: Vec<Tup<W, M>>) -> Relation<Tup<W, M>> {
    crate::sort::sort_rows(&mut rows, |t| &t.row);
    rows.dedup();
    Relation { elements: rows }
}

/// One row of an index: filtered by the spec's constants and equalities, then permuted.
#[inline]
fn project_row<const W: usize, M: Copy>(spec: &crate::plan::IndexSpec, t: &Tup<W, M>) -> Option<Tup<W, M>> {
    for &(c, v) in &spec.consts {
        if t.row[c] != v {
            return None;
        }
    }
    for &(a, b) in &spec.eqs {
        if t.row[a] != t.row[b] {
            return None;
        }
    }
    let mut row = [0u32; W];
    for (k, &c) in spec.cols.iter().enumerate() {
        row[k] = t.row[c];
    }
    Some(Tup { row, meta: t.meta })
}

/// `<relation>_by_<columns>`, the name datafrog variables of keyed copies carry.
pub fn index_name(program: &Program, spec: &crate::plan::IndexSpec) -> String {
    let rel = &program.relations[spec.rel];
    let key: Vec<&str> = spec.cols[..spec.key_len].iter().map(|&c| rel.columns[c].0.as_str()).collect();
    if key.is_empty() { rel.name.clone() } else { format!("{}_by_{}", rel.name, key.join("_")) }
}
