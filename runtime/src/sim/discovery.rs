//! Discovery as kube-apiserver serves it, for the in-memory API (`kubeapi`): `/version`, `/api`,
//! `/apis` and each group-version's resource list (verbs, short names, namespaced,
//! subresources), for the core kinds the product and its stand-ins use and for every CRD the
//! API holds (Ichor's are installed from the start, as `ichor install` would). `kubectl` reads
//! these before anything else (`kubectl api-resources`, `kubectl get talosclusters`).
//!
//! Start at `Resource::builtin` and `Resource::from_crd`; the documents are `version`,
//! `api_versions`, `group_list`, `resource_list`, `openapi_v2`, `openapi_root` and
//! `openapi_group_version`,
//! pure functions of the resource table (and, for OpenAPI, the CRDs' schemas).

use serde_json::{Value as Json, json};

/// The Kubernetes version the simulated API says it is.
pub const KUBERNETES_VERSION: (&str, &str, &str) = ("1", "36", "v1.36.4");

/// One resource of the API, as discovery lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// The API group (`""` for the core group).
    pub group: String,
    /// The version served.
    pub version: String,
    /// The plural (`talosclusters`).
    pub plural: String,
    /// The singular (`taloscluster`).
    pub singular: String,
    /// The kind (`TalosCluster`).
    pub kind: String,
    /// Namespaced, or cluster-scoped.
    pub namespaced: bool,
    /// Short names (`tc`).
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// It has a status subresource.
    pub status: bool,
    /// The verbs served (empty: the usual eight).
    pub verbs: Vec<&'static str>,
}

const VERBS: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

