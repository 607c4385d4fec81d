//! Tokens of the rule dialect, with positions.
//!
//! The lexer never stops at a bad character: it reports a diagnostic and goes on, so that the
//! parser can report every syntax problem of a file at once. Doc comments (`///`) are tokens;
//! ordinary comments are dropped.

use crate::diag::{Diagnostic, Span};

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// A lower-case identifier: relation, functor or predicate name.
    Ident(String),
    /// An upper-case identifier.
    Var(String),
    Wild,
    Str(String),
    Num(i64),
    /// `.decl`, `.input`, ...
    Directive(String),
    /// `@name`
    At(String),
    Doc(String),
    Dot,
    Comma,
    Colon,
    ColonDash,
    LParen,
    RParen,
    LBrace,
    RBrace,
    Bang,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Eof,
}

impl Tok {
    /// How a token is named in "expected X, found Y".
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier `{s}`"),
            Tok::Var(s) => format!("variable `{s}`"),
            Tok::Wild => "`_`".into(),
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Num(n) => format!("number `{n}`"),
            Tok::Directive(d) => format!("directive `.{d}`"),
            Tok::At(s) => format!("`@{s}`"),
            Tok::Doc(_) => "doc comment".into(),
            Tok::Dot => "`.`".into(),
            Tok::Comma => "`,`".into(),
            Tok::Colon => "`:`".into(),
            Tok::ColonDash => "`:-`".into(),
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::LBrace => "`{`".into(),
            Tok::RBrace => "`}`".into(),
            Tok::Bang => "`!`".into(),
            Tok::Eq => "`=`".into(),
            Tok::Ne => "`!=`".into(),
            Tok::Lt => "`<`".into(),
            Tok::Le => "`<=`".into(),
            Tok::Gt => "`>`".into(),
            Tok::Ge => "`>=`".into(),
            Tok::Plus => "`+`".into(),
            Tok::Minus => "`-`".into(),
            Tok::Star => "`*`".into(),
            Tok::Slash => "`/`".into(),
            Tok::Percent => "`%`".into(),
            Tok::Eof => "end of file".into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    file: u32,
    line: u32,
    col: u32,
    out: Vec<Token>,
    diags: Vec<Diagnostic>,
}

