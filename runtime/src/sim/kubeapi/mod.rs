//! An in-memory Kubernetes API, for tests and demos only (feature `sim`): a tower service that
//! a real `kube_client::Client` (and the real `kubectl`) talks HTTP to, keeping objects as JSON
//! with the semantics a controller relies on, each as kube-apiserver has it:
//!
//! - discovery and OpenAPI (`discovery`), server-side Tables with the CRDs' printer columns
//!   (`table`), Events readable in both the `core/v1` and `events.k8s.io/v1` views (`events`);
//! - `resourceVersion` conflicts on update; a write that changes nothing kept as it was (same
//!   resourceVersion, no watch event); status written through the status subresource only;
//!   `generation` moved by spec changes only; finalizers and `deletionTimestamp`;
//! - `dryRun=All`; `fieldValidation` `Strict`/`Warn`/`Ignore`, pruning, defaulting and the
//!   CRDs' CEL rules (`schema`); merge, JSON and strategic merge patches (`patch`);
//!   server-side apply with field ownership, conflicts naming the manager, `managedFields`;
//! - label selectors with set-based requirements and the field selectors kubectl uses
//!   (`select`); `limit`/`continue`; watches that resume from a resourceVersion, send bookmarks
//!   when asked and answer 410 Gone for one compacted away; evictions that respect
//!   PodDisruptionBudgets; UID preconditions on delete;
//! - faults on demand (`Faults`): a fraction of writes answered 409, 500 or 429, watches
//!   dropped, latency.
//!
//! It is not a kube-apiserver: no authentication or authorization (SubjectAccessReviews are
//! answered from `Api::grant`), no admission webhooks, no OpenAPI type validation of the core
//! kinds, no garbage collection of owned objects, no protobuf.
//!
//! Start at `Api::client` (a `kube_client::Client` over it), `Api::serve_http` (what kubectl
//! reaches) and `Api::objects` (what it holds).

mod events;
pub mod patch;
pub mod schema;
pub mod table;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use serde_json::{Value as Json, json};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An object's key: API group (`""` for the core group), plural, namespace (`""` when
/// cluster-scoped), name.
pub type Key = (String, String, String, String);

/// How many watch events the API keeps; a watch from before the oldest is answered 410 Gone.
const HISTORY: usize = 20_000;

#[derive(Clone, Debug)]
struct WatchEvent {
    rv: u64,
    group: String,
    plural: String,
    namespace: String,
    kind: &'static str,
    object: Json,
}

/// Who owns a field, for server-side apply and `managedFields`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owner {
    manager: String,
    /// An `Apply` (server-side apply), else an `Update`.
    apply: bool,
    api_version: String,
}

/// Faults the API injects, for rehearsals and tests (`ichor sim cluster --api-fault ...`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Writes answered with this HTTP status (409, 500 or 429) instead of being made: the
    /// status and the fraction of writes, chosen by a fixed sequence (reproducible).
    pub writes: Vec<(u16, f64)>,
    /// Every watch stream is cut after this long.
    pub drop_watches_after: Option<Duration>,
    /// Every request waits this long before it is served.
    pub latency: Duration,
    /// Only requests whose User-Agent starts with this meet the faults (`for=ichor-controller`:
    /// the controller's, not the CLI's or kubectl's); `None`: every request.
    pub only_agent: Option<String>,
}

impl Faults {
    /// Whether a request from this User-Agent meets the faults.
    pub fn apply_to(&self, user_agent: &str) -> bool {
        self.only_agent.as_ref().is_none_or(|a| user_agent.starts_with(a.as_str()))
    }

    /// A fault as `ichor sim cluster --api-fault` names it: `409=0.1`, `500=0.05`,
    /// `429=0.2`, `drop-watch=30s`, `latency=200ms`.
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        let (k, v) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec}: expected KIND=VALUE (409=0.1, drop-watch=30s, latency=200ms)"))?;
        let duration = |v: &str| -> Result<Duration, String> {
            let (n, unit) = v.find(|c: char| !c.is_ascii_digit()).map_or((v, "s"), |i| v.split_at(i));
            let n: u64 = n.parse().map_err(|_| format!("{spec}: {v} is not a duration (30s, 200ms)"))?;
            match unit {
                "ms" => Ok(Duration::from_millis(n)),
                "s" => Ok(Duration::from_secs(n)),
                "m" => Ok(Duration::from_secs(n * 60)),
                _ => Err(format!("{spec}: {v} is not a duration (30s, 200ms)")),
            }
        };
        match k {
            "409" | "500" | "429" => {
                let p: f64 = v.parse().map_err(|_| format!("{spec}: {v} is not a fraction"))?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(format!("{spec}: the fraction of writes is between 0 and 1"));
                }
                self.writes.push((k.parse().expect("a status"), p));
            }
            "drop-watch" => self.drop_watches_after = Some(duration(v)?),
            "latency" => self.latency = duration(v)?,
            "for" if !v.is_empty() => self.only_agent = Some(v.to_string()),
            _ => {
                return Err(format!(
                    "{spec}: unknown fault {k:?}; one of 409, 500, 429, drop-watch, latency, for=USER-AGENT-PREFIX"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Default)]
struct Store {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Json>,
    /// The manager owning each leaf field of each object.
    owners: BTreeMap<Key, BTreeMap<String, Vec<Owner>>>,
    history: std::collections::VecDeque<WatchEvent>,
    /// The resourceVersion of the newest event dropped from `history` (0: none).
    compacted: u64,
    /// Requests served: method and path, in order (request-level assertions).
    log: Vec<String>,
    /// The (user, namespace, resource/subresource, verb) a SubjectAccessReview allows.
    grants: BTreeSet<(String, String, String, String)>,
    faults: Faults,
    /// Writes seen, for the fault sequence.
    writes: u64,
}

impl Store {
    /// The CRDs the API holds, and Ichor's (installed from the start, as `ichor install` would).
    fn crds(&self) -> (Vec<Json>, &'static [Json]) {
        // The objects are ordered by group and resource: the CRDs are one range, read without
        // walking the rest (a list asks on every request, at 5,000 machines too).
        let (group, plural) = ("apiextensions.k8s.io", "customresourcedefinitions");
        let from: Key = (group.into(), plural.into(), String::new(), String::new());
        let stored = self
            .objects
            .range(from..)
            .take_while(|(k, _)| k.0 == group && k.1 == plural)
            .map(|(_, v)| v.clone())
            .collect();
        (stored, shipped_crds())
    }

    /// Whether `group`/`plural` is a custom resource (a CRD it holds or ships).
    fn is_custom(&self, group: &str, plural: &str) -> bool {
        let (stored, shipped) = self.crds();
        stored.iter().chain(shipped).any(|crd| {
            crd.pointer("/spec/group").and_then(Json::as_str) == Some(group)
                && crd.pointer("/spec/names/plural").and_then(Json::as_str) == Some(plural)
        })
    }

    /// The version of the CRD that serves `group`/`plural` at `version`.
    fn crd_version(&self, group: &str, version: &str, plural: &str) -> Option<(String, Json)> {
        let (stored, shipped) = self.crds();
        stored.iter().chain(shipped).find_map(|crd| {
            let s = |p: &str| crd.pointer(p).and_then(Json::as_str).unwrap_or_default();
            if s("/spec/group") != group || s("/spec/names/plural") != plural {
                return None;
            }
            let v = crd
                .pointer("/spec/versions")
                .and_then(Json::as_array)?
                .iter()
                .find(|v| v.get("name").and_then(Json::as_str) == Some(version))?;
            Some((s("/spec/names/kind").to_string(), v.clone()))
        })
    }

    /// Every resource the API serves: the core kinds, Ichor's CRDs, and every CRD it holds.
    fn resources(&self) -> Vec<super::discovery::Resource> {
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
        for crd in stored.iter().chain(shipped) {
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

    /// The kind of a resource, from the resource table.
    fn kind(&self, group: &str, plural: &str) -> String {
        self.resources()
            .into_iter()
            .find(|r| r.group == group && r.plural == plural)
            .map(|r| r.kind)
            .unwrap_or_else(|| plural.trim_end_matches('s').to_string())
    }
}

/// The in-memory API; clones share it.
#[derive(Clone, Default)]
pub struct Api {
    store: Arc<Mutex<Store>>,
    events: Arc<Mutex<Vec<tokio::sync::mpsc::UnboundedSender<WatchEvent>>>>,
    admission: Arc<Mutex<Option<Arc<Admission>>>>,
}

/// The answer of a validating webhook to an AdmissionReview (the review's JSON, whole).
pub type Review = std::pin::Pin<Box<dyn std::future::Future<Output = Json> + Send>>;

/// A validating admission webhook the API calls, as kube-apiserver calls the one a
/// ValidatingWebhookConfiguration names: for a CREATE or UPDATE of one of `plurals` of `group`
/// (not their status), with the object as it would be stored (defaulted, validated) and the
/// old one, before it is stored; dry runs included. A refusal is answered with the webhook's
/// code and kube-apiserver's words (`admission webhook "NAME" denied the request: ...`); its
/// warnings go out as `Warning` headers.
pub struct Admission {
    pub name: String,
    pub group: String,
    pub plurals: Vec<String>,
    pub review: Box<dyn Fn(Json) -> Review + Send + Sync>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("kubeapi::Api { .. }")
    }
}

type Body = BoxBody<Bytes, Infallible>;

/// Who every request to the sim is (it has no authentication): its kubeconfig's admin, in the
/// group kube-apiserver's authorizer allows everything.
pub const SIM_USER: &str = "kubernetes-admin";
pub const SIM_ADMIN_GROUP: &str = "system:masters";

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

fn not_found(plural: &str, name: &str) -> Response<Body> {
    status(StatusCode::NOT_FOUND, "NotFound", format!("{plural} \"{name}\" not found"))
}

/// Now, as RFC 3339 and as seconds since the epoch.
fn now() -> (String, i64) {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    (crate::plan::rfc3339(t), t)
}

/// `/api/v1/...` or `/apis/G/V/...` -> (group, version, namespace, plural, name, subresource).
/// A request's body as JSON (kubectl sends server-side apply bodies as YAML); protobuf and
/// what parses as neither are refused as kube-apiserver refuses them.
#[allow(clippy::result_large_err)]
fn request_body(content_type: &str, bytes: &[u8]) -> Result<Json, Response<Body>> {
    if content_type.starts_with("application/vnd.kubernetes.protobuf") && !bytes.is_empty() {
        // kubectl's typed generators (`kubectl create configmap`) write protobuf; the sim
        // speaks JSON and YAML only (`kubectl create -f` and `apply` send JSON).
        return Err(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (the simulated API does not decode {content_type}; write the object from a file: kubectl create -f)"
            ),
        ));
    }
    Ok(if bytes.is_empty() {
        Json::Null
    } else if let Ok(v) = serde_json::from_slice(bytes) {
        v
    } else {
        // kubectl sends server-side apply bodies as YAML.
        match serde_yaml::from_slice::<Json>(bytes) {
            Ok(v) => v,
            Err(e) => {
                return Err(status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("the body is not JSON or YAML: {e}"),
                ));
            }
        }
    })
}

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

