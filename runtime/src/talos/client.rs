//! The Talos client: one mTLS channel per endpoint, a node reached through an endpoint by the
//! `node` metadata header, a deadline on every call (each call its own), retries with backoff
//! for reads only, and errors mapped to what the planner needs.
//!
//! Start at `Client::new` (from a talosconfig context's credentials), then the calls:
//! `version`, `apply` (always an explicit mode: proto3's default 0 is REBOOT, which Talos 1.14
//! rejects, so `ApplyMode` has no such variant), `running_config` (read through COSI),
//! `pull_image` (ImageService.Pull where the node has it, ImagePull otherwise), `upgrade`
//! (LifecycleService.Upgrade, or the legacy MachineService.Upgrade), `get`, `list`.

use super::config::{Context, Credentials};
use super::proto::common::{ContainerDriver, ContainerdInstance, ContainerdNamespace as PbNamespace};
use super::proto::cosi::resource::{GetRequest, ListRequest, Resource, state_client::StateClient};
use super::proto::machine::apply_configuration_request::Mode;
use super::proto::machine::image_service_pull_response::Response as PullResponse;
use super::proto::machine::lifecycle_service_install_progress::Response as InstallProgress;
use super::proto::machine::{
    ApplyConfigurationRequest, ImagePullRequest, ImageServicePullRequest, InstallArtifactsSource,
    LifecycleServiceUpgradeRequest, RebootRequest, UpgradeRequest, image_service_client::ImageServiceClient,
    lifecycle_service_client::LifecycleServiceClient, machine_service_client::MachineServiceClient, reboot_request,
};
use crate::plan::ContainerdNamespace;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

/// How long an upgrade call may run: the installer writes the new system to disk.
pub const UPGRADE_DEADLINE: Duration = Duration::from_secs(600);

/// Talos's API port (apid).
pub const APID_PORT: u16 = 50000;

/// The mode of an apply. There is no REBOOT: Talos 1.14 rejects it, and a reboot is an
/// operation of its own (cordon, drain), never a side effect of an apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyMode {
    /// Talos decides (1.13: reboots when the change needs it; 1.14: never reboots).
    Auto,
    NoReboot,
    /// Written to disk only, applied at the next reboot.
    Staged,
    /// Applied, rolled back unless confirmed within the timeout.
    Try,
}

impl ApplyMode {
    fn wire(self) -> Mode {
        match self {
            ApplyMode::Auto => Mode::Auto,
            ApplyMode::NoReboot => Mode::NoReboot,
            ApplyMode::Staged => Mode::Staged,
            ApplyMode::Try => Mode::Try,
        }
    }
}

fn withheld_note(withheld: bool) -> &'static str {
    if withheld {
        " (Talos's diff left out: it may carry secrets; `ichor config diff --node` shows it redacted)"
    } else {
        ""
    }
}

/// What went wrong with a call, as the planner needs it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TalosError {
    /// InvalidArgument: Talos refused (the config, the request), with its message. The config
    /// diff Talos 1.13 appends to a refused apply is withheld here, where the error is built,
    /// since it can hold secrets; `diff_withheld` says it was.
    #[error("{node}: Talos refused {call}: {message}{}", withheld_note(*.diff_withheld))]
    Refused { node: String, call: &'static str, message: String, diff_withheld: bool },
    /// Unavailable or DeadlineExceeded (or no answer within the call's deadline): try later.
    #[error("{node}: {call} did not answer ({message}): try again later")]
    TryLater { node: String, call: &'static str, message: String },
    /// PermissionDenied: the talosconfig's role is too weak.
    #[error(
        "{node}: {call} needs role {needed}; the talosconfig's certificate has {have}: use a talosconfig with {needed}"
    )]
    PermissionDenied { node: String, call: &'static str, needed: &'static str, have: String },
    /// Unimplemented: the node's Talos has no such call or mode.
    #[error("{node}: {call} is not implemented by this node: {message}")]
    Unimplemented { node: String, call: &'static str, message: String },
    /// NotFound: the resource does not exist.
    #[error("{node}: {call}: not found: {message}")]
    NotFound { node: String, call: &'static str, message: String },
    #[error("{node}: {call}: {code}: {message}")]
    Other { node: String, call: &'static str, code: String, message: String },
}

impl TalosError {
    /// Worth trying again later (the node may come back).
    pub fn is_transient(&self) -> bool {
        matches!(self, TalosError::TryLater { .. })
    }
}

/// The client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("endpoint {endpoint:?}: {problem}")]
    Endpoint { endpoint: String, problem: String },
    #[error("the talosconfig's certificates cannot be used for TLS: {0}")]
    Tls(String),
}

/// The result of an apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The mode Talos used (1.14 turns AUTO into NO_REBOOT).
    pub mode: String,
    pub details: String,
    pub warnings: Vec<String>,
}

