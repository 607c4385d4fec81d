//! Path inventories: which config paths exist at a Talos contract, and their types.
//!
//! `derive` reads a Talos machine-config JSON schema (`config.schema.json`, JSON Schema
//! 2020-12: a `oneOf` of document definitions under `$defs`) and lists every path pattern with
//! its type, one per line: `KubeProxyConfig.enabled boolean`, `LinkConfig[*].mtu integer`,
//! `machine.nodeLabels.* string`. A bare `type: object` with no properties is free-form
//! (`any`): every path below it exists. The project commits these lists under
//! `rules/contracts/`, so nothing at run time needs the schema. `Inventory::parse` loads one
//! into a segment trie; `Inventory::contains` answers for a concrete path.

use crate::path::{Path, Seg};
use engine::FxHashMap;
use serde_json::Value as Json;
use std::collections::BTreeMap;

/// One correction of a Talos schema (see `rules/contracts/corrections.yaml`).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Correction {
    /// The contracts the correction applies to.
    pub contracts: Vec<String>,
    #[serde(default)]
    /// Paths the schema lacks, with their type.
    pub add: BTreeMap<String, String>,
    #[serde(default)]
    /// Document kinds the schema names otherwise, from its name to Talos's.
    pub rename_kind: BTreeMap<String, String>,
    /// Why, with the Talos source that shows it.
    pub why: String,
}

/// A corrections file, schema or inventory that cannot be read: the place (`line L, column C`
/// or `line L`) and the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InventoryError {
    /// The place and the problem.
    pub message: String,
}

impl From<String> for InventoryError {
    fn from(message: String) -> InventoryError {
        InventoryError { message }
    }
}

/// Parses the corrections file.
pub fn parse_corrections(text: &str) -> Result<Vec<Correction>, InventoryError> {
    serde_yaml::from_str(text).map_err(|e| {
        InventoryError::from(match e.location() {
            Some(l) => format!("line {}, column {}: {e}", l.line(), l.column()),
            None => e.to_string(),
        })
    })
}

/// Derives the inventory text of a schema at `contract`, applying the corrections that name it.
pub fn derive(schema_text: &str, contract: &str, corrections: &[Correction]) -> Result<String, InventoryError> {
    derive_text(schema_text, contract, corrections).map_err(InventoryError::from)
}

fn derive_text(schema_text: &str, contract: &str, corrections: &[Correction]) -> Result<String, String> {
    let applied: Vec<&Correction> = corrections.iter().filter(|c| c.contracts.iter().any(|x| x == contract)).collect();
    let rename = |k: &str| -> String {
        applied.iter().find_map(|c| c.rename_kind.get(k).cloned()).unwrap_or_else(|| k.to_string())
    };
    let schema: Json = serde_json::from_str(schema_text)
        .map_err(|e| format!("line {}, column {}: not JSON: {e}", e.line(), e.column()))?;
    let defs = schema
        .get("$defs")
        .and_then(Json::as_object)
        .ok_or("the schema has no `$defs`: is it a Talos config.schema.json?")?;
    let roots =
        schema.get("oneOf").and_then(Json::as_array).ok_or("the schema has no top-level `oneOf` of documents")?;
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut work = WALK_BUDGET;
    for root in roots {
        let def = resolve(root, defs).ok_or("a `oneOf` entry does not resolve to a definition")?;
        let props = def.get("properties").and_then(Json::as_object).ok_or("a document definition has no properties")?;
        let kind = props.get("kind").and_then(|k| k.get("enum")).and_then(|e| e.get(0)).and_then(Json::as_str);
        match kind {
            Some(kind) => {
                let kind = rename(kind);
                let kind = kind.as_str();
                let named = props.contains_key("name");
                let base = if named { format!("{kind}[*]") } else { kind.to_string() };
                out.insert(base.clone(), "document".into());
                for (k, v) in props {
                    if matches!(k.as_str(), "apiVersion" | "kind" | "name") {
                        continue;
                    }
                    walk(&format!("{base}.{}", seg(k)), v, defs, &mut out, 0, &mut work);
                }
            }
            None => {
                // The v1alpha1 document: its fields start at the root.
                for (k, v) in props {
                    walk(&seg(k), v, defs, &mut out, 0, &mut work);
                }
            }
        }
    }
    if work == 0 {
        return Err(format!(
            "the schema fans out past {WALK_BUDGET} nodes (a definition that refers back to itself through many fields?): a Talos config.schema.json has a few thousand paths"
        ));
    }
    for c in &applied {
        for (p, t) in &c.add {
            out.insert(p.clone(), t.clone());
        }
    }
    let mut text = format!(
        "# Config paths of the Talos {contract} machine-config contract, with their types.\n\
         # Derived from Talos's config.schema.json by `ichor contract derive`; do not edit by hand.\n\
         # `*` is any map key, `[*]` any list index or document name; type `any` means free-form\n\
         # (every path below exists); `document` marks a document kind.\n"
    );
    for c in &applied {
        text.push_str(&format!(
            "# Corrected (rules/contracts/corrections.yaml): {}\n",
            c.why.split(". ").next().unwrap_or(&c.why)
        ));
    }
    for (p, t) in out {
        text.push_str(&format!("{p} {t}\n"));
    }
    Ok(text)
}

