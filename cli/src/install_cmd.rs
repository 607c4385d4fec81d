//! `ichor install` and `ichor uninstall`: the options, the talosconfig read and checked, the
//! webhook's certificates generated; the manifests themselves are `runtime::install`'s.
//!
//! Start at `install`.

use crate::{Report, disk, io::now};
use anyhow::Result;
use runtime::install::{Install, WebhookTls};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    #[arg(long, default_value = "ichor-system")]
    pub namespace: String,
    #[arg(long, default_value = runtime::kube::JOB_IMAGE)]
    pub image: String,
    /// Replicas of the controller and of the webhook (two: one takes over while the other's
    /// node drains).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub replicas: u32,
    /// Let cert-manager make the webhook's certificate (an Issuer chain and the Certificate,
    /// the CA injected) instead of shipping one generated here.
    #[arg(long, conflicts_with = "rotate_certs")]
    pub cert_manager: bool,
    /// Print only new webhook certificates (the TLS Secret and the webhook configuration's
    /// caBundle), to apply over a running installation.
    #[arg(long)]
    pub rotate_certs: bool,
    /// Ship this talosconfig (role os:admin) as the Secret ichor-talosconfig.
    #[arg(long)]
    pub talosconfig: Option<PathBuf>,
    /// The talosconfig context to check (default: its current one).
    #[arg(long, requires = "talosconfig")]
    pub context: Option<String>,
    /// Do not lock the namespace down with CiliumNetworkPolicies (the controller's
    /// `--no-network-policies`).
    #[arg(long)]
    pub no_network_policies: bool,
    /// A CIDR the controller's metrics may be scraped from once the namespace is locked down
    /// (repeat it; the controller's `--metrics-from`).
    #[arg(long, value_name = "CIDR", conflicts_with = "no_network_policies")]
    pub metrics_from: Vec<String>,
    /// Add the monitoring manifests: a Service over the metrics port, a ServiceMonitor, a
    /// PrometheusRule with Ichor's alerts and a Grafana dashboard (ConfigMap). They need the
    /// Prometheus Operator's CRDs (monitoring.coreos.com).
    #[arg(long, conflicts_with = "rotate_certs")]
    pub monitoring: bool,
}

#[derive(clap::Args, Debug)]
pub struct UninstallArgs {
    #[arg(long, default_value = "ichor-system")]
    pub namespace: String,
    /// The installation used cert-manager (`ichor install --cert-manager`).
    #[arg(long)]
    pub cert_manager: bool,
    /// Delete the CRDs too, last: every Ichor resource goes with them.
    #[arg(long)]
    pub crds: bool,
    /// The installation has the monitoring manifests (`ichor install --monitoring`).
    #[arg(long)]
    pub monitoring: bool,
}

pub fn install(a: &InstallArgs) -> Result<Report> {
    let talosconfig = match &a.talosconfig {
        None => None,
        Some(path) => {
            let text = disk::read_text(path, disk::caps::TEXT, "a talosconfig")?;
            runtime::install::talosconfig(&text, &path.display().to_string(), a.context.as_deref(), now())?;
            Some(text)
        }
    };
    let tls = if a.cert_manager {
        WebhookTls::CertManager
    } else {
        WebhookTls::Generated(runtime::install::webhook_certs(&a.namespace, now())?)
    };
    let network_policies = if a.no_network_policies {
        None
    } else {
        Some(a.metrics_from.iter().map(|c| runtime::netpol::cidr(c)).collect::<Result<Vec<_>, _>>()?)
    };
    let o = Install {
        namespace: a.namespace.clone(),
        image: a.image.clone(),
        replicas: a.replicas,
        tls,
        talosconfig,
        network_policies,
        monitoring: a.monitoring,
    };
    let stdout = if a.rotate_certs { runtime::install::rotate_yaml(&o) } else { runtime::install::install_yaml(&o) };
    Ok(Report { stdout, ..Report::default() })
}

pub fn uninstall(a: &UninstallArgs) -> Result<Report> {
    // What is deleted does not depend on the certificate's bytes: the identities are the same.
    let tls = if a.cert_manager {
        WebhookTls::CertManager
    } else {
        WebhookTls::Generated(runtime::install::webhook_certs(&a.namespace, now())?)
    };
    let o = Install {
        namespace: a.namespace.clone(),
        image: runtime::kube::JOB_IMAGE.into(),
        replicas: 1,
        tls,
        talosconfig: Some(String::new()),
        network_policies: Some(vec![]),
        monitoring: a.monitoring,
    };
    let crds = if a.crds { Some(crate::render_cmd::crds_cmd()?.stdout) } else { None };
    let stdout = runtime::install::uninstall_yaml(&runtime::install::install_yaml(&o), crds.as_deref());
    Ok(Report { stdout, ..Report::default() })
}
