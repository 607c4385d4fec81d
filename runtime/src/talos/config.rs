//! The talosconfig: contexts, endpoints, nodes and the client's credentials, as `talosctl`
//! writes them (`ca`, `crt`, `key` are base64 of PEM).
//!
//! Start at `TalosConfig::parse`; `Context::credentials` decodes and checks the PEM material
//! (an Ed25519 key may carry Talos's non-standard `ED25519 PRIVATE KEY` label). Every error
//! names the file and the field (`contexts.lab.crt`); key material never appears in one.

use base64::Engine as _;
use serde::Deserialize;
use std::collections::BTreeMap;

/// One problem of a talosconfig: the file, the field at fault, and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {field}: {problem}")]
pub struct TalosConfigError {
    pub file: String,
    pub field: String,
    pub problem: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct TalosConfig {
    /// The context used when none is chosen.
    #[serde(default)]
    pub context: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Context {
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub nodes: Vec<String>,
    #[serde(default)]
    pub ca: String,
    #[serde(default)]
    pub crt: String,
    #[serde(default)]
    pub key: String,
}

/// The PEM material of a context, decoded and checked.
#[derive(Clone)]
pub struct Credentials {
    pub ca_pem: String,
    pub crt_pem: String,
    /// PKCS#8 under the standard `PRIVATE KEY` label.
    pub key_pem: String,
    /// The roles the client certificate carries (its Organization values, `os:admin`, ...).
    pub roles: Vec<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("roles", &self.roles).finish_non_exhaustive()
    }
}

/// The label Talos writes on Ed25519 keys (a PKCS#8 body).
pub const TALOS_ED25519_LABEL: &str = "ED25519 PRIVATE KEY";

impl TalosConfig {
    /// Parses a talosconfig; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<TalosConfig, TalosConfigError> {
        let err = |field: &str, problem: String| TalosConfigError { file: file.into(), field: field.into(), problem };
        let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| {
            let at = e.location().map(|l| format!("line {}, column {}", l.line(), l.column())).unwrap_or_default();
            // serde_yaml quotes the offending text: never show it (it may be key material).
            err(&at, "not YAML a talosconfig can be read from".into())
        })?;
        serde_yaml::from_value(value).map_err(|e| {
            let what = e.to_string();
            let what = what.split(':').next().unwrap_or("").to_string();
            err(
                if what.is_empty() { "(root)" } else { &what },
                "not a talosconfig (expected context and contexts.<name>.{endpoints, nodes, ca, crt, key})".into(),
            )
        })
    }

    /// The named context, or the file's current one.
    pub fn context(&self, name: Option<&str>, file: &str) -> Result<(&str, &Context), TalosConfigError> {
        let err = |field: &str, problem: String| TalosConfigError { file: file.into(), field: field.into(), problem };
        let name = match name.or(self.context.as_deref()) {
            Some(n) => n,
            None => return Err(err("context", "no context is set: set it, or pass --context".into())),
        };
        let known: Vec<&str> = self.contexts.keys().map(String::as_str).collect();
        match self.contexts.get_key_value(name) {
            Some((k, c)) => Ok((k.as_str(), c)),
            None => Err(err(
                "context",
                format!(
                    "no context {name:?} in contexts (the file has: {})",
                    if known.is_empty() { "none".into() } else { known.join(", ") }
                ),
            )),
        }
    }
}

impl Context {
    /// Decodes `ca`, `crt` and `key` (base64 of PEM) and checks them: a CA certificate, a client
    /// certificate that has not expired (at `now`, seconds since 1970), a private key.
    pub fn credentials(&self, name: &str, file: &str, now: i64) -> Result<Credentials, TalosConfigError> {
        let field = |f: &str| format!("contexts.{name}.{f}");
        let err = |f: &str, problem: String| TalosConfigError { file: file.into(), field: field(f), problem };
        if self.endpoints.is_empty() {
            return Err(err("endpoints", "no endpoints: list at least one (host or host:port)".into()));
        }
        let decode = |f: &str, v: &str| -> Result<String, TalosConfigError> {
            if v.trim().is_empty() {
                return Err(err(f, "missing: talosctl writes it as base64 of PEM".into()));
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .map_err(|_| err(f, "not base64 (talosctl writes base64 of PEM)".into()))?;
            String::from_utf8(bytes).map_err(|_| err(f, "base64 of something that is not PEM text".into()))
        };
        let ca_pem = decode("ca", &self.ca)?;
        let crt_pem = decode("crt", &self.crt)?;
        let key_text = decode("key", &self.key)?;
        let ca = first_cert(&ca_pem).ok_or_else(|| err("ca", "no PEM CERTIFICATE block".into()))?;
        let crt = first_cert(&crt_pem).ok_or_else(|| err("crt", "no PEM CERTIFICATE block".into()))?;
        let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca)
            .map_err(|_| err("ca", "the PEM block is not an X.509 certificate".into()))?;
        if !ca_cert.is_ca() {
            return Err(err("ca", "not a CA certificate (it should be the Talos OS CA)".into()));
        }
        let (_, cert) = x509_parser::parse_x509_certificate(&crt)
            .map_err(|_| err("crt", "the PEM block is not an X.509 certificate".into()))?;
        let validity = cert.validity();
        if validity.not_after.timestamp() < now {
            return Err(err(
                "crt",
                format!(
                    "the client certificate expired at {}: generate a new talosconfig (talosctl config new)",
                    validity.not_after
                ),
            ));
        }
        if validity.not_before.timestamp() > now {
            return Err(err("crt", format!("the client certificate is not valid before {}", validity.not_before)));
        }
        let roles: Vec<String> =
            cert.subject().iter_organization().filter_map(|o| o.as_str().ok().map(str::to_string)).collect();
        let key_pem = normalize_key(&key_text).ok_or_else(|| {
            err("key", format!("no PEM private key block (PRIVATE KEY, {TALOS_ED25519_LABEL}, EC PRIVATE KEY)"))
        })?;
        Ok(Credentials { ca_pem, crt_pem, key_pem, roles })
    }
}

/// The DER of the first CERTIFICATE block.
pub fn first_cert(pem: &str) -> Option<Vec<u8>> {
    pem_blocks(pem).into_iter().find(|(label, _)| label == "CERTIFICATE").map(|(_, der)| der)
}

/// Every PEM block: label and DER.
pub fn pem_blocks(pem: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = vec![];
    let mut lines = pem.lines();
    while let Some(line) = lines.next() {
        let Some(label) = line.trim().strip_prefix("-----BEGIN ").and_then(|l| l.strip_suffix("-----")) else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut body = String::new();
        for l in lines.by_ref() {
            if l.trim() == end {
                break;
            }
            body.push_str(l.trim());
        }
        if let Ok(der) = base64::engine::general_purpose::STANDARD.decode(body) {
            out.push((label.to_string(), der));
        }
    }
    out
}

/// A private key PEM as rustls reads it: Talos's `ED25519 PRIVATE KEY` label (a PKCS#8 body)
/// becomes `PRIVATE KEY`; other standard labels stay.
pub fn normalize_key(pem: &str) -> Option<String> {
    let (label, der) = pem_blocks(pem).into_iter().find(|(l, _)| l.ends_with("PRIVATE KEY"))?;
    let label = if label == TALOS_ED25519_LABEL { "PRIVATE KEY".to_string() } else { label };
    Some(to_pem(&label, &der))
}

pub fn to_pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s + &format!("-----END {label}-----\n")
}
