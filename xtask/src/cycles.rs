//! Import cycles among the top-level modules of a crate, for `cargo xtask lint`.
//!
//! The top-level modules of a crate are the `.rs` files and the folders directly
//! under its `src/` (`src/config.rs` is `config`; `src/audit/mod.rs` and every file
//! under `src/audit/` are `audit`); `lib.rs` and `main.rs` are the root, not modules.
//! Module A depends on module B when a file of A names `crate::B` (a `use`, grouped
//! or not, or a path in an expression or a type) or reaches B through `super::`.
//! Comments, string and char literals, `$crate::` (macro hygiene) and other crates'
//! paths do not count. Test code counts like the rest: a test of A that needs B
//! makes A depend on B.
//!
//! Paths through the root's re-exports (`crate::Item` where `lib.rs` has
//! `pub use b::Item`) and `#[path]` attributes are not followed.
//!
//! A cycle is a strongly connected component of more than one module; each is
//! reported with every edge inside it and the first place that makes the edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The crate source roots `cargo xtask lint` checks, relative to the workspace root.
pub const CHECKED: &[&str] = &["agent/src", "common/src"];

/// One reference of a module to another: where it is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Location {
    /// The file, as given to [`scan`] (`agent/src/api.rs`).
    pub file: PathBuf,
    /// 1-based.
    pub line: usize,
    /// Inside a `#[cfg(test)] mod ... { }`.
    pub in_test: bool,
}

/// The top-level modules of a crate and the references between them.
#[derive(Debug, Default)]
pub struct Graph {
    pub modules: BTreeSet<String>,
    /// (from, to) -> every reference that makes the edge, by file and line.
    pub edges: BTreeMap<(String, String), Vec<Location>>,
}

/// A strongly connected component of more than one module.
#[derive(Debug, PartialEq, Eq)]
pub struct Cycle {
    /// Sorted.
    pub modules: Vec<String>,
    /// The edges between them, sorted: (from, to).
    pub edges: Vec<(String, String)>,
}

/// Checks every source root of `crates` (relative to `root`): `Ok` with a one-line
/// summary when none has a cycle, `Err` naming each crate's cycles otherwise.
pub fn check(root: &Path, crates: &[&str]) -> Result<String> {
    let mut clean = Vec::new();
    let mut report = String::new();
    for src in crates {
        let graph = scan(root, Path::new(src))?;
        let cycles = graph.cycles();
        if cycles.is_empty() {
            clean.push(format!("{src} ({} modules)", graph.modules.len()));
        } else {
            report.push_str(&graph.describe(src, &cycles));
        }
    }
    if !report.is_empty() {
        let fine = if clean.is_empty() {
            String::new()
        } else {
            format!("(no cycle in {})\n", clean.join(", "))
        };
        bail!(
            "import cycles among the top-level modules of a crate:\n{report}{fine}\
             Break each cycle: move what one side needs from the other into the module \
             that owns it, or into a lower module both can use."
        );
    }
    Ok(format!(
        "no import cycles among the top-level modules of {}",
        clean.join(", ")
    ))
}

/// The graph of the crate source root `src` (a path relative to `root`; the
/// locations are relative to `root` too).
pub fn scan(root: &Path, src: &Path) -> Result<Graph> {
    let mut files = Vec::new();
    let dir = root.join(src);
    for entry in read_dir_sorted(&dir)? {
        let name = file_name(&entry)?;
        let rel = src.join(&name);
        if entry.is_dir() {
            // src/bin/ holds binaries (crate roots of their own), not modules.
            if name == "bin" {
                continue;
            }
            let mut inside = Vec::new();
            rs_files(root, &rel, &mut inside)?;
            files.extend(inside.into_iter().map(|f| (name.clone(), f)));
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                files.push((stem.to_string(), rel));
            }
        }
    }
    let mut graph = Graph {
        modules: files.iter().map(|(m, _)| m.clone()).collect(),
        ..Graph::default()
    };
    for (module, file) in &files {
        let text = std::fs::read_to_string(root.join(file))
            .with_context(|| format!("reading {}", file.display()))?;
        let depth = module_depth(src, file);
        for r in references(&text, depth) {
            if r.target != *module && graph.modules.contains(&r.target) {
                graph
                    .edges
                    .entry((module.clone(), r.target))
                    .or_default()
                    .push(Location {
                        file: file.clone(),
                        line: r.line,
                        in_test: r.in_test,
                    });
            }
        }
    }
    for locations in graph.edges.values_mut() {
        locations.sort();
    }
    Ok(graph)
}