fn seg(name: &str) -> String {
    if crate::path::is_plain(name) { name.to_string() } else { format!("[{}]", serde_json::to_string(name).unwrap()) }
}

fn resolve<'a>(node: &'a Json, defs: &'a serde_json::Map<String, Json>) -> Option<&'a Json> {
    let mut n = node;
    for _ in 0..16 {
        match n.get("$ref").and_then(Json::as_str) {
            Some(r) => n = defs.get(r.strip_prefix("#/$defs/")?)?,
            None => return Some(n),
        }
    }
    None
}

fn type_name(node: &Json, defs: &serde_json::Map<String, Json>) -> String {
    type_at(node, defs, 0)
}

/// `type_name` at a depth of `oneOf` nesting: a `oneOf` that refers back to itself (nothing
/// ends it) is free-form past 16 levels, not a stack overflow.
fn type_at(node: &Json, defs: &serde_json::Map<String, Json>, depth: usize) -> String {
    let Some(n) = resolve(node, defs).filter(|_| depth <= 16) else {
        return "any".into();
    };
    if let Some(alts) = n.get("oneOf").and_then(Json::as_array) {
        let mut ts: Vec<String> = alts.iter().map(|a| type_at(a, defs, depth + 1)).collect();
        ts.sort();
        ts.dedup();
        return ts.join("|");
    }
    match n.get("type").and_then(Json::as_str) {
        Some("object") if n.get("properties").is_some() => "object".into(),
        Some("object") if n.get("additionalProperties").is_some_and(Json::is_object) => "map".into(),
        Some("object") => "any".into(),
        Some(t) => t.into(),
        None if n.get("properties").is_some() => "object".into(),
        None if n.get("enum").is_some() => "string".into(),
        None => "any".into(),
    }
}

/// The most schema nodes a derivation visits: Talos's schemas have a few thousand paths; a
/// schema whose definitions fan out recursively would otherwise take exponential time.
const WALK_BUDGET: usize = 500_000;

