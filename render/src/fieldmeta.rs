//! Field metadata (`rules/fieldmeta.yaml`): loading, validation, and path matching.
//!
//! Start at `FieldMeta::parse` (every problem at once, each with its line), then
//! `FieldMeta::matcher` (one trie of patterns per contract, built once) and `Matcher::candidates`
//! (the entries whose patterns match a path, run once per path). Choosing among candidates
//! is the classification rules' job (`rules/classify.rules`), not this module's.
//! `FieldMeta::check_inventories` finds ambiguities (two entries of equal specificity and
//! different classes for one path) and coverage (paths no entry decides).

use crate::inventory::Inventory;
use crate::path::{PatSeg, Path, Pattern, Seg, canonical_index};
use crate::vocab::{Class, Contract, Effect};
use engine::FxHashMap;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Clone, Debug)]
/// One entry of rules/fieldmeta.yaml: the patterns it decides, at which contracts, and what it says of them.
pub struct Entry {
    /// Its line in the file.
    pub line: usize,
    /// The config paths it decides.
    pub patterns: Vec<Pattern>,
    /// The first contract it holds at (none: every contract before `to`).
    pub from: Option<Contract>,
    /// The last contract it holds at (none: every contract from `from`).
    pub to: Option<Contract>,
    /// The class it gives (none: it only marks `sensitive` or names restarts).
    pub class: Option<Class>,
    /// The services a change of the paths restarts.
    pub restarts: Vec<String>,
    /// The operation that applies the paths, when only one may.
    pub applied_by: Option<String>,
    /// What Talos itself does with a change of the paths, where its class does not say it
    /// (none: the rules derive it from the class, `restarts`, `appliedBy` and the contract).
    pub effect: Option<Effect>,
    /// The paths hold secrets: their values are never shown.
    pub sensitive: bool,
    /// Why, in a sentence (shown by `ichor config explain`).
    pub why: String,
    /// Where in Talos's source or docs that is so.
    pub source: String,
}

impl Entry {
    /// Whether the entry holds at contract `c`.
    pub fn holds_at(&self, c: Contract) -> bool {
        self.from.is_none_or(|f| f <= c) && self.to.is_none_or(|t| c <= t)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEntry {
    patterns: Vec<String>,
    contracts: String,
    #[serde(default)]
    class: Option<String>,
    #[serde(default)]
    restarts: Vec<String>,
    #[serde(default)]
    applied_by: Option<String>,
    #[serde(default)]
    effect: Option<String>,
    #[serde(default)]
    sensitive: bool,
    why: String,
    source: String,
}

/// A problem in the field metadata, at a line of its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaError {
    /// The line, 1-based.
    pub line: usize,
    /// The column, 1-based.
    pub col: usize,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: error: {}", self.line, self.col, self.message)
    }
}

#[derive(Clone, Debug)]
/// The field metadata: every entry, in file order.
pub struct FieldMeta {
    /// The entries.
    pub entries: Vec<Entry>,
}

/// The operations that may own a path (`appliedBy`).
pub const OPERATIONS: [&str; 3] = ["kubernetes", "cni", "talos"];