impl Graph {
    /// The strongly connected components of more than one module (Tarjan), each
    /// sorted, in the order of their first module.
    pub fn cycles(&self) -> Vec<Cycle> {
        let names: Vec<&String> = self.modules.iter().collect();
        let index: BTreeMap<&String, usize> =
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut next = vec![Vec::new(); names.len()];
        for (from, to) in self.edges.keys() {
            if let (Some(&f), Some(&t)) = (index.get(from), index.get(to)) {
                next[f].push(t);
            }
        }
        let mut tarjan = Tarjan {
            next: &next,
            index: vec![None; names.len()],
            low: vec![0; names.len()],
            on_stack: vec![false; names.len()],
            stack: Vec::new(),
            counter: 0,
            components: Vec::new(),
        };
        for v in 0..names.len() {
            if tarjan.index[v].is_none() {
                tarjan.visit(v);
            }
        }
        let mut cycles: Vec<Cycle> = tarjan
            .components
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let members: BTreeSet<&String> = c.iter().map(|&i| names[i]).collect();
                Cycle {
                    modules: members.iter().map(|m| (*m).clone()).collect(),
                    edges: self
                        .edges
                        .keys()
                        .filter(|(f, t)| members.contains(f) && members.contains(t))
                        .cloned()
                        .collect(),
                }
            })
            .collect();
        cycles.sort_by(|a, b| a.modules.cmp(&b.modules));
        cycles
    }

    /// The report of `cycles` of the crate at `src`: each cycle's modules, then each
    /// edge with its first reference and how many there are.
    pub fn describe(&self, src: &str, cycles: &[Cycle]) -> String {
        let mut out = format!(
            "{src}: {} import cycle(s) among its {} top-level modules\n",
            cycles.len(),
            self.modules.len()
        );
        for (i, cycle) in cycles.iter().enumerate() {
            let _ = writeln!(
                out,
                "  cycle {} of {}: {}",
                i + 1,
                cycles.len(),
                cycle.modules.join(", ")
            );
            let width = cycle
                .edges
                .iter()
                .map(|(f, t)| f.len() + t.len() + 4)
                .max()
                .unwrap_or(0);
            for (from, to) in &cycle.edges {
                let locations = self
                    .edges
                    .get(&(from.clone(), to.clone()))
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let Some(first) = locations.first() else {
                    continue;
                };
                let edge = format!("{from} -> {to}");
                let mut line =
                    format!("    {edge:width$}  {}:{}", first.file.display(), first.line);
                if locations.len() > 1 {
                    let _ = write!(line, " (+{} more)", locations.len() - 1);
                }
                if locations.iter().all(|l| l.in_test) {
                    line.push_str(" [tests only]");
                }
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }
}

struct Tarjan<'a> {
    next: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    counter: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    // Recursive: a crate has tens of top-level modules, not thousands.
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.counter);
        self.low[v] = self.counter;
        self.counter += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &self.next[v] {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        entries.push(
            entry
                .with_context(|| format!("reading {}", dir.display()))?
                .path(),
        );
    }
    entries.sort();
    Ok(entries)
}

fn file_name(path: &Path) -> Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .with_context(|| format!("{}: not a UTF-8 file name", path.display()))
}

/// The `.rs` files under `rel` (relative to `root`), recursively.
fn rs_files(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in read_dir_sorted(&root.join(rel))? {
        let name = file_name(&entry)?;
        if entry.is_dir() {
            rs_files(root, &rel.join(&name), out)?;
        } else if name.ends_with(".rs") {
            out.push(rel.join(&name));
        }
    }
    Ok(())
}

