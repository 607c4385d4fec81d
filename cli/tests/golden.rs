//! Golden tests: every case under `tests/golden/<case>/` runs the `ichor` binary.
//!
//! A case is a `*.toml` (arguments, expected exit code) beside its inputs, with the expected
//! output in `*.stdout` / `*.stderr`; the command runs in the case's folder. Rewrite the
//! expected files with `TRYCMD=overwrite cargo test -p cli --test golden` and read the change
//! as a diff.
//!
//! A case that runs on a shared folder (an example cluster, the shipped rules) does not copy
//! it: its `fixture.yaml` names the base per folder (`manifests: examples/clusters/lab-v1.14`),
//! the case holds only what differs, under `<folder>.overlay/`, and `materialize` writes the
//! base with the overlay over it to `<folder>/` before the cases run (git ignores it).

mod common;
use common::{root, rust_files};

#[test]
fn golden() {
    materialize();
    trycmd::TestCases::new().case("../tests/golden/*/*.toml");
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())).flatten() {
        let (p, ft) = (e.path(), e.file_type().unwrap());
        let target = to.join(e.file_name());
        if ft.is_dir() {
            copy_tree(&p, &target);
        } else {
            std::fs::copy(&p, &target).unwrap_or_else(|e| panic!("{} -> {}: {e}", p.display(), target.display()));
        }
    }
}

/// The cases' `fixture.yaml`s: (case folder, folder written, base from the root).
fn fixtures() -> Vec<(std::path::PathBuf, String, String)> {
    let mut out = vec![];
    for e in std::fs::read_dir(root().join("tests/golden")).unwrap().flatten() {
        let file = e.path().join("fixture.yaml");
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let map: std::collections::BTreeMap<String, String> =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        out.extend(map.into_iter().map(|(into, base)| (e.path(), into, base)));
    }
    out.sort();
    out
}

/// Writes each fixture's folder: its base, then the case's overlay over it.
fn materialize() {
    for (case, into, base) in fixtures() {
        let target = case.join(&into);
        let _ = std::fs::remove_dir_all(&target);
        copy_tree(&root().join(&base), &target);
        let overlay = case.join(format!("{into}.overlay"));
        if overlay.is_dir() {
            copy_tree(&overlay, &target);
        }
    }
}

/// Every folder a fixture writes is ignored by git, and every ignored folder is a fixture's.
#[test]
fn tidy_fixture_folders_are_ignored_and_only_they() {
    let ignore = std::fs::read_to_string(root().join("tests/golden/.gitignore")).unwrap();
    let listed: std::collections::BTreeSet<String> =
        ignore.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(str::to_string).collect();
    let written: std::collections::BTreeSet<String> = fixtures()
        .iter()
        .map(|(case, into, _)| format!("/{}/{into}/", case.file_name().unwrap().to_string_lossy()))
        .collect();
    assert_eq!(listed, written, "tests/golden/.gitignore must list exactly the folders the fixtures write");
    for (case, into, base) in fixtures() {
        assert!(root().join(&base).is_dir(), "{}: base {base} is not a folder", case.display());
        assert!(
            !case.join(format!("{into}.overlay")).exists() || case.join(format!("{into}.overlay")).is_dir(),
            "{}: {into}.overlay must be a folder",
            case.display()
        );
    }
}

use std::process::Command;

