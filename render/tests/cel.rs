//! The CRDs' CEL rules (`render::api::CEL_RULES`, `x-kubernetes-validations`) evaluated as the
//! API server evaluates them (kube-cel), on the CRDs `ichor crds` prints: each rule refuses what
//! it names and admits the shipped examples.

use serde_json::{Value, json};

fn schema(kind: &str) -> Value {
    let crd = render::api::crds().into_iter().find(|c| c.spec.names.kind == kind).unwrap();
    serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap()
}

fn check(kind: &str, obj: &Value, old: Option<&Value>) -> Result<(), String> {
    kube_cel::Validator::new().validate(&schema(kind), obj, old).map_err(|e| format!("{e:?}"))
}

fn example(file: &str, kind: &str) -> Value {
    let text = std::fs::read_to_string(format!("{}/../examples/clusters/lab-v1.14/{file}", env!("CARGO_MANIFEST_DIR")))
        .unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .find(|v: &Value| v["kind"] == kind)
        .unwrap()
}

#[test]
fn every_rule_is_in_the_crds() {
    for r in render::api::CEL_RULES {
        let s = serde_json::to_string(&schema(r.kind)).unwrap();
        assert!(s.contains(&serde_json::to_string(r.message).unwrap()), "{} {}: missing", r.kind, r.path);
    }
}

#[test]
fn the_examples_pass_and_bad_versions_are_refused() {
    let c = example("cluster.yaml", "TalosCluster");
    check("TalosCluster", &c, None).unwrap();
    let mut bad = c.clone();
    bad["spec"]["kubernetesVersion"] = json!("1.36.4");
    let e = check("TalosCluster", &bad, None).unwrap_err();
    assert!(e.contains("kubernetesVersion is vX.Y.Z"), "{e}");
    bad["spec"]["kubernetesVersion"] = json!("v1.36.4");
    bad["spec"]["endpoint"] = json!("lab:6443");
    assert!(check("TalosCluster", &bad, None).unwrap_err().contains("https:// URL"));
    bad["spec"]["endpoint"] = c["spec"]["endpoint"].clone();
    bad["spec"]["versionContract"] = json!("v1.14.0");
    assert!(check("TalosCluster", &bad, None).unwrap_err().contains("versionContract is vX.Y"));
}

#[test]
fn immutable_fields_refuse_a_change_on_update() {
    let c = example("cluster.yaml", "TalosCluster");
    let mut changed = c.clone();
    changed["spec"]["secretsRef"]["name"] = json!("other");
    assert!(check("TalosCluster", &changed, Some(&c)).unwrap_err().contains("secretsRef is immutable"));
    let m = example("machines.yaml", "TalosMachine");
    let mut moved = m.clone();
    moved["spec"]["role"] = json!("worker");
    assert!(check("TalosMachine", &moved, Some(&m)).unwrap_err().contains("role is immutable"));
    check("TalosMachine", &m, Some(&m)).unwrap();
}

#[test]
fn an_operation_names_its_target_and_never_changes() {
    let op = json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation", "metadata": {"name": "u"},
                    "spec": {"clusterRef": {"name": "lab"}, "kind": "kubernetes", "target": {"kubernetesVersion": "v1.37.0"}, "maxUnavailable": 1}});
    check("TalosOperation", &op, None).unwrap();
    let mut no_target = op.clone();
    no_target["spec"]["target"] = json!({});
    assert!(check("TalosOperation", &no_target, None).unwrap_err().contains("names target.kubernetesVersion"));
    let mut cni = op.clone();
    cni["spec"]["kind"] = json!("cni");
    assert!(check("TalosOperation", &cni, None).unwrap_err().contains("names target.kubeProxy"));
    let mut edited = op.clone();
    edited["spec"]["maxUnavailable"] = json!(2);
    assert!(check("TalosOperation", &edited, Some(&op)).unwrap_err().contains("spec is immutable"));
}
