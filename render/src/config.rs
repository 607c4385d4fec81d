//! A Talos machine configuration: the legacy `v1alpha1` document plus typed documents.
//!
//! Start at `Config::parse`. Documents are split on `---` lines so that every error names the
//! line (and column) in the whole file. A typed document is identified by `kind` and, for
//! named kinds, `name`; the v1alpha1 document is the one with `version`/`machine`/`cluster`/
//! `debug`/`persist` keys and no `kind`. Duplicate documents, non-mapping documents, empty
//! files and files over `MAX_CONFIG_BYTES` are refused. `Config::leaves` enumerates every
//! leaf path with its value.

use crate::path::{Path, Seg};
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::fmt;

/// 10 MiB: a machine configuration is a few KiB; anything this large is not one.
pub const MAX_CONFIG_BYTES: usize = 10 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq)]
/// One document of a Talos config.
pub struct Doc {
    /// `None` for the v1alpha1 document.
    pub kind: Option<String>,
    /// The document's name, for a named kind (`LinkConfig` `eth0`).
    pub name: Option<String>,
    /// The document, as YAML.
    pub value: Value,
    /// 1-based line where the document starts.
    pub line: usize,
}

impl Doc {
    /// `v1alpha1`, `KubeProxyConfig`, `LinkConfig[eth0]`.
    pub fn id(&self) -> String {
        match (&self.kind, &self.name) {
            (None, _) => "v1alpha1".into(),
            (Some(k), None) => k.clone(),
            (Some(k), Some(n)) => Path { segs: vec![Seg::Field(k.clone()), Seg::Name(n.clone())] }.to_string(),
        }
    }

    /// The path of the document itself (none for v1alpha1, whose fields start at the root).
    pub fn base(&self) -> Option<Path> {
        let kind = self.kind.as_ref()?;
        let mut p = Path::root(kind);
        if let Some(n) = &self.name {
            p.segs.push(Seg::Name(n.clone()));
        }
        Some(p)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
/// A Talos machine config: its documents, in order.
pub struct Config {
    /// The documents.
    pub docs: Vec<Doc>,
}

/// A problem with a config file, with its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The line, 1-based.
    pub line: usize,
    /// The column, 1-based.
    pub col: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.col, self.message)
    }
}

/// Top-level keys that make an untyped document the v1alpha1 one.
pub(crate) const V1ALPHA1_KEYS: [&str; 5] = ["version", "machine", "cluster", "debug", "persist"];

impl Config {
    /// Parses a multi-document config; every problem found is returned.
    pub fn parse(text: &str) -> Result<Config, Vec<ConfigError>> {
        if text.len() > MAX_CONFIG_BYTES {
            return Err(vec![ConfigError {
                line: 1,
                col: 1,
                message: format!(
                    "the file is {} bytes, over the {MAX_CONFIG_BYTES}-byte (10 MiB) limit for a machine configuration",
                    text.len()
                ),
            }]);
        }
        let mut errors = vec![];
        let mut docs: Vec<Doc> = vec![];
        // Split on document separators, remembering where each chunk starts.
        for (start, chunk) in crate::yaml::split_documents(text) {
            // Bounded after aliases expand, merge keys resolved, tags refused, keys made text.
            let value: Value = match crate::yaml::parse(&chunk, MAX_CONFIG_BYTES) {
                Ok(v) => v,
                Err(e) => {
                    let (line, col) = (e.line.map_or(start, |l| start + l - 1), e.col.unwrap_or(1));
                    let what = if e.line.is_some() { "not valid YAML: " } else { "" };
                    errors.push(ConfigError { line, col, message: format!("{what}{}", e.message) });
                    continue;
                }
            };
            if value.is_null() {
                continue; // an empty document (a leading `---`, or comments only)
            }
            let first = first_content_line(&chunk).map_or(start, |l| start + l);
            let Value::Mapping(map) = &value else {
                errors.push(ConfigError {
                    line: first,
                    col: 1,
                    message: format!("a config document must be a mapping, found {}", kind_of(&value)),
                });
                continue;
            };
            let get = |k: &str| map.get(Value::String(k.into()));
            let doc = match get("kind") {
                Some(Value::String(kind)) => {
                    let name = match get("name") {
                        Some(Value::String(n)) => Some(n.clone()),
                        Some(other) => {
                            errors.push(ConfigError {
                                line: first,
                                col: 1,
                                message: format!(
                                    "`name` of a {kind} document must be a string, found {}",
                                    kind_of(other)
                                ),
                            });
                            continue;
                        }
                        None => None,
                    };
                    Doc { kind: Some(kind.clone()), name, value: value.clone(), line: first }
                }
                Some(other) => {
                    errors.push(ConfigError {
                        line: first,
                        col: 1,
                        message: format!("`kind` must be a string, found {}", kind_of(other)),
                    });
                    continue;
                }
                None if V1ALPHA1_KEYS.iter().any(|k| get(k).is_some()) => {
                    Doc { kind: None, name: None, value: value.clone(), line: first }
                }
                None => {
                    errors.push(ConfigError {
                        line: first,
                        col: 1,
                        message: "the document is neither a typed document (it has no `kind`) nor the v1alpha1 config (no `version`, `machine` or `cluster`)".into(),
                    });
                    continue;
                }
            };
            if let Some(prev) = docs.iter().find(|d| d.kind == doc.kind && d.name == doc.name) {
                let what = if doc.kind.is_none() {
                    "duplicate v1alpha1 document".to_string()
                } else {
                    format!("duplicate document {}", doc.id())
                };
                errors.push(ConfigError {
                    line: doc.line,
                    col: 1,
                    message: format!("{what} (first at line {}): Talos refuses a config with two", prev.line),
                });
                continue;
            }
            docs.push(doc);
        }
        if docs.is_empty() && errors.is_empty() {
            errors.push(ConfigError { line: 1, col: 1, message: "the file holds no config document".into() });
        }
        if errors.is_empty() { Ok(Config { docs }) } else { Err(errors) }
    }

