//! What waits for a reboot: a node's running config changed within one boot in paths that
//! take effect only when the node boots (Talos 1.14 accepts every change live, so a path the
//! field metadata calls `reboot-required` can be running and not in effect).
//!
//! Start at `boot_digests`: on a node's new boot, a digest of each reboot-class value of the
//! config it booted with (what a TalosMachine's `status.boot` records); later,
//! `changed_within_boot` compares those with the running config's, and the paths that differ
//! are "applied, takes effect after the next reboot". Pure: no I/O, no clock.

use crate::classify::{Classifier, ClassifyError};
use crate::config::Config;
use crate::diff::{Change, Op};
use crate::vocab::{Class, Contract};
use std::collections::BTreeMap;

/// A digest of each value of `config` whose path needs a reboot to take effect at `contract`
/// (reboot-required, and owned by no operation), by path. Salted with the boot ID, so a digest of a secret value (a volume encryption key)
/// cannot be matched against another node's or another boot's.
pub fn boot_digests(
    c: &Classifier,
    contract: Contract,
    config: &Config,
    salt: &str,
) -> Result<BTreeMap<String, String>, ClassifyError> {
    let leaves = config.leaves();
    let changes: Vec<Change> = leaves
        .iter()
        .map(|(p, v)| Change { path: p.clone(), op: Op::Added, old: None, new: Some(v.clone()) })
        .collect();
    let outcome = c.classify_machine(contract, &changes, Some(config), None, false)?;
    Ok(changes
        .iter()
        .zip(&outcome.changes)
        // An operation's path (a component image, the kube-proxy mode) is classed reboot-required
        // so that only its operation applies it, but Talos puts it in effect live.
        .filter(|(_, k)| k.class == Class::RebootRequired && c.applied_by(k).is_none())
        .map(|(ch, _)| {
            let value = ch.new.as_ref().map(|v| serde_yaml::to_string(v).unwrap_or_default()).unwrap_or_default();
            (ch.path.to_string(), digest(salt, &ch.path.to_string(), &value))
        })
        .collect())
}

/// The paths whose reboot-class value differs between the config a node booted with and the one
/// it runs (changed, added or removed within the boot), sorted.
pub fn changed_within_boot(at_boot: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Vec<String> {
    let mut out: Vec<String> =
        now.iter().filter(|(p, d)| at_boot.get(*p) != Some(*d)).map(|(p, _)| p.clone()).collect();
    out.extend(at_boot.keys().filter(|p| !now.contains_key(*p)).cloned());
    out.sort_unstable();
    out.dedup();
    out
}

/// 64 bits of FNV-1a over the salt, the path and the value, as hex: enough to tell a change,
/// never to recover a value.
fn digest(salt: &str, path: &str, value: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in salt.bytes().chain([0]).chain(path.bytes()).chain([0]).chain(value.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classifier() -> Classifier {
        Classifier::new(&crate::classify::RuleSet::embedded()).unwrap()
    }

    const BOOTED: &str = "version: v1alpha1\nmachine:\n  type: worker\n  kernel:\n    modules:\n      - name: br_netfilter\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.36.4\ncluster:\n  clusterName: lab\n";

    #[test]
    fn a_reboot_class_change_within_a_boot_is_named_and_a_live_one_is_not() {
        let c = classifier();
        let v14 = Contract { major: 1, minor: 14 };
        let booted = Config::parse(BOOTED).unwrap();
        let at_boot = boot_digests(&c, v14, &booted, "boot-1").unwrap();
        assert!(at_boot.keys().any(|p| p.starts_with("machine.kernel.modules")), "{at_boot:?}");
        assert!(!at_boot.keys().any(|p| p.starts_with("machine.kubelet")), "the kubelet image is live: {at_boot:?}");
        // The same config: nothing waits.
        assert!(changed_within_boot(&at_boot, &boot_digests(&c, v14, &booted, "boot-1").unwrap()).is_empty());
        // A live change (the kubelet image): nothing waits either.
        let live = Config::parse(&BOOTED.replace("v1.36.4", "v1.36.5")).unwrap();
        assert!(changed_within_boot(&at_boot, &boot_digests(&c, v14, &live, "boot-1").unwrap()).is_empty());
        // Another kernel module, applied live: it waits for the reboot.
        let module = Config::parse(&BOOTED.replace("br_netfilter", "overlay")).unwrap();
        let waiting = changed_within_boot(&at_boot, &boot_digests(&c, v14, &module, "boot-1").unwrap());
        assert_eq!(waiting, ["machine.kernel.modules[0].name"]);
    }

    #[test]
    fn a_removed_reboot_class_path_waits_too_and_digests_depend_on_the_boot() {
        let c = classifier();
        let v14 = Contract { major: 1, minor: 14 };
        let booted = Config::parse(BOOTED).unwrap();
        let at_boot = boot_digests(&c, v14, &booted, "boot-1").unwrap();
        let gone =
            Config::parse("version: v1alpha1\nmachine:\n  type: worker\ncluster:\n  clusterName: lab\n").unwrap();
        let waiting = changed_within_boot(&at_boot, &boot_digests(&c, v14, &gone, "boot-1").unwrap());
        assert!(waiting.contains(&"machine.kernel.modules[0].name".to_string()), "{waiting:?}");
        assert_ne!(at_boot, boot_digests(&c, v14, &booted, "boot-2").unwrap());
    }
}
