//! Classification: facts for the rules, the rules' answers decoded, with proofs.
//!
//! Start at `Classifier::new` (field metadata, inventories and rule files, all validated; the
//! program compiled once) and `Classifier::classify` (changed paths, and optionally the
//! desired config, in; a class per path, the verdict and Talos's refusals out). Matching
//! paths against field-metadata patterns happens here, once per path, with the contract's
//! pattern trie; which entry wins, the default, the verdict and the refusals are decided by
//! `rules/classify.rules` and `rules/talos-accepts.rules`.

use crate::api::{DriftPolicy, KubeProxyMode, Role};
use crate::config::Config;
use crate::diff::Change;
use crate::fieldmeta::{FieldMeta, Matcher, MetaError};
use crate::inventory::Inventory;
use crate::path::Path;
use crate::vocab::{Class, Contract, Effect, Verdict};
use engine::{Binder, Const, Database, Demand, Engine, EvalOptions, Input, MemSources, Output};
use std::collections::{BTreeMap, HashMap};

/// The relations the config host fills and reads, bound to the program once at load. Their
/// meaning, column by column, is in `rules/programs/config.rules` (inputs) and the rule files
/// that derive the outputs.
#[derive(Clone, Copy, Debug)]
struct Rels {
    change: Input<1>,
    exists: Input<1>,
    candidate: Input<3>,
    entry_class: Input<2>,
    document: Input<1>,
    machine_type: Input<1>,
    present: Input<1>,
    contract: Input<1>,
    value: Input<2>,
    filled: Input<1>,
    item: Input<3>,
    cidr: Input<2>,
    b64_bytes: Input<2>,
    document_name: Input<2>,
    machine_role: Input<1>,
    entry_restarts: Input<2>,
    consent: Input<1>,
    spec_kube_proxy: Input<1>,
    status_kube_proxy: Input<1>,
    inputs_unchanged: Input<0>,
    drift_policy: Input<1>,
    render_failed: Input<1>,
    node_unreachable: Input<1>,
    entry_applied_by: Input<2>,
    operation_in_progress: Input<2>,
    applied_awaiting_reboot: Input<1>,
    policy_candidate: Input<2>,
    policy_class: Input<2>,
    at_contract: Input<1>,
    entry_effect: Input<2>,
    moved_change: Input<2>,
    legacy_node: Input<1>,
    legacy_leaf: Input<1>,
    under: Input<2>,
    legacy_value: Input<2>,
    legacy_filled: Input<1>,
    t_moved: Output<3>,
    t_negated: Output<3>,
    t_moved_each: Output<3>,
    t_each_field: Output<3>,
    t_implied: Output<3>,
    t_implied_add: Output<3>,
    t_decoded: Output<3>,
    migrate_decoded: Output<3>,
    migrate_move: Output<3>,
    migrate_negated: Output<3>,
    migrate_each: Output<3>,
    migrate_field: Output<3>,
    migrate_drop: Output<2>,
    migrate_kept: Output<3>,
    migrate_finding: Output<3>,
    migrate_add: Output<2>,
    nothing_to_migrate: Output<0>,
    effect: Output<2>,
    no_effect: Output<2>,
    decided_by_policy: Output<3>,
    meta_class: Output<3>,
    class_of: Output<3>,
    decided_by: Output<3>,
    verdict: Output<1>,
    rejected: Output<2>,
    machine_ready: Output<3>,
    reboot_path: Output<1>,
    apply_live: Output<1>,
}

