//! render's integration tests (one binary): inventories against real configs, and more.

use render::config::Config;
use render::inventory::Inventory;

fn inventory(v: &str) -> Inventory {
    let text = std::fs::read_to_string(format!("{}/../rules/contracts/{v}.paths", env!("CARGO_MANIFEST_DIR"))).unwrap();
    Inventory::parse(&text).unwrap()
}

/// Every leaf of Talos's own generated configs exists in its contract's inventory. Reads
/// `../shared` when present (the real files are not the project's to copy).
#[test]
fn real_configs_are_covered_by_their_inventory() {
    let shared = format!("{}/../../shared/talos/configs", env!("CARGO_MANIFEST_DIR"));
    if !std::path::Path::new(&shared).exists() {
        eprintln!("skipped: {shared} is absent");
        return;
    }
    let mut missing = vec![];
    for (v, files) in [
        ("v1.13", vec!["v1.13/base-controlplane.yaml", "v1.13/base-worker.yaml"]),
        ("v1.14", vec!["v1.14/base-controlplane.yaml", "v1.14/base-worker.yaml", "v1.14/overrides-controlplane.yaml"]),
    ] {
        let inv = inventory(v);
        for f in files {
            let text = std::fs::read_to_string(format!("{shared}/{f}")).unwrap();
            let c = Config::parse(&text).unwrap_or_else(|e| panic!("{f}: {e:?}"));
            for p in c.leaves().keys() {
                if !inv.contains(p) {
                    missing.push(format!("{v} {f}: {p}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "paths missing from inventories:\n{}", missing.join("\n"));
}

use render::fieldmeta::FieldMeta;
use render::vocab::Contract;
use std::collections::BTreeMap;

/// Every contract the build embeds (each `rules/contracts/vX.Y.paths`): a new contract is
/// tested without editing this file.
fn contracts() -> Vec<Contract> {
    render::embedded::CONTRACTS.iter().map(|(c, _)| Contract::parse(c).unwrap()).collect()
}

fn fieldmeta_text() -> String {
    std::fs::read_to_string(format!("{}/../rules/fieldmeta.yaml", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn shipped_fieldmeta_loads_and_covers_every_contract() {
    let meta = FieldMeta::parse(&fieldmeta_text(), &contracts()).unwrap_or_else(|e| panic!("{e:?}"));
    let invs: BTreeMap<Contract, Inventory> = contracts().into_iter().map(|c| (c, inventory(&c.to_string()))).collect();
    let (errors, coverage) = meta.check_inventories(&invs);
    assert!(errors.is_empty(), "{}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
    for (c, cov) in coverage {
        assert!(
            cov.defaulted.is_empty(),
            "{c}: {} of {} paths fall to the default: {:?}",
            cov.defaulted.len(),
            cov.total,
            cov.defaulted
        );
    }
}

/// The contract's pattern trie finds exactly the patterns that match one by one
/// (`Pattern::matches`), on every inventory path of the three contracts (wildcards replaced by
/// sample segments) and on seeded random paths built from the patterns' own segments.
#[test]
fn pattern_trie_agrees_with_matching_one_by_one() {
    use render::path::{Path, Seg};
    let meta = FieldMeta::parse(&fieldmeta_text(), &contracts()).unwrap();
    let one_by_one = |c: Contract, p: &Path| {
        let mut out: Vec<(usize, i64)> = vec![];
        for (e, en) in meta.entries.iter().enumerate().filter(|(_, en)| en.holds_at(c)) {
            if let Some(s) = en.patterns.iter().filter(|pat| pat.matches(p)).map(|pat| pat.specificity).max() {
                out.push((e, s));
            }
        }
        out
    };
    // Segments seen in patterns and inventories, plus some no pattern names.
    let mut words: Vec<String> = vec!["x".into(), "zz".into(), "a.b/c".into()];
    let mut roots: Vec<String> = vec!["NotAKind".into()];
    let mut paths: Vec<Path> = vec![];
    for c in contracts() {
        for pat in inventory(&c.to_string()).patterns() {
            for (a, b) in [("[0]", ".x"), ("[eth0]", "[\"a.b/c\"]"), ("[3]", ".zz")] {
                if let Ok(p) = Path::parse(&pat.replace("[*]", a).replace(".*", b)) {
                    if let Some(Seg::Field(r)) = p.segs.first() {
                        roots.push(r.clone());
                    }
                    for s in &p.segs {
                        if let Seg::Field(f) | Seg::Name(f) = s {
                            words.push(f.clone());
                        }
                    }
                    paths.push(p);
                }
            }
        }
    }
    for v in [&mut words, &mut roots] {
        v.sort();
        v.dedup();
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for _ in 0..20_000 {
        let mut p = Path::root(&roots[next(roots.len())]);
        for i in 0..next(6) {
            p.segs.push(match next(5) {
                0 => Seg::Index(next(4)),
                1 if i == 0 => Seg::Name(words[next(words.len())].clone()),
                2 => Seg::Key(words[next(words.len())].clone()),
                _ => Seg::Field(words[next(words.len())].clone()),
            });
        }
        paths.push(p);
    }
    let mut matched = 0;
    for c in contracts() {
        let m = meta.matcher(c);
        for p in &paths {
            let want = one_by_one(c, p);
            assert_eq!(m.candidates(p), want, "{c} {p}");
            matched += usize::from(!want.is_empty());
        }
    }
    // Most paths match some pattern, and many random ones match none: both sides are tested.
    assert!(
        matched > paths.len() * 3 / 2 && matched < paths.len() * contracts().len(),
        "{matched} of {} checks matched",
        paths.len() * 3
    );
}

use render::api::*;
use render::render::{Inputs, render};
use render::secrets::Bundle;

fn meta(name: &str) -> kube_core::ObjectMeta {
    kube_core::ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ichor-system".into()),
        generation: Some(1),
        ..Default::default()
    }
}

/// The conformance test (the one test that reads `../shared`): the inputs behind Talos's own
/// generated configs render to the same documents, paths and values.
#[test]
fn render_conforms_to_talos_generated_configs() {
    let shared = format!("{}/../../shared/talos/configs", env!("CARGO_MANIFEST_DIR"));
    if !std::path::Path::new(&shared).exists() {
        eprintln!("skipped: {shared} is absent");
        return;
    }
    let mut problems = vec![];
    let mut compared = 0;
    for contract in ["v1.13", "v1.14"] {
        let cp_text = std::fs::read_to_string(format!("{shared}/{contract}/base-controlplane.yaml")).unwrap();
        let bundle = Bundle::from_config(&Config::parse(&cp_text).unwrap());
        for role in [Role::Controlplane, Role::Worker] {
            let file = format!("{contract}/base-{}.yaml", role.name());
            let reference = Config::parse(&std::fs::read_to_string(format!("{shared}/{file}")).unwrap()).unwrap();
            let cluster = TalosCluster {
                metadata: meta("base"),
                spec: TalosClusterSpec {
                    endpoint: "https://base:6443".into(),
                    kubernetes_version: "v1.28.0".into(),
                    talos_version: "v1.14.0".into(),
                    version_contract: contract.into(),
                    secrets_ref: SecretRef { name: "base-secrets".into() },
                    cni: CniSpec { preset: CniPreset::Flannel, ..Default::default() },
                    ..Default::default()
                },
                status: None,
            };
            let machine = TalosMachine {
                metadata: meta("m1"),
                spec: TalosMachineSpec {
                    cluster_ref: ClusterRef { name: "base".into() },
                    role,
                    address: "10.0.0.1".into(),
                    install_disk: None,
                },
                status: None,
            };
            let inputs = Inputs {
                cluster: &cluster,
                machine: &machine,
                patches: vec![],
                secrets: &bundle,
                secrets_version: "1".into(),
            };
            let out = render(&inputs, Contract::parse(contract).unwrap()).unwrap();
            let kinds = |c: &Config| c.docs.iter().map(|d| d.id()).collect::<Vec<_>>();
            if kinds(&out.config) != kinds(&reference) {
                problems.push(format!(
                    "{file}: documents differ:\n  ours:   {:?}\n  talos:  {:?}",
                    kinds(&out.config),
                    kinds(&reference)
                ));
            }
            let (ours, theirs) = (out.config.leaves(), reference.leaves());
            assert!(theirs.len() >= 25, "{file}: only {} leaves compared", theirs.len());
            compared += theirs.len();
            for (p, v) in &theirs {
                match ours.get(p) {
                    None => problems.push(format!("{file}: missing {p}")),
                    Some(o) if o != v => problems.push(format!("{file}: {p} = {o:?}, Talos has {v:?}")),
                    _ => {}
                }
            }
            for p in ours.keys() {
                if !theirs.contains_key(p) {
                    problems.push(format!("{file}: extra {p}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    eprintln!("conformance: {compared} leaves of Talos's own configs matched");
}

fn example(contract: &str) -> render::manifests::Manifests {
    let dir = format!("{}/../examples/clusters/lab-{contract}", env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    for f in ["cluster.yaml", "machines.yaml", "patches.yaml", "secrets.yaml"] {
        files.push((f.to_string(), std::fs::read_to_string(format!("{dir}/{f}")).unwrap()));
    }
    render::manifests::Manifests::load(&files, &["v1.13".into(), "v1.14".into()]).unwrap()
}

fn render_machine(m: &render::manifests::Manifests, name: &str) -> render::render::Rendered {
    let mch = m.machine(name).unwrap();
    let (bundle, v) = m.bundle(m.cluster_of(mch));
    let inputs = m.inputs(mch, &bundle, v);
    let c = Contract::parse(&m.cluster_of(mch).spec.version_contract).unwrap();
    render(&inputs, c).unwrap()
}

/// ADR 0057: `spec.kubernetesVersion` is vX.Y.Z and images add their own `v`; trimming once
/// means no component image is ever `...:vv1.36.4`.
#[test]
fn adr0057_component_images_never_get_vv() {
    for contract in ["v1.13", "v1.14"] {
        let m = example(contract);
        for name in ["cp1", "w1"] {
            let out = render_machine(&m, name);
            assert!(!out.text.contains(":vv"), "{contract} {name}: {}", out.text);
            assert!(out.text.contains("ghcr.io/siderolabs/kubelet:v1.36.4"), "{contract} {name}");
        }
    }
    assert_eq!(render::render::k8s_version("v1.36.4"), "1.36.4");
    assert_eq!(render::render::k8s_version("1.36.4"), "1.36.4");
}

/// ADR 0024: the render filters a copy; no patch object changes, byte for byte.
#[test]
fn adr0024_render_never_modifies_a_patch() {
    for contract in ["v1.13", "v1.14"] {
        let mut m = example(contract);
        m.clusters[0].status = Some(TalosClusterStatus {
            cni: Some(CniStatus { kube_proxy: Some(KubeProxyMode::Replaced), ..Default::default() }),
            conditions: vec![Condition { type_: "CNIHandover".into(), status: "True".into(), ..Default::default() }],
        });
        let before: Vec<String> = m.patches.iter().map(|p| serde_yaml::to_string(p).unwrap()).collect();
        let out = render_machine(&m, "cp1");
        assert!(!out.text.contains("name: cilium"), "{contract}: the handed-over entry is still rendered");
        let after: Vec<String> = m.patches.iter().map(|p| serde_yaml::to_string(p).unwrap()).collect();
        assert_eq!(before, after, "{contract}: a patch changed during the render");
        assert!(before.iter().any(|p| p.contains("cilium")), "the example's patch carries the entry");
    }
}

/// ADR 0024 amendment: the hash folds in CNIHandover=True and status.cni.kubeProxy, and is
/// unchanged for a cluster that has neither (the value below is that of such a cluster: the example
/// cluster, whose secrets Secret has no resourceVersion, read as "0").
#[test]
fn adr0024_desired_inputs_hash_folds_in_the_two_status_values() {
    let mut m = example("v1.14");
    let plain = render_machine(&m, "cp1").inputs_hash;
    assert_eq!(plain, "a9571031743a4ac99f77a6246213731d", "the hash of a cluster without either status value changed");
    m.clusters[0].status = Some(TalosClusterStatus {
        cni: None,
        conditions: vec![Condition { type_: "CNIHandover".into(), status: "False".into(), ..Default::default() }],
    });
    assert_eq!(render_machine(&m, "cp1").inputs_hash, plain, "a False hand-over must not move the hash");
    m.clusters[0].status.as_mut().unwrap().conditions[0].status = "True".into();
    let handed = render_machine(&m, "cp1").inputs_hash;
    assert_ne!(handed, plain);
    m.clusters[0].status.as_mut().unwrap().cni =
        Some(CniStatus { kube_proxy: Some(KubeProxyMode::Enabled), ..Default::default() });
    assert_ne!(render_machine(&m, "cp1").inputs_hash, handed);
}

/// The render is deterministic byte for byte.
#[test]
fn render_is_deterministic() {
    for contract in ["v1.13", "v1.14"] {
        let m = example(contract);
        let a = render_machine(&m, "cp2").text;
        let b = render_machine(&example(contract), "cp2").text;
        assert_eq!(a, b);
    }
}

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// A structural schema (Kubernetes' rule): every object node has a type, and a node without
/// properties keeps unknown fields only when it says so.
fn structural(path: &str, v: &serde_json::Value, problems: &mut Vec<String>) {
    let Some(obj) = v.as_object() else { return };
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&serde_json::Value::Bool(true));
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&serde_json::Value::Bool(true));
    if !obj.contains_key("type") && !preserve && !int_or_string {
        problems.push(format!("{path}: no type"));
    }
    if obj.get("additionalProperties") == Some(&serde_json::Value::Bool(true)) {
        problems.push(format!("{path}: additionalProperties: true (use x-kubernetes-preserve-unknown-fields)"));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if obj.contains_key(key) && !obj.contains_key("type") {
            problems.push(format!("{path}: {key} without a type"));
        }
    }
    if let Some(props) = obj.get("properties").and_then(|p| p.as_object()) {
        for (k, p) in props {
            structural(&format!("{path}.{k}"), p, problems);
        }
    }
    if let Some(items) = obj.get("items") {
        structural(&format!("{path}[]"), items, problems);
    }
    if let Some(ap) = obj.get("additionalProperties").filter(|a| a.is_object()) {
        structural(&format!("{path}.*"), ap, problems);
    }
}

#[test]
fn crds_deserialize_are_structural_and_accept_the_examples() {
    let crds = render::api::crds();
    assert_eq!(crds.len(), 4);
    let mut problems = vec![];
    let mut schemas = BTreeMap::new();
    for crd in &crds {
        let text = serde_yaml::to_string(crd).unwrap();
        let back: CustomResourceDefinition = serde_yaml::from_str(&text).expect("`ichor crds` output deserializes");
        assert_eq!(&back, crd);
        let version = &crd.spec.versions[0];
        let schema =
            serde_json::to_value(version.schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap();
        structural(&crd.spec.names.kind, &schema, &mut problems);
        schemas.insert(crd.spec.names.kind.clone(), schema);
    }
    assert!(problems.is_empty(), "not structural:\n{}", problems.join("\n"));
    // Every example manifest of ours validates against its CRD's schema.
    let mut checked = 0;
    for contract in ["v1.13", "v1.14"] {
        let dir = format!("{}/../examples/clusters/lab-{contract}", env!("CARGO_MANIFEST_DIR"));
        for f in ["cluster.yaml", "machines.yaml", "patches.yaml"] {
            let text = std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let v: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
                let kind = v["kind"].as_str().unwrap().to_string();
                let validator = jsonschema::validator_for(&schemas[&kind]).unwrap();
                let errors: Vec<String> =
                    validator.iter_errors(&v).map(|e| format!("{e} at {}", e.instance_path())).collect();
                assert!(errors.is_empty(), "{contract}/{f} {kind}: {errors:?}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 14, "{checked}");
    // And a wrong version is refused by the schema, not only by Ichor.
    let mut bad: serde_json::Value = serde_json::from_str(
        &serde_json::to_string(
            &serde_yaml::from_str::<serde_json::Value>(
                &std::fs::read_to_string(format!(
                    "{}/../examples/clusters/lab-v1.14/cluster.yaml",
                    env!("CARGO_MANIFEST_DIR")
                ))
                .unwrap(),
            )
            .unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    bad["spec"]["kubernetesVersion"] = serde_json::json!("1.36");
    assert!(!jsonschema::validator_for(&schemas["TalosCluster"]).unwrap().is_valid(&bad));
}

mod cilium_values {
    use render::cilium::{layered, validate};
    use render::inventory::Inventory;
    use serde_json::json;

    fn keys() -> Inventory {
        Inventory::parse(render::embedded::CILIUM_KEYS.1).unwrap()
    }

    fn check(values: serde_json::Value, replaced: bool) -> Vec<String> {
        validate(&values, &keys(), replaced).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn valid_values_pass() {
        assert_eq!(
            check(json!({"hubble": {"relay": {"enabled": true}}, "operator": {"replicas": 1}}), false),
            Vec::<String>::new()
        );
        assert_eq!(check(json!({"gatewayAPI": {"enabled": true}}), true), Vec::<String>::new());
    }

    #[test]
    fn pinned_keys_are_refused_even_at_their_value_and_say_why() {
        for key in render::cilium::PINNED {
            let parts: Vec<&str> = key.split('.').collect();
            let v = json!({parts[0]: {parts[1]: {parts[2]: "cilium-secrets"}}});
            let r = check(v, true);
            assert_eq!(r.len(), 1, "{key}: {r:?}");
            assert!(r[0].starts_with(&format!("{key}: pinned to cilium-secrets")), "{r:?}");
            assert!(r[0].contains("Role that lets Cilium's service accounts read"), "the refusal says why: {r:?}");
        }
    }

    #[test]
    fn ichor_owned_keys_are_refused() {
        let r = check(
            json!({"kubeProxyReplacement": true, "k8sServiceHost": "10.0.0.1", "ipam": {"mode": "cluster-pool"}, "cgroup": {"hostRoot": "/x"}}),
            true,
        );
        assert_eq!(r.len(), 4, "{r:?}");
        assert!(r.iter().all(|x| x.contains("owned by Ichor")), "{r:?}");
        assert!(r.iter().any(|x| x.starts_with(
            "kubeProxyReplacement: owned by Ichor (kubeProxyReplacement): it follows the kube-proxy mode"
        )));
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_key() {
        let r = check(json!({"hubbel": {"enabled": true}, "hubble": {"relay": {"enabled": "yes"}}}), false);
        assert_eq!(
            r,
            vec![
                "hubbel.enabled: not a key of the Cilium chart's values (check the spelling against the chart's values.yaml)",
                "hubble.relay.enabled: the chart expects boolean, found string \"yes\"",
            ]
        );
    }

    /// The chart's own defaults as a user layer: a value of each leaf's type at each leaf's
    /// path in `rules/cilium/values.1.20.0.defaults` (derived from the chart's values.yaml).
    fn chart_defaults() -> serde_json::Value {
        use render::path::{Path, Seg};
        let mut root = json!({});
        for line in render::embedded::CILIUM_DEFAULT_LEAVES.1.lines().filter(|l| !l.starts_with('#')) {
            let (path, ty) = line.rsplit_once(' ').unwrap();
            let leaf = match ty {
                "string" => json!("x"),
                "integer" => json!(1),
                "number" => json!(0.5),
                "boolean" => json!(true),
                "null" => json!(null),
                "object" => json!({}),
                "array" => json!([]),
                other => panic!("{line}: type {other}"),
            };
            let path = Path::parse(path).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            let mut at = &mut root;
            for seg in &path.segs {
                at = match seg {
                    Seg::Field(k) | Seg::Key(k) | Seg::Name(k) => {
                        if !at.is_object() {
                            *at = json!({});
                        }
                        at.as_object_mut().unwrap().entry(k.clone()).or_insert(json!(null))
                    }
                    Seg::Index(i) => {
                        if !at.is_array() {
                            *at = json!([]);
                        }
                        let a = at.as_array_mut().unwrap();
                        while a.len() <= *i {
                            a.push(json!(null));
                        }
                        &mut a[*i]
                    }
                };
            }
            *at = leaf;
        }
        root
    }

    #[test]
    fn the_charts_own_defaults_pass_less_the_keys_ichor_owns() {
        let mut v = chart_defaults();
        assert!(v["operator"]["nodeSelector"]["kubernetes.io/os"].is_string(), "a label key is read as one key");
        let owned = ["ipam", "cgroup", "k8sServiceHost", "k8sServicePort", "kubeProxyReplacement", "tunnelProtocol"];
        for k in owned {
            v.as_object_mut().unwrap().remove(k);
        }
        v["securityContext"].as_object_mut().unwrap().remove("capabilities");
        // The five `*.secretsNamespace.name` pinned to cilium-secrets.
        for top in v.as_object_mut().unwrap().values_mut() {
            if let Some(m) = top.as_object_mut() {
                m.remove("secretsNamespace");
            }
        }
        // Whole, the defaults are over the size a user's layer may have: checked 12 top-level keys at a time.
        let all = v.as_object().unwrap().clone();
        let keys: Vec<&String> = all.keys().collect();
        for chunk in keys.chunks(12) {
            let part: serde_json::Map<_, _> = chunk.iter().map(|k| ((*k).clone(), all[*k].clone())).collect();
            for replaced in [true, false] {
                let r: Vec<String> = check(json!(part), replaced)
                    .into_iter()
                    .filter(|r| !r.contains("needs kube-proxy replacement"))
                    .collect();
                assert!(r.is_empty(), "the chart's defaults refused (replaced {replaced}): {r:#?}");
            }
        }
    }

    #[test]
    fn the_kubernetes_fields_users_set_most_are_accepted() {
        let user = json!({
            "operator": {
                "replicas": 2,
                "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
                "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
                "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m"}},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}
                ]}}},
                "podAnnotations": {"prometheus.io/scrape": "true"}
            },
            "extraEnv": [{"name": "GODEBUG", "value": "x=1"}],
            "hubble": {
                "enabled": true,
                "relay": {"enabled": true, "nodeSelector": {"kubernetes.io/os": "linux"}},
                "ui": {"enabled": true, "podLabels": {"team": "net"}}
            },
            "securityContext": {"privileged": false, "seLinuxOptions": {"level": "s0", "type": "spc_t"}},
            "extraConfig": {"enable-foo": "true"},
            "podLabels": {"app.kubernetes.io/part-of": "net"},
            "annotations": {"example.com/owner": "team-net"}
        });
        assert_eq!(check(user, true), Vec::<String>::new());
    }

    #[test]
    fn a_typo_in_the_charts_structure_is_one_refusal() {
        let cases = [
            (json!({"hubbel": {"enabled": true}}), "hubbel.enabled: not a key"),
            (json!({"operator": {"replicsa": 2}}), "operator.replicsa: not a key"),
            (json!({"hubble": {"relay": {"enabeld": true}}}), "hubble.relay.enabeld: not a key"),
            (json!({"livenessProbe": {"periodSecond": 3}}), "livenessProbe.periodSecond: not a key"),
            (json!({"nodeSelector": "linux"}), "nodeSelector: the chart expects object"),
            (
                json!({"securityContext": {"capabilities": {"ciliumAgent": ["SYS_MODULE"]}}}),
                "securityContext.capabilities",
            ),
        ];
        for (v, want) in cases {
            let r = check(v.clone(), true);
            assert_eq!(r.len(), 1, "{v}: {r:?}");
            assert!(r[0].starts_with(want), "{v}: {r:?}");
        }
    }

    #[test]
    fn derive_opens_label_maps_named_fields_and_lists_without_items() {
        use render::cilium::{OpenField, derive_keys};
        let schema = r#"{"properties": {
            "agent": {"type": "object", "properties": {
                "enabled": {"type": "boolean"},
                "resources": {"type": "object", "properties": {"limits": {"type": "object"}}},
                "labels": {"type": "object", "properties": {"kubernetes.io/os": {"type": "string"}}},
                "extra": {"type": "array"},
                "ports": {"type": "array", "items": {"type": "object", "properties": {"port": {"type": "integer"}}}},
                "free": {"type": "object"}
            }},
            "sel": {"type": "object", "properties": {"os": {"type": "string"}}}
        }}"#;
        let values = "sel:\n  kubernetes.io/arch: amd64\n";
        let open = [OpenField { name: "resources".into(), reason: "Kubernetes's".into() }];
        let out = derive_keys(schema, Some(values), &open, "test").unwrap();
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        for want in [
            "agent object",
            "agent.enabled boolean",
            "agent.resources object",
            "agent.resources.* any",
            "agent.labels object",
            "agent.labels.* any",
            "agent.extra array",
            "agent.extra[*] any",
            "agent.ports[*].port integer",
            // An object without properties is `any`: nothing below it is checked.
            "agent.free any",
            "sel.* any",
        ] {
            assert!(lines.contains(&want), "{want} missing from {lines:#?}");
        }
        assert!(
            !lines.iter().any(|l| l.starts_with("agent.resources.limits")),
            "nothing below an open node: {lines:#?}"
        );
        let keys = Inventory::parse(&out).unwrap();
        let r: Vec<String> = validate(
            &json!({"agent": {"resources": {"limits": {"cpu": "1"}}, "labels": {"a/b": "c"}, "extra": [1], "free": {"x": {"y": 1}}, "enabeld": true}}),
            &keys,
            true,
        )
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].starts_with("agent.enabeld: not a key"), "{r:?}");
    }

    #[test]
    fn set_key_sets_removes_and_names_what_is_in_the_way() {
        use render::cilium::{SetError, set_key};
        let v = set_key(&json!(null), "hubble.relay.enabled", Some(json!(true))).unwrap();
        assert_eq!(v, json!({"hubble": {"relay": {"enabled": true}}}));
        let v = set_key(&v, r#"nodeSelector["kubernetes.io/os"]"#, Some(json!("linux"))).unwrap();
        assert_eq!(v["nodeSelector"]["kubernetes.io/os"], json!("linux"), "a quoted key is one key");
        let v = set_key(&v, "extraArgs[0]", Some(json!("--a"))).unwrap();
        let v = set_key(&v, "extraArgs[1]", Some(json!("--b"))).unwrap();
        assert_eq!(v["extraArgs"], json!(["--a", "--b"]), "one past the end appends");
        assert!(matches!(set_key(&v, "extraArgs[5]", Some(json!(1))), Err(SetError::Index { len: 2, .. })));
        let e = set_key(&v, "hubble.relay.enabled.x", Some(json!(1))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "hubble.relay.enabled.x: hubble.relay.enabled is boolean, not a mapping; set hubble.relay.enabled itself, or remove it first with hubble.relay.enabled-"
        );
        assert!(matches!(set_key(&v, "a[", None), Err(SetError::Path { .. })));
        let v = set_key(&v, "hubble.relay.enabled", None).unwrap();
        assert!(v.get("hubble").is_none(), "a mapping the removal empties goes too: {v}");
        assert_eq!(set_key(&v, "absent.key", None).unwrap(), v, "removing what is not there changes nothing");
    }

    #[test]
    fn leaf_lines_mark_the_keys_ichor_owns() {
        let text = render::cilium::leaf_lines(&layered(&json!({"hubble": {"enabled": true}}), true, "vxlan"));
        assert!(text.contains("hubble.enabled: true\n"), "{text}");
        assert!(text.contains("kubeProxyReplacement: true  # owned by Ichor\n"), "{text}");
        assert!(text.contains("tls.secretsNamespace.name: \"cilium-secrets\"  # owned by Ichor\n"), "{text}");
        assert!(text.contains("rollOutCiliumPods: true\n"), "Ichor's defaults are the user's to change: {text}");
    }

    #[test]
    fn size_cap() {
        let big: serde_json::Map<String, serde_json::Value> =
            (0..3000).map(|i| (format!("k{i}"), json!("x".repeat(20)))).collect();
        let r = check(json!({"podAnnotations": big}), false);
        assert!(r.iter().any(|x| x.starts_with("(values): ") && x.contains("over the 65536-byte limit")), "{r:?}");
    }

    #[test]
    fn features_that_need_kube_proxy_replacement() {
        let r = check(json!({"gatewayAPI": {"enabled": true}, "ingressController": {"enabled": true}}), false);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].starts_with("gatewayAPI.enabled: Cilium's Gateway API needs kube-proxy replacement"));
    }

    #[test]
    fn job_name_hash_follows_the_values_not_their_key_order() {
        use render::cilium::values_hash;
        let a = layered(&json!({"hubble": {"enabled": true, "relay": {"enabled": true}}}), true, "vxlan");
        let b = layered(&json!({"hubble": {"relay": {"enabled": true}, "enabled": true}}), true, "vxlan");
        assert_eq!(values_hash(&a), values_hash(&b));
        assert_ne!(
            values_hash(&a),
            values_hash(&layered(&json!({"hubble": {"enabled": true, "relay": {"enabled": true}}}), false, "vxlan"))
        );
        assert_eq!(values_hash(&a).len(), 10);
    }

    #[test]
    fn owned_keys_win_over_the_user_and_defaults_lose_to_it() {
        let v = layered(&json!({"rollOutCiliumPods": false, "kubeProxyReplacement": false}), true, "geneve");
        assert_eq!(v["rollOutCiliumPods"], json!(false), "the user's layer overrides a default");
        assert_eq!(v["kubeProxyReplacement"], json!(true), "Ichor's keys are applied last");
        assert_eq!(v["k8sServicePort"], json!(7445));
        assert_eq!(v["tunnelProtocol"], json!("geneve"));
        assert_eq!(v["tls"]["secretsNamespace"]["name"], json!("cilium-secrets"));
    }
}

/// `Config::with_paths` changes exactly the named paths (set from the desired config, removed
/// where it has none, a document it adds added with its identity) and keeps everything else.
#[test]
fn with_paths_changes_only_the_named_paths() {
    use render::config::Config;
    use render::path::Path;
    let running = Config::parse(
        "version: v1alpha1\nmachine:\n  kubelet:\n    image: k:1\n  env:\n    A: a\n---\napiVersion: v1alpha1\nkind: KubeSchedulerConfig\nimage: s:1\n",
    )
    .unwrap();
    let desired = Config::parse(
        "version: v1alpha1\nmachine:\n  kubelet:\n    image: k:2\n---\napiVersion: v1alpha1\nkind: KubeSchedulerConfig\nimage: s:2\n---\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: a:2\n",
    )
    .unwrap();
    let p = |s: &str| Path::parse(s).unwrap();
    let out = running.with_paths(&desired, &[p("machine.kubelet.image"), p("KubeAPIServerConfig.image")]);
    let changed: Vec<String> = render::diff::changes(&running, &out).iter().map(|c| c.path.to_string()).collect();
    assert_eq!(changed, ["KubeAPIServerConfig.image", "machine.kubelet.image"]);
    let text = out.to_yaml();
    assert!(
        text.contains("kind: KubeAPIServerConfig") && text.contains("A: a") && text.contains("image: s:1"),
        "{text}"
    );
    let reparsed = Config::parse(&text).unwrap();
    assert!(render::diff::changes(&out, &reparsed).is_empty());
    // A path the desired config lacks is removed.
    let out = running.with_paths(&desired, &[p("machine.env.A")]);
    let changed: Vec<String> = render::diff::changes(&running, &out).iter().map(|c| c.path.to_string()).collect();
    assert_eq!(changed, ["machine.env.A"]);
}

/// FACTS 8.10 / issue 16: a render past Talos's size limit is an error naming the patch that
/// made it grow past it, not the first or the last patch.
#[test]
fn a_config_grown_past_the_limit_names_the_patch_that_grew_it() {
    let dir = format!("{}/../examples/clusters/lab-v1.14", env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    for f in ["cluster.yaml", "machines.yaml", "patches.yaml", "secrets.yaml"] {
        files.push((f.to_string(), std::fs::read_to_string(format!("{dir}/{f}")).unwrap()));
    }
    let big = |name: &str, order: u32| {
        let line = "x".repeat(1000);
        let contents: String = (0..6000).map(|_| format!("        # {line}\n")).collect();
        format!(
            "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosConfigPatch\nmetadata:\n  name: {name}\n  namespace: ichor-system\nspec:\n  clusterRef:\n    name: lab\n  order: {order}\n  selector:\n    roles: []\n  patch: |\n    apiVersion: v1alpha1\n    kind: KubeInlineManifestConfig\n    name: {name}\n    contents: |\n{contents}"
        )
    };
    files.push(("big-a.yaml".into(), big("big-a", 90)));
    files.push(("big-b.yaml".into(), big("big-b", 91)));
    let m = render::manifests::Manifests::load(&files, &["v1.14".into()]).unwrap();
    let mch = m.machine("cp1").unwrap();
    let (bundle, v) = m.bundle(m.cluster_of(mch));
    let inputs = m.inputs(mch, &bundle, v);
    let errors = render(&inputs, Contract::parse("v1.14").unwrap()).err().expect("over the limit");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].object, "TalosConfigPatch ichor-system/big-b");
    assert!(errors[0].message.contains("over the 10485760-byte limit"), "{}", errors[0].message);
}

/// Issue 50, finding 9: a typo inside a TalosConfigPatch's text (`labelz:` in a KubeNodeConfig)
/// is what the render refuses for every machine the patch selects, naming the patch, the field
/// and the contract; what the admission check keeps is only what names that patch.
#[test]
fn a_typo_in_a_patch_is_a_problem_of_that_patch_naming_the_field_and_the_contract() {
    let mut m = example("v1.14");
    let typo: render::api::TalosConfigPatch = serde_yaml::from_str(
        "apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosConfigPatch\nmetadata:\n  name: team-label\n  namespace: ichor-system\nspec:\n  clusterRef:\n    name: lab\n  order: 50\n  patch: |\n    apiVersion: v1alpha1\n    kind: KubeNodeConfig\n    labelz:\n      team: storage\n",
    )
    .unwrap();
    m.patches.push(typo);
    let c = render::classify::Classifier::new(&render::classify::RuleSet::embedded()).unwrap();
    let problems = render::machine::problems_of(&m, "lab", "TalosConfigPatch ichor-system/team-label", &c);
    assert!(!problems.is_empty(), "the typo is not found");
    assert!(problems.iter().all(|p| p.starts_with("TalosConfigPatch ichor-system/team-label")), "{problems:?}");
    let text = problems.join("\n");
    eprintln!("{text}");
    assert!(text.contains("labelz") && text.contains("v1.14"), "{text}");
    // The same cluster without the typo has no problem of that name.
    m.patches.pop();
    assert!(render::machine::problems_of(&m, "lab", "TalosConfigPatch ichor-system/team-label", &c).is_empty());
}
