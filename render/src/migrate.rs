//! The move from the legacy v1alpha1 fields to the v1.14 documents (issue 29): `ichor config
//! migrate` and `config diff` telling a move from a change.
//!
//! The rules decide (rules/migrate.rules: which groups move, which stay and why, what needs a
//! decision); this module performs what they derived, on plain values, and decides nothing.
//! Start at `Classifier::migrate` (classify.rs), which states the facts and evaluates, then
//! `perform` here (the moves, done on a copy) and `Table::moves_in` (which changes of a diff
//! are moves with the same value, for the classification). Pure: no I/O.

use crate::config::{Config, Doc};
use crate::diff::{Change, Op};
use crate::path::{Path, Seg};
use serde_yaml::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A legacy list whose elements each become a named document: the list, the kind, the element
/// fields and the document fields they move to, the group.
pub type EachMove = (Path, String, Vec<(String, String)>, String);

/// The rules' tables of where each legacy field lives in the documents (evaluated once, at
/// load), for telling moves in a diff.
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// Legacy subtree, its document path, its group.
    pub moved: Vec<(Path, Path, String)>,
    /// Legacy boolean, the document field holding its opposite, its group.
    pub negated: Vec<(Path, Path, String)>,
    /// Legacy base64 text, the document field holding the text decoded, its group.
    pub decoded: Vec<(Path, Path, String)>,
    /// Legacy list, the kind each element becomes, the element fields and where they go, its group.
    pub each: Vec<EachMove>,
    /// Legacy leaf the document's presence says, with its value (as text), its group.
    pub implied: Vec<(Path, String, String)>,
    /// Document leaf the legacy form implied, with its value (as text), its group.
    pub added: Vec<(Path, String, String)>,
}

/// What the rules decided for one config (rules/migrate.rules outputs), decoded.
#[derive(Clone, Debug, Default)]
pub struct Decisions {
    /// Subtrees to move unchanged: from, to, group.
    pub moves: Vec<(Path, Path, String)>,
    /// Booleans to move negated: from, to, group.
    pub negated: Vec<(Path, Path, String)>,
    /// Base64 text to move decoded: from, to, group.
    pub decoded: Vec<(Path, Path, String)>,
    /// Lists whose elements become named documents: list, kind, fields, group.
    pub each: Vec<EachMove>,
    /// Legacy leaves the documents' presence says: leaf, group.
    pub drops: Vec<(Path, String)>,
    /// Document leaves the legacy form implied: path, value.
    pub adds: Vec<(Path, String)>,
    /// Fields kept in the v1alpha1 document: group, leaf, why.
    pub kept: Vec<Kept>,
    /// What needs a decision.
    pub findings: Vec<Finding>,
    /// Nothing moves.
    pub nothing: bool,
}

/// A legacy field kept in the v1alpha1 document.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Kept {
    /// The group that stays with it (a document kind).
    pub group: String,
    /// The field that has no home.
    pub leaf: String,
    /// Why.
    pub why: String,
}

/// A behaviour that changes with the move, or a choice the migration leaves to the operator.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// A CamelCase code (`AuthenticationConfigNeeded`).
    pub code: String,
    /// The path it is about.
    pub at: String,
    /// What changes and what to decide.
    pub message: String,
}

/// One move performed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Moved {
    /// The legacy path.
    pub from: String,
    /// The document path.
    pub to: String,
    /// How: `moved`, `negated`, `decoded` (base64 text written decoded), `element` (a list element become a document), `implied` (said
    /// by the document's presence), `added` (made explicit).
    pub how: &'static str,
}

/// A legacy value whose document field is already set to something else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The legacy path.
    pub legacy: String,
    /// Its value, shown (`<redacted>` for a secret).
    pub legacy_value: String,
    /// The document path.
    pub document: String,
    /// The document's value, shown.
    pub document_value: String,
}

/// A migration's result: the config in document form and everything the operator must read.
#[derive(Clone, Debug, Default)]
pub struct Migration {
    /// The migrated config (with a conflict, the documents' values win; written only with `--force`).
    pub config: Config,
    /// Every move, in path order.
    pub moved: Vec<Moved>,
    /// Fields kept in the v1alpha1 document, and why.
    pub kept: Vec<Kept>,
    /// What needs a decision.
    pub findings: Vec<Finding>,
    /// Legacy values whose document field holds another value.
    pub conflicts: Vec<Conflict>,
    /// What Talos would refuse in the migrated config (its words, and where).
    pub rejected: Vec<crate::vocab::Rejection>,
    /// Nothing moved: the config is in document form already, or every group stays.
    pub nothing: bool,
}

