//! The reference evaluator: slow, naive and obviously correct, kept to check `eval`.
//!
//! It shares only the checked `Program` (and the pure value functions) with the fast path:
//! values are `Const`s, relations are `BTreeSet`s, each stratum is iterated naively (every
//! rule re-run on everything) until nothing changes, and a rule body is enumerated by
//! backtracking over its literals in order. Aggregates read their auxiliary relation, which
//! this evaluator computes itself in a lower stratum. Never use it for real work.

use crate::ast::{AggKind, Pred};
use crate::eval::Facts;
use crate::program::*;
use crate::value;
use std::collections::{BTreeMap, BTreeSet};

/// Each relation's tuples, by `RelId`, as the reference evaluator derives them.
pub type Relations = Vec<BTreeSet<Vec<Const>>>;
/// Called with each satisfying binding of a rule's body.
type Emit<'a> = dyn FnMut(&[Option<Const>]) -> Result<(), String> + 'a;

/// The reference evaluator met a value it cannot compute with (the property test only
/// compares that both evaluators fail).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ReferenceError {
    /// What the evaluator could not compute.
    pub message: String,
}

/// Evaluates `program` on `facts`.
pub fn evaluate(program: &Program, facts: &Facts) -> Result<Relations, ReferenceError> {
    naive(program, facts).map_err(|message| ReferenceError { message })
}

fn naive(program: &Program, facts: &Facts) -> Result<Relations, String> {
    let mut rels: Relations = vec![BTreeSet::new(); program.relations.len()];
    for (rel, values, _) in &program.facts {
        rels[*rel].insert(values.clone());
    }
    for (rel, tuples) in facts.iter().enumerate() {
        for t in tuples {
            rels[rel].insert(t.clone());
        }
    }
    for stratum in &program.strata {
        loop {
            let mut new: Vec<(RelId, Vec<Const>)> = vec![];
            for rule in program.rules.iter().filter(|r| stratum.contains(&r.head)) {
                let mut env: Vec<Option<Const>> = vec![None; rule.vars.len()];
                body(rule, 0, &mut env, &rels, &mut |env| {
                    let mut head = vec![];
                    for e in &rule.head_args {
                        head.push(expr(e, env)?);
                    }
                    new.push((rule.head, head));
                    Ok(())
                })?;
            }
            let mut changed = false;
            for (rel, t) in new {
                changed |= rels[rel].insert(t);
            }
            if !changed {
                break;
            }
        }
    }
    Ok(rels)
}

fn expr(e: &Expr, env: &[Option<Const>]) -> Result<Const, String> {
    Ok(match e {
        Expr::Var(v) => env[*v].clone().ok_or("unbound variable")?,
        Expr::Const(c) => c.clone(),
        Expr::Arith(op, a, b) => {
            let (Const::Num(x), Const::Num(y)) = (expr(a, env)?, expr(b, env)?) else {
                return Err("arithmetic on a symbol".into());
            };
            Const::Num(value::arith(*op, x, y).map_err(|e| e.to_string())?)
        }
        Expr::Call(f, args) => {
            let vals: Result<Vec<Const>, String> = args.iter().map(|a| expr(a, env)).collect();
            value::call(*f, &vals?).map_err(|e| e.to_string())?
        }
    })
}

/// Does `args` match `tuple` under `env`? Binds new variables into `env` when it does.
fn unify(args: &[Arg], tuple: &[Const], env: &mut [Option<Const>]) -> bool {
    for (a, v) in args.iter().zip(tuple) {
        match a {
            Arg::Wild => {}
            Arg::Const(c) => {
                if c != v {
                    return false;
                }
            }
            Arg::Var(x) => match &env[*x] {
                Some(b) if b != v => return false,
                Some(_) => {}
                None => env[*x] = Some(v.clone()),
            },
        }
    }
    true
}