    /// The legacy `v1alpha1` document, when the config has one.
    pub fn v1alpha1(&self) -> Option<&Doc> {
        self.docs.iter().find(|d| d.kind.is_none())
    }

    /// `machine.type` of the v1alpha1 document (`controlplane`, `worker`, `init`), if set.
    pub fn machine_type(&self) -> Option<&str> {
        self.v1alpha1()?.value.get("machine")?.get("type")?.as_str()
    }

    /// Every leaf path and its value; an empty mapping or list is a leaf itself. Identity keys
    /// of typed documents (`apiVersion`, `kind`, `name`) are not paths.
    pub fn leaves(&self) -> BTreeMap<Path, Value> {
        let mut out = BTreeMap::new();
        for d in &self.docs {
            let Value::Mapping(map) = &d.value else {
                continue;
            };
            let base = d.base();
            for (k, v) in map {
                let Some(key) = key_text(k) else { continue };
                if d.kind.is_some() && matches!(key.as_str(), "apiVersion" | "kind" | "name") {
                    continue;
                }
                let p = match &base {
                    Some(b) => b.child_key(&key),
                    None => Path::root(&key),
                };
                walk(&p, v, &mut out);
            }
            if let (Some(b), true) = (&base, map.len() <= 2 + usize::from(d.name.is_some())) {
                // A document with nothing but its identity is still a change when added.
                out.insert(b.clone(), Value::Mapping(Default::default()));
            }
        }
        out
    }
}

fn first_content_line(chunk: &str) -> Option<usize> {
    chunk.lines().position(|l| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#')
    })
}

fn key_text(k: &Value) -> Option<String> {
    match k {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn walk(path: &Path, v: &Value, out: &mut BTreeMap<Path, Value>) {
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            for (k, x) in m {
                if let Some(key) = key_text(k) {
                    walk(&path.child_key(&key), x, out);
                }
            }
        }
        Value::Sequence(s) if !s.is_empty() => {
            for (i, x) in s.iter().enumerate() {
                walk(&path.child_index(i), x, out);
            }
        }
        Value::Tagged(t) => walk(path, &t.value, out),
        _ => {
            out.insert(path.clone(), v.clone());
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// Changing only some paths of a config: the executor applies a step's paths, not the whole
/// render (the upgrade changes one stage's images at a time).
impl Config {
    /// The document a path lives in, in `self`: its index and the path's segments inside it.
    fn locate<'p>(&self, p: &'p Path) -> Option<(usize, &'p [Seg])> {
        let typed = self.docs.iter().enumerate().find_map(|(i, d)| {
            let base = d.base()?;
            p.segs.starts_with(&base.segs).then(|| (i, &p.segs[base.segs.len()..]))
        });
        // A path whose first segment is capitalized names a typed document (`KubeletConfig`);
        // the v1alpha1 document's fields are lower-case (`machine`, `cluster`).
        let is_typed = matches!(p.segs.first(), Some(Seg::Field(k)) if k.starts_with(|c: char| c.is_ascii_uppercase()));
        if is_typed {
            return typed;
        }
        typed.or_else(|| self.docs.iter().position(|d| d.kind.is_none()).map(|i| (i, &p.segs[..])))
    }

    /// This config with each of `paths` set as `desired` has it (removed where `desired` has
    /// none); a document `desired` adds is added with its identity. Everything else is kept.
    pub fn with_paths(&self, desired: &Config, paths: &[Path]) -> Config {
        let mut out = self.clone();
        for p in paths {
            let wanted = desired.locate(p).and_then(|(i, segs)| get(&desired.docs[i].value, segs).cloned());
            let (i, segs) = match out.locate(p) {
                Some(found) => found,
                None => {
                    // A document the desired config adds: its identity first.
                    let Some((di, _)) = desired.locate(p) else { continue };
                    let d = &desired.docs[di];
                    let mut identity = serde_yaml::Mapping::new();
                    if let Value::Mapping(m) = &d.value {
                        for k in ["apiVersion", "kind", "name"] {
                            if let Some(v) = m.get(k) {
                                identity.insert(Value::String(k.into()), v.clone());
                            }
                        }
                    }
                    out.docs.push(Doc {
                        kind: d.kind.clone(),
                        name: d.name.clone(),
                        value: Value::Mapping(identity),
                        line: 0,
                    });
                    match out.locate(p) {
                        Some(found) => found,
                        None => continue,
                    }
                }
            };
            set(&mut out.docs[i].value, segs, wanted);
        }
        out
    }

    /// The config as multi-document YAML.
    pub fn to_yaml(&self) -> String {
        self.docs.iter().map(|d| serde_yaml::to_string(&d.value).unwrap_or_default()).collect::<Vec<_>>().join("---\n")
    }
}

fn key(s: &Seg) -> Option<Value> {
    match s {
        Seg::Field(k) | Seg::Key(k) | Seg::Name(k) => Some(Value::String(k.clone())),
        Seg::Index(_) => None,
    }
}

/// The value at `segs` inside a document's value.
pub(crate) fn get<'v>(v: &'v Value, segs: &[Seg]) -> Option<&'v Value> {
    let Some((first, rest)) = segs.split_first() else { return Some(v) };
    let next = match first {
        Seg::Index(i) => v.as_sequence()?.get(*i)?,
        s => v.as_mapping()?.get(key(s)?)?,
    };
    get(next, rest)
}

