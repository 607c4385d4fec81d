//! A folder of manifests, as a user would `kubectl apply` them: Ichor's custom resources plus
//! the Secret with each cluster's Talos secrets bundle.
//!
//! Start at `Manifests::load` (file names and texts in; every problem out, each naming the
//! file, the object and the field), then `Manifests::inputs` (what one machine's render reads).

use crate::api::*;
use crate::render::{Inputs, object_name};
use crate::secrets::Bundle;
use base64::Engine as _;
use serde_yaml::Value;
use std::collections::BTreeMap;

/// The key of the Secret that holds the bundle.
pub const BUNDLE_KEY: &str = "bundle.yaml";

/// One problem of the manifests: the file, the object and field at fault, and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ManifestError {
    /// The file and line, the object and field at fault, and what to do.
    pub message: String,
}

/// A machine name the manifests do not have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no TalosMachine {name:?} in the manifests; machines: {known}")]
pub struct UnknownMachine {
    /// The machine asked for.
    pub name: String,
    /// The machines the manifests have, joined.
    pub known: String,
}

#[derive(Default)]
/// The custom resources and secrets of a folder of manifests (or of the objects the API returned), checked together.
pub struct Manifests {
    /// The TalosClusters.
    pub clusters: Vec<TalosCluster>,
    /// The TalosMachines.
    pub machines: Vec<TalosMachine>,
    /// The TalosConfigPatches.
    pub patches: Vec<TalosConfigPatch>,
    /// The TalosOperations.
    pub operations: Vec<TalosOperation>,
    /// Secret `namespace/name` -> (resourceVersion, data).
    pub secrets: BTreeMap<String, (String, BTreeMap<String, String>)>,
}

/// Names and counts only: a secret's data never reaches a debug print.
impl std::fmt::Debug for Manifests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manifests")
            .field("clusters", &self.clusters.len())
            .field("machines", &self.machines.len())
            .field("patches", &self.patches.len())
            .field("operations", &self.operations.len())
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn ns_name(m: &kube_core::ObjectMeta) -> String {
    format!("{}/{}", m.namespace.clone().unwrap_or_else(|| "default".into()), m.name.clone().unwrap_or_default())
}

