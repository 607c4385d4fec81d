//! Input facts by relation name, from Rust or from a FACTS.json document.
//!
//! `FactSet` is what a host fills; `FactSet::resolve` checks it against a program (declared,
//! `.input`, arity, column types) and returns every problem at once, each naming the relation
//! and the tuple's index. `FactSet::from_json` reads `{"rel": [[value, ...], ...], ...}`: a JSON
//! string is a symbol, a JSON integer a number.

use crate::eval::Facts;
use crate::program::{Const, Program};
use std::collections::BTreeMap;
use std::fmt;

/// Facts keyed by relation name, in insertion order per relation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FactSet {
    /// Each relation's tuples, by relation name.
    pub relations: BTreeMap<String, Vec<Vec<Const>>>,
}

/// A problem with one relation or one tuple of the facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactError {
    /// The relation at fault.
    pub relation: String,
    /// The tuple's 0-based index in its relation's list, when one tuple is at fault.
    pub index: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for FactError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "relation `{}`, tuple {i}: {}", self.relation, self.message),
            None => write!(f, "relation `{}`: {}", self.relation, self.message),
        }
    }
}

impl FactSet {
    /// Adds one tuple to `relation`.
    pub fn add(&mut self, relation: &str, tuple: Vec<Const>) {
        self.relations.entry(relation.to_string()).or_default().push(tuple);
    }

    /// Parses FACTS.json. Errors name the relation and tuple index (or the JSON position).
    pub fn from_json(text: &str) -> Result<FactSet, Vec<FactError>> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            vec![FactError {
                relation: String::new(),
                index: None,
                message: format!("line {}, column {}: not valid JSON: {e}", e.line(), e.column()),
            }]
        })?;
        let serde_json::Value::Object(map) = value else {
            return Err(vec![FactError {
                relation: String::new(),
                index: None,
                message: "FACTS.json must be an object mapping relation names to lists of tuples".into(),
            }]);
        };
        let mut set = FactSet::default();
        let mut errors = vec![];
        for (rel, tuples) in map {
            let serde_json::Value::Array(tuples) = tuples else {
                errors.push(FactError { relation: rel, index: None, message: "expected a list of tuples".into() });
                continue;
            };
            let entry = set.relations.entry(rel.clone()).or_default();
            for (i, t) in tuples.into_iter().enumerate() {
                let serde_json::Value::Array(values) = t else {
                    errors.push(FactError {
                        relation: rel.clone(),
                        index: Some(i),
                        message: "expected a list of values".into(),
                    });
                    continue;
                };
                let mut row = vec![];
                for (c, v) in values.into_iter().enumerate() {
                    match v {
                        serde_json::Value::String(s) => row.push(Const::Sym(s)),
                        serde_json::Value::Number(n) if n.as_i64().is_some() => row.push(Const::Num(n.as_i64().unwrap())),
                        other => errors.push(FactError {
                            relation: rel.clone(),
                            index: Some(i),
                            message: format!(
                                "value {c} is {other}: only strings (symbols) and integers that fit in 64 bits (numbers) are values"
                            ),
                        }),
                    }
                }
                entry.push(row);
            }
        }
        if errors.is_empty() { Ok(set) } else { Err(errors) }
    }

    /// Checks the facts against the program and orders them by relation id.
    pub fn resolve(&self, program: &Program) -> Result<Facts, Vec<FactError>> {
        let mut facts: Facts = vec![vec![]; program.relations.len()];
        let mut errors = vec![];
        for (name, tuples) in &self.relations {
            let Some(rel) = program.relation(name).filter(|&r| !program.relations[r].aux) else {
                errors.push(FactError {
                    relation: name.clone(),
                    index: None,
                    message: "the program does not declare this relation".into(),
                });
                continue;
            };
            let decl = &program.relations[rel];
            if !decl.input {
                errors.push(FactError {
                    relation: name.clone(),
                    index: None,
                    message: "this relation is not an `.input` of the program, so facts cannot be given for it".into(),
                });
                continue;
            }
            for (i, t) in tuples.iter().enumerate() {
                if t.len() != decl.arity() {
                    errors.push(FactError {
                        relation: name.clone(),
                        index: Some(i),
                        message: format!("expected {} value(s), found {}", decl.arity(), t.len()),
                    });
                    continue;
                }
                let mut ok = true;
                for (c, (v, (col, ty))) in t.iter().zip(&decl.columns).enumerate() {
                    if v.ty() != *ty {
                        ok = false;
                        errors.push(FactError {
                            relation: name.clone(),
                            index: Some(i),
                            message: format!(
                                "value {c} (column `{col}`) must be a {}, found the {} {v}",
                                ty.name(),
                                v.ty().name()
                            ),
                        });
                    }
                }
                if ok {
                    facts[rel].push(t.clone());
                }
            }
        }
        if errors.is_empty() { Ok(facts) } else { Err(errors) }
    }
}

