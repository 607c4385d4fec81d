//! The static checker: from parsed modules to a `Program`, with every problem at once.
//!
//! Start at `check`. Passes, in order: declarations and directives; facts; each rule
//! (conversion, aggregate desugaring, type inference, safety and binding order); then
//! stratification over the relation dependency graph; then warnings for unused relations.
//! A program with any error is not returned, but all of its diagnostics are.

use crate::ast::{self, AggKind, CmpOp, Literal, Term, Type};
use crate::diag::{Diagnostic, SourceMap, Span};
use crate::program::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Checks the modules (one per file, in load order) and returns the program if there is no error.
pub fn check(modules: &[ast::Module], sources: SourceMap) -> (Option<Program>, Vec<Diagnostic>) {
    let mut c = Checker {
        sources: &sources,
        diags: vec![],
        relations: vec![],
        by_name: HashMap::new(),
        rules: vec![],
        facts: vec![],
        aux_count: 0,
    };
    // Declarations first, so that use before declaration in file order is fine.
    for m in modules {
        for item in &m.items {
            if let ast::Item::Decl(d) = item {
                c.declare(d);
            }
        }
    }
    for m in modules {
        for item in &m.items {
            match item {
                ast::Item::Input(names) | ast::Item::Output(names) => {
                    let is_input = matches!(item, ast::Item::Input(_));
                    for (name, span) in names {
                        match c.by_name.get(name) {
                            Some(&r) => {
                                if is_input {
                                    c.relations[r].input = true
                                } else {
                                    c.relations[r].output = true
                                }
                            }
                            None => c.unknown_relation(name, *span),
                        }
                    }
                }
                ast::Item::Fact(atom) => c.fact(atom),
                ast::Item::Rule(rule) => c.rule(rule),
                ast::Item::Decl(_) | ast::Item::Include(..) => {}
            }
        }
    }
    let (strata, stratum_of) = c.stratify();
    c.warn_unused();
    let has_error = c.diags.iter().any(Diagnostic::is_error);
    let Checker { diags, relations, by_name, rules, facts, .. } = c;
    let mut diags = diags;
    crate::diag::sort(&mut diags);
    if has_error {
        return (None, diags);
    }
    let program = Program { sources, relations, by_name, rules, facts, strata, stratum_of };
    (Some(program), diags)
}

struct Checker<'s> {
    sources: &'s SourceMap,
    diags: Vec<Diagnostic>,
    relations: Vec<Relation>,
    by_name: HashMap<String, RelId>,
    rules: Vec<Rule>,
    facts: Vec<(RelId, Vec<Const>, Span)>,
    aux_count: usize,
}

/// Per-rule variable table during conversion.
#[derive(Default)]
struct Scope {
    names: Vec<String>,
    types: Vec<Option<Type>>,
    first: Vec<Span>,
    wild: usize,
}

impl Scope {
    fn var(&mut self, name: &str, span: Span) -> VarId {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return i;
        }
        self.names.push(name.to_string());
        self.types.push(None);
        self.first.push(span);
        self.names.len() - 1
    }

    fn fresh(&mut self, span: Span) -> VarId {
        self.wild += 1;
        let name = format!("_{}", self.wild);
        self.var(&name, span)
    }
}

fn const_of(term: &Term) -> Option<Const> {
    match term {
        Term::Str(s, _) => Some(Const::Sym(s.clone())),
        Term::Num(n, _) => Some(Const::Num(*n)),
        _ => None,
    }
}

/// Variables named in a term, outside any aggregate's body.
fn term_var_names(term: &Term, out: &mut BTreeSet<String>) {
    match term {
        Term::Var(v, _) => {
            out.insert(v.clone());
        }
        Term::Arith(_, a, b, _) => {
            term_var_names(a, out);
            term_var_names(b, out);
        }
        Term::Call(_, args, _) => args.iter().for_each(|a| term_var_names(a, out)),
        // An aggregate's body is its own scope: its variables are not "outside" another one.
        Term::Agg(..) => {}
        Term::Wild(_) | Term::Str(..) | Term::Num(..) => {}
    }
}

fn lit_var_names(lit: &Literal, out: &mut BTreeSet<String>) {
    match lit {
        Literal::Pos(a) | Literal::Neg(a) => a.args.iter().for_each(|t| term_var_names(t, out)),
        Literal::Cmp(a, _, b, _) | Literal::Pred(_, a, b, _) => {
            term_var_names(a, out);
            term_var_names(b, out);
        }
    }
}

