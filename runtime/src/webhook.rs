//! The validating webhook (feature `io`): HTTPS with rustls, its certificate from a Secret,
//! answering `AdmissionReview` v1 at `/validate` with `runtime::admission`'s verdict.
//!
//! Start at `Webhook::handle` (one request body to one response body: parse, look up what the
//! verdict needs, review) and `serve_tls` (the listener: handshakes concurrent, each with a
//! timeout, connections capped, bodies over `BODY_LIMIT` answered 413). The lookups are a SubjectAccessReview
//! for the Cilium values' right, the cluster's TalosOperations for the lock, and for a
//! TalosConfigPatch write the cluster's objects, rendered with the written patch
//! (`patch_problems`).

use crate::admission::{Facts, Request, VALUES_RESOURCE, VALUES_SUBRESOURCE, VALUES_VERB, needs, review};
use bytes::Bytes;
use http::StatusCode;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube_client::api::{Api, ListParams, PostParams};
use render::api::TalosOperation;
use serde_json::json;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("the TLS Secret {0}: {1}")]
    Secret(String, String),
    #[error("the TLS certificate or key: {0}")]
    Tls(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub struct Webhook {
    pub kube: kube_client::Client,
    pub keys: render::inventory::Inventory,
}

impl Webhook {
    async fn facts(&self, r: &Request) -> Result<Facts, kube_client::Error> {
        let n = needs(r);
        let mut facts = Facts {
            now: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or_default(),
            ..Facts::default()
        };
        if n.values_right {
            let sar = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(r.user.clone()),
                    groups: Some(r.groups.clone()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(render::api::GROUP.into()),
                        resource: Some(VALUES_RESOURCE.into()),
                        subresource: Some(VALUES_SUBRESOURCE.into()),
                        verb: Some(VALUES_VERB.into()),
                        namespace: Some(r.namespace.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<SubjectAccessReview> = Api::all(self.kube.clone());
            let answer = api.create(&PostParams::default(), &sar).await?;
            facts.may_write_values = answer.status.is_some_and(|s| s.allowed);
        }
        if let Some(cluster) = n.operations_of {
            let ops: Api<TalosOperation> = Api::namespaced(self.kube.clone(), &r.namespace);
            let listed: Vec<TalosOperation> = ops
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|o| o.spec.cluster_ref.name == cluster)
                .collect();
            for o in &listed {
                let name = o.metadata.name.clone().unwrap_or_default();
                let stages = o.status.iter().flat_map(|s| &s.stages);
                for st in stages.filter(|st| st.kind == render::api::OperationKind::Kubernetes) {
                    facts.release_stages.push((name.clone(), st.target.clone()));
                }
            }
            facts.operations = listed
                .into_iter()
                .map(|o| {
                    let phase = o.status.map(|s| s.phase()).unwrap_or_default();
                    (o.metadata.name.unwrap_or_default(), phase)
                })
                .collect();
        }
        for (api_version, kind) in n.kinds {
            let o = render::api::HealthObject {
                api_version: api_version.clone(),
                kind: kind.clone(),
                ..Default::default()
            };
            let (_, served) = crate::kube::served_kind(&self.kube, &o).await?;
            facts.served.push(((api_version, kind), served));
        }
        if let Some(cluster) = n.renders_of {
            facts.patch_problems = self.patch_problems(r, &cluster).await?;
        }
        Ok(facts)
    }

    /// What rendering `cluster`'s machines with the written patch (in place of the stored one)
    /// refuses because of that patch. A cluster not there yet, or objects that do not load,
    /// are not this write's to answer for: nothing is found then.
    async fn patch_problems(&self, r: &Request, cluster: &str) -> Result<Vec<String>, kube_client::Error> {
        use render::api::{TalosCluster, TalosConfigPatch, TalosMachine};
        let Ok(patch) = serde_json::from_value::<TalosConfigPatch>(r.object.clone()) else { return Ok(vec![]) };
        let ns = &r.namespace;
        let Some(tc) = Api::<TalosCluster>::namespaced(self.kube.clone(), ns).get_opt(cluster).await? else {
            return Ok(vec![]);
        };
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(self.kube.clone(), ns);
        let Some(secret) = secrets.get_opt(&tc.spec.secrets_ref.name).await? else { return Ok(vec![]) };
        let lp = ListParams::default();
        let machines = Api::<TalosMachine>::namespaced(self.kube.clone(), ns).list(&lp).await?.items;
        let name = patch.metadata.name.clone();
        let mut patches: Vec<TalosConfigPatch> = Api::<TalosConfigPatch>::namespaced(self.kube.clone(), ns)
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.name != name)
            .collect();
        let object = render::render::object_name("TalosConfigPatch", &patch.metadata);
        patches.push(patch);
        // The shipped rules, compiled once per process (the path policies' check shares them);
        // without them nothing is admitted (fail closed).
        let c = match crate::admission::classifier() {
            Ok(c) => c,
            Err(e) => return Ok(vec![format!("{object}: the webhook cannot check the render ({e})")]),
        };
        let contracts: Vec<String> = c.known().iter().map(|k| k.to_string()).collect();
        let m = match render::manifests::Manifests::from_objects(vec![tc], machines, patches, &[secret], &contracts) {
            Ok(m) => m,
            // A load problem that names the written patch is its own (a selector, a field).
            Err(problems) => {
                return Ok(problems.into_iter().map(|p| p.message).filter(|t| t.contains(&object)).collect());
            }
        };
        Ok(render::machine::problems_of(&m, cluster, &object, c))
    }

    /// One AdmissionReview body to its response. A lookup that fails refuses the request
    /// (fail closed) and says why.
    pub async fn handle(&self, body: &[u8]) -> (StatusCode, serde_json::Value) {
        let r = match Request::parse(body) {
            Ok(r) => r,
            Err(e) => return (StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
        };
        // A lookup that meets a transient answer (a 429 while the API server's cache of a kind
        // initializes, a 5xx) is tried again, within the API server's 10 s timeout.
        let mut attempt = 0;
        let facts = loop {
            match self.facts(&r).await {
                Err(e) if attempt < 4 && crate::kube::transient(&e) => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(250 << attempt)).await;
                }
                other => break other,
            }
        };
        let verdict = match facts {
            Ok(f) => review(&r, &f, &self.keys),
            Err(e) => crate::admission::Verdict {
                allowed: false,
                messages: vec![format!(
                    "the webhook could not check the request ({}); try again",
                    crate::error_chain(&e)
                )],
                warnings: vec![],
            },
        };
        tracing::info!(uid = %r.uid, kind = %r.kind, operation = %r.operation, user = %r.user, allowed = verdict.allowed, "admission");
        (StatusCode::OK, verdict.response(&r.uid))
    }

    pub fn router(self: Arc<Self>) -> axum::Router {
        axum::Router::new()
            .route(
                "/validate",
                axum::routing::post(move |req: axum::extract::Request| {
                    let hook = self.clone();
                    async move {
                        let json = |code: StatusCode, v: serde_json::Value| {
                            (code, [(http::header::CONTENT_TYPE, "application/json")], v.to_string())
                        };
                        // A body said to be over the cap is answered before any of it is read.
                        let declared = req
                            .headers()
                            .get(http::header::CONTENT_LENGTH)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<usize>().ok());
                        let too_big = json(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            json!({"error": format!("the AdmissionReview is over {BODY_LIMIT} bytes")}),
                        );
                        if declared.is_some_and(|n| n > BODY_LIMIT) {
                            return too_big;
                        }
                        let body: Bytes = match axum::body::to_bytes(req.into_body(), BODY_LIMIT).await {
                            Ok(b) => b,
                            Err(_) => return too_big,
                        };
                        let (code, v) = hook.handle(&body).await;
                        json(code, v)
                    }
                }),
            )
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .layer(axum::extract::DefaultBodyLimit::disable())
    }
}