impl Rels {
    fn bind(program: &engine::Program) -> Result<Rels, engine::BindError> {
        use engine::Type::{Number as N, Symbol as S};
        let mut b = Binder::new(program, "config");
        let rels = Rels {
            change: b.input("change", [("path", S)]),
            exists: b.input("exists", [("path", S)]),
            candidate: b.input("candidate", [("path", S), ("entry", N), ("specificity", N)]),
            entry_class: b.input("entry_class", [("entry", N), ("class", S)]),
            document: b.input("document", [("kind", S)]),
            machine_type: b.input("machine_type", [("type", S)]),
            present: b.input("present", [("path", S)]),
            contract: b.input("contract", [("version", S)]),
            value: b.input("value", [("path", S), ("text", S)]),
            filled: b.input("filled", [("path", S)]),
            item: b.input("item", [("list", S), ("index", N), ("path", S)]),
            cidr: b.input("cidr", [("path", S), ("family", S)]),
            b64_bytes: b.input("b64_bytes", [("path", S), ("n", N)]),
            document_name: b.input("document_name", [("kind", S), ("name", S)]),
            machine_role: b.input("machine_role", [("role", S)]),
            entry_restarts: b.input("entry_restarts", [("entry", N), ("service", S)]),
            consent: b.input("consent", [("mode", S)]),
            spec_kube_proxy: b.input("spec_kube_proxy", [("mode", S)]),
            status_kube_proxy: b.input("status_kube_proxy", [("mode", S)]),
            inputs_unchanged: b.input("inputs_unchanged", []),
            drift_policy: b.input("drift_policy", [("policy", S)]),
            render_failed: b.input("render_failed", [("problem", S)]),
            node_unreachable: b.input("node_unreachable", [("why", S)]),
            entry_applied_by: b.input("entry_applied_by", [("entry", N), ("operation", S)]),
            operation_in_progress: b.input("operation_in_progress", [("name", S), ("kind", S)]),
            applied_awaiting_reboot: b.input("applied_awaiting_reboot", [("path", S)]),
            policy_candidate: b.input("policy_candidate", [("path", S), ("policy", N)]),
            policy_class: b.input("policy_class", [("policy", N), ("class", S)]),
            at_contract: b.input("at_contract", [("version", S)]),
            entry_effect: b.input("entry_effect", [("entry", N), ("effect", S)]),
            moved_change: b.input("moved_change", [("path", S), ("other", S)]),
            legacy_node: b.input("legacy_node", [("path", S)]),
            legacy_leaf: b.input("legacy_leaf", [("path", S)]),
            under: b.input("under", [("leaf", S), ("ancestor", S)]),
            legacy_value: b.input("legacy_value", [("path", S), ("text", S)]),
            legacy_filled: b.input("legacy_filled", [("path", S)]),
            t_moved: b.output("moved", [("from", S), ("to", S), ("group", S)]),
            t_negated: b.output("negated", [("from", S), ("to", S), ("group", S)]),
            t_moved_each: b.output("moved_each", [("list", S), ("kind", S), ("group", S)]),
            t_each_field: b.output("each_field", [("list", S), ("from", S), ("to", S)]),
            t_implied: b.output("implied_by_document", [("leaf", S), ("value", S), ("group", S)]),
            t_implied_add: b.output("implied_add", [("path", S), ("value", S), ("group", S)]),
            t_decoded: b.output("decoded_pair", [("from", S), ("to", S), ("group", S)]),
            migrate_decoded: b.output("migrate_decoded", [("from", S), ("to", S), ("group", S)]),
            migrate_move: b.output("migrate_move", [("from", S), ("to", S), ("group", S)]),
            migrate_negated: b.output("migrate_negated", [("from", S), ("to", S), ("group", S)]),
            migrate_each: b.output("migrate_each", [("list", S), ("kind", S), ("group", S)]),
            migrate_field: b.output("migrate_field", [("list", S), ("from", S), ("to", S)]),
            migrate_drop: b.output("migrate_drop", [("leaf", S), ("group", S)]),
            migrate_kept: b.output("migrate_kept", [("group", S), ("leaf", S), ("why", S)]),
            migrate_finding: b.output("migrate_finding", [("code", S), ("at", S), ("message", S)]),
            migrate_add: b.output("migrate_add", [("path", S), ("value", S)]),
            nothing_to_migrate: b.output("nothing_to_migrate", []),
            effect: b.output("effect", [("path", S), ("effect", S)]),
            no_effect: b.output("no_effect", [("path", S), ("because", S)]),
            decided_by_policy: b.output("decided_by_policy", [("path", S), ("class", S), ("policy", N)]),
            meta_class: b.output("meta_class", [("path", S), ("class", S), ("reason", S)]),
            class_of: b.output("class_of", [("path", S), ("class", S), ("reason", S)]),
            decided_by: b.output("decided_by", [("path", S), ("class", S), ("entry", N)]),
            verdict: b.output("verdict", [("verdict", S)]),
            rejected: b.output("rejected", [("message", S), ("at", S)]),
            machine_ready: b.output("machine_ready", [("status", S), ("reason", S), ("message", S)]),
            reboot_path: b.output("reboot_path", [("path", S)]),
            apply_live: b.output("apply_live", [("path", S)]),
        };
        b.finish()?;
        Ok(rels)
    }
}

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
    /// The field metadata: its file name and text.
    pub fieldmeta: (String, String),
    /// Every rules file the program may include, by the name it is included as.
    pub rules: Vec<(String, String)>,
    /// The program's root file (one of `rules`), which includes the rest.
    pub root: String,
    /// Each contract's inventory: its file name and text.
    pub contracts: Vec<(String, String)>,
}

impl RuleSet {
    /// The rules this build was compiled with.
    pub fn embedded() -> RuleSet {
        let own = |(a, b): &(&str, &str)| (a.to_string(), b.to_string());
        RuleSet {
            fieldmeta: own(&crate::embedded::FIELDMETA),
            rules: crate::embedded::RULE_FILES.iter().map(own).collect(),
            root: crate::embedded::CONFIG_PROGRAM.to_string(),
            contracts: crate::embedded::CONTRACTS.iter().map(own).collect(),
        }
    }
}

/// Why the rules cannot be used; every problem, each with its file and line
/// (`path:line:col: error: message` or `path:line: message`), in the order found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the rules do not load ({} problem(s)); fix them and run `ichor rules check`", problems.len())]
pub struct LoadError {
    /// Every problem, each with its position.
    pub problems: Vec<String>,
}

/// One contract's paths, and the matcher of field-metadata patterns over them.
pub struct ContractData {
    /// The contract's config paths and their types.
    pub inventory: Inventory,
    /// The field-metadata patterns that hold at the contract, compiled for matching.
    pub matcher: Matcher,
}

/// The classifier: field metadata and the classification rules, with each contract's paths, built once.
pub struct Classifier {
    /// The field metadata.
    pub meta: FieldMeta,
    /// The field metadata's file name (for positions).
    pub fieldmeta_file: String,
    /// Each contract's paths and matcher.
    pub contracts: BTreeMap<Contract, ContractData>,
    /// The classification program (rules/programs/config.rules), compiled.
    pub engine: Engine,
    rels: Rels,
    /// What a classification reads (the classes, the verdict, Talos's refusals), and that plus
    /// the machine's condition: only the rules these need run.
    changes_demand: Demand,
    machine_demand: Demand,
    migrate_demand: Demand,
    /// Where each legacy field lives in the v1.14 documents (rules/migrate.rules' tables), for
    /// telling moves in a diff.
    pub moves: crate::migrate::Table,
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
    /// This fleet's policy (the cluster's `spec.configPolicy[i]`) raises it.
    Policy(usize),
    /// The same value moved between a legacy field and its v1.14 document.
    Moved,
}

