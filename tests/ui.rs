//! Compile-time behaviour of `#[distributed_lock]`: what it accepts and how it rejects the rest.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
