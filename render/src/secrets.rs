//! The Talos secrets bundle (`talosctl gen secrets` format, FACTS 8.9) and where each value
//! goes in a config.
//!
//! Start at `Bundle::parse`. Certificates and keys are base64 of PEM, as Talos stores them;
//! the legacy v1alpha1 form embeds them so, the v1.14 documents take the PEM text itself.
//! `Bundle::from_config` recovers a bundle from a rendered config (either form), as
//! `talosctl gen secrets --from-controlplane-config` does.

use crate::config::Config;
use base64::Engine as _;
use serde::Deserialize;
use serde_yaml::Value;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
/// A certificate and its key, PEM, base64-encoded as Talos's bundle holds them.
pub struct Pair {
    #[serde(default)]
    /// The certificate.
    pub crt: String,
    #[serde(default)]
    /// The private key.
    pub key: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
/// A Talos secrets bundle (`talosctl gen secrets`): what every machine of a cluster shares.
pub struct Bundle {
    /// The cluster's identity.
    pub cluster: ClusterIdentity,
    /// The cluster's shared secrets.
    pub secrets: Secrets,
    /// The token machines join trustd with.
    pub trustdinfo: TrustdInfo,
    /// The cluster's certificate authorities.
    pub certs: Certs,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
/// The cluster's identity (`cluster.id`, `cluster.secret`).
pub struct ClusterIdentity {
    /// The cluster's id.
    pub id: String,
    /// The cluster's secret (discovery).
    pub secret: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
/// The cluster's shared secrets.
pub struct Secrets {
    /// The bootstrap token kubelets join with.
    pub bootstraptoken: String,
    #[serde(default)]
    /// The key the API server encrypts Secrets at rest with.
    pub secretboxencryptionsecret: String,
    /// The encryption secret of contracts up to 1.2; Talos takes one of the two.
    #[serde(default)]
    pub aescbcencryptionsecret: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
/// The trustd token.
pub struct TrustdInfo {
    /// The token.
    pub token: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
/// The cluster's certificate authorities.
pub struct Certs {
    /// etcd's CA.
    pub etcd: Pair,
    /// Kubernetes' CA.
    pub k8s: Pair,
    /// The front proxy's (aggregation layer's) CA.
    pub k8saggregator: Pair,
    /// The service-account signing key.
    pub k8sserviceaccount: Pair,
    /// Talos's own CA (the Talos API).
    pub os: Pair,
}

/// The PEM text of a base64-of-PEM value (what v1.14 documents take).
pub fn pem(b64: &str) -> String {
    base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| b64.to_string())
}

/// Why a value is not base64 of a PEM block of the wanted kind (the label is named, never the
/// content).
fn pem_problem(b64: &str, wanted: impl Fn(&str) -> bool, what: &str) -> Option<String> {
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
        return Some(format!("not base64 (Talos stores {what} as base64 of its PEM)"));
    };
    let Ok(text) = String::from_utf8(bytes) else { return Some(format!("not base64 of PEM text ({what} expected)")) };
    let label =
        text.lines().find_map(|l| l.trim().strip_prefix("-----BEGIN ")?.strip_suffix("-----").map(str::to_string));
    match label {
        None => Some(format!("no PEM block ({what} expected)")),
        Some(l) if !wanted(&l) => Some(format!("a PEM {l}, where {what} belongs")),
        Some(l) => {
            let body: String = text
                .lines()
                .skip_while(|x| !x.contains("-----BEGIN"))
                .skip(1)
                .take_while(|x| !x.contains("-----END"))
                .filter(|x| !x.contains(':'))
                .collect();
            match base64::engine::general_purpose::STANDARD.decode(body.trim()) {
                Ok(der) if !der.is_empty() => None,
                _ => Some(format!("the PEM {l} block's body is not base64")),
            }
        }
    }
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// One problem of a secrets bundle: the key at fault (`certs.k8s.key`), never its value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BundleError {
    /// The key at fault and the problem, never the value.
    pub message: String,
}

impl Bundle {
    /// Parses a bundle; every missing key is named (`certs.k8s.key`), never its value.
    pub fn parse(text: &str) -> Result<Bundle, Vec<BundleError>> {
        Bundle::parse_text(text)
            .map_err(|problems| problems.into_iter().map(|message| BundleError { message }).collect())
    }