/// Reads FACTS.json straight into interned facts for `engine`, without a tree of JSON values
/// or of `Const`s: each tuple is checked (declared, `.input`, arity, types) and interned as it
/// streams in, so memory is that of the interned facts. The errors are those of `from_json`
/// then `resolve`, in the same order (by relation name, then tuple index).
pub fn read_json(text: &str, engine: &crate::Engine) -> Result<crate::FactBuilder, Vec<FactError>> {
    use serde::de::DeserializeSeed;
    let mut reader = Reader { program: &engine.program, facts: engine.fact_builder(), shape: vec![], typing: vec![] };
    let mut de = serde_json::Deserializer::from_str(text);
    let syntax = |e: serde_json::Error| {
        vec![FactError {
            relation: String::new(),
            index: None,
            message: format!("line {}, column {}: not valid JSON: {e}", e.line(), e.column()),
        }]
    };
    (&mut reader).deserialize(&mut de).map_err(|e| {
        if e.is_data() && e.to_string().contains(NOT_OBJECT) {
            vec![FactError { relation: String::new(), index: None, message: NOT_OBJECT.into() }]
        } else {
            syntax(e)
        }
    })?;
    de.end().map_err(syntax)?;
    // As before: values that are not values first (nothing else is checked then), else the
    // problems against the program.
    let mut errors = if reader.shape.is_empty() { reader.typing } else { reader.shape };
    errors.sort_by(|a, b| a.relation.cmp(&b.relation));
    if errors.is_empty() { Ok(reader.facts) } else { Err(errors) }
}

const NOT_OBJECT: &str = "FACTS.json must be an object mapping relation names to lists of tuples";

struct Reader<'p> {
    program: &'p Program,
    facts: crate::FactBuilder,
    /// Values that are not values, lists that are not lists.
    shape: Vec<FactError>,
    /// Facts that do not fit the program.
    typing: Vec<FactError>,
}

/// One JSON value of a tuple: a symbol (borrowed from the text unless it has escapes), a
/// number, or what it was instead.
enum Value<'a> {
    Sym(std::borrow::Cow<'a, str>),
    Num(i64),
    Other(String),
}

