//! The in-memory API's contract as a controller meets it, through a real `kube_client::Client`
//! and raw HTTP where kube-rs has no words for it: finalizers, JSON and strategic merge patches,
//! `limit`/`continue`, set-based selectors, watches from a compacted resourceVersion (410),
//! bookmarks, field validation and pruning, the CRDs' CEL rules, `managedFields`, Events in
//! both views, server-side Tables, unknown paths and verbs, injected faults. Each is what
//! kube-apiserver does; the kubectl suite (cli/tests/operations.rs) checks it from the other
//! side.
//!
//! Start at `raw`.

use http::{Method, Request};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube_client::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams};
use runtime::sim::kubeapi;
use serde_json::{Value as Json, json};

/// One request: (status, warning headers, body).
async fn raw(
    api: &kubeapi::Api,
    method: Method,
    uri: &str,
    content_type: &str,
    accept: &str,
    body: Option<Json>,
) -> (u16, Vec<String>, Json) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .header("accept", accept)
        .body(kube_client::client::Body::from(body.map(|b| b.to_string().into_bytes()).unwrap_or_default()))
        .unwrap();
    let resp = api.client().send(req).await.unwrap();
    let code = resp.status().as_u16();
    let warnings = resp.headers().get_all("warning").iter().map(|v| v.to_str().unwrap().to_string()).collect();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
    (code, warnings, serde_json::from_slice(&bytes).unwrap_or(Json::Null))
}

fn cluster() -> Json {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/clusters/lab-v1.14/cluster.yaml"))
            .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

const TC: &str = "/apis/ichor.maesh.dev/v1alpha1/namespaces/ichor-system/talosclusters";

#[tokio::test]
async fn a_finalizer_holds_a_deleted_object_until_it_is_removed() {
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "held", "finalizers": ["example.dev/keep"]}, "data": {"a": "1"}}),
    )
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some(), "marked for deletion, not gone");
    // No new finalizer while it is being deleted.
    let e = cms
        .patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": ["a", "b"]}})))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no new finalizers can be added"), "{e}");
    cms.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none(), "the last finalizer gone, the object goes");
}

#[tokio::test]
async fn json_and_strategic_merge_patches_apply_as_the_server_applies_them() {
    let api = kubeapi::Api::new();
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "labels": {"a": "1"}},
        "spec": {"containers": [{"name": "one", "image": "one:1"}, {"name": "two", "image": "two:1"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let uri = "/api/v1/namespaces/default/pods/p";
    let ops = json!([
        {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
        {"op": "add", "path": "/metadata/labels/b", "value": "3"},
    ]);
    let (code, _, p) =
        raw(&api, Method::PATCH, uri, "application/json-patch+json", "application/json", Some(ops)).await;
    assert_eq!((code, p["metadata"]["labels"].clone()), (200, json!({"a": "2", "b": "3"})));
    let bad = json!([{"op": "test", "path": "/metadata/labels/a", "value": "9"}]);
    let (code, _, e) =
        raw(&api, Method::PATCH, uri, "application/json-patch+json", "application/json", Some(bad)).await;
    assert_eq!(code, 422);
    assert!(e["message"].as_str().unwrap().contains("testing value /metadata/labels/a failed"), "{e}");
    // Strategic: containers merge by name.
    let p = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "two", "image": "two:2"}]}})),
        )
        .await
        .unwrap();
    let images: Vec<String> = p.spec.unwrap().containers.into_iter().map(|c| c.image.unwrap()).collect();
    assert_eq!(images, ["one:1", "two:2"]);
    // A custom resource takes no strategic merge patch (415, as kube-apiserver).
    api.put(render::api::GROUP, "talosclusters", cluster());
    let (code, _, body) = raw(
        &api,
        Method::PATCH,
        &format!("{TC}/lab"),
        "application/strategic-merge-patch+json",
        "application/json",
        Some(json!({"spec": {}})),
    )
    .await;
    assert_eq!(code, 415, "{body}");
}