fn body(rule: &Rule, i: usize, env: &mut Vec<Option<Const>>, rels: &Relations, k: &mut Emit<'_>) -> Result<(), String> {
    let Some(lit) = rule.body.get(i) else {
        return k(env);
    };
    match lit {
        Lit::Atom { rel, args, negated: false, .. } => {
            for t in &rels[*rel] {
                let saved = env.clone();
                if unify(args, t, env) {
                    body(rule, i + 1, env, rels, k)?;
                }
                *env = saved;
            }
            Ok(())
        }
        Lit::Atom { rel, args, negated: true, .. } => {
            let any = rels[*rel].iter().any(|t| {
                let mut probe = env.clone();
                unify(args, t, &mut probe)
            });
            if any { Ok(()) } else { body(rule, i + 1, env, rels, k) }
        }
        Lit::Cmp { .. } | Lit::Pred { .. } => {
            if holds(lit, env, rels)? {
                body(rule, i + 1, env, rels, k)
            } else {
                Ok(())
            }
        }
        Lit::Bind { var, expr: e, .. } => {
            let v = expr(e, env)?;
            let saved = env[*var].clone();
            env[*var] = Some(v);
            body(rule, i + 1, env, rels, k)?;
            env[*var] = saved;
            Ok(())
        }
        Lit::Agg { agg, .. } => {
            let key: Vec<Const> = agg.corr.iter().map(|v| env[*v].clone().unwrap()).collect();
            let mut values: BTreeMap<(), Vec<i64>> = BTreeMap::new();
            let group = values.entry(()).or_default();
            'rows: for t in &rels[agg.aux] {
                if t[..key.len()] == key[..] {
                    let mut cols: Vec<Option<Const>> = t.iter().cloned().map(Some).collect();
                    if let Some(r) = &agg.residual {
                        // The row, then the outside values, then what the residual binds.
                        cols.extend(r.outer.iter().map(|v| env[*v].clone()));
                        cols.resize(r.names.len(), None);
                        for l in &r.lits {
                            if !holds(l, &mut cols, rels)? {
                                continue 'rows;
                            }
                        }
                    }
                    let x = match &agg.target {
                        None => 1,
                        Some(e) => match expr(e, &cols)? {
                            Const::Num(n) => n,
                            Const::Sym(_) => return Err("aggregate over a symbol".into()),
                        },
                    };
                    group.push(x);
                }
            }
            let v = match agg.kind {
                AggKind::Count => group.len() as i64,
                AggKind::Sum => {
                    group.iter().try_fold(0i64, |a, &b| a.checked_add(b)).ok_or("integer overflow in sum")?
                }
                AggKind::Min => match group.iter().min() {
                    Some(&m) => m,
                    None => return Ok(()),
                },
                AggKind::Max => match group.iter().max() {
                    Some(&m) => m,
                    None => return Ok(()),
                },
            };
            let v = Const::Num(v);
            match &env[agg.result] {
                Some(b) if *b != v => Ok(()),
                Some(_) => body(rule, i + 1, env, rels, k),
                None => {
                    env[agg.result] = Some(v);
                    body(rule, i + 1, env, rels, k)?;
                    env[agg.result] = None;
                    Ok(())
                }
            }
        }
    }
}

/// Whether a comparison, a predicate, an `=` binding or a negation holds under `env` (binding
/// what it binds).
fn holds(lit: &Lit, env: &mut [Option<Const>], rels: &Relations) -> Result<bool, String> {
    Ok(match lit {
        Lit::Atom { rel, args, negated: true, .. } => !rels[*rel].iter().any(|t| {
            let mut probe = env.to_vec();
            unify(args, t, &mut probe)
        }),
        Lit::Cmp { lhs, op, rhs, .. } => {
            let (a, b) = (expr(lhs, env)?, expr(rhs, env)?);
            op.holds(&a, &b)
        }
        Lit::Pred { pred, pattern, subject, .. } => {
            let (Const::Sym(p), Const::Sym(s)) = (expr(pattern, env)?, expr(subject, env)?) else {
                return Err("predicate on a number".into());
            };
            match pred {
                Pred::Contains => s.contains(&p),
                Pred::Match => regex::Regex::new(&crate::plan::whole(&p)).map_err(|e| e.to_string())?.is_match(&s),
            }
        }
        Lit::Bind { var, expr: e, .. } => {
            let v = expr(e, env)?;
            env[*var] = Some(v);
            true
        }
        _ => return Err("only constraints and bindings are checked alone".into()),
    })
}