/// A list's `continue` token: the key after which the next page starts (hex, opaque to clients).
fn continue_token(k: &Key) -> String {
    format!("{}\u{1}{}", k.2, k.3).bytes().map(|b| format!("{b:02x}")).collect()
}

fn from_token(t: &str) -> Option<(String, String)> {
    let bytes: Option<Vec<u8>> =
        (0..t.len()).step_by(2).map(|i| t.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (ns, name) = text.split_once('\u{1}')?;
    Some((ns.to_string(), name.to_string()))
}

/// A merge patch that names a resourceVersion other than the object's: a conflict.
fn stale_version(key: &Key, patch: &Json, current: &Json) -> Option<Response<Body>> {
    let given = patch.pointer("/metadata/resourceVersion").and_then(|v| v.as_str())?;
    let have = current.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).unwrap_or("");
    (given != have).then(|| conflict(key))
}

fn conflict(key: &Key) -> Response<Body> {
    status(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
            key.1, key.3
        ),
    )
}

pub use crate::kube::merge_patch;

/// Leaf fields of an object (metadata's identity and bookkeeping left out), as JSON pointers,
/// with their values.
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
                        | "/metadata/deletionTimestamp"
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

/// `managedFields` from the owners of an object's fields: one entry per manager and operation,
/// its fields as `FieldsV1` (`{"f:spec": {"f:kubernetesVersion": {}}}`).
fn managed_fields(owners: &BTreeMap<String, Vec<Owner>>, time: &str) -> Json {
    let mut by: BTreeMap<(String, bool, String), Json> = BTreeMap::new();
    for (ptr, o) in owners.iter().flat_map(|(p, os)| os.iter().map(move |o| (p, o))) {
        let tree = by.entry((o.manager.clone(), o.apply, o.api_version.clone())).or_insert_with(|| json!({}));
        let mut at = tree;
        for seg in ptr.trim_start_matches('/').split('/') {
            let seg = seg.replace("~1", "/").replace("~0", "~");
            at = at.as_object_mut().expect("a fields tree").entry(format!("f:{seg}")).or_insert_with(|| json!({}));
        }
    }
    Json::Array(
        by.into_iter()
            .map(|((manager, apply, api_version), fields)| {
                json!({"manager": manager, "operation": if apply { "Apply" } else { "Update" },
                       "apiVersion": api_version, "time": time, "fieldsType": "FieldsV1", "fieldsV1": fields})
            })
            .collect(),
    )
}

/// The manager of a write that is not an apply: `fieldManager`, else the User-Agent's
/// program name (`kubectl`, as kube-apiserver derives it).
fn manager_of(q: &BTreeMap<String, String>, agent: &str) -> String {
    match q.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => m.clone(),
        None => agent.split('/').next().filter(|a| !a.is_empty()).unwrap_or("unknown").to_string(),
    }
}

/// The selectors of a list, watch or collection delete, or the 400 refusing them.
fn selector(
    group: &str,
    plural: &str,
    q: &BTreeMap<String, String>,
) -> Result<crate::select::Selector, Box<Response<Body>>> {
    crate::select::Selector::parse(
        group,
        plural,
        q.get("labelSelector").map(String::as_str),
        q.get("fieldSelector").map(String::as_str),
    )
    .map_err(|e| Box::new(status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string())))
}

/// What a write carries besides its body.
struct Write {
    api_version: String,
    manager: String,
    mode: schema::Validation,
    status_only: bool,
    /// The resource has a status subresource: the main resource does not write status.
    status_subresource: bool,
}