impl<'de> serde::Deserialize<'de> for Value<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Value<'de>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Value<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an integer")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Value<'de>, E> {
                Ok(Value::Sym(s.into()))
            }
            fn visit_str<E>(self, s: &str) -> Result<Value<'de>, E> {
                Ok(Value::Sym(s.to_string().into()))
            }
            fn visit_string<E>(self, s: String) -> Result<Value<'de>, E> {
                Ok(Value::Sym(s.into()))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Value<'de>, E> {
                Ok(Value::Num(n))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Value<'de>, E> {
                Ok(i64::try_from(n).map_or_else(|_| Value::Other(n.to_string()), Value::Num))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Value<'de>, E> {
                Ok(Value::Other(serde_json::Value::from(n).to_string()))
            }
            fn visit_bool<E>(self, b: bool) -> Result<Value<'de>, E> {
                Ok(Value::Other(b.to_string()))
            }
            fn visit_unit<E>(self) -> Result<Value<'de>, E> {
                Ok(Value::Other("null".into()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value<'de>, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Value::Other("a list".into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value<'de>, A::Error> {
                while a.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(Value::Other("an object".into()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for &mut Reader<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for &mut Reader<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(NOT_OBJECT)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            map.next_value_seed(Relation { reader: &mut *self, name })?;
        }
        Ok(())
    }
}

/// The tuples of one relation.
struct Relation<'r, 'p> {
    reader: &'r mut Reader<'p>,
    name: String,
}

impl<'de> serde::de::DeserializeSeed<'de> for Relation<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Relation<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of tuples")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Relation { reader, name } = self;
        let p = reader.program;
        let rel = p.relation(&name).filter(|&r| !p.relations[r].aux);
        match rel {
            None => reader.typing.push(FactError {
                relation: name.clone(),
                index: None,
                message: "the program does not declare this relation".into(),
            }),
            Some(r) if !p.relations[r].input => reader.typing.push(FactError {
                relation: name.clone(),
                index: None,
                message: "this relation is not an `.input` of the program, so facts cannot be given for it".into(),
            }),
            Some(_) => {}
        }
        let decl = rel.filter(|&r| p.relations[r].input).map(|r| (r, &p.relations[r]));
        let mut row: Vec<u32> = vec![];
        let mut i = 0;
        while let Some(t) = seq.next_element::<Tuple<'de>>()? {
            let index = Some(i);
            i += 1;
            let values = match t {
                Tuple::List(v) => v,
                Tuple::Other => {
                    let message = "expected a list of values".into();
                    reader.shape.push(FactError { relation: name.clone(), index, message });
                    continue;
                }
            };
            let mut ok = true;
            for (c, v) in values.iter().enumerate() {
                if let Value::Other(o) = v {
                    ok = false;
                    let message = format!(
                        "value {c} is {o}: only strings (symbols) and integers that fit in 64 bits (numbers) are values"
                    );
                    reader.shape.push(FactError { relation: name.clone(), index, message });
                }
            }
            let Some((r, decl)) = decl.filter(|_| ok) else { continue };
            if values.len() != decl.arity() {
                let message = format!("expected {} value(s), found {}", decl.arity(), values.len());
                reader.typing.push(FactError { relation: name.clone(), index, message });
                continue;
            }
            row.clear();
            for (c, (v, (col, ty))) in values.iter().zip(&decl.columns).enumerate() {
                let found = match v {
                    Value::Sym(s) if *ty == crate::ast::Type::Symbol => {
                        row.push(reader.facts.sym(s));
                        continue;
                    }
                    Value::Num(n) if *ty == crate::ast::Type::Number => {
                        row.push(reader.facts.num(*n));
                        continue;
                    }
                    Value::Sym(s) => Const::Sym(s.to_string()),
                    Value::Num(n) => Const::Num(*n),
                    Value::Other(_) => unreachable!("checked above"),
                };
                let message = format!(
                    "value {c} (column `{col}`) must be a {}, found the {} {found}",
                    ty.name(),
                    found.ty().name()
                );
                reader.typing.push(FactError { relation: name.clone(), index, message });
            }
            if row.len() == decl.arity() {
                reader.facts.push(r, &row);
            }
        }
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        while a.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        self.not_a_list();
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        self.not_a_list();
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        self.not_a_list();
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        self.not_a_list();
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        self.not_a_list();
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        self.not_a_list();
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.not_a_list();
        Ok(())
    }
}

impl Relation<'_, '_> {
    fn not_a_list(self) {
        let message = "expected a list of tuples".into();
        self.reader.shape.push(FactError { relation: self.name, index: None, message });
    }
}

/// One tuple: a list of values, or something else.
enum Tuple<'a> {
    List(Vec<Value<'a>>),
    Other,
}

impl<'de> serde::Deserialize<'de> for Tuple<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Tuple<'de>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Tuple<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of values")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Tuple<'de>, A::Error> {
                let mut v = Vec::with_capacity(a.size_hint().unwrap_or(4));
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Tuple::List(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Tuple<'de>, A::Error> {
                while a.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(Tuple::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<Tuple<'de>, E> {
                Ok(Tuple::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Tuple<'de>, E> {
                Ok(Tuple::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Tuple<'de>, E> {
                Ok(Tuple::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Tuple<'de>, E> {
                Ok(Tuple::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Tuple<'de>, E> {
                Ok(Tuple::Other)
            }
            fn visit_unit<E>(self) -> Result<Tuple<'de>, E> {
                Ok(Tuple::Other)
            }
        }
        d.deserialize_any(V)
    }
}
