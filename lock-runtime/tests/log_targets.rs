//! Every `tracing` event and span of the engine names its target, one of the few that
//! `docs/operations.md` documents, so that operators filter on targets that do not move with the
//! code's module paths. This test names any event without one, or with another.

#[path = "../../lock-macros/tests/module_graph/mod.rs"]
mod module_graph;

use std::fs;
use std::path::Path;

use module_graph::rust_files;

/// The targets, as documented.
const TARGETS: [&str; 4] = [
    "lock_runtime",
    "lock_runtime::acquire",
    "lock_runtime::hold",
    "lock_runtime::release",
];

/// The macros that make an event or a span.
const MACROS: [&str; 10] = [
    "trace!(",
    "debug!(",
    "info!(",
    "warn!(",
    "error!(",
    "trace_span!(",
    "debug_span!(",
    "info_span!(",
    "warn_span!(",
    "error_span!(",
];

/// Each event macro in `code`: its line and the target it names, if any.
fn events(code: &str) -> Vec<(usize, Option<String>)> {
    let mut found = Vec::new();
    for name in MACROS {
        let mut from = 0;
        while let Some(offset) = code[from..].find(name) {
            let at = from + offset;
            from = at + name.len();
            // `tracing::debug!(`, or `debug!(` but not `my_debug!(` or `eprintln!`.
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c == '_' || c.is_alphanumeric()) {
                continue;
            }
            let line = code[..at].matches('\n').count() + 1;
            let args = code[from..].trim_start();
            let target = args.strip_prefix("target:").map(|rest| {
                let rest = rest.trim_start().trim_start_matches('"');
                rest[..rest.find('"').unwrap_or(0)].to_owned()
            });
            found.push((line, target));
        }
    }
    found
}

#[test]
fn every_event_names_a_documented_target() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files).unwrap();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for file in files {
        let code = fs::read_to_string(&file).unwrap();
        for (line, target) in events(&code) {
            seen += 1;
            if !target.as_deref().is_some_and(|t| TARGETS.contains(&t)) {
                wrong.push(format!("{}:{line}: {target:?}", file.display()));
            }
        }
    }
    assert!(
        seen > 20,
        "only {seen} events found: is the scan still reading the code?"
    );
    assert!(
        wrong.is_empty(),
        "events without a documented target:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_operations_guide_documents_each_target() {
    let guide = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
    let guide = fs::read_to_string(guide).unwrap();
    for target in TARGETS {
        assert!(guide.contains(&format!("`{target}`")), "{target}");
    }
}

#[test]
fn the_scan_finds_targets_and_their_absence() {
    let code = "tracing::debug!(target: \"lock_runtime::hold\", x = 1, \"m\");\n\
                tracing::warn!(\n    lock = n,\n    \"m\"\n);\n\
                my_debug!(x); eprintln!(\"y\");\n\
                let s = tracing::info_span!(target: \"lock_runtime\", \"lock\");";
    let mut found = events(code);
    found.sort();
    assert_eq!(
        found,
        [
            (1, Some("lock_runtime::hold".to_owned())),
            (2, None),
            (7, Some("lock_runtime".to_owned())),
        ]
    );
}
