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
