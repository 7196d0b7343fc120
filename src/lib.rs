//! Hosts the integration tests in `tests/` and the programs in `examples/`.

/// Prints the engine's `tracing` events (acquired, skipped, lost, cancelled, released, with
/// their fences and waits) on standard error, so that running an example shows what happens.
/// `LOCK_LOG=info` (or `warn`, `trace`) changes the level; the default is `debug`.
pub fn show_lock_events() {
    let level = std::env::var("LOCK_LOG")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(tracing::Level::DEBUG);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false)
        .without_time()
        .with_writer(std::io::stderr)
        .compact()
        .try_init();
}

/// The Rust code blocks of README.md, compiled (and, where not `no_run`, run) by
/// `cargo test --doc -p lock-suite`, so that what the README shows keeps compiling.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust code blocks of the guides in docs/, checked the same way as the README's.
#[cfg(doctest)]
pub mod guide_doctests {
    #[doc = include_str!("../docs/guarantees.md")]
    pub struct Guarantees;
    #[doc = include_str!("../docs/deployments.md")]
    pub struct Deployments;
    #[doc = include_str!("../docs/operations.md")]
    pub struct Operations;
    #[doc = include_str!("../docs/performance.md")]
    pub struct Performance;
    #[doc = include_str!("../docs/testing.md")]
    pub struct Testing;
}