impl Resource {
    fn new(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Resource {
        Resource {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: vec![],
            categories: vec![],
            status: false,
            verbs: vec![],
        }
    }

    fn short(mut self, names: &[&str]) -> Resource {
        self.short_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    fn with_status(mut self) -> Resource {
        self.status = true;
        self
    }

    fn verbs(mut self, verbs: &[&'static str]) -> Resource {
        self.verbs = verbs.to_vec();
        self
    }

    /// `group/version`, or `version` for the core group.
    pub fn group_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// The core kinds the product and the stand-ins use, as kube-apiserver lists them.
    pub fn builtin() -> Vec<Resource> {
        vec![
            Resource::new("", "v1", "namespaces", "Namespace", false).short(&["ns"]).with_status(),
            Resource::new("", "v1", "nodes", "Node", false).short(&["no"]).with_status(),
            Resource::new("", "v1", "pods", "Pod", true).short(&["po"]).with_status(),
            Resource::new("", "v1", "configmaps", "ConfigMap", true).short(&["cm"]),
            Resource::new("", "v1", "secrets", "Secret", true),
            Resource::new("", "v1", "serviceaccounts", "ServiceAccount", true).short(&["sa"]),
            Resource::new("", "v1", "services", "Service", true).short(&["svc"]).with_status(),
            Resource::new("", "v1", "events", "Event", true).short(&["ev"]),
            Resource::new("apps", "v1", "daemonsets", "DaemonSet", true).short(&["ds"]).with_status(),
            Resource::new("apps", "v1", "deployments", "Deployment", true).short(&["deploy"]).with_status(),
            Resource::new("batch", "v1", "jobs", "Job", true).with_status(),
            Resource::new("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", true)
                .short(&["pdb"])
                .with_status(),
            Resource::new("coordination.k8s.io", "v1", "leases", "Lease", true),
            Resource::new("events.k8s.io", "v1", "events", "Event", true).short(&["ev"]),
            Resource::new("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", false),
            Resource::new("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", false),
            Resource::new("rbac.authorization.k8s.io", "v1", "roles", "Role", true),
            Resource::new("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", true),
            Resource::new("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", false)
                .verbs(&["create"]),
            Resource::new("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", false)
                .short(&["crd", "crds"])
                .with_status(),
            Resource::new(
                "admissionregistration.k8s.io",
                "v1",
                "validatingwebhookconfigurations",
                "ValidatingWebhookConfiguration",
                false,
            ),
        ]
    }

    /// The resources of a CustomResourceDefinition (as JSON): one per served version.
    pub fn from_crd(crd: &Json) -> Vec<Resource> {
        let s = |p: &str| crd.pointer(p).and_then(Json::as_str).unwrap_or_default().to_string();
        let strings = |p: &str| -> Vec<String> {
            crd.pointer(p)
                .and_then(Json::as_array)
                .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        };
        let versions = crd.pointer("/spec/versions").and_then(Json::as_array).cloned().unwrap_or_default();
        versions
            .iter()
            .filter(|v| v.get("served").and_then(Json::as_bool).unwrap_or(true))
            .map(|v| Resource {
                group: s("/spec/group"),
                version: v.get("name").and_then(Json::as_str).unwrap_or_default().to_string(),
                plural: s("/spec/names/plural"),
                singular: {
                    let singular = s("/spec/names/singular");
                    if singular.is_empty() { s("/spec/names/kind").to_lowercase() } else { singular }
                },
                kind: s("/spec/names/kind"),
                namespaced: s("/spec/scope") != "Cluster",
                short_names: strings("/spec/names/shortNames"),
                categories: strings("/spec/names/categories"),
                status: v.pointer("/subresources/status").is_some(),
                verbs: vec![],
            })
            .collect()
    }
}

/// `/version`.
pub fn version() -> Json {
    let (major, minor, git) = KUBERNETES_VERSION;
    json!({
        "major": major, "minor": minor, "gitVersion": git, "gitCommit": "ichor-sim", "gitTreeState": "clean",
        "buildDate": "2026-11-30T00:00:00Z", "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64",
    })
}

/// `/api`: the core group's versions.
pub fn api_versions() -> Json {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
}

/// `/apis`: every named group with its versions, in first-seen order.
pub fn group_list(resources: &[Resource]) -> Json {
    let mut groups: Vec<(String, Vec<String>)> = vec![];
    for r in resources.iter().filter(|r| !r.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, vs)) if !vs.contains(&r.version) => vs.push(r.version.clone()),
            Some(_) => {}
            None => groups.push((r.group.clone(), vec![r.version.clone()])),
        }
    }
    let groups: Vec<Json> = groups
        .iter()
        .map(|(g, vs)| {
            let versions: Vec<Json> =
                vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/api/v1` or `/apis/G/V`: the group-version's resources and their subresources; `None`
/// when nothing is served there.
pub fn resource_list(resources: &[Resource], group: &str, version: &str) -> Option<Json> {
    let mut list = vec![];
    for r in resources.iter().filter(|r| r.group == group && r.version == version) {
        let verbs: Vec<&str> = if r.verbs.is_empty() { VERBS.to_vec() } else { r.verbs.clone() };
        let mut entry = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": verbs, "storageVersionHash": "",
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        list.push(entry);
        if r.status {
            list.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.plural == "pods" && r.group.is_empty() {
            list.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
        }
    }
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}))
}

/// `/openapi/v3`: where each group-version's document is.
pub fn openapi_root(resources: &[Resource]) -> Json {
    let mut paths = serde_json::Map::new();
    for r in resources {
        let at =
            if r.group.is_empty() { format!("api/{}", r.version) } else { format!("apis/{}/{}", r.group, r.version) };
        paths.insert(at.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{at}?hash=ichor-sim")}));
    }
    json!({"paths": paths})
}

/// The query parameters kube-apiserver documents on a write.
fn write_parameters() -> Json {
    json!([
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}},
    ])
}

/// The component name of a kind's schema (`dev.maesh.ichor.v1alpha1.TalosCluster`).
fn component(r: &Resource) -> String {
    let group: Vec<&str> =
        if r.group.is_empty() { vec!["io", "k8s", "api", "core"] } else { r.group.split('.').rev().collect() };
    format!("{}.{}.{}", group.join("."), r.version, r.kind)
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/G/V`: each resource's paths (every write documents
/// `dryRun`, `fieldManager` and `fieldValidation`, which tells kubectl the server validates
/// fields itself) and, for a CRD, its schema (what `kubectl explain` reads). `schemas` holds
/// each CRD's `openAPIV3Schema` by (group, version, kind).
pub fn openapi_group_version(
    resources: &[Resource],
    schemas: &[((String, String, String), Json)],
    group: &str,
    version: &str,
) -> Option<Json> {
    let here: Vec<&Resource> = resources.iter().filter(|r| r.group == group && r.version == version).collect();
    if here.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    let mut components = serde_json::Map::new();
    let prefix = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    for r in here {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let reference = json!({"$ref": format!("#/components/schemas/{}", component(r))});
        let op = |action: &str| {
            json!({
                "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
                "parameters": write_parameters(),
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}},
            })
        };
        let base = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{prefix}/{}", r.plural)
        };
        paths.insert(
            base.clone(),
            json!({"post": op("post"), "get": {"x-kubernetes-action": "list", "x-kubernetes-group-version-kind": gvk}}),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
        let schema = schemas
            .iter()
            .find(|((g, v, k), _)| *g == r.group && *v == r.version && *k == r.kind)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        let mut schema = schema;
        schema["x-kubernetes-group-version-kind"] = json!([gvk]);
        components.insert(component(r), schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION.2},
        "paths": paths,
        "components": {"schemas": components},
    }))
}

