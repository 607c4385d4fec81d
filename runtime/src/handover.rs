//! The CNI hand-over (ADR 0024): when Argo CD has adopted Cilium, `CNIHandover` turns True on
//! the TalosCluster and the render drops the CNI's inline manifest from then on.
//!
//! The rule host of the cluster loop (`reconcile::cluster`, which reads, plans, executes and
//! writes the status). Start at `Rules::decide` (the cluster's hand-over mode, what Argo CD's
//! Application says, the condition now, given to rules/handover.rules as facts; the rules
//! decide, this file fills the facts and reads the condition) and `Rules::decide_values` (the
//! Cilium values and the lockdown). Absent Argo CD is "not here yet": the condition says
//! `WaitingForArgoCD` and the reconcile comes back later, never a hang or an error.

pub use crate::cni_objects::{
    APPLICATION_NAME, APPLICATION_NAMESPACE, Application, CiliumJob, JobState, OPERATION_LABEL, VALUES_HASH_LABEL,
    cilium_owners, cilium_version_of_image, termination_message,
};
use render::api::Handover;
use std::time::Duration;

/// How often an unfinished hand-over is looked at again.
pub const REQUEUE: Duration = Duration::from_secs(30);

/// The CNIHandover condition to hold, and when to look again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub status: String,
    pub reason: String,
    pub message: String,
    pub requeue: Option<Duration>,
}