impl FieldMeta {
    /// Parses and validates `fieldmeta.yaml`. `known` lists the contracts the project has
    /// inventories for; ranges must name them.
    pub fn parse(text: &str, known: &[Contract]) -> Result<FieldMeta, Vec<MetaError>> {
        let raw: Vec<RawEntry> = serde_yaml::from_str(text).map_err(|e| {
            let (line, col) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            let msg = e.to_string();
            vec![MetaError { line, col, message: msg.split(" at line ").next().unwrap_or(&msg).to_string() }]
        })?;
        // Entries start at column 1 with `- `: their lines, in order.
        let lines: Vec<usize> =
            text.lines().enumerate().filter(|(_, l)| l.starts_with("- ")).map(|(i, _)| i + 1).collect();
        let mut errors = vec![];
        let mut entries = vec![];
        // Entries whose range did not parse take no part in the duplicate check.
        let mut bad_range = vec![];
        for (i, r) in raw.into_iter().enumerate() {
            let line = lines.get(i).copied().unwrap_or(1);
            let mut err = |m: String| errors.push(MetaError { line, col: 1, message: m });
            let class = match r.class.as_deref() {
                None => None,
                Some(name) if Class::parse(name).is_some_and(|c| c != Class::Unsupported) => Class::parse(name),
                Some(other) => {
                    err(format!("unknown class {other:?}: expected safe, reboot-required or install-time-only"));
                    None
                }
            };
            if r.class.is_none() && !r.sensitive {
                err("an entry needs a class, or `sensitive: true` for one that only marks secrets".into());
            }
            if let Some(op) = &r.applied_by {
                if !OPERATIONS.contains(&op.as_str()) {
                    err(format!("unknown appliedBy {op:?}: expected one of {}", OPERATIONS.join(", ")));
                }
                if !matches!(class, Some(Class::RebootRequired | Class::InstallTimeOnly)) {
                    err("an entry with appliedBy is reboot-required or install-time-only (the machine controller leaves it to the operation)".into());
                }
            }
            let effect = match r.effect.as_deref() {
                None => None,
                Some(name) => {
                    let e = Effect::parse(name);
                    if e.is_none() {
                        let all: Vec<&str> = Effect::ALL.iter().map(|e| e.name()).collect();
                        err(format!("unknown effect {name:?}: expected one of {}", all.join(", ")));
                    }
                    if class.is_none() {
                        err("an entry with an effect needs a class".into());
                    }
                    e
                }
            };
            if r.why.trim().is_empty() || r.source.trim().is_empty() {
                err("`why` and `source` must say something".into());
            }
            if r.patterns.is_empty() {
                err("an entry needs at least one pattern".into());
            }
            let (from, to, range_ok) = match parse_range(&r.contracts, known) {
                Ok((a, b)) => (a, b, true),
                Err(m) => {
                    err(m);
                    (None, None, false)
                }
            };
            let mut patterns = vec![];
            for p in &r.patterns {
                match Pattern::new(p) {
                    Ok(pat) => patterns.push(pat),
                    Err(m) => err(format!("pattern {p:?}: {m}")),
                }
            }
            if !range_ok {
                bad_range.push(entries.len());
            }
            entries.push(Entry {
                line,
                patterns,
                from,
                to,
                class,
                restarts: r.restarts,
                applied_by: r.applied_by,
                effect,
                sensitive: r.sensitive,
                why: r.why.trim().to_string(),
                source: r.source.trim().to_string(),
            });
        }
        // The same pattern twice with overlapping contracts and the same role is a duplicate.
        for (i, a) in entries.iter().enumerate() {
            for (j, b) in entries[..i].iter().enumerate() {
                if bad_range.contains(&i) || bad_range.contains(&j) || a.class.is_some() != b.class.is_some() {
                    continue;
                }
                let overlap = known.iter().any(|&c| a.holds_at(c) && b.holds_at(c));
                for p in &a.patterns {
                    if overlap && b.patterns.iter().any(|q| q.text == p.text) {
                        errors.push(MetaError {
                            line: a.line,
                            col: 1,
                            message: format!("duplicate entry: pattern {:?} is already in the entry at line {} for an overlapping contract range", p.text, b.line),
                        });
                    }
                }
            }
        }
        errors.sort_by_key(|e| e.line);
        if errors.is_empty() { Ok(FieldMeta { entries }) } else { Err(errors) }
    }

    /// The matcher of one contract: every pattern of every entry that holds there.
    pub fn matcher(&self, contract: Contract) -> Matcher {
        let holding = self.entries.iter().enumerate().filter(|(_, e)| e.holds_at(contract));
        Matcher::new(contract, holding.flat_map(|(i, e)| e.patterns.iter().map(move |p| (i, p, e.sensitive))))
    }

