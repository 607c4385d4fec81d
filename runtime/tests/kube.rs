//! The executor's Kubernetes side (`runtime::kube::KubeCluster`) through a real
//! `kube_client::Client` over the in-memory API (`runtime::sim::kubeapi`), with the simulated Talos
//! fleet as the source of rendered manifests; and the in-memory API's own contract (conflicts,
//! status, server-side apply ownership, UID preconditions, watches).
//!
//! Start at `setup`.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube_client::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams};
use render::api::{KubeProxyMode, Role};
use runtime::exec::KubePort;
use runtime::kube::{KubeCluster, KubeError};
use runtime::plan::ObjectRef;
use runtime::sim::kubeapi;
use runtime::sim::talos::{Fleet, NodeSpec};
use runtime::talos::config::TalosConfig;
use serde_json::json;
use std::time::Duration;

/// Kubernetes' own words (a Node's phase, a Job's condition type), not operation phases.
const NODE_RUNNING: &str = "Running"; // Kubernetes' word, not an operation phase
const JOB_FAILED: &str = "Failed"; // Kubernetes' word, not an operation phase

async fn setup() -> (Fleet, kubeapi::Api, KubeCluster) {
    let fleet = Fleet::start(
        vec![
            NodeSpec { name: "cp1".into(), role: Role::Controlplane, talos: "v1.14.3".into(), config: None },
            NodeSpec { name: "w1".into(), role: Role::Worker, talos: "v1.14.3".into(), config: None },
        ],
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let tc = TalosConfig::parse(&fleet.talosconfig(&["os:admin"]).unwrap(), "tc").unwrap();
    let (n, ctx) = tc.context(None, "tc").unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let talos =
        runtime::talos::client::Client::new(ctx, &ctx.credentials(n, "tc", now).unwrap(), Duration::from_secs(5))
            .unwrap();
    let api = kubeapi::Api::new();
    let cluster = KubeCluster {
        client: api.client(),
        talos,
        drain_timeout: Duration::from_millis(600),
        operation: None,
        namespace: "default".into(),
    };
    (fleet, api, cluster)
}

fn pod(name: &str, node: &str, labels: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}});
    kubeapi::merge_patch(&mut p, &extra);
    p
}

#[tokio::test]
async fn cordon_and_uncordon_patch_the_node() {
    let (_f, api, mut k) = setup().await;
    api.put("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1"}, "spec": {}}));
    k.cordon("w1").await.unwrap();
    let nodes: Api<Node> = Api::all(k.client.clone());
    assert_eq!(nodes.get("w1").await.unwrap().spec.unwrap().unschedulable, Some(true));
    k.uncordon("w1").await.unwrap();
    assert_eq!(nodes.get("w1").await.unwrap().spec.unwrap().unschedulable, None);
}

#[tokio::test]
async fn a_drain_evicts_through_the_eviction_api_and_leaves_daemonset_and_mirror_pods() {
    let (_f, api, mut k) = setup().await;
    api.put("", "pods", pod("app", "w1", json!({"app": "web"}), json!({})));
    api.put("", "pods", pod("agent", "w1", json!({}), json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cilium", "uid": "u"}]}})));
    api.put(
        "",
        "pods",
        pod("static", "w1", json!({}), json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}})),
    );
    api.put("", "pods", pod("elsewhere", "cp1", json!({"app": "web"}), json!({})));
    k.drain("w1", false).await.unwrap();
    let left: Vec<String> = api.objects().keys().filter(|k| k.1 == "pods").map(|k| k.3.clone()).collect();
    assert_eq!(left, ["agent", "elsewhere", "static"]);
    assert!(
        api.log().iter().any(|l| l.starts_with("POST /api/v1/namespaces/default/pods/app/eviction")),
        "{:?}",
        api.log()
    );
}

/// A PodDisruptionBudget `default/db` over the pods labelled `app: db` that allows no disruption.
fn budget_keeping_db(api: &kubeapi::Api) {
    api.put(
        "policy",
        "poddisruptionbudgets",
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "db", "namespace": "default"}, "spec": {"selector": {"matchLabels": {"app": "db"}}}, "status": {"disruptionsAllowed": 0}}),
    );
}