/// The certificate and key (PEM) from a `kubernetes.io/tls` Secret.
pub async fn tls_from_secret(
    client: &kube_client::Client,
    namespace: &str,
    name: &str,
) -> Result<(String, String), WebhookError> {
    let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("{namespace}/{name}");
    let s = api.get(name).await.map_err(|e| WebhookError::Secret(what.clone(), e.to_string()))?;
    let data = s.data.unwrap_or_default();
    let get = |k: &str| {
        data.get(k).map(|b| String::from_utf8_lossy(&b.0).into_owned()).ok_or_else(|| {
            WebhookError::Secret(
                what.clone(),
                format!("no {k} key (a kubernetes.io/tls Secret has tls.crt and tls.key)"),
            )
        })
    };
    Ok((get("tls.crt")?, get("tls.key")?))
}

/// A rustls server config from PEM (HTTP/1.1, as the API server speaks to webhooks).
pub fn server_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, WebhookError> {
    ReloadableCert::new(cert_pem, key_pem)?.server_config()
}

/// The serving certificate, replaceable while the webhook runs: a renewed Secret (`ichor
/// install --rotate-certs`, or cert-manager's renewal) is served from the next handshake on,
/// with no restart.
#[derive(Debug)]
pub struct ReloadableCert(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl ReloadableCert {
    /// The certificate and key from PEM; errors name `tls.crt` or `tls.key`.
    pub fn new(cert_pem: &str, key_pem: &str) -> Result<Arc<ReloadableCert>, WebhookError> {
        Ok(Arc::new(ReloadableCert(std::sync::RwLock::new(certified_key(cert_pem, key_pem)?))))
    }

    /// Serves this certificate from the next handshake on; a bad one is refused and the old
    /// one kept.
    pub fn replace(&self, cert_pem: &str, key_pem: &str) -> Result<(), WebhookError> {
        let k = certified_key(cert_pem, key_pem)?;
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = k;
        Ok(())
    }

    /// A rustls server config that asks this for its certificate at every handshake.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, WebhookError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| WebhookError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

impl rustls::server::ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::sign::CertifiedKey>, WebhookError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| WebhookError::Tls(format!("tls.crt: {e}")))?;
    if certs.is_empty() {
        return Err(WebhookError::Tls("tls.crt: no certificate".into()));
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| WebhookError::Tls(format!("tls.key: {e}")))?;
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| WebhookError::Tls(format!("tls.key: {e}")))?;
    let k = rustls::sign::CertifiedKey::new(certs, signing);
    k.keys_match().map_err(|e| WebhookError::Tls(format!("tls.crt and tls.key do not belong together: {e}")))?;
    Ok(Arc::new(k))
}

