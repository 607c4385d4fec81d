//! Cilium values: the three layers, and the one validation function used everywhere.
//!
//! Start at `validate` (the user's layer in; every refusal out, each naming its key) and
//! `layered` (Ichor's defaults, then the user's layer, then the keys Ichor owns). The chart's
//! keys and types come from its values.schema.json, derived once by `ichor cni schema derive`
//! and committed under `rules/cilium/`, so nothing at run time needs the chart.
//! From the "CNI and Cilium" user page and ADR 0066.

use crate::inventory::Inventory;
use crate::path::Path;
use serde_json::{Map, Value, json};

/// 64 KiB: values beyond a few KiB are a mistake, and they travel in a CR and a Job.
pub const MAX_VALUES_BYTES: usize = 64 * 1024;
/// Where the five pinned `*.secretsNamespace.name` keys point.
pub const SECRETS_NAMESPACE: &str = "cilium-secrets";
/// The values keys Ichor owns (set per kube-proxy mode and at install); a user layer may not set them.
pub const PINNED: [&str; 5] = [
    "ingressController.secretsNamespace.name",
    "gatewayAPI.secretsNamespace.name",
    "envoyConfig.secretsNamespace.name",
    "bgpControlPlane.secretsNamespace.name",
    "tls.secretsNamespace.name",
];

/// The Kubernetes fields the chart hands whole to its templates (`toYaml`), by name, with why
/// their keys are the user's data: `rules/cilium/open-fields.yaml`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct OpenField {
    /// The field's name wherever it appears in the chart (`nodeSelector`, `resources`).
    pub name: String,
    /// Why its keys are not the chart's.
    pub reason: String,
}

/// Reads `rules/cilium/open-fields.yaml` (a list of `name` and `reason`).
pub fn parse_open_fields(text: &str) -> Result<Vec<OpenField>, crate::inventory::InventoryError> {
    serde_yaml::from_str::<Vec<OpenField>>(text)
        .map_err(|e| crate::inventory::InventoryError::from(format!("not a list of name and reason: {e}")))
}

/// Derives `key type` lines from the chart's values.schema.json, and, with the chart's
/// values.yaml, the free-form maps its defaults show.
///
/// The rule (docs/resources.md, "Cilium values"): the unknown-key check applies to the chart's structure.
/// A node is free-form (open: `path.* any`, `path[*] any`, nothing below it checked) when
/// the schema gives an object no properties, when one of its keys in the schema or in the
/// chart's defaults is not an identifier (a label such as `kubernetes.io/os` is data, not a key
/// of the chart), or when its name is one of `open` (Kubernetes fields handed whole to the
/// templates; Helm validates the rendered objects against Kubernetes's OpenAPI, so a typo there
/// fails the Job with Helm's words). An array without `items` takes any element.
pub fn derive_keys(
    schema_text: &str,
    values_text: Option<&str>,
    open: &[OpenField],
    chart: &str,
) -> Result<String, crate::inventory::InventoryError> {
    derive_key_lines(schema_text, values_text, open, chart).map_err(crate::inventory::InventoryError::from)
}

fn derive_key_lines(
    schema_text: &str,
    values_text: Option<&str>,
    open: &[OpenField],
    chart: &str,
) -> Result<String, String> {
    let schema: Value = serde_json::from_str(schema_text)
        .map_err(|e| format!("line {}, column {}: not JSON: {e}", e.line(), e.column()))?;
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .ok_or("the schema has no top-level properties: is it Cilium's values.schema.json?")?;
    let defaults = match values_text {
        Some(t) => chart_values(t)?,
        None => Value::Null,
    };
    let walker = Walker { open: open.iter().map(|o| o.name.as_str()).collect() };
    let mut out = std::collections::BTreeMap::new();
    for (k, v) in props {
        walker.walk(&seg(k, true), k, v, defaults.get(k), &mut out);
    }
    let mut text = format!(
        "# Keys of the Cilium {chart} chart's values, with their types.\n# Derived from the chart's values.schema.json{} by `ichor cni schema derive`; do not edit by hand.\n# `path.* any` and `path[*] any` mark a free-form map or list (see rules/cilium/open-fields.yaml and the README).\n",
        if values_text.is_some() { " and values.yaml" } else { "" }
    );
    for (k, t) in out {
        text.push_str(&format!("{k} {t}\n"));
    }
    Ok(text)
}

