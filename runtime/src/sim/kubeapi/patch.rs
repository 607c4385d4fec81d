//! The patch types kube-apiserver accepts besides a merge patch: JSON patch (RFC 6902,
//! `application/json-patch+json`, what `kubectl patch --type json` sends) and strategic merge
//! patch (`application/strategic-merge-patch+json`, what `kubectl patch` and client-side
//! `kubectl apply` send for the core kinds): lists merged by their merge key (`containers` by
//! `name`, `volumeMounts` by `mountPath`, `conditions` by `type` ...) and the directives
//! `$patch`, `$setElementOrder/...`, `$retainKeys`, `$deleteFromPrimitiveList/...`.
//!
//! Start at `json_patch` and `strategic_merge`; both are pure functions on JSON.

use serde_json::{Value as Json, json};

/// Why a JSON patch cannot be applied (422, with this text).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The patch is not a list of operations.
    #[error("the JSON patch is not a list of operations: {0}")]
    NotAList(String),
    /// An operation without its `op`, `path` or `value`.
    #[error("operation {index}: {why}")]
    Malformed { index: usize, why: String },
    /// A path that names nothing.
    #[error("operation {index} ({op} {path}): the path does not exist")]
    Missing { index: usize, op: String, path: String },
    /// A `test` that failed.
    #[error("operation {index} (test {path}): testing value {path} failed")]
    TestFailed { index: usize, path: String },
}

fn unescape(t: &str) -> String {
    t.replace("~1", "/").replace("~0", "~")
}

/// (parent pointer, last token) of a JSON pointer.
fn split(path: &str) -> Option<(&str, String)> {
    let (parent, last) = path.rsplit_once('/')?;
    Some((parent, unescape(last)))
}

fn remove(doc: &mut Json, path: &str) -> Option<Json> {
    let (parent, last) = split(path)?;
    match doc.pointer_mut(parent)? {
        Json::Object(m) => m.remove(&last),
        Json::Array(a) => {
            let i: usize = last.parse().ok()?;
            (i < a.len()).then(|| a.remove(i))
        }
        _ => None,
    }
}

fn add(doc: &mut Json, path: &str, value: Json) -> Option<()> {
    if path.is_empty() {
        *doc = value;
        return Some(());
    }
    let (parent, last) = split(path)?;
    match doc.pointer_mut(parent)? {
        Json::Object(m) => {
            m.insert(last, value);
            Some(())
        }
        Json::Array(a) if last == "-" => {
            a.push(value);
            Some(())
        }
        Json::Array(a) => {
            let i: usize = last.parse().ok()?;
            (i <= a.len()).then(|| a.insert(i, value))
        }
        _ => None,
    }
}

/// Applies an RFC 6902 JSON patch to `doc`; on an error `doc` is left as it was.
pub fn json_patch(doc: &mut Json, patch: &Json) -> Result<(), PatchError> {
    let ops = patch.as_array().ok_or_else(|| PatchError::NotAList(patch.to_string()))?;
    let mut next = doc.clone();
    for (index, op) in ops.iter().enumerate() {
        let field = |k: &str| op.get(k).and_then(Json::as_str).map(str::to_string);
        let name = field("op").ok_or_else(|| PatchError::Malformed { index, why: "no op".into() })?;
        let path = field("path").ok_or_else(|| PatchError::Malformed { index, why: "no path".into() })?;
        let value = || op.get("value").cloned().ok_or_else(|| PatchError::Malformed { index, why: "no value".into() });
        let missing = || PatchError::Missing { index, op: name.clone(), path: path.clone() };
        match name.as_str() {
            "add" => add(&mut next, &path, value()?).ok_or_else(missing)?,
            "remove" => {
                remove(&mut next, &path).ok_or_else(missing)?;
            }
            "replace" => {
                remove(&mut next, &path).ok_or_else(missing)?;
                add(&mut next, &path, value()?).ok_or_else(missing)?;
            }
            "move" | "copy" => {
                let from = field("from").ok_or_else(|| PatchError::Malformed { index, why: "no from".into() })?;
                let v = if name == "move" { remove(&mut next, &from) } else { next.pointer(&from).cloned() };
                add(&mut next, &path, v.ok_or_else(missing)?).ok_or_else(missing)?;
            }
            "test" => {
                if next.pointer(&path) != Some(&value()?) {
                    return Err(PatchError::TestFailed { index, path });
                }
            }
            other => return Err(PatchError::Malformed { index, why: format!("unknown op {other:?}") }),
        }
    }
    *doc = next;
    Ok(())
}

