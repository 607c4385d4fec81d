//! Label and field selectors as kube-apiserver parses them, for the in-memory API's lists and
//! watches and the health checks' selectors (`runtime::health`): label selectors with equality
//! (`a=b`, `a==b`, `a!=b`), existence (`a`, `!a`) and set-based requirements (`a in (x,y)`, `a notin (x)`), field selectors on the fields each
//! kind supports (`metadata.name`, `metadata.namespace`, and per kind, `involvedObject.*` for
//! events, `spec.nodeName` for pods ...), an unsupported field refused as the server refuses it.
//!
//! Start at `Selector::parse`; `Selector::matches` tests an object.

use serde_json::Value as Json;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Req {
    Exists(String),
    Absent(String),
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector and field selector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    labels: Vec<Req>,
    fields: Vec<Req>,
}

/// Why a selector is refused (400 BadRequest, with this text).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label requirement that does not parse.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// A field selector term that does not parse.
    #[error("invalid selector: '{0}'; can't understand '{1}'")]
    Field(String, String),
    /// A field the kind does not support.
    #[error("field label not supported: {0}")]
    Unsupported(String),
}

/// The fields a kind's field selectors accept, beyond `metadata.name` and `metadata.namespace`.
fn field_labels(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "events") | ("events.k8s.io", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reportingController",
        ],
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        ("batch", "jobs") => &["status.successful"],
        _ => &[],
    }
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 316
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && k.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Splits at commas outside parentheses.
fn terms(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (vec![], String::new(), 0usize);
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect()
}

/// `k!=v`, `k==v` or `k=v`: (key, value, negated).
fn equality(term: &str) -> Option<(&str, &str, bool)> {
    if let Some((k, v)) = term.split_once("!=") {
        Some((k, v, true))
    } else if let Some((k, v)) = term.split_once("==") {
        Some((k, v, false))
    } else {
        term.split_once('=').map(|(k, v)| (k, v, false))
    }
}

fn label_req(term: &str) -> Result<Req, SelectorError> {
    let bad = |why: &str| SelectorError::Label(format!("{term}: {why}"));
    let set = |rest: &str| -> Result<Vec<String>, SelectorError> {
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| bad("a set is written (a,b)"))?;
        let vals: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
        if let Some(v) = vals.iter().find(|v| !valid_value(v)) {
            return Err(bad(&format!("invalid label value: \"{v}\"")));
        }
        Ok(vals)
    };
    if let Some(k) = term.strip_prefix('!') {
        let k = k.trim();
        return if valid_key(k) { Ok(Req::Absent(k.into())) } else { Err(bad("invalid label key")) };
    }
    let words: Vec<&str> = term.splitn(2, char::is_whitespace).collect();
    if let [k, rest] = words.as_slice() {
        let rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("notin") {
            return Ok(Req::NotIn(k.to_string(), set(r)?));
        }
        if let Some(r) = rest.strip_prefix("in") {
            return Ok(Req::In(k.to_string(), set(r)?));
        }
    }
    let Some((k, v, ne)) = equality(term) else {
        return if valid_key(term) { Ok(Req::Exists(term.into())) } else { Err(bad("invalid label key")) };
    };
    let (k, v) = (k.trim(), v.trim());
    if !valid_key(k) {
        return Err(bad(&format!("invalid label key \"{k}\"")));
    }
    if !valid_value(v) {
        return Err(bad(&format!("invalid label value: \"{v}\"")));
    }
    Ok(if ne { Req::Ne(k.into(), v.into()) } else { Req::Eq(k.into(), v.into()) })
}

fn field_req(term: &str, group: &str, plural: &str, all: &str) -> Result<Req, SelectorError> {
    let Some((k, v, ne)) = equality(term) else {
        return Err(SelectorError::Field(all.into(), term.into()));
    };
    let k = k.trim();
    if !matches!(k, "metadata.name" | "metadata.namespace") && !field_labels(group, plural).contains(&k) {
        return Err(SelectorError::Unsupported(k.into()));
    }
    Ok(if ne { Req::Ne(k.into(), v.into()) } else { Req::Eq(k.into(), v.into()) })
}

