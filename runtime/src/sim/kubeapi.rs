//! An in-memory Kubernetes API, for tests and demos only (feature `sim`): a tower service that
//! a real `kube_client::Client` (and the real `kubectl`) talks HTTP to, keeping objects as JSON
//! with what Ichor relies on: discovery (`discovery`: `/version`, `/api`, `/apis`, each
//! group-version's resources), `resourceVersion` conflicts on update, a write that changes
//! nothing kept as it was (same resourceVersion, no watch event), status written through the
//! status subresource only, server-side apply with field ownership (a conflict names the other
//! manager, `force` takes the fields), UID preconditions on delete, evictions that respect
//! PodDisruptionBudgets, label and field selectors, and watch events. It is not a
//! kube-apiserver: no OpenAPI documents, no server-side tables, no admission, no defaulting,
//! no garbage collection, no validation beyond what it says.
//!
//! Start at `Api::client` (a `kube_client::Client` over it) and `Api::objects` (what it holds).

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use serde_json::{Value as Json, json};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

/// An object's key: API group (`""` for the core group), plural, namespace (`""` when
/// cluster-scoped), name.
pub type Key = (String, String, String, String);

#[derive(Clone, Debug)]
struct WatchEvent {
    rv: u64,
    group: String,
    plural: String,
    namespace: String,
    kind: &'static str,
    object: Json,
}

#[derive(Clone, Default)]
struct Store {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Json>,
    /// Server-side apply: the manager owning each leaf field of each object.
    owners: BTreeMap<Key, BTreeMap<String, String>>,
    history: Vec<WatchEvent>,
    /// Requests served: method and path, in order (request-level assertions).
    log: Vec<String>,
    /// The (user, namespace, resource/subresource, verb) a SubjectAccessReview allows.
    grants: BTreeSet<(String, String, String, String)>,
}

/// The in-memory API; clones share it.
#[derive(Clone, Default)]
pub struct Api {
    store: Arc<Mutex<Store>>,
    events: Arc<Mutex<Vec<tokio::sync::mpsc::UnboundedSender<WatchEvent>>>>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("kubeapi::Api { .. }")
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn full(v: &Json, code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = code;
    r.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    r
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    full(
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()}),
        code,
    )
}

/// The kind of a plural, for list kinds and watch events of objects created without one.
fn kind_of(plural: &str) -> String {
    match plural {
        "pods" => "Pod",
        "nodes" => "Node",
        "configmaps" => "ConfigMap",
        "secrets" => "Secret",
        "serviceaccounts" => "ServiceAccount",
        "daemonsets" => "DaemonSet",
        "deployments" => "Deployment",
        "jobs" => "Job",
        "clusterrolebindings" => "ClusterRoleBinding",
        "clusterroles" => "ClusterRole",
        "poddisruptionbudgets" => "PodDisruptionBudget",
        "leases" => "Lease",
        "events" => "Event",
        "services" => "Service",
        other => return other.trim_end_matches('s').to_string(),
    }
    .to_string()
}

/// `/api/v1/...` or `/apis/G/V/...` -> (group, version, namespace, plural, name, subresource).
fn route(path: &str) -> Option<(String, String, String, String, String, String)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        r => (String::new(), r),
    };
    let get = |i: usize| rest.get(i).map(|s| s.to_string()).unwrap_or_default();
    if rest.is_empty() || rest.len() > 3 {
        return None;
    }
    Some((group, version, ns, get(0), get(1), get(2)))
}

