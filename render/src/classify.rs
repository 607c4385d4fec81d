//! Classification: facts for the rules, the rules' answers decoded, with proofs.
//!
//! Start at `Classifier::new` (field metadata, inventories and rule files, all validated; the
//! program compiled once) and `Classifier::classify` (changed paths, and optionally the
//! desired config, in; a class per path, the verdict and Talos's refusals out). Matching
//! paths against field-metadata patterns happens here, once per path, with the contract's
//! regex set; which entry wins, the default, the verdict and the refusals are decided by
//! `rules/classify.rules` and `rules/talos-accepts.rules`.

use crate::config::Config;
use crate::diff::Change;
use crate::fieldmeta::{Contract, FieldMeta, Matcher, MetaError};
use crate::inventory::Inventory;
use crate::path::Path;
use engine::facts::FactSet;
use engine::{Const, Database, Engine, EvalOptions, MemSources};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The texts a classifier is built from, each with the file name shown in messages.
#[derive(Clone, Debug)]
pub struct RuleSet {
    pub fieldmeta: (String, String),
    pub rules: Vec<(String, String)>,
    pub contracts: Vec<(String, String)>,
}

impl RuleSet {
    /// The rules this build was compiled with.
    pub fn embedded() -> RuleSet {
        let own = |(a, b): &(&str, &str)| (a.to_string(), b.to_string());
        RuleSet {
            fieldmeta: own(&crate::bundle::FIELDMETA),
            rules: crate::bundle::RULES.iter().map(own).collect(),
            contracts: crate::bundle::CONTRACTS.iter().map(own).collect(),
        }
    }
}

/// Why the rules cannot be used; every problem, each with its file and line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError {
    pub problems: Vec<String>,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.problems.join("\n"))
    }
}

impl std::error::Error for LoadError {}

pub struct ContractData {
    pub inventory: Inventory,
    pub matcher: Matcher,
}

pub struct Classifier {
    pub meta: FieldMeta,
    pub fieldmeta_file: String,
    pub contracts: BTreeMap<Contract, ContractData>,
    pub engine: Engine,
}

/// One changed path with its class and the reason.
#[derive(Clone, Debug)]
pub struct Classified {
    pub change: Change,
    pub class: String,
    /// The deciding field-metadata entry (index), or None for the default, an ambiguity or an
    /// unsupported path.
    pub entry: Option<usize>,
    pub why: String,
    pub restarts: Vec<String>,
    pub applied_by: Option<String>,
    pub sensitive: bool,
}

/// Talos would refuse the desired config.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rejection {
    pub message: String,
    pub at: String,
}

pub struct Outcome {
    pub contract: Contract,
    pub verdict: String,
    pub changes: Vec<Classified>,
    pub rejected: Vec<Rejection>,
    /// The evaluation, with provenance, for proofs.
    pub db: Database,
}

impl Classifier {
    pub fn new(set: &RuleSet) -> Result<Classifier, LoadError> {
        let mut problems = vec![];
        let mut contracts = BTreeMap::new();
        let mut inventories = BTreeMap::new();
        for (name, text) in &set.contracts {
            let Some(c) = Contract::parse(name) else {
                problems.push(format!("{name}: not a contract name (vX.Y)"));
                continue;
            };
            match Inventory::parse(text) {
                Ok(inv) => {
                    inventories.insert(c, inv);
                }
                Err(e) => problems.push(format!("rules/contracts/{name}.paths:{e}")),
            }
        }
        let known: Vec<Contract> = inventories.keys().copied().collect();
        let (meta_file, meta_text) = &set.fieldmeta;
        let meta = match FieldMeta::parse(meta_text, &known) {
            Ok(m) => Some(m),
            Err(errs) => {
                problems.extend(errs.iter().map(|e| format!("{meta_file}:{e}")));
                None
            }
        };
        let files: HashMap<String, String> = set.rules.iter().cloned().collect();
        let names: Vec<String> = set.rules.iter().map(|r| r.0.clone()).collect();
        let loaded = engine::load(&names, &MemSources(files));
        problems.extend(
            loaded
                .errors()
                .map(|d| d.display(&loaded.sources).to_string()),
        );
        let engine = loaded.program.and_then(|p| match Engine::new(p) {
            Ok(e) => Some(e),
            Err(errs) => {
                problems.extend(
                    errs.iter()
                        .map(|e| format!("{}: error: {}", e.at, e.message)),
                );
                None
            }
        });
        let (Some(meta), Some(engine), true) = (meta, engine, problems.is_empty()) else {
            return Err(LoadError { problems });
        };
        let (ambiguous, _) = meta.check_inventories(&inventories);
        if !ambiguous.is_empty() {
            return Err(LoadError {
                problems: ambiguous
                    .iter()
                    .map(|e: &MetaError| format!("{meta_file}:{e}"))
                    .collect(),
            });
        }
        for (c, inventory) in inventories {
            contracts.insert(
                c,
                ContractData {
                    matcher: meta.matcher(c),
                    inventory,
                },
            );
        }
        Ok(Classifier {
            meta,
            fieldmeta_file: meta_file.clone(),
            contracts,
            engine,
        })
    }