impl Checker<'_> {
    fn err(&mut self, span: Span, msg: impl Into<String>) {
        self.diags.push(Diagnostic::error(span, msg));
    }

    fn unknown_relation(&mut self, name: &str, span: Span) {
        self.err(span, format!("unknown relation `{name}`: declare it with `.decl {name}(...)`"));
    }

    fn declare(&mut self, d: &ast::Decl) {
        if let Some(&prev) = self.by_name.get(&d.name) {
            let first = self.relations[prev].span;
            self.err(d.span, format!("relation `{}` declared twice (first at {})", d.name, self.sources.locate(first)));
            return;
        }
        let mut seen = BTreeSet::new();
        for (col, _) in &d.columns {
            if !seen.insert(col) {
                self.err(d.span, format!("column `{col}` appears twice in `.decl {}`", d.name));
            }
        }
        self.by_name.insert(d.name.clone(), self.relations.len());
        self.relations.push(Relation {
            name: d.name.clone(),
            columns: d.columns.clone(),
            input: false,
            output: false,
            aux: false,
            doc: d.doc.clone(),
            span: d.span,
        });
    }

    fn resolve(&mut self, atom: &ast::Atom) -> Option<RelId> {
        let Some(&r) = self.by_name.get(&atom.rel) else {
            self.unknown_relation(&atom.rel, atom.span);
            return None;
        };
        let arity = self.relations[r].arity();
        if atom.args.len() != arity {
            self.err(
                atom.span,
                format!(
                    "arity mismatch: `{}` has {} column(s), found {} argument(s)",
                    atom.rel,
                    arity,
                    atom.args.len()
                ),
            );
            return None;
        }
        Some(r)
    }

    fn fact(&mut self, atom: &ast::Atom) {
        let Some(r) = self.resolve(atom) else { return };
        let mut values = vec![];
        for (i, t) in atom.args.iter().enumerate() {
            let Some(c) = const_of(t) else {
                self.err(
                    t.span(),
                    format!(
                        "a fact's arguments must be constants: argument {} of `{}` is not (did you mean a rule, `head :- body.`?)",
                        i + 1,
                        atom.rel
                    ),
                );
                return;
            };
            let (col, ty) = self.relations[r].columns[i].clone();
            if c.ty() != ty {
                self.err(
                    t.span(),
                    format!(
                        "type mismatch: column `{col}` of `{}` is a {}, found the {} {c}",
                        atom.rel,
                        ty.name(),
                        c.ty().name()
                    ),
                );
                return;
            }
            values.push(c);
        }
        self.facts.push((r, values, atom.span));
    }

    fn expr(&mut self, term: &Term, scope: &mut Scope, what: &str) -> Option<Expr> {
        Some(match term {
            Term::Var(v, s) => Expr::Var(scope.var(v, *s)),
            Term::Str(..) | Term::Num(..) => Expr::Const(const_of(term).unwrap()),
            Term::Wild(s) => {
                self.err(*s, format!("`_` cannot appear in {what}: it matches anything and binds nothing"));
                return None;
            }
            Term::Arith(op, a, b, _) => {
                let a = self.expr(a, scope, what)?;
                let b = self.expr(b, scope, what)?;
                Expr::Arith(*op, Box::new(a), Box::new(b))
            }
            Term::Call(f, args, s) => {
                let (arity, _, _) = f.signature();
                if let Some(n) = arity {
                    if args.len() != n {
                        self.err(*s, format!("`{}` takes {n} argument(s), found {}", f.name(), args.len()));
                        return None;
                    }
                } else if args.is_empty() {
                    self.err(*s, format!("`{}` takes at least one argument", f.name()));
                    return None;
                }
                let mut out = vec![];
                for a in args {
                    out.push(self.expr(a, scope, what)?);
                }
                Expr::Call(*f, out)
            }
            Term::Agg(_, _, _, s) => {
                self.err(
                    *s,
                    "an aggregate may only stand alone on one side of `=` (for example `N = count : { p(X) }`)",
                );
                return None;
            }
        })
    }

    fn atom_args(&mut self, atom: &ast::Atom, scope: &mut Scope, agg_scope: bool) -> Option<Vec<Arg>> {
        let mut out = vec![];
        for t in &atom.args {
            out.push(match t {
                Term::Var(v, s) => Arg::Var(scope.var(v, *s)),
                // Inside an aggregate, `_` positions count as distinct bindings.
                Term::Wild(s) if agg_scope => Arg::Var(scope.fresh(*s)),
                Term::Wild(_) => Arg::Wild,
                Term::Str(..) | Term::Num(..) => Arg::Const(const_of(t).unwrap()),
                other => {
                    self.err(
                        other.span(),
                        "an atom's arguments are variables, constants or `_`: bind an expression to a variable with `=` first",
                    );
                    return None;
                }
            });
        }
        Some(out)
    }

    /// Converts body literals; `outer` names the variables used outside an aggregate being
    /// converted (empty for a rule's own body).
    fn body(
        &mut self,
        lits: &[Literal],
        scope: &mut Scope,
        rule_id: usize,
        in_agg: bool,
        outer_names: &BTreeSet<String>,
    ) -> Option<Vec<Lit>> {
        let mut out = vec![];
        let mut ok = true;
        for (i, lit) in lits.iter().enumerate() {
            match lit {
                Literal::Pos(a) | Literal::Neg(a) => {
                    let negated = matches!(lit, Literal::Neg(_));
                    let Some(rel) = self.resolve(a) else {
                        ok = false;
                        continue;
                    };
                    let Some(args) = self.atom_args(a, scope, in_agg && !negated) else {
                        ok = false;
                        continue;
                    };
                    out.push(Lit::Atom { rel, args, negated, span: a.span });
                }
                Literal::Pred(pred, a, b, span) => {
                    let (Some(pattern), Some(subject)) =
                        (self.expr(a, scope, "a predicate"), self.expr(b, scope, "a predicate"))
                    else {
                        ok = false;
                        continue;
                    };
                    out.push(Lit::Pred { pred: *pred, pattern, subject, span: *span });
                }
                Literal::Cmp(a, op, b, span) => {
                    let agg_side = match (a, b) {
                        (Term::Agg(..), Term::Agg(..)) => {
                            self.err(*span, "compare an aggregate with a variable, not with another aggregate");
                            ok = false;
                            continue;
                        }
                        (Term::Agg(..), other) => Some((a, other)),
                        (other, Term::Agg(..)) => Some((b, other)),
                        _ => None,
                    };
                    if let Some((agg_term, other)) = agg_side {
                        if *op != CmpOp::Eq {
                            self.err(*span, "an aggregate is bound with `=`; compare its variable afterwards");
                            ok = false;
                            continue;
                        }
                        // Names used anywhere else in this body (or outside it) are correlated.
                        let mut names = outer_names.clone();
                        for (j, l) in lits.iter().enumerate() {
                            if j != i {
                                lit_var_names(l, &mut names);
                            }
                        }
                        term_var_names(other, &mut names);
                        let result = match other {
                            Term::Var(v, s) => scope.var(v, *s),
                            _ => {
                                let Some(e) = self.expr(other, scope, "a comparison") else {
                                    ok = false;
                                    continue;
                                };
                                let v = scope.fresh(*span);
                                out.push(Lit::Cmp { lhs: Expr::Var(v), op: CmpOp::Eq, rhs: e, span: *span });
                                v
                            }
                        };
                        match self.aggregate(agg_term, scope, rule_id, &names, result) {
                            Some(agg) => out.push(Lit::Agg { agg, span: *span }),
                            None => ok = false,
                        }
                        continue;
                    }
                    let (Some(lhs), Some(rhs)) =
                        (self.expr(a, scope, "a comparison"), self.expr(b, scope, "a comparison"))
                    else {
                        ok = false;
                        continue;
                    };
                    out.push(Lit::Cmp { lhs, op: *op, rhs, span: *span });
                }
            }
        }
        ok.then_some(out)
    }

    fn aggregate(
        &mut self,
        term: &Term,
        outer: &mut Scope,
        rule_id: usize,
        outer_names: &BTreeSet<String>,
        result: VarId,
    ) -> Option<Aggregate> {
        let Term::Agg(kind, target, body, span) = term else { unreachable!() };
        let mut scope = Scope::default();
        let mut lits = self.body(body, &mut scope, rule_id, true, outer_names)?;
        let target = match target {
            Some(t) => Some(self.expr(t, &mut scope, "an aggregate's target")?),
            None => None,
        };
        // Correlated variables first, then the local ones (wildcards included).
        let mut corr_names = vec![];
        let mut local = vec![];
        for (v, name) in scope.names.iter().enumerate() {
            if outer_names.contains(name) && !name.starts_with('_') {
                corr_names.push(v);
            } else {
                local.push(v);
            }
        }
        // A correlated variable that no atom of the body binds (`X < N` with `N` from outside) is
        // read by a residual: the aux relation holds the rest of the body, keyed by the
        // atom-bound correlated variables, and each lookup filters it with the literals that read
        // the outside values. The aux relation then reads only what the aggregate ranges over: no
        // cycle through the enclosing rule, no order among aggregates.
        let mut in_atoms = vec![false; scope.names.len()];
        for l in &lits {
            if let Lit::Atom { args, negated: false, .. } = l {
                args.iter().for_each(|a| {
                    if let Arg::Var(v) = a {
                        in_atoms[*v] = true
                    }
                });
            }
        }
        let free: Vec<VarId> = corr_names.iter().copied().filter(|&v| !in_atoms[v]).collect();
        let mut residual = None;
        if !free.is_empty() {
            let (kept, res_lits, computable) = split_residual(&lits, &in_atoms, &free);
            lits = kept;
            corr_names.retain(|&v| in_atoms[v]);
            local.retain(|&v| computable[v]);
            residual = Some((res_lits, computable));
        }
        let order: Vec<VarId> = corr_names.iter().chain(local.iter()).copied().collect();
        // The residual's environment: the aux columns, the outside values, then what it binds.
        let residual = match residual {
            None => None,
            Some((res_lits, computable)) => {
                let derived: Vec<VarId> =
                    (0..scope.names.len()).filter(|v| !computable[*v] && !free.contains(v)).collect();
                let env: Vec<VarId> = order.iter().chain(&free).chain(&derived).copied().collect();
                let mut bound = vec![false; scope.names.len()];
                order.iter().chain(&free).for_each(|&v| bound[v] = true);
                let ordered = self.residual_order(res_lits, &mut bound, &scope)?;
                let names = env.iter().map(|&v| scope.names[v].clone()).collect();
                let lits = ordered.iter().map(|l| remap_lit(l, &env)).collect();
                Some((Residual { outer: vec![], names, lits }, env))
            }
        };
        self.aux_count += 1;
        let aux_name = format!("__agg{}_{}", self.aux_count, kind.name());
        let aux_rel = self.relations.len();
        // Column types are filled in after the aux rule is typed.
        self.relations.push(Relation {
            name: aux_name.clone(),
            columns: order.iter().map(|&v| (scope.names[v].clone(), Type::Number)).collect(),
            input: false,
            output: false,
            aux: true,
            doc: None,
            span: *span,
        });
        self.by_name.insert(aux_name, aux_rel);
        let head_args: Vec<Expr> = order.iter().map(|&v| Expr::Var(v)).collect();
        // The target is evaluated over aux columns (or the residual's environment, which starts
        // with them): remap variable ids to positions.
        let env_order = residual.as_ref().map_or(&order, |(_, env)| env);
        let target_cols = target.as_ref().map(|e| remap_vars(e, env_order));
        let corr_list: Vec<String> = corr_names.iter().map(|&v| scope.names[v].clone()).collect();
        let free_names: Vec<String> = free.iter().map(|&v| scope.names[v].clone()).collect();
        // A target over the residual's variables is typed with the enclosing rule.
        let aux_target = target.as_ref().filter(|_| residual.is_none());
        let col_types =
            self.finish_rule(aux_rel, head_args, lits, scope, *span, None, Some(rule_id), aux_target, *kind)?;
        for (i, ty) in col_types.iter().enumerate() {
            self.relations[aux_rel].columns[i].1 = *ty;
        }
        let corr: Vec<VarId> = corr_list.iter().map(|n| outer.var(n, *span)).collect();
        let residual = residual.map(|(mut r, _)| {
            r.outer = free_names.iter().map(|n| outer.var(n, *span)).collect();
            r
        });
        Some(Aggregate { kind: *kind, aux: aux_rel, corr, target: target_cols, result, residual })
    }

    /// Orders a residual's literals so that each `=` binds before what reads it; reports a
    /// variable nothing binds.
    fn residual_order(&mut self, rest: Vec<Lit>, bound: &mut [bool], scope: &Scope) -> Option<Vec<Lit>> {
        let mut ordered = vec![];
        let rest = order_by_bindings(rest, bound, &mut ordered);
        if rest.is_empty() {
            return Some(ordered);
        }
        self.report_unsafe(unsafe_in(&rest, bound), scope);
        None
    }

    /// One error per unsafe variable, at its first occurrence, naming where it is needed.
    fn report_unsafe(&mut self, unsafe_vars: BTreeMap<VarId, &'static str>, scope: &Scope) {
        for (v, place) in unsafe_vars {
            self.err(
                scope.first[v],
                format!(
                    "unsafe rule: variable `{}` in {place} is not bound by a positive atom, an `=` binding or an aggregate",
                    scope.names[v]
                ),
            );
        }
    }

    fn rule(&mut self, r: &ast::Rule) {
        let Some(head) = self.resolve(&r.head) else {
            return;
        };
        let mut scope = Scope::default();
        let rule_id = self.rules.len();
        let mut head_args = vec![];
        for t in &r.head.args {
            match self.expr(t, &mut scope, "a rule's head") {
                Some(e) => head_args.push(e),
                None => return,
            }
        }
        let mut head_names = BTreeSet::new();
        r.head.args.iter().for_each(|t| term_var_names(t, &mut head_names));
        let Some(body) = self.body(&r.body, &mut scope, rule_id, false, &head_names) else {
            return;
        };
        // Problems are recorded as diagnostics; the returned head types serve aggregates only.
        let _ = self.finish_rule(head, head_args, body, scope, r.span, r.doc.clone(), None, None, AggKind::Count);
    }

    /// The types an atom's columns give its variables (and a mismatch with a constant or an
    /// earlier type).
    fn atom_types(&mut self, body: &[Lit], scope: &Scope, types: &mut [Option<Type>]) {
        for lit in body {
            if let Lit::Atom { rel, args, span, .. } = lit {
                for (i, a) in args.iter().enumerate() {
                    let (col, ty) = self.relations[*rel].columns[i].clone();
                    match a {
                        Arg::Var(v) => match types[*v] {
                            None => types[*v] = Some(ty),
                            Some(t) if t != ty => self.err(
                                *span,
                                format!(
                                    "type mismatch: variable `{}` is a {} but column `{col}` of `{}` is a {}",
                                    scope.names[*v],
                                    t.name(),
                                    self.relations[*rel].name,
                                    ty.name()
                                ),
                            ),
                            _ => {}
                        },
                        Arg::Const(c) if c.ty() != ty => self.err(
                            *span,
                            format!(
                                "type mismatch: column `{col}` of `{}` is a {}, found the {} {c}",
                                self.relations[*rel].name,
                                ty.name(),
                                c.ty().name()
                            ),
                        ),
                        _ => {}
                    }
                }
            }
        }
    }

    /// The types inside an aggregate's residual: its auxiliary relation's columns, the outside
    /// values it reads, its own bindings; a target that is not a number for a numeric aggregate.
    fn residual_types(&mut self, agg: &Aggregate, r: &Residual, types: &[Option<Type>], span: Span) {
        // The residual's environment: aux columns, outside values, its bindings.
        let mut rt: Vec<Option<Type>> = self.relations[agg.aux].columns.iter().map(|c| Some(c.1)).collect();
        rt.extend(r.outer.iter().map(|&v| types[v]));
        rt.resize(r.names.len(), None);
        for l in &r.lits {
            match l {
                Lit::Bind { var, expr, .. } => {
                    if rt[*var].is_none() {
                        rt[*var] = infer(expr, &rt);
                    }
                }
                Lit::Atom { rel, args, span, .. } => {
                    for (i, a) in args.iter().enumerate() {
                        let (col, ty) = self.relations[*rel].columns[i].clone();
                        if let Arg::Var(v) = a
                            && let Some(t) = rt[*v]
                            && t != ty
                        {
                            self.err(
                                *span,
                                format!(
                                    "type mismatch: variable `{}` is a {} but column `{col}` of `{}` is a {}",
                                    r.names[*v],
                                    t.name(),
                                    self.relations[*rel].name,
                                    ty.name()
                                ),
                            );
                        }
                    }
                }
                _ => self.lit_types(l, &rt),
            }
        }
        if let Some(t) = &agg.target
            && let Some(ty) = self.type_of(t, &rt, span)
            && ty != Type::Number
            && agg.kind != AggKind::Count
        {
            self.err(span, format!("type mismatch: `{}` aggregates numbers, found a symbol", agg.kind.name()));
        }
    }

    /// Types, orders and safety-checks a converted rule and adds it to the program. Returns the
    /// types of the head's columns (used to type an aggregate's auxiliary relation).
    #[allow(clippy::too_many_arguments)]
    fn finish_rule(
        &mut self,
        head: RelId,
        head_args: Vec<Expr>,
        body: Vec<Lit>,
        scope: Scope,
        span: Span,
        doc: Option<String>,
        aux_of: Option<usize>,
        agg_target: Option<&Expr>,
        agg_kind: AggKind,
    ) -> Option<Vec<Type>> {
        let mut types = scope.types.clone();
        let errors_before = self.diags.len();
        // Atoms give their columns' types.
        self.atom_types(&body, &scope, &mut types);
        // Bindings and aggregates give types to what they bind; repeat until nothing changes.
        for _ in 0..body.len() + 1 {
            let mut changed = false;
            for lit in &body {
                match lit {
                    Lit::Cmp { lhs, op: CmpOp::Eq, rhs, .. } => {
                        for (a, b) in [(lhs, rhs), (rhs, lhs)] {
                            if let Expr::Var(v) = a
                                && types[*v].is_none()
                                && let Some(t) = infer(b, &types)
                            {
                                types[*v] = Some(t);
                                changed = true;
                            }
                        }
                    }
                    Lit::Agg { agg, .. } if types[agg.result].is_none() => {
                        types[agg.result] = Some(Type::Number);
                        changed = true;
                    }
                    _ => {}
                }
            }
            if !changed {
                break;
            }
        }
        // Check every expression's types.
        for lit in &body {
            match lit {
                Lit::Cmp { .. } | Lit::Pred { .. } => self.lit_types(lit, &types),
                Lit::Agg { agg, span } => {
                    if let Some(t) = types[agg.result]
                        && t != Type::Number
                    {
                        self.err(*span, "type mismatch: an aggregate's value is a number");
                    }
                    if let Some(r) = &agg.residual {
                        self.residual_types(agg, r, &types, *span);
                    }
                }
                _ => {}
            }
        }
        if let Some(t) = agg_target
            && let Some(ty) = self.type_of(t, &types, span)
            && ty != Type::Number
            && agg_kind != AggKind::Count
        {
            self.err(span, format!("type mismatch: `{}` aggregates numbers, found a symbol", agg_kind.name()));
        }
        let mut head_types = vec![];
        for (i, e) in head_args.iter().enumerate() {
            let t = self.type_of(e, &types, span);
            if !self.relations[head].aux {
                let (col, ty) = self.relations[head].columns[i].clone();
                if let Some(t) = t
                    && t != ty
                {
                    self.err(
                        span,
                        format!(
                            "type mismatch: column `{col}` of `{}` is a {}, but the head gives it a {}",
                            self.relations[head].name,
                            ty.name(),
                            t.name()
                        ),
                    );
                }
            }
            head_types.push(t.unwrap_or(Type::Number));
        }
        // Safety and binding order.
        let mut bound = vec![false; scope.names.len()];
        let mut ordered = vec![];
        let mut rest = vec![];
        for lit in body {
            match &lit {
                Lit::Atom { args, negated: false, .. } => {
                    for a in args {
                        if let Arg::Var(v) = a {
                            bound[*v] = true;
                        }
                    }
                    ordered.push(lit);
                }
                _ => rest.push(lit),
            }
        }
        let rest = order_by_bindings(rest, &mut bound, &mut ordered);
        // Each unsafe variable once, at the first place that needs it.
        let mut unsafe_vars = unsafe_in(&rest, &bound);
        let mut hv = vec![];
        head_args.iter().for_each(|e| e.vars(&mut hv));
        for v in hv {
            if !bound[v] {
                unsafe_vars.entry(v).or_insert(if aux_of.is_some() {
                    "an aggregate (a correlated variable must be bound outside the aggregate)"
                } else {
                    "the head"
                });
            }
        }
        self.report_unsafe(unsafe_vars, &scope);
        if self.diags[errors_before..].iter().any(Diagnostic::is_error) {
            return None;
        }
        let vars = scope.names.iter().zip(&types).map(|(n, t)| (n.clone(), t.unwrap_or(Type::Number))).collect();
        let id = self.rules.len();
        self.rules.push(Rule { id, head, head_args, body: ordered, vars, span, doc, aux_of });
        Some(head_types)
    }

    /// Checks the types of a comparison's or a predicate's operands.
    fn lit_types(&mut self, lit: &Lit, types: &[Option<Type>]) {
        match lit {
            Lit::Cmp { lhs, op, rhs, span } => {
                let a = self.type_of(lhs, types, *span);
                let b = self.type_of(rhs, types, *span);
                if let (Some(a), Some(b)) = (a, b)
                    && a != b
                {
                    self.err(
                        *span,
                        format!("type mismatch: `{}` compares a {} with a {}", op.symbol(), a.name(), b.name()),
                    );
                }
            }
            Lit::Pred { pred, pattern, subject, span } => {
                for e in [pattern, subject] {
                    if let Some(t) = self.type_of(e, types, *span)
                        && t != Type::Symbol
                    {
                        let name = match pred {
                            ast::Pred::Match => "match",
                            ast::Pred::Contains => "contains",
                        };
                        self.err(*span, format!("type mismatch: `{name}` takes symbols, found a number"));
                    }
                }
            }
            _ => {}
        }
    }

    fn type_of(&mut self, e: &Expr, types: &[Option<Type>], span: Span) -> Option<Type> {
        match e {
            Expr::Var(v) => types[*v],
            Expr::Const(c) => Some(c.ty()),
            Expr::Arith(op, a, b) => {
                for x in [a, b] {
                    if let Some(t) = self.type_of(x, types, span)
                        && t != Type::Number
                    {
                        self.err(span, format!("type mismatch: `{}` takes numbers, found a symbol", op.symbol()));
                    }
                }
                Some(Type::Number)
            }
            Expr::Call(f, args) => {
                let (_, arg_ty, ret) = f.signature();
                for x in args {
                    if let Some(t) = self.type_of(x, types, span)
                        && t != arg_ty
                    {
                        self.err(
                            span,
                            format!("type mismatch: `{}` takes {}s, found a {}", f.name(), arg_ty.name(), t.name()),
                        );
                    }
                }
                Some(ret)
            }
        }
    }

    /// Splits relations into strata: Tarjan's SCCs of the dependency graph, in dependency order.
    /// A cycle through negation or an aggregate is reported with the relations on it.
    fn stratify(&mut self) -> (Vec<Vec<RelId>>, Vec<usize>) {
        let n = self.relations.len();
        // edges[head] = (body relation, negative?, span)
        let mut edges: Vec<Vec<(RelId, bool, Span)>> = vec![vec![]; n];
        for rule in &self.rules {
            for lit in &rule.body {
                for (rel, negative) in lit.reads() {
                    edges[rule.head].push((rel, negative, lit.span()));
                }
            }
        }
        let sccs = tarjan(n, &edges);
        let mut stratum_of = vec![0; n];
        for (i, scc) in sccs.iter().enumerate() {
            for &r in scc {
                stratum_of[r] = i;
            }
        }
        for (head, es) in edges.iter().enumerate() {
            for &(body, neg, span) in es {
                if neg && stratum_of[body] == stratum_of[head] {
                    let cycle = self.cycle_names(&sccs[stratum_of[head]], head, body, &edges);
                    let kind = if self.relations[body].aux { "an aggregate" } else { "negation" };
                    self.err(span, format!("unstratifiable program: a cycle through {kind}: {cycle}"));
                }
            }
        }
        (sccs, stratum_of)
    }

    /// A readable cycle `head <- ... <- head` through the edge `head <- body`.
    fn cycle_names(&self, scc: &[RelId], head: RelId, body: RelId, edges: &[Vec<(RelId, bool, Span)>]) -> String {
        // Path from body back to head inside the SCC (BFS over "depends on" edges).
        let mut prev: HashMap<RelId, RelId> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([body]);
        let mut seen = BTreeSet::from([body]);
        while let Some(x) = queue.pop_front() {
            if x == head {
                break;
            }
            for &(y, _, _) in &edges[x] {
                if scc.contains(&y) && seen.insert(y) {
                    prev.insert(y, x);
                    queue.push_back(y);
                }
            }
        }
        let mut path = vec![head];
        let mut cur = head;
        while cur != body {
            match prev.get(&cur) {
                Some(&p) => {
                    path.push(p);
                    cur = p;
                }
                None => break,
            }
        }
        let name = |r: RelId| {
            let rel = &self.relations[r];
            if rel.aux { format!("{}-aggregate", rel.name.trim_start_matches("__")) } else { rel.name.clone() }
        };
        let mut names: Vec<String> = vec![name(head)];
        names.extend(path.iter().rev().map(|&r| name(r)));
        if names.len() >= 2 && names[0] == names[1] {
            names.remove(0);
            names.push(name(head));
        }
        names.join(" depends on ")
    }

    fn warn_unused(&mut self) {
        let mut used = vec![false; self.relations.len()];
        let mut defined = vec![false; self.relations.len()];
        for rule in &self.rules {
            defined[rule.head] = true;
            for lit in &rule.body {
                match lit {
                    Lit::Atom { rel, .. } => used[*rel] = true,
                    Lit::Agg { agg, .. } => used[agg.aux] = true,
                    _ => {}
                }
            }
        }
        for (r, _, _) in &self.facts {
            defined[*r] = true;
        }
        for (r, rel) in self.relations.iter().enumerate() {
            if rel.aux || rel.output {
                continue;
            }
            if !used[r] && !defined[r] && !rel.input {
                self.diags
                    .push(Diagnostic::warning(rel.span, format!("relation `{}` is declared but never used", rel.name)));
            } else if !used[r] && defined[r] {
                self.diags.push(Diagnostic::warning(
                    rel.span,
                    format!("relation `{}` is derived but never read: mark it `.output` or use it in a rule", rel.name),
                ));
            }
        }
    }
}