/// Derives `path type` lines of the chart's default values (one per leaf of values.yaml), so a
/// test can validate the chart's own defaults without the chart.
pub fn derive_default_leaves(values_text: &str, chart: &str) -> Result<String, crate::inventory::InventoryError> {
    let defaults = chart_values(values_text).map_err(crate::inventory::InventoryError::from)?;
    let mut ls = vec![];
    leaves(None, &defaults, &mut ls);
    let mut text = format!(
        "# The leaves of the Cilium {chart} chart's default values (values.yaml), with their JSON types.\n# Derived by `ichor cni schema derive --defaults-out`; do not edit by hand.\n"
    );
    for (p, v) in ls {
        let t = match &v {
            Value::Object(_) => "object",
            Value::Array(_) => "array",
            other => json_type(other),
        };
        text.push_str(&format!("{p} {t}\n"));
    }
    Ok(text)
}

/// The chart's values.yaml, read the one bounded way (8 MiB after aliases; the chart's is ~150 KiB).
fn chart_values(text: &str) -> Result<Value, String> {
    let v = crate::yaml::parse(text, 8 << 20).map_err(|e| {
        format!("the chart's values.yaml:{}:{}: {}", e.line.unwrap_or(1), e.col.unwrap_or(1), e.message)
    })?;
    serde_json::to_value(v).map_err(|e| format!("the chart's values.yaml does not convert to JSON: {e}"))
}

fn seg(k: &str, first: bool) -> String {
    if crate::path::is_plain(k) {
        if first { k.to_string() } else { format!(".{k}") }
    } else {
        format!("[{}]", serde_json::to_string(k).unwrap())
    }
}

/// Whether a key reads as one of the chart's keys (an identifier) rather than data.
fn identifier(k: &str) -> bool {
    let mut cs = k.chars();
    cs.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn type_of(v: &Value) -> String {
    match v.get("type") {
        Some(Value::String(t)) if t == "object" && v.get("properties").is_none() => "any".into(),
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => {
            let mut names: Vec<String> = ts
                .iter()
                .filter_map(Value::as_str)
                .map(|t| if t == "object" { "any".into() } else { t.to_string() })
                .collect();
            names.sort();
            names.join("|")
        }
        _ if v.get("properties").is_some() => "object".into(),
        _ => "any".into(),
    }
}

struct Walker<'a> {
    open: Vec<&'a str>,
}

impl Walker<'_> {
    fn is_open(&self, name: &str, v: &Value, default: Option<&Value>) -> bool {
        let label_key = |m: Option<&Map<String, Value>>| m.is_some_and(|m| m.keys().any(|k| !identifier(k)));
        self.open.contains(&name)
            || label_key(v.get("properties").and_then(Value::as_object))
            || label_key(default.and_then(Value::as_object))
    }

    fn walk(
        &self,
        path: &str,
        name: &str,
        v: &Value,
        default: Option<&Value>,
        out: &mut std::collections::BTreeMap<String, String>,
    ) {
        let t = type_of(v);
        out.insert(path.to_string(), t.clone());
        let types: Vec<&str> = t.split('|').collect();
        let object = types.iter().any(|t| matches!(*t, "object" | "any"));
        let array = types.contains(&"array");
        if self.is_open(name, v, default) {
            if object {
                out.insert(format!("{path}.*"), "any".into());
            }
            if array {
                out.insert(format!("{path}[*]"), "any".into());
            }
            return;
        }
        if let Some(props) = v.get("properties").and_then(Value::as_object) {
            for (k, p) in props {
                self.walk(&format!("{path}{}", seg(k, false)), k, p, default.and_then(|d| d.get(k)), out);
            }
        }
        match v.get("items") {
            Some(items) => self.walk(&format!("{path}[*]"), name, items, None, out),
            None if array => {
                out.insert(format!("{path}[*]"), "any".into());
            }
            None => {}
        }
    }
}

