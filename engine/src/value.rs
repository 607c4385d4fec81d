//! Values at evaluation time: interning, arithmetic and the built-in functors.
//!
//! Every value (symbol or number) is interned to a `u32` so that rows are fixed-width arrays of
//! `u32`. Numbers are interned like symbols (a tagged table, not their bits), so the interner
//! is the one place that knows a value's type. Errors here (a version that does not parse,
//! division by zero, overflow) name the value; the evaluator adds the rule.

use crate::ast::{ArithOp, Functor};
use crate::program::Const;
use std::collections::HashMap;

/// A fast, non-cryptographic hasher (the Fx hash of rustc) for tables keyed by interned
/// ids and values; the inputs are our own, so flooding resistance is not needed.
#[derive(Clone, Copy, Default)]
pub struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut tail = 0u64;
            for (i, &b) in rest.iter().enumerate() {
                tail |= u64::from(b) << (8 * i);
            }
            self.add(tail);
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // Multiplication only carries entropy upward; hash tables take the low bits for the
        // bucket, so bring the well-mixed high bits down (as rustc-hash 2 does).
        self.0.rotate_left(26)
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub type FxBuild = std::hash::BuildHasherDefault<FxHasher>;
/// A hash map with the fast, non-cryptographic FxHash (keys are the engine's own ids).
pub type FxHashMap<K, V> = HashMap<K, V, FxBuild>;

/// Interned value table. Ids are dense from 0. Symbols are found by hash in a table of ids
/// (each symbol's text is stored once, in `values`); numbers have their own map.
#[derive(Clone, Debug, Default)]
pub struct Interner {
    values: Vec<Const>,
    syms: hashbrown::HashTable<u32>,
    nums: FxHashMap<i64, u32>,
}

fn hash_str(s: &str) -> u64 {
    use std::hash::Hasher;
    let mut h = FxHasher::default();
    h.write(s.as_bytes());
    h.finish()
}

fn sym_at(values: &[Const], id: u32) -> &str {
    match &values[id as usize] {
        Const::Sym(s) => s,
        Const::Num(_) => "",
    }
}

impl Interner {
    pub fn intern(&mut self, c: Const) -> u32 {
        match c {
            Const::Sym(s) => self.intern_sym_owned(s),
            Const::Num(n) => self.intern_num(n),
        }
    }

    /// Interns by reference: clones the value only when it is new.
    pub fn intern_ref(&mut self, c: &Const) -> u32 {
        match c {
            Const::Sym(s) => self.intern_sym(s),
            Const::Num(n) => self.intern_num(*n),
        }
    }

    pub fn intern_num(&mut self, n: i64) -> u32 {
        if let Some(&id) = self.nums.get(&n) {
            return id;
        }
        let id = self.values.len() as u32;
        self.values.push(Const::Num(n));
        self.nums.insert(n, id);
        id
    }

    pub fn intern_sym(&mut self, s: &str) -> u32 {
        self.intern_sym_with(s, str::to_string)
    }

    /// Interns a symbol the caller owns: moved into the table when new, never copied.
    pub fn intern_sym_owned(&mut self, s: String) -> u32 {
        self.intern_sym_with(s, |s| s)
    }

    fn intern_sym_with<S: AsRef<str>>(&mut self, s: S, own: impl FnOnce(S) -> String) -> u32 {
        let hash = hash_str(s.as_ref());
        let Interner { values, syms, .. } = self;
        if let Some(&id) = syms.find(hash, |&id| sym_at(values, id) == s.as_ref()) {
            return id;
        }
        let id = values.len() as u32;
        values.push(Const::Sym(own(s)));
        syms.insert_unique(hash, id, |&id| hash_str(sym_at(values, id)));
        id
    }

    /// Room for `n` more symbols without rehashing.
    pub fn reserve_syms(&mut self, n: usize) {
        let Interner { values, syms, .. } = self;
        values.reserve(n);
        syms.reserve(n, |&id| hash_str(sym_at(values, id)));
    }

    /// The id of a value if it was ever interned (a lookup that cannot grow the table).
    pub fn get(&self, c: &Const) -> Option<u32> {
        match c {
            Const::Sym(s) => self.syms.find(hash_str(s), |&id| sym_at(&self.values, id) == s).copied(),
            Const::Num(n) => self.nums.get(n).copied(),
        }
    }

    pub fn value(&self, id: u32) -> &Const {
        &self.values[id as usize]
    }

    pub fn num(&self, id: u32) -> i64 {
        match &self.values[id as usize] {
            Const::Num(n) => *n,
            Const::Sym(_) => 0,
        }
    }

