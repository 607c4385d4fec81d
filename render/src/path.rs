//! Config paths: the syntax of interfaces.md, parsing, display, and wildcard patterns.
//!
//! A path is a list of segments. The v1alpha1 document's fields start at its root
//! (`machine.install.disk`); other documents start with their kind (`KubeProxyConfig.enabled`),
//! and a named document carries its name in brackets (`LinkConfig[eth0].mtu`). List elements
//! are `[0]`. A map key that is not a plain name (it contains `.`, `[`, `]`, `"` or blanks) is
//! quoted: `machine.nodeLabels["node.kubernetes.io/role"]`. Patterns add `*` (one segment),
//! `**` (any number of segments, none included) and `[*]` (any index or document name).
//! Start at `Path::parse`, `Display for Path`, and `Pattern::new`.

use std::fmt;

/// A path or pattern that does not parse: what is wrong, and at which column.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PathError {
    /// What is wrong with the path, and where.
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
/// One segment of a config path.
pub enum Seg {
    /// A field or a plain map key.
    Field(String),
    /// A map key that needs quoting.
    Key(String),
    /// A list index.
    Index(usize),
    /// A named document's name (second segment only).
    Name(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
/// A config path: `machine.install.disk`, `LinkConfig[eth0].mtu`, `cluster.apiServer.certSANs[0]`.
pub struct Path {
    /// The segments, from the document down.
    pub segs: Vec<Seg>,
}

/// Whether a map key can be written bare.
pub fn is_plain(key: &str) -> bool {
    !key.is_empty() && !key.chars().any(|c| matches!(c, '.' | '[' | ']' | '"') || c.is_whitespace())
}

impl Path {
    /// The path of one top-level field.
    pub fn root(first: &str) -> Path {
        Path { segs: vec![Seg::Field(first.to_string())] }
    }

    /// The path of a map key below this one.
    pub fn child_key(&self, key: &str) -> Path {
        let mut p = self.clone();
        p.segs.push(if is_plain(key) { Seg::Field(key.to_string()) } else { Seg::Key(key.to_string()) });
        p
    }

    /// The path of a list index below this one.
    pub fn child_index(&self, i: usize) -> Path {
        let mut p = self.clone();
        p.segs.push(Seg::Index(i));
        p
    }

    /// The list and the index when the path ends at a list element (`a.b[2]` -> `a.b`, 2).
    pub fn parent_index(&self) -> Option<(Path, usize)> {
        match self.segs.split_last()? {
            (Seg::Index(i), rest) if !rest.is_empty() => Some((Path { segs: rest.to_vec() }, *i)),
            _ => None,
        }
    }

    /// Parses the syntax above (no wildcards). The error names the column.
    pub fn parse(text: &str) -> Result<Path, PathError> {
        Path::parse_text(text).map_err(|message| PathError { message })
    }

    fn parse_text(text: &str) -> Result<Path, String> {
        let segs = parse_segments(text, false)?;
        let mut out = vec![];
        for (i, s) in segs.into_iter().enumerate() {
            out.push(match s {
                PSeg::Field(f) => Seg::Field(f),
                PSeg::Key(k) => Seg::Key(k),
                PSeg::Bracket(b) => {
                    let first_is_kind =
                        i == 1 && matches!(&out[0], Seg::Field(f) if f.starts_with(|c: char| c.is_ascii_uppercase()));
                    if first_is_kind {
                        Seg::Name(b)
                    } else {
                        match b.parse::<usize>() {
                            Ok(n) => Seg::Index(n),
                            Err(_) => {
                                return Err(format!(
                                    "`[{b}]` is not a list index: write a number, or quote a map key as [\"{b}\"]"
                                ));
                            }
                        }
                    }
                }
                PSeg::AnyField | PSeg::AnyBracket | PSeg::AnyDepth => unreachable!(),
            });
        }
        Ok(Path { segs: out })
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.render(f)
    }
}

impl Path {
    /// Appends the displayed path to `out`: `Display` without the formatting machinery, for
    /// hosts that render many paths.
    pub fn write_to(&self, out: &mut String) {
        self.render(out).expect("writing to a String cannot fail");
    }

    /// The displayed path, allocated once.
    pub fn text(&self) -> String {
        let len = self.segs.iter().map(|s| match s {
            Seg::Field(n) | Seg::Key(n) | Seg::Name(n) => n.len() + 4,
            Seg::Index(_) => 6,
        });
        let mut out = String::with_capacity(len.sum());
        self.write_to(&mut out);
        out
    }

    /// The one place that knows how a path is written.
    fn render(&self, out: &mut impl fmt::Write) -> fmt::Result {
        for (i, s) in self.segs.iter().enumerate() {
            match s {
                Seg::Field(n) if i == 0 => out.write_str(n)?,
                Seg::Field(n) => {
                    out.write_char('.')?;
                    out.write_str(n)?;
                }
                Seg::Index(n) => {
                    out.write_char('[')?;
                    write_number(out, *n)?;
                    out.write_char(']')?;
                }
                Seg::Name(n) if is_plain(n) => {
                    out.write_char('[')?;
                    out.write_str(n)?;
                    out.write_char(']')?;
                }
                Seg::Key(k) | Seg::Name(k) => {
                    out.write_char('[')?;
                    out.write_str(&quote(k))?;
                    out.write_char(']')?;
                }
            }
        }
        Ok(())
    }
}

/// A number's digits, without the formatting machinery.
fn write_number(out: &mut impl fmt::Write, mut n: usize) -> fmt::Result {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.write_str(std::str::from_utf8(&digits[i..]).expect("ASCII digits"))
}

/// A parsed segment, wildcards included.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PSeg {
    Field(String),
    Key(String),
    Bracket(String),
    AnyField,
    AnyBracket,
    AnyDepth,
}

fn parse_segments(text: &str, wildcards: bool) -> Result<Vec<PSeg>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut out = vec![];
    let err = |i: usize, what: &str| Err(format!("column {}: {what}", i + 1));
    if chars.is_empty() {
        return err(0, "the path is empty");
    }
    let mut first = true;
    while i < chars.len() {
        match chars[i] {
            '.' if !first => {
                let (seg, next) = name_segment(&chars, i + 1, wildcards, "expected a field name after `.`")?;
                out.push(seg);
                i = next;
            }
            '[' => {
                if first {
                    return err(i, "a path starts with a field or document kind");
                }
                i += 1;
                if i < chars.len() && chars[i] == '"' {
                    // A quoted key: a JSON string.
                    let start = i;
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        if chars[i] == '\\' {
                            i += 1;
                        }
                        i += 1;
                    }
                    if i >= chars.len() {
                        return err(start, "unterminated quoted key");
                    }
                    let lit: String = chars[start..=i].iter().collect();
                    let key: String =
                        serde_json::from_str(&lit).map_err(|e| format!("column {}: bad quoted key: {e}", start + 1))?;
                    i += 1;
                    if i >= chars.len() || chars[i] != ']' {
                        return err(i, "expected `]` after the quoted key");
                    }
                    i += 1;
                    out.push(PSeg::Key(key));
                } else {
                    let start = i;
                    while i < chars.len() && chars[i] != ']' {
                        i += 1;
                    }
                    if i >= chars.len() {
                        return err(start - 1, "unterminated `[`");
                    }
                    let inner: String = chars[start..i].iter().collect();
                    i += 1;
                    if inner.is_empty() {
                        return err(start, "empty `[]`: write an index, a name or `*`");
                    }
                    out.push(if inner == "*" && wildcards { PSeg::AnyBracket } else { PSeg::Bracket(inner) });
                }
            }
            c if first => {
                let what = format!("unexpected {c:?}: a path starts with a field or document kind");
                let (seg, next) = name_segment(&chars, i, wildcards, &what)?;
                out.push(seg);
                i = next;
            }
            c => return err(i, &format!("unexpected {c:?}: expected `.` or `[`")),
        }
        first = false;
    }
    Ok(out)
}