impl Lexer<'_> {
    fn span(&self) -> Span {
        Span { file: self.file, line: self.line, col: self.col }
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn peek2(&self) -> Option<char> {
        let mut it = self.chars.clone();
        it.next();
        it.next()
    }

    fn push(&mut self, tok: Tok, span: Span) {
        self.out.push(Token { tok, span });
    }

    fn ident(&mut self) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                s.push(c);
                self.bump();
            } else {
                break;
            }
        }
        s
    }

    fn string(&mut self, start: Span) {
        self.bump(); // opening quote
        let mut s = String::new();
        loop {
            match self.bump() {
                None | Some('\n') => {
                    self.diags.push(Diagnostic::error(
                        start,
                        "unterminated string: expected a closing `\"` before the end of the line",
                    ));
                    return;
                }
                Some('"') => break,
                Some('\\') => {
                    let at = self.span();
                    match self.bump() {
                        Some('"') => s.push('"'),
                        Some('\\') => s.push('\\'),
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some(c) => {
                            self.diags.push(Diagnostic::error(
                                at,
                                format!("unknown escape `\\{c}` in string: expected one of \\\" \\\\ \\n \\t"),
                            ));
                        }
                        None => continue,
                    }
                }
                Some(c) => s.push(c),
            }
        }
        self.push(Tok::Str(s), start);
    }

    fn number(&mut self, start: Span) {
        let mut s = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_digit() {
                s.push(c);
                self.bump();
            } else {
                break;
            }
        }
        match s.parse::<i64>() {
            Ok(n) => self.push(Tok::Num(n), start),
            Err(_) => {
                self.diags.push(Diagnostic::error(
                    start,
                    format!("integer literal {s} does not fit in a 64-bit signed number"),
                ));
                self.push(Tok::Num(0), start);
            }
        }
    }

    fn run(&mut self) {
        while let Some(c) = self.peek() {
            let start = self.span();
            match c {
                c if c.is_whitespace() => {
                    self.bump();
                }
                '/' if self.peek2() == Some('/') => {
                    self.bump();
                    self.bump();
                    let doc = self.peek() == Some('/');
                    if doc {
                        self.bump();
                    }
                    let mut text = String::new();
                    while let Some(c) = self.peek() {
                        if c == '\n' {
                            break;
                        }
                        text.push(c);
                        self.bump();
                    }
                    if doc {
                        self.push(Tok::Doc(text.trim().to_string()), start);
                    }
                }
                '/' if self.peek2() == Some('*') => {
                    self.bump();
                    self.bump();
                    let mut closed = false;
                    while let Some(c) = self.bump() {
                        if c == '*' && self.peek() == Some('/') {
                            self.bump();
                            closed = true;
                            break;
                        }
                    }
                    if !closed {
                        self.diags.push(Diagnostic::error(
                            start,
                            "unterminated block comment: expected `*/` before the end of the file",
                        ));
                    }
                }
                '"' => self.string(start),
                '0'..='9' => self.number(start),
                'a'..='z' => {
                    let s = self.ident();
                    self.push(Tok::Ident(s), start);
                }
                'A'..='Z' => {
                    let s = self.ident();
                    self.push(Tok::Var(s), start);
                }
                '_' => {
                    let s = self.ident();
                    if s == "_" {
                        self.push(Tok::Wild, start);
                    } else {
                        self.diags.push(Diagnostic::error(
                            start,
                            format!(
                                "`{s}` is not a valid name: variables start with an upper-case letter and `_` alone is the anonymous variable"
                            ),
                        ));
                        self.push(Tok::Wild, start);
                    }
                }
                '.' => {
                    self.bump();
                    if self.peek().is_some_and(|c| c.is_ascii_lowercase()) {
                        let s = self.ident();
                        self.push(Tok::Directive(s), start);
                    } else {
                        self.push(Tok::Dot, start);
                    }
                }
                '@' => {
                    self.bump();
                    let s = self.ident();
                    self.push(Tok::At(s), start);
                }
                _ => {
                    self.bump();
                    let two = |l: &mut Self, next: char| {
                        if l.peek() == Some(next) {
                            l.bump();
                            true
                        } else {
                            false
                        }
                    };
                    let tok = match c {
                        ',' => Tok::Comma,
                        ':' => {
                            if two(self, '-') {
                                Tok::ColonDash
                            } else {
                                Tok::Colon
                            }
                        }
                        '(' => Tok::LParen,
                        ')' => Tok::RParen,
                        '{' => Tok::LBrace,
                        '}' => Tok::RBrace,
                        '!' => {
                            if two(self, '=') {
                                Tok::Ne
                            } else {
                                Tok::Bang
                            }
                        }
                        '=' => Tok::Eq,
                        '<' => {
                            if two(self, '=') {
                                Tok::Le
                            } else {
                                Tok::Lt
                            }
                        }
                        '>' => {
                            if two(self, '=') {
                                Tok::Ge
                            } else {
                                Tok::Gt
                            }
                        }
                        '+' => Tok::Plus,
                        '-' => Tok::Minus,
                        '*' => Tok::Star,
                        '/' => Tok::Slash,
                        '%' => Tok::Percent,
                        other => {
                            self.diags.push(Diagnostic::error(start, format!("unexpected character {other:?}")));
                            continue;
                        }
                    };
                    self.push(tok, start);
                }
            }
        }
        let end = self.span();
        self.push(Tok::Eof, end);
    }
}

/// Splits `text` (the content of file number `file`) into tokens; the last token is `Eof`.
pub fn lex(text: &str, file: u32) -> (Vec<Token>, Vec<Diagnostic>) {
    let mut lexer = Lexer { chars: text.chars().peekable(), file, line: 1, col: 1, out: vec![], diags: vec![] };
    lexer.run();
    (lexer.out, lexer.diags)
}
