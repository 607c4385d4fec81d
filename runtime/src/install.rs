//! `ichor install`, `ichor install --rotate-certs` and `ichor uninstall` as text built from
//! data: the controller's and the webhook's objects, hardened (restricted Pod Security, requests
//! and limits, probes, a PodDisruptionBudget and anti-affinity), with the webhook's TLS either
//! generated here (a CA and a serving certificate, shipped as the Secret and the `caBundle`) or
//! cert-manager's (an Issuer chain and the Certificate, the CA injected).
//!
//! Start at `Install` and `install_yaml`; `webhook_certs` makes the certificates, `talosconfig`
//! checks the file the controller's Secret carries, `verify` makes the API server's handshake
//! with the webhook in memory, `uninstall_yaml` lists what to delete.

use crate::rbac::{JOB_SERVICE_ACCOUNT_WHY, cluster_role_yaml};
use base64::Engine as _;
use serde_json::{Value as Json, json};

/// What `ichor install` ships.
#[derive(Clone, Debug)]
pub struct Install {
    pub namespace: String,
    pub image: String,
    /// Replicas of the controller and of the webhook (two: one survives a drain).
    pub replicas: u32,
    pub tls: WebhookTls,
    /// The namespace locked down with CiliumNetworkPolicies once Cilium is ready, with the
    /// CIDRs the controller's metrics may be scraped from; `None`: off
    /// (`--no-network-policies`).
    pub network_policies: Option<Vec<String>>,
    /// The talosconfig the controller reaches the nodes with (its text, checked by
    /// `talosconfig`), shipped as the Secret `ichor-talosconfig`; without it the comment at the
    /// top gives the command that creates the Secret.
    pub talosconfig: Option<String>,
    /// Add the monitoring manifests (`runtime::monitoring`: a metrics Service, a ServiceMonitor,
    /// a PrometheusRule, a Grafana dashboard); they need the Prometheus Operator's CRDs.
    pub monitoring: bool,
}

/// Where the webhook's serving certificate comes from.
#[derive(Clone)]
pub enum WebhookTls {
    /// Made by `ichor install`: the Secret and the `caBundle` ship with the manifests.
    Generated(WebhookCerts),
    /// cert-manager's: an Issuer chain and the Certificate, the CA injected by its cainjector.
    CertManager,
}

impl std::fmt::Debug for WebhookTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WebhookTls::Generated(_) => "Generated(..)",
            WebhookTls::CertManager => "CertManager",
        })
    }
}

/// A CA and the webhook's serving certificate it signed, PEM.
#[derive(Clone)]
pub struct WebhookCerts {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// The TLS Secret the webhook reads at start (`ichor webhook --tls-secret`).
pub const TLS_SECRET: &str = "ichor-webhook-tls";
/// The Secret whose key `talosconfig` the controller mounts at /etc/ichor/talosconfig.
pub const TALOSCONFIG_SECRET: &str = "ichor-talosconfig";

/// The names the API server reaches the webhook's Service by: the serving certificate's SANs.
pub fn webhook_dns_names(namespace: &str) -> Vec<String> {
    vec![
        "ichor-webhook".into(),
        format!("ichor-webhook.{namespace}"),
        format!("ichor-webhook.{namespace}.svc"),
        format!("ichor-webhook.{namespace}.svc.cluster.local"),
    ]
}

/// Why the certificates could not be made or the talosconfig cannot be shipped.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("generating {what}")]
    Certificate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error(transparent)]
    Talosconfig(#[from] crate::talos::config::TalosConfigError),
    #[error(transparent)]
    Tls(#[from] crate::webhook::WebhookError),
    #[error("the serving certificate does not verify against the CA for {name}")]
    Verify {
        name: String,
        #[source]
        source: rustls::Error,
    },
}

/// Whether a client that trusts `ca_pem` (the `caBundle`) accepts the serving certificate and
/// key for `name`: a whole TLS handshake in memory, as the API server would make it.
/// `ichor install` checks what it generated before printing it.
pub fn verify(ca_pem: &str, cert_pem: &str, key_pem: &str, name: &str) -> Result<(), InstallError> {
    verify_server(ca_pem, crate::webhook::server_config(cert_pem, key_pem)?, name)
}

/// `verify` against a server config as it is now (one that reloads its certificate, say).
pub fn verify_server(
    ca_pem: &str,
    server: std::sync::Arc<rustls::ServerConfig>,
    name: &str,
) -> Result<(), InstallError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use std::sync::Arc;
    let fail = |source| InstallError::Verify { name: name.into(), source };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()).flatten() {
        roots.add(c).map_err(fail)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(fail)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server_name = rustls_pki_types::ServerName::try_from(name.to_string())
        .map_err(|_| fail(rustls::Error::General(format!("{name:?} is not a DNS name"))))?;
    let mut c = rustls::ClientConnection::new(Arc::new(client), server_name).map_err(fail)?;
    let mut s = rustls::ServerConnection::new(server).map_err(fail)?;
    let io = |e: std::io::Error| fail(rustls::Error::General(e.to_string()));
    for _ in 0..8 {
        let mut buf = vec![];
        while c.wants_write() {
            c.write_tls(&mut buf).map_err(io)?;
        }
        s.read_tls(&mut &buf[..]).map_err(io)?;
        s.process_new_packets().map_err(fail)?;
        let mut buf = vec![];
        while s.wants_write() {
            s.write_tls(&mut buf).map_err(io)?;
        }
        c.read_tls(&mut &buf[..]).map_err(io)?;
        c.process_new_packets().map_err(fail)?;
        if !c.is_handshaking() && !s.is_handshaking() {
            return Ok(());
        }
    }
    Err(fail(rustls::Error::General("the handshake did not end".into())))
}

