//! Diagnostics: positions in rule files and the problems found there.
//!
//! Every stage (lexer, parser, loader, checker) returns all of its problems at once as a
//! `Vec<Diagnostic>`; nothing stops at the first one. A `Span` names a file by index into the
//! `SourceMap`, so diagnostics print as `path:line:col: error: message`.

use std::fmt;

/// A position in a loaded file: file index, 1-based line and column (in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Span {
    /// The file, as an index into `SourceMap::files`.
    pub file: u32,
    /// The line, 1-based.
    pub line: u32,
    /// The column, 1-based (in characters).
    pub col: u32,
}

/// The names of the files a program was loaded from, indexed by `Span::file`.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    /// The file names, in the order they were loaded.
    pub files: Vec<String>,
}

impl SourceMap {
    /// The name of the file a span is in.
    pub fn name(&self, span: Span) -> &str {
        self.files.get(span.file as usize).map(String::as_str).unwrap_or("<unknown>")
    }

    /// `path:line:col`, the form every message uses to point at a place.
    pub fn locate(&self, span: Span) -> String {
        self.location(span).to_string()
    }

    /// The place `span` names, with its file name resolved.
    pub fn location(&self, span: Span) -> Location {
        Location { file: self.name(span).to_string(), line: span.line, col: span.col }
    }
}

/// A place in a named file, for errors that leave the program behind (`path:line:col`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// The file's name, as it was loaded.
    pub file: String,
    /// The line, 1-based.
    pub line: u32,
    /// The column, 1-based.
    pub col: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
/// How bad a diagnostic is.
pub enum Severity {
    /// The program does not load.
    Error,
    /// The program loads, but something is likely wrong (a relation derived and never read).
    Warning,
}

/// One problem, at one place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// How bad it is.
    pub severity: Severity,
    /// Where it is.
    pub span: Span,
    /// What is wrong and what to do, as one sentence.
    pub message: String,
}

impl Diagnostic {
    /// An error at `span`.
    pub fn error(span: Span, message: impl Into<String>) -> Self {
        Diagnostic { severity: Severity::Error, span, message: message.into() }
    }

    /// A warning at `span`.
    pub fn warning(span: Span, message: impl Into<String>) -> Self {
        Diagnostic { severity: Severity::Warning, span, message: message.into() }
    }

    /// Whether this stops the program from loading.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// Renders `path:line:col: error: message` with the file names of `map`.
    pub fn display<'a>(&'a self, map: &'a SourceMap) -> impl fmt::Display + 'a {
        DisplayDiag { diag: self, map }
    }
}

struct DisplayDiag<'a> {
    diag: &'a Diagnostic,
    map: &'a SourceMap,
}

impl fmt::Display for DisplayDiag<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.diag.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {}: {}", self.map.locate(self.diag.span), level, self.diag.message)
    }
}

/// Every diagnostic as `path:line:col: level: message`, one per line.
pub fn render(diags: &[Diagnostic], map: &SourceMap) -> String {
    diags.iter().map(|d| format!("{}\n", d.display(map))).collect()
}

/// Sorts diagnostics by position so that output is deterministic whatever the order in which
/// the stages found them.
pub fn sort(diags: &mut [Diagnostic]) {
    diags.sort_by(|a, b| (a.span, a.severity, &a.message).cmp(&(b.span, b.severity, &b.message)));
}