#[tokio::test]
async fn a_drain_a_budget_blocks_fails_at_its_deadline_naming_the_pod() {
    let (_f, api, mut k) = setup().await;
    api.put("", "pods", pod("db", "w1", json!({"app": "db"}), json!({})));
    budget_keeping_db(&api);
    match k.drain("w1", false).await {
        Err(e @ KubeError::DrainTimedOut { .. }) => {
            let m = e.to_string();
            assert!(m.contains("default/db") && m.contains("disruption budget db"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert!(api.get("", "pods", "default", "db").is_some(), "the pod the budget protects stays");
}

#[tokio::test]
async fn a_forced_drain_deletes_at_its_deadline_what_a_budget_keeps_and_leaves_the_budget() {
    let (_f, api, mut k) = setup().await;
    api.put("", "pods", pod("db", "w1", json!({"app": "db"}), json!({})));
    budget_keeping_db(&api);
    k.drain("w1", true).await.unwrap();
    assert!(api.get("", "pods", "default", "db").is_none(), "the pod the budget kept is deleted");
    assert!(api.get("policy", "poddisruptionbudgets", "default", "db").is_some(), "the budget stays");
    let log = api.log();
    let evictions = log.iter().filter(|l| l.starts_with("POST /api/v1/namespaces/default/pods/db/eviction")).count();
    assert!(evictions > 1, "the eviction was tried until the deadline first: {log:?}");
    assert!(log.iter().any(|l| l.starts_with("DELETE /api/v1/namespaces/default/pods/db")), "{log:?}");
}

#[tokio::test]
async fn the_manifest_sync_server_side_applies_talos_rendering_under_field_manager_talos() {
    let (_f, api, mut k) = setup().await;
    k.sync_manifests("cp1", "talos").await.unwrap();
    assert!(api.get("apps", "daemonsets", "kube-system", "kube-proxy").is_some());
    assert!(api.get("rbac.authorization.k8s.io", "clusterrolebindings", "", "kube-proxy").is_some());
    let applies: Vec<String> = api.log().into_iter().filter(|l| l.starts_with("PATCH")).collect();
    assert!(
        !applies.is_empty() && applies.iter().all(|l| l.contains("fieldManager=talos") && l.contains("force=true")),
        "{applies:?}"
    );
    // Idempotent.
    k.sync_manifests("cp1", "talos").await.unwrap();
}

#[tokio::test]
async fn deletions_carry_the_uid_and_the_restore_brings_kube_proxy_back_from_talos() {
    let (_f, api, mut k) = setup().await;
    k.sync_manifests("cp1", "talos").await.unwrap();
    for (api_version, kind, ns) in [
        ("apps/v1", "DaemonSet", Some("kube-system")),
        ("v1", "ServiceAccount", Some("kube-system")),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None),
    ] {
        let o = ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: ns.map(str::to_string),
            name: "kube-proxy".into(),
        };
        k.delete(&o).await.unwrap();
        // Deleting what is gone is a no-op.
        k.delete(&o).await.unwrap();
    }
    assert!(api.get("apps", "daemonsets", "kube-system", "kube-proxy").is_none());
    let deletes: Vec<String> = api.log().into_iter().filter(|l| l.starts_with("DELETE")).collect();
    assert_eq!(deletes.len(), 3, "{deletes:?}");
    // A manifest Talos has not rendered restores nothing; kube-proxy's own brings it back.
    k.restore_manifest("cp1", "99-not-rendered", "talos").await.unwrap();
    assert!(api.get("apps", "daemonsets", "kube-system", "kube-proxy").is_none());
    k.restore_manifest("cp1", runtime::plan::KUBE_PROXY_MANIFEST, "talos").await.unwrap();
    assert!(api.get("apps", "daemonsets", "kube-system", "kube-proxy").is_some());
    assert!(api.get("", "serviceaccounts", "kube-system", "kube-proxy").is_some());
}

#[tokio::test]
async fn the_cilium_job_is_created_once_under_its_name_with_its_mode() {
    let (_f, api, mut k) = setup().await;
    k.cilium_job("ichor-cni-abc", KubeProxyMode::Replaced, &json!({"hubble": {"enabled": true}}), "vxlan", true)
        .await
        .unwrap();
    k.cilium_job("ichor-cni-abc", KubeProxyMode::Replaced, &json!({"hubble": {"enabled": true}}), "vxlan", true)
        .await
        .unwrap();
    let jobs: Api<Job> = Api::namespaced(k.client.clone(), "kube-system");
    let j = jobs.get("ichor-cni-abc").await.unwrap();
    let spec = j.spec.unwrap().template.spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("ichor-cni"));
    let args = spec.containers[0].args.clone().unwrap();
    // The Job runs `ichor cni helm apply` with the mode from its flag and the user's layer.
    assert_eq!(args[..4], ["cni", "helm", "apply", "--kube-proxy=replaced"]);
    assert!(args.contains(&"--values-env=ICHOR_CILIUM_VALUES".to_string()), "{args:?}");
    // Cilium's objects in no Helm release yet: Helm takes them over.
    assert_eq!(args.last().map(String::as_str), Some("--take-ownership"), "{args:?}");
    let env = spec.containers[0].env.clone().unwrap();
    assert_eq!(env[0].value.as_deref(), Some(r#"{"hubble":{"enabled":true}}"#));
    assert_eq!(api.objects().keys().filter(|k| k.1 == "jobs").count(), 1);
}

// ---- the in-memory API's contract -------------------------------------------------------

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict_and_status_is_its_own_subresource() {
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}})).unwrap();
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut stale = created.clone();
    let mut fresh = created.clone();
    fresh.data = Some([("a".to_string(), "2".to_string())].into());
    cms.replace("c", &PostParams::default(), &fresh).await.unwrap();
    stale.data = Some([("a".to_string(), "3".to_string())].into());
    let err = cms.replace("c", &PostParams::default(), &stale).await.unwrap_err();
    assert!(matches!(&err, kube_client::Error::Api(s) if s.code == 409), "{err}");
    let nodes: Api<Node> = Api::all(api.client());
    api.put(
        "",
        "nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24"}}),
    );
    nodes
        .patch_status(
            "n",
            &PatchParams::default(),
            // A Node's phase (Kubernetes' word), not an operation phase.
            &Patch::Merge(json!({"status": {"phase": NODE_RUNNING}, "spec": {"podCIDR": "ignored"}})),
        )
        .await
        .unwrap();
    let n = nodes.get("n").await.unwrap();
    assert_eq!(n.spec.unwrap().pod_cidr.as_deref(), Some("10.0.0.0/24"), "a status patch leaves spec alone");
    assert_eq!(n.status.unwrap().phase.as_deref(), Some(NODE_RUNNING));
}

