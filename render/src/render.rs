//! Rendering one machine's Talos config from the custom resources, at its contract.
//!
//! Start at `render`. Steps, in order: the base documents the way Talos's generator makes them
//! for the same inputs (`base_legacy` up to v1.13, `base_documents` from v1.14; FACTS 8.8);
//! the CNI preset; the cluster's patches that select the machine, in ascending `order` then
//! name, with Talos's merge semantics (FACTS 8.3-8.4); then Ichor's rules from the seeds:
//! component images from `spec.kubernetesVersion` with the `v` trimmed once (ADR 0057), the
//! kube-proxy mode (ADR 0066 Decision 2) and the CNI hand-over (ADR 0024). Patches are read,
//! never modified: what a rule drops is dropped from a copy. Output is deterministic.

use crate::api::*;
use crate::config::Config;
use crate::path::Path;
use crate::secrets::{Bundle, pem};
use crate::vocab::Contract;
use serde_yaml::{Mapping, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;

/// The inline-manifest entry (v1.13) or KubeInlineManifestConfig name (v1.14) the Cilium
/// preset's bootstrap manifest lives under; dropped once the hand-over is done (ADR 0024).
pub const CNI_INLINE_MANIFEST: &str = "cilium";

/// Everything one machine's render reads.
pub struct Inputs<'a> {
    /// The machine's cluster.
    pub cluster: &'a TalosCluster,
    /// The machine.
    pub machine: &'a TalosMachine,
    /// Every patch of the cluster; the render selects those for the machine.
    pub patches: Vec<&'a TalosConfigPatch>,
    /// The cluster's Talos secrets.
    pub secrets: &'a Bundle,
    /// The secrets Secret's resourceVersion, folded into the desired-inputs hash.
    pub secrets_version: String,
}

/// A render problem, naming the object and field at fault and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderError {
    /// The object at fault, as `Kind namespace/name`.
    pub object: String,
    /// The field at fault.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field, self.message)
    }
}

/// One machine's rendered config, with what it was made from.
pub struct Rendered {
    /// The contract rendered at.
    pub contract: Contract,
    /// The config as YAML, as Talos's generator writes it.
    pub text: String,
    /// The config, parsed (shared: a controller's reconcile hands it to the plan without a copy).
    pub config: std::sync::Arc<Config>,
    /// ADR 0024 amendment: generations of every input plus the two status values the render reads.
    pub inputs_hash: String,
    /// The patches applied, in order (`namespace/name`).
    pub patches: Vec<String>,
    /// Which patch last set each leaf path (for error messages).
    pub set_by: BTreeMap<Path, String>,
    /// What the user should know though the render succeeded: where Ichor deliberately
    /// differs from the contract's Talos, or a merge that cleared a field.
    pub warnings: Vec<RenderError>,
}

/// The encoded size of a config's (or a patch's) documents.
fn size<'v>(docs: impl IntoIterator<Item = &'v Value>) -> usize {
    docs.into_iter().map(|d| serde_yaml::to_string(d).map_or(0, |t| t.len() + 4)).sum()
}

/// Where in a patch a problem or warning is, as the render's messages say it.
fn in_patch(line: usize, document: &str) -> String {
    if document == "?" {
        format!("line {line} of the patch")
    } else {
        format!("line {line} of the patch, document {document}")
    }
}

/// The bootstrap home of the CNI's values (ADR 0024, 0066): the TalosConfigPatch carrying the
/// inline manifest `cilium`, and what that manifest's cilium-config says of kube-proxy
/// replacement. Before the hand-over, a switch asks for its change there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniHome {
    /// `namespace/name` of the TalosConfigPatch.
    pub patch: String,
    /// `kube-proxy-replacement` of the ConfigMap cilium-config in the manifest (`true`,
    /// `false`); None when the manifest carries no such ConfigMap or key.
    pub kube_proxy_replacement: Option<String>,
}