/// Keeps `cert` equal to the Secret's: reads it every `every` and replaces the certificate
/// when its PEM changed (a read that fails, or a bad certificate, keeps the old one, logged).
pub async fn follow_tls_secret(
    client: kube_client::Client,
    namespace: String,
    name: String,
    cert: Arc<ReloadableCert>,
    mut served: (String, String),
    every: std::time::Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        match tls_from_secret(&client, &namespace, &name).await {
            Ok(now) if now != served => match cert.replace(&now.0, &now.1) {
                Ok(()) => {
                    tracing::info!(secret = %format!("{namespace}/{name}"), "serving the renewed certificate");
                    served = now;
                }
                Err(e) => {
                    tracing::warn!(secret = %format!("{namespace}/{name}"), error = %e, "the renewed certificate is refused; serving the old one")
                }
            },
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "reading the TLS Secret; serving the certificate read before")
            }
        }
    }
}

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Connections held at once (handshaking or open); past it a new one is closed at once.
pub const MAX_CONNECTIONS: usize = 256;
/// The largest AdmissionReview body read (an object and its old object at etcd's 1.5 MiB
/// limit each, with room): a larger one is answered 413.
pub const BODY_LIMIT: usize = 4 << 20;

/// A TLS connection and its place under `MAX_CONNECTIONS` (freed when the connection closes).
pub struct Conn {
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.tls).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

/// A TLS listener for axum. The accept loop only accepts: each connection's handshake runs in
/// its own task, with `HANDSHAKE_TIMEOUT`, so a client that never finishes its handshake delays
/// nobody; at most `MAX_CONNECTIONS` are held at once. A failed handshake is logged.
struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(Conn, std::net::SocketAddr)>,
    addr: std::net::SocketAddr,
}

impl TlsListener {
    fn start(tcp: tokio::net::TcpListener, acceptor: tokio_rustls::TlsAcceptor) -> std::io::Result<TlsListener> {
        let addr = tcp.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, limit = MAX_CONNECTIONS, "too many connections: closed");
                    continue;
                };
                let (conn_tx, acceptor) = (tx.clone(), acceptor.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = conn_tx.send((Conn { tls, _permit: permit }, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, %peer, "TLS handshake"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener { ready, addr })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Conn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept task ended (the server is going away): no more connections.
            None => futures::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// Serves the webhook over HTTPS on `listener` until `shutdown` resolves.
pub async fn serve_tls(
    hook: Arc<Webhook>,
    listener: tokio::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), WebhookError> {
    let l = TlsListener::start(listener, tokio_rustls::TlsAcceptor::from(config))?;
    axum::serve(l, hook.router()).with_graceful_shutdown(shutdown).await?;
    Ok(())
}