/// A node's Talos version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeVersion {
    pub tag: String,
    pub platform: String,
}

#[derive(Clone, Debug)]
pub struct Client {
    endpoints: Vec<(String, Channel)>,
    roles: Vec<String>,
    /// Every call's own deadline.
    pub deadline: Duration,
    /// Attempts of a read (with backoff) before it reports TryLater.
    pub read_attempts: u32,
    /// When each node was last written to (an apply, a reboot), shared by the clones: what
    /// tells a kept observation it may be out of date.
    writes: Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>>,
}

/// The role a call needs (Talos's authorization of machined's API).
pub fn role_needed(call: &str) -> &'static str {
    match call {
        "ApplyConfiguration" | "Kubeconfig" | "MachineConfig" => "os:admin",
        "ImagePull" | "ImageService.Pull" | "Reboot" => "os:operator",
        "LifecycleService.Upgrade" | "Upgrade" => "os:admin",
        _ => "os:reader",
    }
}

/// `host`, `host:port` or `[v6]:port` -> (host for TLS, URI).
fn endpoint_uri(e: &str) -> Option<(String, String)> {
    let e = e.trim();
    if e.is_empty() || e.contains('/') {
        return None;
    }
    let (host, port) = if let Some(rest) = e.strip_prefix('[') {
        let (h, p) = rest.split_once(']')?;
        (h.to_string(), p.strip_prefix(':').map(str::to_string))
    } else if e.matches(':').count() == 1 {
        let (h, p) = e.split_once(':')?;
        (h.to_string(), Some(p.to_string()))
    } else {
        (e.to_string(), None)
    };
    let port: u16 = match port {
        Some(p) => p.parse().ok()?,
        None => APID_PORT,
    };
    let shown = if host.contains(':') { format!("[{host}]") } else { host.clone() };
    Some((host, format!("https://{shown}:{port}")))
}

impl Client {
    /// Records that `node` changed now (a write of ours, or a read that found it changed under
    /// a kept observation): its next observation is fresh.
    pub fn touch(&self, node: &str) {
        self.writes.lock().unwrap_or_else(|e| e.into_inner()).insert(node.to_string(), std::time::Instant::now());
    }

    /// When `node` was last touched, if ever.
    pub fn last_write(&self, node: &str) -> Option<std::time::Instant> {
        self.writes.lock().unwrap_or_else(|e| e.into_inner()).get(node).copied()
    }

    /// A client for the context's endpoints. Channels connect lazily: an unreachable endpoint
    /// fails the calls through it (TryLater), not the client.
    pub fn new(ctx: &Context, creds: &Credentials, deadline: Duration) -> Result<Client, ClientError> {
        let identity = Identity::from_pem(&creds.crt_pem, &creds.key_pem);
        let ca = Certificate::from_pem(&creds.ca_pem);
        let mut endpoints = vec![];
        for e in &ctx.endpoints {
            let (host, uri) = endpoint_uri(e).ok_or_else(|| ClientError::Endpoint {
                endpoint: e.clone(),
                problem: "not host, host:port or [v6]:port".into(),
            })?;
            let tls = ClientTlsConfig::new().ca_certificate(ca.clone()).identity(identity.clone()).domain_name(host);
            let ep = Endpoint::from_shared(uri)
                .map_err(|err| ClientError::Endpoint { endpoint: e.clone(), problem: err.to_string() })?
                .tls_config(tls)
                .map_err(|err| ClientError::Tls(err.to_string()))?
                .connect_timeout(deadline)
                .http2_keep_alive_interval(Duration::from_secs(30));
            endpoints.push((e.clone(), ep.connect_lazy()));
        }
        Ok(Client { endpoints, roles: creds.roles.clone(), deadline, read_attempts: 3, writes: Default::default() })
    }

    fn channel(&self, attempt: u32) -> Channel {
        self.endpoints[attempt as usize % self.endpoints.len()].1.clone()
    }

    fn endpoint(&self, attempt: u32) -> &str {
        &self.endpoints[attempt as usize % self.endpoints.len()].0
    }

