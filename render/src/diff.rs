//! Changed paths between two configs, and the redacted unified diff of their documents.
//!
//! Start at `changes` (every leaf path added, removed or changed, sorted by path) and
//! `unified` (the two configs re-serialized with sensitive values replaced by `<redacted>`,
//! then a unified diff). Which paths are sensitive is the caller's answer (field metadata).

use crate::config::Config;
use crate::path::Path;
use serde_yaml::Value;
use std::fmt;

pub const REDACTED: &str = "<redacted>";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Added,
    Removed,
    Changed,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Added => "added",
            Op::Removed => "removed",
            Op::Changed => "changed",
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub path: Path,
    pub op: Op,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

/// Every leaf that differs between `from` and `to`, sorted by path.
pub fn changes(from: &Config, to: &Config) -> Vec<Change> {
    let a = from.leaves();
    let b = to.leaves();
    let mut out = vec![];
    for (p, old) in &a {
        match b.get(p) {
            None => out.push(Change { path: p.clone(), op: Op::Removed, old: Some(old.clone()), new: None }),
            Some(new) if new != old => {
                out.push(Change { path: p.clone(), op: Op::Changed, old: Some(old.clone()), new: Some(new.clone()) })
            }
            Some(_) => {}
        }
    }
    for (p, new) in &b {
        if !a.contains_key(p) {
            out.push(Change { path: p.clone(), op: Op::Added, old: None, new: Some(new.clone()) });
        }
    }
    out.sort_by(|x, y| x.path.cmp(&y.path));
    out
}

/// The config as YAML, documents separated by `---`, with every leaf for which `sensitive`
/// holds (and every subtree below such a path) replaced by `<redacted>`.
pub fn redacted_yaml(config: &Config, sensitive: &dyn Fn(&Path) -> bool) -> String {
    let mut docs = vec![];
    for d in &config.docs {
        let base = d.base();
        let mut v = d.value.clone();
        if let Value::Mapping(m) = &mut v {
            for (k, x) in m.iter_mut() {
                // Keys are text after `Config::parse`; anything else is hidden, not shown.
                let Some(key) = k.as_str() else {
                    *x = Value::String(REDACTED.into());
                    continue;
                };
                if base.is_some() && matches!(key, "apiVersion" | "kind" | "name") {
                    continue;
                }
                let p = match &base {
                    Some(b) => b.child_key(key),
                    None => Path::root(key),
                };
                redact(&p, x, sensitive);
            }
        }
        docs.push(serde_yaml::to_string(&v).unwrap_or_default());
    }
    docs.join("---\n")
}

fn redact(path: &Path, v: &mut Value, sensitive: &dyn Fn(&Path) -> bool) {
    if sensitive(path) {
        *v = Value::String(REDACTED.into());
        return;
    }
    match v {
        Value::Mapping(m) => {
            for (k, x) in m.iter_mut() {
                match k.as_str() {
                    Some(key) => redact(&path.child_key(key), x, sensitive),
                    // Fail closed: a value whose key cannot be named cannot be checked.
                    None => *x = Value::String(REDACTED.into()),
                }
            }
        }
        Value::Tagged(t) => redact(path, &mut t.value, sensitive),
        Value::Sequence(s) => {
            for (i, x) in s.iter_mut().enumerate() {
                redact(&path.child_index(i), x, sensitive);
            }
        }
        _ => {}
    }
}

/// A unified diff (3 lines of context) between two texts, with file headers.
pub fn unified(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    similar::TextDiff::from_lines(old, new).unified_diff().context_radius(3).header(old_name, new_name).to_string()
}

/// A value on one line, for change lists: scalars as YAML, containers as flow JSON.
pub fn short(v: &Value) -> String {
    match v {
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Null => "null".into(),
        other => serde_json::to_string(other).unwrap_or_else(|_| "?".into()),
    }
}
