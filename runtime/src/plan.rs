//! The plan of one reconcile: the rules' actions, decoded in order, checked, explained.
//!
//! Start at `Planner::new` (rules and message templates, compiled once) and `Planner::plan`
//! (a snapshot in, the phase, actions, messages and proofs out). The rules decide; this file
//! decodes relations into `Action`s, puts them in the fixed order an executor performs them,
//! fills message templates, and refuses plans whose actions contradict each other (reported
//! with both proofs, never executed).

use crate::state::ObservedState;
use engine::explain::{Explanation, Proof};
use engine::{Const, Database, Engine, EvalOptions, MemSources};
use handlebars::Handlebars;
use serde_json::{Value as Json, json};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// What an executor does; each is complete enough to perform without choosing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Pause {
        message: String,
    },
    Fail {
        machine: String,
        message: String,
    },
    SetStatus {
        field: String,
        value: String,
    },
    Start {
        machine: String,
        stage: String,
    },
    PullImage {
        machine: String,
        namespace: String,
        image: String,
    },
    Cordon {
        machine: String,
    },
    Drain {
        machine: String,
    },
    Apply {
        machine: String,
        paths: Vec<String>,
    },
    Done {
        machine: String,
    },
    Uncordon {
        machine: String,
    },
    SyncManifests {
        via: String,
    },
    Delete {
        via: String,
        kind: String,
        name: String,
    },
    RestoreKubeProxy {
        via: String,
    },
    /// The Job is named by the hash of the values it applies, so re-creating it is a no-op.
    CiliumJob {
        mode: String,
        name: String,
        values: Json,
    },
    StepDone {
        step: String,
    },
    Wait {
        reason: String,
        message: String,
        since: Option<String>,
        limit_minutes: i64,
    },
    Warn {
        message: String,
    },
    Complete,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Pause { message } => write!(f, "pause: {message}"),
            Action::Fail { machine, message } => write!(f, "fail {machine}'s step: {message}"),
            Action::SetStatus { field, value } => write!(f, "set status.{field} = {value}"),
            Action::Start { machine, stage } => {
                write!(f, "start {machine} (step {stage}; record it in status with the time)")
            }
            Action::PullImage { machine, namespace, image } => {
                write!(f, "pull {image} into containerd namespace {namespace} on {machine}")
            }
            Action::Cordon { machine } => write!(f, "cordon {machine}"),
            Action::Drain { machine } => write!(f, "drain {machine}"),
            Action::Apply { machine, paths } => {
                write!(f, "apply the rendered config to {machine} without a reboot, changing {}", paths.join(", "))
            }
            Action::Done { machine } => write!(f, "record {machine}'s step as verified and done"),
            Action::Uncordon { machine } => write!(f, "uncordon {machine}"),
            Action::SyncManifests { via } => {
                write!(f, "server-side-apply the bootstrap manifests (field manager talos) through {via}")
            }
            Action::Delete { via, kind, name } if kind == "ClusterRoleBinding" => {
                write!(f, "delete {kind} {name} (cluster-scoped) through {via}'s admin kubeconfig")
            }
            Action::Delete { via, kind, name } => {
                write!(f, "delete {kind} kube-system/{name} through {via}'s admin kubeconfig")
            }
            Action::RestoreKubeProxy { via } => {
                write!(f, "restore the kube-proxy objects from Talos's rendered manifests through {via}")
            }
            Action::CiliumJob { mode, name, .. } => {
                write!(f, "run the Cilium Helm Job {name} with --kube-proxy={mode}")
            }
            Action::StepDone { step } => write!(f, "record step {step} as done"),
            Action::Wait { message, .. } => write!(f, "wait: {message}"),
            Action::Warn { message } => write!(f, "warn: {message}"),
            Action::Complete => write!(f, "complete the operation"),
        }
    }
}

