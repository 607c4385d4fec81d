//! What Ichor may do in a cluster, as data: the controller's ClusterRole (least privilege,
//! each rule with why it is needed), the Cilium Job's own rights (Helm's, which the controller
//! does not hold), which `install` builds the install manifests from (`ichor install`).
//!
//! Start at `CONTROLLER_RULES`. `allowed` checks a request (verb, group, resource) against
//! them; the tests replay every request the controller made in its end-to-end scenarios
//! through it, so the role never drifts from what the code calls.

/// One rule of a ClusterRole, with why Ichor needs it.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub why: &'static str,
}

/// The controller's ClusterRole.
pub const CONTROLLER_RULES: &[Rule] = &[
    Rule {
        group: "argoproj.io",
        resources: &["applications"],
        verbs: &["get"],
        why: "the CNI hand-over (ADR 0024) reads Argo CD's Application for Cilium: synced, healthy, owning the release",
    },
    Rule {
        group: "apps",
        resources: &["deployments"],
        verbs: &["get", "patch"],
        why: "the bootstrap-manifest sync applies Talos's rendering: CoreDNS's Deployment",
    },
    Rule {
        group: "",
        resources: &["services"],
        verbs: &["get", "patch"],
        why: "the bootstrap-manifest sync: CoreDNS's Service",
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["clusterroles", "roles", "rolebindings"],
        verbs: &["get", "patch"],
        why: "the bootstrap-manifest sync: the RBAC Talos renders (CSR approval, node RBAC template, CoreDNS)",
    },
    Rule {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        verbs: &["get", "patch"],
        why: "the bootstrap-manifest sync: Talos's ServiceAccount CRD (with Talos API access)",
    },
    Rule {
        group: "ichor.maesh.dev",
        resources: &["talosclusters", "talosmachines", "talosconfigpatches", "talosoperations"],
        verbs: &["get", "list", "watch"],
        why: "the custom resources it reconciles and renders from",
    },
    Rule {
        group: "ichor.maesh.dev",
        resources: &["talosclusters/status", "talosmachines/status", "talosoperations/status"],
        verbs: &["get", "patch", "update"],
        why: "status: operation progress and clocks, machine conditions, status.cni.kubeProxy",
    },
    Rule {
        group: "",
        resources: &["secrets"],
        verbs: &["get", "list", "watch"],
        why: "the Talos secrets bundle a TalosCluster names (secretsRef), to render; its changes wake the machines (watched by metadata only)",
    },
    Rule {
        group: "",
        resources: &["nodes"],
        verbs: &["get", "list", "watch", "patch"],
        why: "Ready and kubelet versions; cordon and uncordon (spec.unschedulable)",
    },
    Rule {
        group: "",
        resources: &["pods"],
        verbs: &["get", "list", "watch"],
        why: "mirror pods of the control-plane components; the pods a drain evicts",
    },
    Rule {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: &["list"],
        why: "a drain blocked past its deadline names the PodDisruptionBudgets that select the pod",
    },
    Rule {
        group: "",
        resources: &["pods/eviction"],
        verbs: &["create"],
        why: "drains through the Eviction API (PodDisruptionBudgets respected)",
    },
    Rule {
        group: "apps",
        resources: &["daemonsets"],
        verbs: &["get", "list", "watch", "patch", "delete"],
        why: "the cilium and kube-proxy rollouts; the kube-proxy switch deletes and restores kube-proxy (server-side apply as Talos)",
    },
    Rule {
        group: "",
        resources: &["configmaps", "serviceaccounts"],
        verbs: &["get", "list", "watch", "patch", "delete"],
        why: "cilium-config (watched: a change wakes the operations); the bootstrap-manifest sync and kube-proxy's own objects",
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["clusterrolebindings"],
        verbs: &["get", "patch", "delete"],
        why: "the bootstrap-manifest sync and the kube-proxy ClusterRoleBinding",
    },
    Rule {
        group: "batch",
        resources: &["jobs"],
        verbs: &["get", "list", "watch", "create"],
        why: "the Cilium Job, and whether it failed (watched: a Job that ends or is deleted wakes the values reconciler; it runs under its own ServiceAccount, the controller never holds Helm's rights)",
    },
    Rule {
        group: "cilium.io",
        resources: &["ciliumnetworkpolicies"],
        verbs: &["get", "patch"],
        why: "Ichor's namespace locked down once Cilium is ready (its own CiliumNetworkPolicies, field manager ichor-network-policy; --no-network-policies turns it off)",
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "create", "patch", "update"],
        why: "leader election: two replicas never both act",
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        why: "an Event on the operation for every action and pause",
    },
];

/// The Cilium Job's ServiceAccount and why it is apart: Helm installs and upgrades Cilium,
/// which needs nearly cluster-admin rights (the CNI page); the controller only creates the Job.
pub const JOB_SERVICE_ACCOUNT_WHY: &str = "the Cilium Helm Job (ichor-cni) runs as its own ServiceAccount bound to cluster-admin: Helm manages every kind the chart renders; the controller can create the Job but not act as it";

/// The bootstrap-manifest sync applies whatever Talos rendered (Talos's own manifests: the
/// CoreDNS and kube-proxy objects, their RBAC): those kinds need patch too.
pub const SYNC_NOTE: &str = "the bootstrap-manifest sync server-side-applies Talos's rendered manifests (kube-proxy, CoreDNS and their RBAC) under field manager talos; the rules above cover the kinds Talos renders";

/// Whether the controller's role allows `verb` on `resource` (with `/subresource`) of `group`.
pub fn allowed(verb: &str, group: &str, resource: &str) -> bool {
    CONTROLLER_RULES.iter().any(|r| r.group == group && r.resources.contains(&resource) && r.verbs.contains(&verb))
}

/// The request of a log line of the in-memory API (`METHOD /path?query`) as (verb, group,
/// resource): `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
pub fn request(line: &str) -> Option<(String, String, String)> {
    let (method, uri) = line.split_once(' ')?;
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _, rest @ ..] => ("", rest),
        ["apis", g, _, rest @ ..] => (*g, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _, rest @ ..] if !rest.is_empty() => rest,
        r => r,
    };
    let (resource, named) = match rest {
        [plural] => (plural.to_string(), false),
        [plural, _] => (plural.to_string(), true),
        [plural, _, sub] => (format!("{plural}/{sub}"), true),
        _ => return None,
    };
    let watch = query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, named) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => return None,
    };
    Some((verb.to_string(), group.to_string(), resource))
}

/// The controller's ClusterRole as YAML, each rule under its reason.
pub fn cluster_role_yaml(name: &str) -> String {
    let mut s =
        format!("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {name}\nrules:\n");
    for r in CONTROLLER_RULES {
        s += &format!(
            "  # {}\n  - apiGroups: [\"{}\"]\n    resources: [{}]\n    verbs: [{}]\n",
            r.why,
            r.group,
            r.resources.iter().map(|x| format!("\"{x}\"")).collect::<Vec<_>>().join(", "),
            r.verbs.iter().map(|x| format!("\"{x}\"")).collect::<Vec<_>>().join(", ")
        );
    }
    s
}
