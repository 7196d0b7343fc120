//! The macro's modules import one way: leaves (`errors`, `suggest`, `options`, `template`),
//! then `item` and `parse`, then `config`, then `expand`. A cycle makes a stage depend on a later
//! one; this test names it.

mod module_graph;

use std::fs;
use std::path::{Path, PathBuf};

use module_graph::{ModuleGraph, code_only, crate_paths};

#[test]
fn macro_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = ModuleGraph::read(&src).unwrap();
    graph.assert_acyclic();
    // The graph is read for real: the stages' known imports are there.
    assert!(graph.edges["expand"].contains("config"), "{graph:?}");
    assert!(graph.edges["config"].contains("template"), "{graph:?}");
    assert!(graph.edges["parse"].contains("errors"), "{graph:?}");
}

/// A scratch source directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("module-graph-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let scratch = Scratch::new(
        "cycle",
        &[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "use crate::b::B;\npub struct A;"),
            ("b.rs", "pub struct B(crate::c::C);"),
            ("c.rs", "use crate::{a::A, self};\npub struct C;"),
        ],
    );
    let graph = ModuleGraph::read(&scratch.0).unwrap();
    assert_eq!(graph.find_cycle().unwrap(), ["a", "b", "c", "a"]);
    let panic = std::panic::catch_unwind(|| graph.assert_acyclic()).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(message.contains("a -> b -> c -> a"), "{message}");
}

#[test]
fn reexports_and_directories_count_and_text_does_not() {
    let scratch = Scratch::new(
        "reexports",
        &[
            (
                "lib.rs",
                "mod error; mod locker; mod testing;\npub use error::{LockError, Lost as LostReason};",
            ),
            (
                "error.rs",
                "// uses crate::locker in a comment only\nconst S: &str = \"crate::locker\";",
            ),
            (
                "locker.rs",
                "fn f() -> crate::LockError { todo!() }\nmacro_rules! m { () => { $crate::testing::x() } }",
            ),
            ("testing/mod.rs", "mod server;"),
            ("testing/server.rs", "use crate::locker;"),
        ],
    );
    let graph = ModuleGraph::read(&scratch.0).unwrap();
    assert!(graph.edges["error"].is_empty(), "{graph:?}");
    assert_eq!(graph.edges["locker"].iter().collect::<Vec<_>>(), ["error"]);
    assert_eq!(
        graph.edges["testing"].iter().collect::<Vec<_>>(),
        ["locker"]
    );
    assert!(graph.find_cycle().is_none());
}

#[test]
fn scanner_reads_paths_and_skips_literals() {
    let code = code_only(
        "use crate::{a::{x, y}, b};\nlet s = r#\"crate::c\"#; let c = '\"'; fn f<'a>() -> crate::d::D {}\n/* crate::e /* nested */ crate::f */ crate :: g",
    );
    assert_eq!(crate_paths(&code), ["a", "b", "d", "g"]);
}

#[test]
fn imports_of_test_code_are_kept_apart() {
    let scratch = Scratch::new(
        "tests",
        &[
            ("lib.rs", "mod a; mod b; mod c; mod d;"),
            (
                "a/mod.rs",
                "use crate::b::B;\n#[cfg(test)]\nmod tests {\n    use crate::c::C;\n    fn f() { { crate::b::g(); } }\n}\n#[cfg(test)]\nmod more;\nfn after() -> crate::d::D { todo!() }",
            ),
            ("a/more.rs", "use crate::c::{C, D};"),
            ("b.rs", "pub struct B;"),
            ("c.rs", "pub struct C;"),
            ("d.rs", "pub struct D;"),
        ],
    );
    let graph = ModuleGraph::read(&scratch.0).unwrap();
    assert_eq!(graph.edges["a"].iter().collect::<Vec<_>>(), ["b", "c", "d"]);
    assert_eq!(graph.test_edges["a"].iter().collect::<Vec<_>>(), ["c"]);
    assert!(graph.test_edges["b"].is_empty(), "{graph:?}");
}
