//! The CNI hand-over (ADR 0024): when Argo CD has adopted Cilium, `CNIHandover` turns True on
//! the TalosCluster and the render drops the CNI's inline manifest from then on.
//!
//! Start at `decide` (pure: the cluster's hand-over mode, what Argo CD's Application says, the
//! condition now) and, with the `io` feature, `reconcile` (reads the Application as a dynamic
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
}

impl Application {
    /// Reads an Application object (as JSON).
    pub fn from_json(v: &serde_json::Value) -> Application {
        let s = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or_default().to_string();
        let release = v.pointer("/spec/source/helm/releaseName").and_then(|x| x.as_str()).unwrap_or(APPLICATION_NAME);
        Application {
            sync: s("/status/sync/status"),
            health: s("/status/health/status"),
            owns_release: s("/spec/source/chart") == "cilium"
                && release == "cilium"
                && s("/spec/destination/namespace") == "kube-system",
        }
    }
}

/// The CNIHandover condition to hold, and when to look again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
    pub requeue: Option<Duration>,
}

/// ADR 0024: `automatic` waits for Argo CD to have the Application synced and healthy, owning
/// the release; `manual` and `disabled` hold False and never poll. Once True it stays True: the
/// render has dropped the inline manifest, and turning back would make Talos re-apply the
/// bootstrap Cilium over what Argo CD runs.
pub fn decide(mode: Handover, app: Option<&Application>, done: bool) -> Decision {
    let d = |status, reason, message: String, requeue| Decision { status, reason, message, requeue };
    if done {
        return d(
            "True",
            "Synced",
            "Argo CD owns the Cilium release; the render no longer carries its inline manifest".into(),
            None,
        );
    }
    match (mode, app) {
        (Handover::Disabled, _) => d(
            "False",
            "HandoverDisabled",
            "spec.cni.handover is disabled: Cilium stays Ichor's (inline manifest and Job)".into(),
            None,
        ),
        (Handover::Manual, _) => {
            d("False", "HandoverManual", "spec.cni.handover is manual: hand over when you choose".into(), None)
        }
        (Handover::Automatic, None) => d(
            "False",
            "WaitingForArgoCD",
            format!(
                "no Argo CD Application {APPLICATION_NAMESPACE}/{APPLICATION_NAME} (or Argo CD is not installed): waiting; set spec.cni.handover: disabled if this cluster does not run Argo CD"
            ),
            Some(REQUEUE),
        ),
        (Handover::Automatic, Some(a)) if a.health == "Degraded" => d(
            "False",
            "ArgoCDDegraded",
            format!(
                "Argo CD's Application {APPLICATION_NAMESPACE}/{APPLICATION_NAME} is {}/Degraded: fix it in Argo CD; the hand-over waits",
                a.sync
            ),
            Some(REQUEUE),
        ),
        (Handover::Automatic, Some(a)) if !a.owns_release => d(
            "False",
            "ApplicationDoesNotOwnRelease",
            format!(
                "Argo CD's Application {APPLICATION_NAMESPACE}/{APPLICATION_NAME} does not install the cilium release in kube-system: the hand-over waits for one that does"
            ),
            Some(REQUEUE),
        ),
        (Handover::Automatic, Some(a)) if a.sync == "Synced" && a.health == "Healthy" => d(
            "True",
            "Synced",
            "Argo CD owns the Cilium release; the render no longer carries its inline manifest".into(),
            None,
        ),
        (Handover::Automatic, Some(a)) => d(
            "False",
            "ArgoCDProgressing",
            format!(
                "Argo CD's Application {APPLICATION_NAMESPACE}/{APPLICATION_NAME} is {}/{}: waiting for Synced/Healthy",
                or(&a.sync),
                or(&a.health)
            ),
            Some(REQUEUE),
        ),
    }
}

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
    ) -> Result<Option<Duration>, kube_client::Error> {
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
                Err(e) => return Err(e),
            }
        };
        let d = decide(cluster.spec.cni.handover, app.as_ref(), done);
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
                status: d.status.into(),
                reason: d.reason.into(),
                message: d.message.clone(),
                last_transition_time: Some(now.to_string()),
            });
            let api: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"conditions": conditions}})),
            )
            .await?;
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
        Application { sync: sync.into(), health: health.into(), owns_release: true }
    }

    #[test]
    fn absent_argo_cd_waits_and_comes_back() {
        let d = decide(Handover::Automatic, None, false);
        assert_eq!((d.status, d.reason, d.requeue), ("False", "WaitingForArgoCD", Some(REQUEUE)));
    }

    #[test]
    fn progressing_waits() {
        let d = decide(Handover::Automatic, Some(&app("OutOfSync", "Progressing")), false);
        assert_eq!((d.status, d.reason), ("False", "ArgoCDProgressing"));
        assert!(d.message.contains("OutOfSync/Progressing"));
        assert_eq!(d.requeue, Some(REQUEUE));
    }

    #[test]
    fn synced_and_healthy_owning_the_release_is_done() {
        let d = decide(Handover::Automatic, Some(&app("Synced", "Healthy")), false);
        assert_eq!((d.status, d.reason, d.requeue), ("True", "Synced", None));
        let not_ours = Application { owns_release: false, ..app("Synced", "Healthy") };
        assert_eq!(decide(Handover::Automatic, Some(&not_ours), false).reason, "ApplicationDoesNotOwnRelease");
    }

    #[test]
    fn degraded_waits_and_says_so() {
        let d = decide(Handover::Automatic, Some(&app("Synced", "Degraded")), false);
        assert_eq!((d.status, d.reason), ("False", "ArgoCDDegraded"));
        // Once done, a later degradation does not bring the inline manifest back.
        assert_eq!(decide(Handover::Automatic, Some(&app("Synced", "Degraded")), true).status, "True");
    }

    #[test]
    fn manual_and_disabled_never_poll() {
        for m in [Handover::Manual, Handover::Disabled] {
            let d = decide(m, None, false);
            assert_eq!((d.status, d.requeue), ("False", None));
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
}