/// The class of one changed path; `Outcome::changes[i]` answers for the caller's `changes[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Classified {
    /// The path's class.
    pub class: Class,
    /// What decided it.
    pub reason: Reason,
    /// What Talos itself does with the change at the contract (none: no field-metadata entry
    /// decides the path, or the contract lacks it).
    pub effect: Option<Effect>,
    /// The field-metadata entry that decides the path's class by the metadata (also when this
    /// fleet's policy raised it): the entry that says what Talos does.
    pub meta_entry: Option<usize>,
    /// The path holds a secret: its values are never shown.
    pub sensitive: bool,
}

impl Reason {
    /// The reason's symbol in `class_of` (rules/classify.rules).
    pub fn symbol(self) -> &'static str {
        match self {
            Reason::Entry(_) => "entry",
            Reason::Default => "default",
            Reason::Ambiguous => "ambiguous",
            Reason::Unsupported => "not-in-contract",
            Reason::Policy(_) => "policy",
            Reason::Moved => "moved",
        }
    }

    /// The reason a `class_of` symbol names; `entry` is `None` (its entry is in `decided_by`).
    fn from_symbol(s: &str) -> Option<Reason> {
        [Reason::Default, Reason::Ambiguous, Reason::Unsupported, Reason::Moved].into_iter().find(|r| r.symbol() == s)
    }
}

impl Classified {
    /// The field of the policy that decided the class (`spec.configPolicy[0]`), when one did.
    pub fn policy_field(&self) -> Option<String> {
        match self.reason {
            Reason::Policy(i) => Some(format!("spec.configPolicy[{i}]")),
            _ => None,
        }
    }

    /// The policy that decided the class, when one did.
    pub fn reason_policy<'a>(&self, policy: &'a [crate::api::PathPolicy]) -> Option<&'a crate::api::PathPolicy> {
        match self.reason {
            Reason::Policy(i) => policy.get(i),
            _ => None,
        }
    }

    /// The field-metadata entry that decided the class, when one did.
    pub fn entry(&self) -> Option<usize> {
        match self.reason {
            Reason::Entry(e) => Some(e),
            _ => None,
        }
    }
}

/// The cluster and machine context of a machine's classification (`config diff --manifests`).
/// Hashed into the machine controller's verdict key: the same inputs, running config and
/// context judge the same.
#[derive(Clone, Debug, Default, Hash, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct MachineContext {
    /// The machine's role.
    pub role: Role,
    /// The consent annotation's value, if the cluster carries it (any text: the rules compare
    /// it with the spec's mode).
    pub consent: Option<String>,
    /// The cluster's `spec.cni.kubeProxy`.
    pub spec_kube_proxy: KubeProxyMode,
    /// The cluster's `status.cni.kubeProxy`, once a switch set it.
    pub status_kube_proxy: Option<KubeProxyMode>,
    /// The desired-inputs hash equals the machine's recorded one.
    pub inputs_unchanged: bool,
    /// The cluster's path policies (`spec.configPolicy`): stricter classes for its paths.
    pub policy: Vec<crate::api::PathPolicy>,
    /// The cluster's drift policy.
    pub drift_policy: DriftPolicy,
    /// The machine's render failed (or the custom resources do not load), with every problem:
    /// the rules make it `ConfigRejected` (nothing else is judged).
    pub render_failed: Option<String>,
    /// The node could not be read, with why: the rules make it `Unknown` / `NodeUnreachable`.
    pub node_unreachable: Option<String>,
    /// An operation of the cluster that has not ended (its name and kind): the machine is left
    /// to it, and the paths that kind applies are its, not a reboot's.
    pub operation_in_progress: Option<(String, crate::api::OperationKind)>,
    /// Reboot-class paths whose running value changed within the node's current boot
    /// (`render::boot`): applied, they take effect after the next reboot.
    pub applied_awaiting_reboot: Vec<String>,
}

/// Why a classification could not run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClassifyError {
    #[error("no inventory for contract {contract}: add rules/contracts/{contract}.paths")]
    /// The classifier has no inventory for the contract.
    UnknownContract {
        /// The contract asked for.
        contract: Contract,
    },
    #[error("evaluating the classification rules")]
    /// The rules failed to evaluate.
    Eval(#[from] engine::EvalError),
}

/// A contract name that is not one the rules know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    #[error("{name:?} is not a contract name: write vX.Y, one of {known}")]
    /// The name is not `vX.Y`.
    Syntax {
        /// The name given.
        name: String,
        /// The contracts known, joined.
        known: String,
    },
    #[error("unknown contract {contract}: known contracts are {known}")]
    /// The contract is not one the rules have.
    Unknown {
        /// The contract given.
        contract: Contract,
        /// The contracts known, joined.
        known: String,
    },
}

/// A machine's condition, decided by rules/machine.rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineVerdict {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why, in one CamelCase word (rules/machine.rules).
    pub reason: String,
    /// Why, as a sentence that says what to do.
    pub message: String,
    /// The paths that need a reboot to converge.
    pub reboot_paths: Vec<String>,
    /// The paths the machine controller applies live (`apply_live` in rules/machine.rules).
    pub apply_paths: Vec<String>,
    /// Every changed path with its class and effect, in path order (the status's
    /// `pendingChanges`).
    pub pending: Vec<crate::api::PendingChange>,
}

/// Talos would refuse the desired config (`vocab::Rejection`: a migration reports them too).
pub use crate::vocab::Rejection;