/// Why the hand-over rules could not decide.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// The shipped rules do not load or do not declare what this host reads.
    #[error(
        "the hand-over rules ({}) do not load; fix them and run `ichor rules check`",
        render::embedded::HANDOVER_PROGRAM
    )]
    Load(#[from] engine::LoadError),
    #[error("evaluating the hand-over rules")]
    Eval(#[from] engine::EvalError),
    /// The rules derived no condition.
    #[error("the hand-over rules derived {what}")]
    Derived { what: String },
    /// The message templates do not load, or the condition's does not fill.
    #[error(transparent)]
    Messages(#[from] crate::messages::MessageError),
    /// The shipped rules failed to load earlier (that error, as it was first reported).
    #[error("the hand-over rules are unavailable: {why}")]
    Unavailable { why: String },
    /// The Cilium chart's value keys do not load.
    #[error("the Cilium chart's value keys ({file}) do not load")]
    CiliumKeys { file: String, source: render::inventory::InventoryError },
    /// A read or write of the hand-over failed.
    #[cfg(feature = "io")]
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube_client::Error,
    },
    /// An action of the cluster loop's plan did not happen (nothing of the plan is recorded).
    #[cfg(feature = "io")]
    #[error("{action}: it did not happen: {why}")]
    NotPerformed { action: String, why: String },
    /// A read or write of the Cilium values' objects failed.
    #[cfg(feature = "io")]
    #[error(transparent)]
    Objects(#[from] crate::kube::KubeError),
}

/// The hand-over program's relations, as this host uses them (bound once at load).
struct Rels {
    mode: engine::Input<1>,
    done: engine::Input<0>,
    application: engine::Input<2>,
    owns_release: engine::Input<0>,
    condition: engine::Output<3>,
    requeue: engine::Output<0>,
    values: ValuesRels,
}

/// The values' relations (rules/cni-values.rules), bound with the rest.
struct ValuesRels {
    preset_cilium: engine::Input<0>,
    spec_kube_proxy: engine::Input<1>,
    status_kube_proxy: engine::Input<1>,
    cilium_kpr: engine::Input<1>,
    cilium_ds: engine::Input<5>,
    chart_running: engine::Input<1>,
    embedded_chart: engine::Input<1>,
    layer: engine::Input<2>,
    refused: engine::Input<2>,
    applied: engine::Input<1>,
    job: engine::Input<4>,
    operation: engine::Input<2>,
    owner: engine::Input<2>,
    bootstrap_patch: engine::Input<1>,
    adopted: engine::Input<1>,
    condition: engine::Output<4>,
    take_ownership: engine::Output<0>,
    run_job: engine::Output<2>,
    record: engine::Output<1>,
    requeue: engine::Output<1>,
    mode: engine::Output<1>,
    np_enabled: engine::Input<0>,
    np_crd: engine::Input<0>,
    np_lockdown: engine::Output<0>,
    np_waiting: engine::Output<1>,
}

/// The hand-over host: rules/handover.rules compiled once, and the message templates.
pub struct Rules {
    engine: engine::Engine,
    rels: Rels,
    messages: crate::messages::Messages,
    /// The pinned Cilium chart's value keys: the one validator's inventory.
    cilium_keys: render::inventory::Inventory,
}

impl Rules {
    /// The shipped rules and messages.
    pub fn embedded() -> Result<Rules, HandoverError> {
        use engine::Type::{Number as N, Symbol as S};
        let engine = crate::embedded_program(render::embedded::HANDOVER_PROGRAM)?;
        let mut b = engine::Binder::new(&engine.program, "hand-over");
        let rels = Rels {
            mode: b.input("ho_mode", [("mode", S)]),
            done: b.input("ho_done", []),
            application: b.input("ho_application", [("sync", S), ("health", S)]),
            owns_release: b.input("ho_owns_release", []),
            condition: b.output("ho_condition", [("status", S), ("reason", S), ("template", S)]),
            requeue: b.output("ho_requeue", []),
            values: ValuesRels {
                preset_cilium: b.input("cv_preset_cilium", []),
                spec_kube_proxy: b.input("spec_kube_proxy", [("mode", S)]),
                status_kube_proxy: b.input("status_kube_proxy", [("mode", S)]),
                cilium_kpr: b.input("cilium_kpr", [("value", S)]),
                cilium_ds: b.input(
                    "cilium_ds",
                    [("desired", N), ("updated", N), ("ready", N), ("generation", N), ("observed", N)],
                ),
                chart_running: b.input("cilium_chart_running", [("version", S)]),
                embedded_chart: b.input("embedded_cilium_chart", [("version", S)]),
                layer: b.input("cv_layer", [("mode", S), ("hash", S)]),
                refused: b.input("cv_refused", [("mode", S), ("refusal", S)]),
                applied: b.input("cv_applied", [("hash", S)]),
                job: b.input("cv_job", [("hash", S), ("job", S), ("state", S), ("why", S)]),
                operation: b.input("cv_operation", [("name", S), ("phase", S)]),
                owner: b.input("cilium_owner", [("kind", S), ("name", S)]),
                bootstrap_patch: b.input("bootstrap_patch", [("name", S)]),
                adopted: b.input("cilium_adopted", [("operation", S)]),
                take_ownership: b.output("cv_take_ownership", []),
                condition: b.output("cv_condition", [("status", S), ("reason", S), ("template", S), ("detail", S)]),
                run_job: b.output("cv_run_job", [("hash", S), ("mode", S)]),
                record: b.output("cv_record", [("hash", S)]),
                requeue: b.output("cv_requeue", [("seconds", N)]),
                mode: b.output("cv_mode", [("mode", S)]),
                np_enabled: b.input("np_enabled", []),
                np_crd: b.input("np_crd", []),
                np_lockdown: b.output("np_lockdown", []),
                np_waiting: b.output("np_waiting", [("reason", S)]),
            },
        };
        b.finish().map_err(engine::LoadError::from)?;
        let messages = crate::messages::Messages::embedded()?;
        let (file, keys) = render::embedded::CILIUM_KEYS;
        let cilium_keys = render::inventory::Inventory::parse(keys)
            .map_err(|source| HandoverError::CiliumKeys { file: file.to_string(), source })?;
        Ok(Rules { engine, rels, messages, cilium_keys })
    }

    /// ADR 0024's decision, as rules/handover.rules takes it, from the cluster's hand-over
    /// mode, what Argo CD's Application says, and whether the condition is True already.
    pub fn decide(&self, mode: Handover, app: Option<&Application>, done: bool) -> Result<Decision, HandoverError> {
        let r = &self.rels;
        let mut b = self.engine.fact_builder();
        let m = b.sym(mode.name());
        r.mode.push(&mut b, [m]);
        if done {
            r.done.push(&mut b, []);
        }
        if let Some(a) = app {
            let row = [b.sym(or(&a.sync)), b.sym(or(&a.health))];
            r.application.push(&mut b, row);
            if a.owns_release {
                r.owns_release.push(&mut b, []);
            }
        }
        let db = self.engine.evaluate_built(b, engine::EvalOptions::default())?;
        let [status, reason, template] = r
            .condition
            .rows(&db)
            .next()
            .ok_or_else(|| HandoverError::Derived { what: "no CNIHandover condition".into() })?;
        let (sync, health) = app.map(|a| (or(&a.sync), or(&a.health))).unwrap_or(("Unknown", "Unknown"));
        let message = self.messages.render(db.sym(template), &serde_json::json!({"sync": sync, "health": health}))?;
        Ok(Decision {
            status: db.sym(status).to_string(),
            reason: db.sym(reason).to_string(),
            message,
            requeue: r.requeue.any(&db).then_some(REQUEUE),
        })
    }
    /// The values' decision (rules/cni-values.rules) from what the cluster host read.
    pub fn decide_values(&self, f: &ValuesFacts) -> Result<ValuesDecision, HandoverError> {
        use render::api::KubeProxyMode;
        let r = &self.rels.values;
        let mut b = self.engine.fact_builder();
        if f.preset_cilium {
            r.preset_cilium.push(&mut b, []);
        }
        if f.handover_done {
            self.rels.done.push(&mut b, []);
        }
        if f.lockdown_enabled {
            r.np_enabled.push(&mut b, []);
        }
        if f.policy_kind_served {
            r.np_crd.push(&mut b, []);
        }
        let id = b.sym(f.spec_mode.name());
        r.spec_kube_proxy.push(&mut b, [id]);
        if let Some(m) = f.status_mode {
            let id = b.sym(m.name());
            r.status_kube_proxy.push(&mut b, [id]);
        }
        if let Some(v) = &f.cilium_kpr {
            let id = b.sym(v);
            r.cilium_kpr.push(&mut b, [id]);
        }
        if let Some(d) = &f.cilium_ds {
            let row = [d.desired, d.updated, d.ready, d.generation, d.observed_generation].map(|n| b.num(n));
            r.cilium_ds.push(&mut b, row);
        }
        if let Some(v) = &f.chart_running {
            let id = b.sym(v);
            r.chart_running.push(&mut b, [id]);
        }
        let id = b.sym(render::embedded::CILIUM_CHART_VERSION);
        r.embedded_chart.push(&mut b, [id]);
        // Both modes' hashes and refusals: the rules pick the mode Cilium runs now.
        for mode in KubeProxyMode::ALL {
            let replaced = *mode == KubeProxyMode::Replaced;
            let values = render::cilium::layered(&f.user, replaced, &f.tunnel);
            let row = [b.sym(mode.name()), b.sym(&render::cilium::values_hash(&values))];
            r.layer.push(&mut b, row);
            if !f.user.is_null() {
                for refusal in render::cilium::validate(&f.user, &self.cilium_keys, replaced) {
                    let row = [b.sym(mode.name()), b.sym(&refusal.to_string())];
                    r.refused.push(&mut b, row);
                }
            }
        }
        if let Some(h) = &f.applied {
            let id = b.sym(h);
            r.applied.push(&mut b, [id]);
        }
        for j in &f.jobs {
            let Some(hash) = &j.hash else { continue };
            let row = [b.sym(hash), b.sym(&j.name), b.sym(j.state.name()), b.sym(&j.why)];
            r.job.push(&mut b, row);
        }
        for (name, phase) in &f.operations {
            let row = [b.sym(name), b.sym(phase.name())];
            r.operation.push(&mut b, row);
        }
        for o in &f.owners {
            let row = [b.sym(&o.kind), b.sym(&o.name)];
            r.owner.push(&mut b, row);
        }
        if let Some(p) = &f.bootstrap_patch {
            let id = b.sym(p);
            r.bootstrap_patch.push(&mut b, [id]);
        }
        if let Some(o) = &f.adopted {
            let id = b.sym(o);
            r.adopted.push(&mut b, [id]);
        }
        let db = self.engine.evaluate_built(b, engine::EvalOptions::default())?;
        let mode = r.mode.rows(&db).next().map(|[m]| db.sym(m).to_string()).unwrap_or_default();
        let mut rows: Vec<(String, String, String, String)> = r
            .condition
            .rows(&db)
            .map(|[s, re, t, d]| (db.sym(s).into(), db.sym(re).into(), db.sym(t).into(), db.sym(d).into()))
            .collect();
        rows.sort();
        let condition = match rows.first() {
            None => None,
            Some((status, reason, template, _)) => {
                if let Some(other) = rows.iter().find(|x| (&x.0, &x.1) != (status, reason)) {
                    return Err(HandoverError::Derived {
                        what: format!(
                            "two CNIValuesApplied conditions ({status}/{reason} and {}/{})",
                            other.0, other.1
                        ),
                    });
                }
                // Several rows of one condition are its details (every refusal), joined.
                let detail = rows.iter().map(|x| x.3.as_str()).collect::<Vec<_>>().join("; ");
                let message = self
                    .messages
                    .render(template, &serde_json::json!({"detail": detail, "mode": mode, "cluster": f.cluster}))?;
                Some(Decision { status: status.clone(), reason: reason.clone(), message, requeue: None })
            }
        };
        // The rules name the mode; one they could not have meant is an error, never a silent
        // fall back to the spec's (ADR 0066: a Job outside a switch never takes the spec's mode).
        let run_job = match r.run_job.rows(&db).next() {
            None => None,
            Some([h, m]) => {
                let mode = KubeProxyMode::parse(db.sym(m)).ok_or_else(|| HandoverError::Derived {
                    what: format!("cv_run_job names the kube-proxy mode {:?}, which is none", db.sym(m)),
                })?;
                Some(ValuesJob { hash: db.sym(h).to_string(), mode, take_ownership: r.take_ownership.any(&db) })
            }
        };
        Ok(ValuesDecision {
            condition,
            run_job,
            record: r.record.rows(&db).next().map(|[h]| db.sym(h).to_string()),
            lockdown: r.np_lockdown.any(&db),
            lockdown_waits: r.np_waiting.rows(&db).map(|[w]| db.sym(w).to_string()).collect(),
            requeue: r.requeue.rows(&db).filter_map(|[s]| u64::try_from(db.num(s)).ok()).min().map(Duration::from_secs),
        })
    }
}

/// What the values reconciler read, as the rules take it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValuesFacts {
    /// The TalosCluster's name (for the messages).
    pub cluster: String,
    pub preset_cilium: bool,
    pub handover_done: bool,
    pub spec_mode: render::api::KubeProxyMode,
    pub status_mode: Option<render::api::KubeProxyMode>,
    /// The user's layer (spec.cni.cilium.values; null when none).
    pub user: serde_json::Value,
    pub tunnel: String,
    /// cilium-config's kube-proxy-replacement.
    pub cilium_kpr: Option<String>,
    pub cilium_ds: Option<crate::state::DaemonSet>,
    pub chart_running: Option<String>,
    /// status.cni.appliedValuesHash.
    pub applied: Option<String>,
    pub jobs: Vec<CiliumJob>,
    /// The cluster's operations and their phases.
    pub operations: Vec<(String, render::api::Phase)>,
    /// The controller locks its namespace down (runtime::netpol; no `--no-network-policies`).
    pub lockdown_enabled: bool,
    /// The API serves cilium.io/v2 CiliumNetworkPolicy.
    pub policy_kind_served: bool,
    /// Who manages the cilium DaemonSet besides Ichor (`cilium_owners`).
    pub owners: Vec<crate::state::CiliumOwner>,
    /// The TalosConfigPatch that carries Cilium's inline manifest (Ichor installed Cilium).
    pub bootstrap_patch: Option<String>,
    /// status.cni.adoption's operation (Ichor adopted Cilium).
    pub adopted: Option<String>,
}

impl ValuesFacts {
    /// The cluster's part of the facts (the workload's and the Jobs' are filled by the caller).
    pub fn of_cluster(c: &render::api::TalosCluster) -> ValuesFacts {
        let cilium = c.spec.cni.cilium.as_ref();
        ValuesFacts {
            cluster: c.metadata.name.clone().unwrap_or_default(),
            preset_cilium: c.spec.cni.preset == render::api::CniPreset::Cilium,
            handover_done: render::render::handover_done(c),
            spec_mode: c.spec.cni.kube_proxy,
            status_mode: render::render::status_kube_proxy(c),
            user: cilium.and_then(|x| x.values.clone()).unwrap_or(serde_json::Value::Null),
            tunnel: cilium
                .map(|x| x.tunnel_protocol.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| "vxlan".into()),
            cilium_kpr: None,
            cilium_ds: None,
            chart_running: None,
            applied: c.status.as_ref().and_then(|s| s.cni.as_ref()).and_then(|n| n.applied_values_hash.clone()),
            jobs: Vec::new(),
            operations: Vec::new(),
            lockdown_enabled: false,
            policy_kind_served: false,
            owners: Vec::new(),
            bootstrap_patch: None,
            adopted: c
                .status
                .as_ref()
                .and_then(|s| s.cni.as_ref())
                .and_then(|n| n.adoption.as_ref())
                .map(|a| a.operation.clone()),
        }
    }
}

/// What the values reconciler does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValuesDecision {
    /// The CNIValuesApplied condition to hold (none: not the cilium preset).
    pub condition: Option<Decision>,
    /// Run the Cilium Job.
    pub run_job: Option<ValuesJob>,
    /// Record this hash as status.cni.appliedValuesHash.
    pub record: Option<String>,
    pub requeue: Option<Duration>,
    /// Apply the namespace's CiliumNetworkPolicies (rules/lockdown.rules).
    pub lockdown: bool,
    /// Why they are not applied yet (`np_waiting`), for the log.
    pub lockdown_waits: Vec<String>,
}

