//! Classification: facts for the rules, the rules' answers decoded, with proofs.
//!
//! Start at `Classifier::new` (field metadata, inventories and rule files, all validated; the
//! program compiled once) and `Classifier::classify` (changed paths, and optionally the
//! desired config, in; a class per path, the verdict and Talos's refusals out). Matching
//! paths against field-metadata patterns happens here, once per path, with the contract's
//! pattern trie; which entry wins, the default, the verdict and the refusals are decided by
//! `rules/classify.rules` and `rules/talos-accepts.rules`.

use crate::config::Config;
use crate::diff::Change;
use crate::fieldmeta::{Contract, FieldMeta, Matcher, MetaError};
use crate::inventory::Inventory;
use crate::path::Path;
use engine::{Const, Database, Demand, Engine, EvalOptions, MemSources, RelId};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Relations the host fills or reads, with their arities: the contract between this module
/// and the rule files.
const HOST_RELATIONS: &[(&str, usize)] = &[
    ("change", 1),
    ("exists", 1),
    ("candidate", 3),
    ("entry_class", 2),
    ("class_of", 3),
    ("verdict", 1),
    ("document", 1),
    ("machine_type", 1),
    ("present", 1),
    ("rejected", 2),
    ("machine_role", 1),
    ("entry_restarts", 2),
    ("consent", 1),
    ("spec_kube_proxy", 1),
    ("status_kube_proxy", 1),
    ("inputs_unchanged", 0),
    ("drift_policy", 1),
    ("reboot_path", 1),
    ("machine_ready", 3),
];

/// Interned ids of small non-negative numbers, so that hot loops skip the interner's hashing.
#[derive(Default)]
struct SmallNums(Vec<Option<u32>>);

impl SmallNums {
    fn get(&mut self, b: &mut engine::FactBuilder, n: i64) -> u32 {
        let Ok(i) = usize::try_from(n) else { return b.num(n) };
        if i >= 4096 {
            return b.num(n);
        }
        if self.0.len() <= i {
            self.0.resize(i + 1, None);
        }
        *self.0[i].get_or_insert_with(|| b.num(n))
    }
}

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
            rules: crate::bundle::RULES[..crate::bundle::CLASSIFY_RULES].iter().map(own).collect(),
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
    /// What a classification reads (the classes, the verdict, Talos's refusals), and that plus
    /// the machine's condition: only the rules these need run.
    changes_demand: Demand,
    machine_demand: Demand,
}

/// Why a path has its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The field-metadata entry (index) that decides it.
    Entry(usize),
    /// No entry decides: the fail-closed default.
    Default,
    /// Equally specific entries disagree: fail closed.
    Ambiguous,
    /// The contract has no such path.
    Unsupported,
}

/// The class of one changed path; `Outcome::changes[i]` answers for the caller's `changes[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Classified {
    pub class: &'static str,
    pub reason: Reason,
    pub sensitive: bool,
}

impl Classified {
    pub fn entry(&self) -> Option<usize> {
        match self.reason {
            Reason::Entry(e) => Some(e),
            _ => None,
        }
    }
}

/// The cluster and machine context of a machine's classification (`config diff --manifests`).
#[derive(Clone, Debug, Default)]
pub struct MachineContext {
    pub role: String,
    /// The consent annotation's value, if the cluster carries it.
    pub consent: Option<String>,
    pub spec_kube_proxy: String,
    pub status_kube_proxy: Option<String>,
    /// The desired-inputs hash equals the machine's recorded one.
    pub inputs_unchanged: bool,
    pub drift_policy: String,
}

