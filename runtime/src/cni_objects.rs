//! The CNI's objects as read from the API, pure: Argo CD's Application for Cilium (synced,
//! healthy, owning the release, what its Helm values say of kube-proxy), Ichor's Cilium Jobs
//! (state, hash, operation, mode), a failed pod's last words, who else manages an object (Helm,
//! Argo CD, Flux) and the Cilium version an image runs. The hand-over's rules host
//! (`runtime::handover`) decides with them; the Kubernetes side (`runtime::kube`) reads them.
//!
//! Start at `Application::from_json` and `CiliumJob::from_json`.

/// Where the Cilium preset's Argo CD Application lives (the one Ichor generates).
pub const APPLICATION_NAME: &str = "cilium";
pub const APPLICATION_NAMESPACE: &str = "argocd";

/// What Argo CD's Application for Cilium says.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
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

/// A Cilium Job of Ichor's, as the values reconciler reads it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CiliumJob {
    pub name: String,
    /// Its label `ichor.maesh.dev/values-hash` (a Job made before the label has none).
    pub hash: Option<String>,
    /// The operation it was run for (its label `ichor.maesh.dev/operation`); none for the values
    /// reconciler's.
    pub operation: Option<String>,
    /// The kube-proxy mode it runs for (`--kube-proxy=`).
    pub mode: Option<render::api::KubeProxyMode>,
    pub state: JobState,
    /// Why it failed (the Job's Failed condition), empty otherwise.
    pub why: String,
}

/// Where a Job is, from its conditions (Kubernetes' `Complete` and `Failed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JobState {
    Running,
    Complete,
    Failed,
}

impl JobState {
    /// The state as the rules' `cv_job` facts name it (Kubernetes' words).
    pub fn name(self) -> &'static str {
        match self {
            JobState::Running => "Running", // Kubernetes' word (a Job's state), not an operation phase
            JobState::Complete => "Complete", // Kubernetes' word (a Job's condition type)
            JobState::Failed => "Failed",   // Kubernetes' word (a Job's condition type), not an operation phase
        }
    }
}

/// The label that carries the hash of a Cilium Job's layered values (every Job, the switch's
/// too, so the values reconciler adopts a Job of the hash it wants rather than run another).
pub const VALUES_HASH_LABEL: &str = "ichor.maesh.dev/values-hash";
/// The label naming the operation a Cilium Job was run for (none on the values reconciler's).
pub const OPERATION_LABEL: &str = "ichor.maesh.dev/operation";

impl CiliumJob {
    /// Reads one of Ichor's Jobs (as JSON).
    pub fn from_json(v: &serde_json::Value) -> CiliumJob {
        let condition = |t: &str| {
            v.pointer("/status/conditions")
                .and_then(|c| c.as_array())
                .and_then(|cs| cs.iter().find(|c| c["type"] == t && c["status"] == "True"))
        };
        // A Job's condition types are the names of its end states.
        let (state, why) = match (condition(JobState::Complete.name()), condition(JobState::Failed.name())) {
            (Some(_), _) => (JobState::Complete, String::new()),
            (None, Some(c)) => {
                let text = |k: &str| c[k].as_str().filter(|t| !t.is_empty());
                let why = text("message").or(text("reason")).unwrap_or("failed");
                (JobState::Failed, why.to_string())
            }
            (None, None) => (JobState::Running, String::new()),
        };
        let args = v.pointer("/spec/template/spec/containers/0/args").and_then(|a| a.as_array());
        let mode = args.and_then(|a| a.iter().filter_map(|x| x.as_str()).find_map(|x| x.strip_prefix("--kube-proxy=")));
        let label = |k: &str| v.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(|h| h.as_str());
        CiliumJob {
            name: v.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or_default().to_string(),
            hash: label(VALUES_HASH_LABEL).map(str::to_string),
            operation: label(OPERATION_LABEL).map(str::to_string),
            mode: mode.and_then(render::api::KubeProxyMode::parse),
            state,
            why,
        }
    }
}