fn ichor(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// A config over 10 MiB is refused with the limit named, before it is parsed.
#[test]
fn config_over_ten_mib_is_refused() {
    let dir = std::env::temp_dir().join(format!("ichor-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.yaml");
    let mut text = String::from("version: v1alpha1\nmachine:\n    type: worker\n    nodeLabels:\n");
    while text.len() <= 10 * 1024 * 1024 {
        text.push_str(&format!("        l{}: \"{}\"\n", text.len(), "x".repeat(200)));
    }
    std::fs::write(&big, &text).unwrap();
    let (code, _, err) =
        ichor(&["config", "diff", "--from", "examples/configs/v1.13/worker.yaml", "--to", big.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("over the 10485760-byte (10 MiB) limit for a machine configuration"), "{err}");
}

/// No value of a sensitive path appears in any output of `config diff`, text or JSON.
#[test]
fn redaction_leaks_no_secret() {
    let secrets = [
        "lab001.rotatedmachinetk",
        "lab001.examplemachinetk",
        "Uk9UQVRFRC1TRUNSRVRCT1gtS0VZLTAwMDAwMDAwMDA=",
        "RVhBTVBMRS1TRUNSRVRCT1gtS0VZLTAwMDAwMDAwMDA=",
        "Uk9UQVRFRCBLVUJFUk5FVEVTIENBIEtFWQ==",
        "RVhBTVBMRSBLVUJFUk5FVEVTIENBIEtFWQ==",
        "RVhBTVBMRS1DTFVTVEVSLVNFQ1JFVC0wMDAwMDAwMDA=",
        "ROTATED SERVICE ACCOUNT KEY",
        "EXAMPLE SERVICE ACCOUNT KEY",
        // The example bundle's Kubernetes CA key and service-account key (base64 and PEM body).
        "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUZpT3JPSEFpRjJldWF2aVBaR2RmcHBpUTdGUDk3MnpWZVg5aE9sdmU2WjVvQW9HQ0NxR1NNNDkKQXdFSG9VUURRZ0FFVnQyTVBLSjBybUFUb0NRRWJSSVBia0tYaFhkL05wcGlIWDJUaGRMYjZkZ21IOFhlaWs2OApWaHRLcSsyYkhOVG82L3NhYzhLWnJsdVFOL0VObi82c2tBPT0KLS0tLS1FTkQgRUMgUFJJVkFURSBLRVktLS0tLQo=",
        "MIIEowIBAAKCAQEAp61A8YgvY9lFIfwzV3BJ7OcSgxcRF80PYW3ifudFnY3BR2TO",
        "Uk9UQVRFRC1DTFVTVEVSLVNFQ1JFVC0wMDAwMDAwMDA=",
    ];
    for (from, to) in [
        ("examples/configs/v1.13/controlplane.yaml", "tests/golden/config-diff-v1.13-redaction/desired.yaml"),
        ("examples/configs/v1.14/controlplane.yaml", "tests/golden/config-diff-v1.14-redaction/desired.yaml"),
    ] {
        for output in ["text", "json"] {
            let (code, out, err) = ichor(&["config", "diff", "--from", from, "--to", to, "--output", output]);
            assert_eq!(code, 1, "{err}");
            for s in secrets {
                assert!(!out.contains(s) && !err.contains(s), "{s} leaked in the {output} output of {to}");
            }
            assert!(out.contains("<redacted>"));
        }
    }
}

// ---- issue 11: hostile inputs, for every command ------------------------------------------

/// Runs the binary with a 20 s wall clock and a 4 GiB address-space limit (`ulimit -v`), so
/// that a hang or a runaway allocation fails the test instead of the machine.
fn ichor_bounded(args: &[String]) -> (i32, String, String) {
    use std::time::Duration;
    let child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4194304 2>/dev/null; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Output is drained while waiting (a full pipe would stall the child, not a hang of ours).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = rx.recv_timeout(Duration::from_secs(20)) else {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        panic!("ichor {args:?} ran past 20 s");
    };
    let out = out.unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The contract of every run: exit 0, 1 or 2; no panic; exit 2 with a message and no stdout;
/// `secret` (when given) in neither stream.
fn check_run(args: &[String], secret: Option<&str>) {
    let (code, out, err) = ichor_bounded(args);
    assert!(matches!(code, 0..=2), "ichor {args:?} exited {code}\n{err}");
    for bad in ["panicked", "stack overflow", "RUST_BACKTRACE"] {
        assert!(!err.contains(bad), "ichor {args:?}: {bad}\n{err}");
    }
    if code == 2 {
        assert!(
            err.starts_with("ichor: error:") || err.contains(": error:"),
            "ichor {args:?}: exit 2 without a message: {err}"
        );
        assert!(out.is_empty(), "ichor {args:?}: exit 2 with output on stdout");
    }
    if let Some(s) = secret {
        assert!(!out.contains(s) && !err.contains(s), "ichor {args:?} printed the planted secret\n{out}\n{err}");
    }
}

#[path = "../../tests/shared/seeded.rs"]
mod seeded;

/// Hostile edits of valid inputs, from one seeded stream (`tests/shared/seeded.rs`).
struct Mutator(seeded::Seeded);

impl Mutator {
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }

    /// One hostile edit of a valid input.
    fn mutate(&mut self, text: &[u8]) -> Vec<u8> {
        let mut t = text.to_vec();
        let pos = self.below(t.len() + 1);
        match self.below(14) {
            0 => {
                if !t.is_empty() {
                    let i = self.below(t.len());
                    t[i] ^= 1 << self.below(8);
                }
            }
            1 => {
                let bytes: &[u8] = b"\0\xff{}[]&*<!:-\n\"'\\|>%@`#";
                t.insert(pos, bytes[self.below(bytes.len())]);
            }
            2 => t.truncate(pos),
            3 => {
                let mut b = b"\xef\xbb\xbf".to_vec();
                b.extend(t);
                t = b;
            }
            4 => t = String::from_utf8_lossy(&t).replace('\n', "\r\n").into_bytes(),
            5 => t.splice(pos..pos, b"[".repeat(5000)).for_each(drop),
            6 => t.splice(pos..pos, b"{a: ".repeat(3000)).for_each(drop),
            // Alias amplification, a merge key, a tag, a non-text key.
            7 => t.extend(b"\nx: &a [\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"]\ny: [*a, *a, *a, *a, *a, *a, *a, *a]\nz: [*y, *y, *y, *y, *y, *y, *y, *y]\n"),
            8 => t.extend(b"\n<<: {version: v1alpha1}\n"),
            9 => t.splice(pos..pos, b"!tag ".iter().copied()).for_each(drop),
            10 => t.extend(b"\n~: 1\n5000: {true: 1.5}\n"),
            11 => t.extend(format!("\nbig: \"{}\"\n", "x".repeat(1 << 20)).into_bytes()),
            12 => {
                let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
                let keep = self.below(lines.len());
                t = lines.iter().enumerate().filter(|(i, _)| *i != keep).map(|(_, l)| *l).collect::<Vec<_>>().join(&b'\n');
            }
            _ => t.extend(b"\0\0\xfe\xfe"),
        }
        t
    }
}

/// Every command on mutated inputs of its kind: configs, manifests, snapshots, facts, rules,
/// field metadata, contracts, values. `ICHOR_LONG_TESTS=1` runs ten times as many.
#[test]
fn hostile_inputs_end_in_exit_0_1_or_2_with_a_message() {
    let per_kind = if std::env::var_os("ICHOR_LONG_TESTS").is_some() { 1500 } else { 150 };
    let dir = std::env::temp_dir().join(format!("ichor-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let read = |p: &str| std::fs::read(root().join(p)).unwrap();
    let mut m = Mutator(seeded::Seeded(0x1c40));
    // A copy of the rules and of a cluster's manifests, one file of which is mutated per run.
    let copy = |from: &str, to: &std::path::Path| {
        let status = Command::new("cp").arg("-rL").arg(root().join(from)).arg(to).status().unwrap();
        assert!(status.success());
    };
    let rules = dir.join("rules");
    copy("rules", &rules);
    let manifests = dir.join("manifests");
    copy("examples/clusters/lab-v1.14", &manifests);
    let input = dir.join("input");
    type Case = (&'static str, Vec<&'static str>);
    let cases: Vec<Case> = vec![
        (
            "examples/configs/v1.14/controlplane.yaml",
            vec!["config", "diff", "--from", "examples/configs/v1.14/controlplane.yaml", "--to", "@"],
        ),
        (
            "examples/configs/v1.13/controlplane.yaml",
            vec![
                "config",
                "diff",
                "--from",
                "@",
                "--to",
                "examples/configs/v1.13/controlplane.yaml",
                "--output",
                "json",
            ],
        ),
        ("examples/states/upgrade-start.yaml", vec!["plan", "--state", "@", "--explain"]),
        ("examples/states/switch-replacing-start.yaml", vec!["plan", "--state", "@", "--output", "json"]),
        ("examples/rules/plan.facts.json", vec!["rules", "eval", "examples/rules/plan.rules", "--facts", "@"]),
        ("examples/rules/plan.rules", vec!["rules", "eval", "@", "--facts", "examples/rules/plan.facts.json"]),
        ("tests/golden/cni-values/good.yaml", vec!["cni", "values", "validate", "@"]),
    ];
    for (base, args) in &cases {
        let text = read(base);
        for _ in 0..per_kind {
            std::fs::write(&input, m.mutate(&text)).unwrap();
            let args: Vec<String> = args.iter().map(|a| if *a == "@" { s(&input) } else { a.to_string() }).collect();
            check_run(&args, None);
        }
    }
    // Files inside directories: manifests, field metadata, an inventory, a rules file.
    let in_dir: Vec<(std::path::PathBuf, Vec<String>)> = vec![
        (
            manifests.join("patches.yaml"),
            vec!["render".into(), "--manifests".into(), s(&manifests), "--machine".into(), "cp1".into()],
        ),
        (
            manifests.join("cluster.yaml"),
            vec![
                "config".into(),
                "diff".into(),
                "--manifests".into(),
                s(&manifests),
                "--machine".into(),
                "cp1".into(),
                "--node-config".into(),
                "examples/configs/v1.14/controlplane.yaml".into(),
            ],
        ),
        (rules.join("fieldmeta.yaml"), vec!["rules".into(), "check".into(), "--rules".into(), s(&rules)]),
        (
            rules.join("contracts/v1.14.paths"),
            vec![
                "config".into(),
                "explain".into(),
                "machine.install.disk".into(),
                "--contract".into(),
                "v1.14".into(),
                "--rules".into(),
                s(&rules),
            ],
        ),
        (
            rules.join("switch.rules"),
            vec![
                "plan".into(),
                "--state".into(),
                "examples/states/switch-replacing-start.yaml".into(),
                "--rules".into(),
                s(&rules),
            ],
        ),
        (rules.join("tests/switch.yaml"), vec!["rules".into(), "test".into(), "--rules".into(), s(&rules)]),
    ];
    for (file, args) in &in_dir {
        let original = std::fs::read(file).unwrap();
        for _ in 0..per_kind / 3 {
            std::fs::write(file, m.mutate(&original)).unwrap();
            check_run(args, None);
        }
        std::fs::write(file, &original).unwrap();
    }
    // Missing files, directories, endless files, a loop of links.
    std::os::unix::fs::symlink(".", rules.join("loop")).unwrap();
    for args in [
        vec!["config", "diff", "--from", "/nonexistent.yaml", "--to", "examples/configs/v1.14/controlplane.yaml"],
        vec!["config", "diff", "--from", "/dev/zero", "--to", "examples/configs/v1.14/controlplane.yaml"],
        vec!["config", "diff", "--from", "examples", "--to", "examples/configs/v1.14/controlplane.yaml"],
        vec!["plan", "--state", "/dev/zero"],
        vec!["rules", "eval", "examples/rules/plan.rules", "--facts", "/dev/zero"],
        vec!["render", "--manifests", "/nonexistent", "--machine", "cp1"],
    ] {
        check_run(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>(), None);
    }
    check_run(&["rules".into(), "check".into(), "--rules".into(), s(&rules)], None);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A secret planted at every sensitive path of the field metadata, in every YAML shape (a
/// scalar, a list, a map, a merge key, a number key above it), never reaches stdout or stderr
/// of `config diff`, in text or JSON, in either direction.
#[test]
fn planted_secrets_are_never_printed() {
    use render::path::PatSeg;
    use serde_yaml::{Mapping, Value};
    let (_, text) = render::embedded::FIELDMETA;
    let contracts: Vec<render::vocab::Contract> =
        render::embedded::CONTRACTS.iter().filter_map(|(c, _)| render::vocab::Contract::parse(c)).collect();
    let meta = render::fieldmeta::FieldMeta::parse(text, &contracts).unwrap();
    let dir = std::env::temp_dir().join(format!("ichor-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("base.yaml");
    std::fs::write(&base, "version: v1alpha1\nmachine:\n  type: controlplane\n").unwrap();
    let planted = dir.join("planted.yaml");
    let secret = "PLANTED-s3cr3t-VALUE";
    let shapes: Vec<Value> = vec![
        Value::String(secret.into()),
        serde_yaml::from_str(&format!("[{secret}]")).unwrap(),
        serde_yaml::from_str(&format!("{{k: {secret}}}")).unwrap(),
        serde_yaml::from_str(&format!("{{k: [{secret}, {{x: {secret}}}]}}")).unwrap(),
    ];
    let mut runs = 0;
    // Every combination under ICHOR_LONG_TESTS=1; in CI, one contract and one direction per shape.
    let long = std::env::var_os("ICHOR_LONG_TESTS").is_some();
    for pat in meta.entries.iter().filter(|e| e.sensitive).flat_map(|e| &e.patterns) {
        let wild = pat.segs.iter().any(|s| matches!(s, PatSeg::AnyMember | PatSeg::AnyDepth));
        let typed =
            matches!(pat.segs.first(), Some(PatSeg::Member(m)) if m.starts_with(|c: char| c.is_ascii_uppercase()));
        for (shape_no, shape) in shapes.iter().enumerate() {
            for number_keys in [false, true] {
                if number_keys && !wild {
                    continue;
                }
                // Build the document from the leaf up.
                let mut segs: Vec<&PatSeg> = pat.segs.iter().collect();
                let mut name = None;
                if typed && matches!(segs.get(1), Some(PatSeg::Bracket(_) | PatSeg::AnyBracket)) {
                    name = Some(match segs.remove(1) {
                        PatSeg::Bracket(b) => b.clone(),
                        _ => "n0".into(),
                    });
                }
                let kind = typed.then(|| match segs.remove(0) {
                    PatSeg::Member(m) => m.clone(),
                    _ => unreachable!(),
                });
                let mut v = shape.clone();
                let last = segs.len();
                for (i, seg) in segs.iter().enumerate().rev() {
                    v = match seg {
                        PatSeg::Bracket(_) | PatSeg::AnyBracket => Value::Sequence(vec![v]),
                        PatSeg::Member(k) if i + 1 == last && shape_no == 0 => {
                            // The leaf through a merge key: `parent: {<<: {leaf: S}}`.
                            let mut inner = Mapping::new();
                            inner.insert(Value::String(k.clone()), v);
                            let mut m = Mapping::new();
                            m.insert(Value::String("<<".into()), Value::Mapping(inner));
                            Value::Mapping(m)
                        }
                        PatSeg::Member(k) => Value::Mapping([(Value::String(k.clone()), v)].into_iter().collect()),
                        PatSeg::AnyMember | PatSeg::AnyDepth => {
                            let key = if number_keys { Value::Number(5000.into()) } else { Value::String("k0".into()) };
                            Value::Mapping([(key, v)].into_iter().collect())
                        }
                    };
                }
                // `v` is the document's body: a merge key at the top becomes the document itself.
                let mut doc = match v {
                    Value::Mapping(m) => m,
                    other => [(Value::String("value".into()), other)].into_iter().collect(),
                };
                let mut yaml = String::new();
                match kind {
                    Some(kind) => {
                        doc.insert(Value::String("apiVersion".into()), Value::String("v1alpha1".into()));
                        doc.insert(Value::String("kind".into()), Value::String(kind));
                        if let Some(n) = name {
                            doc.insert(Value::String("name".into()), Value::String(n));
                        }
                        yaml.push_str("version: v1alpha1\nmachine:\n  type: controlplane\n---\n");
                        yaml.push_str(&serde_yaml::to_string(&doc).unwrap());
                    }
                    None => {
                        doc.insert(Value::String("version".into()), Value::String("v1alpha1".into()));
                        yaml.push_str(&serde_yaml::to_string(&doc).unwrap());
                    }
                }
                std::fs::write(&planted, &yaml).unwrap();
                let (b, p) = (base.to_string_lossy().into_owned(), planted.to_string_lossy().into_owned());
                let contracts: &[&str] = if long { &["v1.13", "v1.14"] } else { &["v1.14"] };
                let directions = if long || shape_no % 2 == 0 { vec![(&b, &p), (&p, &b)] } else { vec![(&p, &b)] };
                for contract in contracts {
                    for &(from, to) in &directions {
                        for output in ["text", "json"] {
                            let args: Vec<String> = [
                                "config",
                                "diff",
                                "--from",
                                from,
                                "--to",
                                to,
                                "--contract",
                                contract,
                                "--output",
                                output,
                            ]
                            .iter()
                            .map(|a| a.to_string())
                            .collect();
                            check_run(&args, Some(secret));
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 200, "only {runs} runs");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Fuzz targets (issue 11), one per parser, run in process as a bounded loop on stable Rust:
/// mutated configs, patches, snapshots, Cilium values, facts, inventories and field metadata
/// never panic their parser. `ICHOR_LONG_TESTS=1` runs ten times as many. (Rule texts have their
/// own target in engine/tests: 100,000 mutated texts through the parser and checker.)
#[test]
fn fuzz_every_parser_in_process() {
    let rounds = if std::env::var_os("ICHOR_LONG_TESTS").is_some() { 20_000 } else { 2_000 };
    let read = |p: &str| std::fs::read(root().join(p)).unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let keys = render::inventory::Inventory::parse(render::embedded::CILIUM_KEYS.1).unwrap();
    let contracts: Vec<render::vocab::Contract> =
        render::embedded::CONTRACTS.iter().filter_map(|(c, _)| render::vocab::Contract::parse(c)).collect();
    let engine = {
        let loaded = engine::load_str("plan.rules", &text(&read("examples/rules/plan.rules")));
        engine::Engine::new(loaded.program.unwrap()).unwrap()
    };
    type Target<'a> = (&'a str, Box<dyn Fn(&str) + 'a>);
    let targets: Vec<(Vec<u8>, Target)> = vec![
        (
            read("examples/configs/v1.14/controlplane.yaml"),
            ("config", Box::new(|t| drop(render::config::Config::parse(t)))),
        ),
        (
            read("examples/clusters/lab-v1.14/patches.yaml"),
            ("patch", Box::new(|t| drop(render::yaml::parse_documents(t, 1 << 20)))),
        ),
        (
            read("examples/states/upgrade-start.yaml"),
            ("snapshot", Box::new(|t| drop(runtime::state::ObservedState::parse(t)))),
        ),
        (
            read("tests/golden/cni-values/good.yaml"),
            (
                "values",
                Box::new(|t| {
                    if let Ok(v) = serde_yaml::from_str::<serde_json::Value>(t) {
                        drop(render::cilium::validate(&v, &keys, true));
                    }
                }),
            ),
        ),
        (read("examples/rules/plan.facts.json"), ("facts", Box::new(|t| drop(engine::facts::read_json(t, &engine))))),
        (
            read("rules/contracts/v1.14.paths"),
            ("inventory", Box::new(|t| drop(render::inventory::Inventory::parse(t)))),
        ),
        (
            read("rules/fieldmeta.yaml"),
            ("fieldmeta", Box::new(|t| drop(render::fieldmeta::FieldMeta::parse(t, &contracts)))),
        ),
    ];
    let mut m = Mutator(seeded::Seeded(0xf022));
    for (base, (name, parse)) in &targets {
        for _ in 0..rounds / targets.len() {
            let input = text(&m.mutate(base));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse(&input)));
            assert!(r.is_ok(), "the {name} parser panicked on:\n{}", &input[..input.len().min(2000)]);
        }
    }
}

/// Issue 23: every `ichor ...` a message or a CLI text names exists: each word after `ichor`
/// is a subcommand of the words before it, as long as those have subcommands (then come the
/// arguments). The rules' messages and the CLI's sources are read.
#[test]
fn every_ichor_command_a_message_names_exists() {
    let help = |words: &[&str]| -> Option<Vec<String>> {
        let out = Command::new(env!("CARGO_BIN_EXE_ichor")).args(words).arg("--help").output().ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let commands = text.split("Commands:").nth(1).map(|rest| {
            rest.lines()
                .skip(1)
                .take_while(|l| l.starts_with("  "))
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .filter(|c| c != "help")
                .collect()
        });
        Some(commands.unwrap_or_default())
    };
    let re = regex::Regex::new(r"\bichor((?: [a-z][a-z0-9-]*)+)").unwrap();
    let mut texts =
        vec![("rules/messages.yaml".to_string(), std::fs::read_to_string(root().join("rules/messages.yaml")).unwrap())];
    let mut files = vec![];
    rust_files(&root().join("cli/src"), &mut files);
    for f in files {
        let text: String = std::fs::read_to_string(&f)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| format!("{l}\n"))
            .collect();
        texts.push((f.strip_prefix(root()).unwrap().display().to_string(), text));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut problems = vec![];
    for (file, text) in &texts {
        for c in re.captures_iter(text) {
            let words: Vec<&str> = c[1].split_whitespace().collect();
            let mut path: Vec<&str> = vec![];
            for w in &words {
                let Some(subs) = help(&path) else { break };
                if subs.is_empty() {
                    break;
                }
                if !subs.iter().any(|s| s == w) {
                    problems.push(format!(
                        "{file}: `ichor {}`: no subcommand {w:?} of `ichor {}` ({})",
                        words.join(" "),
                        path.join(" "),
                        subs.join(", ")
                    ));
                    break;
                }
                path.push(w);
            }
            seen.insert(path.join(" "));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(seen.contains("operation resume") && seen.contains("status"), "{seen:?}");
}

/// Issue 25's holes, each closed: an alias bomb in a snapshot, a rule-test file and a values
/// file ends in exit 2 naming the file and the cap, in seconds and within the 4 GiB limit; a
/// secret written with a YAML tag never reaches an error; a schema whose definitions fan out
/// recursively is refused in seconds.
#[test]
fn alias_bombs_tagged_secrets_and_recursive_schemas_are_refused_quickly() {
    let dir = std::env::temp_dir().join(format!("ichor-holes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    // A 1 MiB string repeated 100 times through aliases: 100 MiB expanded from a 1 MiB file,
    // with too few aliases for serde_yaml's own repetition limit to notice.
    let bomb = format!("big: &big \"{}\"\nmany: [{}]\n", "x".repeat(1 << 20), vec!["*big"; 100].join(", "));
    let timed = |args: Vec<String>, what: &str| {
        let start = std::time::Instant::now();
        let (code, out, err) = ichor_bounded(&args);
        assert_eq!(code, 2, "{what}: {out}{err}");
        assert!(err.contains("expands past"), "{what}: {err}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "{what}: {:?}", start.elapsed());
        err
    };
    let state = dir.join("state.yaml");
    std::fs::write(&state, &bomb).unwrap();
    let err = timed(vec!["plan".into(), "--state".into(), s(&state)], "a snapshot");
    assert!(err.contains(&s(&state)) || err.contains("state.yaml"), "{err}");
    let values = dir.join("values.yaml");
    std::fs::write(&values, &bomb).unwrap();
    let err = timed(vec!["cni".into(), "values".into(), "validate".into(), s(&values)], "a values file");
    assert!(err.contains("values.yaml"), "{err}");
    let rules = dir.join("rules");
    let status = Command::new("cp").arg("-rL").arg(root().join("rules")).arg(&rules).status().unwrap();
    assert!(status.success());
    std::fs::write(rules.join("tests/bomb.yaml"), format!("{bomb}cases: []\n")).unwrap();
    let err = timed(vec!["rules".into(), "test".into(), "--rules".into(), s(&rules)], "a rule-test file");
    assert!(err.contains("bomb.yaml"), "{err}");
    // A secret with a tag: the reader's error never quotes it.
    let secret = "PLANTED-s3cr3t-VALUE";
    let base = dir.join("base.yaml");
    std::fs::write(&base, "version: v1alpha1\nmachine:\n  type: controlplane\n").unwrap();
    for tag in ["!!int", "!!bool", "!!float"] {
        let planted = dir.join("planted.yaml");
        std::fs::write(
            &planted,
            format!("version: v1alpha1\nmachine:\n  type: controlplane\n  token: {tag} \"{secret}\"\n"),
        )
        .unwrap();
        check_run(
            &["config".into(), "diff".into(), "--from".into(), s(&base), "--to".into(), s(&planted)],
            Some(secret),
        );
        check_run(
            &[
                "config".into(),
                "diff".into(),
                "--from".into(),
                s(&planted),
                "--to".into(),
                s(&base),
                "--output".into(),
                "json".into(),
            ],
            Some(secret),
        );
        let manifests = dir.join("manifests");
        let _ = std::fs::remove_dir_all(&manifests);
        let status = Command::new("cp")
            .arg("-rL")
            .arg(root().join("examples/clusters/lab-v1.14"))
            .arg(&manifests)
            .status()
            .unwrap();
        assert!(status.success());
        // The node config of `config diff --manifests`, and a patch.
        check_run(
            &[
                "config".into(),
                "diff".into(),
                "--manifests".into(),
                s(&manifests),
                "--machine".into(),
                "cp1".into(),
                "--node-config".into(),
                s(&planted),
            ],
            Some(secret),
        );
        std::fs::write(
            manifests.join("tagged.yaml"),
            format!("apiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosConfigPatch\nmetadata:\n  name: tagged\n  namespace: ichor-system\nspec:\n  clusterRef:\n    name: lab\n  patch: |\n    machine:\n      token: {tag} \"{secret}\"\n"),
        )
        .unwrap();
        check_run(
            &["render".into(), "--manifests".into(), s(&manifests), "--machine".into(), "cp1".into()],
            Some(secret),
        );
    }
    // A schema whose definition refers to itself through three fields: 3^24 paths to a walk
    // bounded only by depth.
    let schema = dir.join("schema.json");
    std::fs::write(
        &schema,
        r##"{"$defs": {"root": {"properties": {"x": {"$ref": "#/$defs/n"}}}, "n": {"properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/$defs/n"}, "c": {"$ref": "#/$defs/n"}}}}, "oneOf": [{"$ref": "#/$defs/root"}]}"##,
    )
    .unwrap();
    let start = std::time::Instant::now();
    let (code, _, err) = ichor_bounded(&[
        "contract".into(),
        "derive".into(),
        "--schema".into(),
        s(&schema),
        "--contract".into(),
        "v1.14".into(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("fans out past"), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(5), "{:?}", start.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}