/// The merge key of a list field, as the core kinds' strategic-merge tags declare it.
fn merge_key(field: &str, items: &[Json]) -> Option<&'static str> {
    Some(match field {
        "containers" | "initContainers" | "ephemeralContainers" | "volumes" | "env" | "imagePullSecrets" => "name",
        "volumeMounts" | "volumeDevices" => "mountPath",
        "conditions" => "type",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        "ownerReferences" => "uid",
        // A container's ports merge by containerPort, a Service's by port.
        "ports" if items.iter().any(|p| p.get("containerPort").is_some()) => "containerPort",
        "ports" => "port",
        _ => return None,
    })
}

/// Lists of scalars the core kinds merge as sets.
fn primitive_set(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// Applies a strategic merge patch to `target`.
pub fn strategic_merge(target: &mut Json, patch: &Json) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    match p.get("$patch").and_then(Json::as_str) {
        Some("replace") => {
            let mut v = patch.clone();
            if let Some(m) = v.as_object_mut() {
                m.remove("$patch");
            }
            *target = v;
            return;
        }
        Some("delete") => {
            *target = Json::Null;
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    if let Some(keep) = p.get("$retainKeys").and_then(Json::as_array) {
        t.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)) || p.contains_key(k));
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Json::Array(have)), Some(gone)) = (t.get_mut(field), v.as_array()) {
                have.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Json::Null => {
                t.remove(k);
            }
            Json::Array(items) => {
                let have = t.get(k).and_then(Json::as_array).cloned();
                let merged = match (have, merge_key(k, items)) {
                    (Some(have), Some(key)) => merge_list(have, items, key),
                    (Some(mut have), None) if primitive_set(k) => {
                        for x in items {
                            if !have.contains(x) {
                                have.push(x.clone());
                            }
                        }
                        have
                    }
                    _ => items.iter().filter(|x| x.get("$patch").is_none()).cloned().collect(),
                };
                t.insert(k.clone(), Json::Array(merged));
            }
            Json::Object(_) => {
                let slot = t.entry(k.clone()).or_insert(Json::Null);
                strategic_merge(slot, v);
                if slot.is_null() {
                    t.remove(k);
                }
            }
            scalar => {
                t.insert(k.clone(), scalar.clone());
            }
        }
    }
}

fn merge_list(mut have: Vec<Json>, items: &[Json], key: &str) -> Vec<Json> {
    for item in items {
        let id = item.get(key).cloned();
        let at = id.as_ref().and_then(|id| have.iter().position(|h| h.get(key) == Some(id)));
        match (item.get("$patch").and_then(Json::as_str), at) {
            (Some("delete"), Some(i)) => {
                have.remove(i);
            }
            (Some("delete"), None) => {}
            (_, Some(i)) => strategic_merge(&mut have[i], item),
            (_, None) => {
                let mut fresh = json!({});
                strategic_merge(&mut fresh, item);
                have.push(fresh);
            }
        }
    }
    have
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_patch_adds_replaces_removes_and_tests() {
        let mut d = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"list": [1, 2]}});
        json_patch(
            &mut d,
            &json!([
                {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
                {"op": "replace", "path": "/metadata/labels/a", "value": "3"},
                {"op": "add", "path": "/spec/list/-", "value": 3},
                {"op": "remove", "path": "/spec/list/0"},
                {"op": "test", "path": "/spec/list/0", "value": 2},
                {"op": "copy", "from": "/metadata/labels/a", "path": "/spec/copied"},
            ]),
        )
        .unwrap();
        assert_eq!(d, json!({"metadata": {"labels": {"a": "3", "b/c": "2"}}, "spec": {"list": [2, 3], "copied": "3"}}));
        let before = d.clone();
        let e = json_patch(
            &mut d,
            &json!([{"op": "add", "path": "/spec/x", "value": 1}, {"op": "test", "path": "/spec/x", "value": 2}]),
        )
        .unwrap_err();
        assert_eq!(e, PatchError::TestFailed { index: 1, path: "/spec/x".into() });
        assert_eq!(d, before, "a failed patch changes nothing");
        let e = json_patch(&mut d, &json!([{"op": "remove", "path": "/nope/x"}])).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn a_strategic_merge_patch_merges_containers_by_name() {
        let mut pod = json!({"spec": {"containers": [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]},
                             "metadata": {"finalizers": ["x"]}});
        strategic_merge(
            &mut pod,
            &json!({"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                    "spec": {"containers": [{"name": "b", "image": "b:2"}, {"name": "c", "image": "c:1"}, {"name": "a", "$patch": "delete"}]},
                    "metadata": {"finalizers": ["y"], "labels": {"l": "v"}}}),
        );
        assert_eq!(
            pod,
            json!({"spec": {"containers": [{"name": "b", "image": "b:2"}, {"name": "c", "image": "c:1"}]},
                   "metadata": {"finalizers": ["x", "y"], "labels": {"l": "v"}}})
        );
        strategic_merge(&mut pod, &json!({"metadata": {"labels": {"l": null}}}));
        assert_eq!(pod["metadata"]["labels"], json!({}));
    }
}
