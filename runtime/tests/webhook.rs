//! The validating webhook at the HTTP level: real `AdmissionReview` v1 bodies (the files under
//! `tests/admission/`, as an API server sends them) POSTed over TLS to `/validate`, against the
//! in-memory API for the SubjectAccessReview and the cluster's operations.

use runtime::sim::kubeapi;
use runtime::webhook::{Webhook, serve_tls, server_config};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Hook {
    addr: std::net::SocketAddr,
    connector: tokio_rustls::TlsConnector,
    api: kubeapi::Api,
}

async fn start() -> Hook {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert_pem, key_pem) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let api = kubeapi::Api::new();
    let keys = render::inventory::Inventory::parse(render::embedded::CILIUM_KEYS.1).unwrap();
    let hook = Arc::new(Webhook { kube: api.client(), keys });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_tls(hook, listener, server_config(&cert_pem, &key_pem).unwrap(), std::future::pending()));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Hook { addr, connector: tokio_rustls::TlsConnector::from(Arc::new(cfg)), api }
}

impl Hook {
    async fn post(&self, body: &str) -> (u16, Value) {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = self.connector.connect(name, tcp).await.unwrap();
        let req = format!(
            "POST /validate?timeout=10s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        tls.read_to_string(&mut out).await.unwrap();
        let code: u16 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default();
        (code, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    /// Posts a fixture, with `edit` applied to its JSON first.
    async fn review(&self, fixture: &str, edit: impl FnOnce(&mut Value)) -> Value {
        let text =
            std::fs::read_to_string(format!("{}/tests/admission/{fixture}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let mut v: Value = serde_json::from_str(&text).unwrap();
        edit(&mut v);
        let (code, out) = self.post(&v.to_string()).await;
        assert_eq!(code, 200, "{out}");
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(out["response"]["uid"], v["request"]["uid"], "the response names the request's uid");
        out["response"].clone()
    }
}

fn message(r: &Value) -> String {
    r["status"]["message"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_kube_proxy_switch_is_admitted_only_with_the_annotation_naming_the_target() {
    let h = start().await;
    let r = h.review("taloscluster-switch.json", |_| {}).await;
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    assert!(message(&r).contains("spec.cni.kubeProxy changes from enabled to replaced, which needs the annotation ichor.maesh.dev/confirm-kube-proxy-switch: replaced"), "{r}");
    assert!(message(&r).contains("run `ichor cni kube-proxy replaced --cluster lab`"), "{r}");
    // A leftover annotation naming the other mode does not admit it.
    let r = h
        .review("taloscluster-switch.json", |v| {
            v["request"]["object"]["metadata"]["annotations"] =
                json!({"ichor.maesh.dev/confirm-kube-proxy-switch": "enabled"});
        })
        .await;
    assert_eq!(r["allowed"], false);
    let r = h
        .review("taloscluster-switch.json", |v| {
            v["request"]["object"]["metadata"]["annotations"] =
                json!({"ichor.maesh.dev/confirm-kube-proxy-switch": "replaced"});
        })
        .await;
    assert_eq!(r["allowed"], true, "{r}");
}

#[tokio::test]
async fn cilium_values_are_admin_only_and_validated_by_the_one_validator() {
    let h = start().await;
    // alice has no right on talosclusters/cilium-values.
    let r = h.review("taloscluster-values.json", |_| {}).await;
    assert_eq!(r["allowed"], false);
    assert!(
        message(&r).contains(
            "spec.cni.cilium.values is admin-only: alice may not update talosclusters/cilium-values in ichor-system"
        ),
        "{r}"
    );
    // An ichor-admin may.
    h.api.grant("alice", "ichor-system", "talosclusters/cilium-values", "update");
    let r = h.review("taloscluster-values.json", |_| {}).await;
    assert_eq!(r["allowed"], true, "{r}");
    // Even an admin cannot set a key Ichor owns, nor a pinned secretsNamespace.
    let r = h
        .review("taloscluster-values.json", |v| {
            v["request"]["object"]["spec"]["cni"]["cilium"]["values"] =
                json!({"tls": {"secretsNamespace": {"name": "ichor-system"}}});
        })
        .await;
    assert_eq!(r["allowed"], false);
    assert!(message(&r).contains("spec.cni.cilium.values.tls.secretsNamespace.name: pinned to cilium-secrets"), "{r}");
}

#[tokio::test]
async fn a_second_operation_on_a_locked_cluster_is_refused_naming_the_running_one() {
    let h = start().await;
    let r = h.review("talosoperation-create.json", |_| {}).await;
    assert_eq!(r["allowed"], true, "nothing holds the lock: {r}");
    h.api.put(
        render::api::GROUP,
        "talosoperations",
        json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation", "metadata": {"name": "upgrade-kubernetes-1-37-0", "namespace": "ichor-system"},
               "spec": {"clusterRef": {"name": "lab"}, "kind": "kubernetes", "target": {"kubernetesVersion": "v1.37.0"}},
               "status": {"phase": render::api::Phase::Running}}),
    );
    let r = h.review("talosoperation-create.json", |_| {}).await;
    assert_eq!(r["allowed"], false);
    assert!(
        message(&r).contains("TalosOperation ichor-system/upgrade-kubernetes-1-37-0 (Running) has not ended on cluster lab, and one operation runs on a cluster at a time: wait for it (`ichor status --cluster lab --watch`), resume it if it is Paused (`ichor operation resume upgrade-kubernetes-1-37-0`), or abort it (`ichor operation abort upgrade-kubernetes-1-37-0`)"),
        "{r}"
    );
}

#[tokio::test]
async fn a_body_that_is_not_an_admission_review_is_a_bad_request() {
    let h = start().await;
    let (code, out) = h.post(r#"{"apiVersion": "v1", "kind": "Pod"}"#).await;
    assert_eq!(code, 400);
    assert!(out["error"].as_str().unwrap().contains("AdmissionReview"), "{out}");
}

#[tokio::test]
async fn removing_the_values_needs_the_right_too() {
    let h = start().await;
    // The old object has the values; the new one has none (a removal by alice, who lacks the right).
    let r = h
        .review("taloscluster-values.json", |v| {
            let values = v["request"]["object"]["spec"]["cni"]["cilium"].clone();
            v["request"]["oldObject"]["spec"]["cni"]["cilium"] = values;
            v["request"]["object"]["spec"]["cni"].as_object_mut().unwrap().remove("cilium");
        })
        .await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(message(&r).contains("spec.cni.cilium.values is admin-only: alice may not update"), "{r}");
}

#[tokio::test]
async fn requests_it_cannot_judge_are_refused_with_a_reason() {
    let h = start().await;
    // An UPDATE without oldObject: the consent cannot be checked against it.
    let r = h
        .review("taloscluster-switch.json", |v| {
            v["request"]["object"]["metadata"]["annotations"] =
                json!({"ichor.maesh.dev/confirm-kube-proxy-switch": "replaced"});
            v["request"].as_object_mut().unwrap().remove("oldObject");
        })
        .await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(message(&r).contains("carries no old object the webhook can read"), "{r}");
    // An old object that does not decode.
    let r = h.review("taloscluster-switch.json", |v| v["request"]["oldObject"]["spec"] = json!("nonsense")).await;
    assert_eq!(r["allowed"], false, "{r}");
    // A DELETE, and another kind: what the webhook is not registered for.
    let r = h.review("talosoperation-create.json", |v| v["request"]["operation"] = json!("DELETE")).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(message(&r).contains("it was sent DELETE of a TalosOperation"), "{r}");
    let r = h.review("talosoperation-create.json", |v| v["request"]["kind"]["kind"] = json!("ConfigMap")).await;
    assert_eq!(r["allowed"], false, "{r}");
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_delays_nobody() {
    let h = start().await;
    // Connected, and silent: no ClientHello ever comes.
    let _silent: Vec<tokio::net::TcpStream> =
        futures::future::join_all((0..5).map(|_| tokio::net::TcpStream::connect(h.addr)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(std::time::Duration::from_secs(5), h.review("talosoperation-create.json", |_| {}))
        .await
        .expect("a review answered while other clients hang in their handshakes");
    assert_eq!(r["allowed"], true, "{r}");
    assert!(started.elapsed() < runtime::webhook::HANDSHAKE_TIMEOUT);
}

#[tokio::test]
async fn a_body_over_the_cap_is_answered_413() {
    let h = start().await;
    let tcp = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = h.connector.connect(name, tcp).await.unwrap();
    // It says how long the body is: the answer comes before any of it is sent.
    let req = format!(
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        runtime::webhook::BODY_LIMIT + 1
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut out = vec![0u8; 512];
    let n = tls.read(&mut out).await.unwrap();
    let head = String::from_utf8_lossy(&out[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
}