fn walk(
    path: &str,
    node: &Json,
    defs: &serde_json::Map<String, Json>,
    out: &mut BTreeMap<String, String>,
    depth: usize,
    work: &mut usize,
) {
    if *work == 0 {
        return;
    }
    *work -= 1;
    let t = type_name(node, defs);
    out.insert(path.to_string(), t);
    let Some(n) = resolve(node, defs) else { return };
    if depth > 24 {
        return;
    }
    let alts: Vec<&Json> = match n.get("oneOf").and_then(Json::as_array) {
        Some(a) => a.iter().filter_map(|x| resolve(x, defs)).collect(),
        None => vec![n],
    };
    for n in alts {
        if let Some(props) = n.get("properties").and_then(Json::as_object) {
            for (k, v) in props {
                walk(&format!("{path}.{}", seg(k)), v, defs, out, depth + 1, work);
            }
        }
        if let Some(ap) = n.get("additionalProperties").filter(|a| a.is_object()) {
            walk(&format!("{path}.*"), ap, defs, out, depth + 1, work);
        }
        if let Some(items) = n.get("items") {
            walk(&format!("{path}[*]"), items, defs, out, depth + 1, work);
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Node {
    fields: FxHashMap<String, Node>,
    any_field: Option<Box<Node>>,
    any_bracket: Option<Box<Node>>,
    ty: Option<String>,
}

/// The paths of one contract, as a trie of segments.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    root: Node,
    /// Document kinds (typed documents) of the contract.
    pub kinds: Vec<String>,
    /// How many paths the inventory holds.
    pub len: usize,
}

impl Inventory {
    /// Loads inventory text (`path type` per line, `#` comments).
    pub fn parse(text: &str) -> Result<Inventory, InventoryError> {
        Inventory::parse_text(text).map_err(InventoryError::from)
    }

    fn parse_text(text: &str) -> Result<Inventory, String> {
        let mut inv = Inventory::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (path, ty) = line.rsplit_once(' ').ok_or_else(|| format!("line {}: expected `path type`", i + 1))?;
            // The path must be a pattern of the path syntax (an inventory is derived, but a
            // hand-edited or truncated one must be an error, never a panic).
            crate::path::Pattern::new(path)
                .map_err(|e| format!("line {}: `{path}` is not a path pattern: {e}", i + 1))?;
            let mut node = &mut inv.root;
            for (j, s) in split_pattern(path).into_iter().enumerate() {
                node = match s.as_str() {
                    "*" if j > 0 => node.any_field.get_or_insert_with(Default::default),
                    "[*]" => node.any_bracket.get_or_insert_with(Default::default),
                    _ => node.fields.entry(s).or_default(),
                };
            }
            node.ty = Some(ty.to_string());
            if ty == "document" {
                inv.kinds.push(path.trim_end_matches("[*]").to_string());
            }
            inv.len += 1;
        }
        Ok(inv)
    }

    /// The type of a concrete path, if the contract has it (`any` below a free-form object).
    pub fn lookup(&self, path: &Path) -> Option<&str> {
        let mut node = &self.root;
        for s in &path.segs {
            if node.ty.as_deref() == Some("any") {
                return Some("any");
            }
            let next = match s {
                Seg::Field(f) => node.fields.get(f).or(node.any_field.as_deref()),
                // A quoted key of the inventory (`a["kubernetes.io/os"]`) is stored unquoted.
                Seg::Key(k) => node.fields.get(k).or(node.any_field.as_deref()),
                Seg::Index(_) | Seg::Name(_) => node.any_bracket.as_deref(),
            };
            node = next?;
        }
        Some(node.ty.as_deref().unwrap_or("object"))
    }

    /// Whether `path` is one of the contract's paths.
    pub fn contains(&self, path: &Path) -> bool {
        self.lookup(path).is_some()
    }

    /// Whether the contract has the typed document kind `kind`.
    pub fn has_kind(&self, kind: &str) -> bool {
        self.kinds.iter().any(|k| k == kind)
    }

    /// Every path pattern of the inventory, as written (for coverage reports).
    pub fn patterns(&self) -> Vec<String> {
        let mut out = vec![];
        fn rec(n: &Node, prefix: &str, out: &mut Vec<String>) {
            if n.ty.is_some() && !prefix.is_empty() {
                out.push(prefix.to_string());
            }
            let mut fields: Vec<(&String, &Node)> = n.fields.iter().collect();
            fields.sort_by(|a, b| a.0.cmp(b.0));
            for (k, c) in fields {
                let p = if prefix.is_empty() {
                    k.clone()
                } else if k.starts_with('[') {
                    format!("{prefix}{k}")
                } else {
                    format!("{prefix}.{k}")
                };
                rec(c, &p, out);
            }
            if let Some(c) = &n.any_field {
                rec(c, &format!("{prefix}.*"), out);
            }
            if let Some(c) = &n.any_bracket {
                rec(c, &format!("{prefix}[*]"), out);
            }
        }
        rec(&self.root, "", &mut out);
        out.sort();
        out
    }
}

/// Splits an inventory pattern into segments: `a.b[*].*` -> `a`, `b`, `[*]`, `*`.
fn split_pattern(p: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            '[' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                let mut b = String::from("[");
                let mut quoted = false;
                for c in chars.by_ref() {
                    b.push(c);
                    if c == '"' {
                        quoted = !quoted;
                    }
                    if c == ']' && !quoted {
                        break;
                    }
                }
                if b == "[*]" {
                    out.push(b);
                } else {
                    // A quoted key segment: store the key itself (an unterminated bracket, refused
                    // by `Pattern::new` before, keeps its text).
                    let inner = b.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(&b);
                    out.push(serde_json::from_str::<String>(inner).unwrap_or_else(|_| inner.to_string()));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