/// What a classification found: the verdict, each change's class, Talos's refusals.
pub struct Outcome {
    /// The contract classified at.
    pub contract: Contract,
    /// The verdict over every change.
    pub verdict: Verdict,
    /// Each change's class, in the order of the changes given.
    pub changes: Vec<Classified>,
    /// For each change, why it has no effect in the desired config, when the rules say so
    /// (`no_effect`), in the order of the changes given.
    pub no_effect: Vec<Option<String>>,
    /// For each change that only moves (`Reason::Moved`), the path at the other end of the move.
    pub moved_to: Vec<Option<String>>,
    /// What Talos would refuse in the desired config.
    pub rejected: Vec<Rejection>,
    /// The machine's condition, when classified with its context.
    pub machine: Option<MachineVerdict>,
    /// The evaluation, with provenance, for proofs.
    pub db: Database,
}

impl Classifier {
    /// Loads and checks the rule set: the field metadata against each inventory, the program against its hosts.
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
        // Every relation the host fills or reads must be declared, with its columns' types.
        let bound = Engine::load(std::slice::from_ref(&set.root), &MemSources(files))
            .and_then(|(engine, _)| Ok((Rels::bind(&engine.program)?, engine)));
        let (rels, engine) = match bound {
            Ok((rels, engine)) => (Some(rels), Some(engine)),
            Err(e) => {
                problems
                    .extend(e.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.display(&e.sources).to_string()));
                (None, None)
            }
        };
        let (Some(meta), Some(engine), Some(rels), true) = (meta, engine, rels, problems.is_empty()) else {
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
        let read = [
            rels.class_of.id(),
            rels.decided_by.id(),
            rels.decided_by_policy.id(),
            rels.effect.id(),
            rels.no_effect.id(),
            rels.verdict.id(),
            rels.rejected.id(),
        ];
        let changes_demand = engine.demand(&read);
        let migrate_demand = engine.demand(&[
            rels.migrate_move.id(),
            rels.migrate_negated.id(),
            rels.migrate_decoded.id(),
            rels.migrate_each.id(),
            rels.migrate_field.id(),
            rels.migrate_drop.id(),
            rels.migrate_kept.id(),
            rels.migrate_finding.id(),
            rels.migrate_add.id(),
            rels.nothing_to_migrate.id(),
        ]);
        let moves = match move_table(&engine, &rels) {
            Ok(t) => t,
            Err(e) => return Err(LoadError { problems: vec![format!("evaluating rules/migrate.rules' tables: {e}")] }),
        };
        let machine_demand = engine
            .demand(&[&read[..], &[rels.machine_ready.id(), rels.reboot_path.id(), rels.apply_live.id()]].concat());
        Ok(Classifier {
            meta,
            fieldmeta_file: meta_file.clone(),
            contracts,
            engine,
            rels,
            changes_demand,
            machine_demand,
            migrate_demand,
            moves,
        })
    }

    /// The contracts the classifier has inventories for, in order.
    pub fn known(&self) -> Vec<Contract> {
        self.contracts.keys().copied().collect()
    }

    /// The contract named `name`, or an error listing the known ones.
    pub fn contract(&self, name: &str) -> Result<Contract, ContractError> {
        let known = self.known().iter().map(Contract::to_string).collect::<Vec<_>>().join(", ");
        let c = Contract::parse(name)
            .ok_or_else(|| ContractError::Syntax { name: name.to_string(), known: known.clone() })?;
        if !self.contracts.contains_key(&c) {
            return Err(ContractError::Unknown { contract: c, known });
        }
        Ok(c)
    }

    /// Whether a path's value must never be shown at this contract.
    pub fn sensitive(&self, contract: Contract, path: &Path) -> bool {
        let Some(d) = self.contracts.get(&contract) else {
            return true; // an unknown contract: fail closed, show nothing
        };
        d.matcher.secret(path)
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
    ) -> Result<Outcome, ClassifyError> {
        self.classify_machine(contract, changes, desired, None, provenance)
    }

    /// `classify` under a cluster's path policies (`spec.configPolicy`), as `config explain
    /// --manifests` shows them; with the desired config, what depends on its values (a path
    /// with no effect in it) too.
    pub fn classify_with_policy(
        &self,
        contract: Contract,
        changes: &[Change],
        desired: Option<&Config>,
        policy: &[crate::api::PathPolicy],
        provenance: bool,
    ) -> Result<Outcome, ClassifyError> {
        self.classify_full(contract, changes, desired, None, policy, provenance)
    }

    /// `classify` with the machine's context: also decides its Ready condition.
    pub fn classify_machine(
        &self,
        contract: Contract,
        changes: &[Change],
        desired: Option<&Config>,
        machine: Option<&MachineContext>,
        provenance: bool,
    ) -> Result<Outcome, ClassifyError> {
        let policy = machine.map(|m| &m.policy[..]).unwrap_or(&[]);
        self.classify_full(contract, changes, desired, machine, policy, provenance)
    }

    fn classify_full(
        &self,
        contract: Contract,
        changes: &[Change],
        desired: Option<&Config>,
        machine: Option<&MachineContext>,
        policy: &[crate::api::PathPolicy],
        provenance: bool,
    ) -> Result<Outcome, ClassifyError> {
        let (data, mut b) = self.facts_at(contract)?;
        let r = self.rels;
        for (e, entry) in self.meta.entries.iter().enumerate() {
            if !entry.holds_at(contract) {
                continue;
            }
            if let Some(class) = entry.class {
                let row = [b.num(e as i64), b.sym(class.name())];
                r.entry_class.push(&mut b, row);
            }
            if let Some(effect) = entry.effect {
                let row = [b.num(e as i64), b.sym(effect.name())];
                r.entry_effect.push(&mut b, row);
            }
            for svc in &entry.restarts {
                let row = [b.num(e as i64), b.sym(svc)];
                r.entry_restarts.push(&mut b, row);
            }
            if let Some(op) = &entry.applied_by {
                let row = [b.num(e as i64), b.sym(op)];
                r.entry_applied_by.push(&mut b, row);
            }
        }
        // The policies' patterns (admission refused any that do not parse; one that does not
        // here matches nothing) and classes.
        let policies: Vec<(Vec<crate::path::Pattern>, Class)> = policy
            .iter()
            .map(|p| (p.paths.iter().filter_map(|t| crate::path::Pattern::new(t).ok()).collect(), p.class.class()))
            .collect();
        for (i, (_, class)) in policies.iter().enumerate() {
            let row = [b.num(i as i64), b.sym(class.name())];
            r.policy_class.push(&mut b, row);
        }
        // Entry numbers and specificities are small: interned once each.
        let mut nums = SmallNums::default();
        // Each path is interned once; its id finds its change again when decoding.
        let mut by_id: Vec<usize> = vec![];
        let mut sensitive = Vec::with_capacity(changes.len());
        // Moves between a legacy field and its document, with the same value: facts for the rules.
        let moves = self.moves.moves_in(changes);
        let (mut cands, mut scratch) = (vec![], (vec![], vec![]));
        b.reserve_syms(changes.len());
        b.reserve(r.change.id(), changes.len());
        b.reserve(r.exists.id(), changes.len());
        b.reserve(r.candidate.id(), changes.len() + changes.len() / 4);
        for (i, ch) in changes.iter().enumerate() {
            let id = b.sym_owned(ch.path.text());
            if by_id.len() <= id as usize {
                by_id.resize(id as usize + 1, usize::MAX);
            }
            by_id[id as usize] = i;
            r.change.push(&mut b, [id]);
            if data.inventory.contains(&ch.path) {
                r.exists.push(&mut b, [id]);
            }
            let secret = data.matcher.candidates_into(&ch.path, &mut cands, &mut scratch);
            for &(e, spec) in &cands {
                let row = [id, nums.get(&mut b, e as i64), nums.get(&mut b, spec)];
                r.candidate.push(&mut b, row);
            }
            for (i, _) in policies.iter().enumerate().filter(|(_, (pats, _))| pats.iter().any(|p| p.matches(&ch.path)))
            {
                let row = [id, nums.get(&mut b, i as i64)];
                r.policy_candidate.push(&mut b, row);
            }
            sensitive.push(secret);
        }
        for (&i, other) in &moves {
            let row = [b.sym_owned(changes[i].path.text()), b.sym(other)];
            r.moved_change.push(&mut b, row);
        }
        if let Some(cfg) = desired {
            desired_facts(&mut b, &r, data, contract, cfg);
        }
        if let Some(m) = machine {
            machine_facts(&mut b, &r, m);
        }
        // Only what the answers read is evaluated: the machine's rules only with its context.
        let demand = if machine.is_some() { &self.machine_demand } else { &self.changes_demand };
        let db = self.engine.evaluate_built_for(b, EvalOptions { provenance, ..EvalOptions::default() }, demand)?;
        let mut out: Vec<Classified> = sensitive
            .iter()
            .map(|&s| Classified {
                class: Class::RebootRequired,
                reason: Reason::Default,
                effect: None,
                meta_entry: None,
                sensitive: s,
            })
            .collect();
        let mut no_effect = vec![None; out.len()];
        let mut moved_to: Vec<Option<String>> = vec![None; out.len()];
        let change_of = |id: u32| by_id.get(id as usize).copied().filter(|&i| i != usize::MAX);
        for [path, class, reason] in r.class_of.rows(&db) {
            let Some(i) = change_of(path) else { continue };
            // An unknown class from the rules fails closed, as a missing one does.
            out[i].class = Class::parse(db.sym(class)).unwrap_or(Class::RebootRequired);
            // `entry` reasons get their entry from `decided_by` below.
            if let Some(r) = Reason::from_symbol(db.sym(reason)) {
                out[i].reason = r;
            }
        }
        for [path, _, entry] in r.decided_by.rows(&db) {
            if let (Some(i), Ok(e)) = (change_of(path), usize::try_from(db.num(entry))) {
                out[i].reason = Reason::Entry(e);
                out[i].meta_entry = Some(e);
            }
        }
        // A path this fleet's policy raises: the policy decides it, whatever entry matched.
        for [path, _, policy] in r.decided_by_policy.rows(&db) {
            if let (Some(i), Ok(p)) = (change_of(path), usize::try_from(db.num(policy))) {
                out[i].reason = Reason::Policy(p);
            }
        }
        for [path, effect] in r.effect.rows(&db) {
            if let Some(i) = change_of(path) {
                out[i].effect = Effect::parse(db.sym(effect));
            }
        }
        for (i, k) in out.iter().enumerate() {
            if k.reason == Reason::Moved {
                moved_to[i] = moves.get(&i).cloned();
            }
        }
        for [path, because] in r.no_effect.rows(&db) {
            if let Some(i) = change_of(path) {
                no_effect[i] = Some(db.sym(because).to_string());
            }
        }
        let verdict = r.verdict.rows(&db).find_map(|[v]| Verdict::parse(db.sym(v))).unwrap_or(Verdict::RebootRequired);
        let mut rejected: Vec<Rejection> = r
            .rejected
            .rows(&db)
            .map(|[m, a]| Rejection { message: db.sym(m).to_string(), at: db.sym(a).to_string() })
            .collect();
        rejected.sort();
        let machine = machine.and_then(|_| machine_verdict(&r, &db, changes, &out));
        Ok(Outcome { contract, verdict, changes: out, no_effect, moved_to, rejected, machine, db })
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
            Reason::Policy(i) => format!("This fleet's policy (the TalosCluster's spec.configPolicy[{i}]) makes it {}, stricter than Talos needs.", c.class),
            Reason::Moved => "Only moved: the same value between a legacy v1alpha1 field and its v1.14 document (rules/migrate.rules); Talos reads it from the new place, so nothing changes on the node.".into(),
        }
    }

    /// `why`, with the policy's own words when a policy decided it.
    pub fn why_with(&self, contract: Contract, c: &Classified, policy: &[crate::api::PathPolicy]) -> String {
        match (c.reason, c.reason_policy(policy)) {
            (Reason::Policy(i), Some(p)) if !p.why.is_empty() => {
                format!(
                    "This fleet's policy (the TalosCluster's spec.configPolicy[{i}], {}) makes it {}: {}",
                    p.paths.join(", "),
                    c.class,
                    p.why
                )
            }
            _ => self.why(contract, c),
        }
    }

    /// The services a change restarts (its entry's `restarts`).
    /// A path this fleet's policy raised keeps its entry's: the policy changes when Ichor
    /// applies it, not what applying it restarts.
    pub fn restarts(&self, c: &Classified) -> &[String] {
        c.meta_entry.map_or(&[], |e| &self.meta.entries[e].restarts)
    }

    /// The operation that applies a change, when only one may (its entry's `appliedBy`; the
    /// machine rules' `operation_path` reads the same entry, policy or not).
    pub fn applied_by(&self, c: &Classified) -> Option<&str> {
        c.meta_entry.and_then(|e| self.meta.entries[e].applied_by.as_deref())
    }

    /// What Talos itself does with the change, in an operator's words (`live, restarts
    /// kubelet`, `applied, takes effect after a reboot`), when the rules derived it.
    pub fn effect_label(&self, c: &Classified) -> Option<String> {
        c.effect.map(|x| x.label(self.restarts(c), self.applied_by(c)))
    }

    /// The rule that derived a path's effect (`effect_by_entry` or `no_effect` in
    /// rules/classify.rules, whose comment cites the fact it rests on); the outcome must have
    /// been evaluated with provenance.
    pub fn effect_rule(&self, outcome: &Outcome, path: &Path, c: &Classified) -> Option<engine::explain::RuleRef> {
        use engine::explain::{Explanation, Proof};
        let effect = c.effect?;
        let name = &self.engine.program.relations[self.rels.effect.id()].name;
        let values = vec![Const::Sym(path.to_string()), Const::Sym(effect.name().into())];
        let Ok(Explanation::Holds(Proof::Rule { rule, premises, .. })) =
            engine::explain::explain(&self.engine.program, &outcome.db, name, &values)
        else {
            return None;
        };
        // `effect` only passes on what its premise derived: that premise's rule says why.
        let inner = premises.into_iter().find_map(|p| match p {
            Proof::Rule { fact, premises, .. } if fact.starts_with("dead(") => {
                premises.into_iter().find_map(|q| match q {
                    Proof::Rule { rule, .. } => Some(rule),
                    Proof::Input { .. } => None,
                })
            }
            Proof::Rule { rule, .. } => Some(rule),
            Proof::Input { .. } => None,
        });
        Some(inner.unwrap_or(rule))
    }

    /// The proof of a path's class (the outcome must have been evaluated with provenance).
    pub fn proof(&self, outcome: &Outcome, path: &Path, c: &Classified) -> Option<engine::explain::Proof> {
        let (rel, last) = match c.reason {
            Reason::Entry(e) => (self.rels.decided_by.id(), Const::Num(e as i64)),
            Reason::Policy(i) => (self.rels.decided_by_policy.id(), Const::Num(i as i64)),
            // The field metadata's own reason (the default, ambiguity, not in the contract).
            other => (self.rels.meta_class.id(), Const::Sym(other.symbol().into())),
        };
        let values = vec![Const::Sym(path.to_string()), Const::Sym(c.class.to_string()), last];
        let name = &self.engine.program.relations[rel].name;
        match engine::explain::explain(&self.engine.program, &outcome.db, name, &values) {
            Ok(engine::explain::Explanation::Holds(p)) => Some(p),
            _ => None,
        }
    }
}

