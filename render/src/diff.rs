//! Changed paths between two configs, and the redacted unified diff of their documents.
//!
//! Start at `changes` (every leaf path added, removed or changed, sorted by path) and
//! `unified` (the two configs re-serialized with sensitive values replaced by `<redacted>`,
//! then a unified diff). Which paths are sensitive is the caller's answer (field metadata).

use crate::config::Config;
use crate::path::Path;
use serde_yaml::Value;
use std::fmt;

/// What a sensitive value is shown as, everywhere.
pub const REDACTED: &str = "<redacted>";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
/// How a path changed.
pub enum Op {
    /// The path is new.
    Added,
    /// The path is gone.
    Removed,
    /// The path's value changed.
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
/// One changed leaf path between two configs.
pub struct Change {
    /// The path.
    pub path: Path,
    /// How it changed.
    pub op: Op,
    /// Its value before (`None` when added).
    pub old: Option<Value>,
    /// Its value after (`None` when removed).
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
    hidden_yaml(config, sensitive, &|_| Value::String(REDACTED.into()))
}

/// `redacted_yaml`, each sensitive value replaced by what `hide` makes of it (a snapshot keeps
/// a keyed digest, so that two configs of one snapshot still differ where their secrets do). A
/// value whose key cannot be named is always `<redacted>`.
pub fn hidden_yaml(config: &Config, sensitive: &dyn Fn(&Path) -> bool, hide: &dyn Fn(&Value) -> Value) -> String {
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
                redact(&p, x, sensitive, hide);
            }
        }
        docs.push(serde_yaml::to_string(&v).unwrap_or_default());
    }
    docs.join("---\n")
}

/// A sensitive value replaced by a digest of the same shape (what a snapshot keeps, `hidden_yaml`'s
/// `hide`): a mapping or a list keeps its keys and length, an empty or null leaf stays (it holds
/// nothing), standard base64 becomes base64 of as many digest bytes (the rules' `b64_bytes` sees
/// the same length), any other leaf `<sensitive HEX>`. `digest` is the caller's keyed hash: with
/// keys never written, two values of one snapshot compare as the secrets did and nothing more
/// can be had back.
pub fn digested(v: &Value, digest: &dyn Fn(&str) -> u64) -> Value {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    match v {
        Value::Null => Value::Null,
        Value::String(s) if s.is_empty() => v.clone(),
        Value::Mapping(m) => Value::Mapping(m.iter().map(|(k, x)| (k.clone(), digested(x, digest))).collect()),
        Value::Sequence(l) => Value::Sequence(l.iter().map(|x| digested(x, digest)).collect()),
        Value::Tagged(t) => digested(&t.value, digest),
        Value::String(s) => match b64.decode(s.trim()) {
            Ok(bytes) if !bytes.is_empty() => {
                let stream: Vec<u8> = (0..bytes.len().div_ceil(8))
                    .flat_map(|i| digest(&format!("{i}\0{s}")).to_le_bytes())
                    .take(bytes.len())
                    .collect();
                Value::String(b64.encode(stream))
            }
            _ => Value::String(format!("<sensitive {:016x}>", digest(s))),
        },
        other => {
            Value::String(format!("<sensitive {:016x}>", digest(&serde_yaml::to_string(other).unwrap_or_default())))
        }
    }
}

fn redact(path: &Path, v: &mut Value, sensitive: &dyn Fn(&Path) -> bool, hide: &dyn Fn(&Value) -> Value) {
    if sensitive(path) {
        *v = hide(v);
        return;
    }
    match v {
        Value::Mapping(m) => {
            for (k, x) in m.iter_mut() {
                match k.as_str() {
                    Some(key) => redact(&path.child_key(key), x, sensitive, hide),
                    // Fail closed: a value whose key cannot be named cannot be checked.
                    None => *x = Value::String(REDACTED.into()),
                }
            }
        }
        Value::Tagged(t) => redact(path, &mut t.value, sensitive, hide),
        Value::Sequence(s) => {
            for (i, x) in s.iter_mut().enumerate() {
                redact(&path.child_index(i), x, sensitive, hide);
            }
        }
        _ => {}
    }
}

/// A unified diff (3 lines of context) between two texts, with file headers.
pub fn unified(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    unified_past(old, new, old_name, new_name, 10_000)
}

/// `unified`, with the line count past which the middle is one hunk.
fn unified_past(old: &str, new: &str, old_name: &str, new_name: &str, large: usize) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.split_inclusive('\n').collect(), new.split_inclusive('\n').collect());
    // Myers is O((N + M) * D): seconds for a 10^4-element list against another config. Past
    // `large` lines that differ (10^4), the changed middle (after the common first and last
    // lines) is shown as one replacement hunk, which is linear and still a valid unified diff.
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let max_suffix = a.len().min(b.len()) - prefix;
    let suffix = a.iter().rev().zip(b.iter().rev()).take(max_suffix).take_while(|(x, y)| x == y).count();
    let (a_mid, b_mid) = (a.len() - prefix - suffix, b.len() - prefix - suffix);
    if a_mid + b_mid <= large || a_mid == 0 && b_mid == 0 {
        return similar::TextDiff::from_lines(old, new)
            .unified_diff()
            .context_radius(3)
            .header(old_name, new_name)
            .to_string();
    }
    let ctx = 3;
    let start = prefix.saturating_sub(ctx);
    let (a_end, b_end) = ((a.len() - suffix + ctx).min(a.len()), (b.len() - suffix + ctx).min(b.len()));
    // Ranges as `diff -u` writes them: 1-based start (0 for an empty side) and length.
    let range = |from: usize, to: usize| match to - from {
        0 => format!("{from},0"),
        1 => format!("{}", from + 1),
        n => format!("{},{n}", from + 1),
    };
    let mut out = format!("--- {old_name}\n+++ {new_name}\n@@ -{} +{} @@\n", range(start, a_end), range(start, b_end));
    let line = |out: &mut String, sign: char, l: &str| {
        out.push(sign);
        out.push_str(l);
        if !l.ends_with('\n') {
            out.push_str("\n\\ No newline at end of file\n");
        }
    };
    a[start..prefix].iter().for_each(|l| line(&mut out, ' ', l));
    a[prefix..a.len() - suffix].iter().for_each(|l| line(&mut out, '-', l));
    b[prefix..b.len() - suffix].iter().for_each(|l| line(&mut out, '+', l));
    a[a.len() - suffix..a_end].iter().for_each(|l| line(&mut out, ' ', l));
    out
}

/// A value on one line, for change lists: scalars as YAML, containers as flow JSON.
pub fn short(v: &Value) -> String {
    match v {
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Null => "null".into(),
        other => serde_json::to_string(other).unwrap_or_else(|_| "?".into()),
    }
}

#[cfg(test)]
mod tests {
    /// Where Myers also finds one replacement hunk, the linear path writes the same text.
    #[test]
    fn large_diffs_are_one_hunk_written_as_similar_writes_it() {
        let old = "a\nb\nc\nd\nx1\nx2\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\ny1\ny2\ny3\ne\nf\ng\nh\n";
        let want = super::unified_past(old, new, "old", "new", usize::MAX);
        assert_eq!(super::unified_past(old, new, "old", "new", 0), want);
        let (old, new) = ("x\n", "y\nz\n");
        assert_eq!(super::unified_past(old, new, "o", "n", 0), super::unified_past(old, new, "o", "n", usize::MAX));
    }
}
