//! The release's version path (rules/release.rules) against a breadth-first search written here
//! from the same contract, for every pair of versions the facts of rules/versions.rules name.
//!
//! Start at `every_pair_of_versions_gets_the_shortest_path_talos_first_or_a_refusal`. The search
//! reads only the data of versions.rules (which Kubernetes each Talos minor runs, what it
//! upgrades from, the known releases), never a derived relation.

use engine::Const;
use engine::EvalOptions;
use engine::facts::FactSet;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

type V = (i64, i64);

fn parse(v: &str) -> V {
    let mut it = v.trim_start_matches('v').split('.').map(|p| p.parse::<i64>().unwrap());
    let (_, m, p) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    (m, p)
}

fn show((m, p): V) -> String {
    format!("v1.{m}.{p}")
}

/// What versions.rules says, as plain data.
struct Tables {
    supports: BTreeMap<i64, (i64, i64)>,
    upgrade_from: BTreeMap<i64, V>,
    talos: BTreeSet<V>,
    kube: BTreeSet<V>,
}

fn newest(known: &BTreeSet<V>, minor: i64) -> Option<V> {
    known.iter().filter(|v| v.0 == minor).max().copied()
}

/// The path the contract asks for: the fewest steps, each state supported, a Talos step one Talos
/// allows from the running version, a Kubernetes step at most one minor; intermediate versions
/// the newest known patch of their minor; at each state a Talos step first, the newest first.
fn reference(t: &Tables, from: (V, V), goal: (V, V)) -> Option<Vec<(&'static str, V)>> {
    let mut talos: BTreeSet<V> = [from.0, goal.0].into();
    talos.extend(((from.0.0 + 1)..goal.0.0).filter_map(|m| newest(&t.talos, m)));
    let mut kube: BTreeSet<V> = [from.1, goal.1].into();
    kube.extend(((from.1.0 + 1)..goal.1.0).filter_map(|m| newest(&t.kube, m)));
    let ok = |tv: V, kv: V| t.supports.get(&tv.0).is_some_and(|&(lo, hi)| lo <= kv.0 && kv.0 <= hi);
    let steps = |(tv, kv): (V, V)| -> Vec<(&'static str, (V, V))> {
        let mut out = vec![];
        for &t2 in talos.iter().rev() {
            if t2 > tv && ok(t2, kv) && t.upgrade_from.get(&t2.0).is_some_and(|&f| tv >= f) {
                out.push(("talos", (t2, kv)));
            }
        }
        for &k2 in kube.iter().rev() {
            if k2 > kv && k2.0 <= kv.0 + 1 && ok(tv, k2) {
                out.push(("kubernetes", (tv, k2)));
            }
        }
        out
    };
    if !ok(goal.0, goal.1) || !ok(from.0, from.1) {
        return None;
    }
    // Distances to the goal, by a search backwards over every state.
    let states: Vec<(V, V)> =
        talos.iter().flat_map(|&a| kube.iter().map(move |&b| (a, b))).filter(|&(a, b)| ok(a, b)).collect();
    let mut dist: BTreeMap<(V, V), usize> = [(goal, 0)].into();
    let mut queue = VecDeque::from([goal]);
    while let Some(s) = queue.pop_front() {
        for &p in &states {
            if !dist.contains_key(&p) && steps(p).iter().any(|(_, n)| *n == s) {
                dist.insert(p, dist[&s] + 1);
                queue.push_back(p);
            }
        }
    }
    let mut at = from;
    let mut path = vec![];
    dist.get(&at)?;
    while at != goal {
        let (kind, next) =
            steps(at).into_iter().find(|(_, n)| dist.get(n).is_some_and(|&d| d + 1 == dist[&at])).unwrap();
        path.push((kind, if kind == "talos" { next.0 } else { next.1 }));
        at = next;
    }
    Some(path)
}

