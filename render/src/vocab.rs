//! Ichor's domain vocabulary for configs: one type per concept, shared by every crate.
//!
//! `Contract` (a Talos config contract, `vX.Y`), `Class` (what applying a changed path takes),
//! `Effect` (what Talos itself does with it) and `Verdict` (a whole change's, ordered by severity). The rules speak these as symbols;
//! `Class::parse` and `Verdict::parse` are where those symbols become types, once, when a host
//! decodes the rules' answers. Kubernetes-side vocabulary (roles, kube-proxy modes, operation
//! kinds) lives with the custom resources in `api`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A Talos config contract, `vX.Y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Contract {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
}

impl Contract {
    /// Parses `vX.Y`.
    pub fn parse(s: &str) -> Option<Contract> {
        let rest = s.strip_prefix('v')?;
        let (a, b) = rest.split_once('.')?;
        let num = |x: &str| {
            if !x.is_empty() && x.bytes().all(|c| c.is_ascii_digit()) { x.parse().ok() } else { None }
        };
        Some(Contract { major: num(a)?, minor: num(b)? })
    }
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}", self.major, self.minor)
    }
}

impl Serialize for Contract {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Contract {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Contract, D::Error> {
        let s = String::deserialize(d)?;
        Contract::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("{s:?} is not a contract (vX.Y)")))
    }
}

/// What applying one changed path takes, from the least to the most disruptive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// Applied live, with no reboot.
    Safe,
    /// Read only when Talos installs; changing it means a reinstall.
    InstallTimeOnly,
    /// Needs a reboot (also the fail-closed default).
    RebootRequired,
    /// The contract has no such path, or Talos would refuse the config: it cannot be applied.
    Unsupported,
}

impl Class {
    /// Every class, from the mildest.
    pub const ALL: [Class; 4] = [Class::Safe, Class::InstallTimeOnly, Class::RebootRequired, Class::Unsupported];

    /// The symbol the rules and every output use.
    pub fn name(self) -> &'static str {
        match self {
            Class::Safe => "safe",
            Class::InstallTimeOnly => "install-time-only",
            Class::RebootRequired => "reboot-required",
            Class::Unsupported => "unsupported",
        }
    }

    /// The class of this name.
    pub fn parse(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == s)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What Talos itself does with one changed path at a contract, whatever Ichor decides for it
/// (issue 29): the rules derive it (`effect` in rules/classify.rules) from the field metadata
/// and the contract, and a field-metadata entry may name it (`effect:`) where Talos's own
/// behaviour differs from what its class says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    /// Talos applies it live and it takes effect at once.
    Live,
    /// Talos applies it live by restarting a service (the entry's `restarts`).
    LiveRestarts,
    /// Talos applies it live, but it takes effect only after the next reboot (v1.14 applies
    /// every change live; etcd, environment variables, kernel modules and volume keys are read
    /// only at boot).
    AfterReboot,
    /// Talos (up to v1.13) applies it only with a reboot: it refuses the change in no-reboot
    /// mode, and reboots the node in auto mode.
    Reboot,
    /// Talos reads it only when it installs or upgrades; a running node never does.
    InstallTimeOnly,
    /// Ichor applies it only through an operation (the entry's `appliedBy`).
    Operation,
    /// Talos accepts it, but nothing reads it (another field or document overrides it, or it is
    /// read only when a volume is formatted): a dead path.
    NoEffect,
    /// The same value moved between a legacy field and its v1.14 document (rules/migrate.rules):
    /// nothing changes on the node.
    Moved,
}

impl Effect {
    /// Every effect.
    pub const ALL: [Effect; 8] = [
        Effect::Live,
        Effect::LiveRestarts,
        Effect::AfterReboot,
        Effect::Reboot,
        Effect::InstallTimeOnly,
        Effect::Operation,
        Effect::NoEffect,
        Effect::Moved,
    ];

