//! Talos's config patching, on YAML values: loading a patch, `$patch: delete`, the strategic
//! merge and its keyed lists, as `configpatcher.Apply` does it (FACTS 8.1-8.5).
//!
//! Start at `Patch::load` (one TalosConfigPatch's text: its documents with their lines, or a
//! JSON 6902 patch), then `apply` (into a config's documents). Every error is a `PatchError`
//! naming the document of the patch (its line, kind and name) and the field; the caller adds
//! the patch object. Where Ichor deliberately differs from a Talos version (v1.13's delete of
//! a missing document), `apply` returns a warning saying so.

use crate::vocab::Contract;
use serde_yaml::Value;
use std::fmt;

/// Where in a patch a problem is: the document (its first line in the patch, kind, name) and
/// the field path inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchError {
    /// The document's first line in the patch (1-based).
    pub line: usize,
    /// The document, as `kind name`.
    pub document: String,
    /// The field path inside the document (empty for the document itself).
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for PatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: document {}", self.line, self.document)?;
        if !self.field.is_empty() {
            write!(f, ", field {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// One document of a patch.
#[derive(Clone, Debug)]
pub struct PatchDoc {
    /// First line of the document in the patch text (1-based).
    pub line: usize,
    /// The document, as YAML.
    pub value: Value,
}

/// A patch as Talos's `LoadPatch` sees it.
#[derive(Clone, Debug)]
pub enum Patch {
    /// Config documents, strategic merge.
    Strategic(Vec<PatchDoc>),
    /// An RFC 6902 list of operations.
    Json6902 {
        /// Its first line in the patch text.
        line: usize,
    },
}

use crate::config::V1ALPHA1_KEYS;

/// The identity of a document: kind and name, `None` kind for the v1alpha1 document.
pub type DocId = (Option<String>, Option<String>);

/// A document's identity (kind and name).
pub fn id_of(d: &Value) -> DocId {
    let kind = d.get("kind").and_then(Value::as_str).map(str::to_string);
    let name = d.get("name").and_then(Value::as_str).map(str::to_string);
    (kind.clone(), if kind.is_some() { name } else { None })
}

/// How a document is named in messages: `v1alpha1`, `KubeProxyConfig`, `LinkConfig/eth0`.
pub fn describe(id: &DocId) -> String {
    match id {
        (None, _) => "v1alpha1".into(),
        (Some(k), None) => k.clone(),
        (Some(k), Some(n)) => format!("{k}/{n}"),
    }
}

/// The path prefix of a document's fields (`KubeProxyConfig`, `LinkConfig[eth0]`).
pub fn doc_path(id: &DocId) -> String {
    match id {
        (None, _) => String::new(),
        (Some(k), None) => k.clone(),
        (Some(k), Some(n)) => format!("{k}[{n}]"),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

impl Patch {
    /// Loads a patch's text: bounded YAML, each document checked for what Talos's strict
    /// loader requires (a `kind` with an `apiVersion`, or the v1alpha1 keys), v1.13's
    /// refusal of one document twice.
    pub fn load(text: &str, contract: Contract) -> Result<Patch, Vec<PatchError>> {
        let mut docs = vec![];
        let mut errors = vec![];
        for (start, chunk) in crate::yaml::split_documents(text) {
            let value = match crate::yaml::parse(&chunk, crate::config::MAX_CONFIG_BYTES) {
                Ok(v) => v,
                Err(e) => {
                    errors.push(PatchError {
                        line: e.line.map_or(start, |l| start + l - 1),
                        document: "?".into(),
                        field: String::new(),
                        message: format!("not valid YAML: {}", e.message),
                    });
                    continue;
                }
            };
            let line =
                start + chunk.lines().position(|l| !l.trim().is_empty() && !l.trim().starts_with('#')).unwrap_or(0);
            match value {
                Value::Null => {}
                Value::Sequence(_) if docs.is_empty() => return Ok(Patch::Json6902 { line }),
                Value::Mapping(_) => docs.push(PatchDoc { line, value }),
                _ => errors.push(PatchError {
                    line,
                    document: "?".into(),
                    field: String::new(),
                    message: "a patch document must be a mapping (a Talos config document)".into(),
                }),
            }
        }
        let mut seen: Vec<(DocId, usize)> = vec![];
        for d in &docs {
            let id = id_of(&d.value);
            let api = d.value.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            let err =
                |message: String| PatchError { line: d.line, document: describe(&id), field: String::new(), message };
            match &id.0 {
                Some(kind) if api.is_empty() => errors.push(err(format!(
                    "missing apiVersion: Talos refuses a document without one; add `apiVersion: v1alpha1` above `kind: {kind}`"
                ))),
                None if !V1ALPHA1_KEYS.iter().any(|k| d.value.get(*k).is_some()) => errors.push(err(
                    "missing kind: a document needs `apiVersion` and `kind`, or is the v1alpha1 document (with machine, cluster, debug, persist or version)".into(),
                )),
                _ => {}
            }
            // v1.14 loads patches with duplicates allowed (applied in order); v1.13 does not.
            if contract < V114 && id.0.is_some() && !is_delete(&d.value) {
                if let Some((_, first)) = seen.iter().find(|(s, _)| s == &id) {
                    errors.push(err(format!(
                        "duplicate document {api}/{} is not allowed (line {}); Talos {contract} takes each document once per patch (first at line {first}): merge them, or use two patches",
                        describe(&id),
                        d.line
                    )));
                } else {
                    seen.push((id.clone(), d.line));
                }
            }
        }
        if errors.is_empty() { Ok(Patch::Strategic(docs)) } else { Err(errors) }
    }
}

const V114: Contract = Contract { major: 1, minor: 14 };

/// Whether a value is a `$patch: delete` directive.
pub fn is_delete(v: &Value) -> bool {
    v.get("$patch").and_then(Value::as_str) == Some("delete")
}

/// A `$patch: delete` found in a patch document.
#[derive(Clone, Debug, PartialEq)]
enum Delete {
    /// Remove the field or map key at this path.
    Key(Vec<String>),
    /// Remove the first element of the list at this path whose `key` reads `value`.
    Item { list: Vec<String>, key: String, value: String },
}

fn path_text(p: &[String]) -> String {
    p.join(".")
}

/// Takes the `$patch: delete` selectors out of a document's body (Talos's decoder/delete.go):
/// the mapping holding one is removed, and parents left empty with it.
fn extract_deletes(v: &mut Value, path: &mut Vec<String>, in_list: bool, out: &mut Vec<Delete>) -> Result<(), String> {
    match v {
        Value::Mapping(m) => {
            let keys: Vec<Value> = m.keys().cloned().collect();
            for k in keys {
                let key = crate::yaml::key_text(&k);
                let child = m.get_mut(&k).expect("key listed above");
                if is_delete(child) {
                    if in_list {
                        return Err(format!(
                            "cannot delete an inner key in '{}'",
                            path_text(&[path.clone(), vec![key]].concat())
                        ));
                    }
                    path.push(key);
                    out.push(Delete::Key(path.clone()));
                    path.pop();
                    m.remove(&k);
                    continue;
                }
                let was_empty = is_empty_collection(child);
                path.push(key);
                extract_deletes(child, path, in_list, out)?;
                path.pop();
                if !was_empty && is_empty_collection(child) {
                    m.remove(&k);
                }
            }
        }
        Value::Sequence(items) => {
            let mut keep = vec![];
            for mut item in std::mem::take(items) {
                if is_delete(&item) {
                    let sel = item.as_mapping().and_then(|m| {
                        m.iter()
                            .find(|(k, _)| k.as_str() != Some("$patch"))
                            .map(|(k, v)| (crate::yaml::key_text(k), scalar_text(v)))
                    });
                    match sel {
                        Some((key, value)) => out.push(Delete::Item { list: path.clone(), key, value }),
                        None => {
                            return Err(format!(
                                "no key:val found in sequence node at '{}': a list item to delete names the element, for example `- {{name: x, $patch: delete}}`",
                                path_text(path)
                            ));
                        }
                    }
                    continue;
                }
                extract_deletes(&mut item, path, true, out)?;
                keep.push(item);
            }
            *items = keep;
        }
        _ => {}
    }
    Ok(())
}

fn is_empty_collection(v: &Value) -> bool {
    match v {
        Value::Mapping(m) => m.is_empty(),
        Value::Sequence(s) => s.is_empty(),
        _ => false,
    }
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

/// Applies one delete to a document; `false` when the path is not there (Talos: lookup failed).
fn apply_delete(doc: &mut Value, d: &Delete) -> bool {
    match d {
        Delete::Key(path) => {
            let (last, parents) = path.split_last().expect("a delete has a path");
            let Some(Value::Mapping(m)) = walk_mut(doc, parents) else { return false };
            m.remove(last.as_str()).is_some()
        }
        Delete::Item { list, key, value } => {
            let Some(Value::Sequence(items)) = walk_mut(doc, list) else { return false };
            match items.iter().position(|i| {
                i.get(key.as_str()).is_some_and(|x| x.is_string() || x.is_number() || x.is_bool())
                    && i.get(key.as_str()).map(scalar_text).as_deref() == Some(value.as_str())
            }) {
                Some(i) => {
                    items.remove(i);
                    true
                }
                None => false,
            }
        }
    }
}

fn walk_mut<'v>(v: &'v mut Value, path: &[String]) -> Option<&'v mut Value> {
    let mut cur = v;
    for p in path {
        cur = cur.as_mapping_mut()?.get_mut(p.as_str())?;
        if cur.is_null() {
            return None;
        }
    }
    Some(cur)
}

/// Something the apply tells the user: where Ichor deliberately differs from Talos, or a
/// Talos behaviour that is easy to miss (a merge that clears a field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchWarning {
    /// The document's first line in the patch (1-based).
    pub line: usize,
    /// The document, as `kind name`.
    pub document: String,
    /// What to know.
    pub message: String,
}

/// The result of applying one patch.
#[derive(Default)]
pub struct Applied {
    /// Paths the patch set, added or removed (for "which patch set this").
    pub set: Vec<String>,
    /// What the user should know of the apply.
    pub warnings: Vec<PatchWarning>,
}

/// Applies a loaded patch's documents to a config's documents (FACTS 8.2): the deletes aimed
/// at the v1alpha1 document first, then each document's own deletes just before its content
/// merges; a document with no match is appended.
pub fn apply(docs: &mut Vec<Value>, patch: &[PatchDoc], contract: Contract) -> Result<Applied, PatchError> {
    let mut out = Applied::default();
    // Split every document into its deletes and its content first.
    let mut parts = vec![];
    for d in patch {
        let id = id_of(&d.value);
        let err = |field: String, message: String| PatchError { line: d.line, document: describe(&id), field, message };
        if is_delete(&d.value) {
            parts.push((d, id, None, vec![]));
            continue;
        }
        let mut body = d.value.clone();
        if let Value::Mapping(m) = &mut body {
            for k in ["apiVersion", "kind", "name"] {
                m.remove(k);
            }
        }
        let mut deletes = vec![];
        extract_deletes(&mut body, &mut vec![], false, &mut deletes).map_err(|m| err(String::new(), m))?;
        parts.push((d, id, Some(body), deletes));
    }
    // Deletes aimed at the v1alpha1 document go before everything else of the patch.
    for (d, id, _, deletes) in parts.iter_mut().filter(|p| p.1.0.is_none()) {
        run_deletes(docs, d, id, std::mem::take(deletes), &mut out)?;
    }
    for (d, id, body, deletes) in parts {
        let err = |field: String, message: String| PatchError { line: d.line, document: describe(&id), field, message };
        let Some(body) = body else {
            // A whole-document delete.
            let api = d.value.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            if id.0.is_none() {
                return Err(err(String::new(), "can't delete the root of the legacy document".into()));
            }
            if api.is_empty() {
                return Err(err(
                    String::new(),
                    "missing apiVersion in document for which $patch: delete is used".into(),
                ));
            }
            match docs.iter().position(|x| id_of(x) == id) {
                Some(i) => {
                    docs.remove(i);
                    out.set.push(doc_path(&id));
                }
                None if contract >= V114 => {}
                None => out.warnings.push(PatchWarning {
                    line: d.line,
                    document: describe(&id),
                    message: format!(
                        "deletes {}, which the config does not have: Talos {contract} would append the delete selector itself as a document; Ichor ignores it, as Talos 1.14 does",
                        describe(&id)
                    ),
                }),
            }
            continue;
        };
        run_deletes(docs, d, &id, deletes, &mut out)?;
        match docs.iter().position(|x| id_of(x) == id) {
            Some(i) => {
                let prefix = doc_path(&id);
                merge(&mut docs[i], &body, &prefix, &mut out.set).map_err(|(field, m)| err(field, m))?;
                if let Some(kind) = &id.0 {
                    for field in unconditional(kind) {
                        let segs: Vec<String> = field.split('.').map(str::to_string).collect();
                        let in_patch = lookup(&body, &segs).is_some();
                        if !in_patch && apply_delete(&mut docs[i], &Delete::Key(segs)) {
                            out.set.push(join(&prefix, field));
                            out.warnings.push(PatchWarning {
                                line: d.line,
                                document: describe(&id),
                                message: format!(
                                    "clears {field}: Talos replaces this field with the patch's value even when the patch omits it; repeat it in the patch to keep it"
                                ),
                            });
                        }
                    }
                }
            }
            None => {
                let mut doc = d.value.clone();
                // The deletes were taken out; the appended document is what is left.
                if let (Value::Mapping(m), Value::Mapping(b)) = (&mut doc, &body) {
                    m.retain(|k, _| matches!(k.as_str(), Some("apiVersion" | "kind" | "name")));
                    for (k, v) in b {
                        m.insert(k.clone(), v.clone());
                    }
                }
                docs.push(doc);
                out.set.push(doc_path(&id));
            }
        }
    }
    Ok(out)
}

fn run_deletes(
    docs: &mut [Value],
    d: &PatchDoc,
    id: &DocId,
    deletes: Vec<Delete>,
    out: &mut Applied,
) -> Result<(), PatchError> {
    let prefix = doc_path(id);
    for del in deletes {
        let (shown, list) = match &del {
            Delete::Key(p) => (path_text(p), false),
            Delete::Item { list, key, value } => (format!("{}[{key}={value}]", path_text(list)), true),
        };
        let target = docs.iter_mut().find(|x| &id_of(x) == id);
        let ok = target.is_some_and(|t| apply_delete(t, &del));
        if !ok {
            let api = d.value.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            let (kind, named) = (id.0.clone().unwrap_or_else(|| "v1alpha1".into()), id.1.is_some());
            let inner =
                format!("path '{shown}' in document '{api}/{kind}': failed to delete path '{shown}': lookup failed");
            let message = if named {
                format!("named patch delete: document {api}/{kind}: {inner}")
            } else {
                format!("patch delete: {inner}")
            };
            let hint = if list { "; the list has no such element" } else { "; the config does not have it" };
            return Err(PatchError {
                line: d.line,
                document: describe(id),
                field: shown,
                message: format!("{message}{hint}"),
            });
        }
        out.set.push(match &del {
            Delete::Key(p) => join(&prefix, &path_text(p)),
            Delete::Item { list, .. } => join(&prefix, &path_text(list)),
        });
    }
    Ok(())
}

fn lookup<'v>(v: &'v Value, path: &[String]) -> Option<&'v Value> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p.as_str())?;
    }
    (!cur.is_null()).then_some(cur)
}

