//! The engine's folders are its layers. `src/lib.rs` declares them once, from the bottom up; each
//! layer may import only from the layers declared before it. This test reads that list and the
//! `crate::` imports of every file, and names any import that reaches up or sideways.

#[path = "../../lock-macros/tests/module_graph/mod.rs"]
mod module_graph;

use std::fs;
use std::path::Path;

use module_graph::{ModuleGraph, code_only};

/// The layers, in the order `lib.rs` declares them (`mod x;` lines at its top level).
fn declared_layers(lib_rs: &str) -> Vec<String> {
    code_only(lib_rs)
        .lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .map(|name| name.trim().to_owned())
        .collect()
}

#[test]
fn each_layer_imports_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers = declared_layers(&fs::read_to_string(src.join("lib.rs")).unwrap());
    assert_eq!(
        layers,
        [
            "model",
            "plumbing",
            "transport",
            "server",
            "state",
            "deployment",
            "hold",
            "acquire",
            "api"
        ],
        "the layer list in lib.rs changed: update this test and the drawing in docs"
    );
    let graph = ModuleGraph::read(&src).unwrap();
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut wrong = Vec::new();
    for (from, targets) in &graph.edges {
        let from_rank = rank(from).unwrap_or_else(|| panic!("`{from}` is not a declared layer"));
        for to in targets {
            match rank(to) {
                Some(to_rank) if to_rank < from_rank => {}
                _ => wrong.push(format!("{from} imports {to}")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that reach up the layers: {wrong:?}; move what both need into a lower layer"
    );
    // The graph is read for real: the layers' known imports are there.
    let uses = |from: &str, to: &str| graph.edges[from].contains(to);
    assert!(uses("api", "acquire"), "{graph:?}");
    assert!(uses("acquire", "deployment"), "{graph:?}");
    assert!(uses("deployment", "server"), "{graph:?}");
    assert!(uses("server", "transport"), "{graph:?}");
    assert!(uses("hold", "deployment"), "{graph:?}");
}

#[test]
fn the_source_folder_is_the_list_of_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut entries: Vec<String> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    let mut expected = declared_layers(&fs::read_to_string(src.join("lib.rs")).unwrap());
    expected.push("lib.rs".to_owned());
    expected.sort();
    assert_eq!(entries, expected, "every top-level entry is a layer folder");
    assert!(entries.len() <= 12, "{entries:?}");
}