impl Selector {
    /// The selectors of a list or watch of `group`/`plural`, from the query's
    /// `labelSelector` and `fieldSelector`.
    pub fn parse(
        group: &str,
        plural: &str,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Result<Selector, SelectorError> {
        let labels = terms(labels.unwrap_or("")).iter().map(|t| label_req(t)).collect::<Result<_, _>>()?;
        let all = fields.unwrap_or("");
        let fields = all.split(',').filter(|t| !t.trim().is_empty()).map(|t| field_req(t.trim(), group, plural, all));
        Ok(Selector { labels, fields: fields.collect::<Result<_, _>>()? })
    }

    /// Whether `obj` is selected.
    pub fn matches(&self, obj: &Json) -> bool {
        let label = |k: &str| obj.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Json::as_str);
        let field = |k: &str| -> Option<String> {
            let v = obj.pointer(&format!("/{}", k.replace('.', "/")));
            // A field the object leaves out is its zero value, as the server's field sets say.
            Some(match v {
                None | Some(Json::Null) => String::new(),
                Some(Json::String(s)) => s.clone(),
                Some(x) => x.to_string(),
            })
        };
        let test = |r: &Req, get: &dyn Fn(&str) -> Option<String>| match r {
            Req::Exists(k) => get(k).is_some(),
            Req::Absent(k) => get(k).is_none(),
            Req::Eq(k, v) => get(k).as_deref() == Some(v),
            Req::Ne(k, v) => get(k).as_deref() != Some(v),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
        };
        let label = |k: &str| label(k).map(str::to_string);
        self.labels.iter().all(|r| test(r, &label)) && self.fields.iter().all(|r| test(r, &field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Json {
        json!({"metadata": {"name": "p", "namespace": "kube-system", "labels": {"app": "cilium", "tier": "node"}},
               "spec": {"nodeName": "cp1"}})
    }

    fn sel(labels: &str, fields: &str) -> Selector {
        Selector::parse("", "pods", Some(labels), Some(fields)).unwrap()
    }

    #[test]
    fn equality_existence_and_sets_select_as_kubectl_means_them() {
        let p = pod();
        assert!(sel("app=cilium", "").matches(&p));
        assert!(sel("app==cilium,tier", "").matches(&p));
        assert!(!sel("app!=cilium", "").matches(&p));
        assert!(sel("!missing", "").matches(&p));
        assert!(!sel("!app", "").matches(&p));
        assert!(sel("app in (cilium, kube-proxy)", "").matches(&p));
        assert!(!sel("app notin (cilium)", "").matches(&p));
        assert!(sel("missing notin (x)", "").matches(&p));
        assert!(sel("app in (cilium),tier in (node)", "spec.nodeName=cp1").matches(&p));
        assert!(!sel("", "spec.nodeName=w1").matches(&p));
        assert!(sel("", "spec.nodeName!=w1,metadata.namespace=kube-system").matches(&p));
    }

    #[test]
    fn bad_selectors_are_refused_with_the_servers_words() {
        let e = Selector::parse("", "pods", None, Some("spec.foo=x")).unwrap_err();
        assert_eq!(e.to_string(), "field label not supported: spec.foo");
        let e = Selector::parse("ichor.maesh.dev", "talosmachines", None, Some("spec.role=worker")).unwrap_err();
        assert_eq!(e.to_string(), "field label not supported: spec.role");
        let e = Selector::parse("", "pods", Some("app in cilium"), None).unwrap_err();
        assert!(e.to_string().starts_with("unable to parse requirement: app in cilium"), "{e}");
        let e = Selector::parse("", "pods", Some("a=b c"), None).unwrap_err();
        assert!(e.to_string().contains("invalid label value"), "{e}");
        assert!(Selector::parse("", "events", None, Some("involvedObject.name=cp1,involvedObject.kind=X")).is_ok());
    }
}
