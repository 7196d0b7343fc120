//! The engine's mutexes follow one poisoning policy (`plumbing/unpoisoned.rs`): they are locked
//! through `Unpoisoned::locked` (or `UnpoisonedRw`), never with a `.lock()` whose poisoning each
//! call site decides on its own. This test names any call site that does.

#[path = "../../lock-macros/tests/module_graph/mod.rs"]
mod module_graph;

use std::fs;
use std::path::Path;

use module_graph::{code_only, rust_files};

#[test]
fn every_std_lock_goes_through_the_one_policy() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files).unwrap();
    let mut found = Vec::new();
    for file in &files {
        if file.ends_with("plumbing/unpoisoned.rs") {
            continue;
        }
        let code = code_only(&fs::read_to_string(file).unwrap());
        // Whitespace out, so that a call split over lines is one string.
        let code: String = code.chars().filter(|c| !c.is_whitespace()).collect();
        let calls = [
            ".lock().expect(",
            ".lock().unwrap(",
            ".lock()else",
            ".read().expect(",
            ".write().expect(",
        ];
        for call in calls {
            let n = code.matches(call).count();
            if n > 0 {
                found.push(format!("{}: {n} x `{call}`", file.display()));
            }
        }
    }
    assert!(
        files.len() > 40,
        "the engine's sources were read: {}",
        files.len()
    );
    assert!(
        found.is_empty(),
        "mutexes locked outside the poisoning policy; use `Unpoisoned::locked`: {found:#?}"
    );
}