    /// Checks the metadata against each contract's inventory: ambiguities (errors) and the
    /// paths that fall to the default (coverage).
    pub fn check_inventories(
        &self,
        inventories: &BTreeMap<Contract, Inventory>,
    ) -> (Vec<MetaError>, BTreeMap<Contract, Coverage>) {
        // (contract, entry a, entry b) -> the paths on which they tie with different classes.
        let mut ties: BTreeMap<(Contract, usize, usize), Vec<String>> = BTreeMap::new();
        let mut coverage = BTreeMap::new();
        for (&c, inv) in inventories {
            let m = self.matcher(c);
            let mut cov = Coverage::default();
            for pat in inv.patterns() {
                // Stand a concrete path in for the pattern: `*` and `[*]` become sample segments.
                let sample = pat.replace("[*]", "[0]").replace(".*", ".x");
                let Ok(path) = Path::parse(&sample) else {
                    continue;
                };
                cov.total += 1;
                let cands = m.candidates(&path);
                let classed: Vec<(usize, i64)> =
                    cands.iter().copied().filter(|&(e, _)| self.entries[e].class.is_some()).collect();
                let Some(best) = classed.iter().map(|x| x.1).max() else {
                    cov.defaulted.push(pat.clone());
                    continue;
                };
                let top: Vec<usize> = classed.iter().filter(|x| x.1 == best).map(|x| x.0).collect();
                for &a in &top {
                    for &b in &top {
                        if a < b && self.entries[a].class != self.entries[b].class {
                            ties.entry((c, a, b)).or_default().push(pat.clone());
                        }
                    }
                }
            }
            coverage.insert(c, cov);
        }
        let mut errors: Vec<MetaError> = ties
            .into_iter()
            .map(|((c, a, b), paths)| {
                let (ea, eb) = (&self.entries[a], &self.entries[b]);
                let shown: Vec<&str> = paths.iter().take(3).map(String::as_str).collect();
                let more = if paths.len() > 3 { format!(" and {} more", paths.len() - 3) } else { String::new() };
                MetaError {
                    line: eb.line,
                    col: 1,
                    message: format!(
                        "ambiguous at {c}: this entry ({}) and the entry at line {} ({}) are equally specific for {}{more}; make one of them more specific",
                        eb.class.unwrap().name(),
                        ea.line,
                        ea.class.unwrap().name(),
                        shown.join(", ")
                    ),
                }
            })
            .collect();
        errors.sort_by_key(|e| e.line);
        (errors, coverage)
    }
}

/// How many inventory paths of a contract an explicit entry decides.
#[derive(Clone, Debug, Default)]
pub struct Coverage {
    /// The contract's inventory paths.
    pub total: usize,
    /// The paths no explicit entry decides (they fall to the default class).
    pub defaulted: Vec<String>,
}

fn parse_range(s: &str, known: &[Contract]) -> Result<(Option<Contract>, Option<Contract>), String> {
    let s = s.trim();
    if s == "all" {
        return Ok((None, None));
    }
    let one = |x: &str| -> Result<Option<Contract>, String> {
        if x.is_empty() {
            return Ok(None);
        }
        let c = Contract::parse(x).ok_or_else(|| format!("{x:?} is not a contract (vX.Y)"))?;
        if !known.contains(&c) {
            let names: Vec<String> = known.iter().map(Contract::to_string).collect();
            return Err(format!("unknown contract {c}: known contracts are {}", names.join(", ")));
        }
        Ok(Some(c))
    };
    let (a, b) = match s.split_once("..") {
        Some((a, b)) => (one(a.trim())?, one(b.trim())?),
        None => {
            let c = one(s)?;
            (c, c)
        }
    };
    if let (Some(x), Some(y)) = (a, b)
        && x > y
    {
        return Err(format!("inverted contract range {s}: {x} is after {y}"));
    }
    Ok((a, b))
}

/// The patterns of one contract as one trie over segments, walked once per path: every
/// pattern that matches is found in a single pass, whatever the number of patterns.
#[derive(Clone, Debug)]
pub struct Matcher {
    /// The contract the patterns hold at.
    pub contract: Contract,
    nodes: Vec<Node>,
}

/// A trie node: the patterns that end here, and where each next pattern segment leads.
#[derive(Clone, Debug, Default)]
struct Node {
    members: FxHashMap<String, usize>,
    /// Bracket literals by text (document names), and those that are list indexes by number.
    names: FxHashMap<String, usize>,
    indexes: FxHashMap<usize, usize>,
    any_member: Option<usize>,
    any_bracket: Option<usize>,
    /// The node after a `**`: it is active here too (no segment), and stays active on any segment.
    any_depth: Option<usize>,
    /// Reached through `**`: consumes any segment and stays.
    loops: bool,
    /// (entry, specificity) of the patterns that end here.
    accept: Vec<(usize, i64)>,
    /// A sensitive entry's pattern ends here: this path and everything under it is secret.
    secret: bool,
}