/// A field name (or `*`, `**` in patterns) starting at `start`; returns the segment and where
/// scanning stopped. `empty` is the message when there is no name there.
fn name_segment(chars: &[char], start: usize, wildcards: bool, empty: &str) -> Result<(PSeg, usize), String> {
    let mut i = start;
    while i < chars.len() && !matches!(chars[i], '.' | '[' | ']' | '"') && !chars[i].is_whitespace() {
        i += 1;
    }
    let name: String = chars[start..i].iter().collect();
    let seg = match name.as_str() {
        "" => return Err(format!("column {}: {empty}", start + 1)),
        "*" if wildcards => PSeg::AnyField,
        "**" if wildcards => PSeg::AnyDepth,
        n if n.contains('*') => {
            return Err(format!("column {}: `*` stands alone as a segment (`*`, `**` or `[*]`)", start + 1));
        }
        _ => PSeg::Field(name),
    };
    Ok((seg, i))
}

/// One segment of a pattern.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PatSeg {
    /// A field or map key with this name (`.name` or `["name"]`).
    Member(String),
    /// A list index or document name (`[0]`, `[eth0]`).
    Bracket(String),
    /// `*`: any one field or map key.
    AnyMember,
    /// `[*]`: any one list index or document name.
    AnyBracket,
    /// `**`: any number of segments, none included.
    AnyDepth,
}

