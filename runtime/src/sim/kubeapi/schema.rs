//! What kube-apiserver does with a custom resource's schema on every write: unknown fields
//! pruned (or, under `fieldValidation=Strict`, refused; under `Warn`, pruned with a warning),
//! `default`s filled in, the values checked against the schema (type, enum, required, bounds;
//! with jsonschema, in kube-apiserver's words), and the CRD's CEL rules
//! (`x-kubernetes-validations`) evaluated with kube-cel, transition rules against the object
//! as it was.
//!
//! Start at `Validation::parse` (the query's mode) and `admit` (one write).

use serde_json::{Value as Json, json};

/// The `fieldValidation` a write asks for (kube-apiserver's default is `Warn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validation {
    /// Unknown fields are dropped silently.
    Ignore,
    /// Unknown fields are dropped, each named in a `Warning` header.
    Warn,
    /// A write with an unknown field is refused.
    Strict,
}

impl Validation {
    /// The mode named by the query's `fieldValidation` (absent: `Warn`).
    pub fn parse(q: Option<&str>) -> Result<Validation, String> {
        match q {
            None | Some("") | Some("Warn") => Ok(Validation::Warn),
            Some("Ignore") => Ok(Validation::Ignore),
            Some("Strict") => Ok(Validation::Strict),
            Some(other) => Err(format!(
                "fieldValidation: Unsupported value: \"{other}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
            )),
        }
    }
}

/// How a write is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Unknown fields under `Strict` (400 BadRequest).
    #[error("{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}", unknown_list(.fields))]
    Unknown { kind: String, version: String, fields: Vec<String> },
    /// Values the schema does not allow, or CEL rules that do not hold (422 Invalid).
    #[error("{qualified} \"{name}\" is invalid: {}", causes_text(.causes))]
    Invalid { qualified: String, name: String, causes: Vec<Cause> },
}

/// One field a write is refused for, as kube-apiserver's Status `details.causes` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// `spec.kind`.
    pub field: String,
    /// `FieldValueNotSupported`, `FieldValueTypeInvalid`, `FieldValueRequired`,
    /// `FieldValueInvalid`.
    pub reason: &'static str,
    /// What follows the field in the message: `Unsupported value: "x": supported values: ...`.
    pub message: String,
}

fn unknown_list(fields: &[String]) -> String {
    fields.iter().map(|f| format!("unknown field \"{f}\"")).collect::<Vec<_>>().join(", ")
}

fn causes_text(causes: &[Cause]) -> String {
    let each: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
    if each.len() == 1 { each[0].clone() } else { format!("[{}]", each.join(", ")) }
}

impl Refusal {
    /// The HTTP status and the `Status` body kube-apiserver answers with.
    pub fn status(&self) -> (u16, Json) {
        let message = self.to_string();
        match self {
            Refusal::Unknown { .. } => (
                400,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": "BadRequest", "code": 400}),
            ),
            Refusal::Invalid { qualified, name, causes } => {
                let (kind, group) = qualified.split_once('.').unwrap_or((qualified, ""));
                let causes: Vec<Json> = causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect();
                (
                    422,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": message, "reason": "Invalid", "code": 422,
                           "details": {"name": name, "group": group, "kind": kind, "causes": causes}}),
                )
            }
        }
    }
}

const METADATA: [&str; 15] = [
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Removes the fields `schema` does not declare from `v`, naming each (`spec.foo`).
pub fn prune(v: &mut Json, schema: &Json, at: &str, root: bool, out: &mut Vec<String>) {
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    match v {
        Json::Object(m) => {
            let props = schema.get("properties").and_then(Json::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            let embedded = root || schema.get("x-kubernetes-embedded-resource") == Some(&json!(true));
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                if embedded && matches!(k.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                if embedded && k == "metadata" {
                    if let Some(Json::Object(meta)) = m.get_mut("metadata") {
                        let gone: Vec<String> =
                            meta.keys().filter(|k| !METADATA.contains(&k.as_str())).cloned().collect();
                        for g in gone {
                            meta.remove(&g);
                            out.push(format!("{path}.{g}"));
                        }
                    }
                    continue;
                }
                match (props.and_then(|p| p.get(&k)), extra) {
                    (Some(s), _) | (None, Some(s)) => {
                        if let Some(child) = m.get_mut(&k) {
                            prune(child, s, &path, false, out);
                        }
                    }
                    (None, None) if preserve || props.is_none() && schema.get("type").is_none() => {}
                    (None, None) => {
                        m.remove(&k);
                        out.push(path);
                    }
                }
            }
        }
        Json::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, x) in items.iter_mut().enumerate() {
                    prune(x, s, &format!("{at}[{i}]"), false, out);
                }
            }
        }
        _ => {}
    }
}