    pub fn known(&self) -> Vec<Contract> {
        self.contracts.keys().copied().collect()
    }

    /// The contract named `name`, or an error listing the known ones.
    pub fn contract(&self, name: &str) -> Result<Contract, String> {
        let names: Vec<String> = self.known().iter().map(Contract::to_string).collect();
        let c = Contract::parse(name).ok_or_else(|| {
            format!(
                "{name:?} is not a contract name: write vX.Y, one of {}",
                names.join(", ")
            )
        })?;
        if !self.contracts.contains_key(&c) {
            return Err(format!(
                "unknown contract {c}: known contracts are {}",
                names.join(", ")
            ));
        }
        Ok(c)
    }

    /// Whether a path's value must never be shown at this contract.
    pub fn sensitive(&self, contract: Contract, path: &Path) -> bool {
        let Some(d) = self.contracts.get(&contract) else {
            return false;
        };
        d.matcher
            .candidates(&path.to_string())
            .iter()
            .any(|&(e, _)| self.meta.entries[e].sensitive)
    }

    /// The contract a config is written for, and why: the oldest contract from v1.13 on whose
    /// inventory has every typed document's kind (Talos's own guess: documents present mean
    /// the current form, none mean the v1.13 legacy form), else the newest known.
    pub fn infer_contract(&self, configs: &[&Config]) -> (Contract, String) {
        let kinds: Vec<&str> = configs
            .iter()
            .flat_map(|c| c.docs.iter().filter_map(|d| d.kind.as_deref()))
            .collect();
        let floor = Contract {
            major: 1,
            minor: 13,
        };
        for (&c, d) in self.contracts.range(floor..) {
            if kinds.iter().all(|k| d.inventory.has_kind(k)) {
                let newer: Vec<&str> = kinds
                    .iter()
                    .copied()
                    .filter(|k| {
                        self.contracts
                            .range(..c)
                            .all(|(_, o)| !o.inventory.has_kind(k))
                    })
                    .collect();
                let why = if newer.is_empty() {
                    "every document exists at this contract".to_string()
                } else {
                    let mut n = newer.clone();
                    n.sort();
                    n.dedup();
                    let more = if n.len() > 3 {
                        format!(" and {} more", n.len() - 3)
                    } else {
                        String::new()
                    };
                    format!(
                        "documents first known at {c}: {}{more}",
                        n[..n.len().min(3)].join(", ")
                    )
                };
                return (c, why);
            }
        }
        let newest = *self.contracts.keys().last().expect("at least one contract");
        (
            newest,
            "some documents are unknown to every contract; they are reported as unsupported".into(),
        )
    }