/// Finds the CNI's home among a cluster's patches: the last patch (by `order`, then name) with
/// the inline manifest `cilium`, as a v1alpha1 `cluster.inlineManifests` entry or a
/// `KubeInlineManifestConfig` document. A patch that does not parse is skipped (the render
/// reports it); None when no patch carries the manifest.
pub fn cni_home(patches: &[&TalosConfigPatch]) -> Option<CniHome> {
    let mut sorted = patches.to_vec();
    sorted.sort_by(|a, b| (a.spec.order, &a.metadata.name).cmp(&(b.spec.order, &b.metadata.name)));
    let text = crate::yaml::scalar_text;
    let mut home = None;
    for p in sorted {
        let Ok(docs) = crate::yaml::parse_documents(&p.spec.patch, crate::config::MAX_CONFIG_BYTES) else { continue };
        for d in &docs {
            let manifest = match id_of(d) {
                (Some(kind), Some(name)) if kind == "KubeInlineManifestConfig" && name == CNI_INLINE_MANIFEST => {
                    d.get("manifest").and_then(text)
                }
                (None, _) => d
                    .get("cluster")
                    .and_then(|c| c.get("inlineManifests"))
                    .and_then(Value::as_sequence)
                    .and_then(|l| l.iter().find(|e| e.get("name").and_then(Value::as_str) == Some(CNI_INLINE_MANIFEST)))
                    .and_then(|e| e.get("contents").and_then(text)),
                _ => None,
            };
            let Some(manifest) = manifest else { continue };
            let objects = crate::yaml::parse_documents(&manifest, crate::config::MAX_CONFIG_BYTES).unwrap_or_default();
            let kube_proxy_replacement = objects
                .iter()
                .find(|o| {
                    o.get("kind").and_then(Value::as_str) == Some("ConfigMap")
                        && o.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str)
                            == Some("cilium-config")
                })
                .and_then(|o| o.get("data")?.get("kube-proxy-replacement").and_then(text));
            home = Some(CniHome {
                patch: format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default()
                ),
                kube_proxy_replacement,
            });
        }
    }
    home
}

/// An object's name as messages show it: `Kind namespace/name`.
pub fn object_name(kind: &str, meta: &kube_core::ObjectMeta) -> String {
    format!("{kind} {}/{}", meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

/// Whether the CNIHandover condition is True on the cluster.
pub fn handover_done(c: &TalosCluster) -> bool {
    c.status.as_ref().is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "CNIHandover" && k.status == "True"))
}

/// `status.cni.kubeProxy`, once a switch has set it.
pub fn status_kube_proxy(c: &TalosCluster) -> Option<KubeProxyMode> {
    c.status.as_ref().and_then(|s| s.cni.as_ref()).and_then(|n| n.kube_proxy)
}

/// The kube-proxy mode in force as the custom resources say it (ADR 0066): the status once a
/// switch has set it, else the spec. The one function for the pure render, the webhook and
/// `ichor cni values render`; the rules' `current_kube_proxy_mode` (rules/switch.rules) puts
/// Cilium's live cilium-config above it and otherwise agrees with it (a test pins the two).
pub fn kube_proxy_in_force(c: &TalosCluster) -> KubeProxyMode {
    status_kube_proxy(c).unwrap_or(c.spec.cni.kube_proxy)
}

/// The Kubernetes version without its one leading `v` (`v1.36.4` -> `1.36.4`). Images are
/// `<repo>:v<this>`: trimming once is what keeps them from `:vv1.36.4` (ADR 0057).
pub fn k8s_version(spec_version: &str) -> &str {
    spec_version.strip_prefix('v').unwrap_or(spec_version)
}

fn image(repo: &str, version: &str) -> Value {
    Value::String(format!("{repo}:v{}", k8s_version(version)))
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    let mut m = Mapping::new();
    for (k, v) in entries {
        m.insert(Value::String(k.into()), v);
    }
    Value::Mapping(m)
}

fn s(x: &str) -> Value {
    Value::String(x.into())
}

fn strs(xs: &[String]) -> Value {
    Value::Sequence(xs.iter().map(|x| s(x)).collect())
}

fn doc(kind: &str, name: Option<&str>, fields: Vec<(&str, Value)>) -> Value {
    let mut all = vec![("apiVersion", s("v1alpha1")), ("kind", s(kind))];
    if let Some(n) = name {
        all.push(("name", s(n)));
    }
    all.extend(fields);
    map(all)
}

fn pod_security() -> Value {
    map(vec![
        ("apiVersion", s("pod-security.admission.config.k8s.io/v1alpha1")),
        (
            "defaults",
            map(vec![
                ("audit", s("restricted")),
                ("audit-version", s("latest")),
                ("enforce", s("baseline")),
                ("enforce-version", s("latest")),
                ("warn", s("restricted")),
                ("warn-version", s("latest")),
            ]),
        ),
        (
            "exemptions",
            map(vec![
                ("namespaces", Value::Sequence(vec![s("kube-system")])),
                ("runtimeClasses", Value::Sequence(vec![])),
                ("usernames", Value::Sequence(vec![])),
            ]),
        ),
        ("kind", s("PodSecurityConfiguration")),
    ])
}