/// One write of a custom resource whose version's schema is `schema`: pruned (or refused under
/// `Strict`), defaulted, and checked against its CEL rules (`old`: the object before an
/// update). Returns the object to store and the warnings to send.
pub fn admit(
    obj: &Json,
    old: Option<&Json>,
    schema: &Json,
    mode: Validation,
    (kind, group, version): (&str, &str, &str),
) -> Result<(Json, Vec<String>), Refusal> {
    let mut next = obj.clone();
    let mut unknown = vec![];
    prune(&mut next, schema, "", true, &mut unknown);
    if mode == Validation::Strict && !unknown.is_empty() {
        return Err(Refusal::Unknown { kind: kind.into(), version: version.into(), fields: unknown });
    }
    let warnings = if mode == Validation::Warn {
        unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect()
    } else {
        vec![]
    };
    let next = kube_cel::apply_defaults(schema, &next);
    let name = next.pointer("/metadata/name").and_then(Json::as_str).unwrap_or_default().to_string();
    let refused = |causes| Err(Refusal::Invalid { qualified: format!("{kind}.{group}"), name: name.clone(), causes });
    // kube-apiserver checks the values, then the CEL rules, unless a value's type is wrong, a
    // required one missing, one not in its enum or past a length (its "blocking" errors): then
    // it says the rules were not checked.
    let mut causes = values_refused(schema, &next);
    let blocking = [
        "FieldValueTypeInvalid",
        "FieldValueRequired",
        "FieldValueNotSupported",
        "FieldValueTooLong",
        "FieldValueTooMany",
    ];
    if causes.iter().any(|c| blocking.contains(&c.reason)) {
        causes.push(Cause {
            field: "<nil>".into(),
            reason: "FieldValueInvalid",
            message: "Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into(),
        });
    } else if let Err(errs) = kube_cel::validate(schema, &next, old) {
        causes.extend(errs.as_slice().iter().map(|e| Cause {
            field: e.field_path.clone(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: \"object\": {}", e.message),
        }));
    }
    if !causes.is_empty() {
        return refused(causes);
    }
    Ok((next, warnings))
}

/// A CRD's structural schema as JSON Schema: `nullable: true` lets null through (its `type`
/// also `null`); the `x-kubernetes-*` extensions are keywords JSON Schema ignores.
fn as_json_schema(schema: &Json) -> Json {
    match schema {
        Json::Object(m) => {
            let mut out: serde_json::Map<String, Json> =
                m.iter().map(|(k, v)| (k.clone(), as_json_schema(v))).collect();
            if m.get("nullable") == Some(&json!(true))
                && let Some(Json::String(t)) = m.get("type")
            {
                out.insert("type".into(), json!([t, "null"]));
            }
            Json::Object(out)
        }
        Json::Array(a) => Json::Array(a.iter().map(as_json_schema).collect()),
        other => other.clone(),
    }
}