fn where_of(lit: &Lit) -> &'static str {
    match lit {
        Lit::Atom { negated: true, .. } => "a negated atom",
        Lit::Cmp { .. } | Lit::Bind { .. } => "a constraint",
        Lit::Pred { .. } => "a predicate",
        Lit::Agg { .. } => "an aggregate",
        Lit::Atom { .. } => "an atom",
    }
}

pub(crate) fn lit_vars(lit: &Lit, out: &mut Vec<VarId>) {
    match lit {
        Lit::Atom { args, .. } => {
            for a in args {
                if let Arg::Var(v) = a {
                    out.push(*v);
                }
            }
        }
        Lit::Cmp { lhs, rhs, .. } => {
            lhs.vars(out);
            rhs.vars(out);
        }
        Lit::Pred { pattern, subject, .. } => {
            pattern.vars(out);
            subject.vars(out);
        }
        Lit::Bind { var, expr, .. } => {
            out.push(*var);
            expr.vars(out);
        }
        Lit::Agg { agg, .. } => out.push(agg.result),
    }
}

fn infer(e: &Expr, types: &[Option<Type>]) -> Option<Type> {
    match e {
        Expr::Var(v) => types[*v],
        Expr::Const(c) => Some(c.ty()),
        Expr::Arith(..) => Some(Type::Number),
        Expr::Call(f, _) => Some(f.signature().2),
    }
}

