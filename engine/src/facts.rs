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
    pub relations: BTreeMap<String, Vec<Vec<Const>>>,
}

/// A problem with one relation or one tuple of the facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactError {
    pub relation: String,
    /// The tuple's 0-based index in its relation's list, when one tuple is at fault.
    pub index: Option<usize>,
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