/// The values' Cilium Job the rules ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValuesJob {
    /// The hash of the layered values (the Job's name and label).
    pub hash: String,
    /// The mode Cilium runs now.
    pub mode: render::api::KubeProxyMode,
    /// Helm takes Cilium's objects over into the release (`cv_take_ownership`).
    pub take_ownership: bool,
}

/// The shipped rules, compiled on first use (they are part of the release: a failure to load
/// them is reported by every decision, and caught by the tests).
pub fn rules() -> Result<&'static Rules, &'static HandoverError> {
    static RULES: std::sync::OnceLock<Result<Rules, HandoverError>> = std::sync::OnceLock::new();
    RULES.get_or_init(Rules::embedded).as_ref()
}

/// `Rules::decide` on the shipped rules.
pub fn decide(mode: Handover, app: Option<&Application>, done: bool) -> Result<Decision, HandoverError> {
    match rules() {
        Ok(r) => r.decide(mode, app, done),
        Err(e) => Err(HandoverError::Unavailable { why: e.to_string() }),
    }
}

/// A missing status field reads as Argo CD's own `Unknown`.
fn or(s: &str) -> &str {
    if s.is_empty() { "Unknown" } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(sync: &str, health: &str) -> Application {
        Application { sync: sync.into(), health: health.into(), owns_release: true, kube_proxy_replacement: None }
    }

    #[test]
    fn the_running_cilium_version_is_the_agents_image_tag() {
        for (image, want) in [
            ("quay.io/cilium/cilium:v1.20.0", Some("1.20.0")),
            ("quay.io/cilium/cilium:v1.19.6@sha256:0123abcd", Some("1.19.6")),
            ("registry.local:5000/cilium/cilium:1.21.0-rc.1", Some("1.21.0-rc.1")),
            ("registry.local:5000/cilium/cilium", None),
            ("quay.io/cilium/cilium:latest", None),
            ("quay.io/cilium/cilium@sha256:0123abcd", None),
        ] {
            assert_eq!(cilium_version_of_image(image).as_deref(), want, "{image}");
        }
    }

    #[test]
    fn a_cilium_job_is_read_with_its_hash_mode_and_state() {
        let job = |conditions: serde_json::Value| {
            CiliumJob::from_json(&serde_json::json!({
                "metadata": {"name": "ichor-cni-ab12", "labels": {VALUES_HASH_LABEL: "ab12"}},
                "spec": {"template": {"spec": {"containers": [{"args": ["cni", "helm", "apply", "--kube-proxy=replaced"]}]}}},
                "status": {"conditions": conditions},
            }))
        };
        let running = job(serde_json::json!([]));
        assert_eq!(
            (running.hash.as_deref(), running.mode, running.state),
            (Some("ab12"), Some(render::api::KubeProxyMode::Replaced), JobState::Running)
        );
        let done = job(serde_json::json!([{"type": "Complete", "status": "True"}]));
        assert_eq!(done.state, JobState::Complete);
        let failed = job(
            serde_json::json!([{"type": JobState::Failed.name(), "status": "True", "reason": "BackoffLimitExceeded", "message": ""}]),
        );
        assert_eq!((failed.state, failed.why.as_str()), (JobState::Failed, "BackoffLimitExceeded"));
        let pod = serde_json::json!({"status": {"containerStatuses": [{"state": {"terminated": {"message": "a\nb\nError: UPGRADE FAILED: x\n"}}}]}});
        assert_eq!(termination_message(&pod).as_deref(), Some("a / b / Error: UPGRADE FAILED: x"));
        assert_eq!(termination_message(&serde_json::json!({"status": {}})), None);
    }

    /// The shipped rules through the host: the validator's own words reach the condition, every
    /// refusal of the mode Cilium runs now, and no Job starts.
    #[test]
    fn a_refused_layer_is_decided_with_the_validators_words_and_starts_no_job() {
        let rules = rules().unwrap();
        let mut c = render::api::TalosCluster::new("lab", Default::default());
        c.spec.cni.preset = render::api::CniPreset::Cilium;
        c.spec.cni.handover = Handover::Disabled;
        c.spec.cni.cilium = Some(render::api::CiliumSpec {
            values: Some(serde_json::json!({"hubbel": {"enabled": true}, "kubeProxyReplacement": true})),
            ..Default::default()
        });
        let mut f = ValuesFacts::of_cluster(&c);
        f.cilium_kpr = Some("false".into());
        f.cilium_ds = Some(crate::state::DaemonSet {
            desired: 3,
            updated: 3,
            ready: 3,
            generation: 1,
            observed_generation: 1,
            image: None,
        });
        f.bootstrap_patch = Some("cni".into());
        let d = rules.decide_values(&f).unwrap();
        assert_eq!(d.run_job, None);
        let condition = d.condition.unwrap();
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "ValuesRefused"));
        assert!(
            condition.message.contains("hubbel") && condition.message.contains("kubeProxyReplacement"),
            "{}",
            condition.message
        );
        assert!(condition.message.contains("kube-proxy enabled"), "the mode Cilium runs now: {}", condition.message);

        // The same cluster with a good layer: one Job, of the enabled mode's hash.
        c.spec.cni.cilium.as_mut().unwrap().values = Some(serde_json::json!({"hubble": {"relay": {"enabled": true}}}));
        let f = ValuesFacts { user: ValuesFacts::of_cluster(&c).user, ..f };
        let d = rules.decide_values(&f).unwrap();
        let hash = render::cilium::values_hash(&render::cilium::layered(&f.user, false, "vxlan"));
        // Installed from the bootstrap patch, its objects in no Helm release yet: the Job takes
        // them over (Helm refuses to install over objects it does not own).
        let job = ValuesJob { hash, mode: render::api::KubeProxyMode::Enabled, take_ownership: true };
        assert_eq!(d.run_job, Some(job.clone()));
        // In Ichor's release already: no take-over.
        let owner = |kind: &str, name: &str| crate::state::CiliumOwner { kind: kind.into(), name: name.into() };
        let in_release = ValuesFacts { owners: vec![owner("helm", "kube-system/cilium")], ..f.clone() };
        assert_eq!(rules.decide_values(&in_release).unwrap().run_job, Some(ValuesJob { take_ownership: false, ..job }));
        // Someone else's Cilium (no bootstrap patch, never adopted, no hash applied): no Job,
        // and the condition says to adopt it.
        let foreign = ValuesFacts { bootstrap_patch: None, ..f.clone() };
        let d = rules.decide_values(&foreign).unwrap();
        let condition = d.condition.unwrap();
        assert_eq!((d.run_job, condition.reason.as_str()), (None, "NotAdopted"));
        assert!(condition.message.contains("ichor adopt --cluster lab"), "{}", condition.message);
        // Adopted: Ichor's.
        let adopted = ValuesFacts { adopted: Some("cilium-adopt".into()), ..foreign.clone() };
        assert!(rules.decide_values(&adopted).unwrap().run_job.is_some());
        // Another owner: no Job, whatever else holds.
        for o in [
            owner("helm", "kube-system/my-cilium"),
            owner("argocd", "net"),
            owner("flux", "HelmRelease flux-system/cilium"),
        ] {
            let d = rules.decide_values(&ValuesFacts { owners: vec![o.clone()], ..f.clone() }).unwrap();
            let condition = d.condition.unwrap();
            assert_eq!((d.run_job, condition.reason.as_str()), (None, "OwnedElsewhere"), "{o:?}");
            assert!(condition.message.contains(&o.name), "{}", condition.message);
        }
    }

    #[test]
    fn an_objects_managers_are_read_from_its_labels_and_annotations() {
        let owners = |m: serde_json::Value| {
            cilium_owners(&m).into_iter().map(|o| format!("{} {}", o.kind, o.name)).collect::<Vec<_>>()
        };
        assert_eq!(owners(serde_json::json!({"name": "cilium"})), Vec::<String>::new());
        assert_eq!(
            owners(
                serde_json::json!({"annotations": {"meta.helm.sh/release-name": "cilium", "meta.helm.sh/release-namespace": "kube-system"}})
            ),
            ["helm kube-system/cilium"]
        );
        assert_eq!(
            owners(
                serde_json::json!({"annotations": {"argocd.argoproj.io/tracking-id": "net:apps/DaemonSet:kube-system/cilium"}})
            ),
            ["argocd net"]
        );
        assert_eq!(
            owners(
                serde_json::json!({"labels": {"helm.toolkit.fluxcd.io/name": "cilium", "helm.toolkit.fluxcd.io/namespace": "flux-system"},
                "annotations": {"meta.helm.sh/release-name": "flux-system-cilium", "meta.helm.sh/release-namespace": "kube-system"}})
            ),
            ["flux HelmRelease flux-system/cilium", "helm kube-system/flux-system-cilium"]
        );
        // Helm charts set app.kubernetes.io/instance too: it is no Argo CD mark.
        assert!(owners(serde_json::json!({"labels": {"app.kubernetes.io/instance": "cilium"}})).is_empty());
    }

    #[test]
    fn absent_argo_cd_waits_and_comes_back() {
        let d = decide(Handover::Automatic, None, false).unwrap();
        assert_eq!((d.status.as_str(), d.reason.as_str(), d.requeue), ("False", "WaitingForArgoCD", Some(REQUEUE)));
    }

    #[test]
    fn progressing_waits() {
        let d = decide(Handover::Automatic, Some(&app("OutOfSync", "Progressing")), false).unwrap();
        assert_eq!((d.status.as_str(), d.reason.as_str()), ("False", "ArgoCDProgressing"));
        assert!(d.message.contains("OutOfSync/Progressing"));
        assert_eq!(d.requeue, Some(REQUEUE));
    }

    #[test]
    fn synced_and_healthy_owning_the_release_is_done() {
        let d = decide(Handover::Automatic, Some(&app("Synced", "Healthy")), false).unwrap();
        assert_eq!((d.status.as_str(), d.reason.as_str(), d.requeue), ("True", "Synced", None));
        let not_ours = Application { owns_release: false, ..app("Synced", "Healthy") };
        assert_eq!(decide(Handover::Automatic, Some(&not_ours), false).unwrap().reason, "ApplicationDoesNotOwnRelease");
    }

    #[test]
    fn degraded_waits_and_says_so() {
        let d = decide(Handover::Automatic, Some(&app("Synced", "Degraded")), false).unwrap();
        assert_eq!((d.status.as_str(), d.reason.as_str()), ("False", "ArgoCDDegraded"));
        assert_eq!(
            d.message,
            "Argo CD's Application argocd/cilium is Synced/Degraded: fix it in Argo CD; the hand-over waits"
        );
        // Once done, a later degradation does not bring the inline manifest back.
        assert_eq!(decide(Handover::Automatic, Some(&app("Synced", "Degraded")), true).unwrap().status, "True");
    }

    #[test]
    fn manual_and_disabled_never_poll() {
        for m in [Handover::Manual, Handover::Disabled] {
            let d = decide(m, None, false).unwrap();
            assert_eq!((d.status.as_str(), d.requeue), ("False", None));
        }
    }

    #[test]
    fn the_application_is_read_from_argo_cd_json() {
        let v = serde_json::json!({
            "spec": {"source": {"chart": "cilium", "helm": {"releaseName": "cilium"}}, "destination": {"namespace": "kube-system"}},
            "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}
        });
        assert_eq!(Application::from_json(&v), app("Synced", "Healthy"));
    }

    #[test]
    fn the_application_s_helm_values_say_the_kube_proxy_replacement() {
        let with = |helm: serde_json::Value| {
            let v = serde_json::json!({"spec": {"sources": [{"repoURL": "https://git.example/values"}, {"chart": "cilium", "helm": helm}], "destination": {"namespace": "kube-system"}}});
            Application::from_json(&v)
        };
        let a = with(
            serde_json::json!({"valuesObject": {"kubeProxyReplacement": true}, "values": "kubeProxyReplacement: false"}),
        );
        assert_eq!((a.owns_release, a.kube_proxy_replacement.as_deref()), (true, Some("true")));
        assert_eq!(
            with(serde_json::json!({"values": "kubeProxyReplacement: \"false\"\n"})).kube_proxy_replacement.as_deref(),
            Some("false")
        );
        assert_eq!(with(serde_json::json!({"valueFiles": ["values.yaml"]})).kube_proxy_replacement, None);
    }
}
