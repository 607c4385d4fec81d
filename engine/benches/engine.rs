//! Engine benchmark: each workload through the engine and through a hand-written datafrog
//! program with the same joins, in one process, on the same facts; prints the ratios.
//!
//! Run with `cargo bench -p engine` (add `-- quick` for fewer repetitions); under `cargo test`
//! it runs once on inputs 50 times smaller, as a check that both sides agree. Workloads (issue 2):
//! transitive closure on a 2,000-node chain and on a random 2,000-node / 4,000-edge graph; a
//! classification (10^5 changed paths, 300 patterns, most specific wins) followed by an
//! operation plan over 5,000 machines; a small reconcile (1,000 paths, 50 machines);
//! explaining one derived fact; loading a 300-rule file. Issue 10 adds the shapes rule authors
//! write: "most specific wins" by a self-join with an inequality and a negation over matches
//! from a three-atom join with a recursive ancestor relation; an aggregate grouped by two
//! columns; string functors (`cat`, `strlen`) in a body. Times are medians; the ratio
//! `engine / hand-written` compares the whole evaluate call (interning included) with the
//! hand-written program given the same string facts. For "most specific wins" two hand-written
//! programs are timed: the transliteration (the same self-join, negation as an antijoin) and
//! the best one for the result (one sorted scan per path); both ratios are printed.

use datafrog::{Iteration, Relation};
use engine::facts::FactSet;
use engine::{Const, Engine, EvalOptions, load_str};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::Duration;

/// The allocator the `ichor` binary ships with (cli/src/main.rs), so that what is measured is
/// what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../../tests/shared/timer.rs"]
mod timer;

/// `timer::time`, at most 15 runs.
fn time<R>(budget: Duration, f: impl FnMut() -> R) -> Duration {
    timer::time(budget, 15, f)
}

use timer::ms;

const TC: &str = "
.decl edge(a: number, b: number)
.input edge
.decl path(a: number, b: number)
.output path
path(X, Y) :- edge(X, Y).
path(X, Z) :- path(X, Y), edge(Y, Z).
";

fn tc_hand(edges: &[(i64, i64)]) -> usize {
    // The same work as the engine: values interned to u32 first.
    let mut ids: HashMap<i64, u32> = HashMap::new();
    let mut id = |v: i64| {
        let n = ids.len() as u32;
        *ids.entry(v).or_insert(n)
    };
    let edges: Vec<(u32, u32)> = edges.iter().map(|&(a, b)| (id(a), id(b))).collect();
    let mut it = Iteration::new();
    let edge: Relation<(u32, u32)> = edges.iter().copied().collect();
    let path = it.variable::<(u32, u32)>("path");
    let path_by_y = it.variable::<(u32, u32)>("path_by_y");
    path.extend(edges.iter().copied());
    while it.changed() {
        path_by_y.from_map(&path, |&(x, y)| (y, x));
        path.from_join(&path_by_y, &edge, |_, &x, &z| (x, z));
    }
    path.complete().len()
}

fn tc_facts(edges: &[(i64, i64)]) -> FactSet {
    let mut f = FactSet::default();
    for &(a, b) in edges {
        f.add("edge", vec![Const::Num(a), Const::Num(b)]);
    }
    f
}

/// xorshift, for reproducible random graphs and paths.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const CLASSIFY: &str = r#"
/// `path` matched `pattern` (computed in Rust by the host, once per path).
.decl matches(path: symbol, pattern: symbol)
.input matches
/// A pattern's specificity (higher wins) and its class.
.decl spec(pattern: symbol, s: number)
.input spec
.decl pclass(pattern: symbol, class: symbol)
.input pclass
.decl machine(m: symbol, role: symbol)
.input machine
.decl changed(m: symbol, path: symbol)
.input changed
/// The most specific pattern's specificity, per path.
.decl best(path: symbol, s: number)
best(P, S) :- matches(P, _), S = max S2 : { matches(P, Pat), spec(Pat, S2) }.
/// The class of each path: the class of its most specific pattern.
.decl class_of(path: symbol, class: symbol)
.output class_of
class_of(P, C) :- best(P, S), matches(P, Pat), spec(Pat, S), pclass(Pat, C).
.decl reboot(m: symbol)
reboot(M) :- changed(M, P), class_of(P, "reboot-required").
.decl role_rank(role: symbol, r: number)
role_rank("controlplane", 0).
role_rank("worker", 1).
.decl candidate(m: symbol, r: number)
candidate(M, R) :- reboot(M), machine(M, Role), role_rank(Role, R).
/// The machines that go first: the lowest rank among those needing a reboot.
.decl next(m: symbol)
.output next
next(M) :- candidate(M, R), R = min R2 : { candidate(_, R2) }.
/// Machines whose changes are all live.
.decl live(m: symbol)
.output live
live(M) :- machine(M, _), !reboot(M).
"#;

