//! No function of the engine, the macro, the option rules or `lockctl` is 80 lines or longer: a
//! longer one holds two ideas. This test names any that is.

#[path = "../../lock-macros/tests/module_graph/mod.rs"]
mod module_graph;

use std::fs;
use std::path::Path;

use module_graph::{code_only, rust_files};

const LIMIT: usize = 80;

/// Each `fn` with a body in `code` (comments and literals already blanked): its name, first
/// line and length in lines.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let bytes = code.as_bytes();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = code[from..].find("fn ") {
        let at = from + offset;
        from = at + 3;
        let before = at.checked_sub(1).map(|p| bytes[p]);
        if before.is_some_and(|b| b == b'_' || b.is_ascii_alphanumeric()) {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| *c == '_' || c.is_alphanumeric())
            .collect();
        // The body opens at the first `{` before any `;` (a declaration has none).
        let Some(open) = code[at..].find(['{', ';']).map(|o| at + o) else {
            break;
        };
        if name.is_empty() || bytes[open] == b';' {
            continue;
        }
        let mut depth = 0;
        let mut close = open;
        for (i, b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        found.push((name, line_of(at), line_of(close) - line_of(at) + 1));
    }
    found
}

#[test]
fn the_counter_finds_functions_and_their_lengths() {
    let code = "fn a() {\n    if x { y }\n}\ntrait T { fn b(&self); }\nasync fn c<T: X>(t: T)\nwhere T: Y\n{\n}\n";
    let found = functions(&code_only(code));
    assert_eq!(
        found,
        [("a".to_owned(), 1, 3), ("c".to_owned(), 5, 4)],
        "{found:?}"
    );
}

#[test]
fn no_function_is_80_lines_or_longer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for crate_dir in ["lock-runtime", "lock-macros", "lock-rules", "lockctl"] {
        rust_files(&root.join(crate_dir).join("src"), &mut files).unwrap();
    }
    assert!(files.len() > 40, "{files:?}");
    let mut long = Vec::new();
    let mut counted = 0;
    for file in &files {
        let code = code_only(&fs::read_to_string(file).unwrap());
        for (name, line, lines) in functions(&code) {
            counted += 1;
            if lines >= LIMIT {
                long.push(format!("{}:{line} {name} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(counted > 300, "{counted} functions found");
    assert!(
        long.is_empty(),
        "functions of {LIMIT} lines or more; split each into named steps: {long:#?}"
    );
}
