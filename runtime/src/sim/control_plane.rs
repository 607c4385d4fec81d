//! A real Kubernetes control plane on loopback for a test (issue 51): etcd, kube-apiserver
//! (authorization Node,RBAC; PodSecurity and the admission webhooks enabled; service-account
//! tokens signed by a generated key), kube-controller-manager (service accounts and their
//! tokens, DaemonSets, Jobs, Deployments and ReplicaSets, PodDisruptionBudgets, the garbage
//! collector, namespaces) and kube-scheduler, built from their Go modules by `tests/kube` (see
//! `kubebin`). As envtest does for controller-runtime, but with the controllers and the
//! scheduler too, so a DaemonSet rolls out, a Job runs and an eviction meets a real budget.
//!
//! Start at `ControlPlane::start`. Every process is stopped by PID when the value drops (also
//! when a test fails); a process that fails to start is named with its last log lines, and
//! nothing is left running.

use super::kubebin::{self, KubeBinError};
use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why the control plane is not up.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("the Kubernetes programs")]
    Programs(#[from] KubeBinError),
    #[error("generating {what}")]
    Pki { what: &'static str, source: rcgen::Error },
    #[error("writing {path}")]
    Write { path: String, source: std::io::Error },
    #[error("starting {program}")]
    Spawn { program: &'static str, source: std::io::Error },
    /// A process ended or did not get ready in time: its name, why, and its log's last lines.
    #[error("{program} {why}; the last lines of {log}:\n{tail}")]
    NotReady { program: &'static str, why: String, log: String, tail: String },
    #[error("{what}: {detail}")]
    Kubectl { what: String, detail: String },
}

/// How long each component may take to become ready: kube-apiserver runs its post-start hooks
/// (RBAC bootstrap roles, priority levels) in a few seconds; 90 s leaves room on a busy
/// 2-core machine running tests beside it.
const READY_WITHIN: Duration = Duration::from_secs(90);

/// A running control plane. Dropping it stops every process and removes its folder.
pub struct ControlPlane {
    dir: PathBuf,
    procs: Vec<(&'static str, Child, PathBuf)>,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// A kubeconfig of `system:masters` (what `kubectl` and the test's setup use).
    pub admin_kubeconfig: PathBuf,
    ca_pem: String,
    ca: Ca,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").field("server", &self.server).field("dir", &self.dir).finish()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The scheduler and the controller manager first, etcd last.
        for (_, child, _) in self.procs.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("ICHOR_KEEP_CONTROL_PLANE").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `N` free TCP ports on loopback, all bound at once so that none repeats (one at a time, the
/// system handed the same port out twice: etcd's client and peer URLs collided), then released
/// for the programs to take.
fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> =
        (0..N).filter_map(|_| std::net::TcpListener::bind("127.0.0.1:0").ok()).collect();
    let mut ports = [0; N];
    for (p, l) in ports.iter_mut().zip(&held) {
        *p = l.local_addr().map(|a| a.port()).unwrap_or(0);
    }
    ports
}

/// How many times a control plane is started afresh when a program found its port taken in
/// between (another test's program took it after it was released).
const START_ATTEMPTS: u32 = 3;

fn key(what: &'static str) -> Result<KeyPair, ControlPlaneError> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(|source| ControlPlaneError::Pki { what, source })
}

fn validity(p: &mut CertificateParams) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    p.not_before = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(now.saturating_sub(3600));
    p.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(now + 30 * 86_400);
}

/// The cluster's CA and what it signs (PEM).
struct Ca {
    pem: String,
    params: CertificateParams,
    key: KeyPair,
}

impl Ca {
    fn new() -> Result<Ca, ControlPlaneError> {
        let key = key("the cluster CA key")?;
        let mut p = CertificateParams::default();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "kubernetes");
        p.distinguished_name = dn;
        validity(&mut p);
        let cert = p.self_signed(&key).map_err(|source| ControlPlaneError::Pki { what: "the cluster CA", source })?;
        Ok(Ca { pem: cert.pem(), params: p, key })
    }

    /// A certificate for `cn` in `orgs` (client) or for these addresses and names (server).
    fn sign(
        &self,
        what: &'static str,
        cn: &str,
        orgs: &[&str],
        server_names: &[&str],
    ) -> Result<(String, String), ControlPlaneError> {
        let k = key(what)?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        for o in orgs {
            dn.push(DnType::OrganizationName, *o);
        }
        p.distinguished_name = dn;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        if server_names.is_empty() {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        } else {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            for n in server_names {
                p.subject_alt_names.push(match n.parse::<std::net::IpAddr>() {
                    Ok(ip) => SanType::IpAddress(ip),
                    Err(_) => {
                        SanType::DnsName((*n).try_into().map_err(|source| ControlPlaneError::Pki { what, source })?)
                    }
                });
            }
        }
        validity(&mut p);
        let issuer = Issuer::new(self.params.clone(), &self.key);
        let cert = p.signed_by(&k, &issuer).map_err(|source| ControlPlaneError::Pki { what, source })?;
        Ok((cert.pem(), k.serialize_pem()))
    }
}

fn write(path: &Path, text: &str) -> Result<(), ControlPlaneError> {
    std::fs::write(path, text).map_err(|source| ControlPlaneError::Write { path: path.display().to_string(), source })
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig for `server` with the CA and either a client certificate or a token.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, auth: &KubeAuth) -> String {
    let creds = match auth {
        KubeAuth::Cert { crt_pem, key_pem } => {
            format!("    client-certificate-data: {}\n    client-key-data: {}\n", b64(crt_pem), b64(key_pem))
        }
        KubeAuth::Token(t) => format!("    token: {t}\n"),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: {user}\n  context:\n    cluster: test\n    user: {user}\ncurrent-context: {user}\nusers:\n- name: {user}\n  user:\n{creds}",
        b64(ca_pem)
    )
}

/// How a kubeconfig's user authenticates.
#[derive(Clone, Debug)]
pub enum KubeAuth {
    Cert { crt_pem: String, key_pem: String },
    Token(String),
}

/// The last `n` lines of a log file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl ControlPlane {
    /// Builds (if needed) and starts a control plane in a new folder under the system's temp
    /// folder, named after `name`; returns once kube-apiserver is ready, the controller manager
    /// has made the default ServiceAccount and the scheduler runs. A program that found its
    /// port taken meanwhile starts the whole control plane again on fresh ports (up to
    /// `START_ATTEMPTS` times).
    pub fn start(name: &str) -> Result<ControlPlane, ControlPlaneError> {
        let mut attempt = 1;
        loop {
            match ControlPlane::start_once(name) {
                Err(ControlPlaneError::NotReady { tail, .. })
                    if tail.contains("address already in use") && attempt < START_ATTEMPTS =>
                {
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    fn start_once(name: &str) -> Result<ControlPlane, ControlPlaneError> {
        let bins: Vec<PathBuf> = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"]
            .iter()
            .map(|p| kubebin::bin(p))
            .collect::<Result<_, _>>()?;
        let dir = std::env::temp_dir().join(format!("ichor-kube-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("etcd"))
            .map_err(|source| ControlPlaneError::Write { path: dir.display().to_string(), source })?;
        let ca = Ca::new()?;
        let [etcd_port, etcd_peer, api_port] = free_ports::<3>();
        let server = format!("https://127.0.0.1:{api_port}");
        let f = |n: &str| dir.join(n);
        write(&f("ca.crt"), &ca.pem)?;
        let (crt, k) = ca.sign(
            "the API server's certificate",
            "kube-apiserver",
            &[],
            &["127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        )?;
        write(&f("apiserver.crt"), &crt)?;
        write(&f("apiserver.key"), &k)?;
        let sa = key("the service-account signing key")?;
        write(&f("sa.key"), &sa.serialize_pem())?;
        write(&f("sa.pub"), &sa.public_key_pem())?;
        let user = |what, cn: &str, orgs: &[&str], file: &str| -> Result<PathBuf, ControlPlaneError> {
            let (crt_pem, key_pem) = ca.sign(what, cn, orgs, &[])?;
            let path = f(file);
            write(&path, &kubeconfig(&server, &ca.pem, cn, &KubeAuth::Cert { crt_pem, key_pem }))?;
            Ok(path)
        };
        let admin = user("the admin's certificate", "admin", &["system:masters"], "admin.kubeconfig")?;
        let cm = user(
            "the controller manager's certificate",
            "system:kube-controller-manager",
            &[],
            "controller-manager.kubeconfig",
        )?;
        let sched = user("the scheduler's certificate", "system:kube-scheduler", &[], "scheduler.kubeconfig")?;
        // Auditing, as a cluster's operators run it: every request of a ServiceAccount at the
        // Metadata level (verb, resource, code), for `ControlPlane::requests_of`.
        write(
            &f("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n  - level: Metadata\n    userGroups: [\"system:serviceaccounts\"]\n  - level: None\n",
        )?;
        let ca_pem = ca.pem.clone();
        let mut cp = ControlPlane { dir: dir.clone(), procs: vec![], server, admin_kubeconfig: admin, ca_pem, ca };
        let s = |p: &Path| p.display().to_string();
        cp.spawn(
            "etcd",
            &bins[0],
            &[
                "--name=default".into(),
                format!("--data-dir={}", s(&f("etcd"))),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
                // A test's data need not survive a power cut.
                "--unsafe-no-fsync".into(),
            ],
        )?;
        cp.spawn(
            "kube-apiserver",
            &bins[1],
            &[
                format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                format!("--tls-cert-file={}", s(&f("apiserver.crt"))),
                format!("--tls-private-key-file={}", s(&f("apiserver.key"))),
                format!("--client-ca-file={}", s(&f("ca.crt"))),
                format!("--service-account-key-file={}", s(&f("sa.pub"))),
                format!("--service-account-signing-key-file={}", s(&f("sa.key"))),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--authorization-mode=Node,RBAC".into(),
                // What a cluster has (kubeadm's and Talos's defaults include these).
                "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,PodSecurity,NodeRestriction,DefaultStorageClass,DefaultTolerationSeconds,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,ResourceQuota,Priority".into(),
                "--allow-privileged=true".into(),
                "--endpoint-reconciler-type=none".into(),
                format!("--audit-policy-file={}", s(&f("audit-policy.yaml"))),
                format!("--audit-log-path={}", s(&f("audit.log"))),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
            ],
        )?;
        cp.wait_for("kube-apiserver", |cp| cp.kubectl_ok(&["get", "--raw", "/readyz"]))?;
        cp.spawn(
            "kube-controller-manager",
            &bins[2],
            &[
                format!("--kubeconfig={}", s(&cm)),
                format!("--authentication-kubeconfig={}", s(&cm)),
                format!("--authorization-kubeconfig={}", s(&cm)),
                format!("--service-account-private-key-file={}", s(&f("sa.key"))),
                format!("--root-ca-file={}", s(&f("ca.crt"))),
                "--use-service-account-credentials=true".into(),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                // The controllers a cluster's workloads need, and the node lifecycle (the
                // stand-in kubelets renew node Leases; it lifts the `not-ready` taint admission
                // puts on a new Node, which a DaemonSet's pods do not tolerate); no cloud.
                "--controllers=serviceaccount,serviceaccount-token,nodelifecycle,daemonset,job,deployment,replicaset,disruption,garbagecollector,namespace,endpointslice,ttl-after-finished,root-ca-cert-publisher,clusterrole-aggregation".into(),
            ],
        )?;
        cp.spawn(
            "kube-scheduler",
            &bins[3],
            &[
                format!("--kubeconfig={}", s(&sched)),
                format!("--authentication-kubeconfig={}", s(&sched)),
                format!("--authorization-kubeconfig={}", s(&sched)),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ],
        )?;
        cp.wait_for("kube-controller-manager", |cp| {
            cp.kubectl_ok(&["get", "serviceaccount", "default", "-n", "default"])
        })?;
        Ok(cp)
    }

    /// Starts a program with its output in `<dir>/<program>.log`.
    fn spawn(&mut self, program: &'static str, bin: &Path, args: &[String]) -> Result<(), ControlPlaneError> {
        let log_path = self.dir.join(format!("{program}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|source| ControlPlaneError::Write { path: log_path.display().to_string(), source })?;
        let err = log.try_clone().map_err(|source| ControlPlaneError::Spawn { program, source })?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|source| ControlPlaneError::Spawn { program, source })?;
        self.procs.push((program, child, log_path));
        Ok(())
    }

    /// Polls `ready` until it holds; fails naming the program that ended or did not get ready.
    fn wait_for(
        &mut self,
        program: &'static str,
        ready: impl Fn(&ControlPlane) -> bool,
    ) -> Result<(), ControlPlaneError> {
        let start = Instant::now();
        loop {
            if ready(self) {
                return Ok(());
            }
            for (name, child, log) in &mut self.procs {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(ControlPlaneError::NotReady {
                        program: name,
                        why: format!("ended ({status})"),
                        log: log.display().to_string(),
                        tail: tail(log, 20),
                    });
                }
            }
            if start.elapsed() > READY_WITHIN {
                let log = self.dir.join(format!("{program}.log"));
                return Err(ControlPlaneError::NotReady {
                    program,
                    why: format!("was not ready within {} s", READY_WITHIN.as_secs()),
                    log: log.display().to_string(),
                    tail: tail(&log, 20),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `kubectl ARGS` as the admin: exit code, stdout, stderr.
    pub fn kubectl(&self, args: &[&str]) -> (i32, String, String) {
        self.kubectl_as(&self.admin_kubeconfig, args, None)
    }

    /// `kubectl ARGS` with `kubeconfig`, and `input` on its stdin.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], input: Option<&str>) -> (i32, String, String) {
        use std::io::Write;
        let mut child = match Command::new(kubebin::kubectl())
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => return (-1, String::new(), e.to_string()),
        };
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            let _ = stdin.write_all(text.as_bytes());
        }
        match child.wait_with_output() {
            Ok(o) => (
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stdout).into(),
                String::from_utf8_lossy(&o.stderr).into(),
            ),
            Err(e) => (-1, String::new(), e.to_string()),
        }
    }

    fn kubectl_ok(&self, args: &[&str]) -> bool {
        self.kubectl(args).0 == 0
    }

    /// A kubeconfig that authenticates as ServiceAccount `namespace/name` with a token from the
    /// API server's TokenRequest (`kubectl create token`): what a pod of that account gets, so
    /// RBAC judges every request it makes.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf, ControlPlaneError> {
        let (code, out, err) = self.kubectl(&["create", "token", name, "-n", namespace, "--duration=24h"]);
        if code != 0 {
            return Err(ControlPlaneError::Kubectl {
                what: format!("a token for ServiceAccount {namespace}/{name}"),
                detail: err.trim().to_string(),
            });
        }
        let path = self.dir.join(format!("sa-{namespace}-{name}.kubeconfig"));
        let user = format!("system:serviceaccount:{namespace}:{name}");
        write(&path, &kubeconfig(&self.server, &self.ca_pem, &user, &KubeAuth::Token(out.trim().to_string())))?;
        Ok(path)
    }

    /// What `user` (`system:serviceaccount:NS:NAME`) asked kube-apiserver and was not denied,
    /// from the audit log: (verb, API group, resource[/subresource]); an apply that created
    /// its object counts as a `create` too, as RBAC authorized it.
    pub fn requests_of(&self, user: &str) -> std::collections::BTreeSet<(String, String, String)> {
        let text = std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default();
        let mut out = std::collections::BTreeSet::new();
        for e in text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) {
            let s = |p: &str| e.pointer(p).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            if s("/user/username") != user || s("/stage") != "ResponseComplete" {
                continue;
            }
            let code = e.pointer("/responseStatus/code").and_then(|c| c.as_u64()).unwrap_or(0);
            if code == 403 {
                continue;
            }
            let (sub, resource) = (s("/objectRef/subresource"), s("/objectRef/resource"));
            if resource.is_empty() {
                continue;
            }
            let resource = if sub.is_empty() { resource } else { format!("{resource}/{sub}") };
            let verb = s("/verb");
            // A server-side apply that created its object was authorized as a create too.
            if verb == "patch" && code == 201 {
                out.insert(("create".into(), s("/objectRef/apiGroup"), resource.clone()));
            }
            out.insert((verb, s("/objectRef/apiGroup"), resource));
        }
        out
    }

    /// The folder holding the PKI, the kubeconfigs and each program's log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster CA (PEM), for a webhook's `caBundle` or a client.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A serving certificate and key (PEM) signed by the cluster CA for these addresses and
    /// names: what a webhook the API server calls over TLS presents.
    pub fn serving_cert(&self, names: &[&str]) -> Result<(String, String), ControlPlaneError> {
        self.ca.sign("a serving certificate", names.first().copied().unwrap_or("localhost"), &[], names)
    }
}