#[test]
fn every_pair_of_versions_gets_the_shortest_path_talos_first_or_a_refusal() {
    let planner = runtime::plan::Planner::embedded().unwrap();
    let engine = &planner.engine;
    let p = &engine.program;
    let base = engine.evaluate(&engine.empty_facts(), EvalOptions::default()).unwrap();
    let rows = |db: &engine::Database, name: &str| db.decoded(p.relation(name).unwrap());
    let text = |c: &Const| match c {
        Const::Sym(s) => s.clone(),
        Const::Num(n) => n.to_string(),
    };
    let num = |c: &Const| match c {
        Const::Num(n) => *n,
        Const::Sym(s) => panic!("{s} is no number"),
    };
    let t = Tables {
        supports: rows(&base, "talos_supports").iter().map(|r| (num(&r[0]), (num(&r[1]), num(&r[2])))).collect(),
        upgrade_from: rows(&base, "talos_upgrade_from").iter().map(|r| (num(&r[0]), parse(&text(&r[1])))).collect(),
        talos: rows(&base, "talos_release").iter().map(|r| parse(&text(&r[0]))).collect(),
        kube: rows(&base, "kubernetes_release").iter().map(|r| parse(&text(&r[0]))).collect(),
    };
    // Every Talos minor the table has (its first patch, and the newest known), every Kubernetes
    // minor a Talos runs (likewise), and two release sets.
    let mut talos_from: BTreeSet<V> = t.supports.keys().map(|&m| (m, 0)).collect();
    talos_from.extend(t.supports.keys().filter_map(|&m| newest(&t.talos, m)));
    let (lo, hi) = (t.supports.values().map(|v| v.0).min().unwrap(), t.supports.values().map(|v| v.1).max().unwrap());
    let mut kube_from: BTreeSet<V> = (lo - 1..=hi).map(|m| (m, 0)).collect();
    kube_from.extend((lo..=hi).filter_map(|m| newest(&t.kube, m)));
    let goals = [((14, 6), (37, 0)), ((13, 10), (36, 4))];
    let (mut paths, mut refusals) = (0, 0);
    for goal in goals {
        for &tf in &talos_from {
            for &kf in &kube_from {
                if tf > goal.0 || kf > goal.1 {
                    continue;
                }
                let mut set = FactSet::default();
                let sym = |s: &str| Const::Sym(s.to_string());
                set.add("operation", vec![sym("rel"), sym("release"), sym(render::api::Phase::Pending.name())]);
                set.add("target_talos", vec![sym(&show(goal.0))]);
                set.add("target_kubernetes", vec![sym(&show(goal.1))]);
                set.add("machine_versions", vec![sym("m"), sym(&show(tf)), sym(&show(kf))]);
                let db = engine.evaluate(&set.resolve(p).unwrap(), EvalOptions::default()).unwrap();
                let mut got: Vec<(i64, String, String)> =
                    rows(&db, "release_step").iter().map(|r| (num(&r[0]), text(&r[1]), text(&r[2]))).collect();
                got.sort();
                let refused = rows(&db, "release_refusal");
                let case =
                    format!("from Talos {} Kubernetes {} to {} {}", show(tf), show(kf), show(goal.0), show(goal.1));
                match reference(&t, (tf, kf), goal) {
                    Some(want) => {
                        let want: Vec<(i64, String, String)> = want
                            .iter()
                            .enumerate()
                            .map(|(i, (k, v))| (i as i64 + 1, k.to_string(), show(*v)))
                            .collect();
                        assert_eq!(got, want, "{case}");
                        assert!(refused.is_empty(), "{case}: refused {refused:?} with a path");
                        paths += 1;
                    }
                    None => {
                        assert!(got.is_empty(), "{case}: steps {got:?} where there is no path");
                        assert_eq!(refused.len(), 1, "{case}: one refusal, got {refused:?}");
                        refusals += 1;
                    }
                }
            }
        }
    }
    // Both kinds of answer were met (a table change that made every pair one kind is seen).
    assert!(paths > 50 && refusals > 20, "{paths} paths, {refusals} refusals");
}

/// The shipped release set is what the binary embeds elsewhere (the chart it carries, the
/// Kubernetes the controller's flag defaults to).
#[test]
fn the_release_set_is_the_one_the_binary_embeds() {
    let set = runtime::plan::Planner::embedded().unwrap().release_set().unwrap();
    assert_eq!(set.kubernetes, render::embedded::RELEASE_SET_KUBERNETES);
    assert_eq!(set.cilium, render::embedded::CILIUM_CHART_VERSION);
    assert_eq!(set.talos, render::embedded::RELEASE_SET_TALOS);
}

/// The rules with the release set's Talos and Kubernetes replaced, loaded: the error, if any.
fn load_with(talos: &str, kubernetes: &str) -> (Option<String>, impl Fn(&str) -> usize) {
    let files: Vec<(String, String)> = render::embedded::RULE_FILES
        .iter()
        .map(|(name, text)| {
            let text = if name.ends_with("versions.rules") {
                text.replace("release_set(\"talos\", \"v1.14.6\").", &format!("release_set(\"talos\", \"{talos}\")."))
                    .replace(
                        "release_set(\"kubernetes\", \"v1.37.0\").",
                        &format!("release_set(\"kubernetes\", \"{kubernetes}\")."),
                    )
            } else {
                text.to_string()
            };
            (name.to_string(), text)
        })
        .collect();
    let versions = files.iter().find(|(n, _)| n.ends_with("versions.rules")).unwrap().1.clone();
    let line = move |needle: &str| versions.lines().position(|l| l.starts_with(needle)).unwrap() + 1;
    let planner = runtime::plan::Planner::new(&files, render::embedded::OPERATIONS_PROGRAM, render::embedded::MESSAGES);
    (planner.err().map(|e| e.to_string()), line)
}

/// A release set that names versions no fact covers does not load: every problem names the
/// fact's file, line and column, and why.
#[test]
fn a_release_set_no_fact_covers_is_a_load_error_naming_the_fact() {
    let (e, line) = load_with("v1.16.2", "v1.37.0");
    let e = e.expect("a release set of an unknown Talos loaded");
    let at = line("release_set(\"talos\"");
    let talos = format!("versions.rules:{at}:1: release_set(\"talos\", \"v1.16.2\"): not a Talos release");
    assert!(e.contains(&talos), "{e}\nwanted: {talos}");
    assert!(e.contains("no talos_supports row for its minor"), "{e}");
    let (e, line) = load_with("v1.14.6", "v1.31.0");
    let e = e.expect("a release set of a Kubernetes its Talos does not run loaded");
    let at = line("release_set(\"kubernetes\"");
    let kube = format!(
        "versions.rules:{at}:1: release_set(\"kubernetes\", \"v1.31.0\"): Talos v1.14.6 of the release set runs Kubernetes 1.32 to 1.37"
    );
    assert!(e.contains(&kube), "{e}\nwanted: {kube}");
    assert!(load_with("v1.14.6", "v1.37.0").0.is_none());
}