impl Classifier {
    /// The contract's data and a fact builder that states the contract (`at_contract`): how
    /// every evaluation of the config program starts.
    fn facts_at(&self, contract: Contract) -> Result<(&ContractData, engine::FactBuilder), ClassifyError> {
        let data = self.contracts.get(&contract).ok_or(ClassifyError::UnknownContract { contract })?;
        let mut b = self.engine.fact_builder();
        let row = [b.sym(&contract.to_string())];
        self.rels.at_contract.push(&mut b, row);
        Ok((data, b))
    }

    /// The migration of `cfg` to the v1.14 documents at `contract` (`ichor config migrate`): the
    /// rules (rules/migrate.rules) decide what moves, what stays and what needs a decision;
    /// `migrate::perform` moves it; the result is checked by the same rules as a render (what
    /// Talos would refuse).
    pub fn migrate(&self, contract: Contract, cfg: &Config) -> Result<crate::migrate::Migration, ClassifyError> {
        use crate::migrate::{Decisions, Finding, Kept, scalar_text};
        let (data, mut b) = self.facts_at(contract)?;
        let r = self.rels;
        for d in cfg.docs.iter().filter(|d| d.kind.is_some()) {
            let kind = b.sym(d.kind.as_deref().unwrap_or_default());
            r.document.push(&mut b, [kind]);
        }
        let mut nodes = std::collections::BTreeSet::new();
        for (path, v) in cfg.leaves() {
            if matches!(path.segs.first(), Some(crate::path::Seg::Field(k)) if k.starts_with(|c: char| c.is_ascii_uppercase()))
            {
                continue;
            }
            let leaf = b.sym(&path.to_string());
            r.legacy_leaf.push(&mut b, [leaf]);
            for n in 1..=path.segs.len() {
                let anc = Path { segs: path.segs[..n].to_vec() }.to_string();
                let a = b.sym(&anc);
                r.under.push(&mut b, [leaf, a]);
                nodes.insert(anc);
            }
            if !data.matcher.secret(&path)
                && let Some(t) = scalar_text(&v)
            {
                let row = [leaf, b.sym(&t)];
                r.legacy_value.push(&mut b, row);
            }
            if leaf_facts(&v).filled {
                r.legacy_filled.push(&mut b, [leaf]);
            }
        }
        for n in &nodes {
            let id = b.sym(n);
            r.legacy_node.push(&mut b, [id]);
        }
        let db = self.engine.evaluate_built_for(b, EvalOptions::default(), &self.migrate_demand)?;
        let path = |id: u32| Path::parse(db.sym(id)).ok();
        let text = |id: u32| db.sym(id).to_string();
        let (moves, negated, each) =
            decode_moves(&db, [r.migrate_move, r.migrate_negated, r.migrate_each, r.migrate_field]);
        let triples = |rel: Output<3>| -> Vec<(Path, Path, String)> {
            rel.rows(&db).filter_map(|[f, t, g]| Some((path(f)?, path(t)?, text(g)))).collect()
        };
        let d = Decisions {
            moves,
            negated,
            decoded: triples(r.migrate_decoded),
            each,
            drops: r.migrate_drop.rows(&db).filter_map(|[l, g]| Some((path(l)?, text(g)))).collect(),
            adds: r.migrate_add.rows(&db).filter_map(|[p, v]| Some((path(p)?, text(v)))).collect(),
            kept: r
                .migrate_kept
                .rows(&db)
                .map(|[g, l, w]| Kept { group: text(g), leaf: text(l), why: text(w) })
                .collect(),
            findings: r
                .migrate_finding
                .rows(&db)
                .map(|[c, a, m]| Finding { code: text(c), at: text(a), message: text(m) })
                .collect(),
            nothing: r.nothing_to_migrate.rows(&db).next().is_some(),
        };
        let secret = |p: &Path| data.matcher.secret(p);
        let mut m = crate::migrate::perform(cfg, &d, &secret);
        // Kept: each field the table says has no home, and one line for the others of a group.
        let mut seen = std::collections::BTreeSet::new();
        m.kept.retain(|k| seen.insert((k.group.clone(), k.why.clone())));
        if !m.nothing {
            m.rejected = self.classify(contract, &[], Some(&m.config), false)?.rejected;
        }
        Ok(m)
    }
}

