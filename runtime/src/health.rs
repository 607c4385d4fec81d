//! Health checks (`spec.healthChecks`, issue 53): CEL expressions over Kubernetes objects that
//! must hold before each machine's step starts and before it counts as done. Pure: the objects
//! are the caller's (the controller reads them, `crate::kube::read_health_objects`); the CEL
//! is kube-cel's (the `cel` crate with Kubernetes's libraries registered).
//!
//! Start at `evaluate`: one check over the objects read, to what the operations' rules get as
//! facts (`health_check`, `health_failing`, `health_passed`). `problems` is what admission and
//! `ichor upgrade --dry-run` refuse.

use crate::window::FieldProblem;
use kube_cel::KubeCelExt;
use kube_cel::cel::{self, Program, Value};
use render::api::{HealthCheck, HealthObject};
use serde::{Deserialize, Serialize};

/// Whether the API server serves a kind, as discovery says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    Namespaced,
    ClusterScoped,
    /// Not served, with what discovery answered.
    No(String),
}

/// What discovery said of kinds (apiVersion, kind), as admission and the CLI look them up.
pub type ServedKinds = Vec<((String, String), Served)>;

/// What `kinds` says of an object's kind; `None` when it was not looked up.
pub fn served_in(kinds: &ServedKinds, o: &HealthObject) -> Option<Served> {
    kinds.iter().find(|((v, k), _)| *v == o.api_version && *k == o.kind).map(|(_, s)| s.clone())
}

/// One check at one time: every object it read, passed or not. A check whose objects could not
/// be read has one failing result naming why.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthAt {
    pub name: String,
    pub timeout_seconds: i64,
    pub results: Vec<HealthResult>,
}

/// One object's answer: `Kind namespace/name`, whether it passed, and the expression's result
/// (`true`, `false`, or why it is not a boolean).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthResult {
    pub object: String,
    pub passed: bool,
    pub result: String,
}