fn query(uri: &http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(x) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(x);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=b,c=d` selectors (equality only, as Ichor uses them) against a flat view of the object.
fn selected(obj: &Json, labels: Option<&String>, fields: Option<&String>) -> bool {
    let eq = |sel: &str, get: &dyn Fn(&str) -> Option<String>| {
        sel.split(',').filter(|t| !t.is_empty()).all(|term| match term.split_once("!=") {
            Some((k, v)) => get(k).as_deref() != Some(v),
            None => match term.split_once('=') {
                Some((k, v)) => get(k.trim_end_matches('=')).as_deref() == Some(v),
                None => get(term).is_some(),
            },
        })
    };
    let label =
        |k: &str| obj.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(|v| v.as_str()).map(str::to_string);
    let field = |k: &str| {
        let ptr = format!("/{}", k.replace('.', "/"));
        obj.pointer(&ptr).and_then(|v| v.as_str().map(str::to_string).or_else(|| Some(v.to_string())))
    };
    labels.is_none_or(|s| eq(s, &label)) && fields.is_none_or(|s| eq(s, &field))
}

/// A merge patch that names a resourceVersion other than the object's: a conflict.
fn stale_version(key: &Key, patch: &Json, current: &Json) -> Option<Response<Body>> {
    let given = patch.pointer("/metadata/resourceVersion").and_then(|v| v.as_str())?;
    let have = current.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).unwrap_or("");
    (given != have).then(|| {
        status(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{}\": the object has been modified", key.1, key.3),
        )
    })
}

pub use crate::kube::merge_patch;

/// Leaf fields of an applied object (metadata's identity and bookkeeping left out), as
/// JSON pointers, with their values.
fn leaves(v: &Json, at: String, out: &mut BTreeMap<String, Json>) {
    match v {
        Json::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                if matches!(
                    p.as_str(),
                    "/apiVersion"
                        | "/kind"
                        | "/metadata/name"
                        | "/metadata/namespace"
                        | "/metadata/resourceVersion"
                        | "/metadata/uid"
                        | "/metadata/managedFields"
                        | "/metadata/creationTimestamp"
                        | "/metadata/generation"
                ) {
                    continue;
                }
                leaves(x, p, out);
            }
        }
        x => {
            out.insert(at, x.clone());
        }
    }
}

/// Whether a write changes nothing kube-apiserver keeps: the object is the same apart from the
/// fields the server stamps. Such a write keeps the resourceVersion and sends no watch event.
fn unchanged(old: &Json, next: &Json) -> bool {
    let strip = |v: &Json| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Json::as_object_mut) {
            for k in ["resourceVersion", "generation", "managedFields", "uid", "creationTimestamp"] {
                m.remove(k);
            }
        }
        v
    };
    strip(old) == strip(next)
}

/// The main resource never writes status, the status subresource writes nothing else (as
/// kube-apiserver does for every kind with a status subresource).
fn keep_status(old: &Json, next: &mut Json) {
    match old.get("status") {
        Some(st) => next["status"] = st.clone(),
        None => {
            if let Some(o) = next.as_object_mut() {
                o.remove("status");
            }
        }
    }
}

fn remove_pointer(v: &mut Json, ptr: &str) {
    let Some((parent, last)) = ptr.rsplit_once('/') else { return };
    let last = last.replace("~1", "/").replace("~0", "~");
    if let Some(Json::Object(m)) = v.pointer_mut(parent) {
        m.remove(&last);
    }
}

impl Api {
    pub fn new() -> Api {
        Api::default()
    }

    /// A real client over this API (default namespace `default`).
    pub fn client(&self) -> kube_client::Client {
        let api = self.clone();
        let svc = tower::service_fn(move |req: Request<kube_client::client::Body>| {
            let api = api.clone();
            async move { Ok::<_, Infallible>(api.serve(req).await) }
        });
        kube_client::Client::new(svc, "default")
    }

    /// Serves this API over plain HTTP on `listener`: what a kubeconfig pointing at
    /// `http://127.0.0.1:PORT` reaches (`ichor sim cluster`, the CLI's end-to-end tests).
    pub async fn serve_http(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let api = self;
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let api = api.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = axum::body::to_bytes(body, 64 << 20).await.unwrap_or_default();
                let resp = api.serve(Request::from_parts(parts, kube_client::client::Body::from(bytes))).await;
                resp.map(axum::body::Body::new)
            }
        });
        axum::serve(listener, app).await
    }

    /// A kubeconfig for an API served at `server` (`http://127.0.0.1:PORT`), context `sim`.
    pub fn kubeconfig(server: &str, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {server}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: {namespace}\ncurrent-context: sim\nusers:\n- name: sim\n  user: {{}}\n"
        )
    }

    /// Lets `user` do `verb` on `resource` (`talosclusters/cilium-values`) in `namespace`, as a
    /// SubjectAccessReview reports it.
    pub fn grant(&self, user: &str, namespace: &str, resource: &str, verb: &str) {
        if let Ok(mut s) = self.store.lock() {
            s.grants.insert((user.into(), namespace.into(), resource.into(), verb.into()));
        }
    }

    /// A copy of every object, by key.
    pub fn objects(&self) -> BTreeMap<Key, Json> {
        self.store.lock().map(|s| s.objects.clone()).unwrap_or_default()
    }

    /// One object.
    pub fn get(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Json> {
        let key = (group.to_string(), plural.to_string(), namespace.to_string(), name.to_string());
        self.store.lock().ok()?.objects.get(&key).cloned()
    }

    /// Every request served, as `METHOD path?query`.
    pub fn log(&self) -> Vec<String> {
        self.store.lock().map(|s| s.log.clone()).unwrap_or_default()
    }

    /// Puts an object as a test's fixture (created, or replaced whole).
    pub fn put(&self, group: &str, plural: &str, mut obj: Json) -> Json {
        let ns = obj.pointer("/metadata/namespace").and_then(|v| v.as_str()).unwrap_or("").to_string();
        let name = obj.pointer("/metadata/name").and_then(|v| v.as_str()).unwrap_or("").to_string();
        let key = (group.to_string(), plural.to_string(), ns, name);
        let mut s = self.store.lock().expect("kubeapi store");
        let existed = s.objects.contains_key(&key);
        if let Some(old) = s.objects.get(&key)
            && unchanged(old, &obj)
        {
            return old.clone();
        }
        self.stamp(&mut s, &key, &mut obj, !existed);
        s.objects.insert(key.clone(), obj.clone());
        self.emit(&mut s, &key, if existed { "MODIFIED" } else { "ADDED" }, obj.clone());
        obj
    }

    fn stamp(&self, s: &mut Store, key: &Key, obj: &mut Json, created: bool) {
        s.rv += 1;
        let rv = s.rv.to_string();
        if !obj.is_object() {
            *obj = json!({});
        }
        let old = s.objects.get(key).cloned();
        let meta = obj.as_object_mut().expect("an object").entry("metadata").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        let m = meta.as_object_mut().expect("metadata is an object");
        m.insert("resourceVersion".into(), json!(rv));
        m.insert("name".into(), json!(key.3));
        if !key.2.is_empty() {
            m.insert("namespace".into(), json!(key.2));
        }
        if created {
            s.uid += 1;
            m.insert("uid".into(), json!(format!("00000000-0000-0000-0000-{:012}", s.uid)));
            m.insert("creationTimestamp".into(), json!("2026-11-30T00:00:00Z"));
            m.insert("generation".into(), json!(1));
        } else if let Some(old) = &old {
            for k in ["uid", "creationTimestamp"] {
                if let Some(v) = old.pointer(&format!("/metadata/{k}")) {
                    m.insert(k.into(), v.clone());
                }
            }
            let generation = old.pointer("/metadata/generation").and_then(|g| g.as_i64()).unwrap_or(1);
            let spec_changed = old.get("spec") != obj.get("spec");
            let m = obj.pointer_mut("/metadata").and_then(|m| m.as_object_mut()).expect("metadata");
            m.insert("generation".into(), json!(if spec_changed { generation + 1 } else { generation }));
        }
    }

    fn emit(&self, s: &mut Store, key: &Key, kind: &'static str, object: Json) {
        let e = WatchEvent {
            rv: s.rv,
            group: key.0.clone(),
            plural: key.1.clone(),
            namespace: key.2.clone(),
            kind,
            object,
        };
        s.history.push(e.clone());
        if let Ok(mut subs) = self.events.lock() {
            subs.retain(|tx| tx.send(e.clone()).is_ok());
        }
    }

    async fn serve(&self, req: Request<kube_client::client::Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("reading the body: {e}")),
        };
        let q = query(&parts.uri);
        if let Ok(mut s) = self.store.lock() {
            s.log.push(format!("{} {}", parts.method, parts.uri));
        }
        if parts.method == Method::GET
            && let Some(doc) = self.discovery(parts.uri.path())
        {
            return full(&doc, StatusCode::OK);
        }
        let Some((group, version, ns, plural, name, sub)) = route(parts.uri.path()) else {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("the server could not find the requested resource {}", parts.uri.path()),
            );
        };
        let api_version = if group.is_empty() { version.clone() } else { format!("{group}/{version}") };
        let body: Json = if bytes.is_empty() {
            Json::Null
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("the body is not JSON: {e}")),
            }
        };
        // SubjectAccessReview: answered from the grants, never stored (as the API server does).
        if plural == "subjectaccessreviews" && parts.method == Method::POST {
            let a = |p: &str| body.pointer(p).and_then(Json::as_str).unwrap_or_default().to_string();
            let resource =
                format!("{}/{}", a("/spec/resourceAttributes/resource"), a("/spec/resourceAttributes/subresource"));
            let grant = (
                a("/spec/user"),
                a("/spec/resourceAttributes/namespace"),
                resource,
                a("/spec/resourceAttributes/verb"),
            );
            let allowed = self.store.lock().is_ok_and(|s| s.grants.contains(&grant));
            let mut out = body.clone();
            out["status"] = json!({"allowed": allowed});
            return full(&out, StatusCode::CREATED);
        }
        let key = (group.clone(), plural.clone(), ns.clone(), name.clone());
        let content_type = parts.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        // `dryRun=All`: the write is made, checked and answered on a copy; nothing is kept and
        // no watcher hears of it (as kube-apiserver: admission and validation run, storage not).
        let dry = parts.method != Method::GET && q.get("dryRun").is_some_and(|d| d == "All");
        let api = if dry { self.shadow() } else { self.clone() };
        match (parts.method.clone(), name.is_empty(), sub.as_str()) {
            (Method::GET, true, _) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                api.watch(&group, &plural, &ns, &q)
            }
            (Method::GET, true, _) => api.list(&group, &plural, &ns, &api_version, &q),
            (Method::GET, false, _) => match api.get(&group, &plural, &ns, &name) {
                Some(o) => full(&o, StatusCode::OK),
                None => status(StatusCode::NOT_FOUND, "NotFound", format!("{plural} \"{name}\" not found")),
            },
            (Method::POST, true, _) => api.create(&group, &plural, &ns, &api_version, body),
            (Method::POST, false, "eviction") => api.evict(&key),
            (Method::PUT, false, sub) => api.replace(&key, body, sub == "status"),
            (Method::PATCH, false, sub) => api.patch(&key, &api_version, body, &content_type, &q, sub == "status"),
            (Method::DELETE, false, "") => api.delete(&key, &body),
            (m, _, _) => {
                status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", format!("{m} is not supported here"))
            }
        }
    }

    /// The CRDs the API holds, and Ichor's (installed from the start, as `ichor install` would).
    fn crds(&self) -> (Vec<Json>, Vec<Json>) {
        let stored = self
            .store
            .lock()
            .map(|s| {
                s.objects
                    .iter()
                    .filter(|(k, _)| k.0 == "apiextensions.k8s.io" && k.1 == "customresourcedefinitions")
                    .map(|(_, v)| v.clone())
                    .collect()
            })
            .unwrap_or_default();
        let shipped = render::api::crds().iter().filter_map(|c| serde_json::to_value(c).ok()).collect();
        (stored, shipped)
    }

    /// A copy of the store no watcher listens to, for a dry run.
    fn shadow(&self) -> Api {
        let store = self.store.lock().map(|s| s.clone()).unwrap_or_default();
        Api { store: Arc::new(Mutex::new(store)), events: Arc::default() }
    }

    /// Every resource the API serves: the core kinds, Ichor's CRDs, and every CRD it holds.
    pub fn resources(&self) -> Vec<super::discovery::Resource> {
        use super::discovery::Resource;
        let mut all = Resource::builtin();
        let (stored, shipped) = self.crds();
        for crd in shipped.iter().chain(&stored) {
            for r in Resource::from_crd(crd) {
                if !all.iter().any(|x| x.group == r.group && x.version == r.version && x.plural == r.plural) {
                    all.push(r);
                }
            }
        }
        all
    }

    /// Every CRD's schema by (group, version, kind): Ichor's and those the API holds.
    fn schemas(&self) -> Vec<((String, String, String), Json)> {
        let (stored, shipped) = self.crds();
        let mut out = vec![];
        for crd in stored.iter().chain(&shipped) {
            let g = crd.pointer("/spec/group").and_then(Json::as_str).unwrap_or_default().to_string();
            let k = crd.pointer("/spec/names/kind").and_then(Json::as_str).unwrap_or_default().to_string();
            for v in crd.pointer("/spec/versions").and_then(Json::as_array).into_iter().flatten() {
                let name = v.get("name").and_then(Json::as_str).unwrap_or_default().to_string();
                if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
                    out.push(((g.clone(), name, k.clone()), schema.clone()));
                }
            }
        }
        out
    }

    /// The kind of a resource: from the resource table, else guessed from the plural.
    fn kind(&self, group: &str, plural: &str) -> String {
        use super::discovery::Resource;
        let builtin = Resource::builtin();
        if let Some(r) = builtin.iter().find(|r| r.group == group && r.plural == plural) {
            return r.kind.clone();
        }
        for c in render::api::crds() {
            if c.spec.group == group && c.spec.names.plural == plural {
                return c.spec.names.kind.clone();
            }
        }
        kind_of(plural)
    }

    /// The discovery document at `path`, when it is one.
    fn discovery(&self, path: &str) -> Option<Json> {
        use super::discovery as d;
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segs.as_slice() {
            ["version"] => Some(d::version()),
            ["api"] => Some(d::api_versions()),
            ["apis"] => Some(d::group_list(&self.resources())),
            ["api", v] => d::resource_list(&self.resources(), "", v),
            ["apis", g, v] => d::resource_list(&self.resources(), g, v),
            ["openapi", "v3"] => Some(d::openapi_root(&self.resources())),
            ["openapi", "v3", "api", v] => d::openapi_group_version(&self.resources(), &self.schemas(), "", v),
            ["openapi", "v3", "apis", g, v] => d::openapi_group_version(&self.resources(), &self.schemas(), g, v),
            _ => None,
        }
    }

    fn list(
        &self,
        group: &str,
        plural: &str,
        ns: &str,
        api_version: &str,
        q: &BTreeMap<String, String>,
    ) -> Response<Body> {
        let s = self.store.lock().expect("kubeapi store");
        let items: Vec<Json> = s
            .objects
            .iter()
            .filter(|(k, _)| k.0 == group && k.1 == plural && (ns.is_empty() || k.2 == ns))
            .map(|(_, v)| v.clone())
            .filter(|o| selected(o, q.get("labelSelector"), q.get("fieldSelector")))
            .collect();
        full(
            &json!({"apiVersion": api_version, "kind": format!("{}List", self.kind(group, plural)), "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            StatusCode::OK,
        )
    }

    fn watch(&self, group: &str, plural: &str, ns: &str, q: &BTreeMap<String, String>) -> Response<Body> {
        use futures::StreamExt;
        let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let timeout = q.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(290u64);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let past: Vec<WatchEvent> = {
            let s = self.store.lock().expect("kubeapi store");
            if let Ok(mut subs) = self.events.lock() {
                subs.push(tx);
            }
            s.history.iter().filter(|e| e.rv > from).cloned().collect()
        };
        let (group, plural, ns) = (group.to_string(), plural.to_string(), ns.to_string());
        let (ls, fs) = (q.get("labelSelector").cloned(), q.get("fieldSelector").cloned());
        let keep = move |e: &WatchEvent| {
            e.group == group
                && e.plural == plural
                && (ns.is_empty() || e.namespace == ns)
                && selected(&e.object, ls.as_ref(), fs.as_ref())
        };
        let live = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let events =
            futures::stream::iter(past).chain(live).filter(move |e| futures::future::ready(keep(e))).map(|e| {
                Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(format!(
                    "{}\n",
                    json!({"type": e.kind, "object": e.object})
                ))))
            });
        let ended = tokio_stream::StreamExt::timeout(events, std::time::Duration::from_secs(timeout.max(1)))
            .take_while(|r| futures::future::ready(r.is_ok()))
            .filter_map(|r| futures::future::ready(r.ok()));
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(ended)));
        r.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
        r
    }

    fn create(&self, group: &str, plural: &str, ns: &str, api_version: &str, mut body: Json) -> Response<Body> {
        let Some(name) = body.pointer("/metadata/name").and_then(|v| v.as_str()).map(str::to_string) else {
            return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", "metadata.name: Required value".into());
        };
        let key = (group.to_string(), plural.to_string(), ns.to_string(), name.clone());
        let mut s = self.store.lock().expect("kubeapi store");
        if s.objects.contains_key(&key) {
            return status(StatusCode::CONFLICT, "AlreadyExists", format!("{plural} \"{name}\" already exists"));
        }
        if body.get("apiVersion").is_none() {
            body["apiVersion"] = json!(api_version);
        }
        if body.get("kind").is_none() {
            body["kind"] = json!(kind_of(plural));
        }
        self.stamp(&mut s, &key, &mut body, true);
        s.objects.insert(key.clone(), body.clone());
        self.emit(&mut s, &key, "ADDED", body.clone());
        full(&body, StatusCode::CREATED)
    }

    fn replace(&self, key: &Key, mut body: Json, status_only: bool) -> Response<Body> {
        let mut s = self.store.lock().expect("kubeapi store");
        let Some(old) = s.objects.get(key).cloned() else {
            return status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{}\" not found", key.1, key.3));
        };
        let given = body.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).unwrap_or("");
        let current = old.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).unwrap_or("");
        if !given.is_empty() && given != current {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                    key.1, key.3
                ),
            );
        }
        if status_only {
            let mut next = old.clone();
            next["status"] = body.get("status").cloned().unwrap_or(Json::Null);
            body = next;
        } else {
            keep_status(&old, &mut body);
        }
        if unchanged(&old, &body) {
            return full(&old, StatusCode::OK);
        }
        self.stamp(&mut s, key, &mut body, false);
        s.objects.insert(key.clone(), body.clone());
        self.emit(&mut s, key, "MODIFIED", body.clone());
        full(&body, StatusCode::OK)
    }

    fn patch(
        &self,
        key: &Key,
        api_version: &str,
        body: Json,
        content_type: &str,
        q: &BTreeMap<String, String>,
        status_only: bool,
    ) -> Response<Body> {
        let mut s = self.store.lock().expect("kubeapi store");
        let old = s.objects.get(key).cloned();
        let apply = content_type.starts_with("application/apply-patch");
        let mut next = match (&old, apply) {
            (Some(o), _) => o.clone(),
            (None, true) => json!({"apiVersion": api_version, "kind": kind_of(&key.1), "metadata": {"name": key.3}}),
            (None, false) => {
                return status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{}\" not found", key.1, key.3));
            }
        };
        if apply {
            let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "PATCH with apply requires a fieldManager".into(),
                );
            };
            let force = q.get("force").is_some_and(|f| f == "true");
            let mut applied = BTreeMap::new();
            leaves(&body, String::new(), &mut applied);
            let owners = s.owners.entry(key.clone()).or_default();
            let mut conflicts = vec![];
            for (ptr, v) in &applied {
                if let Some(other) = owners.get(ptr)
                    && other != manager
                    && next.pointer(ptr) != Some(v)
                    && !force
                {
                    // kube-apiserver names the field as a dotted path (`.spec.kubernetesVersion`).
                    conflicts.push(format!("conflict with \"{other}\": {}", ptr.replace('/', ".")));
                }
            }
            if !conflicts.is_empty() {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Apply failed with {} conflict{}: {}",
                        conflicts.len(),
                        if conflicts.len() == 1 { "" } else { "s" },
                        conflicts.join("\n")
                    ),
                );
            }
            // Fields this manager applied before and no longer does are removed.
            let dropped: Vec<String> = owners
                .iter()
                .filter(|(p, m)| *m == manager && !applied.contains_key(*p))
                .map(|(p, _)| p.clone())
                .collect();
            for p in &dropped {
                owners.remove(p);
                remove_pointer(&mut next, p);
            }
            for p in applied.keys() {
                owners.insert(p.clone(), manager.clone());
            }
            let mut patch = body.clone();
            if let Some(m) = patch.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                m.retain(|k, _| k == "labels" || k == "annotations");
            }
            if status_only {
                next["status"] = body.get("status").cloned().unwrap_or(Json::Null);
            } else {
                merge_patch(&mut next, &patch);
                if let Some(o) = &old {
                    keep_status(o, &mut next);
                }
            }
        } else if content_type.starts_with("application/json-patch") {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                "JSON patches are not supported here".into(),
            );
        } else if let Some(stale) = stale_version(key, &body, &next) {
            return stale;
        } else if status_only {
            let mut st = next.get("status").cloned().unwrap_or(Json::Null);
            merge_patch(&mut st, body.get("status").unwrap_or(&Json::Null));
            next["status"] = st;
        } else {
            merge_patch(&mut next, &body);
            if let Some(o) = &old {
                keep_status(o, &mut next);
            }
        }
        if let Some(o) = &old
            && unchanged(o, &next)
        {
            return full(o, StatusCode::OK);
        }
        self.stamp(&mut s, key, &mut next, old.is_none());
        s.objects.insert(key.clone(), next.clone());
        self.emit(&mut s, key, if old.is_none() { "ADDED" } else { "MODIFIED" }, next.clone());
        full(&next, if old.is_none() { StatusCode::CREATED } else { StatusCode::OK })
    }

    fn delete(&self, key: &Key, body: &Json) -> Response<Body> {
        let mut s = self.store.lock().expect("kubeapi store");
        let Some(old) = s.objects.get(key).cloned() else {
            return status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{}\" not found", key.1, key.3));
        };
        if let Some(uid) = body.pointer("/preconditions/uid").and_then(|v| v.as_str()) {
            let have = old.pointer("/metadata/uid").and_then(|v| v.as_str()).unwrap_or("");
            if uid != have {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"),
                );
            }
        }
        s.objects.remove(key);
        s.owners.remove(key);
        s.rv += 1;
        self.emit(&mut s, key, "DELETED", old.clone());
        full(&old, StatusCode::OK)
    }

    /// The Eviction API: refused with 429 while a PodDisruptionBudget selecting the pod allows
    /// no disruption (its `status.disruptionsAllowed`), else the pod is deleted.
    fn evict(&self, key: &Key) -> Response<Body> {
        let pod = {
            let s = self.store.lock().expect("kubeapi store");
            match s.objects.get(&(String::new(), "pods".into(), key.2.clone(), key.3.clone())) {
                Some(p) => p.clone(),
                None => return status(StatusCode::NOT_FOUND, "NotFound", format!("pods \"{}\" not found", key.3)),
            }
        };
        let blocked = {
            let s = self.store.lock().expect("kubeapi store");
            let labels = pod.pointer("/metadata/labels").and_then(|l| l.as_object()).cloned().unwrap_or_default();
            s.objects.iter().filter(|(k, _)| k.0 == "policy" && k.1 == "poddisruptionbudgets" && k.2 == key.2).find_map(
                |(k, pdb)| {
                    let sel = pdb.pointer("/spec/selector/matchLabels").and_then(|m| m.as_object())?;
                    let matches = sel.iter().all(|(lk, lv)| labels.get(lk) == Some(lv));
                    let allowed = pdb.pointer("/status/disruptionsAllowed").and_then(|v| v.as_i64()).unwrap_or(0);
                    (matches && allowed < 1).then(|| k.3.clone())
                },
            )
        };
        if let Some(pdb) = blocked {
            return status(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                format!("Cannot evict pod as it would violate the pod's disruption budget {pdb}"),
            );
        }
        let pod_key = (String::new(), "pods".to_string(), key.2.clone(), key.3.clone());
        self.delete(&pod_key, &Json::Null);
        full(
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            StatusCode::CREATED,
        )
    }
}

/// The names of every kind this API has held (for RBAC checks in tests).
pub fn plurals(objects: &BTreeMap<Key, Json>) -> BTreeSet<(String, String)> {
    objects.keys().map(|k| (k.0.clone(), k.1.clone())).collect()
}