/// A new ECDSA P-256 CA (ten years) and a serving certificate for the webhook's Service names
/// (one year, `--rotate-certs` renews it), valid from an hour before `now` (seconds since 1970),
/// checked by `verify` before they are returned.
pub fn webhook_certs(namespace: &str, now: i64) -> Result<WebhookCerts, InstallError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    let fail = |what| move |source| InstallError::Certificate { what, source };
    let at = |secs: i64| rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(secs.max(0) as u64);
    let ca_key = KeyPair::generate().map_err(fail("the CA key"))?;
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("ichor-webhook-ca.{namespace}"));
    ca.distinguished_name = dn;
    ca.not_before = at(now - 3600);
    ca.not_after = at(now + 10 * 365 * 86_400);
    let ca_cert = ca.self_signed(&ca_key).map_err(fail("the CA"))?;
    let issuer = Issuer::new(ca, &ca_key);
    let key = KeyPair::generate().map_err(fail("the serving key"))?;
    let names = webhook_dns_names(namespace);
    let mut sp = CertificateParams::new(names.clone()).map_err(fail("the serving certificate"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, names[2].clone());
    sp.distinguished_name = dn;
    sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    sp.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    sp.not_before = at(now - 3600);
    sp.not_after = at(now + 365 * 86_400);
    let cert = sp.signed_by(&key, &issuer).map_err(fail("the serving certificate"))?;
    let certs = WebhookCerts { ca_pem: ca_cert.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() };
    verify(&certs.ca_pem, &certs.cert_pem, &certs.key_pem, &names[2])?;
    Ok(certs)
}

/// Checks that `text` (the file `file`) is a talosconfig the controller can use: it parses, its
/// current context (or `context`) has a CA, an unexpired client certificate and a key, and the
/// certificate carries the `os:admin` role. Errors name the file and the field, never the key.
pub fn talosconfig(text: &str, file: &str, context: Option<&str>, now: i64) -> Result<(), InstallError> {
    use crate::talos::config::{TalosConfig, TalosConfigError};
    let cfg = TalosConfig::parse(text, file)?;
    let (name, ctx) = cfg.context(context, file)?;
    let creds = ctx.credentials(name, file, now)?;
    if !creds.roles.iter().any(|r| r == "os:admin") {
        return Err(TalosConfigError {
            file: file.into(),
            field: format!("contexts.{name}.crt"),
            problem: format!(
                "the client certificate's roles are [{}], not os:admin: the controller applies configs and reboots \
                 nodes; make an admin talosconfig (talosctl config new --roles os:admin) and pass it",
                creds.roles.join(", ")
            ),
        }
        .into());
    }
    Ok(())
}

