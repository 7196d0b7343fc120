//! The `crate::` imports between the top-level modules of a crate's source directory, and the
//! check that they run one way (no cycle). It has no dependencies, so another crate of the
//! workspace can use it from its own tests:
//!
//! ```ignore
//! #[path = "../../lock-macros/tests/module_graph/mod.rs"]
//! mod module_graph;
//!
//! #[test]
//! fn modules_import_one_way() {
//!     let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
//!     module_graph::ModuleGraph::read(&src).unwrap().assert_acyclic();
//! }
//! ```
//!
//! A module is a file `src/<name>.rs` or a directory `src/<name>/` (its files count as that
//! module). A `crate::x` names module `x`, or, when `x` is re-exported by the crate root
//! (`pub use error::LockError;` in `lib.rs`), the module it comes from. Comments, strings and
//! `$crate::` (macro_rules) are ignored. Imports made only by test code (an item under
//! `#[cfg(test)]`, or a file such an item declares as a module) are in `edges` and also kept
//! apart in `test_edges`, so that a check can hold the engine's code to a stricter rule.

// Each user includes it for some of its functions.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Which module imports which, by name.
#[derive(Debug, Default)]
pub(crate) struct ModuleGraph {
    /// Every import, from code and tests alike.
    pub edges: BTreeMap<String, BTreeSet<String>>,
    /// The imports that only test code makes (a subset of `edges`).
    pub test_edges: BTreeMap<String, BTreeSet<String>>,
}

impl ModuleGraph {
    /// Reads every `.rs` file under `src` (recursively); `lib.rs` and `main.rs` are the root.
    pub(crate) fn read(src: &Path) -> io::Result<Self> {
        let mut files = Vec::new();
        rust_files(src, &mut files)?;
        let mut modules = BTreeMap::<String, String>::new();
        let mut tests = BTreeMap::<String, String>::new();
        let mut root = String::new();
        let test_files = test_module_files(&files)?;
        for file in &files {
            let relative = file.strip_prefix(src).unwrap_or(file);
            let first = relative
                .components()
                .next()
                .map(|c| c.as_os_str().to_string_lossy().into_owned());
            let Some(first) = first else { continue };
            let (code, test) = split_tests(&code_only(&fs::read_to_string(file)?));
            let (code, test) = if test_files.contains(file) {
                (String::new(), code + &test)
            } else {
                (code, test)
            };
            if first == "lib.rs" || first == "main.rs" {
                root.push_str(&code);
                root.push('\n');
                continue;
            }
            let module = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
            let all = modules.entry(module.clone()).or_default();
            all.push_str(&code);
            all.push('\n');
            let all = tests.entry(module).or_default();
            all.push_str(&test);
            all.push('\n');
        }
        let names: BTreeSet<String> = modules.keys().cloned().collect();
        let reexports = root_reexports(&root, &names);
        let targets = |module: &String, text: &str| -> BTreeSet<String> {
            crate_paths(text)
                .into_iter()
                .filter_map(|first| {
                    if names.contains(&first) {
                        Some(first)
                    } else {
                        reexports.get(&first).cloned()
                    }
                })
                .filter(|t| t != module)
                .collect()
        };
        let mut graph = ModuleGraph::default();
        for (module, text) in &modules {
            let code = targets(module, text);
            let test: BTreeSet<String> = targets(module, &tests[module])
                .into_iter()
                .filter(|t| !code.contains(t))
                .collect();
            let all = code.union(&test).cloned().collect();
            graph.edges.insert(module.clone(), all);
            graph.test_edges.insert(module.clone(), test);
        }
        Ok(graph)
    }

    /// A cycle of imports, as the modules along it with the first repeated at the end.
    pub(crate) fn find_cycle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Open,
            Done,
        }
        fn visit(
            graph: &ModuleGraph,
            module: &str,
            marks: &mut BTreeMap<String, Mark>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            match marks.get(module) {
                Some(Mark::Done) => return None,
                Some(Mark::Open) => {
                    let start = path.iter().position(|m| m == module).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(module.to_owned());
                    return Some(cycle);
                }
                None => {}
            }
            marks.insert(module.to_owned(), Mark::Open);
            path.push(module.to_owned());
            for next in graph.edges.get(module).into_iter().flatten() {
                if let Some(cycle) = visit(graph, next, marks, path) {
                    return Some(cycle);
                }
            }
            path.pop();
            marks.insert(module.to_owned(), Mark::Done);
            None
        }
        let mut marks = BTreeMap::new();
        self.edges
            .keys()
            .find_map(|module| visit(self, module, &mut marks, &mut Vec::new()))
    }

    /// Panics with the cycle, if there is one.
    pub(crate) fn assert_acyclic(&self) {
        if let Some(cycle) = self.find_cycle() {
            panic!(
                "modules import each other: {}; move what both need into a module below them",
                cycle.join(" -> ")
            );
        }
    }
}