struct Workload {
    matches: Vec<(String, String)>,
    spec: Vec<(String, i64)>,
    pclass: Vec<(String, String)>,
    machine: Vec<(String, String)>,
    changed: Vec<(String, String)>,
}

fn workload(paths: usize, patterns: usize, machines: usize, seed: u64) -> Workload {
    let mut rng = Rng(seed);
    let classes = ["safe", "reboot-required", "install-time-only"];
    let spec = (0..patterns).map(|p| (format!("pat{p}"), rng.below(10) as i64)).collect();
    let pclass = (0..patterns).map(|p| (format!("pat{p}"), classes[rng.below(3) as usize].to_string())).collect();
    let mut matches = vec![];
    for i in 0..paths {
        for _ in 0..1 + rng.below(3) {
            matches.push((format!("machine.path{i}"), format!("pat{}", rng.below(patterns as u64))));
        }
    }
    let machine = (0..machines)
        .map(|m| (format!("m{m}"), if m % 10 == 0 { "controlplane" } else { "worker" }.to_string()))
        .collect();
    let changed = (0..paths).map(|i| (format!("m{}", i % machines), format!("machine.path{i}"))).collect();
    Workload { matches, spec, pclass, machine, changed }
}

fn classify_facts(w: &Workload) -> FactSet {
    let mut f = FactSet::default();
    let s = |x: &str| Const::Sym(x.to_string());
    for (a, b) in &w.matches {
        f.add("matches", vec![s(a), s(b)]);
    }
    for (a, n) in &w.spec {
        f.add("spec", vec![s(a), Const::Num(*n)]);
    }
    for (a, b) in &w.pclass {
        f.add("pclass", vec![s(a), s(b)]);
    }
    for (a, b) in &w.machine {
        f.add("machine", vec![s(a), s(b)]);
    }
    for (a, b) in &w.changed {
        f.add("changed", vec![s(a), s(b)]);
    }
    f
}

