//! The engine's modules import one way (see the layer list in `src/lib.rs`): a cycle would make a
//! lower layer depend on a higher one. This test names any cycle.

#[path = "../../lock-macros/tests/module_graph/mod.rs"]
mod module_graph;

use std::path::Path;

use module_graph::ModuleGraph;

#[test]
fn engine_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = ModuleGraph::read(&src).unwrap();
    graph.assert_acyclic();
    // The graph is read for real: the layers' known imports are there.
    let uses = |from: &str, to: &str| graph.edges[from].contains(to);
    assert!(uses("locker", "acquire"), "{graph:?}");
    assert!(uses("acquire", "quorum"), "{graph:?}");
    assert!(uses("quorum", "node"), "{graph:?}");
    assert!(uses("node", "pubsub"), "{graph:?}");
    assert!(uses("watchdog", "quorum"), "{graph:?}");
    // And the layers the stack promises: nothing below the facade reaches up to it.
    for low in [
        "node",
        "pubsub",
        "quorum",
        "lease_state",
        "watchdog",
        "lease",
        "queue",
        "acquire",
    ] {
        for high in ["locker", "builder", "default_locker", "run", "reentrancy"] {
            assert!(!uses(low, high), "{low} imports {high}: {graph:?}");
        }
    }
}
