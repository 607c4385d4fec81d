//! `ichor install`'s manifests as the tools that apply them read them: every document
//! deserializes into its k8s-openapi type without dropping a field, every pod meets the
//! restricted Pod Security Standard, the webhook's certificate verifies against its caBundle for
//! the Service's name, a talosconfig without an admin certificate is refused by field, and the
//! uninstall list ends with the CRDs only when asked.
//!
//! Start at `every_document_is_its_kubernetes_type_without_a_dropped_field`.

use runtime::install::{Install, WebhookTls, install_yaml, rotate_yaml, uninstall_yaml, verify, webhook_certs};
use serde::Deserialize;
use serde_json::{Value as Json, json};

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn install(tls: WebhookTls, talosconfig: Option<String>) -> Install {
    Install {
        namespace: "ichor-system".into(),
        image: "example/ichor:v0".into(),
        replicas: 2,
        tls,
        talosconfig,
        network_policies: Some(vec![]),
        monitoring: false,
    }
}

fn generated() -> WebhookTls {
    WebhookTls::Generated(webhook_certs("ichor-system", now()).unwrap())
}

fn docs(text: &str) -> Vec<Json> {
    serde_yaml::Deserializer::from_str(text).map(|d| Json::deserialize(d).unwrap()).filter(|v| !v.is_null()).collect()
}

/// `typed` round-trips `doc` through `T`: what comes back equals what went in.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Json) -> Json {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{}: {e}", doc["kind"]));
    serde_json::to_value(typed).unwrap()
}

#[test]
fn every_document_is_its_kubernetes_type_without_a_dropped_field() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::{
        apps::v1::Deployment,
        core::v1::{Namespace, Secret, Service, ServiceAccount},
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    };
    let text = install_yaml(&install(generated(), Some("context: x\n".into())));
    let all = docs(&text);
    assert_eq!(all.len(), text.matches("\n---\n").count() + 1, "one document per ---");
    for doc in &all {
        let back = match doc["kind"].as_str().unwrap() {
            "Namespace" => round_trip::<Namespace>(doc),
            "Secret" => round_trip::<Secret>(doc),
            "ServiceAccount" => round_trip::<ServiceAccount>(doc),
            "Service" => round_trip::<Service>(doc),
            "ClusterRole" => round_trip::<ClusterRole>(doc),
            "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(doc),
            "Role" => round_trip::<Role>(doc),
            "RoleBinding" => round_trip::<RoleBinding>(doc),
            "Deployment" => round_trip::<Deployment>(doc),
            "PodDisruptionBudget" => round_trip::<PodDisruptionBudget>(doc),
            "ValidatingWebhookConfiguration" => round_trip::<ValidatingWebhookConfiguration>(doc),
            other => panic!("a kind the test does not know: {other}"),
        };
        assert_eq!(&back, doc, "{} {} lost or changed a field", doc["kind"], doc["metadata"]["name"]);
    }
    let kinds: Vec<&str> = all.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "Secret",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            // ichor-health-checks, aggregated, and its binding.
            "ClusterRole",
            "ClusterRoleBinding",
            "ServiceAccount",
            "ClusterRoleBinding",
            "Deployment",
            "PodDisruptionBudget",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "Secret",
            "Deployment",
            "PodDisruptionBudget",
            "Service",
            "ValidatingWebhookConfiguration",
        ]
    );
    // The controller's role is the rules' and nothing but the Cilium Job's account is bound to
    // cluster-admin.
    let role = all.iter().find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "ichor-controller").unwrap();
    assert_eq!(role["rules"].as_array().unwrap().len(), runtime::rbac::CONTROLLER_RULES.len());
    let admins: Vec<&Json> = all.iter().filter(|d| d["roleRef"]["name"] == "cluster-admin").collect();
    assert_eq!(admins.len(), 1);
    assert_eq!(
        admins[0]["subjects"],
        json!([{"kind": "ServiceAccount", "name": "ichor-cni", "namespace": "kube-system"}])
    );
    let hook = &all.last().unwrap()["webhooks"][0];
    assert_eq!(hook["clientConfig"]["service"]["path"], "/validate");
    assert_eq!(hook["rules"][0]["resources"], json!(["talosclusters", "talosoperations", "talosconfigpatches"]));
    assert_eq!(hook["failurePolicy"], "Fail");
}

