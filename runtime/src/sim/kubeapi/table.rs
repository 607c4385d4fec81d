//! Server-side printing, as kube-apiserver answers a list or watch asked for
//! `application/json;as=Table;g=meta.k8s.io;v=v1` (what `kubectl get` asks for): a
//! `meta.k8s.io/v1` Table whose columns are a CRD's `additionalPrinterColumns` (Name first, Age
//! when the CRD names none) or, for the core kinds the sim serves, the columns kube-apiserver
//! prints for them; each row carries the object's metadata (`PartialObjectMetadata`) or, with
//! `includeObject=Object`, the object.
//!
//! Start at `Columns::of` (a resource's columns) and `Columns::table` (a Table of objects).

use serde_json::{Value as Json, json};

const JOB_COMPLETE: &str = "Complete"; // Kubernetes' word, not an operation phase
const JOB_FAILED: &str = "Failed"; // Kubernetes' word, not an operation phase
const JOB_RUNNING: &str = "Running"; // Kubernetes' word, not an operation phase

/// One column: its definition and how a cell is read from an object.
#[derive(Clone, Debug)]
struct Column {
    name: String,
    kind: String,
    format: String,
    priority: i64,
    cell: Cell,
}

#[derive(Clone, Debug)]
enum Cell {
    Name,
    Age,
    /// A JSONPath of a CRD's printer column, with its type.
    Path(String),
    /// A core kind's computed cell.
    Builtin(fn(&Json, i64) -> Json),
}

/// The columns of one resource.
#[derive(Clone, Debug)]
pub struct Columns(Vec<Column>);

fn col(name: &str, kind: &str, cell: Cell) -> Column {
    Column { name: name.into(), kind: kind.into(), format: String::new(), priority: 0, cell }
}

fn wide(mut c: Column) -> Column {
    c.priority = 1;
    c
}

fn name_column() -> Column {
    let mut c = col("Name", "string", Cell::Name);
    c.format = "name".into();
    c
}

fn s(v: &Json, ptr: &str) -> String {
    v.pointer(ptr).and_then(Json::as_str).unwrap_or_default().to_string()
}

fn n(v: &Json, ptr: &str) -> i64 {
    v.pointer(ptr).and_then(Json::as_i64).unwrap_or(0)
}

fn none_or(v: String) -> Json {
    if v.is_empty() { json!("<none>") } else { json!(v) }
}

/// Seconds since the epoch of an RFC 3339 time (`2026-11-30T00:00:00Z`; a fraction, as an
/// Event's `eventTime` has, ignored).
pub fn epoch(t: &str) -> Option<i64> {
    let whole = t.split(['.', 'Z', '+']).next()?;
    crate::state::epoch(&format!("{whole}Z"))
}

/// An age as kubectl prints it (`5m`, `3h12m`, `2d`), Kubernetes' `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    let (m, h) = (secs / 60, secs / 3600);
    let (d, y) = (h / 24, h / (24 * 365));
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        if secs % 60 == 0 { format!("{m}m") } else { format!("{m}m{}s", secs % 60) }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 { format!("{h}h") } else { format!("{h}h{}m", m % 60) }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 { format!("{d}d") } else { format!("{d}d{}h", h % 24) }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if h < 24 * 365 * 8 {
        let dy = d - y * 365;
        if dy == 0 { format!("{y}y") } else { format!("{y}y{dy}d") }
    } else {
        format!("{y}y")
    }
}

fn age_of(t: &str, now: i64) -> Json {
    match epoch(t) {
        Some(at) => json!(human_duration(now - at)),
        None => json!("<unknown>"),
    }
}