/// The keys Ichor owns, with the reason each refusal gives.
fn owned() -> Vec<(&'static str, &'static str)> {
    vec![
        ("ipam.mode", "Talos needs IPAM mode kubernetes"),
        ("securityContext.capabilities", "Talos does not allow SYS_MODULE; Ichor sets the agent's capabilities"),
        ("cgroup", "Talos mounts the cgroup hierarchy itself (autoMount off, hostRoot /sys/fs/cgroup)"),
        ("k8sServiceHost", "Cilium reaches the API server through KubePrism (localhost:7445) on every node"),
        ("k8sServicePort", "Cilium reaches the API server through KubePrism (localhost:7445) on every node"),
        (
            "kubeProxyReplacement",
            "it follows the kube-proxy mode; switch it with `ichor cni kube-proxy replaced|enabled`",
        ),
        ("tunnelProtocol", "chosen at install (--cni-tunnel vxlan|geneve) and kept by Ichor"),
    ]
}

/// A refusal, naming the key at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The key at fault, dotted (`kubeProxyReplacement`).
    pub key: String,
    /// Why it is refused and what to do.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

fn leaves(prefix: Option<&Path>, v: &Value, out: &mut Vec<(Path, Value)>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let p = match prefix {
                    None => Path::root(k),
                    Some(p) => p.child_key(k),
                };
                leaves(Some(&p), x, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                leaves(Some(&prefix.cloned().unwrap_or_default().child_index(i)), x, out);
            }
        }
        _ => {
            if let Some(p) = prefix {
                out.push((p.clone(), v.clone()));
            }
        }
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(expected: &str, v: &Value) -> bool {
    let got = json_type(v);
    expected
        .split('|')
        .any(|t| t == got || t == "any" || (t == "number" && got == "integer") || (t == "object" && got == "object"))
}

/// The one validation of the user's layer (webhook, UI, CLI and controller all call this).
/// `kube_proxy_replaced` is the mode the values will run with.
pub fn validate(user: &Value, keys: &Inventory, kube_proxy_replaced: bool) -> Vec<Refusal> {
    let mut out = vec![];
    let size = serde_json::to_string(user).map(|s| s.len()).unwrap_or(0);
    if size > MAX_VALUES_BYTES {
        out.push(Refusal {
            key: "(values)".into(),
            message: format!("{size} bytes, over the {MAX_VALUES_BYTES}-byte limit: keep only the keys you change"),
        });
    }
    if !user.is_object() && !user.is_null() {
        out.push(Refusal {
            key: "(values)".into(),
            message: format!("the values must be a mapping, found {}", json_type(user)),
        });
        return out;
    }
    let mut ls = vec![];
    leaves(None, user, &mut ls);
    for (p, v) in &ls {
        let shown = p.to_string();
        if let Some(pin) = PINNED.iter().find(|k| shown == **k) {
            out.push(Refusal {
                key: pin.to_string(),
                message: format!(
                    "pinned to {SECRETS_NAMESPACE} and owned by Ichor, so it cannot be set, even to {SECRETS_NAMESPACE}: a value naming another namespace (such as ichor-system) would render a Role that lets Cilium's service accounts read that namespace's Secrets, Ichor's included"
                ),
            });
            continue;
        }
        if let Some((k, why)) = owned()
            .into_iter()
            .find(|(k, _)| shown == *k || shown.starts_with(&format!("{k}.")) || shown.starts_with(&format!("{k}[")))
        {
            out.push(Refusal {
                key: shown.clone(),
                message: format!("owned by Ichor ({k}): {why}; remove it from your values"),
            });
            continue;
        }
        match keys.lookup(p) {
            None => out.push(Refusal {
                key: shown.clone(),
                message: "not a key of the Cilium chart's values (check the spelling against the chart's values.yaml)"
                    .into(),
            }),
            Some(t) if !type_ok(t, v) && !v.is_null() => out.push(Refusal {
                key: shown.clone(),
                message: format!("the chart expects {t}, found {} {v}", json_type(v)),
            }),
            _ => {}
        }
    }
    let get = |path: &[&str]| path.iter().try_fold(user, |v, k| v.get(k));
    if !kube_proxy_replaced {
        for (feature, what) in
            [(["gatewayAPI", "enabled"], "Gateway API"), (["ingressController", "enabled"], "the ingress controller")]
        {
            if get(&feature) == Some(&Value::Bool(true)) {
                out.push(Refusal {
                    key: feature.join("."),
                    message: format!(
                        "Cilium's {what} needs kube-proxy replacement, and this cluster runs kube-proxy: switch first with `ichor cni kube-proxy replaced`"
                    ),
                });
            }
        }
    }
    out
}

