//! The rule files this build ships with, embedded at compile time.
//!
//! The binary classifies and plans from these when no `--rules DIR` is given, so `ichor config
//! diff` works from any directory; `ichor rules check` reads the files on disk. `build.rs`
//! lists every `.rules` file and every contract inventory under `rules/`, so a new contract or
//! rules file needs no edit here. Compile-time inclusion is not I/O: nothing here touches the
//! filesystem at run time.

include!(concat!(env!("OUT_DIR"), "/embedded_files.rs"));

/// The root of the program the config host evaluates (classification, Talos's acceptance, a
/// machine's condition); it includes the rest and declares every input, column by column.
pub const CONFIG_PROGRAM: &str = "rules/programs/config.rules";

/// The root of the program the operations host evaluates (backbone, upgrade, switch).
pub const OPERATIONS_PROGRAM: &str = "rules/programs/operations.rules";

/// The root of the program the hand-over host evaluates (the CNIHandover condition).
pub const HANDOVER_PROGRAM: &str = "rules/programs/handover.rules";

/// The root of the program the intent host evaluates (whether `ichor operation resume|abort`
/// may be asked now).
pub const INTENT_PROGRAM: &str = "rules/programs/intent.rules";
/// The root of the program the admission host evaluates (the validating webhook's refusals).
pub const ADMISSION_PROGRAM: &str = "rules/programs/admission.rules";

/// The handlebars templates of every message an operation's rules can raise.
pub const MESSAGES: (&str, &str) = ("rules/messages.yaml", include_str!("../../rules/messages.yaml"));

/// The field metadata: the class of every config path, per contract.
pub const FIELDMETA: (&str, &str) = ("rules/fieldmeta.yaml", include_str!("../../rules/fieldmeta.yaml"));

/// The Cilium chart's value keys and types (derived from its values.schema.json).
pub const CILIUM_KEYS: (&str, &str) =
    ("rules/cilium/values.1.20.0.keys", include_str!("../../rules/cilium/values.1.20.0.keys"));

/// The Cilium chart's free-form fields by name (read by `ichor cni schema derive`).
pub const CILIUM_OPEN_FIELDS: (&str, &str) =
    ("rules/cilium/open-fields.yaml", include_str!("../../rules/cilium/open-fields.yaml"));

/// What `ichor adopt` keeps of a running Cilium: cilium-config keys and the chart values that
/// write them (`render::adopt`).
pub const CILIUM_ADOPT: (&str, &str) = ("rules/cilium/adopt.yaml", include_str!("../../rules/cilium/adopt.yaml"));

/// The leaves of the embedded chart's default values with their types (derived from its
/// values.yaml), for the test that the chart's own defaults pass the validator.
pub const CILIUM_DEFAULT_LEAVES: (&str, &str) =
    ("rules/cilium/values.1.20.0.defaults", include_str!("../../rules/cilium/values.1.20.0.defaults"));

/// The Cilium chart embedded in this build: Jobs install it and nothing newer is stepped back
/// (CNI page: "a recorded patch newer than the embedded chart is never stepped back").
pub const CILIUM_CHART_VERSION: &str = "1.20.0";
/// Where the Cilium Job's image carries that chart (docs/resources.md: the Cilium Job).
pub const CILIUM_CHART_PATH: &str = "/charts/cilium-1.20.0.tgz";

/// The Kubernetes version of this Ichor's release set (ADR 0113): the only upgrade target.
pub const RELEASE_SET_KUBERNETES: &str = "v1.37.0";

/// The Talos version of this Ichor's release set (rules/versions.rules `release_set`; a test
/// pins the two together).
pub const RELEASE_SET_TALOS: &str = "v1.14.6";