/// Values at a kubectl-style JSONPath (`.status.conditions[?(@.type=="Ready")].status`,
/// `.spec.items[0].name`, `.items[*].name`).
pub fn json_path<'a>(v: &'a Json, path: &str) -> Vec<&'a Json> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}').trim_start_matches('$');
    let mut cur = vec![v];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            cur = cur.into_iter().filter_map(|x| x.get(key)).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else { return vec![] };
            let inner = &r[..end];
            rest = &r[end + 1..];
            if inner == "*" {
                cur = cur.into_iter().flat_map(|x| x.as_array().into_iter().flatten()).collect();
            } else if let Some(f) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let Some((field, want)) = f.split_once("==") else { return vec![] };
                let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                cur = cur
                    .into_iter()
                    .flat_map(|x| x.as_array().into_iter().flatten())
                    .filter(|e| {
                        e.pointer(&format!("/{}", field.trim().replace('.', "/"))).is_some_and(|x| match x {
                            Json::String(s) => s == want,
                            other => *other == want,
                        })
                    })
                    .collect();
            } else if let Ok(i) = inner.parse::<usize>() {
                cur = cur.into_iter().filter_map(|x| x.get(i)).collect();
            } else {
                let key = inner.trim_matches(|c| c == '\'' || c == '"');
                cur = cur.into_iter().filter_map(|x| x.get(key)).collect();
            }
        } else {
            return vec![];
        }
    }
    cur
}

fn pod_ready(p: &Json, _: i64) -> Json {
    let st = p.pointer("/status/containerStatuses").and_then(Json::as_array).cloned().unwrap_or_default();
    let total = p.pointer("/spec/containers").and_then(Json::as_array).map_or(st.len(), Vec::len);
    let ready = st.iter().filter(|c| c.get("ready") == Some(&json!(true))).count();
    json!(format!("{ready}/{total}"))
}

fn pod_restarts(p: &Json, _: i64) -> Json {
    let st = p.pointer("/status/containerStatuses").and_then(Json::as_array).cloned().unwrap_or_default();
    json!(st.iter().map(|c| c.get("restartCount").and_then(Json::as_i64).unwrap_or(0)).sum::<i64>())
}

fn node_status(v: &Json, _: i64) -> Json {
    let conds = v.pointer("/status/conditions").and_then(Json::as_array).cloned().unwrap_or_default();
    let ready = conds.iter().find(|c| c.get("type") == Some(&json!("Ready")));
    let mut out = match ready.and_then(|c| c.get("status")).and_then(Json::as_str) {
        Some("True") => "Ready".to_string(),
        _ => "NotReady".to_string(),
    };
    if v.pointer("/spec/unschedulable") == Some(&json!(true)) {
        out.push_str(",SchedulingDisabled");
    }
    json!(out)
}

fn node_roles(v: &Json, _: i64) -> Json {
    let labels = v.pointer("/metadata/labels").and_then(Json::as_object).cloned().unwrap_or_default();
    let roles: Vec<&str> =
        labels.keys().filter_map(|k| k.strip_prefix("node-role.kubernetes.io/")).filter(|r| !r.is_empty()).collect();
    none_or(roles.join(","))
}

fn event_object(e: &Json, _: i64) -> Json {
    let o = e.get("involvedObject").or_else(|| e.get("regarding")).cloned().unwrap_or_default();
    json!(format!("{}/{}", s(&o, "/kind").to_lowercase(), s(&o, "/name")))
}

fn event_last_seen(e: &Json, now: i64) -> Json {
    let t = [
        "/series/lastObservedTime",
        "/lastTimestamp",
        "/deprecatedLastTimestamp",
        "/eventTime",
        "/metadata/creationTimestamp",
    ]
    .iter()
    .map(|p| s(e, p))
    .find(|t| !t.is_empty())
    .unwrap_or_default();
    age_of(&t, now)
}

fn data_count(v: &Json, _: i64) -> Json {
    let count = |p: &str| v.get(p).and_then(Json::as_object).map_or(0, |m| m.len());
    json!(count("data") + count("binaryData") + count("stringData"))
}