/// Fields whose Go types (`block.ByteSize`, `block.PercentageSize`, `cel.Expression`) have a
/// `Merge` that replaces unconditionally, so a patch document that omits them clears them
/// (FACTS 8.3, code reading).
fn unconditional(kind: &str) -> &'static [&'static str] {
    match kind {
        "VolumeConfig" | "UserVolumeConfig" | "RawVolumeConfig" | "SwapVolumeConfig" => {
            &["provisioning.minSize", "provisioning.maxSize", "provisioning.diskSelector.match"]
        }
        "UnattendedInstallConfig" => &["provisioning.diskSelector.match"],
        "ExistingVolumeConfig" => &["volumeDiscovery.volumeSelector.match"],
        "LinkAliasConfig" => &["selector.match"],
        _ => &[],
    }
}

/// Lists (and fields) a patch replaces instead of merging (`merge:"replace"`, FACTS 8.3).
fn replaced(path: &str) -> bool {
    const EXACT: &[&str] = &[
        "cluster.apiServer.auditPolicy",
        "cluster.network.podSubnets",
        "cluster.network.serviceSubnets",
        "KubeNetworkConfig.podSubnets",
        "KubeNetworkConfig.serviceSubnets",
        "KubeAuditPolicyConfig.configuration",
        "KubeAuthenticationConfig.configuration",
        "KubeCredentialProviderConfig.configuration",
        "CRIBaseRuntimeSpecConfig.overrides",
    ];
    let named = |kind: &str, fields: &[&str]| {
        path.starts_with(&format!("{kind}[")) && fields.iter().any(|f| path.ends_with(&format!("].{f}")))
    };
    EXACT.contains(&path)
        // meta.Args: each extraArgs key's value is replaced, string or list alike.
        || path.rsplit_once('.').is_some_and(|(parent, _)| parent.ends_with("extraArgs"))
        || named("NetworkRuleConfig", &["ingress", "portSelector.ports"])
        || named("BGPInstanceConfig", &["advertise", "importRoutes", "neighbors"])
        || named("KubeStaticPodConfig", &["pod"])
}