impl Matcher {
    fn new<'a>(contract: Contract, patterns: impl Iterator<Item = (usize, &'a Pattern, bool)>) -> Matcher {
        let mut nodes = vec![Node::default()];
        for (e, pat, sensitive) in patterns {
            let mut at = 0;
            for seg in &pat.segs {
                let fresh = nodes.len();
                let n = &mut nodes[at];
                let next = *match seg {
                    PatSeg::Member(m) => n.members.entry(m.clone()).or_insert(fresh),
                    // A bracket literal is a document name, and also a list index when it is one.
                    PatSeg::Bracket(b) => match canonical_index(b) {
                        Some(i) => n.names.entry(b.clone()).or_insert(*n.indexes.entry(i).or_insert(fresh)),
                        None => n.names.entry(b.clone()).or_insert(fresh),
                    },
                    PatSeg::AnyMember => n.any_member.get_or_insert(fresh),
                    PatSeg::AnyBracket => n.any_bracket.get_or_insert(fresh),
                    PatSeg::AnyDepth => n.any_depth.get_or_insert(fresh),
                };
                if next == fresh {
                    nodes.push(Node { loops: matches!(seg, PatSeg::AnyDepth), ..Node::default() });
                }
                at = next;
            }
            nodes[at].accept.push((e, pat.specificity));
            nodes[at].secret |= sensitive;
        }
        Matcher { contract, nodes }
    }

    /// Adds `n` and what its `**` reaches without consuming a segment; notes a secret node.
    fn enter(&self, mut n: usize, set: &mut Vec<usize>, secret: &mut bool) {
        loop {
            if set.contains(&n) {
                return;
            }
            set.push(n);
            *secret |= self.nodes[n].secret;
            match self.nodes[n].any_depth {
                Some(d) => n = d,
                None => return,
            }
        }
    }

    /// `(entry, specificity)` for every entry with a pattern matching the path; the best
    /// specificity per entry, in entry order.
    pub fn candidates(&self, path: &Path) -> Vec<(usize, i64)> {
        let mut out = vec![];
        self.candidates_into(path, &mut out, &mut (vec![], vec![]));
        out
    }

    /// Whether the path, or a path it lies under, matches a sensitive entry: redaction fails
    /// closed whatever shape the value has (a token written as a list or a map).
    pub fn secret(&self, path: &Path) -> bool {
        self.candidates_into(path, &mut vec![], &mut (vec![], vec![]))
    }

    /// `candidates` into `out` (cleared first), with scratch space reused across paths;
    /// returns `secret` for the path, found in the same walk.
    pub fn candidates_into(
        &self,
        path: &Path,
        out: &mut Vec<(usize, i64)>,
        scratch: &mut (Vec<usize>, Vec<usize>),
    ) -> bool {
        out.clear();
        let (set, next) = scratch;
        set.clear();
        let mut secret = false;
        self.enter(0, set, &mut secret);
        for seg in &path.segs {
            next.clear();
            for &n in set.iter() {
                let node = &self.nodes[n];
                if node.loops {
                    self.enter(n, next, &mut secret);
                }
                let lit = match seg {
                    Seg::Field(f) | Seg::Key(f) if !node.members.is_empty() => node.members.get(f.as_str()),
                    Seg::Name(x) if !node.names.is_empty() => node.names.get(x.as_str()),
                    Seg::Index(i) if !node.indexes.is_empty() => node.indexes.get(i),
                    _ => None,
                };
                if let Some(&c) = lit {
                    self.enter(c, next, &mut secret);
                }
                let any = match seg {
                    Seg::Field(_) | Seg::Key(_) => node.any_member,
                    Seg::Index(_) | Seg::Name(_) => node.any_bracket,
                };
                if let Some(c) = any {
                    self.enter(c, next, &mut secret);
                }
            }
            std::mem::swap(set, next);
            if set.is_empty() {
                return secret;
            }
        }
        for &n in set.iter() {
            for &(e, spec) in &self.nodes[n].accept {
                match out.iter_mut().find(|x| x.0 == e) {
                    Some(x) => x.1 = x.1.max(spec),
                    None => out.push((e, spec)),
                }
            }
        }
        out.sort_unstable();
        secret
    }
}