/// Moves (from, to, group), negated moves of that shape, and list moves with their fields.
type Moves = (Vec<(Path, Path, String)>, Vec<(Path, Path, String)>, Vec<crate::migrate::EachMove>);

/// The moves, negated moves and list moves (list, kind, group) with their fields (list, from,
/// to), decoded from those four relations, in that order.
fn decode_moves(db: &Database, [moved, negated, each, fields]: [Output<3>; 4]) -> Moves {
    let path = |id: u32| Path::parse(db.sym(id)).ok();
    let text = |id: u32| db.sym(id).to_string();
    let triples = |rel: Output<3>| -> Vec<(Path, Path, String)> {
        rel.rows(db).filter_map(|[f, t, g]| Some((path(f)?, path(t)?, text(g)))).collect()
    };
    let mut by_list: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for [l, f, t] in fields.rows(db) {
        by_list.entry(text(l)).or_default().push((text(f), text(t)));
    }
    let each = each
        .rows(db)
        .filter_map(|[l, k, g]| Some((path(l)?, text(k), by_list.get(db.sym(l)).cloned().unwrap_or_default(), text(g))))
        .collect();
    (triples(moved), triples(negated), each)
}

/// rules/migrate.rules' tables, evaluated once at load.
fn move_table(engine: &Engine, r: &Rels) -> Result<crate::migrate::Table, engine::EvalError> {
    let demand = engine.demand(&[
        r.t_moved.id(),
        r.t_negated.id(),
        r.t_moved_each.id(),
        r.t_each_field.id(),
        r.t_implied.id(),
        r.t_implied_add.id(),
        r.t_decoded.id(),
    ]);
    let db = engine.evaluate_built_for(engine.fact_builder(), EvalOptions::default(), &demand)?;
    let path = |id: u32| Path::parse(db.sym(id)).ok();
    let text = |id: u32| db.sym(id).to_string();
    let (moved, negated, each) = decode_moves(&db, [r.t_moved, r.t_negated, r.t_moved_each, r.t_each_field]);
    let decoded = r.t_decoded.rows(&db).filter_map(|[f, t, g]| Some((path(f)?, path(t)?, text(g)))).collect();
    Ok(crate::migrate::Table {
        moved,
        negated,
        decoded,
        each,
        implied: r.t_implied.rows(&db).filter_map(|[l, v, g]| Some((path(l)?, text(v), text(g)))).collect(),
        added: r.t_implied_add.rows(&db).filter_map(|[p, v, g]| Some((path(p)?, text(v), text(g)))).collect(),
    })
}