#[tokio::test]
async fn server_side_apply_conflicts_name_the_other_manager_unless_forced() {
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let mine =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1", "b": "1"}});
    cms.patch("c", &PatchParams::apply("talos"), &Patch::Apply(&mine)).await.unwrap();
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "2"}});
    let err = cms.patch("c", &PatchParams::apply("kubectl"), &Patch::Apply(&theirs)).await.unwrap_err();
    assert!(err.to_string().contains("conflict with \"talos\""), "{err}");
    cms.patch("c", &PatchParams::apply("kubectl").force(), &Patch::Apply(&theirs)).await.unwrap();
    assert_eq!(cms.get("c").await.unwrap().data.unwrap()["a"], "2");
    // A field its manager stops applying is removed.
    let less = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}});
    cms.patch("c", &PatchParams::apply("talos"), &Patch::Apply(&less)).await.unwrap();
    let data = cms.get("c").await.unwrap().data.unwrap_or_default();
    assert!(!data.contains_key("b") && data["a"] == "2", "{data:?}");
}

#[tokio::test]
async fn a_delete_with_another_uid_is_refused() {
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: Some("someone-else".into()), resource_version: None }),
        ..Default::default()
    };
    let err = cms.delete("c", &dp).await.unwrap_err();
    assert!(err.to_string().contains("Precondition failed"), "{err}");
    assert!(cms.get("c").await.is_ok());
}

