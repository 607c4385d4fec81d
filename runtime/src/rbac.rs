//! What Ichor may do in a cluster, as data: the controller's ClusterRole (least privilege,
//! each rule with why it is needed), the Cilium Job's own rights (Helm's, which the controller
//! does not hold), and the install manifests built from them (`ichor install`).
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
        verbs: &["get", "list", "create"],
        why: "the Cilium Job, and whether it failed (it runs under its own ServiceAccount; the controller never holds Helm's rights)",
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

/// Everything to install Ichor's controller in `namespace` (the CRDs come from `ichor crds`).
pub fn install_yaml(namespace: &str, image: &str) -> String {
    let role = cluster_role_yaml("ichor-controller");
    format!(
        r#"# Ichor's controller. Apply after `ichor crds | kubectl apply --server-side -f -`.
# The talosconfig (role os:admin) goes in Secret {namespace}/ichor-talosconfig, key talosconfig.
apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: ichor-controller
  namespace: {namespace}
---
{role}---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: ichor-controller
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: ichor-controller
subjects:
  - kind: ServiceAccount
    name: ichor-controller
    namespace: {namespace}
---
# {job_why}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: ichor-cni
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: ichor-cni
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: cluster-admin
subjects:
  - kind: ServiceAccount
    name: ichor-cni
    namespace: kube-system
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ichor-controller
  namespace: {namespace}
spec:
  replicas: 2
  selector:
    matchLabels:
      app.kubernetes.io/name: ichor-controller
  template:
    metadata:
      labels:
        app.kubernetes.io/name: ichor-controller
    spec:
      serviceAccountName: ichor-controller
      containers:
        - name: controller
          image: {image}
          args: ["controller", "--talosconfig", "/etc/ichor/talosconfig", "--namespace", "{namespace}"]
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
          ports:
            - name: http
              containerPort: 8080
          livenessProbe:
            httpGet:
              path: /healthz
              port: http
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
          volumeMounts:
            - name: talosconfig
              mountPath: /etc/ichor
              readOnly: true
      volumes:
        - name: talosconfig
          secret:
            secretName: ichor-talosconfig
---
# The validating webhook (`ichor webhook`): what the CRDs' CEL rules cannot say. Its TLS
# certificate is the kubernetes.io/tls Secret {namespace}/ichor-webhook-tls (cert-manager's
# Certificate, or your own); cert-manager injects the CA into the configuration below.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: ichor-webhook
  namespace: {namespace}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: ichor-webhook
rules:
  # Whether the requester may write Cilium values (talosclusters/cilium-values, ichor-admin only).
  - apiGroups: ["authorization.k8s.io"]
    resources: ["subjectaccessreviews"]
    verbs: ["create"]
  # The cluster lock: the other operations of the cluster.
  - apiGroups: ["ichor.maesh.dev"]
    resources: ["talosoperations"]
    verbs: ["list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: ichor-webhook
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: ichor-webhook
subjects:
  - kind: ServiceAccount
    name: ichor-webhook
    namespace: {namespace}
---
# Its own certificate only.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: ichor-webhook-tls
  namespace: {namespace}
rules:
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: ["ichor-webhook-tls"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: ichor-webhook-tls
  namespace: {namespace}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: ichor-webhook-tls
subjects:
  - kind: ServiceAccount
    name: ichor-webhook
    namespace: {namespace}
---
# Writing Cilium values is a right of its own (CNI page): bind this to ichor-admin only.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: ichor-admin-cilium-values
rules:
  - apiGroups: ["ichor.maesh.dev"]
    resources: ["talosclusters/cilium-values"]
    verbs: ["update"]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ichor-webhook
  namespace: {namespace}
spec:
  replicas: 2
  selector:
    matchLabels:
      app.kubernetes.io/name: ichor-webhook
  template:
    metadata:
      labels:
        app.kubernetes.io/name: ichor-webhook
    spec:
      serviceAccountName: ichor-webhook
      containers:
        - name: webhook
          image: {image}
          args: ["webhook", "--namespace", "{namespace}", "--tls-secret", "ichor-webhook-tls", "--listen", "0.0.0.0:9443"]
          ports:
            - name: https
              containerPort: 9443
---
apiVersion: v1
kind: Service
metadata:
  name: ichor-webhook
  namespace: {namespace}
spec:
  selector:
    app.kubernetes.io/name: ichor-webhook
  ports:
    - name: https
      port: 443
      targetPort: https
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: ichor
  annotations:
    cert-manager.io/inject-ca-from: {namespace}/ichor-webhook-tls
webhooks:
  - name: validate.ichor.maesh.dev
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig:
      service:
        name: ichor-webhook
        namespace: {namespace}
        path: /validate
    rules:
      - apiGroups: ["ichor.maesh.dev"]
        apiVersions: ["v1alpha1"]
        resources: ["talosclusters", "talosoperations"]
        operations: ["CREATE", "UPDATE"]
"#,
        job_why = JOB_SERVICE_ACCOUNT_WHY
    )
}