/// What the validation rules read of one leaf's value.
struct LeafFacts {
    filled: bool,
    text: Option<String>,
    cidr: Option<&'static str>,
    b64_bytes: Option<usize>,
}

fn leaf_facts(v: &serde_yaml::Value) -> LeafFacts {
    use base64::Engine as _;
    use serde_yaml::Value;
    let text = match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    let filled = match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Mapping(m) => !m.is_empty(),
        Value::Sequence(s) => !s.is_empty(),
        _ => true,
    };
    let cidr = text.as_deref().and_then(cidr_family);
    let b64_bytes = match v {
        Value::String(s) if !s.is_empty() => {
            base64::engine::general_purpose::STANDARD.decode(s.trim()).ok().map(|b| b.len())
        }
        _ => None,
    };
    LeafFacts { filled, text, cidr, b64_bytes }
}

/// `ipv4` or `ipv6` when the text is a CIDR (`10.244.0.0/16`, `fd00::/56`).
fn cidr_family(t: &str) -> Option<&'static str> {
    let (addr, len) = t.split_once('/')?;
    let len: u8 = len.parse().ok()?;
    match addr.parse::<core::net::IpAddr>().ok()? {
        core::net::IpAddr::V4(_) if len <= 32 => Some("ipv4"),
        core::net::IpAddr::V6(_) if len <= 128 => Some("ipv6"),
        _ => None,
    }
}