fn merge(base: &mut Value, top: &Value) {
    match (base, top) {
        (Value::Object(b), Value::Object(t)) => {
            for (k, v) in t {
                match b.get_mut(k) {
                    Some(x) => merge(x, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, t) => *b = t.clone(),
    }
}

/// A short hash of layered values (canonical JSON: object keys sorted), naming the Job that
/// applies them: the same values give the same Job, so creating it again changes nothing.
pub fn values_hash(values: &Value) -> String {
    use sha2::{Digest, Sha256};
    let canonical = serde_json::to_string(&canonical(values)).unwrap_or_default();
    Sha256::digest(canonical.as_bytes()).iter().take(5).map(|b| format!("{b:02x}")).collect()
}

fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: std::collections::BTreeMap<&String, Value> = m.iter().map(|(k, x)| (k, canonical(x))).collect();
            serde_json::to_value(sorted).unwrap_or(Value::Null)
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// Ichor's defaults, then the user's layer, then the keys Ichor owns (applied last).
pub fn layered(user: &Value, kube_proxy_replaced: bool, tunnel: &str) -> Value {
    // Defaults: agents restart when cilium-config changes, which the kube-proxy switch relies on.
    let mut v = json!({"rollOutCiliumPods": true, "operator": {"rollOutPods": true}});
    if user.is_object() {
        merge(&mut v, user);
    }
    let mut owned = json!({
        "ipam": {"mode": "kubernetes"},
        "securityContext": {"capabilities": {
            "ciliumAgent": ["CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"],
            "cleanCiliumState": ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"]
        }},
        "cgroup": {"autoMount": {"enabled": false}, "hostRoot": "/sys/fs/cgroup"},
        "k8sServiceHost": "localhost",
        "k8sServicePort": 7445,
        "kubeProxyReplacement": kube_proxy_replaced,
        "tunnelProtocol": tunnel,
    });
    for key in PINNED {
        let parts: Vec<&str> = key.split('.').collect();
        let mut cur = &mut owned;
        for p in &parts[..parts.len() - 1] {
            cur = cur.as_object_mut().unwrap().entry(p.to_string()).or_insert_with(|| Value::Object(Map::new()));
        }
        cur.as_object_mut().unwrap().insert(parts[parts.len() - 1].to_string(), json!(SECRETS_NAMESPACE));
    }
    merge(&mut v, &owned);
    v
}

/// Why `set_key` could not set a key of the user's layer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    /// The key does not parse as a dotted path (`hubble.relay.enabled`, `nodeSelector["a/b"]`).
    #[error(
        "{key}: not a key path ({problem}); write it dotted, quoting a key with dots or slashes: nodeSelector[\"kubernetes.io/os\"]"
    )]
    Path {
        /// The key as given.
        key: String,
        /// What the path parser says.
        problem: crate::path::PathError,
    },
    /// A segment meets a value that is not a mapping (or a list, for an index).
    #[error("{key}: {at} is {found}, not a {wanted}; set {at} itself, or remove it first with {at}-")]
    NotContainer {
        /// The key as given.
        key: String,
        /// The part of the key that holds something else.
        at: String,
        /// What it holds (a JSON type).
        found: &'static str,
        /// What the key needs there.
        wanted: &'static str,
    },
    /// An index past the end of a list (one past it appends).
    #[error("{key}: index {index} is past the end of {at} ({len} item(s)); use {len} to append")]
    Index {
        /// The key as given.
        key: String,
        /// The list.
        at: String,
        /// The index asked for.
        index: usize,
        /// The list's length.
        len: usize,
    },
}

