//! The engine's folders are its layers. `src/lib.rs` declares them once, from the bottom up, and
//! [`MAY_IMPORT`] says which layers each one's code may import. This test reads that list and
//! the `crate::` imports of every file, and names any import the table does not allow.
//!
//! Test code (items under `#[cfg(test)]`) may also import any layer declared before its own, to
//! set up a case directly on a lower layer; it never reaches up either.

#[path = "../../lock-macros/tests/module_graph/mod.rs"]
mod module_graph;

use std::fs;
use std::path::Path;

use module_graph::{ModuleGraph, code_only, rust_files};

/// Which layers each layer's code may import, bottom up (the order of `lib.rs`). Above
/// `deployment`, nothing reaches `server` or `transport`: `deployment` re-exports the few
/// types of its interface that come from there.
const MAY_IMPORT: &[(&str, &[&str])] = &[
    ("model", &[]),
    ("plumbing", &["model"]),
    ("transport", &["model", "plumbing"]),
    ("server", &["model", "plumbing", "transport"]),
    ("state", &["model", "plumbing"]),
    (
        "deployment",
        &["model", "plumbing", "transport", "server", "state"],
    ),
    ("hold", &["model", "plumbing", "state", "deployment"]),
    (
        "acquire",
        &["model", "plumbing", "state", "deployment", "hold"],
    ),
    (
        "api",
        &[
            "model",
            "plumbing",
            "state",
            "deployment",
            "hold",
            "acquire",
        ],
    ),
];

/// The layers, in the order `lib.rs` declares them (`mod x;` lines at its top level).
fn declared_layers(lib_rs: &str) -> Vec<String> {
    code_only(lib_rs)
        .lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .map(|name| name.trim().to_owned())
        .collect()
}

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_table_lists_the_layers_in_order_and_allows_only_lower_ones() {
    let layers = declared_layers(&fs::read_to_string(src().join("lib.rs")).unwrap());
    let table: Vec<&str> = MAY_IMPORT.iter().map(|(layer, _)| *layer).collect();
    assert_eq!(
        layers, table,
        "the layer list in lib.rs changed: update MAY_IMPORT and the table in \
         docs/architecture.md"
    );
    for (rank, (layer, allowed)) in MAY_IMPORT.iter().enumerate() {
        for to in *allowed {
            assert!(
                table[..rank].contains(to),
                "MAY_IMPORT lets `{layer}` import `{to}`, which is not below it"
            );
        }
    }
}

#[test]
fn each_layer_imports_only_what_the_table_allows() {
    let layers = declared_layers(&fs::read_to_string(src().join("lib.rs")).unwrap());
    let graph = ModuleGraph::read(&src()).unwrap();
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut wrong = Vec::new();
    for (from, targets) in &graph.edges {
        let from_rank = rank(from).unwrap_or_else(|| panic!("`{from}` is not a declared layer"));
        let allowed = MAY_IMPORT
            .iter()
            .find(|(layer, _)| layer == from)
            .map_or(&[][..], |(_, allowed)| *allowed);
        let tests_only = &graph.test_edges[from];
        for to in targets {
            let ok = if tests_only.contains(to) {
                rank(to).is_some_and(|to_rank| to_rank < from_rank)
            } else {
                allowed.contains(&to.as_str())
            };
            if !ok {
                wrong.push(format!("{from} imports {to}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that MAY_IMPORT does not allow: {wrong:?}; move what both need into a lower \
         layer, or reach it through the layer the table allows"
    );
    // The graph is read for real: the layers' known imports are there.
    let uses = |from: &str, to: &str| graph.edges[from].contains(to);
    assert!(uses("api", "acquire"), "{graph:?}");
    assert!(uses("acquire", "deployment"), "{graph:?}");
    assert!(uses("deployment", "server"), "{graph:?}");
    assert!(uses("server", "transport"), "{graph:?}");
    assert!(uses("hold", "deployment"), "{graph:?}");
}

/// The variant names of `enum <name>` in `text`, which is code only.
fn variants_of(text: &str, name: &str) -> Vec<String> {
    let start = text
        .find(&format!("enum {name} "))
        .unwrap_or_else(|| panic!("no `enum {name}`"));
    let body = &text[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.split(',')
        .filter_map(|v| {
            let v = v.trim();
            let v = v.rsplit(']').next().unwrap_or(v).trim();
            let name: String = v
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[test]
fn above_the_transport_nothing_matches_on_its_variants() {
    let link = code_only(&fs::read_to_string(src().join("transport/link.rs")).unwrap());
    let mut forbidden = Vec::new();
    for enum_name in ["Link", "Conn"] {
        let variants = variants_of(&link, enum_name);
        assert!(variants.len() >= 2, "{enum_name}: {variants:?}");
        forbidden.push(format!("{enum_name}::*"));
        forbidden.push(format!("{enum_name}::{{"));
        forbidden.extend(variants.iter().map(|v| format!("{enum_name}::{v}")));
    }
    assert!(
        forbidden.iter().any(|f| f == "Link::Sentinel"),
        "{forbidden:?}"
    );
    let layers = declared_layers(&fs::read_to_string(src().join("lib.rs")).unwrap());
    let above = layers.iter().skip_while(|l| *l != "transport").skip(1);
    let mut found = Vec::new();
    for layer in above {
        let mut files = Vec::new();
        rust_files(&src().join(layer), &mut files).unwrap();
        for file in files {
            let code = code_only(&fs::read_to_string(&file).unwrap());
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            for pattern in &forbidden {
                let whole_word = |at: usize| {
                    let before = code[..at].chars().next_back();
                    let after = code[at + pattern.len()..].chars().next();
                    !word(before) && (pattern.ends_with(['*', '{']) || !word(after))
                };
                if code
                    .match_indices(pattern.as_str())
                    .any(|(at, _)| whole_word(at))
                {
                    let name = file.strip_prefix(src()).unwrap().display().to_string();
                    found.push(format!("{name}: {pattern}"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "code above `transport` names the variants of its link: {found:?}; what differs by \
         transport belongs in a method of the link (`transport/link.rs`)"
    );
}

#[test]
fn the_source_folder_is_the_list_of_layers() {
    let mut entries: Vec<String> = fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    let mut expected = declared_layers(&fs::read_to_string(src().join("lib.rs")).unwrap());
    expected.push("lib.rs".to_owned());
    expected.sort();
    assert_eq!(entries, expected, "every top-level entry is a layer folder");
    assert!(entries.len() <= 12, "{entries:?}");
}
