//! Talos's TLS rules, for both sides: an Ed25519 CA and certificates (as Talos generates
//! them), and apid's check of a client certificate (extended key usage exactly `clientAuth`,
//! roles in the Organization).
//!
//! Start at `Pki::generate` (a CA, a server certificate for loopback, an admin client) and
//! `client_roles` (what apid accepts). Used by the simulated fleet and by tests.

use crate::talos::config::{TALOS_ED25519_LABEL, to_pem};
use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ED25519,
};

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
#[error("generating {what}")]
pub struct PkiError {
    what: &'static str,
    source: rcgen::Error,
}

/// A CA and what it signed: PEM texts.
#[derive(Clone)]
pub struct Pki {
    pub ca_pem: String,
    ca_key_pem: String,
    ca_params: CertificateParams,
    pub server_crt_pem: String,
    pub server_key_pem: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pki { .. }")
    }
}

/// A client certificate and its key (Talos's PEM label on the key).
#[derive(Clone)]
pub struct ClientCert {
    pub crt_pem: String,
    pub key_pem: String,
}

/// What a client certificate carries; `Talos` is what `talosctl config new` makes.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub roles: Vec<String>,
    pub usages: Vec<ExtendedKeyUsagePurpose>,
    /// Seconds from now until it expires (negative: already expired).
    pub valid_for: i64,
}

impl ClientSpec {
    pub fn talos(roles: &[&str]) -> ClientSpec {
        ClientSpec {
            roles: roles.iter().map(|r| r.to_string()).collect(),
            usages: vec![ExtendedKeyUsagePurpose::ClientAuth],
            valid_for: 365 * 86_400,
        }
    }
}

fn ed25519(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&PKCS_ED25519).map_err(|source| PkiError { what, source })
}

fn validity(p: &mut CertificateParams, valid_for: i64) {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (from, to) = if valid_for < 0 { (now + valid_for * 2, now + valid_for) } else { (now - 3600, now + valid_for) };
    p.not_before = rcgen::date_time_ymd(1970, 1, 1) + time_offset(from);
    p.not_after = rcgen::date_time_ymd(1970, 1, 1) + time_offset(to);
}

fn time_offset(secs: i64) -> std::time::Duration {
    std::time::Duration::from_secs(secs.max(0) as u64)
}

impl Pki {
    /// A new Talos-style CA (Ed25519) and a server certificate for `127.0.0.1`, `::1` and
    /// `localhost` (the simulated fleet listens on loopback).
    pub fn generate() -> Result<Pki, PkiError> {
        let ca_key = ed25519("the CA key")?;
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "talos");
        ca.distinguished_name = dn;
        validity(&mut ca, 10 * 365 * 86_400);
        let ca_cert = ca.self_signed(&ca_key).map_err(|source| PkiError { what: "the CA", source })?;
        let ca_params = ca.clone();
        let issuer = Issuer::new(ca, &ca_key);
        let server_key = ed25519("the server key")?;
        let mut sp = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])
            .map_err(|source| PkiError { what: "the server certificate", source })?;
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        sp.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        validity(&mut sp, 365 * 86_400);
        let server =
            sp.signed_by(&server_key, &issuer).map_err(|source| PkiError { what: "the server certificate", source })?;
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            ca_key_pem: ca_key.serialize_pem(),
            ca_params,
            server_crt_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
        })
    }

    /// A client certificate signed by this CA; its key under Talos's `ED25519 PRIVATE KEY` label.
    pub fn client(&self, spec: &ClientSpec) -> Result<ClientCert, PkiError> {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem).map_err(|source| PkiError { what: "the CA key", source })?;
        let issuer = Issuer::new(self.ca_params.clone(), &ca_key);
        let key = ed25519("the client key")?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        for r in &spec.roles {
            dn.push(DnType::OrganizationName, r.as_str());
        }
        p.distinguished_name = dn;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = spec.usages.clone();
        validity(&mut p, spec.valid_for);
        let cert = p.signed_by(&key, &issuer).map_err(|source| PkiError { what: "the client certificate", source })?;
        Ok(ClientCert { crt_pem: cert.pem(), key_pem: to_pem(TALOS_ED25519_LABEL, &key.serialize_der()) })
    }

    /// A talosconfig with one context `name` for these endpoints and nodes.
    pub fn talosconfig(&self, name: &str, endpoints: &[String], nodes: &[String], client: &ClientCert) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let list = |v: &[String]| v.iter().map(|e| format!("\n      - {e}")).collect::<String>();
        format!(
            "context: {name}\ncontexts:\n  {name}:\n    endpoints:{}\n    nodes:{}\n    ca: {}\n    crt: {}\n    key: {}\n",
            list(endpoints),
            list(nodes),
            b64(&self.ca_pem),
            b64(&client.crt_pem),
            b64(&client.key_pem)
        )
    }
}

/// Why apid refuses a client certificate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CertRefusal {
    #[error("no client certificate")]
    Missing,
    #[error("the client certificate is not X.509")]
    Unparsable,
    #[error("the client certificate's extended key usage must be exactly clientAuth")]
    ExtKeyUsage,
}

/// The roles of a client certificate as apid accepts it: a non-CA certificate whose extended
/// key usage is exactly `clientAuth` (apid's `verifyExtKeyUsage`); its roles are the
/// Organization values.
pub fn client_roles(der: &[u8]) -> Result<Vec<String>, CertRefusal> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| CertRefusal::Unparsable)?;
    if !cert.is_ca() {
        let eku = cert.extended_key_usage().ok().flatten().map(|e| e.value);
        let exactly_client = eku.is_some_and(|e| {
            e.client_auth
                && !e.any
                && !e.server_auth
                && !e.code_signing
                && !e.email_protection
                && !e.time_stamping
                && !e.ocsp_signing
                && e.other.is_empty()
        });
        if !exactly_client {
            return Err(CertRefusal::ExtKeyUsage);
        }
    }
    Ok(cert.subject().iter_organization().filter_map(|o| o.as_str().ok().map(str::to_string)).collect())
}