/// A foreign namespaced CRD as its project installs it: no status subresource, a schema that
/// keeps every field, the printer columns given.
fn foreign_crd(
    group: &str,
    version: &str,
    kind: &str,
    singular: &str,
    plural: &str,
    short: &[&str],
    columns: Json,
) -> Json {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"kind": kind, "listKind": format!("{kind}List"), "plural": plural,
                      "singular": singular, "shortNames": short},
            "versions": [{
                "name": version, "served": true, "storage": true,
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    })
}

/// Argo CD's Application CRD, as the Argo CD stand-in installs it (no status subresource, as
/// Argo CD's own; its schema keeps every field).
pub fn argo_cd_application_crd() -> Json {
    let columns = json!([
        {"name": "Sync Status", "type": "string", "jsonPath": ".status.sync.status"},
        {"name": "Health Status", "type": "string", "jsonPath": ".status.health.status"},
    ]);
    foreign_crd("argoproj.io", "v1alpha1", "Application", "application", "applications", &["app", "apps"], columns)
}

/// Cilium's CiliumNetworkPolicy CRD (cilium.io/v2), as the chart installs it: what tells Ichor
/// the API serves the policies its namespace is locked down with.
pub fn cilium_network_policy_crd() -> Json {
    let (kind, singular, plural) = ("CiliumNetworkPolicy", "ciliumnetworkpolicy", "ciliumnetworkpolicies");
    foreign_crd("cilium.io", "v2", kind, singular, plural, &["cnp", "ciliumnp"], json!([]))
}

/// `/openapi/v2`: one Swagger 2.0 document of every resource (older clients and tools read it):
/// each CRD's schema under `definitions`, with its kind, and each resource's paths.
pub fn openapi_v2(resources: &[Resource], schemas: &[((String, String, String), Json)]) -> Json {
    let mut paths = serde_json::Map::new();
    let mut definitions = serde_json::Map::new();
    for r in resources {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let prefix =
            if r.group.is_empty() { format!("/api/{}", r.version) } else { format!("/apis/{}/{}", r.group, r.version) };
        let base = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{prefix}/{}", r.plural)
        };
        let op = |action: &str| json!({"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk, "parameters": write_parameters()});
        paths.insert(base.clone(), json!({"post": op("post"), "get": op("list")}));
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
        let mut schema = schemas
            .iter()
            .find(|((g, v, k), _)| *g == r.group && *v == r.version && *k == r.kind)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| json!({"type": "object"}));
        schema["x-kubernetes-group-version-kind"] = json!([gvk]);
        definitions.insert(component(r), schema);
    }
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION.2},
           "paths": paths, "definitions": definitions})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ichor() -> Vec<Resource> {
        render::api::crds().iter().flat_map(|c| Resource::from_crd(&serde_json::to_value(c).unwrap())).collect()
    }

    #[test]
    fn ichors_crds_are_listed_with_their_short_names_and_status() {
        let all: Vec<Resource> = Resource::builtin().into_iter().chain(ichor()).collect();
        let list = resource_list(&all, "ichor.maesh.dev", "v1alpha1").unwrap();
        let names: Vec<&str> =
            list["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"talosclusters") && names.contains(&"talosclusters/status"), "{names:?}");
        let tc = list["resources"].as_array().unwrap().iter().find(|r| r["name"] == "talosclusters").unwrap();
        assert_eq!((tc["kind"].as_str(), tc["namespaced"].as_bool()), (Some("TalosCluster"), Some(true)));
        assert_eq!(tc["shortNames"], json!(["tc"]));
        let groups = group_list(&all);
        assert!(groups["groups"].as_array().unwrap().iter().any(|g| g["name"] == "ichor.maesh.dev"));
        assert!(resource_list(&all, "nowhere.example", "v1").is_none());
        // Every write documents fieldValidation (kubectl then leaves validation to the server)
        // and the CRD's schema carries its kind (what kubectl explain looks up).
        let schemas =
            vec![(("ichor.maesh.dev".into(), "v1alpha1".into(), "TalosCluster".into()), json!({"type": "object"}))];
        let doc = openapi_group_version(&all, &schemas, "ichor.maesh.dev", "v1alpha1").unwrap();
        let patch =
            &doc["paths"]["/apis/ichor.maesh.dev/v1alpha1/namespaces/{namespace}/talosclusters/{name}"]["patch"];
        assert!(patch["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "fieldValidation"), "{patch}");
        let schema = &doc["components"]["schemas"]["dev.maesh.ichor.v1alpha1.TalosCluster"];
        assert_eq!(schema["x-kubernetes-group-version-kind"][0]["kind"], "TalosCluster");
        assert!(openapi_root(&all)["paths"]["apis/ichor.maesh.dev/v1alpha1"]["serverRelativeURL"].is_string());
    }
}