#[tokio::test]
async fn lists_page_with_limit_and_continue_and_select_by_sets() {
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    for (i, tier) in ["a", "b", "c", "a", "b"].iter().enumerate() {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm{i}"), "labels": {"tier": tier}}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let mut names = vec![];
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().limit(2);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await.unwrap();
        pages += 1;
        names.extend(page.items.into_iter().map(|c| c.metadata.name.unwrap()));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!((pages, names.len()), (3, 5), "{names:?}");
    let ab = cms.list(&ListParams::default().labels("tier in (a,b),tier notin (b)")).await.unwrap();
    assert_eq!(ab.items.len(), 2);
    let e = cms.list(&ListParams::default().fields("spec.nothing=x")).await.unwrap_err();
    assert!(e.to_string().contains("field label not supported: spec.nothing"), "{e}");
}

#[tokio::test]
async fn a_watch_from_a_compacted_resource_version_is_gone_and_bookmarks_come_when_asked() {
    use futures::StreamExt;
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "y"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    api.compact();
    let (code, _, body) = raw(
        &api,
        Method::GET,
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1",
        "application/json",
        "application/json",
        None,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (410, Some("Expired")), "{body}");
    assert!(body["message"].as_str().unwrap().starts_with("too old resource version: 1"), "{body}");
    let rv = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut stream = cms.watch(&WatchParams::default().timeout(2), &rv).await.unwrap().boxed();
    let first = tokio::time::timeout(std::time::Duration::from_secs(3), stream.next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(first, kube_client::api::WatchEvent::Bookmark(_)), "{first:?}");
}

#[tokio::test]
async fn unknown_fields_are_refused_under_strict_pruned_with_a_warning_otherwise() {
    let api = kubeapi::Api::new();
    let mut c = cluster();
    c["spec"]["kubernetesVersoin"] = json!("v1.36.4");
    let (code, _, body) = raw(
        &api,
        Method::POST,
        &format!("{TC}?fieldValidation=Strict"),
        "application/json",
        "application/json",
        Some(c.clone()),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        body["message"],
        "TalosCluster in version \"v1alpha1\" cannot be handled as a TalosCluster: strict decoding error: unknown field \"spec.kubernetesVersoin\""
    );
    assert!(api.get(render::api::GROUP, "talosclusters", "ichor-system", "lab").is_none(), "nothing is written");
    let (code, warnings, body) = raw(&api, Method::POST, TC, "application/json", "application/json", Some(c)).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(warnings, ["299 - \"unknown field \\\"spec.kubernetesVersoin\\\"\""]);
    assert!(body["spec"].get("kubernetesVersoin").is_none(), "pruned: {body}");
}

#[tokio::test]
async fn the_crds_cel_rules_refuse_a_write_with_the_servers_words() {
    let api = kubeapi::Api::new();
    let mut c = cluster();
    c["spec"]["kubernetesVersion"] = json!("1.36.4");
    let (code, _, body) = raw(&api, Method::POST, TC, "application/json", "application/json", Some(c)).await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.starts_with("TalosCluster.ichor.maesh.dev \"lab\" is invalid: "), "{message}");
    assert!(message.contains("kubernetesVersion is vX.Y.Z"), "{message}");
    // A transition rule: the secrets reference cannot change.
    let (code, _, _) = raw(&api, Method::POST, TC, "application/json", "application/json", Some(cluster())).await;
    assert_eq!(code, 201);
    let (code, _, body) = raw(
        &api,
        Method::PATCH,
        &format!("{TC}/lab"),
        "application/merge-patch+json",
        "application/json",
        Some(json!({"spec": {"secretsRef": {"name": "other"}}})),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(body["message"].as_str().unwrap().contains("secretsRef is immutable"), "{body}");
}

#[tokio::test]
async fn managed_fields_name_each_manager_and_operation() {
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"a": "1"}});
    cms.patch("m", &PatchParams::apply("first"), &Patch::Apply(&applied)).await.unwrap();
    let cm = cms
        .patch(
            "m",
            &PatchParams { field_manager: Some("editor".into()), ..Default::default() },
            &Patch::Merge(json!({"data": {"b": "2"}})),
        )
        .await
        .unwrap();
    let managed = cm.metadata.managed_fields.unwrap();
    let entries: Vec<(String, String)> =
        managed.iter().map(|m| (m.manager.clone().unwrap(), m.operation.clone().unwrap())).collect();
    assert_eq!(entries, [("editor".to_string(), "Update".to_string()), ("first".into(), "Apply".into())]);
    let fields = serde_json::to_value(&managed[1].fields_v1).unwrap();
    assert_eq!(fields, json!({"f:data": {"f:a": {}}}));
    // The updater owns `b`: applying another value of it conflicts, naming it with its version.
    let other =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"a": "1", "b": "9"}});
    let e = cms.patch("m", &PatchParams::apply("first"), &Patch::Apply(&other)).await.unwrap_err();
    assert!(e.to_string().contains("conflict with \"editor\" using v1: .data.b"), "{e}");
}

#[tokio::test]
async fn an_event_written_in_the_new_api_is_read_in_the_core_view_by_its_object() {
    use kube_runtime::events::{Event, EventType, Recorder, Reporter};
    let api = kubeapi::Api::new();
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    let cm = cms
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "e"}})).unwrap())
        .await
        .unwrap();
    let recorder =
        Recorder::new(api.client(), Reporter { controller: "ichor".into(), instance: Some("ichor-0".into()) });
    use kube_client::Resource;
    let ev = Event {
        type_: EventType::Normal,
        reason: "Applied".into(),
        note: Some("config applied".into()),
        action: "Apply".into(),
        secondary: None,
    };
    recorder.publish(&ev, &cm.object_ref(&())).await.unwrap();
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(api.client(), "default");
    let uid = cm.metadata.uid.unwrap();
    let selector = format!(
        "involvedObject.name=e,involvedObject.namespace=default,involvedObject.kind=ConfigMap,involvedObject.uid={uid}"
    );
    let found = core.list(&ListParams::default().fields(&selector)).await.unwrap();
    assert_eq!(found.items.len(), 1);
    let e = &found.items[0];
    assert_eq!((e.reason.as_deref(), e.message.as_deref()), (Some("Applied"), Some("config applied")));
    assert_eq!(e.source.as_ref().and_then(|s| s.component.as_deref()), Some("ichor"));
}