    /// Classifies `changes` at `contract`; with the desired config, also checks what Talos
    /// would refuse. Evaluates with provenance so that every answer can be explained.
    pub fn classify(
        &self,
        contract: Contract,
        changes: &[Change],
        desired: Option<&Config>,
    ) -> Result<Outcome, engine::EvalError> {
        let data = &self.contracts[&contract];
        let mut facts = FactSet::default();
        let sym = |s: &str| Const::Sym(s.to_string());
        for (e, entry) in self.meta.entries.iter().enumerate() {
            if let (Some(class), true) = (entry.class, entry.holds_at(contract)) {
                facts.add("entry_class", vec![Const::Num(e as i64), sym(class.name())]);
            }
        }
        let mut shown: Vec<String> = vec![];
        for ch in changes {
            let p = ch.path.to_string();
            facts.add("change", vec![sym(&p)]);
            if data.inventory.contains(&ch.path) {
                facts.add("exists", vec![sym(&p)]);
            }
            for (e, spec) in data.matcher.candidates(&p) {
                facts.add(
                    "candidate",
                    vec![sym(&p), Const::Num(e as i64), Const::Num(spec)],
                );
            }
            shown.push(p);
        }
        if let Some(cfg) = desired {
            for d in &cfg.docs {
                if let Some(k) = &d.kind {
                    facts.add("document", vec![sym(k)]);
                }
            }
            if let Some(t) = cfg.machine_type() {
                facts.add("machine_type", vec![sym(t)]);
            }
            for p in cfg.leaves().keys() {
                facts.add("present", vec![sym(&p.to_string())]);
            }
        }
        let resolved = facts
            .resolve(&self.engine.program)
            .map_err(|errs| engine::EvalError {
                at: "classification facts".into(),
                message: errs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            })?;
        let db = self.engine.evaluate(
            &resolved,
            EvalOptions {
                provenance: true,
                ..EvalOptions::default()
            },
        )?;
        let p = &self.engine.program;
        let mut classes: HashMap<String, (String, i64)> = HashMap::new();
        for t in db.decoded(
            p.relation("class_of")
                .expect("classify.rules declares class_of"),
        ) {
            if let [Const::Sym(path), Const::Sym(class), Const::Num(entry)] = &t[..] {
                classes.insert(path.clone(), (class.clone(), *entry));
            }
        }
        let verdict = db
            .decoded(
                p.relation("verdict")
                    .expect("classify.rules declares verdict"),
            )
            .into_iter()
            .find_map(|t| match &t[..] {
                [Const::Sym(v)] => Some(v.clone()),
                _ => None,
            })
            .unwrap_or_else(|| "RebootRequired".into());
        let mut out = vec![];
        for (ch, p) in changes.iter().zip(&shown) {
            let (class, entry) = classes
                .get(p)
                .cloned()
                .unwrap_or(("reboot-required".into(), -1));
            let e = usize::try_from(entry).ok().map(|e| &self.meta.entries[e]);
            let why = match (entry, e) {
                (_, Some(e)) => e.why.clone(),
                (-3, _) => format!(
                    "The Talos {contract} contract has no such path (rules/contracts/{contract}.paths): Talos would refuse it at this contract; remove it or change the contract."
                ),
                (-2, _) => "Field-metadata entries of equal specificity disagree about this path, so Ichor fails closed and treats it as needing a reboot; make one entry more specific.".into(),
                _ => "No field-metadata entry decides this path, so Ichor fails closed and treats it as needing a reboot; add an entry to rules/fieldmeta.yaml.".into(),
            };
            out.push(Classified {
                change: ch.clone(),
                class,
                entry: e.map(|_| entry as usize),
                why,
                restarts: e.map(|e| e.restarts.clone()).unwrap_or_default(),
                applied_by: e.and_then(|e| e.applied_by.clone()),
                sensitive: self.sensitive(contract, &ch.path),
            });
        }
        let mut rejected: Vec<Rejection> = db
            .decoded(
                p.relation("rejected")
                    .expect("talos-accepts.rules declares rejected"),
            )
            .into_iter()
            .filter_map(|t| match &t[..] {
                [Const::Sym(m), Const::Sym(a)] => Some(Rejection {
                    message: m.clone(),
                    at: a.clone(),
                }),
                _ => None,
            })
            .collect();
        rejected.sort();
        Ok(Outcome {
            contract,
            verdict,
            changes: out,
            rejected,
            db,
        })
    }

    /// The proof of a path's class, as text.
    pub fn proof(&self, outcome: &Outcome, c: &Classified) -> Option<engine::explain::Proof> {
        let entry = c.entry.map_or_else(
            || match c.class.as_str() {
                "unsupported" => -3,
                _ => -1,
            },
            |e| e as i64,
        );
        let values = vec![
            Const::Sym(c.change.path.to_string()),
            Const::Sym(c.class.clone()),
            Const::Num(entry),
        ];
        match engine::explain::explain(&self.engine.program, &outcome.db, "class_of", &values) {
            Ok(engine::explain::Explanation::Holds(p)) => Some(p),
            _ => None,
        }
    }
}
