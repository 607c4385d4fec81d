//! Loading a program from several files and their `.include`s, without doing I/O.
//!
//! The host passes a `Sources` that reads a file by path (the CLI reads the disk; tests use a
//! map). Each file is loaded once, whatever the number of includes naming it; an include cycle
//! and an unreadable or non-UTF-8 file are diagnostics at the include (or the file) that
//! caused them. Start at `load`.

use crate::ast::{Item, Module};
use crate::check::check;
use crate::diag::{Diagnostic, SourceMap, Span};
use crate::program::Program;
use std::collections::HashMap;

/// Where the loader gets file contents from.
pub trait Sources {
    /// The bytes of the file at `path`, or why it cannot be read.
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>>;
}

/// An in-memory set of files, for tests and for programs given as strings.
#[derive(Clone, Debug, Default)]
pub struct MemSources(pub HashMap<String, String>);

impl Sources for MemSources {
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        self.0
            .get(path)
            .map(|s| s.clone().into_bytes())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"))
    }
}

/// The result of loading: the program if it checked without error, every diagnostic, and the
/// file names that diagnostics refer to.
#[derive(Debug)]
pub struct Loaded {
    /// The program, when it checked without error.
    pub program: Option<Program>,
    /// Every error and warning, in the order found.
    pub diagnostics: Vec<Diagnostic>,
    /// The files the diagnostics refer to.
    pub sources: SourceMap,
}

impl Loaded {
    /// The diagnostics that are errors.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }

    /// Every diagnostic as `path:line:col: level: message`, one per line.
    pub fn render_diagnostics(&self) -> String {
        crate::diag::render(&self.diagnostics, &self.sources)
    }
}

/// `include` relative to the directory of `from`, with `.` and `..` segments folded.
pub fn resolve_include(from: &str, include: &str) -> String {
    let joined = if include.starts_with('/') {
        include.to_string()
    } else {
        match from.rfind('/') {
            Some(i) => format!("{}/{}", &from[..i], include),
            None => include.to_string(),
        }
    };
    let absolute = joined.starts_with('/');
    let mut parts: Vec<&str> = vec![];
    for seg in joined.split('/') {
        match seg {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let body = parts.join("/");
    if absolute { format!("/{body}") } else { body }
}

/// The position of the first invalid byte of a non-UTF-8 file.
fn utf8_error_span(bytes: &[u8], file: u32, valid_up_to: usize) -> Span {
    let prefix = std::str::from_utf8(&bytes[..valid_up_to]).unwrap_or("");
    let line = prefix.matches('\n').count() as u32 + 1;
    let col = prefix.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
    Span { file, line, col }
}

/// Loads `roots` (in order) and everything they include, then checks the whole program.
pub fn load(roots: &[String], sources: &dyn Sources) -> Loaded {
    let mut map = SourceMap::default();
    let mut diags = vec![];
    let mut modules: Vec<Module> = vec![];
    let mut loaded: HashMap<String, u32> = HashMap::new();
    // Depth-first, with the include stack kept to name cycles.
    #[allow(clippy::too_many_arguments)] // the loader's state, passed down the recursion
    fn visit(
        path: &str,
        at: Option<Span>,
        stack: &mut Vec<String>,
        sources: &dyn Sources,
        map: &mut SourceMap,
        diags: &mut Vec<Diagnostic>,
        modules: &mut Vec<Module>,
        loaded: &mut HashMap<String, u32>,
    ) {
        if let Some(i) = stack.iter().position(|p| p == path) {
            let mut cycle: Vec<&str> = stack[i..].iter().map(String::as_str).collect();
            cycle.push(path);
            diags.push(Diagnostic::error(
                at.unwrap_or_default(),
                format!("include cycle: {}", cycle.join(" includes ")),
            ));
            return;
        }
        if loaded.contains_key(path) {
            return;
        }
        let file = map.files.len() as u32;
        map.files.push(path.to_string());
        loaded.insert(path.to_string(), file);
        let bytes = match sources.read(path) {
            Ok(b) => b,
            Err(e) => {
                let span = at.unwrap_or(Span { file, line: 1, col: 1 });
                let what = if at.is_some() { "cannot read included file" } else { "cannot read rules file" };
                diags.push(Diagnostic::error(span, format!("{what} {path}: {e}")));
                return;
            }
        };
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) => t,
            Err(e) => {
                diags.push(Diagnostic::error(
                    utf8_error_span(&bytes, file, e.valid_up_to()),
                    "the file is not valid UTF-8: rules files are UTF-8 text",
                ));
                return;
            }
        };
        let (module, mut ds) = crate::parser::parse(text, file);
        diags.append(&mut ds);
        let includes: Vec<(String, Span)> = module
            .items
            .iter()
            .filter_map(|i| if let Item::Include(p, s) = i { Some((p.clone(), *s)) } else { None })
            .collect();
        modules.push(module);
        stack.push(path.to_string());
        for (inc, span) in includes {
            let target = resolve_include(path, &inc);
            visit(&target, Some(span), stack, sources, map, diags, modules, loaded);
        }
        stack.pop();
    }
    for root in roots {
        let mut stack = vec![];
        visit(root, None, &mut stack, sources, &mut map, &mut diags, &mut modules, &mut loaded);
    }
    // Check what parsed even when something did not, so that one run reports everything.
    let broken = diags.iter().any(Diagnostic::is_error);
    let (program, mut more) = check(&modules, map.clone());
    diags.append(&mut more);
    let program = if broken { None } else { program };
    crate::diag::sort(&mut diags);
    Loaded { program, diagnostics: diags, sources: map }
}

/// Loads a program from one string (file name `name`); for tests and small embedded programs.
pub fn load_str(name: &str, text: &str) -> Loaded {
    let mut files = HashMap::new();
    files.insert(name.to_string(), text.to_string());
    load(&[name.to_string()], &MemSources(files))
}
