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
pub struct Pair {
    #[serde(default)]
    pub crt: String,
    #[serde(default)]
    pub key: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Bundle {
    pub cluster: ClusterIdentity,
    pub secrets: Secrets,
    pub trustdinfo: TrustdInfo,
    pub certs: Certs,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ClusterIdentity {
    pub id: String,
    pub secret: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Secrets {
    pub bootstraptoken: String,
    #[serde(default)]
    pub secretboxencryptionsecret: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct TrustdInfo {
    pub token: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Certs {
    pub etcd: Pair,
    pub k8s: Pair,
    pub k8saggregator: Pair,
    pub k8sserviceaccount: Pair,
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

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// One problem of a secrets bundle: the key at fault (`certs.k8s.key`), never its value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BundleError {
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
        need(&b.secrets.secretboxencryptionsecret, "secrets.secretboxencryptionsecret");
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
        if missing.is_empty() { Ok(b) } else { Err(missing) }
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