fn version_ok(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else { return false };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

impl Manifests {
    /// Loads `(file, text)` pairs. `contracts` are the contract names the project knows.
    pub fn load(files: &[(String, String)], contracts: &[String]) -> Result<Manifests, Vec<ManifestError>> {
        Manifests::load_texts(files, contracts)
            .map_err(|problems| problems.into_iter().map(|message| ManifestError { message }).collect())
    }

    /// The manifests from objects already decoded (as the controller reads them from the API,
    /// which validated their fields): no YAML between, and the same checks as `load` after it.
    pub fn from_objects(
        clusters: Vec<TalosCluster>,
        machines: Vec<TalosMachine>,
        patches: Vec<TalosConfigPatch>,
        secrets: &[k8s_openapi::api::core::v1::Secret],
        contracts: &[String],
    ) -> Result<Manifests, Vec<ManifestError>> {
        let mut m = Manifests { clusters, machines, patches, ..Manifests::default() };
        let mut errors = vec![];
        for s in secrets {
            let key = ns_name(&s.metadata);
            let rv = s.metadata.resource_version.clone().unwrap_or_else(|| "0".into());
            let mut data: BTreeMap<String, String> = s.string_data.clone().unwrap_or_default();
            for (k, v) in s.data.iter().flatten() {
                match String::from_utf8(v.0.clone()) {
                    Ok(text) => {
                        data.insert(k.clone(), text);
                    }
                    Err(_) => errors.push(format!("Secret {key}: data.{k} is not UTF-8")),
                }
            }
            m.secrets.insert(key, (rv, data));
        }
        m.validate(contracts, &mut errors);
        if errors.is_empty() {
            Ok(m)
        } else {
            Err(errors.into_iter().map(|message| ManifestError { message }).collect())
        }
    }

    fn load_texts(files: &[(String, String)], contracts: &[String]) -> Result<Manifests, Vec<String>> {
        let mut m = Manifests::default();
        let mut errors = vec![];
        for (file, text) in files {
            for (start, chunk) in crate::yaml::split_documents(text) {
                // Bounded, merge keys resolved as kubectl resolves them, tags refused.
                let value: Value = match crate::yaml::parse(&chunk, crate::config::MAX_CONFIG_BYTES) {
                    Ok(v) => v,
                    Err(e) => {
                        let at = e.line.map_or(start, |l| start + l - 1);
                        let what = if e.line.is_some() { "not valid YAML: " } else { "" };
                        errors.push(format!("{file}:{at}: {what}{}", e.message));
                        continue;
                    }
                };
                if value.is_null() {
                    continue;
                }
                let api = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_string();
                let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
                let at = format!("{file}:{start}");
                // Strict field validation, as `kubectl apply` does it: a field the CRD's schema
                // does not know is an error, never silently dropped (`instalDisk`).
                if api == "ichor.maesh.dev/v1alpha1" {
                    let name = value.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("?");
                    for (path, known) in unknown_fields(&kind, &value) {
                        errors.push(format!(
                            "{file}:{start}: {kind} {name}: {path}: unknown field (strict field validation, as kubectl apply does); the fields here are {known}"
                        ));
                    }
                }
                let de = |e: serde_yaml::Error| {
                    let msg = crate::yaml::scrub(&e.to_string());
                    format!("{at}: {kind}: {}", msg.split(" at line ").next().unwrap_or_default())
                };
                match (api.as_str(), kind.as_str()) {
                    ("ichor.maesh.dev/v1alpha1", "TalosCluster") => match serde_yaml::from_value(value) {
                        Ok(v) => m.clusters.push(v),
                        Err(e) => errors.push(de(e)),
                    },
                    ("ichor.maesh.dev/v1alpha1", "TalosMachine") => match serde_yaml::from_value(value) {
                        Ok(v) => m.machines.push(v),
                        Err(e) => errors.push(de(e)),
                    },
                    ("ichor.maesh.dev/v1alpha1", "TalosConfigPatch") => match serde_yaml::from_value(value) {
                        Ok(v) => m.patches.push(v),
                        Err(e) => errors.push(de(e)),
                    },
                    ("ichor.maesh.dev/v1alpha1", "TalosOperation") => match serde_yaml::from_value(value) {
                        Ok(v) => m.operations.push(v),
                        Err(e) => errors.push(de(e)),
                    },
                    ("v1", "Secret") => match secret(&value) {
                        Ok((key, rv, data)) => {
                            m.secrets.insert(key, (rv, data));
                        }
                        Err(e) => errors.push(format!("{at}: Secret: {e}")),
                    },
                    _ => errors.push(format!(
                        "{at}: {api}/{kind} is not one of Ichor's kinds (ichor.maesh.dev/v1alpha1 TalosCluster, TalosMachine, TalosConfigPatch, TalosOperation) nor a v1 Secret"
                    )),
                }
            }
        }
        m.validate(contracts, &mut errors);
        if errors.is_empty() { Ok(m) } else { Err(errors) }
    }

    fn validate(&self, contracts: &[String], errors: &mut Vec<String>) {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for c in &self.clusters {
            let obj = object_name("TalosCluster", &c.metadata);
            *seen.entry(ns_name(&c.metadata)).or_default() += 1;
            if !version_ok(&c.spec.kubernetes_version) {
                errors.push(format!(
                    "{obj}: spec.kubernetesVersion: {:?} is not vX.Y.Z (for example v1.36.4)",
                    c.spec.kubernetes_version
                ));
            }
            if !contracts.contains(&c.spec.version_contract) {
                errors.push(format!(
                    "{obj}: spec.versionContract: unknown contract {:?}: known contracts are {}",
                    c.spec.version_contract,
                    contracts.join(", ")
                ));
            }
            if !c.spec.endpoint.starts_with("https://") {
                errors.push(format!(
                    "{obj}: spec.endpoint: {:?} is not an https URL (for example https://host:6443)",
                    c.spec.endpoint
                ));
            }
            let secret = format!(
                "{}/{}",
                c.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
                c.spec.secrets_ref.name
            );
            match self.secrets.get(&secret) {
                None => errors.push(format!("{obj}: spec.secretsRef: Secret {secret} is not among the manifests")),
                Some((_, data)) => match data.get(BUNDLE_KEY) {
                    None => errors.push(format!("{obj}: spec.secretsRef: Secret {secret} has no key {BUNDLE_KEY}")),
                    Some(text) => {
                        if let Err(es) = Bundle::parse(text) {
                            for e in es {
                                errors.push(format!("{obj}: spec.secretsRef: Secret {secret}, key {BUNDLE_KEY}: {e}"));
                            }
                        }
                    }
                },
            }
        }
        for (name, n) in seen {
            if n > 1 {
                errors.push(format!(
                    "TalosCluster {name}: defined {n} times; cluster names must be unique in a namespace"
                ));
            }
        }
        let cluster_exists = |ns: &Option<String>, name: &str| {
            self.clusters.iter().any(|c| c.metadata.namespace == *ns && c.metadata.name.as_deref() == Some(name))
        };
        for mch in &self.machines {
            if !cluster_exists(&mch.metadata.namespace, &mch.spec.cluster_ref.name) {
                errors.push(format!(
                    "{}: spec.clusterRef.name: no TalosCluster {:?} in namespace {}",
                    object_name("TalosMachine", &mch.metadata),
                    mch.spec.cluster_ref.name,
                    mch.metadata.namespace.clone().unwrap_or_default()
                ));
            }
        }
        for p in &self.patches {
            if !cluster_exists(&p.metadata.namespace, &p.spec.cluster_ref.name) {
                errors.push(format!(
                    "{}: spec.clusterRef.name: no TalosCluster {:?} in namespace {}",
                    object_name("TalosConfigPatch", &p.metadata),
                    p.spec.cluster_ref.name,
                    p.metadata.namespace.clone().unwrap_or_default()
                ));
            }
        }
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for mch in &self.machines {
            *names.entry(mch.metadata.name.clone().unwrap_or_default()).or_default() += 1;
        }
        for (n, k) in names {
            if k > 1 {
                errors.push(format!("TalosMachine {n}: defined {k} times; name machines uniquely"));
            }
        }
    }

    /// The machine of this name.
    pub fn machine(&self, name: &str) -> Result<&TalosMachine, UnknownMachine> {
        self.machines.iter().find(|m| m.metadata.name.as_deref() == Some(name)).ok_or_else(|| UnknownMachine {
            name: name.to_string(),
            known: self.machines.iter().filter_map(|m| m.metadata.name.clone()).collect::<Vec<_>>().join(", "),
        })
    }

    /// The TalosCluster a machine belongs to (checked at load).
    pub fn cluster_of(&self, m: &TalosMachine) -> &TalosCluster {
        self.clusters
            .iter()
            .find(|c| {
                c.metadata.namespace == m.metadata.namespace
                    && c.metadata.name.as_deref() == Some(m.spec.cluster_ref.name.as_str())
            })
            .expect("validated at load")
    }

    /// The bundle and secrets version of a cluster (validated at load).
    pub fn bundle(&self, c: &TalosCluster) -> (Bundle, String) {
        let key =
            format!("{}/{}", c.metadata.namespace.clone().unwrap_or_else(|| "default".into()), c.spec.secrets_ref.name);
        let (rv, data) = &self.secrets[&key];
        (Bundle::parse(&data[BUNDLE_KEY]).expect("validated at load"), rv.clone())
    }

    /// What one machine's render reads: its cluster, itself, its cluster's patches, the bundle.
    pub fn inputs<'a>(&'a self, m: &'a TalosMachine, bundle: &'a Bundle, secrets_version: String) -> Inputs<'a> {
        let cluster = self.cluster_of(m);
        Inputs { cluster, machine: m, patches: self.patches_of(cluster), secrets: bundle, secrets_version }
    }

    /// The cluster's patches (the render selects those of each machine).
    pub fn patches_of(&self, cluster: &TalosCluster) -> Vec<&TalosConfigPatch> {
        self.patches
            .iter()
            .filter(|p| {
                p.metadata.namespace == cluster.metadata.namespace
                    && Some(p.spec.cluster_ref.name.as_str()) == cluster.metadata.name.as_deref()
            })
            .collect()
    }

    /// The resourceVersion of the cluster's secrets Secret (what the inputs hash folds in),
    /// without parsing the bundle.
    pub fn secrets_version(&self, c: &TalosCluster) -> &str {
        let key =
            format!("{}/{}", c.metadata.namespace.clone().unwrap_or_else(|| "default".into()), c.spec.secrets_ref.name);
        self.secrets.get(&key).map(|(rv, _)| rv.as_str()).unwrap_or_default()
    }
}

