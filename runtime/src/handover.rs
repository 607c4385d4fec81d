//! The CNI hand-over (ADR 0024): when Argo CD has adopted Cilium, `CNIHandover` turns True on
//! the TalosCluster and the render drops the CNI's inline manifest from then on.
//!
//! Start at `decide` (pure: the cluster's hand-over mode, what Argo CD's Application says, the
//! condition now, given to rules/handover.rules as facts; the rules decide, this file fills
//! the facts and reads the condition) and, with the `io` feature, `reconcile` (reads the Application as a dynamic
//! object, writes the condition only when it changes). Absent Argo CD is "not here yet": the
//! condition says `WaitingForArgoCD` and the reconcile comes back later, never a hang or an error.

use render::api::Handover;
use std::time::Duration;

/// Where the Cilium preset's Argo CD Application lives (the one Ichor generates).
pub const APPLICATION_NAME: &str = "cilium";
pub const APPLICATION_NAMESPACE: &str = "argocd";
/// How often an unfinished hand-over is looked at again.
pub const REQUEUE: Duration = Duration::from_secs(30);

/// What Argo CD's Application for Cilium says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Application {
    /// `status.sync.status`: `Synced`, `OutOfSync`, `Unknown`.
    pub sync: String,
    /// `status.health.status`: `Healthy`, `Progressing`, `Degraded`, `Missing`, ...
    pub health: String,
    /// The Application installs the `cilium` release in `kube-system` (chart `cilium`).
    pub owns_release: bool,
    /// What its Helm values (`valuesObject`, else the `values` text) say of
    /// `kubeProxyReplacement` (`true`, `false`): the values' home after the hand-over. None
    /// when they do not say (a value file in Git, which Ichor does not read).
    pub kube_proxy_replacement: Option<String>,
}

impl Application {
    /// Reads an Application object (as JSON): its source of the `cilium` chart is `spec.source`
    /// or one of `spec.sources`.
    pub fn from_json(v: &serde_json::Value) -> Application {
        let s = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or_default().to_string();
        let chart = |x: &serde_json::Value| x.get("chart").and_then(|c| c.as_str()) == Some("cilium");
        let source = v.pointer("/spec/source").filter(|x| chart(x)).or_else(|| {
            v.pointer("/spec/sources").and_then(|l| l.as_array()).and_then(|l| l.iter().find(|x| chart(x)))
        });
        let helm = source.and_then(|x| x.get("helm"));
        let release = helm.and_then(|h| h.get("releaseName")).and_then(|x| x.as_str()).unwrap_or(APPLICATION_NAME);
        Application {
            sync: s("/status/sync/status"),
            health: s("/status/health/status"),
            owns_release: source.is_some() && release == "cilium" && s("/spec/destination/namespace") == "kube-system",
            kube_proxy_replacement: helm.and_then(helm_kube_proxy_replacement),
        }
    }
}

/// `kubeProxyReplacement` in an Argo CD Helm source: `valuesObject` first (Argo CD gives it
/// precedence over `values`), then the `values` YAML text. A string or a boolean, as text.
fn helm_kube_proxy_replacement(helm: &serde_json::Value) -> Option<String> {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    if let Some(v) = helm.get("valuesObject").and_then(|o| o.get("kubeProxyReplacement")) {
        return text(v);
    }
    let values = helm.get("values")?.as_str()?;
    render::yaml::scalar_text(
        render::yaml::parse(values, render::config::MAX_CONFIG_BYTES).ok()?.get("kubeProxyReplacement")?,
    )
}

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
}

/// The hand-over program's relations, as this host uses them (bound once at load).
struct Rels {
    mode: engine::Input<1>,
    done: engine::Input<0>,
    application: engine::Input<2>,
    owns_release: engine::Input<0>,
    condition: engine::Output<3>,
    requeue: engine::Output<0>,
}

/// The hand-over host: rules/handover.rules compiled once, and the message templates.
pub struct Rules {
    engine: engine::Engine,
    rels: Rels,
    messages: crate::messages::Messages,
}

impl Rules {
    /// The shipped rules and messages.
    pub fn embedded() -> Result<Rules, HandoverError> {
        use engine::Type::Symbol as S;
        let engine = crate::embedded_program(render::embedded::HANDOVER_PROGRAM)?;
        let mut b = engine::Binder::new(&engine.program, "hand-over");
        let rels = Rels {
            mode: b.input("ho_mode", [("mode", S)]),
            done: b.input("ho_done", []),
            application: b.input("ho_application", [("sync", S), ("health", S)]),
            owns_release: b.input("ho_owns_release", []),
            condition: b.output("ho_condition", [("status", S), ("reason", S), ("template", S)]),
            requeue: b.output("ho_requeue", []),
        };
        b.finish().map_err(engine::LoadError::from)?;
        let messages = crate::messages::Messages::embedded()?;
        Ok(Rules { engine, rels, messages })
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

#[cfg(feature = "io")]
mod io {
    use super::*;
    use kube_client::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    use render::api::TalosCluster;

    /// One hand-over reconcile of a cluster: read the Application, decide, write the condition
    /// when it changes. Returns when to look again.
    pub async fn reconcile(
        client: &kube_client::Client,
        cluster: &TalosCluster,
        now: &str,
    ) -> Result<Option<Duration>, crate::controller::ControllerError> {
        use crate::controller::ControllerError;
        let kube = |source| ControllerError::Kube { what: "the CNI hand-over".into(), source };
        let done = render::render::handover_done(cluster);
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
            "applications",
        );
        let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), APPLICATION_NAMESPACE, &ar);
        let app = if done || cluster.spec.cni.handover != Handover::Automatic {
            None
        } else {
            match apps.get_opt(APPLICATION_NAME).await {
                Ok(a) => a.map(|o| Application::from_json(&serde_json::to_value(&o).unwrap_or_default())),
                // Argo CD's CRDs not installed: the same as no Application.
                Err(kube_client::Error::Api(e)) if e.code == 404 => None,
                Err(e) => return Err(kube(e)),
            }
        };
        let d = decide(cluster.spec.cni.handover, app.as_ref(), done)?;
        let current = cluster.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "CNIHandover"));
        let same = current.is_some_and(|c| c.status == d.status && c.reason == d.reason && c.message == d.message);
        if !same {
            let ns = cluster.metadata.namespace.clone().unwrap_or_default();
            let name = cluster.metadata.name.clone().unwrap_or_default();
            let mut conditions: Vec<render::api::Condition> =
                cluster.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
            conditions.retain(|c| c.type_ != "CNIHandover");
            conditions.push(render::api::Condition {
                type_: "CNIHandover".into(),
                status: d.status.clone(),
                reason: d.reason.clone(),
                message: d.message.clone(),
                last_transition_time: Some(now.to_string()),
            });
            let api: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"conditions": conditions}})),
            )
            .await
            .map_err(kube)?;
            crate::crashpoint::after(crate::crashpoint::Write::Status);
        }
        Ok(d.requeue)
    }
}

#[cfg(feature = "io")]
pub use io::reconcile;

#[cfg(test)]
mod tests {
    use super::*;

    fn app(sync: &str, health: &str) -> Application {
        Application { sync: sync.into(), health: health.into(), owns_release: true, kube_proxy_replacement: None }
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