impl Columns {
    /// The columns of `group`/`plural`: `printer` is the CRD version's
    /// `additionalPrinterColumns` when the resource is a CRD's (`None` for a core kind).
    pub fn of(group: &str, plural: &str, printer: Option<&[Json]>) -> Columns {
        let age = || col("Age", "string", Cell::Age);
        let b = |name: &str, f: fn(&Json, i64) -> Json| col(name, "string", Cell::Builtin(f));
        if let Some(printer) = printer {
            let mut cols = vec![name_column()];
            for c in printer {
                let path = c.get("jsonPath").and_then(Json::as_str).unwrap_or_default().to_string();
                let mut column = col(
                    c.get("name").and_then(Json::as_str).unwrap_or_default(),
                    c.get("type").and_then(Json::as_str).unwrap_or("string"),
                    if path == ".metadata.creationTimestamp" { Cell::Age } else { Cell::Path(path) },
                );
                column.priority = c.get("priority").and_then(Json::as_i64).unwrap_or(0);
                column.format = c.get("format").and_then(Json::as_str).unwrap_or_default().to_string();
                cols.push(column);
            }
            if printer.is_empty() {
                cols.push(age());
            }
            return Columns(cols);
        }
        let cols = match (group, plural) {
            ("", "pods") => vec![
                name_column(),
                b("Ready", pod_ready),
                b("Status", |p, _| json!(s(p, "/status/phase"))),
                b("Restarts", pod_restarts),
                age(),
                wide(b("IP", |p, _| none_or(s(p, "/status/podIP")))),
                wide(b("Node", |p, _| none_or(s(p, "/spec/nodeName")))),
            ],
            ("", "nodes") => vec![
                name_column(),
                b("Status", node_status),
                b("Roles", node_roles),
                age(),
                b("Version", |v, _| json!(s(v, "/status/nodeInfo/kubeletVersion"))),
            ],
            ("", "events") | ("events.k8s.io", "events") => vec![
                b("Last Seen", event_last_seen),
                b("Type", |e, _| json!(s(e, "/type"))),
                b("Reason", |e, _| json!(s(e, "/reason"))),
                b("Object", event_object),
                b("Message", |e, _| {
                    json!(e.get("message").or_else(|| e.get("note")).and_then(Json::as_str).unwrap_or_default())
                }),
            ],
            ("", "configmaps") => vec![name_column(), b("Data", data_count), age()],
            ("", "secrets") => {
                vec![name_column(), b("Type", |v, _| json!(s(v, "/type"))), b("Data", data_count), age()]
            }
            ("", "namespaces") => {
                vec![name_column(), b("Status", |v, _| json!(s(v, "/status/phase"))), age()]
            }
            ("coordination.k8s.io", "leases") => {
                vec![name_column(), b("Holder", |v, _| json!(s(v, "/spec/holderIdentity"))), age()]
            }
            ("apps", "deployments") => vec![
                name_column(),
                b("Ready", |v, _| {
                    json!(format!("{}/{}", n(v, "/status/readyReplicas"), n(v, "/spec/replicas").max(1)))
                }),
                b("Up-to-date", |v, _| json!(n(v, "/status/updatedReplicas"))),
                b("Available", |v, _| json!(n(v, "/status/availableReplicas"))),
                age(),
            ],
            ("apps", "daemonsets") => vec![
                name_column(),
                b("Desired", |v, _| json!(n(v, "/status/desiredNumberScheduled"))),
                b("Current", |v, _| json!(n(v, "/status/currentNumberScheduled"))),
                b("Ready", |v, _| json!(n(v, "/status/numberReady"))),
                b("Up-to-date", |v, _| json!(n(v, "/status/updatedNumberScheduled"))),
                b("Available", |v, _| json!(n(v, "/status/numberAvailable"))),
                age(),
            ],
            ("batch", "jobs") => vec![
                name_column(),
                b("Status", |v, _| {
                    let done = n(v, "/status/succeeded") > 0;
                    let failed = n(v, "/status/failed") > 0;
                    json!(if done {
                        JOB_COMPLETE
                    } else if failed {
                        JOB_FAILED
                    } else {
                        JOB_RUNNING
                    })
                }),
                b("Completions", |v, _| {
                    json!(format!("{}/{}", n(v, "/status/succeeded"), n(v, "/spec/completions").max(1)))
                }),
                age(),
            ],
            _ => vec![name_column(), age()],
        };
        Columns(cols)
    }

