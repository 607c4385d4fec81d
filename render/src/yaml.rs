//! YAML read the one way every input of Ichor's is read: bounded in size after aliases expand,
//! merge keys resolved as YAML 1.1 readers (and Talos's Go reader) resolve them, tags refused,
//! and map keys made text. Start at `parse`.
//!
//! Why: an alias repeated thousands of times expands a small file into gigabytes; a merge key
//! left as a `<<` key, a tagged mapping or a non-text key would route a value around the
//! redaction that works by path. After `parse`, every mapping key is a string and no value
//! is tagged, so a path names every value exactly.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_yaml::{Mapping, Value};
use std::cell::Cell;
use std::fmt;

/// Why a YAML document cannot be read: where (a path inside the document, when known) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YamlError {
    /// 1-based line and column in the text, when the YAML parser knows them.
    pub line: Option<usize>,
    /// The column, when known.
    pub col: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A scalar as text, the way a ConfigMap or a Helm value reads it: a string as it is, a
/// boolean as `true`/`false`; None for anything else.
pub fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Parses one YAML document, refusing it when its values (aliases expanded) exceed `limit`
/// bytes, then resolves merge keys, refuses tags and turns number and boolean keys into text.
pub fn parse(text: &str, limit: usize) -> Result<Value, YamlError> {
    let budget = Budget { left: Cell::new(limit), limit };
    let value = Bounded(&budget).deserialize(serde_yaml::Deserializer::from_str(text)).map_err(|e| {
        let loc = e.location();
        let msg = e.to_string();
        // serde_yaml appends "at line X column Y": the fields say it.
        // A tag on a value (`!!int "s3cr3t"`) makes serde_yaml quote the value: never shown.
        let msg = scrub(msg.split(" at line ").next().unwrap_or(&msg));
        YamlError { line: loc.as_ref().map(|l| l.line()), col: loc.as_ref().map(|l| l.column()), message: msg }
    })?;
    normalize(value, "")
}

struct Budget {
    left: Cell<usize>,
    limit: usize,
}

impl Budget {
    fn spend<E: de::Error>(&self, n: usize) -> Result<(), E> {
        match self.left.get().checked_sub(n) {
            Some(l) => {
                self.left.set(l);
                Ok(())
            }
            None => Err(E::custom(format!(
                "the document expands past {} bytes (aliases repeat their content): it is not a configuration",
                self.limit
            ))),
        }
    }
}

/// Builds a `Value`, spending the budget on every node and scalar byte as it arrives.
#[derive(Clone, Copy)]
struct Bounded<'b>(&'b Budget);

/// What one node costs besides its text: a value's size in memory, roughly.
const NODE: usize = 32;

