//! Admission (ADR 0013 and its amendments): what the validating webhook refuses, as a function on
//! plain data. The CRDs' CEL rules (`render::api`) hold what is structural; rules/admission.rules
//! decides the rest (the switch's consent, the values' validity and who may write them, the
//! cluster lock, an operation's immutable spec), and its messages are rules/messages.yaml's.
//! This host decodes the request into facts and fills the messages; it decides nothing.
//!
//! Start at `Request::parse` (an `AdmissionReview` v1 body), `needs` (what must be looked up
//! first: a SubjectAccessReview, the cluster's operations) and `review` (the verdict, with a
//! message that says what to do). The HTTPS server is `runtime::webhook` (feature `io`).

use render::api::{CONFIRM_KUBE_PROXY_SWITCH, KubeProxyMode, TalosCluster, TalosOperation};
use serde_json::{Value as Json, json};

/// The right that writing Cilium values needs (CNI page: "update on talosclusters/cilium-values,
/// held by ichor-admin only").
pub const VALUES_RESOURCE: &str = "talosclusters";
pub const VALUES_SUBRESOURCE: &str = "cilium-values";
pub const VALUES_VERB: &str = "update";

/// One admission request, as the API server sends it.
#[derive(Clone, Debug)]
pub struct Request {
    pub uid: String,
    pub kind: String,
    pub operation: String,
    pub namespace: String,
    pub user: String,
    pub groups: Vec<String>,
    pub object: Json,
    pub old_object: Json,
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("not an AdmissionReview v1 request: {0}")]
    Shape(String),
}

impl Request {
    pub fn parse(body: &[u8]) -> Result<Request, ReviewError> {
        let v: Json = serde_json::from_slice(body).map_err(|e| ReviewError::Shape(e.to_string()))?;
        if v.get("apiVersion").and_then(Json::as_str) != Some("admission.k8s.io/v1")
            || v.get("kind").and_then(Json::as_str) != Some("AdmissionReview")
        {
            return Err(ReviewError::Shape("apiVersion admission.k8s.io/v1, kind AdmissionReview expected".into()));
        }
        let r = v.get("request").ok_or_else(|| ReviewError::Shape("no request".into()))?;
        let s = |p: &str| r.pointer(p).and_then(Json::as_str).unwrap_or_default().to_string();
        let uid = s("/uid");
        if uid.is_empty() {
            return Err(ReviewError::Shape("request.uid is missing".into()));
        }
        Ok(Request {
            uid,
            kind: s("/kind/kind"),
            operation: s("/operation"),
            namespace: s("/namespace"),
            user: s("/userInfo/username"),
            groups: r
                .pointer("/userInfo/groups")
                .and_then(Json::as_array)
                .map(|a| a.iter().filter_map(|g| g.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
            object: r.get("object").cloned().unwrap_or(Json::Null),
            old_object: r.get("oldObject").cloned().unwrap_or(Json::Null),
        })
    }
}

/// What the webhook must look up before `review`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Whether the requester may write Cilium values (a SubjectAccessReview).
    pub values_right: bool,
    /// The operations of this cluster (name), for the lock.
    pub operations_of: Option<String>,
    /// A TalosConfigPatch write of this cluster (name): the cluster's machines are rendered
    /// with it (`render::machine::problems_of`).
    pub renders_of: Option<String>,
    /// The kinds a TalosCluster's health checks read (apiVersion, kind): discovery says whether
    /// the API server serves each, and where.
    pub kinds: Vec<(String, String)>,
}

/// What was looked up.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub may_write_values: bool,
    /// The cluster's other operations: name and phase.
    pub operations: Vec<(String, render::api::Phase)>,
    /// The review's clock, seconds since 1970 (a maintenance window that never fires from now).
    pub now: i64,
    /// The Kubernetes versions the cluster's releases hold as stages (`status.stages`): a
    /// release's own spec write moves the cluster to one of them.
    pub release_stages: Vec<(String, String)>,
    /// What rendering the cluster's machines with the written patch refuses because of it.
    pub patch_problems: Vec<String>,
    /// What discovery said of each kind the health checks read (apiVersion, kind).
    pub served: crate::health::ServedKinds,
}