    pub fn sym(&self, id: u32) -> &str {
        match &self.values[id as usize] {
            Const::Sym(s) => s,
            Const::Num(_) => "",
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// A semantic version's numbers; a pre-release suffix is kept only for ordering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub major: i64,
    pub minor: i64,
    pub patch: i64,
    pub pre: Option<String>,
}

/// Parses `v1.36.4`, `1.36.4`, `v1.14` (patch 0) and `v1.14.0-rc.1`.
pub fn parse_version(s: &str) -> Option<Version> {
    let t = s.strip_prefix('v').unwrap_or(s);
    let (core, pre) = match t.split_once(['-', '+']) {
        Some((c, p)) => (c, Some(p.to_string())),
        None => (t, None),
    };
    let mut parts = core.split('.');
    let num = |p: Option<&str>| -> Option<i64> {
        let p = p?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.len() > 18 {
            return None;
        }
        p.parse().ok()
    };
    let major = num(parts.next())?;
    let minor = num(parts.next())?;
    let patch = match parts.next() {
        Some(p) => num(Some(p))?,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(Version { major, minor, patch, pre })
}

/// Semantic-version order: numbers first, then a release sorts after its pre-releases.
pub fn version_cmp(a: &Version, b: &Version) -> std::cmp::Ordering {
    (a.major, a.minor, a.patch).cmp(&(b.major, b.minor, b.patch)).then_with(|| match (&a.pre, &b.pre) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(x), Some(y)) => x.cmp(y),
    })
}

/// Why an expression could not be computed; the evaluator adds the rule's name and place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueError {
    BadVersion(String),
    DivByZero {
        lhs: i64,
        op: ArithOp,
    },
    Overflow {
        lhs: i64,
        op: ArithOp,
        rhs: i64,
    },
    /// A `sum` (or `count`) past the integer range.
    SumOverflow {
        lhs: i64,
        rhs: i64,
    },
    BadNumber(String),
    BadRegex(String, String),
}

impl std::fmt::Display for ValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ValueError::BadVersion(v) => {
                write!(f, "version {v:?} does not parse (expected vX.Y.Z)")
            }
            ValueError::DivByZero { lhs, op } => {
                write!(f, "division by zero in {lhs} {} 0", op.symbol())
            }
            ValueError::Overflow { lhs, op, rhs } => {
                write!(f, "integer overflow in {lhs} {} {rhs}", op.symbol())
            }
            ValueError::SumOverflow { lhs, rhs } => write!(f, "integer overflow in sum over {lhs} + {rhs}"),
            ValueError::BadNumber(s) => write!(f, "to_number: {s:?} is not an integer"),
            ValueError::BadRegex(p, e) => write!(f, "regex {p:?} does not compile: {e}"),
        }
    }
}

pub fn arith(op: ArithOp, a: i64, b: i64) -> Result<i64, ValueError> {
    let r = match op {
        ArithOp::Add => a.checked_add(b),
        ArithOp::Sub => a.checked_sub(b),
        ArithOp::Mul => a.checked_mul(b),
        ArithOp::Div | ArithOp::Rem if b == 0 => return Err(ValueError::DivByZero { lhs: a, op }),
        ArithOp::Div => a.checked_div(b),
        ArithOp::Rem => a.checked_rem(b),
    };
    r.ok_or(ValueError::Overflow { lhs: a, op, rhs: b })
}

/// Applies a functor to constant arguments (types were checked at load).
pub fn call(f: Functor, args: &[Const]) -> Result<Const, ValueError> {
    let sym = |i: usize| match &args[i] {
        Const::Sym(s) => s.as_str(),
        Const::Num(_) => "",
    };
    let version = |i: usize| parse_version(sym(i)).ok_or_else(|| ValueError::BadVersion(sym(i).to_string()));
    Ok(match f {
        Functor::Cat => {
            let mut s = String::new();
            for a in args {
                match a {
                    Const::Sym(x) => s.push_str(x),
                    Const::Num(n) => s.push_str(&n.to_string()),
                }
            }
            Const::Sym(s)
        }
        Functor::Strlen => Const::Num(sym(0).chars().count() as i64),
        Functor::ToNumber => Const::Num(sym(0).trim().parse().map_err(|_| ValueError::BadNumber(sym(0).to_string()))?),
        Functor::ToString => match &args[0] {
            Const::Num(n) => Const::Sym(n.to_string()),
            Const::Sym(s) => Const::Sym(s.clone()),
        },
        Functor::Major => Const::Num(version(0)?.major),
        Functor::Minor => Const::Num(version(0)?.minor),
        Functor::Patch => Const::Num(version(0)?.patch),
        Functor::VersionCmp => Const::Num(match version_cmp(&version(0)?, &version(1)?) {
            std::cmp::Ordering::Less => -1,
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Greater => 1,
        }),
    })
}