/// The same program by hand on datafrog: aggregates by a sorted scan, as hand-written
/// datafrog code does them between computations.
fn classify_hand(w: &Workload) -> (usize, usize, usize) {
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut id = |v: &str| -> u32 {
        if let Some(&x) = ids.get(v) {
            return x;
        }
        let n = ids.len() as u32;
        ids.insert(v.to_string(), n);
        n
    };
    let matches: Relation<(u32, u32)> = w.matches.iter().map(|(p, q)| (id(p), id(q))).collect();
    let spec: Relation<(u32, u32)> = w.spec.iter().map(|(p, s)| (id(p), *s as u32)).collect();
    let pclass: Relation<(u32, u32)> = w.pclass.iter().map(|(p, c)| (id(p), id(c))).collect();
    let machine: Relation<(u32, u32)> = w.machine.iter().map(|(m, r)| (id(m), id(r))).collect();
    let changed: Relation<(u32, u32)> = w.changed.iter().map(|(m, p)| (id(m), id(p))).collect();
    let reboot_class = id("reboot-required");
    let cp = id("controlplane");
    // matches by pattern -> (pattern, path), joined with spec -> (path, (pattern, s)).
    let matches_by_pat: Relation<(u32, u32)> = matches.iter().map(|&(p, q)| (q, p)).collect();
    let with_spec: Relation<(u32, (u32, u32))> = Relation::from_join(&matches_by_pat, &spec, |&q, &p, &s| (p, (q, s)));
    // best(P, S): max over the sorted (path, ...) groups.
    let mut best: Vec<((u32, u32), ())> = vec![];
    let mut i = 0;
    while i < with_spec.len() {
        let p = with_spec[i].0;
        let mut m = 0;
        while i < with_spec.len() && with_spec[i].0 == p {
            m = m.max(with_spec[i].1.1);
            i += 1;
        }
        best.push(((p, m), ()));
    }
    let best: Relation<((u32, u32), ())> = Relation::from_vec(best);
    // class_of(P, C) :- best(P, S), matches(P, Pat), spec(Pat, S), pclass(Pat, C).
    let keyed: Relation<((u32, u32), u32)> = with_spec.iter().map(|&(p, (q, s))| ((p, s), q)).collect();
    let best_pat: Relation<(u32, u32)> = Relation::from_join(&best, &keyed, |&(p, _), _, &q| (q, p));
    let class_of: Relation<(u32, u32)> = Relation::from_join(&best_pat, &pclass, |_, &p, &c| (p, c));
    // reboot(M) :- changed(M, P), class_of(P, "reboot-required").
    let changed_by_p: Relation<(u32, u32)> = changed.iter().map(|&(m, p)| (p, m)).collect();
    let reboot_paths: Relation<(u32, ())> =
        class_of.iter().filter(|x| x.1 == reboot_class).map(|&(p, _)| (p, ())).collect();
    let reboot: Relation<(u32, ())> = Relation::from_join(&changed_by_p, &reboot_paths, |_, &m, _| (m, ()));
    // candidate(M, R) and next(M): the minimum rank.
    let cand: Relation<(u32, u32)> = Relation::from_join(&reboot, &machine, |&m, _, &r| (m, u32::from(r != cp)));
    let min = cand.iter().map(|x| x.1).min();
    let next = cand.iter().filter(|x| Some(x.1) == min).count();
    // live(M) :- machine(M, _), !reboot(M): an antijoin over the sorted slice.
    let mut it = Iteration::new();
    let machines = it.variable::<(u32, u32)>("machine");
    machines.insert(machine.clone());
    let rb: Relation<u32> = reboot.iter().map(|x| x.0).collect();
    let live = it.variable::<(u32, u32)>("live");
    while it.changed() {
        live.from_antijoin(&machines, &rb, |&m, &r| (m, r));
    }
    (class_of.len(), next, live.complete().len())
}

// ---- 5. Shapes contributors write (issue 10) -----------------------------------------------

/// "Most specific wins" written with a self-join, an inequality and a negation, over matches
/// made by a three-atom join with a recursive ancestor relation over a tree.
const DOMINANCE: &str = "
.decl parent(c: number, p: number)
.input parent
.decl node(n: number)
.input node
.decl chg(path: number, n: number)
.input chg
.decl pat(at: number, p: number, d: number)
.input pat
.decl anc(n: number, a: number)
anc(N, N) :- node(N).
anc(N, A) :- anc(N, B), parent(B, A).
.decl m(path: number, p: number, d: number)
m(X, P, D) :- chg(X, N), anc(N, A), pat(A, P, D).
.decl shadowed(path: number, d: number)
shadowed(X, D) :- m(X, _, D), m(X, _, D2), D2 > D.
.decl best(path: number, p: number)
.output best
best(X, P) :- m(X, P, D), !shadowed(X, D).
";

struct Dom {
    parent: Vec<(i64, i64)>,
    nodes: i64,
    chg: Vec<(i64, i64)>,
    pat: Vec<(i64, i64, i64)>,
}

/// A tree of `nodes` (each node's parent a quarter of its id: depth ~ log4), `paths` changed
/// paths at random nodes, `patterns` patterns attached near the root more often than not.
fn dominance(nodes: i64, paths: usize, patterns: usize, seed: u64) -> Dom {
    let mut rng = Rng(seed);
    let parent = (1..nodes).map(|i| (i, i / 4)).collect();
    let chg = (0..paths as i64).map(|x| (x, rng.below(nodes as u64) as i64)).collect();
    let pat = (0..patterns as i64)
        .map(|p| {
            let near = rng.below(nodes as u64 / 8) + 1;
            let at = rng.below(near) as i64;
            (at, p, rng.below(20) as i64)
        })
        .collect();
    Dom { parent, nodes, chg, pat }
}

