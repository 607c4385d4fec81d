//! Recursive-descent parser from tokens to `ast::Module`.
//!
//! Start at `parse`. On a syntax error the parser records "expected X, found Y" and skips to
//! the end of the clause (the next `.` or directive), so one run reports every broken clause
//! of a file. The words `count`, `sum`, `min` and `max` are reserved for aggregates, and
//! `match` and `contains` for the two built-in predicates.

use crate::ast::*;
use crate::diag::{Diagnostic, Span};
use crate::lexer::{Tok, Token, lex};

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    diags: Vec<Diagnostic>,
    /// How deep the term being parsed is nested (parentheses, calls, unary minus, aggregates).
    nesting: usize,
    /// The depth of the last term parsed, as a tree.
    depth: usize,
}

/// 256: no rule a person writes comes near it, and every later pass (checking, planning,
/// evaluating, dropping) walks terms recursively; deeper input is a located error, never a
/// stack overflow.
pub const MAX_TERM_DEPTH: usize = 256;

/// 1,000 literals in one body: the checker and planner order a body in quadratic time, and no
/// rule a person writes comes near it (50,000 took 14 s to load).
pub const MAX_BODY_LITERALS: usize = 1_000;

type PResult<T> = Result<T, ()>;

const AGGREGATES: [&str; 4] = ["count", "sum", "min", "max"];

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn peek_at(&self, n: usize) -> &Tok {
        let i = (self.pos + n).min(self.toks.len() - 1);
        &self.toks[i].tok
    }

    fn span(&self) -> Span {
        self.toks[self.pos].span
    }

    fn bump(&mut self) -> Token {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn error<T>(&mut self, expected: &str) -> PResult<T> {
        let found = self.peek().describe();
        let span = self.span();
        self.diags.push(Diagnostic::error(span, format!("expected {expected}, found {found}")));
        Err(())
    }

    /// Enters one level of nesting, or fails past `MAX_TERM_DEPTH`.
    fn nest(&mut self) -> PResult<()> {
        self.nesting += 1;
        self.check_depth(self.nesting)
    }

    fn check_depth(&mut self, depth: usize) -> PResult<()> {
        if depth <= MAX_TERM_DEPTH {
            return Ok(());
        }
        let span = self.span();
        self.diags.push(Diagnostic::error(
            span,
            format!("the term is nested deeper than {MAX_TERM_DEPTH} levels: bind parts of it to variables with `=`"),
        ));
        // Skip the rest of the clause at once: nothing in it can be read.
        self.nesting = 0;
        Err(())
    }

    fn expect(&mut self, tok: Tok, expected: &str) -> PResult<Span> {
        if *self.peek() == tok { Ok(self.bump().span) } else { self.error(expected) }
    }

    /// Skips to the start of the next clause: just after the next `.`, or to the next directive,
    /// or to a token in column 1 of a later line (a clause left unfinished).
    fn recover(&mut self) {
        self.nesting = 0;
        let line = self.span().line;
        loop {
            let span = self.span();
            if span.col == 1 && span.line > line {
                return;
            }
            match self.peek() {
                Tok::Eof | Tok::Directive(_) => return,
                Tok::Dot => {
                    self.bump();
                    return;
                }
                _ => {
                    self.bump();
                }
            }
        }
    }

    fn module(&mut self) -> Module {
        let mut items = vec![];
        let mut doc: Vec<String> = vec![];
        loop {
            match self.peek().clone() {
                Tok::Eof => break,
                Tok::Doc(text) => {
                    self.bump();
                    doc.push(text);
                    continue;
                }
                _ => {}
            }
            let d = if doc.is_empty() { None } else { Some(doc.join("\n")) };
            doc.clear();
            match self.item(d) {
                Ok(item) => items.push(item),
                Err(()) => self.recover(),
            }
        }
        Module { items }
    }

    fn item(&mut self, doc: Option<String>) -> PResult<Item> {
        match self.peek().clone() {
            Tok::Directive(d) => {
                let span = self.bump().span;
                match d.as_str() {
                    "decl" => self.decl(doc),
                    "input" | "output" => {
                        let mut names = vec![self.relation_name()?];
                        while *self.peek() == Tok::Comma {
                            self.bump();
                            names.push(self.relation_name()?);
                        }
                        Ok(if d == "input" { Item::Input(names) } else { Item::Output(names) })
                    }
                    "include" => match self.peek().clone() {
                        Tok::Str(path) => {
                            let s = self.bump().span;
                            Ok(Item::Include(path, s))
                        }
                        _ => self.error("a quoted file name after `.include`"),
                    },
                    other => {
                        self.diags.push(Diagnostic::error(
                            span,
                            format!("unknown directive `.{other}`: expected one of .decl .input .output .include"),
                        ));
                        Err(())
                    }
                }
            }
            Tok::Ident(_) => {
                let head = self.atom()?;
                match self.peek() {
                    Tok::Dot => {
                        self.bump();
                        Ok(Item::Fact(head))
                    }
                    Tok::ColonDash => {
                        self.bump();
                        let span = head.span;
                        let body = self.body(&Tok::Dot)?;
                        if *self.peek() == Tok::Dot {
                            self.bump();
                        } else {
                            return self.error("`,` or the `.` that ends the rule");
                        }
                        Ok(Item::Rule(Rule { head, body, span, doc }))
                    }
                    _ => self.error("`:-` or the `.` that ends a fact"),
                }
            }
            _ => self.error("a directive, a fact or a rule"),
        }
    }

    fn relation_name(&mut self) -> PResult<(String, Span)> {
        match self.peek().clone() {
            Tok::Ident(n) => {
                let s = self.bump().span;
                Ok((n, s))
            }
            _ => self.error("a relation name"),
        }
    }

    fn decl(&mut self, doc: Option<String>) -> PResult<Item> {
        let (name, name_span) = self.relation_name()?;
        self.expect(Tok::LParen, "`(` after the relation name")?;
        let mut columns = vec![];
        if *self.peek() != Tok::RParen {
            loop {
                let col = match self.peek().clone() {
                    Tok::Ident(n) | Tok::Var(n) => {
                        self.bump();
                        n
                    }
                    _ => return self.error("a column name"),
                };
                self.expect(Tok::Colon, "`:` after the column name")?;
                let ty = match self.peek().clone() {
                    Tok::Ident(t) if t == "symbol" => Type::Symbol,
                    Tok::Ident(t) if t == "number" => Type::Number,
                    _ => return self.error("a type (`symbol` or `number`)"),
                };
                self.bump();
                columns.push((col, ty));
                if *self.peek() == Tok::Comma {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        self.expect(Tok::RParen, "`,` or `)` in the column list")?;
        Ok(Item::Decl(Decl { name, span: name_span, columns, doc }))
    }

    fn atom(&mut self) -> PResult<Atom> {
        let (rel, span) = self.relation_name()?;
        if AGGREGATES.contains(&rel.as_str()) || rel == "match" || rel == "contains" {
            self.diags.push(Diagnostic::error(span, format!("`{rel}` is a reserved word and cannot name a relation")));
            return Err(());
        }
        self.expect(Tok::LParen, "`(` after the relation name")?;
        let args = self.args()?;
        Ok(Atom { rel, args, span })
    }

    /// A functor's arguments, one level deeper; the call's depth is one more than theirs.
    fn call_args(&mut self) -> PResult<Vec<Term>> {
        self.nest()?;
        let mut depth = 0;
        let mut args = vec![];
        if *self.peek() != Tok::RParen {
            loop {
                args.push(self.term()?);
                depth = depth.max(self.depth);
                if *self.peek() == Tok::Comma {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        self.expect(Tok::RParen, "`,` or `)`")?;
        self.nesting -= 1;
        self.depth = depth + 1;
        Ok(args)
    }

    fn args(&mut self) -> PResult<Vec<Term>> {
        let mut args = vec![];
        if *self.peek() != Tok::RParen {
            loop {
                args.push(self.term()?);
                if *self.peek() == Tok::Comma {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        self.expect(Tok::RParen, "`,` or `)`")?;
        Ok(args)
    }

    fn body(&mut self, end: &Tok) -> PResult<Vec<Literal>> {
        let mut lits = vec![self.literal()?];
        while *self.peek() == Tok::Comma {
            self.bump();
            if lits.len() == MAX_BODY_LITERALS {
                let span = self.span();
                self.diags.push(Diagnostic::error(
                    span,
                    format!(
                        "the body has more than {MAX_BODY_LITERALS} literals: split the rule into rules of its parts"
                    ),
                ));
                return Err(());
            }
            lits.push(self.literal()?);
        }
        if self.peek() != end && *self.peek() != Tok::Dot {
            let what = if *end == Tok::RBrace { "`,` or `}`" } else { "`,` or the `.` that ends the rule" };
            return self.error(what);
        }
        Ok(lits)
    }

    fn literal(&mut self) -> PResult<Literal> {
        match self.peek().clone() {
            Tok::Bang => {
                self.bump();
                Ok(Literal::Neg(self.atom()?))
            }
            Tok::Ident(name) if (name == "match" || name == "contains") && *self.peek_at(1) == Tok::LParen => {
                let span = self.bump().span;
                self.bump();
                let args = self.args()?;
                let pred = if name == "match" { Pred::Match } else { Pred::Contains };
                if args.len() != 2 {
                    self.diags
                        .push(Diagnostic::error(span, format!("`{name}` takes 2 arguments, found {}", args.len())));
                    return Err(());
                }
                let mut it = args.into_iter();
                let (a, b) = (it.next().unwrap(), it.next().unwrap());
                Ok(Literal::Pred(pred, a, b, span))
            }
            Tok::Ident(name) if Functor::from_name(&name, false).is_none() && !AGGREGATES.contains(&name.as_str()) => {
                Ok(Literal::Pos(self.atom()?))
            }
            _ => {
                let lhs = self.term()?;
                let span = lhs.span();
                let op = match self.peek() {
                    Tok::Eq => CmpOp::Eq,
                    Tok::Ne => CmpOp::Ne,
                    Tok::Lt => CmpOp::Lt,
                    Tok::Le => CmpOp::Le,
                    Tok::Gt => CmpOp::Gt,
                    Tok::Ge => CmpOp::Ge,
                    _ => return self.error("a comparison (`=`, `!=`, `<`, `<=`, `>`, `>=`)"),
                };
                self.bump();
                let rhs = self.term()?;
                Ok(Literal::Cmp(lhs, op, rhs, span))
            }
        }
    }

    fn term(&mut self) -> PResult<Term> {
        let mut lhs = self.product()?;
        let mut depth = self.depth;
        loop {
            let op = match self.peek() {
                Tok::Plus => ArithOp::Add,
                Tok::Minus => ArithOp::Sub,
                _ => {
                    self.depth = depth;
                    return Ok(lhs);
                }
            };
            let span = self.bump().span;
            let rhs = self.product()?;
            depth = 1 + depth.max(self.depth);
            self.check_depth(depth + self.nesting)?;
            lhs = Term::Arith(op, Box::new(lhs), Box::new(rhs), span);
        }
    }

    fn product(&mut self) -> PResult<Term> {
        let mut lhs = self.unary()?;
        let mut depth = self.depth;
        loop {
            let op = match self.peek() {
                Tok::Star => ArithOp::Mul,
                Tok::Slash => ArithOp::Div,
                Tok::Percent => ArithOp::Rem,
                _ => {
                    self.depth = depth;
                    return Ok(lhs);
                }
            };
            let span = self.bump().span;
            let rhs = self.unary()?;
            depth = 1 + depth.max(self.depth);
            self.check_depth(depth + self.nesting)?;
            lhs = Term::Arith(op, Box::new(lhs), Box::new(rhs), span);
        }
    }

    fn unary(&mut self) -> PResult<Term> {
        if *self.peek() == Tok::Minus {
            let span = self.bump().span;
            if let Tok::Num(n) = *self.peek() {
                self.bump();
                self.depth = 1;
                return Ok(Term::Num(-n, span));
            }
            self.nest()?;
            let inner = self.unary()?;
            self.nesting -= 1;
            self.depth += 1;
            return Ok(Term::Arith(ArithOp::Sub, Box::new(Term::Num(0, span)), Box::new(inner), span));
        }
        self.primary()
    }

    fn primary(&mut self) -> PResult<Term> {
        let span = self.span();
        self.depth = 1;
        match self.peek().clone() {
            Tok::Var(v) => {
                self.bump();
                Ok(Term::Var(v, span))
            }
            Tok::Wild => {
                self.bump();
                Ok(Term::Wild(span))
            }
            Tok::Str(s) => {
                self.bump();
                Ok(Term::Str(s, span))
            }
            Tok::Num(n) => {
                self.bump();
                Ok(Term::Num(n, span))
            }
            Tok::LParen => {
                self.bump();
                self.nest()?;
                let t = self.term()?;
                self.nesting -= 1;
                self.expect(Tok::RParen, "`)`")?;
                Ok(t)
            }
            Tok::At(name) => {
                self.bump();
                let Some(f) = Functor::from_name(&name, true) else {
                    self.diags.push(Diagnostic::error(
                        span,
                        format!("unknown functor `@{name}`: expected one of @major @minor @patch @version_cmp"),
                    ));
                    return Err(());
                };
                self.expect(Tok::LParen, "`(` after the functor name")?;
                let args = self.call_args()?;
                Ok(Term::Call(f, args, span))
            }
            Tok::Ident(name) if AGGREGATES.contains(&name.as_str()) => {
                self.bump();
                let kind = match name.as_str() {
                    "count" => AggKind::Count,
                    "sum" => AggKind::Sum,
                    "min" => AggKind::Min,
                    _ => AggKind::Max,
                };
                self.nest()?;
                let target = if kind == AggKind::Count { None } else { Some(Box::new(self.term()?)) };
                let depth = 1 + if target.is_some() { self.depth } else { 0 };
                self.expect(Tok::Colon, "`:` before the aggregate's body")?;
                self.expect(Tok::LBrace, "`{` to open the aggregate's body")?;
                let body = self.body(&Tok::RBrace)?;
                self.expect(Tok::RBrace, "`}` to close the aggregate's body")?;
                self.nesting -= 1;
                self.depth = depth;
                Ok(Term::Agg(kind, target, body, span))
            }
            Tok::Ident(name) => match Functor::from_name(&name, false) {
                Some(f) => {
                    self.bump();
                    self.expect(Tok::LParen, "`(` after the functor name")?;
                    let args = self.call_args()?;
                    Ok(Term::Call(f, args, span))
                }
                None => self.error("a term (variable, constant, functor or aggregate)"),
            },
            _ => self.error("a term (variable, constant, functor or aggregate)"),
        }
    }
}

/// Parses one file. Returns the items that parsed and every diagnostic (lexical and syntactic).
pub fn parse(text: &str, file: u32) -> (Module, Vec<Diagnostic>) {
    let (toks, mut diags) = lex(text, file);
    let mut p = Parser { toks, pos: 0, diags: vec![], nesting: 0, depth: 0 };
    let module = p.module();
    diags.append(&mut p.diags);
    (module, diags)
}