/// The shown form of a value: YAML on one line, `<redacted>` for a secret.
fn shown(v: &Value, secret: bool) -> String {
    if secret { "<redacted>".into() } else { crate::diff::short(v) }
}

fn with(p: &Path, rest: &[Seg]) -> Path {
    let mut out = p.clone();
    out.segs.extend_from_slice(rest);
    out
}

/// The text a leaf's value compares as (`true`, `80`, `none`), for scalars.
pub fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The text a base64 string decodes to, when it is base64 of UTF-8 text.
pub fn base64_text(v: &Value) -> Option<String> {
    use base64::Engine as _;
    let s = v.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s.trim()).ok()?;
    String::from_utf8(bytes).ok()
}

/// The document a path lives in (its kind and name) and the path inside it.
fn split_doc(p: &Path) -> Option<(String, Option<String>, &[Seg])> {
    let Some(Seg::Field(kind)) = p.segs.first() else { return None };
    match p.segs.get(1) {
        Some(Seg::Name(n)) => Some((kind.clone(), Some(n.clone()), &p.segs[2..])),
        _ => Some((kind.clone(), None, &p.segs[1..])),
    }
}

fn doc_mut<'c>(cfg: &'c mut Config, kind: &str, name: Option<&str>) -> &'c mut Doc {
    let pos = cfg.docs.iter().position(|d| d.kind.as_deref() == Some(kind) && d.name.as_deref() == name);
    let i = match pos {
        Some(i) => i,
        None => {
            let mut m = serde_yaml::Mapping::new();
            m.insert("apiVersion".into(), "v1alpha1".into());
            m.insert("kind".into(), kind.into());
            if let Some(n) = name {
                m.insert("name".into(), n.into());
            }
            cfg.docs.push(Doc {
                kind: Some(kind.into()),
                name: name.map(Into::into),
                value: Value::Mapping(m),
                line: 0,
            });
            cfg.docs.len() - 1
        }
    };
    &mut cfg.docs[i]
}

/// The value at a document path, when set.
fn doc_get<'c>(cfg: &'c Config, p: &Path) -> Option<&'c Value> {
    let (kind, name, inner) = split_doc(p)?;
    let d = cfg.docs.iter().find(|d| d.kind.as_deref() == Some(&kind) && d.name == name)?;
    crate::config::get(&d.value, inner)
}

fn legacy_get<'c>(cfg: &'c Config, p: &Path) -> Option<&'c Value> {
    crate::config::get(&cfg.v1alpha1()?.value, &p.segs)
}

fn legacy_remove(cfg: &mut Config, p: &Path) {
    if let Some(d) = cfg.docs.iter_mut().find(|d| d.kind.is_none()) {
        crate::config::set(&mut d.value, &p.segs, None);
    }
}