fn dominance_facts(d: &Dom) -> FactSet {
    let mut f = FactSet::default();
    for &(c, p) in &d.parent {
        f.add("parent", vec![Const::Num(c), Const::Num(p)]);
    }
    for n in 0..d.nodes {
        f.add("node", vec![Const::Num(n)]);
    }
    for &(x, n) in &d.chg {
        f.add("chg", vec![Const::Num(x), Const::Num(n)]);
    }
    for &(a, p, dd) in &d.pat {
        f.add("pat", vec![Const::Num(a), Const::Num(p), Const::Num(dd)]);
    }
    f
}

/// The closure and the matches `m(X, P, D)` by hand on datafrog, as both hand-written
/// programs below start.
fn dominance_matches(d: &Dom) -> Relation<(u32, u32, u32)> {
    let mut ids: HashMap<i64, u32> = HashMap::new();
    let mut id = |v: i64| {
        let n = ids.len() as u32;
        *ids.entry(v).or_insert(n)
    };
    let parent: Relation<(u32, u32)> = d.parent.iter().map(|&(c, p)| (id(c), id(p))).collect();
    let nodes: Vec<u32> = (0..d.nodes).map(&mut id).collect();
    let chg_by_node: Relation<(u32, u32)> = d.chg.iter().map(|&(x, n)| (id(n), id(x))).collect();
    // Specificities stay numbers (typed tuples), as a hand-written program keeps them.
    let pat_by_at: Relation<(u32, (u32, u32))> = d.pat.iter().map(|&(a, p, dd)| (id(a), (id(p), dd as u32))).collect();
    let mut it = Iteration::new();
    let anc = it.variable::<(u32, u32)>("anc");
    anc.extend(nodes.iter().map(|&n| (n, n)));
    let anc_by_b = it.variable::<(u32, u32)>("anc_by_b");
    while it.changed() {
        anc_by_b.from_map(&anc, |&(n, b)| (b, n));
        anc.from_join(&anc_by_b, &parent, |_, &n, &a| (n, a));
    }
    let anc = anc.complete();
    // m(X, P, D) :- chg(X, N), anc(N, A), pat(A, P, D).
    let by_a: Relation<(u32, u32)> = Relation::from_join(&chg_by_node, &anc, |_, &x, &a| (a, x));
    Relation::from_join(&by_a, &pat_by_at, |_, &x, &(p, dd)| (x, p, dd))
}

/// The transliteration of the rules by hand on datafrog, with the same joins: the matches, the
/// self-join filtered by the inequality (as one scan of the distinct pairs), the negation an
/// antijoin.
fn dominance_hand(d: &Dom) -> usize {
    let m = dominance_matches(d);
    // shadowed(X, D) :- m(X, _, D), m(X, _, D2), D2 > D.
    let m_xd: Relation<(u32, u32)> = m.iter().map(|&(x, _, dd)| (x, dd)).collect();
    // Sorted by (X, D) and distinct: a D is shadowed exactly when the next pair has the same X
    // (the best hand-written program for the self-join with `D2 > D`: one scan, no pairs).
    let shadowed: Vec<(u32, u32)> = m_xd.elements.windows(2).filter(|w| w[0].0 == w[1].0).map(|w| w[0]).collect();
    let shadowed: Relation<(u32, u32)> = shadowed.into();
    // best(X, P) :- m(X, P, D), !shadowed(X, D).
    let m_by_xd: Relation<((u32, u32), u32)> = m.iter().map(|&(x, p, dd)| ((x, dd), p)).collect();
    let sh: Relation<(u32, u32)> = shadowed;
    let mut best = 0;
    let mut k = 0;
    for &((x, dd), _) in m_by_xd.iter() {
        while k < sh.len() && sh[k] < (x, dd) {
            k += 1;
        }
        if k >= sh.len() || sh[k] != (x, dd) {
            best += 1;
        }
    }
    best
}