/// The checks of the restricted Pod Security Standard (Kubernetes' pod-security admission,
/// level `restricted`) on one pod spec: every problem, named.
fn restricted_problems(name: &str, pod: &Json) -> Vec<String> {
    let mut out = vec![];
    let psc = &pod["securityContext"];
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[host] == true {
            out.push(format!("{name}: {host}"));
        }
    }
    for v in pod["volumes"].as_array().into_iter().flatten() {
        let allowed = [
            "configMap",
            "csi",
            "downwardAPI",
            "emptyDir",
            "ephemeral",
            "persistentVolumeClaim",
            "projected",
            "secret",
        ];
        if !v.as_object().unwrap().keys().all(|k| k == "name" || allowed.contains(&k.as_str())) {
            out.push(format!("{name}: volume {} of a restricted type", v["name"]));
        }
    }
    let seccomp_pod = psc["seccompProfile"]["type"].as_str();
    for c in pod["containers"].as_array().unwrap() {
        let csc = &c["securityContext"];
        let cname = format!("{name}/{}", c["name"].as_str().unwrap());
        if csc["privileged"] == true {
            out.push(format!("{cname}: privileged"));
        }
        if csc["allowPrivilegeEscalation"] != false {
            out.push(format!("{cname}: allowPrivilegeEscalation is not false"));
        }
        if !(csc["runAsNonRoot"] == true || (psc["runAsNonRoot"] == true && csc["runAsNonRoot"] != false)) {
            out.push(format!("{cname}: runAsNonRoot is not true"));
        }
        if csc["runAsUser"] == 0 || (psc["runAsUser"] == 0 && csc["runAsUser"].is_null()) {
            out.push(format!("{cname}: runs as user 0"));
        }
        let seccomp = csc["seccompProfile"]["type"].as_str().or(seccomp_pod);
        if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
            out.push(format!("{cname}: seccompProfile is not RuntimeDefault or Localhost"));
        }
        let caps = &csc["capabilities"];
        if !caps["drop"].as_array().is_some_and(|d| d.iter().any(|x| x == "ALL")) {
            out.push(format!("{cname}: capabilities do not drop ALL"));
        }
        if caps["add"].as_array().is_some_and(|a| a.iter().any(|x| x != "NET_BIND_SERVICE")) {
            out.push(format!("{cname}: adds a capability other than NET_BIND_SERVICE"));
        }
        // Beyond the standard, what the issue asks of a production deployment.
        if c["resources"]["requests"].is_null() || c["resources"]["limits"]["memory"].is_null() {
            out.push(format!("{cname}: no resource requests or memory limit"));
        }
        if c["livenessProbe"].is_null() || c["readinessProbe"].is_null() {
            out.push(format!("{cname}: no liveness or readiness probe"));
        }
        if csc["readOnlyRootFilesystem"] != true {
            out.push(format!("{cname}: the root filesystem is writable"));
        }
    }
    out
}

