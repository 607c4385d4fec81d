//! The result of an evaluation: every relation's tuples, sorted, with their provenance.
//!
//! Rows are stored flat (`arity` interned values per row) in the order of their interned ids,
//! which makes membership a binary search. `decoded` gives the user-facing order: per column,
//! numbers numerically and symbols by bytes. When provenance was on, each row carries the rule
//! that first derived it and the round (height) it appeared in; `explain` uses both.

use crate::program::{Const, Program, RelId};
use crate::value::Interner;

/// Marks an input fact (or a fact written in a rules file) in `RelData::rule`.
pub const INPUT: u32 = u32::MAX;

#[derive(Clone, Debug, Default)]
pub struct RelData {
    pub arity: usize,
    /// Number of rows (kept apart from `rows` so that nullary relations work).
    pub count: usize,
    /// `arity` values per row, rows sorted.
    pub rows: Vec<u32>,
    /// Per row: the rule that derived it (`INPUT` for a fact); empty without provenance.
    pub rule: Vec<u32>,
    /// Per row: the evaluation round it first appeared in (0 for facts).
    pub height: Vec<u32>,
}

impl RelData {
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn row(&self, i: usize) -> &[u32] {
        &self.rows[i * self.arity..(i + 1) * self.arity]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u32]> {
        (0..self.len()).map(move |i| self.row(i))
    }

    /// The index of a row, by binary search.
    pub fn find(&self, row: &[u32]) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.row(mid).cmp(row) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }
}

impl RelData {
    /// Rows whose first `prefix.len()` values equal `prefix` (binary search, then a scan).
    pub fn with_prefix(&self, prefix: Vec<u32>) -> impl Iterator<Item = usize> + '_ {
        let k = prefix.len();
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.row(mid)[..k] < prefix[..] {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo..self.len()).take_while(move |&i| self.row(i)[..k] == prefix[..])
    }
}

/// Every relation's contents after an evaluation.
#[derive(Clone, Debug)]
pub struct Database {
    /// Every value the evaluation met, by the id its rows hold.
    pub(crate) interner: Interner,
    /// Each relation's rows, by `RelId`.
    pub rels: Vec<RelData>,
    /// Whether each row records the rule and round that derived it (for explanations).
    pub(crate) provenance: bool,
    /// Evaluation rounds in total (an upper bound on any height).
    pub rounds: u32,
}

impl Database {
    /// The value an id stands for.
    pub fn value(&self, id: u32) -> &Const {
        self.interner.value(id)
    }

    /// The symbol interned as `id` ("" for a number: a host bound to the program knows which
    /// columns are symbols, so this never meets one).
    pub fn sym(&self, id: u32) -> &str {
        match self.value(id) {
            Const::Sym(s) => s,
            Const::Num(_) => "",
        }
    }

    /// The number interned as `id` (0 for a symbol; see `sym`).
    pub fn num(&self, id: u32) -> i64 {
        match self.value(id) {
            Const::Num(n) => *n,
            Const::Sym(_) => 0,
        }
    }

    /// A row's values, decoded from their ids.
    pub fn decode_row(&self, row: &[u32]) -> Vec<Const> {
        row.iter().map(|&v| self.interner.value(v).clone()).collect()
    }

    /// Each interned id's rank in value order (numbers before symbols, numbers numerically,
    /// symbols by bytes): comparing rows of ranks orders them as `decoded` does, without
    /// decoding them.
    pub fn value_ranks(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..self.interner.len() as u32).collect();
        ids.sort_unstable_by(|&a, &b| self.interner.value(a).cmp(self.interner.value(b)));
        let mut rank = vec![0; ids.len()];
        for (r, &id) in ids.iter().enumerate() {
            rank[id as usize] = r as u32;
        }
        rank
    }

    /// A relation's rows in value order (as `decoded` orders them), still interned; `ranks`
    /// from `value_ranks`.
    pub fn rows_in_value_order<'a>(&'a self, rel: RelId, ranks: &[u32]) -> Vec<&'a [u32]> {
        let mut rows: Vec<&[u32]> = self.rels[rel].iter().collect();
        rows.sort_unstable_by(|a, b| a.iter().map(|&v| ranks[v as usize]).cmp(b.iter().map(|&v| ranks[v as usize])));
        rows
    }

    /// A relation's tuples as values, in the user-facing order.
    pub fn decoded(&self, rel: RelId) -> Vec<Vec<Const>> {
        let mut out: Vec<Vec<Const>> = self.rels[rel].iter().map(|r| self.decode_row(r)).collect();
        out.sort();
        out
    }

    /// The interned row of a tuple given as values, if every value is known.
    pub fn encode(&self, values: &[Const]) -> Option<Vec<u32>> {
        values.iter().map(|c| self.interner.get(c)).collect()
    }

    /// Whether relation `rel` holds exactly these values.
    pub fn contains(&self, rel: RelId, values: &[Const]) -> bool {
        self.encode(values).is_some_and(|row| self.rels[rel].find(&row).is_some())
    }

    /// `rel("a", 1)` in the dialect's own syntax.
    pub fn format_tuple(program: &Program, rel: RelId, values: &[Const]) -> String {
        let args: Vec<String> = values.iter().map(Const::to_string).collect();
        format!("{}({})", program.relations[rel].name, args.join(", "))
    }
}