#[tokio::test]
async fn watches_see_what_changes() {
    use futures::StreamExt;
    let api = kubeapi::Api::new();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    let list = pods.list(&Default::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut events = pods.watch(&WatchParams::default().timeout(5), &rv).await.unwrap().boxed();
    api.put("", "pods", pod("p", "w1", json!({}), json!({})));
    match tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("p")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn kinds_pluralize_as_the_api_server_does() {
    use runtime::kube::plural;
    for (k, p) in [
        ("ConfigMap", "configmaps"),
        ("TalosConfigPatch", "talosconfigpatches"),
        ("NetworkPolicy", "networkpolicies"),
        ("Gateway", "gateways"),
        ("Ingress", "ingresses"),
        ("Endpoints", "endpoints"),
        ("DaemonSet", "daemonsets"),
    ] {
        assert_eq!(plural(k), p);
    }
}

/// A drain a budget blocks past its deadline fails the machine's step (the operation pauses,
/// naming the pod and the budget), and nothing after it is done on the machine.
#[tokio::test]
async fn a_drain_past_its_deadline_fails_the_step_and_applies_nothing() {
    use runtime::plan::{Action, Plan};
    let (_f, api, mut k) = setup().await;
    api.put("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1"}, "spec": {}}));
    api.put("", "pods", pod("db", "w1", json!({"app": "db"}), json!({})));
    budget_keeping_db(&api);
    let plan = Plan {
        operation: "upgrade".into(),
        kind: render::api::OperationKind::Kubernetes,
        phase: render::api::Phase::Running,
        confirmation: None,
        actions: vec![
            (Action::Cordon { machine: "w1".into() }, vec![]),
            (Action::Drain { machine: "w1".into(), force: false }, vec![]),
            (
                Action::Apply {
                    machine: "w1".into(),
                    node: None,
                    paths: vec!["machine.kubelet.image".into()],
                    payload: None,
                },
                vec![],
            ),
        ],
        proofs: Default::default(),
        cilium_job_mode: None,
        work_left: vec![],
        reboot_paths: Default::default(),
        checks: vec![],
        drain_refusals: vec![],
        nothing_to_do: None,
        stages: vec![],
        stage_proofs: vec![],
    };
    let talos = k.talos.clone();
    let before = talos.running_config("w1").await.unwrap();
    let mut exec = runtime::exec::Executor { talos: &talos, kube: &mut k };
    let out = exec.run(&plan).await;
    let failed = out.failed();
    assert_eq!(failed.len(), 1, "{out:?}");
    assert!(failed[0].1.contains("default/db"), "{out:?}");
    assert_eq!(out.done().len(), 1, "only the cordon: {out:?}");
    assert_eq!(out.actions.len(), 2, "nothing after the failed drain: {out:?}");
    assert_eq!(talos.running_config("w1").await.unwrap(), before);
}