#[test]
fn every_deployment_meets_the_restricted_pod_security_standard() {
    for tls in [generated(), WebhookTls::CertManager] {
        let all = docs(&install_yaml(&install(tls, None)));
        let ns = all.iter().find(|d| d["kind"] == "Namespace").unwrap();
        assert_eq!(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted");
        let deployments: Vec<&Json> = all.iter().filter(|d| d["kind"] == "Deployment").collect();
        assert_eq!(deployments.len(), 2);
        for d in deployments {
            let name = d["metadata"]["name"].as_str().unwrap();
            let problems = restricted_problems(name, &d["spec"]["template"]["spec"]);
            assert!(problems.is_empty(), "{problems:#?}");
            let app = &d["spec"]["selector"]["matchLabels"];
            let pdb = all.iter().find(|p| p["kind"] == "PodDisruptionBudget" && p["metadata"]["name"] == name);
            assert_eq!(pdb.map(|p| &p["spec"]["selector"]["matchLabels"]), Some(app), "{name} has its budget");
            let spread = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
            assert!(spread.to_string().contains("kubernetes.io/hostname"), "{name} spreads over nodes");
        }
    }
    // The checker finds what it checks: a pod as the old install shipped it fails it.
    let bare = json!({"containers": [{"name": "c", "image": "i"}]});
    assert_eq!(restricted_problems("old", &bare).len(), 7, "{:#?}", restricted_problems("old", &bare));
}

#[test]
fn the_webhooks_certificate_verifies_against_its_ca_bundle_for_the_services_name() {
    use base64::Engine as _;
    for text in [install_yaml(&install(generated(), None)), rotate_yaml(&install(generated(), None))] {
        let all = docs(&text);
        let secret =
            all.iter().find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "ichor-webhook-tls").unwrap();
        assert_eq!(secret["type"], "kubernetes.io/tls");
        let hook = all.iter().find(|d| d["kind"] == "ValidatingWebhookConfiguration").unwrap();
        let bundle = base64::engine::general_purpose::STANDARD
            .decode(hook["webhooks"][0]["clientConfig"]["caBundle"].as_str().unwrap())
            .unwrap();
        let bundle = String::from_utf8(bundle).unwrap();
        assert_eq!(secret["stringData"]["ca.crt"], bundle.as_str());
        let (crt, key) =
            (secret["stringData"]["tls.crt"].as_str().unwrap(), secret["stringData"]["tls.key"].as_str().unwrap());
        // The API server calls the Service as <name>.<namespace>.svc.
        verify(&bundle, crt, key, "ichor-webhook.ichor-system.svc").unwrap();
        let wrong = verify(&bundle, crt, key, "ichor-webhook.other.svc").unwrap_err().to_string();
        assert!(wrong.contains("ichor-webhook.other.svc"), "a name the certificate does not carry is refused: {wrong}");
        let other = webhook_certs("ichor-system", now()).unwrap();
        assert!(verify(&other.ca_pem, crt, key, "ichor-webhook.ichor-system.svc").is_err(), "another CA is refused");
    }
    // With cert-manager the Certificate names the Secret the webhook reads, and the CA is
    // injected from it: nothing is shipped that the chain does not make.
    let all = docs(&install_yaml(&install(WebhookTls::CertManager, None)));
    assert!(!all.iter().any(|d| d["kind"] == "Secret"), "no Secret: cert-manager writes it");
    let cert = all.iter().find(|d| d["kind"] == "Certificate" && d["metadata"]["name"] == "ichor-webhook-tls").unwrap();
    assert_eq!(cert["spec"]["secretName"], "ichor-webhook-tls");
    assert!(cert["spec"]["dnsNames"].as_array().unwrap().contains(&json!("ichor-webhook.ichor-system.svc")));
    let issuers: Vec<&str> =
        all.iter().filter(|d| d["kind"] == "Issuer").map(|d| d["metadata"]["name"].as_str().unwrap()).collect();
    assert!(issuers.contains(&cert["spec"]["issuerRef"]["name"].as_str().unwrap()));
    let hook = all.iter().find(|d| d["kind"] == "ValidatingWebhookConfiguration").unwrap();
    assert_eq!(hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "ichor-system/ichor-webhook-tls");
}