/// A failed pod's termination message (its container's last words: Helm's error with
/// `FallbackToLogsOnError`), trimmed to its last 20 lines; none when no container says one.
pub fn termination_message(pod: &serde_json::Value) -> Option<String> {
    let statuses = pod.pointer("/status/containerStatuses")?.as_array()?;
    let text = statuses.iter().find_map(|c| {
        c.pointer("/state/terminated/message").and_then(|m| m.as_str()).map(str::trim).filter(|m| !m.is_empty())
    })?;
    let lines: Vec<&str> = text.lines().collect();
    Some(lines[lines.len().saturating_sub(20)..].join(" / "))
}

/// Who manages an object besides Ichor, from its metadata's labels and annotations: Helm's
/// ownership annotations (`meta.helm.sh/release-namespace` and `-name`: kind `helm`, name
/// `namespace/release`), Argo CD's tracking (annotation `argocd.argoproj.io/tracking-id`, or the
/// label `argocd.argoproj.io/instance`: kind `argocd`, the application), Flux's labels
/// (`helm.toolkit.fluxcd.io/name` or `kustomize.toolkit.fluxcd.io/name` with their namespace:
/// kind `flux`, `HelmRelease namespace/name` or `Kustomization namespace/name`). Sorted.
pub fn cilium_owners(metadata: &serde_json::Value) -> Vec<crate::state::CiliumOwner> {
    let get = |map: &str, key: &str| {
        metadata.get(map).and_then(|m| m.get(key)).and_then(|v| v.as_str()).filter(|v| !v.is_empty())
    };
    let owner = |kind: &str, name: String| crate::state::CiliumOwner { kind: kind.into(), name };
    let mut out = vec![];
    if let Some(release) = get("annotations", "meta.helm.sh/release-name") {
        let ns = get("annotations", "meta.helm.sh/release-namespace").unwrap_or("default");
        out.push(owner("helm", format!("{ns}/{release}")));
    }
    if let Some(id) = get("annotations", "argocd.argoproj.io/tracking-id") {
        // `<application>:<group>/<kind>:<namespace>/<name>`: the application is the first part.
        out.push(owner("argocd", id.split(':').next().unwrap_or(id).to_string()));
    } else if let Some(app) = get("labels", "argocd.argoproj.io/instance") {
        out.push(owner("argocd", app.to_string()));
    }
    for (kind, prefix) in [("HelmRelease", "helm"), ("Kustomization", "kustomize")] {
        if let Some(name) = get("labels", &format!("{prefix}.toolkit.fluxcd.io/name")) {
            let ns = get("labels", &format!("{prefix}.toolkit.fluxcd.io/namespace")).unwrap_or("flux-system");
            out.push(owner("flux", format!("{kind} {ns}/{name}")));
        }
    }
    out.sort();
    out
}

/// The Cilium version an agent image runs (`quay.io/cilium/cilium:v1.20.0@sha256:...` gives
/// `1.20.0`): the running chart's version, as Cilium's chart and agents are released together.
/// None for an image without a version tag (a digest alone, `latest`).
pub fn cilium_version_of_image(image: &str) -> Option<String> {
    let image = image.split('@').next()?;
    let (_, tag) = image.rsplit_once(':').filter(|(repo, tag)| !tag.contains('/') && !repo.is_empty())?;
    let version = tag.strip_prefix('v').unwrap_or(tag);
    let core = version.split(['-', '+']).next()?;
    let parts: Vec<&str> = core.split('.').collect();
    let numeric = parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    numeric.then(|| version.to_string())
}

/// What Cilium runs now, as both hosts read it: cilium-config's kube-proxy-replacement and
/// IPAM mode, the cilium DaemonSet's rollout, and who manages it.
#[derive(Clone, Debug, Default)]
pub struct LiveCilium {
    /// cilium-config was there.
    pub config_read: bool,
    /// cilium-config's whole data.
    pub config: std::collections::BTreeMap<String, String>,
    pub daemon_set: Option<crate::state::DaemonSet>,
    /// The DaemonSet's managers (its labels and annotations: `handover::cilium_owners`).
    pub owners: Vec<crate::state::CiliumOwner>,
}

impl LiveCilium {
    /// cilium-config's kube-proxy-replacement.
    pub fn kpr(&self) -> Option<String> {
        self.config.get("kube-proxy-replacement").cloned()
    }
    /// cilium-config's `ipam`.
    pub fn ipam(&self) -> Option<String> {
        self.config.get("ipam").cloned()
    }
}