/// A failed Cilium Job is read back by the mode it ran for, with its condition's words, for the
/// operation that ran it only (another operation's, or the values reconciler's, is not its).
#[tokio::test]
async fn the_workload_reports_a_failed_cilium_job_by_its_mode() {
    let (_f, api, mut k) = setup().await;
    k.operation = Some("sw".into());
    k.cilium_job("ichor-cni-abc", KubeProxyMode::Replaced, &json!({}), "vxlan", false).await.unwrap();
    let mut job = api.get("batch", "jobs", "kube-system", "ichor-cni-abc").unwrap();
    job["status"] = json!({"conditions": [{"type": JOB_FAILED, "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]});
    api.put("batch", "jobs", job);
    let w = runtime::kube::read_workload(
        &k.client,
        runtime::controller::ProbeResult { answers: true, target: "the test".into() },
        "sw",
    )
    .await
    .unwrap();
    let why = w.cilium_jobs_failed.get(&KubeProxyMode::Replaced).expect("the failed Job");
    assert!(why.contains("ichor-cni-abc") && why.contains("backoff limit"), "{why}");
    let other = runtime::kube::read_workload(
        &k.client,
        runtime::controller::ProbeResult { answers: true, target: "the test".into() },
        "another-operation",
    )
    .await
    .unwrap();
    assert!(other.cilium_jobs_failed.is_empty(), "{:?}", other.cilium_jobs_failed);
}

/// The sync keeps Talos's inventory as Talos does: each applied object annotated with it, and
/// the ConfigMap listing `<namespace>_<name>_<group>_<kind>`.
#[tokio::test]
async fn the_manifest_sync_keeps_talos_inventory() {
    let (_f, api, mut k) = setup().await;
    k.sync_manifests("cp1", "talos").await.unwrap();
    let inv = api.get("", "configmaps", "kube-system", "talos-bootstrap-manifests-inventory").expect("the inventory");
    let keys: Vec<&String> = inv["data"].as_object().unwrap().keys().collect();
    assert!(keys.contains(&&"kube-system_kube-proxy_apps_DaemonSet".to_string()), "{keys:?}");
    assert!(keys.contains(&&"_kube-proxy_rbac.authorization.k8s.io_ClusterRoleBinding".to_string()), "{keys:?}");
    assert!(keys.contains(&&"kube-system_kube-proxy__ServiceAccount".to_string()), "{keys:?}");
    let ds = api.get("apps", "daemonsets", "kube-system", "kube-proxy").unwrap();
    assert_eq!(ds["metadata"]["annotations"]["config.k8s.io/owning-inventory"], "talos-bootstrap-manifests-inventory");
}

// ---- the CNI hand-over controller (ADR 0024) ---------------------------------------------

/// The example's TalosCluster, as JSON.
fn example_cluster() -> serde_json::Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/clusters/lab-v1.14/cluster.yaml"))
            .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// Absent, progressing, degraded, then synced: the condition follows Argo CD's Application,
/// and once True the render drops the CNI's inline manifest.
#[tokio::test]
async fn the_handover_follows_argo_cds_application_and_the_render_then_drops_the_inline_entry() {
    use render::api::TalosCluster;
    let (_fleet, api, port) = setup().await;
    api.put(render::api::GROUP, "talosclusters", example_cluster());
    let clusters: Api<TalosCluster> = Api::namespaced(api.client(), "ichor-system");
    let condition = |c: &TalosCluster| {
        let k = c.status.as_ref().unwrap().conditions.iter().find(|k| k.type_ == "CNIHandover").unwrap().clone();
        (k.status, k.reason)
    };
    let app = |sync: &str, health: &str| {
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "cilium", "namespace": "argocd"},
               "spec": {"source": {"chart": "cilium", "helm": {"releaseName": "cilium"}}, "destination": {"namespace": "kube-system"}},
               "status": {"sync": {"status": sync}, "health": {"status": health}}})
    };
    let step = || async {
        let c = clusters.get("lab").await.unwrap();
        let mut k = port.clone();
        let again = runtime::reconcile::cluster::reconcile(&mut k, &[], None, &c, "2026-12-01T00:00:00Z")
            .await
            .unwrap()
            .requeue;
        (condition(&clusters.get("lab").await.unwrap()), again)
    };
    // Argo CD absent: waiting, and it comes back (at the latest after the hand-over's wait).
    let ((status, reason), again) = step().await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "WaitingForArgoCD"));
    assert!(again.is_some_and(|d| d <= runtime::handover::REQUEUE), "{again:?}");
    // Argo CD arrives: its Application CRD, then the Application.
    api.put("apiextensions.k8s.io", "customresourcedefinitions", runtime::sim::discovery::argo_cd_application_crd());
    api.put("argoproj.io", "applications", app("OutOfSync", "Progressing"));
    assert_eq!(step().await.0, ("False".into(), "ArgoCDProgressing".into()));
    api.put("argoproj.io", "applications", app("Synced", "Degraded"));
    assert_eq!(step().await.0, ("False".into(), "ArgoCDDegraded".into()));
    api.put("argoproj.io", "applications", app("Synced", "Healthy"));
    let ((status, reason), again) = step().await;
    assert_eq!((status.as_str(), reason.as_str(), again), ("True", "Synced", None));
    // The render reads the condition: the inline Cilium entry is gone.
    let c = clusters.get("lab").await.unwrap();
    assert!(render::render::handover_done(&c));
    // A later degradation does not undo it.
    api.put("argoproj.io", "applications", app("Synced", "Degraded"));
    assert_eq!(step().await.0, ("True".into(), "Synced".into()));
}