#[test]
fn a_talosconfig_without_an_admin_certificate_is_refused_by_field_never_quoting_the_key() {
    use runtime::sim::pki::{ClientSpec, Pki};
    let pki = Pki::generate().unwrap();
    let endpoints = ["127.0.0.1:50000".to_string()];
    let admin = pki.client(&ClientSpec::talos(&["os:admin"])).unwrap();
    let reader = pki.client(&ClientSpec::talos(&["os:reader"])).unwrap();
    let ok = pki.talosconfig("lab", &endpoints, &endpoints, &admin);
    let now = now();
    runtime::install::talosconfig(&ok, "admin.yaml", None, now).unwrap();
    let text = install_yaml(&install(generated(), Some(ok.clone())));
    let all = docs(&text);
    let secret = all.iter().find(|d| d["metadata"]["name"] == "ichor-talosconfig").unwrap();
    assert_eq!(secret["stringData"]["talosconfig"], ok.as_str());
    let deployment = all.iter().find(|d| d["metadata"]["name"] == "ichor-controller" && d["kind"] == "Deployment");
    assert!(!deployment.unwrap().to_string().contains("optional"), "the shipped Secret is required");

    let cases = [
        (pki.talosconfig("lab", &endpoints, &endpoints, &reader), "contexts.lab.crt", "not os:admin"),
        ("context: lab\ncontexts: [".to_string(), "line ", "not YAML"),
        (ok.replace("crt: ", "crt: x"), "contexts.lab.crt", "not base64"),
        (ok.replace("context: lab\n", "context: prod\n"), "context", "no context \"prod\""),
    ];
    for (text, field, words) in cases {
        let e = runtime::install::talosconfig(&text, "bad.yaml", None, now).unwrap_err().to_string();
        assert!(e.starts_with("bad.yaml: ") && e.contains(field) && e.contains(words), "{e}");
        for key in [&admin.key_pem, &reader.key_pem] {
            let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
            assert!(!e.contains(&body[..20]), "the key is never quoted: {e}");
        }
    }
}

#[test]
fn uninstall_lists_every_object_the_last_first_and_the_crds_only_when_asked() {
    let text = install_yaml(&install(generated(), Some(String::new())));
    let created = docs(&text);
    let crds = "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: talosclusters.ichor.maesh.dev\nspec: {}\n";
    let without = docs(&uninstall_yaml(&text, None));
    assert_eq!(without.len(), created.len());
    assert_eq!(without.first().unwrap()["kind"], "ValidatingWebhookConfiguration");
    assert_eq!(without.last().unwrap()["kind"], "Namespace");
    assert!(!without.iter().any(|d| d["kind"] == "CustomResourceDefinition"));
    for (d, c) in without.iter().zip(created.iter().rev()) {
        assert_eq!(
            (&d["kind"], &d["metadata"]["name"], &d["metadata"]["namespace"]),
            (&c["kind"], &c["metadata"]["name"], &c["metadata"]["namespace"])
        );
        assert!(d["spec"].is_null() && d["rules"].is_null(), "identities only");
    }
    let with = docs(&uninstall_yaml(&text, Some(crds)));
    assert_eq!(with.len(), created.len() + 1);
    assert_eq!(with.last().unwrap()["kind"], "CustomResourceDefinition");
}

/// The webhook serves a renewed certificate from its next handshake on, with no restart (what
/// `ichor install --rotate-certs` and cert-manager's renewal rely on); a bad one is refused and
/// the served one kept.
#[test]
fn a_replaced_certificate_is_served_from_the_next_handshake_and_a_bad_one_is_refused() {
    use runtime::install::{verify_server, webhook_certs};
    use runtime::webhook::ReloadableCert;
    let name = "ichor-webhook.ichor-system.svc";
    // The handshake checks validity against the clock: certificates made now.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (a, b) = (webhook_certs("ichor-system", now).unwrap(), webhook_certs("ichor-system", now).unwrap());
    let cert = ReloadableCert::new(&a.cert_pem, &a.key_pem).unwrap();
    let server = cert.server_config().unwrap();
    verify_server(&a.ca_pem, server.clone(), name).unwrap();
    assert!(verify_server(&b.ca_pem, server.clone(), name).is_err());
    cert.replace(&b.cert_pem, &b.key_pem).unwrap();
    verify_server(&b.ca_pem, server.clone(), name).unwrap();
    assert!(verify_server(&a.ca_pem, server.clone(), name).is_err());
    let e = cert.replace(&a.cert_pem, &b.key_pem).unwrap_err().to_string();
    assert!(e.contains("do not belong together"), "{e}");
    verify_server(&b.ca_pem, server, name).unwrap();
}