/// Fields of an object its kind's CRD schema does not have, with the fields it does have there.
pub fn unknown_fields(kind: &str, object: &Value) -> Vec<(String, String)> {
    let Some(crd) = crate::api::crds().into_iter().find(|c| c.spec.names.kind == kind) else { return vec![] };
    let Some(schema) =
        crd.spec.versions.first().and_then(|v| v.schema.as_ref()).and_then(|s| s.open_api_v3_schema.as_ref())
    else {
        return vec![];
    };
    let schema = serde_json::to_value(schema).unwrap_or_default();
    let object = serde_json::to_value(object).unwrap_or_default();
    let mut out = vec![];
    if let Some(top) = object.as_object() {
        for (k, v) in top {
            match k.as_str() {
                "apiVersion" | "kind" | "metadata" => {}
                _ => match schema.get("properties").and_then(|p| p.get(k)) {
                    Some(s) => walk_schema(v, s, k, &mut out),
                    None => out.push((k.clone(), "apiVersion, kind, metadata, spec, status".into())),
                },
            }
        }
    }
    out
}

fn walk_schema(v: &serde_json::Value, schema: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
    if schema.get("x-kubernetes-preserve-unknown-fields").and_then(serde_json::Value::as_bool) == Some(true) {
        return;
    }
    match v {
        serde_json::Value::Object(m) => {
            let Some(props) = schema.get("properties").and_then(serde_json::Value::as_object) else {
                if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                    for (k, x) in m {
                        walk_schema(x, extra, &format!("{path}.{k}"), out);
                    }
                }
                return;
            };
            for (k, x) in m {
                match props.get(k) {
                    Some(s) => walk_schema(x, s, &format!("{path}.{k}"), out),
                    None => out.push((format!("{path}.{k}"), props.keys().cloned().collect::<Vec<_>>().join(", "))),
                }
            }
        }
        serde_json::Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, x) in items.iter().enumerate() {
                    walk_schema(x, s, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

type SecretParts = (String, String, BTreeMap<String, String>);

fn secret(v: &Value) -> Result<SecretParts, String> {
    let meta = v.get("metadata").ok_or("no metadata")?;
    let name = meta.get("name").and_then(Value::as_str).ok_or("metadata.name is missing")?;
    let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("default");
    let rv = meta.get("resourceVersion").and_then(Value::as_str).unwrap_or("0").to_string();
    let mut data = BTreeMap::new();
    if let Some(Value::Mapping(d)) = v.get("stringData") {
        for (k, x) in d {
            data.insert(k.as_str().unwrap_or_default().to_string(), x.as_str().unwrap_or_default().to_string());
        }
    }
    if let Some(Value::Mapping(d)) = v.get("data") {
        for (k, x) in d {
            let key = k.as_str().unwrap_or_default().to_string();
            let raw = x.as_str().unwrap_or_default();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(raw.trim())
                .map_err(|_| format!("{ns}/{name}: data.{key} is not base64"))?;
            data.insert(
                key.clone(),
                String::from_utf8(bytes).map_err(|_| format!("{ns}/{name}: data.{key} is not UTF-8"))?,
            );
        }
    }
    Ok((format!("{ns}/{name}"), rv, data))
}
