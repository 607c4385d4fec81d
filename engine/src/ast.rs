//! The syntax tree of a rules file, as the parser produces it.
//!
//! Every node carries the `Span` of its first token so that the checker and the explainer can
//! point back at the source. Nothing here is checked yet: see `check.rs` for what turns a set
//! of modules into a `Program`.

use crate::diag::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
/// The type of a column: every value the engine holds is one of these.
pub enum Type {
    /// Text, interned (`"controlplane"`).
    Symbol,
    /// A 64-bit signed integer (`42`, seconds since 1970).
    Number,
}

impl Type {
    /// The type's name as the dialect writes it (`symbol`, `number`).
    pub fn name(self) -> &'static str {
        match self {
            Type::Symbol => "symbol",
            Type::Number => "number",
        }
    }
}

/// `.decl name(col: type, ...)`, with its doc comment.
#[derive(Clone, Debug)]
pub struct Decl {
    pub name: String,
    pub span: Span,
    pub columns: Vec<(String, Type)>,
    pub doc: Option<String>,
}

#[derive(Clone, Debug)]
pub enum Item {
    Decl(Decl),
    /// `.input a, b` (several names allowed).
    Input(Vec<(String, Span)>),
    Output(Vec<(String, Span)>),
    Include(String, Span),
    Fact(Atom),
    Rule(Rule),
}

#[derive(Clone, Debug)]
pub struct Rule {
    pub head: Atom,
    pub body: Vec<Literal>,
    pub span: Span,
    pub doc: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Atom {
    pub rel: String,
    pub args: Vec<Term>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    /// Whether `a op b` holds, in `T`'s order.
    pub fn holds<T: PartialOrd>(self, a: &T, b: &T) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pred {
    /// `match(regex, s)`: the whole of `s` matches.
    Match,
    /// `contains(sub, s)`.
    Contains,
}

#[derive(Clone, Debug)]
pub enum Literal {
    Pos(Atom),
    Neg(Atom),
    Cmp(Term, CmpOp, Term, Span),
    Pred(Pred, Term, Term, Span),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl ArithOp {
    pub fn symbol(self) -> &'static str {
        match self {
            ArithOp::Add => "+",
            ArithOp::Sub => "-",
            ArithOp::Mul => "*",
            ArithOp::Div => "/",
            ArithOp::Rem => "%",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Functor {
    Cat,
    Strlen,
    ToNumber,
    ToString,
    Major,
    Minor,
    Patch,
    VersionCmp,
}

impl Functor {
    pub fn from_name(name: &str, at: bool) -> Option<Functor> {
        Some(match (at, name) {
            (false, "cat") => Functor::Cat,
            (false, "strlen") => Functor::Strlen,
            (false, "to_number") => Functor::ToNumber,
            (false, "to_string") => Functor::ToString,
            (true, "major") => Functor::Major,
            (true, "minor") => Functor::Minor,
            (true, "patch") => Functor::Patch,
            (true, "version_cmp") => Functor::VersionCmp,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Functor::Cat => "cat",
            Functor::Strlen => "strlen",
            Functor::ToNumber => "to_number",
            Functor::ToString => "to_string",
            Functor::Major => "@major",
            Functor::Minor => "@minor",
            Functor::Patch => "@patch",
            Functor::VersionCmp => "@version_cmp",
        }
    }

    /// Argument types and result type; `None` arity means variadic (cat).
    pub fn signature(self) -> (Option<usize>, Type, Type) {
        match self {
            Functor::Cat => (None, Type::Symbol, Type::Symbol),
            Functor::Strlen => (Some(1), Type::Symbol, Type::Number),
            Functor::ToNumber => (Some(1), Type::Symbol, Type::Number),
            Functor::ToString => (Some(1), Type::Number, Type::Symbol),
            Functor::Major | Functor::Minor | Functor::Patch => (Some(1), Type::Symbol, Type::Number),
            Functor::VersionCmp => (Some(2), Type::Symbol, Type::Number),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AggKind {
    Count,
    Sum,
    Min,
    Max,
}

impl AggKind {
    pub fn name(self) -> &'static str {
        match self {
            AggKind::Count => "count",
            AggKind::Sum => "sum",
            AggKind::Min => "min",
            AggKind::Max => "max",
        }
    }
}

#[derive(Clone, Debug)]
pub enum Term {
    Var(String, Span),
    Wild(Span),
    Str(String, Span),
    Num(i64, Span),
    Arith(ArithOp, Box<Term>, Box<Term>, Span),
    Call(Functor, Vec<Term>, Span),
    /// `count : { body }`, `sum X : { body }`, ...
    Agg(AggKind, Option<Box<Term>>, Vec<Literal>, Span),
}

impl Term {
    pub fn span(&self) -> Span {
        match self {
            Term::Var(_, s)
            | Term::Wild(s)
            | Term::Str(_, s)
            | Term::Num(_, s)
            | Term::Arith(_, _, _, s)
            | Term::Call(_, _, s)
            | Term::Agg(_, _, _, s) => *s,
        }
    }
}

/// One parsed file.
#[derive(Clone, Debug, Default)]
pub struct Module {
    pub items: Vec<Item>,
}
