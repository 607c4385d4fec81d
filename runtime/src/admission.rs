//! Admission (ADR 0013 and its amendments): what the validating webhook refuses, as a function on
//! plain data. The CRDs' CEL rules (`render::api`) hold what is structural; this holds the rest.
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
}

/// What was looked up.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub may_write_values: bool,
    /// The cluster's other operations: name and phase.
    pub operations: Vec<(String, render::api::Phase)>,
}

/// The verdict: allowed, or refused with a message that names the field and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub messages: Vec<String>,
}

impl Verdict {
    /// The AdmissionReview v1 response body.
    pub fn response(&self, uid: &str) -> Json {
        let mut r = json!({"uid": uid, "allowed": self.allowed});
        if !self.allowed {
            r["status"] = json!({"code": 403, "reason": "Forbidden", "message": self.messages.join("; ")});
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
            Needs { values_right: values(&new) != values(&old) && !values(&new).is_null(), operations_of: None }
        }
        "TalosOperation" if r.operation == "CREATE" => Needs {
            values_right: false,
            operations_of: r.object.pointer("/spec/clusterRef/name").and_then(Json::as_str).map(str::to_string),
        },
        _ => Needs::default(),
    }
}

/// The webhook's decision for one request.
pub fn review(r: &Request, facts: &Facts, keys: &render::inventory::Inventory) -> Verdict {
    let mut refusals = vec![];
    match (r.kind.as_str(), r.operation.as_str()) {
        ("TalosCluster", "CREATE" | "UPDATE") => {
            let Some(new) = cluster(&r.object) else {
                return Verdict {
                    allowed: false,
                    messages: vec![
                        "the TalosCluster does not decode: fix its fields (kubectl explain taloscluster.spec)".into(),
                    ],
                };
            };
            let old = cluster(&r.old_object);
            let name = format!("TalosCluster {}/{}", r.namespace, new.metadata.name.clone().unwrap_or_default());
            // ADR 0066 amendment: a switch needs the annotation naming the target mode, in the
            // same write.
            if let Some(old) = &old
                && old.spec.cni.kube_proxy != new.spec.cni.kube_proxy
            {
                let target = new.spec.cni.kube_proxy.name();
                let consent = new.metadata.annotations.as_ref().and_then(|a| a.get(CONFIRM_KUBE_PROXY_SWITCH));
                if consent.map(String::as_str) != Some(target) {
                    refusals.push(format!(
                        "{name}: spec.cni.kubeProxy changes from {} to {target}, which needs the annotation {CONFIRM_KUBE_PROXY_SWITCH}: {target} in the same write{}; run `ichor cni kube-proxy {target} --cluster {}` (it writes both and starts the switch), or commit both to Git",
                        old.spec.cni.kube_proxy.name(),
                        match consent {
                            Some(other) => format!(" (it names {other:?})"),
                            None => String::new(),
                        },
                        new.metadata.name.clone().unwrap_or_default()
                    ));
                }
            }
            // The one validator, for the mode Cilium will run with.
            let user = values(&Some(new.clone()));
            if !user.is_null() {
                let mode = render::render::kube_proxy_in_force(&new);
                for rf in render::cilium::validate(&user, keys, mode == KubeProxyMode::Replaced) {
                    refusals.push(format!("{name}: spec.cni.cilium.values.{rf}"));
                }
            }
            // Admin-only values.
            if values(&Some(new.clone())) != values(&old) && !user.is_null() && !facts.may_write_values {
                refusals.push(format!(
                    "{name}: spec.cni.cilium.values is admin-only: {} may not {VALUES_VERB} {VALUES_RESOURCE}/{VALUES_SUBRESOURCE} in {} (ichor-admin holds it); ask an admin to change the values, or change the rest of the cluster without them",
                    r.user, r.namespace
                ));
            }
        }
        ("TalosOperation", "CREATE") => {
            let op: Option<TalosOperation> = serde_json::from_value(r.object.clone()).ok();
            let Some(op) = op else {
                return Verdict {
                    allowed: false,
                    messages: vec![
                        "the TalosOperation does not decode: fix its fields (kubectl explain talosoperation.spec)"
                            .into(),
                    ],
                };
            };
            let own = op.metadata.name.clone().unwrap_or_default();
            if let Some((held, phase)) = facts.operations.iter().find(|(n, p)| n != &own && p.holds_lock()) {
                refusals.push(format!(
                    "TalosOperation {}/{own}: cluster {} is locked by TalosOperation {}/{held} ({phase}); wait for it (`ichor status --cluster {} --watch`) or abort it (`ichor operation abort {held}`)",
                    r.namespace, op.spec.cluster_ref.name, r.namespace, op.spec.cluster_ref.name
                ));
            }
        }
        ("TalosOperation", "UPDATE") if r.object.get("spec") != r.old_object.get("spec") => {
            refusals.push(format!(
                "TalosOperation {}/{}: spec is immutable once created; abort it and create another",
                r.namespace,
                r.object.pointer("/metadata/name").and_then(Json::as_str).unwrap_or_default()
            ));
        }
        _ => {}
    }
    Verdict { allowed: refusals.is_empty(), messages: refusals }
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
        assert!(!v.allowed && v.messages[0].contains("locked by TalosOperation ichor-system/a (Running)"), "{v:?}");
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
