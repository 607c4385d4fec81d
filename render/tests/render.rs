//! render's integration tests (one binary): inventories against real configs, and more.

use render::config::Config;
use render::inventory::Inventory;

fn inventory(v: &str) -> Inventory {
    let text = std::fs::read_to_string(format!(
        "{}/../rules/contracts/{v}.paths",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    Inventory::parse(&text).unwrap()
}

/// Every leaf of Talos's own generated configs exists in its contract's inventory. Reads
/// `../shared` when present (the real files are not the project's to copy).
#[test]
fn real_configs_are_covered_by_their_inventory() {
    let shared = format!("{}/../../shared/talos/configs", env!("CARGO_MANIFEST_DIR"));
    if !std::path::Path::new(&shared).exists() {
        eprintln!("skipped: {shared} is absent");
        return;
    }
    let mut missing = vec![];
    for (v, files) in [
        (
            "v1.13",
            vec!["v1.13/base-controlplane.yaml", "v1.13/base-worker.yaml"],
        ),
        (
            "v1.14",
            vec![
                "v1.14/base-controlplane.yaml",
                "v1.14/base-worker.yaml",
                "v1.14/overrides-controlplane.yaml",
            ],
        ),
    ] {
        let inv = inventory(v);
        for f in files {
            let text = std::fs::read_to_string(format!("{shared}/{f}")).unwrap();
            let c = Config::parse(&text).unwrap_or_else(|e| panic!("{f}: {e:?}"));
            for p in c.leaves().keys() {
                if !inv.contains(p) {
                    missing.push(format!("{v} {f}: {p}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths missing from inventories:\n{}",
        missing.join("\n")
    );
}

use render::fieldmeta::{Contract, FieldMeta};
use std::collections::BTreeMap;

fn contracts() -> Vec<Contract> {
    ["v1.12", "v1.13", "v1.14"]
        .iter()
        .map(|c| Contract::parse(c).unwrap())
        .collect()
}

fn fieldmeta_text() -> String {
    std::fs::read_to_string(format!(
        "{}/../rules/fieldmeta.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn shipped_fieldmeta_loads_and_covers_every_contract() {
    let meta =
        FieldMeta::parse(&fieldmeta_text(), &contracts()).unwrap_or_else(|e| panic!("{e:?}"));
    let invs: BTreeMap<Contract, Inventory> = contracts()
        .into_iter()
        .map(|c| (c, inventory(&c.to_string())))
        .collect();
    let (errors, coverage) = meta.check_inventories(&invs);
    assert!(
        errors.is_empty(),
        "{}",
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    for (c, cov) in coverage {
        assert!(
            cov.defaulted.is_empty(),
            "{c}: {} of {} paths fall to the default: {:?}",
            cov.defaulted.len(),
            cov.total,
            cov.defaulted
        );
    }
}