    /// The symbol the rules and the field metadata use.
    pub fn name(self) -> &'static str {
        match self {
            Effect::Live => "live",
            Effect::LiveRestarts => "live-restarts",
            Effect::AfterReboot => "after-reboot",
            Effect::Reboot => "reboot",
            Effect::InstallTimeOnly => "install-time-only",
            Effect::Operation => "operation",
            Effect::NoEffect => "no-effect",
            Effect::Moved => "moved",
        }
    }

    /// The effect of this name.
    pub fn parse(s: &str) -> Option<Effect> {
        Effect::ALL.into_iter().find(|e| e.name() == s)
    }

    /// The words an operator reads: `live, restarts kubelet`, `applied, takes effect after a
    /// reboot`; `restarts` are the services the change restarts, `applied_by` the operation
    /// that applies it.
    pub fn label(self, restarts: &[String], applied_by: Option<&str>) -> String {
        match self {
            Effect::Live => "live".into(),
            Effect::LiveRestarts if restarts.is_empty() => "live, restarts a service".into(),
            Effect::LiveRestarts => format!("live, restarts {}", restarts.join(", ")),
            Effect::AfterReboot => "applied, takes effect after a reboot".into(),
            Effect::Reboot => "applied only with a reboot".into(),
            Effect::InstallTimeOnly => "install-time-only".into(),
            Effect::Operation => {
                let by = applied_by.map(|op| format!(": applied by the {op} operation")).unwrap_or_default();
                let restarting =
                    if restarts.is_empty() { String::new() } else { format!(", restarts {}", restarts.join(", ")) };
                format!("operation{by}{restarting}")
            }
            Effect::NoEffect => "accepted, no effect".into(),
            Effect::Moved => "moved (same value)".into(),
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A whole change's verdict: the most severe class present, or `NoChanges`. Ordered by
/// severity, so the worst of several is their `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Verdict {
    /// Nothing changes.
    NoChanges,
    /// Every change applies without a reboot.
    LiveApply,
    /// Applies without a reboot, but some changes take effect only at the next install.
    InstallTimeOnly,
    /// Some change needs a reboot.
    RebootRequired,
    /// Talos would refuse the config.
    Unsupported,
}

impl Verdict {
    /// Every verdict, from the mildest.
    pub const ALL: [Verdict; 5] = [
        Verdict::NoChanges,
        Verdict::LiveApply,
        Verdict::InstallTimeOnly,
        Verdict::RebootRequired,
        Verdict::Unsupported,
    ];

    /// The verdict's name (`LiveApply`).
    pub fn name(self) -> &'static str {
        match self {
            Verdict::NoChanges => "NoChanges",
            Verdict::LiveApply => "LiveApply",
            Verdict::InstallTimeOnly => "InstallTimeOnly",
            Verdict::RebootRequired => "RebootRequired",
            Verdict::Unsupported => "Unsupported",
        }
    }

    /// The verdict of this name.
    pub fn parse(s: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.name() == s)
    }

    /// Whether a node can take the change without a reboot (nothing, or only safe paths).
    pub fn live(self) -> bool {
        self <= Verdict::LiveApply
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Talos would refuse the desired config.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rejection {
    /// Talos's refusal, in its words.
    pub message: String,
    /// The paths at fault, joined by ` and `.
    pub at: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order_is_severity() {
        for c in Class::ALL {
            assert_eq!(Class::parse(c.name()), Some(c));
        }
        for v in Verdict::ALL {
            assert_eq!(Verdict::parse(v.name()), Some(v));
        }
        for e in Effect::ALL {
            assert_eq!(Effect::parse(e.name()), Some(e));
        }
        assert_eq!(Effect::LiveRestarts.label(&["kubelet".into()], None), "live, restarts kubelet");
        assert!(Verdict::NoChanges < Verdict::LiveApply && Verdict::RebootRequired < Verdict::Unsupported);
        assert_eq!(Contract::parse("v1.15"), Some(Contract { major: 1, minor: 15 }));
        assert_eq!(Contract::parse("1.15"), None);
    }
}
