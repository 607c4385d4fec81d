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
    /// The objects it is limited to (`resourceNames`); empty: every object.
    pub names: &'static [&'static str],
    pub why: &'static str,
}

/// The label that adds a ClusterRole's rules to what the controller may read for the health
/// checks (`spec.healthChecks`): the install's `ichor-health-checks` ClusterRole aggregates every
/// ClusterRole that carries it, so an operator grants `get` and `list` on the kinds their checks
/// read without touching Ichor's own role.
pub const HEALTH_CHECKS_AGGREGATE: &str = "ichor.maesh.dev/aggregate-to-health-checks";

/// The controller's ClusterRole.
pub const CONTROLLER_RULES: &[Rule] = &[
    Rule {
        group: "argoproj.io",
        resources: &["applications"],
        verbs: &["get"],
        names: &[],
        why: "the CNI hand-over (ADR 0024) reads Argo CD's Application for Cilium: synced, healthy, owning the release",
    },
    Rule {
        group: "apps",
        resources: &["deployments"],
        verbs: &["get", "patch"],
        names: &[],
        why: "the bootstrap-manifest sync applies Talos's rendering: CoreDNS's Deployment",
    },
    Rule {
        group: "",
        resources: &["services"],
        verbs: &["get", "patch"],
        names: &[],
        why: "the bootstrap-manifest sync: CoreDNS's Service",
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["clusterroles", "roles", "rolebindings"],
        verbs: &["get", "patch"],
        names: &[],
        why: "the bootstrap-manifest sync: the RBAC Talos renders (CSR approval, node RBAC template, CoreDNS)",
    },
    Rule {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        verbs: &["get", "patch"],
        names: &[],
        why: "the bootstrap-manifest sync: Talos's ServiceAccount CRD (with Talos API access)",
    },
    Rule {
        group: "ichor.maesh.dev",
        resources: &["talosclusters", "talosmachines", "talosoperations"],
        verbs: &["get", "list", "watch"],
        names: &[],
        why: "the custom resources it reconciles and renders from",
    },
    Rule {
        group: "ichor.maesh.dev",
        resources: &["talosoperations"],
        verbs: &["create"],
        names: &[],
        why: "a release rollout (ichor upgrade cluster) creates each stage's operation in turn",
    },
    Rule {
        group: "ichor.maesh.dev",
        resources: &["talosclusters"],
        verbs: &["patch"],
        names: &[],
        why: "a release rollout sets spec.talosVersion or spec.kubernetesVersion as each stage starts",
    },
    Rule {
        group: "ichor.maesh.dev",
        resources: &["talosconfigpatches"],
        verbs: &["list", "watch"],
        names: &[],
        why: "the patches it renders with, read as a cluster's whole list (never one by name)",
    },
    Rule {
        group: "ichor.maesh.dev",
        resources: &["talosclusters/status", "talosmachines/status", "talosoperations/status"],
        verbs: &["patch"],
        names: &[],
        why: "status: operation progress and clocks, machine conditions, status.cni.kubeProxy",
    },
    Rule {
        group: "",
        resources: &["secrets"],
        verbs: &["get", "list", "watch"],
        names: &[],
        why: "the Talos secrets bundle a TalosCluster names (secretsRef), to render; its changes wake the machines (watched by metadata only)",
    },
    Rule {
        group: "",
        resources: &["nodes"],
        verbs: &["list", "watch", "patch"],
        names: &[],
        why: "Ready and kubelet versions; cordon and uncordon (spec.unschedulable)",
    },
    Rule {
        group: "",
        resources: &["nodes"],
        verbs: &["get"],
        names: &[],
        why: "the taints of the Node drained next, read to add or remove Ichor's PreferNoSchedule one",
    },
    Rule {
        group: "",
        resources: &["pods"],
        verbs: &["get", "list", "watch"],
        names: &[],
        why: "mirror pods of the control-plane components; the pods a drain evicts; the Lease holder's pod, for its node (in a pod, when the Lease does not name it)",
    },
    Rule {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: &["list"],
        names: &[],
        why: "a drain blocked past its deadline names the PodDisruptionBudgets that select the pod",
    },
    Rule {
        group: "",
        resources: &["pods/eviction"],
        verbs: &["create"],
        names: &[],
        why: "drains through the Eviction API (PodDisruptionBudgets respected)",
    },
    Rule {
        group: "apps",
        resources: &["daemonsets"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        names: &[],
        why: "the cilium and kube-proxy rollouts; the kube-proxy switch deletes and restores kube-proxy (server-side apply as Talos; an apply that creates is authorized as a create)",
    },
    Rule {
        group: "",
        resources: &["configmaps"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        names: &[],
        why: "cilium-config (watched: a change wakes the operations); the bootstrap-manifest sync (its inventory ConfigMap created on the first sync) and kube-proxy's own ConfigMap, restored by apply",
    },
    Rule {
        group: "",
        resources: &["serviceaccounts"],
        verbs: &["get", "create", "patch", "delete"],
        names: &[],
        why: "the bootstrap-manifest sync and kube-proxy's ServiceAccount, deleted by a switch and restored by apply",
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["clusterrolebindings"],
        verbs: &["get", "create", "patch", "delete"],
        names: &[],
        why: "the bootstrap-manifest sync and the kube-proxy ClusterRoleBinding (deleted by a switch, restored by apply)",
    },
    Rule {
        group: "batch",
        resources: &["jobs"],
        verbs: &["list", "watch", "create"],
        names: &[],
        why: "the Cilium Job, and whether it failed (watched: a Job that ends or is deleted wakes the values reconciler; it runs under its own ServiceAccount, the controller never holds Helm's rights)",
    },
    Rule {
        group: "cilium.io",
        resources: &["ciliumnetworkpolicies"],
        verbs: &["get", "create", "patch"],
        names: &[],
        why: "Ichor's namespace locked down once Cilium is ready (its own CiliumNetworkPolicies, created and kept by server-side apply under field manager ichor-network-policy; --no-network-policies turns it off)",
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "create", "patch"],
        names: &[],
        why: "leader election: two replicas never both act",
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        names: &[],
        why: "an Event on the operation for every action and pause",
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["clusterroles"],
        verbs: &["bind"],
        names: &["system:node-proxier"],
        why: "restoring kube-proxy's ClusterRoleBinding grants system:node-proxier, which the controller does not hold: kube-apiserver lets it bind that role only (escalation prevention)",
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

/// The in-memory API's log word for a server-side apply that created its object: kube-apiserver
/// authorizes it as a create besides the patch.
pub const APPLY_CREATE: &str = "APPLY-CREATE";

/// The request of a log line of the in-memory API (`METHOD /path?query`) as (verb, group,
/// resource): `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` (`APPLY_CREATE`
/// lines: `create`).
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
        // A server-side apply that created its object: kube-apiserver asks for create too.
        (APPLY_CREATE, _) => "create",
        _ => return None,
    };
    Some((verb.to_string(), group.to_string(), resource))
}

/// `["a", "b"]`'s inside: each quoted, comma-separated.
fn quoted(xs: &[&str]) -> String {
    xs.iter().map(|x| format!("\"{x}\"")).collect::<Vec<_>>().join(", ")
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
            quoted(r.resources),
            quoted(r.verbs)
        );
        if !r.names.is_empty() {
            s += &format!("    resourceNames: [{}]\n", quoted(r.names));
        }
    }
    s
}