    /// A Table of `objects` at `now` (seconds since the epoch); rows carry the whole object when
    /// `whole`, else its metadata.
    pub fn table(&self, objects: &[Json], resource_version: &str, now: i64, whole: bool) -> Json {
        let defs: Vec<Json> = self
            .0
            .iter()
            .map(|c| {
                json!({"name": c.name, "type": c.kind, "format": c.format, "description": "", "priority": c.priority})
            })
            .collect();
        let rows: Vec<Json> = objects.iter().map(|o| self.row(o, now, whole)).collect();
        json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
               "columnDefinitions": defs, "rows": rows})
    }

    fn row(&self, o: &Json, now: i64, whole: bool) -> Json {
        let cells: Vec<Json> = self
            .0
            .iter()
            .map(|c| match &c.cell {
                Cell::Name => json!(s(o, "/metadata/name")),
                Cell::Age => age_of(&s(o, "/metadata/creationTimestamp"), now),
                Cell::Builtin(f) => f(o, now),
                Cell::Path(p) => {
                    let found = json_path(o, p);
                    match (found.as_slice(), c.kind.as_str()) {
                        ([], _) => Json::Null,
                        ([Json::String(t)], "date") => age_of(t, now),
                        ([one], _) => (*one).clone(),
                        (many, _) => json!(
                            many.iter()
                                .map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()))
                                .collect::<Vec<_>>()
                                .join(",")
                        ),
                    }
                }
            })
            .collect();
        let object = if whole {
            o.clone()
        } else {
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata").cloned().unwrap_or_default()})
        };
        json!({"cells": cells, "object": object})
    }
}

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=Table"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_print_as_kubectl_prints_them() {
        for (secs, want) in [
            (5, "5s"),
            (119, "119s"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600 + 120, "3h2m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 3600, "3d1h"),
            (40 * 86400, "40d"),
            (800 * 86400, "2y70d"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
        assert_eq!(epoch("1970-01-02T00:00:01Z"), Some(86401));
        assert_eq!(epoch("2026-11-30T00:00:00.123456Z").map(|t| t % 86400), Some(0));
    }

    #[test]
    fn a_crds_printer_columns_read_their_json_paths() {
        let printer = vec![
            json!({"name": "Role", "type": "string", "jsonPath": ".spec.role"}),
            json!({"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}),
        ];
        let cols = Columns::of("ichor.maesh.dev", "talosmachines", Some(&printer));
        let m = json!({"metadata": {"name": "cp1", "creationTimestamp": "1970-01-01T00:00:00Z"},
            "spec": {"role": "controlplane"},
            "status": {"conditions": [{"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        let t = cols.table(&[m], "7", 90, false);
        assert_eq!(t["rows"][0]["cells"], json!(["cp1", "controlplane", "True"]));
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["columnDefinitions"][0]["format"], "name");
        let none = Columns::of("x", "ys", Some(&[])).table(&[json!({"metadata": {"name": "a"}})], "1", 0, true);
        assert_eq!(none["rows"][0]["cells"], json!(["a", "<unknown>"]));
    }

    #[test]
    fn json_paths_index_filter_and_spread() {
        let v = json!({"a": [{"n": 1, "k": "x"}, {"n": 2, "k": "y"}]});
        assert_eq!(json_path(&v, ".a[1].n"), vec![&json!(2)]);
        assert_eq!(json_path(&v, "{.a[*].k}"), vec![&json!("x"), &json!("y")]);
        assert_eq!(json_path(&v, ".a[?(@.k=='y')].n"), vec![&json!(2)]);
        assert!(json_path(&v, ".b.c").is_empty());
    }
}