/// The expression compiled, or why not, with its line and column inside the expression.
pub fn compile(expression: &str) -> Result<Program, String> {
    Program::compile(expression).map_err(|e| {
        e.errors
            .iter()
            .map(|p| format!("at {}:{}: {}", p.pos.0.max(1), p.pos.1.max(1), p.msg))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// The type of an expression when its shape alone says it is not a boolean (a literal, an
/// arithmetic operator, a list or map, a function that returns a value); `None` when it is or
/// may be a boolean (a comparison, a logical operator, a field read whose type is the object's).
pub fn not_boolean(expression: &cel::IdedExpr) -> Option<&'static str> {
    use cel::common::ast::{Expr, LiteralValue};
    match &expression.expr {
        Expr::Literal(LiteralValue::Boolean(_)) => None,
        Expr::Literal(LiteralValue::Int(_)) => Some("an int"),
        Expr::Literal(LiteralValue::UInt(_)) => Some("a uint"),
        Expr::Literal(LiteralValue::Double(_)) => Some("a double"),
        Expr::Literal(LiteralValue::String(_)) => Some("a string"),
        Expr::Literal(LiteralValue::Bytes(_)) => Some("bytes"),
        Expr::Literal(LiteralValue::Null) => Some("null"),
        Expr::List(_) => Some("a list"),
        Expr::Map(_) | Expr::Struct(_) => Some("a map"),
        Expr::Call(c) => match c.func_name.as_str() {
            "_+_" | "_-_" | "_*_" | "_/_" | "_%_" | "-_" | "size" | "int" | "uint" | "double" => Some("a number"),
            "string" | "lowerAscii" | "upperAscii" | "trim" | "replace" | "join" | "format" => Some("a string"),
            "_?_:_" => c.args.get(1).and_then(not_boolean),
            _ => None,
        },
        // `map` and `filter` make lists; `all`, `exists` and `exists_one` booleans.
        Expr::Comprehension(c) => match &c.result.expr {
            Expr::Ident(_) if matches!(c.accu_init.expr, Expr::List(_)) => Some("a list"),
            _ => None,
        },
        _ => None,
    }
}

/// Every problem of `checks` at once, each with its field path: a name given twice, an
/// expression that does not compile or cannot be a boolean, neither or both of a name and a
/// selector, a selector that does not parse, a kind the API server does not serve (`served`
/// answers; `None`: not looked up), a namespace on a cluster-scoped kind or none on a
/// namespaced one.
pub fn problems(checks: &[HealthCheck], served: &dyn Fn(&HealthObject) -> Option<Served>) -> Vec<FieldProblem> {
    let mut out = vec![];
    for (i, c) in checks.iter().enumerate() {
        let at =
            |field: &str, message: String| FieldProblem { path: format!("spec.healthChecks[{i}].{field}"), message };
        if c.name.is_empty() {
            out.push(at("name", "a check needs a name: status and pauses name it".into()));
        } else if checks[..i].iter().any(|o| o.name == c.name) {
            out.push(at("name", format!("{:?} is the name of an earlier check: names are unique", c.name)));
        }
        match compile(&c.expression) {
            Err(e) => out.push(at("expression", format!("{:?} does not compile: {e}", c.expression))),
            Ok(p) => {
                if let Some(t) = not_boolean(p.expression()) {
                    out.push(at(
                        "expression",
                        format!("{:?} is {t}, not a boolean: a check is true when healthy", c.expression),
                    ));
                }
                // Macros bind their own variables (`c` in `list.exists(c, ...)`): those are known.
                let bound = |v: &str| c.expression.replace(' ', "").contains(&format!("({v},"));
                let refs = p.references();
                let unknown = refs
                    .variables()
                    .into_iter()
                    .find(|v| *v != "object" && !v.starts_with('@') && !v.starts_with("__") && !bound(v));
                if let Some(v) = unknown {
                    out.push(at("expression", format!("{v:?} is not known: the object is `object`")));
                }
            }
        }
        let o = &c.object;
        match (&o.name, &o.selector) {
            (None, None) => out.push(at("object", "name one object (`name`) or select some (`selector`)".into())),
            (Some(_), Some(_)) => out.push(at("object", "a name or a selector, not both".into())),
            (None, Some(s)) => {
                if let Err(e) = selector(s) {
                    out.push(at("object.selector", e));
                }
            }
            _ => {}
        }
        match served(o) {
            Some(Served::No(why)) => out.push(at(
                "object.kind",
                format!("the API server serves no kind {} in {}: {why}", o.kind, o.api_version),
            )),
            Some(Served::ClusterScoped) if o.namespace.is_some() => {
                out.push(at("object.namespace", format!("{} is cluster-scoped: leave the namespace out", o.kind)))
            }
            Some(Served::Namespaced) if o.namespace.is_none() => {
                out.push(at("object.namespace", format!("{} is namespaced: say which namespace", o.kind)))
            }
            _ => {}
        }
    }
    out
}

/// A label selector (`a=b,c!=d,e,!f,g in (x,y)`), read the way the API server reads it
/// (`runtime::select`).
pub fn selector(s: &str) -> Result<(), String> {
    crate::select::Selector::parse("", "", Some(s), None)
        .map(|_| ())
        .map_err(|e| format!("{s:?} is not a label selector: {e}"))
}

/// How a check's objects are named in status and pauses.
pub fn what(o: &HealthObject, name: Option<&str>) -> String {
    let ns = o.namespace.as_deref().map(|n| format!("{n}/")).unwrap_or_default();
    match (name, &o.selector) {
        (Some(n), _) => format!("{} {ns}{n}", o.kind),
        (None, Some(s)) => format!("{} {ns}(selector {s})", o.kind),
        (None, None) => format!("{} {ns}", o.kind),
    }
}

/// One check over the objects read (`Err`: why they could not be read). Every object is
/// evaluated; none read by a selector is a failure (a check that matches nothing proves nothing).
pub fn evaluate(check: &HealthCheck, read: Result<Vec<serde_json::Value>, String>) -> HealthAt {
    let fail = |object: String, result: String| HealthResult { object, passed: false, result };
    let o = &check.object;
    let results = match (compile(&check.expression), read) {
        (Err(e), _) => vec![fail(what(o, o.name.as_deref()), format!("the expression does not compile: {e}"))],
        (_, Err(e)) => vec![fail(what(o, o.name.as_deref()), e)],
        (Ok(_), Ok(objects)) if objects.is_empty() => {
            vec![fail(what(o, o.name.as_deref()), "no object matches".into())]
        }
        (Ok(p), Ok(objects)) => {
            // Kubernetes's CEL libraries registered once per check; each object is `object` in turn.
            let mut ctx = cel::Context::default().with_all();
            objects
                .iter()
                .map(|obj| {
                    let name = obj.pointer("/metadata/name").and_then(|n| n.as_str());
                    let object = what(o, name.or(o.name.as_deref()));
                    match run(&p, &mut ctx, obj) {
                        Ok(true) => HealthResult { object, passed: true, result: "true".into() },
                        Ok(false) => fail(object, "false".into()),
                        Err(e) => fail(object, e),
                    }
                })
                .collect()
        }
    };
    HealthAt { name: check.name.clone(), timeout_seconds: i64::from(check.timeout_seconds), results }
}

/// The expression on one object: its boolean, or why there is none.
fn run(p: &Program, ctx: &mut cel::Context, object: &serde_json::Value) -> Result<bool, String> {
    let value = cel::to_value(object).map_err(|e| format!("the object does not convert to CEL: {e}"))?;
    ctx.add_variable_from_value("object", value);
    match p.execute(ctx) {
        Ok(Value::Bool(b)) => Ok(b),
        Ok(v) => Err(format!("{} ({}), not a boolean", type_name(&v), short(&v))),
        Err(e) => Err(format!("error: {e}")),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "a list",
        Value::Map(_) => "a map",
        Value::Int(_) | Value::UInt(_) | Value::Float(_) => "a number",
        Value::String(_) => "a string",
        Value::Null => "null",
        _ => "a value",
    }
}

fn short(v: &Value) -> String {
    let t = match v {
        Value::String(s) => format!("{s:?}"),
        Value::Int(i) => i.to_string(),
        Value::UInt(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        other => format!("{other:?}"),
    };
    if t.chars().count() > 60 { format!("{}...", t.chars().take(60).collect::<String>()) } else { t }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(expression: &str, object: HealthObject) -> HealthCheck {
        HealthCheck { name: "gate".into(), object, expression: expression.into(), timeout_seconds: 60 }
    }

    fn cm(name: Option<&str>, selector: Option<&str>) -> HealthObject {
        HealthObject {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("default".into()),
            name: name.map(Into::into),
            selector: selector.map(Into::into),
        }
    }

    fn served(o: &HealthObject) -> Option<Served> {
        Some(match o.kind.as_str() {
            "ConfigMap" => Served::Namespaced,
            "Node" => Served::ClusterScoped,
            k => Served::No(format!("{k} is not in the discovery document")),
        })
    }

    #[test]
    fn a_check_passes_fails_or_says_why_it_has_no_boolean_per_object() {
        let c = check(r#"object.data.healthy == "true""#, cm(Some("gate"), None));
        let ok = json!({"metadata": {"name": "gate"}, "data": {"healthy": "true"}});
        let bad = json!({"metadata": {"name": "gate"}, "data": {"healthy": "no"}});
        let at = evaluate(&c, Ok(vec![ok.clone()]));
        assert_eq!(
            at.results,
            vec![HealthResult { object: "ConfigMap default/gate".into(), passed: true, result: "true".into() }]
        );
        assert_eq!(at.timeout_seconds, 60);
        assert_eq!(evaluate(&c, Ok(vec![bad])).results[0].result, "false");
        // A field the object lacks is an error, named.
        let missing = evaluate(&c, Ok(vec![json!({"metadata": {"name": "gate"}})]));
        assert!(!missing.results[0].passed && missing.results[0].result.starts_with("error: "), "{missing:?}");
        // A field read that turns out not to be a boolean.
        let s = evaluate(&check("object.data.healthy", cm(Some("gate"), None)), Ok(vec![ok]));
        assert_eq!(s.results[0].result, r#"a string ("true"), not a boolean"#);
        // A selector that matches nothing, and objects that could not be read.
        let none = evaluate(&check("true", cm(None, Some("app=x"))), Ok(vec![]));
        assert_eq!(none.results[0].object, "ConfigMap default/(selector app=x)");
        assert_eq!(none.results[0].result, "no object matches");
        let unread = evaluate(&c, Err("reading it timed out after 10 s".into()));
        assert_eq!(unread.results[0].result, "reading it timed out after 10 s");
    }

    #[test]
    fn kubernetes_cel_libraries_are_there() {
        let c = check(
            r#"object.status.conditions.exists(c, c.type == "Ready" && c.status == "True") && object.metadata.name.startsWith("n")"#,
            HealthObject {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: Some("n1".into()),
                ..Default::default()
            },
        );
        let node = json!({"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(evaluate(&c, Ok(vec![node])).results[0].passed);
        assert!(problems(&[c], &served).is_empty());
        let q = check(r#"quantity("1Gi").isGreaterThan(quantity("1Mi"))"#, cm(Some("x"), None));
        assert!(evaluate(&q, Ok(vec![json!({"metadata": {"name": "x"}})])).results[0].passed);
    }

    #[test]
    fn every_problem_is_named_with_its_field_path_at_once() {
        let mut dup = check("true", cm(Some("a"), None));
        dup.expression = "1 + 1".into();
        let checks = [
            check("object.data.x ==", cm(None, None)),
            dup,
            check(r#""healthy""#, HealthObject { kind: "CephCluster".into(), ..cm(Some("c"), Some("a=b")) }),
            check("x == 1", HealthObject { kind: "Node".into(), ..cm(None, Some("app in (a,b")) }),
            check("true", HealthObject { namespace: None, ..cm(Some("c"), None) }),
        ];
        let p: Vec<String> = problems(&checks, &served).iter().map(ToString::to_string).collect();
        let want = [
            "spec.healthChecks[0].expression: \"object.data.x ==\" does not compile: at 1:17: Syntax error",
            "spec.healthChecks[0].object: name one object",
            "spec.healthChecks[1].name: \"gate\" is the name of an earlier check",
            "spec.healthChecks[1].expression: \"1 + 1\" is a number, not a boolean",
            "spec.healthChecks[2].name: \"gate\"",
            "spec.healthChecks[2].expression: \"\\\"healthy\\\"\" is a string, not a boolean",
            "spec.healthChecks[2].object: a name or a selector, not both",
            "spec.healthChecks[2].object.kind: the API server serves no kind CephCluster in v1: CephCluster is not in the discovery document",
            "spec.healthChecks[3].name: \"gate\"",
            "spec.healthChecks[3].expression: \"x\" is not known: the object is `object`",
            "spec.healthChecks[3].object.selector: \"app in (a,b\"",
            "spec.healthChecks[3].object.namespace: Node is cluster-scoped",
            "spec.healthChecks[4].name: \"gate\"",
            "spec.healthChecks[4].object.namespace: ConfigMap is namespaced",
        ];
        for (got, want) in p.iter().zip(want) {
            assert!(got.starts_with(want), "{got}\n  wanted {want}");
        }
        assert_eq!(p.len(), want.len(), "{p:#?}");
    }

    #[test]
    fn selectors_read_as_the_api_server_reads_them() {
        for ok in ["app=x", "app==x,tier!=db", "app in (a, b),!legacy", "rook.io/cluster", "a=b, c notin (d)"] {
            assert_eq!(selector(ok), Ok(()), "{ok}");
        }
        for bad in ["=x", "app in (a", "a b"] {
            assert!(selector(bad).is_err(), "{bad}");
        }
    }
}