    fn parse_text(text: &str) -> Result<Bundle, Vec<String>> {
        // Bounded and normalized first; then read again from the normalized text, so that serde
        // names the key path of what is missing.
        let value = crate::yaml::parse(text, crate::config::MAX_CONFIG_BYTES).map_err(|e| vec![e.message])?;
        let normalized = serde_yaml::to_string(&value).unwrap_or_default();
        let b: Bundle = serde_yaml::from_str(&normalized).map_err(|e| {
            // Never a value of the bundle in a message: they are the cluster's keys.
            let msg = crate::yaml::scrub(&e.to_string());
            vec![msg.split(" at line ").next().unwrap_or(&msg).replace("missing field", "missing key")]
        })?;
        let mut missing = vec![];
        let mut need = |v: &str, name: &str| {
            if v.trim().is_empty() {
                missing.push(format!("the secrets bundle has no {name}"));
            }
        };
        need(&b.cluster.id, "cluster.id");
        need(&b.cluster.secret, "cluster.secret");
        need(&b.secrets.bootstraptoken, "secrets.bootstraptoken");
        need(&b.trustdinfo.token, "trustdinfo.token");
        for (pair, name, key_needed) in [
            (&b.certs.etcd, "etcd", true),
            (&b.certs.k8s, "k8s", true),
            (&b.certs.k8saggregator, "k8saggregator", true),
            (&b.certs.os, "os", true),
        ] {
            need(&pair.crt, &format!("certs.{name}.crt"));
            if key_needed {
                need(&pair.key, &format!("certs.{name}.key"));
            }
        }
        need(&b.certs.k8sserviceaccount.key, "certs.k8sserviceaccount.key");
        match (b.secrets.secretboxencryptionsecret.is_empty(), b.secrets.aescbcencryptionsecret.is_empty()) {
            (true, true) => missing.push(
                "the secrets bundle has none of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret]; one of them is required".into(),
            ),
            (false, false) => missing.push(
                "the secrets bundle has both secrets.secretboxencryptionsecret and secrets.aescbcencryptionsecret; only one of them is allowed".into(),
            ),
            _ => {}
        }
        missing.extend(b.invalid());
        if missing.is_empty() { Ok(b) } else { Err(missing) }
    }

    /// What Talos's bundle validation refuses in values that are there (FACTS 8.9): keys and
    /// certificates must be base64 of PEM of the right kind, the 32-byte secrets 32 bytes, the
    /// tokens `[0-9a-z]{6}.[0-9a-z]{16}`. Each problem names the key, never the value.
    fn invalid(&self) -> Vec<String> {
        let mut out = vec![];
        let mut check = |v: &str, name: &str, problem: Option<String>| {
            if let (false, Some(p)) = (v.trim().is_empty(), problem) {
                out.push(format!("the secrets bundle's {name} is invalid: {p}"));
            }
        };
        let token = |t: &str| {
            let ok = t.split_once('.').is_some_and(|(a, b)| {
                a.len() == 6
                    && b.len() == 16
                    && (a.bytes().chain(b.bytes())).all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
            });
            (!ok).then(|| {
                "a token is 6 and 16 characters of [0-9a-z] joined by a dot (`talosctl gen secrets` makes one)"
                    .to_string()
            })
        };
        check(&self.secrets.bootstraptoken, "secrets.bootstraptoken", token(&self.secrets.bootstraptoken));
        check(&self.trustdinfo.token, "trustdinfo.token", token(&self.trustdinfo.token));
        for (v, name) in [
            (&self.cluster.secret, "cluster.secret"),
            (&self.secrets.secretboxencryptionsecret, "secrets.secretboxencryptionsecret"),
            (&self.cluster.id, "cluster.id"),
        ] {
            let engines = [&base64::engine::general_purpose::STANDARD, &base64::engine::general_purpose::URL_SAFE];
            // The cluster id is URL-safe base64 up to 1.13, standard from 1.14; secrets are standard.
            let n = if name == "cluster.id" { &engines[..] } else { &engines[..1] };
            let len = n.iter().find_map(|e| e.decode(v.trim()).ok()).map(|b| b.len());
            check(
                v,
                name,
                match len {
                    None => Some("not base64 of 32 random bytes".into()),
                    Some(32) => None,
                    Some(l) => Some(format!("decodes to {l} bytes; Talos needs 32")),
                },
            );
        }
        for (pair, name, key) in [
            (&self.certs.etcd, "etcd", true),
            (&self.certs.k8s, "k8s", true),
            (&self.certs.k8saggregator, "k8saggregator", true),
            (&self.certs.os, "os", true),
            (&self.certs.k8sserviceaccount, "k8sserviceaccount", false),
        ] {
            if key || !pair.crt.is_empty() {
                check(
                    &pair.crt,
                    &format!("certs.{name}.crt"),
                    pem_problem(&pair.crt, |l| l == "CERTIFICATE", "a certificate"),
                );
            }
            check(
                &pair.key,
                &format!("certs.{name}.key"),
                pem_problem(&pair.key, |l| l.ends_with("PRIVATE KEY"), "a private key"),
            );
        }
        out
    }