fn yaml(v: &Json) -> String {
    serde_yaml::to_string(v).unwrap_or_default()
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The restricted Pod Security Standard, for a pod template (`spec`) at six spaces.
const POD_SECURITY: &str = "      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
";

/// The restricted Pod Security Standard, for a container at ten spaces.
const CONTAINER_SECURITY: &str = "          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [\"ALL\"]
";

/// Spreads the replicas over nodes when it can (preferred: a one-node cluster still runs both).
fn anti_affinity(app: &str) -> String {
    format!(
        "      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    app.kubernetes.io/name: {app}
"
    )
}

/// At most one replica evicted at a time: a drain (Ichor's own, during an upgrade) moves one
/// and waits for it to be ready elsewhere; with one replica it never blocks a drain.
fn disruption_budget(app: &str, namespace: &str) -> String {
    format!(
        "apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {app}
  namespace: {namespace}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      app.kubernetes.io/name: {app}
"
    )
}

/// The documents that make the webhook's TLS: the Secret (generated) or cert-manager's chain.
fn tls_documents(o: &Install) -> Vec<String> {
    let ns = &o.namespace;
    match &o.tls {
        WebhookTls::Generated(c) => vec![format!(
            "# The webhook's serving certificate and its CA, generated by `ichor install` (ECDSA P-256;\n\
             # the certificate for one year, the CA for ten). Renew with\n\
             # `ichor install --rotate-certs | kubectl apply -f -`.\n{}",
            yaml(&json!({
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": TLS_SECRET, "namespace": ns},
                "stringData": {"tls.crt": c.cert_pem, "tls.key": c.key_pem, "ca.crt": c.ca_pem},
            }))
        )],
        WebhookTls::CertManager => {
            let issuer = |name: &str, spec: Json| {
                yaml(&json!({"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
                             "metadata": {"name": name, "namespace": ns}, "spec": spec}))
            };
            vec![
                format!(
                    "# cert-manager makes the webhook's TLS: a self-signed root, the CA it issues, and the\n\
                     # serving certificate (renewed 30 days before it expires; the webhook reads it at start,\n\
                     # so `kubectl -n {ns} rollout restart deployment/ichor-webhook` after a renewal).\n{}",
                    issuer("ichor-selfsigned", json!({"selfSigned": {}}))
                ),
                yaml(&json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                    "metadata": {"name": "ichor-webhook-ca", "namespace": ns},
                    "spec": {"isCA": true, "commonName": format!("ichor-webhook-ca.{ns}"),
                             "secretName": "ichor-webhook-ca", "duration": "87600h",
                             "privateKey": {"algorithm": "ECDSA", "size": 256},
                             "issuerRef": {"name": "ichor-selfsigned", "kind": "Issuer"}}})),
                issuer("ichor-ca", json!({"ca": {"secretName": "ichor-webhook-ca"}})),
                yaml(&json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                    "metadata": {"name": TLS_SECRET, "namespace": ns},
                    "spec": {"secretName": TLS_SECRET, "dnsNames": webhook_dns_names(ns),
                             "duration": "2160h", "renewBefore": "720h",
                             "privateKey": {"algorithm": "ECDSA", "size": 256},
                             "usages": ["server auth", "digital signature", "key encipherment"],
                             "issuerRef": {"name": "ichor-ca", "kind": "Issuer"}}})),
            ]
        }
    }
}

/// The ValidatingWebhookConfiguration, its `caBundle` from the generated CA or injected by
/// cert-manager.
fn webhook_configuration(o: &Install) -> String {
    let ns = &o.namespace;
    let mut client = json!({"service": {"name": "ichor-webhook", "namespace": ns, "path": "/validate", "port": 443}});
    let mut meta = json!({"name": "ichor"});
    match &o.tls {
        WebhookTls::Generated(c) => client["caBundle"] = json!(b64(&c.ca_pem)),
        WebhookTls::CertManager => {
            meta["annotations"] = json!({"cert-manager.io/inject-ca-from": format!("{ns}/{TLS_SECRET}")})
        }
    }
    format!(
        "# The validating webhook: what the CRDs' CEL rules cannot say (the consent annotation, the\n\
         # cluster lock, who may write Cilium values). failurePolicy Fail: those are safety and\n\
         # authorization checks, and a write let through while the webhook is down could start a\n\
         # second operation on a locked cluster or change Cilium without the right; with two replicas,\n\
         # a PodDisruptionBudget and the serving certificate shipped above, it is down only when both\n\
         # replicas are. Only TalosClusters and TalosOperations go through it, so the rest of the\n\
         # cluster never waits on it. timeoutSeconds 10: it answers from one list of operations (well\n\
         # under a second), and a write that waits longer fails with the API server's own words.\n{}",
        yaml(&json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": meta,
            "webhooks": [{
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": client,
                "rules": [{
                    "apiGroups": ["ichor.maesh.dev"], "apiVersions": ["v1alpha1"],
                    "resources": WEBHOOK_RESOURCES,
                    "operations": ["CREATE", "UPDATE"],
                }],
            }],
        }))
    )
}