/// Issue 28, item 5: Ichor's namespace is locked down once Cilium is ready (its DaemonSet rolled
/// out, its policy kind served), each policy written once and not again while it says the
/// same; turned off, nothing is written.
#[tokio::test]
async fn the_namespace_is_locked_down_once_cilium_is_ready_and_written_once() {
    use render::api::TalosCluster;
    let (_fleet, api, port) = setup().await;
    let mut cluster = example_cluster();
    cluster["spec"]["cni"]["handover"] = json!("disabled");
    api.put(render::api::GROUP, "talosclusters", cluster);
    let clusters: Api<TalosCluster> = Api::namespaced(api.client(), "ichor-system");
    let lockdown = runtime::netpol::Lockdown {
        namespace: "ichor-system".into(),
        metrics_from: vec!["10.0.0.0/8".into()],
        talos_nodes: runtime::netpol::talos_nodes(["10.5.0.2", "10.5.0.3"]),
    };
    let policies = || {
        let mut names: Vec<String> = api
            .objects()
            .into_iter()
            .filter(|(k, _)| k.1 == "ciliumnetworkpolicies")
            .map(|(k, v)| format!("{}/{} {}", k.2, k.3, v["metadata"]["resourceVersion"]))
            .collect();
        names.sort();
        names
    };
    let step = |l: Option<runtime::netpol::Lockdown>| {
        let clusters = clusters.clone();
        let mut k = port.clone();
        async move {
            let c = clusters.get("lab").await.unwrap();
            runtime::reconcile::cluster::reconcile(&mut k, &[], l.as_ref(), &c, "2026-12-01T00:00:00Z").await.unwrap();
        }
    };
    // No Cilium yet: nothing.
    step(Some(lockdown.clone())).await;
    assert!(policies().is_empty());
    // Cilium rolling out, its CRD installed: still nothing.
    api.put("apiextensions.k8s.io", "customresourcedefinitions", runtime::sim::discovery::cilium_network_policy_crd());
    api.put("apps", "daemonsets", json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "cilium", "namespace": "kube-system", "generation": 1},
        "spec": {"template": {"spec": {"containers": [{"name": "cilium-agent", "image": "quay.io/cilium/cilium:v1.20.0"}]}}},
        "status": {"desiredNumberScheduled": 4, "updatedNumberScheduled": 2, "numberReady": 4, "observedGeneration": 1}}));
    step(Some(lockdown.clone())).await;
    assert!(policies().is_empty(), "{:?}", policies());
    // Turned off: nothing, even with Cilium rolled out.
    runtime::sim::demo::roll_out_daemonsets(&api, 4);
    step(None).await;
    assert!(policies().is_empty(), "{:?}", policies());
    // Rolled out: the three, under Ichor's field manager; a second reconcile writes none.
    step(Some(lockdown.clone())).await;
    let first = policies();
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(first[0].starts_with("ichor-system/ichor-controller-ingress "), "{first:?}");
    let webhook = api.get("cilium.io", "ciliumnetworkpolicies", "ichor-system", "ichor-webhook-ingress").unwrap();
    assert_eq!(webhook["spec"]["ingress"][0]["fromEntities"], json!(["kube-apiserver", "host"]));
    let managers = webhook["metadata"]["managedFields"].to_string();
    assert!(managers.contains(runtime::netpol::FIELD_MANAGER), "{managers}");
    let egress = api.get("cilium.io", "ciliumnetworkpolicies", "ichor-system", "ichor-egress").unwrap();
    assert_eq!(egress["spec"]["egress"][3]["toCIDR"], json!(["10.5.0.2/32", "10.5.0.3/32"]));
    step(Some(lockdown.clone())).await;
    assert_eq!(policies(), first, "nothing written again while the policies say the same");
    // A policy changed by hand is put back.
    let mut changed = webhook.clone();
    changed["spec"]["ingress"][0]["fromEntities"] = json!(["world"]);
    api.put("cilium.io", "ciliumnetworkpolicies", changed);
    step(Some(lockdown)).await;
    let webhook = api.get("cilium.io", "ciliumnetworkpolicies", "ichor-system", "ichor-webhook-ingress").unwrap();
    assert_eq!(webhook["spec"]["ingress"][0]["fromEntities"], json!(["kube-apiserver", "host"]));
}

/// As kube-apiserver: a write that changes nothing keeps the resourceVersion and sends no watch
/// event (else a controller re-reconciles its own write forever), and the main resource never
/// writes status.
#[tokio::test]
async fn a_no_op_patch_keeps_the_resource_version_and_sends_no_event() {
    use futures::StreamExt;
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    cms.create(&PostParams::default(), &serde_json::from_value(cm).unwrap()).await.unwrap();
    let rv = cms.get("c").await.unwrap().metadata.resource_version.unwrap();
    let mut events = cms.watch(&WatchParams::default().timeout(2), &rv).await.unwrap().boxed();
    let same = cms.patch("c", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": "1"}}))).await.unwrap();
    assert_eq!(same.metadata.resource_version.as_deref(), Some(rv.as_str()), "a no-op patch keeps the version");
    let applied = cms
        .patch(
            "c",
            &PatchParams::apply("me"),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.resource_version.as_deref(), Some(rv.as_str()), "so does a no-op apply");
    // The first event is the first real change, not the no-ops.
    cms.patch("c", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": "2"}}))).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Modified(c) => assert_eq!(c.data.unwrap()["a"], "2"),
        other => panic!("{other:?}"),
    }
    // A patch of the main resource leaves status alone.
    let nodes: Api<Node> = Api::all(api.client());
    api.put(
        "",
        "nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "status": {"phase": "Terminated"}}),
    );
    let n = nodes
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Gone"}, "spec": {"podCIDR": "10.0.0.0/24"}})),
        )
        .await
        .unwrap();
    assert_eq!(n.status.unwrap().phase.as_deref(), Some("Terminated"), "status is written through /status only");
    assert_eq!(n.spec.unwrap().pod_cidr.as_deref(), Some("10.0.0.0/24"));
}
