//! The rule files this build ships with, embedded at compile time.
//!
//! The binary classifies from these when no `--rules DIR` is given, so `ichor config diff`
//! works from any directory; `ichor rules check` reads the files on disk. Compile-time
//! inclusion is not I/O: nothing here touches the filesystem at run time.

/// `(file name as shown in proofs, contents)`.
pub const RULES: &[(&str, &str)] = &[
    ("rules/classify.rules", include_str!("../../rules/classify.rules")),
    ("rules/talos-accepts.rules", include_str!("../../rules/talos-accepts.rules")),
    ("rules/machine.rules", include_str!("../../rules/machine.rules")),
    ("rules/backbone.rules", include_str!("../../rules/backbone.rules")),
    ("rules/upgrade.rules", include_str!("../../rules/upgrade.rules")),
    ("rules/switch.rules", include_str!("../../rules/switch.rules")),
];

/// The files the classifier evaluates (the first three of `RULES`): classification, Talos's
/// acceptance, and the machine's condition. Operations add the rest.
pub const CLASSIFY_RULES: usize = 3;

/// The handlebars templates of every message an operation's rules can raise.
pub const MESSAGES: (&str, &str) = ("rules/messages.yaml", include_str!("../../rules/messages.yaml"));

pub const FIELDMETA: (&str, &str) = ("rules/fieldmeta.yaml", include_str!("../../rules/fieldmeta.yaml"));

/// `(contract, inventory text)`.
pub const CONTRACTS: &[(&str, &str)] = &[
    ("v1.12", include_str!("../../rules/contracts/v1.12.paths")),
    ("v1.13", include_str!("../../rules/contracts/v1.13.paths")),
    ("v1.14", include_str!("../../rules/contracts/v1.14.paths")),
];

/// The Cilium chart's value keys and types (derived from its values.schema.json).
pub const CILIUM_KEYS: (&str, &str) =
    ("rules/cilium/values.1.20.0.keys", include_str!("../../rules/cilium/values.1.20.0.keys"));