/// The best hand-written program for the same result: the matches, then one scan per path of
/// its matches sorted by specificity, keeping the patterns at the group's largest `D` (no
/// `shadowed` relation, no antijoin).
fn dominance_scan(d: &Dom) -> usize {
    let m = dominance_matches(d);
    let mut best = 0;
    let mut i = 0;
    while i < m.len() {
        let x = m[i].0;
        // Sorted by (X, P, D): the group's largest D, and how many of its (P, D) reach it.
        let (mut top, mut at_top) = (m[i].2, 1);
        let mut j = i + 1;
        while j < m.len() && m[j].0 == x {
            match m[j].2.cmp(&top) {
                std::cmp::Ordering::Greater => (top, at_top) = (m[j].2, 1),
                std::cmp::Ordering::Equal => at_top += 1,
                std::cmp::Ordering::Less => {}
            }
            j += 1;
        }
        best += at_top;
        i = j;
    }
    best
}

/// An aggregate grouped by two columns, and string functors in a body.
const GROUPED: &str = "
.decl w(m: number, c: number, k: number, v: number)
.input w
.decl total(m: number, c: number, s: number)
.output total
total(M, C, S) :- w(M, C, _, _), S = sum V : { w(M, C, _, V) }.
.decl mp(m: symbol, p: symbol)
.input mp
.decl full(s: symbol)
.output full
full(S) :- mp(M, P), S = cat(M, \"/\", P), strlen(S) > 14.
";

struct Grouped {
    w: Vec<(i64, i64, i64, i64)>,
    mp: Vec<(String, String)>,
}

/// `machines` machines with 8 components of 5 weighted items each; `paths` (machine, path) pairs.
fn grouped(machines: usize, paths: usize, seed: u64) -> Grouped {
    let mut rng = Rng(seed);
    let mut w = vec![];
    for m in 0..machines as i64 {
        for c in 0..8 {
            for k in 0..5 {
                w.push((m, c, k, rng.below(100) as i64));
            }
        }
    }
    let mp =
        (0..paths).map(|i| (format!("m{}", i % machines.max(1)), format!("machine.p{}", rng.below(1 << 20)))).collect();
    Grouped { w, mp }
}

fn grouped_facts(g: &Grouped) -> FactSet {
    let mut f = FactSet::default();
    for &(m, c, k, v) in &g.w {
        f.add("w", vec![Const::Num(m), Const::Num(c), Const::Num(k), Const::Num(v)]);
    }
    for (m, p) in &g.mp {
        f.add("mp", vec![Const::Sym(m.clone()), Const::Sym(p.clone())]);
    }
    f
}

/// By hand: the sums by a scan of the sorted relation; the strings built and interned.
fn grouped_hand(g: &Grouped) -> (usize, usize) {
    let mut ids: HashMap<i64, u32> = HashMap::new();
    let mut id = |v: i64| {
        let n = ids.len() as u32;
        *ids.entry(v).or_insert(n)
    };
    // Values stay numbers for the sum; machine and component are interned keys.
    let w: Relation<((u32, u32), (u32, u32))> =
        g.w.iter().map(|&(m, c, k, v)| ((id(m), id(c)), (id(k), v as u32))).collect();
    let mut totals = 0;
    let mut i = 0;
    while i < w.len() {
        let key = w[i].0;
        let mut sum = 0u64;
        while i < w.len() && w[i].0 == key {
            sum += u64::from(w[i].1.1);
            i += 1;
        }
        black_box(sum);
        totals += 1;
    }
    // Symbols interned with their text kept by id, as the engine's interner keeps them.
    let mut syms: HashMap<String, u32> = HashMap::new();
    let mut names: Vec<String> = vec![];
    let mut sym = |s: &str, names: &mut Vec<String>| -> u32 {
        if let Some(&x) = syms.get(s) {
            return x;
        }
        let n = names.len() as u32;
        syms.insert(s.to_string(), n);
        names.push(s.to_string());
        n
    };
    let mp: Relation<(u32, u32)> = g.mp.iter().map(|(m, p)| (sym(m, &mut names), sym(p, &mut names))).collect();
    let mut full = vec![];
    for &(m, p) in mp.iter() {
        let (a, b) = (&names[m as usize], &names[p as usize]);
        let mut s = String::with_capacity(a.len() + 1 + b.len());
        s.push_str(a);
        s.push('/');
        s.push_str(b);
        if s.chars().count() > 14 {
            full.push(sym(&s, &mut names));
        }
    }
    let full: Relation<u32> = full.into();
    (totals, full.len())
}

fn engine_for(src: &str) -> Engine {
    let loaded = load_str("bench.rules", src);
    Engine::new(loaded.program.expect("bench program loads")).unwrap()
}

fn row(name: &str, engine: Duration, hand: Duration, prov: Duration) {
    println!(
        "{name:<38} engine {:>9.2} ms  hand-written {:>9.2} ms  ratio {:>5.2}x  provenance on {:>9.2} ms ({:.2}x of off)",
        ms(engine),
        ms(hand),
        engine.as_secs_f64() / hand.as_secs_f64(),
        ms(prov),
        prov.as_secs_f64() / engine.as_secs_f64()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this as a smoke test on
    // small inputs, so that the engine-vs-hand-written agreement checks run in CI.
    let args: Vec<String> = std::env::args().collect();
    let smoke = !args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "quick");
    let budget = Duration::from_millis(if smoke {
        1
    } else if quick {
        200
    } else {
        2000
    });
    let scale = |n: usize| if smoke { (n / 50).max(10) } else { n };
    if smoke {
        println!("smoke run (inputs 50x smaller, one sample; `cargo bench -p engine` measures)");
    }
    let off = EvalOptions::default();
    let on = EvalOptions { provenance: true, ..EvalOptions::default() };

    // 1. Transitive closure.
    let tc = engine_for(TC);
    let n = scale(2000) as i64;
    let chain: Vec<(i64, i64)> = (0..n - 1).map(|i| (i, i + 1)).collect();
    let mut rng = Rng(0x5eed);
    let random: Vec<(i64, i64)> =
        (0..2 * n).map(|_| (rng.below(n as u64) as i64, rng.below(n as u64) as i64)).collect();
    for (name, edges) in [("tc: chain 2,000", &chain), ("tc: random 2,000 nodes / 4,000 edges", &random)] {
        let facts = tc_facts(edges).resolve(&tc.program).unwrap();
        let n_engine = tc.evaluate(&facts, off).unwrap().rels[tc.program.relation("path").unwrap()].len();
        assert_eq!(n_engine, tc_hand(edges), "{name}: engine and hand-written disagree");
        let e = time(budget, || tc.evaluate(&facts, off).unwrap());
        let h = time(budget, || tc_hand(edges));
        let p = time(budget, || tc.evaluate(&facts, on).unwrap());
        row(&format!("{name} ({n_engine} paths)"), e, h, p);
    }

    // 2. Classification + plan, and the small reconcile.
    let cl = engine_for(CLASSIFY);
    let class_of = cl.program.relation("class_of").unwrap();
    for (name, w) in [
        ("classify 10^5 paths x 300 + plan 5,000", workload(scale(100_000), 300, scale(5_000), 7)),
        ("small reconcile: 1,000 paths, 50 machines", workload(scale(1_000), 300, 50, 11)),
    ] {
        let facts = classify_facts(&w).resolve(&cl.program).unwrap();
        let db = cl.evaluate(&facts, off).unwrap();
        let (h_class, h_next, h_live) = classify_hand(&w);
        assert_eq!(db.rels[class_of].len(), h_class, "{name}: class_of differs");
        assert_eq!(db.rels[cl.program.relation("next").unwrap()].len(), h_next, "{name}: next differs");
        assert_eq!(db.rels[cl.program.relation("live").unwrap()].len(), h_live, "{name}: live differs");
        // Fact building (strings to engine facts) is timed apart: the controller builds them once.
        let e = time(budget, || cl.evaluate(&facts, off).unwrap());
        let h = time(budget, || classify_hand(&w));
        let p = time(budget, || cl.evaluate(&facts, on).unwrap());
        row(name, e, h, p);
        let fb = time(budget, || classify_facts(&w).resolve(&cl.program).unwrap());
        println!("{:<38} fact building {:.2} ms (not in the ratio)", "", ms(fb));
    }

    // 5. Shapes contributors write (issue 10).
    let dom = engine_for(DOMINANCE);
    let d = dominance(scale(30_000) as i64, scale(100_000), 300, 13);
    let facts = dominance_facts(&d).resolve(&dom.program).unwrap();
    let db = dom.evaluate(&facts, off).unwrap();
    let best_rel = dom.program.relation("best").unwrap();
    let m_len = db.rels[dom.program.relation("m").unwrap()].len();
    assert_eq!(db.rels[best_rel].len(), dominance_hand(&d), "dominance: best differs");
    assert_eq!(db.rels[best_rel].len(), dominance_scan(&d), "dominance: best differs from the scan");
    let e = time(budget, || dom.evaluate(&facts, off).unwrap());
    let h = time(budget, || dominance_hand(&d));
    let s = time(budget, || dominance_scan(&d));
    let p = time(budget, || dom.evaluate(&facts, on).unwrap());
    row(&format!("most specific by negation ({m_len} matches)"), e, h, p);
    println!(
        "{:<38} best hand-written (a sorted scan per path) {:>9.2} ms  ratio {:>5.2}x",
        "",
        ms(s),
        e.as_secs_f64() / s.as_secs_f64()
    );
    // Where the time goes: the matches alone (closure and three-atom join), both sides.
    let (head, _) = DOMINANCE.split_once(".decl shadowed").unwrap();
    let matches_only = engine_for(&format!("{head}.output m\n"));
    let mfacts = dominance_facts(&d).resolve(&matches_only.program).unwrap();
    assert_eq!(
        matches_only.evaluate(&mfacts, off).unwrap().rels[matches_only.program.relation("m").unwrap()].len(),
        m_len
    );
    let em = time(budget, || matches_only.evaluate(&mfacts, off).unwrap());
    let hm = time(budget, || dominance_matches(&d));
    println!(
        "{:<38} of which the matches: engine {:>9.2} ms  hand-written {:>9.2} ms  ratio {:>5.2}x",
        "",
        ms(em),
        ms(hm),
        em.as_secs_f64() / hm.as_secs_f64()
    );

    let gr = engine_for(GROUPED);
    let g = grouped(scale(5_000), scale(100_000), 17);
    let facts = grouped_facts(&g).resolve(&gr.program).unwrap();
    let db = gr.evaluate(&facts, off).unwrap();
    let (h_tot, h_full) = grouped_hand(&g);
    assert_eq!(db.rels[gr.program.relation("total").unwrap()].len(), h_tot, "grouped: total differs");
    assert_eq!(db.rels[gr.program.relation("full").unwrap()].len(), h_full, "grouped: full differs");
    let e = time(budget, || gr.evaluate(&facts, off).unwrap());
    let h = time(budget, || grouped_hand(&g));
    let p = time(budget, || gr.evaluate(&facts, on).unwrap());
    row("sum by 2 columns + cat/strlen (10^5)", e, h, p);

    // 3. Explaining one derived fact (a class_of proof: aggregate, joins, inputs).
    let w = workload(scale(100_000), 300, scale(5_000), 7);
    let facts = classify_facts(&w).resolve(&cl.program).unwrap();
    let db = cl.evaluate(&facts, on).unwrap();
    let all = db.decoded(class_of);
    let target = all[all.len() / 8].clone();
    let t = time(budget, || engine::explain::explain(&cl.program, &db, "class_of", &target).unwrap());
    println!("{:<38} {:.3} ms (target < 1 ms)", "explain one class_of fact (10^5 paths)", ms(t));

    // 4. Loading (parse, check, plan) a 300-rule file.
    let mut src = String::from(".decl base(a: symbol, b: number)\n.input base\n");
    for i in 0..300 {
        let prev = if i == 0 { "base".to_string() } else { format!("r{}", i - 1) };
        src += &format!(
            "/// Rule {i}.\n.decl r{i}(a: symbol, b: number)\n.output r{i}\nr{i}(A, N) :- {prev}(A, M), base(A, K), N = M + K, N < {}, !base(A, N), match(\"x{i}.*\", A).\n",
            1000 + i
        );
    }
    let t = time(budget, || {
        let loaded = load_str("big.rules", &src);
        Engine::new(loaded.program.unwrap()).unwrap()
    });
    println!("{:<38} {:.2} ms (target < 50 ms)", "load 300 rules (parse, check, plan)", ms(t));
}