/// The verdict: allowed, or refused with a message that names the field and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub messages: Vec<String>,
    /// Said to the client without refusing (kubectl prints them as `Warning: ...`): a path
    /// policy whose pattern matches no path of the contract.
    pub warnings: Vec<String>,
}

impl Verdict {
    /// The AdmissionReview v1 response body.
    pub fn response(&self, uid: &str) -> Json {
        let mut r = json!({"uid": uid, "allowed": self.allowed});
        if !self.allowed {
            r["status"] = json!({"code": 403, "reason": "Forbidden", "message": self.messages.join("; ")});
        }
        if !self.warnings.is_empty() {
            r["warnings"] = json!(self.warnings);
        }
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": r})
    }
}

fn cluster(v: &Json) -> Option<TalosCluster> {
    if v.is_null() { None } else { serde_json::from_value(v.clone()).ok() }
}

fn values(c: &Option<TalosCluster>) -> Json {
    c.as_ref().and_then(|c| c.spec.cni.cilium.as_ref()).and_then(|x| x.values.clone()).unwrap_or(Json::Null)
}

pub fn needs(r: &Request) -> Needs {
    match r.kind.as_str() {
        "TalosCluster" if matches!(r.operation.as_str(), "CREATE" | "UPDATE") => {
            let (new, old) = (cluster(&r.object), cluster(&r.old_object));
            // A change of the target (version, kube-proxy mode) needs the cluster's operations.
            let target = |c: &Option<TalosCluster>| {
                c.as_ref().map(|c| (c.spec.kubernetes_version.clone(), c.spec.cni.kube_proxy))
            };
            let retarget = old.is_some() && target(&new) != target(&old);
            // Writing the values needs the right, and so does removing or emptying them.
            Needs {
                values_right: values(&new) != values(&old),
                operations_of: retarget.then(|| new.as_ref().and_then(|c| c.metadata.name.clone())).flatten(),
                renders_of: None,
                kinds: new
                    .iter()
                    .flat_map(|c| &c.spec.health_checks)
                    .map(|h| (h.object.api_version.clone(), h.object.kind.clone()))
                    .collect(),
            }
        }
        "TalosOperation" if r.operation == "CREATE" => Needs {
            values_right: false,
            operations_of: r.object.pointer("/spec/clusterRef/name").and_then(Json::as_str).map(str::to_string),
            ..Needs::default()
        },
        "TalosConfigPatch" if matches!(r.operation.as_str(), "CREATE" | "UPDATE") => Needs {
            renders_of: r.object.pointer("/spec/clusterRef/name").and_then(Json::as_str).map(str::to_string),
            ..Needs::default()
        },
        _ => Needs::default(),
    }
}