/// The desired config's facts: its contract, documents, machine type, and each leaf (present,
/// filled, base64 length, list position; a value and a CIDR family only for a leaf that is not
/// secret).
fn desired_facts(b: &mut engine::FactBuilder, r: &Rels, data: &ContractData, contract: Contract, cfg: &Config) {
    let row = [b.sym(&contract.to_string())];
    r.contract.push(b, row);
    for d in &cfg.docs {
        let kind = b.sym(d.kind.as_deref().unwrap_or("v1alpha1"));
        r.document.push(b, [kind]);
        if d.kind.is_some() {
            let name = b.sym(d.name.as_deref().unwrap_or_default());
            r.document_name.push(b, [kind, name]);
        }
    }
    if let Some(t) = cfg.machine_type() {
        let id = b.sym(t);
        r.machine_type.push(b, [id]);
    }
    for (path, v) in cfg.leaves() {
        let text = path.to_string();
        let id = b.sym(&text);
        r.present.push(b, [id]);
        let facts = leaf_facts(&v);
        if facts.filled {
            r.filled.push(b, [id]);
        }
        if let Some(n) = facts.b64_bytes {
            let row = [id, b.num(n as i64)];
            r.b64_bytes.push(b, row);
        }
        if let Some((parent, i)) = path.parent_index() {
            let row = [b.sym(&parent.to_string()), b.num(i as i64), id];
            r.item.push(b, row);
        }
        // A secret's value is never a fact: only whether it is there, and its length.
        if !data.matcher.secret(&path) {
            if let Some(t) = facts.text {
                let row = [id, b.sym(&t)];
                r.value.push(b, row);
            }
            if let Some(f) = facts.cidr {
                let row = [id, b.sym(f)];
                r.cidr.push(b, row);
            }
        }
    }
}

/// The machine's context as facts: its role, the cluster's modes and drift policy, why its render
/// failed or its node could not be read, the consent, the operation it is left to.
fn machine_facts(b: &mut engine::FactBuilder, r: &Rels, m: &MachineContext) {
    let mut one = |rel: Input<1>, v: &str| {
        let id = b.sym(v);
        rel.push(b, [id]);
    };
    one(r.machine_role, m.role.name());
    one(r.spec_kube_proxy, m.spec_kube_proxy.name());
    one(r.drift_policy, m.drift_policy.name());
    if let Some(p) = &m.render_failed {
        one(r.render_failed, p);
    }
    if let Some(w) = &m.node_unreachable {
        one(r.node_unreachable, w);
    }
    if let Some(c) = &m.consent {
        one(r.consent, c);
    }
    if let Some(s) = m.status_kube_proxy {
        one(r.status_kube_proxy, s.name());
    }
    for p in &m.applied_awaiting_reboot {
        one(r.applied_awaiting_reboot, p);
    }
    if let Some((name, kind)) = &m.operation_in_progress {
        let row = [b.sym(name), b.sym(kind.name())];
        r.operation_in_progress.push(b, row);
    }
    if m.inputs_unchanged {
        r.inputs_unchanged.push(b, []);
    }
}

/// The machine's verdict the rules derived: its condition, what needs a reboot, what applies
/// live, every change with its class and effect (`out`, in the order of `changes`).
fn machine_verdict(r: &Rels, db: &Database, changes: &[Change], out: &[Classified]) -> Option<MachineVerdict> {
    let [status, reason, message] = r.machine_ready.rows(db).next()?;
    let mut reboot_paths: Vec<String> = r.reboot_path.rows(db).map(|[p]| db.sym(p).to_string()).collect();
    reboot_paths.sort();
    let mut apply_paths: Vec<String> = r.apply_live.rows(db).map(|[p]| db.sym(p).to_string()).collect();
    apply_paths.sort();
    let mut pending: Vec<crate::api::PendingChange> = changes
        .iter()
        .zip(out)
        .map(|(ch, k)| crate::api::PendingChange {
            path: ch.path.to_string(),
            class: k.class.to_string(),
            effect: k.effect.map(|e| e.name().to_string()),
        })
        .collect();
    pending.sort_by(|a, b| a.path.cmp(&b.path));
    Some(MachineVerdict {
        pending,
        status: db.sym(status).to_string(),
        reason: db.sym(reason).to_string(),
        message: db.sym(message).to_string(),
        reboot_paths,
        apply_paths,
    })
}