/// Moves the literals of `rest` into `ordered` in an order where each runs once its inputs
/// are bound (`bound`, updated): `=` with one unbound side becomes a binding, an aggregate
/// binds its value once its inputs are bound (or compares with it, when something bound it
/// first). Returns what no order can run: literals reading a variable nothing binds.
fn order_by_bindings(mut rest: Vec<Lit>, bound: &mut [bool], ordered: &mut Vec<Lit>) -> Vec<Lit> {
    let all_bound = |e: &Expr, bound: &[bool]| {
        let mut vs = vec![];
        e.vars(&mut vs);
        vs.iter().all(|&v| bound[v])
    };
    loop {
        let before = rest.len();
        let mut next = vec![];
        for lit in rest {
            match lit {
                Lit::Cmp { lhs: Expr::Var(v), op: CmpOp::Eq, rhs, span } if !bound[v] && all_bound(&rhs, bound) => {
                    bound[v] = true;
                    ordered.push(Lit::Bind { var: v, expr: rhs, span });
                }
                Lit::Cmp { lhs, op: CmpOp::Eq, rhs: Expr::Var(v), span } if !bound[v] && all_bound(&lhs, bound) => {
                    bound[v] = true;
                    ordered.push(Lit::Bind { var: v, expr: lhs, span });
                }
                Lit::Agg { agg, span } if agg.inputs().all(|v| bound[v]) => {
                    bound[agg.result] = true;
                    ordered.push(Lit::Agg { agg, span });
                }
                other => {
                    let mut vs = vec![];
                    lit_vars(&other, &mut vs);
                    if !matches!(other, Lit::Agg { .. }) && vs.iter().all(|&v| bound[v]) {
                        ordered.push(other);
                    } else {
                        next.push(other);
                    }
                }
            }
        }
        rest = next;
        if rest.is_empty() || rest.len() == before {
            return rest;
        }
    }
}