/// Why the admission rules cannot decide (the webhook then refuses, naming this).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The shipped rules do not load or do not declare what this host reads.
    #[error(
        "the admission rules ({}) do not load; fix them and run `ichor rules check`",
        render::embedded::ADMISSION_PROGRAM
    )]
    Load(#[from] engine::LoadError),
    #[error("evaluating the admission rules")]
    Eval(#[from] engine::EvalError),
    /// The message templates do not load, or a refusal's does not fill.
    #[error(transparent)]
    Messages(#[from] crate::messages::MessageError),
    /// The shipped rules failed to load earlier (that error, as it was first reported).
    #[error("the admission rules are unavailable: {why}")]
    Unavailable { why: String },
}

/// The admission program's relations, as this host uses them (bound once at load).
struct Rels {
    request: engine::Input<2>,
    undecodable: engine::Input<0>,
    old_undecodable: engine::Input<0>,
    kube_proxy_change: engine::Input<2>,
    version_change: engine::Input<2>,
    consent: engine::Input<1>,
    values_problem: engine::Input<1>,
    policy_problem: engine::Input<1>,
    window_problem: engine::Input<1>,
    health_problem: engine::Input<1>,
    patch_problem: engine::Input<1>,
    values_changed: engine::Input<0>,
    may_write_values: engine::Input<0>,
    other_operation: engine::Input<2>,
    release_of_request: engine::Input<1>,
    release_stage: engine::Input<2>,
    spec_changed: engine::Input<0>,
    refusal: engine::Output<4>,
}

/// The admission host: rules/admission.rules compiled once, and the message templates.
pub struct Rules {
    engine: engine::Engine,
    rels: Rels,
    messages: crate::messages::Messages,
}

/// What one request says, decoded once: the facts the rules see and the values their messages
/// name.
struct Decoded {
    kind: String,
    undecodable: bool,
    /// An UPDATE whose old object is missing or does not decode: nothing can be compared.
    old_undecodable: bool,
    /// `Kind namespace/name`.
    object: String,
    cluster: String,
    kube_proxy_change: Option<(KubeProxyMode, KubeProxyMode)>,
    version_change: Option<(String, String)>,
    consent: Option<String>,
    values_problems: Vec<String>,
    /// The path policies' refusals and warnings (render::policy::check).
    policy_problems: Vec<String>,
    /// The maintenance windows' problems (runtime::window::problems).
    window_problems: Vec<String>,
    /// The health checks' problems (runtime::health::problems).
    health_problems: Vec<String>,
    policy_warnings: Vec<String>,
    values_changed: bool,
    values_set: bool,
    spec_changed: bool,
    /// A TalosOperation created for a release's stage: the release it names (its label).
    release: Option<String>,
}

fn decode(r: &Request, keys: &render::inventory::Inventory, facts: &Facts) -> Decoded {
    let now = facts.now;
    let name = r.object.pointer("/metadata/name").and_then(Json::as_str).unwrap_or_default();
    let mut d = Decoded {
        kind: r.kind.clone(),
        undecodable: false,
        old_undecodable: false,
        object: format!("{} {}/{name}", r.kind, r.namespace),
        cluster: String::new(),
        kube_proxy_change: None,
        version_change: None,
        consent: None,
        values_problems: vec![],
        policy_problems: vec![],
        window_problems: vec![],
        health_problems: vec![],
        policy_warnings: vec![],
        values_changed: false,
        values_set: false,
        spec_changed: r.object.get("spec") != r.old_object.get("spec"),
        release: None,
    };
    match (r.kind.as_str(), r.operation.as_str()) {
        ("TalosCluster", "CREATE" | "UPDATE") => {
            let Some(new) = cluster(&r.object) else {
                d.undecodable = true;
                return d;
            };
            let old = cluster(&r.old_object);
            if r.operation == "UPDATE" && old.is_none() {
                d.old_undecodable = true;
            }
            d.cluster = new.metadata.name.clone().unwrap_or_default();
            d.kube_proxy_change = old
                .as_ref()
                .filter(|o| o.spec.cni.kube_proxy != new.spec.cni.kube_proxy)
                .map(|o| (o.spec.cni.kube_proxy, new.spec.cni.kube_proxy));
            d.version_change = old
                .as_ref()
                .filter(|o| o.spec.kubernetes_version != new.spec.kubernetes_version)
                .map(|o| (o.spec.kubernetes_version.clone(), new.spec.kubernetes_version.clone()));
            d.consent = new.metadata.annotations.as_ref().and_then(|a| a.get(CONFIRM_KUBE_PROXY_SWITCH)).cloned();
            // The path policies: stricter only, at the cluster's contract.
            if !new.spec.config_policy.is_empty() {
                match (classifier(), render::vocab::Contract::parse(&new.spec.version_contract)) {
                    (Ok(c), Some(contract)) => {
                        for f in render::policy::check(c, contract, &new.spec.config_policy) {
                            let text = f.to_string();
                            if f.refuses() { d.policy_problems.push(text) } else { d.policy_warnings.push(text) }
                        }
                    }
                    (Err(e), _) => {
                        d.policy_problems.push(format!("spec.configPolicy: the field metadata does not load here: {e}"))
                    }
                    (_, None) => {}
                }
            }
            d.window_problems =
                crate::window::problems(&new.spec.maintenance_windows, now).iter().map(ToString::to_string).collect();
            let served = |o: &render::api::HealthObject| crate::health::served_in(&facts.served, o);
            d.health_problems =
                crate::health::problems(&new.spec.health_checks, &served).iter().map(ToString::to_string).collect();
            let user = values(&Some(new.clone()));
            d.values_set = !user.is_null();
            d.values_changed = user != values(&old);
            if d.values_set {
                // The one validator, for the mode Cilium will run with.
                let mode = render::render::kube_proxy_in_force(&new);
                d.values_problems = render::cilium::validate(&user, keys, mode == KubeProxyMode::Replaced)
                    .iter()
                    .map(|rf| rf.to_string())
                    .collect();
            }
        }
        ("TalosConfigPatch", "CREATE" | "UPDATE") => {
            match serde_json::from_value::<render::api::TalosConfigPatch>(r.object.clone()) {
                Ok(p) => d.cluster = p.spec.cluster_ref.name,
                Err(_) => d.undecodable = true,
            }
        }
        ("TalosOperation", "CREATE") => match serde_json::from_value::<TalosOperation>(r.object.clone()) {
            Ok(op) => {
                d.cluster = op.spec.cluster_ref.name;
                d.release = op.metadata.labels.and_then(|l| l.get(render::api::RELEASE).cloned());
            }
            Err(_) => d.undecodable = true,
        },
        ("TalosOperation", "UPDATE") => {
            d.old_undecodable = serde_json::from_value::<TalosOperation>(r.old_object.clone()).is_err();
        }
        _ => {}
    }
    d
}

impl Rules {
    /// The shipped rules and messages.
    pub fn embedded() -> Result<Rules, AdmissionError> {
        use engine::Type::{Number as N, Symbol as S};
        let engine = crate::embedded_program(render::embedded::ADMISSION_PROGRAM)?;
        let mut b = engine::Binder::new(&engine.program, "admission");
        let rels = Rels {
            request: b.input("ad_request", [("kind", S), ("operation", S)]),
            undecodable: b.input("ad_undecodable", []),
            old_undecodable: b.input("ad_old_undecodable", []),
            kube_proxy_change: b.input("ad_kube_proxy_change", [("from", S), ("to", S)]),
            version_change: b.input("ad_version_change", [("from", S), ("to", S)]),
            consent: b.input("ad_consent", [("mode", S)]),
            values_problem: b.input("ad_values_problem", [("problem", S)]),
            policy_problem: b.input("ad_policy_problem", [("problem", S)]),
            window_problem: b.input("ad_window_problem", [("problem", S)]),
            health_problem: b.input("ad_health_problem", [("problem", S)]),
            patch_problem: b.input("ad_patch_problem", [("problem", S)]),
            values_changed: b.input("ad_values_changed", []),
            may_write_values: b.input("ad_may_write_values", []),
            other_operation: b.input("ad_other_operation", [("name", S), ("phase", S)]),
            release_of_request: b.input("ad_release_of_request", [("release", S)]),
            release_stage: b.input("ad_release_stage", [("release", S), ("kubernetes", S)]),
            spec_changed: b.input("ad_spec_changed", []),
            refusal: b.output("ad_refusal", [("rank", N), ("template", S), ("a", S), ("b", S)]),
        };
        b.finish().map_err(engine::LoadError::from)?;
        Ok(Rules { engine, rels, messages: crate::messages::Messages::embedded()? })
    }

    /// The webhook's decision for one request, as rules/admission.rules takes it.
    pub fn review(
        &self,
        r: &Request,
        facts: &Facts,
        keys: &render::inventory::Inventory,
    ) -> Result<Verdict, AdmissionError> {
        let d = decode(r, keys, facts);
        let rels = &self.rels;
        let mut b = self.engine.fact_builder();
        let row = [b.sym(&r.kind), b.sym(&r.operation)];
        rels.request.push(&mut b, row);
        let flag = |b: &mut engine::FactBuilder, rel: engine::Input<0>, on: bool| {
            if on {
                rel.push(b, []);
            }
        };
        flag(&mut b, rels.undecodable, d.undecodable);
        flag(&mut b, rels.old_undecodable, d.old_undecodable);
        flag(&mut b, rels.values_changed, d.values_changed);
        flag(&mut b, rels.may_write_values, facts.may_write_values);
        flag(&mut b, rels.spec_changed, d.spec_changed);
        if let Some((from, to)) = d.kube_proxy_change {
            let row = [b.sym(from.name()), b.sym(to.name())];
            rels.kube_proxy_change.push(&mut b, row);
        }
        if let Some((from, to)) = &d.version_change {
            let row = [b.sym(from), b.sym(to)];
            rels.version_change.push(&mut b, row);
        }
        if let Some(c) = &d.consent {
            let row = [b.sym(c)];
            rels.consent.push(&mut b, row);
        }
        for p in &d.values_problems {
            let row = [b.sym(p)];
            rels.values_problem.push(&mut b, row);
        }
        for p in &d.window_problems {
            let row = [b.sym(p)];
            rels.window_problem.push(&mut b, row);
        }
        for p in &d.health_problems {
            let row = [b.sym(p)];
            rels.health_problem.push(&mut b, row);
        }
        for p in &d.policy_problems {
            let row = [b.sym(p)];
            rels.policy_problem.push(&mut b, row);
        }
        for p in &facts.patch_problems {
            let row = [b.sym(p)];
            rels.patch_problem.push(&mut b, row);
        }
        let own = r.object.pointer("/metadata/name").and_then(Json::as_str).unwrap_or_default();
        for (name, phase) in facts.operations.iter().filter(|(n, _)| n != own) {
            let row = [b.sym(name), b.sym(phase.name())];
            rels.other_operation.push(&mut b, row);
        }
        if let Some(release) = &d.release {
            let row = [b.sym(release)];
            rels.release_of_request.push(&mut b, row);
        }
        for (name, version) in &facts.release_stages {
            let row = [b.sym(name), b.sym(version)];
            rels.release_stage.push(&mut b, row);
        }
        let db = self.engine.evaluate_built(b, engine::EvalOptions::default())?;
        let mut rows: Vec<(i64, String, String, String)> = rels
            .refusal
            .rows(&db)
            .map(|[rank, t, a, b]| (db.num(rank), db.sym(t).to_string(), db.sym(a).to_string(), db.sym(b).to_string()))
            .collect();
        rows.sort();
        let context = |a: &str, b: &str| {
            serde_json::json!({
                "object": d.object, "kind": d.kind, "resource": d.kind.to_lowercase(),
                "cluster": d.cluster, "namespace": r.namespace, "user": r.user,
                "consent": d.consent.clone().unwrap_or_default(), "annotation": CONFIRM_KUBE_PROXY_SWITCH,
                "verb": VALUES_VERB, "values_resource": VALUES_RESOURCE, "values_subresource": VALUES_SUBRESOURCE,
                "a": a, "b": b,
            })
        };
        let messages =
            rows.iter().map(|(_, t, a, b)| self.messages.render(t, &context(a, b))).collect::<Result<Vec<_>, _>>()?;
        Ok(Verdict { allowed: messages.is_empty(), messages, warnings: d.policy_warnings })
    }
}

/// The shipped field metadata and classification rules, for the path policies' check.
pub(crate) fn classifier() -> Result<&'static render::classify::Classifier, &'static render::classify::LoadError> {
    static C: std::sync::OnceLock<Result<render::classify::Classifier, render::classify::LoadError>> =
        std::sync::OnceLock::new();
    C.get_or_init(|| render::classify::Classifier::new(&render::classify::RuleSet::embedded())).as_ref()
}

/// The shipped rules, compiled on first use.
pub fn rules() -> Result<&'static Rules, &'static AdmissionError> {
    static RULES: std::sync::OnceLock<Result<Rules, AdmissionError>> = std::sync::OnceLock::new();
    RULES.get_or_init(Rules::embedded).as_ref()
}

/// The webhook's decision for one request, on the shipped rules. When the rules cannot decide,
/// the request is refused (fail closed), naming why.
pub fn review(r: &Request, facts: &Facts, keys: &render::inventory::Inventory) -> Verdict {
    let decided = match rules() {
        Ok(rules) => rules.review(r, facts, keys),
        Err(e) => Err(AdmissionError::Unavailable { why: e.to_string() }),
    };
    decided.unwrap_or_else(|e| {
        let why = crate::error_chain(&e);
        Verdict { allowed: false, messages: vec![format!("{why}; nothing was admitted")], warnings: vec![] }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> render::inventory::Inventory {
        render::inventory::Inventory::parse(render::embedded::CILIUM_KEYS.1).unwrap()
    }

    fn req(kind: &str, op: &str, object: Json, old: Json) -> Request {
        Request {
            uid: "u".into(),
            kind: kind.into(),
            operation: op.into(),
            namespace: "ichor-system".into(),
            user: "alice".into(),
            groups: vec![],
            object,
            old_object: old,
        }
    }

    fn tc(mode: &str, annotation: Option<&str>, values: Json) -> Json {
        let mut v = json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster", "metadata": {"name": "lab", "namespace": "ichor-system"},
            "spec": {"endpoint": "https://lab:6443", "kubernetesVersion": "v1.36.4", "talosVersion": "v1.14.3", "versionContract": "v1.14",
                     "secretsRef": {"name": "s"}, "cni": {"preset": "cilium", "kubeProxy": mode, "cilium": {"values": values}}}});
        if let Some(a) = annotation {
            v["metadata"]["annotations"] = json!({CONFIRM_KUBE_PROXY_SWITCH: a});
        }
        v
    }

    /// Issue 29: a path policy only makes paths stricter; a looser one is refused naming the
    /// field-metadata entry that forbids it, a pattern that matches nothing is a warning.
    #[test]
    fn a_path_policy_is_admitted_only_when_stricter_and_an_unmatched_pattern_warns() {
        let with = |policy: Json| {
            let mut v = tc("enabled", None, Json::Null);
            v["spec"]["configPolicy"] = policy;
            review(&req("TalosCluster", "CREATE", v, Json::Null), &Facts::default(), &keys())
        };
        let v = with(
            json!([{"paths": ["machine.sysctls.**", "ResolverConfig.**"], "class": "reboot-required", "why": "ours"}]),
        );
        assert!(v.allowed && v.warnings.is_empty(), "{v:?}");
        let v = with(json!([{"paths": ["KernelModuleConfig.**"], "class": "safe"}]));
        assert!(!v.allowed, "{v:?}");
        assert!(
            v.messages[0]
                .starts_with("TalosCluster ichor-system/lab: spec.configPolicy[0]: KernelModuleConfig.** would make")
                && v.messages[0].contains("rules/fieldmeta.yaml:"),
            "{}",
            v.messages[0]
        );
        let v = with(json!([{"paths": ["NoSuchConfig.**"], "class": "reboot-required"}]));
        assert!(v.allowed, "{v:?}");
        assert_eq!(v.warnings.len(), 1, "{v:?}");
        assert_eq!(v.response("u")["response"]["warnings"][0], json!(v.warnings[0]));
    }

    #[test]
    fn a_switch_needs_the_annotation_naming_the_target() {
        let old = tc("enabled", None, Json::Null);
        let r = req("TalosCluster", "UPDATE", tc("replaced", None, Json::Null), old.clone());
        let v = review(&r, &Facts::default(), &keys());
        assert!(
            !v.allowed
                && v.messages[0].contains("needs the annotation ichor.maesh.dev/confirm-kube-proxy-switch: replaced"),
            "{v:?}"
        );
        let r = req("TalosCluster", "UPDATE", tc("replaced", Some("enabled"), Json::Null), old.clone());
        assert!(review(&r, &Facts::default(), &keys()).messages[0].contains("(it names \"enabled\")"));
        let r = req("TalosCluster", "UPDATE", tc("replaced", Some("replaced"), Json::Null), old);
        assert!(review(&r, &Facts::default(), &keys()).allowed);
    }

    #[test]
    fn the_refusals_read_as_before_the_rules_took_them() {
        let old = tc("enabled", None, Json::Null);
        let r = req("TalosCluster", "UPDATE", tc("replaced", None, Json::Null), old);
        assert_eq!(
            review(&r, &Facts::default(), &keys()).messages,
            vec![
                "TalosCluster ichor-system/lab: spec.cni.kubeProxy changes from enabled to replaced, which needs the annotation ichor.maesh.dev/confirm-kube-proxy-switch: replaced in the same write; run `ichor cni kube-proxy replaced --cluster lab` (it writes both and starts the switch), or commit both to Git"
            ]
        );
        let bad = req("TalosOperation", "CREATE", json!({"metadata": {"name": "x"}, "spec": 3}), Json::Null);
        assert_eq!(
            review(&bad, &Facts::default(), &keys()).messages,
            vec!["the TalosOperation does not decode: fix its fields (kubectl explain talosoperation.spec)"]
        );
        let op = json!({"metadata": {"name": "b"}, "spec": {"clusterRef": {"name": "lab"}, "kind": "kubernetes", "target": {}}});
        let mut changed = op.clone();
        changed["spec"]["target"] = json!({"kubernetesVersion": "v1.37.0"});
        let v = review(&req("TalosOperation", "UPDATE", changed, op.clone()), &Facts::default(), &keys());
        assert_eq!(
            v.messages,
            vec!["TalosOperation ichor-system/b: spec is immutable once created; abort it and create another"]
        );
        // Its status may change.
        let mut status = op.clone();
        status["status"] = json!({"phase": render::api::Phase::Running});
        assert!(review(&req("TalosOperation", "UPDATE", status, op), &Facts::default(), &keys()).allowed);
    }

    #[test]
    fn values_are_validated_and_admin_only() {
        let old = tc("enabled", None, Json::Null);
        let bad =
            req("TalosCluster", "UPDATE", tc("enabled", None, json!({"kubeProxyReplacement": true})), old.clone());
        assert!(needs(&bad).values_right);
        let v = review(&bad, &Facts { may_write_values: true, ..Facts::default() }, &keys());
        assert!(
            !v.allowed && v.messages[0].contains("spec.cni.cilium.values.kubeProxyReplacement: owned by Ichor"),
            "{v:?}"
        );
        let good = req("TalosCluster", "UPDATE", tc("enabled", None, json!({"hubble": {"enabled": true}})), old);
        let v = review(&good, &Facts::default(), &keys());
        assert!(
            !v.allowed && v.messages[0].contains("admin-only: alice may not update talosclusters/cilium-values"),
            "{v:?}"
        );
        assert!(review(&good, &Facts { may_write_values: true, ..Facts::default() }, &keys()).allowed);
    }

    #[test]
    fn a_second_operation_on_a_locked_cluster_is_refused_with_the_running_ones_name() {
        let op = json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation", "metadata": {"name": "b"},
                        "spec": {"clusterRef": {"name": "lab"}, "kind": "kubernetes", "target": {"kubernetesVersion": "v1.37.0"}}});
        let r = req("TalosOperation", "CREATE", op, Json::Null);
        assert_eq!(needs(&r).operations_of.as_deref(), Some("lab"));
        let v = review(
            &r,
            &Facts { operations: vec![("a".into(), render::api::Phase::Running)], ..Facts::default() },
            &keys(),
        );
        assert!(
            !v.allowed
                && v.messages[0].contains("TalosOperation ichor-system/a (Running) has not ended on cluster lab"),
            "{v:?}"
        );
        // A Paused one is in the way too (it holds no lock, but is resumed or aborted first).
        let paused = Facts { operations: vec![("a".into(), render::api::Phase::Paused)], ..Facts::default() };
        let v = review(&r, &paused, &keys());
        assert!(!v.allowed && v.messages[0].contains("ichor operation resume a"), "{v:?}");
        // The cluster write that would start another meanwhile is refused, naming it.
        let old = tc("enabled", None, Json::Null);
        let mut new = old.clone();
        new["spec"]["kubernetesVersion"] = json!("v1.37.0");
        let w = req("TalosCluster", "UPDATE", new, old);
        assert_eq!(needs(&w).operations_of.as_deref(), Some("lab"));
        let v = review(&w, &paused, &keys());
        assert!(
            !v.allowed
                && v.messages[0].contains("would start an operation while TalosOperation ichor-system/a (Paused)"),
            "{v:?}"
        );
        assert!(
            review(
                &r,
                &Facts { operations: vec![("a".into(), render::api::Phase::Completed)], ..Facts::default() },
                &keys()
            )
            .allowed
        );
    }
}