/// The CRDs Ichor ships, as JSON (serialized once).
fn shipped_crds() -> &'static [Json] {
    static CRDS: std::sync::OnceLock<Vec<Json>> = std::sync::OnceLock::new();
    CRDS.get_or_init(|| render::api::crds().iter().filter_map(|c| serde_json::to_value(c).ok()).collect())
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

    /// Injects `faults` from now on.
    pub fn set_faults(&self, faults: Faults) {
        if let Ok(mut s) = self.store.lock() {
            s.faults = faults;
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

    /// Every request served, as `METHOD path?query`; an apply that created its object adds a
    /// line `rbac::APPLY_CREATE path` (the create RBAC checks besides the patch).
    pub fn log(&self) -> Vec<String> {
        self.store.lock().map(|s| s.log.clone()).unwrap_or_default()
    }

    /// Puts an object as a test's fixture (created, or replaced whole; no validation).
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
        if key.0.is_empty() && key.1 == "secrets" {
            string_data_into_data(obj);
        }
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
        let generation = keeps_generation(&key.0, &key.1);
        if !generation {
            m.remove("generation");
        }
        if created {
            s.uid += 1;
            m.insert("uid".into(), json!(format!("00000000-0000-0000-0000-{:012}", s.uid)));
            m.insert("creationTimestamp".into(), json!(now().0));
            if generation {
                m.insert("generation".into(), json!(1));
            }
            m.remove("deletionTimestamp");
        } else if let Some(old) = &old {
            // What the server owns: a client neither sets nor clears them.
            for k in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"] {
                match old.pointer(&format!("/metadata/{k}")) {
                    Some(v) => m.insert(k.into(), v.clone()),
                    None => m.remove(k),
                };
            }
            if generation {
                let generation = old.pointer("/metadata/generation").and_then(|g| g.as_i64()).unwrap_or(1);
                let spec_changed = old.get("spec") != obj.get("spec");
                let m = obj.pointer_mut("/metadata").and_then(|m| m.as_object_mut()).expect("metadata");
                m.insert("generation".into(), json!(if spec_changed { generation + 1 } else { generation }));
            }
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
        s.history.push_back(e.clone());
        while s.history.len() > HISTORY {
            if let Some(gone) = s.history.pop_front() {
                s.compacted = gone.rv;
            }
        }
        if let Ok(mut subs) = self.events.lock() {
            subs.retain(|tx| tx.send(e.clone()).is_ok());
        }
    }

    /// Forgets the watch history up to now, as an etcd compaction does: a watch from an older
    /// resourceVersion is answered 410 Gone.
    pub fn compact(&self) {
        if let Ok(mut s) = self.store.lock() {
            s.compacted = s.rv;
            s.history.clear();
        }
    }

    /// The fault a write meets, if any (a fixed, evenly spread sequence over the writes).
    fn write_fault(&self, key: &Key) -> Option<Response<Body>> {
        let mut s = self.store.lock().ok()?;
        if s.faults.writes.is_empty() {
            return None;
        }
        s.writes += 1;
        let x = (s.writes as f64 * 0.618_033_988_749_895).fract();
        let mut sum = 0.0;
        let code = s.faults.writes.iter().find_map(|(code, p)| {
            sum += p;
            (x < sum).then_some(*code)
        })?;
        Some(match code {
            409 => conflict(key),
            429 => {
                let mut r = status(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequests",
                    "the server has received too many requests and has asked us to try again later".into(),
                );
                r.headers_mut().insert("retry-after", http::HeaderValue::from_static("1"));
                r
            }
            _ => status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "an error on the server (\"injected by ichor sim cluster --api-fault\") has prevented the request from succeeding".into(),
            ),
        })
    }

    /// A SubjectAccessReview answered from the grants, never stored (as the API server does):
    /// system:masters may do everything.
    fn access_review(&self, body: &Json) -> Response<Body> {
        let a = |p: &str| body.pointer(p).and_then(Json::as_str).unwrap_or_default().to_string();
        let resource =
            format!("{}/{}", a("/spec/resourceAttributes/resource"), a("/spec/resourceAttributes/subresource"));
        let grant =
            (a("/spec/user"), a("/spec/resourceAttributes/namespace"), resource, a("/spec/resourceAttributes/verb"));
        // As kube-apiserver's authorizer: system:masters may do everything.
        let admin = body
            .pointer("/spec/groups")
            .and_then(Json::as_array)
            .is_some_and(|g| g.iter().any(|g| g.as_str() == Some(SIM_ADMIN_GROUP)));
        let allowed = admin || self.store.lock().is_ok_and(|s| s.grants.contains(&grant));
        let mut out = body.clone();
        out["status"] = json!({"allowed": allowed});
        full(&out, StatusCode::CREATED)
    }

    async fn serve(&self, req: Request<kube_client::client::Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("reading the body: {e}")),
        };
        let q = query(&parts.uri);
        let agent = parts.headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let (latency, faulted) = match self.store.lock() {
            Ok(mut s) => {
                s.log.push(format!("{} {}", parts.method, parts.uri));
                let faulted = s.faults.apply_to(&agent);
                (if faulted { s.faults.latency } else { Duration::ZERO }, faulted)
            }
            Err(_) => (Duration::ZERO, false),
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if parts.method == Method::GET
            && let Some(doc) = self.discovery(parts.uri.path())
        {
            return full(&doc, StatusCode::OK);
        }
        let unknown = || {
            status(StatusCode::NOT_FOUND, "NotFound", "the server could not find the requested resource".to_string())
        };
        let Some((group, version, ns, plural, name, sub)) = route(parts.uri.path()) else { return unknown() };
        let Some(resource) =
            self.resources().into_iter().find(|r| r.group == group && r.version == version && r.plural == plural)
        else {
            return unknown();
        };
        let subresource_ok = match sub.as_str() {
            "" => true,
            "status" => resource.status,
            "eviction" => group.is_empty() && plural == "pods",
            _ => false,
        };
        if !subresource_ok || (!resource.namespaced && !ns.is_empty()) {
            return unknown();
        }
        let api_version = resource.group_version();
        let content_type = parts.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
        let body = match request_body(content_type, &bytes) {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        // SubjectAccessReview: answered from the grants, never stored (as the API server does).
        if plural == "subjectaccessreviews" && parts.method == Method::POST {
            return self.access_review(&body);
        }
        let key = (group.clone(), plural.clone(), ns.clone(), name.clone());
        let header = |h: &str| parts.headers.get(h).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let content_type = header("content-type");
        let mode = match schema::Validation::parse(q.get("fieldValidation").map(String::as_str)) {
            Ok(m) => m,
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
        };
        let write = Write {
            api_version: api_version.clone(),
            manager: manager_of(&q, &header("user-agent")),
            mode,
            status_only: sub == "status",
            status_subresource: resource.status,
        };
        // `dryRun=All`: the write is made, checked and answered on a copy; nothing is kept and
        // no watcher hears of it (as kube-apiserver: admission and validation run, storage not).
        let writing = parts.method != Method::GET;
        let dry = writing && q.get("dryRun").is_some_and(|d| d == "All");
        if writing
            && !dry
            && faulted
            && let Some(fault) = self.write_fault(&key)
        {
            return fault;
        }
        let api = if dry { self.shadow() } else { self.clone() };
        // A validating webhook, for the writes it names.
        let admission = self.admission.lock().ok().and_then(|a| a.clone()).filter(|a| {
            a.group == group
                && a.plurals.contains(&plural)
                && sub.is_empty()
                && matches!(parts.method, Method::POST | Method::PUT | Method::PATCH)
        });
        let mut warnings = vec![];
        if let Some(adm) = admission {
            let (b, ct) = (body.clone(), content_type.clone());
            let verdict = match parts.method {
                Method::POST => self.admit(&adm, &key, &api_version, |a| a.create(&key, b, &write), dry).await,
                Method::PUT => self.admit(&adm, &key, &api_version, |a| a.replace(&key, b, &write), dry).await,
                _ => self.admit(&adm, &key, &api_version, |a| a.patch(&key, b, &ct, &q, &write), dry).await,
            };
            match verdict {
                Ok(w) => warnings = w,
                Err(answer) => return answer,
            }
        }
        let table = table::wants_table(&header("accept")).then(|| {
            let printer = self.printer_columns(&group, &version, &plural);
            (
                table::Columns::of(&group, &plural, printer.as_deref()),
                q.get("includeObject").is_some_and(|i| i == "Object"),
            )
        });
        let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
        let mut answer = match (parts.method.clone(), name.is_empty(), sub.as_str()) {
            (Method::GET, true, "") if watching => api.watch(&group, &plural, &ns, &api_version, &q, table, faulted),
            (Method::GET, true, "") => api.list(&group, &plural, &ns, &api_version, &q, table),
            (Method::GET, false, _) => match api.get_viewed(&key) {
                Some(o) => match table {
                    Some((cols, whole)) => {
                        let rv = o.pointer("/metadata/resourceVersion").and_then(Json::as_str).unwrap_or_default();
                        full(&cols.table(std::slice::from_ref(&o), rv, now().1, whole), StatusCode::OK)
                    }
                    None => full(&o, StatusCode::OK),
                },
                None => not_found(&self.qualified(&group, &plural), &name),
            },
            (Method::POST, true, "") => api.create(&key, body, &write),
            (Method::POST, false, "eviction") => api.evict(&key),
            (Method::PUT, false, _) => api.replace(&key, body, &write),
            (Method::PATCH, false, _) => api.patch(&key, body, &content_type, &q, &write),
            (Method::DELETE, false, "") => api.delete(&key, &body),
            (Method::DELETE, true, "") => api.delete_collection(&group, &plural, &ns, &api_version, &q),
            (m, _, _) => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("the server does not allow this method on the requested resource ({m} {})", parts.uri.path()),
            ),
        };
        for w in warnings {
            if let Ok(v) = http::HeaderValue::from_str(&format!("299 - {:?}", w)) {
                answer.headers_mut().append("warning", v);
            }
        }
        answer
    }

    /// A copy of the store no watcher listens to, for a dry run.
    fn shadow(&self) -> Api {
        let store = self.store.lock().map(|s| s.clone()).unwrap_or_default();
        Api { store: Arc::new(Mutex::new(store)), events: Arc::default(), admission: Arc::default() }
    }

    /// Calls `admission` on the writes it names from now on.
    pub fn set_admission(&self, admission: Admission) {
        if let Ok(mut a) = self.admission.lock() {
            *a = Some(Arc::new(admission));
        }
    }

    /// The webhook's verdict on a write: the write made on a copy first (what would be stored,
    /// or the refusal validation gives before any webhook is called), then the review. `None`:
    /// admitted, with the warnings to send; `Some`: the answer to give instead.
    async fn admit(
        &self,
        adm: &Admission,
        key: &Key,
        api_version: &str,
        write: impl FnOnce(&Api) -> Response<Body>,
        dry: bool,
    ) -> Result<Vec<String>, Response<Body>> {
        let copy = self.shadow();
        let answer = write(&copy);
        if !answer.status().is_success() {
            return Err(answer);
        }
        let object: Json = match answer.into_body().collect().await {
            Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or(Json::Null),
            Err(never) => match never {},
        };
        let name = object.pointer("/metadata/name").and_then(Json::as_str).unwrap_or_default().to_string();
        let old = self.get(&key.0, &key.1, &key.2, &name).unwrap_or(Json::Null);
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = object.get("kind").and_then(Json::as_str).unwrap_or_default();
        let uid = format!("sim-admission-{}", self.store.lock().map(|s| s.rv).unwrap_or(0));
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": key.1},
                "name": name,
                "namespace": key.2,
                "operation": if old.is_null() { "CREATE" } else { "UPDATE" },
                // The sim has no authentication: every request is its kubeconfig's admin's.
                "userInfo": {"username": SIM_USER, "groups": [SIM_ADMIN_GROUP, "system:authenticated"]},
                "object": object,
                "oldObject": old,
                "dryRun": dry,
            }
        });
        let verdict = (adm.review)(review).await;
        let r = &verdict["response"];
        let warnings =
            r["warnings"].as_array().into_iter().flatten().filter_map(|w| w.as_str().map(str::to_string)).collect();
        if r["allowed"] == json!(true) {
            return Ok(warnings);
        }
        let code = r.pointer("/status/code").and_then(Json::as_u64).unwrap_or(403);
        let message = r.pointer("/status/message").and_then(Json::as_str).unwrap_or("refused");
        let code = StatusCode::from_u16(code as u16).unwrap_or(StatusCode::FORBIDDEN);
        let reason = code.canonical_reason().unwrap_or("Forbidden").replace(' ', "");
        Err(status(code, &reason, format!("admission webhook \"{}\" denied the request: {message}", adm.name)))
    }

    fn printer_columns(&self, group: &str, version: &str, plural: &str) -> Option<Vec<Json>> {
        let (_, v) = self.store.lock().ok()?.crd_version(group, version, plural)?;
        Some(v.get("additionalPrinterColumns").and_then(Json::as_array).cloned().unwrap_or_default())
    }

    /// Every resource the API serves: the core kinds, Ichor's CRDs, and every CRD it holds.
    pub fn resources(&self) -> Vec<super::discovery::Resource> {
        self.store.lock().map(|s| s.resources()).unwrap_or_default()
    }

    fn schemas(&self) -> Vec<((String, String, String), Json)> {
        self.store.lock().map(|s| s.schemas()).unwrap_or_default()
    }

    fn kind(&self, group: &str, plural: &str) -> String {
        self.store.lock().map(|s| s.kind(group, plural)).unwrap_or_default()
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
            ["openapi", "v2"] => Some(d::openapi_v2(&self.resources(), &self.schemas())),
            ["openapi", "v3"] => Some(d::openapi_root(&self.resources())),
            ["openapi", "v3", "api", v] => d::openapi_group_version(&self.resources(), &self.schemas(), "", v),
            ["openapi", "v3", "apis", g, v] => d::openapi_group_version(&self.resources(), &self.schemas(), g, v),
            _ => None,
        }
    }

    /// An object as a client of its group reads it (an Event in either view).
    fn get_viewed(&self, key: &Key) -> Option<Json> {
        let s = self.store.lock().ok()?;
        if let Some(o) = s.objects.get(key) {
            return Some(o.clone());
        }
        if !events::is_event(&key.0, &key.1) {
            return None;
        }
        let other = events::other_group(&key.0);
        let o = s.objects.get(&(other.to_string(), key.1.clone(), key.2.clone(), key.3.clone()))?;
        Some(events::view(o, other, &key.0))
    }

    fn list(
        &self,
        group: &str,
        plural: &str,
        ns: &str,
        api_version: &str,
        q: &BTreeMap<String, String>,
        table: Option<(table::Columns, bool)>,
    ) -> Response<Body> {
        let sel = match selector(group, plural, q) {
            Ok(s) => s,
            Err(refused) => return *refused,
        };
        let s = self.store.lock().expect("kubeapi store");
        let groups = events::groups(group, plural);
        let mut items: Vec<((String, String), Json)> = s
            .objects
            .iter()
            .filter(|(k, _)| groups.contains(&k.0) && k.1 == plural && (ns.is_empty() || k.2 == ns))
            .map(|(k, v)| ((k.2.clone(), k.3.clone()), events::view(v, &k.0, group)))
            .filter(|(_, o)| sel.matches(o))
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(after) = q.get("continue").filter(|c| !c.is_empty()) {
            let Some(after) = from_token(after) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "continue key is not valid".into());
            };
            items.retain(|(k, _)| *k > after);
        }
        let mut meta = json!({"resourceVersion": s.rv.to_string()});
        if let Some(limit) = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0)
            && items.len() > limit
        {
            let remaining = items.len() - limit;
            items.truncate(limit);
            let (ns, name) = items.last().map(|(k, _)| k.clone()).unwrap_or_default();
            meta["continue"] = json!(continue_token(&(String::new(), String::new(), ns, name)));
            meta["remainingItemCount"] = json!(remaining);
        }
        let items: Vec<Json> = items.into_iter().map(|(_, o)| o).collect();
        if let Some((cols, whole)) = table {
            let mut t = cols.table(&items, &s.rv.to_string(), now().1, whole);
            t["metadata"] = meta;
            return full(&t, StatusCode::OK);
        }
        // A list of a built-in kind carries its items without apiVersion and kind, as
        // kube-apiserver's does; a custom resource's items keep them.
        let items: Vec<Json> = if s.is_custom(group, plural) {
            items
        } else {
            items
                .into_iter()
                .map(|mut o| {
                    if let Some(m) = o.as_object_mut() {
                        m.remove("apiVersion");
                        m.remove("kind");
                    }
                    o
                })
                .collect()
        };
        full(
            &json!({"apiVersion": api_version, "kind": format!("{}List", s.kind(group, plural)), "metadata": meta, "items": items}),
            StatusCode::OK,
        )
    }

    // The route's parts, the query, the table form and the request's fault scope: one request.
    #[allow(clippy::too_many_arguments)]
    fn watch(
        &self,
        group: &str,
        plural: &str,
        ns: &str,
        api_version: &str,
        q: &BTreeMap<String, String>,
        table: Option<(table::Columns, bool)>,
        faulted: bool,
    ) -> Response<Body> {
        use futures::StreamExt;
        let sel = match selector(group, plural, q) {
            Ok(s) => s,
            Err(refused) => return *refused,
        };
        let from: u64 = match q.get("resourceVersion").filter(|v| !v.is_empty()) {
            None => 0,
            Some(v) => match v.parse() {
                Ok(v) => v,
                Err(_) => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("resourceVersion: Invalid value: \"{v}\": must be a number"),
                    );
                }
            },
        };
        let timeout = q.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(1800u64);
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
        let groups = events::groups(group, plural);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (past, drop_after) = {
            let s = self.store.lock().expect("kubeapi store");
            if from != 0 && from < s.compacted {
                return status(
                    StatusCode::GONE,
                    "Expired",
                    format!("too old resource version: {from} ({})", s.compacted + 1),
                );
            }
            if let Ok(mut subs) = self.events.lock() {
                subs.push(tx);
            }
            // From no resourceVersion (or "0"): the objects there are, as ADDED, then what
            // changes; from one: every change after it.
            let past: Vec<WatchEvent> = if from == 0 {
                s.objects
                    .iter()
                    .filter(|(k, _)| groups.contains(&k.0) && k.1 == plural)
                    .map(|(k, v)| WatchEvent {
                        rv: s.rv,
                        group: k.0.clone(),
                        plural: k.1.clone(),
                        namespace: k.2.clone(),
                        kind: "ADDED",
                        object: v.clone(),
                    })
                    .collect()
            } else {
                s.history.iter().filter(|e| e.rv > from).cloned().collect()
            };
            (past, s.faults.drop_watches_after.filter(|_| faulted))
        };
        let (group, plural, ns) = (group.to_string(), plural.to_string(), ns.to_string());
        let keep = {
            let (group, ns, plural) = (group.clone(), ns.clone(), plural.clone());
            move |e: &WatchEvent| {
                groups.contains(&e.group)
                    && e.plural == plural
                    && (ns.is_empty() || e.namespace == ns)
                    && sel.matches(&events::view(&e.object, &e.group, &group))
            }
        };
        let frame = move |kind: &str, object: Json| {
            Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(format!(
                "{}\n",
                json!({"type": kind, "object": object})
            ))))
        };
        let live = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let store = self.store.clone();
        let (kind, api_version) = (self.kind(&group, &plural), api_version.to_string());
        // With `sendInitialEvents` (a streaming list), the first bookmark says the initial events
        // have all been sent.
        let initial = std::sync::atomic::AtomicBool::new(q.get("sendInitialEvents").is_some_and(|v| v == "true"));
        let bookmark = move || {
            let rv = store.lock().map(|s| s.rv).unwrap_or(0);
            let mut b =
                json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}});
            if initial.swap(false, std::sync::atomic::Ordering::Relaxed) {
                b["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            b
        };
        let events = futures::stream::iter(past).chain(live).filter(move |e| futures::future::ready(keep(e))).map({
            move |e| {
                let object = events::view(&e.object, &e.group, &group);
                let object = match &table {
                    Some((cols, whole)) => {
                        let rv = object.pointer("/metadata/resourceVersion").and_then(Json::as_str).unwrap_or("");
                        cols.table(std::slice::from_ref(&object), rv, now().1, *whole)
                    }
                    None => object,
                };
                frame(e.kind, object)
            }
        });
        // Bookmarks, when asked: one once the initial events are sent, then every 15 s.
        let ticks = futures::stream::unfold((), |_| async {
            tokio::time::sleep(Duration::from_secs(15)).await;
            Some(((), ()))
        });
        let marks = futures::stream::once(async {}).chain(ticks).map(move |_| frame("BOOKMARK", bookmark()));
        let events: std::pin::Pin<Box<dyn futures::Stream<Item = _> + Send + Sync>> =
            if bookmarks { Box::pin(futures::stream::select(events, marks)) } else { Box::pin(events) };
        let limit =
            drop_after.map_or(Duration::from_secs(timeout.max(1)), |d| d.min(Duration::from_secs(timeout.max(1))));
        let deadline = tokio::time::Instant::now() + limit;
        let ended = events.take_until(tokio::time::sleep_until(deadline));
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(ended)));
        r.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
        r
    }

    fn create(&self, key: &Key, mut body: Json, w: &Write) -> Response<Body> {
        let (group, plural, ns, _) = key;
        let generate = body.pointer("/metadata/generateName").and_then(Json::as_str).map(str::to_string);
        let name = match (body.pointer("/metadata/name").and_then(|v| v.as_str()), generate) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(prefix)) => {
                let n = self.store.lock().map(|s| s.rv + 1).unwrap_or(0);
                format!("{prefix}{:05x}", (n.wrapping_mul(2_654_435_761)) % 0xfffff)
            }
            _ => {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required".into(),
                );
            }
        };
        if let Some(given) = body.pointer("/metadata/namespace").and_then(Json::as_str)
            && !ns.is_empty()
            && given != ns
        {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            );
        }
        let key = (group.clone(), plural.clone(), ns.clone(), name.clone());
        let mut s = self.store.lock().expect("kubeapi store");
        if s.objects.contains_key(&key) {
            return status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", self.qualified(group, plural)),
            );
        }
        if body.get("apiVersion").is_none() {
            body["apiVersion"] = json!(w.api_version);
        }
        if body.get("kind").is_none() {
            body["kind"] = json!(s.kind(group, plural));
        }
        if let Some(m) = body.get_mut("metadata").and_then(Json::as_object_mut) {
            m.remove("resourceVersion");
        }
        self.commit(&mut s, &key, None, body, w, false)
    }

    /// `group`/`plural` as kube-apiserver names it in messages (`talosclusters.ichor.maesh.dev`).
    fn qualified(&self, group: &str, plural: &str) -> String {
        if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") }
    }

    fn replace(&self, key: &Key, mut body: Json, w: &Write) -> Response<Body> {
        let mut s = self.store.lock().expect("kubeapi store");
        let Some(old) = s.objects.get(key).cloned() else {
            return not_found(&self.qualified(&key.0, &key.1), &key.3);
        };
        let given = body.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).unwrap_or("");
        let current = old.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).unwrap_or("");
        if !given.is_empty() && given != current {
            return conflict(key);
        }
        if w.status_only {
            let mut next = old.clone();
            next["status"] = body.get("status").cloned().unwrap_or(Json::Null);
            body = next;
        }
        self.commit(&mut s, key, Some(&old), body, w, false)
    }

    /// Stores a write: validated against the CRD's schema, kept as it was when it changes
    /// nothing, stamped, its fields' managers recorded, and heard by watchers. `applied`: the
    /// managers were recorded by a server-side apply.
    fn commit(
        &self,
        s: &mut Store,
        key: &Key,
        old: Option<&Json>,
        mut next: Json,
        w: &Write,
        applied: bool,
    ) -> Response<Body> {
        if let Some(o) = old
            && !w.status_only
            && w.status_subresource
        {
            keep_status(o, &mut next);
        }
        let mut warnings = vec![];
        let version = w.api_version.rsplit('/').next().unwrap_or_default();
        let mut defaulted_old = None;
        if let Some((kind, v)) = s.crd_version(&key.0, version, &key.1)
            && let Some(schema) = v.pointer("/schema/openAPIV3Schema")
        {
            match schema::admit(&next, old, schema, w.mode, (&kind, &key.0, version)) {
                Ok((admitted, warned)) => {
                    next = admitted;
                    warnings = warned;
                }
                Err(refusal) => {
                    let (code, body) = refusal.status();
                    return full(&body, StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST));
                }
            }
            // kube-apiserver defaults an object as it reads it from storage too: the old object
            // carries the schema's defaults, so a write that only stores one changes nothing in
            // its spec and leaves its generation (issue 50: an annotation's write moved it).
            defaulted_old = old.map(|o| kube_cel::apply_defaults(schema, o)).filter(|d| Some(d) != old);
        }
        if let Some(d) = &defaulted_old {
            s.objects.insert(key.clone(), d.clone());
        }
        let old = defaulted_old.as_ref().or(old);
        let answer = |obj: &Json, code: StatusCode| {
            let mut r = full(obj, code);
            for warning in &warnings {
                let text = format!("299 - {}", serde_json::to_string(warning).unwrap_or_default());
                if let Ok(v) = http::HeaderValue::from_str(&text) {
                    r.headers_mut().append("warning", v);
                }
            }
            r
        };
        if let Some(o) = old {
            let deleting = o.pointer("/metadata/deletionTimestamp").is_some();
            let finalizers = |v: &Json| -> Vec<Json> {
                v.pointer("/metadata/finalizers").and_then(Json::as_array).cloned().unwrap_or_default()
            };
            if deleting && finalizers(&next).iter().any(|f| !finalizers(o).contains(f)) {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!(
                        "{} \"{}\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                        s.kind(&key.0, &key.1),
                        key.3
                    ),
                );
            }
            if unchanged(o, &next) {
                return answer(o, StatusCode::OK);
            }
            if deleting && finalizers(&next).is_empty() {
                // The last finalizer gone from an object being deleted: it goes.
                self.stamp(s, key, &mut next, false);
                s.objects.remove(key);
                s.owners.remove(key);
                self.emit(s, key, "DELETED", next.clone());
                return answer(&next, StatusCode::OK);
            }
        }
        if !applied {
            // An update owns the fields it sets or changes, taking them from every other manager.
            let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
            if let Some(o) = old {
                leaves(o, String::new(), &mut before);
            }
            leaves(&next, String::new(), &mut after);
            let owners = s.owners.entry(key.clone()).or_default();
            owners.retain(|p, _| after.contains_key(p));
            for (p, v) in &after {
                if before.get(p) != Some(v) {
                    owners.insert(
                        p.clone(),
                        vec![Owner { manager: w.manager.clone(), apply: false, api_version: w.api_version.clone() }],
                    );
                }
            }
        }
        let created = old.is_none();
        self.stamp(s, key, &mut next, created);
        let time = now().0;
        if let Some(owners) = s.owners.get(key) {
            next["metadata"]["managedFields"] = managed_fields(owners, &time);
        }
        s.objects.insert(key.clone(), next.clone());
        self.emit(s, key, if created { "ADDED" } else { "MODIFIED" }, next.clone());
        answer(&next, if created { StatusCode::CREATED } else { StatusCode::OK })
    }

    fn patch(
        &self,
        key: &Key,
        body: Json,
        content_type: &str,
        q: &BTreeMap<String, String>,
        w: &Write,
    ) -> Response<Body> {
        let mut s = self.store.lock().expect("kubeapi store");
        let old = s.objects.get(key).cloned();
        let apply = content_type.starts_with("application/apply-patch");
        let current = match (&old, apply) {
            (Some(o), _) => o.clone(),
            (None, true) => {
                // An apply that creates is authorized as a create too (kube-apiserver asks RBAC
                // for both verbs): the log says so, for the role's drift check.
                let (g, plural, ns, name) = key;
                let root = if g.is_empty() {
                    "/api/v1".to_string()
                } else {
                    format!("/apis/{g}/{}", w.api_version.rsplit('/').next().unwrap_or("v1"))
                };
                let at = if ns.is_empty() { String::new() } else { format!("/namespaces/{ns}") };
                s.log.push(format!("{} {root}{at}/{plural}/{name}", crate::rbac::APPLY_CREATE));
                json!({"apiVersion": w.api_version, "kind": s.kind(&key.0, &key.1), "metadata": {"name": key.3}})
            }
            (None, false) => return not_found(&self.qualified(&key.0, &key.1), &key.3),
        };
        let mut patched = current.clone();
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
            if w.status_only {
                applied.retain(|p, _| p.starts_with("/status"));
            } else {
                applied.retain(|p, _| !p.starts_with("/status"));
            }
            let owners = s.owners.entry(key.clone()).or_default();
            let mut conflicts = vec![];
            for (ptr, v) in &applied {
                for other in owners.get(ptr).into_iter().flatten() {
                    if other.manager != *manager && current.pointer(ptr) != Some(v) && !force {
                        // kube-apiserver names the field as a dotted path (`.spec.kubernetesVersion`),
                        // and an updater with the version it wrote.
                        let using = if other.apply { String::new() } else { format!(" using {}", other.api_version) };
                        conflicts.push(format!(
                            "conflict with \"{}\"{using}: {}",
                            other.manager,
                            ptr.replace('/', ".")
                        ));
                    }
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
            // Fields this manager applied before and no longer does are removed, unless another
            // manager owns them too.
            let mut dropped = vec![];
            for (p, os) in owners.iter_mut() {
                if !applied.contains_key(p) && os.iter().any(|o| o.manager == *manager && o.apply) {
                    os.retain(|o| !(o.manager == *manager && o.apply));
                    if os.is_empty() {
                        dropped.push(p.clone());
                    }
                }
            }
            for p in &dropped {
                owners.remove(p);
                remove_pointer(&mut patched, p);
            }
            let me = Owner { manager: manager.clone(), apply: true, api_version: w.api_version.clone() };
            for (p, v) in &applied {
                let os = owners.entry(p.clone()).or_default();
                if current.pointer(p) != Some(v) {
                    os.clear();
                }
                if !os.contains(&me) {
                    os.retain(|o| o.manager != me.manager);
                    os.push(me.clone());
                }
            }
            let mut patch = body.clone();
            if let Some(m) = patch.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                m.retain(|k, _| k == "labels" || k == "annotations" || k == "finalizers");
            }
            merge_patch(&mut patched, &patch);
        } else if content_type.starts_with("application/json-patch") {
            if let Err(e) = patch::json_patch(&mut patched, &body) {
                return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e.to_string());
            }
        } else if content_type.starts_with("application/strategic-merge-patch") {
            if !key.0.is_empty()
                && s.crd_version(&key.0, w.api_version.rsplit('/').next().unwrap_or(""), &key.1).is_some()
            {
                return status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into(),
                );
            }
            if let Some(stale) = stale_version(key, &body, &current) {
                return stale;
            }
            patch::strategic_merge(&mut patched, &body);
        } else {
            if let Some(stale) = stale_version(key, &body, &current) {
                return stale;
            }
            merge_patch(&mut patched, &body);
        }
        let next = if w.status_only {
            let mut next = current.clone();
            next["status"] = patched.get("status").cloned().unwrap_or(Json::Null);
            next
        } else {
            patched
        };
        self.commit(&mut s, key, old.as_ref(), next, w, apply)
    }

    fn delete(&self, key: &Key, body: &Json) -> Response<Body> {
        let mut s = self.store.lock().expect("kubeapi store");
        let Some(old) = s.objects.get(key).cloned() else {
            return not_found(&self.qualified(&key.0, &key.1), &key.3);
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
        if let Some(rv) = body.pointer("/preconditions/resourceVersion").and_then(|v| v.as_str()) {
            let have = old.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).unwrap_or("");
            if rv != have {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"
                    ),
                );
            }
        }
        self.remove(&mut s, key, old)
    }

    /// Deletes an object, or, while it has finalizers, marks it with `deletionTimestamp` (the
    /// object stays until the last finalizer is removed).
    fn remove(&self, s: &mut Store, key: &Key, old: Json) -> Response<Body> {
        let finalizers = old.pointer("/metadata/finalizers").and_then(Json::as_array).is_some_and(|f| !f.is_empty());
        if finalizers {
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                return full(&old, StatusCode::OK);
            }
            let mut next = old.clone();
            self.stamp(s, key, &mut next, false);
            next["metadata"]["deletionTimestamp"] = json!(now().0);
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if let Some(generation) = next.pointer("/metadata/generation").and_then(Json::as_i64) {
                next["metadata"]["generation"] = json!(generation + 1);
            }
            s.objects.insert(key.clone(), next.clone());
            self.emit(s, key, "MODIFIED", next.clone());
            return full(&next, StatusCode::OK);
        }
        let mut gone = old;
        s.objects.remove(key);
        s.owners.remove(key);
        s.rv += 1;
        gone["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        self.emit(s, key, "DELETED", gone.clone());
        // kube-apiserver answers a deletion done at once with a Status naming the object; a
        // pod's (graceful on a real cluster) with the pod.
        if key.0.is_empty() && key.1 == "pods" {
            return full(&gone, StatusCode::OK);
        }
        let mut details =
            json!({"name": key.3, "kind": key.1, "uid": gone.pointer("/metadata/uid").cloned().unwrap_or_default()});
        if !key.0.is_empty() {
            details["group"] = json!(key.0);
        }
        full(
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
            StatusCode::OK,
        )
    }

    fn delete_collection(
        &self,
        group: &str,
        plural: &str,
        ns: &str,
        api_version: &str,
        q: &BTreeMap<String, String>,
    ) -> Response<Body> {
        let sel = match selector(group, plural, q) {
            Ok(s) => s,
            Err(refused) => return *refused,
        };
        let mut s = self.store.lock().expect("kubeapi store");
        let doomed: Vec<(Key, Json)> = s
            .objects
            .iter()
            .filter(|(k, o)| k.0 == group && k.1 == plural && (ns.is_empty() || k.2 == ns) && sel.matches(o))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        let mut items = vec![];
        for (k, o) in doomed {
            let r = self.remove(&mut s, &k, o.clone());
            drop(r);
            items.push(s.objects.get(&k).cloned().unwrap_or(o));
        }
        full(
            &json!({"apiVersion": api_version, "kind": format!("{}List", s.kind(group, plural)), "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            StatusCode::OK,
        )
    }

    /// The Eviction API: refused with 429 while a PodDisruptionBudget selecting the pod allows
    /// no disruption, else the pod is deleted. What a budget allows is its
    /// `status.disruptionsAllowed` once a disruption controller observed it (a real control
    /// plane's), else what that controller would compute from the pods it selects now
    /// (`disruptions_allowed`): issue 50 found every eviction refused under any budget, even
    /// `maxUnavailable: 1` over a Ready pod.
    fn evict(&self, key: &Key) -> Response<Body> {
        let pod = {
            let s = self.store.lock().expect("kubeapi store");
            match s.objects.get(&(String::new(), "pods".into(), key.2.clone(), key.3.clone())) {
                Some(p) => p.clone(),
                None => return not_found("pods", &key.3),
            }
        };
        let labels = pod.pointer("/metadata/labels").and_then(|l| l.as_object()).cloned().unwrap_or_default();
        let blocked = {
            let s = self.store.lock().expect("kubeapi store");
            s.objects.iter().filter(|(k, _)| k.0 == "policy" && k.1 == "poddisruptionbudgets" && k.2 == key.2).find_map(
                |(k, pdb)| {
                    if !budget_selects(pdb, &labels) {
                        return None;
                    }
                    let observed = pdb.pointer("/status/observedGeneration").is_some();
                    let allowed = match pdb.pointer("/status/disruptionsAllowed").and_then(|v| v.as_i64()) {
                        Some(n) if observed => n,
                        _ => disruptions_allowed(pdb, &selected_pods(&s.objects, &key.2, pdb)),
                    };
                    (allowed < 1).then(|| k.3.clone())
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
        // As kube-apiserver does with an eviction it allows: the budgets that select the pod
        // count it as disrupted at once (their disruptionsAllowed one less), so two evictions
        // never both spend the same allowance before the disruption controller looks again.
        for (bk, mut pdb) in self.objects() {
            if bk.0 == "policy"
                && bk.1 == "poddisruptionbudgets"
                && bk.2 == key.2
                && budget_selects(&pdb, &labels)
                && let Some(n) = pdb.pointer("/status/disruptionsAllowed").and_then(|v| v.as_i64())
            {
                pdb["status"]["disruptionsAllowed"] = json!((n - 1).max(0));
                self.put(&bk.0, &bk.1, pdb);
            }
        }
        let pod_key = (String::new(), "pods".to_string(), key.2.clone(), key.3.clone());
        self.delete(&pod_key, &Json::Null);
        full(
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            StatusCode::CREATED,
        )
    }
}

/// The pods of `namespace` a budget selects.
fn selected_pods<'a>(objects: &'a BTreeMap<Key, Json>, namespace: &str, pdb: &Json) -> Vec<&'a Json> {
    objects
        .iter()
        .filter(|(k, p)| {
            k.0.is_empty()
                && k.1 == "pods"
                && k.2 == namespace
                && p.pointer("/metadata/labels").and_then(|l| l.as_object()).is_some_and(|l| budget_selects(pdb, l))
        })
        .map(|(_, p)| p)
        .collect()
}

/// A budget selects a pod with these labels: the product's reading of a selector
/// (`kube::budget_selects`: matchLabels and matchExpressions, an empty selector selects all).
fn budget_selects(pdb: &Json, labels: &serde_json::Map<String, Json>) -> bool {
    let Ok(budget) = serde_json::from_value(pdb.clone()) else { return false };
    let labels = labels.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect();
    crate::kube::budget_selects(&budget, &labels)
}

impl Api {
    /// The disruption controller's work, done once: every budget's status from the pods it
    /// selects now (`observedGeneration`, `expectedPods`, `disruptionsAllowed`), written when it
    /// changed. `ichor sim cluster` runs it with its other stand-ins, so a budget's status reads as
    /// on a real cluster (`kubectl get pdb -o yaml`) and a preview can read it.
    pub fn observe_disruption_budgets(&self) {
        let objects = self.objects();
        for (key, pdb) in objects.iter().filter(|(k, _)| k.0 == "policy" && k.1 == "poddisruptionbudgets") {
            let pods = selected_pods(&objects, &key.2, pdb);
            let expected = pods.iter().filter(|p| p.pointer("/metadata/deletionTimestamp").is_none()).count();
            let want = json!({
                "observedGeneration": pdb.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
                "disruptionsAllowed": disruptions_allowed(pdb, &pods),
                "expectedPods": expected,
            });
            let mut have = pdb.get("status").cloned().unwrap_or(json!({}));
            let changed =
                ["observedGeneration", "disruptionsAllowed", "expectedPods"].iter().any(|f| have.get(f) != want.get(f));
            if changed {
                if let (Some(h), Some(w)) = (have.as_object_mut(), want.as_object()) {
                    h.extend(w.clone());
                }
                let mut pdb = pdb.clone();
                pdb["status"] = have;
                self.put(&key.0, &key.1, pdb);
            }
        }
    }
}

/// What kube-controller-manager's disruption controller would set as a budget's
/// `status.disruptionsAllowed` for these selected pods: healthy pods (Ready, not being deleted)
/// beyond the desired healthy count, which `minAvailable` gives or `expected - maxUnavailable`
/// gives (a percentage of the expected pods, `minAvailable` rounded up, `maxUnavailable` rounded
/// up, as `GetScaledValueFromIntOrPercent` with roundUp), never below 0. The expected count is the
/// pods selected (the real controller reads their controllers' scale; the sim's pods are the
/// scale).
pub fn disruptions_allowed(pdb: &Json, pods: &[&Json]) -> i64 {
    let expected = pods.iter().filter(|p| p.pointer("/metadata/deletionTimestamp").is_none()).count() as i64;
    let healthy = pods
        .iter()
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|p| {
            p.pointer("/status/conditions")
                .and_then(|c| c.as_array())
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
        .count() as i64;
    let scaled = |v: &Json| -> Option<i64> {
        match v {
            Json::Number(n) => n.as_i64(),
            Json::String(t) => {
                let pct: i64 = t.strip_suffix('%')?.parse().ok()?;
                Some((pct * expected + 99) / 100)
            }
            _ => None,
        }
    };
    let desired = match (pdb.pointer("/spec/minAvailable"), pdb.pointer("/spec/maxUnavailable")) {
        (Some(min), _) => scaled(min).unwrap_or(expected),
        (None, Some(max)) => expected - scaled(max).unwrap_or(0),
        // A budget with neither: minAvailable 1, the API's default.
        (None, None) => 1,
    };
    (healthy - desired).max(0)
}

/// The names of every kind this API has held (for RBAC checks in tests).
pub fn plurals(objects: &BTreeMap<Key, Json>) -> BTreeSet<(String, String)> {
    objects.keys().map(|k| (k.0.clone(), k.1.clone())).collect()
}

/// What kube-apiserver does to a Secret on every write: `stringData` is a write-only
/// convenience, merged into `data` (base64, its keys winning) and never stored.
/// Whether kube-apiserver keeps `metadata.generation` for a kind: custom resources and the
/// built-in kinds whose spec it versions (workloads, Jobs, budgets, CRDs, webhooks...); not the
/// core kinds but pods, nor Leases, Events, RBAC or EndpointSlices.
fn keeps_generation(group: &str, plural: &str) -> bool {
    match group {
        "" => matches!(plural, "pods" | "replicationcontrollers"),
        "coordination.k8s.io" | "events.k8s.io" | "rbac.authorization.k8s.io" | "discovery.k8s.io" => false,
        _ => true,
    }
}

fn string_data_into_data(obj: &mut Json) {
    use base64::Engine as _;
    let Some(m) = obj.as_object_mut() else { return };
    let Some(Json::Object(strings)) = m.remove("stringData") else { return };
    let data = m.entry("data").or_insert_with(|| json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    let data = data.as_object_mut().expect("data is an object");
    for (k, v) in strings {
        let text = v.as_str().unwrap_or_default();
        data.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(text)));
    }
}

#[cfg(test)]
mod disruption_tests {
    use super::disruptions_allowed;
    use serde_json::json;

    fn pod(ready: bool) -> serde_json::Value {
        json!({"status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    /// Issue 50, finding 11: the sim refused every eviction under any budget.
    #[test]
    fn a_budget_allows_what_the_disruption_controller_would() {
        let (r1, r2, nr) = (pod(true), pod(true), pod(false));
        let check =
            |spec: serde_json::Value, pods: &[&serde_json::Value]| disruptions_allowed(&json!({"spec": spec}), pods);
        assert_eq!(check(json!({"maxUnavailable": 1}), &[&r1]), 1, "maxUnavailable 1 over a Ready pod");
        assert_eq!(check(json!({"maxUnavailable": 0}), &[&r1, &r2]), 0);
        assert_eq!(check(json!({"maxUnavailable": 1}), &[&r1, &nr]), 0, "one already unavailable");
        assert_eq!(check(json!({"minAvailable": 1}), &[&r1, &r2]), 1);
        assert_eq!(check(json!({"minAvailable": "50%"}), &[&r1, &r2]), 1);
        assert_eq!(
            check(json!({"maxUnavailable": "50%"}), &[&r1, &r2, &nr]),
            1,
            "50% of 3 rounds up to 2 unavailable: 1 is already"
        );
        assert_eq!(check(json!({"minAvailable": 3}), &[&r1, &r2]), 0, "never below 0");
    }
}