impl Action {
    pub fn to_json(&self) -> Json {
        match self {
            Action::Pause { message } => json!({"action": "pause", "message": message}),
            Action::Fail { machine, message } => json!({"action": "fail", "machine": machine, "message": message}),
            Action::SetStatus { field, value } => json!({"action": "setStatus", "field": field, "value": value}),
            Action::Start { machine, stage } => json!({"action": "start", "machine": machine, "stage": stage}),
            Action::PullImage { machine, namespace, image } => {
                json!({"action": "pullImage", "machine": machine, "namespace": namespace, "image": image})
            }
            Action::Cordon { machine } => json!({"action": "cordon", "machine": machine}),
            Action::Drain { machine } => json!({"action": "drain", "machine": machine}),
            Action::Apply { machine, paths } => json!({"action": "applyNoReboot", "machine": machine, "paths": paths}),
            Action::Done { machine } => json!({"action": "done", "machine": machine}),
            Action::Uncordon { machine } => json!({"action": "uncordon", "machine": machine}),
            Action::SyncManifests { via } => json!({"action": "syncManifests", "via": via, "fieldManager": "talos"}),
            Action::Delete { via, kind, name } => {
                let ns = if kind == "ClusterRoleBinding" { Json::Null } else { json!("kube-system") };
                json!({"action": "delete", "via": via, "kind": kind, "namespace": ns, "name": name})
            }
            Action::RestoreKubeProxy { via } => json!({"action": "restoreKubeProxy", "via": via}),
            Action::CiliumJob { mode, name, values } => {
                json!({"action": "ciliumJob", "name": name, "kubeProxy": mode, "values": values})
            }
            Action::StepDone { step } => json!({"action": "stepDone", "step": step}),
            Action::Wait { reason, message, since, limit_minutes } => {
                json!({"action": "wait", "reason": reason, "message": message, "since": since, "limitMinutes": limit_minutes})
            }
            Action::Warn { message } => json!({"action": "warn", "message": message}),
            Action::Complete => json!({"action": "complete"}),
        }
    }
}

/// The plan of one reconcile.
#[derive(Clone, Debug)]
pub struct Plan {
    pub operation: String,
    pub kind: String,
    pub phase: String,
    pub confirmation: Option<String>,
    pub actions: Vec<(Action, Vec<Proof>)>,
    /// The mode every Cilium Job outside a switch uses (cilium-config, then status, then spec).
    pub cilium_job_mode: Option<String>,
}

#[derive(Debug)]
pub enum PlanError {
    /// The rules or templates do not load.
    Load(Vec<String>),
    Eval(engine::EvalError),
    /// Two actions contradict each other; the plan is not executed.
    Contradiction {
        what: String,
        proofs: Vec<String>,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Load(p) => write!(f, "{}", p.join("\n")),
            PlanError::Eval(e) => write!(f, "evaluation failed: {e}"),
            PlanError::Contradiction { what, .. } => {
                write!(f, "the rules contradict themselves: {what}; nothing is executed")
            }
        }
    }
}

impl std::error::Error for PlanError {}

pub struct Planner {
    pub engine: Engine,
    hb: Handlebars<'static>,
}

fn text(db: &Database, id: u32) -> String {
    match db.value(id) {
        Const::Sym(s) => s.clone(),
        Const::Num(n) => n.to_string(),
    }
}

fn num(db: &Database, id: u32) -> i64 {
    match db.value(id) {
        Const::Num(n) => *n,
        Const::Sym(_) => 0,
    }
}