#[tokio::test]
async fn a_table_prints_a_crds_columns() {
    let api = kubeapi::Api::new();
    api.put(render::api::GROUP, "talosclusters", cluster());
    let (code, _, t) = raw(
        &api,
        Method::GET,
        TC,
        "application/json",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        None,
    )
    .await;
    assert_eq!((code, t["kind"].as_str()), (200, Some("Table")), "{t}");
    let names: Vec<&str> =
        t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Name", "Kubernetes", "Talos", "Kube-Proxy", "Hand-Over", "Contract", "Age"]);
    assert_eq!(t["rows"][0]["cells"][0], "lab");
    assert_eq!(t["rows"][0]["cells"][1], "v1.36.4");
}

#[tokio::test]
async fn unknown_paths_resources_and_verbs_answer_as_kube_apiserver_does() {
    let api = kubeapi::Api::new();
    for uri in ["/apis/nowhere.example/v1/things", "/api/v1/namespaces/default/configmaps/x/nonsense", "/healthz/x"] {
        let (code, _, body) = raw(&api, Method::GET, uri, "application/json", "application/json", None).await;
        assert_eq!(
            (code, body["kind"].as_str(), body["reason"].as_str()),
            (404, Some("Status"), Some("NotFound")),
            "{uri}"
        );
    }
    let (code, _, body) = raw(
        &api,
        Method::PUT,
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        "application/json",
        Some(json!({})),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (405, Some("MethodNotAllowed")), "{body}");
}

#[tokio::test]
async fn faults_scoped_to_a_user_agent_spare_every_other_client() {
    let api = kubeapi::Api::new();
    let mut faults = kubeapi::Faults::default();
    faults.add("500=1").unwrap();
    faults.add("for=ichor-controller").unwrap();
    assert!(faults.apply_to("ichor-controller/0.1.0"));
    assert!(!faults.apply_to("kubectl/v1.32.0 (linux/amd64)"));
    assert!(!faults.apply_to(""));
    assert!(faults.clone().add("for=").unwrap_err().contains("unknown fault"));
    api.set_faults(faults);
    // A request without the controller's User-Agent (the CLI's, kubectl's) is served.
    let (code, _, body) = raw(
        &api,
        Method::POST,
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        "application/json",
        Some(json!({"metadata": {"name": "x"}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
}

#[tokio::test]
async fn injected_faults_answer_writes_as_an_overloaded_server_does() {
    let api = kubeapi::Api::new();
    let mut faults = kubeapi::Faults::default();
    faults.add("429=1").unwrap();
    assert!(faults.clone().add("418=0.5").unwrap_err().contains("unknown fault"));
    api.set_faults(faults);
    let (code, _, body) = raw(
        &api,
        Method::POST,
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        "application/json",
        Some(json!({"metadata": {"name": "x"}})),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (429, Some("TooManyRequests")));
    assert!(api.objects().is_empty(), "a refused write writes nothing");
    api.set_faults(kubeapi::Faults::default());
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap())
        .await
        .unwrap();
}

/// Issue 50, finding 11: kube-apiserver defaults an object as it reads it from storage, so a
/// write that touches no spec field leaves `generation` even when the stored object lacked a
/// default the schema gives (the sim bumped it, and the controller re-judged every machine).
#[tokio::test]
async fn a_write_that_only_stores_a_default_leaves_the_generation() {
    let api = kubeapi::Api::new();
    let mut tc = cluster();
    // Stored before the schema's defaults were filled in (a fixture, or an older server).
    tc.pointer_mut("/spec/cni").and_then(|n| n.as_object_mut()).unwrap().remove("handover");
    api.put(render::api::GROUP, "talosclusters", tc);
    let (code, _, body) = raw(
        &api,
        Method::PATCH,
        &format!("{TC}/lab"),
        "application/merge-patch+json",
        "application/json",
        Some(json!({"metadata": {"annotations": {"team": "storage"}}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body.pointer("/metadata/generation"), Some(&json!(1)), "{body}");
    assert_eq!(body.pointer("/spec/cni/handover"), Some(&json!("automatic")), "defaulted as it is read");
    // A spec change still moves it.
    let (_, _, body) = raw(
        &api,
        Method::PATCH,
        &format!("{TC}/lab"),
        "application/merge-patch+json",
        "application/json",
        Some(json!({"spec": {"cni": {"handover": "manual"}}})),
    )
    .await;
    assert_eq!(body.pointer("/metadata/generation"), Some(&json!(2)), "{body}");
}