    fn request<T>(&self, node: &str, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        r.set_timeout(self.deadline);
        if !node.is_empty()
            && let Ok(v) = node.parse()
        {
            r.metadata_mut().insert("node", v);
        }
        r
    }

    fn map(&self, node: &str, call: &'static str, endpoint: &str, s: Status) -> TalosError {
        let (node, message) = (node.to_string(), s.message().to_string());
        match s.code() {
            Code::InvalidArgument => {
                let head = message.split("\ndiff:").next().unwrap_or(&message).to_string();
                let diff_withheld = head.len() < message.len();
                TalosError::Refused { node, call, message: head, diff_withheld }
            }
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                TalosError::TryLater { node, call, message: format!("{message}, through endpoint {endpoint}") }
            }
            Code::PermissionDenied => TalosError::PermissionDenied {
                node,
                call,
                needed: role_needed(call),
                have: if self.roles.is_empty() { "no role".into() } else { self.roles.join(", ") },
            },
            Code::Unimplemented => TalosError::Unimplemented { node, call, message },
            Code::NotFound => TalosError::NotFound { node, call, message },
            c => TalosError::Other { node, call, code: format!("{c:?}"), message },
        }
    }

    /// Runs one call under its own deadline.
    async fn once<T, F>(&self, node: &str, call: &'static str, attempt: u32, fut: F) -> Result<T, TalosError>
    where
        F: std::future::Future<Output = Result<T, Status>>,
    {
        let endpoint = self.endpoint(attempt);
        match tokio::time::timeout(self.deadline, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(s)) => Err(self.map(node, call, endpoint, s)),
            Err(_) => Err(TalosError::TryLater {
                node: node.to_string(),
                call,
                message: format!(
                    "no answer within its deadline of {} ms, through endpoint {endpoint}",
                    self.deadline.as_millis()
                ),
            }),
        }
    }

    /// A read: retried with backoff while it is transient, over the endpoints in turn.
    async fn read<T, F, Fut>(&self, node: &str, call: &'static str, mut f: F) -> Result<T, TalosError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut attempt = 0;
        loop {
            match self.once(node, call, attempt, f(self.channel(attempt))).await {
                Err(e) if e.is_transient() && attempt + 1 < self.read_attempts => {
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    pub async fn version(&self, node: &str) -> Result<NodeVersion, TalosError> {
        let resp =
            self.read(node, "Version", |ch| async move {
                MachineServiceClient::new(ch).version(self.request(node, ())).await
            })
            .await?
            .into_inner();
        let v = resp.messages.into_iter().next().unwrap_or_default();
        Ok(NodeVersion {
            tag: v.version.map(|i| i.tag).unwrap_or_default(),
            platform: v.platform.map(|p| p.name).unwrap_or_default(),
        })
    }

    /// Applies a whole config (multi-document YAML) in an explicit mode; never retried.
    pub async fn apply(
        &self,
        node: &str,
        config: &[u8],
        mode: ApplyMode,
        dry_run: bool,
    ) -> Result<Applied, TalosError> {
        if !dry_run {
            self.touch(node);
        }
        let req = ApplyConfigurationRequest {
            data: config.to_vec(),
            mode: mode.wire() as i32,
            dry_run,
            try_mode_timeout: None,
        };
        let resp = self
            .once(
                node,
                "ApplyConfiguration",
                0,
                MachineServiceClient::new(self.channel(0)).apply_configuration(self.request(node, req)),
            )
            .await?
            .into_inner();
        let m = resp.messages.into_iter().next().unwrap_or_default();
        Ok(Applied {
            mode: Mode::try_from(m.mode).map(|x| x.as_str_name().to_string()).unwrap_or_else(|_| m.mode.to_string()),
            details: m.mode_details,
            warnings: m.warnings,
        })
    }

    /// One COSI resource; NotFound when it does not exist.
    pub async fn get(&self, node: &str, namespace: &str, kind: &str, id: &str) -> Result<Resource, TalosError> {
        let call = if kind == MACHINE_CONFIG_TYPE { "MachineConfig" } else { "State.Get" };
        let req = GetRequest { namespace: namespace.into(), r#type: kind.into(), id: id.into(), options: None };
        let resp = self
            .read(node, call, |ch| {
                let req = req.clone();
                async move { StateClient::new(ch).get(self.request(node, req)).await }
            })
            .await?
            .into_inner();
        resp.resource.ok_or_else(|| TalosError::NotFound {
            node: node.into(),
            call,
            message: format!("{kind}({namespace}/{id}): an empty answer"),
        })
    }

    /// The node's boot ID (COSI `BootIDs.runtime.talos.dev` `runtime/boot-id`, Talos 1.14 and
    /// later); `None` on a Talos that has no such resource.
    pub async fn boot_id(&self, node: &str) -> Result<Option<String>, TalosError> {
        match self.get(node, "runtime", BOOT_IDS_TYPE, "boot-id").await {
            Ok(r) => {
                let spec = r.spec.unwrap_or_default();
                let yaml: serde_yaml::Value = serde_yaml::from_str(&spec.yaml_spec).unwrap_or_default();
                Ok(yaml.get("bootID").and_then(|b| b.as_str()).map(str::to_string).filter(|b| !b.is_empty()))
            }
            Err(TalosError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every COSI resource of a type in a namespace.
    pub async fn list(&self, node: &str, namespace: &str, kind: &str) -> Result<Vec<Resource>, TalosError> {
        use futures::StreamExt;
        let req = ListRequest { namespace: namespace.into(), r#type: kind.into(), options: None };
        self.read(node, "State.List", |ch| {
            let req = req.clone();
            async move {
                let mut stream = StateClient::new(ch).list(self.request(node, req)).await?.into_inner();
                let mut out = vec![];
                while let Some(item) = stream.next().await {
                    out.extend(item?.resource);
                }
                Ok(out)
            }
        })
        .await
    }

    /// The node's config: `v1alpha1` (running) or `persistent` (what the next boot reads).
    pub async fn machine_config(&self, node: &str, id: &str) -> Result<String, TalosError> {
        let r = self.get(node, "config", MACHINE_CONFIG_TYPE, id).await?;
        Ok(machine_config_text(&r))
    }

    /// The running config, read through COSI.
    pub async fn running_config(&self, node: &str) -> Result<String, TalosError> {
        self.machine_config(node, "v1alpha1").await
    }

    /// Pulls an image into a containerd namespace: ImageService.Pull (Talos 1.13 and later),
    /// else the older MachineService.ImagePull.
    pub async fn pull_image(&self, node: &str, ns: ContainerdNamespace, image: &str) -> Result<(), TalosError> {
        use futures::StreamExt;
        let pb = match ns {
            ContainerdNamespace::K8s => PbNamespace::NsCri,
            ContainerdNamespace::System => PbNamespace::NsSystem,
        };
        let req = ImageServicePullRequest {
            containerd: Some(ContainerdInstance { driver: ContainerDriver::Cri as i32, namespace: pb as i32 }),
            image_ref: image.into(),
        };
        let pulled = self
            .once(node, "ImageService.Pull", 0, async {
                let mut stream =
                    ImageServiceClient::new(self.channel(0)).pull(self.request(node, req)).await?.into_inner();
                while let Some(msg) = stream.next().await {
                    if let Some(PullResponse::Name(_)) = msg?.response {
                        return Ok(());
                    }
                }
                Err(Status::unavailable("the pull stream ended before the image was pulled"))
            })
            .await;
        match pulled {
            Err(TalosError::Unimplemented { .. }) => {
                let req = ImagePullRequest { namespace: pb as i32, reference: image.into() };
                self.once(
                    node,
                    "ImagePull",
                    0,
                    MachineServiceClient::new(self.channel(0)).image_pull(self.request(node, req)),
                )
                .await
                .map(|_| ())
            }
            r => r,
        }
    }

    /// Installs Talos from `image` (already pulled into the `system` namespace) on the node:
    /// LifecycleService.Upgrade, whose stream ends with the installer's exit code (non-zero is
    /// a refusal naming the installer's last line), and which does not reboot; or, `legacy`
    /// (Talos before 1.13), MachineService.Upgrade, which installs and reboots by itself.
    /// Never retried; the installer may run for minutes, so the call has its own deadline.
    pub async fn upgrade(&self, node: &str, image: &str, legacy: bool) -> Result<(), TalosError> {
        use futures::StreamExt;
        self.touch(node);
        let deadline = UPGRADE_DEADLINE.max(self.deadline);
        let call = if legacy { "Upgrade" } else { "LifecycleService.Upgrade" };
        let endpoint = self.endpoint(0).to_string();
        let run = async {
            if legacy {
                let req = UpgradeRequest { image: image.into(), preserve: true, ..Default::default() };
                let mut r = self.request(node, req);
                r.set_timeout(deadline);
                MachineServiceClient::new(self.channel(0)).upgrade(r).await?;
                return Ok(());
            }
            let req = LifecycleServiceUpgradeRequest {
                containerd: Some(ContainerdInstance {
                    driver: ContainerDriver::Cri as i32,
                    namespace: PbNamespace::NsSystem as i32,
                }),
                source: Some(InstallArtifactsSource { image_name: image.into() }),
            };
            let mut r = self.request(node, req);
            r.set_timeout(deadline);
            let mut stream = LifecycleServiceClient::new(self.channel(0)).upgrade(r).await?.into_inner();
            let mut last = String::new();
            while let Some(msg) = stream.next().await {
                match msg?.progress.and_then(|p| p.response) {
                    Some(InstallProgress::Message(line)) => last = line,
                    Some(InstallProgress::ExitCode(0)) => return Ok(()),
                    Some(InstallProgress::ExitCode(code)) => {
                        let said = if last.is_empty() { String::new() } else { format!(": {last}") };
                        return Err(Status::invalid_argument(format!(
                            "the installer {image} exited with code {code}{said}"
                        )));
                    }
                    None => {}
                }
            }
            Err(Status::unavailable("the upgrade stream ended before the installer's exit code"))
        };
        match tokio::time::timeout(deadline, run).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(s)) => Err(self.map(node, call, &endpoint, s)),
            Err(_) => Err(TalosError::TryLater {
                node: node.to_string(),
                call,
                message: format!("no answer within {} s, through endpoint {endpoint}", deadline.as_secs()),
            }),
        }
    }

    /// Reboots the node (MachineService.Reboot, mode DEFAULT): Talos answers at once and the
    /// node goes away, coming back on a new boot. Never retried: a second call could reboot a
    /// node that already came back.
    pub async fn reboot(&self, node: &str) -> Result<(), TalosError> {
        self.touch(node);
        let req = RebootRequest { mode: reboot_request::Mode::Default as i32 };
        self.once(node, "Reboot", 0, MachineServiceClient::new(self.channel(0)).reboot(self.request(node, req)))
            .await
            .map(|_| ())
    }

    /// The admin kubeconfig a control plane issues (the `kubeconfig` file of the .tar.gz).
    pub async fn kubeconfig(&self, node: &str) -> Result<Vec<u8>, TalosError> {
        use futures::StreamExt;
        let bytes = self
            .once(node, "Kubeconfig", 0, async {
                let mut stream =
                    MachineServiceClient::new(self.channel(0)).kubeconfig(self.request(node, ())).await?.into_inner();
                let mut all = vec![];
                while let Some(d) = stream.next().await {
                    all.extend(d?.bytes);
                }
                Ok(all)
            })
            .await?;
        untar_kubeconfig(&bytes).ok_or_else(|| TalosError::Other {
            node: node.into(),
            call: "Kubeconfig",
            code: "DataLoss".into(),
            message: "the answer is not a .tar.gz with a kubeconfig file".into(),
        })
    }
}

/// The COSI type of the machine config.
pub const MACHINE_CONFIG_TYPE: &str = "MachineConfigs.config.talos.dev";
/// The boot ID resource (Talos 1.14 and later; FACTS, Reboots and boot IDs).
pub const BOOT_IDS_TYPE: &str = "BootIDs.runtime.talos.dev";

/// The config text of a MachineConfig resource: its `yaml_spec`, else the bytes its protobuf
/// spec carries.
pub fn machine_config_text(r: &Resource) -> String {
    let spec = r.spec.clone().unwrap_or_default();
    if !spec.yaml_spec.is_empty() {
        // The YAML spec is the config as one string scalar.
        if let Ok(serde_yaml::Value::String(s)) = serde_yaml::from_str::<serde_yaml::Value>(&spec.yaml_spec) {
            return s;
        }
        return spec.yaml_spec;
    }
    super::proto::resource::config::MachineConfigSpec::decode(spec.proto_spec.as_slice())
        .map(|m| String::from_utf8_lossy(&m.yaml_marshalled).into_owned())
        .unwrap_or_default()
}

fn untar_kubeconfig(bytes: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    for entry in archive.entries().ok()? {
        let mut e = entry.ok()?;
        if e.path().ok()?.to_str()? == "kubeconfig" {
            let mut out = vec![];
            e.read_to_end(&mut out).ok()?;
            return Some(out);
        }
    }
    None
}