/// How a keyed list matches a patch item to a base item (FACTS 8.3's custom `Merge`s).
enum Keyed {
    /// Merge into the item with the same value of this field.
    Merge(&'static str),
    /// Replace the item with the same value of this field.
    Replace(&'static str),
    /// v1alpha1 interfaces: by `interface`, else by an equal `deviceSelector`.
    Interfaces,
}

fn keyed(path: &str) -> Option<Keyed> {
    if path == "machine.network.interfaces" {
        Some(Keyed::Interfaces)
    } else if path.starts_with("machine.network.interfaces[") && path.ends_with("].vlans") {
        Some(Keyed::Merge("vlanId"))
    } else if path == "cluster.apiServer.admissionControl" {
        Some(Keyed::Merge("name"))
    } else if path.starts_with("ExtensionServiceConfig[") && path.ends_with("].configFiles") {
        Some(Keyed::Merge("mountPath"))
    } else if path == "ImageVerificationConfig.rules" {
        Some(Keyed::Replace("image"))
    } else {
        None
    }
}

/// The Go type Talos's merge names in a mismatch (`%T` of the decoded YAML).
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Mapping(_) => "map[string]interface {}",
        Value::Sequence(_) => "[]interface {}",
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int",
        _ => "<nil>",
    }
}

/// The zero value of a scalar: a patch's `""` or `0` does not overwrite (FACTS 8.3).
fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

