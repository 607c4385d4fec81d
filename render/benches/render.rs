//! Render benchmark: classifying 10^5 changed paths, and diffing two full v1.14
//! control-plane configs (parse, changed paths, classification, redacted unified diff).
//!
//! `cargo bench -p render`; under `cargo test` it runs once on smaller inputs as a check.
//! Targets (issue 3): classification under 50 ms, the diff under 5 ms.

use render::classify::{Classifier, RuleSet};
use render::config::Config;
use render::diff::{self, Change, Op};
use render::path::Path;
use render::vocab::Contract;
use std::time::{Duration, Instant};

/// The allocator the `ichor` binary ships with (cli/src/main.rs), so that what is measured is
/// what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../../tests/shared/timer.rs"]
mod timer;

/// `timer::time`, at most 30 runs.
fn time<R>(budget: Duration, f: impl FnMut() -> R) -> Duration {
    timer::time(budget, 30, f)
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let budget = Duration::from_millis(if smoke { 1 } else { 2000 });
    let n = if smoke { 2_000 } else { 100_000 };
    let c = Classifier::new(&RuleSet::embedded()).expect("embedded rules load");
    let v114 = Contract::parse("v1.14").unwrap();

    // 10^5 changed paths over many document kinds, fields and keys.
    let shapes = [
        "LinkConfig[eth{}].mtu",
        "KubeletConfig.config.key{}",
        "machine.certSANs[{}]",
        "KubeAPIServerConfig.extraArgs.flag{}",
        "VolumeConfig[vol{}].encryption.keys[0].slot",
        "cluster.etcd.extraArgs.a{}",
        "KubeProxyConfig.config.k{}",
        "RegistryMirrorConfig[mirror{}].endpoints[0].url",
        "machine.nodeLabels.x{}",
        "NotAKind{}.field",
    ];
    let changes: Vec<Change> = (0..n)
        .map(|i| Change {
            path: Path::parse(&shapes[i % shapes.len()].replace("{}", &i.to_string())).unwrap(),
            op: Op::Changed,
            old: None,
            new: None,
        })
        .collect();
    let out = c.classify(v114, &changes, None, false).unwrap();
    assert_eq!(out.changes.len(), n);
    if std::env::var_os("BREAKDOWN").is_some() {
        let m = &c.contracts[&v114].matcher;
        let t0 = Instant::now();
        let k: usize = changes.iter().map(|ch| ch.path.text().len()).sum();
        println!("  display: {:?} ({k} bytes)", t0.elapsed());
        let t0 = Instant::now();
        let k: usize = changes.iter().map(|ch| m.candidates(&ch.path).len()).sum();
        println!("  pattern trie: {:?} ({k} candidates)", t0.elapsed());
        let t0 = Instant::now();
        let k = changes.iter().filter(|ch| c.contracts[&v114].inventory.contains(&ch.path)).count();
        println!("  inventory: {:?} ({k})", t0.elapsed());
        let t0 = Instant::now();
        let k = changes.iter().filter(|ch| c.sensitive(v114, &ch.path)).count();
        println!("  sensitive: {:?} ({k})", t0.elapsed());
    }
    let t = time(budget, || c.classify(v114, &changes, None, false).unwrap());
    println!(
        "classify {n} changed paths at v1.14: {:.2} ms (target < 50 ms for 10^5; mimalloc, as the ichor binary)",
        t.as_secs_f64() * 1e3
    );

    // Two full control-plane configs, a few fields apart.
    let from = include_str!("../../examples/configs/v1.14/controlplane.yaml");
    let to = from
        .replace("mtu: 1500", "mtu: 9000")
        .replace("kubelet:v1.36.4", "kubelet:v1.36.5")
        .replace("-----BEGIN RSA PRIVATE KEY-----\\n", "-----BEGIN RSA PRIVATE KEY-----\\nROTATED");
    let t = time(budget, || {
        let a = Config::parse(from).unwrap();
        let b = Config::parse(&to).unwrap();
        let ch = diff::changes(&a, &b);
        let o = c.classify(v114, &ch, Some(&b), false).unwrap();
        let sensitive = |p: &Path| c.sensitive(v114, p);
        let text = diff::unified(&diff::redacted_yaml(&a, &sensitive), &diff::redacted_yaml(&b, &sensitive), "a", "b");
        (o.verdict, text)
    });
    println!("diff two full v1.14 control-plane configs: {:.3} ms (target < 5 ms)", t.as_secs_f64() * 1e3);

    // Issue 11: a list of 10^5 elements added to a config (parse, changes, classification,
    // redacted texts, unified diff: all `config diff` does but printing).
    let n = if std::env::args().any(|a| a == "--bench") { 100_000 } else { 2_000 };
    let mut big = String::from(from);
    let items: String = (0..n).map(|i| format!("      - h{i}.example\n")).collect();
    big = big.replacen("certSANs: []\n", &format!("certSANs:\n{items}"), 1);
    assert!(big.len() > from.len(), "the example config has machine.certSANs");
    let t = time(budget, || {
        let a = Config::parse(from).unwrap();
        let b = Config::parse(&big).unwrap();
        let ch = diff::changes(&a, &b);
        let o = c.classify(v114, &ch, Some(&b), false).unwrap();
        let sensitive = |p: &Path| c.sensitive(v114, p);
        let text = diff::unified(&diff::redacted_yaml(&a, &sensitive), &diff::redacted_yaml(&b, &sensitive), "a", "b");
        (o.verdict, text.len())
    });
    println!(
        "diff a config with a {n}-element list added: {:.1} ms (target < 1,000 ms for 10^5)",
        t.as_secs_f64() * 1e3
    );
}