    /// Recovers the bundle from a control-plane config of either form.
    pub fn from_config(c: &Config) -> Bundle {
        let v1 = c.v1alpha1().map(|d| d.value.clone()).unwrap_or(Value::Null);
        let s = |v: &Value, path: &[&str]| -> String {
            let mut cur = v;
            for p in path {
                match cur.get(*p) {
                    Some(x) => cur = x,
                    None => return String::new(),
                }
            }
            cur.as_str().unwrap_or_default().to_string()
        };
        let doc = |kind: &str| {
            c.docs.iter().find(|d| d.kind.as_deref() == Some(kind)).map(|d| d.value.clone()).unwrap_or(Value::Null)
        };
        let mut b = Bundle::default();
        b.trustdinfo.token = s(&v1, &["machine", "token"]);
        b.certs.os = Pair { crt: s(&v1, &["machine", "ca", "crt"]), key: s(&v1, &["machine", "ca", "key"]) };
        b.secrets.bootstraptoken = s(&v1, &["cluster", "token"]);
        b.certs.etcd =
            Pair { crt: s(&v1, &["cluster", "etcd", "ca", "crt"]), key: s(&v1, &["cluster", "etcd", "ca", "key"]) };
        if v1.get("cluster").and_then(|c| c.get("ca")).is_some() {
            b.cluster = ClusterIdentity { id: s(&v1, &["cluster", "id"]), secret: s(&v1, &["cluster", "secret"]) };
            b.secrets.secretboxencryptionsecret = s(&v1, &["cluster", "secretboxEncryptionSecret"]);
            b.certs.k8s = Pair { crt: s(&v1, &["cluster", "ca", "crt"]), key: s(&v1, &["cluster", "ca", "key"]) };
            b.certs.k8saggregator = Pair {
                crt: s(&v1, &["cluster", "aggregatorCA", "crt"]),
                key: s(&v1, &["cluster", "aggregatorCA", "key"]),
            };
            b.certs.k8sserviceaccount.key = s(&v1, &["cluster", "serviceAccount", "key"]);
        } else {
            let id = doc("DiscoveryIdentityConfig");
            b.cluster = ClusterIdentity { id: s(&id, &["clusterID"]), secret: s(&id, &["clusterSecret"]) };
            let ca = doc("KubeAPIServerCAConfig");
            b.certs.k8s = Pair { crt: b64(&s(&ca, &["issuingCA", "cert"])), key: b64(&s(&ca, &["issuingCA", "key"])) };
            let agg = doc("KubeAggregatorCAConfig");
            b.certs.k8saggregator =
                Pair { crt: b64(&s(&agg, &["issuingCA", "cert"])), key: b64(&s(&agg, &["issuingCA", "key"])) };
            b.certs.k8sserviceaccount.key = b64(&s(&doc("KubeServiceAccountConfig"), &["issuer", "privateKey"]));
            let enc = doc("KubeEtcdEncryptionConfig");
            b.secrets.secretboxencryptionsecret = enc
                .get("config")
                .and_then(|c| c.get("resources"))
                .and_then(|r| r.get(0))
                .and_then(|r| r.get("providers"))
                .and_then(|p| p.get(0))
                .and_then(|p| p.get("secretbox"))
                .and_then(|s| s.get("keys"))
                .and_then(|k| k.get(0))
                .and_then(|k| k.get("secret"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
        }
        b
    }
}