type MergeError = (String, String);

/// Talos's deep merge of `patch` into `base` at `path` (FACTS 8.3), on YAML values.
fn merge(base: &mut Value, patch: &Value, path: &str, set: &mut Vec<String>) -> Result<(), MergeError> {
    if patch.is_null() {
        return Ok(());
    }
    if base.is_null() {
        *base = patch.clone();
        set.push(path.to_string());
        return Ok(());
    }
    if replaced(path) {
        if !is_empty_collection(patch) && !is_zero(patch) {
            *base = patch.clone();
            set.push(path.to_string());
        }
        return Ok(());
    }
    match (base, patch) {
        (Value::Mapping(b), Value::Mapping(p)) => {
            for (k, v) in p {
                let child = join(path, &crate::yaml::key_text(k));
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v, &child, set)?,
                    None => {
                        b.insert(k.clone(), v.clone());
                        set.push(child);
                    }
                }
            }
            Ok(())
        }
        (Value::Sequence(b), Value::Sequence(p)) => {
            for item in p {
                let at = match keyed(path) {
                    Some(Keyed::Merge(key)) | Some(Keyed::Replace(key)) => {
                        item.get(key).and_then(|kv| b.iter().position(|x| x.get(key) == Some(kv)))
                    }
                    Some(Keyed::Interfaces) => interface_match(b, item),
                    None => None,
                };
                match (at, keyed(path)) {
                    (Some(i), Some(Keyed::Replace(_))) => b[i] = item.clone(),
                    (Some(i), _) => merge(&mut b[i], item, &format!("{path}[{i}]"), set)?,
                    (None, _) => b.push(item.clone()),
                }
            }
            set.push(path.to_string());
            Ok(())
        }
        (b @ (Value::Mapping(_) | Value::Sequence(_)), p) | (b, p @ (Value::Mapping(_) | Value::Sequence(_))) => Err((
            path.to_string(),
            format!(
                "merge type mismatch left {} right {}: the patch gives {path} another shape than the config has",
                go_type(b),
                go_type(p)
            ),
        )),
        (_, p) if is_zero(p) => Ok(()),
        (b, p) => {
            *b = p.clone();
            set.push(path.to_string());
            Ok(())
        }
    }
}