/// Performs the rules' decisions on a copy of `cfg`. `secret` says which paths hold secrets
/// (their values are never shown). A document field already set to another value is a
/// conflict: the document's value is kept and the legacy one dropped.
pub fn perform(cfg: &Config, d: &Decisions, secret: &dyn Fn(&Path) -> bool) -> Migration {
    let mut out = cfg.clone();
    let mut moved = vec![];
    let mut conflicts = vec![];
    // (legacy path, document path, value to write)
    let mut writes: Vec<(Path, Path, Value, &'static str)> = vec![];
    for (from, to, _) in &d.moves {
        if let Some(v) = legacy_get(cfg, from) {
            writes.push((from.clone(), to.clone(), v.clone(), "moved"));
        }
    }
    for (from, to, _) in &d.negated {
        if let Some(Value::Bool(b)) = legacy_get(cfg, from) {
            writes.push((from.clone(), to.clone(), Value::Bool(!b), "negated"));
        }
    }
    // A value that does not decode stays where it is, said as a conflict with itself.
    let mut undecodable = BTreeSet::new();
    for (from, to, _) in &d.decoded {
        match legacy_get(cfg, from).map(|v| (v, base64_text(v))) {
            Some((_, Some(text))) => writes.push((from.clone(), to.clone(), Value::String(text), "decoded")),
            Some((v, None)) => {
                undecodable.insert(from.clone());
                conflicts.push(Conflict {
                    legacy: from.to_string(),
                    legacy_value: shown(v, secret(from)),
                    document: to.to_string(),
                    document_value: "(not written: the legacy value is not base64-encoded text)".into(),
                });
            }
            None => {}
        }
    }
    for (list, kind, fields, _) in &d.each {
        let Some(Value::Sequence(items)) = legacy_get(cfg, list) else { continue };
        for (i, item) in items.iter().enumerate() {
            let elem = list.child_index(i);
            let Some(name) = item.get("name").and_then(scalar_text) else { continue };
            let base = Path { segs: vec![Seg::Field(kind.clone()), Seg::Name(name.clone())] };
            moved.push(Moved { from: elem.child_key("name").to_string(), to: base.to_string(), how: "element" });
            for (f, t) in fields {
                if let Some(v) = item.get(f.as_str()) {
                    writes.push((elem.child_key(f), base.child_key(t), v.clone(), "element"));
                }
            }
            // The document for an element with nothing but its name.
            doc_mut(&mut out, kind, Some(&name));
        }
    }
    for (from, to, v, how) in writes {
        match doc_get(&out, &to) {
            Some(existing) if *existing != v => conflicts.push(Conflict {
                legacy: from.to_string(),
                legacy_value: shown(&v, secret(&from)),
                document: to.to_string(),
                document_value: shown(existing, secret(&to)),
            }),
            _ => {
                if let Some((kind, name, inner)) = split_doc(&to) {
                    let doc = doc_mut(&mut out, &kind, name.as_deref());
                    crate::config::set(&mut doc.value, inner, Some(v));
                }
                moved.push(Moved { from: from.to_string(), to: to.to_string(), how });
            }
        }
    }
    for (leaf, group) in &d.drops {
        moved.push(Moved { from: leaf.to_string(), to: group.clone(), how: "implied" });
    }
    for (path, value) in &d.adds {
        if doc_get(&out, path).is_none()
            && let Some((kind, name, inner)) = split_doc(path)
        {
            let doc = doc_mut(&mut out, &kind, name.as_deref());
            crate::config::set(&mut doc.value, inner, Some(Value::String(value.clone())));
            moved.push(Moved { from: String::new(), to: path.to_string(), how: "added" });
        }
    }
    // The legacy side goes last, so that every read above saw the original.
    let removed: BTreeSet<Path> = d
        .moves
        .iter()
        .chain(&d.negated)
        .chain(&d.decoded)
        .map(|(f, _, _)| f.clone())
        .filter(|f| !undecodable.contains(f))
        .chain(d.each.iter().map(|(l, ..)| l.clone()))
        .chain(d.drops.iter().map(|(l, _)| l.clone()))
        .collect();
    for p in &removed {
        legacy_remove(&mut out, p);
    }
    // A legacy document left empty (a patch whose every field moved) is dropped.
    out.docs.retain(|doc| doc.kind.is_some() || doc.value.as_mapping().is_some_and(|m| !m.is_empty()));
    moved.sort();
    let mut kept = d.kept.clone();
    kept.sort();
    let mut findings = d.findings.clone();
    findings.sort();
    Migration { config: out, moved, kept, findings, conflicts, rejected: vec![], nothing: d.nothing }
}

impl Table {
    /// The groups' document kinds (the first segment of their targets).
    fn kinds(&self, group: &str) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = BTreeSet::new();
        for (_, to, g) in self.moved.iter().chain(&self.negated).chain(&self.decoded) {
            if g == group
                && let Some(Seg::Field(k)) = to.segs.first()
            {
                out.insert(k.clone());
            }
        }
        for (_, kind, _, g) in &self.each {
            if g == group {
                out.insert(kind.clone());
            }
        }
        out
    }

    /// Which changes of a diff are moves with the same value: each such change's index and the
    /// other end of its move (the document path of a legacy field, or the legacy path of a
    /// document field; `(implied by the legacy form)` for a document field the legacy form said).
    pub fn moves_in(&self, changes: &[Change]) -> BTreeMap<usize, String> {
        let added: BTreeMap<&Path, usize> =
            changes.iter().enumerate().filter(|(_, c)| c.op == Op::Added).map(|(i, c)| (&c.path, i)).collect();
        let removed: BTreeMap<&Path, usize> =
            changes.iter().enumerate().filter(|(_, c)| c.op == Op::Removed).map(|(i, c)| (&c.path, i)).collect();
        let mut out = BTreeMap::new();
        let mut groups_moved: BTreeSet<&str> = BTreeSet::new();
        let pair = |out: &mut BTreeMap<usize, String>, i: usize, j: usize| {
            out.insert(i, changes[j].path.to_string());
            out.insert(j, changes[i].path.to_string());
        };
        for (&p, &i) in &removed {
            let old = changes[i].old.as_ref();
            for (from, to, g) in &self.moved {
                if p.segs.starts_with(&from.segs) {
                    let target = with(to, &p.segs[from.segs.len()..]);
                    if let Some(&j) = added.get(&target)
                        && changes[j].new.as_ref() == old
                    {
                        pair(&mut out, i, j);
                        groups_moved.insert(g);
                    }
                }
            }
            for (from, to, g) in &self.negated {
                if let (true, Some(Value::Bool(b)), Some(&j)) = (p == from, old, added.get(to))
                    && changes[j].new == Some(Value::Bool(!b))
                {
                    pair(&mut out, i, j);
                    groups_moved.insert(g);
                }
            }
            for (from, to, g) in &self.decoded {
                if let (true, Some(old), Some(&j)) = (p == from, old, added.get(to))
                    && base64_text(old)
                        .is_some_and(|t| changes[j].new.as_ref().and_then(Value::as_str) == Some(t.as_str()))
                {
                    pair(&mut out, i, j);
                    groups_moved.insert(g);
                }
            }
            for (list, kind, fields, g) in &self.each {
                let n = list.segs.len();
                let (true, Some(Seg::Index(k))) = (p.segs.starts_with(&list.segs), p.segs.get(n)) else {
                    continue;
                };
                let elem = list.child_index(*k);
                let name =
                    removed.get(&elem.child_key("name")).and_then(|&r| changes[r].old.as_ref()).and_then(scalar_text);
                let Some(name) = name else { continue };
                let base = Path { segs: vec![Seg::Field(kind.clone()), Seg::Name(name)] };
                for (f, t) in fields {
                    let field = elem.child_key(f);
                    if p.segs.starts_with(&field.segs) {
                        let target = with(&base.child_key(t), &p.segs[field.segs.len()..]);
                        if let Some(&j) = added.get(&target)
                            && changes[j].new.as_ref() == old
                        {
                            pair(&mut out, i, j);
                            groups_moved.insert(g);
                        }
                    }
                }
                // The element's name is the document's name.
                if p.segs.len() == n + 2 && p.segs[n + 1] == Seg::Field("name".into()) {
                    let doc_there = changes.iter().any(|c| c.op == Op::Added && c.path.segs.starts_with(&base.segs));
                    if doc_there {
                        out.insert(i, base.to_string());
                    }
                }
            }
        }
        // Said by a document's presence, or made explicit: only beside a move of their group.
        for (leaf, value, g) in &self.implied {
            let Some(&i) = removed.get(leaf) else { continue };
            let same = changes[i].old.as_ref().and_then(scalar_text).as_deref() == Some(value.as_str());
            let kinds = self.kinds(g);
            let doc_added = changes
                .iter()
                .any(|c| c.op == Op::Added && matches!(c.path.segs.first(), Some(Seg::Field(k)) if kinds.contains(k)));
            if same && (groups_moved.contains(g.as_str()) || doc_added) {
                out.insert(
                    i,
                    format!("(said by the {} document's presence)", kinds.into_iter().next().unwrap_or_default()),
                );
            }
        }
        for (path, value, g) in &self.added {
            let Some(&j) = added.get(path) else { continue };
            let same = changes[j].new.as_ref().and_then(scalar_text).as_deref() == Some(value.as_str());
            if same && groups_moved.contains(g.as_str()) {
                out.insert(j, "(implied by the legacy form)".into());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Path {
        Path::parse(s).unwrap()
    }

    fn table() -> Table {
        Table {
            moved: vec![(p("machine.time.servers"), p("TimeSyncConfig.ntp.servers"), "TimeSyncConfig".into())],
            negated: vec![(p("cluster.proxy.disabled"), p("KubeProxyConfig.enabled"), "KubeProxyConfig".into())],
            decoded: vec![(
                p("cluster.ca.crt"),
                p("KubeAPIServerCAConfig.acceptedCAs[0]"),
                "KubeAPIServerCAConfig".into(),
            )],
            each: vec![(
                p("cluster.inlineManifests"),
                "KubeInlineManifestConfig".into(),
                vec![("contents".into(), "manifest".into())],
                "KubeInlineManifestConfig".into(),
            )],
            implied: vec![],
            added: vec![],
        }
    }

    #[test]
    fn a_move_with_the_same_value_is_told_from_a_change() {
        let old = Config::parse(
            "machine:\n  time:\n    servers: [a.example]\ncluster:\n  proxy:\n    disabled: true\n  inlineManifests:\n    - name: cilium\n      contents: x\n",
        )
        .unwrap();
        let new = Config::parse(
            "machine: {type: worker}\n---\napiVersion: v1alpha1\nkind: TimeSyncConfig\nntp:\n  servers: [a.example]\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: false\n---\napiVersion: v1alpha1\nkind: KubeInlineManifestConfig\nname: cilium\nmanifest: x\n",
        )
        .unwrap();
        let changes = crate::diff::changes(&old, &new);
        let moves = table().moves_in(&changes);
        let moved: Vec<String> = moves.keys().map(|&i| changes[i].path.to_string()).collect();
        assert!(moved.contains(&"machine.time.servers[0]".to_string()), "{moved:?}");
        assert!(moved.contains(&"TimeSyncConfig.ntp.servers[0]".to_string()));
        assert!(moved.contains(&"cluster.proxy.disabled".to_string()));
        assert!(moved.contains(&"KubeInlineManifestConfig[cilium].manifest".to_string()));
        assert!(moved.contains(&"cluster.inlineManifests[0].name".to_string()));
        // machine.type was added: a change, not a move.
        assert!(!moved.contains(&"machine.type".to_string()));
    }

    #[test]
    fn base64_text_moves_decoded_and_other_text_does_not() {
        // "-----BEGIN X-----\n" in base64.
        let old = Config::parse("cluster:\n  ca:\n    crt: LS0tLS1CRUdJTiBYLS0tLS0K\n").unwrap();
        let new = Config::parse(
            "apiVersion: v1alpha1\nkind: KubeAPIServerCAConfig\nacceptedCAs:\n  - |\n    -----BEGIN X-----\n",
        )
        .unwrap();
        let changes = crate::diff::changes(&old, &new);
        assert_eq!(table().moves_in(&changes).len(), 2, "{changes:?}");
        let other = Config::parse(
            "apiVersion: v1alpha1\nkind: KubeAPIServerCAConfig\nacceptedCAs: [LS0tLS1CRUdJTiBYLS0tLS0K]\n",
        )
        .unwrap();
        assert!(
            table().moves_in(&crate::diff::changes(&old, &other)).is_empty(),
            "the base64 text itself is another value"
        );
        let d = Decisions {
            decoded: vec![(
                p("cluster.ca.crt"),
                p("KubeAPIServerCAConfig.acceptedCAs[0]"),
                "KubeAPIServerCAConfig".into(),
            )],
            ..Decisions::default()
        };
        let m = perform(&old, &d, &|_: &Path| false);
        assert_eq!(
            m.config.leaves().get(&p("KubeAPIServerCAConfig.acceptedCAs[0]")),
            Some(&Value::String("-----BEGIN X-----\n".into()))
        );
        let bad = Config::parse("cluster:\n  ca:\n    crt: not base64!\n").unwrap();
        let m = perform(&bad, &d, &|_: &Path| false);
        assert_eq!(m.conflicts.len(), 1);
        assert!(m.config.leaves().contains_key(&p("cluster.ca.crt")), "a value that does not decode stays");
    }

    #[test]
    fn another_value_is_not_a_move() {
        let old = Config::parse("machine:\n  time:\n    servers: [a.example]\n").unwrap();
        let new = Config::parse("apiVersion: v1alpha1\nkind: TimeSyncConfig\nntp:\n  servers: [b.example]\n").unwrap();
        let changes = crate::diff::changes(&old, &new);
        assert!(table().moves_in(&changes).is_empty());
    }

    #[test]
    fn perform_moves_keeps_and_reports_a_conflict_redacted() {
        let cfg = Config::parse(
            "machine:\n  time:\n    servers: [a.example]\ncluster:\n  secret: s3cret\n---\napiVersion: v1alpha1\nkind: DiscoveryIdentityConfig\nclusterSecret: other\n",
        )
        .unwrap();
        let d = Decisions {
            moves: vec![
                (p("machine.time.servers"), p("TimeSyncConfig.ntp.servers"), "TimeSyncConfig".into()),
                (p("cluster.secret"), p("DiscoveryIdentityConfig.clusterSecret"), "DiscoveryServiceConfig".into()),
            ],
            ..Decisions::default()
        };
        let m = perform(&cfg, &d, &|q: &Path| q.to_string().contains("ecret"));
        let yaml = m.config.to_yaml();
        assert!(yaml.contains("kind: TimeSyncConfig") && yaml.contains("a.example"), "{yaml}");
        assert!(!yaml.contains("time:"), "{yaml}");
        assert_eq!(m.conflicts.len(), 1);
        assert_eq!(m.conflicts[0].legacy_value, "<redacted>");
        assert_eq!(m.conflicts[0].document_value, "<redacted>");
        assert!(!format!("{:?}", m.conflicts).contains("s3cret"));
    }
}
