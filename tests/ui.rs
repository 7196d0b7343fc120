//! Compile-time behaviour of `#[distributed_lock]`: what it accepts and how it rejects the rest.
//! Only what a compiler shows: the expansion compiling, and each error's message and span. The
//! option rules (durations, permits, shared) are a table in lock-rules that the macro's and the
//! runtime's tests both run; here `several_errors` shows their errors at their arguments.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

/// The errors users see, and keep snapshots of, speak of their code and of the library's public
/// names only: never of the paths the expansion calls, the library's source files, or lists of
/// impls that depend on what else the user's crate depends on.
#[test]
fn errors_name_no_internals() {
    let internals = [
        "__private",
        "$LOCK_RUNTIME",
        "lock-runtime/src",
        "lock_runtime/src",
        "other types implement",
        "required by a bound",
    ];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/fail");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "stderr") {
            let text = std::fs::read_to_string(&path).unwrap();
            for word in internals {
                assert!(!text.contains(word), "{}: {word}\n{text}", path.display());
            }
            seen += 1;
        }
    }
    assert!(
        seen > 30,
        "only {seen} snapshots read from {}",
        dir.display()
    );
}