impl<'de> DeserializeSeed<'de> for Bounded<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        self.0.spend(NODE)?;
        Ok(Value::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value, E> {
        self.0.spend(NODE)?;
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value, E> {
        self.0.spend(NODE)?;
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value, E> {
        self.0.spend(NODE)?;
        Ok(Value::Number(n.into()))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        self.0.spend(NODE + s.len())?;
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        self.0.spend(NODE + s.len())?;
        Ok(Value::String(s))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.0.spend(NODE)?;
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.spend(NODE)?;
        let mut out = vec![];
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Value::Sequence(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.spend(NODE)?;
        let mut out = Mapping::new();
        while let Some(k) = map.next_key_seed(self)? {
            let v = map.next_value_seed(self)?;
            out.insert(k, v);
        }
        Ok(Value::Mapping(out))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        // A tagged value (`!tag x`): kept as tagged, then refused by `normalize` with its path.
        use de::VariantAccess;
        let (tag, variant): (String, _) = data.variant()?;
        let value = variant.newtype_variant_seed(self)?;
        self.0.spend(NODE + tag.len())?;
        Ok(Value::Tagged(Box::new(serde_yaml::value::TaggedValue { tag: serde_yaml::value::Tag::new(tag), value })))
    }
}

/// The documents of a multi-document text, split at `---` lines, each with its first line
/// (1-based) in the text.
pub fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut out = vec![];
    let (mut cur, mut start) = (String::new(), 1);
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("---") && line[3..].trim().is_empty() {
            out.push((start, std::mem::take(&mut cur)));
            start = i + 2;
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    out.push((start, cur));
    out
}

/// A mapping key as text (`5`, `true` and strings alike).
pub fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
    }
}

/// Parses every document of a multi-document text (patches, bundles) with one budget.
pub fn parse_documents(text: &str, limit: usize) -> Result<Vec<Value>, YamlError> {
    let budget = Budget { left: Cell::new(limit), limit };
    let mut out = vec![];
    for d in serde_yaml::Deserializer::from_str(text) {
        // The whole text is the caller's: serde_yaml's own positions in the message are right.
        let v = Bounded(&budget).deserialize(d).map_err(|e| {
            let loc = e.location();
            YamlError {
                line: loc.as_ref().map(|l| l.line()),
                col: loc.as_ref().map(|l| l.column()),
                message: scrub(&e.to_string()),
            }
        })?;
        if !v.is_null() {
            out.push(normalize(v, "")?);
        }
    }
    Ok(out)
}

/// A serde message with the values it quotes taken out (`invalid type: string "s3cr3t",
/// expected a list` becomes `invalid type: string, expected a list`): an error names the field
/// and what was expected, never a value, which may be a secret.
pub fn scrub(message: &str) -> String {
    const AFTER: [&str; 3] = ["invalid type: ", "invalid value: ", "unknown variant "];
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some((i, prefix)) = AFTER.iter().filter_map(|p| rest.find(p).map(|i| (i, *p))).min_by_key(|&(i, _)| i) {
        out.push_str(&rest[..i + prefix.len()]);
        rest = &rest[i + prefix.len()..];
        // The kind of value (`string`, `floating point`), then its quoted text: keep the kind.
        let kind_end = rest.find(|c: char| !(c.is_ascii_lowercase() || c == ' ')).unwrap_or(rest.len());
        let kind = rest[..kind_end].trim_end();
        let Some(open) = rest[kind_end..].chars().next().filter(|c| matches!(c, '"' | '`' | '\'')) else {
            continue; // nothing quoted: a kind alone (`sequence`) says no value
        };
        let close = if open == '"' { '"' } else { open };
        let mut end = None;
        let mut escaped = false;
        for (j, ch) in rest[kind_end + 1..].char_indices() {
            match ch {
                '\\' if open == '"' && !escaped => escaped = true,
                c if c == close && !escaped => {
                    end = Some(kind_end + 1 + j + c.len_utf8());
                    break;
                }
                _ => escaped = false,
            }
        }
        out.push_str(if kind.is_empty() { "(a value, not shown)" } else { kind });
        rest = match end {
            Some(e) => &rest[e..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

fn at(path: &str) -> String {
    if path.is_empty() { "the document".into() } else { format!("`{path}`") }
}

fn error(message: String) -> YamlError {
    YamlError { line: None, col: None, message }
}

/// Merge keys resolved, tags refused, keys made text; `path` names where the value sits.
fn normalize(v: Value, path: &str) -> Result<Value, YamlError> {
    match v {
        Value::Tagged(t) => {
            Err(error(format!("{}: YAML tag {}: a Talos config carries no tags; remove it", at(path), t.tag)))
        }
        Value::Sequence(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, x)| normalize(x, &format!("{path}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Sequence),
        Value::Mapping(m) => {
            let mut v = Value::Mapping(m);
            // A merged mapping may bring merge keys of its own: resolve until none is left.
            for _ in 0..64 {
                let has_merge = matches!(&v, Value::Mapping(m) if m.contains_key("<<"));
                if !has_merge {
                    break;
                }
                v.apply_merge().map_err(|e| error(format!("{}: merge key `<<`: {e}", at(path))))?;
            }
            let Value::Mapping(m) = v else { unreachable!("a mapping stays one") };
            if m.contains_key("<<") {
                return Err(error(format!("{}: merge keys (`<<`) nested past 64 levels", at(path))));
            }
            let mut out = Mapping::new();
            for (k, x) in m {
                let key = match k {
                    Value::String(s) => s,
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    Value::Null => {
                        return Err(error(format!(
                            "{}: a mapping key is empty (`~` or nothing): keys are text; quote it",
                            at(path)
                        )));
                    }
                    _ => {
                        return Err(error(format!(
                            "{}: a mapping key is a list, mapping or tagged value: keys are text",
                            at(path)
                        )));
                    }
                };
                let child = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                let x = normalize(x, &child)?;
                if out.insert(Value::String(key.clone()), x).is_some() {
                    return Err(error(format!(
                        "{}: the key `{key}` is written twice (once as text, once as a number or boolean)",
                        at(path)
                    )));
                }
            }
            Ok(Value::Mapping(out))
        }
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keys_resolve_tags_refuse_keys_become_text() {
        let v = parse("a: &x {token: S}\nb:\n  <<: *x\n  c: 1\n5000: {password: P}\ntrue: 1\n", 1 << 20).unwrap();
        assert_eq!(v["b"]["token"], Value::String("S".into()));
        assert!(v.get("5000").is_some() && v.get("true").is_some());
        let e = parse("machine: !t {token: S}\n", 1 << 20).unwrap_err();
        assert!(e.message.contains("`machine`: YAML tag !t"), "{e}");
        assert!(!e.message.contains('S'.to_string().as_str()) || !e.message.contains("token: S"));
        let e = parse("m:\n  ~: P\n", 1 << 20).unwrap_err();
        assert!(e.message.contains("`m`: a mapping key is empty"), "{e}");
    }

    #[test]
    fn scrub_takes_quoted_values_out() {
        assert_eq!(
            scrub(r#"spec.token: invalid type: string "s3c\"r3t", expected a sequence"#),
            "spec.token: invalid type: string, expected a sequence"
        );
        assert_eq!(scrub("invalid value: integer `42`, expected a port"), "invalid value: integer, expected a port");
        assert_eq!(
            scrub("unknown variant `hunter2`, expected one of `a`, `b`"),
            "unknown variant (a value, not shown), expected one of `a`, `b`"
        );
        assert_eq!(scrub("missing field `name`"), "missing field `name`");
    }

    #[test]
    fn aliases_cannot_amplify_past_the_budget() {
        let mut text = format!("a: &a \"{}\"\nb: [", "x".repeat(10_000));
        for _ in 0..2_000 {
            text.push_str("*a, ");
        }
        text.push_str("1]\n");
        let e = parse(&text, 1 << 20).unwrap_err();
        assert!(e.message.contains("expands past 1048576 bytes"), "{e}");
        assert!(parse(&text, 64 << 20).is_ok());
    }
}