/// A machine's condition, decided by rules/machine.rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineVerdict {
    pub status: String,
    pub reason: String,
    pub message: String,
    pub reboot_paths: Vec<String>,
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
    /// The machine's condition, when classified with its context.
    pub machine: Option<MachineVerdict>,
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
        problems.extend(loaded.errors().map(|d| d.display(&loaded.sources).to_string()));
        let engine = loaded.program.and_then(|p| match Engine::new(p) {
            Ok(e) => Some(e),
            Err(errs) => {
                problems.extend(errs.iter().map(|e| format!("{}: error: {}", e.at, e.message)));
                None
            }
        });
        // Every relation the host fills or reads must be declared, with its arity.
        if let Some(e) = &engine {
            for (name, arity) in HOST_RELATIONS {
                match e.program.relation(name) {
                    Some(r) if e.program.relations[r].arity() == *arity => {}
                    Some(_) => problems.push(format!("the rules declare `{name}` with another arity than the {arity} the host uses")),
                    None => problems.push(format!("the rules do not declare `{name}`, which the host uses; load classify.rules, talos-accepts.rules and machine.rules together")),
                }
            }
        }
        let (Some(meta), Some(engine), true) = (meta, engine, problems.is_empty()) else {
            return Err(LoadError { problems });
        };
        let (ambiguous, _) = meta.check_inventories(&inventories);
        if !ambiguous.is_empty() {
            return Err(LoadError {
                problems: ambiguous.iter().map(|e: &MetaError| format!("{meta_file}:{e}")).collect(),
            });
        }
        for (c, inventory) in inventories {
            contracts.insert(c, ContractData { matcher: meta.matcher(c), inventory });
        }
        let p = &engine.program;
        let rels = |names: &[&str]| -> Vec<RelId> { names.iter().filter_map(|n| p.relation(n)).collect() };
        let read = ["class_of", "verdict", "rejected"];
        let changes_demand = engine.demand(&rels(&read));
        let machine_demand = engine.demand(&rels(&[&read[..], &["machine_ready", "reboot_path"]].concat()));
        Ok(Classifier { meta, fieldmeta_file: meta_file.clone(), contracts, engine, changes_demand, machine_demand })
    }

    pub fn known(&self) -> Vec<Contract> {
        self.contracts.keys().copied().collect()
    }

    /// The contract named `name`, or an error listing the known ones.
    pub fn contract(&self, name: &str) -> Result<Contract, String> {
        let names: Vec<String> = self.known().iter().map(Contract::to_string).collect();
        let c = Contract::parse(name)
            .ok_or_else(|| format!("{name:?} is not a contract name: write vX.Y, one of {}", names.join(", ")))?;
        if !self.contracts.contains_key(&c) {
            return Err(format!("unknown contract {c}: known contracts are {}", names.join(", ")));
        }
        Ok(c)
    }

    /// Whether a path's value must never be shown at this contract.
    pub fn sensitive(&self, contract: Contract, path: &Path) -> bool {
        let Some(d) = self.contracts.get(&contract) else {
            return false;
        };
        d.matcher.candidates(path).iter().any(|&(e, _)| self.meta.entries[e].sensitive)
    }

    /// The contract a config is written for, and why: the oldest contract from v1.13 on whose
    /// inventory has every typed document's kind (Talos's own guess: documents present mean
    /// the current form, none mean the v1.13 legacy form), else the newest known.
    pub fn infer_contract(&self, configs: &[&Config]) -> (Contract, String) {
        let kinds: Vec<&str> = configs.iter().flat_map(|c| c.docs.iter().filter_map(|d| d.kind.as_deref())).collect();
        let floor = Contract { major: 1, minor: 13 };
        for (&c, d) in self.contracts.range(floor..) {
            if kinds.iter().all(|k| d.inventory.has_kind(k)) {
                let newer: Vec<&str> = kinds
                    .iter()
                    .copied()
                    .filter(|k| self.contracts.range(..c).all(|(_, o)| !o.inventory.has_kind(k)))
                    .collect();
                let why = if newer.is_empty() {
                    "every document exists at this contract".to_string()
                } else {
                    let mut n = newer.clone();
                    n.sort();
                    n.dedup();
                    let more = if n.len() > 3 { format!(" and {} more", n.len() - 3) } else { String::new() };
                    format!("documents first known at {c}: {}{more}", n[..n.len().min(3)].join(", "))
                };
                return (c, why);
            }
        }
        let newest = *self.contracts.keys().last().expect("at least one contract");
        (newest, "some documents are unknown to every contract; they are reported as unsupported".into())
    }

    /// Classifies `changes` at `contract`; with the desired config, also checks what Talos
    /// would refuse. `provenance` records derivations so that `proof` can explain answers.
    pub fn classify(
        &self,
        contract: Contract,
        changes: &[Change],
        desired: Option<&Config>,
        provenance: bool,
    ) -> Result<Outcome, engine::EvalError> {
        self.classify_machine(contract, changes, desired, None, provenance)
    }

    /// `classify` with the machine's context: also decides its Ready condition.
    pub fn classify_machine(
        &self,
        contract: Contract,
        changes: &[Change],
        desired: Option<&Config>,
        machine: Option<&MachineContext>,
        provenance: bool,
    ) -> Result<Outcome, engine::EvalError> {
        let data = &self.contracts[&contract];
        let p = &self.engine.program;
        let rel = |name: &str| p.relation(name).unwrap_or_else(|| panic!("the classification rules declare `{name}`"));
        let mut b = self.engine.fact_builder();
        let (r_entry, r_change, r_exists, r_cand) =
            (rel("entry_class"), rel("change"), rel("exists"), rel("candidate"));
        for (e, entry) in self.meta.entries.iter().enumerate() {
            if let (Some(class), true) = (entry.class, entry.holds_at(contract)) {
                let row = [b.num(e as i64), b.sym(class.name())];
                b.push(r_entry, &row);
            }
        }
        // Entry numbers and specificities are small: interned once each.
        let mut nums = SmallNums::default();
        // Each path is interned once; its id finds its change again when decoding.
        let mut by_id: Vec<usize> = vec![];
        let mut sensitive = Vec::with_capacity(changes.len());
        let (mut cands, mut scratch) = (vec![], (vec![], vec![]));
        b.reserve_syms(changes.len());
        b.reserve(r_change, changes.len());
        b.reserve(r_exists, changes.len());
        b.reserve(r_cand, changes.len() + changes.len() / 4);
        for (i, ch) in changes.iter().enumerate() {
            let id = b.sym_owned(ch.path.text());
            if by_id.len() <= id as usize {
                by_id.resize(id as usize + 1, usize::MAX);
            }
            by_id[id as usize] = i;
            b.push(r_change, &[id]);
            if data.inventory.contains(&ch.path) {
                b.push(r_exists, &[id]);
            }
            let mut secret = false;
            data.matcher.candidates_into(&ch.path, &mut cands, &mut scratch);
            for &(e, spec) in &cands {
                secret |= self.meta.entries[e].sensitive;
                let row = [id, nums.get(&mut b, e as i64), nums.get(&mut b, spec)];
                b.push(r_cand, &row);
            }
            sensitive.push(secret);
        }
        if let Some(cfg) = desired {
            let (r_doc, r_type, r_present) = (rel("document"), rel("machine_type"), rel("present"));
            for d in &cfg.docs {
                if let Some(k) = &d.kind {
                    let id = b.sym(k);
                    b.push(r_doc, &[id]);
                }
            }
            if let Some(t) = cfg.machine_type() {
                let id = b.sym(t);
                b.push(r_type, &[id]);
            }
            for path in cfg.leaves().keys() {
                let id = b.sym(&path.to_string());
                b.push(r_present, &[id]);
            }
        }
        if let Some(m) = machine {
            let r_restarts = rel("entry_restarts");
            for (e, entry) in self.meta.entries.iter().enumerate() {
                if entry.holds_at(contract) {
                    for svc in &entry.restarts {
                        let row = [b.num(e as i64), b.sym(svc)];
                        b.push(r_restarts, &row);
                    }
                }
            }
            let mut one = |name: &str, v: &str| {
                let id = b.sym(v);
                b.push(rel(name), &[id]);
            };
            one("machine_role", &m.role);
            one("spec_kube_proxy", &m.spec_kube_proxy);
            one("drift_policy", &m.drift_policy);
            if let Some(c) = &m.consent {
                one("consent", c);
            }
            if let Some(s) = &m.status_kube_proxy {
                one("status_kube_proxy", s);
            }
            if m.inputs_unchanged {
                b.push(rel("inputs_unchanged"), &[]);
            }
        }
        // Only what the answers read is evaluated: the machine's rules only with its context.
        let demand = if machine.is_some() { &self.machine_demand } else { &self.changes_demand };
        let db = self.engine.evaluate_built_for(b, EvalOptions { provenance, ..EvalOptions::default() }, demand)?;
        let mut out: Vec<Classified> = sensitive
            .iter()
            .map(|&s| Classified { class: "reboot-required", reason: Reason::Default, sensitive: s })
            .collect();
        for row in db.rels[rel("class_of")].iter() {
            let Some(&i) = by_id.get(row[0] as usize).filter(|&&i| i != usize::MAX) else {
                continue;
            };
            let class = match db.value(row[1]) {
                Const::Sym(c) if c == "safe" => "safe",
                Const::Sym(c) if c == "install-time-only" => "install-time-only",
                Const::Sym(c) if c == "unsupported" => "unsupported",
                _ => "reboot-required",
            };
            let reason = match db.value(row[2]) {
                Const::Num(-3) => Reason::Unsupported,
                Const::Num(-2) => Reason::Ambiguous,
                Const::Num(e) if *e >= 0 => Reason::Entry(*e as usize),
                _ => Reason::Default,
            };
            out[i].class = class;
            out[i].reason = reason;
        }
        let verdict = db.rels[rel("verdict")]
            .iter()
            .find_map(|row| match db.value(row[0]) {
                Const::Sym(v) => Some(v.clone()),
                Const::Num(_) => None,
            })
            .unwrap_or_else(|| "RebootRequired".into());
        let mut rejected: Vec<Rejection> = db.rels[rel("rejected")]
            .iter()
            .filter_map(|row| match (db.value(row[0]), db.value(row[1])) {
                (Const::Sym(m), Const::Sym(a)) => Some(Rejection { message: m.clone(), at: a.clone() }),
                _ => None,
            })
            .collect();
        rejected.sort();
        let machine = machine.and_then(|_| {
            let row = db.rels[rel("machine_ready")].iter().next()?;
            let text = |id: u32| match db.value(id) {
                Const::Sym(s) => s.clone(),
                Const::Num(n) => n.to_string(),
            };
            let mut reboot_paths: Vec<String> = db.rels[rel("reboot_path")].iter().map(|r| text(r[0])).collect();
            reboot_paths.sort();
            Some(MachineVerdict { status: text(row[0]), reason: text(row[1]), message: text(row[2]), reboot_paths })
        });
        Ok(Outcome { contract, verdict, changes: out, rejected, machine, db })
    }

    /// The sentence that explains a path's class to an operator.
    pub fn why(&self, contract: Contract, c: &Classified) -> String {
        match c.reason {
            Reason::Entry(e) => self.meta.entries[e].why.clone(),
            Reason::Unsupported => format!(
                "The Talos {contract} contract has no such path (rules/contracts/{contract}.paths): Talos would refuse it at this contract; remove it or change the contract."
            ),
            Reason::Ambiguous => "Field-metadata entries of equal specificity disagree about this path, so Ichor fails closed and treats it as needing a reboot; make one entry more specific.".into(),
            Reason::Default => "No field-metadata entry decides this path, so Ichor fails closed and treats it as needing a reboot; add an entry to rules/fieldmeta.yaml.".into(),
        }
    }

    pub fn restarts(&self, c: &Classified) -> &[String] {
        c.entry().map_or(&[], |e| &self.meta.entries[e].restarts)
    }

    pub fn applied_by(&self, c: &Classified) -> Option<&str> {
        c.entry().and_then(|e| self.meta.entries[e].applied_by.as_deref())
    }

    /// The proof of a path's class (the outcome must have been evaluated with provenance).
    pub fn proof(&self, outcome: &Outcome, path: &Path, c: &Classified) -> Option<engine::explain::Proof> {
        let entry = match c.reason {
            Reason::Entry(e) => e as i64,
            Reason::Default => -1,
            Reason::Ambiguous => -2,
            Reason::Unsupported => -3,
        };
        let values = vec![Const::Sym(path.to_string()), Const::Sym(c.class.to_string()), Const::Num(entry)];
        match engine::explain::explain(&self.engine.program, &outcome.db, "class_of", &values) {
            Ok(engine::explain::Explanation::Holds(p)) => Some(p),
            _ => None,
        }
    }
}