/// The unbound variables of literals that could not be ordered, each with the first place
/// that needs it.
fn unsafe_in(rest: &[Lit], bound: &[bool]) -> BTreeMap<VarId, &'static str> {
    let mut unsafe_vars = BTreeMap::new();
    for lit in rest {
        let mut vs = vec![];
        lit_vars(lit, &mut vs);
        if let Lit::Agg { agg, .. } = lit {
            vs.extend(agg.inputs());
        }
        for v in vs {
            if !bound[v] {
                unsafe_vars.entry(v).or_insert(where_of(lit));
            }
        }
    }
    unsafe_vars
}

/// Splits an aggregate's converted body for a residual: the literals that read a variable no
/// atom of the body binds, directly or through `=` (`free` are the correlated ones), and the
/// rest. Also returns which variables the rest can compute. Every variable of a positive atom
/// is in `in_atoms`, so positive atoms always stay with the rest.
fn split_residual(lits: &[Lit], in_atoms: &[bool], free: &[VarId]) -> (Vec<Lit>, Vec<Lit>, Vec<bool>) {
    let mut computable = in_atoms.to_vec();
    loop {
        let mut changed = false;
        for l in lits {
            if let Lit::Cmp { lhs, op: CmpOp::Eq, rhs, .. } = l {
                for (a, b) in [(lhs, rhs), (rhs, lhs)] {
                    let mut vs = vec![];
                    b.vars(&mut vs);
                    if let Expr::Var(v) = a
                        && !computable[*v]
                        && !free.contains(v)
                        && vs.iter().all(|&x| computable[x])
                    {
                        computable[*v] = true;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    let (mut kept, mut res) = (vec![], vec![]);
    for l in lits {
        let mut vs = vec![];
        lit_vars(l, &mut vs);
        if vs.iter().all(|&v| computable[v]) {
            kept.push(l.clone());
        } else {
            res.push(l.clone());
        }
    }
    (kept, res, computable)
}

/// A residual literal with variable ids replaced by positions in `order`.
fn remap_lit(l: &Lit, order: &[VarId]) -> Lit {
    let pos = |v: &VarId| order.iter().position(|x| x == v).unwrap_or(0);
    match l {
        Lit::Cmp { lhs, op, rhs, span } => {
            Lit::Cmp { lhs: remap_vars(lhs, order), op: *op, rhs: remap_vars(rhs, order), span: *span }
        }
        Lit::Bind { var, expr, span } => Lit::Bind { var: pos(var), expr: remap_vars(expr, order), span: *span },
        Lit::Pred { pred, pattern, subject, span } => Lit::Pred {
            pred: *pred,
            pattern: remap_vars(pattern, order),
            subject: remap_vars(subject, order),
            span: *span,
        },
        Lit::Atom { rel, args, negated, span } => Lit::Atom {
            rel: *rel,
            args: args.iter().map(|a| if let Arg::Var(v) = a { Arg::Var(pos(v)) } else { a.clone() }).collect(),
            negated: *negated,
            span: *span,
        },
        Lit::Agg { .. } => unreachable!("an aggregate's body holds no aggregate"),
    }
}

fn remap_vars(e: &Expr, order: &[VarId]) -> Expr {
    match e {
        Expr::Var(v) => Expr::Var(order.iter().position(|x| x == v).unwrap_or(0)),
        Expr::Const(c) => Expr::Const(c.clone()),
        Expr::Arith(op, a, b) => Expr::Arith(*op, Box::new(remap_vars(a, order)), Box::new(remap_vars(b, order))),
        Expr::Call(f, args) => Expr::Call(*f, args.iter().map(|a| remap_vars(a, order)).collect()),
    }
}

/// Tarjan's strongly connected components; returns them in dependency order (a component
/// comes after every component it depends on). Deterministic for a given graph.
fn tarjan(n: usize, edges: &[Vec<(RelId, bool, Span)>]) -> Vec<Vec<RelId>> {
    struct T<'a> {
        edges: &'a [Vec<(RelId, bool, Span)>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<RelId>>,
    }
    impl T<'_> {
        fn visit(&mut self, v: usize) {
            // Iterative to survive deep dependency chains.
            let mut work: Vec<(usize, usize)> = vec![(v, 0)];
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on[v] = true;
            while let Some(&mut (x, ref mut i)) = work.last_mut() {
                if *i < self.edges[x].len() {
                    let y = self.edges[x][*i].0;
                    *i += 1;
                    match self.index[y] {
                        None => {
                            self.index[y] = Some(self.next);
                            self.low[y] = self.next;
                            self.next += 1;
                            self.stack.push(y);
                            self.on[y] = true;
                            work.push((y, 0));
                        }
                        Some(iy) if self.on[y] => self.low[x] = self.low[x].min(iy),
                        _ => {}
                    }
                } else {
                    work.pop();
                    if let Some(&(p, _)) = work.last() {
                        self.low[p] = self.low[p].min(self.low[x]);
                    }
                    if Some(self.low[x]) == self.index[x] {
                        let mut scc = vec![];
                        loop {
                            let w = self.stack.pop().unwrap();
                            self.on[w] = false;
                            scc.push(w);
                            if w == x {
                                break;
                            }
                        }
                        scc.sort_unstable();
                        self.out.push(scc);
                    }
                }
            }
        }
    }
    let mut t =
        T { edges, index: vec![None; n], low: vec![0; n], on: vec![false; n], stack: vec![], next: 0, out: vec![] };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.out
}