/// The values of `obj` its schema does not allow, in kube-apiserver's words: an enum's
/// `Unsupported value`, a type's `must be of type`, a `Required value`, and the bounds'
/// `Invalid value`.
fn values_refused(schema: &Json, obj: &Json) -> Vec<Cause> {
    use jsonschema::error::ValidationErrorKind as K;
    let Ok(validator) = jsonschema::validator_for(&as_json_schema(schema)) else { return vec![] };
    let quoted = |v: &Json| match v {
        Json::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    };
    validator
        .iter_errors(obj)
        .map(|e| {
            let mut field = String::new();
            for seg in e.instance_path().as_str().split('/').skip(1) {
                let seg = seg.replace("~1", "/").replace("~0", "~");
                match seg.parse::<usize>() {
                    Ok(i) => field += &format!("[{i}]"),
                    Err(_) if field.is_empty() => field = seg,
                    Err(_) => field += &format!(".{seg}"),
                }
            }
            let value = e.instance().as_ref().clone();
            match e.kind() {
                K::Enum { options } => {
                    let supported: Vec<String> = options.as_array().into_iter().flatten().map(quoted).collect();
                    Cause {
                        field,
                        reason: "FieldValueNotSupported",
                        message: format!(
                            "Unsupported value: {}: supported values: {}",
                            quoted(&value),
                            supported.join(", ")
                        ),
                    }
                }
                K::Required { property } => {
                    let property = property.as_str().unwrap_or_default();
                    let field = if field.is_empty() { property.to_string() } else { format!("{field}.{property}") };
                    Cause { field, reason: "FieldValueRequired", message: "Required value".into() }
                }
                K::Type { kind } => {
                    let want = match kind {
                        jsonschema::error::TypeKind::Single(t) => t.to_string(),
                        jsonschema::error::TypeKind::Multiple(ts) => {
                            ts.iter().map(|t| t.to_string()).find(|t| t != "null").unwrap_or_default()
                        }
                    };
                    let have = match &value {
                        Json::String(_) => "string",
                        Json::Number(n) if n.is_i64() || n.is_u64() => "integer",
                        Json::Number(_) => "number",
                        Json::Bool(_) => "boolean",
                        Json::Array(_) => "array",
                        Json::Object(_) => "object",
                        Json::Null => "null",
                    };
                    Cause {
                        message: format!(
                            "Invalid value: \"{have}\": {field} in body must be of type {want}: \"{have}\""
                        ),
                        field,
                        reason: "FieldValueTypeInvalid",
                    }
                }
                K::Pattern { pattern } => Cause {
                    message: format!("Invalid value: {}: {field} in body should match '{pattern}'", quoted(&value)),
                    field,
                    reason: "FieldValueInvalid",
                },
                K::MaxLength { limit } => Cause {
                    message: format!("Too long: may not be more than {limit} bytes"),
                    field,
                    reason: "FieldValueTooLong",
                },
                K::MaxItems { limit } => Cause {
                    message: format!(
                        "Too many: {}: must have at most {limit} items",
                        value.as_array().map(Vec::len).unwrap_or_default()
                    ),
                    field,
                    reason: "FieldValueTooMany",
                },
                K::Minimum { limit } => Cause {
                    message: format!(
                        "Invalid value: {value}: {field} in body should be greater than or equal to {limit}"
                    ),
                    field,
                    reason: "FieldValueInvalid",
                },
                K::Maximum { limit } => Cause {
                    message: format!("Invalid value: {value}: {field} in body should be less than or equal to {limit}"),
                    field,
                    reason: "FieldValueInvalid",
                },
                _ => Cause {
                    message: format!("Invalid value: {}: {e}", quoted(&value)),
                    field,
                    reason: "FieldValueInvalid",
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Json {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "version": {"type": "string", "x-kubernetes-validations": [{"rule": "self.startsWith('v')", "message": "version is vX.Y.Z"}]},
                "replicas": {"type": "integer", "default": 1},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}},
            "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}})
    }

    const GVK: (&str, &str, &str) = ("Thing", "example.dev", "v1");

    #[test]
    fn unknown_fields_are_pruned_warned_or_refused() {
        let obj = json!({"apiVersion": "example.dev/v1", "kind": "Thing", "metadata": {"name": "t", "bogus": 1},
            "spec": {"version": "v1", "foo": 1, "free": {"any": 1}, "items": [{"name": "a", "x": 2}]}});
        let (kept, warnings) = admit(&obj, None, &schema(), Validation::Warn, GVK).unwrap();
        assert_eq!(
            warnings,
            ["unknown field \"metadata.bogus\"", "unknown field \"spec.foo\"", "unknown field \"spec.items[0].x\""]
        );
        assert_eq!(kept["spec"], json!({"version": "v1", "free": {"any": 1}, "items": [{"name": "a"}], "replicas": 1}));
        let e = admit(&obj, None, &schema(), Validation::Strict, GVK).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Thing in version \"v1\" cannot be handled as a Thing: strict decoding error: unknown field \"metadata.bogus\", unknown field \"spec.foo\", unknown field \"spec.items[0].x\""
        );
        assert_eq!(e.status().0, 400);
        let (_, warnings) = admit(&obj, None, &schema(), Validation::Ignore, GVK).unwrap();
        assert!(warnings.is_empty());
    }

    #[test]
    fn cel_rules_refuse_with_the_servers_words() {
        let obj = json!({"apiVersion": "example.dev/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": {"version": "1.2"}});
        let e = admit(&obj, None, &schema(), Validation::Strict, GVK).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Thing.example.dev \"t\" is invalid: spec.version: Invalid value: \"object\": version is vX.Y.Z"
        );
        let (code, body) = e.status();
        assert_eq!((code, body["details"]["causes"][0]["field"].as_str()), (422, Some("spec.version")));
        assert!(Validation::parse(Some("Loose")).unwrap_err().contains("supported values"));
    }
}