/// The files that a `#[cfg(test)] mod name;` declares: `name.rs` beside a `mod.rs`, `lib.rs` or
/// `main.rs`, else in the folder named after the declaring file (or `name/mod.rs`).
fn test_module_files(files: &[PathBuf]) -> io::Result<BTreeSet<PathBuf>> {
    let mut found = BTreeSet::new();
    for file in files {
        let (_, test) = split_tests(&code_only(&fs::read_to_string(file)?));
        let stem = file.file_stem().unwrap_or_default().to_string_lossy();
        let dir = file.parent().unwrap_or(Path::new(""));
        let dir = if ["mod", "lib", "main"].contains(&stem.as_ref()) {
            dir.to_path_buf()
        } else {
            dir.join(stem.as_ref())
        };
        for item in test.split(';') {
            let words: Vec<&str> = item.split_whitespace().collect();
            if let [.., "mod", name] = words.as_slice() {
                found.insert(dir.join(format!("{name}.rs")));
                found.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    Ok(found)
}

/// Code (comments and strings removed already) split into what is compiled always and the items
/// under `#[cfg(test)]`: each such item runs to its `;`, or to the brace that closes its body.
pub(crate) fn split_tests(code: &str) -> (String, String) {
    const MARK: &str = "#[cfg(test)]";
    let (mut always, mut test) = (String::new(), String::new());
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        always.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let end = match (item.find(';'), item.find('{')) {
            (Some(semi), Some(open)) if semi < open => semi + 1,
            (Some(semi), None) => semi + 1,
            (_, Some(open)) => {
                let chars: Vec<char> = item.chars().collect();
                let open = item[..open].chars().count();
                let close = matching_brace(&chars, open);
                let close: usize = chars[..close.min(chars.len())]
                    .iter()
                    .map(|c| c.len_utf8())
                    .sum();
                (close + 1).min(item.len())
            }
            (None, None) => item.len(),
        };
        test.push_str(&item[..end]);
        test.push('\n');
        rest = &item[end..];
    }
    always.push_str(rest);
    (always, test)
}

/// Every `.rs` file under `dir`, into `out`, in path order.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<_>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The source without comments, string and char literals (each replaced by a space), so that
/// `crate::` in them is not taken for an import.
pub(crate) fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let at = |i: usize, s: &str| {
        s.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    while i < chars.len() {
        let c = chars[i];
        if at(i, "//") {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            let mut depth = 0;
            while i < chars.len() {
                if at(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if at(i, "*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (chars.get(i + 1) == Some(&'"') || chars.get(i + 1) == Some(&'#'))
            && !ident_char(i.checked_sub(1).map(|p| chars[p]))
        {
            // A raw string r"..", r#".."#: ends at a quote followed by as many `#`.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < chars.len()
                && !(chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')))
            {
                j += 1;
            }
            i = j + 1 + hashes;
            out.push(' ');
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c == '\'' && is_char_literal(&chars, i) {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `'x'` or `'\n'`, not a lifetime `'a`.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}

fn ident_char(c: Option<char>) -> bool {
    c.is_some_and(|c| c == '_' || c.is_alphanumeric())
}

/// The first segment after each `crate::`, with `crate::{a::b, c}` giving `a` and `c`.
pub(crate) fn crate_paths(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(offset) = code_find(&chars[i..], "crate") {
        let start = i + offset;
        i = start + 5;
        let before = start.checked_sub(1).map(|p| chars[p]);
        if ident_char(before) || before == Some('$') {
            continue;
        }
        let rest = skip_space(&chars, i);
        if chars.get(rest) != Some(&':') || chars.get(rest + 1) != Some(&':') {
            continue;
        }
        let after = skip_space(&chars, rest + 2);
        if chars.get(after) == Some(&'{') {
            let end = matching_brace(&chars, after);
            let inner: String = chars[after + 1..end].iter().collect();
            found.extend(group_heads(&inner));
            i = end;
        } else {
            let name = ident_at(&chars, after);
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
}

/// The first name of each item of a `{...}` use group, at its top level.
fn group_heads(inner: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item = String::new();
    for c in inner.chars().chain([',']) {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                let chars: Vec<char> = item.chars().collect();
                let name = ident_at(&chars, skip_space(&chars, 0));
                if !name.is_empty() && name != "self" {
                    heads.push(name);
                }
                item.clear();
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    heads
}

/// Names the crate root re-exports from each module: `pub use error::{LockError as E, X};`
/// maps `E` and `X` to `error`.
fn root_reexports(root: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in root.split(';') {
        let Some(at) = statement.find("use ") else {
            continue;
        };
        let path = statement[at + 4..].trim();
        let path = path.strip_prefix("crate::").unwrap_or(path);
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        if !modules.contains(module.trim()) {
            continue;
        }
        let rest = rest.trim().trim_start_matches('{').trim_end_matches('}');
        for item in rest.split(',') {
            let last = item.split(" as ").last().unwrap_or(item);
            let name = last.rsplit("::").next().unwrap_or(last).trim();
            if !name.is_empty() && name != "*" && name != "self" {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    names
}

fn code_find(chars: &[char], word: &str) -> Option<usize> {
    let word: Vec<char> = word.chars().collect();
    chars.windows(word.len()).position(|w| w == word.as_slice())
}

fn skip_space(chars: &[char], mut i: usize) -> usize {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

fn ident_at(chars: &[char], i: usize) -> String {
    chars[i.min(chars.len())..]
        .iter()
        .take_while(|c| ident_char(Some(**c)))
        .collect()
}

fn matching_brace(chars: &[char], open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    chars.len()
}