impl PatSeg {
    /// Whether this single-segment pattern matches `seg` (`AnyDepth` is handled by the caller).
    pub fn matches(&self, seg: &Seg) -> bool {
        match (self, seg) {
            (PatSeg::Member(m), Seg::Field(f) | Seg::Key(f)) => m == f,
            (PatSeg::Bracket(b), Seg::Name(n)) => b == n,
            (PatSeg::Bracket(b), Seg::Index(i)) => canonical_index(b) == Some(*i),
            (PatSeg::AnyMember, Seg::Field(_) | Seg::Key(_)) => true,
            (PatSeg::AnyBracket, Seg::Index(_) | Seg::Name(_)) => true,
            _ => false,
        }
    }
}

/// The index a bracket literal names, when it is written as Talos shows indexes (`[7]`, not `[07]`).
pub fn canonical_index(b: &str) -> Option<usize> {
    let n: usize = b.parse().ok()?;
    (n.to_string() == b).then_some(n)
}

/// A field-metadata pattern: segments matched against a path's segments.
#[derive(Clone, Debug)]
pub struct Pattern {
    /// The pattern as written.
    pub text: String,
    /// Its segments.
    pub segs: Vec<PatSeg>,
    /// Higher is more specific: 10 per literal segment, 1 per single wildcard, 0 per `**`.
    pub specificity: i64,
}

impl Pattern {
    /// Parses a pattern (`machine.**`, `*.mtu`, `LinkConfig[*].mtu`).
    pub fn new(text: &str) -> Result<Pattern, PathError> {
        Pattern::parse_text(text).map_err(|message| PathError { message })
    }

    fn parse_text(text: &str) -> Result<Pattern, String> {
        let segs: Vec<PatSeg> = parse_segments(text, true)?
            .into_iter()
            .map(|s| match s {
                PSeg::Field(f) | PSeg::Key(f) => PatSeg::Member(f),
                PSeg::Bracket(b) => PatSeg::Bracket(b),
                PSeg::AnyField => PatSeg::AnyMember,
                PSeg::AnyBracket => PatSeg::AnyBracket,
                PSeg::AnyDepth => PatSeg::AnyDepth,
            })
            .collect();
        let specificity = segs
            .iter()
            .map(|s| match s {
                PatSeg::Member(_) | PatSeg::Bracket(_) => 10,
                PatSeg::AnyMember | PatSeg::AnyBracket => 1,
                PatSeg::AnyDepth => 0,
            })
            .sum();
        Ok(Pattern { text: text.to_string(), segs, specificity })
    }

    /// Whether the pattern matches the whole path.
    pub fn matches(&self, path: &Path) -> bool {
        fn rec(p: &[PatSeg], s: &[Seg]) -> bool {
            match p.split_first() {
                None => s.is_empty(),
                Some((PatSeg::AnyDepth, rest)) => (0..=s.len()).any(|k| rec(rest, &s[k..])),
                Some((first, rest)) => s.split_first().is_some_and(|(h, t)| first.matches(h) && rec(rest, t)),
            }
        }
        rec(&self.segs, &path.segs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, path: &str) -> bool {
        Pattern::new(pattern).unwrap().matches(&Path::parse(path).unwrap())
    }

    #[test]
    fn paths_round_trip() {
        for p in [
            "machine.install.disk",
            "KubeProxyConfig.enabled",
            "LinkConfig[eth0].mtu",
            "machine.network.interfaces[0].addresses[1]",
            "machine.nodeLabels[\"node.kubernetes.io/role\"]",
            "debug",
        ] {
            assert_eq!(Path::parse(p).unwrap().to_string(), p);
        }
        assert_eq!(Path::parse("LinkConfig[eth0]").unwrap().segs[1], Seg::Name("eth0".into()));
    }

    #[test]
    fn bad_paths_name_the_column() {
        assert_eq!(Path::parse("machine..disk").unwrap_err().message, "column 9: expected a field name after `.`");
        assert!(Path::parse("machine.interfaces[x]").unwrap_err().message.contains("is not a list index"));
        assert!(Path::parse("").is_err());
        assert!(Path::parse("a[").is_err());
    }

    #[test]
    fn wildcards() {
        assert!(matches("cluster.**", "cluster"));
        assert!(matches("cluster.**", "cluster.etcd.image"));
        assert!(!matches("cluster.**", "clusterx"));
        assert!(matches("machine.nodeLabels.*", "machine.nodeLabels[\"a.b/c\"]"));
        assert!(matches("machine.nodeLabels.*", "machine.nodeLabels.x"));
        assert!(!matches("machine.nodeLabels.*", "machine.nodeLabels.x.y"));
        assert!(matches("LinkConfig[*].mtu", "LinkConfig[eth0].mtu"));
        assert!(matches("machine.network.interfaces[*].**", "machine.network.interfaces[3].vlans[0].mtu"));
        assert!(matches("**", "anything.at[0].all"));
        assert!(!matches("KubeProxyConfig.**", "KubeProxyConfigX.enabled"));
        assert!(Pattern::new("cluster.etcd.**").unwrap().specificity > Pattern::new("cluster.**").unwrap().specificity);
    }
}