/// Sets (or with `None` removes, pruning parents it empties) the value at `segs`.
pub(crate) fn set(v: &mut Value, segs: &[Seg], to: Option<Value>) {
    let Some((first, rest)) = segs.split_first() else {
        if let Some(t) = to {
            *v = t;
        }
        return;
    };
    match first {
        Seg::Index(i) => {
            if !v.is_sequence() {
                if to.is_none() {
                    return;
                }
                *v = Value::Sequence(vec![]);
            }
            let Some(seq) = v.as_sequence_mut() else { return };
            if rest.is_empty() && to.is_none() {
                if *i < seq.len() {
                    seq.remove(*i);
                }
                return;
            }
            while seq.len() <= *i {
                seq.push(Value::Null);
            }
            set(&mut seq[*i], rest, to);
        }
        s => {
            let Some(k) = key(s) else { return };
            if !v.is_mapping() {
                if to.is_none() {
                    return;
                }
                *v = Value::Mapping(Default::default());
            }
            let Some(m) = v.as_mapping_mut() else { return };
            if rest.is_empty() && to.is_none() {
                m.remove(&k);
                return;
            }
            if !m.contains_key(&k) {
                if to.is_none() {
                    return;
                }
                m.insert(k.clone(), Value::Null);
            }
            let removing = to.is_none();
            if let Some(child) = m.get_mut(&k) {
                set(child, rest, to);
                // A removal that empties its parent removes the parent too (an empty mapping is
                // not the absent one: Talos 1.13 compares them as different).
                let emptied = match child {
                    Value::Mapping(c) => c.is_empty(),
                    Value::Sequence(c) => c.is_empty(),
                    _ => false,
                };
                if removing && emptied {
                    m.remove(&k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_and_leaves() {
        let c = Config::parse(
            "version: v1alpha1\nmachine:\n  type: worker\n  nodeLabels:\n    node.kubernetes.io/x: \"\"\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\nmtu: 9000\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: false\n",
        )
        .unwrap();
        assert_eq!(c.docs.len(), 3);
        assert_eq!(c.docs[1].line, 7);
        let leaves: Vec<String> = c.leaves().keys().map(|p| p.to_string()).collect();
        assert_eq!(
            leaves,
            vec![
                "KubeProxyConfig.enabled",
                "LinkConfig[eth0].mtu",
                "machine.nodeLabels[\"node.kubernetes.io/x\"]",
                "machine.type",
                "version"
            ]
        );
        assert_eq!(c.machine_type(), Some("worker"));
    }

    #[test]
    fn errors_have_positions() {
        let e = Config::parse("version: v1alpha1\n---\nkind: A\n---\nkind: A\n").unwrap_err();
        assert_eq!(e[0].to_string(), "5:1: duplicate document A (first at line 3): Talos refuses a config with two");
        let e = Config::parse("machine:\n  type: [worker\n").unwrap_err();
        assert_eq!(e[0].line, 3, "{}", e[0]);
        let e = Config::parse("").unwrap_err();
        assert_eq!(e[0].message, "the file holds no config document");
        let e = Config::parse("version: v1alpha1\n---\n- a\n- b\n").unwrap_err();
        assert_eq!(e[0].to_string(), "3:1: a config document must be a mapping, found a list");
    }
}