/// The validating webhook's name in its configuration (kube-apiserver's refusals quote it).
pub const WEBHOOK_NAME: &str = "validate.ichor.maesh.dev";
/// The resources whose CREATE and UPDATE go through the webhook.
pub const WEBHOOK_RESOURCES: [&str; 3] = ["talosclusters", "talosoperations", "talosconfigpatches"];

/// The talosconfig Secret, or `None` (the header then says how to create it).
fn talosconfig_secret(o: &Install) -> Option<String> {
    let text = o.talosconfig.as_ref()?;
    Some(format!(
        "# The talosconfig (role os:admin) the controller reaches the nodes with.\n{}",
        yaml(&json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": TALOSCONFIG_SECRET, "namespace": o.namespace},
            "stringData": {"talosconfig": text},
        }))
    ))
}

/// Everything to install Ichor in `o.namespace` (the CRDs come from `ichor crds`), documents
/// separated by `---`, each with why it is there.
pub fn install_yaml(o: &Install) -> String {
    let ns = &o.namespace;
    let image = &o.image;
    let replicas = o.replicas;
    let mut docs = vec![];
    let talosconfig_note = if o.talosconfig.is_some() {
        "# The talosconfig Secret ships below (--talosconfig).".to_string()
    } else {
        format!(
            "# The controller needs a talosconfig with role os:admin, in the Secret {TALOSCONFIG_SECRET}:\n\
             #   kubectl -n {ns} create secret generic {TALOSCONFIG_SECRET} --from-file=talosconfig=PATH\n\
             # (or `ichor install --talosconfig PATH`); until it exists the controller exits naming the\n\
             # missing file, and its pods restart with backoff until it is there."
        )
    };
    // The lockdown: the controller's flags, and the policies it applies, shown as comments.
    let (lockdown_args, lockdown_note) = match &o.network_policies {
        None => (
            ", \"--no-network-policies\"".to_string(),
            "# The namespace is not locked down (--no-network-policies): no CiliumNetworkPolicy is applied."
                .to_string(),
        ),
        Some(from) => {
            let args: String = from.iter().map(|c| format!(", \"--metrics-from\", \"{c}\"")).collect();
            let policies = crate::netpol::policies(&crate::netpol::Lockdown {
                namespace: ns.clone(),
                metrics_from: from.clone(),
                talos_nodes: vec![],
            });
            let shown: String = policies
                .iter()
                .map(|p| format!("---\n{}", yaml(p)))
                .collect::<String>()
                .lines()
                .map(|l| format!("#   {l}\n"))
                .collect();
            (
                args,
                format!(
                    "# Once Cilium is ready, the controller locks this namespace down with these\n\
                     # CiliumNetworkPolicies (field manager {}; the egress policy also lists the\n\
                     # TalosMachines' addresses; `ichor install --no-network-policies` turns it off,\n\
                     # --metrics-from CIDR opens the metrics port to a scraper):\n{shown}",
                    crate::netpol::FIELD_MANAGER
                )
                .trim_end()
                .to_string(),
            )
        }
    };
    docs.push(format!(
        "# Ichor. Apply after `ichor crds | kubectl apply --server-side -f -`.\n{talosconfig_note}\n\
         {lockdown_note}\n\
         # Every pod meets the restricted Pod Security Standard, which the namespace enforces.\n{}",
        yaml(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}}))
    ));
    docs.extend(talosconfig_secret(o));
    docs.push(format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: ichor-controller\n  namespace: {ns}\n"
    ));
    docs.push(cluster_role_yaml("ichor-controller"));
    docs.push(format!(
        "apiVersion: rbac.authorization.k8s.io/v1
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
    namespace: {ns}
"
    ));
    docs.push(format!(
        "# What the health checks (spec.healthChecks) may read: the rules of every ClusterRole labelled\n\
         # {agg}: \"true\" (kube-controller-manager aggregates them).\n\
         # Grant get and list on the kinds your checks read with one, for example:\n\
         #   apiVersion: rbac.authorization.k8s.io/v1\n\
         #   kind: ClusterRole\n\
         #   metadata: {{name: ichor-health-ceph, labels: {{{agg}: \"true\"}}}}\n\
         #   rules: [{{apiGroups: [ceph.rook.io], resources: [cephclusters], verbs: [get, list]}}]\n\
         apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: ichor-health-checks
aggregationRule:
  clusterRoleSelectors:
    - matchLabels:
        {agg}: \"true\"
rules: []
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: ichor-health-checks
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: ichor-health-checks
subjects:
  - kind: ServiceAccount
    name: ichor-controller
    namespace: {ns}
",
        agg = crate::rbac::HEALTH_CHECKS_AGGREGATE
    ));
    docs.push(format!(
        "# {JOB_SERVICE_ACCOUNT_WHY}. It is the one near-cluster-admin identity\n\
         # Ichor ships (the CNI page); nothing else here is bound to cluster-admin.\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: ichor-cni\n  namespace: kube-system\n"
    ));
    docs.push(
        "apiVersion: rbac.authorization.k8s.io/v1
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
"
        .to_string(),
    );
    let optional = if o.talosconfig.is_some() { "" } else { "\n            optional: true" };
    docs.push(format!(
        "# The controller: one replica holds the Lease and acts, the other waits to take over.
# Requests are what an idle controller of a 1,000-machine fleet uses (the scale benchmark,
# cli/benches/scale.rs: about 1 % of a core); the memory limit leaves room for an upgrade's
# renders. No CPU limit: a throttled reconcile only delays the operation it serves.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ichor-controller
  namespace: {ns}
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app.kubernetes.io/name: ichor-controller
  template:
    metadata:
      labels:
        app.kubernetes.io/name: ichor-controller
    spec:
      serviceAccountName: ichor-controller
      # On SIGTERM the controller lets its reconciles end (20 s, runtime::serve's
      # SHUTDOWN_RECONCILE_GRACE) and releases its Lease (at most 5 s) before the kubelet kills it.
      terminationGracePeriodSeconds: 30
{POD_SECURITY}{affinity}      containers:
        - name: controller
          image: {image}
          args: [\"controller\", \"--talosconfig\", \"/etc/ichor/talosconfig\", \"--namespace\", \"{ns}\"{lockdown_args}]
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
            periodSeconds: 20
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
            periodSeconds: 10
          resources:
            requests:
              cpu: 50m
              memory: 128Mi
            limits:
              memory: 1Gi
{CONTAINER_SECURITY}          volumeMounts:
            - name: talosconfig
              mountPath: /etc/ichor
              readOnly: true
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: talosconfig
          secret:
            secretName: {TALOSCONFIG_SECRET}{optional}
        - name: tmp
          emptyDir: {{}}
",
        affinity = anti_affinity("ichor-controller"),
    ));
    docs.push(disruption_budget("ichor-controller", ns));
    docs.push(format!(
        "# The validating webhook (`ichor webhook`). Its TLS certificate is the kubernetes.io/tls
# Secret {ns}/{TLS_SECRET}.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: ichor-webhook
  namespace: {ns}
"
    ));
    docs.push(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: ichor-webhook
rules:
  # Whether the requester may write Cilium values (talosclusters/cilium-values, ichor-admin only).
  - apiGroups: [\"authorization.k8s.io\"]
    resources: [\"subjectaccessreviews\"]
    verbs: [\"create\"]
  # The cluster lock: the other operations of the cluster.
  - apiGroups: [\"ichor.maesh.dev\"]
    resources: [\"talosoperations\"]
    verbs: [\"list\"]
  # A patch write is rendered for the machines of its cluster before it is admitted: the
  # cluster, its machines and patches, and its secrets bundle (read, never written or logged).
  - apiGroups: [\"ichor.maesh.dev\"]
    resources: [\"talosclusters\", \"talosmachines\", \"talosconfigpatches\"]
    verbs: [\"get\", \"list\"]
  - apiGroups: [\"\"]
    resources: [\"secrets\"]
    verbs: [\"get\"]
"
        .to_string(),
    );
    docs.push(format!(
        "apiVersion: rbac.authorization.k8s.io/v1
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
    namespace: {ns}
"
    ));
    docs.push(format!(
        "# Its own certificate only.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: ichor-webhook-tls
  namespace: {ns}
rules:
  - apiGroups: [\"\"]
    resources: [\"secrets\"]
    resourceNames: [\"{TLS_SECRET}\"]
    verbs: [\"get\"]
"
    ));
    docs.push(format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: ichor-webhook-tls
  namespace: {ns}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: ichor-webhook-tls
subjects:
  - kind: ServiceAccount
    name: ichor-webhook
    namespace: {ns}
"
    ));
    docs.push(
        "# Writing Cilium values is a right of its own (CNI page): bind this to ichor-admin only.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: ichor-admin-cilium-values
rules:
  - apiGroups: [\"ichor.maesh.dev\"]
    resources: [\"talosclusters/cilium-values\"]
    verbs: [\"update\"]
"
        .to_string(),
    );
    docs.extend(tls_documents(o));
    docs.push(format!(
        "# The webhook answers each review from one list of operations: small requests.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ichor-webhook
  namespace: {ns}
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app.kubernetes.io/name: ichor-webhook
  template:
    metadata:
      labels:
        app.kubernetes.io/name: ichor-webhook
    spec:
      serviceAccountName: ichor-webhook
{POD_SECURITY}{affinity}      containers:
        - name: webhook
          image: {image}
          args: [\"webhook\", \"--namespace\", \"{ns}\", \"--tls-secret\", \"{TLS_SECRET}\", \"--listen\", \"0.0.0.0:9443\"]
          ports:
            - name: https
              containerPort: 9443
          livenessProbe:
            httpGet:
              path: /healthz
              port: https
              scheme: HTTPS
            periodSeconds: 20
          readinessProbe:
            httpGet:
              path: /healthz
              port: https
              scheme: HTTPS
            periodSeconds: 10
          resources:
            requests:
              cpu: 10m
              memory: 32Mi
            limits:
              memory: 256Mi
{CONTAINER_SECURITY}",
        affinity = anti_affinity("ichor-webhook"),
    ));
    docs.push(disruption_budget("ichor-webhook", ns));
    docs.push(format!(
        "apiVersion: v1
kind: Service
metadata:
  name: ichor-webhook
  namespace: {ns}
spec:
  selector:
    app.kubernetes.io/name: ichor-webhook
  ports:
    - name: https
      port: 443
      targetPort: https
"
    ));
    docs.push(webhook_configuration(o));
    if o.monitoring {
        docs.extend(crate::monitoring::manifests(ns));
    }
    docs.join("---\n")
}

/// `--rotate-certs`: a new CA and serving certificate, as the two objects that carry them (the
/// Secret and the webhook configuration's `caBundle`), to apply over a running installation.
pub fn rotate_yaml(o: &Install) -> String {
    let mut docs = tls_documents(o);
    docs.push(webhook_configuration(o));
    format!(
        "# New webhook certificates: `ichor install --rotate-certs | kubectl apply -f -`. The webhook\n\
         # reads its Secret from the API every 30 s and serves the new certificate from then on, no\n\
         # restart; in those seconds the API server may refuse writes of TalosClusters and\n\
         # TalosOperations (the new caBundle, the old certificate): retry them.\n{}",
        docs.join("---\n")
    )
}

/// What `ichor uninstall` prints for `kubectl delete -f -`: every object of `install` (its
/// text), in the reverse order, by kind and name only; the CRDs (`crds`, `ichor crds`'s text)
/// last, and only when given: deleting them deletes every TalosCluster, TalosMachine,
/// TalosConfigPatch and TalosOperation.
pub fn uninstall_yaml(install: &str, crds: Option<&str>) -> String {
    use serde::Deserialize;
    let ids = |text: &str| -> Vec<Json> {
        serde_yaml::Deserializer::from_str(text)
            .filter_map(|d| Json::deserialize(d).ok())
            .filter(|v| v.is_object())
            .map(|v| {
                let mut meta = json!({"name": v["metadata"]["name"]});
                if let Some(ns) = v["metadata"]["namespace"].as_str() {
                    meta["namespace"] = json!(ns);
                }
                json!({"apiVersion": v["apiVersion"], "kind": v["kind"], "metadata": meta})
            })
            .collect()
    };
    let out = String::from(
        "# What `ichor install` created, the last first:\n\
         #   ichor uninstall | kubectl delete --ignore-not-found -f -\n\
         # The CRDs and every Ichor resource stay unless `--crds` is given.\n",
    );
    let mut objects = ids(install);
    objects.reverse();
    let mut docs: Vec<String> = objects.iter().map(yaml).collect();
    if let Some(crds) = crds {
        let list: Vec<String> = ids(crds).iter().map(yaml).collect();
        if let Some(first) = list.first() {
            docs.push(format!(
                "# The CRDs, last: deleting them deletes every TalosCluster, TalosMachine, TalosConfigPatch\n\
                 # and TalosOperation (the Talos machines themselves keep running their configs).\n{first}"
            ));
            docs.extend(list.into_iter().skip(1));
        }
    }
    out + &docs.join("---\n")
}