/// RFC 3339 UTC from seconds since 1970.
pub fn rfc3339(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

impl Planner {
    /// Compiles the given rule files (all of them, as one program) and message templates.
    pub fn new(rules: &[(String, String)], messages: &str) -> Result<Planner, PlanError> {
        let files: HashMap<String, String> = rules.iter().cloned().collect();
        let names: Vec<String> = rules.iter().map(|r| r.0.clone()).collect();
        let loaded = engine::load(&names, &MemSources(files));
        let Some(program) = loaded.program else {
            return Err(PlanError::Load(loaded.errors().map(|d| d.display(&loaded.sources).to_string()).collect()));
        };
        let engine = Engine::new(program)
            .map_err(|e| PlanError::Load(e.iter().map(|x| format!("{}: {}", x.at, x.message)).collect()))?;
        let templates: BTreeMap<String, String> =
            serde_yaml::from_str(messages).map_err(|e| PlanError::Load(vec![format!("rules/messages.yaml: {e}")]))?;
        let mut hb = Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        let mut problems = vec![];
        for (name, t) in &templates {
            if let Err(e) = hb.register_template_string(name, t) {
                problems.push(format!("rules/messages.yaml: template {name}: {e}"));
            }
        }
        if !problems.is_empty() {
            return Err(PlanError::Load(problems));
        }
        Ok(Planner { engine, hb })
    }

    /// The shipped rules and templates.
    pub fn embedded() -> Result<Planner, PlanError> {
        let rules: Vec<(String, String)> =
            render::bundle::RULES.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Planner::new(&rules, render::bundle::MESSAGES.1)
    }

    fn message(&self, template: &str, data: &Json) -> String {
        self.hb.render(template, data).unwrap_or_else(|e| format!("{template} (message template failed: {e})"))
    }

    /// Plans one reconcile of the snapshot's operation; with `explain`, every action carries
    /// its proof (proofs of contradicting actions are always built).
    pub fn plan(&self, s: &ObservedState) -> Result<Plan, PlanError> {
        self.plan_with(s, false)
    }

    pub fn plan_with(&self, s: &ObservedState, explain: bool) -> Result<Plan, PlanError> {
        let facts = crate::facts::facts(&self.engine, s);
        let db = self
            .engine
            .evaluate_built(facts, EvalOptions { provenance: true, ..EvalOptions::default() })
            .map_err(PlanError::Eval)?;
        let p = &self.engine.program;
        let rows = |name: &str| -> Vec<Vec<u32>> {
            let r = p.relation(name).unwrap_or_else(|| panic!("the rules declare `{name}`"));
            db.rels[r].iter().map(<[u32]>::to_vec).collect()
        };
        let proof = |name: &str, row: &[u32]| -> Option<Proof> {
            if !explain {
                return None;
            }
            let values: Vec<Const> = row.iter().map(|&v| db.value(v).clone()).collect();
            match engine::explain::explain(p, &db, name, &values) {
                Ok(Explanation::Holds(pr)) => Some(pr),
                _ => None,
            }
        };
        let cps = s.machines.iter().filter(|m| m.role == "controlplane").count();
        let target =
            s.operation.target_kubernetes.clone().or(s.operation.target_kube_proxy.clone()).unwrap_or_default();
        let from = match s.operation.kind.as_str() {
            // The mode in force: the status a switch set, else what Cilium runs now, else the spec.
            "cni" => s.cluster.status_kube_proxy.clone().unwrap_or_else(|| {
                match s.workload.cilium_kube_proxy_replacement.as_deref() {
                    Some("true") => "replaced".into(),
                    Some(_) => "enabled".into(),
                    None => s.cluster.cni.kube_proxy.clone(),
                }
            }),
            // The oldest kubelet the machines run.
            _ => s
                .machines
                .iter()
                .map(|m| m.kubelet_version.clone())
                .min_by(|a, b| match (engine::value::parse_version(a), engine::value::parse_version(b)) {
                    (Some(x), Some(y)) => engine::value::version_cmp(&x, &y),
                    _ => a.cmp(b),
                })
                .unwrap_or_else(|| s.cluster.kubernetes_version.clone()),
        };
        let base = json!({
            "cluster": s.cluster.name,
            "operation": s.operation.name,
            "kind": s.operation.kind,
            "target": target,
            "from": from,
            "machines": s.machines.len(),
            "controlplanes": cps,
            "workers": s.machines.len() - cps,
            "maxUnavailable": s.operation.max_unavailable,
            "live": s.workload.cilium_kube_proxy_replacement.clone().unwrap_or_else(|| "unknown".into()),
            "wantReplacement": if target == "replaced" { "true" } else { "false" },
        });
        let data = |extra: Json| -> Json {
            let mut d = base.clone();
            if let (Json::Object(m), Json::Object(x)) = (&mut d, extra) {
                m.extend(x);
            }
            d
        };
        let mut actions: Vec<(Action, Vec<Proof>)> = vec![];
        let mut push = |a: Action, p: Option<Proof>| actions.push((a, p.into_iter().collect()));
        for r in rows("act_pause") {
            let msg =
                self.message(&text(&db, r[0]), &data(json!({"machine": text(&db, r[1]), "detail": text(&db, r[2])})));
            push(Action::Pause { message: msg }, proof("act_pause", &r));
        }
        for r in rows("act_fail") {
            let msg =
                self.message(&text(&db, r[1]), &data(json!({"machine": text(&db, r[0]), "detail": text(&db, r[2])})));
            push(Action::Fail { machine: text(&db, r[0]), message: msg }, proof("act_fail", &r));
        }
        for r in rows("act_set_status") {
            push(Action::SetStatus { field: text(&db, r[0]), value: text(&db, r[1]) }, proof("act_set_status", &r));
        }
        for r in rows("act_start") {
            push(Action::Start { machine: text(&db, r[0]), stage: text(&db, r[1]) }, proof("act_start", &r));
        }
        for r in rows("act_pull_image") {
            push(
                Action::PullImage { machine: text(&db, r[0]), namespace: text(&db, r[1]), image: text(&db, r[2]) },
                proof("act_pull_image", &r),
            );
        }
        for r in rows("act_cordon") {
            push(Action::Cordon { machine: text(&db, r[0]) }, proof("act_cordon", &r));
        }
        for r in rows("act_drain") {
            push(Action::Drain { machine: text(&db, r[0]) }, proof("act_drain", &r));
        }
        let mut applies: BTreeMap<String, (Vec<String>, Vec<Proof>)> = BTreeMap::new();
        for r in rows("act_apply") {
            let e = applies.entry(text(&db, r[0])).or_default();
            e.0.push(text(&db, r[1]));
            e.1.extend(proof("act_apply", &r));
        }
        for (m, (mut paths, proofs)) in applies {
            paths.sort();
            actions.push((Action::Apply { machine: m, paths }, proofs));
        }
        let mut push = |a: Action, p: Option<Proof>| actions.push((a, p.into_iter().collect()));
        for r in rows("act_done") {
            push(Action::Done { machine: text(&db, r[0]) }, proof("act_done", &r));
        }
        for r in rows("act_uncordon") {
            push(Action::Uncordon { machine: text(&db, r[0]) }, proof("act_uncordon", &r));
        }
        for r in rows("act_sync_manifests") {
            push(Action::SyncManifests { via: text(&db, r[0]) }, proof("act_sync_manifests", &r));
        }
        // In the order the rules give (their first column), then by name.
        let mut deletes = rows("act_delete");
        deletes.sort_by_key(|r| (num(&db, r[0]), text(&db, r[3])));
        for r in deletes {
            push(
                Action::Delete { via: text(&db, r[1]), kind: text(&db, r[2]), name: text(&db, r[3]) },
                proof("act_delete", &r),
            );
        }
        for r in rows("act_restore_kube_proxy") {
            push(Action::RestoreKubeProxy { via: text(&db, r[0]) }, proof("act_restore_kube_proxy", &r));
        }
        for r in rows("act_cilium_job") {
            let mode = text(&db, r[0]);
            let values = render::cilium::layered(
                s.cluster.cilium_values.as_ref().unwrap_or(&Json::Null),
                mode == "replaced",
                s.cluster.cilium_tunnel.as_deref().unwrap_or("vxlan"),
            );
            let name = format!("ichor-cni-{}", render::cilium::values_hash(&values));
            push(Action::CiliumJob { mode, name, values }, proof("act_cilium_job", &r));
        }
        for r in rows("act_step_done") {
            push(Action::StepDone { step: text(&db, r[0]) }, proof("act_step_done", &r));
        }
        for r in rows("act_wait") {
            let (t, since, limit) = (text(&db, r[0]), num(&db, r[2]), num(&db, r[3]));
            let since = (since > 0).then(|| rfc3339(since));
            let msg = self.message(
                &t,
                &data(json!({"machine": text(&db, r[1]), "detail": text(&db, r[1]), "since": since.clone().unwrap_or_default(), "limit": limit / 60})),
            );
            push(Action::Wait { reason: t, message: msg, since, limit_minutes: limit / 60 }, proof("act_wait", &r));
        }
        for r in rows("act_warn") {
            let msg = self.message(&text(&db, r[0]), &data(json!({"a": text(&db, r[1]), "b": text(&db, r[2])})));
            push(Action::Warn { message: msg }, proof("act_warn", &r));
        }
        if !rows("act_complete").is_empty() {
            push(Action::Complete, proof("act_complete", &[]));
        }
        // The order of action kinds is the rules' (`action_order`); within a kind, as decoded.
        let rank: HashMap<String, i64> =
            rows("action_order").iter().map(|r| (text(&db, r[0]), num(&db, r[1]))).collect();
        actions.sort_by_key(|(a, _)| {
            rank.get(a.to_json()["action"].as_str().unwrap_or_default()).copied().unwrap_or(i64::MAX)
        });
        if let Err(e) = self.contradictions(&actions, s) {
            // Contradicting actions are always reported with their proofs.
            return if explain { Err(e) } else { self.plan_with(s, true) };
        }
        let phase = rows("phase").first().map(|r| text(&db, r[0])).unwrap_or_else(|| s.operation.phase.clone());
        let confirmation = (s.operation.phase == "Pending").then(|| {
            let t = if s.operation.kind == "cni" { "ConfirmSwitch" } else { "ConfirmUpgrade" };
            self.message(t, &base)
        });
        let cilium_job_mode = rows("cilium_job_mode").first().map(|r| text(&db, r[0]));
        Ok(Plan {
            operation: s.operation.name.clone(),
            kind: s.operation.kind.clone(),
            phase,
            confirmation,
            actions,
            cilium_job_mode,
        })
    }

    /// Actions that cannot all be performed: reported with both proofs, never executed.
    fn contradictions(&self, actions: &[(Action, Vec<Proof>)], s: &ObservedState) -> Result<(), PlanError> {
        let show = |i: usize| actions[i].1.iter().map(ToString::to_string).collect::<String>();
        let find = |pred: &dyn Fn(&Action) -> bool| -> Vec<usize> {
            (0..actions.len()).filter(|&i| pred(&actions[i].0)).collect()
        };
        let err = |what: String, idx: &[usize]| PlanError::Contradiction {
            what,
            proofs: idx.iter().map(|&i| show(i)).collect(),
        };
        let jobs = find(&|a| matches!(a, Action::CiliumJob { .. }));
        if jobs.len() > 1 {
            return Err(err("two Cilium Jobs with different kube-proxy modes".into(), &jobs));
        }
        let mut by_field: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, (a, _)) in actions.iter().enumerate() {
            if let Action::SetStatus { field, .. } = a {
                by_field.entry(field.as_str()).or_default().push(i);
            }
        }
        for (field, idx) in by_field {
            if idx.len() > 1 {
                return Err(err(format!("two values for status.{field}"), &idx));
            }
        }
        let complete = find(&|a| matches!(a, Action::Complete));
        let stops = find(&|a| matches!(a, Action::Pause { .. } | Action::Fail { .. }));
        if !complete.is_empty() && !stops.is_empty() {
            return Err(err("the operation both completes and pauses".into(), &[complete[0], stops[0]]));
        }
        let cps: Vec<usize> = (0..actions.len())
            .filter(|&i| match &actions[i].0 {
                Action::Start { machine, .. } => {
                    s.machines.iter().any(|m| &m.name == machine && m.role == "controlplane")
                }
                _ => false,
            })
            .collect();
        if cps.len() > 1 {
            return Err(err("two control planes start in one plan (control planes go one at a time)".into(), &cps));
        }
        let starts = find(&|a| matches!(a, Action::Start { .. }));
        for &i in &starts {
            if let Action::Start { machine, .. } = &actions[i].0 {
                let failed = find(&|a| matches!(a, Action::Fail { machine: m, .. } if m == machine));
                if let Some(&f) = failed.first() {
                    return Err(err(format!("{machine} both starts and fails"), &[i, f]));
                }
            }
        }
        Ok(())
    }
}