/// v1alpha1 `NetworkDeviceList`: a patch item with an `interface` merges into the base item
/// with the same one; else one whose `deviceSelector` is equal (never one that sets
/// `physical`, a pointer Talos compares by address).
fn interface_match(base: &[Value], item: &Value) -> Option<usize> {
    if let Some(name) = item.get("interface").and_then(Value::as_str).filter(|n| !n.is_empty()) {
        return base.iter().position(|x| x.get("interface").and_then(Value::as_str) == Some(name));
    }
    let sel = item.get("deviceSelector")?;
    if sel.get("physical").is_some() {
        return None;
    }
    base.iter().position(|x| x.get("deviceSelector") == Some(sel))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V113: Contract = Contract { major: 1, minor: 13 };

    fn docs(text: &str) -> Vec<Value> {
        crate::yaml::parse_documents(text, 1 << 20).unwrap()
    }

    fn run(base: &str, patch: &str, c: Contract) -> Result<(Vec<Value>, Applied), Vec<PatchError>> {
        let mut d = docs(base);
        let Patch::Strategic(p) = Patch::load(patch, c)? else { panic!("not strategic") };
        let a = apply(&mut d, &p, c).map_err(|e| vec![e])?;
        Ok((d, a))
    }

    const BASE: &str = "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtu: 1500\n        addresses: [10.0.0.2/24]\n      - interface: eth1\n  certSANs: [a]\ncluster:\n  clusterName: c\n---\napiVersion: v1alpha1\nkind: KubeNetworkConfig\npodSubnets: [10.244.0.0/16]\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: ext\nconfigFiles:\n  - mountPath: /a\n    content: one\n";

    #[test]
    fn keyed_lists_merge_by_their_key_and_other_lists_append() {
        let patch = "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtu: 9000\n        addresses: [10.0.0.3/24]\n  certSANs: [b]\n---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: ext\nconfigFiles:\n  - mountPath: /a\n    content: two\n  - mountPath: /b\n    content: three\n";
        let (d, _) = run(BASE, patch, V114).unwrap();
        let ifs = &d[0]["machine"]["network"]["interfaces"];
        assert_eq!(ifs.as_sequence().unwrap().len(), 2);
        assert_eq!(ifs[0]["mtu"], Value::from(9000));
        assert_eq!(ifs[0]["addresses"].as_sequence().unwrap().len(), 2);
        assert_eq!(d[0]["machine"]["certSANs"], Value::Sequence(vec!["a".into(), "b".into()]));
        let files = d[2]["configFiles"].as_sequence().unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0]["content"], Value::from("two"));
    }

    #[test]
    fn replace_lists_replace_and_empty_strings_do_not_overwrite() {
        let patch = "cluster:\n  clusterName: \"\"\n---\napiVersion: v1alpha1\nkind: KubeNetworkConfig\npodSubnets: [10.200.0.0/16]\n";
        let (d, _) = run(BASE, patch, V114).unwrap();
        assert_eq!(d[0]["cluster"]["clusterName"], Value::from("c"));
        assert_eq!(d[1]["podSubnets"], Value::Sequence(vec!["10.200.0.0/16".into()]));
    }

    #[test]
    fn list_item_delete_removes_the_matching_element_then_content_merges() {
        let patch = "machine:\n  network:\n    interfaces:\n      - interface: eth1\n        $patch: delete\n      - interface: eth2\n";
        let (d, _) = run(BASE, patch, V114).unwrap();
        let names: Vec<_> = d[0]["machine"]["network"]["interfaces"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|i| i["interface"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["eth0", "eth2"]);
        let missing = "machine:\n  network:\n    interfaces:\n      - interface: eth9\n        $patch: delete\n";
        let e = run(BASE, missing, V114).err().unwrap();
        assert!(e[0].message.contains("lookup failed"), "{e:?}");
        let inner =
            "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtu:\n          $patch: delete\n";
        assert!(run(BASE, inner, V114).err().unwrap()[0].message.starts_with("cannot delete an inner key"));
        let bare = "machine:\n  certSANs:\n    - $patch: delete\n";
        assert!(run(BASE, bare, V114).err().unwrap()[0].message.starts_with("no key:val found"));
    }

    #[test]
    fn key_delete_of_a_missing_path_is_talos_lookup_error() {
        let e = run(BASE, "machine:\n  kubelet:\n    $patch: delete\n", V114).err().unwrap();
        assert_eq!(e[0].field, "machine.kubelet");
        assert!(e[0].message.starts_with("patch delete: path 'machine.kubelet' in document '/v1alpha1'"), "{e:?}");
    }

    #[test]
    fn missing_apiversion_and_type_mismatch_are_errors() {
        let e = run(BASE, "kind: KubeNetworkConfig\npodSubnets: []\n", V114).err().unwrap();
        assert!(e[0].message.starts_with("missing apiVersion"), "{e:?}");
        let e = run(BASE, "machine:\n  certSANs: {a: b}\n", V114).err().unwrap();
        assert_eq!(e[0].field, "machine.certSANs");
        assert!(e[0].message.starts_with("merge type mismatch left []interface {} right map[string]interface {}"));
    }

    #[test]
    fn deleting_a_missing_document_is_ignored_at_v114_and_warned_at_v113() {
        let patch = "apiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\n$patch: delete\n";
        let (_, a) = run(BASE, patch, V114).unwrap();
        assert!(a.warnings.is_empty());
        let (d, a) = run(BASE, patch, V113).unwrap();
        assert_eq!(d.len(), 3);
        assert!(a.warnings[0].message.contains("Talos v1.13 would append the delete selector"), "{:?}", a.warnings);
    }

    #[test]
    fn one_document_twice_merges_at_v114_and_is_refused_at_v113() {
        let patch = "apiVersion: v1alpha1\nkind: KubeSpanConfig\nenabled: true\n---\napiVersion: v1alpha1\nkind: KubeSpanConfig\nmtu: 1400\n";
        let (d, _) = run(BASE, patch, V114).unwrap();
        assert_eq!(d.len(), 4);
        assert_eq!(d[3]["mtu"], Value::from(1400));
        let e = run(BASE, patch, V113).err().unwrap();
        assert!(
            e[0].message.starts_with("duplicate document v1alpha1/KubeSpanConfig is not allowed (line 5)"),
            "{e:?}"
        );
    }

    #[test]
    fn json6902_is_recognised() {
        let p = Patch::load("- op: add\n  path: /machine/network/hostname\n  value: x\n", V114).unwrap();
        assert!(matches!(p, Patch::Json6902 { line: 1 }));
    }

    #[test]
    fn unconditional_fields_are_cleared_with_a_warning() {
        let base = "version: v1alpha1\n---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: a\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == \"/dev/sda\"\n";
        let patch = "apiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: b\n";
        let (d, a) = run(base, patch, V114).unwrap();
        assert!(d[1]["provisioning"]["diskSelector"].get("match").is_none());
        assert!(a.warnings[0].message.starts_with("clears provisioning.diskSelector.match"));
    }
}