/// The user's layer with `key` set to `value`, or removed (`None`; mappings left empty by the
/// removal go too). The layer is not validated here: `validate` judges the result.
pub fn set_key(layer: &Value, key: &str, value: Option<Value>) -> Result<Value, SetError> {
    let path = Path::parse(key).map_err(|problem| SetError::Path { key: key.into(), problem })?;
    let mut out = if layer.is_object() { layer.clone() } else { json!({}) };
    match value {
        Some(v) => {
            let mut at = &mut out;
            let mut shown = String::new();
            for (i, seg) in path.segs.iter().enumerate() {
                let last = i + 1 == path.segs.len();
                let next_is_index = path.segs.get(i + 1).is_some_and(|s| matches!(s, crate::path::Seg::Index(_)));
                let fresh = || if next_is_index { json!([]) } else { json!({}) };
                at = match seg {
                    crate::path::Seg::Index(n) => {
                        let found = json_type(at);
                        let len = at.as_array().map(Vec::len);
                        let Some(a) = at.as_array_mut() else {
                            return Err(SetError::NotContainer { key: key.into(), at: shown, found, wanted: "list" });
                        };
                        let len = len.unwrap_or_default();
                        if *n > len {
                            return Err(SetError::Index { key: key.into(), at: shown, index: *n, len });
                        }
                        if *n == len {
                            a.push(if last { Value::Null } else { fresh() });
                        }
                        &mut a[*n]
                    }
                    crate::path::Seg::Field(k) | crate::path::Seg::Key(k) | crate::path::Seg::Name(k) => {
                        if at.is_null() {
                            *at = json!({});
                        }
                        let found = json_type(at);
                        let Some(m) = at.as_object_mut() else {
                            return Err(SetError::NotContainer {
                                key: key.into(),
                                at: shown,
                                found,
                                wanted: "mapping",
                            });
                        };
                        m.entry(k.clone()).or_insert_with(|| if last { Value::Null } else { fresh() })
                    }
                };
                path_prefix(&path, i, &mut shown);
            }
            *at = v;
        }
        None => remove(&mut out, &path.segs),
    }
    Ok(out)
}

fn path_prefix(path: &Path, upto: usize, out: &mut String) {
    *out = Path { segs: path.segs[..=upto].to_vec() }.to_string();
}

/// Removes the value at `segs`; a mapping the removal leaves empty goes too.
fn remove(v: &mut Value, segs: &[crate::path::Seg]) {
    use crate::path::Seg;
    let Some((first, rest)) = segs.split_first() else { return };
    match (first, v) {
        (Seg::Field(k) | Seg::Key(k) | Seg::Name(k), Value::Object(m)) => {
            if rest.is_empty() {
                m.remove(k);
            } else if let Some(child) = m.get_mut(k) {
                remove(child, rest);
                if child.as_object().is_some_and(Map::is_empty) {
                    m.remove(k);
                }
            }
        }
        (Seg::Index(i), Value::Array(a)) if *i < a.len() => {
            if rest.is_empty() {
                a.remove(*i);
            } else {
                remove(&mut a[*i], rest);
            }
        }
        _ => {}
    }
}

/// Layered values as one line per leaf (`hubble.relay.enabled: true`, the value as JSON), in
/// path order, each key Ichor owns marked `# owned by Ichor`: what `ichor cni values diff`
/// compares, so a change reads as the lines it moves.
pub fn leaf_lines(values: &Value) -> String {
    let mut ls = vec![];
    leaves(None, values, &mut ls);
    let mut lines: Vec<String> = ls
        .iter()
        .map(|(p, v)| {
            let shown = p.to_string();
            let ours = PINNED.contains(&shown.as_str())
                || owned().iter().any(|(k, _)| {
                    shown == *k || shown.starts_with(&format!("{k}.")) || shown.starts_with(&format!("{k}["))
                });
            format!("{shown}: {v}{}\n", if ours { "  # owned by Ichor" } else { "" })
        })
        .collect();
    lines.sort();
    lines.concat()
}