fn audit_policy() -> Value {
    map(vec![
        ("apiVersion", s("audit.k8s.io/v1")),
        ("kind", s("Policy")),
        ("rules", Value::Sequence(vec![map(vec![("level", s("Metadata"))])])),
    ])
}

/// The installer image: the cluster's own at `talosVersion`'s tag, else the default of the
/// talosctl that matches the Talos version the machines run (FACTS 8.8), not the contract: a
/// machine running Talos 1.14 at contract v1.13 gets 1.14's factory installer.
fn installer_image(c: &TalosClusterSpec) -> String {
    installer_image_at(c, &c.talos_version)
}

/// The installer image of Talos `version` for this cluster: `installImage`'s repository at
/// `version`'s tag (a tag or digest it carries is replaced: the image follows the version),
/// else Talos's factory installer for `version` (from Talos 1.14 the release publishes no plain
/// `installer` image, only `installer-base`: the factory's metal installer of the default
/// schematic is what `talosctl gen config` puts in a new config), else, before 1.14,
/// `ghcr.io/siderolabs/installer`. What the Talos upgrade installs.
pub fn installer_image_at(c: &TalosClusterSpec, version: &str) -> String {
    if let Some(i) = &c.install_image {
        let repo = i.split('@').next().unwrap_or(i);
        let slash = repo.rfind('/').map_or(0, |p| p + 1);
        let repo = match repo[slash..].find(':') {
            Some(colon) => &repo[..slash + colon],
            None => repo,
        };
        return format!("{repo}:{version}");
    }
    let talos = version.strip_prefix('v').unwrap_or(version);
    let minor = talos.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()).unwrap_or(0);
    let major = talos.split('.').next().and_then(|m| m.parse::<u32>().ok()).unwrap_or(0);
    if (major, minor) >= (1, 14) {
        format!(
            "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:{version}"
        )
    } else {
        format!("ghcr.io/siderolabs/installer:{version}")
    }
}

/// `cluster.etcd` of a control plane (both forms keep etcd's CA in the v1alpha1 document).
fn etcd_ca(b: &Bundle) -> Value {
    map(vec![("ca", map(vec![("crt", s(&b.certs.etcd.crt)), ("key", s(&b.certs.etcd.key))]))])
}

/// What both base forms read from the inputs.
struct Common<'a> {
    c: &'a TalosClusterSpec,
    b: &'a Bundle,
    cp: bool,
    v: &'a String,
    net: ClusterNetwork,
    name: String,
}