/// How deep below the crate root the module of `file` is: 1 for `src/a.rs` and
/// `src/a/mod.rs`, 2 for `src/a/b.rs`, and so on (`super` that many times is the
/// crate root).
fn module_depth(src: &Path, file: &Path) -> usize {
    let parts = file.strip_prefix(src).map_or(0, |p| p.components().count());
    if file.file_name().is_some_and(|n| n == "mod.rs") {
        parts.saturating_sub(1)
    } else {
        parts
    }
}

/// A top-level name that a file reaches from the crate root.
#[derive(Debug, PartialEq, Eq)]
struct Reference {
    target: String,
    line: usize,
    in_test: bool,
}

/// The first segment after the crate root of every `crate::` path, and of every
/// `super::` path that climbs to the crate root, in a file whose module is `depth`
/// levels below the root. Inline `mod name { }` blocks add a level.
fn references(text: &str, depth: usize) -> Vec<Reference> {
    let toks = tokenize(text);
    let mut out = Vec::new();
    let mut braces = 0usize;
    // Inline modules open here: (their brace level, under #[cfg(test)]).
    let mut mods: Vec<(usize, bool)> = Vec::new();
    for i in 0..toks.len() {
        let at = |j: usize| toks.get(j).map(|t| &t.tok);
        match &toks[i].tok {
            Tok::Punct('{') => {
                braces += 1;
                if i >= 2 && matches!(at(i - 1), Some(Tok::Ident(_))) {
                    if let Some(Tok::Ident("mod")) = at(i - 2) {
                        mods.push((braces, is_cfg_test(&toks, i - 2)));
                    }
                }
            }
            Tok::Punct('}') => {
                if mods.last().is_some_and(|m| m.0 == braces) {
                    mods.pop();
                }
                braces = braces.saturating_sub(1);
            }
            Tok::Ident(word @ ("crate" | "super")) => {
                // The start of a path: not `x::super`, not `$crate`.
                let starts = i == 0 || !matches!(at(i - 1), Some(Tok::PathSep | Tok::Punct('$')));
                if !starts || at(i + 1) != Some(&Tok::PathSep) {
                    continue;
                }
                let mut j = i + 2;
                if *word == "super" {
                    let mut up = 1;
                    while at(j) == Some(&Tok::Ident("super")) && at(j + 1) == Some(&Tok::PathSep) {
                        up += 1;
                        j += 2;
                    }
                    // Fewer stays inside this top-level module; more is not Rust.
                    if up != depth + mods.len() {
                        continue;
                    }
                }
                let in_test = mods.iter().any(|m| m.1);
                let mut names = Vec::new();
                match at(j) {
                    Some(Tok::Ident(_)) => names.push(j),
                    Some(Tok::Punct('{')) => {
                        group(&toks, j, &mut names);
                    }
                    _ => {}
                }
                for n in names {
                    if let Some(Token {
                        tok: Tok::Ident(name),
                        line,
                    }) = toks.get(n)
                    {
                        if !matches!(*name, "self" | "super" | "crate") {
                            out.push(Reference {
                                target: name.to_string(),
                                line: *line,
                                in_test,
                            });
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The first identifier of each item of the `{ ... }` group at `open` (nested
/// groups at an item's start included) into `names`; the index after its `}`.
fn group(toks: &[Token], open: usize, names: &mut Vec<usize>) -> usize {
    let mut p = open + 1;
    let mut item_start = true;
    while let Some(t) = toks.get(p) {
        match t.tok {
            Tok::Punct('}') => return p + 1,
            Tok::Punct(',') => {
                item_start = true;
                p += 1;
            }
            Tok::Punct('{') => {
                let mut inner = Vec::new();
                p = group(toks, p, &mut inner);
                if item_start {
                    names.extend(inner);
                }
                item_start = false;
            }
            Tok::Ident(_) if item_start => {
                names.push(p);
                item_start = false;
                p += 1;
            }
            _ => p += 1,
        }
    }
    p
}

/// Whether the `mod` at `m` carries `#[cfg(test)]` (before an optional `pub`,
/// `pub(crate)`, ...).
fn is_cfg_test(toks: &[Token], m: usize) -> bool {
    let tok = |j: usize| toks.get(j).map(|t| &t.tok);
    let mut k = m;
    // Visibility.
    if k >= 1 && tok(k - 1) == Some(&Tok::Punct(')')) {
        if let Some(open) = matching_back(toks, k - 1, '(', ')') {
            if open >= 1 && tok(open - 1) == Some(&Tok::Ident("pub")) {
                k = open - 1;
            }
        }
    } else if k >= 1 && tok(k - 1) == Some(&Tok::Ident("pub")) {
        k -= 1;
    }
    // Outer attributes, nearest first.
    while k >= 1 && tok(k - 1) == Some(&Tok::Punct(']')) {
        let Some(open) = matching_back(toks, k - 1, '[', ']') else {
            return false;
        };
        let inside: Vec<&Tok> = toks[open + 1..k - 1].iter().map(|t| &t.tok).collect();
        if inside
            == [
                &Tok::Ident("cfg"),
                &Tok::Punct('('),
                &Tok::Ident("test"),
                &Tok::Punct(')'),
            ]
        {
            return true;
        }
        if open == 0 || tok(open - 1) != Some(&Tok::Punct('#')) {
            return false;
        }
        k = open - 1;
    }
    false
}

/// The index of the `open` that matches the `close` at `at`, looking back.
fn matching_back(toks: &[Token], at: usize, open: char, close: char) -> Option<usize> {
    let mut level = 0usize;
    for j in (0..=at).rev() {
        match toks[j].tok {
            Tok::Punct(c) if c == close => level += 1,
            Tok::Punct(c) if c == open => {
                level -= 1;
                if level == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

#[derive(Debug, PartialEq, Eq)]
enum Tok<'a> {
    Ident(&'a str),
    /// `::`
    PathSep,
    /// Any other ASCII punctuation character.
    Punct(char),
    /// A string, char or number literal.
    Lit,
}

#[derive(Debug)]
struct Token<'a> {
    tok: Tok<'a>,
    line: usize,
}

/// Rust source as identifiers, `::`, punctuation and literals, with their lines;
/// comments dropped. Lenient: unterminated literals and comments end at the end.
fn tokenize(text: &str) -> Vec<Token<'_>> {
    let b = text.as_bytes();
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    let mut toks = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start_line = line;
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            _ if c.is_ascii_whitespace() => i += 1,
            b'/' if at(i + 1) == b'/' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if at(i + 1) == b'*' => {
                let mut level = 0;
                while i < b.len() {
                    if b[i] == b'/' && at(i + 1) == b'*' {
                        level += 1;
                        i += 2;
                    } else if b[i] == b'*' && at(i + 1) == b'/' {
                        level -= 1;
                        i += 2;
                        if level == 0 {
                            break;
                        }
                    } else {
                        if b[i] == b'\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
            }
            b'"' => {
                i = skip_string(b, i + 1, &mut line);
                toks.push(Token {
                    tok: Tok::Lit,
                    line: start_line,
                });
            }
            b'\'' => {
                if let Some(end) = char_literal_end(b, i) {
                    i = end;
                    toks.push(Token {
                        tok: Tok::Lit,
                        line,
                    });
                } else {
                    // A lifetime or a label: its name follows as an identifier.
                    i += 1;
                }
            }
            b':' if at(i + 1) == b':' => {
                toks.push(Token {
                    tok: Tok::PathSep,
                    line,
                });
                i += 2;
            }
            _ if c.is_ascii_digit() => {
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                toks.push(Token {
                    tok: Tok::Lit,
                    line,
                });
            }
            _ if is_ident(c) => {
                let s = i;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                let word = &text[s..i];
                let next = at(i);
                let raw_string = matches!(word, "r" | "br" | "cr") && {
                    let mut h = i;
                    while at(h) == b'#' {
                        h += 1;
                    }
                    at(h) == b'"'
                };
                if raw_string {
                    i = skip_raw_string(b, i, &mut line);
                    toks.push(Token {
                        tok: Tok::Lit,
                        line: start_line,
                    });
                } else if matches!(word, "b" | "c") && next == b'"' {
                    i = skip_string(b, i + 1, &mut line);
                    toks.push(Token {
                        tok: Tok::Lit,
                        line: start_line,
                    });
                } else if word == "b" && next == b'\'' {
                    i = char_literal_end(b, i).unwrap_or(i + 1);
                    toks.push(Token {
                        tok: Tok::Lit,
                        line,
                    });
                } else if word == "r" && next == b'#' && is_ident(at(i + 1)) {
                    // A raw identifier, r#name.
                    let s = i + 1;
                    i = s;
                    while i < b.len() && is_ident(b[i]) {
                        i += 1;
                    }
                    toks.push(Token {
                        tok: Tok::Ident(&text[s..i]),
                        line,
                    });
                } else {
                    toks.push(Token {
                        tok: Tok::Ident(word),
                        line,
                    });
                }
            }
            _ => {
                toks.push(Token {
                    tok: Tok::Punct(c as char),
                    line,
                });
                i += 1;
            }
        }
    }
    toks
}

/// The index after the closing `"` of a string whose contents start at `i`.
fn skip_string(b: &[u8], mut i: usize, line: &mut usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => {
                if b.get(i + 1) == Some(&b'\n') {
                    *line += 1;
                }
                i += 2;
            }
            b'"' => return i + 1,
            c => {
                if c == b'\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    b.len()
}

/// The index after a raw string whose `#`s (or opening `"`) start at `i`.
fn skip_raw_string(b: &[u8], mut i: usize, line: &mut usize) -> usize {
    let mut hashes = 0;
    while b.get(i) == Some(&b'#') {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening "
    while i < b.len() {
        if b[i] == b'"'
            && b[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == b'#')
                .count()
                == hashes
        {
            return i + 1 + hashes;
        }
        if b[i] == b'\n' {
            *line += 1;
        }
        i += 1;
    }
    b.len()
}

/// When the `'` at `q` opens a char (or byte) literal, the index after its closing
/// `'`; `None` for a lifetime or a label (`'a`).
fn char_literal_end(b: &[u8], q: usize) -> Option<usize> {
    let first = *b.get(q + 1)?;
    if first == b'\\' {
        // '\n', '\'', '\u{1F600}': up to the next quote after the escaped character.
        let mut j = q + 3;
        while j < b.len() && b[j] != b'\'' && b[j] != b'\n' {
            j += 1;
        }
        return (b.get(j) == Some(&b'\'')).then_some(j + 1);
    }
    let len = match first {
        0..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    };
    (b.get(q + 1 + len) == Some(&b'\'')).then_some(q + 2 + len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_testkit::temp::TempDir;

    /// A crate source tree `src/` in a temporary directory: (path, contents).
    fn tree(files: &[(&str, &str)]) -> TempDir {
        let dir = TempDir::new("cycles");
        for (path, text) in files {
            let p = dir.path().join("src").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
        }
        dir
    }

    fn graph(files: &[(&str, &str)]) -> Graph {
        let dir = tree(files);
        scan(dir.path(), Path::new("src")).unwrap()
    }

    fn edges(g: &Graph) -> Vec<String> {
        g.edges.keys().map(|(f, t)| format!("{f}->{t}")).collect()
    }

    fn cycle_modules(g: &Graph) -> Vec<Vec<String>> {
        g.cycles().into_iter().map(|c| c.modules).collect()
    }

    #[test]
    fn an_acyclic_tree_has_no_cycle_and_check_says_so() {
        let dir = tree(&[
            (
                "lib.rs",
                "pub mod a;\npub mod b;\npub mod c;\nuse crate::a::X;\n",
            ),
            ("a.rs", "use crate::b::Y;\npub fn f() { crate::c::g(); }\n"),
            ("b.rs", "use crate::c;\n"),
            ("c.rs", "pub fn g() {}\n"),
        ]);
        let g = scan(dir.path(), Path::new("src")).unwrap();
        assert_eq!(g.modules.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(edges(&g), ["a->b", "a->c", "b->c"]);
        assert!(g.cycles().is_empty());
        let summary = check(dir.path(), &["src"]).unwrap();
        assert_eq!(
            summary,
            "no import cycles among the top-level modules of src (3 modules)"
        );
    }

    #[test]
    fn a_two_cycle_is_found_with_where_each_edge_is() {
        let dir = tree(&[
            ("a.rs", "//! a\n\nuse crate::b::Y;\n"),
            (
                "b.rs",
                "fn f() {\n    let _ = crate::a::x();\n    crate::a::y();\n}\n",
            ),
            ("c.rs", "use crate::a;\n"),
        ]);
        let g = scan(dir.path(), Path::new("src")).unwrap();
        let cycles = g.cycles();
        assert_eq!(
            cycles,
            [Cycle {
                modules: vec!["a".into(), "b".into()],
                edges: vec![("a".into(), "b".into()), ("b".into(), "a".into())],
            }]
        );
        let lines = g.edges[&("b".to_string(), "a".to_string())]
            .iter()
            .map(|l| l.line)
            .collect::<Vec<_>>();
        assert_eq!(lines, [2, 3]);
        let err = check(dir.path(), &["src"]).unwrap_err().to_string();
        assert!(
            err.contains("src: 1 import cycle(s) among its 3 top-level modules"),
            "{err}"
        );
        assert!(err.contains("cycle 1 of 1: a, b\n"), "{err}");
        assert!(err.contains("a -> b  src/a.rs:3\n"), "{err}");
        assert!(err.contains("b -> a  src/b.rs:2 (+1 more)\n"), "{err}");
        assert!(!err.contains("c ->"), "{err}");
    }

    #[test]
    fn a_failed_check_names_the_crates_without_cycles_too() {
        let dir = tree(&[("a.rs", "use crate::b;\n"), ("b.rs", "use crate::a;\n")]);
        for (path, text) in [("lib2/x.rs", "use crate::y;\n"), ("lib2/y.rs", "")] {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
        }
        let err = check(dir.path(), &["src", "lib2"]).unwrap_err().to_string();
        assert!(err.contains("src: 1 import cycle(s)"), "{err}");
        assert!(err.contains("(no cycle in lib2 (2 modules))\n"), "{err}");
        assert_eq!(
            check(dir.path(), &["lib2"]).unwrap(),
            "no import cycles among the top-level modules of lib2 (2 modules)"
        );
    }

    #[test]
    fn a_three_cycle_through_folders_is_found() {
        let g = graph(&[
            ("a/mod.rs", "mod inner;\n"),
            ("a/inner.rs", "use crate::b::X;\n"),
            ("b.rs", "use crate::c::deep::Y;\n"),
            ("c/deep/mod.rs", "pub fn y() { crate::a::z() }\n"),
            ("d.rs", "use crate::a;\n"),
        ]);
        assert_eq!(edges(&g), ["a->b", "b->c", "c->a", "d->a"]);
        assert_eq!(cycle_modules(&g), [["a", "b", "c"]]);
    }

    #[test]
    fn grouped_uses_name_each_first_segment() {
        let g = graph(&[
            (
                "a.rs",
                "use crate::{\n    b::X,\n    c,\n    d::{e, f},\n    self as root,\n    {g::G, h},\n};\n",
            ),
            ("b.rs", ""),
            ("c.rs", ""),
            ("d.rs", ""),
            ("e.rs", ""),
            ("f.rs", ""),
            ("g.rs", ""),
            ("h.rs", ""),
        ]);
        assert_eq!(edges(&g), ["a->b", "a->c", "a->d", "a->g", "a->h"]);
        let d = &g.edges[&("a".to_string(), "d".to_string())];
        assert_eq!(d[0].line, 4);
    }

    #[test]
    fn super_reaches_the_root_only_from_the_right_depth() {
        let g = graph(&[
            // Top-level file: super is the crate root.
            ("a.rs", "use super::b::X;\nuse super::{c, d::D};\n"),
            // Nested file: super is `e`, super::super the root.
            ("e/mod.rs", "mod x;\nmod y;\n"),
            ("e/x.rs", "use super::y::Y;\n"),
            ("e/y.rs", "use super::super::f::F;\n"),
            // Inline module in a top-level file: super is `g`.
            (
                "g.rs",
                "mod t {\n    use super::h;\n    use super::super::b;\n}\n",
            ),
            ("b.rs", ""),
            ("c.rs", ""),
            ("d.rs", ""),
            ("f.rs", ""),
            ("h.rs", ""),
            ("x.rs", ""),
            ("y.rs", ""),
        ]);
        assert_eq!(edges(&g), ["a->b", "a->c", "a->d", "e->f", "g->b"]);
        let gb = &g.edges[&("g".to_string(), "b".to_string())];
        assert_eq!(gb[0].line, 3);
    }

    #[test]
    fn comments_strings_and_chars_do_not_count() {
        let g = graph(&[
            (
                "a.rs",
                concat!(
                    "// use crate::b;\n",
                    "/// [crate::b::X]\n",
                    "//! crate::b\n",
                    "/* crate::b /* nested crate::b */ crate::b */\n",
                    "fn f<'a>(x: &'a str) -> char {\n",
                    "    let _ = \"crate::b \\\" crate::b\";\n",
                    "    let _ = r#\"crate::b \" crate::b\"#;\n",
                    "    let _ = b\"crate::b\";\n",
                    "    let _ = '\"'; let _ = '\\''; let _ = b'x';\n",
                    "    crate::c::g();\n",
                    "    '{'\n",
                    "}\n",
                    // A lifetime is no char literal: d is still seen.
                    "struct S<'a, 'b>(&'a u8, crate::d::T<'b>);\n",
                    // A raw string ends at its first \"#, and \\ escapes nothing in it.
                    "const R: &str = r#\"x\" crate::b \"#;\n",
                    "const Q: &str = r\"\\\"; const _: u8 = crate::e::E;\n",
                ),
            ),
            ("b.rs", ""),
            ("c.rs", ""),
            ("d.rs", ""),
            ("e.rs", ""),
        ]);
        assert_eq!(edges(&g), ["a->c", "a->d", "a->e"]);
        assert_eq!(g.edges[&("a".to_string(), "c".to_string())][0].line, 10);
    }

    #[test]
    fn dollar_crate_other_crates_and_visibility_do_not_count() {
        let g = graph(&[
            (
                "a.rs",
                concat!(
                    "macro_rules! m { () => { $crate::b::f() }; }\n",
                    "use roce_common::b::X;\n",
                    "extern crate c;\n",
                    "pub(crate) fn f() {}\n",
                    "pub(super) fn g() {}\n",
                    "use crate::a::self_ref;\n",
                    "use crate::Root;\n",
                ),
            ),
            ("b.rs", ""),
            ("c.rs", ""),
        ]);
        assert!(g.edges.is_empty(), "{:?}", edges(&g));
    }

    #[test]
    fn edges_only_from_test_modules_are_marked() {
        let dir = tree(&[
            ("a.rs", "use crate::b;\n"),
            (
                "b.rs",
                "#[cfg(test)]\n#[allow(dead_code)]\nmod tests {\n    use crate::a;\n}\n",
            ),
        ]);
        let g = scan(dir.path(), Path::new("src")).unwrap();
        assert_eq!(cycle_modules(&g), [["a", "b"]]);
        assert!(g.edges[&("b".to_string(), "a".to_string())][0].in_test);
        assert!(!g.edges[&("a".to_string(), "b".to_string())][0].in_test);
        let err = check(dir.path(), &["src"]).unwrap_err().to_string();
        assert!(err.contains("b -> a  src/b.rs:4 [tests only]\n"), "{err}");
    }

    #[test]
    fn lib_main_and_bin_are_not_modules() {
        let g = graph(&[
            ("lib.rs", "use crate::a;\n"),
            ("main.rs", "use crate::a;\n"),
            ("bin/tool.rs", "use crate::a;\n"),
            ("a.rs", ""),
        ]);
        assert_eq!(g.modules.iter().collect::<Vec<_>>(), ["a"]);
        assert!(g.edges.is_empty());
    }

    #[test]
    fn cycles_are_reported_in_a_fixed_order() {
        let g = graph(&[
            ("z.rs", "use crate::y;\n"),
            ("y.rs", "use crate::z;\n"),
            ("b.rs", "use crate::a;\n"),
            ("a.rs", "use crate::b;\nuse crate::c;\n"),
            ("c.rs", "use crate::a;\n"),
        ]);
        assert_eq!(cycle_modules(&g), [vec!["a", "b", "c"], vec!["y", "z"]]);
    }
}