impl<'a> Common<'a> {
    fn of(i: &'a Inputs) -> Common<'a> {
        let c = &i.cluster.spec;
        Common {
            c,
            b: i.secrets,
            cp: i.machine.spec.role == Role::Controlplane,
            v: &c.kubernetes_version,
            net: c.network.clone().unwrap_or_default(),
            name: i.cluster.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// Base documents, legacy v1alpha1 form (contract up to v1.13).
fn base_legacy(i: &Inputs) -> Vec<Value> {
    let Common { c, b, cp, v, net, name } = Common::of(i);
    let mut machine = vec![
        ("type", s(i.machine.spec.role.name())),
        ("token", s(&b.trustdinfo.token)),
        ("ca", map(vec![("crt", s(&b.certs.os.crt)), ("key", s(if cp { &b.certs.os.key } else { "" }))])),
        ("certSANs", Value::Sequence(vec![])),
        (
            "kubelet",
            map(vec![
                ("image", image("ghcr.io/siderolabs/kubelet", v)),
                ("defaultRuntimeSeccompProfileEnabled", Value::Bool(true)),
                ("disableManifestsDirectory", Value::Bool(true)),
            ]),
        ),
    ];
    let mut install = vec![];
    if let Some(disk) = &i.machine.spec.install_disk {
        install.push(("disk", s(disk)));
        install.push(("image", s(&installer_image(c))));
    }
    install.push(("wipe", Value::Bool(false)));
    install.push(("grubUseUKICmdline", Value::Bool(true)));
    machine.push(("install", map(install)));
    machine.push((
        "features",
        map(vec![
            ("diskQuotaSupport", Value::Bool(true)),
            ("kubePrism", map(vec![("enabled", Value::Bool(true)), ("port", Value::Number(7445.into()))])),
            ("hostDNS", map(vec![("enabled", Value::Bool(true)), ("forwardKubeDNSToHost", Value::Bool(true))])),
        ]),
    ));
    if cp {
        machine.push(("nodeLabels", map(vec![("node.kubernetes.io/exclude-from-external-load-balancers", s(""))])));
    }
    let mut cluster = vec![
        ("id", s(&b.cluster.id)),
        ("secret", s(&b.cluster.secret)),
        ("controlPlane", map(vec![("endpoint", s(&c.endpoint))])),
        ("clusterName", s(&name)),
        (
            "network",
            map(vec![
                ("dnsDomain", s(&net.dns_domain)),
                ("podSubnets", strs(&net.pod_subnets)),
                ("serviceSubnets", strs(&net.service_subnets)),
            ]),
        ),
        ("token", s(&b.secrets.bootstraptoken)),
    ];
    if cp {
        cluster.push(("secretboxEncryptionSecret", s(&b.secrets.secretboxencryptionsecret)));
    }
    cluster.push(("ca", map(vec![("crt", s(&b.certs.k8s.crt)), ("key", s(if cp { &b.certs.k8s.key } else { "" }))])));
    if cp {
        cluster.push((
            "aggregatorCA",
            map(vec![("crt", s(&b.certs.k8saggregator.crt)), ("key", s(&b.certs.k8saggregator.key))]),
        ));
        cluster.push(("serviceAccount", map(vec![("key", s(&b.certs.k8sserviceaccount.key))])));
        cluster.push((
            "apiServer",
            map(vec![
                ("image", image("registry.k8s.io/kube-apiserver", v)),
                (
                    "admissionControl",
                    Value::Sequence(vec![map(vec![("name", s("PodSecurity")), ("configuration", pod_security())])]),
                ),
                ("auditPolicy", audit_policy()),
            ]),
        ));
        cluster.push(("controllerManager", map(vec![("image", image("registry.k8s.io/kube-controller-manager", v))])));
        cluster.push(("proxy", map(vec![("image", image("registry.k8s.io/kube-proxy", v))])));
        cluster.push(("scheduler", map(vec![("image", image("registry.k8s.io/kube-scheduler", v))])));
    }
    cluster.push((
        "discovery",
        map(vec![
            ("enabled", Value::Bool(true)),
            (
                "registries",
                map(vec![("kubernetes", map(vec![("disabled", Value::Bool(true))])), ("service", map(vec![]))]),
            ),
        ]),
    ));
    if cp {
        cluster.push(("etcd", etcd_ca(b)));
    }
    let v1 = map(vec![
        ("version", s("v1alpha1")),
        ("debug", Value::Bool(false)),
        ("persist", Value::Bool(true)),
        ("machine", map(machine)),
        ("cluster", map(cluster)),
    ]);
    vec![v1, doc("HostnameConfig", None, vec![("auto", s("stable"))])]
}

/// Base documents, multi-document form (contract v1.14 on).
fn base_documents(i: &Inputs) -> Vec<Value> {
    let Common { c, b, cp, v, net, name } = Common::of(i);
    let mut v1_cluster = vec![("token", s(&b.secrets.bootstraptoken))];
    if cp {
        v1_cluster.push(("etcd", etcd_ca(b)));
    }
    let v1 = map(vec![
        ("version", s("v1alpha1")),
        ("debug", Value::Bool(false)),
        ("persist", Value::Bool(true)),
        (
            "machine",
            map(vec![
                ("type", s(i.machine.spec.role.name())),
                ("token", s(&b.trustdinfo.token)),
                ("ca", map(vec![("crt", s(&b.certs.os.crt)), ("key", s(if cp { &b.certs.os.key } else { "" }))])),
                ("certSANs", Value::Sequence(vec![])),
                ("features", map(vec![("diskQuotaSupport", Value::Bool(true))])),
            ]),
        ),
        ("cluster", map(v1_cluster)),
    ]);
    let mut docs = vec![
        v1,
        doc("DiscoveryServiceConfig", Some("default"), vec![("endpoint", s("https://discovery.talos.dev/"))]),
        doc(
            "DiscoveryIdentityConfig",
            None,
            vec![("clusterID", s(&b.cluster.id)), ("clusterSecret", s(&b.cluster.secret))],
        ),
    ];
    if let Some(disk) = &i.machine.spec.install_disk {
        docs.push(doc(
            "UnattendedInstallConfig",
            None,
            vec![
                ("installer", map(vec![("image", s(&installer_image(c)))])),
                (
                    "provisioning",
                    map(vec![
                        ("diskSelector", map(vec![("match", s(&format!("disk.dev_path == \"{disk}\"")))])),
                        ("wipe", Value::Bool(false)),
                    ]),
                ),
            ],
        ));
    }
    docs.extend([
        doc(
            "ResolverConfig",
            None,
            vec![("hostDNS", map(vec![("enabled", Value::Bool(true)), ("forwardKubeDNSToHost", Value::Bool(true))]))],
        ),
        doc("VolumeConfig", Some("EPHEMERAL"), vec![("mount", map(vec![("secure", Value::Bool(true))]))]),
        doc("FilesystemTrimConfig", None, vec![("interval", s("168h0m0s"))]),
        doc("SecurityProfileConfig", None, vec![("workloadIsolation", Value::Bool(true))]),
        doc("HostnameConfig", None, vec![("auto", s("stable"))]),
        doc("KubeClusterConfig", None, vec![("clusterName", s(&name)), ("endpoint", s(&c.endpoint))]),
    ]);
    let mut node = vec![("nodeIP", map(vec![]))];
    if cp {
        node.push((
            "labels",
            map(vec![
                ("node-role.kubernetes.io/control-plane", s("")),
                ("node.kubernetes.io/exclude-from-external-load-balancers", s("")),
            ]),
        ));
        node.push(("taints", map(vec![("node-role.kubernetes.io/control-plane", s("NoSchedule"))])));
    }
    docs.push(doc("KubeNodeConfig", None, node));
    docs.push(doc(
        "KubeletConfig",
        None,
        vec![
            ("image", image("ghcr.io/siderolabs/kubelet", v)),
            ("config", map(vec![])),
            ("defaultRuntimeSeccompProfileEnabled", Value::Bool(true)),
        ],
    ));
    docs.push(doc(
        "KubeNetworkConfig",
        None,
        vec![
            ("dnsDomain", s(&net.dns_domain)),
            ("podSubnets", strs(&net.pod_subnets)),
            ("serviceSubnets", strs(&net.service_subnets)),
        ],
    ));
    if cp {
        docs.push(doc(
            "KubeAPIServerCAConfig",
            None,
            vec![("issuingCA", map(vec![("cert", s(&pem(&b.certs.k8s.crt))), ("key", s(&pem(&b.certs.k8s.key)))]))],
        ));
    } else {
        docs.push(doc(
            "KubeAPIServerCAConfig",
            None,
            vec![("acceptedCAs", Value::Sequence(vec![s(&pem(&b.certs.k8s.crt))]))],
        ));
    }
    docs.push(doc("KubePrismConfig", None, vec![("port", Value::Number(7445.into()))]));
    if !cp {
        return docs;
    }
    docs.extend([
        doc(
            "KubeAggregatorCAConfig",
            None,
            vec![(
                "issuingCA",
                map(vec![("cert", s(&pem(&b.certs.k8saggregator.crt))), ("key", s(&pem(&b.certs.k8saggregator.key)))]),
            )],
        ),
        doc("KubeAdmissionControlConfig", Some("PodSecurity"), vec![("configuration", pod_security())]),
        doc("KubeAuditPolicyConfig", None, vec![("configuration", audit_policy())]),
        doc(
            "KubeAuthenticationConfig",
            None,
            vec![(
                "configuration",
                map(vec![
                    (
                        "anonymous",
                        map(vec![
                            (
                                "conditions",
                                Value::Sequence(vec![
                                    map(vec![("path", s("/livez"))]),
                                    map(vec![("path", s("/readyz"))]),
                                    map(vec![("path", s("/healthz"))]),
                                ]),
                            ),
                            ("enabled", Value::Bool(true)),
                        ]),
                    ),
                    ("jwt", Value::Sequence(vec![])),
                ]),
            )],
        ),
        doc("KubeAuthorizerConfig", Some("node"), vec![("type", s("Node"))]),
        doc("KubeAuthorizerConfig", Some("rbac"), vec![("type", s("RBAC"))]),
        doc(
            "KubeEtcdEncryptionConfig",
            None,
            vec![(
                "config",
                map(vec![(
                    "resources",
                    Value::Sequence(vec![map(vec![
                        (
                            "providers",
                            Value::Sequence(vec![map(vec![(
                                "secretbox",
                                map(vec![(
                                    "keys",
                                    Value::Sequence(vec![map(vec![
                                        ("name", s("key2")),
                                        ("secret", s(&b.secrets.secretboxencryptionsecret)),
                                    ])]),
                                )]),
                            )])]),
                        ),
                        ("resources", Value::Sequence(vec![s("secrets")])),
                    ])]),
                )]),
            )],
        ),
        doc(
            "KubeServiceAccountConfig",
            None,
            vec![(
                "issuer",
                map(vec![("privateKey", s(&pem(&b.certs.k8sserviceaccount.key))), ("issuerURL", s(&c.endpoint))]),
            )],
        ),
        doc("KubeAPIServerConfig", None, vec![("image", image("registry.k8s.io/kube-apiserver", v))]),
        doc("KubeControllerManagerConfig", None, vec![("image", image("registry.k8s.io/kube-controller-manager", v))]),
        doc(
            "KubeSchedulerConfig",
            None,
            vec![("image", image("registry.k8s.io/kube-scheduler", v)), ("config", map(vec![]))],
        ),
        doc("KubeProxyConfig", None, vec![("image", image("registry.k8s.io/kube-proxy", v)), ("config", map(vec![]))]),
        doc(
            "KubeFlannelCNIConfig",
            None,
            vec![("backendType", s("vxlan")), ("backendPort", Value::Number(4789.into()))],
        ),
        doc("KubeCoreDNSConfig", None, vec![("enabled", Value::Bool(true))]),
    ]);
    docs
}

use crate::patch::{Patch, PatchDoc, id_of};

fn selects(p: &TalosConfigPatch, m: &TalosMachine) -> bool {
    let sel = &p.spec.selector;
    let name = m.metadata.name.clone().unwrap_or_default();
    (sel.roles.is_empty() || sel.roles.contains(&m.spec.role))
        && (sel.machines.is_empty() || sel.machines.contains(&name))
}

/// A copy of a patch's documents with what Ichor owns taken out: the CNI's inline manifest
/// once handed over (ADR 0024), and the kube-proxy setting once Ichor owns it (ADR 0066).
fn filtered(docs: &[PatchDoc], contract: Contract, handed_over: bool, owns_proxy: bool) -> Vec<PatchDoc> {
    let v114 = contract >= Contract { major: 1, minor: 14 };
    let mut out = vec![];
    for pd in docs {
        let mut d = pd.value.clone();
        let (kind, name) = id_of(&d);
        if handed_over
            && kind.as_deref() == Some("KubeInlineManifestConfig")
            && name.as_deref() == Some(CNI_INLINE_MANIFEST)
        {
            continue;
        }
        if kind.is_none() {
            if handed_over
                && let Some(Value::Sequence(list)) = d.get_mut("cluster").and_then(|c| c.get_mut("inlineManifests"))
            {
                list.retain(|e| e.get("name").and_then(Value::as_str) != Some(CNI_INLINE_MANIFEST));
            }
            if owns_proxy && let Some(Value::Mapping(cluster)) = d.get_mut("cluster") {
                if v114 {
                    cluster.remove("proxy");
                } else if let Some(Value::Mapping(proxy)) = cluster.get_mut("proxy") {
                    proxy.remove("disabled");
                }
            }
        }
        if owns_proxy
            && kind.as_deref() == Some("KubeProxyConfig")
            && let Value::Mapping(m) = &mut d
        {
            m.remove("enabled");
        }
        out.push(PatchDoc { line: pd.line, value: d });
    }
    out
}

/// kube-proxy in the render (ADR 0066 Decision 2): status wins over spec; replaced renders
/// disabled; enabled renders an explicit flag only once a switch set the status (a control
/// plane's KubeProxyConfig from v1.14, `cluster.proxy.disabled` before).
fn kube_proxy_flag(docs: &mut Vec<Value>, i: &Inputs, v114: bool, cp: bool, status_mode: Option<KubeProxyMode>) {
    let mode = kube_proxy_in_force(i.cluster);
    let flag = match (mode, status_mode) {
        (KubeProxyMode::Replaced, _) => Some(false),
        (KubeProxyMode::Enabled, Some(_)) => Some(true),
        (KubeProxyMode::Enabled, None) => None,
    };
    if let Some(enabled) = flag {
        if v114 {
            if cp {
                match docs.iter_mut().find(|d| d.get("kind").and_then(Value::as_str) == Some("KubeProxyConfig")) {
                    Some(Value::Mapping(m)) => {
                        m.insert(s("enabled"), Value::Bool(enabled));
                    }
                    _ => docs.push(doc(
                        "KubeProxyConfig",
                        None,
                        vec![
                            ("image", image("registry.k8s.io/kube-proxy", &i.cluster.spec.kubernetes_version)),
                            ("enabled", Value::Bool(enabled)),
                        ],
                    )),
                }
            }
        } else if let Some(Value::Mapping(cluster)) = docs[0].get_mut("cluster") {
            let proxy = cluster.entry(s("proxy")).or_insert_with(|| map(vec![]));
            if let Value::Mapping(p) = proxy {
                p.insert(s("disabled"), Value::Bool(!enabled));
            }
        }
    }
}

/// Renders one machine's config at the cluster's contract.
pub fn render(i: &Inputs, contract: Contract) -> Result<Rendered, Vec<RenderError>> {
    let mut errors = vec![];
    let v114 = contract >= Contract { major: 1, minor: 14 };
    let cp = i.machine.spec.role == Role::Controlplane;
    let mut docs = if v114 { base_documents(i) } else { base_legacy(i) };
    // The CNI preset: anything but Flannel means no Flannel from Talos.
    match i.cluster.spec.cni.preset {
        CniPreset::Flannel => {}
        CniPreset::Cilium | CniPreset::Custom => {
            if v114 {
                docs.retain(|d| d.get("kind").and_then(Value::as_str) != Some("KubeFlannelCNIConfig"));
            } else if let Some(Value::Mapping(net)) = docs[0].get_mut("cluster").and_then(|c| c.get_mut("network")) {
                net.insert(s("cni"), map(vec![("name", s("none"))]));
            }
        }
    }
    // Patches, in order.
    let handed_over = handover_done(i.cluster);
    let status_mode = status_kube_proxy(i.cluster);
    let spec_mode = i.cluster.spec.cni.kube_proxy;
    let owns_proxy = spec_mode == KubeProxyMode::Replaced || status_mode.is_some();
    let mut patches: Vec<&TalosConfigPatch> = i.patches.iter().copied().filter(|p| selects(p, i.machine)).collect();
    patches.sort_by(|a, b| (a.spec.order, &a.metadata.name).cmp(&(b.spec.order, &b.metadata.name)));
    let mut applied = vec![];
    let mut set_by: BTreeMap<String, String> = BTreeMap::new();
    let mut warnings = vec![];
    // Talos's size limit, without encoding the config after every patch: the base is encoded
    // once, and a patch grows the config by at most its own encoding (a patch document mirrors
    // the config's nesting; deletes and replacements only shrink it), counted twice to be safe.
    // Only near the limit is the config encoded exactly, before and after the patch.
    let mut bound = size(&docs);
    for p in &patches {
        let obj = object_name("TalosConfigPatch", &p.metadata);
        let located = |e: crate::patch::PatchError| RenderError {
            object: obj.clone(),
            field: if e.field.is_empty() { "spec.patch".into() } else { format!("spec.patch: {}", e.field) },
            message: format!("{}: {}", in_patch(e.line, &e.document), e.message),
        };
        let pdocs = match Patch::load(&p.spec.patch, contract) {
            Ok(Patch::Strategic(d)) => d,
            Ok(Patch::Json6902 { line }) => {
                // Talos applies JSON 6902 only to a single-document config; every config of
                // contract v1.12 and later has at least two (FACTS 8.5).
                errors.push(RenderError {
                    object: obj,
                    field: "spec.patch".into(),
                    message: format!(
                        "line {line} of the patch: JSON6902 patches are not supported for multi-document machine configuration (the {contract} config has {} documents); write the change as a strategic-merge document",
                        docs.len()
                    ),
                });
                continue;
            }
            Err(es) => {
                errors.extend(es.into_iter().map(located));
                continue;
            }
        };
        let pdocs = filtered(&pdocs, contract, handed_over, owns_proxy);
        bound += 2 * size(pdocs.iter().map(|d| &d.value));
        let near_limit = bound > crate::config::MAX_CONFIG_BYTES;
        let before = if near_limit { size(&docs) } else { 0 };
        match crate::patch::apply(&mut docs, &pdocs, contract) {
            Ok(done) => {
                for path in done.set {
                    set_by.insert(path, obj.clone());
                }
                warnings.extend(done.warnings.into_iter().map(|w| RenderError {
                    object: obj.clone(),
                    field: "spec.patch".into(),
                    message: format!("{}: {}", in_patch(w.line, &w.document), w.message),
                }));
            }
            Err(e) => {
                errors.push(located(e));
                continue;
            }
        }
        let after = if near_limit { size(&docs) } else { 0 };
        if near_limit {
            bound = after;
        }
        if after > crate::config::MAX_CONFIG_BYTES {
            errors.push(RenderError {
                object: obj.clone(),
                field: "spec.patch".into(),
                message: format!(
                    "the config grows from {before} to {after} bytes with this patch, over the {}-byte limit Talos accepts; make the patch smaller",
                    crate::config::MAX_CONFIG_BYTES
                ),
            });
            continue;
        }
        applied.push(obj.trim_start_matches("TalosConfigPatch ").to_string());
    }
    kube_proxy_flag(&mut docs, i, v114, cp, status_mode);
    if !errors.is_empty() {
        return Err(errors);
    }
    let text = docs.iter().map(|d| serde_yaml::to_string(d).unwrap_or_default()).collect::<Vec<_>>().join("---\n");
    let config = match Config::parse(&text) {
        Ok(c) => c,
        Err(e) => {
            return Err(e
                .into_iter()
                .map(|e| RenderError {
                    object: object_name("TalosMachine", &i.machine.metadata),
                    field: "render".into(),
                    message: format!("the patches produce a config Talos cannot load: {}", e.message),
                })
                .collect());
        }
    };
    let set_by = set_by.into_iter().filter_map(|(k, v)| Path::parse(&k).ok().map(|p| (p, v))).collect();
    Ok(Rendered {
        contract,
        text,
        config: std::sync::Arc::new(config),
        inputs_hash: inputs_hash(i, &patches),
        patches: applied,
        set_by,
        warnings,
    })
}

/// The desired-inputs hash (ADR 0024 amendment): generations of the cluster, the machine and
/// the selected patches, the secrets' version, plus whether CNIHandover is True and
/// `status.cni.kubeProxy`, folded in only when present so that clusters with neither keep
/// their hash.
pub fn inputs_hash(i: &Inputs, patches: &[&TalosConfigPatch]) -> String {
    let g = |m: &kube_core::ObjectMeta| format!("{}/{}", m.name.clone().unwrap_or_default(), m.generation.unwrap_or(0));
    let mut text =
        format!("cluster:{};machine:{};secrets:{}", g(&i.cluster.metadata), g(&i.machine.metadata), i.secrets_version);
    let mut names: Vec<String> = patches.iter().map(|p| g(&p.metadata)).collect();
    names.sort();
    text.push_str(&format!(";patches:{}", names.join(",")));
    if handover_done(i.cluster) {
        text.push_str(";cniHandover:True");
    }
    if let Some(m) = status_kube_proxy(i.cluster) {
        text.push_str(&format!(";kubeProxy:{}", m.name()));
    }
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(name: &str, order: i32, text: &str) -> TalosConfigPatch {
        let mut p = TalosConfigPatch::new(name, Default::default());
        p.metadata.namespace = Some("ichor-system".into());
        p.spec.order = order;
        p.spec.patch = text.into();
        p
    }

    #[test]
    fn the_cni_home_is_the_patch_with_the_cilium_inline_manifest_and_its_cilium_config() {
        let legacy = patch(
            "cilium-bootstrap",
            10,
            "cluster:\n  inlineManifests:\n    - name: cilium\n      contents: |\n        apiVersion: v1\n        kind: ConfigMap\n        metadata:\n          name: cilium-config\n          namespace: kube-system\n        data:\n          kube-proxy-replacement: \"false\"\n",
        );
        let time = patch("time", 20, "machine:\n  time:\n    servers: [time.cloudflare.com]\n");
        assert_eq!(
            cni_home(&[&time, &legacy]),
            Some(CniHome {
                patch: "ichor-system/cilium-bootstrap".into(),
                kube_proxy_replacement: Some("false".into())
            })
        );
        // The v1.14 document; a manifest without cilium-config is a home that says nothing.
        let doc = patch(
            "cni",
            30,
            "apiVersion: v1alpha1\nkind: KubeInlineManifestConfig\nname: cilium\nmanifest: |\n  apiVersion: v1\n  kind: ServiceAccount\n  metadata:\n    name: cilium\n",
        );
        assert_eq!(
            cni_home(&[&legacy, &doc]),
            Some(CniHome { patch: "ichor-system/cni".into(), kube_proxy_replacement: None })
        );
        assert_eq!(cni_home(&[&time]), None);
    }
}
